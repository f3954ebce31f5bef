// The search's incumbent, the best plan within the budgets simulated so far: each distance's own
// fronts (Refine), step 2's seeds (Note [Seeds]), the bound of a plan (Note [Plan bounds]), hill
// climbing (Improve) and the simulation that makes a plan the incumbent (TryLeaf).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "planner/search/optimizer_internal.h"

namespace stowage::planner::optimizer_internal {

// Refines the fronts of every distance whose bound the incumbent does not already beat.
void Search::Refine() {
  for (Distance& dist : distances_) {
    if (Settled()) return;
    if (dist.bound >= best_seconds_ * settle_ || dist.fronts != nullptr) continue;
    // Its fronts relax the host budget, so their bound is at most relaxed_upper: where that
    // is no more than the bound already known (a binding host budget, Note [Two prices]),
    // building them cannot help.
    if (dist.relaxed_upper <= dist.bound) continue;
    // Note [Bounded work]: a refinement costs about (its windows / the shared one's) times the
    // shared fronts' work.
    const double work = shared_->work() * std::pow(shared_model_->classes(), kMaxWindow - 1);
    if (refine_work_ + work > kRefineFactor * shared_->work()) continue;
    refine_work_ += work;
    Build(dist);
    for (const std::vector<int>& pick : dist.fronts->Plans(kFrontPlans)) TryLeaf(pick, dist.d);
  }
  std::stable_sort(distances_.begin(), distances_.end(),
                   [](const Distance& a, const Distance& b) { return a.bound < b.bound; });
}

// Step 2: the fronts' best plans, and uniform plans (every layer input offloaded while the
// host budget lasts, the rest and the last layers recomputed; each chunk count).
// Note [Seeds]
// Each seed is a simulation of every layer, so they stop as soon as the incumbent is proven
// (what follows could only be faster by less than kProvenTolerance); a plan that offloads
// nothing is simulated once for all distances (the distance changes only an offloading layer's
// protocol fields); and a plan simulated only to become the incumbent is not simulated when its
// bound cannot beat it (Note [Plan bounds]). Where no budget binds (the bench's deep Llama up to
// 300 layers) the fronts' first plan is proven after one simulation, where 52 were made before
// on every stage.
void Search::Seed() {
  if (Settled()) return;  // by Note [Whole layers] alone
  // Where the fronts' plan takes more host memory than the budget (the prices exist), the whole
  // layers' plan first: it is usually within the gap, and the fronts' plans do not fit.
  if (prices_.first >= 0) WholeLayers();
  if (Settled()) return;
  for (const std::vector<int>& pick : shared_->Plans(kFrontPlans)) {
    const bool done = TryEveryDistance(pick, [&](Distance& dist, const SimResult& sim) {
      if (sim.peak_bytes <= o_.gpu_budget_bytes) {
        dist.relaxed_upper = std::min(dist.relaxed_upper, sim.step_seconds);
      }
    });
    if (done) return;
  }
  for (const std::vector<int>& pick : priced_plans_) {
    if (TryEveryDistance(pick)) return;
  }
  RoundPrices();
  if (Settled()) return;
  for (int chunks : o_.chunk_counts) {
    for (int keep_last : {0, 1, 2}) {
      std::vector<int> pick(n_, -1);
      uint64_t host = 0;
      for (int i = 0; i < n_; ++i) {
        LayerPolicy policy = LayerPolicy::kRecompute;
        // Every in-flight microbatch's input is pinned (Note [In-flight microbatches]).
        const uint64_t m =
            static_cast<uint64_t>(std::max(1, step_.layers[i].in_flight_microbatches));
        if (i < n_ - keep_last &&
            FitsBudget(host, CheckedMul(m, step_.layers[i].input_bytes).value_or(~0ull), 0,
                       o_.host_budget_bytes)) {
          policy = LayerPolicy::kOffloadInput;
        }
        if (o_.force.has_value()) policy = *o_.force;
        for (size_t k = 0; k < cand_[i].size(); ++k) {
          const LayerOption& option = cand_[i][k].option;
          if (option.policy == policy && option.chunks == chunks) pick[i] = static_cast<int>(k);
        }
        if (pick[i] < 0) break;
        host += m * cand_[i][pick[i]].cost.host_bytes;
      }
      if (std::find(pick.begin(), pick.end(), -1) != pick.end()) continue;
      if (TryEveryDistance(pick)) return;
    }
  }
}

// `pick` simulated at every distance (once when it offloads nothing), `seen(distance, its
// simulation)` for each; whether the incumbent is then proven, which ends the seeds (Note
// [Seeds]).
template <typename F>
bool Search::TryEveryDistance(const std::vector<int>& pick, F&& seen) {
  bool offloads = false;
  for (int i = 0; i < n_ && !offloads; ++i) offloads = cand_[i][pick[i]].cost.host_bytes > 0;
  std::optional<SimResult> once;
  for (Distance& dist : distances_) {
    if (!offloads && once.has_value()) {
      seen(dist, *once);
      continue;
    }
    const SimResult sim = TryLeaf(pick, dist.d);
    seen(dist, sim);
    if (!offloads) once = sim;
    if (Settled()) return true;
  }
  return false;
}

// The same for a plan simulated only to become the incumbent: not at all when it cannot
// (Note [Plan bounds]).
bool Search::TryEveryDistance(const std::vector<int>& pick) {
  if (CannotWin(PlanBound(pick))) return false;
  return TryEveryDistance(pick, [](Distance&, const SimResult&) {});
}

// Note [Plan bounds]
// The shared model's costs bound every plan, not only the fronts' least: the simulated step of
// `pick` at any of the distances is at least the fixed seconds plus the sum of its options'
// Model::Cost (compute plus the copy-wait bounds of Note [Forward waits] and
// Note [Backward waits], which hold for any plan, with the shared model's waits for the largest
// distance).
// A plan whose bound is no less than the incumbent's step cannot replace it, so the seeds and
// hill climbing do not simulate it (as the branch and bound prunes a child).
double Search::PlanBound(const std::vector<int>& pick) const {
  double sum = shared_model_->fixed_seconds();
  for (int i = 0; i < n_; ++i) sum += shared_model_->Cost(i, pick[i]);
  return sum;
}

bool Search::CannotWin(double bound) const { return bound >= best_seconds_ * (1 - 1e-12); }

// Hill climbing from the best plan: change one layer's option while that shortens the
// simulated step. Only improves the incumbent, so the search's bound cuts more.
void Search::Improve() {
  if (best_pick_.empty()) return;
  const double start = simulated_layers_;
  // The two levels of Note [Two prices] every plan within the budgets keeps: a change that
  // takes the incumbent's past its room cannot fit, so it is not simulated.
  const double gpu_room = shared_model_->room();
  const double host_room = Model::HostRoom(step_, o_);
  double gpu = 0, host = 0, bound = 0;
  auto totals = [&] {
    gpu = host = 0;
    for (int i = 0; i < n_; ++i) {
      gpu += LevelOf(i, best_pick_[i]);
      host += HostOf(i, best_pick_[i]);
    }
    bound = PlanBound(best_pick_);
  };
  totals();
  std::vector<int> pick;
  for (int pass = 0; pass < 8; ++pass) {
    bool improved = false;
    for (int i = 0; i < n_; ++i) {
      for (size_t k = 0; k < cand_[i].size(); ++k) {
        if (simulated_layers_ - start >= kImproveSimulations * n_ || Settled()) return;
        if (static_cast<int>(k) == best_pick_[i]) continue;
        // Without copy waits only less compute can shorten the step.
        if (best_stall_ == 0 &&
            cand_[i][k].cost.compute_seconds() >= cand_[i][best_pick_[i]].cost.compute_seconds()) {
          continue;
        }
        const int kk = static_cast<int>(k);
        if (gpu - LevelOf(i, best_pick_[i]) + LevelOf(i, kk) > gpu_room ||
            host - HostOf(i, best_pick_[i]) + HostOf(i, kk) > host_room) {
          continue;
        }
        // Note [Plan bounds]: a change whose bound is no faster than the incumbent cannot win.
        if (CannotWin(bound - shared_model_->Cost(i, best_pick_[i]) + shared_model_->Cost(i, kk))) {
          continue;
        }
        pick = best_pick_;
        pick[i] = static_cast<int>(k);
        const double before = best_seconds_;
        TryLeaf(pick, best_distance_);
        if (best_seconds_ < before) {
          improved = true;
          totals();
        }
      }
    }
    if (!improved) return;
  }
}

SimResult Search::TryLeaf(const std::vector<int>& pick, int distance) {
  std::vector<OptionCost> costs(n_);
  for (int i = 0; i < n_; ++i) costs[i] = cand_[i][pick[i]].cost;
  SimResult sim = Simulate(step_, costs, distance, /*record=*/false);
  simulated_layers_ += n_;
  ++leaves_;
  if (sim.peak_bytes <= o_.gpu_budget_bytes && sim.host_bytes <= o_.host_budget_bytes &&
      sim.step_seconds < best_seconds_) {
    best_seconds_ = sim.step_seconds;
    best_stall_ = sim.exposed_copy_seconds;
    best_pick_ = pick;
    best_distance_ = distance;
  }
  return sim;
}

}  // namespace stowage::planner::optimizer_internal
