#include "planner/cost/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/checked_math.h"
#include "planner/frameworks/hf.h"
#include "planner/hardware/op_time.h"
#include "planner/search/pipeline.h"

namespace stowage::planner {
namespace {

// Note [Cost model]
// Bytes are counted per token from the layer shapes and multiplied by the tokens one rank holds
// (seq_len * micro_batch / cp). Under TP with sequence parallelism, tensors on the residual path
// (layer input, norms) divide by tp, tensors inside attention and the FFN divide their head or
// intermediate dimension by tp. Routed-expert tensors scale with the tokens the busiest
// expert-parallel rank receives: tokens * top_k * moe_imbalance (expert TP is 1). A layer's
// input is hc_mult * hidden wide (mHC residual streams), which is what makes 1M tokens / CP 8 of
// GLM-5.3-Flash come to 32 KiB per token per layer, 180 GiB over 45 layers.
//
// Seconds: each module's work as an OpWork, timed by OpSeconds (planner/hardware/op_time.h): matmul FLOPs
// (2 per multiply-add; backward twice forward) as dense GEMMs, routed experts as grouped GEMMs
// at the tokens each local expert receives; softmax attention cores (flash / TE fused
// attention, MLA and DSA's sparse core) by their own FLOP counts (causal: each query sees half
// the sequence on average, under CP too; backward 2.5x forward as in flash kernels); linear
// attention's chunked cores and the DSA indexer as GEMMs; element-wise work as three passes
// over the saved bytes. Communication adds what compute does not hide (Note
// [Communication] in communication.cc).

// Note [megatron profile]
// What a Megatron-Core (0.16) layer with TransformerEngine (2.x) kernels keeps for backward, per
// token; checked against Megatron-Core's own local-spec layers on CPU by
// tests/python/test_megatron_profile.py, which also states, as cited constants, what the local
// spec keeps instead where TE's fused kernels differ. TE files are under
// transformer_engine/pytorch/, Megatron-Core's under megatron/core/.
//  Norm + linear (TELayerNormColumnParallelLinear = module/layernorm_linear.py
//    _LayerNormLinear.forward): saves the norm's input (the layer input or the residual `mid`:
//    the same storage), ln_out (the local sequence shard under SP; backward all-gathers it) and
//    rsigma, one fp32 per row: h*dt/tp + 4/tp for each of the two norms. TENorm before a MoE
//    (ops/basic/rmsnorm.py RMSNorm.op_forward) saves its input and rstdevs the same way.
//  q/k norms (TENorm, the same op_forward): `input_.contiguous()` copies the q and k views out
//    of linear_qkv's output and saves the copies with one fp32 rstdev per head.
//  Attention (transformer/attention.py SelfAttention with TEDotProductAttention, RoPE fused:
//    Megatron-LM's default, --no-rope-fusion turns it off): fused RoPE (attention/rope.py
//    FusedRoPEFunc) saves only the shared freqs; v is a view into linear_qkv's output, which
//    attention/dot_product_attention/utils.py get_qkv_layout finds "not_supported" and makes
//    contiguous, so flash/cuDNN attention keeps q, k, v at (hq + 2 hkv) d, its output and the
//    fp32 softmax_lse per head. The output is linear_proj's saved input too (one storage).
//    Selective recompute of the core (Megatron's "core_attn") is not a module here: the output
//    stays saved by linear_proj, and tensor_parallel.checkpoint would hold q, k and the v view,
//    i.e. all of linear_qkv's output, more than the kernel's own saved set (transformer_config.py
//    warns that fused attention needs no core_attn recompute).
//  MLA (transformer/multi_latent_attention.py; the local spec cannot build it on CPU at 0.16.1:
//    "DotProductAttention.__init__() got an unexpected keyword argument 'k_channels'", so these
//    terms are counted from the code): latent norms fused into the up projections as above; q, k
//    and v made contiguous before the core, so core_attn recompute frees only softmax_lse.
//  Dense MLP: fused SwiGLU (fusions/fused_bias_swiglu.py SwiGLUFunction, bias_activation_fusion)
//    saves its input only (2f); fc2 (TERowParallelLinear) saves its input (f).
//  MoE (transformer/moe/, softmax top-k router, unfused permute: moe_permute_fusion's default):
//    the router's gating linear saves its input (the pre-MLP norm's output, counted there);
//    moe_utils.py topk_softmax_with_capacity keeps the top-k indices (int64) and the fp32
//    softmax over the top-k scores: 12k; moe_utils.py permute keeps the routing map transposed
//    (bool, E), the transposed probs for masked_select (dt E) and the sorted token indices
//    (int64, 8k); experts keep the dispatched tokens (fc1's input), fc1's output and the
//    permuted probs (experts.py TEGroupedMLP.forward: weighted_bias_swiglu_impl applies the
//    probs inside the activation and saves input + probs) and the activation (fc2's input). The
//    experts' output is not saved: the probs were applied before fc2, and unpermute keeps indices.

// Note [MTP layers]
// Multi-token prediction (DeepSeek-V3, GLM-4.5/5: num_nextn_predict_layers) as Megatron-Core 0.16
// trains it (transformer/multi_token_prediction.py, models/gpt/gpt_model.py _postprocess). The run
// trains TrainedMtpLayers depths: --mtp-layers, by default the config's count under megatron
// (Megatron-Bridge's providers set mtp_num_layers = num_nextn_predict_layers; Megatron-Core's own
// default is None) and none under hf (transformers drops the weights on load,
// `_keys_to_ignore_on_load_unexpected`, and never runs them; --mtp-layers > 0 is refused there).
// Without a custom pipeline layout every depth runs on the last stage after its decoder layers
// (mtp_on_this_rank), so each depth is one more plannable layer at the end of the last virtual
// stage (VirtualStageLayers), "mtp.K" in the table and the plan (stowage/plan.h Note [MTP
// layers]). What depth K's MultiTokenPredictionLayer keeps for backward, per token (SP: /tp):
//  - its two inputs, the hidden states of the depth before (the decoder's final-norm output for
//    K = 0) and the embedding of the tokens shifted by K + 1 (_get_embeddings: roll_tensor, then
//    the shared embedding): hnorm and enorm (TENorm, Note [megatron profile]) save them as their
//    inputs, and MultiTokenPredictionLayer._checkpointed_forward (recompute_granularity full,
//    tensor_parallel.checkpoint of _proj_and_transformer_layer) keeps exactly these two; with
//    them the shifted token ids (int64, 8 B, whole sequence: the embedding's backward keeps its
//    indices, VocabParallelEmbedding / F.embedding), outside the checkpoint: the layer's
//    "input", 2 h dt + 8, what recompute keeps and offload_input moves;
//  - enorm's and hnorm's fp32 rstdevs (8 B);
//  - torch.cat((enorm(e), hnorm(h)), -1), eh_proj's saved input (TEColumnParallelLinear keeps the
//    local sequence shard): 2 h dt; the norms' outputs are not kept apart from it (cat saves none);
//  - the transformer layer of the model's last layer kind, exactly as a decoder layer of that kind
//    (BuildLayer: its input is eh_proj's output, gathered and scattered back to the SP shard);
//  - final_layernorm (TENorm) saves its input, the layer's output, and its rstdev: h dt + 4.
// The depth's output (final_layernorm's, h dt) goes to the shared output layer and a second
// cross-entropy (gpt_model.py _postprocess; mtp_loss_scaling_factor scales the loss, not what it
// keeps): those run with the main head in the tail (BuildStepCost): the head's working set of
// one loss chunk is reused by each head in turn, and each depth's output and its gradient (2 h dt)
// are held there; with an unchunked loss (--loss-chunk-tokens 0) every head's logits are saved
// at once. The time: eh_proj's GEMM (2 x 2h x h FLOPs per token), the element-wise passes over the
// bytes above, the layer's own time, and one more head and loss in the tail. The decoder's output
// is also the main head's input, held by the tail whatever the MTP layer's policy; the MTP layer's
// "input" counts it again (h dt per token, an upper bound). Weights, gradients and optimizer state
// are fixed memory of the last stage (StageNonLayerParams); --mtp-layers 0 holds none of them.
// Under FSDP (optim_grads_params) the depth's transformer layer is a Megatron-FSDP unit
// (mcore_fsdp_adapter.py fsdp_unit_modules: TransformerLayer, MoETransformerLayer), gathered by
// the MTP layer; enorm, hnorm, eh_proj and final_layernorm are the root's, gathered with the
// embedding and head (BuildStepComm).

// Note [megatron linear attention]
// What KDA and gated DeltaNet layers keep for backward, per token, counted from the code (no
// CPU can run these kernels: fla's are Triton, Megatron-Core's GatedDeltaNet needs CUDA and
// fla to build), fla = flash-linear-attention v0.5.2 (fla/...), Megatron-Core 0.16.1
// (megatron/core/ssm/gated_delta_net.py, the version tests/python/test_megatron_profile.py
// pins). H heads of d (KDA), hk/hv key/value heads of dk/dv (GDN), C = 64 fla's chunk_size.
//  fla's chunk functions keep, beside their inputs, the chunk matrices they solved in the
//    forward and recompute the rest (w, u, the chunk states, v_new) in backward:
//    ChunkGatedDeltaRuleFunction.forward (ops/gated_delta_rule/chunk.py) saves q, k, v, the
//    chunk-local cumsum of g (fp32: utils/cumsum.py output_dtype=torch.float), beta and A, the
//    solved (I + A)^-1 of every chunk, [B, T, HV, C] in k's dtype
//    (gated_delta_rule/chunk_fwd.py chunk_gated_delta_rule_fwd_intra). ChunkKDAFunction.forward
//    (ops/kda/chunk.py) saves the l2-normalised q and k (use_qk_l2norm_in_kernel: l2norm_fwd's
//    output and one fp32 rstd per head, modules/l2norm.py), v, the raw gate (with
//    use_gate_in_kernel chunk_kda_fwd drops the cumsum), beta's logits and their fp32 sigmoid
//    (ops/common/gate.py fused_beta_sigmoid_fwd), and two chunk matrices, Aqk and Akk,
//    [B, T, HV, C] in k's dtype each (kda/chunk_intra.py chunk_kda_fwd_intra; fla 0.4.0 kept
//    them fp32). w, u, qg, kg, v_new and h are None unless disable_recompute; safe_gate with
//    a lower_bound (GLM-5.3-Flash's gate_lower_bound) changes the kernels, not what is saved.
//  KDA layer (layers/kda.py KimiDeltaAttention, fla's reference layer, which Kimi Linear's
//    modeling code follows): q/k/v projections, each through a ShortConvolution whose
//    CausalConv1dFunction (modules/conv/triton/ops.py) saves its input x, not its output (the
//    backward recomputes it): 3 H d; the core keeps v (the v conv's output) and l2-normalised
//    copies of q and k, so the q and k conv outputs are kept by nothing. f_proj and g_proj are
//    low-rank (hidden -> d
//    -> H d): each second linear keeps its d-wide input; f_proj's output is the core's raw
//    gate (H d), b_proj's the beta logits (H). The output norm (modules/fused_norm_gate.py
//    LayerNormGatedFunction, sigmoid gate) keeps its input (the core's output), the gate
//    (g_proj's output, H d) and one fp32 rstd per head; o_proj keeps the norm's output.
//  GDN layer (Megatron-Core 0.16.1 GatedDeltaNet.forward): in_proj's output is kept by nothing
//    (every part is copied before use): `qkv.transpose(1, 2).contiguous()` is the conv's input,
//    which causal_conv1d_fn (CausalConv1dFn) saves; q and k are copied out of the conv's output
//    for fla's l2norm (L2NormFunction saves its output and the fp32 rstd per head), repeated to
//    hv heads by repeat_interleave when hv > hk (the core keeps the repeats), v is copied for
//    the core (value.contiguous()). g = -A_log.exp() * softplus(alpha.float() + dt_bias):
//    softplus keeps its fp32 input, the mul its fp32 output; beta.sigmoid() keeps its bf16
//    output (the core's beta). The gated norm (_apply_gated_norm): TENorm keeps the core's
//    output and one fp32 rstdev per head; `y * act_fn(gate.float())` runs under jit_fuser
//    (torch.compile; TENorm's C++ kernel call breaks the graph before it), whose min-cut
//    partitioner keeps the two bf16 inputs, y and the gate (gate.contiguous()), and recomputes
//    the fp32 silu (eager would keep fp32 gate and silu instead: 8 bytes per element, not 4);
//    out_proj keeps the norm's output transposed to [s, b, value].
//  Recompute modules: neither layer has one. The convs save only their inputs, and what they
//    output is kept by the core (v) or by nothing (q, k: the core keeps their l2-normalised
//    copies), so rerunning a conv frees nothing; the core output is the gated norm's saved input
//    (LayerKinds.LinearAttentionCoreOutputIsKeptByItsConsumer). Megatron-Core has no selective
//    recompute of either layer at 0.16.1 (Megatron-LM main adds gdn_norm_out, a
//    CheckpointWithoutOutput over the gated norm, not modelled here).

// Note [Limits]
// Byte counts are products of shapes, dtypes and tokens computed in double (exact up to 2^53,
// and what the formulas need for fractional terms such as moe_imbalance), then converted once
// to uint64 by Builder::Bytes, which refuses anything negative, not finite or above
// kMaxTensorBytes instead of converting it (a double beyond uint64's range converts to
// whatever the hardware gives: `--seq-len 9007199254740992` once planned "keep ... 0 B").
// Sums of converted counts use base/checked_math.h. CheckStepCostBounds then bounds the
// whole step by kMaxStepBytes, which is what lets the simulator and optimizer add any subset of
// a step's bytes in uint64/int64 without checks of their own. The up-front limits on the run and
// the model (ValidateRun) make a refusal here rare; when it happens the error names the tensor,
// its size and the inputs it grows with.

constexpr int kMaxMtpLayers = kPlanMaxMtpLayers;
constexpr double kChunkOverheadSeconds = 100e-6;  // two all-to-all launches + kernel tails
constexpr uint64_t kIndexerQueryBlock = 1024;     // DSA indexer scores this many queries at once
constexpr int kKdaChunk = 64;                     // delta-rule chunk length

struct Builder {
  const ModelConfig& m;
  const HardwareProfile& hw;
  const RunSettings& run;
  double tokens;  // per rank
  LayerCost cost;
  double matmul_flops = 0;     // forward, dense GEMMs (and GEMM-like cores)
  double core_flops = 0;       // forward, all attention cores (LayerCost::forward_flops)
  double attention_flops = 0;  // forward, the softmax-attention part of core_flops
  double grouped_flops = 0;    // forward, routed-expert GEMMs
  double tokens_per_expert = 0;
  absl::Status status;  // the first count that broke a limit (Note [Limits])

  // `bytes` as a byte count, or 0 and an error (kept in `status`) naming `what`.
  uint64_t Bytes(double bytes, const std::string& what) {
    if (bytes >= 0 && bytes <= static_cast<double>(kMaxTensorBytes)) {
      return static_cast<uint64_t>(std::llround(bytes));
    }
    if (status.ok()) {
      const std::string where = cost.index >= 0 ? absl::StrCat(" of layer ", cost.index) : "";
      status = absl::InvalidArgumentError(absl::StrFormat(
          "%s%s would be %g bytes, beyond the limit of %d bytes (2^56) per tensor: it grows "
          "with --seq-len %d x --micro-batch %d / --cp %d = %.0f tokens per rank and the "
          "model's widths (hidden %d); see README \"Limits\"",
          what, where, bytes, kMaxTensorBytes, run.seq_len, run.micro_batch, run.cp, tokens,
          m.hidden));
    }
    return 0;
  }
  uint64_t Sum(uint64_t a, uint64_t c, const std::string& what) {
    return Bytes(static_cast<double>(a) + static_cast<double>(c), what);
  }
  void Save(const std::string& name, const std::string& module, double bytes_per_token) {
    cost.saved.push_back({name, module, Bytes(bytes_per_token * tokens, "tensor '" + name + "'")});
  }
  double Gemm(double flops) const { return OpSeconds({.gemm_flops = flops}, hw); }
  double Core(double flops) const { return OpSeconds({.attention_forward_flops = flops}, hw); }
  double Elementwise(double bytes) const { return OpSeconds({.elementwise_bytes = bytes}, hw); }
};

void AddModule(Builder& b, const std::string& name, double seconds, bool in_ffn) {
  uint64_t bytes = 0;
  for (const SavedTensor& t : b.cost.saved) {
    if (t.module == name) bytes = b.Sum(bytes, t.bytes, "the saved tensors of module " + name);
  }
  b.cost.modules.push_back({name, bytes, seconds, in_ffn});
}

void Attention(Builder& b, const LayerSpec& spec) {
  const ModelConfig& m = b.m;
  const double tp = b.run.tp;
  const double dt = b.run.activation_bytes;
  const double t = b.tokens;
  const double kv_len = 0.5 * static_cast<double>(b.run.seq_len);  // causal average
  switch (spec.attention) {
    case AttentionKind::kAttention: {
      const double hq = m.heads / tp, hkv = std::max(1.0, m.kv_heads / tp), d = m.head_dim;
      // Megatron-Core attention.py SelfAttention + TE DotProductAttention (flash): q, k, v
      // and the output with its fp32 softmax statistics are saved whatever keys a query
      // sees: sliding windows, chunks, sinks (an extra logit per head folded into the
      // statistics) and logit soft-capping (flash_attn's softcap, applied in the kernel)
      // change the work, not the saved tensors.
      b.Save("attn.qkv", "", (hq + 2 * hkv) * d * dt);
      // Llama 4's NoPE layers (its full-span ones, hf_config.cc PlaceSpans) have no q/k norm:
      // Megatron-Bridge's get_llama4_layer_spec sets L2Norm only `if config.qk_l2_norm and not
      // is_nope_layer`, as transformers' Llama4TextAttention does (`use_qk_norm and use_rope`).
      const bool nope = m.family == "llama4_text" && spec.span == AttentionSpan::kFull;
      if (m.qk_norm != QkNorm::kNone && !nope) {
        // Note [megatron profile]: TENorm's contiguous copies of q and k, one fp32 rstdev per head.
        b.Save("attn.qk_norm_in", "", (hq + hkv) * (d * dt + 4));
      }
      b.Save("attn.core_out", "", hq * d * dt + hq * 4);  // + softmax_lse; no attn_core module
      if (m.attention_output_gate) {
        // modeling_qwen3_next.py Qwen3NextAttention: out = core * sigmoid(gate); the gate
        // half of q_proj's output is kept for backward.
        b.Save("attn.out_gate", "", hq * d * dt);
      }
      double keys = kv_len;
      if (spec.span == AttentionSpan::kSliding) {
        // Each query sees min(position, window) earlier keys.
        const double w = std::min<double>(m.sliding_window, static_cast<double>(b.run.seq_len));
        keys = w - w * w / (2.0 * static_cast<double>(b.run.seq_len));
      } else if (spec.span == AttentionSpan::kChunked) {
        // modeling_llama4.py: a RoPE layer attends causally within its attention_chunk_size
        // chunk, so a query sees half a chunk on average.
        keys = 0.5 * std::min<double>(m.attention_chunk, static_cast<double>(b.run.seq_len));
      }
      const double core = 4 * hq * d * keys * t;
      b.core_flops += core;
      b.attention_flops += core;
      b.cost.attn_forward_transient = b.Bytes(hq * d * dt * t, "the attention forward working set");
      b.cost.attn_backward_transient = b.Bytes((hq + 2 * hkv) * d * dt * t + hq * d * 4 * t,
                                               "the attention backward working set");
      break;
    }
    case AttentionKind::kMla:
    case AttentionKind::kDsa: {
      const double h = m.heads / tp, ql = m.q_lora_rank, kvl = m.kv_lora_rank;
      const double dqk = m.qk_nope_head_dim + m.qk_rope_head_dim, dv = m.v_head_dim;
      // The latent norms are fused into linear_q_up_proj / linear_kv_up_proj
      // (TELayerNormColumnParallelLinear, models/gpt/gpt_layer_specs.py): input, ln_out and one
      // fp32 rsigma each (Note [megatron profile]).
      b.Save("attn.q_latent", "", ql > 0 ? 2 * ql * dt + 4 : 0);
      b.Save("attn.kv_latent", "", (2 * kvl + m.qk_rope_head_dim) * dt + 4);
      b.Save("attn.qkv", "mla_up_proj", (2 * h * dqk + h * dv) * dt);
      // multi_latent_attention.py makes q, k, v contiguous before the core, so a core_attn
      // checkpoint keeps what the flash kernel keeps; rerunning the core frees only its
      // softmax_lse: the output stays saved by linear_proj.
      b.Save("attn.core_out", "", h * dv * dt);
      b.Save("attn.softmax_lse", "attn_core", h * 4);
      const double up_flops = 2 * (ql * h * dqk + kvl * h * (m.qk_nope_head_dim + dv)) * t;
      double keys = kv_len;
      if (spec.attention == AttentionKind::kDsa) {
        keys = std::min(kv_len, static_cast<double>(m.index_topk));
        b.Save("attn.index_qk", "",
               (m.index_heads * m.index_head_dim + m.index_head_dim) * dt + m.index_heads * 4.0);
        b.Save("attn.topk_indices", "", m.index_topk * 4.0);
        // Scores of one query block against every key (fp32), the top-k taken block by block.
        b.cost.attn_forward_transient =
            b.Bytes(std::min(static_cast<double>(kIndexerQueryBlock), t) *
                        static_cast<double>(b.run.seq_len) * 4,
                    "the indexer's score block");
        // The indexer runs in fp8: half the bf16 cost.
        b.core_flops += 0.5 * 2 * m.index_heads * m.index_head_dim * kv_len * t;
      }
      const double core = 2 * h * (dqk + dv) * keys * t;
      b.core_flops += core;
      b.attention_flops += core;
      AddModule(b, "mla_up_proj", b.Gemm(up_flops), false);
      AddModule(b, "attn_core", b.Core(core), false);
      b.cost.attn_forward_transient +=
          b.Bytes(h * dv * dt * t, "the attention forward working set");
      b.cost.attn_backward_transient =
          b.Bytes((2 * h * dqk + 2 * h * dv) * dt * t + h * dqk * 4 * t,
                  "the attention backward working set");
      break;
    }
    case AttentionKind::kKda: {
      // Note [megatron linear attention]: fla's KimiDeltaAttention layer and chunk_kda.
      const double heads = m.linear_heads / tp, d = m.linear_head_dim, inner = heads * d;
      b.Save("attn.qkv", "", 3 * inner * dt);
      b.Save("attn.qk_l2norm", "", 2 * inner * dt + 2 * heads * 4);
      b.Save("attn.v", "", inner * dt);
      b.Save("attn.gates", "", (inner + heads + 2 * d) * dt + heads * 4);
      b.Save("attn.chunk_a", "", 2 * heads * kKdaChunk * dt);
      b.Save("attn.core_out", "", inner * dt + heads * 4);
      b.Save("attn.out_gate", "", 2 * inner * dt);
      const double core = 2 * heads * (4 * d * d + 2 * kKdaChunk * d) * t;
      b.core_flops += core;
      // Forward: the chunk states h (heads x d x d per chunk, bf16) beside w, u, kg and v_new
      // (chunk_kda_fwd), dropped when it returns; backward rebuilds them (chunk_kda_bwd).
      const uint64_t states = b.Bytes(heads * d * d * dt * t / kKdaChunk, "the KDA chunk states");
      b.cost.attn_forward_transient =
          states + b.Bytes(4 * inner * dt * t, "the KDA forward working set");
      b.cost.attn_backward_transient =
          states + b.Bytes(4 * inner * dt * t, "the attention backward working set");
      break;
    }
    case AttentionKind::kGdn: {
      // Note [megatron linear attention]: Megatron-Core's GatedDeltaNet and fla's
      // chunk_gated_delta_rule.
      const double hk = m.gdn_key_heads / tp, hv = m.gdn_value_heads / tp;
      const double dk = m.gdn_key_head_dim, dv = m.gdn_value_head_dim;
      const double key = hk * dk, value = hv * dv;
      b.Save("attn.conv_in", "", (2 * key + value) * dt);
      b.Save("attn.qk_l2norm", "", 2 * key * dt + 2 * hk * 4);
      if (hv > hk) b.Save("attn.qk_repeated", "", 2 * hv * dk * dt);
      b.Save("attn.v", "", value * dt);
      b.Save("attn.gates", "", hv * (4 + 4 + dt));
      b.Save("attn.chunk_a", "", hv * kKdaChunk * dt + hv * 4);
      b.Save("attn.core_out", "", value * dt + hv * 4);
      b.Save("attn.out_gate", "", 2 * value * dt);
      b.Save("attn.norm_out", "", value * dt);
      const double core = 2 * hv * (4 * dk * dv + kKdaChunk * (dk + dv)) * t;
      b.core_flops += core;
      // Forward: the chunk states h beside w, u and v_new (chunk_gated_delta_rule_fwd), dropped
      // when it returns; backward rebuilds them (chunk_gated_delta_rule_bwd).
      const uint64_t states =
          b.Bytes(hv * dk * dv * dt * t / kKdaChunk, "the delta-rule chunk states");
      b.cost.attn_forward_transient =
          states + b.Bytes(hv * (dk + 2 * dv) * dt * t, "the delta-rule forward working set");
      b.cost.attn_backward_transient =
          states + b.Bytes(4 * value * dt * t, "the attention backward working set");
      break;
    }
  }
}

void Ffn(Builder& b, const LayerSpec& spec) {
  const ModelConfig& m = b.m;
  const double tp = b.run.tp;
  const double dt = b.run.activation_bytes;
  const double t = b.tokens;
  const double h = m.hidden;
  const size_t first = b.cost.saved.size();
  if (spec.ffn == FfnKind::kDense) {
    const double f = m.intermediate / tp;
    b.Save("ffn.gate_up", "", 2 * f * dt);
    b.Save("ffn.act", "ffn_act", f * dt);
    AddModule(b, "ffn_act", b.Elementwise(3 * f * dt * t), true);
    b.cost.ffn_forward_transient = b.Bytes(2 * f * dt * t, "the FFN forward working set");
    b.cost.ffn_backward_transient = b.Bytes(3 * f * dt * t, "the FFN backward working set");
  } else {
    const double routed = m.experts_per_token * b.run.moe_imbalance / tp;  // per token
    const double fe = m.moe_intermediate, fs = m.shared_intermediate / tp;
    // Note [megatron profile]: the router and the permute run on this rank's own tokens
    // (sequence-parallel shard), the experts on the tokens dispatched to it.
    const double k = m.experts_per_token;
    b.Save("moe.router", "", k * (8 + 4) / tp);
    b.Save("moe.permute_map", "", (m.experts * (1 + dt) + 8 * k) / tp);
    b.Save("moe.dispatched", "", routed * h * dt);
    b.Save("moe.gate_up", "", (routed * 2 * fe + 2 * fs) * dt);
    b.Save("moe.probs", "", routed * dt);
    b.Save("moe.act", "moe_act", (routed * fe + fs) * dt);
    AddModule(b, "moe_act", b.Elementwise(3 * (routed * fe + fs) * dt * t), true);
    // TE GroupedLinear over this rank's experts/ep experts, which share the routed tokens.
    b.grouped_flops += 2 * 3 * h * fe * routed * t;
    b.tokens_per_expert = routed * t * b.run.ep / m.experts;
    // All-to-all send and receive buffers for dispatch and combine, plus expert intermediates.
    b.cost.ffn_forward_transient = b.Bytes((3 * routed * h + routed * 2 * fe + 2 * fs) * dt * t,
                                           "the MoE forward working set");
    b.cost.ffn_backward_transient = b.Bytes((4 * routed * h + routed * 3 * fe + 3 * fs) * dt * t,
                                            "the MoE backward working set");
  }
  for (size_t i = first; i < b.cost.saved.size(); ++i) {
    b.cost.ffn_saved_bytes =
        b.Sum(b.cost.ffn_saved_bytes, b.cost.saved[i].bytes, "the FFN's saved tensors");
  }
}

absl::StatusOr<LayerCost> BuildLayer(const ModelConfig& m, const HardwareProfile& hw,
                                     const RunSettings& run, int index, double tokens) {
  const LayerSpec& spec = m.layers[index];
  Builder b{m, hw, run, tokens, {}, 0, 0, 0, 0, 0, absl::OkStatus()};
  b.cost.index = index;
  b.cost.type = spec.TypeName();
  const double tp = run.tp, dt = run.activation_bytes, h = m.hidden, n = m.hc_mult;
  b.Save("input", "", n * h * dt / tp);
  if (m.hc_mult > 1) b.Save("attn.hc_in", "", h * dt / tp);
  b.Save("attn.norm", "", (h * dt + 4) / tp);  // ln_out + rsigma (Note [megatron profile])
  Attention(b, spec);
  b.Save("mid", "", n * h * dt / tp);
  if (m.hc_mult > 1) b.Save("ffn.hc_in", "", h * dt / tp);
  b.Save("ffn.norm", "", (h * dt + 4) / tp);
  Ffn(b, spec);
  b.matmul_flops += 2.0 * static_cast<double>(DenseLayerParams(m, spec)) / tp * tokens;
  b.cost.input_bytes = b.cost.saved.front().bytes;
  b.cost.output_bytes = b.cost.input_bytes;  // a residual layer: output as wide as its input
  for (const SavedTensor& s : b.cost.saved) {
    b.cost.saved_bytes = b.Sum(b.cost.saved_bytes, s.bytes, "the saved tensors");
  }
  const double elementwise = 3.0 * static_cast<double>(b.cost.saved_bytes);
  const double other_cores = b.core_flops - b.attention_flops;  // GEMM-like (linear attention)
  b.cost.forward_flops = b.matmul_flops + b.grouped_flops + b.core_flops;
  b.cost.forward_time = OpTimeOf({.gemm_flops = b.matmul_flops + other_cores,
                                  .attention_forward_flops = b.attention_flops,
                                  .grouped_gemm_flops = b.grouped_flops,
                                  .tokens_per_expert = b.tokens_per_expert,
                                  .elementwise_bytes = elementwise},
                                 hw);
  b.cost.forward_seconds = b.cost.forward_time.total();
  b.cost.backward_time = OpTimeOf({.gemm_flops = 2 * b.matmul_flops + 2.5 * other_cores,
                                   .attention_backward_flops = 2.5 * b.attention_flops,
                                   .grouped_gemm_flops = 2 * b.grouped_flops,
                                   .tokens_per_expert = b.tokens_per_expert,
                                   .elementwise_bytes = 2 * elementwise},
                                  hw);
  b.cost.backward_seconds = b.cost.backward_time.total();
  // The softmax/MLA attention core alone: what each CP ring step hides behind
  // (Note [Communication] in communication.cc).
  b.cost.attention_core_forward_seconds =
      OpSeconds({.attention_forward_flops = b.attention_flops}, hw);
  b.cost.attention_core_backward_seconds =
      OpSeconds({.attention_backward_flops = 2.5 * b.attention_flops}, hw);
  b.cost.chunk_overhead_seconds = kChunkOverheadSeconds;
  if (!b.status.ok()) return b.status;
  return b.cost;
}

// MTP depth `depth` (Note [MTP layers]): the transformer layer of the model's last kind inside the
// module's own norms, eh_proj and final norm.
absl::StatusOr<LayerCost> BuildMtpLayer(const ModelConfig& m, const HardwareProfile& hw,
                                        const RunSettings& run, int depth, double tokens) {
  absl::StatusOr<LayerCost> inner = BuildLayer(m, hw, run, m.num_layers() - 1, tokens);
  if (!inner.ok()) return inner.status();
  Builder b{m, hw, run, tokens, *std::move(inner), 0, 0, 0, 0, 0, absl::OkStatus()};
  b.cost.index = m.num_layers() + depth;
  b.cost.name = MtpLayerName(depth);
  b.cost.type = absl::StrCat("mtp+", b.cost.type);
  const double tp = run.tp, dt = run.activation_bytes, h = m.hidden;
  std::vector<SavedTensor> layer = std::move(b.cost.saved);
  b.cost.saved.clear();
  // The hidden states, the shifted tokens' embedding and their ids.
  b.Save("input", "", 2 * h * dt / tp + 8);
  b.Save("mtp.norms", "", 2 * 4.0 / tp);
  b.Save("mtp.eh_proj_in", "", 2 * h * dt / tp);
  const size_t own_front = b.cost.saved.size();
  for (SavedTensor& t : layer) {
    if (t.name == "input") t.name = "mtp.layer_input";
    b.cost.saved.push_back(std::move(t));
  }
  b.Save("mtp.final_norm", "", (h * dt + 4) / tp);
  uint64_t own = 0;  // the module's bytes around its transformer layer
  for (size_t i = 0; i < b.cost.saved.size(); ++i) {
    if (i < own_front || i + 1 == b.cost.saved.size()) {
      own = b.Sum(own, b.cost.saved[i].bytes, "the MTP module's saved tensors");
    }
  }
  b.cost.saved_bytes = 0;
  for (const SavedTensor& t : b.cost.saved) {
    b.cost.saved_bytes = b.Sum(b.cost.saved_bytes, t.bytes, "the saved tensors");
  }
  b.cost.input_bytes = b.cost.saved.front().bytes;
  b.cost.output_bytes = b.Bytes(h * dt / tp * tokens, "the MTP layer's output");
  const double eh_proj = 2 * (2 * h * h) / tp * tokens;
  b.cost.forward_flops += eh_proj;
  b.cost.forward_time +=
      OpTimeOf({.gemm_flops = eh_proj, .elementwise_bytes = 3.0 * static_cast<double>(own)}, hw);
  b.cost.backward_time += OpTimeOf(
      {.gemm_flops = 2 * eh_proj, .elementwise_bytes = 6.0 * static_cast<double>(own)}, hw);
  b.cost.forward_seconds = b.cost.forward_time.total();
  b.cost.backward_seconds = b.cost.backward_time.total();
  if (!b.status.ok()) return b.status;
  return b.cost;
}

// Largest bytes any option of the layer holds at once (EvaluateOption's terms, all together):
// what CheckStepCostBounds adds up.
absl::StatusOr<uint64_t> LayerCeiling(const LayerCost& l) {
  uint64_t total = 0;
  for (uint64_t part : {l.saved_bytes, l.attn_forward_transient, l.ffn_forward_transient,
                        l.attn_backward_transient, l.ffn_backward_transient,
                        l.ffn_inputs_backward_bytes, l.input_bytes, l.output_bytes, l.grad_bytes,
                        // Note [Recompute moment]: the rerun's output gradient beside its forward.
                        l.output_bytes, l.checkpoint_held_bytes, l.unkept_forward_bytes}) {
    // The message is built only on overflow: this runs for every layer of every plan.
    auto sum = CheckedAdd(total, part);
    if (!sum) {
      return absl::OutOfRangeError(
          absl::StrCat("the bytes of layer ", l.index, " overflow (", total, " + ", part, ")"));
    }
    total = *sum;
  }
  return total;
}

double Rate(const HardwareProfile& hw, uint64_t chunk, bool d2h) {
  double rate = d2h ? hw.d2h_bytes_per_second : hw.h2d_bytes_per_second;
  // The table's entry for the largest chunk size not above `chunk` caps the rate.
  for (const ChunkBandwidth& c : hw.chunk_bandwidth) {
    if (c.chunk_bytes <= chunk) {
      rate = std::min(d2h ? hw.d2h_bytes_per_second : hw.h2d_bytes_per_second,
                      d2h ? c.d2h_bytes_per_second : c.h2d_bytes_per_second);
    }
  }
  return rate;
}

// The model's sizes within the limits of cost_model.h, so that parameter counts
// (DenseLayerParams: products of up to three widths) and per-token bytes stay exact.
absl::Status CheckModelLimits(const ModelConfig& m) {
  if (m.num_layers() < 1 || m.num_layers() > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat("model '", m.name, "' has ", m.layers.size(),
                                                   " layers; allowed: 1 to ", kMaxLayers,
                                                   " (README \"Limits\")"));
  }
  struct Field {
    const char* name;
    int value;
    int max;
  };
  for (const Field& f : {Field{"hidden_size", m.hidden, kMaxModelDim},
                         {"vocab_size", m.vocab, kMaxVocab},
                         {"hc_mult", m.hc_mult, 64},
                         {"num_attention_heads", m.heads, kMaxHeads},
                         {"num_key_value_heads", m.kv_heads, kMaxHeads},
                         {"head_dim", m.head_dim, kMaxModelDim},
                         {"q_lora_rank", m.q_lora_rank, kMaxModelDim},
                         {"kv_lora_rank", m.kv_lora_rank, kMaxModelDim},
                         {"qk_nope_head_dim", m.qk_nope_head_dim, kMaxModelDim},
                         {"qk_rope_head_dim", m.qk_rope_head_dim, kMaxModelDim},
                         {"v_head_dim", m.v_head_dim, kMaxModelDim},
                         {"index_n_heads", m.index_heads, kMaxHeads},
                         {"index_head_dim", m.index_head_dim, kMaxModelDim},
                         {"index_topk", m.index_topk, 1 << 30},
                         {"linear_num_heads", m.linear_heads, kMaxHeads},
                         {"linear_head_dim", m.linear_head_dim, kMaxModelDim},
                         {"short_conv_kernel_size", m.short_conv_kernel, 1 << 10},
                         {"intermediate_size", m.intermediate, kMaxModelDim},
                         {"n_routed_experts", m.experts, kMaxHeads},
                         {"num_experts_per_tok", m.experts_per_token, kMaxHeads},
                         {"shared expert intermediate size", m.shared_intermediate, kMaxModelDim},
                         {"linear_num_key_heads", m.gdn_key_heads, kMaxHeads},
                         {"linear_num_value_heads", m.gdn_value_heads, kMaxHeads},
                         {"linear_key_head_dim", m.gdn_key_head_dim, kMaxModelDim},
                         {"linear_value_head_dim", m.gdn_value_head_dim, kMaxModelDim},
                         {"sliding_window", m.sliding_window, 1 << 30},
                         {"attention_chunk_size", m.attention_chunk, 1 << 30},
                         {"extra embedding rows", m.extra_embedding_rows, kMaxVocab},
                         {"vision tokens", m.vision_tokens, 1 << 30},
                         {"norms per layer", m.norms_per_layer, 64},
                         {"num_nextn_predict_layers", m.mtp_layers, kMaxMtpLayers},
                         {"moe_intermediate_size", m.moe_intermediate, kMaxModelDim}}) {
    if (f.value < 0 || f.value > f.max) {
      return absl::InvalidArgumentError(absl::StrCat("model '", m.name, "': field '", f.name,
                                                     "' is ", f.value, "; allowed: 0 to ", f.max,
                                                     " (README \"Limits\")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckStepCostBounds(const StepCost& step) {
  if (step.layers.empty() || step.layers.size() > static_cast<size_t>(kMaxLayers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the step has ", step.layers.size(), " layers; allowed: 1 to ", kMaxLayers));
  }
  uint64_t total = 0;
  auto add = [&](uint64_t bytes, const std::string& what) -> absl::Status {
    if (bytes > kMaxTensorBytes) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is ", bytes,
                                                     " bytes; allowed: at most ", kMaxTensorBytes,
                                                     " (2^56, README \"Limits\")"));
    }
    auto sum = AddOrError(total, bytes, "the step's bytes");
    if (!sum.ok()) return sum.status();
    total = *sum;
    return absl::OkStatus();
  };
  for (auto [what, bytes] : {std::pair<const char*, uint64_t>{"fixed weights", step.fixed.weights},
                             {"fixed gradients", step.fixed.gradients},
                             {"fixed optimizer state", step.fixed.optimizer},
                             {"communication buffers", step.fixed.comm_buffers},
                             {"the LM head and loss working set", step.tail_bytes},
                             {"the LM head's gradients", step.tail_grad_bytes},
                             {"the embedding's gradients", step.embedding_grad_bytes}}) {
    if (absl::Status s = add(bytes, what); !s.ok()) return s;
  }
  if (step.held_logits_bytes > step.tail_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the held logits are ", step.held_logits_bytes,
                     " bytes; allowed: at most the LM head and loss working set (", step.tail_bytes,
                     "), of which they are part"));
  }
  auto finite = [](double x) { return x >= 0 && x < 1e300; };  // NaN fails both
  for (const LayerCost& l : step.layers) {
    // Names the layer in an error; built only then (this loop runs for every layer of every plan).
    auto what = [&] { return absl::StrCat("layer ", l.index); };
    for (uint64_t part :
         {l.input_bytes, l.output_bytes, l.saved_bytes, l.attn_forward_transient,
          l.ffn_forward_transient, l.attn_backward_transient, l.ffn_backward_transient,
          l.ffn_inputs_backward_bytes, l.grad_bytes, l.unkept_forward_bytes}) {
      if (part > kMaxTensorBytes) return add(part, absl::StrCat("a byte count of ", what()));
    }
    // Note [Gradient timing]: the gradients made by a peak are some of the layer's.
    if (l.ffn_peak_grad_bytes > l.grad_bytes || l.attn_peak_grad_bytes > l.grad_bytes ||
        l.ffn_inputs_grad_bytes > l.grad_bytes ||
        (!step.gradients_in_backward && l.grad_bytes > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what(), " makes ", l.grad_bytes, " gradient bytes in its backward, ",
          l.ffn_peak_grad_bytes, " by its FFN peak and ", l.attn_peak_grad_bytes,
          " by its attention peak; allowed: at most the layer's, and none unless gradients are "
          "created during backward"));
    }
    // The sums EvaluateOption subtracts from must be what they claim: a wrapped sum (tensors
    // of [2^64-1, 1] "adding up" to 0) would turn into a huge difference there.
    if (l.saved.size() > 64 || l.modules.size() > 16) {
      return absl::InvalidArgumentError(absl::StrCat(what(), " has ", l.saved.size(),
                                                     " saved tensors and ", l.modules.size(),
                                                     " recompute modules; allowed: 64 and 16"));
    }
    uint64_t saved = 0, in_modules = 0;
    for (const SavedTensor& t : l.saved) {
      if (t.bytes > kMaxTensorBytes) return add(t.bytes, absl::StrCat(what(), "'s ", t.name));
      saved += t.bytes;  // at most 64 of at most 2^56 each
    }
    for (const RecomputeModule& mod : l.modules) {
      if (mod.saved_bytes > kMaxTensorBytes)
        return add(mod.saved_bytes, absl::StrCat(what(), "'s ", mod.name));
      in_modules += mod.saved_bytes;
    }
    if (saved != l.saved_bytes || l.ffn_saved_bytes > l.saved_bytes || in_modules > l.saved_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          what(), "'s saved tensors add up to ", saved, " bytes but it claims ", l.saved_bytes,
          " (FFN part ", l.ffn_saved_bytes, ", recompute modules ", in_modules, ")"));
    }
    if (l.in_flight_microbatches < 1 || l.in_flight_microbatches > kMaxInFlightMicrobatches) {
      return absl::InvalidArgumentError(absl::StrCat(what(), " has ", l.in_flight_microbatches,
                                                     " in-flight microbatches; allowed: 1 to ",
                                                     kMaxInFlightMicrobatches));
    }
    auto ceiling = LayerCeiling(l);
    if (!ceiling.ok()) return ceiling.status();
    // Every in-flight microbatch may hold the layer's bytes (Note [In-flight microbatches]).
    auto held = CheckedMul(*ceiling, static_cast<uint64_t>(l.in_flight_microbatches));
    if (!held) {
      return absl::OutOfRangeError(absl::StrCat("the bytes of ", what(), " overflow (", *ceiling,
                                                " x ", l.in_flight_microbatches, ")"));
    }
    if (*held > kMaxTensorBytes || !CheckedAdd(total, *held)) {
      return add(*held, absl::StrCat("the largest option of ", what()));  // the error naming it
    }
    total += *held;
    if (!finite(l.forward_seconds) || !finite(l.backward_seconds) ||
        !finite(l.chunk_overhead_seconds) || !finite(l.forward_comm_seconds) ||
        !finite(l.backward_comm_seconds) || !finite(l.recompute_comm_seconds)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what(), " has a negative or non-finite time (forward ", l.forward_seconds,
                       " s, backward ", l.backward_seconds, " s)"));
    }
    for (const RecomputeModule& mod : l.modules) {
      if (mod.saved_bytes > l.saved_bytes || !finite(mod.seconds)) {
        return absl::InvalidArgumentError(absl::StrCat(what(), "'s module ", mod.name, " has ",
                                                       mod.saved_bytes, " bytes and ", mod.seconds,
                                                       " s"));
      }
    }
  }
  if (total > kMaxStepBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the step's bytes add up to ", total, "; allowed: at most ", kMaxStepBytes,
                     " (2^62, README \"Limits\"): fewer tokens per rank or layers"));
  }
  if (!finite(step.tail_seconds) || !finite(step.embedding_seconds) ||
      !finite(step.comm.step_exposed_seconds) || !(step.d2h_bytes_per_second > 0) ||
      !(step.h2d_bytes_per_second > 0) || !(step.bidir_d2h_bytes_per_second > 0) ||
      !(step.bidir_h2d_bytes_per_second > 0)) {
    return absl::InvalidArgumentError("the step has a negative or non-finite time or link rate");
  }
  return absl::OkStatus();
}

const char* ShardingName(Sharding sharding) {
  switch (sharding) {
    case Sharding::kNoShard:
      return "no_shard";
    case Sharding::kOptim:
      return "optim";
    case Sharding::kOptimGrads:
      return "optim_grads";
    case Sharding::kOptimGradsParams:
      return "optim_grads_params";
  }
  return "unknown";
}

absl::StatusOr<Sharding> ParseSharding(const std::string& name) {
  for (Sharding s :
       {Sharding::kNoShard, Sharding::kOptim, Sharding::kOptimGrads, Sharding::kOptimGradsParams}) {
    if (name == ShardingName(s)) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--sharding is '", name, "'; allowed: no_shard, optim, optim_grads, optim_grads_params"));
}

const char* FrameworkName(Framework framework) {
  return framework == Framework::kHf ? "hf" : "megatron";
}

absl::StatusOr<Framework> ParseFramework(const std::string& name) {
  if (name == "megatron") return Framework::kMegatron;
  if (name == "hf") return Framework::kHf;
  return absl::InvalidArgumentError(
      absl::StrCat("--framework is '", name, "'; allowed: megatron, hf"));
}

const char* OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kNone:
      return "none";
  }
  return "unknown";
}

absl::StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name) {
  for (OptimizerKind k : {OptimizerKind::kAdam, OptimizerKind::kSgd, OptimizerKind::kNone}) {
    if (name == OptimizerKindName(k)) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--optimizer is '", name, "'; allowed: adam, sgd, none"));
}

RunSettings DefaultRunSettings(Framework framework, const ModelConfig& model) {
  RunSettings run;
  run.framework = framework;
  const bool has_moe = std::any_of(model.layers.begin(), model.layers.end(),
                                   [](const LayerSpec& l) { return l.ffn == FfnKind::kMoe; });
  if (!has_moe) run.ep = 1;
  if (framework == Framework::kHf) {
    // ValidateHfRun's rules, as defaults.
    run.cp = run.ep = 1;
    run.loss_chunk_tokens = 0;
  }
  return run;
}

int OptimizerBytesPerParam(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdam:
      return 12;  // fp32 master weights, m, v
    case OptimizerKind::kSgd:
      return 8;  // fp32 master weights, momentum
    case OptimizerKind::kNone:
      return 0;
  }
  return 0;
}

absl::Status ValidateRun(const ModelConfig& m, const RunSettings& r) {
  auto bad = [](const char* flag, auto value, const std::string& rule) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " is ", value, "; ", rule));
  };
  if (r.seq_len == 0 || r.seq_len > kMaxSeqLen) {
    return bad("seq-len", r.seq_len, absl::StrCat("allowed: 1 to ", kMaxSeqLen, " (2^30)"));
  }
  for (auto [flag, value] : {std::pair<const char*, int>{"micro-batch", r.micro_batch},
                             {"tp", r.tp},
                             {"cp", r.cp},
                             {"ep", r.ep},
                             {"gpus", r.gpus}}) {
    if (value < 1 || value > kMaxParallel) {
      return bad(flag, value, absl::StrCat("allowed: 1 to ", kMaxParallel));
    }
  }
  if (r.seq_len * static_cast<uint64_t>(r.micro_batch) > kMaxTokensPerMicroBatch) {
    return bad("micro-batch", r.micro_batch,
               absl::StrCat("--seq-len x --micro-batch may be at most ", kMaxTokensPerMicroBatch,
                            " (2^32) tokens"));
  }
  for (auto [flag, value] : {std::pair<const char*, int>{"activation bytes", r.activation_bytes},
                             {"weight bytes", r.weight_bytes},
                             {"grad-dtype bytes", r.grad_bytes}}) {
    if (value < 1 || value > 64) return bad(flag, value, "allowed: 1 to 64 bytes per element");
  }
  if (absl::Status s = CheckModelLimits(m); !s.ok()) return s;
  // Note [MTP layers].
  if (r.mtp_layers < -1 || r.mtp_layers > kMaxMtpLayers) {
    return bad("mtp-layers", r.mtp_layers,
               absl::StrCat("allowed: 0 to ", kMaxMtpLayers, " (MTP depths trained)"));
  }
  if (r.framework == Framework::kHf && r.mtp_layers > 0) {
    return bad("mtp-layers", r.mtp_layers,
               "--framework hf plans transformers models, which drop the MTP weights on load and "
               "never run them; use --mtp-layers 0 or --framework megatron");
  }
  if (r.seq_len % static_cast<uint64_t>(r.cp) != 0) {
    return bad("seq-len", r.seq_len, absl::StrCat("it must be a multiple of --cp (", r.cp, ")"));
  }
  const int64_t tp_cp = int64_t{r.tp} * r.cp;
  if (r.gpus % tp_cp != 0) {
    return bad("gpus", r.gpus, absl::StrCat("it must be a multiple of --tp x --cp (", tp_cp, ")"));
  }
  if (r.gpus % r.ep != 0) {
    return bad("gpus", r.gpus, absl::StrCat("it must be a multiple of --ep (", r.ep, ")"));
  }
  bool has_moe = false;
  for (const LayerSpec& l : m.layers) has_moe |= l.ffn == FfnKind::kMoe;
  if (has_moe && m.experts % r.ep != 0) {
    return bad("ep", r.ep,
               absl::StrCat("the model's ", m.experts, " experts must divide evenly over it"));
  }
  if (!has_moe && r.ep != 1) return bad("ep", r.ep, "the model has no experts; use 1");
  if (m.heads > 0 && m.heads % r.tp != 0) {
    return bad("tp", r.tp, absl::StrCat("the model's ", m.heads, " heads must divide evenly"));
  }
  // The busiest of ep ranks can hold at most all the routed tokens: ep times the average.
  if (!(r.moe_imbalance >= 1.0 && r.moe_imbalance <= std::max(1, r.ep))) {
    return bad("moe-imbalance", r.moe_imbalance,
               absl::StrCat("it must be between 1 and --ep (", r.ep, ")"));
  }
  return absl::OkStatus();
}

int TrainedMtpLayers(const ModelConfig& m, const RunSettings& run) {
  if (run.mtp_layers >= 0) return run.mtp_layers;
  return run.framework == Framework::kHf ? 0 : m.mtp_layers;
}

bool LastStageHoldsWordEmbeddings(const ModelConfig& m, const RunSettings& run) {
  return run.pp > 1 && (m.tied_embeddings || TrainedMtpLayers(m, run) > 0);
}

NonLayerParams StageNonLayerParams(const ModelConfig& m, const RunSettings& run, int stage) {
  const bool first_stage = stage == 0, last_stage = stage == run.pp - 1;
  const double tp = std::max(1, run.tp), ep = std::max(1, run.ep);
  // Embedding, head and final norm, and the multi-token-prediction modules (model.cc) where the
  // framework trains them: the embedding on the first stage; the final norm, head and MTP on the
  // last. Note [MTP layers]: the depths the run trains (--mtp-layers; none under hf, where
  // transformers drops the MTP weights on load) are fixed memory of the last stage, their
  // activations layers of it.
  const int mtp = TrainedMtpLayers(m, run);
  const double input_embedding =
      (static_cast<double>(m.vocab) + m.extra_embedding_rows) * static_cast<double>(m.hidden);
  const double head_and_norm = static_cast<double>(EmbeddingParams(m)) - input_embedding;
  NonLayerParams out;
  out.dense = ((first_stage ? input_embedding : 0) +
               (last_stage ? head_and_norm + static_cast<double>(MtpDenseParams(m, mtp)) : 0)) /
              tp;
  // The last stage keeps its own copy of the word embeddings for the LM head when they are tied,
  // and for the MTP modules' input when it runs them (Megatron-Core gpt_model.py builds an
  // embedding where pre_process or mtp_process; shared_embedding_or_output_weight; kept equal by
  // an all-reduce with stage 0's, finalize_model_grads.py _allreduce_word_embedding_grads).
  if (LastStageHoldsWordEmbeddings(m, run) && last_stage) {
    out.dense += static_cast<double>(m.vocab) * m.hidden / tp;
  }
  out.experts = last_stage ? static_cast<double>(MtpRoutedExpertParams(m, mtp)) / ep : 0;
  return out;
}

absl::StatusOr<StepCost> BuildStepCost(const ModelConfig& m, const HardwareProfile& hw,
                                       const RunSettings& run, int stage) {
  if (absl::Status s = ValidateModel(m); !s.ok()) return s;
  if (absl::Status s = ValidateHardwareProfile(hw); !s.ok()) return s;
  if (absl::Status s = ValidateRun(m, run); !s.ok()) return s;
  // Note [Pipeline] (pipeline.cc): this stage's layers, embedding on the first, head on the last.
  if (absl::Status s = ValidatePipeline(m, run); !s.ok()) return s;
  if (stage < 0 || stage >= run.pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", stage, " is not a stage of --pp ", run.pp));
  }
  absl::StatusOr<std::vector<LayerRange>> split = VirtualStageLayers(m, run);
  if (!split.ok()) return split.status();
  const bool first_stage = stage == 0, last_stage = stage == run.pp - 1;
  StepCost c;
  c.stage = stage;
  c.chunks = StageChunks(*split, run.pp, run.vpp, stage);
  c.model = m.name;
  c.model_parameters = ModelParameters(m);
  c.run = run;
  c.mtp_layers = TrainedMtpLayers(m, run);
  c.model_mtp_layers = m.mtp_layers;
  c.hardware = hw;
  c.tokens_per_rank =
      run.seq_len * static_cast<uint64_t>(run.micro_batch) / static_cast<uint64_t>(run.cp);
  const double tokens = static_cast<double>(c.tokens_per_rank);
  const bool hf = run.framework == Framework::kHf;
  if (hf) {
    if (absl::Status s = ValidateHfRun(m, run); !s.ok()) return s;
  }
  for (size_t k = 0; k < c.chunks.size(); ++k) {
    const int in_flight =
        InFlightMicrobatches(run.schedule, run.pp, run.vpp, run.microbatches, stage, k);
    for (int i = c.chunks[k].first_layer; i < c.chunks[k].end(); ++i) {
      if (i >= m.num_layers()) {  // Note [MTP layers]
        absl::StatusOr<LayerCost> mtp = BuildMtpLayer(m, hw, run, i - m.num_layers(), tokens);
        if (!mtp.ok()) return mtp.status();
        c.layers.push_back(*std::move(mtp));
      } else if (hf) {
        c.layers.push_back(BuildHfLayer(m, hw, run, i, tokens));
      } else {
        absl::StatusOr<LayerCost> layer = BuildLayer(m, hw, run, i, tokens);
        if (!layer.ok()) return layer.status();
        c.layers.push_back(*std::move(layer));
      }
      c.layers.back().in_flight_microbatches = in_flight;
    }
  }
  // Fixed memory and the loss are whole-step counts: the same checked conversion as a layer's.
  Builder whole{m, hw, run, tokens, {}, 0, 0, 0, 0, 0, absl::OkStatus()};
  whole.cost.index = -1;

  // Fixed memory. Dense parameters shard over the data-parallel ranks of a TP group (DP x CP),
  // routed experts over the expert-data-parallel ranks (gpus / ep).
  // With pipeline parallelism each stage's state shards over its own data-parallel group, a
  // pp-th of the ranks (under either rank order: RunSettings::rank_order moves its members, not
  // their count).
  const double tp = run.tp;
  const double dense_group = static_cast<double>(run.gpus) / tp / run.pp;
  const double expert_group = static_cast<double>(run.gpus) / run.ep / run.pp;
  // Embedding, head and final norm, and the multi-token-prediction modules (StageNonLayerParams).
  const NonLayerParams outside = StageNonLayerParams(m, run, stage);
  double dense = outside.dense;
  double experts = outside.experts;
  double max_layer = 0;
  for (const LayerCost& layer : c.layers) {
    if (layer.index >= m.num_layers()) continue;  // an MTP depth: in StageNonLayerParams
    const LayerSpec& l = m.layers[layer.index];
    const double d = static_cast<double>(DenseLayerParams(m, l)) / tp;
    const double e = static_cast<double>(RoutedExpertParams(m, l)) / run.ep;
    dense += d;
    experts += e;
    max_layer = std::max(max_layer, d + e);
  }
  auto shard = [&](double bytes_per_param, bool sharded, const char* what) {
    return whole.Bytes(bytes_per_param * (sharded ? dense / dense_group + experts / expert_group
                                                  : dense + experts),
                       what);
  };
  c.fixed.weights =
      shard(run.weight_bytes, run.sharding == Sharding::kOptimGradsParams, "the weights");
  c.fixed.gradients = shard(run.grad_bytes, run.sharding >= Sharding::kOptimGrads, "the gradients");
  const uint64_t optimizer = shard(OptimizerBytesPerParam(run.optimizer),
                                   run.sharding >= Sharding::kOptim, "the optimizer state");
  if (run.optimizer_offload) {
    // Megatron's CPU optimizer offload: the state stays in pinned host memory; each step the
    // gradients go D2H and the updated weights H2D, after the backward and before the next
    // forward, so the copies do not overlap compute.
    c.optimizer_host_bytes = optimizer;
    c.optimizer_copy_seconds =
        static_cast<double>(
            shard(run.grad_bytes, run.sharding >= Sharding::kOptim, "the gradients")) /
            hw.d2h_bytes_per_second +
        static_cast<double>(
            shard(run.weight_bytes, run.sharding >= Sharding::kOptim, "the weights")) /
            hw.h2d_bytes_per_second;
  } else {
    c.fixed.optimizer = optimizer;
  }
  // Sharded weights are gathered a layer at a time, the next one prefetched; sharded gradients
  // exist whole for one layer until reduce-scattered.
  double comm = 0;
  if (run.sharding == Sharding::kOptimGradsParams) comm += 2 * max_layer * run.weight_bytes;
  if (run.sharding >= Sharding::kOptimGrads) comm += max_layer * run.grad_bytes;
  c.fixed.comm_buffers = whole.Bytes(comm, "the communication buffers");

  // Tail: final norm, LM head (vocab split by TP) and cross-entropy over loss chunks; backward
  // recomputes each chunk's logits when the loss is chunked.
  const double dt = run.activation_bytes, h = m.hidden, v = m.vocab / tp;
  const double chunk = run.loss_chunk_tokens == 0
                           ? tokens
                           : std::min(tokens, static_cast<double>(run.loss_chunk_tokens));
  // Final-logit soft-capping (Gemma 2: logits = cap * tanh(logits / cap), modeling_gemma2.py
  // Gemma2ForCausalLM.forward) keeps the tanh output, one more fp32 logits chunk.
  const double softcap_bytes = m.final_logit_softcap > 0 ? 4 : 0;
  // Note [MTP layers]: each MTP depth's head runs after the main one's: its input and gradient are
  // held; one loss chunk's logits are reused by each head in turn, unless the loss is unchunked
  // (every head's logits are saved until its backward).
  const double heads = 1 + static_cast<double>(c.mtp_layers);
  const double logit_sets = chunk >= tokens ? heads : 1;
  c.tail_bytes = whole.Bytes(tokens * (m.hc_mult + 2 + 2 * (heads - 1)) * h * dt / tp +
                                 logit_sets * chunk * v * (dt + 4 + 4 + softcap_bytes),
                             "the LM head and loss working set");
  const double head_flops = heads * 2 * h * v * tokens;
  // Forward, and backward's two GEMMs (input and weight gradients); a chunked loss recomputes
  // each chunk's logits in backward (a fourth pass) unless one chunk covers every token, when
  // the logits are kept as with 0 (issue 11: that case was charged four passes).
  const double passes = chunk >= tokens ? 3 : 4;
  c.tail_time = OpTimeOf(
      {.gemm_flops = passes * head_flops, .elementwise_bytes = heads * 3 * tokens * v * 4}, hw);
  c.tail_seconds = c.tail_time.total();
  c.embedding_time = OpTimeOf({.elementwise_bytes = 3 * tokens * h * dt * m.hc_mult}, hw);
  c.embedding_seconds = c.embedding_time.total();
  if (hf) ApplyHfStep(m, hw, run, c);
  if (!first_stage) c.embedding_seconds = 0, c.embedding_grad_bytes = 0;
  if (!last_stage) {
    c.tail_seconds = 0, c.tail_bytes = 0, c.tail_grad_bytes = 0, c.held_logits_bytes = 0;
  }
  if (hf) ApplyHfDataParallel(run, c);
  c.comm = BuildStepComm(m, hw, run, c.layers, stage);
  for (size_t i = 0; i < c.layers.size(); ++i) {
    c.layers[i].forward_comm_seconds = c.comm.layers[i].forward_exposed_seconds;
    c.layers[i].backward_comm_seconds = c.comm.layers[i].backward_exposed_seconds;
    c.layers[i].recompute_comm_seconds = c.comm.layers[i].recompute_exposed_seconds;
  }

  c.copy_chunk_bytes = 16ull << 20;
  // Every rank of a node runs this schedule, so each copy of this rank runs while the GPUs
  // sharing its host link copy too: the link's share is the rate (HardwareProfile::
  // SharedHostLinkRate).
  c.d2h_bytes_per_second = hw.SharedHostLinkRate(Rate(hw, c.copy_chunk_bytes, true));
  c.h2d_bytes_per_second = hw.SharedHostLinkRate(Rate(hw, c.copy_chunk_bytes, false));
  const double bidir_scale_d = hw.bidir_d2h_bytes_per_second / hw.d2h_bytes_per_second;
  const double bidir_scale_h = hw.bidir_h2d_bytes_per_second / hw.h2d_bytes_per_second;
  c.bidir_d2h_bytes_per_second = c.d2h_bytes_per_second * std::min(1.0, bidir_scale_d);
  c.bidir_h2d_bytes_per_second = c.h2d_bytes_per_second * std::min(1.0, bidir_scale_h);
  if (!whole.status.ok()) return whole.status;
  if (absl::Status s = CheckStepCostBounds(c); !s.ok()) return s;
  return c;
}

// Note [Gradient timing]
// When a layer's parameter gradients exist. Megatron-Core allocates its contiguous gradient
// buffers before the step (fixed memory; LayerCost::grad_bytes is 0). Eager PyTorch creates each
// weight's gradient when autograd runs the backward node of the op that used the weight (the
// mm or grouped_mm backward computes it with the input's gradient, and AccumulateGrad takes it
// as the parameter's .grad, set_to_none); within a layer the engine runs the nodes in reverse
// order of their creation in forward. So at a moment of a layer's backward the gradients made
// are those of the weights used after that moment's op in forward: at the FFN/MoE part's peak
// (the SwiGLU mul's backward, Note [hf FFN backward]) down_proj's, not gate/up's nor any of the
// attention's; at the attention part's peak (the core's backward) the whole FFN/MoE block's and
// o_proj's, not the q/k/v projections'. The recipe states them per layer kind
// (LayerCost::ffn_peak_grad_bytes, attn_peak_grad_bytes; framework_hf.cc Note [hf gradient
// timing], which adds the FFN's input projections' backward as a third moment: Mixtral's
// gate_up_proj gradient, 1.75 GiB, is made there); the backward peak below is the largest of
// the moments with its gradients, the
// rest of the layer's gradients exist from its backward's end, and what the step holds around
// the layer is BackwardHeldBytes (simulator.h), the one sum the simulator and the optimizer use.
// The layer input's gradient follows the same order: autograd sums the gradients of the
// input's uses (the residual path and the layer's first ops) in the input's buffer, and the
// residual add's backward hands the output's gradient on as it is (AddBackward0: no new
// tensor), so a new tensor of the input's width exists only once the first ops' backward (the
// input norm's; OLMo's q/k/v projections) has run, after every moment above: the hf recipe
// says so (LayerCost::input_grad_made_last; the olmo3 layers at 4096 tokens peaked 40 MiB,
// 2h per token, below the old count). A shared expert's input gradient, made inside the
// FFN's backward, is the FFN recipe's (framework_hf.cc). The megatron recipe keeps counting it
// at every moment: GLM-5.3-Flash's layers are mHC (hc_mult 4), and Megatron-Core applies H_res
// to the n-stream residual after the sublayer (transformer/hyper_connection.py apply_h_res,
// deferred to the fused h_res/h_post bias-dropout-add), so that bmm's backward, which runs
// first, makes an n x hidden-wide part of the input's gradient that lives through the rest of
// the layer's backward (its peak moments included). For hc_mult 1 layers the megatron count
// stays as it was: an upper bound by 2h per token (the fused bias-dropout-add's backward
// under torch.compile or jit is not checked here).
//
// Note [Recompute moment]
// A recomputed layer reruns its forward inside its backward, and the rerun's transients are live
// on top of what the backward holds then. Megatron-Core's CheckpointFunction (tensor_parallel/
// random.py, reentrant; TransformerEngine's te_checkpoint the same) reruns the whole layer
// forward when autograd reaches the checkpoint's node, then runs the layer's backward over its
// outputs with the output gradients passed in. torch.utils.checkpoint without reentrance (the
// one transformers' gradient_checkpointing_enable uses, `use_reentrant=False`; torch 2.11
// checkpoint.py _checkpoint_hook.unpack_hook) reruns the forward at the first unpack of a saved
// tensor, i.e. at the layer's first backward node that needs one (down_proj's, or the MoE
// weighting mul's: the residual add saves nothing), before any of the layer's gradients is
// made, and stops it once the last saved tensor is regenerated (early_stop, default True:
// _recomputation_hook raises _StopRecomputationError), each regenerated tensor then freed at its
// unpack as a kept one is at its node. Either way the rerun's moment holds what the forward held
// at its peak (forward_with: the saved tensors made so far, the transients, the residual stream)
// and the output's gradient (output_bytes) beside it; the forward-only transients (GLM-5's DSA
// indexer: two fp32 [s, H, s] score tensors, 4 GiB a layer at 4096 tokens, Note [hf MLA] in
// framework_hf.cc) make it the backward's peak. The backward's own moments follow, with what the
// checkpoint holds beyond its input until its backward ends (LayerCost::checkpoint_held_bytes:
// under hf the step's masks, Note [hf masks]), which the rerun counts already as the forward
// did. A measured layer's rerun is its measured forward (own forward bytes) with the output's
// gradient: the same moment read off the measured step (profile.cc Note [Measured layers]).
OptionCost EvaluateOption(const LayerCost& l, const LayerOption& o) {
  OptionCost c;
  const int k = std::max(1, o.chunks);
  const double overhead = (k - 1) * l.chunk_overhead_seconds;
  c.forward_seconds = l.forward_seconds + l.forward_comm_seconds + overhead;
  c.backward_seconds = l.backward_seconds + l.backward_comm_seconds + overhead;
  c.comm_seconds = l.forward_comm_seconds + l.backward_comm_seconds;
  // Attention runs before the FFN/MoE in forward and after it in backward: the FFN part's
  // working set (divided by the chunk count) sits on top of everything the attention part
  // saved, the attention part's on top of its own saved tensors only. The output (forward) or
  // the output and input gradients (backward) are alive throughout.
  const uint64_t attn_saved = l.saved_bytes - l.ffn_saved_bytes;
  const uint64_t ffn_fwd = l.ffn_forward_transient / k;
  const uint64_t ffn_bwd = l.ffn_backward_transient / k;
  auto forward_with = [&](uint64_t attn_part, uint64_t ffn_part) {
    return std::max(attn_part + l.attn_forward_transient, attn_part + ffn_part + ffn_fwd) +
           l.output_bytes;
  };
  // Note [Gradient timing]: each part's peak with the gradients made by then, and the input's
  // gradient where it exists by then.
  const uint64_t input_grad = l.input_grad_made_last ? 0 : l.input_bytes;
  auto backward_with = [&](uint64_t ffn_part) {
    return std::max({attn_saved + ffn_part + ffn_bwd + l.ffn_peak_grad_bytes,
                     attn_saved + l.ffn_inputs_backward_bytes + l.ffn_inputs_grad_bytes,
                     attn_saved + l.attn_backward_transient + l.attn_peak_grad_bytes}) +
           l.output_bytes + input_grad;
  };
  const uint64_t keep_forward = forward_with(attn_saved, l.ffn_saved_bytes);
  const uint64_t keep_backward = backward_with(l.ffn_saved_bytes);
  switch (o.policy) {
    case LayerPolicy::kKeep:
      c.resident_bytes = l.saved_bytes;
      c.forward_peak = keep_forward;
      c.backward_peak = keep_backward;
      break;
    case LayerPolicy::kSelectiveRecompute: {
      uint64_t dropped = 0;
      for (size_t m = 0; m < l.modules.size(); ++m) {
        if (o.module_mask & (1u << m)) {
          dropped += l.modules[m].saved_bytes;
          c.recompute_seconds += l.modules[m].seconds + (l.modules[m].in_ffn ? overhead : 0);
          if (l.modules[m].holds_checkpoint_held) c.checkpoint_held_bytes = l.checkpoint_held_bytes;
        }
      }
      c.resident_bytes = l.saved_bytes - dropped;
      c.forward_peak = keep_forward;
      // Note [Recompute moment]: a module's checkpoint holds its share of the step's inputs
      // through the layer's backward moments (the attention core's backward is the last).
      c.backward_peak = keep_backward + c.checkpoint_held_bytes;
      break;
    }
    case LayerPolicy::kRecompute:
    case LayerPolicy::kOffloadInput:
      c.resident_bytes = o.policy == LayerPolicy::kRecompute ? l.input_bytes : 0;
      c.host_bytes = o.policy == LayerPolicy::kOffloadInput ? l.input_bytes : 0;
      c.save_at_forward_start = o.policy == LayerPolicy::kOffloadInput;
      c.recompute_seconds = c.forward_seconds - l.forward_comm_seconds + l.recompute_comm_seconds;
      c.comm_seconds += l.recompute_comm_seconds;  // the recompute's collectives run again
      // Forward saves nothing but the input, and peaks at its transients or where its code
      // holds the most (LayerCost::unkept_forward_bytes); the recompute in backward regenerates
      // the FFN/MoE part chunk by chunk. Note [Recompute moment]: the backward's peak is the
      // larger of its own moments, with what the checkpoint holds through them, and the rerun
      // forward's.
      c.forward_peak =
          std::max(forward_with(l.input_bytes, 0), l.input_bytes + l.unkept_forward_bytes);
      c.checkpoint_held_bytes = l.checkpoint_held_bytes;
      c.backward_peak = std::max(backward_with(l.ffn_saved_bytes / k) + l.checkpoint_held_bytes,
                                 forward_with(attn_saved, l.ffn_saved_bytes / k) + l.output_bytes);
      break;
    case LayerPolicy::kOffloadSaved:
      c.host_bytes = l.saved_bytes;
      c.forward_peak = keep_forward;
      c.backward_peak = keep_backward;
      break;
  }
  return c;
}

std::vector<PlannedTransfer> OptionTransfers(const LayerCost& l, const LayerOption& o) {
  std::vector<PlannedTransfer> out;
  if (o.policy == LayerPolicy::kOffloadInput) {
    out.push_back({"input", l.input_bytes});
  } else if (o.policy == LayerPolicy::kOffloadSaved) {
    for (const SavedTensor& t : l.saved) {
      if (t.bytes > 0) out.push_back({t.name, t.bytes});
    }
  }
  return out;
}

std::vector<LayerOption> AllOptions(const LayerCost& l, const std::vector<int>& chunk_counts) {
  std::vector<LayerOption> out;
  for (int k : l.ffn_chunkable ? chunk_counts : std::vector<int>{1}) {
    out.push_back({LayerPolicy::kKeep, 0, k});
    const uint32_t subsets = 1u << l.modules.size();
    for (uint32_t mask = 1; mask < subsets; ++mask) {
      out.push_back({LayerPolicy::kSelectiveRecompute, mask, k});
    }
    out.push_back({LayerPolicy::kRecompute, 0, k});
    out.push_back({LayerPolicy::kOffloadInput, 0, k});
    out.push_back({LayerPolicy::kOffloadSaved, 0, k});
  }
  return out;
}

}  // namespace stowage::planner
