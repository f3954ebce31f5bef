// The `megatron` framework recipe: what a Megatron-Core layer with TransformerEngine kernels
// keeps for backward and spends, per rank (Notes [Cost model], [megatron profile], [megatron
// linear attention]), its multi-token-prediction layers (Note [MTP layers]), and the step's
// fixed memory, LM head and loss and embedding.
#include "planner/frameworks/megatron.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/frameworks/step_cost.h"
#include "planner/hardware/op_time.h"

namespace stowage::planner {
namespace {

// Note [Cost model]
// Bytes are counted per token from the layer shapes and multiplied by the tokens one rank holds
// (seq_len * micro_batch / cp). Under TP, tensors inside attention and the FFN divide their head
// or intermediate dimension by tp; tensors on the residual path (layer input, norms) divide by tp
// only with sequence parallelism (Note [Sequence parallelism]). Routed-expert tensors scale with
// the tokens the busiest expert-parallel rank receives: tokens * top_k * moe_imbalance (expert TP
// is 1). A layer's input is hc_mult * hidden wide (mHC residual streams), which is what makes 1M
// tokens / CP 8 of GLM-5.3-Flash come to 32 KiB per token per layer, 180 GiB over 45 layers.
//
// Seconds: each module's work as an OpWork, timed by OpSeconds (planner/hardware/op_time.h): matmul
// FLOPs (2 per multiply-add; backward twice forward) as dense GEMMs, routed experts as grouped
// GEMMs at the tokens each local expert receives; softmax attention cores (flash / TE fused
// attention, MLA and DSA's sparse core) by their own FLOP counts (causal: each query sees half
// the sequence on average, under CP too; backward 2.5x forward as in flash kernels); linear
// attention's chunked cores and the DSA indexer as GEMMs; element-wise work as three passes
// over the saved bytes. Communication adds what compute does not hide
// (Note [Communication] in planner/cost/communication.cc).

// Note [megatron profile]
// What a Megatron-Core (0.16) layer with TransformerEngine (2.x) kernels keeps for backward, per
// token; checked against Megatron-Core's own local-spec layers on CPU by
// tests/python/measure/test_megatron_profile.py, which also states, as cited constants, what the
// local spec keeps instead where TE's fused kernels differ. TE files are under
// transformer_engine/pytorch/, Megatron-Core's under megatron/core/.
//  Norm + linear (TELayerNormColumnParallelLinear = module/layernorm_linear.py
//    _LayerNormLinear.forward): saves the norm's input (the layer input or the residual `mid`:
//    the same storage), ln_out (the local sequence shard under SP, backward all-gathers it; the
//    whole sequence without SP) and rsigma, one fp32 per row: (h*dt + 4)/sp for each of the two
//    norms (sp: Note [Sequence parallelism]). TENorm before a MoE (ops/basic/rmsnorm.py
//    RMSNorm.op_forward) saves its input and rstdevs the same way.
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
// stage (VirtualStageLayers), "mtp.K" in the table and the plan
// (Note [MTP layers] in stowage/plan.h). What depth K's MultiTokenPredictionLayer keeps for
// backward, per token (all but the token ids divided by sp, Note [Sequence parallelism]):
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
//    local sequence shard under SP, the whole sequence without): 2 h dt; the norms' outputs are
//    not kept apart from it (cat saves none);
//  - the transformer layer of the model's last layer kind, exactly as a decoder layer of that kind
//    (BuildMegatronLayer: its input is eh_proj's output, gathered and scattered back to the SP
//    shard under SP, all-reduced without);
//  - final_layernorm (TENorm) saves its input, the layer's output, and its rstdev: h dt + 4.
// The depth's output (final_layernorm's, h dt) goes to the shared output layer and a second
// cross-entropy (gpt_model.py _postprocess; mtp_loss_scaling_factor scales the loss, not what it
// keeps): those run with the main head in the tail (ApplyMegatronStep): the head's working set of
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
// (megatron/core/ssm/gated_delta_net.py, the version tests/python/measure/test_megatron_profile.py
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

// Note [Sequence parallelism]
// Megatron's --sequence-parallel (RunSettings::sequence_parallel; Megatron-LM's default is off, the
// planner's on). sp = SequenceShards(run): tp with it, 1 without. Megatron-Core 0.16.1
// tensor_parallel/layers.py: a ColumnParallelLinear's input under SP is the rank's sequence shard,
// which LinearWithGradAccumulationAndAsyncCommunication.forward all-gathers for the GEMM and saves
// as the shard (backward gathers it again for the weight gradient); without SP the input is the
// whole sequence (copy_to_tensor_model_parallel_region: identity forward, all-reduce backward) and
// is saved whole. A RowParallelLinear's output is reduce-scattered to the shard under SP,
// all-reduced to the whole sequence without (reduce_from_tensor_model_parallel_region). So every
// tensor between a row-parallel output and the next column-parallel input holds t/sp tokens per
// rank: the layer input and the residual `mid` (hc_mult streams), the norms' inputs, outputs and
// rsigma, the MTP module's norms and eh_proj input, the final norm and the LM head's saved input
// (the embedding's output is reduce-scattered to the shard under SP, LanguageModelEmbedding's
// reduce_scatter_embeddings, and all-reduced whole without), and the pipeline's messages
// (schedules.py get_tensor_shapes: seq_length // tp only under SP). Tensors split by heads, the
// FFN's intermediate or the vocabulary divide by tp either way. The MoE router and permute run on
// the rank's own tokens, the SP shard: Megatron refuses MoE under TP without SP (ValidateRun).
// Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022),
// split a GPT layer's activations the same way: 10 s b h of them (the norms and the residual
// path's dropouts) on every TP rank without SP, divided by t with it.

// Note [GEMM workspaces]
// What the GEMM libraries hold on the device from their first call to the end of the process,
// fixed memory of every stage:
//  - TransformerEngine's cuBLAS workspace, one per device (transformer_engine/pytorch/
//    cpp_extensions/gemm.py get_cublas_workspace, lru_cached), 32 MiB + 1 KiB on sm90+
//    (get_cublas_workspace_size_bytes; TransformerEngine 2.20.0.dev0, d0067d0), for every TE
//    linear;
//  - where the stage has MoE layers, TE GroupedLinear's four more, one per compute stream
//    (get_cublas_workspace(..., grouped_gemm=True): transformer_engine/common/util/
//    multi_stream.cpp num_compute_streams = 4);
//  - PyTorch's two cuBLAS workspaces (kTorchCublasWorkspacesBytes, step_cost.h) for the GEMMs
//    Megatron-Core runs in torch: the output layer (tensor_parallel.ColumnParallelLinear,
//    megatron/core/models/gpt/gpt_model.py) and the MoE router (RouterGatingLinearFunction's
//    torch.mm forward and backward, transformer/moe/moe_utils.py, 0.16.1). A stage with neither
//    (no MoE layer, not the last) holds none; it is counted there too, 64 MiB on the safe side.
// --tp-comm-overlap's userbuffers workspace (three more) is not modelled, as the overlap is not.
constexpr double kTeCublasWorkspaceBytes = 32.0 * 1024 * 1024 + 1024;
constexpr int kTeGroupedGemmStreams = 4;

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
  // The first count that broke a limit (Note [Limits] in planner/cost/cost_model.cc).
  absl::Status status;

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
  // Keeps `s` when it is the first error (the cost model's AddModule).
  void Keep(absl::Status s) {
    if (status.ok()) status = std::move(s);
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
      b.Keep(AddModule(b.cost, "mla_up_proj", b.Gemm(up_flops), false));
      b.Keep(AddModule(b.cost, "attn_core", b.Core(core), false));
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
    b.Keep(AddModule(b.cost, "ffn_act", b.Elementwise(3 * f * dt * t), true));
    b.cost.ffn_forward_transient = b.Bytes(2 * f * dt * t, "the FFN forward working set");
    b.cost.ffn_backward_transient = b.Bytes(3 * f * dt * t, "the FFN backward working set");
  } else {
    const double routed = m.experts_per_token * b.run.moe_imbalance / tp;  // per token
    const double fe = m.moe_intermediate, fs = m.shared_intermediate / tp;
    // Note [megatron profile]: the router and the permute run on this rank's own tokens
    // (sequence-parallel shard), the experts on the tokens dispatched to it.
    // (Megatron refuses MoE under TP without SP: the shard is t / tp, ValidateRun.)
    const double k = m.experts_per_token, sp = SequenceShards(b.run);
    b.Save("moe.router", "", k * (8 + 4) / sp);
    b.Save("moe.permute_map", "", (m.experts * (1 + dt) + 8 * k) / sp);
    b.Save("moe.dispatched", "", routed * h * dt);
    b.Save("moe.gate_up", "", (routed * 2 * fe + 2 * fs) * dt);
    b.Save("moe.probs", "", routed * dt);
    b.Save("moe.act", "moe_act", (routed * fe + fs) * dt);
    b.Keep(AddModule(b.cost, "moe_act", b.Elementwise(3 * (routed * fe + fs) * dt * t), true));
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

}  // namespace

absl::StatusOr<LayerCost> BuildMegatronLayer(const ModelConfig& m, const HardwareProfile& hw,
                                             const RunSettings& run, int index, double tokens) {
  const LayerSpec& spec = m.layers[index];
  Builder b{m, hw, run, tokens, {}, 0, 0, 0, 0, 0, absl::OkStatus()};
  b.cost.index = index;
  b.cost.type = spec.TypeName();
  const double tp = run.tp, dt = run.activation_bytes, h = m.hidden, n = m.hc_mult;
  // The sequence-parallel region: t / sp tokens per rank (Note [Sequence parallelism]).
  const double sp = SequenceShards(run);
  b.Save("input", "", n * h * dt / sp);
  if (m.hc_mult > 1) b.Save("attn.hc_in", "", h * dt / sp);
  b.Save("attn.norm", "", (h * dt + 4) / sp);  // ln_out + rsigma (Note [megatron profile])
  Attention(b, spec);
  b.Save("mid", "", n * h * dt / sp);
  if (m.hc_mult > 1) b.Save("ffn.hc_in", "", h * dt / sp);
  b.Save("ffn.norm", "", (h * dt + 4) / sp);
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
  // (Note [Communication] in planner/cost/communication.cc).
  b.cost.attention_core_forward_seconds =
      OpSeconds({.attention_forward_flops = b.attention_flops}, hw);
  b.cost.attention_core_backward_seconds =
      OpSeconds({.attention_backward_flops = 2.5 * b.attention_flops}, hw);
  b.cost.chunk_overhead_seconds = kChunkOverheadSeconds;
  if (!b.status.ok()) return b.status;
  return b.cost;
}

// Note [MTP layers]: the transformer layer of the model's last kind inside the module's own norms,
// eh_proj and final norm.
absl::StatusOr<LayerCost> BuildMegatronMtpLayer(const ModelConfig& m, const HardwareProfile& hw,
                                                const RunSettings& run, int depth, double tokens) {
  absl::StatusOr<LayerCost> inner = BuildMegatronLayer(m, hw, run, m.num_layers() - 1, tokens);
  if (!inner.ok()) return inner.status();
  Builder b{m, hw, run, tokens, *std::move(inner), 0, 0, 0, 0, 0, absl::OkStatus()};
  b.cost.index = m.num_layers() + depth;
  b.cost.name = MtpLayerName(depth);
  b.cost.type = absl::StrCat("mtp+", b.cost.type);
  const double tp = run.tp, dt = run.activation_bytes, h = m.hidden;
  const double sp = SequenceShards(run);  // Note [Sequence parallelism]
  std::vector<SavedTensor> layer = std::move(b.cost.saved);
  b.cost.saved.clear();
  // The hidden states, the shifted tokens' embedding and their ids.
  b.Save("input", "", 2 * h * dt / sp + 8);
  b.Save("mtp.norms", "", 2 * 4.0 / sp);
  b.Save("mtp.eh_proj_in", "", 2 * h * dt / sp);
  const size_t own_front = b.cost.saved.size();
  for (SavedTensor& t : layer) {
    if (t.name == "input") t.name = "mtp.layer_input";
    b.cost.saved.push_back(std::move(t));
  }
  b.Save("mtp.final_norm", "", (h * dt + 4) / sp);
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
  b.cost.output_bytes = b.Bytes(h * dt / sp * tokens, "the MTP layer's output");
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

absl::Status ApplyMegatronStep(const ModelConfig& m, const HardwareProfile& hw,
                               const RunSettings& run, StepCost& c) {
  const double tokens = static_cast<double>(c.tokens_per_rank);
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
  const NonLayerParams outside = StageNonLayerParams(m, run, c.stage);
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
  // Note [GEMM workspaces] (transformers' eager step has PyTorch's only: ApplyHfStep).
  if (run.framework == Framework::kMegatron) {
    bool grouped_gemm = false;
    for (const LayerCost& layer : c.layers) {
      const int kind = std::min(layer.index, m.num_layers() - 1);  // an MTP depth: the last kind
      grouped_gemm |= m.layers[kind].ffn == FfnKind::kMoe;
    }
    c.fixed.other += static_cast<uint64_t>(kTeCublasWorkspaceBytes *
                                           (1 + (grouped_gemm ? kTeGroupedGemmStreams : 0))) +
                     kTorchCublasWorkspacesBytes;
  }

  // Tail: final norm, LM head (vocab split by TP) and cross-entropy over loss chunks; backward
  // recomputes each chunk's logits when the loss is chunked. The final norm's input and output
  // (the head's saved input) are in the sequence-parallel region (Note [Sequence parallelism]).
  const double dt = run.activation_bytes, h = m.hidden, v = m.vocab / tp;
  const double sp = SequenceShards(run);
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
  c.tail_bytes = whole.Bytes(tokens * (m.hc_mult + 2 + 2 * (heads - 1)) * h * dt / sp +
                                 logit_sets * chunk * v * (dt + 4 + 4 + softcap_bytes),
                             "the LM head and loss working set");
  const double head_flops = heads * 2 * h * v * tokens;
  // Forward, and backward's two GEMMs (input and weight gradients); a chunked loss recomputes
  // each chunk's logits in backward (a fourth pass) unless one chunk covers every token, when
  // the logits are kept as with 0 (three passes, not four).
  const double passes = chunk >= tokens ? 3 : 4;
  c.tail_time = OpTimeOf(
      {.gemm_flops = passes * head_flops, .elementwise_bytes = heads * 3 * tokens * v * 4}, hw);
  c.tail_seconds = c.tail_time.total();
  c.embedding_time = OpTimeOf({.elementwise_bytes = 3 * tokens * h * dt * m.hc_mult}, hw);
  c.embedding_seconds = c.embedding_time.total();
  return whole.status;
}

}  // namespace stowage::planner
