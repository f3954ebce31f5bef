#include "runtime/step_regions.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
  out.microbatches_ = std::max(1, plan.microbatches);
  out.regions_.resize(plan.layers.size());
  for (const LayerPlan& layer : plan.layers) {
    if (layer.index < 0 || layer.index >= static_cast<int>(plan.layers.size())) {
      return absl::InvalidArgumentError(absl::StrCat("plan: layer index ", layer.index,
                                                     " is out of range; the plan has ",
                                                     plan.layers.size(), " layers"));
    }
    Region& region = out.regions_[layer.index];
    const std::string what = absl::StrCat("the host region of layer ", layer.index);
    // Note [Microbatch slots]: each microbatch the schedule holds of the layer saves its own copy.
    const uint64_t copies = static_cast<uint64_t>(std::max(1, layer.in_flight_microbatches));
    region.plan_bytes = layer.host_bytes;
    std::optional<uint64_t> reserved = 0;
    for (const PlannedTransfer& t : layer.transfers) {
      std::optional<uint64_t> aligned = AlignUp(t.bytes, kSaveAlignment);
      if (aligned) reserved = CheckedAdd(*reserved, *aligned);
      if (!aligned || !reserved) {
        return absl::OutOfRangeError(
            absl::StrCat(what, " overflows: transfer '", t.name, "' is ", t.bytes, " bytes"));
      }
    }
    if (*reserved > 0) reserved = CheckedAdd(*reserved, kRegionSlack);
    std::optional<uint64_t> slot = reserved ? AlignUp(*reserved, kSaveAlignment) : std::nullopt;
    std::optional<uint64_t> in_arena = slot ? CheckedMul(*slot, copies) : std::nullopt;
    std::optional<uint64_t> total =
        in_arena ? CheckedAdd(out.arena_bytes_, *in_arena) : std::nullopt;
    if (!total) {
      return absl::OutOfRangeError(absl::StrCat("the host arena overflows at ", what, " (",
                                                layer.host_bytes, " bytes x ", copies,
                                                " in-flight microbatches)"));
    }
    region.slot_reserved = *reserved;
    region.slot_in_arena = *slot;
    if (region.slot_reserved > 0) region.slots.resize(copies);
    out.arena_bytes_ = *total;
  }
  return out;
}

absl::Status StepRegions::Carve(offload::PinnedArena* arena) {
  Release();
  for (Region& region : regions_) {
    for (Slot& slot : region.slots) {
      absl::StatusOr<std::byte*> base = arena == nullptr
                                            ? absl::InternalError("no arena")
                                            : arena->Allocate(region.slot_in_arena, kSaveAlignment);
      if (!base.ok()) {
        if (arena != nullptr) arena->Reset();
        Release();
        return absl::InternalError(
            absl::StrCat("begin_step: carving layer regions: ", base.status().message()));
      }
      slot.base = *base;
    }
  }
  return absl::OkStatus();
}

void StepRegions::Release() {
  for (Region& region : regions_) {
    for (Slot& slot : region.slots) slot = Slot{};
    region.saved = 0;
    region.last_saver = -1;
    region.microbatches.clear();
  }
}

absl::Status StepRegions::CheckMicrobatch(int layer, int microbatch, const char* call) const {
  if (microbatch >= 0 && microbatch < microbatches_) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      call, ": microbatch ", microbatch, " of layer ", layer, " is out of range; the plan's ",
      "run.microbatches is ", microbatches_, " (ids 0 to ", microbatches_ - 1, ")"));
}

std::string StepRegions::InFlightText(int layer) const {
  const Region& region = regions_[layer];
  std::vector<int> held;
  for (const Slot& slot : region.slots) {
    if (slot.microbatch >= 0) held.push_back(slot.microbatch);
  }
  std::sort(held.begin(), held.end());
  return absl::StrCat(held.empty()       ? "no microbatch"
                      : held.size() == 1 ? "microbatch "
                                         : "microbatches ",
                      absl::StrJoin(held, ", "), " in flight of the ", region.slots.size(),
                      " the plan holds (layers[", layer, "].in_flight_microbatches)");
}

bool StepRegions::Saved(int layer, int microbatch) const {
  return regions_[layer].microbatches.count(microbatch) > 0;
}

// The slot `mb` holds is free for the next microbatch (Note [Microbatch slots]). No fence is
// polled here (a CUDA call, and the runtime's lock is held): Runtime::Save waits for the
// readers it is handed.
void StepRegions::FreeSlot(Region& region, Microbatch& mb) {
  Slot& slot = region.slots[mb.slot];
  std::vector<std::shared_ptr<offload::CopyFence>> readers = std::move(slot.readers);
  std::byte* const base = slot.base;
  slot = Slot{};
  slot.base = base;
  slot.prior_readers = std::move(readers);
  mb.slot = -1;
}

absl::StatusOr<SlotPlacement> StepRegions::Place(int layer, int microbatch, uint64_t bytes) {
  if (absl::Status s = CheckMicrobatch(layer, microbatch, "save"); !s.ok()) return s;
  Region& region = regions_[layer];
  auto found = region.microbatches.find(microbatch);
  Microbatch* mb = found == region.microbatches.end() ? nullptr : &found->second;
  if (mb != nullptr && mb->slot < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("save: microbatch ", microbatch, " of layer ", layer,
                     " was already saved and restored in this step; a microbatch saves a layer "
                     "once per step (ids 0 to ",
                     microbatches_ - 1, ", one per forward)"));
  }
  if (mb != nullptr && !mb->saving) {
    const Slot& held = region.slots[mb->slot];
    return absl::FailedPreconditionError(absl::StrCat(
        "save: microbatch ", microbatch, " of layer ", layer, " is already saved (", held.saved,
        " bytes, ", mb->outstanding,
        " tensor(s)) and not restored, and another microbatch saved into the layer since; a "
        "microbatch saves a layer once per step: give each forward its own microbatch id (",
        InFlightText(layer), ")"));
  }
  // Another microbatch's saves end the previous saver's batch (applied below, on success); a
  // previous saver with every tensor restored then frees its slot.
  Microbatch* previous = nullptr;
  if (region.last_saver >= 0 && region.last_saver != microbatch) {
    auto it = region.microbatches.find(region.last_saver);
    if (it != region.microbatches.end() && it->second.saving) previous = &it->second;
  }
  int slot_index = mb != nullptr ? mb->slot : -1;
  if (slot_index < 0) {
    for (size_t s = 0; s < region.slots.size(); ++s) {
      if (region.slots[s].microbatch < 0) {
        slot_index = static_cast<int>(s);
        break;
      }
    }
    if (slot_index < 0 && previous != nullptr && previous->outstanding == 0) {
      slot_index = previous->slot;
    }
    if (slot_index < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("save: microbatch ", microbatch, " of layer ", layer,
                       " would be one more in flight than planned: ", InFlightText(layer),
                       "; restore one of them before this microbatch's forward"));
    }
  }
  Slot& slot = region.slots[slot_index];
  const bool reused = slot_index == (previous != nullptr ? previous->slot : -1);
  const uint64_t used = reused ? 0 : slot.used;
  const uint64_t already = reused ? 0 : slot.saved;
  // Aligned while the slot's slack lasts, packed after that: a trainer that splits a layer's
  // transfer into many tensors must never fail on alignment padding. Invariant: padding so far
  // (used - saved) <= slack (slot_reserved - plan_bytes), so saved + bytes <= plan_bytes implies
  // offset + bytes <= slot_reserved. `used` <= slot_reserved, so aligning it cannot wrap.
  uint64_t offset = *AlignUp(used, kSaveAlignment);
  if ((used - already) + (offset - used) > region.slot_reserved - region.plan_bytes) {
    offset = used;
  }
  const std::optional<uint64_t> saved = CheckedAdd(already, bytes);
  const std::optional<uint64_t> end = CheckedAdd(offset, bytes);
  if (!saved || !end || *saved > region.plan_bytes || *end > region.slot_reserved) {
    return absl::ResourceExhaustedError(
        absl::StrCat("save: microbatch ", microbatch, " of layer ", layer, " would hold ",
                     saved ? absl::StrCat(*saved) : absl::StrCat("more than 2^64-1"),
                     " bytes this step but the plan reserved ", region.plan_bytes,
                     " per microbatch (", already, " already saved, ", bytes,
                     " asked for; each forward of a step saves under its own microbatch id)"));
  }
  if (previous != nullptr) {
    previous->saving = false;
    if (previous->outstanding == 0) FreeSlot(region, *previous);
  }
  if (mb == nullptr) mb = &region.microbatches[microbatch];
  region.last_saver = microbatch;
  SlotPlacement out;
  out.host = slot.base + offset;
  out.slot = slot_index;
  out.after = slot.prior_readers;
  if (slot.microbatch < 0) {
    slot.microbatch = microbatch;
    mb->slot = slot_index;
  }
  slot.used = *end;
  slot.saved = *saved;
  region.saved += bytes;  // bounded by the arena's size
  ++mb->outstanding;
  return out;
}

void StepRegions::Abandon(int layer, int microbatch) {
  Region& region = regions_[layer];
  auto found = region.microbatches.find(microbatch);
  if (found == region.microbatches.end() || found->second.slot < 0) return;
  Microbatch& mb = found->second;
  Slot& slot = region.slots[mb.slot];
  if (mb.outstanding == 1 && slot.readers.empty()) {
    // Its only tensor never left the device: as if the microbatch had not saved here.
    std::vector<std::shared_ptr<offload::CopyFence>> prior = std::move(slot.prior_readers);
    std::byte* const base = slot.base;
    slot = Slot{};
    slot.base = base;
    slot.prior_readers = std::move(prior);
    region.microbatches.erase(found);
    return;
  }
  Restored(layer, microbatch, nullptr);
}

void StepRegions::Restored(int layer, int microbatch, std::shared_ptr<offload::CopyFence> h2d) {
  Region& region = regions_[layer];
  auto found = region.microbatches.find(microbatch);
  if (found == region.microbatches.end() || found->second.slot < 0) return;
  Microbatch& mb = found->second;
  if (h2d != nullptr) region.slots[mb.slot].readers.push_back(std::move(h2d));
  if (--mb.outstanding > 0) return;
  // Every tensor is back. While the microbatch is the layer's last saver it may still save more
  // (a layer that runs backward inside its own forward); the next microbatch's save frees it.
  if (!mb.saving) FreeSlot(region, mb);
}

}  // namespace stowage::runtime
