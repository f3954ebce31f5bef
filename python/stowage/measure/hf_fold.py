"""Steps whose ops repeat with the sequence length (transformers' chunked linear-attention
loops), folded into steps that run the same events at every length (Note [Loops in the step]),
so that they can be fitted allocation by allocation.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from ..plan import PlanError
from .hf_trace import StepTrace

# Note [Loops in the step]
# transformers' torch fallbacks of the linear-attention kernels (torch_chunk_gated_delta_rule in
# Qwen3-Next and Qwen3.5, chunk_kimi_delta_attention in Kimi Linear: Note [hf linear attention] in
# planner/frameworks/hf.h) scan the sequence in a Python loop over chunks of 64 tokens, so a longer
# step runs more ops: the forward loop's body once more per chunk, and its backward, which autograd
# interleaves with the iterations next to it, so the backward is no clean repetition of one body.
# Such steps cannot be fitted allocation by allocation (Note [Replaying the step]); they are folded
# first, into steps that are:
#  - the events are split at the phase changes and marks, which every length has in the same
#    order; in a part whose events (allocation by the op that made it, or a free) differ between
#    the lengths, the common beginning and end are kept event by event, and what lies between,
#    the loop (its "middle"), is folded;
#  - a folded middle becomes: one allocation of its excursion (the most it holds above the bytes
#    live when it starts) and its free; the frees of what was made before it; then one
#    allocation per group of what it makes and outlives it, grouped by where it is freed (in
#    which later middle, at which kept event, or never) and what refers to it (a layer's saved
#    tensors by module, a layer's input or output, gradients by owner). The bytes live at every
#    kept event, and every part's peak, are the unfolded step's.
#  - a kept event must be the same thing at every length (a free of the last iteration's tensor
#    is of a kept allocation at one length and of the middle's at a longer one): where one is
#    not, the middle grows over it, until every kept event is.
# The folded steps of every length have the same events, and each size (an excursion, a group's
# bytes: the iterations' bytes, linear in the number of chunks and so in the length) is fitted
# as any allocation is. Over the first few iterations the moment a loop holds the most can move
# (GDN's and KDA's backward: up to the fifth chunk), so a folded size must be linear through
# the measured lengths: measure_hf moves lengths it chose up until it is, and refuses lengths it
# was given otherwise. A loop runs whole chunks of a fixed size (64 tokens): the fit is exact for
# lengths that are multiples of it, as the defaults and AgreementTest's are. The folded middles'
# saved tensors are listed per group ("<module>.<k>" names are renumbered by allocation).


def _tokens(trace: StepTrace) -> list[tuple]:
    ops = trace.made_by
    return [("a", ops[x]) if k == "a" else ("f",) if k == "f" else (k, x)
            for k, x in trace.events]


class _Folding:
    """One step's events with some ranges marked as middles (Note [Loops in the step]): what
    each kept event and each middle's allocations are, in terms every length shares (kept
    events by their index among the kept, middles by their part)."""

    def __init__(self, trace: StepTrace, parts: Sequence[tuple[int, int]],
                 middles: dict[int, tuple[int, int]]) -> None:
        ev = trace.events
        self.trace, self.parts, self.middles = trace, parts, middles
        self.mid_of: list[Optional[int]] = [None] * len(ev)
        for g, (a, e) in middles.items():
            for i in range(a, e):
                self.mid_of[i] = g
        self.kept: list[int] = []  # event index of each kept event
        self.kept_at: list[Optional[int]] = [None] * len(ev)
        self.made_at: dict[int, int] = {}
        self.freed_at: dict[int, int] = {}
        for i, (k, x) in enumerate(ev):
            if self.mid_of[i] is None:
                self.kept_at[i] = len(self.kept)
                self.kept.append(i)
            if k == "a":
                self.made_at[x] = i
            elif k == "f":
                self.freed_at[x] = i
        self.refs: dict[int, list[tuple]] = {}
        for j, entries in enumerate(trace.saved):
            for name, x, module in entries:
                self.refs.setdefault(x, []).append(("saved", j, module, name == "input"))
        for what, ids in (("input", trace.inputs), ("output", trace.outputs)):
            for j, x in enumerate(ids):
                self.refs.setdefault(x, []).append((what, j))
        for owner, ids in trace.grads.items():
            for x in ids:
                self.refs.setdefault(x, []).append(("grad", repr(owner)))

    def fate(self, x: int) -> tuple:
        f = self.freed_at.get(x)
        if f is None:
            return ("never",)
        if self.mid_of[f] is not None:
            return ("middle", self.mid_of[f])
        return ("at", self.kept_at[f])

    def group(self, x: int) -> tuple:
        """A middle's allocation: its middle, its fate, what refers to it."""
        g = self.mid_of[self.made_at[x]]
        fate = self.fate(x)
        if fate == ("middle", g):
            fate = ("internal",)
        return (g, fate, tuple(self.refs.get(x, ())))

    def what(self, p: int) -> tuple:
        """Kept event p in shared terms."""
        k, x = self.trace.events[self.kept[p]]
        if k == "a":
            return ("a", self.fate(x))
        if k == "f":
            i = self.made_at.get(x)
            if i is None or self.mid_of[i] is None:
                return ("f", "kept", None if i is None else self.kept_at[i])
            return ("f", "group", self.group(x))
        return (k, x)

    def absorb(self, p: int) -> tuple[int, int, int]:
        """(part, start, end) of the middle that covers kept event p and its part's middle."""
        i = self.kept[p]
        g = next(g for g, (a, e) in enumerate(self.parts) if a <= i < e)
        a, e = self.middles.get(g, (i, i + 1))
        return g, min(a, i), max(e, i + 1)

    def groups(self) -> dict[tuple, int]:
        out: dict[tuple, int] = {}
        for x, i in self.made_at.items():
            if self.mid_of[i] is None:
                continue
            key = self.group(x)
            if key[1] == ("internal",):
                if key[2]:
                    raise PlanError(f"an allocation the step refers to ({key[2]}) is freed in "
                                    "the loop that made it: the loop cannot be folded")
                continue
            out[key] = out.get(key, 0) + self.trace.sizes[x]
        return out

    def fold(self, keys: Sequence[tuple]) -> StepTrace:
        """The folded step, with the groups `keys` (every length's, in one order; a group
        this length has none of is an allocation of 0 bytes)."""
        trace, ev, sizes = self.trace, self.trace.events, self.trace.sizes
        totals = self.groups()
        new_sizes: list[int] = []
        events: list[tuple[str, Any]] = []
        nid: dict[int, int] = {}
        pid: dict[tuple, int] = {}
        folded: list[int] = []

        def allocate(size: int) -> int:
            new_sizes.append(size)
            return len(new_sizes) - 1

        for x in range(len(sizes)):  # made before the mode: no allocation event
            if x not in self.made_at:
                nid[x] = allocate(sizes[x])
        i = 0
        while i < len(ev):
            g = self.mid_of[i]
            if g is None:
                k, x = ev[i]
                if k == "a":
                    nid[x] = allocate(sizes[x])
                    events.append(("a", nid[x]))
                elif k == "f":
                    events.append(("f", nid[x] if x in nid else pid[self.group(x)]))
                else:
                    events.append((k, x))
                i += 1
                continue
            a, e = self.middles[g]
            live = top = 0
            for k, x in ev[a:e]:
                if k == "a":
                    live += sizes[x]
                    top = max(top, live)
                elif k == "f":
                    live -= sizes[x]
            top_id = allocate(top)
            folded.append(top_id)
            events += [("a", top_id), ("f", top_id)]
            # What was made before and is freed here: kept allocations in the order they were
            # made, then the groups of earlier middles.
            kept_freed = sorted(self.made_at[x] for k, x in ev[a:e]
                                if k == "f" and self.mid_of[self.made_at[x]] is None)
            events += [("f", nid[ev[j][1]]) for j in kept_freed]
            events += [("f", pid[key]) for key in keys if key[1] == ("middle", g)]
            for key in keys:
                if key[0] == g:
                    pid[key] = allocate(totals.get(key, 0))
                    folded.append(pid[key])
                    events.append(("a", pid[key]))
            i = e

        def new(x: int) -> int:
            return nid[x] if x in nid else pid[self.group(x)]

        saved = []
        for j, entries in enumerate(trace.saved):
            rows: dict[int, tuple[str, str]] = {}
            for name, x, module in entries:
                rows.setdefault(new(x), (name, module))
            for key in keys:  # the groups it saves that this length has none of
                for ref in key[2]:
                    if ref[0] == "saved" and ref[1] == j:
                        rows.setdefault(pid[key], ("input" if ref[3] else "", ref[2]))
            counts: dict[str, int] = {}
            out = []
            for y in sorted(rows):
                name, module = rows[y]
                if name != "input":
                    k = counts.get(module, 0)
                    counts[module] = k + 1
                    name = f"{module or 'layer'}.{k}"
                out.append((name, y, module))
            saved.append(out)
        grads: dict[Any, list[int]] = {}
        for owner, ids in trace.grads.items():
            grads[owner] = sorted({new(x) for x in ids} |
                                  {pid[key] for key in keys if ("grad", repr(owner)) in key[2]})
        return dataclasses.replace(
            trace, events=events, sizes=new_sizes, saved=saved,
            inputs=[new(x) for x in trace.inputs], outputs=[new(x) for x in trace.outputs],
            grads=grads, made_by=[], folded=folded,
            layer_args=sorted({new(x) for x in trace.layer_args}),
            layer_args_of=[sorted({new(x) for x in a}) for a in trace.layer_args_of])


def _parts(traces: Sequence[StepTrace]) -> list[list[tuple[int, int]]]:
    """Per trace, its parts: the event ranges between phase changes and marks, which every
    length must have in the same order."""
    out = []
    marks0 = None
    for t in traces:
        bounds = [i for i, (k, _x) in enumerate(t.events) if k in ("p", "m")]
        marks = [t.events[i] for i in bounds]
        if marks0 is None:
            marks0 = marks
        elif marks != marks0:
            raise PlanError(f"the step at {t.seq_len} tokens changes phase in another order "
                            f"than at {traces[0].seq_len}: it cannot be fitted")
        starts = [0] + [b + 1 for b in bounds]
        ends = bounds + [len(t.events)]
        out.append(list(zip(starts, ends)))
    return out


def fold_loops(traces: Sequence[StepTrace]) -> list[StepTrace]:
    """The steps with the parts that differ between their lengths folded (Note [Loops in the step]);
    the same steps when none does."""
    parts = _parts(traces)
    toks = [_tokens(t) for t in traces]
    middles: list[dict[int, tuple[int, int]]] = [{} for _ in traces]
    for g in range(len(parts[0])):
        seqs = [ts[a:e] for ts, (a, e) in zip(toks, (p[g] for p in parts))]
        if all(x == seqs[0] for x in seqs[1:]):
            continue
        limit = min(len(x) for x in seqs)
        pre = 0
        while pre < limit and all(x[pre] == seqs[0][pre] for x in seqs[1:]):
            pre += 1
        suf = 0
        while suf < limit - pre and all(x[-1 - suf] == seqs[0][-1 - suf] for x in seqs[1:]):
            suf += 1
        for t, p in enumerate(parts):
            middles[t][g] = (p[g][0] + pre, p[g][1] - suf)
    if not middles[0]:
        return list(traces)
    # A kept event must be the same thing at every length: where it is not (a free of the last
    # iteration's tensor, which a longer step made in its middle), the middle grows over it.
    while True:
        foldings = [_Folding(t, p, m) for t, p, m in zip(traces, parts, middles)]
        n = len(foldings[0].kept)
        if any(len(f.kept) != n for f in foldings):
            raise PlanError("the folded steps keep different events: they cannot be fitted")
        bad = [p for p in range(n) if any(f.what(p) != foldings[0].what(p) for f in foldings[1:])]
        if not bad:
            break
        for f, m in zip(foldings, middles):
            for p in bad:
                g, a, e = f.absorb(p)
                m[g] = (min(a, m.get(g, (a, e))[0]), max(e, m.get(g, (a, e))[1]))
    keys: dict[tuple, None] = {}
    for f in foldings:
        for key in f.groups():
            keys[key] = None
    order = sorted(keys, key=repr)
    return [f.fold(order) for f in foldings]


def unfolded_kink(traces: Sequence[StepTrace]) -> Optional[int]:
    """A folded allocation whose bytes are not linear in the length through the steps
    (Note [Loops in the step]: a loop's iterations hold the same bytes each, but which moment of a
    middle is its excursion can change over the first few), or None."""
    if len(traces) < 3 or not traces[0].folded:
        return None
    s = [t.seq_len for t in traces]
    for i in traces[0].folded:
        v = [t.sizes[i] for t in traces]
        for k in range(2, len(v)):
            if ((v[k - 1] - v[k - 2]) * (s[k] - s[k - 1])
                    != (v[k] - v[k - 1]) * (s[k - 1] - s[k - 2])):
                return i
    return None


__all__ = ["fold_loops", "unfolded_kink"]
