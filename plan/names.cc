// The plan's words: how each enum is spelled in a plan file (and on the command line) and read
// back, the names of the MTP layers, and which layer policies move bytes to the host
// (include/stowage/plan.h).
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "stowage/plan.h"

namespace stowage {
namespace {

constexpr std::pair<LayerPolicy, std::string_view> kPolicyNames[] = {
    {LayerPolicy::kKeep, "keep"},
    {LayerPolicy::kRecompute, "recompute"},
    {LayerPolicy::kSelectiveRecompute, "selective_recompute"},
    {LayerPolicy::kOffloadInput, "offload_input"},
    {LayerPolicy::kOffloadSaved, "offload_saved"},
};

constexpr std::pair<PipelineSchedule, std::string_view> kScheduleNames[] = {
    {PipelineSchedule::k1F1B, "1f1b"},
    {PipelineSchedule::kInterleaved, "interleaved"},
};

constexpr std::pair<RankOrder, std::string_view> kRankOrderNames[] = {
    {RankOrder::kTpCpEpDpPp, "tp-cp-ep-dp-pp"},
    {RankOrder::kTpCpEpPpDp, "tp-cp-ep-pp-dp"},
};

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

}  // namespace stowage
