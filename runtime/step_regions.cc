#include "runtime/step_regions.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/checked_math.h"

namespace stowage::runtime {
namespace {

// `value` rounded up to a multiple of `alignment`; nullopt when that does not fit.
std::optional<uint64_t> AlignUp(uint64_t value, uint64_t alignment) {
  std::optional<uint64_t> blocks = CheckedMul(CeilDiv(value, alignment), alignment);
  return blocks;
}

}  // namespace

absl::StatusOr<StepRegions> StepRegions::FromPlan(const Plan& plan) {
  StepRegions out;
  out.regions_.resize(plan.layers.size());
  for (const LayerPlan& layer : plan.layers) {
    if (layer.index < 0 || layer.index >= static_cast<int>(plan.layers.size())) {
      return absl::InvalidArgumentError(absl::StrCat("plan: layer index ", layer.index,
                                                     " is out of range; the plan has ",
                                                     plan.layers.size(), " layers"));
    }
    Region& region = out.regions_[layer.index];
    const std::string what = absl::StrCat("the host region of layer ", layer.index);
    // Note [Pipeline stages]: each microbatch the schedule holds of the layer saves its own copy.
    const uint64_t copies = static_cast<uint64_t>(std::max(1, layer.in_flight_microbatches));
    const std::optional<uint64_t> plan_bytes = CheckedMul(layer.host_bytes, copies);
    if (!plan_bytes) {
      return absl::OutOfRangeError(absl::StrCat(what, " overflows: ", layer.host_bytes, " bytes x ",
                                                copies, " in-flight microbatches"));
    }
    region.plan_bytes = *plan_bytes;
    std::optional<uint64_t> reserved = 0;
    for (const PlannedTransfer& t : layer.transfers) {
      std::optional<uint64_t> aligned = AlignUp(t.bytes, kSaveAlignment);
      if (aligned) reserved = CheckedAdd(*reserved, *aligned);
      if (!aligned || !reserved) {
        return absl::OutOfRangeError(
            absl::StrCat(what, " overflows: transfer '", t.name, "' is ", t.bytes, " bytes"));
      }
    }
    reserved = CheckedMul(*reserved, copies);
    if (reserved && *reserved > 0) reserved = CheckedAdd(*reserved, kRegionSlack);
    std::optional<uint64_t> in_arena = reserved ? AlignUp(*reserved, kSaveAlignment) : std::nullopt;
    std::optional<uint64_t> total =
        in_arena ? CheckedAdd(out.arena_bytes_, *in_arena) : std::nullopt;
    if (!total) {
      return absl::OutOfRangeError(
          absl::StrCat("the host arena overflows at ", what, " (", layer.host_bytes, " bytes)"));
    }
    region.reserved = *reserved;
    out.arena_bytes_ = *total;
  }
  return out;
}

absl::Status StepRegions::Carve(offload::PinnedArena* arena) {
  for (Region& region : regions_) {
    region.used = region.saved = 0;
    region.base = nullptr;
  }
  for (Region& region : regions_) {
    if (region.reserved == 0) continue;
    absl::StatusOr<std::byte*> base = arena == nullptr
                                          ? absl::InternalError("no arena")
                                          : arena->Allocate(region.reserved, kSaveAlignment);
    if (!base.ok()) {
      if (arena != nullptr) arena->Reset();
      Release();
      return absl::InternalError(
          absl::StrCat("begin_step: carving layer regions: ", base.status().message()));
    }
    region.base = *base;
  }
  return absl::OkStatus();
}

void StepRegions::Release() {
  for (Region& region : regions_) {
    region.base = nullptr;
    region.used = region.saved = 0;
  }
}

absl::StatusOr<std::byte*> StepRegions::Place(int layer, uint64_t bytes) {
  Region& region = regions_[layer];
  // Aligned while the region's slack lasts, packed after that: a trainer that splits a layer's
  // transfer into many tensors must never fail on alignment padding. Invariant: padding so far
  // (used - saved) <= slack (reserved - plan_bytes), so saved + bytes <= plan_bytes implies
  // offset + bytes <= reserved. `used` <= reserved, so aligning it cannot wrap.
  uint64_t offset = *AlignUp(region.used, kSaveAlignment);
  if ((region.used - region.saved) + (offset - region.used) > region.reserved - region.plan_bytes) {
    offset = region.used;
  }
  const std::optional<uint64_t> saved = CheckedAdd(region.saved, bytes);
  const std::optional<uint64_t> end = CheckedAdd(offset, bytes);
  if (!saved || !end || *saved > region.plan_bytes || *end > region.reserved) {
    return absl::ResourceExhaustedError(
        absl::StrCat("save: layer ", layer, " would hold ",
                     saved ? absl::StrCat(*saved) : absl::StrCat("more than 2^64-1"),
                     " bytes this step but the plan reserved ", region.plan_bytes, " (",
                     region.saved, " already saved, ", bytes, " asked for)"));
  }
  region.used = *end;
  region.saved = *saved;
  return region.base + offset;
}

}  // namespace stowage::runtime
