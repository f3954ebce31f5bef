#include "runtime/tensor_table.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stowage::runtime {
namespace {

uint32_t StepOf(TensorId id) { return static_cast<uint32_t>(id >> 32); }
uint32_t SlotOf(TensorId id) { return static_cast<uint32_t>(id & 0xffffffffu); }
TensorId MakeId(uint32_t step, uint32_t slot) { return (static_cast<uint64_t>(step) << 32) | slot; }

}  // namespace

const char* TensorStateName(TensorState state) {
  switch (state) {
    case TensorState::kIssuing:
      return "being saved";
    case TensorState::kSaved:
      return "saved";
    case TensorState::kPrefetching:
      return "being prefetched";
    case TensorState::kPrefetched:
      return "prefetched";
    case TensorState::kRestoring:
      return "being restored";
    case TensorState::kRestored:
      return "restored";
    case TensorState::kCorrupt:
      return "corrupt";
    case TensorState::kFailed:
      return "failed";
  }
  return "unknown";
}

void TensorTable::Open() {
  ++step_;
  if (step_ == 0) step_ = 1;  // wrapped after 2^32 steps; 0 stays invalid
  entries_.clear();
}

std::vector<std::unique_ptr<TensorEntry>> TensorTable::Close() {
  return std::exchange(entries_, {});
}

absl::StatusOr<std::pair<TensorId, TensorEntry*>> TensorTable::Add(int layer, int microbatch,
                                                                   std::byte* host,
                                                                   uint64_t bytes) {
  if (entries_.size() >= 0xffffffffu) {
    return absl::ResourceExhaustedError("save: more than 2^32-1 saves in one step");
  }
  auto entry = std::make_unique<TensorEntry>();
  entry->layer = layer;
  entry->microbatch = microbatch;
  entry->host = host;
  entry->bytes = bytes;
  const TensorId id = MakeId(step_, static_cast<uint32_t>(entries_.size()));
  entries_.push_back(std::move(entry));
  return std::make_pair(id, entries_.back().get());
}

absl::StatusOr<TensorEntry*> TensorTable::Find(TensorId id) const {
  if (StepOf(id) != step_) {
    return absl::NotFoundError(absl::StrCat("tensor id ", id,
                                            " is stale or unknown: it does not belong to the "
                                            "current step (ids are valid only in their step)"));
  }
  const uint32_t slot = SlotOf(id);
  if (slot >= entries_.size()) {
    return absl::NotFoundError(absl::StrCat("tensor id ", id, " is unknown in this step"));
  }
  return entries_[slot].get();
}

}  // namespace stowage::runtime
