"""A step at any sequence length from steps measured at a few: each allocation's size and each
phase's work fitted as c0 + c1*s + c2*s^2 through the measured lengths, exactly in rationals
(HfMeasurement.at), on one side of every length where the step changes otherwise.

Note [Replaying the step]
A peak is a max over time of sums, not a polynomial in the length (the LM head's gradient can
be the peak at 256 tokens and the logits at 16K), so peaks are not fitted. LiveBytes logs every
allocation and free in order; every length runs the same ops in the same order
(check_same_step), so allocation i has one size per length, a polynomial of degree at most two
(activations are linear in s, an s x s mask quadratic, weights' gradients constant), fitted
exactly through the three lengths. HfMeasurement.at(s) replays the log with the sizes at s:
the peaks of that step, which tests check against a step measured at s directly.

Note [One side of every threshold]
Three things change a step at a length in a way no polynomial follows, and each happens at a
length the config or the step fixes: (1) SDPA gets a mask only from a length on: a sliding-
window layer when s >= sliding_window (masking_utils._ignore_causal_mask_sdpa: no skip once
kv_length >= local_attention_size), a chunked layer when s > attention_chunk_size — the mask
and the kernel that takes it (with its saved copy) appear there; eager attention masks at every
length, so only SDPA models have these; (2) a softmax row over the keys that reaches 48 KiB
switches to the kernel that reads it three times (Note [Kernel bytes] in
stowage/measure/op_work.py): the work jumps, not the bytes (eager attention's fp32 scores at
12288 keys, gpt-oss's bf16 scores with the sink column at 24575); (3) an
index_put(accumulate=True) sorts its destination's row ids on their significant bits only
(Note [Kernel bytes]), a pass per 8 bits: a routed block's gathers of the tokens and of the t*k
routed rows take one pass more once those rows pass 2^(8j) + 1 (Qwen3-MoE, top-8: at 33, 257
and 8193 tokens). So the measured lengths and the length a profile is for must lie on one side
of each: measure_hf(config, seq_len=N) picks its lengths between the thresholds around N (the
defaults scaled by a power of two, or 1 : 1.5 : 2 where the interval is narrow), and
HfMeasurement.at() refuses a length across one from them. The softmax and sort thresholds come
from the step itself: rows that grow with the length, at two lengths, give their offset from s
(and a sort's rows their multiple of it).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any, Sequence

from ..plan import PlanError
from .hf_model import HfModel
from .hf_trace import StepTrace
from .op_work import SHARED_MEMORY_PER_BLOCK, WORK_FIELDS, OpWork

# Three lengths fit a constant, a linear and a quadratic term exactly.
DEFAULT_LENGTHS = (256, 512, 1024)


def fit(points: Sequence[tuple[int, float]]) -> list[Fraction]:
    """Coefficients c0, c1, c2 of c0 + c1*s + c2*s^2 through the points (fewer terms with fewer
    points: two fit c1*s + c2*s^2), solved exactly."""
    pts = [(Fraction(s), Fraction(v)) for s, v in points]
    powers = [0, 1, 2] if len(pts) >= 3 else [1, 2][:len(pts)]
    pts = pts[:len(powers)]
    m = [[s ** p for p in powers] + [v] for s, v in pts]
    size = len(powers)
    for c in range(size):  # Gauss-Jordan; distinct lengths make it non-singular
        pivot = next(r for r in range(c, size) if m[r][c] != 0)
        m[c], m[pivot] = m[pivot], m[c]
        for r in range(size):
            if r != c and m[r][c] != 0:
                f = m[r][c] / m[c][c]
                m[r] = [a - f * b for a, b in zip(m[r], m[c])]
    coeffs = [Fraction(0)] * 3
    for c, p in enumerate(powers):
        coeffs[p] = m[c][size] / m[c][c]
    return coeffs


def extrapolate(points: Sequence[tuple[int, float]], seq_len: int) -> Fraction:
    c = fit(points)
    return c[0] + c[1] * seq_len + c[2] * seq_len * seq_len


def _work_at(works: Sequence[OpWork], lengths: Sequence[int], seq_len: int) -> OpWork:
    out = OpWork()
    for f in WORK_FIELDS:
        v = extrapolate([(s, getattr(w, f)) for s, w in zip(lengths, works)], seq_len)
        setattr(out, f, max(0.0, float(v)))
    return out


@dataclasses.dataclass
class HfMeasurement:
    hf: HfModel
    lengths: list[int]
    traces: list[StepTrace]
    # Note [One side of every threshold]: (length, what happens there).
    thresholds: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    def covers(self, seq_len: int) -> bool:
        """Whether `seq_len` lies on the measured lengths' side of every threshold."""
        return all((seq_len >= t) == (self.lengths[0] >= t) for t, _ in self.thresholds)

    def at(self, seq_len: int) -> StepTrace:
        """The step at `seq_len` tokens: each allocation's size and each phase's work fitted
        through the measured lengths (Note [Replaying the step])."""
        for t, what in self.thresholds:
            if (seq_len >= t) != (self.lengths[0] >= t):
                raise PlanError(
                    f"seq_len {seq_len} is on the other side of {what} at {t} tokens from the "
                    f"measured lengths {self.lengths}: measure with seq_len={seq_len} "
                    "(Note [One side of every threshold])")
        t0 = self.traces[0]
        ls = self.lengths
        sizes = [max(0, round(extrapolate([(s, t.sizes[i]) for s, t in zip(ls, self.traces)],
                                          seq_len)))
                 for i in range(len(t0.sizes))]

        def works(key: Any, table: str) -> OpWork:
            return _work_at([getattr(t, table).get(key, OpWork()) for t in self.traces], ls,
                            seq_len)
        return dataclasses.replace(
            t0, seq_len=seq_len, sizes=sizes,
            work={k: works(k, "work") for k in t0.work},
            module_work={k: works(k, "module_work") for k in t0.module_work})


def check_same_step(traces: Sequence[StepTrace]) -> None:
    """Sizes can be fitted one allocation at a time only if every length ran the same ops in
    the same order."""
    t0 = traces[0]
    for t in traces[1:]:
        same = (t.events == t0.events and len(t.sizes) == len(t0.sizes)
                and [[(n, i, m) for n, i, m in l] for l in t.saved] == t0.saved
                and t.inputs == t0.inputs and t.outputs == t0.outputs and t.grads == t0.grads
                and set(t.work) == set(t0.work) and set(t.module_work) == set(t0.module_work))
        if not same:
            raise PlanError(
                f"the step at {t.seq_len} tokens ran other ops than at {t0.seq_len} "
                f"({len(t.events)} vs {len(t0.events)} events): its sizes cannot be fitted "
                "allocation by allocation; choose other --lengths")


def mask_thresholds(hf: HfModel) -> list[tuple[int, str]]:
    """Where SDPA starts to get a mask (Note [One side of every threshold]); none for eager
    attention, which masks at every length."""
    cfg = hf.model.config
    if getattr(cfg, "_attn_implementation", "sdpa") != "sdpa":
        return []
    types = set(getattr(cfg, "layer_types", None) or [])
    out = []
    window = getattr(cfg, "sliding_window", None)
    if window and ("sliding_attention" in types or not types and
                   getattr(cfg, "use_sliding_window", True)):
        out.append((int(window), "the sliding window (SDPA's mask from here on)"))
    chunk = getattr(cfg, "attention_chunk_size", None)
    if chunk and "chunked_attention" in types:
        out.append((int(chunk) + 1, "the attention chunk (SDPA's mask beyond it)"))
    return out


def softmax_thresholds(traces: Sequence[StepTrace]) -> list[tuple[int, str]]:
    """Lengths where a softmax row that grows with the length reaches 48 KiB
    (Note [One side of every threshold]): a row present at each length as s + c with one
    constant c."""
    if len(traces) < 2:
        return []
    out = []
    first, second = traces[0], traces[1]
    for row, size in sorted(first.softmax_rows):
        c = row - first.seq_len
        if (second.seq_len + c, size) in second.softmax_rows and c > -first.seq_len:
            t = -(-SHARED_MEMORY_PER_BLOCK // size) - c
            if t > 0:
                out.append((t, f"a softmax row of 48 KiB ({size}-byte elements)"))
    return sorted(set(out))


def sort_thresholds(traces: Sequence[StepTrace]) -> list[tuple[int, str]]:
    """Lengths where an index_put's sort takes one more pass (Note [One side of every threshold]):
    destination rows a*s + c at every measured length (a whole, e.g. the tokens or the tokens
    times top-k) reach 2^(8j) + 1, one more bit than j passes sort."""
    if len(traces) < 2:
        return []
    out = []
    first, second = traces[0], traces[1]
    for rows in sorted(first.sort_rows):
        for a in range(1, max(1, rows // max(1, first.seq_len)) + 1):
            c = rows - a * first.seq_len
            if a * second.seq_len + c not in second.sort_rows:
                continue
            for j in range(1, 8):
                t = -(-(2 ** (8 * j) + 1 - c) // a)
                if t > 0:
                    out.append((t, f"an index_put sort of {a} x tokens + {c} rows taking "
                                   f"{j + 1} passes"))
    return sorted(set(out))


def lengths_between(thresholds: Sequence[tuple[int, str]], seq_len: int,
                    default: Sequence[int] = DEFAULT_LENGTHS) -> list[int]:
    """Three lengths with `seq_len` between the same thresholds: `default` scaled by the power
    of two nearest 1 that fits, else 1 : 1.5 : 2 from the interval's start."""
    lo = max([t for t, _ in thresholds if t <= seq_len], default=1)
    hi = min([t for t, _ in thresholds if t > seq_len], default=None)

    def fits(ls: Sequence[int]) -> bool:
        return all(lo <= x and (hi is None or x < hi) for x in ls) and len(set(ls)) == len(ls)

    for k in sorted(range(-12, 13), key=abs):
        for base in (tuple(default), (256, 384, 512)):
            ls = [int(x * 2.0 ** k) for x in base]
            if fits(ls):
                return ls
    ls = [lo, lo + (lo + 1) // 2, 2 * lo]
    if fits(ls):
        return ls
    raise PlanError(f"no three lengths between the thresholds {lo} and {hi} around seq_len "
                    f"{seq_len}; pass lengths=")


__all__ = ["DEFAULT_LENGTHS", "HfMeasurement", "check_same_step", "extrapolate", "fit",
           "lengths_between", "mask_thresholds", "softmax_thresholds", "sort_thresholds"]
