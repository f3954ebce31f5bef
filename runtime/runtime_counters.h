// RuntimeCounters: everything the runtime counts, as plain atomics. The engine's hot paths
// (save, prefetch, restore, copy completion) only add to these; the Prometheus exporter
// (runtime/metrics.*) reads them at scrape time, so metrics cost nothing between scrapes and
// the engine never calls into prometheus-cpp. stowage_get_stats() reads the same counters.
#ifndef STOWAGE_RUNTIME_RUNTIME_COUNTERS_H_
#define STOWAGE_RUNTIME_RUNTIME_COUNTERS_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
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

// Note [Step duration buckets]. histogram_quantile interpolates linearly inside the bucket a
// quantile falls in, so the median of a step time that stays put at x in (a, b] reads back as the
// bucket's midpoint (a + b) / 2: off by at most (b - a) / 2a, i.e. (r - 1) / 2 for bounds r apart.
// The default bounds are 12 per decade, 10^(k/12) s to 3 significant digits (r <= 1.215: the
// median within 10.75% at any step time in range; 28.5 s reads 28.85 s), from 10 ms (k = -24) to
// 681 s (k = 34), the first bound past 10 minutes: 59 buckets. The old 1-2.5-5 bounds up to 60 s
// read a 28.5 s step as 42.5 s. Each bound is the double nearest its 3-digit spelling; the `le`
// label is that double as prometheus-cpp writes it (%.16g), which spells 3 of the 59 with 16
// digits (0.06809999999999999, 0.5620000000000001, 68.09999999999999). A job whose steps sit in a
// narrow band can set its own bounds (stowage_options.metrics_step_buckets or
// STOWAGE_METRICS_STEP_BUCKETS; ParseStepSecondsBuckets in runtime/metrics.h).
inline constexpr int kStepBucketsPerDecade = 12;
inline constexpr int kFirstStepBucketExponent = -24;  // 10^(-24/12) s = 10 ms
inline constexpr int kLastStepBucketExponent = 34;    // 10^(34/12) s = 681 s, past 10 minutes
// Most bounds a job may configure: each is one series per rank.
inline constexpr size_t kMaxStepSecondsBuckets = 128;

inline std::vector<double> DefaultStepSecondsBuckets() {
  std::vector<double> bounds;
  for (int k = kFirstStepBucketExponent; k <= kLastStepBucketExponent; ++k) {
    const double exact = std::pow(10.0, static_cast<double>(k) / kStepBucketsPerDecade);
    // 3 significant digits as an integer mantissa times a power of ten, divided (or multiplied)
    // exactly, so the bound is the double nearest its decimal spelling.
    const int exponent = static_cast<int>(std::floor(std::log10(exact) + 1e-9)) - 2;
    const double mantissa = std::round(exact / std::pow(10.0, exponent));
    const double scale = std::pow(10.0, std::abs(exponent));
    bounds.push_back(exponent < 0 ? mantissa / scale : mantissa * scale);
  }
  return bounds;
}

// Note [Per-step gauges]. What one step peaks at (pinned bytes, device bytes awaiting their D2H,
// copies in flight) and what it stalled is tracked while the step runs (running maxima on the hot
// paths: atomics only) and exported as the last completed step's values, set once at step end
// (RecordStep). A gauge of the live value sampled at scrape time read 0 between steps and
// anything up to the peak within one, depending on when the scrape came.
struct RuntimeCounters {
  RuntimeCounters() { SetStepSecondsBuckets(DefaultStepSecondsBuckets()); }

  // Set once at creation. Identity (Note [Rank labels] in runtime/metrics.h).
  std::string gpu = "host";  // the GPU's UUID as DCGM names it ("GPU-8c2f..."); "host" backend
  std::string hostname = "unknown";  // the machine (gethostname): where the NUMA node is
  int rank = -1;                     // RANK (-1: not launched as a rank)
  int local_rank = -1;               // LOCAL_RANK
  int stage = 0;                     // pipeline stage this runtime runs (options.stage)
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
  std::atomic<uint64_t> arena_peak_bytes{0};  // most ever in use within one step (stowage_stats)

  // Bytes the trainer handed to save() this step and still on the device until their D2H lands.
  std::atomic<uint64_t> device_pending_bytes{0};
  std::atomic<uint64_t> observed_peak_device_bytes{0};  // reported by the trainer

  CopyCounters d2h;
  CopyCounters h2d;
  std::atomic<uint64_t> copies_in_flight{0};
  std::atomic<uint64_t> saves_total{0};
  std::atomic<uint64_t> restores_total{0};
  std::atomic<uint64_t> stall_nanos{0};  // consumer waited on an unfinished H2D

  // The step running now (Note [Per-step gauges]): maxima so far.
  std::atomic<uint64_t> step_arena_peak_bytes{0};
  std::atomic<uint64_t> step_pending_peak_bytes{0};
  std::atomic<uint64_t> step_in_flight_peak{0};
  // The last completed step, set once at its end.
  std::atomic<uint64_t> last_step_nanos{0};
  std::atomic<uint64_t> last_step_arena_peak_bytes{0};
  std::atomic<uint64_t> last_step_pending_peak_bytes{0};
  std::atomic<uint64_t> last_step_in_flight_peak{0};
  std::atomic<uint64_t> last_step_stall_nanos{0};

  std::atomic<uint64_t> steps_total{0};
  std::atomic<uint64_t> step_nanos_sum{0};
  // Upper bounds of stowage_step_duration_seconds (Note [Step duration buckets]; +Inf implied) and
  // the steps that fell in each (non-cumulative; one more entry than bounds: past the last).
  // Set once at creation, like the identity.
  std::vector<double> step_seconds_bounds;
  std::vector<std::atomic<uint64_t>> step_seconds_bucket;

  // Failed calls by stowage_status code (index = code; 0 unused).
  std::array<std::atomic<uint64_t>, 8> errors_by_status{};

  std::vector<std::unique_ptr<LayerTypeCounters>> layer_types;  // fixed after creation

  // `bounds` increasing, finite, positive (ParseStepSecondsBuckets checks text from users). Before
  // the exporter starts and before the first step only.
  void SetStepSecondsBuckets(std::vector<double> bounds) {
    step_seconds_bounds = std::move(bounds);
    step_seconds_bucket = std::vector<std::atomic<uint64_t>>(step_seconds_bounds.size() + 1);
  }

  // At step end (the runtime's EndStep, after the drain): counts the step and publishes what it
  // peaked at and stalled (Note [Per-step gauges]), then starts the next step's maxima from what
  // is held now (nothing, after the release).
  void RecordStep(double seconds, double stall_seconds = 0) {
    AddSeconds(stall_nanos, stall_seconds);
    last_step_stall_nanos.store(ToNanos(stall_seconds), std::memory_order_relaxed);
    last_step_arena_peak_bytes.store(
        step_arena_peak_bytes.exchange(arena_used_bytes.load(std::memory_order_relaxed)),
        std::memory_order_relaxed);
    last_step_pending_peak_bytes.store(
        step_pending_peak_bytes.exchange(device_pending_bytes.load(std::memory_order_relaxed)),
        std::memory_order_relaxed);
    last_step_in_flight_peak.store(
        step_in_flight_peak.exchange(copies_in_flight.load(std::memory_order_relaxed)),
        std::memory_order_relaxed);
    last_step_nanos.store(ToNanos(seconds), std::memory_order_relaxed);
    steps_total.fetch_add(1, std::memory_order_relaxed);
    AddSeconds(step_nanos_sum, seconds);
    // Bucket i holds (bounds[i-1], bounds[i]]: the first bound not below the step (le is
    // inclusive); past the last bound, the +Inf entry.
    const size_t i = static_cast<size_t>(
        std::lower_bound(step_seconds_bounds.begin(), step_seconds_bounds.end(), seconds) -
        step_seconds_bounds.begin());
    step_seconds_bucket[i].fetch_add(1, std::memory_order_relaxed);
  }
  void RecordArenaUse(uint64_t used) {
    arena_used_bytes.store(used, std::memory_order_relaxed);
    RaiseTo(arena_peak_bytes, used);
    RaiseTo(step_arena_peak_bytes, used);
  }
  // save() handed `bytes` to the copy engine; they stay on the device until the D2H lands.
  void AddDevicePending(uint64_t bytes) {
    RaiseTo(step_pending_peak_bytes,
            device_pending_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  }
  void CopyIssued() {
    RaiseTo(step_in_flight_peak, copies_in_flight.fetch_add(1, std::memory_order_relaxed) + 1);
  }

 private:
  static uint64_t ToNanos(double seconds) {
    return seconds > 0 ? static_cast<uint64_t>(seconds * 1e9) : 0;
  }
  static void RaiseTo(std::atomic<uint64_t>& peak, uint64_t value) {
    uint64_t seen = peak.load(std::memory_order_relaxed);
    while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
    }
  }
};

}  // namespace stowage::runtime

#endif  // STOWAGE_RUNTIME_RUNTIME_COUNTERS_H_
