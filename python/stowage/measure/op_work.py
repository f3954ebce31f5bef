"""The work of each aten op by the planner's op classes (planner/hardware/op_time.h OpWork):
GEMM, fp32 GEMM, attention forward and backward, grouped GEMM FLOPs, memory-bound bytes and
kernel count, as the CUDA kernels of torch 2.11 run them (Note [Kernel bytes]). LiveBytes
(stowage.measure.live_bytes) adds each op's work to the phase and modules running it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import torch
from torch.utils._pytree import tree_flatten

WORK_FIELDS = ("gemm_flops", "fp32_gemm_flops", "attention_forward_flops",
               "attention_backward_flops", "grouped_gemm_flops", "torch_grouped_mm_flops",
               "tokens_per_expert", "elementwise_bytes", "kernels")

_ATTENTION_FORWARD = {"_scaled_dot_product_flash_attention_for_cpu",
                      "_scaled_dot_product_flash_attention",
                      "_scaled_dot_product_efficient_attention",
                      "_scaled_dot_product_cudnn_attention"}
_ATTENTION_BACKWARD = {f"{n}_backward" for n in _ATTENTION_FORWARD}
_GEMMS = {"mm", "addmm", "bmm", "baddbmm"}
# Ops that allocate or relabel without a kernel that moves bytes.
_NO_KERNEL = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided",
              "lift_fresh", "lift_fresh_copy", "_local_scalar_dense", "sym_size", "sym_stride",
              "sym_numel", "sym_storage_offset", "is_same_size",
              "_has_compatible_shallow_copy_type"}
# Gathers read what they write (plus the index), not the whole table.
_GATHERS = {"embedding", "index", "index_select", "gather"}
# Note [Kernel bytes]: the ops whose CUDA kernels move other bytes than "every input read once,
# every output written once" — the GPU runs them, so their bytes are the GPU's, which the
# analytic hf profile (planner/frameworks/) counts the same way.
#  - softmax / log_softmax over a row wider than one block's shared memory (48 KiB,
#    sharedMemPerBlock on sm70-sm100; aten/src/ATen/native/cuda/SoftMax.cu host_softmax: the
#    persistent and the shared-memory kernels read the row once): cunn_SoftMaxForward reads it
#    three times (max, sum of exponentials, the output); cunn_SoftMaxBackward reads the
#    gradient twice (its row sum, then the output's gradient) — the loss over the vocabulary.
#  - nll_loss reads one log-probability per row, the target's; its backward zeroes the
#    gradient and writes one value per row (LossNLL.cu): neither reads the whole [t, V] input.
#  - fills (zeros, new_zeros, zeros_like, fill_, zero_, ...) write their output and read
#    nothing, whatever tensor they are called on.
#  - sort runs CUB's onesweep radix sort over every bit of its keys (Sort.cpp, SortStable.cu;
#    planner/frameworks/hf_ffn.cc Note [Routing kernels]: the positions' fill, two memsets, a
#    histogram, an exclusive sum, then a memset and a pass per 8 bits reading and writing keys
#    and int64 positions): an int64 key 8 + 8 + 8 x 32 = 272 bytes, 21 kernels; index_put with
#    accumulate=True first computes its linear index (remainder, the stride's mul, the division
#    by the slice: three int64 kernels) and the positions (arange), and sorts on the
#    destination's significant bits only (Indexing.cu index_put_with_sort_kernel:
#    get_num_bits(rows - 1)): 56 + 8 + passes x 32 bytes per index, 4 + 4 + 2 x passes kernels.
#  - topk with sorted=True sorts its k results in place after the selection (TensorTopK.cu):
#    two kernels, the k values and int64 indices read and written once more.
#  - histc zeroes its output first, and over 100 or more bins a per-block partial histogram
#    too (SummaryOps.cu CUDA_tensor_histogram, MULTI_BLOCK): two or three kernels.
#  - index_put with accumulate=True over slices wider than one element (a gather's backward:
#    `hidden[perm // k]`, `weighted_out[inv_perm]`, a bias gathered by expert id) then runs
#    indexing_backward_kernel: one warp per distinct destination row walks that row's
#    duplicates one after another and, for each, reads the value row, reads the destination
#    row and writes it back (Indexing.cu: `weight[ii]` is reloaded from `grad_weight` and
#    stored for every duplicate, not accumulated in registers). So it moves 3 bytes per value
#    byte whatever the destination's size: a token's k routed rows read and rewrite its
#    destination row k times. One-element slices take indexing_backward_kernel_stride_1,
#    which sums a row's duplicates in a warp and writes each destination once.
#  - _grouped_mm is two kernels on sm90 (GroupMM.cu bf16bf16_grouped_mm):
#    prepare_grouped_gemm_data, then the CUTLASS grouped GEMM (Note [torch._grouped_mm rate] in
#    planner/hardware/hardware.cc).
#  - slice_backward (a slice's gradient, e.g. rotate_half's in RoPE) is two kernels: a zero
#    fill of the whole input's size, then a copy of the gradient into the slice.
#  - embedding_dense_backward zeroes the [V, h] gradient, sorts the ids, sums each id's rows
#    into fp32 partials (written and read: 8 bytes per element) and writes them (Embedding
#    Backward Kernel.cu embedding_backward_cuda_kernel): 2Vh + 12 bytes per gradient element.
SHARED_MEMORY_PER_BLOCK = 48 * 1024
_FILLS = {"zeros", "ones", "full", "new_zeros", "new_ones", "new_full", "zeros_like",
          "ones_like", "full_like", "fill_", "zero_", "fill"}


def radix_sort_work(key_bytes: int, key_bits: int) -> tuple[float, float]:
    """(bytes, kernels) per key of CUB's onesweep radix sort of `key_bytes`-wide keys with int64
    values over their low `key_bits` bits: planner/frameworks/hf.h RadixSortWork
    (Note [Routing kernels] in planner/frameworks/hf_ffn.cc), the same numbers."""
    passes = (key_bits + 7) // 8
    return float(key_bytes + passes * 2 * (key_bytes + 8)), float(4 + 2 * passes)


def sort_key_bits(largest_key: int) -> int:
    """at::cuda::cub::get_num_bits: the bits torch sorts keys up to `largest_key` on
    (planner/frameworks/hf.h SortKeyBits)."""
    bits = 1
    while largest_key > 1:
        largest_key >>= 1
        bits += 1
    return bits


def _sort(keys: torch.Tensor) -> tuple[float, float]:
    """(bytes, kernels) of torch.sort of `keys` on CUDA: the int64 positions' fill, then the
    radix sort over every bit of the key (Note [Kernel bytes])."""
    per_key, kernels = radix_sort_work(keys.element_size(), 8 * keys.element_size())
    return keys.numel() * (per_key + 8), 1 + kernels


def index_put_rows(args: tuple) -> tuple[int, int]:
    """(destination rows, elements per row) of index_put(self, indices, values, ...): the
    rows are what index_put_with_sort_kernel sorts the ids of (largestIndex(self) / sliceSize
    + 1 for a contiguous self)."""
    target = args[0]
    indexed = [t is not None for t in args[1]] + [False] * (target.dim() - len(args[1]))
    slice_elements = math.prod(n for n, i in zip(target.shape, indexed) if not i)
    return max(1, target.numel() // max(1, slice_elements)), slice_elements


def _index_put_sort(index: torch.Tensor, rows: int) -> tuple[float, float]:
    """(bytes, kernels) of index_put_with_sort_kernel before its accumulation (Note [Kernel bytes]):
    the linear index, the positions and the sort of `index` on the bits of the destination's last
    row id."""
    per_key, kernels = radix_sort_work(8, sort_key_bits(rows - 1))
    return index.numel() * (56 + per_key), 4 + kernels


def accumulates(name: str, args: tuple, kwargs: dict) -> bool:
    return name in ("index_put", "index_put_", "_index_put_impl_") and (
        (len(args) > 3 and args[3] is True) or kwargs.get("accumulate") is True)


SOFTMAX = {"_softmax", "_log_softmax"}
SOFTMAX_BACKWARD = {"_softmax_backward_data", "_log_softmax_backward_data"}


def _row_passes(t: torch.Tensor, dim: int, wide: int) -> int:
    """How often a softmax kernel reads `t` along `dim`: once when a row fits one block's
    shared memory, `wide` times when it does not (Note [Kernel bytes])."""
    row = t.shape[dim] * t.element_size() if t.dim() > 0 else 0
    return wide if row >= SHARED_MEMORY_PER_BLOCK else 1


@dataclasses.dataclass
class OpWork:
    """planner/hardware/op_time.h OpWork: what a pass runs, by op class (totals, not per token)."""
    gemm_flops: float = 0
    # mm / bmm on float32 operands: CUDA cores, not tensor cores, under torch's default float32
    # matmul precision (planner/hardware/op_time.h OpWork::fp32_gemm_flops)
    fp32_gemm_flops: float = 0
    attention_forward_flops: float = 0
    attention_backward_flops: float = 0
    grouped_gemm_flops: float = 0
    # aten._grouped_mm: its own kernel and rate (Note [torch._grouped_mm rate] in
    # planner/hardware/hardware.cc)
    torch_grouped_mm_flops: float = 0
    tokens_per_expert: float = 0  # grouped GEMM rows per group, FLOP-weighted
    elementwise_bytes: float = 0
    kernels: float = 0

    def grouped(self) -> float:
        return self.grouped_gemm_flops + self.torch_grouped_mm_flops

    def add(self, other: "OpWork") -> None:
        grouped = self.grouped() + other.grouped()
        if grouped > 0:
            self.tokens_per_expert = (self.tokens_per_expert * self.grouped() +
                                      other.tokens_per_expert * other.grouped()) / grouped
        for f in WORK_FIELDS:
            if f != "tokens_per_expert":
                setattr(self, f, getattr(self, f) + getattr(other, f))

    def to_dict(self) -> dict[str, float]:
        return {f: float(getattr(self, f)) for f in WORK_FIELDS}


def tensors_in(tree: Any) -> list[torch.Tensor]:
    """The tensors in an op's arguments or outputs, in order: tuples, lists and dicts walked
    here (tree_flatten's registry lookups were a fifth of a measured step's time). No closure:
    a self-referencing one is a reference cycle that would keep the tensors alive past their
    last use until the collector runs, and LiveBytes would see them freed late."""
    out: list[torch.Tensor] = []
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (tuple, list)):
            stack.extend(reversed(x))
        elif isinstance(x, dict):
            stack.extend(reversed(list(x.values())))
        elif x is not None and not isinstance(x, (int, float, bool, str, torch.dtype,
                                                  torch.device, torch.layout,
                                                  torch.memory_format)):
            out.extend(t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor))
    return out


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _attention_flops(args: tuple, causal: bool) -> tuple[float, float]:
    """(forward, backward) FLOPs of an SDPA core on q [b, hq, s, d], k [b, hkv, skv, d],
    v [b, hkv, skv, dv]. Forward: S = QK^T and O = PV. Backward (flash): S again, dV = P^T dO,
    dP = dO V^T, dQ = dS K, dK = dS^T Q. A causal kernel skips the masked half of its blocks."""
    q, k, v = args[0], args[1], args[2]
    b, hq, s, d = q.shape
    skv, dv = k.shape[-2], v.shape[-1]
    pairs = b * hq * s * skv * (0.5 if causal else 1.0)
    return 2 * pairs * (d + dv), 2 * pairs * (2 * d + 2 * dv + d)


def _grouped_flops(a: torch.Tensor, b: torch.Tensor, groups: int) -> tuple[float, float]:
    """(FLOPs, rows per group) of torch._grouped_mm(a, b, offs) with `groups` groups: 2-D a
    [M, K] with 3-D b [G, K, N] routes each row to one group; 2-D x 2-D ([K, M] x [M, N], the
    weight gradient) splits the reduction over M into the groups; 3-D x 3-D is a batched GEMM
    of a.shape[1] rows per group."""
    if a.dim() == 2 and b.dim() == 3:
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[2], a.shape[0] / b.shape[0]
    if a.dim() == 2 and b.dim() == 2:
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[1], a.shape[1] / max(1, groups)
    if a.dim() == 3 and b.dim() == 3:
        return 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2], float(a.shape[1])
    # 3-D a [G, M, K] with 2-D b [K?]: each group's rows against one shared operand.
    return 2.0 * a.numel() * b.shape[-1], float(a.shape[-2])


def op_work(func: Any, args: tuple, kwargs: dict, out: Any) -> Optional[OpWork]:
    """The work of one aten op, or None for a view or an op without a kernel."""
    if getattr(func, "is_view", False) or func.namespace == "prim":
        return None
    name = func._overloadpacket.__name__
    if name in _NO_KERNEL or name in ("detach", "alias", "view", "_unsafe_view"):
        return None
    w = OpWork(kernels=1)
    if name in _GEMMS:
        from torch.utils.flop_counter import flop_registry
        count = flop_registry[func._overloadpacket]
        flops = count(*args, **kwargs, out_val=out)
        # The operands' dtype picks the rate: float32 runs without TF32 on the GPU (torch's
        # default, Note [Op time] in planner/hardware/op_time.cc), every other dtype on tensor
        # cores.
        if any(t.dtype == torch.float32 for t in tensors_in(args)):
            w.fp32_gemm_flops = flops
        else:
            w.gemm_flops = flops
    elif name in _ATTENTION_FORWARD or name in _ATTENTION_BACKWARD:
        backward = name in _ATTENTION_BACKWARD
        # Forward (q, k, v, dropout, is_causal, ...); backward (grad_out, q, k, v, out, lse,
        # dropout, is_causal, ...): is_causal is the first bool argument.
        tensors = args[1:4] if backward else args[0:3]
        names = [a.name for a in func._schema.arguments]
        at = names.index("is_causal")
        causal = kwargs.get("is_causal", args[at] if len(args) > at else False)
        fwd, bwd = _attention_flops(tensors, bool(causal))
        if backward:
            w.attention_backward_flops = bwd
        else:
            w.attention_forward_flops = fwd
    elif name == "_grouped_mm":
        offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
        groups = offs.numel() if isinstance(offs, torch.Tensor) else 1
        w.torch_grouped_mm_flops, w.tokens_per_expert = _grouped_flops(args[0], args[1], groups)
        w.kernels = 2  # prepare_grouped_gemm_data and the GEMM (Note [Kernel bytes])
    elif name in SOFTMAX:
        x = args[0]
        w.elementwise_bytes = _row_passes(x, args[1], 3) * _bytes(x) + sum(
            _bytes(t) for t in tensors_in(out))
    elif name in SOFTMAX_BACKWARD:
        grad, output = args[0], args[1]
        w.elementwise_bytes = (_row_passes(grad, args[2], 2) * _bytes(grad) + _bytes(output) +
                               sum(_bytes(t) for t in tensors_in(out)))
    elif name == "nll_loss_forward":
        # (self, target, weight, reduction, ignore_index): the target's value in each row.
        target = args[1]
        w.elementwise_bytes = _bytes(target) * (1 + args[0].element_size() / 8) + sum(
            _bytes(t) for t in tensors_in(out))
    elif name == "nll_loss_backward":
        # (grad_output, self, target, weight, reduction, ignore_index, total_weight)
        w.elementwise_bytes = sum(_bytes(t) for t in tensors_in(out)) + _bytes(args[2])
    elif name in _FILLS:
        w.elementwise_bytes = sum(_bytes(t) for t in tensors_in(out))
    elif name == "sort":
        w.elementwise_bytes, w.kernels = _sort(args[0])
    elif name == "topk":
        # The selection reads the input and writes the k values and indices; sorted=True
        # (the default) sorts them in place: read and written once more, one kernel more.
        outs = sum(_bytes(t) for t in tensors_in(out))
        sorted_ = args[4] if len(args) > 4 else kwargs.get("sorted", True)
        w.elementwise_bytes = _bytes(args[0]) + outs * (3 if sorted_ else 1)
        w.kernels = 2 if sorted_ else 1
    elif name == "histc" and args[0].dim() > 0:
        bins = args[1] if len(args) > 1 else kwargs.get("bins", 100)
        w.elementwise_bytes = _bytes(args[0]) + sum(_bytes(t) for t in tensors_in(out))
        w.kernels = 3 if bins >= 100 else 2  # the output's zeros (and MULTI_BLOCK's partial's)
    elif accumulates(name, args, kwargs):
        index = [t for t in tensors_in(args[1]) if t is not None]
        target = args[0]
        rows, slice_elements = index_put_rows(args)
        sort_bytes, sort_kernels = _index_put_sort(index[0], rows) if index else (0.0, 0.0)
        if index and slice_elements > 1:
            # indexing_backward_kernel: every value row reads and rewrites its destination
            # row (Note [Kernel bytes]); the values as the kernel reads them (expanded first).
            rows = math.prod(torch.broadcast_shapes(*(t.shape for t in index)))
            w.elementwise_bytes = (3 * rows * slice_elements * target.element_size() +
                                   sum(_bytes(t) for t in index) + sort_bytes)
        else:
            w.elementwise_bytes = sum(_bytes(t) for t in tensors_in((args, kwargs))) + sum(
                _bytes(t) for t in tensors_in(out)) + sort_bytes
        w.kernels = 1 + sort_kernels
    elif name == "slice_backward":
        w.kernels = 2
        w.elementwise_bytes = sum(_bytes(t) for t in tensors_in(out)) + 2 * _bytes(args[0])
    elif name == "embedding_dense_backward":
        grad, ids = args[0], args[1]
        w.elementwise_bytes = (sum(_bytes(t) for t in tensors_in(out)) + _bytes(ids) +
                               _bytes(grad) * (1 + 4 + 1))
    elif name in _GATHERS:
        outs = tensors_in(out)
        index = [t for t in tensors_in(args) if not t.is_floating_point()]
        w.elementwise_bytes = 2 * sum(_bytes(t) for t in outs) + sum(_bytes(t) for t in index)
    else:
        w.elementwise_bytes = sum(_bytes(t) for t in tensors_in((args, kwargs))) + sum(
            _bytes(t) for t in tensors_in(out))
    return w


__all__ = ["OpWork", "SHARED_MEMORY_PER_BLOCK", "SOFTMAX", "SOFTMAX_BACKWARD", "WORK_FIELDS",
           "accumulates", "index_put_rows", "op_work", "radix_sort_work", "sort_key_bits",
           "tensors_in"]
