#include "planner/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/checked_math.h"
#include "planner/report.h"

namespace stowage::planner {
namespace {

// Note [Search]
// Step time = compute seconds (a sum over layers of the chosen options) + exposed copy waits
// (>= 0). Every layer's resident bytes are on the GPU together while the LM head and loss run,
// so any feasible plan satisfies  sum(resident) <= budget - fixed - tail.  The minimum compute
// of layers i..L-1 under that capacity is a knapsack solved once per search by dynamic
// programming over capacity buckets (resident bytes rounded down, so the bound never exceeds
// the truth). Depth-first search assigns layers in forward order; a node is cut when
//  - its compute so far plus the knapsack bound is no better than the best plan found,
//  - the forward pass so far already exceeds the GPU budget (forward memory depends only on the
//    layers before: no H2D runs before the tail, so D2H completions are known exactly), or
//  - its host bytes exceed the host budget.
// Leaves are simulated in full. The bound ignores copy waits, so the search is exact whatever
// the waits are; it is fast when they are small, which is when offloading pays.

// Note [Bounded work]
// Left alone, the knapsack tables cost layers x options x buckets^2 in time and layers x
// buckets^2 in memory, and hill climbing costs layers^2 x options simulated layers: 1,000
// layers took 11.7 s, 5,000 took 234 s and 1.3 GB, 100,000 ran out of memory. So:
//  - the bucket count per table dimension shrinks with depth so one table costs at most
//    kTableWork cell updates (coarser buckets give a weaker but still valid lower bound:
//    bytes stay rounded down in it, up in the incumbent's table);
//  - Seed rebuilds its table at most until kSeedTableWork cell updates are spent;
//  - Improve stops after kImproveSimulatedLayers layer-simulations;
//  - the search itself stops after node_limit nodes, as before, or once its leaves have cost
//    kSearchSimulatedLayers layer-simulations (deep models reach a leaf every few nodes).
// None of these changes what a completed search proves; a search cut short reports the plan
// it found, unproven, with the root bound as its gap (OptimizeResult::lower_bound_seconds).
// Models deeper than kMaxLayers are refused before any of this (CheckStepCostBounds).
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kMaxBuckets = 128;
constexpr int kMinBuckets = 4;
constexpr double kTableWork = 3e7;
constexpr double kSeedTableWork = 1.2e8;
constexpr double kImproveSimulatedLayers = 3e5;
constexpr double kSearchSimulatedLayers = 4e5;

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
    for (const LayerOption& option : AllOptions(step.layers[i], o.chunk_counts)) {
      if (o.force.has_value() && option.policy != *o.force) continue;
      const OptionCost c = EvaluateOption(step.layers[i], option);
      // An option whose own bytes cannot fit next to the fixed memory never helps.
      if (!FitsBudget(fixed, std::max(c.forward_peak, c.backward_peak), 0, o.gpu_budget_bytes)) {
        continue;
      }
      if (c.host_bytes > o.host_budget_bytes) continue;
      bool duplicate = false;
      for (const Candidate& other : out[i]) {
        const OptionCost& d = other.cost;
        duplicate |= d.resident_bytes == c.resident_bytes && d.host_bytes == c.host_bytes &&
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

// Note [Knapsack tables]
// T[i][r][h] is the least compute of layers i..L-1 when the layers before used r resident
// buckets and h host buckets, under the necessary conditions every feasible plan meets:
//  - all resident bytes are on the GPU during the LM head and loss: r <= (budget - fixed -
//    tail) / q_r at the end;
//  - while layer i runs forward or backward, the resident bytes of layers 0..i-1 are on the GPU
//    beside its own working set: r <= (budget - fixed - peak(i)) / q_r;
//  - host bytes fit the host budget.
// With bytes rounded down the table is a lower bound (the search's bound); rounded up, the plan
// it yields meets the conditions exactly (the search's first incumbent).
class Table {
 public:
  Table(const StepCost& step, const OptimizerOptions& o,
        const std::vector<std::vector<Candidate>>& cand, bool round_up)
      : n_(static_cast<int>(cand.size())), cand_(cand), round_up_(round_up) {
    const uint64_t fixed = step.fixed.total();
    const uint64_t used = fixed + step.tail_bytes;
    const uint64_t resident_room = o.gpu_budget_bytes > used ? o.gpu_budget_bytes - used : 0;
    // Note [Bounded work]: buckets^2 x (all options of all layers) <= kTableWork.
    double options = 1;
    for (const auto& c : cand) options += static_cast<double>(c.size());
    const int buckets =
        std::clamp(static_cast<int>(std::sqrt(kTableWork / options)), kMinBuckets, kMaxBuckets);
    qr_ = resident_room / static_cast<uint64_t>(buckets) + 1;
    qh_ = o.host_budget_bytes / static_cast<uint64_t>(buckets) + 1;
    rb_ = static_cast<int>(resident_room / qr_);
    hb_ = static_cast<int>(std::min<uint64_t>(o.host_budget_bytes / qh_, kMaxBuckets));
    work_ = options * (rb_ + 1) * (hb_ + 1);
    room_ = o.gpu_budget_bytes > fixed ? o.gpu_budget_bytes - fixed : 0;
    tail_ = step.tail_bytes;
    // Offloaded bytes stay on the GPU until their D2H completes, and the D2H engine moves at
    // most rate x elapsed bytes: before layer i's forward, at least host - rate x (the longest
    // the forward of layers 0..i-1 can take) are still waiting.
    drained_.assign(n_ + 1, 0);
    double elapsed = 0;
    for (int i = 0; i < n_; ++i) {
      double longest = 0;
      for (const Candidate& c : cand[i]) longest = std::max(longest, c.cost.forward_seconds);
      if (i > 0) elapsed += longest;
      drained_[i] = elapsed * step.d2h_bytes_per_second;
    }
    double last = 0;
    for (const Candidate& c : cand[n_ - 1 >= 0 ? n_ - 1 : 0]) {
      last = std::max(last, c.cost.forward_seconds);
    }
    drained_[n_] = (elapsed + (n_ > 0 ? last : 0)) * step.d2h_bytes_per_second;
    v_.assign(static_cast<size_t>(n_ + 1) * (rb_ + 1) * (hb_ + 1), kInf);
    for (int r = 0; r <= rb_; ++r) {
      for (int h = 0; h <= hb_; ++h) {
        if (Fits(n_, r, h, tail_)) At(n_, r, h) = 0;
      }
    }
    // The next layer starts its forward (and later runs its backward beside this layer's
    // reload) while this layer's offloaded bytes are on the GPU: this layer's resident and host
    // bytes plus the next layer's least working set must fit too.
    // An offload still in flight when the LM head and loss run sits beside them: the D2H of
    // layer i cannot have moved more than rate x (the longest forward of the layers after it).
    tail_pending_.assign(n_, std::vector<uint64_t>());
    {
      double after = 0;
      for (int i = n_ - 1; i >= 0; --i) {
        for (const Candidate& c : cand[i]) {
          const double left =
              static_cast<double>(c.cost.host_bytes) - after * step.d2h_bytes_per_second;
          tail_pending_[i].push_back(c.cost.resident_bytes +
                                     (left > 0 ? static_cast<uint64_t>(left) : 0) + tail_);
        }
        double longest = 0;
        for (const Candidate& c : cand[i]) longest = std::max(longest, c.cost.forward_seconds);
        after += longest;
      }
    }
    next_peak_.assign(n_ + 1, 0);
    for (int i = 0; i + 1 < n_; ++i) {
      uint64_t least = ~0ull;
      for (const Candidate& c : cand[i + 1]) {
        least = std::min(least, std::max(c.cost.forward_peak, c.cost.backward_peak));
      }
      next_peak_[i] = least;
    }
    for (int i = n_ - 1; i >= 0; --i) {
      for (size_t k = 0; k < cand[i].size(); ++k) {
        const Candidate& c = cand[i][k];
        const uint64_t at_tail = tail_pending_[i][k];
        if (c.cost.host_bytes > 0 &&
            !Fits(i, 0, 0, c.cost.resident_bytes + c.cost.host_bytes + next_peak_[i])) {
          continue;
        }
        const int w = Resident(c.cost), x = Host(c.cost);
        const double secs = c.cost.compute_seconds();
        for (int r = 0; r + w <= rb_; ++r) {
          if (!Fits(i, r, 0, c.cost.backward_peak)) break;
          if (!Fits(i, r, 0, at_tail)) break;
          if (c.cost.host_bytes > 0 &&
              !Fits(i, r, 0, c.cost.resident_bytes + c.cost.host_bytes + next_peak_[i])) {
            break;
          }
          for (int h = 0; h + x <= hb_; ++h) {
            if (!Fits(i, r, h, c.cost.forward_peak)) break;
            double& cell = At(i, r, h);
            cell = std::min(cell, secs + At(i + 1, r + w, h + x));
          }
        }
      }
    }
  }

  // Whether `own` bytes fit beside r resident and h host buckets of the layers before layer i.
  bool Fits(int i, int r, int h, uint64_t own) const {
    const double pending =
        std::max(0.0, static_cast<double>(h) * static_cast<double>(qh_) - drained_[i]);
    return static_cast<double>(r) * static_cast<double>(qr_) + pending + static_cast<double>(own) <=
           static_cast<double>(room_);
  }
  bool Allowed(int i, int r, int h, const OptionCost& c) const {
    return Fits(i, r, 0, c.backward_peak) && Fits(i, r, h, c.forward_peak);
  }

  // Cell updates this table cost to fill (Note [Bounded work]).
  double work() const { return work_; }
  int Resident(const OptionCost& c) const { return Buckets(c.resident_bytes, qr_); }
  int Host(const OptionCost& c) const { return Buckets(c.host_bytes, qh_); }
  double Bound(int i, int r, int h) const {
    return r > rb_ || h > hb_ ? kInf : v_[(static_cast<size_t>(i) * (rb_ + 1) + r) * (hb_ + 1) + h];
  }

  // The table's plan from an empty prefix: least compute, then least host and resident bytes.
  std::vector<int> Choice() const {
    std::vector<int> pick(n_, -1);
    int r = 0, h = 0;
    for (int i = 0; i < n_; ++i) {
      int best = -1;
      double best_secs = kInf;
      for (size_t k = 0; k < cand_[i].size(); ++k) {
        const OptionCost& c = cand_[i][k].cost;
        if (!Allowed(i, r, h, c)) continue;
        if (!Fits(i, r, 0, tail_pending_[i][k])) continue;
        if (c.host_bytes > 0 && !Fits(i, r, 0, c.resident_bytes + c.host_bytes + next_peak_[i])) {
          continue;
        }
        const double secs = c.compute_seconds() + Bound(i + 1, r + Resident(c), h + Host(c));
        if (secs == kInf) continue;
        const OptionCost* prev = best >= 0 ? &cand_[i][best].cost : nullptr;
        if (secs < best_secs - 1e-12 ||
            (secs <= best_secs + 1e-12 && prev != nullptr &&
             (c.host_bytes < prev->host_bytes ||
              (c.host_bytes == prev->host_bytes && c.resident_bytes < prev->resident_bytes)))) {
          best = static_cast<int>(k);
          best_secs = std::min(best_secs, secs);
        }
      }
      if (best < 0) return {};
      pick[i] = best;
      r += Resident(cand_[i][best].cost);
      h += Host(cand_[i][best].cost);
    }
    return pick;
  }

 private:
  int Buckets(uint64_t bytes, uint64_t q) const {
    const uint64_t b = round_up_ ? CeilDiv(bytes, q) : bytes / q;
    return static_cast<int>(std::min<uint64_t>(b, 1u << 30));
  }
  double& At(int i, int r, int h) {
    return v_[(static_cast<size_t>(i) * (rb_ + 1) + r) * (hb_ + 1) + h];
  }

  int n_;
  const std::vector<std::vector<Candidate>>& cand_;
  bool round_up_;
  uint64_t qr_ = 1, qh_ = 1;
  int rb_ = 0, hb_ = 0;
  uint64_t room_ = 0, tail_ = 0;
  double work_ = 0;
  std::vector<double> drained_;
  std::vector<uint64_t> next_peak_;  // the next layer's least working set
  std::vector<std::vector<uint64_t>>
      tail_pending_;  // per option: its least bytes at the loss  // most bytes the D2H
                      // engine can have moved before layer i
  std::vector<double> v_;
};

class Search {
 public:
  Search(const StepCost& step, const OptimizerOptions& o,
         std::vector<std::vector<Candidate>> candidates)
      : step_(step),
        o_(o),
        cand_(std::move(candidates)),
        n_(static_cast<int>(cand_.size())),
        lower_(step, o, cand_, /*round_up=*/false) {
    const uint64_t fixed = step.fixed.total();
    const uint64_t used = fixed + step.tail_bytes;
    capacity_ = o.gpu_budget_bytes > used ? o.gpu_budget_bytes - used : 0;
    fixed_seconds_ = step.tail_seconds + step.embedding_seconds;
    // While layer i runs backward, every earlier layer's resident bytes are still on the GPU:
    // the resident bytes of layers 0..i-1 may not exceed budget - fixed - (the least backward
    // working set of any layer from i on).
    prefix_limit_.assign(n_ + 1, ~0ull);
    for (int i = n_ - 1; i >= 0; --i) {
      uint64_t least = ~0ull;
      for (const Candidate& c : cand_[i]) least = std::min(least, c.cost.backward_peak);
      const uint64_t room =
          o.gpu_budget_bytes > fixed + least ? o.gpu_budget_bytes - fixed - least : 0;
      prefix_limit_[i] = std::min(prefix_limit_[i + 1], room);
    }
  }

  // Lower bound on every plan.
  double RootBound() const { return lower_.Bound(0, 0, 0) + fixed_seconds_; }

  // First incumbents: the plans of the rounded-up table. The table misses what only the
  // simulation sees (copies still in flight beside a working set), so when its plan overshoots
  // the budget by some bytes, the table is rebuilt with that much less room and tried again.
  void Seed() {
    // Uniform plans: every layer input offloaded while the host budget lasts, the rest (and the
    // last layer, whose reload could not overlap anything) recomputed; each chunk count.
    for (int chunks : o_.chunk_counts) {
      for (int keep_last : {0, 1, 2}) {
        std::vector<int> pick(n_, -1);
        uint64_t host = 0;
        for (int i = 0; i < n_ && pick.size() == static_cast<size_t>(n_); ++i) {
          LayerPolicy policy = LayerPolicy::kRecompute;
          if (i < n_ - keep_last && host + step_.layers[i].input_bytes <= o_.host_budget_bytes) {
            policy = LayerPolicy::kOffloadInput;
          }
          if (o_.force.has_value()) policy = *o_.force;
          for (size_t k = 0; k < cand_[i].size(); ++k) {
            const LayerOption& option = cand_[i][k].option;
            if (option.policy == policy && option.chunks == chunks) pick[i] = static_cast<int>(k);
          }
          if (pick[i] < 0) break;
          host += cand_[i][pick[i]].cost.host_bytes;
        }
        if (std::find(pick.begin(), pick.end(), -1) != pick.end()) continue;
        for (int d : o_.prefetch_distances) TryLeaf(pick, d);
      }
    }
    OptimizerOptions tighter = o_;
    double table_work = 0;
    for (int attempt = 0; attempt < 12 && table_work < kSeedTableWork; ++attempt) {
      Table upper(step_, tighter, cand_, /*round_up=*/true);
      table_work += upper.work();
      std::vector<int> pick = upper.Choice();
      if (pick.empty()) return;
      uint64_t overshoot = ~0ull;
      for (int d : o_.prefetch_distances) {
        const SimResult sim = TryLeaf(pick, d);
        const uint64_t over =
            sim.peak_bytes > o_.gpu_budget_bytes ? sim.peak_bytes - o_.gpu_budget_bytes : 0;
        overshoot = std::min(overshoot, over);
      }
      if (overshoot == 0) return;
      const uint64_t cut = overshoot + (overshoot >> 2) + (64ull << 20);
      if (tighter.gpu_budget_bytes <= cut) return;
      tighter.gpu_budget_bytes -= cut;
    }
  }

  // Hill climbing from the best plan: change one layer's option (or the prefetch distance)
  // while that shortens the simulated step. Only improves the incumbent, so the search's bound
  // cuts more; the answer stays the search's.
  void Improve() {
    if (best_pick_.empty()) return;
    const double start = simulated_layers_;
    for (int pass = 0; pass < 8; ++pass) {
      bool improved = false;
      for (int i = 0; i < n_; ++i) {
        for (size_t k = 0; k < cand_[i].size(); ++k) {
          if (simulated_layers_ - start > kImproveSimulatedLayers) return;
          if (static_cast<int>(k) == best_pick_[i]) continue;
          // Without copy waits only less compute can shorten the step.
          if (best_stall_ == 0 && cand_[i][k].cost.compute_seconds() >=
                                      cand_[i][best_pick_[i]].cost.compute_seconds()) {
            continue;
          }
          std::vector<int> pick = best_pick_;
          pick[i] = static_cast<int>(k);
          const double before = best_seconds_;
          TryLeaf(pick, best_distance_);
          improved |= best_seconds_ < before;
        }
      }
      if (!improved) return;
    }
  }

  SimResult TryLeaf(const std::vector<int>& pick, int distance) {
    std::vector<OptionCost> costs(n_);
    for (int i = 0; i < n_; ++i) costs[i] = cand_[i][pick[i]].cost;
    SimResult sim = Simulate(step_, costs, distance, /*record=*/false);
    simulated_layers_ += n_;
    if (sim.peak_bytes <= o_.gpu_budget_bytes && sim.host_bytes <= o_.host_budget_bytes &&
        sim.step_seconds < best_seconds_) {
      best_seconds_ = sim.step_seconds;
      best_stall_ = sim.exposed_copy_seconds;
      best_pick_ = pick;
      best_distance_ = distance;
    }
    return sim;
  }

  // The search's own budget (Note [Bounded work]) counts from here, over every distance.
  void BeginSearch() { search_start_ = simulated_layers_; }

  void Run(int distance) {
    distance_ = distance;
    pick_.assign(n_, -1);
    pending_.clear();
    Dfs(0, 0.0, 0, 0, 0, 0, step_.embedding_seconds / 3, 0.0);
  }

  bool exhausted() const {
    return nodes_ > o_.node_limit || simulated_layers_ - search_start_ > kSearchSimulatedLayers;
  }
  int64_t nodes() const { return nodes_; }
  double best_seconds() const { return best_seconds_; }
  const std::vector<int>& best_pick() const { return best_pick_; }
  int best_distance() const { return best_distance_; }
  const std::vector<std::vector<Candidate>>& candidates() const { return cand_; }

 private:
  struct Pending {
    double done;
    uint64_t bytes;
  };

  void Dfs(int i, double compute, uint64_t resident, uint64_t host, int r_buckets, int h_buckets,
           double now, double d2h_free) {
    if (nodes_++ > o_.node_limit || exhausted()) return;
    if (i == n_) {
      TryLeaf(pick_, distance_);
      return;
    }
    const uint64_t previous_host = i > 0 ? cand_[i - 1][pick_[i - 1]].cost.host_bytes : 0;
    // Pool at the start of layer i's forward: resident bytes plus copies not yet done.
    uint64_t pool = resident;
    for (const Pending& p : pending_) {
      if (p.done > now) pool += p.bytes;
    }
    const uint64_t fixed = step_.fixed.total();
    struct Child {
      int k;
      double bound;
    };
    std::vector<Child> children;
    children.reserve(cand_[i].size());
    for (size_t k = 0; k < cand_[i].size(); ++k) {
      const OptionCost& c = cand_[i][k].cost;
      // Sums of a step's bytes cannot wrap (CheckStepCostBounds), but a budget near 2^64 (the
      // "unlimited" of a forced policy) must not make one: FitsBudget treats a wrap as too big.
      if (!FitsBudget(host, c.host_bytes, 0, o_.host_budget_bytes)) continue;
      if (!FitsBudget(fixed, pool, c.forward_peak, o_.gpu_budget_bytes)) continue;
      // During layer i's backward the previous layer's reload has already started (its H2D
      // follows layer i's in the same queue and is triggered no later than layer i starts).
      if (!FitsBudget(fixed + resident, previous_host, c.backward_peak, o_.gpu_budget_bytes)) {
        continue;
      }
      const uint64_t r = resident + c.resident_bytes;
      if (r > capacity_ || r > prefix_limit_[i + 1]) continue;
      const double rest =
          lower_.Bound(i + 1, r_buckets + lower_.Resident(c), h_buckets + lower_.Host(c));
      const double bound = compute + c.compute_seconds() + rest + fixed_seconds_;
      if (bound >= best_seconds_ * (1 - 1e-12)) continue;
      children.push_back({static_cast<int>(k), bound});
    }
    std::stable_sort(children.begin(), children.end(), [&](const Child& a, const Child& b) {
      if (a.bound != b.bound) return a.bound < b.bound;
      const OptionCost& x = cand_[i][a.k].cost;
      const OptionCost& y = cand_[i][b.k].cost;
      if (x.resident_bytes != y.resident_bytes) return x.resident_bytes < y.resident_bytes;
      return x.host_bytes < y.host_bytes;
    });
    for (const Child& child : children) {
      if (child.bound >= best_seconds_ * (1 - 1e-12)) break;
      const OptionCost& c = cand_[i][child.k].cost;
      pick_[i] = child.k;
      const double end = now + c.forward_seconds;
      double free = d2h_free;
      if (c.host_bytes > 0) {
        free = std::max(end, d2h_free) +
               static_cast<double>(c.host_bytes) / step_.d2h_bytes_per_second;
        pending_.push_back({free, c.host_bytes});
      }
      Dfs(i + 1, compute + c.compute_seconds(), resident + c.resident_bytes, host + c.host_bytes,
          r_buckets + lower_.Resident(c), h_buckets + lower_.Host(c), end, free);
      if (c.host_bytes > 0) pending_.pop_back();
      if (exhausted()) return;
    }
  }

  const StepCost& step_;
  const OptimizerOptions& o_;
  std::vector<std::vector<Candidate>> cand_;
  int n_;
  Table lower_;
  uint64_t capacity_ = 0;
  std::vector<uint64_t> prefix_limit_;  // see the constructor
  double fixed_seconds_ = 0;
  int distance_ = 1;
  std::vector<int> pick_;
  std::vector<Pending> pending_;
  int64_t nodes_ = 0;
  double simulated_layers_ = 0;  // Note [Bounded work]
  double search_start_ = 0;      // simulated_layers_ when the search began
  double best_seconds_ = kInf;
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
std::string Gib(uint64_t bytes) { return FormatBytes(bytes); }

}  // namespace

OptimizeResult Optimize(const StepCost& step, const OptimizerOptions& o) {
  // Everything below adds bytes and simulates layers on the strength of these bounds.
  if (absl::Status bounds = CheckStepCostBounds(step); !bounds.ok()) {
    OptimizeResult r;
    r.binding = "input limits";
    r.explanation = std::string(bounds.message());
    return r;
  }
  Search search(step, o, Candidates(step, o));
  bool any_layer_empty = false;
  for (const auto& c : search.candidates()) any_layer_empty |= c.empty();
  if (!any_layer_empty && search.RootBound() < kInf) {
    search.Seed();
    search.Improve();
    search.BeginSearch();
    for (int d : o.prefetch_distances) {
      search.Run(d);
      if (search.exhausted()) break;
    }
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
  r.lower_bound_seconds = std::min(search.RootBound(), r.sim.step_seconds);
  r.proven_optimal = !search.exhausted();
  r.nodes = search.nodes();
  return r;
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
    LayerOption option{LayerPolicy::kRecompute, 0, chunks};
    if (o.force.has_value()) {
      option.policy = *o.force;
    } else if (host + l.input_bytes <= o.host_budget_bytes) {
      option.policy = LayerPolicy::kOffloadInput;
      host += l.input_bytes;
    } else {
      host_limited = true;
    }
    options.push_back(option);
  }
  OptimizeResult r = Finish(step, options, 1);
  r.feasible = false;
  r.min_peak_bytes = r.sim.peak_bytes;
  const std::string fixed_parts =
      absl::StrCat("weights ", Gib(step.fixed.weights), ", gradients ", Gib(step.fixed.gradients),
                   ", optimizer state ", Gib(step.fixed.optimizer), ", communication buffers ",
                   Gib(step.fixed.comm_buffers),
                   step.fixed.other > 0 ? absl::StrCat(", other ", Gib(step.fixed.other)) : "");
  if (fixed >= o.gpu_budget_bytes) {
    r.binding = "fixed memory";
    r.explanation = absl::StrCat("fixed memory alone is ", Gib(fixed), " (", fixed_parts,
                                 ") against a GPU budget of ", Gib(o.gpu_budget_bytes));
  } else if (host_limited && !o.force.has_value()) {
    r.binding = "host memory";
    r.explanation = absl::StrCat("the host budget of ", Gib(o.host_budget_bytes),
                                 " per GPU takes the inputs of only part of the layers; the rest "
                                 "stay on the GPU and the peak is ",
                                 Gib(r.sim.peak_bytes));
  } else if (r.sim.peak_at == "LM head and loss") {
    r.binding = "LM head and loss";
    r.explanation = absl::StrCat("the LM head and loss need ", Gib(step.tail_bytes), " on top of ",
                                 Gib(fixed), " fixed memory; try a smaller --loss-chunk-tokens");
  } else {
    r.binding = absl::StrCat("working set of the ", r.sim.peak_at);
    r.explanation = absl::StrCat("one layer's working set does not fit next to ", Gib(fixed),
                                 " of fixed memory (", fixed_parts, ")");
  }
  return r;
}

absl::StatusOr<uint64_t> LongestFittingSeqLen(const ModelConfig& model,
                                              const HardwareProfile& hardware, RunSettings run,
                                              const OptimizerOptions& options, uint64_t granularity,
                                              uint64_t limit) {
  if (granularity == 0) granularity = 1;
  // Feasibility is monotone in the sequence length (every byte and second grows with it), so a
  // bisection over multiples of the granularity finds the longest.
  auto fits = [&](uint64_t units) -> absl::StatusOr<bool> {
    run.seq_len = units * granularity;
    auto step = BuildStepCost(model, hardware, run);
    if (!step.ok()) return step.status();
    return Optimize(*step, options).feasible;
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
