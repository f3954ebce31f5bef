// The hf recipe's softmax attention: SDPA and eager attention of every span (full, sliding,
// chunked), RoPE and its partial and Llama 4 forms, Qwen3-Next's output gate, and Mllama's
// cross-attention layers. MLA / DSA are in hf_mla.cc, linear attention in hf_linear_attention.cc.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "planner/frameworks/hf_layer.h"
#include "planner/hardware/op_time.h"

namespace stowage::planner::hf_internal {
namespace {

// Note [hf attn_core]
// The attn_core recompute module is the attention interface call (the ALL_ATTENTION_FUNCTIONS
// entry, sdpa_attention_forward or the family's eager_attention_forward) rerun in backward under
// torch.utils.checkpoint, as the stowage wrapper checkpoints a submodule. A checkpoint keeps its
// inputs, drops what the call saves inside, and cannot drop its output, which its consumer saves:
// o_proj (or the output gate's mul, or the cross-attention reshape) keeps the core's output
// whatever the core recomputes, as under megatron (Note [megatron profile]). So the module frees
// only what the call makes and keeps inside: the kernel's fp32 logsumexp, eager attention's
// s x s scores, k and v repeated to every query head (repeat_kv runs inside the call when a
// mask is given or attention is eager), and SDPA's additive copy of a bool mask
// (convert_boolean_attn_mask); and it holds what nothing held before: the unrepeated k and v
// it was called with, and a layer's own bool mask (DSA's top-k folded into the causal mask,
// GlmMoeDsaAttention.forward, 1 byte per key), counted as kept in both cases below. The mask
// every layer shares (built once by the model) is held once by the checkpoints and is not a
// layer's. Checked against autograd with the call checkpointed by
// tests/python/measure/test_hf_layer_kinds.py (RecomputedCoreTest).

// Llama4TextAttention.forward's positions, bytes per element: RoPE layers rotate q and k as
// complex numbers (apply_rotary_emb: `torch.view_as_complex(x.float()...) * freqs_cis`, then
// `.type_as(x)`), forward float() r2 w4, the complex mul r4 w4, the cast r4 w2 = 20, three
// kernels a tensor; backward the cast's gradient r2 w4, the mul's by conj(freqs) r4 w4, float()'s
// r4 w2 = 20, four kernels with the conj. The result is already in the projections' [b, s, h, d]
// layout (no copy, unlike Llama's rotate_half). NoPE layers scale q by the fp32 attention
// temperature instead (`(query_states * attn_scales).to(dtype)`: r2 w4 + r4 w2 = 12 per q
// element, its gradient 20), after nine per-token ops that compute the scales.
void Llama4PositionWork(HfLayer& b, bool nope) {
  const double hq = b.m.heads, hkv = b.m.kv_heads, d = b.m.head_dim;
  if (nope) {
    b.Traffic(12 * hq * d, 20 * hq * d, 9 + 2, 3);
  } else {
    b.Traffic(20 * (hq + hkv) * d, 20 * (hq + hkv) * d, 2 * 3, 2 * 4);
  }
}

// Note [hf eager attention]
// Gemma 2 and gpt-oss refuse SDPA (`_supports_sdpa = False`, modeling_gemma2.py /
// modeling_gpt_oss.py), and PreTrainedModel.get_correct_attn_implementation falls back from
// its default "sdpa" to "eager" when _sdpa_can_dispatch refuses (modeling_utils.py): a model
// built without attn_implementation trains with eager_attention_forward (flash_attention_2 and
// flex_attention are accepted, but only when asked for). Gemma 3 allows SDPA, its default.
// Per token, S keys (the whole sequence: eager masks, it does not skip), `rep` when k/v are
// repeated (repeat_kv: hkv < hq).
//  Gemma 2 (eager_attention_forward, modeling_gemma2.py): repeat_kv's two copies (r2 w2 of the
//    expanded hq*d each); QK^T and PV are bmm, dense GEMMs at cuBLAS rates over the whole
//    square (4 hq d S FLOPs forward, twice that backward); `* scaling` r2 w2; soft-capping's
//    div, tanh and mul (r2 w2 each); the additive mask r2 w2 (+ the [b, 1, s, s] mask read
//    once, 2S); softmax(dtype=float32) converts the bf16 scores first (aten softmax: the
//    half_to_float kernel is taken for Half only, not BFloat16) r2 w4, then _softmax in fp32
//    (r4 w4; a row of 4S bytes beyond 48 KiB of shared memory is read three times,
//    Note [Kernel bytes]); `.to(bf16)` r4 w2; the output's transpose(1, 2).contiguous() r2 w2 of
//    hq*d. So 40 per score with soft-capping, 28 without. Backward: to(bf16)'s r2 w4, softmax's (r4
//    of the gradient, twice for a wide row, r4 w4), to(fp32)'s r4 w2, soft-capping's mul r2 w2,
//    tanh_backward r4 w2 and div r2 w2, the scaling mul r2 w2: 42 per score (28 without
//    soft-capping); repeat_kv's sums (r 2hq*d w 2hkv*d each) and v's gradient copied to the
//    projection's layout (r2 w2 of hkv*d; q's and k's are RoPE's).
//  gpt-oss (modeling_gpt_oss.py eager_attention_forward): `* scaling`, the mask add, the cat
//    with the sink column (r 2S + 2 w 2(S + 1)), its row max (r 2(S + 1), values and int64
//    indices), the subtraction (r4 w2 over S + 1), softmax in bf16 (r2 w2 over S + 1); the
//    slice that drops the sink, dropout(p=0) and `.to(bf16)` copy nothing. Backward: the
//    slice's zeros and copy (w 2(S + 1) + r2 w2), softmax's (r4 w2 over S + 1), the max
//    value's gradient (neg r2 w2, sum over the row r2), max's scatter into zeros (w2 + r2 w2
//    over S + 1), the two gradients of the logits summed (r4 w2), the sinks' sum, the scaling
//    mul r2 w2.
// Memory beyond the saved tensors (Note [hf profile] lists those), measured at these moments on
// the live bytes (tests/python/measure/test_hf_measured_peaks.py EagerAttentionTest); the FFN's
// input norms, which the layer cost counts with the attention's saved tensors, are not alive at
// either moment (BuildHfLayer takes them off):
//  forward, at _softmax's output: the masked bf16 scores (2 per score) and their fp32 copy (4),
//    with k and v before repeat_kv (4 hkv d when repeated); the bf16 probabilities and the
//    output, counted as saved, do not exist yet. gpt-oss: the masked scores (2S, still bound
//    to `attn_weights`) and the shifted logits (2(S + 1)).
//  backward, at _softmax_backward_data's output: the fp32 gradient of the probabilities (4) and
//    softmax's gradient (4), with dV (2 hq d); the bf16 probabilities, the repeated v and the
//    output have been released by the nodes already run. gpt-oss, at max's scatter: softmax's
//    gradient, the zeros and the scatter (2(S + 1) each), with dV; softmax's saved output, the
//    repeated v and the output released.
void EagerScores(HfLayer& b) {
  const ModelConfig& m = b.m;
  const double hq = m.heads, hkv = m.kv_heads, d = m.head_dim, s = b.s;
  const double rep = hkv < hq ? 1 : 0;
  const double square = 2 * hq * (d + d) * s * b.t;  // QK^T and PV, FLOPs
  b.gemm_flops += square;
  double fwd = rep * 8 * hq * d + 4 * hq * d + 4 * hq * s + 4 * hq * s + 2 * s;
  double bwd = rep * (4 * hq * d + 4 * hkv * d) + 4 * hkv * d + 4 * hq * s;
  double fwd_kernels = 2 * rep + 2 + 1 + 1 + 1;  // copies, bmm x2, scale, mask, contiguous
  double bwd_kernels = 4 + 1 + 2 * rep + 1;      // bmm x4, scale, sums, v copy
  if (m.attention_sinks) {
    const double row = s + 1;
    const double wide = 2 * row >= kSharedMemoryPerBlock ? 1 : 0;
    fwd += (4 * hq * s + 4 * hq) + (2 * hq * row + 10 * hq) + (4 * hq * row + 2 * hq) +
           (4 + 4 * wide) * hq * row;
    bwd += (6 * hq * s + 2 * hq) + (6 + 2 * wide) * hq * row + 4 * hq * row +
           (2 * hq * row + 2 * hq) + 2 * hq * row + (4 * hq * row + 10 * hq) + 6 * hq * row +
           2 * hq;
    fwd_kernels += 4;
    bwd_kernels += 2 + 1 + 2 + 2 + 1 + 1 + 1;
  } else {
    const double wide = 4 * s >= kSharedMemoryPerBlock ? 1 : 0;
    fwd += (6 + 8 + 8 * wide + 6) * hq * s;
    bwd += (6 + 12 + 4 * wide + 6) * hq * s;
    fwd_kernels += 3;
    bwd_kernels += 3;
    if (m.attn_logit_softcap > 0) {
      fwd += 12 * hq * s;
      bwd += 14 * hq * s;
      fwd_kernels += 3;
      bwd_kernels += 3;
    }
  }
  b.Traffic(fwd, bwd, fwd_kernels, bwd_kernels);
  AddModule(
      b, "attn_core",
      OpSeconds({.gemm_flops = square, .elementwise_bytes = fwd * b.t, .kernels = fwd_kernels},
                b.hw),
      false);
  if (m.attention_sinks) {
    b.cost.attn_forward_transient = static_cast<uint64_t>(std::max(
        0.0,
        (2 * hq * s + 2 * hq * (s + 1) + rep * 4 * hkv * d - 2 * hq * d - 2 * m.hidden) * b.t));
    b.cost.attn_backward_transient = static_cast<uint64_t>(std::max(
        0.0, (6 * hq * (s + 1) + 2 * hq * d - 2 * hq * (s + 1) - 2 * hq * d - 2 * hq * d) * b.t));
  } else {
    b.cost.attn_forward_transient = static_cast<uint64_t>(std::max(
        0.0, (6 * hq * s - 2 * hq * s + rep * 4 * hkv * d - 2 * hq * d - 2 * m.hidden) * b.t));
    b.cost.attn_backward_transient = static_cast<uint64_t>(
        std::max(0.0, (8 * hq * s + 2 * hq * d - 2 * hq * s - 2 * hq * d - 2 * hq * d) * b.t));
  }
}

// Note [hf partial rotary]
// GLM-4.5, Phi-3, Qwen3-Next and Qwen3.5 (apply_rotary_pos_emb in modeling_glm4_moe.py,
// modeling_phi3.py, modeling_qwen3_next.py, modeling_qwen3_5(_moe).py; the reader sets
// ModelConfig::rotary_dim r for exactly these, hf_config.cc ReadRotaryDim) rotate the first r of
// each head's d dims and cat the rest back: `q_rot, q_pass = q[..., :r], q[..., r:]`,
// `torch.cat([q_rot * cos + rotate_half(q_rot) * sin, q_pass], dim=-1)`. Llama's RoPE keeps the
// projection's [b, s, h, d] layout (element-wise outputs follow their input's strides); the cat
// makes q and k new [b, h, s, d]-contiguous tensors, even at r = d (Phi-4: an empty q_pass).
//  Output layout: the kernel an H200 runs for equal head dims writes its output in the query's
//    layout (stowage/measure/hf_families.py Note [SDPA on the GPU]: cuDNN,
//    alloc_with_matching_layout, up to 128 dims with or without a mask; flash, `at::empty_like(q)`
//    in mha_fwd, up to 256 without one; the CPU flash kernel likewise), so sdpa_attention_forward's
//    `.transpose(1, 2).contiguous()` copies it (r2 w2 of hq d, one kernel) and o_proj (Qwen3-Next
//    and Qwen3.5: the output gate's mul) keeps the copy, 2 hq d per token (attn.o_proj_in),
//    while the kernel keeps its own output inside the call (which a recompute of the call
//    drops). Only the memory-efficient kernel, which a mask sends head dims above 128 to, writes
//    [b, s, h, d] whatever the query's layout: no copy. Eager attention copies in every family.
//  Work, bytes per element of q and k (hq + hkv heads of d), f = r / d, measured with LiveBytes'
//    op work on the real apply_rotary_pos_emb (bf16, [1, 256, 8 + 2, 128] at f = 1/4, 1/2, 1):
//    forward Llama's rotation over the rotated part (20 f) and the cat (r2 w2 of d: 4), 6
//    kernels a tensor; backward Llama's rotation gradient over the rotated part (30 f) and the
//    slices' gradients, each a zero fill of the whole head and a copy of its part (w2 + r2 w2 f
//    for q_rot, w2 + r2 w2 (1 - f) for q_pass), their sum (r4 w2) and the layout copy to the
//    projection's [b, s, h*d] (r2 w2): 30 f + 18, 15 kernels a tensor. At r = d q_rot is the
//    whole head and its gradient is used as it is: 30 + 12 (the empty q_pass's zero fill, the
//    sum, the layout copy), 13 kernels a tensor.
//  The cos/sin tables the model builds once are r wide (2 x 2r per token, ApplyHfStep).
//  Megatron-Core (the megatron recipe) takes GLM-4.5's factor as rotary_percent
//  (Megatron-Bridge's GLM-4.5 provider: 0.5): RotaryEmbedding makes freqs of
//  int(kv_channels * rotary_percent) dims, and TransformerEngine's FusedRoPEFunc
//  (transformer_engine/pytorch/attention/rope.py, "freqs [s2, 1, 1, d2] with d2 <= d") rotates
//  those and passes the rest in one kernel whose output keeps the sbhd layout, saving only the
//  freqs: no term of the megatron recipe (Note [megatron profile]) depends on it.

// Whether SDPA's output is copied for o_proj (Note [hf partial rotary]): a cat query, and a
// kernel that writes the query's layout.
bool HfOutputCopied(const HfLayer& b, bool masked) {
  const double d = b.m.head_dim;
  return b.m.rotary_dim > 0 && !b.dialect.eager && (!masked || HfCudnnAttention(d, d));
}

void PartialRotaryTraffic(HfLayer& b) {
  const double heads = b.m.heads + b.m.kv_heads, d = b.m.head_dim;
  const double f = std::min(1.0, b.m.rotary_dim / d);
  if (f < 1) {
    b.Traffic((20 * f + 4) * heads * d, (30 * f + 18) * heads * d, 2 * 6, 2 * 15);
  } else {
    b.Traffic(24 * heads * d, 42 * heads * d, 2 * 6, 2 * 13);
  }
}

}  // namespace

void SoftmaxAttention(HfLayer& b, const LayerSpec& spec) {
  const ModelConfig& m = b.m;
  const double h = m.hidden, hq = m.heads, hkv = m.kv_heads, d = m.head_dim, s = b.s;
  b.Norm("attn.norm", h, 1, true);
  // Llama 4: the q/k L2 norm and RoPE only on its chunked (RoPE) layers; the NoPE layers scale
  // q by an fp32 attention temperature per token instead (Llama4TextAttention.forward). Its
  // NoPE layers are the full-span ones (hf_config.cc PlaceSpans).
  const bool nope = m.family == "llama4_text" && spec.span == AttentionSpan::kFull;
  if (nope) b.Save("attn.temperature", "", 4);
  if (m.qk_norm == QkNorm::kL2) {
    if (!nope) {
      b.Save("attn.qk_norm", "", 4 * (hq + hkv) * d + 4 * (hq + hkv));
      // Llama4TextL2Norm: `x.float() * rsqrt(x.pow(2).mean(-1) + eps)` cast back: an RMSNorm
      // without the weight mul (NormWorkOf less r2 w2 forward, less its two gradients' 12
      // bytes backward), one kernel less forward, two backward.
      b.Traffic(32 * (hq + hkv) * d, 80 * (hq + hkv) * d, 2 * 7, 2 * 13);
    }
  } else if (m.qk_norm != QkNorm::kNone) {
    const double rows_q = m.qk_norm == QkNorm::kPerHead ? hq : 1;
    const double rows_k = m.qk_norm == QkNorm::kPerHead ? hkv : 1;
    const size_t first = b.cost.saved.size();
    b.Norm("attn.q_norm", hq * d, rows_q, false);
    b.Norm("attn.k_norm", hkv * d, rows_k, false);
    // One tensor for the pair, as the profile has always named it.
    b.cost.saved[first].name = "attn.qk_norm";
    b.cost.saved[first].bytes += b.cost.saved[first + 1].bytes;
    b.cost.saved.pop_back();
  }
  const bool masked = !b.dialect.eager && HfMasked(b, spec);
  // k and v as the kernel sees them: repeated to every query head when a mask is given or
  // attention is eager (repeat_kv), else GQA inside the flash kernel.
  const double kv = masked || b.dialect.eager ? hq : hkv;
  // q, k and v as the interface gets them (Note [hf attn_core]: what its checkpoint keeps), and
  // the rest of their repeats, which the kernel keeps instead of them.
  b.Save("attn.qkv", "", 2 * (hq + 2 * hkv) * d);
  if (kv > hkv) b.Save("attn.kv_repeated", "attn_core", 4 * (kv - hkv) * d);
  if (masked) b.Save("attn.mask", "attn_core", 2 * s);  // SDPA's additive copy
  // The output (eager: transposed and made contiguous for o_proj), which o_proj keeps. After a
  // partial-rotary cat the kernel's output is laid out as the [b, h, s, d] query
  // (Note [hf partial rotary]), so the call's own `.transpose(1, 2).contiguous()` copies it: o_proj
  // keeps the copy (attn.o_proj_in) and the kernel's output is kept only inside the call, which a
  // recompute drops.
  const bool output_copied = HfOutputCopied(b, masked);
  b.Save("attn.core_out", output_copied ? "attn_core" : "", 2 * hq * d);
  if (output_copied) {
    b.Save("attn.o_proj_in", "", 2 * hq * d);
    b.Traffic(4 * hq * d, 0, 1, 0);
  }
  if (b.dialect.eager) {
    // The s x s scores.
    double scores = 6 * hq * s;
    if (m.attention_sinks) scores = 8 * hq + 2 * hq * (s + 1);
    if (m.attn_logit_softcap > 0) scores += 2 * hq * s;
    b.Save("attn.scores", "attn_core", scores);
  } else {
    b.Save("attn.softmax_lse", "attn_core", 4 * hq);
  }
  if (m.attention_output_gate) {
    // Qwen3NextAttention / Qwen3_5Attention.forward: `attn_output * torch.sigmoid(gate)`, the
    // gate being q_proj's second half: sigmoid keeps its output, the mul keeps it and the core's
    // output (already counted), and o_proj keeps the product. Forward: the gate's reshape copy,
    // sigmoid, mul (r 2 w 2, r 2 w 2, r 4 w 2 per element); backward: the mul's two gradients
    // and sigmoid's (r 4 w 2 each).
    b.Save("attn.out_gate", "", 2 * hq * d);
    b.Save("attn.gated_out", "", 2 * hq * d);
    b.Traffic(14 * hq * d, 18 * hq * d, 3, 3);
  }
  // RoPE on q and k (apply_rotary_pos_emb), bytes per element: forward x * cos r2 w2,
  // rotate_half's neg over half r1 w1 and cat r2 w2, * sin r2 w2, the add r4 w2 = 20, 5 kernels;
  // backward * sin r2 w2, neg r1 w1, the two slices' zeros-and-copy (w2 + r1 w1 each), * cos r2
  // w2, and the sum of the three gradients (2 x r4 w2) = 30, 9 kernels; the slices' zeros are
  // [b, h, s, d]-contiguous, so the sum is too, and the projection's `.view(...).transpose(1, 2)`
  // backward copies it to [b, s, h*d] (reshape of a non-viewable gradient: r2 w2), 1 kernel.
  // Per head tensor (q and k; v's gradient comes from attention in the projection's layout).
  if (m.family == "llama4_text") {
    Llama4PositionWork(b, nope);
  } else if (m.family == "gpt_oss") {
    // gpt-oss (_apply_rotary_emb, modeling_gpt_oss.py) rotates the two halves instead: four
    // half-width muls (r2 w2 per half element: 8), `first * cos - second * sin` and `second *
    // cos + first * sin` (r4 w2 over halves: 3 + 3), the cat r2 w2 = 18, 7 kernels; backward the
    // four muls (8), the two gradients' sums (6), neg (2), chunk's cat of the halves (4) and the
    // layout copy (4) = 24, 9 kernels.
    b.Traffic(18 * (hq + hkv) * d, 24 * (hq + hkv) * d, 14, 18);
  } else if (m.rotary_dim > 0) {
    PartialRotaryTraffic(b);  // Note [hf partial rotary]
  } else {
    b.Traffic(20 * (hq + hkv) * d, 34 * (hq + hkv) * d, 10, 20);
  }
  // Residual add (r 4h, w 2h); backward sums the gradients of the layer input's two uses (the
  // norm and the add: r 4h w 2h) and of the normed input's three (q, k and v: 2 x r 4h w 2h).
  // The q, k, v, o GEMMs: 4 forward, 8 backward (input and weight gradients).
  b.Traffic(6 * h, 18 * h, 1 + 4, 3 + 8);
  if (m.qkv_bias) {
    // q/k/v biases: added in the GEMM epilogue forward; backward sums each gradient over tokens.
    b.Traffic(0, 2 * (hq + 2 * hkv) * d, 0, 3);
  }
  // o_proj's bias (gpt-oss): its gradient summed over tokens (r 2h).
  if (m.o_bias) b.Traffic(0, 2 * h, 0, 1);
  if (b.dialect.eager) {
    EagerScores(b);
    return;
  }
  if (masked) {
    // A mask costs its conversion on every call (convert_boolean_attn_mask: where over the
    // bool [b, 1, s, s] mask, r1 w2 per pair) and, with k and v repeated (repeat_kv: hkv < hq),
    // their copies (r2 w2 of the expanded hq*d each); backward, repeat_kv's sums (r 2hq*d w
    // 2hkv*d each) and v's gradient copied back to the projection's layout (r2 w2 of hkv*d).
    const double rep = hkv < hq ? 1 : 0;
    b.Traffic(rep * 8 * hq * d + 3 * s, rep * (4 * hq * d + 8 * hkv * d), 2 * rep + 1, 3 * rep);
  }
  // Causal flash skips the blocks above the diagonal (a query sees half the sequence on
  // average); a masked kernel computes the whole square.
  AttentionCore(b, hq, d, d, masked ? s : 0.5 * s);
  // Forward: the projections before RoPE and RoPE's temporaries; backward: dq, dk, dv (dk, dv at
  // hkv heads) and cuDNN's workspace, the fp32 dQ accumulator and softmax_sum
  // (Note [SDPA on sm90]: no per-query-head dK/dV under GQA).
  b.cost.attn_forward_transient =
      static_cast<uint64_t>((2 * (hq + 2 * hkv) * d + 4 * hq * d) * b.t);
  b.cost.attn_backward_transient =
      static_cast<uint64_t>((2 * (hq + 2 * kv) * d + 4 * hq * d + 4 * hq) * b.t);
}

// Note [hf cross-attention]
// Mllama's cross-attention layers (MllamaCrossAttentionDecoderLayer, modeling_mllama.py) attend
// from the text to V vision tokens per sequence (ModelConfig::vision_tokens,
// Note [Vision tokens] in hf_config.cc); with V = 0 MllamaTextModel.forward skips them: they keep
// and cost nothing. Per text token: the input norm (Llama's, output kept by q_proj); q_norm
// (MllamaTextRMSNorm over head_dim, its output kept by SDPA as the query: fp32 x, rsqrt per head,
// bf16 normalised x, output); SDPA with the additive cross-attention mask (a float mask: the
// GPUs run the memory-efficient kernel, which keeps q, k, v, the output and the fp32
// logsumexp, and the mask, the step's one tensor shared by every layer); the output kept by
// o_proj; o_proj's output kept by the `cross_attn_attn_gate.tanh() *` mul (2h, and the tanh, 2
// bytes per layer); the MLP and its norm as in a Llama layer; the MLP's output, row-masked, kept
// by the `cross_attn_mlp_gate.tanh() *` mul (2h, and its tanh). Per vision token, per layer: k_norm
// over the keys (fp32 x, rsqrt, bf16 normalised x: 6 hkv d + 4 hkv) and the keys and values
// repeated to every query head by repeat_kv (a mask disables SDPA's GQA, use_gqa_in_sdpa): 4 hq d.
// The vision states (2hV) and the two masks (2sV + 2s) are the step's, held throughout
// (ApplyHfStep). Work: q_proj and o_proj run over the text, k_proj and v_proj over the vision
// tokens, the core over s x V.
void CrossAttention(HfLayer& b) {
  const ModelConfig& m = b.m;
  const double h = m.hidden, hq = m.heads, hkv = m.kv_heads, d = m.head_dim;
  const double vision = static_cast<double>(m.vision_tokens) * b.sequences;
  b.Norm("attn.norm", h, 1, true);
  b.Norm("attn.q_norm", hq * d, hq, true);
  // k_norm's tensors and k, v as the interface gets them; the rest of their repeats to every
  // query head, made inside the call (Note [hf attn_core]).
  b.Save("attn.kv", "", 0, vision * (6 * hkv * d + 4 * hkv + 4 * hkv * d));
  b.Save("attn.kv_repeated", "attn_core", 0, vision * 4 * (hq - hkv) * d);
  b.Save("attn.core_out", "", 2 * hq * d);  // kept by the reshape's consumer, o_proj
  b.Save("attn.softmax_lse", "attn_core", 4 * hq);
  b.Save("attn.gated_out", "", 2 * h, 2);  // and the gate's bf16 tanh, one value per layer
  b.NormTraffic(hkv * d * vision / b.t);
  // k/v repeat (r 2 w 2 per repeated element), the gate's tanh-mul and residual add.
  b.Traffic(8 * hq * d * vision / b.t + 12 * h, 12 * hq * d * vision / b.t + 24 * h, 4 + 4, 6 + 8);
  // k_proj and v_proj over the vision tokens instead of the text (BuildHfLayer counts every
  // dense parameter over the text tokens).
  b.gemm_flops += 2 * (2 * h * hkv * d) * (vision - b.t);
  const double core = 2 * hq * (d + d) * static_cast<double>(m.vision_tokens) * b.t;
  b.core_flops += core;
  b.fwd_kernels += 1;
  b.bwd_kernels += 3;
  AddModule(b, "attn_core", OpSeconds({.attention_forward_flops = core, .kernels = 1}, b.hw),
            false);
  b.cost.attn_forward_transient =
      static_cast<uint64_t>(2 * hq * d * b.t + 4 * hq * d * vision + 4 * hkv * d * vision);
  b.cost.attn_backward_transient =
      static_cast<uint64_t>(2 * hq * d * b.t + 4 * hq * d * b.t + 4 * hq * d * vision);
}

}  // namespace stowage::planner::hf_internal
