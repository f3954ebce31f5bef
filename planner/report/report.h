// Turning an optimized schedule into what users read and what the runtime reads: the plan
// (include/stowage/plan.h), the per-layer table with its summary, and the timeline picture.
#ifndef STOWAGE_PLANNER_REPORT_H_
#define STOWAGE_PLANNER_REPORT_H_

#include <string>

#include "base/bytes.h"
#include "planner/cost/cost_model.h"
#include "planner/search/baseline.h"
#include "planner/search/optimizer.h"
#include "stowage/plan.h"

namespace stowage::planner {

struct PlanLabels {
  std::string generator;  // "stowage <version>"
  std::string model;      // preset name or config path
  std::string hardware;   // preset name or profile path
  uint64_t gpu_budget_bytes = 0;
  uint64_t host_budget_bytes = 0;
};

// The plan for a simulated schedule; passes ValidatePlan.
Plan MakePlan(const StepCost& step, const OptimizeResult& result, const Baseline& baseline,
              const PlanLabels& labels);

// The per-layer table and the summary below it.
std::string RenderTable(const StepCost& step, const Plan& plan, const OptimizeResult& result);
std::string RenderSummary(const StepCost& step, const Plan& plan, const OptimizeResult& result);

// Device memory over the step (forward rising, backward falling) against the budget, with the
// compute, D2H and H2D lanes below it. Self-contained SVG 1.1.
std::string RenderTimelineSvg(const StepCost& step, const Plan& plan, const OptimizeResult& result);

// The predicted step as Chrome trace-event JSON (plan/chrome_trace.h, Note [Step trace tracks]):
// compute per layer (recompute and backward apart), stalls, D2H and H2D copies, the trainer's
// waits and the device memory counter; the runtime writes the measured step in the same tracks.
std::string RenderStepTraceJson(const Plan& plan, const OptimizeResult& result);

// "12.3 GiB", "512.0 MiB".
// "850 ms", "4.56 s", "2173 s (36.2 min)", "19566 s (5.4 h)".
std::string FormatSeconds(double seconds);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_REPORT_H_
