// The hf recipe's internals shared by its files (not the planner's interface: that is hf.h):
// the family dialect, the HfLayer builder each module kind adds its saved tensors and work to, and
// the builders of each layer part. Note [hf profile] below is the recipe's overview.
#ifndef STOWAGE_PLANNER_FRAMEWORKS_HF_LAYER_H_
#define STOWAGE_PLANNER_FRAMEWORKS_HF_LAYER_H_

#include <cmath>
#include <cstdint>
#include <string>

#include "planner/cost/cost_model.h"
#include "planner/frameworks/hf.h"
#include "planner/frameworks/step_cost.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"

namespace stowage::planner::hf_internal {

// Note [hf profile]
// What transformers' eager decoder (torch 2.x autograd, SDPA, bf16 weights and activations)
// keeps for backward, per token, counted from the code and checked against autograd's saved
// tensors on CPU (tests/python/measure/test_hf_profile.py). Autograd saves a mul's operand only
// when the other operand requires grad, so RoPE's `q * cos` keeps cos, not q; `.to(dtype)`, views,
// `mean` (2.x) and residual adds save nothing. Sizes: h hidden, d head_dim, hq/hkv heads,
// f intermediate, E experts, k experts per token, fe expert intermediate, V vocab.
//
//  RMSNorm (LlamaRMSNorm.forward, modeling_llama.py): `hidden_states.to(float32)` saved by
//    `pow(2)` (4h), `rsqrt(variance + eps)` saved by rsqrt and the mul (4), the bf16
//    `hidden_states.to(input_dtype)` saved by `self.weight * ...` (2h), and its output saved by
//    the linear that consumes it (2h): 8h + 4. The layer's bf16 input itself is not saved.
//  q/k norms (Qwen3Attention.forward, modeling_qwen3.py / modeling_qwen3_moe.py): the same
//    recipe over hq*d and hkv*d with one rsqrt per head, less the output (RoPE's muls keep only
//    cos/sin): 6*hq*d + 4*hq and 6*hkv*d + 4*hkv.
//  Attention (sdpa_attention_forward, integrations/sdpa_attention.py): with no padding mask
//    use_gqa_in_sdpa() is true, so k/v are not repeated; torch 2.11 runs cuDNN's kernel on an
//    H200 (hardware.cc Note [SDPA on sm90]), which saves q, k, v after RoPE, the output
//    and the fp32 logsumexp: 2*(hq + 2*hkv)*d + 2*hq*d + 4*hq. The output is already in
//    [b, s, h, d] layout, so `.transpose(1, 2).contiguous()` copies nothing and o_proj saves
//    the same storage. (On CPU SDPA's flash kernel saves the same set; its math kernel would
//    keep the attention matrix, which the GPUs do not run.) RoPE's cos and sin (2 * 2d) are
//    computed once per step (LlamaRotaryEmbedding.forward) and shared by every layer.
//  SwiGLU (LlamaMLP.forward): gate_proj's output saved by silu (2f), silu's output and
//    up_proj's output saved by the mul (4f), the product saved by down_proj (2f): 8f.
//  Routed experts (Qwen3MoeSparseMoeBlock + Qwen3MoeTopKRouter, modeling_qwen3_moe.py;
//    grouped_mm_experts_forward, integrations/moe.py): fp32 softmax of the router logits (4E),
//    top-k indices (8k), the renormalised top-k values and their sum (4k + 4), the sort
//    permutation's gather indices `perm // k`, `perm` and `inv_perm` (3 * 8k), the routing
//    weights gathered to bf16 (2k), the gathered hidden states saved by the up grouped_mm
//    (2hk), its [gate; up] output saved by silu and the mul (4*fe*k), silu's output and the
//    product (4*fe*k), the down grouped_mm output saved by the weighting mul (2hk).
//  LM head and loss (LlamaForCausalLM.forward; ForCausalLMLoss, loss/loss_utils.py): the
//    final norm (8h + 4), the bf16 logits held by the model output (2V), `logits.float()` (4V),
//    log_softmax's saved fp32 output (4V); in backward nll_loss's fp32 gradient (4V) and
//    log_softmax's gradient (4V) are alive with the saved output and the bf16 logits: the
//    loss's peak is 14V per token (forward reaches 10V). Labels padded and shifted: 16 bytes.
//  FFN backward: its peak, the SwiGLU mul's backward, is Note [hf FFN backward] (hf_ffn.cc).
//  Gradients: created by autograd when backward reaches each parameter (bf16 with
//    --grad-dtype bf16), so none exist at the loss's peak; they accumulate layer by layer, and
//    within a layer module by module (Note [hf gradient timing]).
//  Workspaces: PyTorch's two cuBLAS workspaces (kTorchCublasWorkspacesBytes, step_cost.h).
// Shared memory per block on sm70-sm100 (48 KiB): a softmax row wider than this is read three
// times forward and its gradient twice backward (Note [Kernel bytes], stowage/measure/op_work.py).
constexpr double kSharedMemoryPerBlock = 48 * 1024;

// Note [Step time]
// Each pass of a layer is an OpWork timed by OpSeconds (planner/hardware/op_time.h,
// Note [Op time]): dense GEMMs, grouped expert GEMMs at the tokens per expert (transformers'
// grouped_mm experts: torch._grouped_mm, at its own rate, Note [torch._grouped_mm rate] in
// hardware.cc; its forward and its backward's two calls, twice the forward's FLOPs), causal
// attention forward and backward (2.5x the forward's FLOPs), element-wise kernels by the bytes they
// read and write, and each kernel's fixed cost. Element-wise bytes per token are counted per op
// below (read + write); backward moves about twice the forward's. The matmuls transformers runs on
// fp32 operands are fp32 GEMMs (OpWork::fp32_gemm_flops: CUDA cores, TF32 off by torch's default,
// Note [Op time]), as stowage.measure.op_work classes every mm / bmm by its operands' dtype; among
// the recipes': the linear-attention fallbacks' chunk matmuls (Note [hf linear attention work]),
// the routers of DeepSeek-V2/V3, GLM and Kimi (`F.linear(x.float(), weight.float())`,
// Note [hf dialects]: 2hE per token forward, its input and weight gradients 4hE backward) and the
// DSA indexer's scores and their weighted sum over heads (`matmul(q.float(), k.float())`,
// Note [hf MLA]; no backward). Every other router (Qwen2/3-MoE, Qwen3-Next, Mixtral, gpt-oss,
// Llama 4) runs F.linear / nn.Linear on the bf16 hidden states and weight (transformers 5.17 and
// 5.23, e.g. Qwen3MoeTopKRouter.forward: `F.linear(hidden_states, self.weight)`).

enum class HfNorm { kLlama, kGemma, kGptOss };
enum class HfRouter { kQwen, kDeepSeekSoftmax, kDeepSeekSigmoid, kGptOss, kLlama4 };

struct HfDialect {
  HfNorm norm = HfNorm::kLlama;
  bool eager = false;  // eager_attention_forward (the model class refuses SDPA)
  HfRouter router = HfRouter::kQwen;
  bool fp32_rope = false;    // Note [hf OLMo and Phi-3]: RoPE's cos/sin stay fp32
  bool norms_after = false;  // Note [hf OLMo and Phi-3]: the norms follow the sublayers
  bool fused_qkv = false;    // Note [hf OLMo and Phi-3]: one qkv_proj, one gate_up_proj
  // Note [hf transformers versions]: grouped_mm experts make and apply the EP-sentinel mask.
  bool ep_sentinel_masks = false;
};

// Each family's dialect (Note [hf dialects], hf_layer.cc).
HfDialect DialectFor(const ModelConfig& m);

// An RMSNorm's element-wise work per element of its width in the `norm` dialect's code (how each
// figure is counted: hf_layer.cc).
using NormWork = HfNormWork;
NormWork NormWorkOf(HfNorm norm);

// One layer's cost as its parts build it: each module kind adds its saved tensors, FLOPs,
// element-wise work and transients (Note [Step time]); BuildHfLayer times and finishes it.
struct HfLayer {
  const ModelConfig& m;
  const HardwareProfile& hw;
  double t;          // tokens
  double s;          // keys per query's sequence (seq_len)
  double sequences;  // per micro-batch: what per-sequence constants multiply by
  HfDialect dialect;
  LayerCost cost;
  double gemm_flops = 0;     // forward, dense GEMMs
  double grouped_flops = 0;  // forward, expert GEMMs: torch._grouped_mm (Note [Step time])
  double tokens_per_expert = 0;
  double core_flops = 0;  // forward, attention core
  // Backward attention FLOPs beyond 2.5x the forward's: q/k and v head dims that differ (MLA).
  double core_backward_extra = 0;
  double no_grad_gemm_flops = 0;  // forward GEMMs under torch.no_grad: no backward GEMMs
  // GEMMs on fp32 operands (OpWork::fp32_gemm_flops, at the CUDA cores' rate), forward and
  // backward: the linear-attention fallbacks' chunk matmuls, the fp32 routers' F.linear, the DSA
  // indexer's scores (Note [Step time]).
  double fp32_gemm_flops = 0;
  double fp32_gemm_backward_flops = 0;
  // The DSA indexer's moment (Note [hf MLA]): the saved bytes made before it and what is alive
  // beyond them, for the whole micro-batch; 0 without an indexer.
  double indexer_level = 0;
  double fwd_bytes = 0;  // forward element-wise bytes per token
  double bwd_bytes = 0;  // backward element-wise bytes per token
  double fwd_kernels = 0, bwd_kernels = 0;

  // `per_layer` bytes do not grow with tokens (a weight's fp32 copy, grouped_mm's offsets).
  void Save(const std::string& name, const std::string& module, double bytes_per_token,
            double per_layer = 0) {
    cost.saved.push_back(
        {name, module, static_cast<uint64_t>(std::llround(bytes_per_token * t + per_layer))});
  }
  // An RMSNorm over `width` per token with `rows` rsqrt values, in this family's code (Note
  // [hf dialects]); `output_kept`: a linear consumes its output.
  void Norm(const std::string& name, double width, double rows, bool output_kept) {
    double bytes = 4 * width + 4 * rows + (output_kept ? 2 * width : 0);
    double per_layer = 0;
    switch (dialect.norm) {
      case HfNorm::kLlama:
        bytes += 2 * width;
        break;
      case HfNorm::kGemma:
        bytes += 4 * width;
        per_layer = 4 * width / rows;  // (1 + weight) in fp32, one weight per row
        break;
      case HfNorm::kGptOss:
        bytes += 4 * width;
        break;
    }
    Save(name, "", bytes, per_layer);
    NormTraffic(width);
  }
  // Element-wise work of one module: bytes per token read + written, forward and backward, and
  // the kernels each pass launches.
  void Traffic(double fwd, double bwd, double fwd_launches, double bwd_launches) {
    fwd_bytes += fwd;
    bwd_bytes += bwd;
    fwd_kernels += fwd_launches;
    bwd_kernels += bwd_launches;
  }
  // An RMSNorm over `width` in this family's code (NormWorkOf).
  void NormTraffic(double width) {
    const NormWork w = NormWorkOf(dialect.norm);
    Traffic(w.fwd * width, w.bwd * width, w.fwd_kernels, w.bwd_kernels);
  }
};

// Adds the recompute module `name` with the saved bytes its tensors already hold.
void AddModule(HfLayer& b, const std::string& name, double seconds, bool in_ffn);
// Whether SDPA gets a mask in this layer (Note [hf dialects]: masks).
bool HfMasked(const HfLayer& b, const LayerSpec& spec);
// The attention core's bookkeeping shared by the kinds (hf_layer.cc).
void AttentionCore(HfLayer& b, double heads, double dqk, double dv, double keys);
// Whether an H200 runs cuDNN's SDPA for these head dims (Note [hf MLA], hf_mla.cc).
bool HfCudnnAttention(double dqk, double dv);

// The attention part of a layer, by kind; each adds its saved tensors, work and transients.
// Softmax attention of every span, SDPA or eager (hf_attention.cc).
void SoftmaxAttention(HfLayer& b, const LayerSpec& spec);
// Mllama's cross-attention (Note [hf cross-attention], hf_attention.cc).
void CrossAttention(HfLayer& b);
// MLA and DSA (Note [hf MLA], hf_mla.cc).
void MlaAttention(HfLayer& b, const LayerSpec& spec);
// Gated DeltaNet and KDA (Note [hf linear attention], hf_linear_attention.cc).
void LinearAttention(HfLayer& b, const LayerSpec& spec);
// The FFN part: its norms, dense SwiGLU or routed experts (hf_ffn.cc).
void Ffn(HfLayer& b, const LayerSpec& spec);

}  // namespace stowage::planner::hf_internal

#endif  // STOWAGE_PLANNER_FRAMEWORKS_HF_LAYER_H_
