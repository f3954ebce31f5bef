// The run's settings: the names and parsers of their enums, the defaults per framework, the
// checks of a run and its model against the limits, and what a pipeline stage holds outside its
// layers.
#include "planner/cost/run_settings.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stowage::planner {
namespace {

constexpr int kMaxMtpLayers = kPlanMaxMtpLayers;

// The model's sizes within the limits of planner/model/model.h, so that parameter counts
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
  // Note [MTP layers] in planner/frameworks/megatron.cc.
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
  // Megatron-Core 0.16.1 transformer/moe/moe_layer.py MoELayer.forward raises "During training,
  // performance may degrade if MoE and tensor parallelism are enabled without also enabling
  // sequence parallelism" (Megatron-LM 0.16.1 megatron/training/yaml_arguments.py asserts "When
  // using MoE and tensor parallelism, sequence parallelism must be used.").
  if (has_moe && r.tp > 1 && !r.sequence_parallel) {
    return bad("tp", r.tp,
               "a MoE model under tensor parallelism needs sequence parallelism: Megatron-Core "
               "refuses to train MoE layers with TP > 1 without --sequence-parallel "
               "(moe_layer.py MoELayer.forward); drop --no-sequence-parallel or use --tp 1");
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
  // Embedding, head and final norm, and the multi-token-prediction modules (planner/model/model.cc)
  // where the framework trains them: the embedding on the first stage; the final norm, head and MTP
  // on the last. Note [MTP layers] (planner/frameworks/megatron.cc): the depths the run trains
  // (--mtp-layers; none under hf, where transformers drops the MTP weights on load) are fixed
  // memory of the last stage, their activations layers of it.
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

}  // namespace stowage::planner
