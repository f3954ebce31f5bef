// Which job shape: every parallel layout Megatron-Core accepts for a model, hardware, GPU count,
// sequence length and global batch (TP, CP, EP, PP, VPP, micro-batch, schedule, rank order),
// each planned with the per-layer optimizer (planner/search/pipeline.h PlanPipeline) and ranked
// by step time for the global batch. Valid bounds (fixed memory alone, a compute-only step time)
// keep most layouts from being planned; Note [Layout search] in layout_search.cc.
#ifndef STOWAGE_PLANNER_LAYOUT_LAYOUT_SEARCH_H_
#define STOWAGE_PLANNER_LAYOUT_LAYOUT_SEARCH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/run_settings.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "planner/search/optimizer.h"
#include "planner/search/pipeline.h"
#include "stowage/plan.h"

namespace stowage::planner {

// One parallel layout of a job: the settings `stowage plan` takes for it.
struct Layout {
  int gpus = 1, tp = 1, cp = 1, ep = 1, pp = 1, vpp = 1;
  int micro_batch = 1;
  int microbatches = 1;  // per step: global batch / (micro_batch x data parallel)
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  RankOrder rank_order = RankOrder::kTpCpEpDpPp;
  // Layers per (virtual) stage where Megatron's even split does not divide them (DerivedPpLayout);
  // empty: the even split.
  std::vector<int> pp_layout;
  // The data-parallel sharding where the search chooses it (LayoutSearchRequest::shardings);
  // else the base run's.
  std::optional<Sharding> sharding;
  friend bool operator==(const Layout&, const Layout&) = default;
};

// "TP 1 CP 8 EP 8 PP 1 MB 1", with "VPP 2" (interleaved), "pp-dp" (rank order tp-cp-ep-pp-dp)
// and the sharding where they apply.
std::string LayoutName(const Layout& layout);
// The `stowage plan` flags that set the layout (with --global-batch for its microbatches).
std::string LayoutFlags(const Layout& layout, uint64_t global_batch);
// `base` (sequence length, framework, sharding, ...) with the layout's settings.
RunSettings ApplyLayout(RunSettings base, const Layout& layout);

// Layers per virtual stage when `layers` do not divide evenly over `virtual_stages`
// (Note [Derived pipeline layout] in layout_search.cc); empty when they do.
std::vector<int> DerivedPpLayout(int layers, int virtual_stages);

// A layout to rank whatever its place: the sizes it names, any of the rest (0: any).
struct LayoutPattern {
  std::string text;  // as given, e.g. "tp=8,cp=16,pp=16"
  int gpus = 0, tp = 0, cp = 0, ep = 0, pp = 0, vpp = 0, micro_batch = 0;
  bool Matches(const Layout& layout) const;
};
// "tp=8,cp=16,pp=16" (keys gpus, tp, cp, ep, pp, vpp, mb); errors name the text and the keys.
absl::StatusOr<LayoutPattern> ParseLayoutPattern(const std::string& text);

struct LayoutSearchRequest {
  ModelConfig model;
  HardwareProfile hardware;
  // Everything but the layout: sequence length, framework, sharding, optimizer, dtypes, ...
  RunSettings base;
  std::vector<int> gpu_counts;
  uint64_t global_batch = 1;  // sequences per step
  OptimizerOptions options;   // the budgets and the optimizer's settings, as `stowage plan`'s
  int top = 10;               // layouts ranked exactly (the rest only bounded)
  bool allow_tp_outside_nvlink = false;
  int max_vpp = 4;          // model chunks per stage tried (interleaved schedule)
  int max_micro_batch = 8;  // sequences per micro-batch tried
  // Data-parallel shardings tried; empty: the base run's alone.
  std::vector<Sharding> shardings;
  // Layouts ranked exactly wherever they fall (the best match of each).
  std::vector<LayoutPattern> rank_also;
  // Plan every layout that might rank above a rank_also layout, so that its rank is exact (else
  // a range: LayoutSearchResult::rank_also_rank_max).
  bool exact_rank = false;
  // Plan every valid layout, pruned or not (the tests' reference).
  bool exhaustive = false;
};

// How one layout fared. Seconds terms of the step (they add up to step_seconds): compute is
// the slowest stage's least compute per microbatch (the bound's), memory what recompute and
// copy waits add, comm the exposed collectives, point-to-point and once-per-step work, bubble
// the pipeline's fill and drain.
struct LayoutOutcome {
  Layout layout;
  double bound_seconds = 0;  // no plan of this layout is faster
  bool planned = false;
  bool feasible = false;
  double step_seconds = 0;
  double tokens_per_second = 0;
  uint64_t peak_bytes = 0;  // the highest stage's
  uint64_t host_bytes = 0;  // pinned host bytes per GPU, the highest stage's
  double compute_seconds = 0, memory_seconds = 0, comm_seconds = 0, bubble_seconds = 0;
  std::string binding;  // what binds: the largest term ("compute", "bubble", ...), or why no fit
};

// Layouts left out, grouped by family (GPU count, TP, CP, EP, PP) and kind: why (the first one's
// reason), how many, one of them.
struct PrunedFamily {
  // "divisibility" (ValidateRun, ValidatePipeline, the global batch), "search rule" (TP beyond
  // NVLink, CP not zigzag-divisible), "fixed memory", "host memory", "does not fit" (planned).
  std::string kind;
  std::string reason;
  int layouts = 0;
  std::string example;  // LayoutName of the first
};

struct LayoutSearchResult {
  std::vector<LayoutOutcome> ranked;  // fitting, planned, fastest first (ties: enumeration order)
  // Where the top list ends: no layout left unplanned can beat ranked[top - 1] (or any, when
  // fewer fit). ranked may hold more (the rank_also layouts and what beat them).
  int top = 0;
  // rank_also[k]'s best match: its 1-based rank in ranked, 0 when none is valid or fits; its
  // rank in the full enumeration lies in [rank_also_rank, rank_also_rank_max] (equal: exact),
  // the layouts between never planned because their bounds are below its step but above the
  // table's (LayoutSearchRequest::exact_rank plans them).
  std::vector<int> rank_also_rank;
  std::vector<int> rank_also_rank_max;
  std::vector<LayoutOutcome> rank_also_outcome;
  std::vector<PrunedFamily> pruned;  // invalid, fixed memory, host memory, planned without fit
  int64_t layouts = 0;               // enumerated
  int64_t valid = 0;                 // passing ValidateRun and ValidatePipeline
  int64_t bounded_out = 0;           // valid, never planned: their bound exceeds the top list
  int64_t planned = 0;               // planned with PlanPipeline
  int64_t stage_plans = 0;           // Optimize calls (stages planned)
};

absl::StatusOr<LayoutSearchResult> SearchLayouts(const LayoutSearchRequest& request);

// The step of one planned layout summarised as the search ranks it.
LayoutOutcome SummarizeLayout(const Layout& layout, const PipelineResult& pipeline,
                              uint64_t global_batch, uint64_t seq_len);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_LAYOUT_LAYOUT_SEARCH_H_
