#include "stowage/plan.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/checked_math.h"
#include "base/json_reader.h"
#include "base/status_macros.h"
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


// Errors from reading name the source "plan"; ReadPlanFile puts the file's path in front.
constexpr std::string_view kSource = "plan";

// Each field's range, used by the reader (so a value read from JSON is refused naming its limit)
// and by ValidatePlan (so a plan built in code obeys the same limit).
constexpr json::Range<uint64_t> kBytes{0, kPlanMaxBytes};
constexpr json::Range<double> kSeconds{0, kPlanMaxSeconds};
// A ratio of predicted durations less 1 (PlanPrediction::optimality_gap).
constexpr json::Range<double> kOptimalityGap{0, kPlanMaxSeconds};
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
constexpr json::Range<int> kPipelineStages{1, kPlanMaxPipelineStages};
constexpr json::Range<int> kVirtualStages{1, kPlanMaxVirtualStages};
constexpr json::Range<int> kMicrobatches{1, kPlanMaxMicrobatches};
constexpr json::Range<int> kInFlight{1, kPlanMaxMicrobatches};
constexpr json::Range<int> kStageIndex{0, kPlanMaxPipelineStages - 1};
constexpr json::Range<int> kChunkLayers{0, kPlanMaxLayers};
constexpr json::Range<int> kMtpLayers{0, kPlanMaxMtpLayers};

constexpr std::pair<PipelineSchedule, std::string_view> kScheduleNames[] = {
    {PipelineSchedule::k1F1B, "1f1b"},
    {PipelineSchedule::kInterleaved, "interleaved"},
};

constexpr std::pair<RankOrder, std::string_view> kRankOrderNames[] = {
    {RankOrder::kTpCpEpDpPp, "tp-cp-ep-dp-pp"},
    {RankOrder::kTpCpEpPpDp, "tp-cp-ep-pp-dp"},
};

// Old name -> new name (issue 10: moe_chunks also chunks dense FFNs).
constexpr std::pair<std::string_view, std::string_view> kRenamedLayerFields[] = {
    {"moe_chunks", "ffn_chunks"},
};

// The protocol fields a layer gives (Note [Runtime protocol]); the reader fills in the others.
struct ProtocolGiven {
  bool save_wait_before_layer = false;
  bool prefetch_after_layer = false;
  bool in_flight_microbatches = false;
};

absl::StatusOr<StagePlan> ReadStage(const json::Json& value, const std::string& path,
                                    int prefetch_distance) {
  absl::StatusOr<json::Object> object = json::Object::Of(value, std::string(kSource), path);
  if (!object.ok()) return object.status();
  const json::Object& st = *object;
  StagePlan stage;
  stage.prefetch_distance = prefetch_distance;
  STOWAGE_RETURN_IF_ERROR(st.Read("stage", stage.stage, kStageIndex));
  absl::StatusOr<const json::Json*> chunks = st.Array("chunks");
  if (!chunks.ok()) return chunks.status();
  if ((*chunks)->size() > static_cast<size_t>(kPlanMaxVirtualStages)) {
    return absl::InvalidArgumentError(absl::StrCat("plan: field '", st.PathOf("chunks"), "' has ",
                                                   (*chunks)->size(), " chunks; allowed: at most ",
                                                   kPlanMaxVirtualStages, " (run.vpp)"));
  }
  for (size_t k = 0; k < (*chunks)->size(); ++k) {
    absl::StatusOr<json::Object> c = json::Object::Of(
        (**chunks)[k], std::string(kSource), absl::StrCat(st.PathOf("chunks"), "[", k, "]"));
    if (!c.ok()) return c.status();
    LayerRange range;
    STOWAGE_RETURN_IF_ERROR(c->Read("first_layer", range.first_layer, kLayerIndex));
    STOWAGE_RETURN_IF_ERROR(c->Read("num_layers", range.num_layers, kChunkLayers));
    stage.chunks.push_back(range);
  }
  STOWAGE_RETURN_IF_ERROR(
      st.ReadOptional("prefetch_distance", stage.prefetch_distance, kPrefetchDistance));
  STOWAGE_RETURN_IF_ERROR(st.ReadOptional("embedding", stage.embedding));
  STOWAGE_RETURN_IF_ERROR(st.ReadOptional("lm_head", stage.lm_head));
  STOWAGE_RETURN_IF_ERROR(
      st.ReadOptional("peak_device_bytes", stage.peak_device_bytes, kBytes));
  STOWAGE_RETURN_IF_ERROR(
      st.ReadOptional("fixed_device_bytes", stage.fixed_device_bytes, kBytes));
  STOWAGE_RETURN_IF_ERROR(
      st.ReadOptional("host_bytes_per_gpu", stage.host_bytes_per_gpu, kBytes));
  STOWAGE_RETURN_IF_ERROR(st.ReadOptional("host_arena_bytes", stage.host_arena_bytes, kBytes));
  STOWAGE_RETURN_IF_ERROR(
      st.ReadOptional("microbatch_seconds", stage.microbatch_seconds, kSeconds));
  STOWAGE_RETURN_IF_ERROR(
      st.ReadOptional("exposed_copy_seconds", stage.exposed_copy_seconds, kSeconds));
  STOWAGE_RETURN_IF_ERROR(
      st.ReadOptional("point_to_point_seconds", stage.point_to_point_seconds, kSeconds));
  return stage;
}

absl::StatusOr<LayerPlan> ReadLayer(const json::Json& value, const std::string& path,
                                    ProtocolGiven* given) {
  absl::StatusOr<json::Object> object = json::Object::Of(value, std::string(kSource), path);
  if (!object.ok()) return object.status();
  const json::Object& l = *object;
  LayerPlan layer;
  std::string policy;
  STOWAGE_RETURN_IF_ERROR(l.Read("index", layer.index, kLayerIndex));
  STOWAGE_RETURN_IF_ERROR(l.Read("type", layer.type));
  STOWAGE_RETURN_IF_ERROR(l.ReadOptional("name", layer.name));
  STOWAGE_RETURN_IF_ERROR(l.Read("policy", policy));
  absl::StatusOr<LayerPolicy> parsed = ParseLayerPolicy(policy);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: field '", l.PathOf("policy"), "': ", parsed.status().message()));
  }
  layer.policy = *parsed;
  STOWAGE_RETURN_IF_ERROR(l.Read("device_saved_bytes", layer.device_saved_bytes, kBytes));
  STOWAGE_RETURN_IF_ERROR(l.Read("host_bytes", layer.host_bytes, kBytes));
  if (l.Has("recompute_modules")) {
    absl::StatusOr<const json::Json*> modules = l.Array("recompute_modules");
    if (!modules.ok()) return modules.status();
    for (size_t k = 0; k < (*modules)->size(); ++k) {
      std::string module;
      STOWAGE_RETURN_IF_ERROR(
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
  STOWAGE_RETURN_IF_ERROR(l.ReadOptional("ffn_chunks", layer.ffn_chunks, kFfnChunks));
  given->save_wait_before_layer = l.Has("save_wait_before_layer");
  given->prefetch_after_layer = l.Has("prefetch_after_layer");
  given->in_flight_microbatches = l.Has("in_flight_microbatches");
  STOWAGE_RETURN_IF_ERROR(
      l.ReadOptional("in_flight_microbatches", layer.in_flight_microbatches, kInFlight));
  STOWAGE_RETURN_IF_ERROR(
      l.ReadOptional("save_wait_before_layer", layer.save_wait_before_layer, kSaveWaitBeforeLayer));
  STOWAGE_RETURN_IF_ERROR(
      l.ReadOptional("prefetch_after_layer", layer.prefetch_after_layer, kPrefetchAfterLayer));
  STOWAGE_RETURN_IF_ERROR(l.ReadOptional("forward_seconds", layer.forward_seconds, kSeconds));
  STOWAGE_RETURN_IF_ERROR(
      l.ReadOptional("backward_seconds", layer.backward_seconds, kSeconds));
  STOWAGE_RETURN_IF_ERROR(
      l.ReadOptional("recompute_seconds", layer.recompute_seconds, kSeconds));
  STOWAGE_RETURN_IF_ERROR(l.ReadOptional("d2h_seconds", layer.d2h_seconds, kSeconds));
  STOWAGE_RETURN_IF_ERROR(l.ReadOptional("h2d_seconds", layer.h2d_seconds, kSeconds));
  if (l.Has("transfers")) {
    absl::StatusOr<const json::Json*> transfers = l.Array("transfers");
    if (!transfers.ok()) return transfers.status();
    for (size_t k = 0; k < (*transfers)->size(); ++k) {
      absl::StatusOr<json::Object> t = json::Object::Of(
          (**transfers)[k], std::string(kSource), absl::StrCat(l.PathOf("transfers"), "[", k, "]"));
      if (!t.ok()) return t.status();
      PlannedTransfer transfer;
      STOWAGE_RETURN_IF_ERROR(t->ReadOptional("name", transfer.name));
      STOWAGE_RETURN_IF_ERROR(t->Read("bytes", transfer.bytes, kBytes));
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

// The run's pipeline fields, each in range and agreeing with the others.
absl::Status CheckPipelineRunFields(PipelineSchedule schedule, int pp, int vpp, int microbatches) {
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.pp", pp, kPipelineStages));
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.vpp", vpp, kVirtualStages));
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.microbatches", microbatches, kMicrobatches));
  const bool interleaved = schedule == PipelineSchedule::kInterleaved;
  if (schedule != PipelineSchedule::k1F1B && !interleaved) {
    return absl::InvalidArgumentError(absl::StrCat("plan: field 'run.schedule' is not a schedule (",
                                                   static_cast<int>(schedule),
                                                   "); allowed: 1f1b, interleaved"));
  }
  if ((vpp > 1) != interleaved) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: field 'run.vpp' has value ", vpp, " with run.schedule '",
                     std::string(PipelineScheduleName(schedule)),
                     "'; allowed: vpp > 1 exactly with the interleaved schedule (1 with 1f1b)"));
  }
  if (interleaved && pp < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: field 'run.pp' has value ", pp,
                     "; the interleaved schedule needs at least 2 stages"));
  }
  if (interleaved && microbatches % pp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: field 'run.microbatches' has value ", microbatches,
                     "; the interleaved schedule runs them in groups of run.pp (", pp,
                     "): allowed: a multiple of ", pp));
  }
  return absl::OkStatus();
}

// Note [Pipeline stages]: the run's pipeline fields agree with each other, and the stages' chunks
// cover the layers in virtual-stage order (chunk c of stage s is virtual stage c x pp + s).
// O(pp x vpp): the reader runs it before walking the layers.
absl::Status CheckStages(const Plan& plan) {
  STOWAGE_RETURN_IF_ERROR(
      CheckPipelineRunFields(plan.schedule, plan.pp, plan.vpp, plan.microbatches));
  if (plan.stages.size() != static_cast<size_t>(plan.pp)) {
    return absl::InvalidArgumentError(absl::StrCat("plan: field 'stages' has ", plan.stages.size(),
                                                   " stages; run.pp is ", plan.pp));
  }
  for (int s = 0; s < plan.pp; ++s) {
    const StagePlan& st = plan.stages[s];
    const std::string path = absl::StrCat("stages[", s, "]");
    if (st.stage != s) {
      return absl::InvalidArgumentError(absl::StrCat("plan: field '", path, ".stage' is ", st.stage,
                                                     "; stages must be listed in order from 0"));
    }
    if (st.chunks.size() != static_cast<size_t>(plan.vpp)) {
      return absl::InvalidArgumentError(absl::StrCat("plan: field '", path, ".chunks' has ",
                                                     st.chunks.size(), " chunks; run.vpp is ",
                                                     plan.vpp));
    }
    if (st.embedding != (s == 0) || st.lm_head != (s == plan.pp - 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan: field '", path, st.embedding != (s == 0) ? ".embedding" : ".lm_head", "' is ",
          (st.embedding != (s == 0) ? st.embedding : st.lm_head) ? "true" : "false",
          "; the embedding runs on the first stage, the LM head and loss on the last"));
    }
    for (const auto& [name, bytes] :
         {std::pair<const char*, uint64_t>{"peak_device_bytes", st.peak_device_bytes},
          {"fixed_device_bytes", st.fixed_device_bytes},
          {"host_bytes_per_gpu", st.host_bytes_per_gpu},
          {"host_arena_bytes", st.host_arena_bytes}}) {
      STOWAGE_RETURN_IF_ERROR(CheckRange(absl::StrCat(path, ".", name), bytes, kBytes));
    }
    STOWAGE_RETURN_IF_ERROR(CheckRange(absl::StrCat(path, ".prefetch_distance"),
                                            st.prefetch_distance, kPrefetchDistance));
    if (plan.pp == 1 && st.prefetch_distance != plan.runtime.prefetch_distance) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: field '", path, ".prefetch_distance' has value ",
                       st.prefetch_distance, "; allowed: runtime.prefetch_distance (",
                       plan.runtime.prefetch_distance, ") in a plan of one stage"));
    }
    STOWAGE_RETURN_IF_ERROR(
        CheckRange(absl::StrCat(path, ".microbatch_seconds"), st.microbatch_seconds, kSeconds));
    STOWAGE_RETURN_IF_ERROR(
        CheckRange(absl::StrCat(path, ".exposed_copy_seconds"), st.exposed_copy_seconds, kSeconds));
    STOWAGE_RETURN_IF_ERROR(CheckRange(absl::StrCat(path, ".point_to_point_seconds"),
                                            st.point_to_point_seconds, kSeconds));
  }
  int64_t next = 0;
  for (int c = 0; c < plan.vpp; ++c) {
    for (int s = 0; s < plan.pp; ++s) {
      const LayerRange& r = plan.stages[s].chunks[c];
      const std::string path = absl::StrCat("stages[", s, "].chunks[", c, "]");
      STOWAGE_RETURN_IF_ERROR(
          CheckRange(absl::StrCat(path, ".num_layers"), r.num_layers, kChunkLayers));
      if (r.first_layer != next) {
        return absl::InvalidArgumentError(
            absl::StrCat("plan: field '", path, ".first_layer' is ", r.first_layer,
                         "; allowed: ", next, " (virtual stage ", int64_t{c} * plan.pp + s,
                         " starts where the one before it ends: chunk c of stage s is virtual "
                         "stage c x pp + s)"));
      }
      next += r.num_layers;
    }
  }
  if (next != static_cast<int64_t>(plan.layers.size())) {
    return absl::InvalidArgumentError(absl::StrCat("plan: field 'stages' chunks cover ", next,
                                                   " layers; the plan has ", plan.layers.size(),
                                                   " (every layer runs on exactly one stage)"));
  }
  return absl::OkStatus();
}

// Note [MTP layers]: the last run.mtp_layers layers are "mtp.0", "mtp.1", ... with an "mtp+" type,
// all in the last virtual stage (the last chunk of the last stage); no other layer is named. The
// stages passed CheckStages.
absl::Status CheckMtpLayers(const Plan& plan) {
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.mtp_layers", plan.mtp_layers, kMtpLayers));
  const int n = static_cast<int>(plan.layers.size());
  if (plan.mtp_layers >= n && plan.mtp_layers > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: field 'run.mtp_layers' is ", plan.mtp_layers, " but the plan has ", n,
        " layers; allowed: fewer than the layers (the MTP layers follow the decoder's)"));
  }
  const int first_mtp = n - plan.mtp_layers;
  for (int i = 0; i < n; ++i) {
    const LayerPlan& l = plan.layers[i];
    const std::string want = i >= first_mtp ? MtpLayerName(i - first_mtp) : std::string();
    if (l.name != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan: field 'layers[", i, "].name' is '", l.name, "'; allowed: ",
          want.empty()
              ? std::string("none (a decoder layer; run.mtp_layers is ")
              : absl::StrCat("'", want, "' (the MTP layers are the last run.mtp_layers = "),
          plan.mtp_layers, want.empty() ? ")" : " layers)"));
    }
    if (i >= first_mtp && !absl::StartsWith(l.type, "mtp+")) {
      return absl::InvalidArgumentError(absl::StrCat("plan: field 'layers[", i, "].type' is '",
                                                     l.type,
                                                     "'; an MTP layer's type starts with 'mtp+'"));
    }
  }
  if (plan.mtp_layers == 0) return absl::OkStatus();
  const StagePlan& last = plan.stages.back();
  const LayerRange chunk = last.chunks.empty() ? LayerRange{} : last.chunks.back();
  if (chunk.first_layer > first_mtp || chunk.end() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: field 'stages[", plan.stages.size() - 1, "].chunks' ends with layers ",
        chunk.first_layer, " to ", chunk.end() - 1, "; the MTP layers ", first_mtp, " to ", n - 1,
        " run in the last chunk of the last stage (Megatron-Core places them there)"));
  }
  return absl::OkStatus();
}

// Where each layer runs; the stages passed CheckStages.
std::vector<LayerPlace> PlacesOfLayers(const Plan& plan) {
  std::vector<LayerPlace> places(plan.layers.size());
  for (const StagePlan& st : plan.stages) {
    for (size_t c = 0; c < st.chunks.size(); ++c) {
      for (int i = st.chunks[c].first_layer; i < st.chunks[c].end(); ++i) {
        places[i] = {st.stage, static_cast<int>(c)};
      }
    }
  }
  return places;
}

// Note [Plans that do not fit]: `fits` and `binding` agree with the budgets and the stages'
// predictions (the stages passed CheckStages).
absl::Status CheckFits(const Plan& plan) {
  const auto over = [&](const std::string& budget, const StagePlan& st) -> std::optional<uint64_t> {
    const bool gpu = budget == "gpu";
    const uint64_t limit = gpu ? plan.gpu_budget_bytes : plan.host_budget_bytes;
    const uint64_t used = gpu ? st.peak_device_bytes : st.host_bytes_per_gpu;
    if (limit == 0 || used <= limit) return std::nullopt;  // 0: no budget stated
    return used - limit;
  };
  if (plan.fits) {
    for (const StagePlan& st : plan.stages) {
      for (const char* budget : {"gpu", "host"}) {
        if (const std::optional<uint64_t> by = over(budget, st); by.has_value()) {
          const bool gpu = std::string(budget) == "gpu";
          return absl::InvalidArgumentError(
              absl::StrCat("plan: field 'fits' is true but stages[", st.stage,
                           gpu ? "].peak_device_bytes (" : "].host_bytes_per_gpu (",
                           gpu ? st.peak_device_bytes : st.host_bytes_per_gpu, ") exceeds run.",
                           gpu ? "gpu_budget_bytes (" : "host_budget_bytes (",
                           gpu ? plan.gpu_budget_bytes : plan.host_budget_bytes, ") by ", *by,
                           " bytes; allowed: false, with a binding naming the budget"));
        }
      }
    }
    return absl::OkStatus();
  }
  const PlanBinding& b = plan.binding;
  if (b.budget != "gpu" && b.budget != "host") {
    return absl::InvalidArgumentError(absl::StrCat("plan: field 'binding.budget' has value '",
                                                   b.budget, "'; allowed: gpu, host"));
  }
  if (b.stage < 0 || static_cast<size_t>(b.stage) >= plan.stages.size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan: field 'binding.stage' has value ",
                                                   b.stage, "; allowed: a stage in [0, ",
                                                   plan.stages.size() - 1, "]"));
  }
  const StagePlan& st = plan.stages[b.stage];
  const std::optional<uint64_t> by = over(b.budget, st);
  const bool gpu = b.budget == "gpu";
  if (by != b.exceeded_by_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: field 'binding.exceeded_by_bytes' has value ", b.exceeded_by_bytes, "; allowed: ",
        by.has_value() ? absl::StrCat(*by) : std::string("none: the budget is not exceeded"),
        " (stages[", b.stage, gpu ? "].peak_device_bytes " : "].host_bytes_per_gpu ",
        gpu ? st.peak_device_bytes : st.host_bytes_per_gpu,
        gpu ? " - run.gpu_budget_bytes " : " - run.host_budget_bytes ",
        gpu ? plan.gpu_budget_bytes : plan.host_budget_bytes, ")"));
  }
  return absl::OkStatus();
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

LayerProtocol LayerProtocolFor(int layer, LayerRange chunk, bool offloads, int prefetch_distance,
                               int save_lag) {
  LayerProtocol p;
  const int64_t end = int64_t{chunk.first_layer} + chunk.num_layers;
  if (!offloads || layer < chunk.first_layer || layer >= end) return p;
  p.save_wait_before_layer =
      static_cast<int>(std::min<int64_t>(int64_t{layer} + std::max(save_lag, 1), end));
  p.prefetch_after_layer =
      static_cast<int>(std::min<int64_t>(int64_t{layer} + std::max(prefetch_distance, 1), end - 1));
  return p;
}

std::string_view PipelineScheduleName(PipelineSchedule schedule) {
  for (const auto& [s, name] : kScheduleNames) {
    if (s == schedule) return name;
  }
  return "unknown";
}

absl::StatusOr<PipelineSchedule> ParsePipelineSchedule(std::string_view name) {
  for (const auto& [s, n] : kScheduleNames) {
    if (n == name) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown pipeline schedule '", std::string(name),
                                                 "'; allowed: 1f1b, interleaved"));
}

std::string_view RankOrderName(RankOrder order) {
  for (const auto& [o, name] : kRankOrderNames) {
    if (o == order) return name;
  }
  return "unknown";
}

absl::StatusOr<RankOrder> ParseRankOrder(std::string_view name) {
  for (const auto& [o, n] : kRankOrderNames) {
    if (n == name) return o;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown rank order '", std::string(name),
                   "'; allowed: tp-cp-ep-dp-pp (Megatron's default, pipeline outermost), "
                   "tp-cp-ep-pp-dp (Megatron's --use-tp-pp-dp-mapping)"));
}

namespace {

// The interleaved schedule's table (Megatron-Core get_schedule_table): the forwards go through
// groups of `group` microbatches (the last one possibly shorter), each group through chunk 0, 1,
// ..., vpp - 1 in turn, chunk-major; the backwards visit the chunks in reverse.
struct InterleavedTable {
  int64_t group = 1;  // microbatch_group_size_per_vp_stage (its default: pp)
  int64_t m = 1;      // microbatches
  int64_t v = 1;      // vpp
  PipelineOp Unit(int64_t unit, bool forward) const {
    const int64_t last_group = (m - 1) / group;
    const int64_t g = std::min(unit / (group * v), last_group);
    const int64_t size = std::min(group, m - g * group);
    const int64_t within = unit - g * group * v;
    const int64_t c = within / size;
    return {forward, static_cast<int>(forward ? c : v - 1 - c),
            static_cast<int>(g * group + within % size)};
  }
};

// Forwards 1F1B runs before its first backward: get_pp_rank_microbatches.
int64_t Warmup1F1B(int pp, int stage, int64_t microbatches) {
  return std::min<int64_t>(pp - stage - 1, microbatches);
}
// ... and the interleaved schedule (forward_backward_pipelining_with_interleaving), of `total`
// units.
int64_t WarmupInterleaved(int pp, int stage, int64_t v, int64_t total) {
  return std::min<int64_t>(2 * (pp - stage - 1) + (v - 1) * pp, total);
}

// Note [Pipeline stages]: the most microbatches of each chunk that `stage` holds at once, walking
// Megatron-Core's order for the stage (PipelineOrder, without building it: microbatches may be
// 2^20). Arguments within ValidatePlan's limits.
std::vector<int> InFlightPerChunk(PipelineSchedule schedule, int pp, int vpp, int microbatches,
                                  int stage) {
  if (pp == 1) return std::vector<int>(vpp, 1);
  if (schedule == PipelineSchedule::k1F1B || vpp == 1) {
    // The warmup forwards, then a forward before each backward: one more is held.
    return std::vector<int>(vpp, static_cast<int>(std::min<int64_t>(
                                     Warmup1F1B(pp, stage, microbatches) + 1, microbatches)));
  }
  const InterleavedTable table{pp, microbatches, vpp};
  const int64_t total = table.m * table.v;
  const int64_t warmup = WarmupInterleaved(pp, stage, table.v, total);
  std::vector<int> held(vpp, 0), most(vpp, 0);
  auto forward = [&](int64_t unit) {
    const int c = table.Unit(unit, true).chunk;
    most[c] = std::max(most[c], ++held[c]);
  };
  for (int64_t u = 0; u < warmup; ++u) forward(u);
  // Steady state: forward warmup + k, then backward k. With every group full the counts repeat
  // every group x vpp steps (both orders advance by one group of each chunk), so one period shows
  // the most; the cooldown only releases.
  const int64_t steady = total - warmup;
  const int64_t walk =
      table.m % table.group == 0 ? std::min(steady, table.group * table.v) : steady;
  for (int64_t k = 0; k < walk; ++k) {
    forward(warmup + k);
    --held[table.Unit(k, false).chunk];
  }
  for (int& c : most) c = std::max(c, 1);
  return most;
}

bool PipelineArgsInRange(int pp, int vpp, int microbatches) {
  return pp >= 1 && pp <= kPlanMaxPipelineStages && vpp >= 1 && vpp <= kPlanMaxVirtualStages &&
         microbatches >= 1 && microbatches <= kPlanMaxMicrobatches;
}

// InFlightMicrobatches of every stage's chunks, each stage's schedule walked once (the stages
// passed CheckStages): [stage][chunk].
std::vector<std::vector<int>> InFlightOfStages(const Plan& plan) {
  std::vector<std::vector<int>> out;
  for (int s = 0; s < plan.pp; ++s) {
    out.push_back(InFlightPerChunk(plan.schedule, plan.pp, plan.vpp, plan.microbatches, s));
  }
  return out;
}

}  // namespace

int InFlightMicrobatches(PipelineSchedule schedule, int pp, int vpp, int microbatches, int stage,
                         int chunk) {
  if (!PipelineArgsInRange(pp, vpp, microbatches) || stage < 0 || stage >= pp || chunk < 0 ||
      chunk >= vpp) {
    return 1;
  }
  return InFlightPerChunk(schedule, pp, vpp, microbatches, stage)[chunk];
}

absl::Status CheckPipelineRun(PipelineSchedule schedule, int pp, int vpp, int microbatches) {
  return CheckPipelineRunFields(schedule, pp, vpp, microbatches);
}

std::vector<PipelineOp> PipelineOrder(PipelineSchedule schedule, int pp, int vpp, int microbatches,
                                      int stage) {
  std::vector<PipelineOp> order;
  if (!PipelineArgsInRange(pp, vpp, microbatches) || stage < 0 || stage >= pp) return order;
  order.reserve(2 * static_cast<size_t>(microbatches) * static_cast<size_t>(vpp));
  if (pp == 1) {
    // Gradient accumulation: each microbatch through every chunk and back before the next.
    for (int k = 0; k < microbatches; ++k) {
      for (int c = 0; c < vpp; ++c) order.push_back({true, c, k});
      for (int c = vpp - 1; c >= 0; --c) order.push_back({false, c, k});
    }
    return order;
  }
  if (schedule == PipelineSchedule::k1F1B || vpp == 1) {
    const int warmup = static_cast<int>(Warmup1F1B(pp, stage, microbatches));
    for (int k = 0; k < warmup; ++k) order.push_back({true, 0, k});
    for (int k = 0; k < microbatches - warmup; ++k) {
      order.push_back({true, 0, warmup + k});
      order.push_back({false, 0, k});
    }
    for (int k = microbatches - warmup; k < microbatches; ++k) order.push_back({false, 0, k});
    return order;
  }
  const InterleavedTable table{pp, microbatches, vpp};
  const int64_t total = table.m * table.v;
  const int64_t warmup = WarmupInterleaved(pp, stage, table.v, total);
  for (int64_t u = 0; u < warmup; ++u) order.push_back(table.Unit(u, true));
  for (int64_t k = 0; k < total - warmup; ++k) {
    order.push_back(table.Unit(warmup + k, true));
    order.push_back(table.Unit(k, false));
  }
  for (int64_t k = total - warmup; k < total; ++k) order.push_back(table.Unit(k, false));
  return order;
}

StagePlan StageWithoutPipeline(const Plan& plan) {
  StagePlan stage;
  stage.stage = 0;
  stage.chunks = {{0, static_cast<int>(plan.layers.size())}};
  stage.embedding = stage.lm_head = true;
  stage.prefetch_distance = plan.runtime.prefetch_distance;
  stage.peak_device_bytes = plan.predicted.peak_device_bytes;
  stage.fixed_device_bytes = plan.predicted.fixed_device_bytes;
  stage.host_bytes_per_gpu = plan.predicted.host_bytes_per_gpu;
  stage.host_arena_bytes = plan.runtime.host_arena_bytes;
  stage.microbatch_seconds = plan.predicted.step_seconds / std::max(1, plan.microbatches);
  stage.exposed_copy_seconds = plan.predicted.exposed_copy_seconds / std::max(1, plan.microbatches);
  return stage;
}

std::vector<StagePlan> PlanStages(const Plan& plan) {
  if (plan.stages.empty() && plan.pp == 1) return {StageWithoutPipeline(plan)};
  return plan.stages;
}

LayerPlace PlaceOfLayer(const Plan& plan, int layer) {
  for (const StagePlan& stage : PlanStages(plan)) {
    for (size_t c = 0; c < stage.chunks.size(); ++c) {
      const LayerRange& r = stage.chunks[c];
      if (layer >= r.first_layer && int64_t{layer} < int64_t{r.first_layer} + r.num_layers) {
        return {stage.stage, static_cast<int>(c)};
      }
    }
  }
  return {};
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

std::string MtpLayerName(int depth) { return absl::StrCat("mtp.", depth); }

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
              {"pp", plan.pp},
              {"vpp", plan.vpp},
              {"schedule", PipelineScheduleName(plan.schedule)},
              {"microbatches", plan.microbatches}};
  // Written only when MTP is trained (Note [MTP layers]): other plans keep their bytes and hash.
  if (plan.mtp_layers != 0) j["run"]["mtp_layers"] = plan.mtp_layers;
  if (plan.rank_order != RankOrder::kTpCpEpDpPp) {
    j["run"]["rank_order"] = RankOrderName(plan.rank_order);
  }
  j["run"]["gpu_budget_bytes"] = plan.gpu_budget_bytes;
  j["run"]["host_budget_bytes"] = plan.host_budget_bytes;
  // Note [Plans that do not fit]: every plan says whether it fits; one that does not says why.
  j["fits"] = plan.fits;
  if (!plan.fits) {
    const PlanBinding& b = plan.binding;
    j["binding"] = {{"budget", b.budget}, {"exceeded_by_bytes", b.exceeded_by_bytes},
                    {"stage", b.stage},   {"at", b.at},
                    {"what", b.what},     {"explanation", b.explanation}};
  }
  const PlanPrediction& p = plan.predicted;
  j["predicted"] = {{"peak_device_bytes", p.peak_device_bytes},
                    {"fixed_device_bytes", p.fixed_device_bytes},
                    {"host_bytes_per_gpu", p.host_bytes_per_gpu},
                    {"host_bytes_per_numa_node", p.host_bytes_per_numa_node},
                    {"step_seconds", p.step_seconds},
                    {"exposed_copy_seconds", p.exposed_copy_seconds},
                    {"baseline", p.baseline},
                    {"baseline_step_seconds", p.baseline_step_seconds},
                    {"unoverlapped_step_seconds", p.unoverlapped_step_seconds},
                    {"exposed_point_to_point_seconds", p.exposed_point_to_point_seconds},
                    {"optimality", p.optimality},
                    {"optimality_gap", p.optimality_gap}};
  const RuntimeSettings& r = plan.runtime;
  j["runtime"] = {{"prefetch_distance", r.prefetch_distance},
                  {"save_lag", r.save_lag},
                  {"host_arena_bytes", r.host_arena_bytes},
                  {"copy_chunk_bytes", r.copy_chunk_bytes},
                  {"gpus_per_numa_node", r.gpus_per_numa_node},
                  {"link_bytes_per_second", r.link_bytes_per_second}};
  ordered_json stages = ordered_json::array();
  for (const StagePlan& st : PlanStages(plan)) {
    ordered_json chunks = ordered_json::array();
    for (const LayerRange& c : st.chunks) {
      chunks.push_back({{"first_layer", c.first_layer}, {"num_layers", c.num_layers}});
    }
    stages.push_back({{"stage", st.stage},
                      {"chunks", chunks},
                      {"prefetch_distance", st.prefetch_distance},
                      {"embedding", st.embedding},
                      {"lm_head", st.lm_head},
                      {"peak_device_bytes", st.peak_device_bytes},
                      {"fixed_device_bytes", st.fixed_device_bytes},
                      {"host_bytes_per_gpu", st.host_bytes_per_gpu},
                      {"host_arena_bytes", st.host_arena_bytes},
                      {"microbatch_seconds", st.microbatch_seconds},
                      {"exposed_copy_seconds", st.exposed_copy_seconds},
                      {"point_to_point_seconds", st.point_to_point_seconds}});
  }
  j["stages"] = std::move(stages);
  ordered_json layers = ordered_json::array();
  for (const LayerPlan& l : plan.layers) {
    ordered_json transfers = ordered_json::array();
    for (const PlannedTransfer& t : l.transfers) {
      transfers.push_back({{"name", t.name}, {"bytes", t.bytes}});
    }
    ordered_json layer = {{"index", l.index}, {"type", l.type}};
    // Only MTP layers are named (Note [MTP layers]): a plan without them reads as before.
    if (!l.name.empty()) layer["name"] = l.name;
    layer["policy"] = LayerPolicyName(l.policy);
    layer["device_saved_bytes"] = l.device_saved_bytes;
    layer["host_bytes"] = l.host_bytes;
    layer["transfers"] = transfers;
    layer["save_wait_before_layer"] = l.save_wait_before_layer;
    layer["prefetch_after_layer"] = l.prefetch_after_layer;
    layer["in_flight_microbatches"] = l.in_flight_microbatches;
    layer["ffn_chunks"] = l.ffn_chunks;
    layer["forward_seconds"] = l.forward_seconds;
    layer["backward_seconds"] = l.backward_seconds;
    layer["recompute_seconds"] = l.recompute_seconds;
    layer["d2h_seconds"] = l.d2h_seconds;
    layer["h2d_seconds"] = l.h2d_seconds;
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
  STOWAGE_RETURN_IF_ERROR(j.Read("schema_version", plan.schema_version, kSchemaVersion));
  if (plan.schema_version != kPlanSchemaVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: field 'schema_version' is ", plan.schema_version,
                     "; this runtime reads schema_version ", kPlanSchemaVersion));
  }
  STOWAGE_RETURN_IF_ERROR(j.ReadOptional("generator", plan.generator));
  STOWAGE_RETURN_IF_ERROR(j.ReadOptional("model", plan.model));
  STOWAGE_RETURN_IF_ERROR(j.ReadOptional("model_parameters", plan.model_parameters));
  STOWAGE_RETURN_IF_ERROR(j.ReadOptional("hardware", plan.hardware));
  if (j.Has("run")) {
    absl::StatusOr<json::Object> run = j.Child("run");
    if (!run.ok()) return run.status();
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("seq_len", plan.seq_len, kSeqLen));
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("micro_batch", plan.micro_batch, kParallel));
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("framework", plan.framework));
    if (plan.framework != "megatron" && plan.framework != "hf") {
      return absl::InvalidArgumentError(absl::StrCat("plan: field 'run.framework' has value '",
                                                     plan.framework, "'; allowed: megatron, hf"));
    }
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("tp", plan.tp, kParallel));
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("cp", plan.cp, kParallel));
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("ep", plan.ep, kParallel));
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("pp", plan.pp, kPipelineStages));
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("vpp", plan.vpp, kVirtualStages));
    std::string schedule(PipelineScheduleName(plan.schedule));
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("schedule", schedule));
    absl::StatusOr<PipelineSchedule> parsed_schedule = ParsePipelineSchedule(schedule);
    if (!parsed_schedule.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("plan: field 'run.schedule' has value '",
                                                     schedule, "'; allowed: 1f1b, interleaved"));
    }
    plan.schedule = *parsed_schedule;
    STOWAGE_RETURN_IF_ERROR(
        run->ReadOptional("microbatches", plan.microbatches, kMicrobatches));
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("mtp_layers", plan.mtp_layers, kMtpLayers));
    std::string rank_order(RankOrderName(plan.rank_order));
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("rank_order", rank_order));
    absl::StatusOr<RankOrder> parsed_order = ParseRankOrder(rank_order);
    if (!parsed_order.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: field 'run.rank_order' has value '", rank_order,
                       "'; allowed: tp-cp-ep-dp-pp, tp-cp-ep-pp-dp (Megatron's rank orders)"));
    }
    plan.rank_order = *parsed_order;
    STOWAGE_RETURN_IF_ERROR(
        run->ReadOptional("gpu_budget_bytes", plan.gpu_budget_bytes, kBytes));
    STOWAGE_RETURN_IF_ERROR(
        run->ReadOptional("host_budget_bytes", plan.host_budget_bytes, kBytes));
  }
  STOWAGE_RETURN_IF_ERROR(j.ReadOptional("fits", plan.fits));
  if (!plan.fits) {
    // A plan that does not fit says why (Note [Plans that do not fit]); one that fits needs no
    // binding, and any it carries is ignored like an unknown field.
    absl::StatusOr<json::Object> b = j.Child("binding");
    if (!b.ok()) return b.status();
    PlanBinding& out = plan.binding;
    STOWAGE_RETURN_IF_ERROR(b->Read("budget", out.budget));
    STOWAGE_RETURN_IF_ERROR(b->Read("exceeded_by_bytes", out.exceeded_by_bytes, kBytes));
    STOWAGE_RETURN_IF_ERROR(b->ReadOptional("stage", out.stage, kStageIndex));
    STOWAGE_RETURN_IF_ERROR(b->ReadOptional("at", out.at));
    STOWAGE_RETURN_IF_ERROR(b->ReadOptional("what", out.what));
    STOWAGE_RETURN_IF_ERROR(b->ReadOptional("explanation", out.explanation));
  }
  {
    absl::StatusOr<json::Object> p = j.Child("predicted");
    if (!p.ok()) return p.status();
    PlanPrediction& out = plan.predicted;
    STOWAGE_RETURN_IF_ERROR(p->Read("peak_device_bytes", out.peak_device_bytes, kBytes));
    STOWAGE_RETURN_IF_ERROR(p->Read("host_bytes_per_gpu", out.host_bytes_per_gpu, kBytes));
    STOWAGE_RETURN_IF_ERROR(p->Read("step_seconds", out.step_seconds, kSeconds));
    STOWAGE_RETURN_IF_ERROR(
        p->Read("exposed_copy_seconds", out.exposed_copy_seconds, kSeconds));
    STOWAGE_RETURN_IF_ERROR(
        p->ReadOptional("fixed_device_bytes", out.fixed_device_bytes, kBytes));
    STOWAGE_RETURN_IF_ERROR(
        p->ReadOptional("host_bytes_per_numa_node", out.host_bytes_per_numa_node, kBytes));
    STOWAGE_RETURN_IF_ERROR(p->ReadOptional("baseline", out.baseline));
    STOWAGE_RETURN_IF_ERROR(
        p->ReadOptional("baseline_step_seconds", out.baseline_step_seconds, kSeconds));
    STOWAGE_RETURN_IF_ERROR(
        p->ReadOptional("unoverlapped_step_seconds", out.unoverlapped_step_seconds, kSeconds));
    STOWAGE_RETURN_IF_ERROR(p->ReadOptional("exposed_point_to_point_seconds",
                                                 out.exposed_point_to_point_seconds, kSeconds));
    STOWAGE_RETURN_IF_ERROR(p->ReadOptional("optimality", out.optimality));
    STOWAGE_RETURN_IF_ERROR(
        p->ReadOptional("optimality_gap", out.optimality_gap, kOptimalityGap));
  }
  if (j.Has("runtime")) {
    absl::StatusOr<json::Object> r = j.Child("runtime");
    if (!r.ok()) return r.status();
    RuntimeSettings& out = plan.runtime;
    STOWAGE_RETURN_IF_ERROR(
        r->ReadOptional("prefetch_distance", out.prefetch_distance, kPrefetchDistance));
    STOWAGE_RETURN_IF_ERROR(r->ReadOptional("save_lag", out.save_lag, kSaveLag));
    STOWAGE_RETURN_IF_ERROR(r->ReadOptional("host_arena_bytes", out.host_arena_bytes, kBytes));
    STOWAGE_RETURN_IF_ERROR(
        r->ReadOptional("copy_chunk_bytes", out.copy_chunk_bytes, kCopyChunk));
    STOWAGE_RETURN_IF_ERROR(
        r->ReadOptional("gpus_per_numa_node", out.gpus_per_numa_node, kGpusPerNumaNode));
    STOWAGE_RETURN_IF_ERROR(
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
  // Note [Pipeline stages]: a plan without stages (one written before they existed) has the one
  // stage of every layer; a pipelined plan must say which stage runs what.
  if (j.Has("stages")) {
    absl::StatusOr<const json::Json*> stages = j.Array("stages");
    if (!stages.ok()) return stages.status();
    if ((*stages)->size() > static_cast<size_t>(kPlanMaxPipelineStages)) {
      return absl::InvalidArgumentError(absl::StrCat("plan: field 'stages' has ", (*stages)->size(),
                                                     " stages; allowed: at most ",
                                                     kPlanMaxPipelineStages, " (run.pp)"));
    }
    for (size_t s = 0; s < (*stages)->size(); ++s) {
      absl::StatusOr<StagePlan> stage =
          ReadStage((**stages)[s], absl::StrCat("stages[", s, "]"), plan.runtime.prefetch_distance);
      if (!stage.ok()) return stage.status();
      plan.stages.push_back(*std::move(stage));
    }
  } else if (plan.pp > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: field 'stages' is missing; a plan with run.pp = ", plan.pp,
                     " lists its ", plan.pp, " stages (the layers each runs)"));
  } else {
    plan.stages.push_back(StageWithoutPipeline(plan));
  }
  // A protocol or in-flight field a plan leaves out (one written before it existed) is the
  // protocol's (the schedule's) value.
  STOWAGE_RETURN_IF_ERROR(CheckStages(plan));
  const std::vector<LayerPlace> places = PlacesOfLayers(plan);
  const std::vector<std::vector<int>> in_flight = InFlightOfStages(plan);
  const int n = static_cast<int>(plan.layers.size());
  for (int i = 0; i < n; ++i) {
    LayerPlan& layer = plan.layers[i];
    const LayerPlace place = places[i];
    const StagePlan& stage = plan.stages[place.stage];
    const LayerProtocol p = LayerProtocolFor(i, stage.chunks[place.chunk], layer.host_bytes > 0,
                                             stage.prefetch_distance, plan.runtime.save_lag);
    if (!given[i].save_wait_before_layer) layer.save_wait_before_layer = p.save_wait_before_layer;
    if (!given[i].prefetch_after_layer) layer.prefetch_after_layer = p.prefetch_after_layer;
    if (!given[i].in_flight_microbatches) {
      layer.in_flight_microbatches = in_flight[place.stage][place.chunk];
    }
  }
  STOWAGE_RETURN_IF_ERROR(ValidatePlan(plan));
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
  // A plan built in code without stages and without pipeline parallelism has the one stage.
  if (plan.stages.empty() && plan.pp == 1) {
    Plan staged = plan;
    staged.stages = PlanStages(plan);
    return ValidatePlan(staged);
  }
  if (plan.schema_version != kPlanSchemaVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: field 'schema_version' is ", plan.schema_version,
                     "; this runtime reads schema_version ", kPlanSchemaVersion));
  }
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.seq_len", plan.seq_len, kSeqLen));
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.micro_batch", plan.micro_batch, kParallel));
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.tp", plan.tp, kParallel));
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.cp", plan.cp, kParallel));
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.ep", plan.ep, kParallel));
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.gpu_budget_bytes", plan.gpu_budget_bytes, kBytes));
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.host_budget_bytes", plan.host_budget_bytes, kBytes));

  const PlanPrediction& p = plan.predicted;
  STOWAGE_RETURN_IF_ERROR(
      CheckRange("predicted.peak_device_bytes", p.peak_device_bytes, kBytes));
  STOWAGE_RETURN_IF_ERROR(
      CheckRange("predicted.fixed_device_bytes", p.fixed_device_bytes, kBytes));
  STOWAGE_RETURN_IF_ERROR(
      CheckRange("predicted.host_bytes_per_gpu", p.host_bytes_per_gpu, kBytes));
  STOWAGE_RETURN_IF_ERROR(
      CheckRange("predicted.host_bytes_per_numa_node", p.host_bytes_per_numa_node, kBytes));
  STOWAGE_RETURN_IF_ERROR(CheckRange("predicted.step_seconds", p.step_seconds, kSeconds));
  STOWAGE_RETURN_IF_ERROR(
      CheckRange("predicted.exposed_copy_seconds", p.exposed_copy_seconds, kSeconds));
  STOWAGE_RETURN_IF_ERROR(
      CheckRange("predicted.baseline_step_seconds", p.baseline_step_seconds, kSeconds));
  STOWAGE_RETURN_IF_ERROR(
      CheckRange("predicted.unoverlapped_step_seconds", p.unoverlapped_step_seconds, kSeconds));
  STOWAGE_RETURN_IF_ERROR(CheckRange("predicted.exposed_point_to_point_seconds",
                                          p.exposed_point_to_point_seconds, kSeconds));
  STOWAGE_RETURN_IF_ERROR(
      CheckRange("predicted.optimality_gap", p.optimality_gap, kOptimalityGap));
  if (!p.optimality.empty() && p.optimality != "proven" && p.optimality != "within_gap" &&
      p.optimality != "unproven") {
    return absl::InvalidArgumentError(absl::StrCat("predicted.optimality is '", p.optimality,
                                                   "'; allowed: proven, within_gap, unproven"));
  }

  const RuntimeSettings& r = plan.runtime;
  STOWAGE_RETURN_IF_ERROR(
      CheckRange("runtime.prefetch_distance", r.prefetch_distance, kPrefetchDistance));
  STOWAGE_RETURN_IF_ERROR(CheckRange("runtime.save_lag", r.save_lag, kSaveLag));
  STOWAGE_RETURN_IF_ERROR(CheckRange("runtime.host_arena_bytes", r.host_arena_bytes, kBytes));
  STOWAGE_RETURN_IF_ERROR(
      CheckRange("runtime.copy_chunk_bytes", r.copy_chunk_bytes, kCopyChunk));
  STOWAGE_RETURN_IF_ERROR(
      CheckRange("runtime.gpus_per_numa_node", r.gpus_per_numa_node, kGpusPerNumaNode));
  STOWAGE_RETURN_IF_ERROR(
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
  STOWAGE_RETURN_IF_ERROR(CheckStages(plan));
  STOWAGE_RETURN_IF_ERROR(CheckMtpLayers(plan));
  const std::vector<LayerPlace> places = PlacesOfLayers(plan);
  const std::vector<std::vector<int>> in_flight_of = InFlightOfStages(plan);
  const int n = static_cast<int>(plan.layers.size());
  // Per stage: every byte its layers offload, each in-flight microbatch its own copy.
  std::vector<uint64_t> stage_host(plan.stages.size(), 0);
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
    STOWAGE_RETURN_IF_ERROR(
        CheckRange(absl::StrCat(path, ".ffn_chunks"), l.ffn_chunks, kFfnChunks));
    STOWAGE_RETURN_IF_ERROR(
        CheckRange(absl::StrCat(path, ".device_saved_bytes"), l.device_saved_bytes, kBytes));
    STOWAGE_RETURN_IF_ERROR(
        CheckRange(absl::StrCat(path, ".host_bytes"), l.host_bytes, kBytes));
    uint64_t transfer_sum = 0;
    for (size_t k = 0; k < l.transfers.size(); ++k) {
      STOWAGE_RETURN_IF_ERROR(CheckRange(absl::StrCat(path, ".transfers[", k, "].bytes"),
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
    const LayerPlace place = places[i];
    const StagePlan& stage = plan.stages[place.stage];
    const LayerProtocol want = LayerProtocolFor(i, stage.chunks[place.chunk], l.host_bytes > 0,
                                                stage.prefetch_distance, r.save_lag);
    if (l.save_wait_before_layer != want.save_wait_before_layer) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan: field '", path, ".save_wait_before_layer' has value ", l.save_wait_before_layer,
          "; allowed: ", want.save_wait_before_layer,
          l.host_bytes > 0 ? (plan.pp == 1 ? " (min(index + runtime.save_lag, number of layers))"
                                           : " (min(index + runtime.save_lag, end of its chunk))")
                           : " (the layer offloads nothing)"));
    }
    if (l.prefetch_after_layer != want.prefetch_after_layer &&
        !(l.host_bytes > 0 && l.prefetch_after_layer == -1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan: field '", path, ".prefetch_after_layer' has value ", l.prefetch_after_layer,
          "; allowed: ",
          l.host_bytes > 0
              ? absl::StrCat("-1 (restore on demand) or ", want.prefetch_after_layer,
                             plan.pp == 1 ? " (min(index + runtime.prefetch_distance, last layer))"
                                          : " (min(index + runtime.prefetch_distance, "
                                            "last layer of its chunk))")
              : "-1 (the layer offloads nothing)"));
    }
    for (const auto& [name, seconds] :
         {std::pair<const char*, double>{"forward_seconds", l.forward_seconds},
          {"backward_seconds", l.backward_seconds},
          {"recompute_seconds", l.recompute_seconds},
          {"d2h_seconds", l.d2h_seconds},
          {"h2d_seconds", l.h2d_seconds}}) {
      STOWAGE_RETURN_IF_ERROR(CheckRange(absl::StrCat(path, ".", name), seconds, kSeconds));
    }
    STOWAGE_RETURN_IF_ERROR(CheckRange(absl::StrCat(path, ".in_flight_microbatches"),
                                            l.in_flight_microbatches, kInFlight));
    const int in_flight = in_flight_of[place.stage][place.chunk];
    if (l.in_flight_microbatches != in_flight) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan: field '", path, ".in_flight_microbatches' has value ", l.in_flight_microbatches,
          "; allowed: ", in_flight, " (what the ", std::string(PipelineScheduleName(plan.schedule)),
          " schedule holds of chunk ", place.chunk, " of stage ", place.stage, " with run.pp ",
          plan.pp, ", run.microbatches ", plan.microbatches, ")"));
    }
    const std::optional<uint64_t> copies =
        CheckedMul<uint64_t>(l.host_bytes, static_cast<uint64_t>(l.in_flight_microbatches));
    const std::optional<uint64_t> total =
        copies ? CheckedAdd(stage_host[place.stage], *copies) : std::nullopt;
    if (!total) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: the layers' host_bytes sum past 2^64 bytes at ", path,
                       " (each x its in_flight_microbatches, over stage ", place.stage,
                       "'s layers); runtime.host_arena_bytes must hold them all"));
    }
    stage_host[place.stage] = *total;
  }
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    if (r.host_arena_bytes < stage_host[s]) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: field 'runtime.host_arena_bytes' is ", r.host_arena_bytes,
                       plan.pp == 1 ? std::string(" but the layers offload ")
                                    : absl::StrCat(" but the layers of stage ", s, " offload "),
                       stage_host[s], " bytes in all; the arena must hold them"));
    }
    if (plan.stages[s].host_arena_bytes < stage_host[s]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan: field 'stages[", s, "].host_arena_bytes' is ", plan.stages[s].host_arena_bytes,
          " but the stage's layers offload ", stage_host[s],
          " bytes in all (host_bytes x in_flight_microbatches); the arena must hold them"));
    }
  }
  return CheckFits(plan);
}

}  // namespace stowage
