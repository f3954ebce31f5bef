"""What the wrapper (stowage.layers) and the profiler (stowage.measure.profile) both say of a
tensor: which saved tensors an offload_saved layer sends to the host, how many bytes that moves,
when two saved tensors are one, and which tensor a layer hands the next. One definition each, so
a measured profile's host bytes are the bytes the wrapper moves.

The lowest torch module of the package: it imports torch and nothing of stowage.
"""

from __future__ import annotations

import bisect
import itertools
from typing import Any

import torch
import torch.nn as nn


def storage(t: torch.Tensor) -> Any:
    """The tensor's storage: untyped_storage() where torch has it, storage() on torch 1.x."""
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage()
    return t.storage()  # torch 1.x


def storage_ptr(t: torch.Tensor) -> int:
    """The address of the tensor's storage (not of its first element: a view's differs)."""
    return storage(t).data_ptr()


def offload_nbytes(t: torch.Tensor) -> int:
    """The bytes offloading `t` moves: the span of memory its elements lie in, from data_ptr()
    up (numel() elements for a dense tensor; fewer for an expanded one, more for one with
    gaps). The copy keeps the tensor's strides, so backward sees the same layout and runs the
    same kernels: copying into a contiguous tensor (as a clone in torch's own saved-tensor hooks
    does) changed gradient bits of Hugging Face MoE layers. The profiler counts saved bytes
    with this function too, so plans reserve what is moved."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()


def saved_key(t: torch.Tensor) -> tuple:
    """What makes two saved tensors the same tensor to offload: one copy serves both."""
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)


class ResidentMemory:
    """The address ranges of the storages of a module's parameters and buffers: a saved tensor
    that lies in one (the weight itself, its transpose, a slice) stays on the device. Looked up
    by address (a bisection), as a saved tensor's own storage object costs more to build."""

    def __init__(self, module: nn.Module):
        spans: dict[int, int] = {}
        for t in itertools.chain(module.parameters(), module.buffers()):
            if hasattr(t, "to_local"):  # a DTensor (FSDP2's sharded parameter): this rank's
                t = t.to_local()  # shard, whose storage is a real one
            s = storage(t)
            start, nbytes = s.data_ptr(), s.nbytes()
            if nbytes > 0:
                spans[start] = max(spans.get(start, 0), nbytes)
        self._starts = sorted(spans)
        self._ends = [start + spans[start] for start in self._starts]

    def holds(self, t: torch.Tensor) -> bool:
        ptr = t.data_ptr()
        i = bisect.bisect_right(self._starts, ptr) - 1
        return i >= 0 and ptr < self._ends[i]


def resident_storages(module: nn.Module) -> ResidentMemory:
    """The memory of a module's parameters and buffers (see ResidentMemory)."""
    return ResidentMemory(module)


def offloadable(t: torch.Tensor, device: torch.device, resident: ResidentMemory) -> bool:
    """Whether an offload_saved layer sends this saved tensor to the host. The profiler
    (stowage.measure.profile) uses the same rule, so plan host_bytes and the bytes saved
    agree."""
    return (t.layout is torch.strided and t.device == device and t.numel() > 0
            and not resident.holds(t))


def hidden_state(out: Any, i: int, layer: nn.Module) -> torch.Tensor:
    """The hidden state layer `i` returned: the tensor itself, or a tuple's first element (the
    Hugging Face convention before transformers 4.54, and of many decoder layers still)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"layer {i} ({type(layer).__name__}) returned {type(out).__name__}; "
                    "PlannedLayers passes a tensor, or a tuple's first element, from layer to "
                    "layer")


__all__ = ["ResidentMemory", "hidden_state", "offload_nbytes", "offloadable",
           "resident_storages", "saved_key", "storage", "storage_ptr"]
