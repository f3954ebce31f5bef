// The cost model: per-layer bytes and seconds of one training step on one rank, counted from the
// model's shapes, the run's parallelism and the hardware's rates. See Note [Cost model] in
// cost_model.cc for what is counted and why.
#ifndef STOWAGE_PLANNER_COST_MODEL_H_
#define STOWAGE_PLANNER_COST_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/communication.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "planner/hardware/op_time.h"
#include "stowage/plan.h"

namespace stowage::planner {

// How the data-parallel group shards training state (Megatron-FSDP's names). Each level includes
// the previous: "optim" is Megatron's distributed optimizer; "optim_grads_params" also shards
// weights and gradients, gathering one layer's weights at a time.
enum class Sharding { kNoShard, kOptim, kOptimGrads, kOptimGradsParams };
const char* ShardingName(Sharding sharding);
absl::StatusOr<Sharding> ParseSharding(const std::string& name);

// Whose code runs the layers, which decides what a layer holds for backward and when gradients
// exist. kMegatron: Megatron-Core with TransformerEngine kernels (Note [Cost model]); kHf:
// Hugging Face transformers eager code with SDPA and its default loss (framework_hf.cc).
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
  int tp = 1;                  // tensor parallel, with sequence parallelism
  int cp = 8;                  // context parallel
  int ep = 8;                  // expert parallel
  int gpus = 64;               // world size; data parallel = gpus / (tp * cp)
  double moe_imbalance = 1.0;  // tokens on the busiest expert-parallel rank over the average
  int activation_bytes = 2;    // bf16 activations
  int weight_bytes = 2;        // bf16 weights
  int grad_bytes = 4;          // fp32 main gradients
  OptimizerKind optimizer = OptimizerKind::kAdam;  // its state: OptimizerBytesPerParam
  // Optimizer state lives in pinned host memory and the step runs on the CPU (Megatron's
  // --optimizer-cpu-offload): gradients go D2H and updated weights H2D once per step.
  bool optimizer_offload = false;
  Framework framework = Framework::kMegatron;
  // Under kHf: the transformers 5.x release whose code the recipe follows where releases differ,
  // as its minor version (Note [hf transformers versions] in framework_hf.cc). 17: the version
  // of the measured reference steps (reference/measured/).
  int transformers_minor = 17;
  Sharding sharding = Sharding::kOptimGradsParams;
  // The LM head and loss run over this many tokens at a time (a fused/chunked cross-entropy);
  // 0 materializes the logits of every token at once.
  uint64_t loss_chunk_tokens = 8192;
  // Pipeline parallelism (planner/search/pipeline.h, Note [Pipeline] in pipeline.cc): stages, model
  // chunks per stage, schedule, microbatches per step (gradient accumulation without pipeline),
  // layers per stage or virtual stage (empty: Megatron-Core's even split), and whether that
  // split counts the embedding / the loss as a layer (Megatron's
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
  // cost_model.cc): -1 takes the config's num_nextn_predict_layers under megatron (as
  // Megatron-Bridge's providers set mtp_num_layers) and 0 under hf (transformers drops the MTP
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

// Checks ranges and divisibility (e.g. gpus by tp*cp, experts by ep) and the limits above;
// errors name the flag (or model field), its value and what is allowed.
absl::Status ValidateRun(const ModelConfig& model, const RunSettings& run);

// One tensor a layer keeps for its backward when nothing is recomputed.
struct SavedTensor {
  std::string name;    // e.g. "input", "attn.qkv", "moe.act"
  std::string module;  // recompute module that can regenerate it ("" if none but full recompute)
  uint64_t bytes = 0;  // on this rank
};

// A module selective recompute can rerun in backward instead of keeping its outputs.
struct RecomputeModule {
  std::string name;  // "attn_core", "mla_up_proj", "ffn_act", "moe_act"
  uint64_t saved_bytes = 0;
  double seconds = 0;
  bool in_ffn = false;  // part of the FFN/MoE (its rerun is chunked with it)
  // Its checkpoint holds LayerCost::checkpoint_held_bytes until its backward ends (hf
  // attn_core: the step's attention mask is an argument of the call it reruns).
  bool holds_checkpoint_held = false;
};

struct LayerCost {
  int index = 0;     // the model's layer index; MTP depth k: the model's layers + k
  std::string type;  // LayerSpec::TypeName(); an MTP layer's is "mtp+" and its layer's kind
  std::string name;  // "mtp.K" for MTP depth K (stowage/plan.h MtpLayerName), else ""
  uint64_t input_bytes = 0;
  uint64_t output_bytes = 0;  // alive through the forward; its gradient through the backward
  // Whether the input's gradient is made after every moment of the backward EvaluateOption
  // counts (Note [Gradient timing] in cost_model.cc: eager PyTorch, the hf recipe), so that
  // none of them holds it; else each counts it beside the output's gradient (megatron).
  bool input_grad_made_last = false;
  std::vector<SavedTensor> saved;  // includes "input"
  uint64_t saved_bytes = 0;        // sum of saved
  uint64_t ffn_saved_bytes = 0;    // the FFN/MoE part of saved (recomputed chunk by chunk)
  std::vector<RecomputeModule> modules;
  // Transient working sets beyond the saved tensors, attention and FFN/MoE parts (the FFN/MoE
  // part divides by the chunk count).
  uint64_t attn_forward_transient = 0;
  uint64_t ffn_forward_transient = 0;
  uint64_t attn_backward_transient = 0;
  uint64_t ffn_backward_transient = 0;
  double forward_seconds = 0;
  double backward_seconds = 0;
  // forward_seconds and backward_seconds by op class, where the analytic recipes built them
  // (a measured profile's are empty): what `--explain`-style tables and tests print.
  OpTime forward_time;
  OpTime backward_time;
  double chunk_overhead_seconds = 0;  // per extra FFN/MoE chunk, per pass
  double forward_flops = 0;
  // Parameter gradients this layer's backward creates (StepCost::gradients_in_backward): they
  // exist from its backward to the end of the step. Of them, those made by the moment its FFN/MoE
  // part's backward peaks and by the moment its attention part's backward peaks (eager PyTorch
  // makes a weight's gradient when autograd runs its module's backward: Note [Gradient timing]
  // in cost_model.cc); EvaluateOption counts them in the backward peak, the rest exist from the
  // backward's end. Both are 0 when gradients exist before the step.
  uint64_t grad_bytes = 0;
  uint64_t ffn_peak_grad_bytes = 0;
  uint64_t attn_peak_grad_bytes = 0;
  // A third moment of the backward, between those two: the FFN/MoE input projections' backward
  // (gate/up), when their weight gradients are made (ffn_inputs_grad_bytes, the FFN block's
  // gradients made by then) beside what of the FFN is still alive (ffn_inputs_backward_bytes:
  // its saved tensors not yet released, the gradients of the projections' output and input).
  // 0 where the recipe has no such moment (Megatron: gradients exist before the step).
  uint64_t ffn_inputs_backward_bytes = 0;
  uint64_t ffn_inputs_grad_bytes = 0;
  // What the layer's checkpoint holds beyond its input from its forward until its backward ends
  // when the layer is recomputed, that its forward transients count while the forward runs
  // (transformers: the step's attention masks, passed to every checkpointed layer; Note
  // [Recompute moment] in cost_model.cc). 0 where the checkpoint holds its input only.
  uint64_t checkpoint_held_bytes = 0;
  // Which tensors those are: layers of one group hold the same ones (one copy however many
  // hold them), layers of different groups different ones (transformers: each layer type's
  // mask, Note [hf masks]); the simulator counts each group's once (Note [Checkpoint-held
  // inputs] in simulator.cc).
  int checkpoint_held_group = 0;
  // The layer's own bytes at its forward's peak beyond its input when its checkpoint keeps none
  // of its saved tensors (recompute, offload_input: each is freed once the forward's own
  // references to it are gone), where the recipe states it (hf: Llama 4, Note [hf recompute
  // forward] in framework_hf.cc); 0: the forward transients alone count there.
  uint64_t unkept_forward_bytes = 0;
  // Microbatches of this layer a pipeline stage holds at once (1F1B: stage s of p holds
  // min(p - s, M)); the simulator keeps the other m - 1 microbatches' resident bytes on the GPU
  // throughout and m copies of its host bytes in host memory. 1 without pipelining.
  int in_flight_microbatches = 1;
  // Whether the trainer can run this layer's FFN/MoE in token chunks (LayerOption::chunks > 1).
  // Megatron's recipe can; transformers' eager MLP and expert loop take every token at once
  // (framework_hf.cc), and a measured layer ran as it was measured.
  bool ffn_chunkable = true;
  // Exposed communication of one forward (made again by a recompute) and one backward
  // (StepComm::layers; planner/cost/communication.h), added to the pass times by EvaluateOption.
  double forward_comm_seconds = 0;
  double backward_comm_seconds = 0;
  double recompute_comm_seconds = 0;  // a recompute's (StepComm: no FSDP gather again)
  // The softmax/MLA attention core's share of forward_seconds / backward_seconds (what a CP ring
  // step overlaps); 0 for other attention kinds and measured profiles.
  double attention_core_forward_seconds = 0;
  double attention_core_backward_seconds = 0;
};
inline constexpr int kMaxInFlightMicrobatches = 1024;

struct FixedMemory {
  uint64_t weights = 0;
  uint64_t gradients = 0;
  uint64_t optimizer = 0;
  uint64_t comm_buffers = 0;
  uint64_t other = 0;  // held by the trainer throughout (a measured profile's sample input)
  uint64_t total() const { return weights + gradients + optimizer + comm_buffers + other; }
};

// Everything the simulator and optimizer need about one step on one rank.
struct StepCost {
  std::string model;
  // The pipeline stage this step is (0 without pipeline parallelism) and its model chunks.
  int stage = 0;
  std::vector<LayerRange> chunks;
  uint64_t model_parameters = 0;  // ModelParameters(model)
  RunSettings run;
  // MTP depths the run trains (TrainedMtpLayers; the last stage's last layers are they) and the
  // model's own count (num_nextn_predict_layers), for what the summary says about them.
  int mtp_layers = 0;
  int model_mtp_layers = 0;
  HardwareProfile hardware;
  uint64_t tokens_per_rank = 0;
  FixedMemory fixed;
  std::vector<LayerCost> layers;
  double embedding_seconds = 0;  // forward + backward
  double tail_seconds = 0;       // final norm, LM head and loss, forward + backward
  OpTime embedding_time;         // embedding_seconds and tail_seconds by op class (analytic)
  OpTime tail_time;
  uint64_t tail_bytes = 0;  // working set of the LM head and loss
  double d2h_bytes_per_second = 0;
  double h2d_bytes_per_second = 0;
  double bidir_d2h_bytes_per_second = 0;
  double bidir_h2d_bytes_per_second = 0;
  uint64_t copy_chunk_bytes = 16ull << 20;
  // Eager PyTorch creates each parameter's gradient when backward reaches it (fixed.gradients
  // is then 0): the LM head's at the end of the tail, each layer's at the end of its backward,
  // the embedding's last.
  bool gradients_in_backward = false;
  uint64_t tail_grad_bytes = 0;
  uint64_t embedding_grad_bytes = 0;
  // Once a layer's backward has ended it holds a layer_grad_shards-th of its gradients
  // (LayerCost::grad_bytes, rounded up): 1 unless the data-parallel engine reduce-scatters each
  // layer's gradients as its backward ends and frees the unsharded ones (torch FSDP2 under hf,
  // Note [hf data parallel] in framework_hf.cc).
  int layer_grad_shards = 1;
  // Of tail_bytes, what the caller holds from the LM head's forward to the end of the step: the
  // model output's logits (transformers returns them and the training loop keeps the output
  // while it runs the backward). 0 where nothing outlives the loss (Megatron's vocab-parallel
  // loss returns the loss only).
  uint64_t held_logits_bytes = 0;
  // --optimizer-offload: the optimizer state in host memory and the once-per-step copies
  // (gradients D2H, weights H2D) that do not overlap the forward and backward.
  uint64_t optimizer_host_bytes = 0;
  double optimizer_copy_seconds = 0;
  // The step's collectives (planner/cost/communication.h); comm.step_exposed_seconds is added to
  // the step by the simulator, each layer's exposed part is in its LayerCost.
  StepComm comm;
  // A step built from a measured layer profile (BuildStepCostFromProfile): which of `run`'s
  // framework, optimizer and grad_bytes, and of model_parameters, the profile stated (the
  // others are unknown, and the summary says so instead of printing a default).
  struct ProfileStated {
    bool framework = false, optimizer = false, grad_dtype = false, parameters = false;
  };
  std::optional<ProfileStated> profile;
};

// Parameters a rank of pipeline stage `stage` holds outside its layers (dense ones over tp,
// routed experts over ep): the input embedding on the first stage; the final norm, LM head (its
// own copy of the word embeddings when pp > 1 and they are tied or feed the MTP modules) and,
// where the framework trains them, the multi-token-prediction modules on the last. The fixed memory
// and the gradient reduction of a stage both count these (BuildStepCost, planner/cost/communication.h
// BuildStepComm).
struct NonLayerParams {
  double dense = 0;
  double experts = 0;
};
NonLayerParams StageNonLayerParams(const ModelConfig& model, const RunSettings& run, int stage);
// Whether the last of several stages keeps a copy of the word embeddings (tied to the LM head,
// or the input of the MTP modules under Megatron), whose gradients it all-reduces with stage 0's
// once per step.
bool LastStageHoldsWordEmbeddings(const ModelConfig& model, const RunSettings& run);

// One pipeline stage's step (run.pp = 1: the whole model; planner/search/pipeline.h): that stage's
// layers (LayerCost::index is the model's layer index; in_flight_microbatches the schedule's),
// their weights, gradients and optimizer state sharded over the stage's data-parallel group, the
// embedding on stage 0 and the final norm, LM head and loss on the last stage.
absl::StatusOr<StepCost> BuildStepCost(const ModelConfig& model, const HardwareProfile& hardware,
                                       const RunSettings& run, int stage = 0);

// Whether a step cost (built here, or from a measured profile) keeps within kMaxLayers,
// kMaxTensorBytes and kMaxStepBytes, and has finite, non-negative seconds: what the simulator
// and optimizer assume. BuildStepCost checks it before returning; Optimize checks it too.
absl::Status CheckStepCostBounds(const StepCost& step);

// One choice for one layer.
struct LayerOption {
  LayerPolicy policy = LayerPolicy::kKeep;
  uint32_t module_mask = 0;  // kSelectiveRecompute: bit k = LayerCost::modules[k] is rerun
  int chunks = 1;            // FFN/MoE chunk count
  friend bool operator==(const LayerOption&, const LayerOption&) = default;
};

// What one option costs: what the simulator consumes.
struct OptionCost {
  uint64_t resident_bytes = 0;  // on the GPU from forward end to backward start (after D2H)
  uint64_t host_bytes = 0;      // copied D2H after forward and H2D before backward
  // The save is issued when the forward starts (offload_input: the input exists already), not
  // when it ends (offload_saved: tensors are saved as the forward makes them).
  bool save_at_forward_start = false;
  uint64_t forward_peak = 0;  // the layer's own bytes during its forward (input included)
  // The layer's own bytes at the peak of its recompute + backward: its working set and the
  // parameter gradients its backward has made by then (LayerCost::ffn_peak_grad_bytes).
  uint64_t backward_peak = 0;
  // What of the step's shared inputs (LayerCost::checkpoint_held_bytes) the option's checkpoint
  // holds from its forward to its backward's end; backward_peak counts them, the simulator
  // counts them in the loss and above (Note [Checkpoint-held inputs] in simulator.cc).
  uint64_t checkpoint_held_bytes = 0;
  double forward_seconds = 0;
  double recompute_seconds = 0;
  double backward_seconds = 0;
  double comm_seconds = 0;  // the exposed communication included in the three above
  double compute_seconds() const { return forward_seconds + recompute_seconds + backward_seconds; }
};

OptionCost EvaluateOption(const LayerCost& layer, const LayerOption& option);
// Tensors the option moves to the host, in copy order (names as in LayerCost::saved).
std::vector<PlannedTransfer> OptionTransfers(const LayerCost& layer, const LayerOption& option);
// Every option for a layer: keep, each non-empty subset of its modules, recompute,
// offload_input, offload_saved, each with chunk counts 1, 2, 4, 8 (FFN/MoE layers).
// Every option of `layer`, with each of `chunk_counts` where the layer is ffn_chunkable (else
// chunk count 1 only).
std::vector<LayerOption> AllOptions(const LayerCost& layer, const std::vector<int>& chunk_counts);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_COST_MODEL_H_
