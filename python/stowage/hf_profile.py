"""A measured layer profile of a Hugging Face transformers model, without a GPU.

    python -m stowage.profile --hf config.json --seq-len 16384 --out profile.json
    stowage plan --profile profile.json --hardware h200 --force keep

measure_hf() builds the transformers model of a config.json (bf16, SDPA, train mode) and runs
one training step (forward, the model's own loss, backward) at a few short sequence lengths,
watching every aten op with a TorchDispatchMode: live bytes by storage (LiveBytes), what autograd
saves (saved_tensors_hooks, each storage once), the peaks of each layer's forward and backward
and of the LM head and loss, and each op's work by class (GEMM, attention, grouped GEMM FLOPs,
memory-bound bytes, kernel count). Each figure is fitted as c0 + c1*s + c2*s^2 in the sequence
length s through the measured points (exactly, in rationals) and evaluated at the requested
length; to_model_profile() writes the "stowage-layer-profile" the C++ planner reads.

Note [Fake tensors at real widths]
The model runs on FakeTensorMode tensors that report device "cpu": every op runs its meta
kernel, so shapes, dtypes, strides and storages (and therefore every byte figure) are exactly
those of the CPU run, while no memory is allocated and no arithmetic is done. So the widths are
the config's own (an 8B model's layer costs nothing), and no scaling by dimensions is needed.
SDPA picks its kernel from the query's device and shapes before dispatch
(sdp::select_sdp_backend_cpp), so a fake "cpu" query takes the CPU flash kernel as a real one
does, and saves what the CUDA flash kernel saves (q, k, v, output, logsumexp). MoE routing is
data-dependent only in values (transformers' grouped_mm path: histc, sort, _grouped_mm over
t*k rows), not in shapes. `fake=False` runs real CPU tensors instead (tests compare the two).

Note [SDPA on the GPU]
SDPA picks a kernel per call (Note [SDPA Runtime Dispatch], aten/src/ATen/native/transformers/
cuda/sdp_utils.cpp; the CPU's in sdp_utils_cpp.cpp), and where the CPU's choice keeps other
bytes than the GPU's, a fake step runs the GPU's kernel (its meta function) instead. On an H200,
torch 2.11 tries cuDNN, flash, memory-efficient, math in that order (check_prefer_cudnn_attention:
cuDNN runtime > 9.15 on sm90; the cu130 wheel ships cuDNN 9.19). cuDNN takes head dims up to 128,
or d_qk 192 with d_v 128 on sm90 with cuDNN >= 9.11 (check_cudnn_tensor_shapes; the 9.22 d256
branch of later versions is not in 2.11's library: no 92200 constant, no d256 message), any
layout, and a mask; flash takes no mask and one head dim up to 256 (check_head_dim_size_flash);
the memory-efficient kernel takes any head dims divisible by 8. Where the CPU differs:
 - q/k and v head dims differ (MLA: qk_nope + qk_rope against v_head_dim): the CPU flash kernel
   needs one head dim (check_head_dim_size_cpp), so the CPU runs the math decomposition, which
   keeps the s x s scores and their softmax. The GPU runs cuDNN for DeepSeek's 192/128 (else
   the memory-efficient kernel). cuDNN writes its output in the query's layout
   (alloc_with_matching_layout, aten/src/ATen/native/cudnn/MHA.cpp); MLA's query is a cat, so
   [b, h, s, d] contiguous, and transformers' `.transpose(1, 2).contiguous()` copies it for
   o_proj, which keeps the copy while cuDNN keeps the output.
 - a mask cuDNN refuses (GLM-5's DSA layers: head dim 256) with a query that is not in
   [b, s, h, d] layout: the GPU runs the memory-efficient kernel, whose output is [b, s, h, d]
   whatever the query's, so nothing is copied for o_proj; the CPU flash kernel writes the
   query's layout, and the copy is made.
cuDNN and the memory-efficient kernel keep q, k, v, the output, the fp32 logsumexp and the
additive mask, which SDPA converts from bool in the query's dtype (convert_boolean_attn_mask)
(tools/autograd/derivatives.yaml). Real CPU tensors (fake=False) have neither kernel and measure
what the CPU runs.

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

Note [Replaying the step]
A peak is a max over time of sums, not a polynomial in the length (the LM head's gradient can
be the peak at 256 tokens and the logits at 16K), so peaks are not fitted. LiveBytes logs every
allocation and free in order; every length runs the same ops in the same order
(_check_same_step), so allocation i has one size per length, a polynomial of degree at most two
(activations are linear in s, an s x s mask quadratic, weights' gradients constant), fitted
exactly through the three lengths. HfMeasurement.at(s) replays the log with the sizes at s:
the peaks of that step, which tests check against a step measured at s directly.

Note [One side of every threshold]
Two things change a step at a length in a way no polynomial follows, and both happen at a
length the config or the step fixes: (1) SDPA gets a mask only from a length on: a sliding-
window layer when s >= sliding_window (masking_utils._ignore_causal_mask_sdpa: no skip once
kv_length >= local_attention_size), a chunked layer when s > attention_chunk_size — the mask
and the kernel that takes it (with its saved copy) appear there; eager attention masks at every
length, so only SDPA models have these; (2) a softmax row over the keys that reaches 48 KiB
switches to the kernel that reads it three times (Note [Kernel bytes]): the work jumps, not the
bytes (eager attention's fp32 scores at 12288 keys, gpt-oss's bf16 scores with the sink
column at 24575); (3) an index_put(accumulate=True) sorts its destination's row ids on their
significant bits only (Note [Kernel bytes]), a pass per 8 bits: a routed block's gathers of the
tokens and of the t*k routed rows take one pass more once those rows pass 2^(8j) + 1 (Qwen3-MoE,
top-8: at 33, 257 and 8193 tokens). So the measured lengths and the length a profile is for must lie on one side
of each: measure_hf(config, seq_len=N) picks its lengths between the thresholds around N (the
defaults scaled by a power of two, or 1 : 1.5 : 2 where the interval is narrow), and
HfMeasurement.at() refuses a length across one from them. The softmax and sort thresholds come from
the step itself: rows that grow with the length, at two lengths, give their offset from s (and
a sort's rows their multiple of it).

Depth: one layer per distinct layer kind (the module tree's class names, parameter shapes and
attention_type), in model order; the others are dropped from model.model.layers before the step,
and the config's per-layer lists with them (Note [One layer per kind], _keep_layers).
Weights are counted over the full-depth model (fake, so free): the text decoder and its LM
head, what the planner plans (a multimodal wrapper's vision tower is built but not counted, and
a text-only step gives it no pixels); each layer's figures are its kind's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import weakref
from fractions import Fraction
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .plan import PlanError

# Three lengths fit a constant, a linear and a quadratic term exactly.
DEFAULT_LENGTHS = (256, 512, 1024)
# The planner tries every subset of a layer's modules (planner/frameworks/layer_profile.h kMaxProfileModules).
MAX_MODULES = 8
# CheckStepCostBounds allows 64 saved tensors per layer; beyond this many, a module's tensors
# are merged into one entry per module.
MAX_SAVED = 48

# The profile's grad_dtype names (planner/frameworks/layer_profile.cc); other dtypes are not stated.
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}

WORK_FIELDS = ("gemm_flops", "fp32_gemm_flops", "attention_forward_flops",
               "attention_backward_flops", "grouped_gemm_flops", "torch_grouped_mm_flops",
               "tokens_per_expert", "elementwise_bytes", "kernels")


def _key(t: torch.Tensor) -> int:
    """A storage's identity: its StorageImpl (data_ptr() is 0 for every fake tensor)."""
    return t.untyped_storage()._cdata


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


# ---------------------------------------------------------------------------------------------
# Op work by class.

_ATTENTION_FORWARD = {"_scaled_dot_product_flash_attention_for_cpu",
                      "_scaled_dot_product_flash_attention",
                      "_scaled_dot_product_efficient_attention",
                      "_scaled_dot_product_cudnn_attention"}
_ATTENTION_BACKWARD = {f"{n}_backward" for n in _ATTENTION_FORWARD}
_GEMMS = {"mm", "addmm", "bmm", "baddbmm"}
# Ops that allocate or relabel without a kernel that moves bytes.
_NO_KERNEL = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided",
              "lift_fresh", "lift_fresh_copy", "_local_scalar_dense", "sym_size", "sym_stride",
              "sym_numel", "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type"}
# Gathers read what they write (plus the index), not the whole table.
_GATHERS = {"embedding", "index", "index_select", "gather"}
# Note [Kernel bytes]: the ops whose CUDA kernels move other bytes than "every input read once,
# every output written once" — the GPU runs them, so their bytes are the GPU's, which the
# analytic hf profile (planner/frameworks/hf.cc) counts the same way.
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
#    planner/frameworks/hf.cc Note [Routing kernels]: the positions' fill, two memsets, a
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
#    prepare_grouped_gemm_data, then the CUTLASS grouped GEMM (planner/hardware/hardware.cc Note
#    [torch._grouped_mm rate]).
#  - slice_backward (a slice's gradient, e.g. rotate_half's in RoPE) is two kernels: a zero
#    fill of the whole input's size, then a copy of the gradient into the slice.
#  - embedding_dense_backward zeroes the [V, h] gradient, sorts the ids, sums each id's rows
#    into fp32 partials (written and read: 8 bytes per element) and writes them (Embedding
#    Backward Kernel.cu embedding_backward_cuda_kernel): 2Vh + 12 bytes per gradient element.
_SHARED_MEMORY_PER_BLOCK = 48 * 1024
_FILLS = {"zeros", "ones", "full", "new_zeros", "new_ones", "new_full", "zeros_like",
          "ones_like", "full_like", "fill_", "zero_", "fill"}


def radix_sort_work(key_bytes: int, key_bits: int) -> tuple[float, float]:
    """(bytes, kernels) per key of CUB's onesweep radix sort of `key_bytes`-wide keys with int64
    values over their low `key_bits` bits: planner/frameworks/hf.h RadixSortWork (Note [Routing
    kernels] in planner/frameworks/hf.cc), the same numbers."""
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


def _index_put_rows(args: tuple) -> tuple[int, int]:
    """(destination rows, elements per row) of index_put(self, indices, values, ...): the
    rows are what index_put_with_sort_kernel sorts the ids of (largestIndex(self) / sliceSize
    + 1 for a contiguous self)."""
    target = args[0]
    indexed = [t is not None for t in args[1]] + [False] * (target.dim() - len(args[1]))
    slice_elements = math.prod(n for n, i in zip(target.shape, indexed) if not i)
    return max(1, target.numel() // max(1, slice_elements)), slice_elements


def _index_put_sort(index: torch.Tensor, rows: int) -> tuple[float, float]:
    """(bytes, kernels) of index_put_with_sort_kernel before its accumulation (Note [Kernel
    bytes]): the linear index, the positions and the sort of `index` on the bits of the
    destination's last row id."""
    per_key, kernels = radix_sort_work(8, sort_key_bits(rows - 1))
    return index.numel() * (56 + per_key), 4 + kernels


def _accumulates(name: str, args: tuple, kwargs: dict) -> bool:
    return name in ("index_put", "index_put_", "_index_put_impl_") and (
        (len(args) > 3 and args[3] is True) or kwargs.get("accumulate") is True)

_SOFTMAX = {"_softmax", "_log_softmax"}
_SOFTMAX_BACKWARD = {"_softmax_backward_data", "_log_softmax_backward_data"}


def _row_passes(t: torch.Tensor, dim: int, wide: int) -> int:
    """How often a softmax kernel reads `t` along `dim`: once when a row fits one block's
    shared memory, `wide` times when it does not (Note [Kernel bytes])."""
    row = t.shape[dim] * t.element_size() if t.dim() > 0 else 0
    return wide if row >= _SHARED_MEMORY_PER_BLOCK else 1


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
    # aten._grouped_mm: its own kernel and rate (planner/hardware/hardware.cc Note [torch._grouped_mm rate])
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


def _tensors(tree: Any) -> list[torch.Tensor]:
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
        # default, Note [Op time] in planner/hardware/op_time.cc), every other dtype on tensor cores.
        if any(t.dtype == torch.float32 for t in _tensors(args)):
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
    elif name in _SOFTMAX:
        x = args[0]
        w.elementwise_bytes = _row_passes(x, args[1], 3) * _bytes(x) + sum(
            _bytes(t) for t in _tensors(out))
    elif name in _SOFTMAX_BACKWARD:
        grad, output = args[0], args[1]
        w.elementwise_bytes = (_row_passes(grad, args[2], 2) * _bytes(grad) + _bytes(output) +
                               sum(_bytes(t) for t in _tensors(out)))
    elif name == "nll_loss_forward":
        # (self, target, weight, reduction, ignore_index): the target's value in each row.
        target = args[1]
        w.elementwise_bytes = _bytes(target) * (1 + args[0].element_size() / 8) + sum(
            _bytes(t) for t in _tensors(out))
    elif name == "nll_loss_backward":
        # (grad_output, self, target, weight, reduction, ignore_index, total_weight)
        w.elementwise_bytes = sum(_bytes(t) for t in _tensors(out)) + _bytes(args[2])
    elif name in _FILLS:
        w.elementwise_bytes = sum(_bytes(t) for t in _tensors(out))
    elif name == "sort":
        w.elementwise_bytes, w.kernels = _sort(args[0])
    elif name == "topk":
        # The selection reads the input and writes the k values and indices; sorted=True
        # (the default) sorts them in place: read and written once more, one kernel more.
        outs = sum(_bytes(t) for t in _tensors(out))
        sorted_ = args[4] if len(args) > 4 else kwargs.get("sorted", True)
        w.elementwise_bytes = _bytes(args[0]) + outs * (3 if sorted_ else 1)
        w.kernels = 2 if sorted_ else 1
    elif name == "histc" and args[0].dim() > 0:
        bins = args[1] if len(args) > 1 else kwargs.get("bins", 100)
        w.elementwise_bytes = _bytes(args[0]) + sum(_bytes(t) for t in _tensors(out))
        w.kernels = 3 if bins >= 100 else 2  # the output's zeros (and MULTI_BLOCK's partial's)
    elif _accumulates(name, args, kwargs):
        index = [t for t in _tensors(args[1]) if t is not None]
        target = args[0]
        rows, slice_elements = _index_put_rows(args)
        sort_bytes, sort_kernels = _index_put_sort(index[0], rows) if index else (0.0, 0.0)
        if index and slice_elements > 1:
            # indexing_backward_kernel: every value row reads and rewrites its destination
            # row (Note [Kernel bytes]); the values as the kernel reads them (expanded first).
            rows = math.prod(torch.broadcast_shapes(*(t.shape for t in index)))
            w.elementwise_bytes = (3 * rows * slice_elements * target.element_size() +
                                   sum(_bytes(t) for t in index) + sort_bytes)
        else:
            w.elementwise_bytes = sum(_bytes(t) for t in _tensors((args, kwargs))) + sum(
                _bytes(t) for t in _tensors(out)) + sort_bytes
        w.kernels = 1 + sort_kernels
    elif name == "slice_backward":
        w.kernels = 2
        w.elementwise_bytes = sum(_bytes(t) for t in _tensors(out)) + 2 * _bytes(args[0])
    elif name == "embedding_dense_backward":
        grad, ids = args[0], args[1]
        w.elementwise_bytes = (sum(_bytes(t) for t in _tensors(out)) + _bytes(ids) +
                               _bytes(grad) * (1 + 4 + 1))
    elif name in _GATHERS:
        outs = _tensors(out)
        index = [t for t in _tensors(args) if not t.is_floating_point()]
        w.elementwise_bytes = 2 * sum(_bytes(t) for t in outs) + sum(_bytes(t) for t in index)
    else:
        w.elementwise_bytes = sum(_bytes(t) for t in _tensors((args, kwargs))) + sum(
            _bytes(t) for t in _tensors(out))
    return w


# ---------------------------------------------------------------------------------------------
# Live bytes.

class LiveBytes(TorchDispatchMode):
    """Follows the bytes of every storage an op creates while the mode is active: a storage
    counts from the op that returns it (an output whose storage is none of the op's inputs')
    until its StorageImpl is freed (weakref.finalize on the storage object, which PyTorch keeps
    alive as long as the StorageImpl is). Storages that existed before (weights, inputs) are not
    counted. Every allocation, free and phase change is logged in order (`events`), so the
    same step can be replayed with other sizes (Note [Replaying the step]); `phase` labels what
    runs now, and every op's work is added to the phase's OpWork and to that of each entry of
    `modules` (the modules running now)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.sizes: list[int] = []       # by allocation id
        self.allocated_in: list[Any] = []  # by allocation id: the phase that made it
        self.made_by: list[str] = []     # by allocation id: the op that made it (Note [Loops])
        self.events: list[tuple[str, Any]] = []  # ("a", id), ("f", id), ("p", phase), ("m", x)
        self.live_ids: dict[int, int] = {}  # storage key -> allocation id, while alive
        self.phase: Any = None
        self.work: dict[Any, OpWork] = {}
        self.modules: list[Any] = []
        self.module_work: dict[Any, OpWork] = {}
        # (row length, element size) of every softmax (Note [One side of every threshold]).
        self.softmax_rows: set[tuple[int, int]] = set()
        # The destination rows of every index_put(accumulate=True) (Note [One side of every
        # threshold]: its sort's passes follow their bits).
        self.sort_rows: set[int] = set()

    def set_phase(self, phase: Any) -> None:
        self.phase = phase
        self.events.append(("p", phase))

    def mark(self, what: Any) -> None:
        self.events.append(("m", what))

    def ref(self, t: torch.Tensor) -> int:
        """The allocation id of t's storage; one made before the mode gets an id of its own,
        with its size and no allocation event."""
        key = _key(t)
        if key not in self.live_ids:
            self.sizes.append(_nbytes(t))
            self.allocated_in.append(None)
            self.made_by.append("")
            return len(self.sizes) - 1
        return self.live_ids[key]

    def _free(self, key: int) -> None:
        i = self.live_ids.pop(key, None)
        if i is not None:
            self.live -= self.sizes[i]
            self.events.append(("f", i))

    def _track(self, t: torch.Tensor, inputs: set, op: str) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in inputs or key in self.live_ids:
            return
        i = len(self.sizes)
        self.sizes.append(storage.nbytes())
        self.allocated_in.append(self.phase)
        self.made_by.append(op)
        self.live_ids[key] = i
        self.events.append(("a", i))
        self.live += self.sizes[i]
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {_key(t) for t in _tensors((args, kwargs)) if t.layout is torch.strided}
        name = func._overloadpacket.__name__
        for t in _tensors(out):
            if t.layout is torch.strided:
                self._track(t, inputs, name)
        if name in _SOFTMAX or name in _SOFTMAX_BACKWARD:
            x, dim = args[0], args[1] if name in _SOFTMAX else args[2]
            if x.dim() > 0:
                self.softmax_rows.add((int(x.shape[dim]), x.element_size()))
        if _accumulates(name, args, kwargs):
            self.sort_rows.add(_index_put_rows(args)[0])
        w = op_work(func, args, kwargs, out)
        if w is not None:
            self.work.setdefault(self.phase, OpWork()).add(w)
            for m in self.modules:
                self.module_work.setdefault(m, OpWork()).add(w)
        return out


def replay(events: Sequence[tuple[str, Any]], sizes: Sequence[int]
           ) -> tuple[dict[Any, int], dict[Any, int], dict[Any, int], int]:
    """Note [Replaying the step]: the live bytes of a logged step with allocation sizes `sizes`.
    Returns, per phase, the live bytes when it was first entered and the most it reached; per
    mark, the live bytes there; and the step's peak."""
    live = peak = 0
    phase: Any = None
    entered: dict[Any, int] = {}
    peaks: dict[Any, int] = {}
    marks: dict[Any, int] = {}
    for kind, x in events:
        if kind == "a":
            live += sizes[x]
            peak = max(peak, live)
            peaks[phase] = max(peaks.get(phase, 0), live)
        elif kind == "f":
            live -= sizes[x]
        elif kind == "p":
            phase = x
            entered.setdefault(x, live)
            peaks[x] = max(peaks.get(x, 0), live)
        else:
            marks[x] = live
    return entered, peaks, marks, peak


# ---------------------------------------------------------------------------------------------
# The model.

def read_config(config: Any) -> dict[str, Any]:
    """A config.json path or dict, as a dict (model_type included)."""
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding="utf-8") as f:
            config = json.load(f)
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise PlanError("the config must be a JSON object with a string field 'model_type'")
    return dict(config)


def build_config(config: dict[str, Any]) -> Any:
    from transformers import AutoConfig
    d = dict(config)
    model_type = d.pop("model_type")
    # Training runs bf16 weights (measured/README); a checkpoint's quantization is not trained.
    for k in ("torch_dtype", "dtype", "quantization_config", "architectures", "transformers_version"):
        d.pop(k, None)
    try:
        cfg = AutoConfig.for_model(model_type, **d)
    except (KeyError, ValueError) as e:
        raise PlanError(f"transformers cannot build model_type {model_type!r}: {e}") from e
    cfg._attn_implementation = "sdpa"
    cfg.use_cache = False
    return cfg


def _model_class(cfg: Any) -> tuple[Any, type]:
    """The auto class and model class transformers trains `cfg` with: its causal LM, or for a
    multimodal wrapper without one (Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE) its image-text-to-text
    model, whose text decoder a text-only step runs (the vision tower gets no pixels)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText):
        model_class = auto._model_mapping.get(type(cfg), None)
        if model_class is not None:
            return auto, model_class
    # A text config whose causal LM is registered under its wrapper's config (MllamaTextConfig:
    # MllamaForCausalLM).
    import transformers
    name = type(cfg).__name__.replace("TextConfig", "ForCausalLM")
    model_class = getattr(transformers, name, None)
    if model_class is not None and getattr(model_class, "config_class", None) is type(cfg):
        return model_class, model_class
    raise PlanError(f"transformers has no causal LM or image-text-to-text model for "
                    f"{type(cfg).__name__}: not a decoder stowage.hf_profile knows")


def _text_parameters(model: nn.Module, decoder: nn.Module) -> list[nn.Parameter]:
    """The parameters of the text decoder and its LM head, each once: what the planner plans
    (a multimodal wrapper's vision tower is not)."""
    head = model.get_output_embeddings()
    params: dict[int, nn.Parameter] = {}
    for p in list(decoder.parameters()) + (list(head.parameters()) if head is not None else []):
        params.setdefault(id(p), p)
    return list(params.values())


def _decoder(model: nn.Module) -> nn.Module:
    inner = getattr(model, "model", None)
    # Multimodal wrappers keep the text decoder as model.model.language_model.
    inner = getattr(inner, "language_model", inner)
    if inner is None or not isinstance(getattr(inner, "layers", None), nn.ModuleList):
        raise PlanError(f"{type(model).__name__} has no model.layers ModuleList: not a decoder "
                        "stowage.hf_profile knows")
    return inner


def layer_kind(layer: nn.Module) -> tuple:
    """What makes two decoder layers cost the same: their module tree, parameter shapes and the
    attributes that choose a code path (attention_type: sliding or full)."""
    sig = []
    for name, m in layer.named_modules():
        attrs = tuple((a, repr(getattr(m, a))) for a in ("attention_type", "sliding_window",
                                                         "is_sliding", "layer_type")
                      if hasattr(m, a) and not callable(getattr(m, a)))
        params = tuple((n, tuple(p.shape), str(p.dtype))
                       for n, p in m.named_parameters(recurse=False))
        sig.append((name, type(m).__name__, params, attrs))
    return tuple(sig)


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
    # planner/frameworks/hf.cc); layers handed the same tensors share a group.
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


def _cross_attention_inputs(model: nn.Module, seq_len: int) -> dict[str, torch.Tensor]:
    """What Mllama's text decoder gets from MllamaForConditionalGeneration besides the tokens
    (Note [hf cross-attention] in planner/frameworks/hf.cc): one image's projected vision states,
    max_num_tiles tiles of (image_size / patch_size)^2 + 1 tokens (the vision config's, or
    MllamaVisionConfig's defaults for a text config), that every text token sees, and the masks
    _prepare_cross_attention_mask makes of it. Nothing for a model without cross-attention."""
    text = model.config.get_text_config()
    if not getattr(text, "cross_attention_layers", None):
        return {}
    from transformers.models.mllama.configuration_mllama import MllamaVisionConfig
    from transformers.models.mllama.modeling_mllama import _prepare_cross_attention_mask
    vision = getattr(model.config, "vision_config", None) or MllamaVisionConfig()
    tiles = vision.max_num_tiles
    per_tile = (vision.image_size // vision.patch_size) ** 2 + 1
    dtype = next(model.parameters()).dtype
    states = torch.randn(1, tiles * per_tile, text.hidden_size, dtype=dtype)
    mask, rows = _prepare_cross_attention_mask(
        torch.ones(1, seq_len, 1, tiles, dtype=torch.int64), per_tile, dtype)
    return dict(cross_attention_states=states, cross_attention_mask=mask,
                full_text_row_masked_out_mask=rows)


def _trace_step(model: nn.Module, seq_len: int) -> StepTrace:
    decoder = _decoder(model)
    layers = list(decoder.layers)
    n = len(layers)
    params = {_key(p) for p in model.parameters()}
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
            for t in _tensors((args[1:], {k: v for k, v in kwargs.items()
                                          if k != "hidden_states"})):
                if _key(t) in mode.live_ids:
                    layer_args.add(mode.live_ids[_key(t)])
                    args_of[j].add(mode.live_ids[_key(t)])
            mode.set_phase(("forward", j))
            inputs[j] = mode.ref(x)
            in_key[j] = _key(x)
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
            children.append((name, {_key(t) for t in _tensors((args, kwargs))}))
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
        if not (isinstance(phase, tuple) and phase[0] == "forward") or t.layout is not torch.strided:
            return t
        j = phase[1]
        key = _key(t)
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
                _one_sequence(), _gpu_sdpa():
            mode.set_phase("embedding")
            # As a training loop holds it (and shared/reference/measured/measure_hf.py): the
            # output, with its bf16 logits, stays alive through the backward.
            out = model(input_ids=ids, labels=ids, use_cache=False,
                        **_cross_attention_inputs(model, seq_len))
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


class _gpu_sdpa:
    """Note [SDPA on the GPU]: a call whose head dims the CPU flash kernel refuses runs, on fake
    tensors, the fused kernel the GPU runs instead of the CPU's math decomposition."""

    def __enter__(self) -> None:
        self.saved = torch.nn.functional.scaled_dot_product_attention
        torch.nn.functional.scaled_dot_product_attention = self._sdpa

    def __exit__(self, *exc: Any) -> None:
        torch.nn.functional.scaled_dot_product_attention = self.saved

    def _sdpa(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
              is_causal: bool = False, scale: Optional[float] = None,
              enable_gqa: bool = False) -> torch.Tensor:
        from torch._subclasses.fake_tensor import FakeTensor
        kernel = None
        if isinstance(query, FakeTensor) and query.dim() == 4 and query.shape[1] == key.shape[1]:
            kernel = _h200_sdpa_kernel(query, value, attn_mask is not None)
        if kernel is None:
            return self.saved(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        bias = None
        if attn_mask is not None:
            bias = attn_mask
            if attn_mask.dtype == torch.bool:  # convert_boolean_attn_mask
                bias = torch.where(attn_mask.logical_not(), float("-inf"),
                                   torch.zeros((), dtype=query.dtype))
            bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        if kernel == "cudnn":
            return torch.ops.aten._scaled_dot_product_cudnn_attention(
                query, key, value, bias, lse, dropout_p, is_causal, False, scale=scale)[0]
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, lse, dropout_p, is_causal, scale=scale)[0]


def _h200_sdpa_kernel(query: torch.Tensor, value: torch.Tensor, masked: bool) -> Optional[str]:
    """Note [SDPA on the GPU]: the kernel torch 2.11 runs on an H200 ("cudnn" or "efficient")
    where it keeps other bytes than the CPU's kernel, else None (the CPU's call is the GPU's)."""
    dqk, dv = query.shape[-1], value.shape[-1]
    # check_cudnn_tensor_shapes on sm90 with cuDNN 9.11-9.22: both head dims <= 128, or
    # exactly 192 and 128; multiples of 8.
    cudnn = dqk % 8 == 0 and dv % 8 == 0 and (max(dqk, dv) <= 128 or (dqk, dv) == (192, 128))
    if dqk != dv:
        return "cudnn" if cudnn else ("efficient" if dqk % 8 == 0 and dv % 8 == 0 else None)
    # Equal head dims: the CPU's flash kernel keeps what the GPU's keeps and writes its output
    # in the query's layout, as cuDNN does; with a mask that cuDNN refuses the GPU runs the
    # memory-efficient kernel, whose output is [b, s, h, d] whatever the query's layout.
    bshd = query.stride(1) == query.shape[-1] and query.stride(2) == query.shape[1] * query.shape[-1]
    if masked and not cudnn and not bshd and dqk % 8 == 0:
        return "efficient"
    return None


class _one_sequence:
    """transformers looks for packed sequences in position_ids (masking_utils.
    find_packed_sequence_indices) and returns None for one sequence, 0..s-1 as here; on fake
    tensors it cannot read the values and builds an s x s mask instead, which the real run does
    not. For the length of the step it answers what the real run computes: one sequence."""

    def __enter__(self) -> None:
        try:
            from transformers import masking_utils
        except ImportError:
            self.module = None
            return
        self.module = masking_utils
        self.saved = getattr(masking_utils, "find_packed_sequence_indices", None)
        if self.saved is not None:
            masking_utils.find_packed_sequence_indices = lambda position_ids: None

    def __exit__(self, *exc: Any) -> None:
        if self.module is not None and self.saved is not None:
            self.module.find_packed_sequence_indices = self.saved


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
    reverse forward order: Note [hf gradient timing] in planner/frameworks/hf.cc) and releases
    each saved tensor once the node that saved it has run. So at the moment the layer's
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
    # no layer saves them, Note [hf masks] in planner/frameworks/hf.cc) is not alive in the loss
    # and the backward of this step, but a checkpointed step's layers hold them until their
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


@dataclasses.dataclass
class HfModel:
    """The model measure_hf runs: one layer per kind, and what the full depth has."""
    model: nn.Module
    kinds: list[int]           # per layer of the full model: its kind (index into `layers`)
    kind_names: list[str]      # per kind: the class name of its layer
    weights_bytes: int         # the full-depth text decoder's and LM head's parameters
    parameters: int            # their count
    model_type: str
    fake: bool
    mode: Any = None           # the FakeTensorMode the model lives in
    dtype: Any = None          # the weights' (and so the gradients') dtype


def build_hf_model(config: Any, *, dtype: torch.dtype = torch.bfloat16, fake: bool = True,
                   one_per_kind: bool = True) -> HfModel:
    """The transformers model of `config` with one decoder layer per distinct kind (every
    layer with one_per_kind=False)."""
    d = read_config(config)
    cfg = build_config(d)
    fake_mode = None
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode
        fake_mode = FakeTensorMode()
    torch.manual_seed(0)
    ctx = fake_mode if fake_mode is not None else _null()
    with ctx:
        auto, model_class = _model_class(cfg)
        if not getattr(model_class, "_supports_sdpa", True):
            # Gemma 2, gpt-oss: the class refuses SDPA (soft-capping, sinks) and transformers
            # runs eager attention, as the hf profile's recipe does (Note [hf dialects]).
            cfg._attn_implementation = "eager"
        model = (auto.from_config(cfg, dtype=dtype) if auto is not model_class else
                 model_class._from_config(cfg, dtype=dtype))
    model.train()
    decoder = _decoder(model)
    text = _text_parameters(model, decoder)
    weights = sum(_nbytes(p) for p in text)
    parameters = sum(p.numel() for p in text)
    signatures: list[tuple] = []
    kinds = []
    for layer in decoder.layers:
        sig = layer_kind(layer)
        if sig not in signatures:
            signatures.append(sig)
        kinds.append(signatures.index(sig))
    firsts = [kinds.index(k) for k in range(len(signatures))]
    names = [type(decoder.layers[i]).__name__ for i in firsts]
    if one_per_kind:
        _keep_layers(decoder, firsts)
    else:
        kinds = list(range(len(kinds)))
        names = [type(layer).__name__ for layer in decoder.layers]
    return HfModel(model=model, kinds=kinds, kind_names=names, weights_bytes=weights,
                   parameters=parameters, model_type=d["model_type"], fake=fake, mode=fake_mode,
                   dtype=dtype)


def _keep_layers(decoder: nn.Module, keep: list[int]) -> None:
    """Note [One layer per kind]: the decoder keeps only the layers `keep` (model order). Its
    forward hands the j-th layer what the config says of layer j: `causal_mask_mapping[self.
    config.layer_types[i]]` and `position_embeddings[...layer_types[i]]` (Olmo3Model, Llama4Text
    Model, Gemma2/3, gpt-oss, Qwen2/3, Qwen3-Next, ...), Mllama's `idx in self.
    cross_attention_layers`; so those lists are cut to the kept layers too. Left as they were,
    the kept layers would run with their neighbours' masks (OLMo 3's full layer, fourth of four,
    took the second layer's sliding-window mask; Llama 4's NoPE layer the RoPE layers' chunk
    mask above 8192 tokens)."""
    decoder.layers = nn.ModuleList([decoder.layers[i] for i in keep])
    cfg = getattr(decoder, "config", None)
    types = getattr(cfg, "layer_types", None)
    if isinstance(types, (list, tuple)) and len(types) > max(keep):
        cfg.layer_types = [types[i] for i in keep]
    cross = getattr(decoder, "cross_attention_layers", None)
    if isinstance(cross, (list, tuple)):
        decoder.cross_attention_layers = [j for j, i in enumerate(keep) if i in cross]


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def trace_step(hf: HfModel, seq_len: int) -> StepTrace:
    """One logged training step of `hf.model` at `seq_len` tokens."""
    with hf.mode if hf.mode is not None else _null():
        return _trace_step(hf.model, seq_len)


# ---------------------------------------------------------------------------------------------
# Fitting in the sequence length.

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


def _check_same_step(traces: Sequence[StepTrace]) -> None:
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


# Note [Loops in the step]
# transformers' torch fallbacks of the linear-attention kernels (torch_chunk_gated_delta_rule in
# Qwen3-Next and Qwen3.5, chunk_kimi_delta_attention in Kimi Linear: Note [hf linear attention]
# in planner/frameworks/hf.cc) scan the sequence in a Python loop over chunks of 64 tokens, so a
# longer step runs more ops: the forward loop's body once more per chunk, and its backward,
# which autograd interleaves with the iterations next to it, so the backward is no clean
# repetition of one body. Such steps cannot be fitted allocation by allocation (Note [Replaying
# the step]); they are folded first, into steps that are:
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
    """The steps with the parts that differ between their lengths folded (Note [Loops in the
    step]); the same steps when none does."""
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


def _unfolded_kink(traces: Sequence[StepTrace]) -> Optional[int]:
    """A folded allocation whose bytes are not linear in the length through the steps (Note
    [Loops in the step]: a loop's iterations hold the same bytes each, but which moment of a
    middle is its excursion can change over the first few), or None."""
    if len(traces) < 3 or not traces[0].folded:
        return None
    s = [t.seq_len for t in traces]
    for i in traces[0].folded:
        v = [t.sizes[i] for t in traces]
        for k in range(2, len(v)):
            if (v[k - 1] - v[k - 2]) * (s[k] - s[k - 1]) != (v[k] - v[k - 1]) * (s[k - 1] - s[k - 2]):
                return i
    return None


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
    """Lengths where a softmax row that grows with the length reaches 48 KiB (Note [One side of
    every threshold]): a row present at each length as s + c with one constant c."""
    if len(traces) < 2:
        return []
    out = []
    first, second = traces[0], traces[1]
    for row, size in sorted(first.softmax_rows):
        c = row - first.seq_len
        if (second.seq_len + c, size) in second.softmax_rows and c > -first.seq_len:
            t = -(-_SHARED_MEMORY_PER_BLOCK // size) - c
            if t > 0:
                out.append((t, f"a softmax row of 48 KiB ({size}-byte elements)"))
    return sorted(set(out))


def sort_thresholds(traces: Sequence[StepTrace]) -> list[tuple[int, str]]:
    """Lengths where an index_put's sort takes one more pass (Note [One side of every
    threshold]): destination rows a*s + c at every measured length (a whole, e.g. the tokens
    or the tokens times top-k) reach 2^(8j) + 1, one more bit than j passes sort."""
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


def measure_hf(config: Any, *, lengths: Optional[Sequence[int]] = None,
               seq_len: Optional[int] = None, dtype: torch.dtype = torch.bfloat16,
               fake: bool = True) -> HfMeasurement:
    """Runs one step of the model of `config` (a config.json path or dict) at each length:
    `lengths`, or lengths on seq_len's side of every threshold (Note [One side of every
    threshold]; the defaults when seq_len is not given)."""
    hf = build_hf_model(config, dtype=dtype, fake=fake)
    windows = mask_thresholds(hf)
    chosen = lengths is None
    if chosen:
        lengths = DEFAULT_LENGTHS if seq_len is None else lengths_between(windows, seq_len)
    lengths = sorted(set(int(s) for s in lengths))
    if len(lengths) < 2 or lengths[0] < 1:
        raise PlanError(f"lengths are {lengths}; allowed: at least two distinct positive lengths "
                        "(three fit a constant term too)")
    traces = [trace_step(hf, s) for s in lengths]
    thresholds = sorted(set(windows + softmax_thresholds(traces) + sort_thresholds(traces)))
    m = HfMeasurement(hf=hf, lengths=lengths, traces=traces, thresholds=thresholds)
    straddled = any(lengths[0] < t <= lengths[-1] for t, _ in thresholds)
    if chosen and (straddled or (seq_len is not None and not m.covers(seq_len))):
        # A softmax or sort threshold between the defaults and seq_len (or among the defaults:
        # then the longest one's side): measure on its side.
        m.lengths = lengths = lengths_between(thresholds,
                                              seq_len if seq_len is not None else lengths[-1])
        m.traces = [trace_step(hf, s) for s in lengths]
    # Note [Loops in the step]: a step whose ops repeat with the length is folded first; where
    # a folded middle is not yet linear in the length (its first iterations), lengths chosen
    # here move up until it is.
    m.traces = fold_loops(m.traces)
    for _ in range(3):
        kink = _unfolded_kink(m.traces)
        if kink is None or not chosen:
            break
        span = m.lengths[-1] - m.lengths[0]
        m.lengths = lengths = [x + 2 * span for x in m.lengths]
        m.traces = fold_loops([trace_step(hf, x) for x in lengths])
    kink = _unfolded_kink(m.traces)
    if kink is not None:
        raise PlanError(
            f"a loop of the step holds bytes that are not linear in the length through "
            f"{m.lengths} (folded allocation {kink}: "
            f"{[t.sizes[kink] for t in m.traces]}): measure at longer lengths "
            "(Note [Loops in the step])")
    _check_same_step(m.traces)
    return m


def to_model_profile(m: HfMeasurement, seq_len: int) -> "ModelProfile":
    """The measured layer profile at `seq_len` tokens, each layer its kind's."""
    from .profile import LayerProfile, ModelProfile, ModuleTime, SavedTensor
    trace = m.at(seq_len)
    step = evaluate(trace)
    kinds = []
    for k, point in enumerate(step.layers):
        fwd = ("forward", k)
        by_module: dict[str, int] = {}
        for _n, b, mod in point.saved:
            if mod:
                by_module[mod] = by_module.get(mod, 0) + b
        listed = sorted(by_module, key=lambda x: -by_module[x])[:MAX_MODULES]
        saved = [(n, b, mod if mod in listed else "") for n, b, mod in point.saved]
        if len(saved) > MAX_SAVED:
            merged: dict[str, list] = {}
            for n, b, mod in saved:
                key = "input" if n == "input" else f"{mod or 'layer'}.all"
                merged.setdefault(key, [0, mod])[0] += b
            saved = [(n, b, mod) for n, (b, mod) in merged.items()]
        kinds.append(dict(
            input_bytes=point.input_bytes, output_bytes=point.output_bytes,
            saved=[SavedTensor(n, b, mod) for n, b, mod in saved],
            modules=[ModuleTime(name, 0.0, trace.module_work.get((fwd, name), OpWork()).to_dict())
                     for name in listed],
            forward_peak_bytes=max(0, point.forward_own_bytes - point.input_bytes),
            backward_peak_bytes=max(0, point.backward_own_bytes), grad_bytes=point.grad_bytes,
            backward_peak_grad_bytes=point.peak_grad_bytes,
            backward_peak_released_bytes=point.peak_released_bytes,
            checkpoint_held_bytes=point.checkpoint_held_bytes,
            checkpoint_held_group=point.checkpoint_held_group,
            forward_work=trace.work.get(fwd, OpWork()).to_dict(),
            backward_work=trace.work.get(("backward", k), OpWork()).to_dict()))
    layers = []
    for i, k in enumerate(m.hf.kinds):
        kk = kinds[k]
        layers.append(LayerProfile(
            index=i, type=m.hf.kind_names[k], input_bytes=kk["input_bytes"],
            output_bytes=kk["output_bytes"], saved=[dataclasses.replace(t) for t in kk["saved"]],
            modules=[dataclasses.replace(x) for x in kk["modules"]],
            forward_peak_bytes=kk["forward_peak_bytes"],
            backward_peak_bytes=kk["backward_peak_bytes"], forward_seconds=0.0,
            backward_seconds=0.0, grad_bytes=kk["grad_bytes"],
            backward_peak_grad_bytes=kk["backward_peak_grad_bytes"],
            backward_peak_released_bytes=kk["backward_peak_released_bytes"],
            checkpoint_held_bytes=kk["checkpoint_held_bytes"],
            checkpoint_held_group=kk["checkpoint_held_group"],
            forward_work=kk["forward_work"],
            backward_work=kk["backward_work"]))
    loss = trace.work.get("loss", OpWork())
    embedding = OpWork()
    for phase in ("embedding", "embedding_backward"):
        embedding.add(trace.work.get(phase, OpWork()))
    return ModelProfile(
        layers=layers, device="cpu (fake tensors)" if m.hf.fake else "cpu",
        weights_bytes=m.hf.weights_bytes, gradients_bytes=0,
        other_bytes=step.other_bytes - step.forward_freed_bytes,
        loss_peak_bytes=step.loss_peak_bytes, held_logits_bytes=step.held_logits_bytes,
        measured_memory=False, tokens=seq_len,
        gradients_in_backward=True, loss_grad_bytes=step.loss_grad_bytes,
        loss_work=loss.to_dict(), embedding_grad_bytes=step.embedding_grad_bytes,
        embedding_work=embedding.to_dict(), d2h_bytes_per_second=0.0, h2d_bytes_per_second=0.0,
        # transformers' eager code, one step without an optimizer, gradients in the weights'
        # dtype as autograd creates them.
        framework="hf", optimizer="none", grad_dtype=_DTYPE_NAMES.get(m.hf.dtype),
        model_parameters=m.hf.parameters)


def profile_hf(config: Any, seq_len: int, *, lengths: Optional[Sequence[int]] = None,
               dtype: torch.dtype = torch.bfloat16, fake: bool = True) -> "ModelProfile":
    """measure_hf + to_model_profile: the profile `stowage plan --profile` reads."""
    if seq_len < 1:
        raise PlanError(f"seq_len is {seq_len}; allowed: at least 1")
    return to_model_profile(
        measure_hf(config, lengths=lengths, seq_len=seq_len, dtype=dtype, fake=fake), seq_len)


__all__ = ["HfMeasurement", "LiveBytes", "OpWork", "StepTrace", "build_hf_model", "evaluate",
           "extrapolate", "fit", "measure_hf", "op_work", "profile_hf", "replay",
           "to_model_profile", "trace_step"]
