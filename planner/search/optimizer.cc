#include "planner/search/optimizer.h"

#include <algorithm>
#include <cmath>
#include <compare>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/checked_math.h"
#include "planner/frameworks/step_cost.h"
#include "planner/search/layer_counts.h"
#include "base/bytes.h"

namespace stowage::planner {
namespace {

// Note [Exact search]
// What the simulator's step time and peak depend on (Note [Runtime protocol], simulator.cc),
// for a choice of one option per layer and a prefetch distance d (save lag L):
//  - Device memory moves only at compute events (a forward or backward starting or ending, a
//    save waited for, a prefetch issued), so the levels it reaches do not depend on copy
//    timing. With R = resident, H = host bytes, F/Bk = the option's forward/backward working
//    set, E = the other in-flight microbatches' resident bytes (sum of (m_k - 1) R_k, m_k =
//    LayerCost::in_flight_microbatches) and G_j = what the step holds in the backward of j
//    besides j's own bytes (the held logits and the gradients made so far; Bk_j counts those
//    j's backward has made by its peak: BackwardHeldBytes, Note [Gradient timing]):
//      forward of i:   fixed + E + R_<i + H_{i-L+1..i-1} + F_i
//      backward of j:  fixed + E + R_<j + H_{j-d..j-1} + Bk_j + G_j
//      LM head/loss:   fixed + E + R_all + H_{n-L..n-1} + max(tail, G_{n-1})
//      step's end:     fixed + E + G_end (every gradient, the held logits)
//    are reached by every plan, and together with one level reached only when a forward waits
//    for a save (fixed + E + R_<=i + H_{i-L+1..i}) they are the peak. So the memory a plan needs
//    is a sum of prefix resident bytes and terms of a window of W = max(L - 1, d) layers.
//    Which layers of the window count is the protocol's (OffloadProtocol): on a stage of several
//    model chunks (vpp > 1) a save is waited for by its chunk's end and a prefetch issued no
//    earlier than its chunk's last layer (Note [Pipeline stages] in plan.h), so a window ends
//    where its chunk ends; the copy-wait windows below end there too.
//  - Step time = embedding + tail + optimizer copies + the chosen options' compute + copy
//    waits. The waits are a max-plus function of the copy queues; what every plan must wait is
//    bounded from below per layer: layer i's save (h = H_i / D2H rate) must land before the
//    forward of i + L (or backward), and only the forward compute between its issue and that
//    wait can hide it, so the forward waits are at least the sum of the excesses h - (that
//    compute, each layer at its longest option): Note [Forward waits]. Likewise
//    the prefetch issued at the backward of i + d must land before the backward of i: the
//    backward waits are at least the sum of (H_i / H2D rate - the backward compute between):
//    Note [Backward waits].
// The search:
//  1. Fronts (per d): a dynamic programme over layers from the last to the first. A state is a
//     layer i and the host-byte classes of the W layers before it (the window the memory
//     terms need). Its value is not one number but the Pareto front of the suffix plans
//     i..n-1: (slack = the most weighted prefix resident bytes sum_{k<i} m_k R_k the suffix's
//     memory terms admit, extra = its sum of (m_k - 1) R_k, cost = compute + the wait bounds
//     above). Bytes are exact (no buckets); a front longer than its cap (Note [Bounded work]) is
//     thinned by merging neighbours into one label with the best slack, extra and cost of the
//     group, which keeps every value a valid bound and only weakens it (a counted gap, never a
//     wrong proof).
//     The root front's least cost + the fixed seconds is a lower bound on every plan's step
//     time (the host budget and the stall-only memory level are relaxed away).
//     Where the fronts' plan takes more host memory than the budget has, two relaxations bring
//     the host budget back into the bound: a price on it over the same fronts (Note [Host
//     price]) and prices on both budgets over the level at the LM head (Note [Two prices]).
//  2. Candidates: the front's best plans (and uniform plans, and where the host budget binds the
//     plans of Note [Host price] and the rounding of Note [Two prices]) are simulated exactly;
//     the best one within both budgets is the incumbent.
//  3. If the incumbent is within kProvenTolerance of the bound it is proven optimal, within
//     OptimizerOptions::optimality_gap of it the search stops there (Note [Optimality gap]).
//     Otherwise a depth-first branch and bound over the layers (exact prefix memory and host bytes;
//     bound = the prefix's costs + the suffix front's least cost admitting the prefix, or where it
//     is larger the two prices' bound on the suffix in what the prefix leaves of both budgets)
//     closes the gap or stops at node_limit and reports it (OptimizeResult::lower_bound_seconds).
// What is proven, with pipeline stages: the plan is optimal for the step the simulator replays
// for the stage (its chunks' layers in order for one microbatch, the other in-flight
// microbatches' resident bytes on the GPU all step: Note [In-flight microbatches]), for any
// number of chunks and in-flight counts per chunk; optimizer_test.cc checks both against
// exhaustive search. It says nothing about the order the schedule interleaves microbatches in
// beyond what that replay and the in-flight counts (planner/search/pipeline.h) capture.
// On the reference model the bound is attained: the compute-optimal plan under these memory
// terms waits for no copy, so step 1's plan is the optimum and step 3 never runs. On small
// random instances the branch and bound runs to completion and equals exhaustive search
// (optimizer_test.cc). Deep models where both budgets bind: the two prices bound them within 0.06%
// (1,000 layers: 207.228 s against a 207.711 s plan before them), the rest being the rounding of
// the layers the relaxation splits; the same relaxation in whole layers (Note [Whole layers] in
// layer_counts.cc) closes that, and its counts are the plan (every stage of the bench's deep
// Llama rows within the default gap, most proven).
// Checkpoint-held inputs (Note [Checkpoint-held inputs] in simulator.cc: what the lowest holding
// checkpoint keeps alive in the loss and the backward of every layer above it) are a max over the
// prefix's options (per group of shared inputs, summed over the groups), not a sum, and are left
// out of these memory terms. Leaving a term out only
// lowers the levels the search assumes: it admits more plans, never fewer, so every bound stays a
// lower bound over the plans that fit, no prune drops a plan that fits, and every plan is accepted
// only by its simulation, which has the term (Optimizer.CheckpointHeldInputsStayExact checks the
// search against exhaustive search with such options).

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

// Note [Bounded work]
// Every part of the search does work at most proportional to the layers, with a constant per layer
// that does not depend on the depth (`stowage bench plan --layers` prints the curve):
//  - Fronts: layers x windows x options x front length label updates, where a front holds at most
//    kMaxFront labels at any depth and max(L - 1, d) <= kMaxWindow layers of window. (A cap of
//    3e6 labels shared by all layers made fronts shorter, and deep models' bounds weaker, the
//    deeper the model; no real instance's front comes near kMaxFront: the reference model's are
//    256 labels, DeepSeek-V3's stages 62, the bench's deep Llama stages 27.) The shared fronts are
//    always built; Refine's per-distance fronts while they cost no more than kRefineFactor times
//    the shared fronts; the branch and bound builds those of the distances it searches. Before the
//    fronts the tables of a bucketed knapsack cost layers x buckets^2 (1,000 layers took 11.7 s).
//  - Simulations, each linear in the layers (Note [Events in time order] in simulator.cc): a
//    bounded number of seeds (Note [Seeds]), hill climbing at most kImproveSimulations, the
//    branch and bound at most node_limit nodes (each costing options x window, whatever the depth)
//    and kSearchSimulatedLayers layer-simulations of leaves in all, and at most 15 of Note [Least
//    pinned memory].
//  - The host price: at most kPriceSteps fronts of kPriceFront labels; the two prices
//    kTwoPriceEvaluations passes over the distinct layers' options; the whole layers (Note [Whole
//    layers] in layer_counts.cc) at most kCountEvaluations evaluations of that dual per attempt,
//    kRoundAttempts attempts each simulating one plan: groups of identical layers, so none of it
//    grows with the depth but the grouping and the simulations.
// Exact filters keep these from running where they cannot gain: hill climbing does not simulate a
// change that takes the incumbent past either room of Note [Two prices] (no plan there fits) or
// whose bound cannot beat it (Note [Plan bounds]), and a distance's own fronts are not built when
// a plan the shared fronts found within the GPU budget (the host ignored) is no slower than the
// bound known: those fronts relax the host budget too, so they bound no more than that plan's
// step. None of these changes what a completed search proves; a search cut short reports the plan
// it found, unproven, with its bound (OptimizeResult::lower_bound_seconds). Models deeper than
// kMaxLayers are refused before any of this (CheckStepCostBounds).
// What the constant per layer is depends on what binds, not on the depth: where no budget binds
// the fronts are a few labels and one simulation proves the plan; where the GPU and the host
// budget both bind (the bench's Llama from about 500 layers) the whole layers come first (the
// relaxation's host price is positive) and their counts' plan, simulated once or a few times, is
// within the default gap of their bound on every stage of the bench's deep rows, so no front is
// built there (the fronts are about 24 labels on such stages, up to 250 label updates per layer
// with many microbatches in flight: 60% of a 10,000-layer stage's CPU before). Where the counts'
// plan does not settle the search, the fronts, the two prices' rounding, hill climbing and
// node_limit nodes of branch and bound follow as before, a fixed cost per stage, not per layer.

// Note [Optimality gap]
// The search stops once its incumbent is within OptimizerOptions::optimality_gap G of a lower
// bound: step <= bound (1 + G), the gap being step / bound - 1 (a little stricter than the
// solvers' (step - bound) / step, Gurobi MIPGap and CPLEX EpGap, whose default 1e-4 it takes).
// What stops: the seeds, refinement and hill climbing once the incumbent is within G of the
// bound known; a distance whose bound is within G of the incumbent is not searched; and the
// branch and bound prunes a child whose bound b has best <= b (1 + G). The last keeps the bound
// honest: every plan of a pruned subtree takes at least b, so a distance whose branch and bound
// completed is bounded by the least bound it pruned (Distance::pruned) or by the incumbent (the
// leaves it simulated), never by the incumbent alone, and the plan returned is within G of the
// optimum. G = 0 is the exact search of Note [Exact search] (prunes at best * (1 - 1e-12), proven
// at 1e-9 of the bound): what optimizer_test.cc checks against exhaustive search. Where the gap
// is already below G at the root (deep models whose two prices bound them within 0.01%: Note [Two
// prices]) the branch and bound does not run at all; where it is not, the plan is reported with
// its gap, as a search cut short by its node budget is.
constexpr double kInf = std::numeric_limits<double>::infinity();
// A front holds at most kMaxFront labels, at any depth: the fronts' work per layer is then at most
// windows x options x kMaxFront label updates (Note [Bounded work]).
constexpr int kMaxFront = 4096;
// The window of host-byte classes kept exactly; older prefetched bytes are left out of the
// backward term for d > kMaxWindow (a relaxation: the bound stays valid).
constexpr int kMaxWindow = 3;
constexpr double kProvenTolerance = 1e-9;

// a + b + c <= limit, where a sum that would wrap does not fit.
bool FitsBudget(uint64_t a, uint64_t b, uint64_t c, uint64_t limit) {
  const auto ab = CheckedAdd(a, b);
  if (!ab) return false;
  const auto abc = CheckedAdd(*ab, c);
  return abc && *abc <= limit;
}

struct Candidate {
  LayerOption option;
  OptionCost cost;
};

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

// The protocol fields every layer would get if it offloaded (a layer that does not has no host
// bytes, so its fields never count): within each model chunk of the stage (Note [Pipeline
// stages] in plan.h), as the simulator runs it.
std::vector<LayerProtocol> OffloadProtocol(const StepCost& step, int n, int distance, int lag) {
  std::vector<OptionCost> offloading(n);
  for (OptionCost& c : offloading) c.host_bytes = 1;
  return ProtocolFor(step, offloading, distance, lag);
}

// The per-layer quantities of Note [Exact search] for prefetch distance `distance` (the backward
// wait bound for `wait_distance`: a larger one hides more, so a model with the smallest distance
// for memory and the largest for waits bounds every distance in between).
class Model {
 public:
  Model(const StepCost& step, const OptimizerOptions& o,
        const std::vector<std::vector<Candidate>>& cand, int distance, int lag, int max_window,
        int wait_distance, double host_price = 0)
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

  // The pinned bytes the layers may take: the host budget less the optimizer's (Note [Host
  // price]).
  static double HostRoom(const StepCost& step, const OptimizerOptions& o) {
    return o.host_budget_bytes > step.optimizer_host_bytes
               ? static_cast<double>(o.host_budget_bytes - step.optimizer_host_bytes)
               : 0;
  }

  int n() const { return n_; }
  int options(int i) const { return static_cast<int>(cand_[i].size()); }
  int keys() const { return keys_; }
  int classes() const { return classes_; }
  int Class(int i, int k) const { return cls_[i][k]; }
  int Shift(int key, int cls) const { return window_ == 0 ? 0 : (key * classes_) % keys_ + cls; }
  double Cost(int i, int k) const { return cost_[i][k]; }
  double room() const { return room_; }
  // What the LM head and loss add to the GPU beside every resident byte (Need's last term).
  double tail_need() const { return tail_need_; }
  double fixed_seconds() const { return fixed_seconds_; }
  double Multiplier(int i) const {
    return static_cast<double>(std::max(1, step_.layers[i].in_flight_microbatches));
  }
  double Resident(int i, int k) const {
    return static_cast<double>(cand_[i][k].cost.resident_bytes);
  }
  // Host bytes of layer i - 1 - t in window `key` at position i (0 before layer 0).
  double WindowHost(int i, int key, int t) const {
    const int layer = i - 1 - t;
    if (layer < 0 || t >= window_) return 0;
    int digit = key;
    for (int s = 0; s < t; ++s) digit /= classes_;
    digit %= classes_;
    return digit < static_cast<int>(hosts_[layer].size())
               ? static_cast<double>(hosts_[layer][digit])
               : -1;  // a window no plan has
  }
  // The options of layer i no other option of the same host bytes beats in resident bytes,
  // working sets and cost (for the fronts: the plans they describe stay the same or better).
  std::vector<int> Undominated(int i) const {
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
        const bool better = b.resident_bytes < a.resident_bytes ||
                            b.forward_peak < a.forward_peak || b.backward_peak < a.backward_peak ||
                            cost_[i][j] < cost_[i][k];
        beaten = no_worse && (better || j < k);
      }
      if (!beaten) out.push_back(k);
    }
    return out;
  }
  bool ValidKey(int i, int key) const {
    for (int t = 0; t < window_; ++t) {
      if (WindowHost(i, key, t) < 0) return false;
    }
    return true;
  }
  // Whether layer k's save is still on the GPU when the forward of i starts, and whether its
  // prefetch has been issued when the backward of i starts (k < i; from the protocol, so the
  // windows end where a model chunk ends).
  bool Pending(int k, int i) const { return protocol_[k].save_wait_before_layer > i; }
  bool Prefetched(int k, int i) const { return protocol_[k].prefetch_after_layer >= i; }
  // Layer i's memory terms beyond the prefix's resident bytes (Note [Exact search]).
  double Need(int i, int k, int key) const {
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
      need =
          std::max(need, static_cast<double>(c.resident_bytes + c.host_bytes) + fwd + tail_need_);
    }
    // After the first layer's backward only what the step holds is left (no prefix).
    if (i == 0) need = std::max(need, at_end_);
    return need;
  }

 private:
  const StepCost& step_;
  const std::vector<std::vector<Candidate>>& cand_;
  int n_, d_, lag_;
  std::vector<LayerProtocol> protocol_;  // OffloadProtocol for d_
  int window_ = 0, classes_ = 1, keys_ = 1;
  double room_ = 0, tail_need_ = 0, at_end_ = 0, fixed_seconds_ = 0;
  std::vector<std::vector<int>> cls_;
  std::vector<std::vector<uint64_t>> hosts_;
  std::vector<double> held_;  // BackwardHeldBytes(step).in_layer
  std::vector<std::vector<double>> cost_;
};

// The Pareto fronts of Note [Exact search], step 1.
class Fronts {
 public:
  struct Label {
    double slack = 0;  // most weighted prefix resident bytes the suffix admits
    double extra = 0;  // the suffix's sum of (m_k - 1) R_k
    double cost = 0;
    int option = -1;  // in cand[i]
    int next = -1;    // its successor in the front of (i + 1, shifted key)
  };

  // `cap`: labels per front (0: Note [Bounded work]'s).
  explicit Fronts(const Model& model, int cap = 0)
      : m_(model), n_(model.n()), cap_(static_cast<size_t>(cap > 0 ? cap : kMaxFront)) {
    fronts_.assign(static_cast<size_t>(n_ + 1) * m_.keys(), {});
    plain_.assign(fronts_.size(), 1);
    for (int key = 0; key < m_.keys(); ++key) {
      if (m_.ValidKey(n_, key) && m_.room() >= 0) At(n_, key).push_back({m_.room(), 0, 0, -1, -1});
    }
    // The most weighted resident bytes any prefix can hold: more slack than that admits nothing
    // more, so labels beyond it are one label (exact).
    std::vector<double> most(n_ + 1, 0);
    for (int i = 0; i < n_; ++i) {
      double largest = 0;
      for (int k = 0; k < m_.options(i); ++k) largest = std::max(largest, m_.Resident(i, k));
      most[i + 1] = most[i] + m_.Multiplier(i) * largest;
    }
    std::vector<Label> all, merged, scratch;
    std::vector<size_t> runs;
    std::vector<Group> groups;
    size_t used = 0;  // groups in use for the current front
    for (int i = n_ - 1; i >= 0; --i) {
      const double mult = m_.Multiplier(i);
      const std::vector<int> useful = m_.Undominated(i);
      for (int key = 0; key < m_.keys(); ++key) {
        if (!m_.ValidKey(i, key)) continue;
        all.clear();
        runs.clear();
        bool sorted_runs = true;
        for (int k : useful) {
          const int next_key = m_.Shift(key, m_.Class(i, k));
          const std::vector<Label>& next = At(i + 1, next_key);
          if (next.empty()) continue;
          const double r = m_.Resident(i, k);
          const double own = m_.room() - m_.Need(i, k, key);
          const double cost = m_.Cost(i, k);
          if (own < 0) continue;
          // Options sharing the next front and the resident bytes differ only in their own
          // room and cost (Note [Plain runs], Note [Option groups]).
          const bool plain = mult == 1 && Plain(i + 1, next_key);
          auto group = std::find_if(groups.begin(), groups.begin() + used, [&](const Group& g) {
            return g.next_key == next_key && g.resident == r;
          });
          if (group == groups.begin() + used) {
            if (used == groups.size()) groups.emplace_back();
            group = groups.begin() + used++;
            group->next_key = next_key;
            group->resident = r;
            group->plain = plain;
            group->options.clear();
          }
          group->options.push_back({k, plain ? std::min(own, most[i]) : own, cost});
        }
        for (size_t g = 0; g < used; ++g) {
          if (groups[g].plain) {
            PlainRun(i, groups[g], all, runs);
          } else {
            sorted_runs = false;
            ExtraRun(i, groups[g], mult, most[i], all);
          }
        }
        used = 0;
        work_ += static_cast<double>(all.size());  // the labels made (Note [Bounded work])
        if (sorted_runs) {
          Merge(all, runs, merged, scratch);
          std::swap(all, merged);
        }
        Prune(all, sorted_runs, At(i, key), plain_[static_cast<size_t>(i) * m_.keys() + key]);
      }
    }
  }

  // Least suffix cost of layers i..n-1 after a prefix with weighted resident bytes `prefix`
  // whose own memory terms leave `extra_room` for the suffix's extra; kInf if none.
  double Bound(int i, int key, double prefix, double extra_room) const {
    const std::vector<Label>& f = At(i, key);
    // Sorted by slack, largest first: the labels admitting `prefix` are a prefix of f.
    const auto end =
        std::partition_point(f.begin(), f.end(), [&](const Label& l) { return l.slack >= prefix; });
    double best = kInf;
    if (Plain(i, key)) {
      // Without extra, cost falls along the front: the last admitted label is the least.
      if (end != f.begin() && (end - 1)->extra <= extra_room) best = (end - 1)->cost;
      return best;
    }
    for (auto it = f.begin(); it != end; ++it) {
      if (it->extra <= extra_room) best = std::min(best, it->cost);
    }
    return best;
  }
  double Root() const { return Bound(0, 0, 0, kInf); }

  // The plans of the root front's cheapest `count` labels, cheapest first.
  std::vector<std::vector<int>> Plans(int count) const {
    std::vector<int> order(At(0, 0).size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return At(0, 0)[a].cost < At(0, 0)[b].cost; });
    std::vector<std::vector<int>> out;
    for (int q : order) {
      if (static_cast<int>(out.size()) >= count) break;
      std::vector<int> pick(n_);
      int key = 0, at = q;
      for (int i = 0; i < n_; ++i) {
        const Label& l = At(i, key)[at];
        pick[i] = l.option;
        key = m_.Shift(key, m_.Class(i, l.option));
        at = l.next;
      }
      out.push_back(std::move(pick));
    }
    return out;
  }

  double work() const { return work_; }
  bool thinned() const { return thinned_; }

 private:
  std::vector<Label>& At(int i, int key) {
    return fronts_[static_cast<size_t>(i) * m_.keys() + key];
  }
  const std::vector<Label>& At(int i, int key) const {
    return fronts_[static_cast<size_t>(i) * m_.keys() + key];
  }
  bool Plain(int i, int key) const { return plain_[static_cast<size_t>(i) * m_.keys() + key]; }

  // Note [Plain runs]
  // Without in-flight multipliers in the layer or its suffix (a plain front: no extra), option k
  // continuing label l gives slack = min(l.slack - R_k, top_k) (top_k: the room its own memory
  // terms leave, at most the prefix's largest) at cost l.cost + c_k. The options sharing the
  // next front and R_k differ only in (top_k, c_k): one that has less top and no less cost is
  // beaten by another at every slack, and of the rest (top falling, cost falling) the cheapest
  // that admits a slack is the one with the least top at or above it. So the group is one run,
  // sorted by slack, of at most |next| + options labels — the front the union of its options'
  // runs would give after pruning, built without them (at 128K tokens the reference model's 44
  // options per layer fall into 11 groups).
  struct GroupOption {
    int k;
    double top, cost;
  };
  struct Group {
    int next_key = 0;
    double resident = 0;
    bool plain = true;  // no extra in the layer or the next front: a run (Note [Plain runs])
    std::vector<GroupOption> options;  // top: min(own room, most) if plain, else the own room
  };

  // Keeps the options of `o` no other beats in top and cost (Note [Plain runs]): top falling,
  // cost falling; returns how many.
  static size_t Staircase(std::vector<GroupOption>& o) {
    std::sort(o.begin(), o.end(), [](const GroupOption& a, const GroupOption& b) {
      return a.top != b.top ? a.top > b.top : a.cost < b.cost;
    });
    size_t kept = 0;
    for (const GroupOption& option : o) {
      if (kept == 0 || option.cost < o[kept - 1].cost) o[kept++] = option;
    }
    return kept;
  }

  // Note [Option groups]
  // With extra (in-flight multipliers m > 1), option k of a group (the same next front and
  // resident bytes r) continuing label l gives extra e = l.extra + (m - 1) r — the same for every
  // option of the group — slack min(A, own_k - e) with A = min(l.slack - m r, most), and cost
  // l.cost + c_k. Of the group's staircase (own falling, cost falling), the options whose own
  // room admits A all give slack A and e, so the cheapest of them beats the rest; the cheaper
  // options below it give less slack for less cost and stay. So each label of the next front
  // yields the staircase's options from the cheapest up to the first that admits A — the labels
  // Prune would keep of the group's product with the next front, made without the others (on the
  // bench's deep Llama stages usually one per label, where every option of the group gave one).
  void ExtraRun(int i, Group& group, double mult, double most, std::vector<Label>& all) const {
    std::vector<GroupOption>& o = group.options;
    const size_t kept = Staircase(o);
    const std::vector<Label>& next = At(i + 1, group.next_key);
    const double r = group.resident;
    for (size_t q = 0; q < next.size(); ++q) {
      const Label& l = next[q];
      const double extra = l.extra + (mult - 1) * r;
      const double a = std::min(l.slack - mult * r, most);
      if (a < 0) continue;
      // Cheapest first: the staircase from its end (least own room, least cost).
      for (size_t j = kept; j-- > 0;) {
        const double slack = std::min(a, o[j].top - extra);
        if (slack < 0) continue;
        all.push_back({slack, extra, l.cost + o[j].cost, o[j].k, static_cast<int>(q)});
        if (o[j].top - extra >= a) break;
      }
    }
  }

  // Appends group's run (Note [Plain runs]) continuing the front of layer i + 1.
  void PlainRun(int i, Group& group, std::vector<Label>& all, std::vector<size_t>& runs) const {
    std::vector<GroupOption>& o = group.options;
    const size_t kept = Staircase(o);
    const std::vector<Label>& next = At(i + 1, group.next_key);
    const double r = group.resident;
    runs.push_back(all.size());
    size_t q = 0;
    for (size_t j = 0; j < kept; ++j) {
      const GroupOption& option = o[j];
      // The labels admitting slack top once shifted collapse into their cheapest (the last).
      q = static_cast<size_t>(
          std::partition_point(next.begin() + q, next.end(),
                               [&](const Label& l) { return l.slack - r >= option.top; }) -
          next.begin());
      if (q > 0) {
        all.push_back(
            {option.top, 0, next[q - 1].cost + option.cost, option.k, static_cast<int>(q - 1)});
      }
      // At and below the next option's top (never negative) that option is cheaper.
      const bool last = j + 1 == kept;
      for (; q < next.size(); ++q) {
        const double slack = next[q].slack - r;
        if (last ? slack < 0 : slack <= o[j + 1].top) break;
        all.push_back({slack, 0, next[q].cost + option.cost, option.k, static_cast<int>(q)});
      }
    }
  }

  // The labels of `all` no other label beats in slack, extra and cost (ties: the first), most
  // slack first; thinned to the cap (Note [Exact search]).
  static bool Before(const Label& a, const Label& b) {
    if (a.slack != b.slack) return a.slack > b.slack;
    if (a.cost != b.cost) return a.cost < b.cost;
    return a.extra < b.extra;
  }

  // The runs of `all` (each a staircase in Before order: slack and cost falling, Note [Plain
  // runs]) merged into their lower envelope `out`, one run at a time (linear in the labels: at
  // most the envelope's length plus the run's per run).
  static void Merge(const std::vector<Label>& all, const std::vector<size_t>& runs,
                    std::vector<Label>& out, std::vector<Label>& scratch) {
    out.clear();
    for (size_t r = 0; r < runs.size(); ++r) {
      size_t a = 0, b = runs[r];
      const size_t end = r + 1 < runs.size() ? runs[r + 1] : all.size();
      scratch.clear();
      double least = kInf;
      while (a < out.size() || b < end) {
        const bool from_out = b == end || (a < out.size() && Before(out[a], all[b]));
        const Label& l = from_out ? out[a++] : all[b++];
        if (l.cost < least) {
          scratch.push_back(l);
          least = l.cost;
        }
      }
      std::swap(out, scratch);
    }
  }

  void Prune(std::vector<Label>& all, bool sorted, std::vector<Label>& out, char& plain) {
    if (!sorted) {
      std::sort(all.begin(), all.end(),
                [](const Label& a, const Label& b) { return Before(a, b); });
    }
    bool has_extra = false;
    for (const Label& l : all) has_extra |= l.extra > 0;
    out.clear();
    if (!has_extra) {
      double least = kInf;
      for (const Label& l : all) {
        if (l.cost < least) {
          out.push_back(l);
          least = l.cost;
        }
      }
    } else {
      // A label is beaten when one before it (no less slack) has no more extra and cost: the
      // least cost at extra <= l.extra among those kept. `stairs` holds the kept labels' (extra,
      // cost) staircase (cost falling as extra grows), so that is one lookup, not a scan.
      // (A sorted array: a front's staircase is short, and a tree allocated a node per label.)
      std::vector<std::pair<double, double>>& stairs = stairs_;
      stairs.clear();
      for (const Label& l : all) {
        const size_t at =
            static_cast<size_t>(std::upper_bound(stairs.begin(), stairs.end(), l.extra,
                                                 [](double e, const std::pair<double, double>& s) {
                                                   return e < s.first;
                                                 }) -
                                stairs.begin());
        if (at > 0 && stairs[at - 1].second <= l.cost) continue;
        out.push_back(l);
        size_t end = at;
        while (end < stairs.size() && stairs[end].second >= l.cost) ++end;
        if (at > 0 && stairs[at - 1].first == l.extra) {
          stairs[at - 1].second = l.cost;
          stairs.erase(stairs.begin() + at, stairs.begin() + end);
        } else if (at == end) {
          stairs.insert(stairs.begin() + at, {l.extra, l.cost});
        } else {
          stairs[at] = {l.extra, l.cost};
          stairs.erase(stairs.begin() + at + 1, stairs.begin() + end);
        }
      }
    }
    plain = !has_extra;
    if (out.size() <= cap_) return;
    // Thin: groups of neighbours become one label with the group's most slack, least extra and
    // least cost (a bound on each member), continuing the first member's plan.
    const size_t group = (out.size() + cap_ - 1) / cap_;
    std::vector<Label> thin;
    for (size_t s = 0; s < out.size(); s += group) {
      Label merged = out[s];
      for (size_t t = s; t < std::min(out.size(), s + group); ++t) {
        merged.extra = std::min(merged.extra, out[t].extra);
        merged.cost = std::min(merged.cost, out[t].cost);
      }
      thin.push_back(merged);
    }
    out = std::move(thin);
    thinned_ = true;
  }

  const Model& m_;
  int n_;
  size_t cap_;  // labels per front
  std::vector<std::vector<Label>> fronts_;
  std::vector<char> plain_;  // the front has no extra (every m_k = 1 in its plans)
  double work_ = 0;
  bool thinned_ = false;
  std::vector<std::pair<double, double>> stairs_;  // Prune's scratch
};

// Bounds on the work besides the fronts (Note [Bounded work]).
// Hill climbing simulates the whole model at most kImproveSimulations times; the per-distance
// fronts Refine builds do at most kRefineFactor times the shared fronts' label updates together
// (one distance's window of kMaxWindow layers at four host-byte classes, 4^2; the branch and bound
// builds the fronts of the distances it searches).
constexpr double kImproveSimulations = 32;
constexpr double kRefineFactor = 16;
constexpr double kSearchSimulatedLayers = 4e5;
constexpr int kFrontPlans = 4;  // the root front's cheapest plans simulated per distance
// Pricing the host budget (Note [Host price]): at most kPriceSteps fronts of kPriceFront labels,
// until the interval of prices is within kPriceTolerance of the price.
constexpr int kPriceSteps = 10;
constexpr int kPriceFront = 8;
constexpr double kPriceTolerance = 1e-2;
// Note [Two prices]: D is evaluated at most kPriceSteps + 3 + kGoldenSteps times (the golden
// section's interval shrinks to 0.618^64, about 1e-13, of itself); prices within kTieTolerance of a
// layer's least priced cost tie (the rounding of sums of about a hundred terms); kRoundAttempts
// roundings, each with the rooms shrunk by what the last one's simulation exceeded.
constexpr int kGoldenSteps = 64;
constexpr double kTwoPriceEvaluations = kPriceSteps + 3 + kGoldenSteps;
constexpr double kTieTolerance = 1e-9;
constexpr int kRoundAttempts = 6;
// Note [Whole layers] (layer_counts.cc): the branch and bound over counts stops after this many
// evaluations of the dual over the distinct layers' options.
constexpr int64_t kCountEvaluations = 4000;

class Search {
 public:
  Search(const StepCost& step, const OptimizerOptions& o,
         std::vector<std::vector<Candidate>> candidates)
      : step_(step), o_(o), cand_(std::move(candidates)), n_(static_cast<int>(cand_.size())) {
    held_ = BackwardHeldBytes(step);
    // Note [Optimality gap]: a bound settles the incumbent at settle_ of it, prunes at prune_.
    const double gap = std::clamp(o.optimality_gap, 0.0, OptimizerOptions::kMaxOptimalityGap);
    settle_ = gap > kProvenTolerance ? 1 / (1 + gap) : 1 - kProvenTolerance;
    prune_ = gap > kProvenTolerance ? 1 / (1 + gap) : 1 - 1e-12;
    // Note [Whole layers]: the counts' search takes half the gap, the plan it gives the rest.
    count_gap_ = gap > kProvenTolerance ? gap / 2 : 0;
    // One set of fronts bounds every distance first (a window of one layer, the least prefetched
    // bytes, the least backward waits); a distance gets its own only when that bound does not
    // settle it (Refine).
    int least = std::numeric_limits<int>::max(), most = 1;
    for (int d : o.prefetch_distances) {
      least = std::min(least, std::max(d, 1));
      most = std::max(most, d);
    }
    least_ = least;
    most_ = most;
    shared_model_ = std::make_unique<Model>(step, o, cand_, least, kDefaultSaveLag, 1, most);
    for (int d : o.prefetch_distances) {
      Distance& dist = distances_.emplace_back();
      dist.d = std::max(d, 1);
      dist.bound = -kInf;
    }
    GroupLayers();
    // Note [Whole layers] first where the host budget binds the relaxation (its host price is
    // positive): its counts' plan within the gap of their bound settles the search before any
    // front is built (the fronts were 60% of a 10,000-layer stage's CPU).
    if (dual_.host > 0 && dual_.value < kInf) {
      for (Distance& dist : distances_) {
        dist.bound = dual_.value + shared_model_->fixed_seconds();
      }
      WholeLayers();
      if (Settled()) return;
    }
    shared_ = std::make_unique<Fronts>(*shared_model_);
    double bound = shared_->Root() + shared_model_->fixed_seconds();
    PriceBudgets(bound);
    if (prices_.first < 0) PriceHost(bound);  // Note [Host price]
    for (Distance& dist : distances_) dist.bound = std::max(dist.bound, bound);
  }

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
  void PriceHost(double& bound) {
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
  void PriceBudgets(double& bound) {
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
  void GroupLayers() {
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
  void RoundPrices() {
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
        least =
            std::min(least, model.Cost(i, k) + l * weight(i, k, true) + p * weight(i, k, false));
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
            if (!(ga <= gpu_cap || ga <= used_gpu) || !(hb <= host_cap || hb <= used_host))
              continue;
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
  std::pair<double, double> OverBudget(const SimResult& sim) const {
    return {static_cast<double>(sim.peak_bytes) - static_cast<double>(o_.gpu_budget_bytes),
            static_cast<double>(sim.host_bytes) - static_cast<double>(o_.host_budget_bytes)};
  }

  // Note [Two prices] in whole layers (Note [Whole layers] in layer_counts.cc): the relaxation's
  // integer optimum bounds every distance; its counts, given to each group's layers (the
  // offloading options to the first layers: their pending saves and prefetches then meet the
  // smallest resident prefix), are simulated, and where that plan does not fit (the levels the
  // relaxation leaves out) the room it exceeded shrinks by the excess and the counts are solved
  // again, as RoundPrices does.
  void WholeLayers() {
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
  double LevelOf(int i, int k) const {
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
  double HostOf(int i, int k) const {
    return shared_model_->Multiplier(i) * static_cast<double>(cand_[i][k].cost.host_bytes);
  }
  double HostOf(const std::vector<int>& pick) const {
    double host = 0;
    for (int i = 0; i < n_; ++i) host += HostOf(i, pick[i]);
    return host;
  }

  // Refines the fronts of every distance whose bound the incumbent does not already beat.
  void Refine() {
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

  // No plan within the budgets is faster (Note [Exact search]); kInf: none fits.
  double RootBound() const {
    double b = kInf;
    for (const Distance& d : distances_) b = std::min(b, d.bound);
    return b;
  }
  // No plan within the budgets is faster: the incumbent (every leaf simulated), each distance's
  // bound and, where its branch and bound completed, the least bound it pruned (Note
  // [Optimality gap]).
  double LowerBound() const {
    double b = best_seconds_;
    for (const Distance& d : distances_) {
      b = std::min(b, d.searched ? std::max(d.bound, d.pruned) : d.bound);
    }
    return b;
  }
  // Proven optimal (to rounding); within the requested gap of the bound (Note [Optimality gap]).
  bool Proven() const {
    return !best_pick_.empty() && best_seconds_ <= LowerBound() * (1 + kProvenTolerance);
  }
  bool Settled() const { return !best_pick_.empty() && best_seconds_ * settle_ <= LowerBound(); }

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
  void Seed() {
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
  bool TryEveryDistance(const std::vector<int>& pick, F&& seen) {
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
  bool TryEveryDistance(const std::vector<int>& pick) {
    if (CannotWin(PlanBound(pick))) return false;
    return TryEveryDistance(pick, [](Distance&, const SimResult&) {});
  }

  // Note [Plan bounds]
  // The shared model's costs bound every plan, not only the fronts' least: the simulated step of
  // `pick` at any of the distances is at least the fixed seconds plus the sum of its options'
  // Model::Cost (compute plus the copy-wait bounds of Note [Forward waits] and Note [Backward
  // waits], which hold for any plan, with the shared model's waits for the largest distance).
  // A plan whose bound is no less than the incumbent's step cannot replace it, so the seeds and
  // hill climbing do not simulate it (as the branch and bound prunes a child).
  double PlanBound(const std::vector<int>& pick) const {
    double sum = shared_model_->fixed_seconds();
    for (int i = 0; i < n_; ++i) sum += shared_model_->Cost(i, pick[i]);
    return sum;
  }
  bool CannotWin(double bound) const { return bound >= best_seconds_ * (1 - 1e-12); }

  // Hill climbing from the best plan: change one layer's option while that shortens the
  // simulated step. Only improves the incumbent, so the search's bound cuts more.
  void Improve() {
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
          if (best_stall_ == 0 && cand_[i][k].cost.compute_seconds() >=
                                      cand_[i][best_pick_[i]].cost.compute_seconds()) {
            continue;
          }
          const int kk = static_cast<int>(k);
          if (gpu - LevelOf(i, best_pick_[i]) + LevelOf(i, kk) > gpu_room ||
              host - HostOf(i, best_pick_[i]) + HostOf(i, kk) > host_room) {
            continue;
          }
          // Note [Plan bounds]: a change whose bound is no faster than the incumbent cannot win.
          if (CannotWin(bound - shared_model_->Cost(i, best_pick_[i]) +
                        shared_model_->Cost(i, kk))) {
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

  // Step 3: branch and bound, distance by distance, until proven or out of nodes.
  void BranchAndBound() {
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

  SimResult TryLeaf(const std::vector<int>& pick, int distance) {
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

  // Note [Least pinned memory]
  // The search minimises the step; plans of the same step may pin very different host memory (an
  // offload the copy engines hide costs nothing, so where the GPU budget is not tight offloading
  // 200 layers ties with offloading the 100 the GPU needs: 204.7 against 108.5 GiB on the bench's
  // 500 Llama layers). Pinned memory is the user's (the node's other ranks, the data loader), so
  // of the incumbent's layers whose option pins bytes another option of no more modelled cost
  // pins fewer of, the last ones take that option, as many as the exact simulation allows with
  // the step no slower and both budgets met. How many is bisected: each more layer released adds
  // GPU bytes, so the counts that fit are, as a rule, those up to some count; every count taken is
  // simulated exactly, so the plan returned fits and is as fast whatever the rule. At most
  // log2(kMaxLayers) + 1 = 15 simulations (Note [Bounded work]). The step is no slower, so
  // whatever was proven of the incumbent holds of this plan. The test
  // Optimizer.OfPlansAsFastPinsTheLeastHostMemory checks the least against every plan of small
  // instances.
  void ReleaseHost() {
    if (best_pick_.empty()) return;
    const Model& model = *shared_model_;
    std::vector<int> layers, lighter;  // last layer first
    for (int i = n_ - 1; i >= 0; --i) {
      const int k = best_pick_[i];
      int light = -1;
      for (int j = 0; j < static_cast<int>(cand_[i].size()); ++j) {
        if (cand_[i][j].cost.host_bytes < cand_[i][k].cost.host_bytes &&
            model.Cost(i, j) <= model.Cost(i, k) &&
            (light < 0 || cand_[i][j].cost.host_bytes < cand_[i][light].cost.host_bytes)) {
          light = j;
        }
      }
      if (light < 0) continue;
      layers.push_back(i);
      lighter.push_back(light);
    }
    auto released = [&](size_t count) {
      std::vector<int> pick = best_pick_;
      for (size_t a = 0; a < count; ++a) pick[layers[a]] = lighter[a];
      return pick;
    };
    std::vector<OptionCost> costs(n_);
    auto no_worse = [&](const std::vector<int>& pick, double& seconds) {
      for (int i = 0; i < n_; ++i) costs[i] = cand_[i][pick[i]].cost;
      const SimResult sim = Simulate(step_, costs, best_distance_, /*record=*/false);
      simulated_layers_ += n_;
      seconds = sim.step_seconds;
      const auto [over_gpu, over_host] = OverBudget(sim);
      return over_gpu <= 0 && over_host <= 0 && sim.step_seconds <= best_seconds_;
    };
    size_t lo = 0, hi = layers.size();  // `lo` layers released is known to be no worse
    double lo_seconds = best_seconds_;
    while (lo < hi) {
      const size_t mid = lo + (hi - lo + 1) / 2;
      double seconds = 0;
      if (no_worse(released(mid), seconds)) {
        lo = mid;
        lo_seconds = seconds;
      } else {
        hi = mid - 1;
      }
    }
    if (lo == 0) return;
    best_pick_ = released(lo);
    best_seconds_ = lo_seconds;
  }

  bool exhausted() const {
    return nodes_ > o_.node_limit || simulated_layers_ - search_start_ > kSearchSimulatedLayers;
  }
  int64_t nodes() const { return nodes_ + leaves_; }
  double best_seconds() const { return best_seconds_; }
  const std::vector<int>& best_pick() const { return best_pick_; }
  int best_distance() const { return best_distance_; }
  const std::vector<std::vector<Candidate>>& candidates() const { return cand_; }

 private:
  struct Distance {
    int d = 1;
    std::vector<LayerProtocol> protocol;  // OffloadProtocol for d (exact memory terms)
    std::unique_ptr<Model> model;
    std::unique_ptr<Fronts> fronts;
    double bound = kInf;
    // The least simulated step of a plan at this distance within the GPU budget, the host's
    // ignored (the shared fronts' plans): the host-relaxed fronts of this distance bound no more.
    double relaxed_upper = kInf;
    bool searched = false;  // its branch and bound completed (or its bound cannot win)
    double pruned = kInf;   // the least bound of a subtree its branch and bound pruned
  };

  void Build(Distance& dist) {
    dist.model =
        std::make_unique<Model>(step_, o_, cand_, dist.d, kDefaultSaveLag, kMaxWindow, dist.d);
    dist.fronts = std::make_unique<Fronts>(*dist.model);
    // Both bounds are valid; this one is the stronger.
    dist.bound = std::max(dist.bound, dist.fronts->Root() + dist.model->fixed_seconds());
  }

  // Layer i's memory terms beyond the prefix's resident bytes, from the prefix's actual picks
  // (exact bytes; saturating: a sum that would wrap does not fit any budget).
  uint64_t NeedExact(int i, const OptionCost& c) const {
    uint64_t fwd = 0, bwd = 0;
    const std::vector<LayerProtocol>& protocol = current_->protocol;
    for (int k = std::max(0, i - std::max(kDefaultSaveLag, current_->d)); k < i; ++k) {
      const uint64_t host = cand_[k][pick_[k]].cost.host_bytes;
      if (protocol[k].save_wait_before_layer > i) fwd += host;
      if (protocol[k].prefetch_after_layer >= i) bwd += host;
    }
    const uint64_t a = CheckedAdd(c.forward_peak, fwd).value_or(~0ull);
    const uint64_t b =
        CheckedAdd(CheckedAdd(c.backward_peak, bwd).value_or(~0ull), held_.in_layer[i])
            .value_or(~0ull);
    uint64_t need = std::max(a, b);
    if (i == n_ - 1) {  // the LM head and loss (Model::Need)
      const uint64_t tail = std::max(step_.tail_bytes, held_.in_layer[i]);
      need =
          std::max(need, CheckedAdd(c.resident_bytes + c.host_bytes + fwd, tail).value_or(~0ull));
    }
    if (i == 0) need = std::max(need, held_.at_end);
    return need;
  }

  // prefix: sum_{k<i} m_k R_k; qmax: the largest of the prefix layers' memory terms (each with
  // the prefix's extra so far); host: sum_{k<i} m_k H_k; cost: the prefix's option costs.
  void Dfs(int i, int key, uint64_t prefix, uint64_t host, double qmax, double cost) {
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
      if (!FitsBudget(fixed, CheckedAdd(prefix, extra).value_or(~0ull), need,
                      o_.gpu_budget_bytes)) {
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

  const StepCost& step_;
  const OptimizerOptions& o_;
  std::vector<std::vector<Candidate>> cand_;
  int n_;
  BackwardHeld held_;
  std::unique_ptr<Model> shared_model_;
  std::unique_ptr<Fronts> shared_;  // bounds every distance
  int least_ = 1, most_ = 1;        // the prefetch distances' range
  std::vector<std::vector<int>> priced_plans_;
  std::pair<double, double> prices_ = {-1, -1};  // Note [Two prices]: (l, p), l < 0 if none
  double gpu_room_ = 0, host_room_ = 0;
  std::vector<double> priced_suffix_;  // sum over layers >= i of the least c + l a + p b
  // Note [Two prices]' layers grouped (Note [Whole layers] in layer_counts.cc): each group's
  // (c, a, b) options, sorted, and its layers.
  std::vector<CountGroup> count_groups_;
  std::vector<std::vector<int>> group_layers_;
  TwoPrices dual_;             // the relaxation's best prices and bound (BestTwoPrices)
  bool whole_layers_ = false;  // WholeLayers ran
  double refine_work_ = 0;
  std::vector<Distance> distances_;
  Distance* current_ = nullptr;
  std::vector<int> pick_;
  int64_t nodes_ = 0, leaves_ = 0;
  double simulated_layers_ = 0;
  double search_start_ = 0;
  double best_seconds_ = kInf;
  double settle_ = 1, prune_ = 1;  // Note [Optimality gap]
  double count_gap_ = 0;
  double best_stall_ = 0;
  std::vector<int> best_pick_;
  int best_distance_ = 1;
};

OptimizeResult Finish(const StepCost& step, const std::vector<LayerOption>& options, int distance) {
  OptimizeResult r;
  r.schedule.options = options;
  r.schedule.prefetch_distance = distance;
  r.sim = Simulate(step, r.schedule, /*record=*/true);
  return r;
}

// Readable at any scale (a measured profile of small layers is KiB, the reference run TiB).

}  // namespace

OptimizeResult Optimize(const StepCost& step, const OptimizerOptions& o) {
  // Everything below adds bytes and simulates layers on the strength of these bounds.
  if (absl::Status bounds = CheckStepCostBounds(step); !bounds.ok()) {
    OptimizeResult r;
    r.binding = "input limits";
    r.explanation = std::string(bounds.message());
    return r;
  }
  std::vector<std::vector<Candidate>> candidates = Candidates(step, o);
  bool any_layer_empty = false;
  for (const auto& c : candidates) any_layer_empty |= c.empty();
  if (any_layer_empty || o.prefetch_distances.empty()) return MinimumPeak(step, o);
  // Note [Exact search].
  Search search(step, o, std::move(candidates));
  if (search.RootBound() < kInf) {
    search.Seed();
    if (!search.Settled()) search.Refine();
    if (!search.Settled()) search.Improve();
    if (!search.Settled()) search.BranchAndBound();
    search.ReleaseHost();
  }
  if (search.best_pick().empty()) {
    OptimizeResult r = MinimumPeak(step, o);
    r.nodes = search.nodes();
    return r;
  }
  std::vector<LayerOption> options;
  for (size_t i = 0; i < search.best_pick().size(); ++i) {
    options.push_back(search.candidates()[i][search.best_pick()[i]].option);
  }
  OptimizeResult r = Finish(step, options, search.best_distance());
  r.feasible = true;
  r.proven_optimal = search.Proven();
  r.lower_bound_seconds =
      r.proven_optimal ? r.sim.step_seconds : std::min(search.LowerBound(), r.sim.step_seconds);
  r.within_gap = r.proven_optimal || search.Settled();
  r.nodes = search.nodes();
  return r;
}

double OptimalityGap(const OptimizeResult& r) {
  if (!r.feasible || r.proven_optimal || !(r.lower_bound_seconds > 0)) return 0;
  return r.sim.step_seconds / r.lower_bound_seconds - 1;
}

const char* OptimalityName(const OptimizeResult& r) {
  if (!r.feasible) return "";
  return r.proven_optimal ? "proven" : r.within_gap ? "within_gap" : "unproven";
}

absl::Status CheckOptimalityGap(double gap, const std::string& what) {
  if (!(gap >= 0 && gap <= OptimizerOptions::kMaxOptimalityGap)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", gap, "; allowed: 0 (prove the plan optimal) to ",
                     OptimizerOptions::kMaxOptimalityGap, " (a relative gap: 1e-4 is 0.01%)"));
  }
  return absl::OkStatus();
}

OptimizeResult ExhaustiveSearch(const StepCost& step, const OptimizerOptions& o) {
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
  const int64_t nodes = best.nodes;
  best = Finish(step, best.schedule.options, best.schedule.prefetch_distance);
  best.feasible = true;
  best.proven_optimal = true;
  best.nodes = nodes;
  return best;
}

OptimizeResult MinimumPeak(const StepCost& step, const OptimizerOptions& o) {
  const uint64_t fixed = step.fixed.total();
  const int chunks = *std::max_element(o.chunk_counts.begin(), o.chunk_counts.end());
  // Offload every layer input the host budget takes (the rest recompute), largest chunks: the
  // least each layer keeps on the GPU and the smallest working sets.
  std::vector<LayerOption> options;
  uint64_t host = 0;
  bool host_limited = false;
  for (const LayerCost& l : step.layers) {
    LayerOption option{LayerPolicy::kRecompute, 0, l.ffn_chunkable ? chunks : 1};
    if (o.force.has_value()) {
      option.policy = *o.force;
    } else if (const uint64_t held =
                   l.input_bytes * static_cast<uint64_t>(std::max(
                                       1, l.in_flight_microbatches));  // CheckStepCostBounds
               host + held <= o.host_budget_bytes) {
      option.policy = LayerPolicy::kOffloadInput;
      host += held;
    } else {
      host_limited = true;
    }
    options.push_back(option);
  }
  OptimizeResult r = Finish(step, options, 1);
  r.feasible = false;
  r.min_peak_bytes = r.sim.peak_bytes;
  const std::string fixed_parts =
      absl::StrCat("weights ", FormatBytes(step.fixed.weights), ", gradients ", FormatBytes(step.fixed.gradients),
                   ", optimizer state ", FormatBytes(step.fixed.optimizer), ", communication buffers ",
                   FormatBytes(step.fixed.comm_buffers),
                   step.fixed.other > 0 ? absl::StrCat(", other ", FormatBytes(step.fixed.other)) : "");
  if (fixed >= o.gpu_budget_bytes) {
    r.binding = "fixed memory";
    r.explanation = absl::StrCat("fixed memory alone is ", FormatBytes(fixed), " (", fixed_parts,
                                 ") against a GPU budget of ", FormatBytes(o.gpu_budget_bytes));
  } else if (host_limited && !o.force.has_value()) {
    r.binding = "host memory";
    r.explanation = absl::StrCat("the host budget of ", FormatBytes(o.host_budget_bytes),
                                 " per GPU takes the inputs of only part of the layers; the rest "
                                 "stay on the GPU and the peak is ",
                                 FormatBytes(r.sim.peak_bytes));
  } else if (r.sim.peak_at == "LM head and loss") {
    r.binding = "LM head and loss";
    r.explanation = absl::StrCat("the LM head and loss need ", FormatBytes(step.tail_bytes), " on top of ",
                                 FormatBytes(fixed), " fixed memory; try a smaller --loss-chunk-tokens");
  } else {
    r.binding = absl::StrCat("working set of the ", r.sim.peak_at);
    r.explanation = absl::StrCat("one layer's working set does not fit next to ", FormatBytes(fixed),
                                 " of fixed memory (", fixed_parts, ")");
  }
  return r;
}

absl::StatusOr<uint64_t> LongestFittingSeqLen(const ModelConfig& model,
                                              const HardwareProfile& hardware, RunSettings run,
                                              const OptimizerOptions& options, uint64_t granularity,
                                              uint64_t limit, double max_step_seconds) {
  if (granularity == 0) granularity = 1;
  // Feasibility is monotone in the sequence length (every byte and second grows with it), so a
  // bisection over multiples of the granularity finds the longest.
  auto fits = [&](uint64_t units) -> absl::StatusOr<bool> {
    run.seq_len = units * granularity;
    // Every pipeline stage must fit (planner/search/pipeline.h); without pipeline parallelism, the one.
    for (int stage = 0; stage < run.pp; ++stage) {
      auto step = BuildStepCost(model, hardware, run, stage);
      if (!step.ok()) return step.status();
      const OptimizeResult r = Optimize(*step, options);
      if (!r.feasible || (max_step_seconds > 0 && r.sim.step_seconds > max_step_seconds)) {
        return false;
      }
    }
    return true;
  };
  auto first = fits(1);
  if (!first.ok()) return first.status();
  if (!*first) return uint64_t{0};
  uint64_t lo = 1, hi = 2;
  const uint64_t max_units = std::max<uint64_t>(1, limit / granularity);
  while (true) {
    if (hi > max_units) {
      hi = max_units + 1;
      break;
    }
    auto ok = fits(hi);
    if (!ok.ok()) return ok.status();
    if (!*ok) break;
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    auto ok = fits(mid);
    if (!ok.ok()) return ok.status();
    (*ok ? lo : hi) = mid;
  }
  return lo * granularity;
}

}  // namespace stowage::planner
