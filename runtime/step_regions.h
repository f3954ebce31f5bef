// The per-layer host regions of a step (Note [Step lifecycle] in runtime/runtime.h): their sizes
// come from the plan once, at creation; every BeginStep carves them out of the arena in layer
// order (the same layout every step) and EndStep lets them go. Saves for a layer are placed in
// its region, aligned while its slack lasts.
//
// Every size here comes from the plan or the caller, so every sum is overflow-checked: a size
// that would wrap is an error naming the layer, never a short region.
//
// Not thread-safe: the runtime calls it under its own lock.
#ifndef STOWAGE_RUNTIME_STEP_REGIONS_H_
#define STOWAGE_RUNTIME_STEP_REGIONS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/pinned_arena.h"
#include "stowage/plan.h"

namespace stowage::runtime {

// Alignment of each save inside its layer's region. DMA runs at full speed from 256-byte aligned
// host addresses; the plan's exact transfer sizes get this much slack each.
inline constexpr uint64_t kSaveAlignment = 256;

// Extra bytes per offloading layer so that tensors the trainer splits differently from the
// plan's transfers still start aligned (up to 16 of them; later ones are packed). 45 layers cost
// 180 KiB, far below 1% of any real arena.
inline constexpr uint64_t kRegionSlack = 16 * kSaveAlignment;

class StepRegions {
 public:
  // One region per plan layer: the plan's transfers, each aligned, plus kRegionSlack.
  // OUT_OF_RANGE when the sizes overflow.
  static absl::StatusOr<StepRegions> FromPlan(const Plan& plan);

  // Host bytes the regions take in the arena (each region aligned).
  uint64_t arena_bytes() const { return arena_bytes_; }
  int size() const { return static_cast<int>(regions_.size()); }
  bool reserved(int layer) const { return regions_[layer].reserved > 0; }
  // Bytes saved into `layer`'s region this step.
  uint64_t saved(int layer) const { return regions_[layer].saved; }

  // BeginStep: carves every region out of `arena` (which is Reset on failure). INTERNAL if the
  // arena is too small (it is sized from arena_bytes(), so only on a bug).
  absl::Status Carve(offload::PinnedArena* arena);
  // EndStep: forgets this step's placements (the caller resets the arena).
  void Release();

  // Places `bytes` in `layer`'s region and returns where they go. The layer must be in range and
  // its region reserved and carved. RESOURCE_EXHAUSTED past the plan's reservation for the layer
  // (also when `bytes` is so large that a sum would wrap).
  absl::StatusOr<std::byte*> Place(int layer, uint64_t bytes);

 private:
  struct Region {
    uint64_t reserved = 0;      // plan bytes + per-transfer alignment slack
    uint64_t plan_bytes = 0;    // the plan's host_bytes
    std::byte* base = nullptr;  // this step's region
    uint64_t used = 0;          // bytes consumed (with alignment)
    uint64_t saved = 0;         // bytes saved
  };

  std::vector<Region> regions_;
  uint64_t arena_bytes_ = 0;
};

}  // namespace stowage::runtime

#endif  // STOWAGE_RUNTIME_STEP_REGIONS_H_
