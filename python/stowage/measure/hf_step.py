"""The figures of a logged step, part by part (StepPoint, LayerPoint): each layer's saved tensors,
own forward and backward bytes, gradients, and what it holds at its backward's peak; the loss's and
the embedding's; as the planner's simulator counts them (Note [Measured hf],
Note [The backward peak's moment]).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from .hf_trace import StepTrace
from .live_bytes import replay


@dataclasses.dataclass
class LayerPoint:
    """What one layer did in one step."""
    input_bytes: int
    output_bytes: int
    saved: list[tuple[str, int, str]]  # (name, bytes, module that regenerates it or "")
    retained_bytes: int     # live after its forward minus live before it
    forward_own_bytes: int  # the planner's own forward bytes, input included
    backward_own_bytes: int  # the planner's own backward bytes (Note [Measured hf])
    grad_bytes: int
    # At its backward's peak (Note [The backward peak's moment]): of grad_bytes, those made by
    # then; of saved_bytes, those its backward has released by then.
    peak_grad_bytes: int = 0
    peak_released_bytes: int = 0
    # What its checkpoint holds to its backward when it is recomputed: of what the decoder hands
    # it, what the forward frees (its layer type's mask, Note [hf masks] in
    # planner/frameworks/hf_build_layer.cc); layers handed the same tensors share a group.
    checkpoint_held_bytes: int = 0
    checkpoint_held_group: int = 0

    @property
    def saved_bytes(self) -> int:
        return sum(b for _n, b, _m in self.saved)


@dataclasses.dataclass
class StepPoint:
    """What one step did, by part."""
    seq_len: int
    layers: list[LayerPoint]
    other_bytes: int      # made before the first layer and held through it (RoPE cos/sin)
    loss_peak_bytes: int  # LM head and loss: beyond the live bytes when the final norm starts
    loss_grad_bytes: int
    embedding_grad_bytes: int
    peak_bytes: int       # the step's live-bytes peak (weights and token ids not included)
    # What the loss made and the caller holds to the step's end: the model output's logits
    # (Note [The backward peak's moment]).
    held_logits_bytes: int = 0
    # Of other_bytes, what the forward frees (the step's masks, which a checkpoint holds).
    forward_freed_bytes: int = 0
    checkpoint_held_bytes: int = 0  # of forward_freed_bytes, what the layers are handed


def evaluate(trace: StepTrace, sizes: Optional[Sequence[int]] = None) -> StepPoint:
    """The step's figures with allocation sizes `sizes` (default: the traced ones).

    Note [Measured hf]: each part's own bytes are what make the planner's simulator reach the
    live bytes measured at that part's peak. The simulator's level (over fixed memory) is, in
    the forward of layer j, the resident bytes of layers before j plus j's own forward bytes;
    in the loss, every layer's resident bytes plus the last output and the loss's peak bytes;
    in the backward of layer j, the resident bytes of layers before j, the gradients made so
    far (the loss's, those of layers after j, j's own) plus j's own backward bytes. So each own
    figure is the measured peak less those terms, and whatever else is alive then and unknown
    to the simulator counts in it: the embedding output, which transformers' decoder keeps
    (`inputs_embeds`) through every layer's forward. The model output's logits, which the
    training loop holds through the backward, are the profile's own term (loss.held_logits_bytes,
    StepCost::held_logits_bytes as the analytic hf recipe names them), and so are the gradients
    a layer has made by its backward's peak (Note [The backward peak's moment]).

    Note [The backward peak's moment]
    Eager PyTorch makes a layer's weight gradients while its backward runs (AccumulateGrad, in
    reverse forward order: Note [hf gradient timing] in planner/frameworks/hf_build_layer.cc) and
    releases each saved tensor once the node that saved it has run. So at the moment the layer's
    backward peaks some of its gradients exist and some of its saved tensors are gone: Mixtral's
    (4096 tokens) is in its attention's backward, with the MoE block's gradients made (2.62 of
    the layer's 2.70 GiB, gate_up_proj's 1.75 GiB among them) and 0.94 of its 1.33 GiB of saved
    tensors released. That moment (the first at which the phase reaches its
    peak; the gradients only grow within it) is read off the replay: the layer's gradients
    alive then (peak_grad_bytes) and the bytes of its saved tensors freed by then
    (peak_released_bytes). The planner puts them where the analytic recipe puts its moments'
    (profile.cc Note [Measured layers]): the own backward bytes are net of the gradients made by
    the peak only, and the released tensors are not counted at it. What the loss made and is
    still alive when the backward ends, gradients aside, is what the caller holds to the step's
    end (the model output's logits): alive in every layer's backward and at the end, where the
    embedding's gradient is made, so each layer's own bytes are net of it and the profile
    states it once (held_logits_bytes)."""
    sizes = trace.sizes if sizes is None else sizes
    entered, peaks, marks, peak = replay(trace.events, sizes)
    moments, held_logits = _backward_moments(trace, sizes)
    grad = {k: sum(sizes[i] for i in ids) for k, ids in trace.grads.items()}
    n = len(trace.inputs)
    tensors = [[(name, sizes[i], module) for name, i, module in trace.saved[j]] for j in range(n)]
    resident = [sum(b for _n, b, _m in t) for t in tensors]
    grads = [grad.get(("layer", j), 0) for j in range(n)]
    in0 = sizes[trace.inputs[0]]
    other = entered[("forward", 0)] - entered["embedding"] - in0
    # What of `other` the forward frees (the attention masks: the decoder builds them once and
    # no layer saves them, Note [hf masks] in planner/frameworks/hf_build_layer.cc) is not alive in
    # the loss and the backward of this step, but a checkpointed step's layers hold them until their
    # backward. As the analytic recipe counts them: in every layer's forward (its own bytes are
    # over what stays only) and in its checkpoint (checkpoint_held_bytes); the profile's fixed
    # bytes are what stays.
    held = other - _freed_before_backward(trace, sizes)
    # Of it, what the layers were handed (the masks; not a temporary of the decoder's forward):
    # what a layer's checkpoint holds to its backward (checkpoint_held_bytes).
    handed = _freed_before_backward(trace, sizes, set(trace.layer_args))
    # Per layer, what it is handed of that, and its group: the layers handed the same tensors
    # (Note [hf masks]: a layer type's mask).
    groups: dict[tuple[int, ...], int] = {}
    held_by: list[tuple[int, int]] = []
    for j in range(len(trace.inputs)):
        args = trace.layer_args_of[j] if trace.layer_args_of else trace.layer_args
        ids = tuple(sorted(_freed_ids_before_backward(trace, set(args))))
        held_by.append((sum(sizes[x] for x in ids), groups.setdefault(ids, len(groups))))
    points = []
    for j in range(n):
        fwd, bwd = ("forward", j), ("backward", j)
        in_b, out_b = sizes[trace.inputs[j]], sizes[trace.outputs[j]]
        saves_input = any(name == "input" for name, _b, _m in tensors[j])
        before = held + sum(resident[:j])
        peak_grad, released = moments[j]
        bwd_own = (peaks[bwd] - held - sum(resident[:j]) - grad.get("loss", 0) -
                   sum(grads[j + 1:]) - peak_grad - held_logits)
        points.append(LayerPoint(
            input_bytes=in_b, output_bytes=out_b, saved=tensors[j],
            retained_bytes=marks[("forward_end", j)] - entered[fwd],
            forward_own_bytes=max(0, peaks[fwd] - before),
            backward_own_bytes=max(0, bwd_own - (in_b if saves_input else 0)),
            grad_bytes=grads[j], peak_grad_bytes=peak_grad, peak_released_bytes=released,
            checkpoint_held_bytes=held_by[j][0], checkpoint_held_group=held_by[j][1]))
    loss_peak = peaks["loss"] - held - sum(resident) - points[-1].output_bytes
    return StepPoint(
        seq_len=trace.seq_len, layers=points, other_bytes=other,
        forward_freed_bytes=other - held, checkpoint_held_bytes=handed,
        loss_peak_bytes=max(0, loss_peak), loss_grad_bytes=grad.get("loss", 0),
        embedding_grad_bytes=grad.get("embedding", 0), peak_bytes=peak,
        held_logits_bytes=held_logits)


def _backward_moments(trace: StepTrace, sizes: Sequence[int]
                      ) -> tuple[list[tuple[int, int]], int]:
    """Note [The backward peak's moment]: per layer, (its gradients alive, its saved tensors'
    bytes freed) at the first moment its backward phase reaches its peak, as replay() finds
    the peak; and the bytes the loss made that are alive when the backward ends, gradients
    aside (the caller's output)."""
    n = len(trace.inputs)
    grad_of = {i: ("layer", k[1]) for k, ids in trace.grads.items()
               if isinstance(k, tuple) for i in ids}
    gradient = {i for ids in trace.grads.values() for i in ids}
    saved_of = {i: j for j in range(n) for _name, i, _m in trace.saved[j]}
    grads_alive = [0] * n
    freed = [0] * n
    best: dict[int, int] = {}
    moments = [(0, 0)] * n
    alive: set[int] = set()
    phase: Any = None
    held_logits = 0

    def at_peak(live: int) -> None:
        if isinstance(phase, tuple) and phase[0] == "backward":
            j = phase[1]
            if live > best.get(j, -1):
                best[j] = live
                moments[j] = (grads_alive[j], freed[j])

    live = 0
    loss_made: set[int] = set()
    for kind, x in trace.events:
        if kind == "a":
            live += sizes[x]
            alive.add(x)
            if phase == "loss":
                loss_made.add(x)
            if x in grad_of:
                grads_alive[grad_of[x][1]] += sizes[x]
            at_peak(live)
        elif kind == "f":
            live -= sizes[x]
            alive.discard(x)
            if x in grad_of:
                grads_alive[grad_of[x][1]] -= sizes[x]
            if x in saved_of:
                freed[saved_of[x]] += sizes[x]
        elif kind == "p":
            phase = x
            at_peak(live)
        elif x == "backward_end":
            held_logits = sum(sizes[i] for i in alive & loss_made if i not in gradient)
    return moments, held_logits


def _freed_before_backward(trace: StepTrace, sizes: Sequence[int],
                           only: Optional[set[int]] = None) -> int:
    """Bytes made before the first layer (other than its input) and freed before the first
    layer's backward starts; of the allocations `only` where given."""
    return sum(sizes[x] for x in _freed_ids_before_backward(trace, only))


def _freed_ids_before_backward(trace: StepTrace, only: Optional[set[int]] = None) -> list[int]:
    """The allocations _freed_before_backward counts, in the order they were made."""
    made: set[int] = set()
    phase: Any = None
    freed: list[int] = []
    for kind, x in trace.events:
        if kind == "p":
            phase = x
            if isinstance(x, tuple) and x[0] == "backward":
                break
        elif kind == "a" and phase == "embedding" and x != trace.inputs[0] and \
                (only is None or x in only):
            made.add(x)
        elif kind == "f" and x in made:
            made.discard(x)
            if phase != "embedding":  # a temporary of the embedding is not in `other`
                freed.append(x)
    return freed


__all__ = ["LayerPoint", "StepPoint", "evaluate"]
