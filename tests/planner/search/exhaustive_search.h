// ExhaustiveSearch, the tests' reference for the optimizer: every combination of AllOptions per
// layer and every prefetch distance, simulated (only for a handful of layers).
#ifndef STOWAGE_TESTS_PLANNER_SEARCH_EXHAUSTIVE_SEARCH_H_
#define STOWAGE_TESTS_PLANNER_SEARCH_EXHAUSTIVE_SEARCH_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "planner/search/optimizer.h"
#include "planner/search/simulator.h"

namespace stowage::planner {

// The fastest plan within the budgets (proven_optimal; nodes: the simulations), or where none
// fits MinimumPeak's answer.
inline OptimizeResult ExhaustiveSearch(const StepCost& step, const OptimizerOptions& o) {
  const int n = static_cast<int>(step.layers.size());
  std::vector<std::vector<LayerOption>> all(n);
  std::vector<std::vector<OptionCost>> costs(n);
  for (int i = 0; i < n; ++i) {
    for (const LayerOption& option : AllOptions(step.layers[i], o.chunk_counts)) {
      if (o.force.has_value() && option.policy != *o.force) continue;
      all[i].push_back(option);
      costs[i].push_back(EvaluateOption(step.layers[i], option));
    }
  }
  OptimizeResult best;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double best_seconds = kInf;
  std::vector<int> idx(n, 0);
  std::vector<OptionCost> chosen(n);
  while (true) {
    for (int i = 0; i < n; ++i) chosen[i] = costs[i][idx[i]];
    for (int d : o.prefetch_distances) {
      SimResult sim = Simulate(step, chosen, d, false);
      ++best.nodes;
      if (sim.peak_bytes <= o.gpu_budget_bytes && sim.host_bytes <= o.host_budget_bytes &&
          sim.step_seconds < best_seconds) {
        best_seconds = sim.step_seconds;
        best.schedule.options.clear();
        for (int i = 0; i < n; ++i) best.schedule.options.push_back(all[i][idx[i]]);
        best.schedule.prefetch_distance = d;
      }
    }
    int i = 0;
    while (i < n && ++idx[i] == static_cast<int>(all[i].size())) idx[i++] = 0;
    if (i == n) break;
  }
  if (best_seconds == kInf) return MinimumPeak(step, o);
  // The best schedule with its recorded simulation, as Optimize reports its plan.
  OptimizeResult r;
  r.schedule.options = best.schedule.options;
  r.schedule.prefetch_distance = best.schedule.prefetch_distance;
  r.sim = Simulate(step, r.schedule, /*record=*/true);
  r.feasible = true;
  r.proven_optimal = true;
  r.nodes = best.nodes;
  return r;
}

}  // namespace stowage::planner

#endif  // STOWAGE_TESTS_PLANNER_SEARCH_EXHAUSTIVE_SEARCH_H_
