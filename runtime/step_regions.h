// The per-layer host regions of a step (Note [Step lifecycle] in runtime/runtime.h): their sizes
// come from the plan once, at creation; every BeginStep carves them out of the arena in layer
// order (the same layout every step) and EndStep lets them go.
//
// Note [Microbatch slots]. A layer's region is in_flight_microbatches slots (the plan's count,
// Note [Pipeline stages] in include/stowage/plan.h), each the plan's host_bytes for the layer.
// The first save of a microbatch into a layer claims a free slot; a microbatch's saves into the
// layer end when another microbatch saves into it, and the slot is free again once those saves
// have ended and every tensor of them was restored. So a step (one optimizer step, every
// microbatch of it) may run far more microbatches than a layer holds at once, and a caller that
// only ever uses microbatch 0 sees the one region per layer it always had. Errors: a save of a
// microbatch whose saves ended (saved and not restored, or restored) -- a second forward under
// one id; a microbatch more than the slots; a microbatch outside run.microbatches; more than the
// plan's bytes for one microbatch. A reused slot's next D2H must not overwrite bytes an H2D of
// the slot's previous microbatch is still reading: the slot keeps those H2Ds' fences and hands
// them to the next occupant's saves (Runtime orders each D2H after them).
//
// Every size here comes from the plan or the caller, so every sum is overflow-checked: a size
// that would wrap is an error naming the layer, never a short region.
//
// Not thread-safe: the runtime calls it under its own lock.
#ifndef STOWAGE_RUNTIME_STEP_REGIONS_H_
#define STOWAGE_RUNTIME_STEP_REGIONS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/device_backend.h"
#include "offload/pinned_arena.h"
#include "stowage/plan.h"

namespace stowage::runtime {

// Alignment of each save inside its layer's region. DMA runs at full speed from 256-byte aligned
// host addresses; the plan's exact transfer sizes get this much slack each.
inline constexpr uint64_t kSaveAlignment = 256;

// Extra bytes per slot of an offloading layer so that tensors the trainer splits differently from
// the plan's transfers still start aligned (up to 16 of them; later ones are packed). 45 layers
// cost 180 KiB per slot, far below 1% of any real arena.
inline constexpr uint64_t kRegionSlack = 16 * kSaveAlignment;

// Where a save goes: its host bytes, the slot, and the H2Ds (of the slot's previous microbatch)
// its D2H must follow (Note [Microbatch slots]).
struct SlotPlacement {
  std::byte* host = nullptr;
  int slot = 0;
  std::vector<std::shared_ptr<offload::CopyFence>> after;
};

class StepRegions {
 public:
  // One region per plan layer: in_flight_microbatches slots of the plan's transfers, each
  // aligned, plus kRegionSlack. OUT_OF_RANGE when the sizes overflow.
  static absl::StatusOr<StepRegions> FromPlan(const Plan& plan);

  // Host bytes the regions take in the arena (each slot aligned).
  uint64_t arena_bytes() const { return arena_bytes_; }
  int size() const { return static_cast<int>(regions_.size()); }
  bool reserved(int layer) const { return regions_[layer].slot_reserved > 0; }
  // The plan's in_flight_microbatches for `layer` (its slots).
  int slots(int layer) const { return static_cast<int>(regions_[layer].slots.size()); }
  int microbatches() const { return microbatches_; }
  // Bytes saved into `layer`'s slots this step (all microbatches).
  uint64_t saved(int layer) const { return regions_[layer].saved; }

  // BeginStep: carves every region out of `arena` (which is Reset on failure). INTERNAL if the
  // arena is too small (it is sized from arena_bytes(), so only on a bug).
  absl::Status Carve(offload::PinnedArena* arena);
  // EndStep: forgets this step's placements and microbatches (the caller resets the arena).
  void Release();

  // INVALID_ARGUMENT naming `call` when `microbatch` is outside [0, run.microbatches).
  absl::Status CheckMicrobatch(int layer, int microbatch, const char* call) const;

  // Places `bytes` of `microbatch` in `layer`'s region (Note [Microbatch slots]). The layer must
  // be in range and its region reserved and carved. INVALID_ARGUMENT (microbatch out of range),
  // FAILED_PRECONDITION (the microbatch already saved the layer this step), RESOURCE_EXHAUSTED
  // (more microbatches in flight than planned; past the plan's bytes for one microbatch, also
  // when `bytes` is so large that a sum would wrap). A failure changes nothing.
  absl::StatusOr<SlotPlacement> Place(int layer, int microbatch, uint64_t bytes);
  // A tensor Place put in `layer`'s slot for `microbatch` will never be restored (its D2H could
  // not be issued).
  void Abandon(int layer, int microbatch);
  // One of the microbatch's tensors in `layer` was restored; `h2d` (may be null) read the slot.
  // The last one frees the slot once the microbatch's saves there have ended.
  void Restored(int layer, int microbatch, std::shared_ptr<offload::CopyFence> h2d);
  // "microbatches 0, 3 in flight of the 2 planned" for error messages.
  std::string InFlightText(int layer) const;
  // Whether `microbatch` saved into `layer` this step (in flight or restored).
  bool Saved(int layer, int microbatch) const;

 private:
  struct Slot {
    std::byte* base = nullptr;  // this step's slot
    uint64_t used = 0;          // bytes consumed (with alignment)
    uint64_t saved = 0;         // bytes saved
    int microbatch = -1;        // the occupant; -1: free
    // H2Ds of the previous occupant, which read this slot: every save of this one follows them.
    std::vector<std::shared_ptr<offload::CopyFence>> prior_readers;
    // H2Ds of this occupant (its own follow its D2Hs, which follow prior_readers).
    std::vector<std::shared_ptr<offload::CopyFence>> readers;
  };
  struct Microbatch {
    int slot = -1;        // -1 once restored
    int outstanding = 0;  // tensors saved and not yet restored
    bool saving = true;   // its batch of saves is still open
  };
  struct Region {
    uint64_t slot_reserved = 0;  // plan bytes + per-transfer alignment slack, per slot
    uint64_t slot_in_arena = 0;  // slot_reserved aligned
    uint64_t plan_bytes = 0;     // the plan's host_bytes: one microbatch's
    uint64_t saved = 0;          // this step, every microbatch
    int last_saver = -1;         // the microbatch that saved into the layer last
    std::vector<Slot> slots;     // in_flight_microbatches of them
    std::unordered_map<int, Microbatch> microbatches;  // those that saved this step
  };

  static void FreeSlot(Region& region, Microbatch& mb);

  std::vector<Region> regions_;
  uint64_t arena_bytes_ = 0;
  int microbatches_ = 1;
};

}  // namespace stowage::runtime

#endif  // STOWAGE_RUNTIME_STEP_REGIONS_H_
