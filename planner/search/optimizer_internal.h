// Shared inside the optimizer, not a public interface: the per-layer candidates, the bound model
// (Model, bound_model.cc), the Pareto fronts (Fronts, pareto_fronts.cc) and the search (Search:
// its bounds and entry in optimizer.cc, the priced relaxations in prices.cc, the incumbent's
// plans in incumbent.cc, the branch and bound in branch_and_bound.cc). Note [Exact search] in
// optimizer.cc describes how they fit together.
#ifndef STOWAGE_PLANNER_SEARCH_OPTIMIZER_INTERNAL_H_
#define STOWAGE_PLANNER_SEARCH_OPTIMIZER_INTERNAL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "base/checked_math.h"
#include "planner/cost/cost_model.h"
#include "planner/search/layer_counts.h"
#include "planner/search/optimizer.h"
#include "planner/search/simulator.h"

namespace stowage::planner::optimizer_internal {

constexpr double kInf = std::numeric_limits<double>::infinity();
// A front holds at most kMaxFront labels, at any depth: the fronts' work per layer is then at most
// windows x options x kMaxFront label updates (Note [Bounded work] in optimizer.cc).
constexpr int kMaxFront = 4096;
// The window of host-byte classes kept exactly; older prefetched bytes are left out of the
// backward term for d > kMaxWindow (a relaxation: the bound stays valid).
constexpr int kMaxWindow = 3;
constexpr double kProvenTolerance = 1e-9;

// a + b + c <= limit, where a sum that would wrap does not fit.
inline bool FitsBudget(uint64_t a, uint64_t b, uint64_t c, uint64_t limit) {
  const auto ab = CheckedAdd(a, b);
  if (!ab) return false;
  const auto abc = CheckedAdd(*ab, c);
  return abc && *abc <= limit;
}

struct Candidate {
  LayerOption option;
  OptionCost cost;
};

// Each layer's options that can fit: within the host budget, their own bytes next to the fixed
// memory, duplicates dropped (bound_model.cc).
std::vector<std::vector<Candidate>> Candidates(const StepCost& step, const OptimizerOptions& o);

// The protocol fields every layer would get if it offloaded (a layer that does not has no host
// bytes, so its fields never count): within each model chunk of the stage
// (Note [Pipeline stages] in plan.h), as the simulator runs it.
std::vector<LayerProtocol> OffloadProtocol(const StepCost& step, int n, int distance, int lag);

// The per-layer quantities of Note [Exact search] for prefetch distance `distance` (the backward
// wait bound for `wait_distance`: a larger one hides more, so a model with the smallest distance
// for memory and the largest for waits bounds every distance in between).
class Model {
 public:
  // Note [Forward waits], Note [Backward waits] (bound_model.cc): each option's cost.
  Model(const StepCost& step, const OptimizerOptions& o,
        const std::vector<std::vector<Candidate>>& cand, int distance, int lag, int max_window,
        int wait_distance, double host_price = 0);

  // The pinned bytes the layers may take: the host budget less the optimizer's
  // (Note [Host price]).
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
  std::vector<int> Undominated(int i) const;
  bool ValidKey(int i, int key) const;
  // Whether layer k's save is still on the GPU when the forward of i starts, and whether its
  // prefetch has been issued when the backward of i starts (k < i; from the protocol, so the
  // windows end where a model chunk ends).
  bool Pending(int k, int i) const { return protocol_[k].save_wait_before_layer > i; }
  bool Prefetched(int k, int i) const { return protocol_[k].prefetch_after_layer >= i; }
  // Layer i's memory terms beyond the prefix's resident bytes (Note [Exact search]).
  double Need(int i, int k, int key) const;

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

// The Pareto fronts of Note [Exact search], step 1 (pareto_fronts.cc).
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
  explicit Fronts(const Model& model, int cap = 0);

  // Least suffix cost of layers i..n-1 after a prefix with weighted resident bytes `prefix`
  // whose own memory terms leave `extra_room` for the suffix's extra; kInf if none.
  double Bound(int i, int key, double prefix, double extra_room) const;
  double Root() const { return Bound(0, 0, 0, kInf); }

  // The plans of the root front's cheapest `count` labels, cheapest first.
  std::vector<std::vector<int>> Plans(int count) const;

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

  // Note [Plain runs]: one option of a group, and the group.
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
  // Keeps the options of `o` no other beats in top and cost (Note [Plain runs]).
  static size_t Staircase(std::vector<GroupOption>& o);
  // Note [Option groups].
  void ExtraRun(int i, Group& group, double mult, double most, std::vector<Label>& all) const;
  // Appends group's run (Note [Plain runs]) continuing the front of layer i + 1.
  void PlainRun(int i, Group& group, std::vector<Label>& all, std::vector<size_t>& runs) const;
  // Most slack, then least cost, then least extra first.
  static bool Before(const Label& a, const Label& b);
  // The runs of `all` merged into their lower envelope `out`.
  static void Merge(const std::vector<Label>& all, const std::vector<size_t>& runs,
                    std::vector<Label>& out, std::vector<Label>& scratch);
  // The labels of `all` no other label beats, most slack first; thinned to the cap.
  void Prune(std::vector<Label>& all, bool sorted, std::vector<Label>& out, char& plain);

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

// The search of Note [Exact search]: one per Optimize.
class Search {
 public:
  // Step 1 (optimizer.cc): the shared fronts and every distance's first bound.
  Search(const StepCost& step, const OptimizerOptions& o,
         std::vector<std::vector<Candidate>> candidates);

  // The priced relaxations (prices.cc): Note [Host price], Note [Two prices], its layers grouped
  // and their plans rounded, in whole layers too.
  void PriceHost(double& bound);
  void PriceBudgets(double& bound);
  void GroupLayers();
  void RoundPrices();
  // How far a simulated plan's GPU peak and pinned host bytes exceed their budgets (<= 0: fits).
  std::pair<double, double> OverBudget(const SimResult& sim) const;
  void WholeLayers();
  // Layer i's option k in the levels of Note [Two prices] (a_k).
  double LevelOf(int i, int k) const;
  // Pinned bytes of layer i's option k over its in-flight microbatches, and of a plan.
  double HostOf(int i, int k) const;
  double HostOf(const std::vector<int>& pick) const;

  // The incumbent (incumbent.cc): refining each distance's fronts, step 2's seeds (Note
  // [Seeds]), the plans' bounds (Note [Plan bounds]), hill climbing and a plan simulated.
  void Refine();
  void Seed();
  template <typename F>
  bool TryEveryDistance(const std::vector<int>& pick, F&& seen);
  bool TryEveryDistance(const std::vector<int>& pick);
  double PlanBound(const std::vector<int>& pick) const;
  bool CannotWin(double bound) const;
  void Improve();
  SimResult TryLeaf(const std::vector<int>& pick, int distance);

  // What is proven (optimizer.cc: Note [Optimality gap]).
  double RootBound() const;
  double LowerBound() const;
  bool Proven() const;
  bool Settled() const;

  // Step 3 (branch_and_bound.cc).
  void BranchAndBound();

  // Of plans as fast, the one pinning the least (optimizer.cc: Note [Least pinned memory]).
  void ReleaseHost();

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

  // Branch and bound (branch_and_bound.cc): a distance's own fronts, a layer's exact memory
  // terms, the depth-first search.
  void Build(Distance& dist);
  uint64_t NeedExact(int i, const OptionCost& c) const;
  void Dfs(int i, int key, uint64_t prefix, uint64_t host, double qmax, double cost);

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

// The result of `options` at prefetch distance `distance`: the schedule and its recorded
// simulation (optimizer.cc).
OptimizeResult Finish(const StepCost& step, const std::vector<LayerOption>& options, int distance);

}  // namespace stowage::planner::optimizer_internal

#endif  // STOWAGE_PLANNER_SEARCH_OPTIMIZER_INTERNAL_H_
