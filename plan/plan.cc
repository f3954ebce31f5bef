#include "stowage/plan.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/checked_math.h"
#include "base/json_reader.h"
#include "nlohmann/json.hpp"

namespace stowage {
namespace {

using nlohmann::ordered_json;

constexpr std::pair<LayerPolicy, std::string_view> kPolicyNames[] = {
    {LayerPolicy::kKeep, "keep"},
    {LayerPolicy::kRecompute, "recompute"},
    {LayerPolicy::kSelectiveRecompute, "selective_recompute"},
    {LayerPolicy::kOffloadInput, "offload_input"},
    {LayerPolicy::kOffloadSaved, "offload_saved"},
};

#define STOWAGE_PLAN_RETURN_IF_ERROR(expr) \
  do {                                     \
    absl::Status status_ = (expr);         \
    if (!status_.ok()) return status_;     \
  } while (0)

// Errors from reading name the source "plan"; ReadPlanFile puts the file's path in front.
constexpr std::string_view kSource = "plan";

// Each field's range, used by the reader (so a value read from JSON is refused naming its limit)
// and by ValidatePlan (so a plan built in code obeys the same limit).
constexpr json::Range<uint64_t> kBytes{0, kPlanMaxBytes};
constexpr json::Range<double> kSeconds{0, kPlanMaxSeconds};
constexpr json::Range<int> kParallel{1, kPlanMaxParallelSize};
constexpr json::Range<uint64_t> kSeqLen{0, kPlanMaxSeqLen};
constexpr json::Range<uint64_t> kCopyChunk{kPlanMinCopyChunkBytes, kPlanMaxCopyChunkBytes};
constexpr json::Range<int> kGpusPerNumaNode{1, kPlanMaxGpusPerNumaNode};
constexpr json::Range<double> kLinkRate{0, kPlanMaxLinkBytesPerSecond};
constexpr json::Range<int> kPrefetchDistance{1, kPlanMaxLayers};
constexpr json::Range<int> kFfnChunks{1, kPlanMaxFfnChunks};
constexpr json::Range<int> kLayerIndex{0, kPlanMaxLayers - 1};
constexpr json::Range<int> kPrefetchAfterLayer{-1, kPlanMaxLayers - 1};
constexpr json::Range<int> kSaveLag{1, kPlanMaxLayers};
constexpr json::Range<int> kSaveWaitBeforeLayer{-1, kPlanMaxLayers};
constexpr json::Range<int> kSchemaVersion{0, std::numeric_limits<int>::max()};

// Old name -> new name (issue 10: moe_chunks also chunks dense FFNs).
constexpr std::pair<std::string_view, std::string_view> kRenamedLayerFields[] = {
    {"moe_chunks", "ffn_chunks"},
};

// The protocol fields a layer gives (Note [Runtime protocol]); the reader fills in the others.
struct ProtocolGiven {
  bool save_wait_before_layer = false;
  bool prefetch_after_layer = false;
};

absl::StatusOr<LayerPlan> ReadLayer(const json::Json& value, const std::string& path,
                                    ProtocolGiven* given) {
  absl::StatusOr<json::Object> object = json::Object::Of(value, std::string(kSource), path);
  if (!object.ok()) return object.status();
  const json::Object& l = *object;
  LayerPlan layer;
  std::string policy;
  STOWAGE_PLAN_RETURN_IF_ERROR(l.Read("index", layer.index, kLayerIndex));
  STOWAGE_PLAN_RETURN_IF_ERROR(l.Read("type", layer.type));
  STOWAGE_PLAN_RETURN_IF_ERROR(l.Read("policy", policy));
  absl::StatusOr<LayerPolicy> parsed = ParseLayerPolicy(policy);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: field '", l.PathOf("policy"), "': ", parsed.status().message()));
  }
  layer.policy = *parsed;
  STOWAGE_PLAN_RETURN_IF_ERROR(l.Read("device_saved_bytes", layer.device_saved_bytes, kBytes));
  STOWAGE_PLAN_RETURN_IF_ERROR(l.Read("host_bytes", layer.host_bytes, kBytes));
  if (l.Has("recompute_modules")) {
    absl::StatusOr<const json::Json*> modules = l.Array("recompute_modules");
    if (!modules.ok()) return modules.status();
    for (size_t k = 0; k < (*modules)->size(); ++k) {
      std::string module;
      STOWAGE_PLAN_RETURN_IF_ERROR(
          json::ReadValue((**modules)[k], kSource,
                          absl::StrCat(l.PathOf("recompute_modules"), "[", k, "]"), module));
      layer.recompute_modules.push_back(std::move(module));
    }
  }
  // Renamed fields: a plan that still uses the old word is refused naming the new one (not ignored
  // as unknown, which would silently drop its value).
  for (const auto& [old_name, new_name] : kRenamedLayerFields) {
    if (l.Has(old_name)) {
      return absl::InvalidArgumentError(absl::StrCat("plan: field '", l.PathOf(old_name),
                                                     "' is now called '", std::string(new_name),
                                                     "'; rename it in the plan"));
    }
  }
  STOWAGE_PLAN_RETURN_IF_ERROR(l.ReadOptional("ffn_chunks", layer.ffn_chunks, kFfnChunks));
  given->save_wait_before_layer = l.Has("save_wait_before_layer");
  given->prefetch_after_layer = l.Has("prefetch_after_layer");
  STOWAGE_PLAN_RETURN_IF_ERROR(
      l.ReadOptional("save_wait_before_layer", layer.save_wait_before_layer, kSaveWaitBeforeLayer));
  STOWAGE_PLAN_RETURN_IF_ERROR(
      l.ReadOptional("prefetch_after_layer", layer.prefetch_after_layer, kPrefetchAfterLayer));
  STOWAGE_PLAN_RETURN_IF_ERROR(l.ReadOptional("forward_seconds", layer.forward_seconds, kSeconds));
  STOWAGE_PLAN_RETURN_IF_ERROR(
      l.ReadOptional("backward_seconds", layer.backward_seconds, kSeconds));
  STOWAGE_PLAN_RETURN_IF_ERROR(
      l.ReadOptional("recompute_seconds", layer.recompute_seconds, kSeconds));
  STOWAGE_PLAN_RETURN_IF_ERROR(l.ReadOptional("d2h_seconds", layer.d2h_seconds, kSeconds));
  STOWAGE_PLAN_RETURN_IF_ERROR(l.ReadOptional("h2d_seconds", layer.h2d_seconds, kSeconds));
  if (l.Has("transfers")) {
    absl::StatusOr<const json::Json*> transfers = l.Array("transfers");
    if (!transfers.ok()) return transfers.status();
    for (size_t k = 0; k < (*transfers)->size(); ++k) {
      absl::StatusOr<json::Object> t = json::Object::Of(
          (**transfers)[k], std::string(kSource), absl::StrCat(l.PathOf("transfers"), "[", k, "]"));
      if (!t.ok()) return t.status();
      PlannedTransfer transfer;
      STOWAGE_PLAN_RETURN_IF_ERROR(t->ReadOptional("name", transfer.name));
      STOWAGE_PLAN_RETURN_IF_ERROR(t->Read("bytes", transfer.bytes, kBytes));
      layer.transfers.push_back(std::move(transfer));
    }
  } else if (layer.host_bytes > 0) {
    // A plan may leave out the transfers of a layer that copies its input as one piece.
    layer.transfers.push_back({"input", layer.host_bytes});
  }
  return layer;
}

// Range errors read like the JSON reader's, so a plan built in code and a plan read from a file
// are refused in the same words.
template <typename T>
absl::Status CheckRange(std::string_view path, T value, json::Range<T> range) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isfinite(value) && value >= range.min && value <= range.max) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrFormat("plan: field '%s' has value %g; allowed: a finite number in [%g, %g]",
                        std::string(path), value, range.min, range.max));
  } else {
    if (value >= range.min && value <= range.max) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("plan: field '", std::string(path), "' has value ", value,
                     "; allowed: an integer in [", range.min, ", ", range.max, "]"));
  }
}

}  // namespace

std::string_view LayerPolicyName(LayerPolicy policy) {
  for (const auto& [p, name] : kPolicyNames) {
    if (p == policy) return name;
  }
  return "unknown";
}

absl::StatusOr<LayerPolicy> ParseLayerPolicy(std::string_view name) {
  for (const auto& [p, n] : kPolicyNames) {
    if (n == name) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown layer policy '", std::string(name),
      "'; allowed: keep, recompute, selective_recompute, offload_input, offload_saved"));
}

LayerProtocol LayerProtocolFor(int layer, int num_layers, bool offloads, int prefetch_distance,
                               int save_lag) {
  LayerProtocol p;
  if (!offloads || layer < 0 || layer >= num_layers) return p;
  // 64-bit sums: a hand-written plan may carry distances near INT_MAX.
  p.save_wait_before_layer =
      static_cast<int>(std::min<int64_t>(int64_t{layer} + std::max(save_lag, 1), num_layers));
  p.prefetch_after_layer = static_cast<int>(
      std::min<int64_t>(int64_t{layer} + std::max(prefetch_distance, 1), num_layers - 1));
  return p;
}

std::string_view StepEventKindName(StepEventKind kind) {
  switch (kind) {
    case StepEventKind::kSaveIssued:
      return "save_issued";
    case StepEventKind::kSaveLanded:
      return "save_landed";
    case StepEventKind::kSaveWait:
      return "save_wait";
    case StepEventKind::kPrefetchIssued:
      return "prefetch_issued";
    case StepEventKind::kPrefetchLanded:
      return "prefetch_landed";
    case StepEventKind::kRestore:
      return "restore";
  }
  return "unknown";
}

bool PolicyOffloads(LayerPolicy policy) {
  return policy == LayerPolicy::kOffloadInput || policy == LayerPolicy::kOffloadSaved;
}

std::string PlanToJson(const Plan& plan) {
  ordered_json j;
  j["schema_version"] = plan.schema_version;
  j["generator"] = plan.generator;
  j["model"] = plan.model;
  j["model_parameters"] = plan.model_parameters;
  j["hardware"] = plan.hardware;
  j["run"] = {{"seq_len", plan.seq_len},
              {"micro_batch", plan.micro_batch},
              {"framework", plan.framework},
              {"tp", plan.tp},
              {"cp", plan.cp},
              {"ep", plan.ep},
              {"gpu_budget_bytes", plan.gpu_budget_bytes},
              {"host_budget_bytes", plan.host_budget_bytes}};
  const PlanPrediction& p = plan.predicted;
  j["predicted"] = {{"peak_device_bytes", p.peak_device_bytes},
                    {"fixed_device_bytes", p.fixed_device_bytes},
                    {"host_bytes_per_gpu", p.host_bytes_per_gpu},
                    {"host_bytes_per_numa_node", p.host_bytes_per_numa_node},
                    {"step_seconds", p.step_seconds},
                    {"exposed_copy_seconds", p.exposed_copy_seconds},
                    {"baseline", p.baseline},
                    {"baseline_step_seconds", p.baseline_step_seconds}};
  const RuntimeSettings& r = plan.runtime;
  j["runtime"] = {{"prefetch_distance", r.prefetch_distance},
                  {"save_lag", r.save_lag},
                  {"host_arena_bytes", r.host_arena_bytes},
                  {"copy_chunk_bytes", r.copy_chunk_bytes},
                  {"gpus_per_numa_node", r.gpus_per_numa_node},
                  {"link_bytes_per_second", r.link_bytes_per_second}};
  ordered_json layers = ordered_json::array();
  for (const LayerPlan& l : plan.layers) {
    ordered_json transfers = ordered_json::array();
    for (const PlannedTransfer& t : l.transfers) {
      transfers.push_back({{"name", t.name}, {"bytes", t.bytes}});
    }
    ordered_json layer = {{"index", l.index},
                          {"type", l.type},
                          {"policy", LayerPolicyName(l.policy)},
                          {"device_saved_bytes", l.device_saved_bytes},
                          {"host_bytes", l.host_bytes},
                          {"transfers", transfers},
                          {"save_wait_before_layer", l.save_wait_before_layer},
                          {"prefetch_after_layer", l.prefetch_after_layer},
                          {"ffn_chunks", l.ffn_chunks},
                          {"forward_seconds", l.forward_seconds},
                          {"backward_seconds", l.backward_seconds},
                          {"recompute_seconds", l.recompute_seconds},
                          {"d2h_seconds", l.d2h_seconds},
                          {"h2d_seconds", l.h2d_seconds}};
    if (!l.recompute_modules.empty()) layer["recompute_modules"] = l.recompute_modules;
    layers.push_back(std::move(layer));
  }
  j["layers"] = std::move(layers);
  return j.dump(2) + "\n";
}

absl::StatusOr<Plan> ParsePlanJson(std::string_view text) {
  absl::StatusOr<json::Json> parsed = json::Parse(text, kSource);
  if (!parsed.ok()) return parsed.status();
  absl::StatusOr<json::Object> root = json::Object::Of(*parsed, std::string(kSource));
  if (!root.ok()) return root.status();
  const json::Object& j = *root;
  Plan plan;
  // The version first: a plan of another schema may differ anywhere else.
  STOWAGE_PLAN_RETURN_IF_ERROR(j.Read("schema_version", plan.schema_version, kSchemaVersion));
  if (plan.schema_version != kPlanSchemaVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: field 'schema_version' is ", plan.schema_version,
                     "; this runtime reads schema_version ", kPlanSchemaVersion));
  }
  STOWAGE_PLAN_RETURN_IF_ERROR(j.ReadOptional("generator", plan.generator));
  STOWAGE_PLAN_RETURN_IF_ERROR(j.ReadOptional("model", plan.model));
  STOWAGE_PLAN_RETURN_IF_ERROR(j.ReadOptional("model_parameters", plan.model_parameters));
  STOWAGE_PLAN_RETURN_IF_ERROR(j.ReadOptional("hardware", plan.hardware));
  if (j.Has("run")) {
    absl::StatusOr<json::Object> run = j.Child("run");
    if (!run.ok()) return run.status();
    STOWAGE_PLAN_RETURN_IF_ERROR(run->ReadOptional("seq_len", plan.seq_len, kSeqLen));
    STOWAGE_PLAN_RETURN_IF_ERROR(run->ReadOptional("micro_batch", plan.micro_batch, kParallel));
    STOWAGE_PLAN_RETURN_IF_ERROR(run->ReadOptional("framework", plan.framework));
    if (plan.framework != "megatron" && plan.framework != "hf") {
      return absl::InvalidArgumentError(absl::StrCat("plan: field 'run.framework' has value '",
                                                     plan.framework, "'; allowed: megatron, hf"));
    }
    STOWAGE_PLAN_RETURN_IF_ERROR(run->ReadOptional("tp", plan.tp, kParallel));
    STOWAGE_PLAN_RETURN_IF_ERROR(run->ReadOptional("cp", plan.cp, kParallel));
    STOWAGE_PLAN_RETURN_IF_ERROR(run->ReadOptional("ep", plan.ep, kParallel));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        run->ReadOptional("gpu_budget_bytes", plan.gpu_budget_bytes, kBytes));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        run->ReadOptional("host_budget_bytes", plan.host_budget_bytes, kBytes));
  }
  {
    absl::StatusOr<json::Object> p = j.Child("predicted");
    if (!p.ok()) return p.status();
    PlanPrediction& out = plan.predicted;
    STOWAGE_PLAN_RETURN_IF_ERROR(p->Read("peak_device_bytes", out.peak_device_bytes, kBytes));
    STOWAGE_PLAN_RETURN_IF_ERROR(p->Read("host_bytes_per_gpu", out.host_bytes_per_gpu, kBytes));
    STOWAGE_PLAN_RETURN_IF_ERROR(p->Read("step_seconds", out.step_seconds, kSeconds));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        p->Read("exposed_copy_seconds", out.exposed_copy_seconds, kSeconds));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        p->ReadOptional("fixed_device_bytes", out.fixed_device_bytes, kBytes));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        p->ReadOptional("host_bytes_per_numa_node", out.host_bytes_per_numa_node, kBytes));
    STOWAGE_PLAN_RETURN_IF_ERROR(p->ReadOptional("baseline", out.baseline));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        p->ReadOptional("baseline_step_seconds", out.baseline_step_seconds, kSeconds));
  }
  if (j.Has("runtime")) {
    absl::StatusOr<json::Object> r = j.Child("runtime");
    if (!r.ok()) return r.status();
    RuntimeSettings& out = plan.runtime;
    STOWAGE_PLAN_RETURN_IF_ERROR(
        r->ReadOptional("prefetch_distance", out.prefetch_distance, kPrefetchDistance));
    STOWAGE_PLAN_RETURN_IF_ERROR(r->ReadOptional("save_lag", out.save_lag, kSaveLag));
    STOWAGE_PLAN_RETURN_IF_ERROR(r->ReadOptional("host_arena_bytes", out.host_arena_bytes, kBytes));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        r->ReadOptional("copy_chunk_bytes", out.copy_chunk_bytes, kCopyChunk));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        r->ReadOptional("gpus_per_numa_node", out.gpus_per_numa_node, kGpusPerNumaNode));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        r->ReadOptional("link_bytes_per_second", out.link_bytes_per_second, kLinkRate));
  }
  absl::StatusOr<const json::Json*> layers = j.Array("layers");
  if (!layers.ok()) return layers.status();
  if ((*layers)->size() > static_cast<size_t>(kPlanMaxLayers)) {
    return absl::InvalidArgumentError(absl::StrCat("plan: field 'layers' has ", (*layers)->size(),
                                                   " layers; allowed: at most ", kPlanMaxLayers));
  }
  plan.layers.reserve((*layers)->size());
  std::vector<ProtocolGiven> given((*layers)->size());
  for (size_t i = 0; i < (*layers)->size(); ++i) {
    absl::StatusOr<LayerPlan> layer =
        ReadLayer((**layers)[i], absl::StrCat("layers[", i, "]"), &given[i]);
    if (!layer.ok()) return layer.status();
    plan.layers.push_back(*std::move(layer));
  }
  // A protocol field a plan leaves out (one written before it existed) is the protocol's value.
  const int n = static_cast<int>(plan.layers.size());
  for (int i = 0; i < n; ++i) {
    LayerPlan& layer = plan.layers[i];
    const LayerProtocol p = LayerProtocolFor(i, n, layer.host_bytes > 0,
                                             plan.runtime.prefetch_distance, plan.runtime.save_lag);
    if (!given[i].save_wait_before_layer) layer.save_wait_before_layer = p.save_wait_before_layer;
    if (!given[i].prefetch_after_layer) layer.prefetch_after_layer = p.prefetch_after_layer;
  }
  STOWAGE_PLAN_RETURN_IF_ERROR(ValidatePlan(plan));
  return plan;
}

absl::StatusOr<Plan> ReadPlanFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open plan file '", path, "'"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto plan = ParsePlanJson(buffer.str());
  if (!plan.ok()) {
    return absl::Status(plan.status().code(), absl::StrCat(path, ": ", plan.status().message()));
  }
  return plan;
}

absl::Status ValidatePlan(const Plan& plan) {
  if (plan.schema_version != kPlanSchemaVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: field 'schema_version' is ", plan.schema_version,
                     "; this runtime reads schema_version ", kPlanSchemaVersion));
  }
  STOWAGE_PLAN_RETURN_IF_ERROR(CheckRange("run.seq_len", plan.seq_len, kSeqLen));
  STOWAGE_PLAN_RETURN_IF_ERROR(CheckRange("run.micro_batch", plan.micro_batch, kParallel));
  STOWAGE_PLAN_RETURN_IF_ERROR(CheckRange("run.tp", plan.tp, kParallel));
  STOWAGE_PLAN_RETURN_IF_ERROR(CheckRange("run.cp", plan.cp, kParallel));
  STOWAGE_PLAN_RETURN_IF_ERROR(CheckRange("run.ep", plan.ep, kParallel));
  STOWAGE_PLAN_RETURN_IF_ERROR(CheckRange("run.gpu_budget_bytes", plan.gpu_budget_bytes, kBytes));
  STOWAGE_PLAN_RETURN_IF_ERROR(CheckRange("run.host_budget_bytes", plan.host_budget_bytes, kBytes));

  const PlanPrediction& p = plan.predicted;
  STOWAGE_PLAN_RETURN_IF_ERROR(
      CheckRange("predicted.peak_device_bytes", p.peak_device_bytes, kBytes));
  STOWAGE_PLAN_RETURN_IF_ERROR(
      CheckRange("predicted.fixed_device_bytes", p.fixed_device_bytes, kBytes));
  STOWAGE_PLAN_RETURN_IF_ERROR(
      CheckRange("predicted.host_bytes_per_gpu", p.host_bytes_per_gpu, kBytes));
  STOWAGE_PLAN_RETURN_IF_ERROR(
      CheckRange("predicted.host_bytes_per_numa_node", p.host_bytes_per_numa_node, kBytes));
  STOWAGE_PLAN_RETURN_IF_ERROR(CheckRange("predicted.step_seconds", p.step_seconds, kSeconds));
  STOWAGE_PLAN_RETURN_IF_ERROR(
      CheckRange("predicted.exposed_copy_seconds", p.exposed_copy_seconds, kSeconds));
  STOWAGE_PLAN_RETURN_IF_ERROR(
      CheckRange("predicted.baseline_step_seconds", p.baseline_step_seconds, kSeconds));

  const RuntimeSettings& r = plan.runtime;
  STOWAGE_PLAN_RETURN_IF_ERROR(
      CheckRange("runtime.prefetch_distance", r.prefetch_distance, kPrefetchDistance));
  STOWAGE_PLAN_RETURN_IF_ERROR(CheckRange("runtime.save_lag", r.save_lag, kSaveLag));
  STOWAGE_PLAN_RETURN_IF_ERROR(CheckRange("runtime.host_arena_bytes", r.host_arena_bytes, kBytes));
  STOWAGE_PLAN_RETURN_IF_ERROR(
      CheckRange("runtime.copy_chunk_bytes", r.copy_chunk_bytes, kCopyChunk));
  STOWAGE_PLAN_RETURN_IF_ERROR(
      CheckRange("runtime.gpus_per_numa_node", r.gpus_per_numa_node, kGpusPerNumaNode));
  STOWAGE_PLAN_RETURN_IF_ERROR(
      CheckRange("runtime.link_bytes_per_second", r.link_bytes_per_second, kLinkRate));
  // One computation of the per-node figure: every GPU of the node holds host_bytes_per_gpu.
  // Both factors are bounded (2^60 and 2^10) but their product is not below 2^64: checked.
  if (p.host_bytes_per_numa_node != 0) {
    const std::optional<uint64_t> per_node =
        CheckedMul<uint64_t>(p.host_bytes_per_gpu, static_cast<uint64_t>(r.gpus_per_numa_node));
    if (!per_node || *per_node != p.host_bytes_per_numa_node) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan: field 'predicted.host_bytes_per_numa_node' has value ", p.host_bytes_per_numa_node,
          "; allowed: 0 (not stated) or predicted.host_bytes_per_gpu (", p.host_bytes_per_gpu,
          ") x runtime.gpus_per_numa_node (", r.gpus_per_numa_node, ")"));
    }
  }

  if (plan.layers.size() > static_cast<size_t>(kPlanMaxLayers)) {
    return absl::InvalidArgumentError(absl::StrCat("plan: field 'layers' has ", plan.layers.size(),
                                                   " layers; allowed: at most ", kPlanMaxLayers));
  }
  const int n = static_cast<int>(plan.layers.size());
  uint64_t host_total = 0;
  for (int i = 0; i < n; ++i) {
    const LayerPlan& l = plan.layers[i];
    const std::string path = absl::StrCat("layers[", i, "]");
    if (l.index != i) {
      return absl::InvalidArgumentError(absl::StrCat("plan: field '", path, ".index' is ", l.index,
                                                     "; layers must be listed in order from 0"));
    }
    if (LayerPolicyName(l.policy) == "unknown") {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan: field '", path, ".policy' is not a policy (", static_cast<int>(l.policy),
          "); allowed: keep, recompute, selective_recompute, offload_input, "
          "offload_saved"));
    }
    STOWAGE_PLAN_RETURN_IF_ERROR(
        CheckRange(absl::StrCat(path, ".ffn_chunks"), l.ffn_chunks, kFfnChunks));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        CheckRange(absl::StrCat(path, ".device_saved_bytes"), l.device_saved_bytes, kBytes));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        CheckRange(absl::StrCat(path, ".host_bytes"), l.host_bytes, kBytes));
    uint64_t transfer_sum = 0;
    for (size_t k = 0; k < l.transfers.size(); ++k) {
      STOWAGE_PLAN_RETURN_IF_ERROR(CheckRange(absl::StrCat(path, ".transfers[", k, "].bytes"),
                                              l.transfers[k].bytes, kBytes));
      const std::optional<uint64_t> sum = CheckedAdd(transfer_sum, l.transfers[k].bytes);
      if (!sum) {
        return absl::InvalidArgumentError(
            absl::StrCat("plan: field '", path, ".transfers' sums past 2^64 bytes at transfers[", k,
                         "]; their sum must equal host_bytes (", l.host_bytes, ")"));
      }
      transfer_sum = *sum;
    }
    if (transfer_sum != l.host_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("plan: field '", path, ".transfers' sum to ",
                                                     transfer_sum, " bytes but host_bytes is ",
                                                     l.host_bytes));
    }
    if (!PolicyOffloads(l.policy) && l.host_bytes != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: field '", path, ".host_bytes' is ", l.host_bytes, " but policy '",
                       std::string(LayerPolicyName(l.policy)),
                       "' offloads nothing; only offload_input and offload_saved may"));
    }
    // Note [Runtime protocol]: the fields are LayerProtocolFor's, so the simulator (which
    // computes them) and the runtime and wrapper (which read them) run one protocol; a prefetch
    // may also be left to the restore (-1).
    const LayerProtocol want = LayerProtocolFor(static_cast<int>(i), static_cast<int>(n),
                                                l.host_bytes > 0, r.prefetch_distance, r.save_lag);
    if (l.save_wait_before_layer != want.save_wait_before_layer) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: field '", path, ".save_wait_before_layer' has value ",
                       l.save_wait_before_layer, "; allowed: ", want.save_wait_before_layer,
                       l.host_bytes > 0 ? " (min(index + runtime.save_lag, number of layers))"
                                        : " (the layer offloads nothing)"));
    }
    if (l.prefetch_after_layer != want.prefetch_after_layer &&
        !(l.host_bytes > 0 && l.prefetch_after_layer == -1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan: field '", path, ".prefetch_after_layer' has value ", l.prefetch_after_layer,
          "; allowed: ",
          l.host_bytes > 0 ? absl::StrCat("-1 (restore on demand) or ", want.prefetch_after_layer,
                                          " (min(index + runtime.prefetch_distance, last layer))")
                           : "-1 (the layer offloads nothing)"));
    }
    for (const auto& [name, seconds] :
         {std::pair<const char*, double>{"forward_seconds", l.forward_seconds},
          {"backward_seconds", l.backward_seconds},
          {"recompute_seconds", l.recompute_seconds},
          {"d2h_seconds", l.d2h_seconds},
          {"h2d_seconds", l.h2d_seconds}}) {
      STOWAGE_PLAN_RETURN_IF_ERROR(CheckRange(absl::StrCat(path, ".", name), seconds, kSeconds));
    }
    const std::optional<uint64_t> total = CheckedAdd(host_total, l.host_bytes);
    if (!total) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: the layers' host_bytes sum past 2^64 bytes at ", path,
                       "; runtime.host_arena_bytes must hold them all"));
    }
    host_total = *total;
  }
  if (r.host_arena_bytes < host_total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: field 'runtime.host_arena_bytes' is ", r.host_arena_bytes,
        " but the layers offload ", host_total, " bytes in all; the arena must hold them"));
  }
  return absl::OkStatus();
}

}  // namespace stowage
