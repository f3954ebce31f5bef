// The tensors saved in the open step, by id (Note [Step lifecycle] in runtime/runtime.h). An id
// encodes the step and a slot, so an id from an earlier step is NOT_FOUND rather than a pointer
// into memory that now holds another tensor.
//
// Not thread-safe: the runtime calls it under its own lock. Entries stay at a stable address until
// Close, so the runtime may use one outside that lock while its state says it is being worked on.
#ifndef STOWAGE_RUNTIME_TENSOR_TABLE_H_
#define STOWAGE_RUNTIME_TENSOR_TABLE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "offload/device_backend.h"

namespace stowage::runtime {

using TensorId = uint64_t;

enum class TensorState {
  kIssuing,
  kSaved,
  kPrefetching,
  kPrefetched,
  kRestoring,
  kRestored,
  kCorrupt,
  kFailed
};
const char* TensorStateName(TensorState state);  // "being saved", "saved", ...

struct TensorEntry {
  int layer = 0;
  int microbatch = 0;  // Note [Microbatch slots] in runtime/step_regions.h
  std::byte* host = nullptr;
  uint64_t bytes = 0;
  TensorState state = TensorState::kIssuing;
  std::shared_ptr<offload::CopyFence> d2h;
  std::shared_ptr<offload::CopyFence> h2d;
  void* prefetch_dst = nullptr;
  std::atomic<uint64_t> checksum{0};  // written on a backend thread when the D2H lands
  std::atomic<bool> synced{false};    // the caller waited for (or saw) the D2H
};

class TensorTable {
 public:
  // Starts a step: ids issued from now on carry a new step number (never 0, so 0 is no id).
  void Open();
  // Ends the step: hands back every entry (the caller drains their copies) and forgets the ids.
  std::vector<std::unique_ptr<TensorEntry>> Close();

  // A new entry for `microbatch` of `layer` and its id. RESOURCE_EXHAUSTED past 2^32-1 saves in
  // one step.
  absl::StatusOr<std::pair<TensorId, TensorEntry*>> Add(int layer, int microbatch, std::byte* host,
                                                        uint64_t bytes);
  // NOT_FOUND when `id` is of another step or unknown (the runtime knows whether a step is open).
  absl::StatusOr<TensorEntry*> Find(TensorId id) const;

 private:
  uint32_t step_ = 0;  // ids carry it; 0 is never a valid step
  std::vector<std::unique_ptr<TensorEntry>> entries_;
};

}  // namespace stowage::runtime

#endif  // STOWAGE_RUNTIME_TENSOR_TABLE_H_
