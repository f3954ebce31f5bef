// The run's settings: parallelism, dtypes, sharding, framework, optimizer, pipeline and MTP
// depths, with their names and parsers, the defaults per framework, the checks of a run against
// its model, and what a pipeline stage holds outside its layers.
#ifndef STOWAGE_PLANNER_COST_RUN_SETTINGS_H_
#define STOWAGE_PLANNER_COST_RUN_SETTINGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/model/model.h"
#include "stowage/plan.h"

namespace stowage::planner {

// How the data-parallel group shards training state (Megatron-FSDP's names). Each level includes
// the previous: "optim" is Megatron's distributed optimizer; "optim_grads_params" also shards
// weights and gradients, gathering one layer's weights at a time.
enum class Sharding { kNoShard, kOptim, kOptimGrads, kOptimGradsParams };
const char* ShardingName(Sharding sharding);
absl::StatusOr<Sharding> ParseSharding(const std::string& name);

// Whose code runs the layers, which decides what a layer holds for backward and when gradients
// exist. kMegatron: Megatron-Core with TransformerEngine kernels (Note [Cost model] in
// planner/frameworks/megatron.cc); kHf: Hugging Face transformers eager code with SDPA and its
// default loss (planner/frameworks/).
enum class Framework { kMegatron, kHf };
const char* FrameworkName(Framework framework);  // "megatron", "hf"
absl::StatusOr<Framework> ParseFramework(const std::string& name);

// The optimizer's state per parameter. kAdam: fp32 master weights + m + v; kSgd (with
// momentum): fp32 master weights + momentum; kNone: no optimizer state at all.
enum class OptimizerKind { kAdam, kSgd, kNone };
const char* OptimizerKindName(OptimizerKind kind);  // "adam", "sgd", "none"
absl::StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name);
int OptimizerBytesPerParam(OptimizerKind kind);  // 12, 8, 0

struct RunSettings {
  uint64_t seq_len = 1048576;  // tokens per sequence
  int micro_batch = 1;         // sequences per micro-batch
  int tp = 1;                  // tensor parallel
  int cp = 8;                  // context parallel
  int ep = 8;                  // expert parallel
  int gpus = 64;               // world size; data parallel = gpus / (tp * cp)
  double moe_imbalance = 1.0;  // tokens on the busiest expert-parallel rank over the average
  int activation_bytes = 2;    // bf16 activations
  int weight_bytes = 2;        // bf16 weights
  int grad_bytes = 4;          // fp32 main gradients
  OptimizerKind optimizer = OptimizerKind::kAdam;  // its state: OptimizerBytesPerParam
  // Megatron's --sequence-parallel (meaningful with tp > 1; Megatron-LM's default is off, the
  // planner's on): the tensors outside attention and the FFN (the layer input, the norms, the
  // residual) split their tokens over the TP ranks; without it every TP rank holds them for the
  // whole sequence (SequenceShards; Note [Sequence parallelism] in planner/frameworks/megatron.cc).
  bool sequence_parallel = true;
  // Optimizer state lives in pinned host memory and the step runs on the CPU (Megatron's
  // --optimizer-cpu-offload): gradients go D2H and updated weights H2D once per step.
  bool optimizer_offload = false;
  Framework framework = Framework::kMegatron;
  // Under kHf: the transformers 5.x release whose code the recipe follows where releases differ,
  // as its minor version (Note [hf transformers versions] in planner/frameworks/hf_ffn.cc). 17: the
  // version of the measured reference steps (tests/planner/data/measured/hf-h200.jsonl).
  int transformers_minor = 17;
  Sharding sharding = Sharding::kOptimGradsParams;
  // The LM head and loss run over this many tokens at a time (a fused/chunked cross-entropy);
  // 0 materializes the logits of every token at once.
  uint64_t loss_chunk_tokens = 8192;
  // Pipeline parallelism (the split: planner/cost/pipeline_layout.h; the step:
  // planner/search/pipeline.h, Note [Pipeline] in pipeline.cc): stages, model chunks per stage,
  // schedule, microbatches per step (gradient accumulation without pipeline), layers per stage or
  // virtual stage (empty: Megatron-Core's even split), and whether that split counts the embedding
  // / the loss as a layer (Megatron's
  // --account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split).
  int pp = 1;
  int vpp = 1;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int microbatches = 1;
  std::vector<int> pp_layout;
  bool account_for_embedding_in_pipeline_split = false;
  bool account_for_loss_in_pipeline_split = false;
  // Megatron's rank order (--rank-order; stowage/plan.h RankOrder): with pp 1 both orders make
  // the same groups.
  RankOrder rank_order = RankOrder::kTpCpEpDpPp;
  // Multi-token-prediction depths trained (Megatron-Core's --mtp-num-layers; Note [MTP layers] in
  // planner/frameworks/megatron.cc): -1 takes the config's num_nextn_predict_layers under megatron
  // (as Megatron-Bridge's providers set mtp_num_layers) and 0 under hf (transformers drops the MTP
  // weights on load); 0 trains none (the MTP weights are then neither trained nor held).
  int mtp_layers = -1;
};

// The settings of a run where its request or command line says nothing, per framework: the
// struct's (the reference run: CP 8, EP 8, the loss in 8K-token chunks) under megatron, EP 1
// for a dense model; under hf what transformers eager runs: no context or expert parallelism
// and the loss over every token at once (ForCausalLMLoss). The CLI and plan requests both start
// from it, so a run that names only its framework plans what that framework can run.
RunSettings DefaultRunSettings(Framework framework, const ModelConfig& model);

// The MTP depths `run` trains (RunSettings::mtp_layers resolved): the layers after the model's
// decoder layers, on the last pipeline stage.
int TrainedMtpLayers(const ModelConfig& model, const RunSettings& run);

// The ranks the tokens of the sequence-parallel region (the layer input, the norms, the residual,
// the pipeline's messages) split over: tp with sequence parallelism, else 1 (each TP rank holds
// the whole sequence).
inline int SequenceShards(const RunSettings& run) {
  return run.sequence_parallel && run.tp > 1 ? run.tp : 1;
}

// Checks ranges and divisibility (e.g. gpus by tp*cp, experts by ep) and the limits of
// planner/model/model.h; errors name the flag (or model field), its value and what is allowed.
absl::Status ValidateRun(const ModelConfig& model, const RunSettings& run);

// Parameters a rank of pipeline stage `stage` holds outside its layers (dense ones over tp,
// routed experts over ep): the input embedding on the first stage; the final norm, LM head (its
// own copy of the word embeddings when pp > 1 and they are tied or feed the MTP modules) and,
// where the framework trains them, the multi-token-prediction modules on the last. The fixed memory
// and the gradient reduction of a stage both count these (planner/frameworks/step_cost.h
// BuildStepCost, planner/cost/communication.h BuildStepComm).
struct NonLayerParams {
  double dense = 0;
  double experts = 0;
};
NonLayerParams StageNonLayerParams(const ModelConfig& model, const RunSettings& run, int stage);
// Whether the last of several stages keeps a copy of the word embeddings (tied to the LM head,
// or the input of the MTP modules under Megatron), whose gradients it all-reduces with stage 0's
// once per step.
bool LastStageHoldsWordEmbeddings(const ModelConfig& model, const RunSettings& run);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_COST_RUN_SETTINGS_H_
