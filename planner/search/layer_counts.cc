#include "planner/search/layer_counts.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace stowage::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Rooms are compared with this relative slack: the relaxation admits a little more than the
// budgets, which only weakens its bound (the plans it suggests are simulated exactly).
constexpr double kRoomSlack = 1e-12;
// Golden-section steps over the host price: the root's (0.618^64, about 1e-13 of the interval)
// and a node's (0.618^40, about 4e-9: any prices give a valid bound, these only sharpen it).
constexpr int kRootGoldenSteps = 64;
constexpr int kNodeGoldenSteps = 40;
// Doublings of the first host price while the dual still rises.
constexpr int kPriceDoublings = 10;

// A group's options from `first` on, `count` layers of them (a node of the search fixes the
// counts of a group's options one at a time).
struct View {
  double count = 0;
  const CountOption* first = nullptr;
  int size = 0;
};

// max over l >= 0 of sum_v count min_k (base(k) + l gpu_k) - l gpu_room, and its l: the slope in
// l is the chosen options' GPU bytes less the room, falling at the breakpoints of each group's
// lower envelope of the lines base + l gpu. +inf when it never falls to 0 (the least GPU bytes
// exceed the room: no count vector fits). With base = cost + p host it is D(l, p) + p host_room
// at the best l; with base = host, the least host bytes any (fractional) count vector within the
// GPU room takes.
template <typename Base>
double Envelope(const std::vector<View>& views, double gpu_room, Base&& base, double* l_out,
                std::vector<std::pair<double, double>>& breaks) {
  breaks.clear();
  double slope = -gpu_room;
  for (const View& v : views) {
    if (v.count <= 0) continue;
    const CountOption* o = v.first;
    int at = -1;
    double least = kInf;
    for (int k = 0; k < v.size; ++k) {
      const double value = base(o[k]);
      if (at < 0 || value < least || (value == least && o[k].gpu < o[at].gpu)) {
        at = k;
        least = value;
      }
    }
    slope += v.count * o[at].gpu;
    double l = 0;
    while (true) {
      // The line that takes over first as l grows: less GPU, the earliest crossing.
      int next = -1;
      double when = kInf;
      const double from = base(o[at]);
      for (int k = 0; k < v.size; ++k) {
        if (o[k].gpu >= o[at].gpu) continue;
        const double t = (base(o[k]) - from) / (o[at].gpu - o[k].gpu);
        if (t < when || (t == when && next >= 0 && o[k].gpu < o[next].gpu)) {
          when = t;
          next = k;
        }
      }
      if (next < 0) break;
      when = std::max(when, l);
      breaks.push_back({when, v.count * (o[at].gpu - o[next].gpu)});
      l = when;
      at = next;
    }
  }
  double l = 0;
  if (slope > 0) {
    std::sort(breaks.begin(), breaks.end());
    l = kInf;
    for (const auto& [t, drop] : breaks) {
      slope -= drop;
      if (slope <= 0) {
        l = t;
        break;
      }
    }
    if (l == kInf) return kInf;
  }
  double d = -l * gpu_room;
  for (const View& v : views) {
    if (v.count <= 0) continue;
    double least = kInf;
    for (int k = 0; k < v.size; ++k) least = std::min(least, base(v.first[k]) + l * v.first[k].gpu);
    d += v.count * least;
  }
  *l_out = l;
  return d;
}

// D(l, p) at the best l for p, plus `offset` (the costs fixed so far).
double BestGpuPrice(const std::vector<View>& views, double gpu_room, double host_room,
                    double offset, double p, double* l_out,
                    std::vector<std::pair<double, double>>& breaks) {
  const double d = Envelope(
      views, gpu_room, [p](const CountOption& o) { return o.cost + p * o.host; }, l_out, breaks);
  return d == kInf ? kInf : offset + d - p * host_room;
}

// The dual's maximum over both prices: the exact l for each p, p by golden section over
// [0, 2 high], high a first price (a group's dearest option over its cheapest per host byte of
// its largest) doubled while D still rises. Every (l, p) evaluated gives a valid bound; the best
// is returned.
TwoPrices Maximize(const std::vector<View>& views, double gpu_room, double host_room, double offset,
                   int steps, std::vector<std::pair<double, double>>& breaks) {
  TwoPrices best;
  auto at = [&](double p) {
    double l = 0;
    const double d = BestGpuPrice(views, gpu_room, host_room, offset, p, &l, breaks);
    if (d > best.value) best = {l, p, d};
    return d;
  };
  if (at(0) == kInf) return best;  // the GPU room alone admits nothing, at any host price
  double high = 0;
  for (const View& v : views) {
    if (v.count <= 0) continue;
    double least = kInf, most = -kInf, most_host = 0;
    for (int k = 0; k < v.size; ++k) {
      least = std::min(least, v.first[k].cost);
      most = std::max(most, v.first[k].cost);
      most_host = std::max(most_host, v.first[k].host);
    }
    if (most_host > 0) high = std::max(high, (most - least) / most_host);
  }
  if (!(high > 0)) return best;  // no option takes host bytes, or none trades them for time
  double at_high = at(high);
  for (int t = 0; t < kPriceDoublings; ++t) {
    const double next = at(2 * high);
    if (!(next > at_high)) break;
    high *= 2;
    at_high = next;
  }
  double lo = 0, hi = 2 * high;
  const double phi = (std::sqrt(5.0) - 1) / 2;
  double x1 = hi - phi * (hi - lo), x2 = lo + phi * (hi - lo);
  double f1 = at(x1), f2 = at(x2);
  for (int t = 0; t < steps; ++t) {
    if (f1 < f2) {
      lo = x1;
      x1 = x2;
      f1 = f2;
      x2 = lo + phi * (hi - lo);
      f2 = at(x2);
    } else {
      hi = x2;
      x2 = x1;
      f2 = f1;
      x1 = hi - phi * (hi - lo);
      f1 = at(x1);
    }
  }
  return best;
}

// Note [Whole layers]
// The relaxation of Note [Two prices] keeps two constraints of the plan's memory (the level at
// the LM head, the host budget) and is bounded by its linear relaxation's dual. That dual is the
// optimum of a plan that may split a layer between options; deep models whose both budgets bind
// lose up to about one layer's choice to it (1,000 Llama layers over 16 stages: 0.05%, where the
// default gap is 0.01%). In whole layers the same relaxation is a knapsack in counts: a group of
// n identical layers (equal option lists) chooses how many of them take each option, so its size
// does not multiply the search, and the layer order (which the relaxation does not see) is gone
// with the symmetry it made for a search over layers.
// The branch and bound fixes the counts of one group's options after another (the last option of a
// group takes the rest). A node's bound is the dual of what is left, its prices maximised
// (BestTwoPrices' method). A child t (the option's count) has the dual
//   D_t(l, p) = D_0(l, p) + t (c + l a + p b - min over the group's later options of the same),
// linear in t for fixed prices, so one child's best prices bound every sibling by a line: the
// children are evaluated from the least of those lines outward and none is left unevaluated whose
// line-bound is below the cutoff (a convex function of t: the children that can win are an
// interval, found in a few evaluations even for thousands of layers). Every bound is weak duality
// at some prices, so it holds whatever the prices' accuracy; the counts are exact integers and the
// leaves check both rooms, so a completed search is the relaxation's integer optimum.
// Options a group has that another of its options beats in cost, GPU and host bytes are dropped
// first (replacing one by the other keeps every count vector within the rooms and costs no more).
class Search {
 public:
  Search(const std::vector<CountGroup>& groups, double gpu_room, double host_room, double cutoff,
         double gap, int64_t work_limit)
      : gpu_room_(gpu_room + std::abs(gpu_room) * kRoomSlack),
        host_room_(host_room + std::abs(host_room) * kRoomSlack),
        cutoff_(cutoff),
        prune_(gap > 0 ? 1 / (1 + gap) : 1 - 1e-12),
        work_limit_(work_limit) {
    for (const CountGroup& g : groups) {
      Group& kept = groups_.emplace_back();
      kept.layers = g.layers;
      kept.inputs = g.options.size();
      const int n = static_cast<int>(g.options.size());
      for (int k = 0; k < n; ++k) {
        const CountOption& a = g.options[k];
        bool beaten = false;
        for (int j = 0; j < n && !beaten; ++j) {
          if (j == k) continue;
          const CountOption& b = g.options[j];
          const bool no_worse = b.cost <= a.cost && b.gpu <= a.gpu && b.host <= a.host;
          const bool better = b.cost < a.cost || b.gpu < a.gpu || b.host < a.host;
          beaten = no_worse && (better || j < k);
        }
        if (!beaten) kept.index.push_back(k);
      }
      // Cheapest first (then the least GPU, the least host): the counts fixed first are those
      // of the options the relaxation fills most.
      std::sort(kept.index.begin(), kept.index.end(), [&](int x, int y) {
        const CountOption& a = g.options[x];
        const CountOption& b = g.options[y];
        if (a.cost != b.cost) return a.cost < b.cost;
        if (a.gpu != b.gpu) return a.gpu < b.gpu;
        return a.host < b.host;
      });
      for (int k : kept.index) kept.options.push_back(g.options[k]);
      if (kept.options.empty()) infeasible_ = g.layers > 0;
    }
    x_.resize(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) x_[g].assign(groups_[g].options.size(), 0);
  }

  LayerCounts Run() {
    LayerCounts out;
    out.counts.resize(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) {
      out.counts[g].assign(groups_[g].inputs, 0);
    }
    if (infeasible_) {
      out.complete = true;
      out.bound = kInf;
      return out;
    }
    const TwoPrices root = Lp(0, 0, Layers(0), gpu_room_, host_room_, 0, kRootGoldenSteps);
    out.bound = root.value;
    if (root.value < Threshold()) Visit(0, 0, Layers(0), gpu_room_, host_room_, 0, root.value);
    out.nodes = nodes_;
    out.evaluations = evaluations_;
    out.cost = best_cost_;
    if (best_cost_ < kInf) {
      for (size_t g = 0; g < groups_.size(); ++g) {
        for (size_t k = 0; k < groups_[g].index.size(); ++k) {
          out.counts[g][groups_[g].index[k]] = best_x_[g][k];
        }
      }
    }
    // Every pruned node's bound was at least the threshold, every leaf at least best and, where
    // the work ran out, every count vector not yet reached at least open_.
    out.complete = !aborted_;
    out.bound = std::max(out.bound, std::min({best_cost_, Threshold(), open_}));
    return out;
  }

 private:
  struct Group {
    int64_t layers = 0;
    size_t inputs = 0;                 // options in the input
    std::vector<CountOption> options;  // undominated, cheapest first
    std::vector<int> index;            // each one's index in the input
  };

  int64_t Layers(size_t g) const { return g < groups_.size() ? groups_[g].layers : 0; }
  // Below this a node can still hold a count vector better than the best found (or the cutoff) by
  // more than the gap.
  double Threshold() const {
    const double t = std::min(best_cost_, cutoff_);
    return t == kInf ? kInf : t * prune_;
  }

  // The dual of the node that has fixed groups < g and group g's options < k, with r layers of
  // group g left, rooms ga and gb left, and `cost` fixed.
  TwoPrices Lp(size_t g, int k, int64_t r, double ga, double gb, double cost, int steps) {
    ChildViews(g, k, r);
    return MaximizeViews(ga, gb, cost, steps);
  }

  // d D_t / d t at prices (l, p) for option k of group g (Note [Whole layers]).
  double Slope(size_t g, int k, double l, double p) const {
    const std::vector<CountOption>& o = groups_[g].options;
    double least = kInf;
    for (size_t j = static_cast<size_t>(k) + 1; j < o.size(); ++j) {
      least = std::min(least, o[j].cost + l * o[j].gpu + p * o[j].host);
    }
    return o[k].cost + l * o[k].gpu + p * o[k].host - least;
  }

  void Visit(size_t g, int k, int64_t r, double ga, double gb, double cost, double bound) {
    if (aborted_) {
      open_ = std::min(open_, bound);
      return;
    }
    // Groups with no layer left fix the rest of their options at 0.
    while (g < groups_.size() && r == 0) {
      ++g;
      k = 0;
      r = Layers(g);
    }
    if (g == groups_.size()) {
      if (cost < best_cost_) {
        best_cost_ = cost;
        best_x_ = x_;
      }
      return;
    }
    const CountOption& o = groups_[g].options[k];
    const int last = static_cast<int>(groups_[g].options.size()) - 1;
    if (k == last) {  // the rest of the group's layers
      const double t = static_cast<double>(r);
      if (t * o.gpu > ga || t * o.host > gb) return;
      x_[g][k] = r;
      Visit(g + 1, 0, Layers(g + 1), ga - t * o.gpu, gb - t * o.host, cost + t * o.cost, bound);
      x_[g][k] = 0;
      return;
    }
    ++nodes_;
    if (evaluations_ >= work_limit_) {
      aborted_ = true;
      open_ = std::min(open_, bound);
      return;
    }
    int64_t most = r;
    if (o.gpu > 0) most = std::min<int64_t>(most, static_cast<int64_t>(std::floor(ga / o.gpu)));
    if (o.host > 0) most = std::min<int64_t>(most, static_cast<int64_t>(std::floor(gb / o.host)));
    if (most < 0) return;
    // Children t = lo..hi (Note [Whole layers]). An evaluated child gives a line under every
    // sibling's dual (`value` + (t' - t) `slope`) or, where it admits no count vector, a line
    // under a measure of infeasibility (`value` = +inf, `excess` + (t' - t) `slope` > 0: none
    // fits).
    struct Child {
      int64_t t;
      double value, slope, excess;
      bool visited;
    };
    std::vector<Child> seen;
    int64_t lo = 0, hi = most;
    auto line_bound = [&](int64_t t) {
      double b = bound;  // the node's own bound holds for every child
      for (const Child& c : seen) {
        if (c.value < kInf) b = std::max(b, c.value + static_cast<double>(t - c.t) * c.slope);
      }
      return b;
    };
    auto evaluated = [&](int64_t t) {
      return std::any_of(seen.begin(), seen.end(), [&](const Child& c) { return c.t == t; });
    };
    auto evaluate = [&](int64_t t) {
      ++evaluations_;
      const double dt = static_cast<double>(t);
      const double ga_t = ga - dt * o.gpu, gb_t = gb - dt * o.host;
      ChildViews(g, k + 1, r - t);
      // Feasible (as a linear programme) only if the least host bytes within the GPU room fit.
      double mu = 0;
      const double host = Envelope(
          views_, ga_t, [](const CountOption& x) { return x.host; }, &mu, breaks_);
      const std::vector<CountOption>& os = groups_[g].options;
      if (host == kInf) {  // the least GPU bytes exceed the room
        double least = kInf;
        for (size_t j = static_cast<size_t>(k) + 1; j < os.size(); ++j) {
          least = std::min(least, os[j].gpu);
        }
        double excess = -ga_t;
        for (const View& v : views_) {
          double m = kInf;
          for (int j = 0; j < v.size; ++j) m = std::min(m, v.first[j].gpu);
          if (v.count > 0) excess += v.count * m;
        }
        seen.push_back({t, kInf, o.gpu - least, excess, false});
        return;
      }
      if (host > gb_t) {
        double least = kInf;
        for (size_t j = static_cast<size_t>(k) + 1; j < os.size(); ++j) {
          least = std::min(least, os[j].host + mu * os[j].gpu);
        }
        seen.push_back({t, kInf, o.host + mu * o.gpu - least, host - gb_t, false});
        return;
      }
      const TwoPrices d = MaximizeViews(ga_t, gb_t, cost + dt * o.cost, kNodeGoldenSteps);
      seen.push_back({t, d.value, d.value == kInf ? 0 : Slope(g, k, d.gpu, d.host), 0, false});
    };
    // The children left: within the infeasibility lines, below the threshold on the dual's.
    auto narrow = [&]() {
      const double threshold = Threshold();
      auto clamp = [&](double t) { return std::clamp(t, -1.0, static_cast<double>(most) + 1); };
      for (const Child& c : seen) {
        const double t = static_cast<double>(c.t);
        double over = 0;  // the line is > 0 (infeasible) or >= threshold (cannot win) beyond here
        if (c.value == kInf) {
          over = c.excess;
        } else if (threshold < kInf) {
          over = c.value - threshold;
        } else {
          continue;
        }
        const bool strict = c.value == kInf;  // infeasible needs > 0, pruned >= 0
        if (c.slope > 0) {
          // Where over + (t' - t) slope reaches 0.
          const double at = clamp(t - over / c.slope);
          hi = std::min(hi, static_cast<int64_t>(strict ? std::floor(at) : std::ceil(at) - 1));
        } else if (c.slope < 0) {
          const double at = clamp(t - over / c.slope);
          lo = std::max(lo, static_cast<int64_t>(strict ? std::ceil(at) : std::floor(at) + 1));
        } else if (strict ? over > 0 : over >= 0) {
          lo = hi + 1;
        }
      }
    };
    // The least of the lines over [lo, hi] (an integer next to where it is least on the reals: an
    // end, or where a falling line meets a rising one or the node's bound).
    auto least_at = [&]() {
      int64_t where = lo;
      double least = line_bound(lo);
      auto consider = [&](double t) {
        t = std::clamp(t, static_cast<double>(lo), static_cast<double>(hi));
        for (double c : {std::floor(t), std::ceil(t)}) {
          const double b = line_bound(static_cast<int64_t>(c));
          if (b < least) {
            least = b;
            where = static_cast<int64_t>(c);
          }
        }
      };
      consider(static_cast<double>(hi));
      for (const Child& a : seen) {
        if (a.value == kInf || a.slope == 0) continue;
        const double ta = static_cast<double>(a.t);
        consider(ta + (bound - a.value) / a.slope);
        for (const Child& b : seen) {
          if (a.slope < 0 && b.value < kInf && b.slope > 0) {
            const double tb = static_cast<double>(b.t);
            consider((b.value - a.value + a.slope * ta - b.slope * tb) / (a.slope - b.slope));
          }
        }
      }
      return where;
    };
    // Locate the children's least (a few evaluations: the ends, then where the lines cross).
    evaluate(0);
    if (most > 0) evaluate(most);
    for (int step = 0; step < 8; ++step) {
      narrow();
      if (lo > hi) break;
      const int64_t t = least_at();
      if (evaluated(t)) break;
      evaluate(t);
    }
    while (true) {
      narrow();
      if (lo > hi) break;
      const double threshold = Threshold();
      // The best evaluated child not yet visited, and the unevaluated child with the least
      // line-bound (where the lines are least, or next to an evaluated child: the bound is
      // convex in t).
      Child* next = nullptr;
      for (Child& c : seen) {
        if (!c.visited && c.t >= lo && c.t <= hi && c.value < threshold &&
            (next == nullptr || c.value < next->value)) {
          next = &c;
        }
      }
      int64_t fresh = -1;
      double fresh_bound = kInf;
      auto candidate = [&](int64_t t) {
        if (t < lo || t > hi || evaluated(t)) return;
        const double b = line_bound(t);
        if (b < threshold && b < fresh_bound) {
          fresh = t;
          fresh_bound = b;
        }
      };
      candidate(least_at());
      candidate(lo);
      candidate(hi);
      for (size_t i = 0; i < seen.size(); ++i) {
        candidate(seen[i].t - 1);
        candidate(seen[i].t + 1);
      }
      if (next == nullptr && fresh < 0) break;
      if (aborted_ || evaluations_ >= work_limit_) {
        // Cut short: what this node has not searched is bounded by its least open child.
        aborted_ = true;
        open_ = std::min({open_, next != nullptr ? next->value : kInf, fresh_bound});
        return;
      }
      if (next != nullptr && (fresh < 0 || next->value <= fresh_bound)) {
        next->visited = true;
        const int64_t t = next->t;
        const double value = next->value, dt = static_cast<double>(t);
        x_[g][k] = t;
        Visit(g, k + 1, r - t, ga - dt * o.gpu, gb - dt * o.host, cost + dt * o.cost, value);
        x_[g][k] = 0;
      } else {
        evaluate(fresh);
      }
    }
  }

  // views_ for the node of group g's options from k on with r of its layers left.
  void ChildViews(size_t g, int k, int64_t r) {
    views_.clear();
    if (g >= groups_.size()) return;
    const Group& group = groups_[g];
    views_.push_back({static_cast<double>(r), group.options.data() + k,
                      static_cast<int>(group.options.size()) - k});
    for (size_t h = g + 1; h < groups_.size(); ++h) {
      views_.push_back({static_cast<double>(groups_[h].layers), groups_[h].options.data(),
                        static_cast<int>(groups_[h].options.size())});
    }
  }
  TwoPrices MaximizeViews(double ga, double gb, double cost, int steps) {
    return Maximize(views_, ga, gb, cost, steps, breaks_);
  }

  std::vector<Group> groups_;
  double gpu_room_, host_room_, cutoff_;
  double prune_;
  int64_t work_limit_;
  bool infeasible_ = false, aborted_ = false;
  int64_t nodes_ = 0, evaluations_ = 0;
  double open_ = kInf;  // the least bound of what a search cut short left
  std::vector<std::vector<int64_t>> x_, best_x_;
  double best_cost_ = kInf;
  std::vector<View> views_;
  std::vector<std::pair<double, double>> breaks_;
};

}  // namespace

TwoPrices BestTwoPrices(const std::vector<CountGroup>& groups, double gpu_room, double host_room) {
  std::vector<View> views;
  for (const CountGroup& g : groups) {
    if (g.options.empty()) {
      if (g.layers > 0) return {0, 0, kInf};  // a layer with no option: nothing fits
      continue;
    }
    views.push_back(
        {static_cast<double>(g.layers), g.options.data(), static_cast<int>(g.options.size())});
  }
  std::vector<std::pair<double, double>> breaks;
  return Maximize(views, gpu_room, host_room, 0, kRootGoldenSteps, breaks);
}

LayerCounts SolveLayerCounts(const std::vector<CountGroup>& groups, double gpu_room,
                             double host_room, double cutoff, double gap, int64_t work_limit) {
  return Search(groups, gpu_room, host_room, cutoff, gap, work_limit).Run();
}

}  // namespace stowage::planner
