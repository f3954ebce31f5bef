// Step 3 of Note [Exact search]: a depth-first branch and bound over the layers, distance by
// distance, with exact prefix memory and host bytes, bounded by the suffix fronts and the two
// prices (Note [Two prices]), pruning within the optimality gap (Note [Optimality gap] in
// optimizer.cc) until proven or out of nodes.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "planner/search/optimizer_internal.h"

namespace stowage::planner::optimizer_internal {

// Step 3: branch and bound, distance by distance, until proven or out of nodes.
void Search::BranchAndBound() {
  search_start_ = simulated_layers_;
  for (Distance& dist : distances_) {
    if (Settled()) return;
    if (dist.bound >= best_seconds_ * settle_) {
      dist.searched = true;  // no plan at this distance is faster by more than the gap
      dist.pruned = dist.bound;
      continue;
    }
    // Without its own fronts (Refine: they could not bound more) the shared ones bound it.
    if (dist.fronts == nullptr && dist.relaxed_upper > dist.bound) Build(dist);
    dist.protocol = OffloadProtocol(step_, n_, dist.d, kDefaultSaveLag);
    current_ = &dist;
    pick_.assign(n_, -1);
    Dfs(0, 0, 0, 0, -kInf, 0.0);
    if (exhausted()) return;
    dist.searched = true;
  }
}

void Search::Build(Distance& dist) {
  dist.model =
      std::make_unique<Model>(step_, o_, cand_, dist.d, kDefaultSaveLag, kMaxWindow, dist.d);
  dist.fronts = std::make_unique<Fronts>(*dist.model);
  // Both bounds are valid; this one is the stronger.
  dist.bound = std::max(dist.bound, dist.fronts->Root() + dist.model->fixed_seconds());
}

// Layer i's memory terms beyond the prefix's resident bytes, from the prefix's actual picks
// (exact bytes; saturating: a sum that would wrap does not fit any budget).
uint64_t Search::NeedExact(int i, const OptionCost& c) const {
  uint64_t fwd = 0, bwd = 0;
  const std::vector<LayerProtocol>& protocol = current_->protocol;
  for (int k = std::max(0, i - std::max(kDefaultSaveLag, current_->d)); k < i; ++k) {
    const uint64_t host = cand_[k][pick_[k]].cost.host_bytes;
    if (protocol[k].save_wait_before_layer > i) fwd += host;
    if (protocol[k].prefetch_after_layer >= i) bwd += host;
  }
  const uint64_t a = CheckedAdd(c.forward_peak, fwd).value_or(~0ull);
  const uint64_t b = CheckedAdd(CheckedAdd(c.backward_peak, bwd).value_or(~0ull), held_.in_layer[i])
                         .value_or(~0ull);
  uint64_t need = std::max(a, b);
  if (i == n_ - 1) {  // the LM head and loss (Model::Need)
    const uint64_t tail = std::max(step_.tail_bytes, held_.in_layer[i]);
    need = std::max(need, CheckedAdd(c.resident_bytes + c.host_bytes + fwd, tail).value_or(~0ull));
  }
  if (i == 0) need = std::max(need, held_.at_end);
  return need;
}

// prefix: sum_{k<i} m_k R_k; qmax: the largest of the prefix layers' memory terms (each with

void Search::Dfs(int i, int key, uint64_t prefix, uint64_t host, double qmax, double cost) {
  if (++nodes_ > o_.node_limit || exhausted()) return;
  if (i == n_) {
    TryLeaf(pick_, current_->d);
    return;
  }
  const Model& model = current_->model != nullptr ? *current_->model : *shared_model_;
  const uint64_t fixed = step_.fixed.total();
  const uint64_t m = static_cast<uint64_t>(std::max(1, step_.layers[i].in_flight_microbatches));
  struct Child {
    int k;
    double bound;
    uint64_t prefix, host;
    double qmax;
  };
  std::vector<Child> children;
  children.reserve(cand_[i].size());
  for (size_t k = 0; k < cand_[i].size(); ++k) {
    const OptionCost& c = cand_[i][k].cost;
    const uint64_t h = CheckedMul(m, c.host_bytes).value_or(~0ull);
    if (!FitsBudget(host, h, 0, o_.host_budget_bytes)) continue;
    const uint64_t extra = CheckedMul(m - 1, c.resident_bytes).value_or(~0ull);
    const uint64_t need = NeedExact(i, c);
    if (!FitsBudget(fixed, CheckedAdd(prefix, extra).value_or(~0ull), need, o_.gpu_budget_bytes)) {
      continue;
    }
    const uint64_t next_prefix =
        CheckedAdd(prefix, CheckedMul(m, c.resident_bytes).value_or(~0ull)).value_or(~0ull);
    const double q = std::max(qmax + static_cast<double>(extra),
                              static_cast<double>(prefix + extra) + static_cast<double>(need));
    const double rest = (current_->fronts != nullptr ? *current_->fronts : *shared_)
                            .Bound(i + 1, model.Shift(key, model.Class(i, static_cast<int>(k))),
                                   static_cast<double>(next_prefix), model.room() - q);
    double bound = cost + model.Cost(i, static_cast<int>(k)) + rest + model.fixed_seconds();
    if (!priced_suffix_.empty()) {
      // Note [Two prices] for the layers after i at the root's prices: what is left of both
      // rooms after the prefix bounds their a and b.
      const double level = i + 1 == n_
                               ? static_cast<double>(prefix) + LevelOf(i, static_cast<int>(k))
                               : static_cast<double>(next_prefix);
      const double lagrange = cost + model.Cost(i, static_cast<int>(k)) + priced_suffix_[i + 1] -
                              prices_.first * (gpu_room_ - level) -
                              prices_.second * (host_room_ - static_cast<double>(host + h)) +
                              model.fixed_seconds();
      bound = std::max(bound, lagrange);
    }
    if (bound >= best_seconds_ * prune_) {
      current_->pruned = std::min(current_->pruned, bound);
      continue;
    }
    children.push_back({static_cast<int>(k), bound, next_prefix, host + h, q});
  }
  std::stable_sort(children.begin(), children.end(),
                   [](const Child& a, const Child& b) { return a.bound < b.bound; });
  for (const Child& child : children) {
    if (child.bound >= best_seconds_ * prune_) {
      // The rest are no lower (sorted): their least is this one (Note [Optimality gap]).
      current_->pruned = std::min(current_->pruned, child.bound);
      break;
    }
    pick_[i] = child.k;
    Dfs(i + 1, model.Shift(key, model.Class(i, child.k)), child.prefix, child.host, child.qmax,
        cost + model.Cost(i, child.k));
    if (exhausted()) return;
  }
  pick_[i] = -1;
}

}  // namespace stowage::planner::optimizer_internal
