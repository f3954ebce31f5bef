// The hf recipe's multi-head latent attention: DeepSeek-V2/V3, Kimi and GLM's MLA, with the
// DSA indexer of DeepSeek-V3.2 and GLM-5 (Note [hf MLA]), and which SDPA kernel an H200 runs.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "planner/frameworks/hf_layer.h"

namespace stowage::planner::hf_internal {

// Note [hf MLA]
// DeepSeek-V2/V3 (Kimi-K2), DeepSeek-V3.2 and GLM-5 attention as transformers 5.23 runs it
// (DeepseekV3Attention.forward / expand_kv, modeling_deepseek_v3.py; DeepseekV2Attention and
// apply_rotary_emb, modeling_deepseek_v2.py; GlmMoeDsaAttention and GlmMoeDsaIndexer,
// modeling_glm_moe_dsa.py), counted from the live ops of each family at 4096 tokens
// (tests/python/measure/test_hf_measured_agreement.py AgreementTest). Sizes per token: hq heads, r
// the rope dims, n the nope dims, dqk = n + r, dv, kvl / ql the latent ranks, h hidden.
//  Kernel (stowage/measure/hf_families.py Note [SDPA on the GPU]): dqk and dv differ, so the
//    CPU would run SDPA's math path; on an H200 torch 2.11 runs cuDNN for 192/128 (and head dims
//    up to 128), the memory-efficient kernel otherwise (GLM-5: 256, masked). cuDNN writes its
//    output in the query's layout (alloc_with_matching_layout, cudnn/MHA.cpp): the query is a cat,
//    [b, h, s, d] contiguous, so `attn_output.transpose(1, 2).contiguous()` copies it and
//    o_proj keeps the copy (2 hq dv) while cuDNN keeps the output; r 2 w 2 per element forward.
//  RoPE on q_rot and the one-head k_rot, bytes per element of hq + 1 heads: DeepSeek-V2's
//    complex rotation (xq.float(), view_as_complex, the complex mul with freqs_cis, type_as):
//    forward 20 (+ 4 per rope dim per tensor for freqs), backward 28 (+ the conjugated freqs'
//    copy and its mul, 16 per dim in all). The interleaved rotation (apply_rotary_pos_emb_
//    interleave: even/odd slices, four muls, a sub, an add and a cat): forward 18 (+ 8 per dim
//    for cos/sin), backward 30 (+ 8): the four muls' gradients, neg, two adds, two
//    slice_backwards (zeros + copy) and their sum.
//  Forward: the query's cat (r 2 w 2 per element of hq dqk), expand_kv's new_empty filled by
//    two copy_ (6 per element of hq dqk, counted as the destination, source and result), the
//    residual add (6h). Backward: the two copy_'s CopySlices (12 hq dqk), k_rot's slice clone,
//    zero fill and copy (12 hq r), k_nope's clone (4 hq n), the expand's sum over heads
//    (2 hq r + 2r), kv_b_proj's split (cat) and its transpose copy (8 hq (n + dv)), the
//    latent's split (4 (kvl + r)), the query's split (cat) and its transpose copy (8 hq dqk),
//    and the sums of the normed and the layer input's two gradients (12h).
//  DSA indexer (GlmMoeDsaIndexer.forward, under torch.no_grad: no backward, nothing kept; its
//    weights get no gradient GEMMs): `matmul(q.float(), k.float())` makes [b, s, H, s] fp32
//    scores (H index heads, d index dims), `* softmax_scale` a second, relu a third: two are
//    alive at once (8 H s); then the weighted sum over heads
//    (a GEMM), the causal masked_fill, top-k and the bool top-k mask folded into the additive
//    attention mask (GlmMoeDsaAttention.forward). Bytes per token: rope 18 (H + 1) d_rope
//    + 8 d_rope, the cats 4 (H + 1) d, q's and k's fp32 casts 6 (H + 1) d, the score mul and
//    relu 16 H s, the weights' cast and scale 14 H, ~mask 2s, masked_fill 9s, top-k 4s + 12 k,
//    the indices' casts 24 k, the top-k mask (new_ones s, scatter 2s + 8k, ~ 2s), its fold into
//    the causal mask (3s) and the additive mask (3s); k_norm's LayerNorm 4d.
//  The indexer's moment (the layer's forward peak, and its rerun's under recompute: Note
//    [Recompute moment] in cost_model.cc) comes after the query's cat and expand_kv, before the
//    mask and the attention call: alive are the saved tensors made so far (the norms, the
//    latents, q, k and kv_b_proj's output), q_b_proj's output (2 hq dqk, which q_pass and q_rot
//    still view), the rotated q_rot and k_rot (2 (hq + 1) r), kv_a_proj's output (2 (kvl + r),
//    viewed by kv_pass and k_rot), the indexer's q and k with their rotated parts and cats
//    (4 H di + 4 di + 2 (H + 1) r) and the two score tensors (8 H s); the layer's mask, its
//    additive copy, the call's output and logsumexp and the FFN's norm do not exist yet. Live
//    bytes of glm_moe_dsa's layer 0 rerun at 4096 tokens: 5095.5 MiB made by the rerun, as
//    counted (tests/python/measure/test_hf_measured_agreement.py AgreementTest, recompute).
bool HfCudnnAttention(double dqk, double dv) {
  // check_cudnn_tensor_shapes (sdp_utils.cpp, torch 2.11) on sm90 with cuDNN 9.19.
  const bool aligned = std::fmod(dqk, 8) == 0 && std::fmod(dv, 8) == 0;
  return aligned && (std::max(dqk, dv) <= 128 || (dqk == 192 && dv == 128));
}

namespace {

void MlaTraffic(HfLayer& b, bool copied) {
  const ModelConfig& m = b.m;
  const double h = m.hidden, hq = m.heads, r = m.qk_rope_head_dim, n = m.qk_nope_head_dim;
  const double dqk = n + r, dv = m.v_head_dim, kvl = m.kv_lora_rank;
  if (m.family == "deepseek_v2") {
    b.Traffic(20 * (hq + 1) * r + 8 * r, 28 * (hq + 1) * r + 16 * r, 6, 10);
  } else {
    b.Traffic(18 * (hq + 1) * r + 8 * r, 30 * (hq + 1) * r + 8 * r, 14, 24);
  }
  b.Traffic(10 * hq * dqk + 6 * h + (copied ? 4 * hq * dv : 0),
            12 * hq * dqk + 12 * hq * r + 4 * hq * n + 2 * hq * r + 2 * r + 8 * hq * (n + dv) +
                4 * (kvl + r) + 8 * hq * dqk + 12 * h,
            4 + (copied ? 1 : 0), 14);
}

}  // namespace

void MlaAttention(HfLayer& b, const LayerSpec& spec) {
  const ModelConfig& m = b.m;
  const double h = m.hidden, hq = m.heads, ql = m.q_lora_rank, kvl = m.kv_lora_rank;
  const double dqk = m.qk_nope_head_dim + m.qk_rope_head_dim, dv = m.v_head_dim, s = b.s;
  b.Norm("attn.norm", h, 1, true);
  if (ql > 0) b.Norm("attn.q_latent", ql, 1, true);
  b.Norm("attn.kv_latent", kvl, 1, true);
  // q and k (cat of nope and rope parts), kv_b_proj's output (v is a view of it). No
  // mla_up_proj module under hf: these are the attention call's inputs, which SDPA (or, with
  // attn_core recomputed, its checkpoint) keeps, so rerunning the up projections under
  // torch.utils.checkpoint frees none of them. Megatron's mla_up_proj frees them because
  // CheckpointWithoutOutput discards its outputs' storage and refills it before backward
  // (planner/frameworks/megatron.cc); transformers and the stowage wrapper have no such mechanism.
  b.Save("attn.qkv", "", 4 * hq * dqk + 2 * hq * (m.qk_nope_head_dim + dv));
  double saved_before_indexer = 0;
  for (const SavedTensor& t : b.cost.saved) saved_before_indexer += static_cast<double>(t.bytes);
  const bool masked = HfMasked(b, spec);
  if (masked) {
    // SDPA's additive copy of the layer's bool mask; under recompute the checkpoint holds the
    // bool mask (1 byte per key) instead (Note [hf attn_core]).
    b.Save("attn.mask", "", s);
    b.Save("attn.mask_additive", "attn_core", s);
  }
  // The kernel an H200 runs (Note [hf MLA]): cuDNN writes its output in the query's layout,
  // [b, h, s, d] for MLA's cat, so the call's `.transpose(1, 2).contiguous()` copies it and
  // o_proj keeps the copy (attn.o_proj_in); the kernel's own output is then kept only inside
  // the call, which a recompute drops. Kimi Linear's MLA query is a transposed projection
  // ([b, s, h, d] already): no copy. The memory-efficient kernel (GLM-5's masked 256 dims)
  // writes [b, s, h, d]: no copy, o_proj keeps the kernel's output.
  const bool copied = HfCudnnAttention(dqk, dv) && m.family != "kimi_linear";
  b.Save("attn.core_out", copied ? "attn_core" : "", 2 * hq * dv);
  if (copied) b.Save("attn.o_proj_in", "", 2 * hq * dv);
  b.Save("attn.softmax_lse", "attn_core", 4 * hq);
  if (m.family == "kimi_linear") {
    // KimiMLAAttention (NoPE MLA of Kimi Linear): not re-derived against the live ops here.
    b.fwd_bytes += 20 * hq * m.qk_rope_head_dim + 6 * h + 8 * hq * dqk;
    b.bwd_bytes += 20 * hq * m.qk_rope_head_dim + 12 * h + 8 * hq * dqk;
    b.fwd_kernels += 16;
    b.bwd_kernels += 20;
  } else {
    MlaTraffic(b, copied);
  }
  AttentionCore(b, hq, dqk, dv, masked ? s : 0.5 * s);
  if (spec.attention == AttentionKind::kDsa) {
    // The indexer (Note [hf MLA]), forward only: its scores and their weighted sum over heads
    // as GEMMs, its weights' GEMMs without a backward.
    const double hi = m.index_heads, di = m.index_head_dim, k = m.index_topk;
    const double scores = 2 * hi * di * s * b.t + 2 * hi * s * b.t;  // fp32 bmm: no backward
    const double q_in = ql > 0 ? ql : h;
    b.fp32_gemm_flops += scores;
    b.no_grad_gemm_flops += 2 * (q_in * hi * di + h * di + h * hi) * b.t;
    b.Traffic(18 * (hi + 1) * m.qk_rope_head_dim + 8 * m.qk_rope_head_dim + 10 * (hi + 1) * di +
                  16 * hi * s + 14 * hi + 26 * s + 44 * k + 4 * di,
              0, 34, 0);
    const double r = m.qk_rope_head_dim;
    b.indexer_level =
        saved_before_indexer + (8 * hi * s + 2 * hq * dqk + 2 * (hq + 1) * r + 2 * (kvl + r) +
                                4 * hi * di + 4 * di + 2 * (hi + 1) * r) *
                                   b.t;
  }
  b.cost.attn_forward_transient = static_cast<uint64_t>((2 * hq * dqk + 4 * hq * dv) * b.t);
  b.cost.attn_backward_transient =
      static_cast<uint64_t>((4 * hq * dqk + 2 * hq * dv + 4 * hq * dqk) * b.t);
}

}  // namespace stowage::planner::hf_internal
