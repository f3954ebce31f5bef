// The optimizer: chooses one option per layer (policy, recompute modules, FFN/MoE chunk count)
// and the prefetch distance that minimise the simulated step time within the GPU and host
// budgets. Exact: Pareto fronts over the layers bound the step, priced relaxations bring a binding
// host budget into the bound, and a branch and bound closes what remains or states the gap; see
// Note [Exact search] in optimizer.cc.
#ifndef STOWAGE_PLANNER_OPTIMIZER_H_
#define STOWAGE_PLANNER_OPTIMIZER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "planner/cost/cost_model.h"
#include "planner/search/simulator.h"

namespace stowage::planner {

struct OptimizerOptions {
  uint64_t gpu_budget_bytes = 0;
  uint64_t host_budget_bytes = 0;  // pinned host bytes one GPU may use
  std::vector<int> chunk_counts = {1, 2, 4, 8};
  std::vector<int> prefetch_distances = {1, 2, 3, 4};
  // Evaluate one uniform policy instead of choosing (keep, recompute or offload_input); chunk
  // counts and prefetch distance are still chosen.
  std::optional<LayerPolicy> force;
  // Search nodes before the best plan found so far is returned unproven.
  int64_t node_limit = 5000;
  // The search stops once its plan is within this relative gap of its lower bound: step /
  // bound - 1 <= optimality_gap (Note [Optimality gap] in optimizer.cc). 0 proves the plan
  // optimal (to rounding, 1e-9). The default is the mixed-integer solvers' (Gurobi MIPGap,
  // CPLEX EpGap: 1e-4).
  double optimality_gap = kDefaultOptimalityGap;
  static constexpr double kDefaultOptimalityGap = 1e-4;
  static constexpr double kMaxOptimalityGap = 1e-2;
};

struct OptimizeResult {
  bool feasible = false;
  Schedule schedule;  // when feasible (or forced): the chosen schedule
  SimResult sim;      // its simulation
  // No plan within the budgets is faster (to rounding, 1e-9): the gap is 0.
  bool proven_optimal = false;
  // Within OptimizerOptions::optimality_gap of lower_bound_seconds (true when proven).
  bool within_gap = false;
  // No plan within the budgets is faster than this.
  double lower_bound_seconds = 0;
  int64_t nodes = 0;
  // When infeasible: the smallest peak the options reach and what binds.
  uint64_t min_peak_bytes = 0;
  std::string binding;  // "fixed memory", "host memory", "working set of ...", "LM head and loss"
  std::string explanation;
};

OptimizeResult Optimize(const StepCost& step, const OptimizerOptions& options);

// step / lower_bound_seconds - 1 of a feasible result: no plan within the budgets is faster by
// more than this fraction (0 when proven optimal or infeasible).
double OptimalityGap(const OptimizeResult& result);

// "proven", "within_gap" or "unproven" (PlanPrediction::optimality); "" when infeasible.
const char* OptimalityName(const OptimizeResult& result);

// OptimizerOptions::optimality_gap checked: `what` names it in the error (a flag, a field).
absl::Status CheckOptimalityGap(double gap, const std::string& what);

// The smallest peak stowage's options reach within the host budget, and which term binds.
OptimizeResult MinimumPeak(const StepCost& step, const OptimizerOptions& options);

// The longest sequence (a multiple of `granularity` tokens) for which Optimize finds a plan
// within the budgets — and, when `max_step_seconds` > 0, a step no longer than that — searching
// up to `limit` tokens; 0 when not even `granularity` fits.
absl::StatusOr<uint64_t> LongestFittingSeqLen(const ModelConfig& model,
                                              const HardwareProfile& hardware, RunSettings run,
                                              const OptimizerOptions& options, uint64_t granularity,
                                              uint64_t limit, double max_step_seconds = 0);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_OPTIMIZER_H_
