#include "planner/framework_hf.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "planner/op_time.h"

namespace stowage::planner {
namespace {

// Note [hf profile]
// What transformers' eager decoder (torch 2.x autograd, SDPA, bf16 weights and activations)
// keeps for backward, per token, counted from the code and checked against autograd's saved
// tensors on CPU (tests/python/hf_profile_test.py). Autograd saves a mul's operand only when
// the other operand requires grad, so RoPE's `q * cos` keeps cos, not q; `.to(dtype)`, views,
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
//    use_gqa_in_sdpa() is true, so k/v are not repeated; the CUDA flash / memory-efficient
//    kernels (aten _scaled_dot_product_flash_attention) save q, k, v after RoPE, the output
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
//  Gradients: created by autograd when backward reaches each parameter (bf16 with
//    --grad-dtype bf16), so none exist at the loss's peak; they accumulate layer by layer.
//  Workspaces: one cuBLAS workspace per (handle, stream); the forward runs on the Python
//    thread's handle, backward on the autograd engine's device thread with its own handle, and
//    each workspace is 32 MiB on sm90+ (CublasHandlePool.cpp, getChosenWorkspaceSize).
constexpr double kCublasWorkspaceBytes = 32.0 * 1024 * 1024;
constexpr int kCublasWorkspaces = 2;

// Note [Step time]
// Each pass of a layer is an OpWork timed by OpSeconds (planner/op_time.h, Note [Op time]):
// dense GEMMs, grouped expert GEMMs at the tokens per expert, causal attention forward and
// backward (2.5x the forward's FLOPs), element-wise kernels by the bytes they read and write,
// and each kernel's fixed cost. Element-wise bytes per token are counted per op below (read +
// write); backward moves about twice the forward's.

struct HfLayer {
  const ModelConfig& m;
  const HardwareProfile& hw;
  double t;  // tokens
  LayerCost cost;
  double gemm_flops = 0;     // forward, dense GEMMs
  double grouped_flops = 0;  // forward, expert GEMMs
  double tokens_per_expert = 0;
  double core_flops = 0;  // forward, attention core
  double fwd_bytes = 0;   // forward element-wise bytes per token
  double bwd_bytes = 0;   // backward element-wise bytes per token
  double fwd_kernels = 0, bwd_kernels = 0;

  void Save(const std::string& name, const std::string& module, double bytes_per_token) {
    cost.saved.push_back({name, module, static_cast<uint64_t>(std::llround(bytes_per_token * t))});
  }
  // An RMSNorm over `width` per token with `rows` rsqrt values: to(fp32) 2w+4w, pow 8w, mean
  // 4w, mul 8w, to(bf16) 6w, weight mul 4w = 36w forward.
  void NormTraffic(double width) {
    fwd_bytes += 36 * width;
    bwd_bytes += 72 * width;
    fwd_kernels += 7;
    bwd_kernels += 12;
  }
};

void AddModule(HfLayer& b, const std::string& name, double seconds, bool in_ffn) {
  uint64_t bytes = 0;
  for (const SavedTensor& t : b.cost.saved) {
    if (t.module == name) bytes += t.bytes;
  }
  b.cost.modules.push_back({name, bytes, seconds, in_ffn});
}

void Attention(HfLayer& b) {
  const ModelConfig& m = b.m;
  const double h = m.hidden, hq = m.heads, hkv = m.kv_heads, d = m.head_dim;
  b.Save("attn.norm", "", 8 * h + 4);
  b.NormTraffic(h);
  if (m.qk_norm != QkNorm::kNone) {
    const double rows_q = m.qk_norm == QkNorm::kPerHead ? hq : 1;
    const double rows_k = m.qk_norm == QkNorm::kPerHead ? hkv : 1;
    b.Save("attn.qk_norm", "", 6 * (hq + hkv) * d + 4 * (rows_q + rows_k));
    b.NormTraffic(hq * d);
    b.NormTraffic(hkv * d);
  }
  b.Save("attn.qkv", "", 2 * (hq + 2 * hkv) * d);
  b.Save("attn.core_out", "attn_core", 2 * hq * d + 4 * hq);
  // RoPE on q and k (apply_rotary_pos_emb): two muls, rotate_half's neg and cat, an add:
  // 20 bytes per element forward, about as many backward.
  b.fwd_bytes += 20 * (hq + hkv) * d;
  b.bwd_bytes += 20 * (hq + hkv) * d;
  b.fwd_kernels += 12;
  b.bwd_kernels += 12;
  // Residual add (r 4h, w 2h); backward sums the three projections' input gradients.
  b.fwd_bytes += 6 * h;
  b.bwd_bytes += 12 * h;
  b.fwd_kernels += 5;  // q, k, v, o projections, residual add
  b.bwd_kernels += 12;
  const double kv_len = 0.5 * b.t;  // causal: a query sees half the sequence on average
  const double core = 4 * hq * d * kv_len * b.t;
  b.core_flops += core;
  b.fwd_kernels += 1;
  b.bwd_kernels += 3;  // flash backward: preprocess, main, dq conversion
  // Forward: the projections before RoPE and RoPE's temporaries; backward: dq, dk, dv and the
  // fp32 dq accumulator of the flash backward (flash-attention's mha_bwd).
  b.cost.attn_forward_transient =
      static_cast<uint64_t>((2 * (hq + 2 * hkv) * d + 4 * hq * d) * b.t);
  b.cost.attn_backward_transient =
      static_cast<uint64_t>((2 * (hq + 2 * hkv) * d + 4 * hq * d + 4 * hq) * b.t);
  AddModule(b, "attn_core", OpSeconds({.attention_forward_flops = core, .kernels = 1}, b.hw),
            false);
}

void Ffn(HfLayer& b, const LayerSpec& spec) {
  const ModelConfig& m = b.m;
  const double h = m.hidden;
  b.Save("ffn.norm", "", 8 * h + 4);
  b.NormTraffic(h);
  b.fwd_bytes += 6 * h;  // residual add
  b.bwd_bytes += 6 * h;
  const size_t first = b.cost.saved.size();
  // A SwiGLU of width f (LlamaMLP.forward): silu r 2f w 2f, mul r 4f w 2f; backward the mul's
  // two gradients (r 6f w 4f) and silu's (r 4f w 2f), and the sum of gate's and up's input
  // gradients.
  auto swiglu = [&](double f, const char* prefix, const char* module) {
    b.Save(absl::StrCat(prefix, ".gate_up"), "", 4 * f);
    b.Save(absl::StrCat(prefix, ".act"), module, 4 * f);
    b.fwd_bytes += 10 * f;
    b.bwd_bytes += 16 * f + 6 * h;
    b.fwd_kernels += 5;
    b.bwd_kernels += 10;
  };
  if (spec.ffn == FfnKind::kDense) {
    const double f = m.intermediate;
    swiglu(f, "ffn", "ffn_act");
    AddModule(b, "ffn_act", OpSeconds({.elementwise_bytes = 10 * f * b.t, .kernels = 2}, b.hw),
              true);
    // Forward: down_proj's output; backward: the product's, silu's and up's gradients.
    b.cost.ffn_forward_transient = static_cast<uint64_t>(2 * h * b.t);
    b.cost.ffn_backward_transient = static_cast<uint64_t>(6 * f * b.t);
  } else {
    const double e = m.experts, k = m.experts_per_token, fe = m.moe_intermediate;
    b.Save("moe.router", "", 4 * e + 8 * k + 4 * k + 4);
    b.Save("moe.dispatched", "", 3 * 8 * k + 2 * k + 2 * h * k);
    b.Save("moe.gate_up", "", 4 * fe * k);
    b.Save("moe.act", "moe_act", 4 * fe * k);
    b.Save("moe.expert_out", "", 2 * h * k);
    // Router: softmax r 2E w 4E, top-k r 4E; sort of t*k int64 keys (radix passes, ~64 bytes
    // per key); the gathers hidden[perm // k] and weighted_out[inv_perm] (r 2hk w 2hk each);
    // gate/up activation 10*fe*k; the weighting mul 4hk; the sum over k r 2hk w 2h.
    b.fwd_bytes += 6 * e + 4 * e + 64 * k + 4 * h * k + 10 * fe * k + 4 * h * k + 4 * h * k +
                   2 * h * k + 2 * h;
    b.bwd_bytes +=
        2 * (4 * h * k + 10 * fe * k + 4 * h * k + 4 * h * k + 2 * h * k + 2 * h) + 6 * e;
    b.fwd_kernels += 30;
    b.bwd_kernels += 45;
    b.grouped_flops += 2 * 3 * h * fe * k * b.t;
    b.tokens_per_expert = b.t * k / e;
    if (m.shared_intermediate > 0) swiglu(m.shared_intermediate, "moe.shared", "");
    AddModule(b, "moe_act", OpSeconds({.elementwise_bytes = 10 * fe * k * b.t, .kernels = 2}, b.hw),
              true);
    // Forward: weighted_out, its permuted copy and the router logits; backward: the expert
    // intermediates' gradients and the gathered states' gradient.
    b.cost.ffn_forward_transient = static_cast<uint64_t>((4 * h * k + 2 * e) * b.t);
    b.cost.ffn_backward_transient = static_cast<uint64_t>((6 * fe * k + 4 * h * k) * b.t);
  }
  for (size_t i = first; i < b.cost.saved.size(); ++i) {
    b.cost.ffn_saved_bytes += b.cost.saved[i].bytes;
  }
}

}  // namespace

absl::Status ValidateHfRun(const ModelConfig& m, const RunSettings& run) {
  auto bad = [](const char* flag, auto value, const char* rule) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " is ", value, " with --framework hf; ", rule));
  };
  if (run.tp != 1) return bad("tp", run.tp, "transformers eager runs no tensor parallelism: use 1");
  if (run.cp != 1)
    return bad("cp", run.cp, "transformers eager runs no context parallelism: use 1");
  if (run.ep != 1) return bad("ep", run.ep, "transformers eager runs no expert parallelism: use 1");
  if (run.loss_chunk_tokens != 0) {
    return bad("loss-chunk-tokens", run.loss_chunk_tokens,
               "transformers' loss (ForCausalLMLoss) covers every token at once: use 0");
  }
  for (int i = 0; i < m.num_layers(); ++i) {
    // A sliding or chunked span needs a mask, which sends SDPA off the flash kernel and
    // repeats k/v (use_gqa_in_sdpa): not this recipe.
    if (m.layers[i].attention != AttentionKind::kAttention ||
        m.layers[i].span != AttentionSpan::kFull || m.layers[i].cross_attention) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--framework hf: layer ", i, " is ", m.layers[i].TypeName(),
          "; the hf profile has recipes for full causal softmax attention with a dense or MoE FFN "
          "only"));
    }
  }
  return absl::OkStatus();
}

LayerCost BuildHfLayer(const ModelConfig& m, const HardwareProfile& hw, const RunSettings& run,
                       int index, double tokens) {
  const LayerSpec& spec = m.layers[index];
  HfLayer b{m, hw, tokens, {}};
  b.cost.index = index;
  b.cost.type = spec.TypeName();
  Attention(b);
  Ffn(b, spec);
  const double dense_params = static_cast<double>(DenseLayerParams(m, spec));
  const double expert_params = static_cast<double>(RoutedExpertParams(m, spec));
  // Router and attention weights are dense GEMMs; expert GEMMs are counted by Ffn.
  b.gemm_flops += 2 * dense_params * tokens;
  // The layer's input is what full recompute keeps (checkpoint's saved inputs); keep does not
  // save it (the first norm saves its fp32 upcast).
  b.cost.input_bytes = static_cast<uint64_t>(std::llround(2.0 * m.hidden * tokens));
  b.cost.output_bytes = b.cost.input_bytes;
  for (const SavedTensor& s : b.cost.saved) b.cost.saved_bytes += s.bytes;
  b.cost.forward_flops = b.gemm_flops + b.grouped_flops + b.core_flops;
  b.cost.forward_seconds = OpSeconds({.gemm_flops = b.gemm_flops,
                                      .attention_forward_flops = b.core_flops,
                                      .grouped_gemm_flops = b.grouped_flops,
                                      .tokens_per_expert = b.tokens_per_expert,
                                      .elementwise_bytes = b.fwd_bytes * tokens,
                                      .kernels = b.fwd_kernels},
                                     hw);
  b.cost.backward_seconds = OpSeconds({.gemm_flops = 2 * b.gemm_flops,
                                       .attention_backward_flops = 2.5 * b.core_flops,
                                       .grouped_gemm_flops = 2 * b.grouped_flops,
                                       .tokens_per_expert = b.tokens_per_expert,
                                       .elementwise_bytes = b.bwd_bytes * tokens,
                                       .kernels = b.bwd_kernels},
                                      hw);
  b.cost.grad_bytes =
      static_cast<uint64_t>((dense_params + expert_params) * static_cast<double>(run.grad_bytes));
  return b.cost;
}

void ApplyHfStep(const ModelConfig& m, const HardwareProfile& hw, const RunSettings& run,
                 StepCost& c) {
  const double t = static_cast<double>(c.tokens_per_rank);
  const double h = m.hidden, v = m.vocab, d = m.head_dim;
  // Gradients are created in backward, not allocated before the step.
  c.gradients_in_backward = true;
  c.fixed.gradients = 0;
  // The LM head's (the embedding's too when tied) and the final norm's at the end of the tail.
  c.tail_grad_bytes = static_cast<uint64_t>((v * h + h) * run.grad_bytes);
  c.embedding_grad_bytes =
      m.tied_embeddings ? 0 : static_cast<uint64_t>(v * h * static_cast<double>(run.grad_bytes));
  // Held throughout the step: the two cuBLAS workspaces and RoPE's cos/sin (2 x 2d per token).
  c.fixed.other += static_cast<uint64_t>(kCublasWorkspaces * kCublasWorkspaceBytes + 4 * d * t);
  // The tail: final norm (8h + 4) + the loss's 14V + labels (16) per token (Note [hf profile]).
  c.tail_bytes = static_cast<uint64_t>(std::llround((8 * h + 4 + 14 * v + 16) * t));
  // LM head: forward GEMM and two backward GEMMs. Loss element-wise: float() 6V, log_softmax
  // 12V, nll_loss backward's zeros 4V, log_softmax backward 16V, to(bf16) 6V; the final norm.
  c.tail_seconds =
      OpSeconds({.gemm_flops = 3 * 2 * h * v * t, .elementwise_bytes = (44 * v + 108 * h) * t}, hw);
  // Embedding: the gather forward; backward zeroes a V x h gradient and scatters into it.
  c.embedding_seconds = OpSeconds({.elementwise_bytes = 4 * h * t + 2 * v * h + 6 * h * t}, hw);
}

}  // namespace stowage::planner
