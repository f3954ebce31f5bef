// The plan: the one contract between the planner (which writes it) and the runtime (which carries
// it out every step). Serialized as versioned JSON; the README's "Plan format" section documents
// every field. Readers accept any plan whose schema_version they know and ignore unknown fields,
// so the planner may add fields without breaking deployed runtimes.
#ifndef STOWAGE_PLAN_H_
#define STOWAGE_PLAN_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace stowage {

inline constexpr int kPlanSchemaVersion = 1;

// The limits ValidatePlan enforces (the README's "Plan format" states them too). They are far
// above any real run and far below where the runtime's arithmetic could wrap: a plan outside them
// was written by mistake or by hand, and is refused with the field, its value and the limit.
inline constexpr int kPlanMaxLayers = 100000;
inline constexpr uint64_t kPlanMaxBytes = uint64_t{1} << 60;  // any one byte count: 1 EiB
inline constexpr double kPlanMaxSeconds = 1e9;                // any one predicted duration
// Copies are split into chunks of copy_chunk_bytes; every chunk is one backend operation, so tiny
// chunks cost a call per few bytes (1-byte chunks took ~1 GB of queue for 30 MiB) and huge ones
// stop the directions interleaving. The runtime enforces the same range on its option
// (offload::kMinCopyChunkBytes / kMaxCopyChunkBytes; runtime/c_api.cc asserts they agree).
inline constexpr uint64_t kPlanMinCopyChunkBytes = uint64_t{4} << 10;
inline constexpr uint64_t kPlanMaxCopyChunkBytes = uint64_t{1} << 30;
inline constexpr double kPlanMaxLinkBytesPerSecond = 1e15;  // 1 PB/s
inline constexpr int kPlanMaxParallelSize = 1 << 20;        // micro_batch, tp, cp, ep
inline constexpr uint64_t kPlanMaxSeqLen = uint64_t{1} << 40;
inline constexpr int kPlanMaxGpusPerNumaNode = 1024;
inline constexpr int kPlanMaxFfnChunks = 1 << 16;

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

struct LayerProtocol {
  int save_wait_before_layer = -1;  // in [i + 1, num_layers]; num_layers: backward start
  int prefetch_after_layer = -1;    // in [i, num_layers - 1]
};

// The one computation of Note [Runtime protocol]. `offloads`: the layer moves bytes to the host.
LayerProtocol LayerProtocolFor(int layer, int num_layers, bool offloads, int prefetch_distance,
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

// One device->host->device copy the runtime performs for a layer each step.
struct PlannedTransfer {
  std::string name;    // e.g. "input", "attn.q", "moe.act"
  uint64_t bytes = 0;  // exact size on this rank
};

struct LayerPlan {
  int index = 0;
  std::string type;  // e.g. "kda+dense_ffn", "dsa+moe", "attention+swiglu"
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
  double exposed_copy_seconds = 0;   // compute stalled waiting on copies
  double baseline_step_seconds = 0;  // keep-everything if it fits, else full recompute
  std::string baseline;              // "keep" or "recompute"
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

struct Plan {
  int schema_version = kPlanSchemaVersion;
  std::string generator;  // "stowage <version>"
  std::string model;      // preset name or config path
  std::string hardware;   // preset name or profile path
  // Every trained parameter of the model (planner/model.h ModelParameters).
  uint64_t model_parameters = 0;
  // Run settings the plan was made for (echoed so a plan file explains itself).
  uint64_t seq_len = 0;
  int micro_batch = 1;
  std::string framework = "megatron";  // the planner's framework profile: "megatron" or "hf"
  int tp = 1, cp = 1, ep = 1;
  uint64_t gpu_budget_bytes = 0;
  uint64_t host_budget_bytes = 0;
  PlanPrediction predicted;
  RuntimeSettings runtime;
  std::vector<LayerPlan> layers;
};

// Serialization. PlanToJson is pretty-printed and stable (same plan, same bytes).
std::string PlanToJson(const Plan& plan);
// Reads a plan strictly (base/json_reader.h: integers only where integers are meant, no value
// outside its C++ type, no duplicate keys; unknown fields are ignored), then ValidatePlan()s it.
// Errors name the offending field (its JSON path), its value and what is allowed.
absl::StatusOr<Plan> ParsePlanJson(std::string_view json);
// As ParsePlanJson; errors start with the file's path.
absl::StatusOr<Plan> ReadPlanFile(const std::string& path);

// Every rule a plan obeys, in one place (the C++ planner, the runtime, the C ABI's
// stowage_plan_validate and Python's Plan all use this): each field within its limit (above),
// indices 0..n-1 in order, transfers summing to host_bytes without overflow, host bytes only under
// the offload policies, prefetch_after_layer -1 or a layer from index to n-1,
// host_bytes_per_numa_node 0 (not stated) or host_bytes_per_gpu x gpus_per_numa_node, and an arena
// that holds every offloaded byte.
absl::Status ValidatePlan(const Plan& plan);

}  // namespace stowage

#endif  // STOWAGE_PLAN_H_
