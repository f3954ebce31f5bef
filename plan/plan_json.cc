// The plan's one JSON writer (PlanToJson) and its one strict reader (ParsePlanJson,
// ReadPlanFile), which fills in the fields an older plan leaves out and then validates the plan.
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/json_reader.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "plan/plan_checks.h"
#include "stowage/plan.h"

namespace stowage {

using plan_internal::CheckStages;
using plan_internal::InFlightOfStages;
using plan_internal::kBytes;
using plan_internal::kChunkLayers;
using plan_internal::kCopyChunk;
using plan_internal::kFfnChunks;
using plan_internal::kGlobalBatch;
using plan_internal::kGpus;
using plan_internal::kGpusPerNumaNode;
using plan_internal::kInFlight;
using plan_internal::kLayerIndex;
using plan_internal::kLinkRate;
using plan_internal::kMicrobatches;
using plan_internal::kMtpLayers;
using plan_internal::kOptimalityGap;
using plan_internal::kParallel;
using plan_internal::kPipelineStages;
using plan_internal::kPrefetchAfterLayer;
using plan_internal::kPrefetchDistance;
using plan_internal::kSaveLag;
using plan_internal::kSaveWaitBeforeLayer;
using plan_internal::kSchemaVersion;
using plan_internal::kSeconds;
using plan_internal::kSeqLen;
using plan_internal::kStageIndex;
using plan_internal::kVirtualStages;
using plan_internal::PlacesOfLayers;

namespace {

using nlohmann::ordered_json;

// Errors from reading name the source "plan"; ReadPlanFile puts the file's path in front.
constexpr std::string_view kSource = "plan";

// What a plan's text may hold, checked while it is read (Note [JSON limits while reading] in
// base/json_reader.cc): no array of a plan is longer than its layers, so a plan of more than
// kPlanMaxLayers layers is refused at its first layer too many, before the rest is read.
json::Limits PlanLimits() {
  json::Limits limits;
  limits.max_elements = static_cast<size_t>(kPlanMaxLayers);
  return limits;
}

// Old name -> new name (moe_chunks also chunks dense FFNs).
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
  STOWAGE_RETURN_IF_ERROR(st.ReadOptional("peak_device_bytes", stage.peak_device_bytes, kBytes));
  STOWAGE_RETURN_IF_ERROR(st.ReadOptional("fixed_device_bytes", stage.fixed_device_bytes, kBytes));
  STOWAGE_RETURN_IF_ERROR(st.ReadOptional("host_bytes_per_gpu", stage.host_bytes_per_gpu, kBytes));
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
  STOWAGE_RETURN_IF_ERROR(l.ReadOptional("backward_seconds", layer.backward_seconds, kSeconds));
  STOWAGE_RETURN_IF_ERROR(l.ReadOptional("recompute_seconds", layer.recompute_seconds, kSeconds));
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

}  // namespace

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
  if (!plan.sequence_parallel) j["run"]["sequence_parallel"] = false;
  // The job's GPUs and global batch: written only when stated (plans without them keep their
  // bytes and hash).
  if (plan.gpus != 0) j["run"]["gpus"] = plan.gpus;
  if (plan.global_batch != 0) j["run"]["global_batch"] = plan.global_batch;
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
  absl::StatusOr<json::Json> parsed = json::Parse(text, kSource, PlanLimits());
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
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("microbatches", plan.microbatches, kMicrobatches));
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
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("sequence_parallel", plan.sequence_parallel));
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("gpus", plan.gpus, kGpus));
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("global_batch", plan.global_batch, kGlobalBatch));
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("gpu_budget_bytes", plan.gpu_budget_bytes, kBytes));
    STOWAGE_RETURN_IF_ERROR(run->ReadOptional("host_budget_bytes", plan.host_budget_bytes, kBytes));
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
    STOWAGE_RETURN_IF_ERROR(p->Read("exposed_copy_seconds", out.exposed_copy_seconds, kSeconds));
    STOWAGE_RETURN_IF_ERROR(p->ReadOptional("fixed_device_bytes", out.fixed_device_bytes, kBytes));
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
    STOWAGE_RETURN_IF_ERROR(p->ReadOptional("optimality_gap", out.optimality_gap, kOptimalityGap));
  }
  if (j.Has("runtime")) {
    absl::StatusOr<json::Object> r = j.Child("runtime");
    if (!r.ok()) return r.status();
    RuntimeSettings& out = plan.runtime;
    STOWAGE_RETURN_IF_ERROR(
        r->ReadOptional("prefetch_distance", out.prefetch_distance, kPrefetchDistance));
    STOWAGE_RETURN_IF_ERROR(r->ReadOptional("save_lag", out.save_lag, kSaveLag));
    STOWAGE_RETURN_IF_ERROR(r->ReadOptional("host_arena_bytes", out.host_arena_bytes, kBytes));
    STOWAGE_RETURN_IF_ERROR(r->ReadOptional("copy_chunk_bytes", out.copy_chunk_bytes, kCopyChunk));
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
  // A file past the size limit is refused before it is read into memory.
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size > 0 && static_cast<uint64_t>(size) > PlanLimits().max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": plan: ", size, " bytes; allowed: at most ", PlanLimits().max_bytes));
  }
  // Read in one piece (no stream buffer copying a 100 MB plan twice).
  std::string text(size > 0 ? static_cast<size_t>(size) : 0, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (size <= 0) {  // not a regular file (a pipe): as it comes
    std::stringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  }
  auto plan = ParsePlanJson(text);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(), absl::StrCat(path, ": ", plan.status().message()));
  }
  return plan;
}

}  // namespace stowage
