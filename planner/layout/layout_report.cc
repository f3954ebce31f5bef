#include "planner/layout/layout_report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/bytes.h"
#include "planner/report/report.h"

namespace stowage::planner {
namespace {

constexpr const char* kRow = "%5s  %-36s %10s %10s %10s %12s %10s %10s  %s\n";

// With several GPU counts searched, each row names its own.
std::string Row(const std::string& rank, const LayoutOutcome& o, bool gpus) {
  return absl::StrFormat(
      kRow, rank,
      absl::StrCat(gpus ? absl::StrCat(o.layout.gpus, " GPUs ") : "", LayoutName(o.layout)),
      FormatBytes(o.peak_bytes), FormatBytes(o.host_bytes), FormatSeconds(o.step_seconds),
      absl::StrFormat("%.0f", o.tokens_per_second), FormatSeconds(o.comm_seconds),
      FormatSeconds(o.bubble_seconds), o.binding);
}

}  // namespace

std::string ExplainGap(const LayoutOutcome& layout, const LayoutOutcome& best) {
  const double gap = layout.step_seconds - best.step_seconds;
  const std::pair<double, const char*> terms[] = {
      {layout.compute_seconds - best.compute_seconds, "compute"},
      {layout.memory_seconds - best.memory_seconds, "memory"},
      {layout.comm_seconds - best.comm_seconds, "comm"},
      {layout.bubble_seconds - best.bubble_seconds, "bubble"}};
  std::string out =
      absl::StrFormat("%+.1f%% (%s%s)", best.step_seconds > 0 ? 100 * gap / best.step_seconds : 0,
                      gap >= 0 ? "+" : "-", FormatSeconds(std::abs(gap)));
  if (gap <= 0) return out;
  absl::StrAppend(&out, ":");
  for (const auto& [seconds, name] : terms) {
    absl::StrAppend(&out, " ", name, " ", seconds >= 0 ? "+" : "-",
                    FormatSeconds(std::abs(seconds)));
  }
  const auto* decides = std::max_element(std::begin(terms), std::end(terms));
  absl::StrAppend(&out, "; decides: ", decides->second);
  return out;
}

std::string RenderLayoutSearch(const LayoutSearchRequest& q, const LayoutSearchResult& r,
                               const LayoutReportOptions& o) {
  std::string out = absl::StrFormat(
      "layouts: %d enumerated, %d valid, %d planned (%d stage plans), %d never planned (their "
      "bound is above the table's last step)\n\n",
      r.layouts, r.valid, r.planned, r.stage_plans, r.bounded_out);
  absl::StrAppend(&out, absl::StrFormat(kRow, "rank", "layout", "peak", "host/GPU", "step",
                                        "tokens/s", "comm", "bubble", "binds"));
  const bool gpus = q.gpu_counts.size() > 1;
  std::vector<int> rows;
  for (int i = 0; i < r.top; ++i) rows.push_back(i);
  for (int i = 0; i < r.top; ++i)
    absl::StrAppend(&out, Row(absl::StrCat(i + 1), r.ranked[i], gpus));
  for (size_t k = 0; k < r.rank_also_rank.size(); ++k) {
    const int rank = r.rank_also_rank[k];
    if (rank > r.top) {
      const bool exact = r.rank_also_rank_max[k] == rank;
      absl::StrAppend(&out, Row(absl::StrCat(rank, exact ? "" : "+"), r.ranked[rank - 1], gpus));
      rows.push_back(rank - 1);
    }
  }
  if (r.ranked.empty()) absl::StrAppend(&out, "  (no layout fits)\n");
  for (size_t k = 0; k < r.rank_also_rank.size(); ++k) {
    const int rank = r.rank_also_rank[k];
    const std::string& text = q.rank_also[k].text;
    if (rank == 0) {
      absl::StrAppend(&out, "\n", text, ": no valid layout of it fits (see the pruned lines)\n");
      continue;
    }
    const int most = r.rank_also_rank_max[k];
    absl::StrAppend(&out, "\n", text, ": ", LayoutName(r.ranked[rank - 1].layout), ", rank ",
                    most > rank ? absl::StrCat(rank, " to ", most, " (", most - rank,
                                               " layouts never planned might beat it; "
                                               "--exact-rank plans them)")
                                : absl::StrCat(rank, " (exact)"));
    if (rank > 1) {
      absl::StrAppend(&out, ", gap to the best ", ExplainGap(r.ranked[rank - 1], r.ranked[0]));
    }
    absl::StrAppend(&out, "\n");
  }
  if (!r.pruned.empty()) {
    std::vector<PrunedFamily> pruned = r.pruned;
    // What memory rules out first (the families a user would otherwise try), then the rules.
    auto order = [](const std::string& kind) {
      return kind == "fixed memory"   ? 0
             : kind == "host memory"  ? 1
             : kind == "does not fit" ? 2
             : kind == "search rule"  ? 3
                                      : 4;
    };
    std::stable_sort(pruned.begin(), pruned.end(), [&](const auto& a, const auto& b) {
      return order(a.kind) < order(b.kind) ||
             (order(a.kind) == order(b.kind) && a.layouts > b.layouts);
    });
    std::map<std::string, int64_t> kinds;
    for (const PrunedFamily& f : pruned) kinds[f.kind] += f.layouts;
    std::vector<std::string> totals;
    for (const auto& [kind, count] : kinds) totals.push_back(absl::StrCat(kind, " ", count));
    absl::StrAppend(&out, "\npruned: ", absl::StrJoin(totals, ", "),
                    kinds.count("search rule") > 0
                        ? " (a search rule's count is of families, not enumerated further)\n"
                        : "\n");
    absl::StrAppend(&out, "  layouts  one of them: why\n");
    int64_t rest = 0, rest_lines = 0;
    for (size_t i = 0; i < pruned.size(); ++i) {
      if (static_cast<int>(i) < o.max_pruned_lines) {
        absl::StrAppend(&out, absl::StrFormat("  %7d  %s (%s): %s\n", pruned[i].layouts,
                                              pruned[i].example, pruned[i].kind, pruned[i].reason));
      } else {
        rest += pruned[i].layouts;
        ++rest_lines;
      }
    }
    if (rest_lines > 0) {
      absl::StrAppend(
          &out, absl::StrFormat("  %7d  in %d more families (--pruned-lines shows them)\n", rest,
                                rest_lines));
    }
  }
  if (!r.ranked.empty()) {
    absl::StrAppend(&out, "\nto plan a row alone:\n");
    for (int i : rows) {
      if (!o.flags_per_row && i > 0) break;
      absl::StrAppend(&out, absl::StrFormat("  %3d  stowage plan %s %s\n", i + 1, o.base_flags,
                                            LayoutFlags(r.ranked[i].layout, o.global_batch)));
    }
  }
  return out;
}

}  // namespace stowage::planner
