// BuildHfLayer: one decoder layer's cost under the hf recipe, its attention and FFN parts
// (hf_attention.cc, hf_mla.cc, hf_linear_attention.cc, hf_ffn.cc) put together with what spans
// the layer: the step's masks (Note [hf masks]), the gradients made by each backward moment
// (Note [hf gradient timing]), Llama 4's forward under recompute, OLMo's and Phi-3's terms, and
// the layer's time; and ValidateHfRun.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner/frameworks/hf.h"
#include "planner/frameworks/hf_layer.h"
#include "planner/hardware/op_time.h"

namespace stowage::planner {
namespace hf_internal {
namespace {

// Note [hf OLMo and Phi-3]
// What OLMo 2/3 and Phi-3 run beyond Llama's layer (modeling_olmo2.py, modeling_olmo3.py,
// modeling_phi3.py), checked against the live bytes and op work of the real classes
// (tests/python/measure/test_hf_measured_agreement.py AgreementTest).
//  OLMo 2/3: the norms follow the sublayers (`post_attention_layernorm(self_attn(x))`) and
//    compute gpt-oss's fp32 weight mul: fp32 x, rsqrt, the fp32 normalised x (8w + 4 per row);
//    their output feeds the residual add, while the sublayer's bf16 input (2h) is what q/k/v
//    (gate/up) keep: the same 10h + 4 a pre-norm with its kept output counts, of which the
//    attention's 2h is the layer's input ("input": keep saves it). The q/k norms are
//    the same code over the whole projection. Olmo2RotaryEmbedding returns cos/sin in fp32 (no
//    `.to(x.dtype)`), one pair per layer type (Olmo3Model.forward), so `q * cos` promotes RoPE to
//    fp32 and `.to(q_type)` casts back: per element of q and k forward q * cos r2 w4, rotate_half
//    in bf16 (neg r1 w1, cat r2 w2), * sin r2 w4, the add r8 w4, the cast r4 w2 = 36 (Llama's
//    20), one kernel more; backward the cast's gradient r2 w4, * sin r4 w4 and * cos r4 w4 with
//    each gradient cast to q's bf16 (2 x r4 w2), rotate_half and the sum in bf16 as Llama's,
//    the layout copy: 60 (Llama's 34), three kernels more. Autograd keeps cos/sin only.
//    A norm after its sublayer runs first in that sublayer's backward: the post-feedforward
//    norm's before the MLP's, the post-attention norm's before the attention's. So at the SwiGLU
//    mul's backward (the FFN moment) and at the core's (the attention moment) that norm's fp32
//    x, rsqrt and normalised x (8h + 4) are freed (its 2h, the sublayer's input, stays: q/k/v
//    or gate/up keep it); and the norm's own backward is a moment of its own, every saved
//    tensor of the layer still alive, with its fp32 temporaries beyond them: the gradient cast
//    to fp32, the weight mul's and the rsqrt mul's, the row sum, mean's and pow's (20h), less
//    the normalised x it frees (4h) = 16h (the live bytes of OLMo 2's last layer at 4096
//    tokens: a mul, a div and a pow output of 4h each beyond the saved tensors, the fp32 x
//    still alive). Each part's moment is the larger of the two, each with the gradients made by
//    it (OlmoNormMoments): at the post-feedforward norm's none of the MLP's (down_proj's is
//    made at the FFN moment: olmo3 at 4096 tokens was 270 MiB high there, 5120 x 27648 bf16),
//    at the post-attention norm's the whole MLP's, not o_proj's.
//  Phi-3: one qkv_proj and one gate_up_proj. q, k, v are slices of qkv_proj's output: v goes to
//    SDPA as a view of it (k/v not repeated), so the kernel's saved v keeps the whole output
//    (2(hq + 2hkv)d, not 2 hkv d). apply_rotary_pos_emb is the partial-rotary form (Phi-4's
//    factor 1.0 still cats an empty q_pass): its cat, the output's copy for o_proj and their
//    work are Note [hf partial rotary]'s. Backward: each of the three slices' gradients is a
//    zero fill of qkv's width W = (hq + 2hkv)d and a copy (slice_backward: 10W over the three, 6
//    kernels), summed (2 x r4W w2W); gate_up's gradient is the cat of its halves' (r4f w4f); one
//    GEMM each instead of three (q, k, v) and two (gate, up), and none of Llama's sums of their
//    input gradients (2 x 6h, 6h).
void OlmoPhi3Terms(HfLayer& b, const LayerSpec& spec) {
  const ModelConfig& m = b.m;
  const double h = m.hidden, hq = m.heads, hkv = m.kv_heads, d = m.head_dim;
  if (b.dialect.fp32_rope) b.Traffic(16 * (hq + hkv) * d, 26 * (hq + hkv) * d, 2, 6);
  if (b.dialect.norms_after) {
    // The 2h of the attention norm's count that q/k/v keep is the layer's input itself: keep
    // saves it, so a recomputed layer's backward holds nothing beyond its saved tensors
    // (Note [Recompute moment] in cost_model.cc; SavesInput).
    auto norm = std::find_if(b.cost.saved.begin(), b.cost.saved.end(),
                             [](const SavedTensor& t) { return t.name == "attn.norm"; });
    const auto input = static_cast<uint64_t>(std::llround(2 * h * b.t));
    if (norm != b.cost.saved.end() && norm->bytes >= input) {
      norm->bytes -= input;
      b.cost.saved.insert(norm, {"input", "", input});
    }
    // The norms' own moments, with the gradients made by them: OlmoNormMoments.
    const double freed = (8 * h + 4) * b.t;
    auto less_freed = [&](uint64_t& transient) {
      transient = static_cast<uint64_t>(std::max(static_cast<double>(transient) - freed, 0.0));
    };
    less_freed(b.cost.ffn_backward_transient);
    less_freed(b.cost.attn_backward_transient);
  }
  if (!b.dialect.fused_qkv) return;
  const bool masked = !b.dialect.eager && HfMasked(b, spec);
  const bool repeated = (masked || b.dialect.eager) && hq != hkv;  // repeat_kv copies v
  const double w = (hq + 2 * hkv) * d;
  if (!repeated) b.Save("attn.qkv_out", "", 2 * (hq + hkv) * d);  // the rest of v's storage
  // Kernels: forward one GEMM for three; backward two for six, the three slices' 6, the two sums
  // for Llama's two (the partial-rotary cat's and its slices': Note [hf partial rotary]).
  b.Traffic(0, 22 * w - 12 * h, -2, -4 + 6 + 2 - 2);
  // One GEMM for two, forward and backward; the cat for the sum.
  b.Traffic(0, 8 * m.intermediate - 6 * h, -1, -2 + 1 - 1);
}

// Note [hf masks]
// The decoder's forward builds one mask per layer type it needs, once (Gemma2Model /
// Gemma3TextModel / GptOssModel.forward: causal_mask_mapping), and hands it to every layer of
// that type; none is saved by autograd (an add with a tensor that needs no gradient saves
// nothing), so they are freed when the model's forward returns, before the LM head.
//  Eager (masking_utils.eager_mask): a [b, 1, s, s] mask in the activations' dtype (bf16: 2
//    bytes per pair) whatever the length; Gemma 2 and gpt-oss build both the full and the
//    sliding one, whichever layer types the model has.
//  SDPA (sdpa_mask): none for full causal layers (is_causal instead); a bool [b, 1, s, s]
//    (1 byte per pair) for sliding-window layers once s >= the window (Gemma 3 builds it
//    whatever its layer types), for chunked layers once s > the chunk
//    (_ignore_causal_mask_sdpa); each layer then keeps its own converted copy (attn.mask).
// Under gradient checkpointing the layers' checkpoints hold their inputs, masks included
// (GradientCheckpointingLayer.__call__ binds them into the partial its checkpoint reruns), until
// their backward: a recomputed layer's backward has the masks alive
// (LayerCost::checkpoint_held_bytes, Note [Recompute moment] in cost_model.cc), and so does a
// selective attn_core's, whose checkpointed call is handed its layer's mask
// (RecomputeModule::holds_checkpoint_held). Held by every such checkpoint, they are freed after
// the lowest one's backward: alive also in the loss and in the backward of every layer above
// it, kept ones included, which the simulator counts (Note [Checkpoint-held inputs] in
// simulator.cc). Each layer gets its own type's mask (causal_mask_mapping[layer type]:
// Gemma2Model.forward builds the full and the sliding one whatever its layer types, 5.17 and
// 5.23), so its checkpoint holds that one (LayerCost::checkpoint_held_bytes, one group per
// layer type: LayerCost::checkpoint_held_group): a type's mask lives to the backward of the
// lowest recomputed layer of that type, and a type no checkpoint holds is freed with the
// forward. Gemma 2 with its sliding layers recomputed and its full ones kept holds one mask, 2 s^2
// bytes, not both; SDPA's full layers (is_causal, no mask) hold none.

// The mask one layer is handed (gets_mask in BuildHfLayer): eager's [b, 1, s, s] in bf16, SDPA's
// bool one; per sequence.
double HfLayerMaskBytes(const ModelConfig& m, double s) {
  return (DialectFor(m).eager ? 2 : 1) * s * s;
}

// The masks the decoder's forward builds (each layer type's, see above), per sequence.
double HfMaskBytes(const ModelConfig& m, double s) {
  const bool eager = DialectFor(m).eager;
  bool sliding = false, chunked = false;
  for (const LayerSpec& l : m.layers) {
    if (l.attention != AttentionKind::kAttention || l.cross_attention) continue;
    sliding |= l.span == AttentionSpan::kSliding;
    chunked |= l.span == AttentionSpan::kChunked;
  }
  if (eager) return 2 * 2 * s * s;
  double bytes = 0;
  sliding |= m.family == "gemma3_text" && m.sliding_window > 0;
  if (sliding && s >= m.sliding_window) bytes += s * s;
  if (chunked && s > m.attention_chunk) bytes += s * s;
  return bytes;
}

// Note [hf gradient timing]
// Which of a layer's parameter gradients exist at its two backward peaks (Note [Gradient timing]
// in cost_model.cc: autograd runs the layer's nodes in reverse order of their creation in
// forward, and a weight's gradient is made by the backward of the op that used it). The forward
// order is the decoder layer's: LlamaDecoderLayer.forward (modeling_llama.py; Mistral's,
// Mixtral's, Qwen's the same) runs input_layernorm, self_attn (q/k/v_proj, q/k norms, RoPE,
// the core, o_proj), the residual add, post_attention_layernorm, mlp, the residual add.
//  - FFN/MoE peak, the SwiGLU mul's backward (Note [hf FFN backward]): made are the weights used
//    after the mul: down_proj (LlamaMLP.forward: down_proj(act_fn(gate_proj(x)) * up_proj(x)));
//    in an MoE block the experts' down_proj (grouped_mm_experts_forward, integrations/moe.py:
//    the up grouped_mm, the gate, the down grouped_mm, the routing-weight mul), the shared
//    expert's gate when its product is taken after the experts (Qwen2MoeSparseMoeBlock), the
//    shared experts when they run after the routed ones (DeepseekV3MoE, Glm4MoeMoE,
//    Llama4TextMoe: `hidden_states + self.shared_experts(residuals)`; the Qwen blocks with a
//    gated shared expert call it before the router), and a post-feedforward norm (Gemma).
//    Not made: gate/up (gate_up_proj), the router, the FFN's norms, all of the attention.
//  - Attention peak, the core's backward (SDPA's, eager attention's scores, the linear
//    attention's chunks): made are the whole FFN/MoE block, the norms after the attention, and
//    what runs after the core (AttentionOutputParams: o_proj; linear attention's output norm
//    and out_proj). Not made: the q/k/v (or MLA's latent and up) projections, the q/k norms,
//    the input norm, the convs and gates before the core.
// Mistral at 4096 tokens: gate/up (224 MiB) and the attention's 80 MiB are not made at the FFN
// peak; Mixtral: the experts' gate_up_proj, 1.75 GiB
// (tests/python/measure/test_hf_measured_agreement.py).
//  - FFN/MoE input projections' backward (gate/up; a third moment, between the two, where
//    gate_up_proj's gradient is made): those of the FFN peak and gate/up's (the experts'
//    gate_up_proj); not the router, nor a shared expert that ran before it.
struct HfGradTiming {
  double by_ffn_peak = 0;  // parameters
  double by_ffn_inputs = 0;
  double by_attn_peak = 0;
};

HfGradTiming HfGradientsMade(const ModelConfig& m, const LayerSpec& spec) {
  const double h = m.hidden;
  HfGradTiming t;
  if (spec.cross_attention && m.vision_tokens == 0) return t;  // skipped: nothing runs
  // Gemma 2/3: post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm.
  const double norms_after_attention = std::max(0, m.norms_per_layer - 1) * h;
  const double post_ffn_norm = m.norms_per_layer == 4 ? h : 0;
  if (spec.ffn == FfnKind::kDense) {
    t.by_ffn_peak = h * m.intermediate + (m.mlp_bias ? h : 0) + post_ffn_norm;
    t.by_ffn_inputs =
        t.by_ffn_peak + 2 * h * m.intermediate + (m.mlp_bias ? 2 * m.intermediate : 0);
  } else {
    t.by_ffn_peak = static_cast<double>(m.experts) * h * m.moe_intermediate +
                    (m.expert_bias ? static_cast<double>(m.experts) * h : 0) + post_ffn_norm;
    if (m.shared_expert_gate) {
      t.by_ffn_peak += h;  // the gate: its shared expert ran before the router
    } else {
      t.by_ffn_peak += 3 * h * m.shared_intermediate;
    }
    const double down = static_cast<double>(m.experts) * h * m.moe_intermediate +
                        (m.expert_bias ? static_cast<double>(m.experts) * h : 0);
    t.by_ffn_inputs = t.by_ffn_peak + static_cast<double>(RoutedExpertParams(m, spec)) - down;
  }
  t.by_attn_peak = static_cast<double>(FfnDenseParams(m, spec)) +
                   static_cast<double>(RoutedExpertParams(m, spec)) + norms_after_attention +
                   static_cast<double>(AttentionOutputParams(m, spec));
  if (spec.cross_attention) t.by_attn_peak += 2;  // the two tanh gates, after the core
  return t;
}

// Note [hf recompute forward]
// A layer run under torch.utils.checkpoint (non-reentrant: its pack hook keeps no saved
// tensor) frees each tensor once the forward's own references to it are gone, so its forward
// peaks where the Python code holds the most at once, not where a kept layer's saved tensors
// pile up. Llama 4 (modeling_llama4.py, transformers 5.23): Llama4TextDecoderLayer.forward holds
// `residual` (the mid state), `attention_states` (o_proj's output) and the normed FFN input in
// its frame while the FFN runs (6h); Llama4TextMoe.forward holds the router's logits and bf16
// scores (4E) and `routed_in * scores` (2hE; the repeat's copy is freed by the rebinding), which
// Llama4TextExperts.forward keeps while its [gate; up] bmm output (4feE), the activation (2feE)
// and the product (2feE) are alive at `up * self.act_fn(gate)`; a dense layer's Llama4TextMLP
// holds act_fn(gate) (the gate freed), up and the product (6f) at its mul; and the step's masks.
// The live bytes of Llama 4 at 16384 tokens, every layer checkpointed, say so exactly: the MoE
// layers' forward, planned from their transients, was 13.8 GiB low. The shared expert, run after
// the routed ones, peaks below (the routed output 2hE and its 6fs). Other families' forward
// under recompute is counted by their transients only (LayerCost::unkept_forward_bytes 0): lower
// than this moment but below the rerun's in the layer's backward (Note [Recompute moment] in
// cost_model.cc), where a recomputed step peaks.
void Llama4UnkeptForward(HfLayer& b, const LayerSpec& spec, double masks) {
  if (b.dialect.router != HfRouter::kLlama4) return;
  const ModelConfig& m = b.m;
  const double h = m.hidden, e = m.experts, fe = m.moe_intermediate;
  const double ffn =
      spec.ffn == FfnKind::kDense ? 6.0 * m.intermediate : 4 * e + 2 * h * e + 8 * fe * e;
  b.cost.unkept_forward_bytes = static_cast<uint64_t>(std::llround((6 * h + ffn) * b.t + masks));
}

// Note [hf OLMo and Phi-3]: a norm after its sublayer runs its backward before that sublayer's,
// so its moment (16h of fp32 temporaries over every saved tensor) has fewer of the layer's
// gradients made than the sublayer's moment EvaluateOption counts with it: its transient there
// is the norm's less the gradients made between the two (`made`, Note [hf gradient timing]).
void OlmoNormMoments(HfLayer& b, const LayerSpec& spec, const HfGradTiming& made,
                     double grad_dtype) {
  if (!b.dialect.norms_after) return;
  const double h = b.m.hidden, norm_backward = 16 * h * b.t;
  auto moment = [&](uint64_t& transient, double made_after_norm) {
    transient = static_cast<uint64_t>(
        std::max(static_cast<double>(transient), norm_backward - made_after_norm * grad_dtype));
  };
  // At the post-feedforward norm's moment none of the FFN moment's gradients is made.
  moment(b.cost.ffn_backward_transient, made.by_ffn_peak);
  // At the post-attention norm's the FFN's and the norms' are; o_proj's is not.
  moment(b.cost.attn_backward_transient, static_cast<double>(AttentionOutputParams(b.m, spec)));
}

}  // namespace
}  // namespace hf_internal

using hf_internal::CrossAttention;
using hf_internal::DialectFor;
using hf_internal::Ffn;
using hf_internal::HfGradientsMade;
using hf_internal::HfGradTiming;
using hf_internal::HfLayer;
using hf_internal::HfLayerMaskBytes;
using hf_internal::HfMaskBytes;
using hf_internal::HfMasked;
using hf_internal::LinearAttention;
using hf_internal::Llama4UnkeptForward;
using hf_internal::MlaAttention;
using hf_internal::OlmoNormMoments;
using hf_internal::OlmoPhi3Terms;
using hf_internal::SoftmaxAttention;

absl::Status ValidateHfRun(const ModelConfig& /*model*/, const RunSettings& run) {
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
  return absl::OkStatus();
}

LayerCost BuildHfLayer(const ModelConfig& m, const HardwareProfile& hw, const RunSettings& run,
                       int index, double tokens) {
  const LayerSpec& spec = m.layers[index];
  HfLayer b{m,
            hw,
            tokens,
            static_cast<double>(run.seq_len),
            static_cast<double>(run.micro_batch),
            DialectFor(m),
            {}};
  b.dialect.ep_sentinel_masks = run.transformers_minor < 18;
  b.cost.index = index;
  b.cost.type = spec.TypeName();
  // LlamaMLP.forward is down_proj(act_fn(gate_proj(x)) * up_proj(x)) over every token, and the
  // MoE blocks route all tokens at once: nothing in transformers chunks the FFN.
  b.cost.ffn_chunkable = false;
  const bool skipped = spec.cross_attention && m.vision_tokens == 0;
  if (skipped) {
    // A text-only step: MllamaTextModel.forward skips the layer (Note [hf cross-attention]).
    b.cost.input_bytes = b.cost.output_bytes =
        static_cast<uint64_t>(std::llround(2.0 * m.hidden * tokens));
    return b.cost;
  }
  const auto saved_so_far = [&b] {
    uint64_t bytes = 0;
    for (const SavedTensor& t : b.cost.saved) bytes += t.bytes;
    return bytes;
  };
  switch (spec.cross_attention ? AttentionKind::kAttention : spec.attention) {
    case AttentionKind::kAttention:
      if (spec.cross_attention) {
        CrossAttention(b);
      } else {
        SoftmaxAttention(b, spec);
      }
      break;
    case AttentionKind::kMla:
    case AttentionKind::kDsa:
      MlaAttention(b, spec);
      break;
    case AttentionKind::kKda:
    case AttentionKind::kGdn:
      LinearAttention(b, spec);
      break;
  }
  const uint64_t attention_saved = saved_so_far();
  Ffn(b, spec);
  if (b.dialect.eager && spec.attention == AttentionKind::kAttention && !spec.cross_attention) {
    // Note [hf eager attention]: the FFN's input norms count in the attention part of the saved
    // bytes (outside ffn_saved_bytes) but do not exist yet at the forward's moment and no more
    // at the backward's.
    const uint64_t norms = saved_so_far() - attention_saved - b.cost.ffn_saved_bytes;
    b.cost.attn_forward_transient -= std::min(norms, b.cost.attn_forward_transient);
    b.cost.attn_backward_transient -= std::min(norms, b.cost.attn_backward_transient);
  }
  if (spec.attention == AttentionKind::kKda || spec.attention == AttentionKind::kGdn) {
    // The KDA and GDN cores' backward moments (LinearAttention) come after the FFN's input
    // norm's backward, which has freed that norm's tensors, counted in the attention part.
    const uint64_t norms = saved_so_far() - attention_saved - b.cost.ffn_saved_bytes;
    b.cost.attn_backward_transient -= std::min(norms, b.cost.attn_backward_transient);
  }
  OlmoPhi3Terms(b, spec);
  if (b.indexer_level > 0) {
    // Note [hf MLA]: the indexer's moment over every saved tensor the attention part counts
    // (the FFN's norm included), when it is the part's peak.
    const double attn_saved = static_cast<double>(saved_so_far() - b.cost.ffn_saved_bytes);
    b.cost.attn_forward_transient =
        std::max(b.cost.attn_forward_transient,
                 static_cast<uint64_t>(std::max(0.0, b.indexer_level - attn_saved)));
  }
  // The step's attention masks live while the model's forward runs (Note [hf masks]).
  const double masks = HfMaskBytes(m, b.s) * b.sequences;
  b.cost.attn_forward_transient += static_cast<uint64_t>(masks);
  b.cost.ffn_forward_transient += static_cast<uint64_t>(masks);
  // Note [hf masks]: a layer (and its attention call, so the attn_core module's checkpoint too)
  // is handed its type's mask, and holds that one: eager attention always gets one, SDPA where
  // masked; one group per layer type.
  const bool gets_mask = spec.attention == AttentionKind::kAttention && !spec.cross_attention &&
                         (b.dialect.eager || HfMasked(b, spec));
  const double handed = gets_mask ? HfLayerMaskBytes(m, b.s) * b.sequences : 0;
  b.cost.checkpoint_held_bytes = static_cast<uint64_t>(handed);
  b.cost.checkpoint_held_group = static_cast<int>(spec.span);
  for (RecomputeModule& mod : b.cost.modules) {
    mod.holds_checkpoint_held = mod.name == "attn_core" && handed > 0;
  }
  Llama4UnkeptForward(b, spec, masks);
  const double dense_params = static_cast<double>(DenseLayerParams(m, spec));
  const double expert_params = static_cast<double>(RoutedExpertParams(m, spec));
  // Router and attention weights are dense GEMMs; expert GEMMs are counted by Ffn.
  b.gemm_flops += 2 * dense_params * tokens;
  // The layer's input is what full recompute keeps (checkpoint's saved inputs); keep does not
  // save it (the first norm saves its fp32 upcast).
  b.cost.input_bytes = static_cast<uint64_t>(std::llround(2.0 * m.hidden * tokens));
  b.cost.output_bytes = b.cost.input_bytes;
  // Note [Gradient timing]: autograd makes the input's gradient last, in the layer's first ops'
  // backward (the input norm's, or q/k/v's under OLMo), where the residual's gradient and
  // theirs are summed.
  b.cost.input_grad_made_last = true;
  for (const SavedTensor& s : b.cost.saved) b.cost.saved_bytes += s.bytes;
  b.cost.forward_flops = b.gemm_flops + b.fp32_gemm_flops + b.grouped_flops + b.core_flops;
  b.cost.forward_time = OpTimeOf({.gemm_flops = b.gemm_flops,
                                  .fp32_gemm_flops = b.fp32_gemm_flops,
                                  .attention_forward_flops = b.core_flops,
                                  .torch_grouped_mm_flops = b.grouped_flops,
                                  .tokens_per_expert = b.tokens_per_expert,
                                  .elementwise_bytes = b.fwd_bytes * tokens,
                                  .kernels = b.fwd_kernels},
                                 hw);
  b.cost.forward_seconds = b.cost.forward_time.total();
  b.cost.backward_time =
      OpTimeOf({.gemm_flops = 2 * (b.gemm_flops - b.no_grad_gemm_flops),
                .fp32_gemm_flops = b.fp32_gemm_backward_flops,
                .attention_backward_flops = 2.5 * b.core_flops + b.core_backward_extra,
                .torch_grouped_mm_flops = 2 * b.grouped_flops,
                .tokens_per_expert = b.tokens_per_expert,
                .elementwise_bytes = b.bwd_bytes * tokens,
                .kernels = b.bwd_kernels},
               hw);
  b.cost.backward_seconds = b.cost.backward_time.total();
  const double grad_dtype = static_cast<double>(run.grad_bytes);
  b.cost.grad_bytes = static_cast<uint64_t>((dense_params + expert_params) * grad_dtype);
  const HfGradTiming made = HfGradientsMade(m, spec);
  b.cost.ffn_peak_grad_bytes = static_cast<uint64_t>(made.by_ffn_peak * grad_dtype);
  b.cost.ffn_inputs_grad_bytes = static_cast<uint64_t>(made.by_ffn_inputs * grad_dtype);
  b.cost.attn_peak_grad_bytes = static_cast<uint64_t>(made.by_attn_peak * grad_dtype);
  OlmoNormMoments(b, spec, made, grad_dtype);
  return b.cost;
}

}  // namespace stowage::planner
