// The search's priced relaxations of the host budget: a price on it over the fronts
// (Note [Host price]) and prices on both budgets over the level at the LM head (Note [Two prices]),
// their plans rounded from the prices and, in whole layers, from the counts of Note [Whole layers]
// (layer_counts.cc).
#include <algorithm>
#include <cmath>
#include <compare>
#include <cstdint>
#include <map>
#include <numeric>
#include <utility>
#include <vector>

#include "planner/search/optimizer_internal.h"

namespace stowage::planner::optimizer_internal {

// Note [Host price]
// The fronts relax the host budget away; where the plan they find offloads more than the budget
// takes (deep models: beyond about 380 of the bench's Llama layers), that plan does not fit and
// their bound is the step without the budget. A price p >= 0 per pinned byte restores the
// budget as a Lagrangian relaxation: for every plan within the host room B,
//   sum c_k >= sum (c_k + p m_k H_k) - p B,
// so fronts over the priced costs, less p B (Model's host_price), bound every plan within the
// budgets. PriceHost walks p from a first guess, doubling it until the fronts' plan fits the
// room, then halving the interval between a price whose plan is over the room and one whose
// plan is within (kPriceSteps fronts at most). The plans within the
// room, and the plan within the room taking the over-room plan's choice for as many layers as the
// room takes (in layer order and in reverse), are candidates for step 2. Priced fronts of many
// identical layers are long (the price makes options that tied at no cost differ), so these
// fronts are kPriceFront labels: linear work, plans that fit. Their bound is used only where it
// beats the unpriced one, which at that size it rarely does (measured at 1,000 layers: 64-label
// priced fronts bound the step at 206.65 s, the unpriced 207.23 s; full-size priced fronts 207.55
// s, but in 0.7 s of CPU). Where the two prices exist (Note [Two prices]) this is not run: their
// relaxation bounds the host budget and their rounding gives the plans (at their p, the one
// front this built there changed no plan and no bound on the bench's deep rows, 500 to 10,000
// layers over 1, 4 and 16 stages, and took 25-45% of their CPU).
void Search::PriceHost(double& bound) {
  if (o_.host_budget_bytes >= (1ull << 62)) return;  // no budget to price
  const double room = Model::HostRoom(step_, o_);
  std::vector<std::vector<int>> over = shared_->Plans(1);
  if (over.empty() || HostOf(over[0]) <= room) return;
  // A first price: what a layer's dearest option costs over its cheapest, per pinned byte of
  // its largest offload.
  double price = 0;
  for (int i = 0; i < n_; ++i) {
    double least_cost = kInf, most_cost = 0, most_host = 0;
    for (int k = 0; k < static_cast<int>(cand_[i].size()); ++k) {
      least_cost = std::min(least_cost, shared_model_->Cost(i, k));
      most_cost = std::max(most_cost, shared_model_->Cost(i, k));
      most_host = std::max(most_host, HostOf(i, k));
    }
    if (most_host > 0) price = std::max(price, (most_cost - least_cost) / most_host);
  }
  if (!(price > 0)) return;
  double low = 0, high = -1;  // prices whose plan is over / within the room
  std::vector<int> low_plan = over[0], high_plan;
  for (int step = 0; step < kPriceSteps; ++step) {
    const double p = high < 0 ? price : (low + high) / 2;
    const Model model(step_, o_, cand_, least_, kDefaultSaveLag, 1, most_, p);
    const Fronts fronts(model, kPriceFront);
    bound = std::max(bound, fronts.Root() + model.fixed_seconds());
    std::vector<std::vector<int>> plans = fronts.Plans(1);
    if (plans.empty()) break;  // nothing fits the GPU at this price (nor at any other)
    if (HostOf(plans[0]) > room) {
      low = p;
      low_plan = plans[0];
      if (high < 0) price *= 2;
    } else {
      high = p;
      high_plan = plans[0];
      priced_plans_.push_back(plans[0]);
    }
    if (high >= 0 && high - low <= kPriceTolerance * high) break;
  }
  if (high_plan.empty()) return;
  for (bool forward : {true, false}) {
    std::vector<int> mix = high_plan;
    double host = HostOf(mix);
    for (int t = 0; t < n_; ++t) {
      const int i = forward ? t : n_ - 1 - t;
      if (mix[i] == low_plan[i]) continue;
      const double delta = HostOf(i, low_plan[i]) - HostOf(i, mix[i]);
      if (host + delta > room) continue;
      host += delta;
      mix[i] = low_plan[i];
    }
    priced_plans_.push_back(std::move(mix));
  }
}

// Note [Two prices]
// Where the host budget binds, the fronts' model has a simpler relaxation that prices both
// budgets. Keep only two of its constraints: the levels every plan reaches at the LM head and
// loss (fixed + sum_k m_k R_k + H_{n-1} + the pending saves before it + the tail's need, Model::
// Need of the last layer) and in the last layer's own forward and backward (fixed + the prefix's
// sum_k m_k R_k + (m - 1) R + its working set, + what the step holds there), which share the
// prefix's sum, and the host budget (sum_k m_k H_k <= the host room B). With a_k = m_k R_k (for
// the last layer the most its option adds in those levels: LevelOf), b_k = m_k H_k and G = the
// GPU room, every plan within the budgets has sum a_k <= G and sum b_k <= B (the pending saves
// and prefetches are >= 0), so for any prices l, p >= 0
//   sum_k c_k >= sum_k (c_k + l a_k + p b_k) - l G - p B >= sum_k min_options(c + l a + p b)
//                                                           - l G - p B =: D(l, p),
// with c_k = Model::Cost (compute + the copy-wait bounds): D(l, p) + the fixed seconds bounds
// every plan's step (weak duality; any l, p >= 0 gives a valid bound, the best is the linear
// relaxation of the two-budget knapsack). D is concave; for each p the best l is exact (the
// slope sum a(l) - G falls at the breakpoints of each layer's lower envelope of lines), and p
// is found by golden section. Layers whose (c, a, b) lists are equal are one group counted
// with its size, so the work is in distinct layers, not layers: a model of 1,000 identical
// layers is two groups (the last carries the LM head). Why it closes deep models: the DP fronts
// are exact in GPU bytes but their host price (Note [Host price]) has to be thinned to stay
// linear, and thinning weakens the bound with every layer (1,000 layers: 206.64 s against a
// 207.7 s plan); the relaxation here loses only the levels before the LM head, the pending
// saves and the rounding of the few layers the relaxation's optimum splits between options.
// The branch and bound uses the same prices below a prefix: a completion's layers j > i have
// sum c_j >= sum_j min(c + l a + p b) - l (G - the prefix's a) - p (B - the prefix's b), valid
// for any l, p >= 0, so the root's prices serve every node (priced_suffix_ holds the sums).
void Search::PriceBudgets(double& bound) {
  if (count_groups_.empty()) return;  // no budget to price, or nothing fits
  {
    const std::vector<std::vector<int>> over = shared_->Plans(1);
    if (over.empty() || HostOf(over[0]) <= Model::HostRoom(step_, o_)) return;  // not binding
  }
  const Model& model = *shared_model_;
  const double l = dual_.gpu, p = dual_.host;
  prices_ = {l, p};
  // Each suffix's least priced cost, for the branch and bound's bound at these prices.
  priced_suffix_.assign(n_ + 1, 0);
  for (int i = n_ - 1; i >= 0; --i) {
    double least = kInf;
    for (int k = 0; k < static_cast<int>(cand_[i].size()); ++k) {
      least = std::min(least, model.Cost(i, k) + l * LevelOf(i, k) + p * HostOf(i, k));
    }
    priced_suffix_[i] = priced_suffix_[i + 1] + least;
  }
  bound = std::max(bound, dual_.value + model.fixed_seconds());
}

// The layers of Note [Two prices] grouped (Note [Whole layers]) and the relaxation's dual.
void Search::GroupLayers() {
  if (o_.host_budget_bytes >= (1ull << 62)) return;  // no budget to price
  const Model& model = *shared_model_;
  const double gpu_room = model.room();  // the last layer's level counts the tail (LevelOf)
  if (gpu_room < 0) return;
  const double host_room = Model::HostRoom(step_, o_);
  // Layers whose (c, a, b) lists are equal are one group (Note [Whole layers] in
  // layer_counts.cc), in the order of their first layer.
  struct Line {
    double c, a, b;
    auto operator<=>(const Line&) const = default;
  };
  std::map<std::vector<Line>, int> group_of;
  count_groups_.clear();
  group_layers_.clear();
  for (int i = 0; i < n_; ++i) {
    std::vector<Line> lines;
    for (int k = 0; k < static_cast<int>(cand_[i].size()); ++k) {
      lines.push_back({model.Cost(i, k), LevelOf(i, k), HostOf(i, k)});
    }
    std::sort(lines.begin(), lines.end());
    const auto [it, added] = group_of.try_emplace(lines, static_cast<int>(count_groups_.size()));
    if (added) {
      CountGroup& group = count_groups_.emplace_back();
      for (const Line& x : lines) group.options.push_back({x.c, x.a, x.b});
      group_layers_.emplace_back();
    }
    ++count_groups_[it->second].layers;
    group_layers_[it->second].push_back(i);
  }
  dual_ = BestTwoPrices(count_groups_, gpu_room, host_room);
  if (!(dual_.value < kInf)) {  // nothing fits the level at the LM head
    count_groups_.clear();
    return;
  }
  gpu_room_ = gpu_room;
  host_room_ = host_room;
}

// The plans of the two prices (Note [Two prices]): at (l, p) every option of a layer whose
// priced cost c + l a + p b is its least is as good as any other in the relaxation, so the
// relaxation's optimum fills both budgets with them: each layer starts at its tied option that
// takes the least (the dearest c) and, in layer order then again, moves to the cheapest tied
// option that still fits what is left of G and B. The plan is simulated exactly; where it does
// not fit (the pending saves and the levels before the LM head are not in the relaxation) G or
// B shrinks by the excess and the rounding runs again.
void Search::RoundPrices() {
  if (prices_.first < 0) return;
  const Model& model = *shared_model_;
  const auto [l, p] = prices_;
  std::vector<std::vector<int>> tied(n_);
  auto weight = [&](int i, int k, bool gpu) {
    const double m = model.Multiplier(i);
    const double h = static_cast<double>(cand_[i][k].cost.host_bytes);
    return gpu ? LevelOf(i, k) : m * h;
  };
  for (int i = 0; i < n_; ++i) {
    double least = kInf;
    for (int k = 0; k < static_cast<int>(cand_[i].size()); ++k) {
      least = std::min(least, model.Cost(i, k) + l * weight(i, k, true) + p * weight(i, k, false));
    }
    for (int k = 0; k < static_cast<int>(cand_[i].size()); ++k) {
      const double v = model.Cost(i, k) + l * weight(i, k, true) + p * weight(i, k, false);
      if (v <= least + kTieTolerance * std::abs(least)) tied[i].push_back(k);
    }
  }
  double gpu_cap = gpu_room_, host_cap = Model::HostRoom(step_, o_);
  for (int attempt = 0; attempt < kRoundAttempts; ++attempt) {
    std::vector<int> pick(n_);
    double used_gpu = 0, used_host = 0;
    for (int i = 0; i < n_; ++i) {
      pick[i] = tied[i][0];
      for (int k : tied[i]) {
        if (model.Cost(i, k) > model.Cost(i, pick[i])) pick[i] = k;
      }
      used_gpu += weight(i, pick[i], true);
      used_host += weight(i, pick[i], false);
    }
    for (int pass = 0; pass < 3; ++pass) {
      for (int i = 0; i < n_; ++i) {
        const bool over = used_gpu > gpu_cap || used_host > host_cap;
        int best = -1;
        for (int k : tied[i]) {
          if (k == pick[i]) continue;
          const double ga = used_gpu + weight(i, k, true) - weight(i, pick[i], true);
          const double hb = used_host + weight(i, k, false) - weight(i, pick[i], false);
          // Never past a budget that was met, never further past one that was not; while
          // over, only moves that bring an exceeded budget back count.
          if (!(ga <= gpu_cap || ga <= used_gpu) || !(hb <= host_cap || hb <= used_host)) continue;
          if (over ? !((used_gpu > gpu_cap && ga < used_gpu) ||
                       (used_host > host_cap && hb < used_host))
                   : model.Cost(i, k) >= model.Cost(i, pick[i])) {
            continue;
          }
          if (best < 0 || model.Cost(i, k) < model.Cost(i, best)) best = k;
        }
        if (best < 0) continue;
        used_gpu += weight(i, best, true) - weight(i, pick[i], true);
        used_host += weight(i, best, false) - weight(i, pick[i], false);
        pick[i] = best;
      }
    }
    const auto [over_gpu, over_host] = OverBudget(TryLeaf(pick, least_));
    if (over_gpu <= 0 && over_host <= 0) {
      TryEveryDistance(pick);
      return;
    }
    if (over_gpu > 0) gpu_cap -= over_gpu;
    if (over_host > 0) host_cap -= over_host;
  }
}

// How far a simulated plan's GPU peak and pinned host bytes exceed their budgets (<= 0: fits).
std::pair<double, double> Search::OverBudget(const SimResult& sim) const {
  return {static_cast<double>(sim.peak_bytes) - static_cast<double>(o_.gpu_budget_bytes),
          static_cast<double>(sim.host_bytes) - static_cast<double>(o_.host_budget_bytes)};
}

// Note [Two prices] in whole layers (Note [Whole layers] in layer_counts.cc): the relaxation's
// integer optimum bounds every distance; its counts, given to each group's layers (the
// offloading options to the first layers: their pending saves and prefetches then meet the
// smallest resident prefix), are simulated, and where that plan does not fit (the levels the
// relaxation leaves out) the room it exceeded shrinks by the excess and the counts are solved
// again, as RoundPrices does.
void Search::WholeLayers() {
  if (count_groups_.empty() || whole_layers_) return;
  whole_layers_ = true;
  const double fixed = shared_model_->fixed_seconds();
  double gpu_cap = gpu_room_, host_cap = host_room_;
  for (int attempt = 0; attempt < kRoundAttempts; ++attempt) {
    const double cutoff = best_seconds_ < kInf ? best_seconds_ - fixed : kInf;
    const LayerCounts counts =
        SolveLayerCounts(count_groups_, gpu_cap, host_cap, cutoff, count_gap_, kCountEvaluations);
    if (attempt == 0) {
      // The rooms as they are: a bound on every plan.
      for (Distance& dist : distances_) dist.bound = std::max(dist.bound, counts.bound + fixed);
    }
    if (!(counts.cost < kInf) || Settled()) return;
    std::vector<int> pick(n_, -1);
    for (size_t g = 0; g < count_groups_.size(); ++g) {
      const std::vector<CountOption>& options = count_groups_[g].options;
      std::vector<int> order(options.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
        return options[x].host != options[y].host ? options[x].host > options[y].host
                                                  : options[x].gpu > options[y].gpu;
      });
      size_t at = 0;
      for (int j : order) {
        for (int64_t c = 0; c < counts.counts[g][j]; ++c) {
          const int i = group_layers_[g][at++];
          for (int k = 0; k < static_cast<int>(cand_[i].size()) && pick[i] < 0; ++k) {
            if (shared_model_->Cost(i, k) == options[j].cost && LevelOf(i, k) == options[j].gpu &&
                HostOf(i, k) == options[j].host) {
              pick[i] = k;
            }
          }
        }
      }
    }
    if (std::find(pick.begin(), pick.end(), -1) != pick.end()) return;  // cannot happen
    const auto [over_gpu, over_host] = OverBudget(TryLeaf(pick, least_));
    if (over_gpu <= 0 && over_host <= 0) {
      TryEveryDistance(pick);
      return;
    }
    // Below what these counts take of the relaxation's rooms by the excess: the next counts
    // differ.
    double used_gpu = 0;
    for (int i = 0; i < n_; ++i) used_gpu += LevelOf(i, pick[i]);
    if (over_gpu > 0) gpu_cap = std::min(gpu_cap, used_gpu) - over_gpu;
    if (over_host > 0) host_cap = std::min(host_cap, HostOf(pick)) - over_host;
  }
}

// Layer i's option k in the levels of Note [Two prices] (a_k): its weighted resident bytes;
// the last layer's, the most its option adds to the prefix's in the LM head and loss (its own
// resident and pending bytes beside the tail's need), its own forward or its own backward (the
// other microbatches' resident bytes, its working set, what the step holds there).
double Search::LevelOf(int i, int k) const {
  const Model& model = *shared_model_;
  const double m = model.Multiplier(i), r = model.Resident(i, k);
  if (i + 1 < n_) return m * r;
  const OptionCost& c = cand_[i][k].cost;
  return std::max({m * r + static_cast<double>(c.host_bytes) + model.tail_need(),
                   (m - 1) * r + static_cast<double>(c.forward_peak),
                   (m - 1) * r + static_cast<double>(c.backward_peak) +
                       static_cast<double>(held_.in_layer[i])});
}

// Pinned bytes of layer i's option k over its in-flight microbatches, and of a plan.
double Search::HostOf(int i, int k) const {
  return shared_model_->Multiplier(i) * static_cast<double>(cand_[i][k].cost.host_bytes);
}

double Search::HostOf(const std::vector<int>& pick) const {
  double host = 0;
  for (int i = 0; i < n_; ++i) host += HostOf(i, pick[i]);
  return host;
}

}  // namespace stowage::planner::optimizer_internal
