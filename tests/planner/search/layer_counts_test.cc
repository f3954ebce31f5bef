// The whole-layer relaxation (planner/search/layer_counts.h) against enumeration of every count
// vector on small random instances: the dual never exceeds the integer optimum, a completed search
// equals it, and a search cut short (or stopped within a gap) still bounds it.
#include "planner/search/layer_counts.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "absl/strings/str_cat.h"

namespace stowage::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Every count vector (per group a composition of its layers over its options): the cheapest
// within both rooms, +inf if none.
double Enumerate(const std::vector<CountGroup>& groups, double gpu_room, double host_room) {
  double best = kInf;
  std::function<void(size_t, size_t, int64_t, double, double, double)> visit =
      [&](size_t g, size_t k, int64_t left, double gpu, double host, double cost) {
        if (g == groups.size()) {
          if (gpu <= gpu_room && host <= host_room) best = std::min(best, cost);
          return;
        }
        const std::vector<CountOption>& o = groups[g].options;
        if (k + 1 == o.size()) {
          const double t = static_cast<double>(left);
          const int64_t next = g + 1 < groups.size() ? groups[g + 1].layers : 0;
          visit(g + 1, 0, next, gpu + t * o[k].gpu, host + t * o[k].host, cost + t * o[k].cost);
          return;
        }
        for (int64_t t = 0; t <= left; ++t) {
          const double x = static_cast<double>(t);
          visit(g, k + 1, left - t, gpu + x * o[k].gpu, host + x * o[k].host, cost + x * o[k].cost);
        }
      };
  visit(0, 0, groups.empty() ? 0 : groups[0].layers, 0, 0, 0);
  return best;
}

// Random groups of identical layers shaped like a layer's options: keep (GPU bytes, least time),
// recompute and selective recompute (fewer GPU bytes for more time), offloads (host bytes instead,
// some as cheap as keeping); ties in cost are common, as in real layers.
std::vector<CountGroup> RandomGroups(std::mt19937_64& rng) {
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  auto integer = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<CountGroup> groups(integer(1, 3));
  for (CountGroup& g : groups) {
    g.layers = integer(1, 7);
    const double keep = uniform(1, 2), saved = std::floor(uniform(100, 1000));
    const double input = std::floor(saved * uniform(0.05, 0.4));
    const double rerun = std::round(uniform(0.2, 1) * 8) / 8;  // ties between options
    g.options.push_back({keep, saved, 0});
    g.options.push_back({keep + rerun, input, 0});
    g.options.push_back(
        {keep + rerun * uniform(0.1, 0.9), std::floor(saved * uniform(0.3, 0.9)), 0});
    g.options.push_back({keep + rerun, 0, input});
    g.options.push_back({keep + (integer(0, 1) ? 0 : uniform(0, 0.5)), 0, saved});
    const int drop = integer(0, 2);
    for (int d = 0; d < drop && g.options.size() > 1; ++d) {
      g.options.erase(g.options.begin() + integer(0, static_cast<int>(g.options.size()) - 1));
    }
  }
  return groups;
}

TEST(LayerCounts, EqualsEnumerationAndBoundsIt) {
  std::mt19937_64 rng(20261202);
  int feasible = 0, infeasible = 0, above_dual = 0, cut_short = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const std::vector<CountGroup> groups = RandomGroups(rng);
    double most_gpu = 0, most_host = 0;
    for (const CountGroup& g : groups) {
      for (const CountOption& o : g.options) {
        most_gpu += static_cast<double>(g.layers) * o.gpu / 2;
        most_host += static_cast<double>(g.layers) * o.host / 3;
      }
    }
    const double gpu_room =
        std::floor(std::uniform_real_distribution<double>(0, 1)(rng) * most_gpu);
    const double host_room =
        std::floor(std::uniform_real_distribution<double>(0, 1)(rng) * most_host);
    const double optimum = Enumerate(groups, gpu_room, host_room);
    SCOPED_TRACE(absl::StrCat("trial ", trial, ", rooms ", gpu_room, " / ", host_room));
    const TwoPrices dual = BestTwoPrices(groups, gpu_room, host_room);
    const LayerCounts exact = SolveLayerCounts(groups, gpu_room, host_room, kInf, 0, 1'000'000);
    ASSERT_TRUE(exact.complete);
    if (optimum == kInf) {
      ++infeasible;
      EXPECT_EQ(exact.cost, kInf);
      continue;
    }
    ++feasible;
    EXPECT_LE(dual.value, optimum * (1 + 1e-12));
    above_dual += optimum > dual.value * (1 + 1e-9);
    EXPECT_NEAR(exact.cost, optimum, 1e-9 * optimum);
    EXPECT_LE(exact.bound, optimum * (1 + 1e-12));
    EXPECT_GE(exact.bound, optimum * (1 - 1e-9));
    // The counts are the cost's, sum to each group's layers and fit both rooms.
    double cost = 0, gpu = 0, host = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      int64_t layers = 0;
      for (size_t k = 0; k < groups[g].options.size(); ++k) {
        const double x = static_cast<double>(exact.counts[g][k]);
        ASSERT_GE(exact.counts[g][k], 0);
        layers += exact.counts[g][k];
        cost += x * groups[g].options[k].cost;
        gpu += x * groups[g].options[k].gpu;
        host += x * groups[g].options[k].host;
      }
      EXPECT_EQ(layers, groups[g].layers);
    }
    EXPECT_NEAR(cost, exact.cost, 1e-9 * optimum);
    EXPECT_LE(gpu, gpu_room * (1 + 1e-12));
    EXPECT_LE(host, host_room * (1 + 1e-12));
    // Within a gap, below a cutoff, or cut short after a few evaluations: still a bound, and a
    // plan within the gap where it completed.
    const LayerCounts gap = SolveLayerCounts(groups, gpu_room, host_room, kInf, 1e-2, 1'000'000);
    EXPECT_LE(gap.bound, optimum * (1 + 1e-12));
    EXPECT_LE(gap.cost, optimum * (1 + 1e-2) * (1 + 1e-12));
    const LayerCounts below =
        SolveLayerCounts(groups, gpu_room, host_room, optimum * 0.999, 0, 1'000'000);
    EXPECT_LE(below.bound, optimum * (1 + 1e-12));
    EXPECT_EQ(below.cost, kInf);
    const LayerCounts cut = SolveLayerCounts(groups, gpu_room, host_room, kInf, 0, 3);
    EXPECT_LE(cut.bound, optimum * (1 + 1e-12));
    cut_short += !cut.complete;
  }
  // The instances exercise every outcome: infeasible rooms, integer optima above the dual (the
  // rounding the counts close) and searches cut short.
  EXPECT_GT(feasible, 200);
  EXPECT_GT(infeasible, 10);
  EXPECT_GT(above_dual, 50);
  EXPECT_GT(cut_short, 20);
}

// Thousands of identical layers: the search's children are located by the lines of their duals,
// not enumerated, so a group of 10,000 layers needs a few hundred evaluations at most, and the
// counts fill both rooms to within one layer's choice.
TEST(LayerCounts, ThousandsOfIdenticalLayersTakeFewEvaluations) {
  CountGroup g;
  g.layers = 9999;
  g.options = {{0.2069, 0, 5.71e8},      // offload saved tensors
               {0.2069, 5.71e8, 0},      // keep
               {0.206933, 4.535e8, 0},   // selective recompute
               {0.208306, 0, 3.355e7},   // offload the input
               {0.208306, 3.355e7, 0}};  // recompute
  CountGroup last;
  last.layers = 1;
  last.options = {{0.208306, 3.355e7, 0}, {0.2069, 5.71e8, 0}};
  const std::vector<CountGroup> groups = {g, last};
  const double gpu_room = 174151913313, host_room = 219902325555;
  const LayerCounts r = SolveLayerCounts(groups, gpu_room, host_room, kInf, 0, 100'000);
  ASSERT_TRUE(r.complete);
  EXPECT_LT(r.evaluations, 500);
  EXPECT_LE(r.bound, r.cost);
  EXPECT_GE(r.bound, r.cost * (1 - 1e-12));
  const TwoPrices dual = BestTwoPrices(groups, gpu_room, host_room);
  EXPECT_LE(dual.value, r.cost);
}

}  // namespace
}  // namespace stowage::planner
