// Optimize, the entry of the planner's search, and what it proves: the search's outline (Note
// [Exact search]), its work (Note [Bounded work]) and gap (Note [Optimality gap]); the search's
// first bounds (Search's constructor) and its final plan (Note [Least pinned memory]); the
// gap's names and check; LongestFittingSeqLen. The parts of the search are in
// optimizer_internal.h.
#include "planner/search/optimizer.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "planner/search/optimizer_internal.h"

namespace stowage::planner::optimizer_internal {

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
//     the host budget back into the bound: a price on it over the same fronts
//     (Note [Host price]) and prices on both budgets over the level at the LM head
//     (Note [Two prices]).
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
//    and kSearchSimulatedLayers layer-simulations of leaves in all, and at most 15 of
//    Note [Least pinned memory].
//  - The host price: at most kPriceSteps fronts of kPriceFront labels; the two prices
//    kTwoPriceEvaluations passes over the distinct layers' options; the whole layers
//    (Note [Whole layers] in layer_counts.cc) at most kCountEvaluations evaluations of that dual
//    per attempt, kRoundAttempts attempts each simulating one plan: groups of identical layers, so
//    none of it grows with the depth but the grouping and the simulations.
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
// is already below G at the root (deep models whose two prices bound them within 0.01%:
// Note [Two prices]) the branch and bound does not run at all; where it is not, the plan is
// reported with its gap, as a search cut short by its node budget is.

Search::Search(const StepCost& step, const OptimizerOptions& o,
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

// No plan within the budgets is faster (Note [Exact search]); kInf: none fits.
double Search::RootBound() const {
  double b = kInf;
  for (const Distance& d : distances_) b = std::min(b, d.bound);
  return b;
}

// No plan within the budgets is faster: the incumbent (every leaf simulated), each distance's
// bound and, where its branch and bound completed, the least bound it pruned (Note
// [Optimality gap]).
double Search::LowerBound() const {
  double b = best_seconds_;
  for (const Distance& d : distances_) {
    b = std::min(b, d.searched ? std::max(d.bound, d.pruned) : d.bound);
  }
  return b;
}

// Proven optimal (to rounding); within the requested gap of the bound (Note [Optimality gap]).
bool Search::Proven() const {
  return !best_pick_.empty() && best_seconds_ <= LowerBound() * (1 + kProvenTolerance);
}

bool Search::Settled() const {
  return !best_pick_.empty() && best_seconds_ * settle_ <= LowerBound();
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
void Search::ReleaseHost() {
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

OptimizeResult Finish(const StepCost& step, const std::vector<LayerOption>& options, int distance) {
  OptimizeResult r;
  r.schedule.options = options;
  r.schedule.prefetch_distance = distance;
  r.sim = Simulate(step, r.schedule, /*record=*/true);
  return r;
}

}  // namespace stowage::planner::optimizer_internal

namespace stowage::planner {

using optimizer_internal::Candidate;
using optimizer_internal::Candidates;
using optimizer_internal::Finish;
using optimizer_internal::kInf;
using optimizer_internal::Search;

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

absl::StatusOr<uint64_t> LongestFittingSeqLen(const ModelConfig& model,
                                              const HardwareProfile& hardware, RunSettings run,
                                              const OptimizerOptions& options, uint64_t granularity,
                                              uint64_t limit, double max_step_seconds) {
  if (granularity == 0) granularity = 1;
  // Feasibility is monotone in the sequence length (every byte and second grows with it), so a
  // bisection over multiples of the granularity finds the longest.
  auto fits = [&](uint64_t units) -> absl::StatusOr<bool> {
    run.seq_len = units * granularity;
    // Every pipeline stage must fit (planner/search/pipeline.h); without pipeline parallelism, the
    // one.
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
