// The hf recipe's shared HfLayer helpers and its family dialects: which code each model family
// runs where the families differ (Note [hf dialects]), the RMSNorms' work, and the attention
// core's bookkeeping shared by the attention kinds.
#include "planner/frameworks/hf_layer.h"

#include <cstdint>
#include <string>

#include "planner/frameworks/hf.h"
#include "planner/hardware/op_time.h"

namespace stowage::planner {
namespace hf_internal {

// Note [hf dialects]
// Families differ in code the recipe counts (each modeling_<family>.py). Checked against
// autograd's saved tensors for each family on CPU (tests/python/measure/test_hf_layer_kinds.py).
//  Norms: Llama's RMSNorm (Note [hf profile]) keeps fp32 x, rsqrt and the bf16 normalised x: 6w + 4
//  per
//    row, plus its output (2w) where a linear consumes it. Gemma2/3RMSNorm computes
//    `_norm(x.float()) * (1.0 + weight.float())`: fp32 x, rsqrt, the fp32 normalised x and the
//    fp32 (1 + weight) (4w bytes per layer, not per token): 8w + 4 per row; the post-attention
//    and post-feedforward norms feed a residual add, so only the pre-norms' outputs (2w) are
//    kept by a linear. GptOssRMSNorm computes `weight * x_normed` in fp32, then `.to(bf16)`:
//    8w + 4 per row, plus the output. Llama 4's q/k L2Norm (no weight): fp32 x and rsqrt.
//  Attention implementation: Gemma 2 and gpt-oss refuse SDPA (`_supports_sdpa = False`:
//    soft-capping, sinks), so transformers runs eager_attention_forward, which repeats k/v to
//    every query head (repeat_kv) and keeps the s x s scores: softmax's fp32 output (4) and its
//    bf16 copy kept by the PV matmul (2) per head and key; soft-capping's tanh keeps its bf16
//    output (2); with sinks (modeling_gpt_oss.py) the softmax runs in bf16 over s + 1 logits
//    (its output, 2 per head and key + 1) after a max whose int64 indices are kept (8 per head).
//  Masks (masking_utils.py sdpa_mask): a sliding-window or chunked layer gets a [b, 1, s, s]
//    bool mask unless the sequence is shorter than the window (_ignore_causal_mask_sdpa; a
//    chunk: not longer than it), and GLM-5 / DeepSeek-V3.2 fold the indexer's top-k into the
//    mask of every DSA layer (GlmMoeDsaAttention.forward). SDPA converts the bool mask to an
//    additive mask of the query's dtype on every call (aten convert_boolean_attn_mask) and the
//    memory-efficient kernel a mask sends it to keeps it for backward: 2 bytes per key and
//    token in each layer. With a mask use_gqa_in_sdpa() is false, so k and v are repeated to
//    every query head. A masked kernel computes every block of the s x s square, and eager
//    attention multiplies whole s x s matrices: the window saves no FLOPs here.
//  MLA (modeling_deepseek_v3.py DeepseekV3Attention): q_a_layernorm and kv_a_layernorm are
//    Llama norms over q_lora_rank / kv_lora_rank feeding q_b_proj / kv_b_proj; SDPA gets q and
//    k as new tensors (cat of the nope and rope parts, 2*h*dqk each), v as a view of
//    kv_b_proj's output (2*h*(d_nope + dv)); q/k and v head dims differ, so the GPUs run the
//    memory-efficient kernel (saves q, k, v, the output and the fp32 logsumexp). The DSA
//    indexer runs under torch.no_grad (GlmMoeDsaIndexer.forward): it keeps nothing.
//  Routers (their TopkRouter / MoE classes): DeepSeek-V2/V3, GLM and Kimi compute the router
//    linear in fp32 (`F.linear(x.float(), weight.float())`: fp32 x, and the fp32 weight copy,
//    4*E*h bytes per layer), then softmax (V2) or sigmoid (V3, GLM) kept fp32 (4E), top-k
//    indices (8k); V3 and GLM renormalise (the sum, 4, and the top-k weights, 4k); routing
//    weights stay fp32 (4k gathered). gpt-oss takes top-k of the biased logits, then a bf16
//    softmax over k (2k); its expert biases are gathered by expert id (one more int64 index);
//    its activation (GptOssExperts._apply_gate: clamp, sigmoid(alpha * gate), (up + 1) * glu)
//    keeps five tensors of fe per routed token (10*fe*k). Llama 4 (Llama4TextMoe) runs every
//    expert on every token: it keeps the sigmoid of the scattered top-k scores (4E), their
//    bf16 copy (2E), the input repeated E times and its weighted copy (2*h*E each), and the
//    bmm experts' [gate; up], silu and product (8*fe*E). grouped_mm keeps its int32 expert
//    offsets (4E bytes per layer).

HfDialect DialectFor(const ModelConfig& m) {
  HfDialect d;
  const std::string& f = m.family;
  // Qwen3NextRMSNorm / Qwen3_5RMSNorm compute `_norm(x.float()) * (1.0 + weight.float())`, as
  // Gemma's does.
  if (f == "gemma2" || f == "gemma3_text" || f == "qwen3_next" || f == "qwen3_5_text" ||
      f == "qwen3_5_moe_text") {
    d.norm = HfNorm::kGemma;
  }
  if (f == "gpt_oss") d.norm = HfNorm::kGptOss;
  // Olmo2RMSNorm / Olmo3RMSNorm: `(self.weight * hidden_states).to(input_dtype)`, gpt-oss's code.
  if (f == "olmo2" || f == "olmo3") {
    d.norm = HfNorm::kGptOss;
    d.fp32_rope = true;
    d.norms_after = true;
  }
  d.fused_qkv = f == "phi3";
  d.eager = f == "gemma2" || f == "gpt_oss";
  if (f == "deepseek_v2") d.router = HfRouter::kDeepSeekSoftmax;
  if (f == "deepseek_v3" || f == "deepseek_v32" || f == "glm_moe_dsa" || f == "glm4_moe" ||
      f == "kimi_linear") {
    d.router = HfRouter::kDeepSeekSigmoid;
  }
  if (f == "gpt_oss") d.router = HfRouter::kGptOss;
  if (f == "llama4_text") d.router = HfRouter::kLlama4;
  return d;
}

// An RMSNorm's element-wise work per element of its width: bytes read + written forward and
// backward, and kernels. LlamaRMSNorm.forward: forward to(fp32) r2 w4, pow r4 w4, mean r4, (+eps,
// rsqrt: per row), mul r4 w4, to(bf16) r4 w2, weight mul r2 w2 = 36, 8 kernels. Backward, in
// autograd's order: the weight mul's two gradients (g * x r4 w2 summed over tokens r2; g * weight
// r2 w2), to(bf16)'s (r2 w4), the rsqrt mul's (g * r r4 w4; (g * x).sum(-1) r8 w4 + r4), rsqrt's
// backward on the rows (pow, two muls), mean's backward dividing the gradient expanded over the
// row (r4 w4: the measured profile reads an expanded input per element,
// stowage/measure/op_work.py), pow's (x.pow(1) r4 w4, * 2 r4 w4, * g r8 w4), the sum of x32's two
// gradients (r8 w4), to(fp32)'s (r4 w2) = 96, 16 kernels (the live ops of DeepSeek-V2's norms at
// 4096 tokens: 96.02 per element). The gpt-oss / OLMo 2/3 norm multiplies by the weight in fp32 and
// casts after (`(self.weight * hidden_states).to(input_dtype)`): forward the mul r4 w4 and the cast
// r4 w2 instead of r4 w2 and r2 w2 (+4); backward the cast's gradient to fp32 (r2 w4) first, then
// the mul's two in fp32 (g * weight r4 w4; g * x r8 w4, summed over tokens r4) instead of (r2 w2;
// r4 w2, r2) (+12), one kernel more. Every kind's figures are LiveBytes' op work
// (stowage/measure/op_work.py) on the real modules' forward and backward (LlamaRMSNorm,
// DeepseekV2RMSNorm: 96.01 B, 16 kernels backward; GptOssRMSNorm, Olmo2RMSNorm, Gemma2/3RMSNorm:
// 108.02 B, 17), bf16 [1024, 4096] on the CPU. Gemma's norm (Gemma2/3RMSNorm, Qwen3-Next's:
// `_norm(x.float()) * (1.0 + weight.float())`) runs the same fp32 weight mul after an fp32 copy of
// the weight and its `1 +` (two kernels more forward); its backward measures as the gpt-oss norm's:
// 40 forward, 108 backward, 10 and 17 kernels.
NormWork NormWorkOf(HfNorm norm) {
  if (norm == HfNorm::kGptOss) return {40, 108, 8, 17};
  if (norm == HfNorm::kGemma) return {40, 108, 10, 17};
  return {36, 96, 8, 16};
}

void AddModule(HfLayer& b, const std::string& name, double seconds, bool in_ffn) {
  // The cost model's AddModule. BuildHfLayer returns no status: a module whose tensors add up
  // beyond kMaxTensorBytes keeps that sum as its saved_bytes, which CheckStepCostBounds (run by
  // BuildStepCost on every step) refuses, naming the layer and the module.
  planner::AddModule(b.cost, name, seconds, in_ffn).IgnoreError();
}

// Whether SDPA gets a mask in this layer (Note [hf dialects]: masks).
bool HfMasked(const HfLayer& b, const LayerSpec& spec) {
  if (spec.attention == AttentionKind::kDsa) return true;
  if (spec.span == AttentionSpan::kSliding) return b.s >= b.m.sliding_window;
  if (spec.span == AttentionSpan::kChunked) return b.s > b.m.attention_chunk;
  return false;
}

// The attention core's bookkeeping shared by the kinds: FLOPs over `keys` per query, kernel
// counts, the module and the transients.
void AttentionCore(HfLayer& b, double heads, double dqk, double dv, double keys) {
  const double core = 2 * heads * (dqk + dv) * keys * b.t;
  b.core_flops += core;
  // The backward recomputes S = QK^T (dqk) and makes dV = P^T dO (dv), dP = dO V^T (dv),
  // dQ = dS K and dK = dS^T Q (dqk each): 2 (3 dqk + 2 dv) per pair, 2.5x the forward's when
  // dqk = dv (stowage/measure/op_work.py _attention_flops counts the same).
  b.core_backward_extra += 2 * heads * (3 * dqk + 2 * dv) * keys * b.t - 2.5 * core;
  b.fwd_kernels += 1;
  b.bwd_kernels += 3;  // flash backward: preprocess, main, dq conversion
  AddModule(b, "attn_core", OpSeconds({.attention_forward_flops = core, .kernels = 1}, b.hw),
            false);
}

}  // namespace hf_internal

HfNormWork NormWorkOf(const ModelConfig& model) {
  return hf_internal::NormWorkOf(hf_internal::DialectFor(model).norm);
}

}  // namespace stowage::planner
