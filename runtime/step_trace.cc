#include "runtime/step_trace.h"

#include <utility>

namespace stowage::runtime {

void StepTrace::SetCapacity(size_t capacity) {
  absl::MutexLock lock(&mu_);
  current_.clear();
  last_.clear();
  current_.shrink_to_fit();
  last_.shrink_to_fit();
  current_.reserve(capacity);
  last_.reserve(capacity);
  current_dropped_ = last_dropped_ = 0;
  start_ = std::chrono::steady_clock::now();
  capacity_.store(capacity, std::memory_order_relaxed);
}

void StepTrace::BeginStep() {
  if (!enabled()) return;
  absl::MutexLock lock(&mu_);
  current_.clear();
  current_dropped_ = 0;
  start_ = std::chrono::steady_clock::now();
}

void StepTrace::EndStep() {
  if (!enabled()) return;
  absl::MutexLock lock(&mu_);
  // Swapping keeps both buffers' reservations: no allocation per step.
  std::swap(current_, last_);
  last_dropped_ = current_dropped_;
  current_.clear();
  current_dropped_ = 0;
}

void StepTrace::Record(StepEventKind kind, int layer, int microbatch, uint64_t bytes, uint64_t id) {
  const size_t capacity = capacity_.load(std::memory_order_relaxed);
  if (capacity == 0) return;
  const auto now = std::chrono::steady_clock::now();
  absl::MutexLock lock(&mu_);
  if (current_.size() >= capacity) {
    ++current_dropped_;
    return;
  }
  const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(now - start_).count();
  current_.push_back({current_.size(), kind, layer, microbatch, bytes, id,
                      nanos > 0 ? static_cast<uint64_t>(nanos) : uint64_t{0}});
}

std::vector<TraceEvent> StepTrace::Last(uint64_t* dropped) const {
  absl::MutexLock lock(&mu_);
  if (dropped != nullptr) *dropped = last_dropped_;
  return last_;
}

}  // namespace stowage::runtime
