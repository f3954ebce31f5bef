"""One training step of a transformers model, logged op by op: LiveBytes' allocations, frees and
phases, and which allocations are each layer's input, output and saved tensors and each part's
gradients (StepTrace). The step is the one a training loop runs: forward, the model's own loss,
backward, the output held through the backward.

Note [Saved by allocation]
What autograd saves is told apart by allocation (LiveBytes' ids), not by storage address: a
StorageImpl's address is reused once it is freed, and the step frees saved tensors before it
ends. DeepSeek-V3's and GLM's group-limited router (DeepseekV3TopkRouter.forward) builds
scores_for_choice from the sigmoid scores, saves for its topk(2) the int64 indices and for its
masked_fill the bool mask, and then only uses the top-k indices, which need no gradient: the
branch of the graph that saved them is dropped when the router returns, they are freed, and
the next allocations (the shared expert's gate/up output, grouped_mm's offsets) may get their
addresses, depending on the sizes malloc saw before. Keyed by address, those later saves
looked already seen at some lengths and not at others ("ran other ops" at 256 vs 512 tokens,
event sequences identical); and the dropped branch's tensors were counted as kept. So a saved
tensor is known by its allocation id, and what is freed before its layer's forward ends is not
the layer's.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import torch
import torch.nn as nn

from .hf_families import cross_attention_inputs, gpu_sdpa, one_sequence
from .hf_model import HfModel, decoder_of
from .live_bytes import LiveBytes, storage_key
from .op_work import OpWork, tensors_in


@dataclasses.dataclass
class StepTrace:
    """One logged training step: LiveBytes' events and sizes, and which allocations are what."""
    seq_len: int
    events: list[tuple[str, Any]]
    sizes: list[int]
    saved: list[list[tuple[str, int, str]]]  # per layer: (name, allocation id, module)
    inputs: list[int]   # per layer: allocation id of its input
    outputs: list[int]  # per layer: allocation id of its output
    grads: dict[Any, list[int]]  # "loss", "embedding", ("layer", j): their gradients' ids
    work: dict[Any, OpWork]
    module_work: dict[Any, OpWork]  # (("forward", j), child name) -> its forward work
    softmax_rows: set = dataclasses.field(default_factory=set)  # (row, element size)
    sort_rows: set = dataclasses.field(default_factory=set)  # index_put's destination rows
    made_by: list[str] = dataclasses.field(default_factory=list)  # by allocation id: its op
    folded: list[int] = dataclasses.field(default_factory=list)  # Note [Loops in the step]
    # Allocation ids of the tensors the decoder hands its layers besides the hidden states (the
    # masks, RoPE's cos/sin): what a layer's checkpoint holds (Note [Measured hf]).
    layer_args: list[int] = dataclasses.field(default_factory=list)
    # Per layer, the ones it is handed (each layer type its own mask: Note [hf masks]).
    layer_args_of: list[list[int]] = dataclasses.field(default_factory=list)


def _grad_owner(model: nn.Module, decoder: nn.Module) -> dict[int, Any]:
    """Which part's backward creates each parameter's gradient: ("layer", j), "loss" (the final
    norm and LM head, and a tied embedding) or "embedding"."""
    owner: dict[int, Any] = {}
    for j, layer in enumerate(decoder.layers):
        for p in layer.parameters():
            owner[id(p)] = ("layer", j)
    head = model.get_output_embeddings()
    for m in [decoder.norm] + ([head] if head is not None else []):
        for p in m.parameters():
            owner[id(p)] = "loss"
    for p in model.parameters():
        owner.setdefault(id(p), "embedding")
    return owner


def _hidden(x: Any) -> torch.Tensor:
    return x[0] if isinstance(x, (tuple, list)) else x


def trace_model_step(model: nn.Module, seq_len: int) -> StepTrace:
    decoder = decoder_of(model)
    layers = list(decoder.layers)
    n = len(layers)
    params = {storage_key(p) for p in model.parameters()}
    owner = _grad_owner(model, decoder)
    mode = LiveBytes()
    saved: list[list[tuple[str, int, str]]] = [[] for _ in layers]
    seen: set[int] = set()  # allocation ids already saved (Note [Saved by allocation])
    inputs = [-1] * n
    outputs = [-1] * n
    in_key = [0] * n
    counts: list[dict[str, int]] = [dict() for _ in layers]
    children: list[tuple[str, set]] = []  # the layer's children running now, outermost first
    handles = []

    def on_grad(phase: Any) -> Callable:
        def hook(_grad: torch.Tensor) -> None:
            mode.set_phase(phase)
        return hook

    layer_args: set[int] = set()
    args_of: list[set[int]] = [set() for _ in layers]

    def pre(j: int) -> Callable:
        def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            x = _hidden(args[0] if args else kwargs["hidden_states"])
            for t in tensors_in((args[1:], {k: v for k, v in kwargs.items()
                                            if k != "hidden_states"})):
                if storage_key(t) in mode.live_ids:
                    layer_args.add(mode.live_ids[storage_key(t)])
                    args_of[j].add(mode.live_ids[storage_key(t)])
            mode.set_phase(("forward", j))
            inputs[j] = mode.ref(x)
            in_key[j] = storage_key(x)
            if j == 0 and x.requires_grad:
                x.register_hook(on_grad("embedding_backward"))
        return hook

    def post(j: int) -> Callable:
        def hook(_m: nn.Module, _args: tuple, _kwargs: dict, out: Any) -> None:
            y = _hidden(out)
            outputs[j] = mode.ref(y)
            # Note [Saved by allocation]: what a dropped branch of the graph saved is freed
            # with it before the layer ends; it is not the layer's to keep.
            alive = set(mode.live_ids.values())
            saved[j][:] = [e for e in saved[j] if e[1] in alive]
            mode.mark(("forward_end", j))
            y.register_hook(on_grad(("backward", j)))
        return hook

    def child_pre(name: str) -> Callable:
        def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            children.append((name, {storage_key(t) for t in tensors_in((args, kwargs))}))
            mode.modules.append((mode.phase, name))
        return hook

    def child_post(_m: nn.Module, _args: tuple, _kwargs: dict, _out: Any) -> None:
        children.pop()
        mode.modules.pop()

    for j, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(pre(j), with_kwargs=True))
        handles.append(layer.register_forward_hook(post(j), with_kwargs=True))
        for name, child in layer.named_children():
            handles.append(child.register_forward_pre_hook(child_pre(name), with_kwargs=True))
            handles.append(child.register_forward_hook(child_post, with_kwargs=True))
    handles.append(decoder.norm.register_forward_pre_hook(
        lambda _m, _a: mode.set_phase("loss")))

    def pack(t: torch.Tensor) -> torch.Tensor:
        phase = mode.phase
        if (not (isinstance(phase, tuple) and phase[0] == "forward")
                or t.layout is not torch.strided):
            return t
        j = phase[1]
        key = storage_key(t)
        if key in params or mode.live_ids.get(key) in seen:
            return t
        if key == in_key[j]:
            name, module = "input", ""
        elif key in mode.live_ids and mode.allocated_in[mode.live_ids[key]] == phase:
            # The outermost child running now regenerates it, unless it is that child's input
            # (a checkpointed child keeps its inputs).
            module = children[0][0] if children and key not in children[0][1] else ""
            k = counts[j].get(module, 0)
            counts[j][module] = k + 1
            name = f"{module or 'layer'}.{k}"
        else:
            return t  # made before this layer (RoPE cos/sin): the step's, not the layer's
        i = mode.ref(t)
        seen.add(i)
        saved[j].append((name, i, module))
        return t

    model.zero_grad(set_to_none=True)
    try:
        ids = torch.randint(0, model.config.get_text_config().vocab_size, (1, seq_len))
        with mode, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                one_sequence(), gpu_sdpa():
            mode.set_phase("embedding")
            # As a training loop holds it (and as the measured cases of tests/planner/data/measured
            # were stepped): the output, with its bf16 logits, stays alive through the backward.
            out = model(input_ids=ids, labels=ids, use_cache=False,
                        **cross_attention_inputs(model, seq_len))
            out.loss.backward()
            mode.mark("backward_end")  # what is alive here and not after: the caller's output
            del out
            grads: dict[Any, list[int]] = {}
            for p in model.parameters():
                if p.grad is not None:
                    grads.setdefault(owner[id(p)], []).append(mode.ref(p.grad))
            model.zero_grad(set_to_none=True)
        mode.set_phase("end")
    finally:
        for h in handles:
            h.remove()
    return StepTrace(seq_len=seq_len, events=mode.events, sizes=mode.sizes, saved=saved,
                     inputs=inputs, outputs=outputs, grads=grads, work=mode.work,
                     module_work=mode.module_work, softmax_rows=mode.softmax_rows,
                     sort_rows=mode.sort_rows,
                     made_by=mode.made_by, layer_args=sorted(layer_args),
                     layer_args_of=[sorted(a) for a in args_of])


def trace_step(hf: HfModel, seq_len: int) -> StepTrace:
    """One logged training step of `hf.model` at `seq_len` tokens."""
    with hf.mode if hf.mode is not None else contextlib.nullcontext():
        return trace_model_step(hf.model, seq_len)


__all__ = ["StepTrace", "trace_model_step", "trace_step"]
