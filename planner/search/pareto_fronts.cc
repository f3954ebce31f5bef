// The Pareto fronts of Note [Exact search], step 1: a dynamic programme over the layers from the
// last to the first whose value at a layer and window of host-byte classes is the front of its
// suffix plans (slack, extra, cost), built in runs (Note [Plain runs], Note [Option groups]),
// pruned and thinned to a cap (Note [Bounded work] in optimizer.cc).
#include <algorithm>
#include <cstddef>
#include <numeric>
#include <utility>
#include <vector>

#include "planner/search/optimizer_internal.h"

namespace stowage::planner::optimizer_internal {

Fronts::Fronts(const Model& model, int cap)
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

double Fronts::Bound(int i, int key, double prefix, double extra_room) const {
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

std::vector<std::vector<int>> Fronts::Plans(int count) const {
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

// Keeps the options of `o` no other beats in top and cost (Note [Plain runs]): top falling,
// cost falling; returns how many.
size_t Fronts::Staircase(std::vector<GroupOption>& o) {
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
void Fronts::ExtraRun(int i, Group& group, double mult, double most,
                      std::vector<Label>& all) const {
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
void Fronts::PlainRun(int i, Group& group, std::vector<Label>& all,
                      std::vector<size_t>& runs) const {
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
bool Fronts::Before(const Label& a, const Label& b) {
  if (a.slack != b.slack) return a.slack > b.slack;
  if (a.cost != b.cost) return a.cost < b.cost;
  return a.extra < b.extra;
}

// The runs of `all` (each a staircase in Before order: slack and cost falling,
// Note [Plain runs]) merged into their lower envelope `out`, one run at a time (linear in the
// labels: at most the envelope's length plus the run's per run).
void Fronts::Merge(const std::vector<Label>& all, const std::vector<size_t>& runs,
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

void Fronts::Prune(std::vector<Label>& all, bool sorted, std::vector<Label>& out, char& plain) {
  if (!sorted) {
    std::sort(all.begin(), all.end(), [](const Label& a, const Label& b) { return Before(a, b); });
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

}  // namespace stowage::planner::optimizer_internal
