// The baseline a plan is compared with, simulated.
#include "planner/search/baseline.h"

namespace stowage::planner {

Baseline ComputeBaseline(const StepCost& step, uint64_t gpu_budget_bytes) {
  Schedule keep;
  keep.options.assign(step.layers.size(), {LayerPolicy::kKeep, 0, 1});
  SimResult sim = Simulate(step, keep, false);
  if (sim.peak_bytes <= gpu_budget_bytes) return {"keep", sim};
  Schedule recompute;
  recompute.options.assign(step.layers.size(), {LayerPolicy::kRecompute, 0, 1});
  return {"recompute", Simulate(step, recompute, false)};
}

}  // namespace stowage::planner
