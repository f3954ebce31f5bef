#include "planner/simulator.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/checked_math.h"

namespace stowage::planner {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

struct MemEvent {
  double time;
  int64_t delta;
  int what;  // >= 0: layer index of a compute op starting; -1 tail; -2 other
  Phase phase;
};

}  // namespace

SimResult Simulate(const StepCost& step, const std::vector<OptionCost>& costs,
                   int prefetch_distance, bool record) {
  SimResult r;
  const int n = static_cast<int>(costs.size());
  const int distance = std::max(1, prefetch_distance);
  std::vector<MemEvent> mem;
  mem.reserve(8 * n + 8);
  auto add = [&](double t, int64_t delta, int what, Phase phase) {
    if (delta != 0) mem.push_back({t, delta, what, phase});
  };

  // Forward: never waits on copies.
  double now = step.embedding_seconds / 3;
  if (record) r.compute.push_back({Phase::kEmbedding, -1, 0, now, 0});
  std::vector<double> forward_end(n);
  for (int i = 0; i < n; ++i) {
    const OptionCost& c = costs[i];
    add(now, static_cast<int64_t>(c.forward_peak), i, Phase::kForward);
    const double end = now + c.forward_seconds;
    add(end,
        static_cast<int64_t>(c.resident_bytes + c.host_bytes) -
            static_cast<int64_t>(c.forward_peak),
        -2, Phase::kForward);
    if (record) r.compute.push_back({Phase::kForward, i, now, end, 0});
    forward_end[i] = end;
    now = end;
    r.host_bytes = CheckedAdd(r.host_bytes, c.host_bytes).value_or(~0ull);
    r.compute_seconds += c.compute_seconds();
  }
  const double tail_start = now;
  const double tail_end = now + step.tail_seconds;
  add(tail_start, static_cast<int64_t>(step.tail_bytes), -1, Phase::kTail);
  add(tail_end, -static_cast<int64_t>(step.tail_bytes), -2, Phase::kTail);
  // Gradients created in backward (eager PyTorch) stay to the end of the step.
  const bool grads = step.gradients_in_backward;
  if (grads) add(tail_end, static_cast<int64_t>(step.tail_grad_bytes), -2, Phase::kBackward);
  if (record) r.compute.push_back({Phase::kTail, -1, tail_start, tail_end, 0});
  r.compute_seconds += step.tail_seconds + step.embedding_seconds;

  // Copy jobs in issue order: D2H in forward order, H2D in backward order.
  std::vector<int> d2h_jobs, h2d_jobs;
  for (int i = 0; i < n; ++i) {
    if (costs[i].host_bytes > 0) d2h_jobs.push_back(i);
  }
  for (int i = n - 1; i >= 0; --i) {
    if (costs[i].host_bytes > 0) h2d_jobs.push_back(i);
  }
  std::vector<double> d2h_done(n, kNever), h2d_done(n, kNever), reach(n, kNever);
  if (n > 0) reach[n - 1] = tail_end;

  struct Engine {
    size_t next = 0;  // next job to start
    int active = -1;  // layer being copied
    double remaining = 0;
    double started = 0;
  } d2h, h2d;

  auto h2d_ready = [&](int layer) {
    const int trigger = std::min(layer + distance, n - 1);
    return std::max(reach[trigger], d2h_done[layer]);
  };

  int next_b = n - 1;
  double t = 0;
  double step_end = tail_end;
  while (true) {
    // Start whatever can start at t.
    if (d2h.active < 0 && d2h.next < d2h_jobs.size() && forward_end[d2h_jobs[d2h.next]] <= t) {
      d2h.active = d2h_jobs[d2h.next++];
      d2h.remaining = static_cast<double>(costs[d2h.active].host_bytes);
      d2h.started = t;
    }
    if (h2d.active < 0 && h2d.next < h2d_jobs.size() && h2d_ready(h2d_jobs[h2d.next]) <= t) {
      h2d.active = h2d_jobs[h2d.next++];
      h2d.remaining = static_cast<double>(costs[h2d.active].host_bytes);
      h2d.started = t;
      add(t, static_cast<int64_t>(costs[h2d.active].host_bytes), -2, Phase::kBackward);
    }
    if (next_b >= 0 && reach[next_b] <= t &&
        (costs[next_b].host_bytes == 0 || h2d_done[next_b] <= t)) {
      const OptionCost& c = costs[next_b];
      const double start = t;
      const double end = start + c.recompute_seconds + c.backward_seconds;
      add(start,
          static_cast<int64_t>(c.backward_peak) -
              static_cast<int64_t>(c.resident_bytes + c.host_bytes) +
              (grads && next_b < static_cast<int>(step.layers.size())
                   ? static_cast<int64_t>(step.layers[next_b].grad_bytes)
                   : 0),
          next_b, Phase::kBackward);
      add(end, -static_cast<int64_t>(c.backward_peak), -2, Phase::kBackward);
      const double stall = start - reach[next_b];
      r.exposed_copy_seconds += stall;
      if (record) r.compute.push_back({Phase::kBackward, next_b, start, end, stall});
      if (next_b > 0) reach[next_b - 1] = end;
      step_end = end;
      --next_b;
      continue;  // the new reach time may let an H2D start now
    }
    // Next event.
    const bool both = d2h.active >= 0 && h2d.active >= 0;
    const double d2h_rate = both ? step.bidir_d2h_bytes_per_second : step.d2h_bytes_per_second;
    const double h2d_rate = both ? step.bidir_h2d_bytes_per_second : step.h2d_bytes_per_second;
    double next = kNever;
    if (d2h.active >= 0) next = std::min(next, t + d2h.remaining / d2h_rate);
    if (h2d.active >= 0) next = std::min(next, t + h2d.remaining / h2d_rate);
    if (d2h.active < 0 && d2h.next < d2h_jobs.size()) {
      next = std::min(next, forward_end[d2h_jobs[d2h.next]]);
    }
    if (h2d.active < 0 && h2d.next < h2d_jobs.size()) {
      next = std::min(next, h2d_ready(h2d_jobs[h2d.next]));
    }
    if (next_b >= 0) {
      const double ready =
          costs[next_b].host_bytes == 0 ? reach[next_b] : std::max(reach[next_b], h2d_done[next_b]);
      next = std::min(next, ready);
    }
    if (next == kNever) break;
    next = std::max(next, t);
    const double dt = next - t;
    // Advance the active copies; a copy whose finish time is `next` completes exactly there.
    if (d2h.active >= 0) {
      if (t + d2h.remaining / d2h_rate <= next) {
        const int layer = d2h.active;
        d2h_done[layer] = next;
        add(next, -static_cast<int64_t>(costs[layer].host_bytes), -2, Phase::kForward);
        if (record) r.copies.push_back({layer, true, costs[layer].host_bytes, d2h.started, next});
        d2h.active = -1;
      } else {
        d2h.remaining -= d2h_rate * dt;
      }
    }
    if (h2d.active >= 0) {
      if (t + h2d.remaining / h2d_rate <= next) {
        const int layer = h2d.active;
        h2d_done[layer] = next;
        if (record) r.copies.push_back({layer, false, costs[layer].host_bytes, h2d.started, next});
        h2d.active = -1;
      } else {
        h2d.remaining -= h2d_rate * dt;
      }
    }
    t = next;
  }
  if (grads) add(step_end, static_cast<int64_t>(step.embedding_grad_bytes), -2, Phase::kBackward);
  // --optimizer-offload: the step's gradient and weight copies run after the backward.
  r.step_seconds = step_end + step.embedding_seconds * 2 / 3 + step.optimizer_copy_seconds;
  r.host_bytes += step.optimizer_host_bytes;
  if (record) {
    r.compute.push_back({Phase::kEmbedding, -1, step_end, r.step_seconds, 0});
  }

  // Device memory: frees before allocations at the same instant.
  std::sort(mem.begin(), mem.end(), [](const MemEvent& a, const MemEvent& b) {
    return a.time != b.time ? a.time < b.time : a.delta < b.delta;
  });
  int64_t level = static_cast<int64_t>(step.fixed.total());
  int64_t peak = level;
  r.peak_seconds = 0;
  r.peak_at = "start";
  int current_layer = -1;
  Phase current_phase = Phase::kEmbedding;
  if (record) r.timeline.push_back({0, static_cast<uint64_t>(level)});
  for (const MemEvent& e : mem) {
    // Byte counts fit int64 and their sums cannot wrap when the step keeps within
    // CheckStepCostBounds (kMaxStepBytes = 2^62); a step that does not saturates the level
    // (a peak that fits no budget) instead of wrapping to a small one.
    level = CheckedAdd(level, e.delta).value_or(std::numeric_limits<int64_t>::max());
    if (e.what >= 0 || e.what == -1) {
      current_layer = e.what;
      current_phase = e.phase;
    }
    if (level > peak) {
      peak = level;
      r.peak_seconds = e.time;
      if (current_phase == Phase::kTail) {
        r.peak_at = "LM head and loss";
      } else {
        r.peak_at = absl::StrCat(current_phase == Phase::kForward ? "forward" : "backward",
                                 " of layer ", current_layer);
      }
    }
    if (record) {
      // Events at one instant merge into one point (the starting point at 0 stays).
      if (r.timeline.size() > 1 && r.timeline.back().seconds == e.time) {
        r.timeline.back().bytes = static_cast<uint64_t>(level);
      } else {
        r.timeline.push_back({e.time, static_cast<uint64_t>(level)});
      }
    }
  }
  r.peak_bytes = static_cast<uint64_t>(peak);
  return r;
}

SimResult Simulate(const StepCost& step, const Schedule& schedule, bool record) {
  std::vector<OptionCost> costs;
  costs.reserve(step.layers.size());
  for (size_t i = 0; i < step.layers.size(); ++i) {
    costs.push_back(EvaluateOption(step.layers[i], schedule.options[i]));
  }
  return Simulate(step, costs, schedule.prefetch_distance, record);
}

}  // namespace stowage::planner
