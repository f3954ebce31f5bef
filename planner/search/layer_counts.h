// The two-budget relaxation of Note [Two prices] (prices.cc) in whole layers: layers whose
// options are equal form a group, and a choice for a group of n layers is a count per option
// (n binary decisions become one small knapsack in counts). Its linear relaxation's Lagrangian
// dual (BestTwoPrices) and its exact integer optimum by branch and bound over the counts
// (SolveLayerCounts); Note [Whole layers] in layer_counts.cc.
#ifndef STOWAGE_PLANNER_LAYER_COUNTS_H_
#define STOWAGE_PLANNER_LAYER_COUNTS_H_

#include <cstdint>
#include <limits>
#include <vector>

namespace stowage::planner {

// One option of a group's layers: its cost (seconds) and what it takes of the GPU room and of the
// host room (bytes).
struct CountOption {
  double cost = 0, gpu = 0, host = 0;
};

struct CountGroup {
  int64_t layers = 0;
  std::vector<CountOption> options;
};

// The best prices (l on GPU bytes, p on host bytes) of the Lagrangian dual
//   D(l, p) = sum_g layers_g min_k (cost + l gpu + p host) - l gpu_room - p host_room
// and D there: no count vector within both rooms costs less (weak duality, for any l, p >= 0).
// value is +inf where the options' least GPU bytes alone exceed the GPU room (nothing fits).
struct TwoPrices {
  double gpu = 0, host = 0;
  double value = -std::numeric_limits<double>::infinity();
};
TwoPrices BestTwoPrices(const std::vector<CountGroup>& groups, double gpu_room, double host_room);

struct LayerCounts {
  // The search ran to its end (no node limit): `bound` is the optimum, or the cutoff where
  // nothing below it exists.
  bool complete = false;
  // No count vector within both rooms costs less (+inf: none fits).
  double bound = 0;
  // The cheapest count vector found within both rooms (+inf: none), and its counts per group
  // and option (the input's order).
  double cost = std::numeric_limits<double>::infinity();
  std::vector<std::vector<int64_t>> counts;
  int64_t nodes = 0;
  int64_t evaluations = 0;  // of the dual at a node
};

// The cheapest count vector (sum over a group's options = its layers) whose GPU and host bytes
// are within the rooms, searched below `cutoff` (a cost known to be reachable otherwise: the
// bound is then at most the cutoff) until it is within the relative `gap` of the bound (0:
// exact, to 1e-12), with at most `work_limit` evaluations of the dual (cut short, the bound is
// the least of what is left, still valid).
LayerCounts SolveLayerCounts(const std::vector<CountGroup>& groups, double gpu_room,
                             double host_room, double cutoff, double gap, int64_t work_limit);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_LAYER_COUNTS_H_
