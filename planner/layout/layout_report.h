// The layout search's answer as text: the ranked table, the layouts asked to be ranked with their
// gap to the best and the cost term that decides it, the pruned families, and the `stowage plan`
// flags that reproduce each row (`stowage search`, `stowage bench search`).
#ifndef STOWAGE_PLANNER_LAYOUT_LAYOUT_REPORT_H_
#define STOWAGE_PLANNER_LAYOUT_LAYOUT_REPORT_H_

#include <string>
#include <vector>

#include "planner/layout/layout_search.h"

namespace stowage::planner {

struct LayoutReportOptions {
  // The `stowage plan` flags of the job without its layout, e.g. "--model deepseek-v3 --hardware
  // h800 --seq-len 4096"; each row's reproducing command is these and LayoutFlags.
  std::string base_flags;
  uint64_t global_batch = 1;
  int max_pruned_lines = 16;  // the rest are counted
  bool flags_per_row = true;  // the reproducing command of every row (else of the best only)
};

// The header line of counts, the table of the top layouts (and each rank_also layout below it
// when outside the top), the gap lines, the pruned families and the reproducing commands.
std::string RenderLayoutSearch(const LayoutSearchRequest& request, const LayoutSearchResult& result,
                               const LayoutReportOptions& options);

// "+12.3% (+0.41 s): bubble +0.30 s, comm +0.12 s, ...; decides: bubble" for `layout` against
// `best` (both planned and fitting).
std::string ExplainGap(const LayoutOutcome& layout, const LayoutOutcome& best);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_LAYOUT_LAYOUT_REPORT_H_
