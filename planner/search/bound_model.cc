// The bound model of Note [Exact search]: each layer's candidate options and, per prefetch
// distance, their memory terms and costs (Model), compute plus the copy-wait bounds of Note
// [Forward waits] and Note [Backward waits].
#include <algorithm>
#include <cstdint>
#include <vector>

#include "planner/search/optimizer_internal.h"

namespace stowage::planner::optimizer_internal {

std::vector<std::vector<Candidate>> Candidates(const StepCost& step, const OptimizerOptions& o) {
  const uint64_t fixed = step.fixed.total();
  std::vector<std::vector<Candidate>> out(step.layers.size());
  for (size_t i = 0; i < step.layers.size(); ++i) {
    const uint64_t m = static_cast<uint64_t>(std::max(1, step.layers[i].in_flight_microbatches));
    for (const LayerOption& option : AllOptions(step.layers[i], o.chunk_counts)) {
      if (o.force.has_value() && option.policy != *o.force) continue;
      const OptionCost c = EvaluateOption(step.layers[i], option);
      // An option whose own bytes cannot fit next to the fixed memory never helps.
      if (!FitsBudget(fixed, std::max(c.forward_peak, c.backward_peak), 0, o.gpu_budget_bytes)) {
        continue;
      }
      if (c.host_bytes > o.host_budget_bytes / m) continue;
      bool duplicate = false;
      for (const Candidate& other : out[i]) {
        const OptionCost& d = other.cost;
        duplicate |= d.resident_bytes == c.resident_bytes && d.host_bytes == c.host_bytes &&
                     d.save_at_forward_start == c.save_at_forward_start &&
                     d.forward_peak == c.forward_peak && d.backward_peak == c.backward_peak &&
                     d.forward_seconds == c.forward_seconds &&
                     d.recompute_seconds == c.recompute_seconds &&
                     d.backward_seconds == c.backward_seconds;
      }
      if (!duplicate) out[i].push_back({option, c});
    }
  }
  return out;
}

std::vector<LayerProtocol> OffloadProtocol(const StepCost& step, int n, int distance, int lag) {
  std::vector<OptionCost> offloading(n);
  for (OptionCost& c : offloading) c.host_bytes = 1;
  return ProtocolFor(step, offloading, distance, lag);
}

// Note [Forward waits]
// Why the forward waits are at least the sum of the excesses e_i = h_i - (the compute between
// i's issue and its wait point), undivided. The forward waits only at the protocol's points and
// the one D2H engine copies in issue order (simulator.cc), so:
//  - a wait at a point before i's for a save of k < i (the points do not decrease with the
//    layer) ends when k's copy lands, no later than i's copy starts: it hides none of i's copy;
//  - at a point where the saves S are waited for (several only at a model chunk's end and before
//    the backward), with t the first of S with e_t > 0, the last copy of S lands no earlier than
//    t's issue (or the end of the last wait before, whichever is later) + the sum of h over S
//    from t on, so that point waits at least e_t + the sum of h_k >= e_k over the later k of S.
// Summed over the points, each layer's excess counts once. Regression: the bound divided each
// excess by L (each point lies in L windows); on DeepSeek-V3, h800, PP 16 (stage 1: four layers,
// 15 in flight, one offload waiting 6.9 ms) it left half the wait out and the search stopped at
// its node limit 1.5% from the bound.

// Note [Backward waits]
// The same argument for the backward, which waits only at a layer's restore (the simulator's
// backward loop) on one H2D engine that copies in issue order: the prefetch of i is issued when
// the backward of issue_at = its prefetch_after_layer starts and waited for before the backward of
// i. Between the two run the backward (and recompute) of issue_at..i+1 and the restores of those
// layers; each of those restores waits for a copy issued before i's (a higher layer, issued no
// later, highest first), so while it waits i's copy has not started and it hides none of it. So
// the restore of i waits at least H_i / H2D rate - that compute (each layer at its longest
// option), and the backward's waits are at least the sum of these excesses, undivided. Regression:
// the bound divided each excess by d + 1; it was valid, and weaker by that factor.

Model::Model(const StepCost& step, const OptimizerOptions& o,
             const std::vector<std::vector<Candidate>>& cand, int distance, int lag, int max_window,
             int wait_distance, double host_price)
    : step_(step),
      cand_(cand),
      n_(static_cast<int>(cand.size())),
      d_(distance),
      lag_(lag),
      protocol_(OffloadProtocol(step, n_, distance, lag)) {
  const uint64_t fixed = step.fixed.total();
  room_ = o.gpu_budget_bytes > fixed
              ? static_cast<double>(std::min<uint64_t>(o.gpu_budget_bytes - fixed, 1ull << 63))
              : -1;
  window_ = std::min({std::max(lag_ - 1, d_), kMaxWindow, std::max(lag_ - 1, max_window)});
  // Host-byte classes: the distinct host byte counts of each layer's options.
  cls_.resize(n_);
  hosts_.resize(n_);
  classes_ = 1;
  for (int i = 0; i < n_; ++i) {
    for (const Candidate& c : cand[i]) {
      auto it = std::find(hosts_[i].begin(), hosts_[i].end(), c.cost.host_bytes);
      cls_[i].push_back(static_cast<int>(it - hosts_[i].begin()));
      if (it == hosts_[i].end()) hosts_[i].push_back(c.cost.host_bytes);
    }
    classes_ = std::max(classes_, static_cast<int>(hosts_[i].size()));
  }
  keys_ = 1;
  for (int t = 0; t < window_; ++t) keys_ *= classes_;
  // Held in the backward of j besides j's own bytes (the logits, the gradients made so far:
  // Note [Gradient timing] in cost_model.cc), and after the last backward.
  const BackwardHeld held = BackwardHeldBytes(step);
  held_.assign(held.in_layer.begin(), held.in_layer.end());
  at_end_ = static_cast<double>(held.at_end);
  tail_need_ = std::max(static_cast<double>(step.tail_bytes), held_.empty() ? 0 : held_.back());
  // Each option's cost: compute plus its share of the copy-wait bounds.
  std::vector<double> fmax(n_, 0), bmax(n_, 0);
  for (int i = 0; i < n_; ++i) {
    for (const Candidate& c : cand[i]) {
      fmax[i] = std::max(fmax[i], c.cost.forward_seconds);
      bmax[i] = std::max(bmax[i], c.cost.recompute_seconds + c.cost.backward_seconds);
    }
  }
  const std::vector<LayerProtocol> waits = OffloadProtocol(step, n_, wait_distance, lag);
  cost_.resize(n_);
  for (int i = 0; i < n_; ++i) {
    for (const Candidate& c : cand[i]) {
      double cost = c.cost.compute_seconds();
      if (c.cost.host_bytes > 0) {
        const double bytes = static_cast<double>(c.cost.host_bytes);
        // Forward: from the save's issue to the wait before the forward of i + L (backward).
        double hide = c.cost.save_at_forward_start ? c.cost.forward_seconds : 0;
        const int wait_at = std::clamp(protocol_[i].save_wait_before_layer, i + 1, n_);
        for (int j = i + 1; j < wait_at; ++j) hide += fmax[j];
        if (wait_at == n_) hide += step.tail_seconds;
        // Note [Forward waits]: the whole excess, not a share of it.
        cost += std::max(0.0, bytes / step.d2h_bytes_per_second - hide);
        // Backward: from the backward of min(i + d, n - 1) to the backward of i.
        const int issue_at = waits[i].prefetch_after_layer;
        double bhide = 0;
        for (int j = i + 1; j <= issue_at; ++j) bhide += bmax[j];
        // Note [Backward waits]: the whole excess too.
        cost += std::max(0.0, bytes / step.h2d_bytes_per_second - bhide);
      }
      // Note [Host price]: the relaxed host budget's price.
      cost_[i].push_back(cost +
                         host_price * Multiplier(i) * static_cast<double>(c.cost.host_bytes));
    }
  }
  // Once per step, whatever the schedule: the once-per-step exposed communication too.
  fixed_seconds_ = step.embedding_seconds + step.tail_seconds + step.optimizer_copy_seconds +
                   step.comm.step_exposed_seconds;
  if (host_price > 0) fixed_seconds_ -= host_price * HostRoom(step, o);
}

std::vector<int> Model::Undominated(int i) const {
  std::vector<int> out;
  const int count = options(i);
  for (int k = 0; k < count; ++k) {
    const OptionCost& a = cand_[i][k].cost;
    bool beaten = false;
    for (int j = 0; j < count && !beaten; ++j) {
      if (j == k || cls_[i][j] != cls_[i][k]) continue;
      const OptionCost& b = cand_[i][j].cost;
      const bool no_worse = b.resident_bytes <= a.resident_bytes &&
                            b.forward_peak <= a.forward_peak &&
                            b.backward_peak <= a.backward_peak && cost_[i][j] <= cost_[i][k];
      const bool better = b.resident_bytes < a.resident_bytes || b.forward_peak < a.forward_peak ||
                          b.backward_peak < a.backward_peak || cost_[i][j] < cost_[i][k];
      beaten = no_worse && (better || j < k);
    }
    if (!beaten) out.push_back(k);
  }
  return out;
}

bool Model::ValidKey(int i, int key) const {
  for (int t = 0; t < window_; ++t) {
    if (WindowHost(i, key, t) < 0) return false;
  }
  return true;
}

double Model::Need(int i, int k, int key) const {
  double fwd = 0, bwd = 0;
  for (int t = 0; t < window_ && i - 1 - t >= 0; ++t) {
    if (Pending(i - 1 - t, i)) fwd += WindowHost(i, key, t);
    if (Prefetched(i - 1 - t, i)) bwd += WindowHost(i, key, t);
  }
  const OptionCost& c = cand_[i][k].cost;
  double need = std::max(static_cast<double>(c.forward_peak) + fwd,
                         static_cast<double>(c.backward_peak) + bwd + held_[i]);
  // The last layer carries the LM head and loss: every resident byte (its own too) and the
  // saves of the last L layers are on the GPU beside them (and then beside what the tail
  // leaves for the backward).
  if (i == n_ - 1) {
    need = std::max(need, static_cast<double>(c.resident_bytes + c.host_bytes) + fwd + tail_need_);
  }
  // After the first layer's backward only what the step holds is left (no prefix).
  if (i == 0) need = std::max(need, at_end_);
  return need;
}

}  // namespace stowage::planner::optimizer_internal
