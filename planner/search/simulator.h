// The step simulator: replays one training step of a schedule on three resources — compute, the
// D2H copy engine and the H2D copy engine — and reports device memory over time, its peak, host
// bytes, step time, the compute time lost waiting on copies, and the step's events.
//
// It runs the protocol of Note [Runtime protocol] (include/stowage/plan.h), the one the runtime
// and the PyTorch wrapper carry out, from the per-layer LayerProtocol the plan carries:
//  - forward runs layer 0..L-1, then the LM head and loss (the tail), then backward L-1..0;
//  - a layer's save is issued when its forward starts (offload_input) or ends (offload_saved,
//    whose tensors appear during the forward); D2H copies run one at a time in issue order;
//  - before the forward of layer save_wait_before_layer (L: before backward, after the tail)
//    compute waits until that layer's D2H has landed, and only then are its device bytes freed
//    (so they stay on the GPU until that wait even when the copy landed earlier);
//  - when compute reaches the backward of layer prefetch_after_layer, the layer's H2D is issued
//    (several at once: highest layer first); its device bytes are allocated at issue (the
//    destination is allocated then); H2D copies run one at a time in issue order, never before
//    the layer's own D2H landed;
//  - a layer's recompute + backward waits for its H2D (restore);
//  - the waits are the exposed copy time. Every save is waited for before backward starts, so
//    D2H and H2D never overlap and the bidirectional rates do not apply.
// Note [In-flight microbatches]: a pipeline stage holding m = LayerCost::in_flight_microbatches
// microbatches of a layer runs the step above for one of them while the other m - 1 hold that
// layer's resident bytes on the GPU (from before the step to its end: they wait for their
// backward) and every one of the m holds its host bytes in pinned memory.
#ifndef STOWAGE_PLANNER_SIMULATOR_H_
#define STOWAGE_PLANNER_SIMULATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "planner/cost/cost_model.h"
#include "stowage/plan.h"

namespace stowage::planner {

struct Schedule {
  std::vector<LayerOption> options;  // one per layer
  int prefetch_distance = 1;
  int save_lag = kDefaultSaveLag;
};

// One predicted event of the step, in the runtime trace's words (StepEventKind); `bytes` is the
// layer's whole transfer (the runtime traces each tensor: the per-layer sums compare).
struct StepEvent {
  StepEventKind kind = StepEventKind::kSaveIssued;
  int layer = 0;
  uint64_t bytes = 0;
  double seconds = 0;
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
  // Every D2H and H2D of the step at its one-way rate, back to back: with compute_seconds, the
  // step time if no copy overlapped compute (PlanPrediction::unoverlapped_step_seconds).
  double copy_seconds = 0;
  // Communication compute waits for (planner/cost/communication.h), included in step_seconds.
  double exposed_comm_seconds = 0;
  // Filled when recording: timeline, compute and copy intervals.
  std::vector<MemoryPoint> timeline;
  std::vector<ComputeInterval> compute;
  std::vector<CopyInterval> copies;
  // In order: the trainer's calls (save/wait/prefetch/restore) in the order it makes them, each
  // landing at its time (a landing at the same instant as a call goes first).
  std::vector<StepEvent> events;
};

// LayerProtocolFor each layer of `costs` (a layer offloads when its host_bytes > 0).
std::vector<LayerProtocol> ProtocolFor(const std::vector<OptionCost>& costs, int prefetch_distance,
                                       int save_lag = kDefaultSaveLag);

// The same within each of the step's model chunks (StepCost::chunks; a pipeline stage with
// several): a layer's fields stay inside its chunk (Note [Pipeline stages] in plan.h).
std::vector<LayerProtocol> ProtocolFor(const StepCost& step, const std::vector<OptionCost>& costs,
                                       int prefetch_distance, int save_lag = kDefaultSaveLag);

// `costs[i]` = EvaluateOption(step.layers[i], schedule.options[i]); `protocol[i]` the layer's
// plan fields (ProtocolFor, or a plan's layers).
SimResult Simulate(const StepCost& step, const std::vector<OptionCost>& costs,
                   const std::vector<LayerProtocol>& protocol, bool record);
// With ProtocolFor(costs, prefetch_distance) (the default save lag).
SimResult Simulate(const StepCost& step, const std::vector<OptionCost>& costs,
                   int prefetch_distance, bool record);
SimResult Simulate(const StepCost& step, const Schedule& schedule, bool record);

// Note [Gradient timing] (cost_model.cc): what the step holds through its backward besides the
// layers' resident, in-flight and prefetched bytes. in_layer[j]: in the backward of layer j
// besides j's own bytes (OptionCost::backward_peak, which counts the gradients j's backward has
// made by its peak) — the logits the caller holds (StepCost::held_logits_bytes) and, where
// gradients are made in backward, the LM head's and those of layers j + 1 .. n - 1; in_layer[n-1]
// is also what the tail leaves. at_end: after the last backward (layer 0's, then the
// embedding's): the logits and every gradient, and where gradients are made in backward, the
// gradient the embedding's backward receives (layer 0's input's) beside the one it makes. The
// simulator's levels and the optimizer's memory bounds (Note [Exact search]) are both made of these
// sums.
struct BackwardHeld {
  std::vector<uint64_t> in_layer;
  uint64_t at_end = 0;
};
BackwardHeld BackwardHeldBytes(const StepCost& step);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_SIMULATOR_H_
