// RuntimeCounters: everything the runtime counts, as plain atomics. The engine's hot paths
// (save, prefetch, restore, copy completion) only add to these; the Prometheus exporter
// (runtime/metrics.*) reads them at scrape time, so metrics cost nothing between scrapes and
// the engine never calls into prometheus-cpp. stowage_get_stats() reads the same counters.
#ifndef STOWAGE_RUNTIME_RUNTIME_COUNTERS_H_
#define STOWAGE_RUNTIME_RUNTIME_COUNTERS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace stowage::runtime {

// Adds `seconds` to a nanosecond counter (atomics of double are not lock-free everywhere).
inline void AddSeconds(std::atomic<uint64_t>& nanos, double seconds) {
  if (seconds > 0) nanos.fetch_add(static_cast<uint64_t>(seconds * 1e9), std::memory_order_relaxed);
}
inline double Seconds(const std::atomic<uint64_t>& nanos) {
  return static_cast<double>(nanos.load(std::memory_order_relaxed)) * 1e-9;
}

struct CopyCounters {  // one per direction: "d2h", "h2d"
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> copies{0};
  std::atomic<uint64_t> busy_nanos{0};  // time the copy engine spent on these copies
};

struct LayerTypeCounters {  // one per distinct layer type in the plan (bounded label)
  std::string layer_type;
  std::atomic<uint64_t> saved_bytes{0};  // D2H bytes saved for layers of this type
  std::atomic<uint64_t> restored_bytes{0};
};

// Fixed buckets for step duration, in seconds (upper bounds; +Inf implied).
inline constexpr std::array<double, 12> kStepSecondsBuckets = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                               1,    2.5,   5,    10,  25,   60};

struct RuntimeCounters {
  // Set once at creation. Identity (Note [Rank labels] in runtime/metrics.h).
  std::string gpu = "host";  // the GPU's UUID as DCGM names it ("GPU-8c2f..."); "host" backend
  int rank = -1;             // RANK (-1: not launched as a rank)
  int local_rank = -1;       // LOCAL_RANK
  int stage = 0;             // pipeline stage this runtime runs (options.stage)
  int numa_node = -1;
  std::string backend;                       // "host" or "cuda"
  uint64_t predicted_peak_device_bytes = 0;  // from the plan
  uint64_t predicted_host_bytes_per_gpu = 0;
  double predicted_step_seconds = 0;
  uint64_t gpu_budget_bytes = 0;
  double link_bytes_per_second = 0;  // per direction, the plan's runtime.*; 0 unknown

  // Pinned host arena.
  std::atomic<uint64_t> arena_capacity_bytes{0};
  std::atomic<uint64_t> arena_used_bytes{0};
  std::atomic<uint64_t> arena_peak_bytes{0};

  // Bytes the trainer handed to save() this step and still on the device until their D2H lands.
  std::atomic<uint64_t> device_pending_bytes{0};
  std::atomic<uint64_t> observed_peak_device_bytes{0};  // reported by the trainer

  CopyCounters d2h;
  CopyCounters h2d;
  std::atomic<uint64_t> copies_in_flight{0};
  std::atomic<uint64_t> saves_total{0};
  std::atomic<uint64_t> restores_total{0};
  std::atomic<uint64_t> stall_nanos{0};  // consumer waited on an unfinished H2D

  std::atomic<uint64_t> steps_total{0};
  std::atomic<uint64_t> last_step_nanos{0};
  std::atomic<uint64_t> step_nanos_sum{0};
  std::array<std::atomic<uint64_t>, kStepSecondsBuckets.size()>
      step_seconds_bucket{};  // non-cumulative

  // Failed calls by stowage_status code (index = code; 0 unused).
  std::array<std::atomic<uint64_t>, 8> errors_by_status{};

  std::vector<std::unique_ptr<LayerTypeCounters>> layer_types;  // fixed after creation

  void RecordStep(double seconds) {
    steps_total.fetch_add(1, std::memory_order_relaxed);
    last_step_nanos.store(static_cast<uint64_t>(seconds * 1e9), std::memory_order_relaxed);
    AddSeconds(step_nanos_sum, seconds);
    size_t i = 0;
    while (i < kStepSecondsBuckets.size() && seconds > kStepSecondsBuckets[i]) ++i;
    if (i < kStepSecondsBuckets.size())
      step_seconds_bucket[i].fetch_add(1, std::memory_order_relaxed);
  }
  void RecordArenaUse(uint64_t used) {
    arena_used_bytes.store(used, std::memory_order_relaxed);
    uint64_t peak = arena_peak_bytes.load(std::memory_order_relaxed);
    while (used > peak &&
           !arena_peak_bytes.compare_exchange_weak(peak, used, std::memory_order_relaxed)) {
    }
  }
};

}  // namespace stowage::runtime

#endif  // STOWAGE_RUNTIME_RUNTIME_COUNTERS_H_
