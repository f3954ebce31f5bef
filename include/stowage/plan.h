// The plan: the one contract between the planner (which writes it) and the runtime (which carries
// it out every step). Serialized as versioned JSON; docs/plan-format.md documents every field.
// Readers accept any plan whose schema_version they know and ignore unknown fields, so the planner
// may add fields without breaking deployed runtimes.
#ifndef STOWAGE_PLAN_H_
#define STOWAGE_PLAN_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace stowage {

inline constexpr int kPlanSchemaVersion = 1;

// The limits ValidatePlan enforces (docs/plan-format.md lists them too). They are far above any
// real run and far below where the runtime's arithmetic could wrap: a plan outside them was written
// by mistake or by hand, and is refused with the field, its value and the limit.
inline constexpr int kPlanMaxLayers = 100000;
inline constexpr uint64_t kPlanMaxBytes = uint64_t{1} << 60;  // any one byte count: 1 EiB
inline constexpr double kPlanMaxSeconds = 1e9;                // any one predicted duration
// Copies are split into chunks of copy_chunk_bytes; every chunk is one backend operation, so tiny
// chunks cost a call per few bytes (1-byte chunks took ~1 GB of queue for 30 MiB) and huge ones
// stop the directions interleaving. The runtime enforces the same range on its option
// (offload::kMinCopyChunkBytes / kMaxCopyChunkBytes; capi/c_api.cc asserts they agree).
inline constexpr uint64_t kPlanMinCopyChunkBytes = uint64_t{4} << 10;
inline constexpr uint64_t kPlanMaxCopyChunkBytes = uint64_t{1} << 30;
inline constexpr double kPlanMaxLinkBytesPerSecond = 1e15;  // 1 PB/s
inline constexpr int kPlanMaxParallelSize = 1 << 20;        // micro_batch, tp, cp, ep
inline constexpr uint64_t kPlanMaxSeqLen = uint64_t{1} << 40;
inline constexpr int kPlanMaxGpusPerNumaNode = 1024;
inline constexpr int kPlanMaxFfnChunks = 1 << 16;
// Pipeline parallelism (Note [Pipeline stages]). Real runs use up to a few dozen stages
// (DeepSeek-V3 and Llama 3 405B: 16) and a few virtual stages; the limits keep the in-flight count
// (which walks a stage's schedule) cheap for any plan the reader accepts.
inline constexpr int kPlanMaxPipelineStages = 512;  // run.pp
inline constexpr int kPlanMaxVirtualStages = 32;    // run.vpp
inline constexpr int kPlanMaxMicrobatches = 1 << 20;
// Multi-token-prediction depths a plan may carry (Note [MTP layers]); DeepSeek-V3 and GLM train 1.
inline constexpr int kPlanMaxMtpLayers = 64;
// run.global_batch, sequences per step: micro_batch x microbatches x data parallel at their limits
// would wrap; no job steps on more than this.
inline constexpr uint64_t kPlanMaxGlobalBatch = uint64_t{1} << 40;

// What happens to one layer's activations between its forward and its backward.
enum class LayerPolicy {
  kKeep,                // every tensor saved for backward stays on the GPU
  kRecompute,           // only the layer input stays on the GPU; forward is rerun in backward
  kSelectiveRecompute,  // the modules in `recompute_modules` are rerun, the rest is kept
  kOffloadInput,        // the layer input goes to pinned host memory; full recompute in backward
  kOffloadSaved,        // every saved tensor goes to pinned host memory; no recompute
};

// Plan-file spelling of a policy: "keep", "recompute", "selective_recompute", "offload_input",
// "offload_saved". The CLI, metrics and docs use the same words.
std::string_view LayerPolicyName(LayerPolicy policy);
absl::StatusOr<LayerPolicy> ParseLayerPolicy(std::string_view name);

// True for the policies that move bytes to the host (and so need the runtime).
bool PolicyOffloads(LayerPolicy policy);

// Note [Runtime protocol]. What a step does with an offloading layer's bytes, and when. The
// planner's simulator replays exactly this, and the PyTorch wrapper (and any trainer driving the
// C ABI) carries it out; the plan carries it in two per-layer fields, both computed by
// LayerProtocolFor and nowhere else:
//  - forward: layer i's saves are issued during its forward (offload_input: its input, before
//    the layer runs; offload_saved: each saved tensor as autograd saves it). Before the forward
//    of layer `save_wait_before_layer` (= i + save_lag) the trainer waits for every save of
//    layer i to land (stowage_save_wait / stowage_save_wait_stream) and only then releases the
//    device blocks; when i + save_lag is past the last layer the wait is at the start of backward
//    (before the last layer's backward; the field is then num_layers). Until that wait the
//    device bytes stay in use, even if the D2H landed earlier.
//  - backward: when the backward of layer `prefetch_after_layer` (= min(i + prefetch_distance,
//    last layer)) starts, layer i's tensors are prefetched (stowage_prefetch; the destination is
//    allocated then). Prefetches triggered by the same layer are issued highest layer first, so
//    the H2D engine carries them in the order backward needs them.
//  - layer i's backward (its recompute included) waits for its own tensors (stowage_restore).
// Layers that offload nothing have both fields -1.
inline constexpr int kDefaultSaveLag = 2;

// One model chunk (Note [Pipeline stages]): layers [first_layer, first_layer + num_layers).
struct LayerRange {
  int first_layer = 0;
  int num_layers = 0;
  int end() const { return first_layer + num_layers; }
};

struct LayerProtocol {
  int save_wait_before_layer = -1;  // in [i + 1, num_layers]; num_layers: backward start
  int prefetch_after_layer = -1;    // in [i, num_layers - 1]
};

// The one computation of Note [Runtime protocol]. `offloads`: the layer moves bytes to the host.
LayerProtocol LayerProtocolFor(int layer, int num_layers, bool offloads, int prefetch_distance,
                               int save_lag);
// Within one model chunk (Note [Pipeline stages]): `chunk.end()` in place of num_layers, so the
// fields stay in [layer + 1, chunk.end()] and [layer, chunk.end() - 1]. LayerProtocolFor(i, n, ...)
// is LayerProtocolFor(i, {0, n}, ...).
LayerProtocol LayerProtocolFor(int layer, LayerRange chunk, bool offloads, int prefetch_distance,
                               int save_lag);

// What one step does, in the words of Note [Runtime protocol]: the runtime's trace
// (stowage_get_trace) and the simulator's prediction use these, in this spelling.
enum class StepEventKind {
  kSaveIssued = 0,      // a save's D2H was issued (stowage_save)
  kSaveLanded = 1,      // its bytes are in host memory
  kSaveWait = 2,        // the trainer waited for a save before reusing its device block
  kPrefetchIssued = 3,  // an H2D was issued (stowage_prefetch, or a restore without a prefetch)
  kPrefetchLanded = 4,  // its bytes are in device memory
  kRestore = 5,         // the consumer waits for the H2D (stowage_restore)
};
// "save_issued", "save_landed", "save_wait", "prefetch_issued", "prefetch_landed", "restore".
std::string_view StepEventKindName(StepEventKind kind);

// Note [Pipeline stages]. With pipeline parallelism (run.pp = p > 1) the layers are split into
// p x vpp model chunks (virtual stages) of consecutive layers; virtual stage v = c * p + s is chunk
// c of stage s (Megatron-Core's order: stage s holds chunks s, p + s, 2p + s, ...). Stage 0 also
// runs the embedding, stage p - 1 the final norm, LM head and loss. A plan lists every layer of the
// model (indices are the model's), and one section per stage naming its chunks; the runtime of a
// rank loads one stage (its `stage` option) and reserves host memory for that stage's layers only.
// The protocol of Note [Runtime protocol] runs within a chunk: for a layer of chunk [first, end)
// `end` plays the part of num_layers (the save wait before the chunk's backward, prefetches
// triggered no later than its last layer). A pp = 1 plan has one stage with one chunk of every
// layer, and reads exactly as before.
//
// A stage holds several microbatches of a layer at once (forwards done, backwards not yet): the
// schedule decides how many, InFlightMicrobatches below, the one computation of it. Each in-flight
// microbatch keeps its own copy of the layer's saved bytes (device and host), so the runtime
// reserves host_bytes x in_flight_microbatches for the layer.
enum class PipelineSchedule {
  k1F1B,         // one forward, one backward (Megatron's forward_backward_pipelining_without_...)
  kInterleaved,  // interleaved 1F1B over vpp > 1 model chunks per stage
};
// "1f1b", "interleaved" (the CLI's --schedule words).
std::string_view PipelineScheduleName(PipelineSchedule schedule);
absl::StatusOr<PipelineSchedule> ParsePipelineSchedule(std::string_view name);

// How Megatron-Core numbers the ranks of the parallel grid, innermost first (parallel_state.py
// RankGenerator; megatron/training/initialize.py passes 'tp-cp-ep-dp-pp', or 'tp-cp-ep-pp-dp'
// under --use-tp-pp-dp-mapping). It decides which ranks form each group and so the link each
// collective crosses (planner/cost/communication.h GroupsOf, Note [Communication]): kTpCpEpDpPp
// puts the pipeline outermost (stages gpus / pp ranks apart, data parallelism inside a stage);
// kTpCpEpPpDp puts pipeline neighbours tp x cp ranks apart and spreads the data-parallel groups
// over pp times more ranks. With pp 1 the two are the same.
enum class RankOrder { kTpCpEpDpPp, kTpCpEpPpDp };
// "tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp" (the CLI's --rank-order words).
std::string_view RankOrderName(RankOrder order);
absl::StatusOr<RankOrder> ParseRankOrder(std::string_view name);

// Microbatches of chunk `chunk` that stage `stage` of `pp` holds at once under `schedule` with
// `microbatches` microbatches per step (Megatron-Core pipeline_parallel/schedules.py):
//  - 1F1B: warmup runs pp - stage - 1 forwards (get_pp_rank_microbatches), then each forward is
//    followed by the oldest backward, so min(pp - stage, microbatches) are held.
//  - interleaved: the forwards go through the chunks in groups of pp microbatches (the schedule
//    table, microbatch_group_size_per_vp_stage = pp), the backwards likewise with the chunks
//    reversed; warmup runs min(2 (pp - stage - 1) + (vpp - 1) pp, microbatches x vpp) forwards,
//    then one forward and one backward alternate, then the rest of the backwards. The count is
//    the most of chunk `chunk` held at any point of that order.
// pp = 1: 1 (gradient accumulation runs the microbatches one after another). Arguments outside the
// plan's limits (ValidatePlan) give 1.
int InFlightMicrobatches(PipelineSchedule schedule, int pp, int vpp, int microbatches, int stage,
                         int chunk);

// The plan's rules for run.schedule, run.pp, run.vpp and run.microbatches (ValidatePlan's, with
// its messages): INVALID_ARGUMENT naming the field, its value and what is allowed.
absl::Status CheckPipelineRun(PipelineSchedule schedule, int pp, int vpp, int microbatches);

// One forward or backward of one microbatch through one model chunk of a stage.
struct PipelineOp {
  bool forward = true;
  int chunk = 0;       // the stage's chunk, 0 to vpp - 1
  int microbatch = 0;  // 0 to microbatches - 1, the id the trainer saves and restores it under
  bool operator==(const PipelineOp&) const = default;
};
// The order in which stage `stage` runs its forwards and backwards in one step (the order
// InFlightMicrobatches walks): 1F1B runs min(pp - stage - 1, microbatches) warmup forwards, then
// alternates one forward and the oldest backward, then the remaining backwards; interleaved runs
// the schedule table's units (groups of pp microbatches through chunk 0, 1, ..., vpp - 1; the
// backwards with the chunks reversed) with the warmup above; pp = 1 (gradient accumulation) runs
// each microbatch's forward and backward before the next. 2 x microbatches x vpp ops; empty for
// arguments outside the plan's limits.
std::vector<PipelineOp> PipelineOrder(PipelineSchedule schedule, int pp, int vpp, int microbatches,
                                      int stage);

// Note [MTP layers]. A run that trains multi-token prediction (Megatron-Core's --mtp-num-layers,
// DeepSeek-V3 / GLM's num_nextn_predict_layers) runs run.mtp_layers more layers after the
// decoder's, on the last pipeline stage (Megatron-Core multi_token_prediction.py
// mtp_on_this_rank without a custom layout): each MTP depth (its norms, eh_proj, one transformer
// layer and its final norm) is one entry of `layers`, after every decoder layer, in the last
// chunk of the last stage, with its own policy and the protocol of that chunk like any other
// layer; its `name` is "mtp.K" (K = 0 for the first depth) and its type starts with "mtp+". The
// second LM head and loss each depth feeds belong to the stage's LM head, not to the layer.
std::string MtpLayerName(int depth);  // "mtp.0", "mtp.1", ...

// One device->host->device copy the runtime performs for a layer each step.
struct PlannedTransfer {
  std::string name;    // e.g. "input", "attn.q", "moe.act"
  uint64_t bytes = 0;  // exact size on this rank
};

struct LayerPlan {
  int index = 0;
  std::string type;  // e.g. "kda+dense_ffn", "dsa+moe", "attention+swiglu"; MTP: "mtp+dsa+moe"
  // Note [MTP layers]: "mtp.K" for multi-token-prediction depth K (MtpLayerName), "" for a
  // decoder layer.
  std::string name;
  LayerPolicy policy = LayerPolicy::kKeep;
  std::vector<std::string> recompute_modules;  // for kSelectiveRecompute
  int ffn_chunks = 1;               // FFN chunk count, dense or MoE (1 = unchunked); was moe_chunks
  uint64_t device_saved_bytes = 0;  // bytes this layer holds on the GPU from forward to backward
  uint64_t host_bytes = 0;          // bytes this layer holds in pinned host memory
  std::vector<PlannedTransfer> transfers;  // sums to host_bytes
  // Note [Runtime protocol]: the forward of layer `save_wait_before_layer` waits for this layer's
  // saves (num_layers: backward start); this layer's H2D is issued when the backward of layer
  // `prefetch_after_layer` starts. Both -1 when nothing is offloaded.
  int save_wait_before_layer = -1;
  int prefetch_after_layer = -1;
  // Note [Pipeline stages]: InFlightMicrobatches of the layer's stage and chunk (1 without
  // pipeline parallelism); the runtime reserves host_bytes x this.
  int in_flight_microbatches = 1;
  double forward_seconds = 0;
  double backward_seconds = 0;
  double recompute_seconds = 0;
  double d2h_seconds = 0;
  double h2d_seconds = 0;
};

struct PlanPrediction {
  uint64_t peak_device_bytes = 0;
  uint64_t fixed_device_bytes = 0;  // weights, gradients, optimizer state, comm buffers
  uint64_t host_bytes_per_gpu = 0;
  uint64_t host_bytes_per_numa_node = 0;
  double step_seconds = 0;
  double exposed_copy_seconds = 0;  // compute stalled waiting on copies
  // The step if no copy overlapped compute: compute, then every D2H and H2D (and the optimizer
  // offload's copies) one after another. With step_seconds, the range a user can expect.
  double unoverlapped_step_seconds = 0;
  double baseline_step_seconds = 0;  // keep-everything if it fits, else full recompute
  std::string baseline;              // "keep" or "recompute"
  // Pipeline point-to-point time (activations and their gradients between stages) in
  // step_seconds: what no compute hides (planner Note [Pipeline]); 0 without stages.
  double exposed_point_to_point_seconds = 0;
  // How far the planner's search got (Note [Optimality gap] in planner/search/optimizer.cc):
  // "proven" (no plan within the budgets is faster), "within_gap" (within the requested optimality
  // gap of the search's bound) or "unproven" (its work budget ran out first); "" for a plan that
  // does not fit or one read without it. optimality_gap: step / that bound - 1, no plan being
  // faster by more than this fraction (0 when proven; with stages, the worst stage's).
  std::string optimality;
  double optimality_gap = 0;
};

// What the runtime needs to set itself up before step 0.
struct RuntimeSettings {
  int prefetch_distance = 1;                // layers ahead in backward
  int save_lag = kDefaultSaveLag;           // layers a save may stay in flight in forward
  uint64_t host_arena_bytes = 0;            // pinned bytes to reserve per GPU (sum of host_bytes)
  uint64_t copy_chunk_bytes = 16ull << 20;  // copies are split into chunks of this size
  int gpus_per_numa_node = 1;
  // Host-link ceiling per direction the plan assumed (bytes/s at copy_chunk_bytes); the runtime
  // exports it next to the bandwidth it achieves. 0: unknown.
  double link_bytes_per_second = 0;
};

// One pipeline stage: what the ranks of that stage run and what they need (Note [Pipeline stages]).
struct StagePlan {
  int stage = 0;
  std::vector<LayerRange> chunks;  // run.vpp of them, chunk c = virtual stage c x pp + stage
  bool embedding = false;          // stage 0
  bool lm_head = false;            // the last stage: final norm, LM head and loss
  // The stage's Note [Runtime protocol] distance (each stage is planned on its own); a plan read
  // without it has runtime.prefetch_distance.
  int prefetch_distance = 1;
  uint64_t peak_device_bytes = 0;  // this stage's peak, its in-flight microbatches included
  uint64_t fixed_device_bytes = 0;
  uint64_t host_bytes_per_gpu = 0;
  // Pinned bytes a rank of this stage reserves: at least its layers' host_bytes x
  // in_flight_microbatches.
  uint64_t host_arena_bytes = 0;
  double microbatch_seconds = 0;  // one microbatch's forward and backward on this stage
  double exposed_copy_seconds = 0;
  // Point-to-point time per microbatch of the steady state no compute hides on this stage (its
  // exchanges with the neighbouring stages), in addition to microbatch_seconds.
  double point_to_point_seconds = 0;
};

// Note [Plans that do not fit]. When no plan fits the budgets the planner still answers: the
// closest plan it found (the smallest peak its options reach; or a forced policy's plan) with
// `fits` false and what binds, in the words the CLI's table prints. Such a plan explains a failure;
// it is not one to run, so the runtime refuses to load it (FAILED_PRECONDITION naming the reason).
// ValidatePlan holds both sides to their budgets: `fits` true means every stage's peak is within
// run.gpu_budget_bytes (when stated, > 0) and the pinned bytes within run.host_budget_bytes (when
// stated); `fits` false means `binding` names a budget the plan exceeds and by exactly how much.
struct PlanBinding {
  std::string budget;  // "gpu" (device memory) or "host" (pinned host memory): the one exceeded
  uint64_t exceeded_by_bytes = 0;  // gpu: the stage's peak - run.gpu_budget_bytes; host: its
                                   // host_bytes_per_gpu - run.host_budget_bytes
  int stage = 0;                   // the stage that binds (0 without pipeline parallelism)
  std::string at;                  // where the peak is: "backward of layer 43", "LM head and loss"
  std::string what;         // what binds: "fixed memory", "host memory", "working set of the ..."
  std::string explanation;  // the sentence the table prints under "binding:"
};

struct Plan {
  int schema_version = kPlanSchemaVersion;
  std::string generator;  // "stowage <version>"
  std::string model;      // preset name or config path
  std::string hardware;   // preset name or profile path
  // Every trained parameter of the model (planner/model/model.h ModelParameters).
  uint64_t model_parameters = 0;
  // Run settings the plan was made for (echoed so a plan file explains itself).
  uint64_t seq_len = 0;
  int micro_batch = 1;
  std::string framework = "megatron";  // the planner's framework recipe: "megatron" or "hf"
  int tp = 1, cp = 1, ep = 1;
  // Pipeline parallelism (Note [Pipeline stages]): stages, model chunks per stage, schedule and
  // microbatches per step.
  int pp = 1, vpp = 1;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int microbatches = 1;
  // Megatron's rank order the stages' links were planned for (the planner's --rank-order).
  // Written only when not the default, so that other plans keep their bytes and hash.
  RankOrder rank_order = RankOrder::kTpCpEpDpPp;
  // Megatron's --sequence-parallel: whether the layer input, the norms, the residual and the
  // pipeline's messages split their tokens over the TP ranks (moot with tp 1). Written only when
  // false, so that other plans keep their bytes and hash; absent means true.
  bool sequence_parallel = true;
  // Note [MTP layers]: multi-token-prediction depths trained (0: none), the last entries of
  // `layers`.
  int mtp_layers = 0;
  // The job the plan was made for: its GPUs (the world size) and its global batch, sequences per
  // step (micro_batch x microbatches x data parallel, data parallel = gpus / (tp x cp x pp)).
  // 0: not stated (plans written before these fields, plans made by hand); written only when
  // stated, so that those plans keep their bytes and hash.
  int gpus = 0;
  uint64_t global_batch = 0;
  uint64_t gpu_budget_bytes = 0;
  uint64_t host_budget_bytes = 0;
  PlanPrediction predicted;
  // Note [Plans that do not fit]: false for the closest plan when none fits; `binding` says why.
  bool fits = true;
  PlanBinding binding;
  RuntimeSettings runtime;
  // Every layer of the model, in order; `stages` say which stage runs each (pp entries; a plan
  // without them read from JSON has the one stage of every layer, StagesWithoutPipeline).
  std::vector<LayerPlan> layers;
  std::vector<StagePlan> stages;
};

// The one stage of a plan without pipeline parallelism: every layer in one chunk, the embedding
// and the LM head, the plan's predictions and arena.
StagePlan StageWithoutPipeline(const Plan& plan);

// The plan's stages: `stages`, or StageWithoutPipeline when they are left empty with pp = 1 (a
// plan built in code; PlanToJson writes that stage and ValidatePlan checks it).
std::vector<StagePlan> PlanStages(const Plan& plan);

// The stage and chunk that run layer `layer` (ValidatePlan guarantees there is one); {-1, -1} if
// none does.
struct LayerPlace {
  int stage = -1;
  int chunk = -1;
};
LayerPlace PlaceOfLayer(const Plan& plan, int layer);

// Serialization. PlanToJson is pretty-printed and stable (same plan, same bytes).
std::string PlanToJson(const Plan& plan);
// Reads a plan strictly (base/json_reader.h: integers only where integers are meant, no value
// outside its C++ type, no duplicate keys; unknown fields are ignored), then ValidatePlan()s it.
// Errors name the offending field (its JSON path), its value and what is allowed.
absl::StatusOr<Plan> ParsePlanJson(std::string_view json);
// As ParsePlanJson; errors start with the file's path.
absl::StatusOr<Plan> ReadPlanFile(const std::string& path);
// The hash ranks compare to agree on one plan (stowage_plan_hash, Python's stowage.agree):
// XXH3-64 of PlanToJson(plan), the canonical text -- the plan as the strict reader fills it,
// written by the one writer -- so whitespace, key order and fields the reader ignores in the file
// a rank loaded do not matter, and every field the runtime reads does.
uint64_t CanonicalPlanHash(const Plan& plan);

// Every rule a plan obeys, in one place (the C++ planner, the runtime, the C ABI's
// stowage_plan_validate and Python's Plan all use this): each field within its limit (above),
// indices 0..n-1 in order, the run.mtp_layers last layers named and placed as Note [MTP layers]
// says (and no other layer named), transfers summing to host_bytes without overflow, host bytes
// only under the offload policies, prefetch_after_layer -1 or a layer from index to n-1,
// host_bytes_per_numa_node 0 (not stated) or host_bytes_per_gpu x gpus_per_numa_node, pp stages
// whose chunks cover the layers in virtual-stage order (Note [Pipeline stages]), vpp > 1 exactly
// with the interleaved schedule (which needs pp > 1 and microbatches a multiple of pp),
// in_flight_microbatches as InFlightMicrobatches gives, each stage's arena (and
// runtime.host_arena_bytes) holding every byte its layers offload, and `fits` / `binding` agreeing
// with the budgets (Note [Plans that do not fit]). A plan that does not fit is a valid plan.
absl::Status ValidatePlan(const Plan& plan);

}  // namespace stowage

#endif  // STOWAGE_PLAN_H_
