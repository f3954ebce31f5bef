// What a plan is compared with: keeping every layer's saved tensors where that fits the GPU
// budget, else full recompute, simulated on the same step.
#ifndef STOWAGE_PLANNER_SEARCH_BASELINE_H_
#define STOWAGE_PLANNER_SEARCH_BASELINE_H_

#include <cstdint>
#include <string>

#include "planner/cost/cost_model.h"
#include "planner/search/simulator.h"

namespace stowage::planner {

// What the plan is compared with: keep everything where that fits the GPU budget, else full
// recompute (every layer input kept on the GPU).
struct Baseline {
  std::string name;  // "keep" or "recompute"
  SimResult sim;
};
Baseline ComputeBaseline(const StepCost& step, uint64_t gpu_budget_bytes);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_SEARCH_BASELINE_H_
