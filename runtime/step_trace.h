// The runtime's per-step event trace (stowage_get_trace): what one step did, in the words of
// Note [Runtime protocol] (include/stowage/plan.h), so a test can hold it against the
// simulator's predicted events for the same plan.
//
// Note [Step trace]. Off until SetCapacity(n > 0); then every call that issues or waits records
// one event (save_issued, save_wait, prefetch_issued, restore) and every copy records one more
// when it lands (save_landed, prefetch_landed: from the backend thread, at landing). An event
// carries a sequence number (the order the runtime saw them in, from 0 each step), the layer,
// the microbatch the tensor was saved under (Note [Microbatch slots]), the tensor's bytes and id,
// and nanoseconds since the step began (for reading, not for comparing: the order of landings
// against calls depends on copy speed). Bounded: a step records at most `capacity` events; later
// ones are counted as dropped, never stored (the sequence numbers of stored events stay gapless).
// EndStep keeps the step's events as the last completed step, which Last() returns; memory is at
// most two buffers of `capacity` events, allocated when the capacity is set. With the trace off a
// call costs one relaxed atomic load.
//
// Thread-safety: Record may run on any thread, concurrently; its lock is a leaf (taken under no
// lock of the trace's caller's that a backend thread could also wait on, and never held across a
// call out). SetCapacity, BeginStep and EndStep must not race with a step in progress.
#ifndef STOWAGE_RUNTIME_STEP_TRACE_H_
#define STOWAGE_RUNTIME_STEP_TRACE_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "stowage/plan.h"

namespace stowage::runtime {

struct TraceEvent {
  uint64_t seq = 0;
  StepEventKind kind = StepEventKind::kSaveIssued;
  int layer = 0;
  int microbatch = 0;  // the one the tensor was saved under (0 without microbatches)
  uint64_t bytes = 0;
  uint64_t id = 0;  // the tensor id
  uint64_t nanos = 0;
};

class StepTrace {
 public:
  // 0 switches the trace off. Clears what was recorded.
  void SetCapacity(size_t capacity);
  size_t capacity() const { return capacity_.load(std::memory_order_relaxed); }
  bool enabled() const { return capacity() > 0; }

  void BeginStep();
  void EndStep();
  void Record(StepEventKind kind, int layer, int microbatch, uint64_t bytes, uint64_t id);

  // The last completed step's events, in sequence order, and how many it dropped.
  std::vector<TraceEvent> Last(uint64_t* dropped) const;

 private:
  std::atomic<size_t> capacity_{0};
  mutable absl::Mutex mu_;
  std::vector<TraceEvent> current_ ABSL_GUARDED_BY(mu_);
  std::vector<TraceEvent> last_ ABSL_GUARDED_BY(mu_);
  uint64_t current_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point start_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stowage::runtime

#endif  // STOWAGE_RUNTIME_STEP_TRACE_H_
