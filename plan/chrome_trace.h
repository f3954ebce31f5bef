// One step as Chrome trace-event JSON (the "JSON Object Format" of the Trace Event Format that
// chrome://tracing and Perfetto open): the planner writes the step it predicts
// (`stowage plan --trace`) and the runtime the step it measured (stowage_get_trace_json), in the
// same tracks and names, so the two files overlay.
//
// Note [Step trace tracks]. One process per file (its name says predicted or measured, and for
// whom), threads as tracks:
//   compute  — forward / recompute / backward of each layer, the embedding and the loss (predicted
//              only: the runtime does not see the trainer's kernels);
//   stall    — compute waiting for a layer's prefetch before it may start (predicted);
//   D2H, H2D — each copy from its issue to its landing, paired from the step events (a save's
//              save_issued→save_landed, a prefetch's prefetch_issued→prefetch_landed; by tensor id
//              when the events carry one, else by layer, first in first out); copies overlap
//              (they queue on the link, and the runtime copies on several threads), so each
//              copy track is packed into as many lanes ("D2H", "D2H 2", ...) as it needs;
//   waits    — the trainer's save_wait and restore calls, as instants;
// plus a "device memory" counter where the planner knows it. Times are microseconds from the
// step's start. A span's args carry its layer, bytes, (compute) policy and, for the runtime's
// events, the tensor and its microbatch.
#ifndef STOWAGE_PLAN_CHROME_TRACE_H_
#define STOWAGE_PLAN_CHROME_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "stowage/plan.h"

namespace stowage {

struct TraceSpan {
  std::string name;    // e.g. "forward 3", "backward 3", "loss"
  int layer = -1;      // -1 for the embedding and the loss
  std::string policy;  // the layer's policy name ("" when not a layer)
  double start_seconds = 0;
  double end_seconds = 0;
};

struct TraceStall {
  int layer = 0;
  double start_seconds = 0;
  double end_seconds = 0;
};

// A step event (StepEventKind) at a time since the step began; `id` is the tensor's id (0 when
// the events are per layer, as the simulator's are).
struct TraceStepEvent {
  StepEventKind kind = StepEventKind::kSaveIssued;
  int layer = 0;
  uint64_t bytes = 0;
  uint64_t id = 0;
  double seconds = 0;
  int microbatch = -1;  // the tensor's microbatch (runtime events); -1 when per layer
};

struct TraceMemoryPoint {
  double seconds = 0;
  uint64_t bytes = 0;
};

struct StepTraceInput {
  // The trace's process: distinct for the predicted (1) and each measured (its pid) step, so that
  // files loaded together sit side by side.
  int pid = 1;
  std::string process_name;  // e.g. "predicted: stowage plan (glm-5.3-flash, h200)"
  std::vector<TraceSpan> compute;
  std::vector<TraceStall> stalls;
  std::vector<TraceStepEvent> events;  // in the order recorded
  std::vector<TraceMemoryPoint> device_bytes;
};

// The trace-event JSON of one step. A copy whose landing is missing (a step cut short) ends at
// the last event's time and says so in its args ("landed": false).
std::string StepTraceJson(const StepTraceInput& input);

}  // namespace stowage

#endif  // STOWAGE_PLAN_CHROME_TRACE_H_
