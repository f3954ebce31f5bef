#include "stowage/plan.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// Reads a required field of `object` into `out`, naming the full path of the field on error.
template <typename T>
absl::Status Get(const ordered_json& object, const std::string& path, const char* key, T& out) {
  auto it = object.find(key);
  if (it == object.end()) {
    return absl::InvalidArgumentError(absl::StrCat("plan: missing field '", path, key, "'"));
  }
  try {
    out = it->template get<T>();
  } catch (const nlohmann::json::exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: field '", path, key, "' has value ", it->dump(), " of the wrong type"));
  }
  return absl::OkStatus();
}

// Optional field: keeps `out` (its default) when absent.
template <typename T>
absl::Status GetOr(const ordered_json& object, const std::string& path, const char* key, T& out) {
  if (!object.contains(key)) return absl::OkStatus();
  return Get(object, path, key, out);
}

#define STOWAGE_PLAN_RETURN_IF_ERROR(expr) \
  do {                                     \
    absl::Status status_ = (expr);         \
    if (!status_.ok()) return status_;     \
  } while (0)

absl::StatusOr<const ordered_json*> Object(const ordered_json& parent, const std::string& path,
                                           const char* key) {
  auto it = parent.find(key);
  if (it == parent.end() || !it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: field '", path, key, "' is missing or not an object"));
  }
  return &*it;
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

bool PolicyOffloads(LayerPolicy policy) {
  return policy == LayerPolicy::kOffloadInput || policy == LayerPolicy::kOffloadSaved;
}

std::string PlanToJson(const Plan& plan) {
  ordered_json j;
  j["schema_version"] = plan.schema_version;
  j["generator"] = plan.generator;
  j["model"] = plan.model;
  j["hardware"] = plan.hardware;
  j["run"] = {{"seq_len", plan.seq_len},
              {"micro_batch", plan.micro_batch},
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
                          {"prefetch_after_layer", l.prefetch_after_layer},
                          {"moe_chunks", l.moe_chunks},
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
  ordered_json j = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("plan: not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("plan: the top level is not an object");
  Plan plan;
  STOWAGE_PLAN_RETURN_IF_ERROR(Get(j, "", "schema_version", plan.schema_version));
  if (plan.schema_version != kPlanSchemaVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: field 'schema_version' is ", plan.schema_version,
                     "; this runtime reads schema_version ", kPlanSchemaVersion));
  }
  STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(j, "", "generator", plan.generator));
  STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(j, "", "model", plan.model));
  STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(j, "", "hardware", plan.hardware));
  if (j.contains("run")) {
    auto run = Object(j, "", "run");
    if (!run.ok()) return run.status();
    const ordered_json& r = **run;
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(r, "run.", "seq_len", plan.seq_len));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(r, "run.", "micro_batch", plan.micro_batch));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(r, "run.", "tp", plan.tp));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(r, "run.", "cp", plan.cp));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(r, "run.", "ep", plan.ep));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(r, "run.", "gpu_budget_bytes", plan.gpu_budget_bytes));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(r, "run.", "host_budget_bytes", plan.host_budget_bytes));
  }
  {
    auto predicted = Object(j, "", "predicted");
    if (!predicted.ok()) return predicted.status();
    const ordered_json& p = **predicted;
    PlanPrediction& out = plan.predicted;
    STOWAGE_PLAN_RETURN_IF_ERROR(Get(p, "predicted.", "peak_device_bytes", out.peak_device_bytes));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        Get(p, "predicted.", "host_bytes_per_gpu", out.host_bytes_per_gpu));
    STOWAGE_PLAN_RETURN_IF_ERROR(Get(p, "predicted.", "step_seconds", out.step_seconds));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        Get(p, "predicted.", "exposed_copy_seconds", out.exposed_copy_seconds));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        GetOr(p, "predicted.", "fixed_device_bytes", out.fixed_device_bytes));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        GetOr(p, "predicted.", "host_bytes_per_numa_node", out.host_bytes_per_numa_node));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(p, "predicted.", "baseline", out.baseline));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        GetOr(p, "predicted.", "baseline_step_seconds", out.baseline_step_seconds));
  }
  if (j.contains("runtime")) {
    auto runtime = Object(j, "", "runtime");
    if (!runtime.ok()) return runtime.status();
    const ordered_json& r = **runtime;
    RuntimeSettings& out = plan.runtime;
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(r, "runtime.", "prefetch_distance", out.prefetch_distance));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(r, "runtime.", "host_arena_bytes", out.host_arena_bytes));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(r, "runtime.", "copy_chunk_bytes", out.copy_chunk_bytes));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        GetOr(r, "runtime.", "gpus_per_numa_node", out.gpus_per_numa_node));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        GetOr(r, "runtime.", "link_bytes_per_second", out.link_bytes_per_second));
  }
  auto layers = j.find("layers");
  if (layers == j.end() || !layers->is_array()) {
    return absl::InvalidArgumentError("plan: field 'layers' is missing or not an array");
  }
  for (size_t i = 0; i < layers->size(); ++i) {
    const ordered_json& l = (*layers)[i];
    const std::string path = absl::StrCat("layers[", i, "].");
    if (!l.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("plan: 'layers[", i, "]' is not an object"));
    }
    LayerPlan layer;
    std::string policy;
    STOWAGE_PLAN_RETURN_IF_ERROR(Get(l, path, "index", layer.index));
    STOWAGE_PLAN_RETURN_IF_ERROR(Get(l, path, "type", layer.type));
    STOWAGE_PLAN_RETURN_IF_ERROR(Get(l, path, "policy", policy));
    auto parsed = ParseLayerPolicy(policy);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: field '", path, "policy': ", parsed.status().message()));
    }
    layer.policy = *parsed;
    STOWAGE_PLAN_RETURN_IF_ERROR(Get(l, path, "device_saved_bytes", layer.device_saved_bytes));
    STOWAGE_PLAN_RETURN_IF_ERROR(Get(l, path, "host_bytes", layer.host_bytes));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(l, path, "recompute_modules", layer.recompute_modules));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(l, path, "moe_chunks", layer.moe_chunks));
    STOWAGE_PLAN_RETURN_IF_ERROR(
        GetOr(l, path, "prefetch_after_layer", layer.prefetch_after_layer));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(l, path, "forward_seconds", layer.forward_seconds));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(l, path, "backward_seconds", layer.backward_seconds));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(l, path, "recompute_seconds", layer.recompute_seconds));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(l, path, "d2h_seconds", layer.d2h_seconds));
    STOWAGE_PLAN_RETURN_IF_ERROR(GetOr(l, path, "h2d_seconds", layer.h2d_seconds));
    if (auto t = l.find("transfers"); t != l.end()) {
      if (!t->is_array()) {
        return absl::InvalidArgumentError(
            absl::StrCat("plan: field '", path, "transfers' is not an array"));
      }
      for (size_t k = 0; k < t->size(); ++k) {
        const std::string tpath = absl::StrCat(path, "transfers[", k, "].");
        PlannedTransfer transfer;
        STOWAGE_PLAN_RETURN_IF_ERROR(GetOr((*t)[k], tpath, "name", transfer.name));
        STOWAGE_PLAN_RETURN_IF_ERROR(Get((*t)[k], tpath, "bytes", transfer.bytes));
        layer.transfers.push_back(std::move(transfer));
      }
    } else if (layer.host_bytes > 0) {
      layer.transfers.push_back({"input", layer.host_bytes});
    }
    plan.layers.push_back(std::move(layer));
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
  uint64_t host_total = 0;
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    const LayerPlan& l = plan.layers[i];
    if (l.index != static_cast<int>(i)) {
      return absl::InvalidArgumentError(absl::StrCat("plan: layers[", i, "].index is ", l.index,
                                                     "; layers must be listed in order from 0"));
    }
    uint64_t transfer_sum = 0;
    for (const PlannedTransfer& t : l.transfers) transfer_sum += t.bytes;
    if (transfer_sum != l.host_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("plan: layers[", i, "].transfers sum to ",
                                                     transfer_sum, " bytes but host_bytes is ",
                                                     l.host_bytes));
    }
    if (!PolicyOffloads(l.policy) && l.host_bytes != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: layers[", i, "].host_bytes is ", l.host_bytes, " but policy '",
                       std::string(LayerPolicyName(l.policy)),
                       "' offloads nothing; only offload_input and offload_saved may"));
    }
    if (l.moe_chunks < 1) {
      return absl::InvalidArgumentError(absl::StrCat("plan: layers[", i, "].moe_chunks is ",
                                                     l.moe_chunks, "; it must be at least 1"));
    }
    host_total += l.host_bytes;
  }
  if (plan.runtime.prefetch_distance < 1) {
    return absl::InvalidArgumentError(absl::StrCat("plan: runtime.prefetch_distance is ",
                                                   plan.runtime.prefetch_distance,
                                                   "; it must be at least 1"));
  }
  if (!(plan.runtime.link_bytes_per_second >= 0)) {  // also rejects NaN
    return absl::InvalidArgumentError(absl::StrCat("plan: runtime.link_bytes_per_second is ",
                                                   plan.runtime.link_bytes_per_second,
                                                   "; it must be 0 (unknown) or positive"));
  }
  if (plan.runtime.copy_chunk_bytes == 0) {
    return absl::InvalidArgumentError("plan: runtime.copy_chunk_bytes is 0; it must be positive");
  }
  if (plan.runtime.host_arena_bytes < host_total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: runtime.host_arena_bytes is ", plan.runtime.host_arena_bytes,
        " but the layers offload ", host_total, " bytes in all; the arena must hold them"));
  }
  return absl::OkStatus();
}

}  // namespace stowage
