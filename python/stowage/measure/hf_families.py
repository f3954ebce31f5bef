"""What a fake CPU step of a transformers model needs so that it runs what the GPU step of its
family runs: the SDPA kernel an H200 picks where the CPU would pick another
(Note [SDPA on the GPU]), one sequence where transformers cannot read fake position ids, and the
vision states Mllama's text decoder gets (Note [hf cross-attention] in
planner/frameworks/hf_attention.cc).

Note [SDPA on the GPU]
SDPA picks a kernel per call (PyTorch's "SDPA Runtime Dispatch" note in
aten/src/ATen/native/transformers/cuda/sdp_utils.cpp; the CPU's in sdp_utils_cpp.cpp), and where the
CPU's choice keeps other bytes than the GPU's, a fake step runs the GPU's kernel (its meta function)
instead. On an H200, torch 2.11 tries cuDNN, flash, memory-efficient, math in that order
(check_prefer_cudnn_attention: cuDNN runtime > 9.15 on sm90; the cu130 wheel ships cuDNN 9.19).
cuDNN takes head dims up to 128, or d_qk 192 with d_v 128 on sm90 with cuDNN >= 9.11
(check_cudnn_tensor_shapes; the 9.22 d256 branch of later versions is not in 2.11's library: no
92200 constant, no d256 message), any layout, and a mask; flash takes no mask and one head dim up to
256 (check_head_dim_size_flash); the memory-efficient kernel takes any head dims divisible by 8.
Where the CPU differs:
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
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn as nn


def cross_attention_inputs(model: nn.Module, seq_len: int) -> dict[str, torch.Tensor]:
    """What Mllama's text decoder gets from MllamaForConditionalGeneration besides the tokens
    (Note [hf cross-attention] in planner/frameworks/hf_attention.cc): one image's projected vision
    states, max_num_tiles tiles of (image_size / patch_size)^2 + 1 tokens (the vision config's, or
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


class gpu_sdpa:
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
            kernel = h200_sdpa_kernel(query, value, attn_mask is not None)
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


def h200_sdpa_kernel(query: torch.Tensor, value: torch.Tensor, masked: bool) -> Optional[str]:
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
    bshd = (query.stride(1) == query.shape[-1]
            and query.stride(2) == query.shape[1] * query.shape[-1])
    if masked and not cudnn and not bshd and dqk % 8 == 0:
        return "efficient"
    return None


class one_sequence:
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


__all__ = ["cross_attention_inputs", "gpu_sdpa", "h200_sdpa_kernel", "one_sequence"]
