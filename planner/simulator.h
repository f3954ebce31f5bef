// The step simulator: replays one training step of a schedule on three resources — compute, the
// D2H copy engine and the H2D copy engine — and reports device memory over time, its peak, host
// bytes, step time and the compute time lost waiting on copies.
//
// Dependencies it honours (the runtime's, see include/stowage/stowage.h):
//  - forward runs layer 0..L-1, then the LM head and loss (the tail), then backward L-1..0;
//  - a layer's D2H starts after its forward ends, copies run one at a time per engine in issue
//    order, and the device bytes are freed when the D2H completes;
//  - a layer's H2D is issued when compute reaches the backward of layer
//    min(index + prefetch_distance, L - 1) and never before its own D2H completes; its device
//    bytes are allocated when it starts;
//  - a layer's recompute + backward waits for its H2D (the wait is the exposed copy time);
//  - while both engines run, each runs at its bidirectional rate.
#ifndef STOWAGE_PLANNER_SIMULATOR_H_
#define STOWAGE_PLANNER_SIMULATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "planner/cost_model.h"

namespace stowage::planner {

struct Schedule {
  std::vector<LayerOption> options;  // one per layer
  int prefetch_distance = 1;
};

struct MemoryPoint {
  double seconds = 0;
  uint64_t bytes = 0;  // device bytes in use from this time on (fixed memory included)
};

enum class Phase { kEmbedding, kForward, kTail, kBackward };

struct ComputeInterval {
  Phase phase = Phase::kForward;
  int layer = -1;  // -1 for the embedding and the tail
  double start = 0, end = 0;
  double stall = 0;  // wait for this layer's H2D before start
};

struct CopyInterval {
  int layer = 0;
  bool d2h = true;
  uint64_t bytes = 0;
  double start = 0, end = 0;
};

struct SimResult {
  uint64_t peak_bytes = 0;
  double peak_seconds = 0;
  std::string peak_at;  // e.g. "backward of layer 44", "loss"
  uint64_t host_bytes = 0;
  double step_seconds = 0;
  double compute_seconds = 0;
  double exposed_copy_seconds = 0;
  // Filled when recording: timeline, compute and copy intervals.
  std::vector<MemoryPoint> timeline;
  std::vector<ComputeInterval> compute;
  std::vector<CopyInterval> copies;
};

// `costs[i]` = EvaluateOption(step.layers[i], schedule.options[i]).
SimResult Simulate(const StepCost& step, const std::vector<OptionCost>& costs,
                   int prefetch_distance, bool record);
SimResult Simulate(const StepCost& step, const Schedule& schedule, bool record);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_SIMULATOR_H_
