// ValidatePlan: every rule a plan obeys, in one place (include/stowage/plan.h), with the checks
// of the run's pipeline fields and the stages that the reader shares.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/checked_math.h"
#include "base/json_reader.h"
#include "base/status_macros.h"
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
using plan_internal::kLinkRate;
using plan_internal::kMicrobatches;
using plan_internal::kMtpLayers;
using plan_internal::kOptimalityGap;
using plan_internal::kParallel;
using plan_internal::kPipelineStages;
using plan_internal::kPrefetchDistance;
using plan_internal::kSaveLag;
using plan_internal::kSeconds;
using plan_internal::kSeqLen;
using plan_internal::kVirtualStages;
using plan_internal::PlacesOfLayers;

namespace {

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

}  // namespace

namespace plan_internal {

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

}  // namespace plan_internal

namespace {

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

absl::Status CheckPipelineRun(PipelineSchedule schedule, int pp, int vpp, int microbatches) {
  return CheckPipelineRunFields(schedule, pp, vpp, microbatches);
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
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.gpus", plan.gpus, kGpus));
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.global_batch", plan.global_batch, kGlobalBatch));
  // A step's sequences are whole microbatches on every data-parallel rank.
  const uint64_t per_rank = static_cast<uint64_t>(plan.micro_batch) *
                            static_cast<uint64_t>(std::max(plan.microbatches, 1));
  if (plan.global_batch % per_rank != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: field 'run.global_batch' is ", plan.global_batch,
        "; allowed: 0 (not stated) or a multiple of run.micro_batch x run.microbatches = ",
        per_rank));
  }
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.gpu_budget_bytes", plan.gpu_budget_bytes, kBytes));
  STOWAGE_RETURN_IF_ERROR(CheckRange("run.host_budget_bytes", plan.host_budget_bytes, kBytes));

  const PlanPrediction& p = plan.predicted;
  STOWAGE_RETURN_IF_ERROR(CheckRange("predicted.peak_device_bytes", p.peak_device_bytes, kBytes));
  STOWAGE_RETURN_IF_ERROR(CheckRange("predicted.fixed_device_bytes", p.fixed_device_bytes, kBytes));
  STOWAGE_RETURN_IF_ERROR(CheckRange("predicted.host_bytes_per_gpu", p.host_bytes_per_gpu, kBytes));
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
  STOWAGE_RETURN_IF_ERROR(CheckRange("predicted.optimality_gap", p.optimality_gap, kOptimalityGap));
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
  STOWAGE_RETURN_IF_ERROR(CheckRange("runtime.copy_chunk_bytes", r.copy_chunk_bytes, kCopyChunk));
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
    STOWAGE_RETURN_IF_ERROR(CheckRange(absl::StrCat(path, ".host_bytes"), l.host_bytes, kBytes));
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
