#include "planner/layout/layout_search.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "planner/cost/pipeline_layout.h"
#include "planner/layout/layout_bounds.h"

namespace stowage::planner {

// Note [Layout search]
// What `stowage search` enumerates, and how it avoids planning most of it.
//  - The layouts. For each GPU count: TP, CP and PP each a divisor of what the others leave
//    (Megatron-Core's grid is tp x cp x dp x pp), EP a divisor of one stage's GPUs (1 for a
//    dense model), VPP 1 to max_vpp with pp x vpp virtual stages of at least one layer each
//    (interleaved schedule when vpp > 1, 1F1B otherwise), micro-batch 1 to max_micro_batch,
//    both rank orders when pp > 1 and each data-parallel sharding asked for (`stowage search`
//    asks for all four under --framework hf: torch's DDP, ZeRO, FSDP2 with and without
//    resharding, unless --sharding names one); the microbatches per step follow from the global
//    batch (global / (micro-batch x dp), a whole number). Where the layers do not divide evenly
//    over the virtual stages the layout carries a derived --pp-layout
//    (Note [Derived pipeline layout]).
//  - Which are valid is the single-plan path's own rule: ValidateRun and ValidatePipeline, the
//    checks `stowage plan` runs (planner/cost/run_settings.h, pipeline_layout.h). The search adds
//    only what it chooses not to try: TP beyond one NVLink domain (tensor parallelism's
//    per-layer collectives across the network; allowed with allow_tp_outside_nvlink), and CP that
//    does not split each sequence into 2 x cp equal chunks (Megatron-Core's load-balanced
//    "zigzag" context parallelism gives rank r chunks r and 2cp - 1 - r:
//    Megatron-LM megatron/training/utils.py get_batch_on_this_cp_rank).
//  - Bounds first (Note [Layout bounds] in layout_bounds.cc): every valid layout gets its
//    fixed-memory check and its compute-only step-time bound from the step costs of a few of
//    its stages. Those that fail the first are pruned with the reason; the rest are planned
//    with PlanPipeline (every stage optimised, exactly as `stowage plan` does) in the order of
//    their bounds, until the next bound exceeds the top-th fastest step found (and the step of
//    each layout asked to be ranked): no layout left can then enter the table, so the table is
//    the exact top of the full enumeration.

namespace {

std::vector<int> Divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

bool HasMoe(const ModelConfig& model) {
  for (const LayerSpec& l : model.layers) {
    if (l.ffn == FfnKind::kMoe) return true;
  }
  return false;
}

std::string FamilyName(const Layout& l) {
  return absl::StrCat(l.gpus, " GPUs TP ", l.tp, " CP ", l.cp, " EP ", l.ep, " PP ", l.pp);
}

struct Candidate {
  Layout layout;
  int64_t index = 0;  // enumeration order: the tie-break
  double bound = 0;
};

struct Pruning {
  std::map<std::string, size_t> where;  // family and kind -> index in families
  std::vector<PrunedFamily> families;
  void Add(const std::string& kind, const std::string& reason, const Layout& layout) {
    // Divisibility errors name their flag first ("--ep is 16; ..."): one line per flag; a
    // search rule one per rule and size; the memory kinds one per family.
    const std::string key = kind == "divisibility"  ? reason.substr(0, reason.find(' '))
                            : kind == "search rule" ? reason
                                                    : absl::StrCat(FamilyName(layout), "|", kind);
    auto [it, inserted] = where.emplace(absl::StrCat(kind, "|", key), families.size());
    if (inserted) families.push_back({kind, reason, 0, LayoutName(layout)});
    ++families[it->second].layouts;
  }
};

}  // namespace

// Note [Derived pipeline layout]
// Megatron-Core splits layers evenly over the virtual stages or takes a --pipeline-model-parallel-
// layout; where the layers do not divide, the search derives one the way the published
// DeepSeek-V3 job's was made: every virtual stage gets ceil(layers / stages), and the layers
// over are taken one at a time from the last and the first virtual stage in turn (they also run
// the LM head, loss and MTP layers, and the embedding), each down to half its share, then from
// the stages before the last, back to front. 61 layers over 16 stages: 3, 4 x 14, 2.
std::vector<int> DerivedPpLayout(int layers, int virtual_stages) {
  if (virtual_stages <= 1 || layers % virtual_stages == 0) return {};
  const int share = (layers + virtual_stages - 1) / virtual_stages;
  std::vector<int> counts(virtual_stages, share);
  int over = share * virtual_stages - layers;
  const int floor = std::max(1, share / 2);
  for (int turn = 0; over > 0 && turn < 2 * share; ++turn) {
    int& end = counts[turn % 2 == 0 ? virtual_stages - 1 : 0];
    if (end > floor) {
      --end;
      --over;
    }
  }
  for (int s = virtual_stages - 2; over > 0; s = s > 1 ? s - 1 : virtual_stages - 2) {
    if (counts[s] > 1) {
      --counts[s];
      --over;
    }
  }
  return counts;
}

std::string LayoutName(const Layout& l) {
  std::string name = absl::StrCat("TP ", l.tp, " CP ", l.cp, " EP ", l.ep, " PP ", l.pp);
  if (l.vpp > 1) absl::StrAppend(&name, " VPP ", l.vpp);
  absl::StrAppend(&name, " MB ", l.micro_batch);
  if (l.pp > 1 && l.rank_order == RankOrder::kTpCpEpPpDp) absl::StrAppend(&name, " pp-dp");
  if (l.sharding.has_value()) absl::StrAppend(&name, " ", ShardingName(*l.sharding));
  return name;
}

std::string LayoutFlags(const Layout& l, uint64_t global_batch) {
  std::string flags =
      absl::StrCat("--gpus ", l.gpus, " --tp ", l.tp, " --cp ", l.cp, " --ep ", l.ep, " --pp ",
                   l.pp, " --micro-batch ", l.micro_batch, " --global-batch ", global_batch);
  if (l.vpp > 1) absl::StrAppend(&flags, " --vpp ", l.vpp, " --schedule interleaved");
  if (l.pp > 1 && l.rank_order != RankOrder::kTpCpEpDpPp) {
    absl::StrAppend(&flags, " --rank-order ", std::string(RankOrderName(l.rank_order)));
  }
  if (l.sharding.has_value()) absl::StrAppend(&flags, " --sharding ", ShardingName(*l.sharding));
  if (!l.pp_layout.empty())
    absl::StrAppend(&flags, " --pp-layout ", absl::StrJoin(l.pp_layout, ","));
  return flags;
}

RunSettings ApplyLayout(RunSettings r, const Layout& l) {
  r.gpus = l.gpus;
  r.tp = l.tp;
  r.cp = l.cp;
  r.ep = l.ep;
  r.pp = l.pp;
  r.vpp = l.vpp;
  r.micro_batch = l.micro_batch;
  r.microbatches = l.microbatches;
  r.schedule = l.schedule;
  r.rank_order = l.rank_order;
  r.pp_layout = l.pp_layout;
  if (l.sharding.has_value()) r.sharding = *l.sharding;
  r.account_for_embedding_in_pipeline_split = false;
  r.account_for_loss_in_pipeline_split = false;
  return r;
}

bool LayoutPattern::Matches(const Layout& l) const {
  auto ok = [](int want, int have) { return want == 0 || want == have; };
  return ok(gpus, l.gpus) && ok(tp, l.tp) && ok(cp, l.cp) && ok(ep, l.ep) && ok(pp, l.pp) &&
         ok(vpp, l.vpp) && ok(micro_batch, l.micro_batch);
}

absl::StatusOr<LayoutPattern> ParseLayoutPattern(const std::string& text) {
  LayoutPattern p;
  p.text = text;
  const std::string allowed =
      "allowed: key=value pairs separated by commas, keys gpus, tp, cp, ep, pp, vpp, mb (e.g. "
      "tp=8,cp=16,pp=16)";
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    int value = 0;
    if (!absl::SimpleAtoi(kv.second, &value) || value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rank is '", text, "': '", part, "' has no positive size; ", allowed));
    }
    int* field = kv.first == "gpus"  ? &p.gpus
                 : kv.first == "tp"  ? &p.tp
                 : kv.first == "cp"  ? &p.cp
                 : kv.first == "ep"  ? &p.ep
                 : kv.first == "pp"  ? &p.pp
                 : kv.first == "vpp" ? &p.vpp
                 : kv.first == "mb"  ? &p.micro_batch
                                     : nullptr;
    if (field == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rank is '", text, "': unknown key '", kv.first, "'; ", allowed));
    }
    *field = value;
  }
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat("--rank is empty; ", allowed));
  return p;
}

LayoutOutcome SummarizeLayout(const Layout& layout, const PipelineResult& pipeline,
                              uint64_t global_batch, uint64_t seq_len) {
  LayoutOutcome o;
  o.layout = layout;
  o.planned = true;
  o.feasible = pipeline.feasible;
  o.step_seconds = pipeline.step_seconds;
  o.tokens_per_second =
      pipeline.step_seconds > 0
          ? static_cast<double>(global_batch) * static_cast<double>(seq_len) / pipeline.step_seconds
          : 0;
  for (const StageResult& s : pipeline.stages) {
    const bool fits = s.result.feasible;
    o.peak_bytes = std::max(o.peak_bytes, fits ? s.result.sim.peak_bytes : s.result.min_peak_bytes);
    o.host_bytes = std::max(o.host_bytes, s.result.sim.host_bytes);
  }
  if (!pipeline.feasible) {
    o.binding = pipeline.stages[pipeline.binding_stage].result.binding;
    return o;
  }
  const StageResult& slow = pipeline.stages[pipeline.slowest_stage];
  const double m = layout.microbatches;
  double recompute = 0;
  for (size_t i = 0; i < slow.step.layers.size() && i < slow.result.schedule.options.size(); ++i) {
    recompute +=
        EvaluateOption(slow.step.layers[i], slow.result.schedule.options[i]).recompute_seconds;
  }
  o.memory_seconds = m * (recompute + slow.result.sim.exposed_copy_seconds);
  o.comm_seconds = m * std::max(0.0, slow.result.sim.exposed_comm_seconds -
                                         slow.step.comm.gradient_sync_exposed_seconds) +
                   m * pipeline.p2p_seconds + pipeline.once_seconds;
  o.bubble_seconds = pipeline.bubble_seconds;
  o.compute_seconds =
      std::max(0.0, o.step_seconds - o.memory_seconds - o.comm_seconds - o.bubble_seconds);
  const std::pair<double, const char*> terms[] = {{o.compute_seconds, "compute"},
                                                  {o.memory_seconds, "memory"},
                                                  {o.comm_seconds, "comm"},
                                                  {o.bubble_seconds, "bubble"}};
  const auto* largest = std::max_element(std::begin(terms), std::end(terms));
  o.binding = absl::StrCat(largest->second, " ",
                           static_cast<int>(100 * largest->first / o.step_seconds + 0.5), "%");
  return o;
}

absl::StatusOr<LayoutSearchResult> SearchLayouts(const LayoutSearchRequest& q) {
  if (q.gpu_counts.empty()) return absl::InvalidArgumentError("--gpus names no GPU count");
  if (q.global_batch == 0) return absl::InvalidArgumentError("--global-batch is 0");
  LayoutSearchResult out;
  Pruning pruning;
  const int layers = q.model.num_layers();
  const bool moe = HasMoe(q.model);
  const uint64_t seq = q.base.seq_len;
  std::vector<Candidate> candidates;
  // Each rank order with each data-parallel sharding searched (none: the base run's).
  std::vector<std::pair<RankOrder, std::optional<Sharding>>> orders_and_shardings;
  for (RankOrder order : {RankOrder::kTpCpEpDpPp, RankOrder::kTpCpEpPpDp}) {
    if (q.shardings.empty()) orders_and_shardings.emplace_back(order, std::nullopt);
    for (Sharding sharding : q.shardings) orders_and_shardings.emplace_back(order, sharding);
  }
  for (int gpus : q.gpu_counts) {
    for (int tp : Divisors(gpus)) {
      Layout family;
      family.gpus = gpus;
      family.tp = tp;
      if (tp > q.hardware.nvlink_domain_gpus && !q.allow_tp_outside_nvlink) {
        pruning.Add(
            "search rule",
            absl::StrCat("TP ", tp, " crosses the NVLink domain (", q.hardware.nvlink_domain_gpus,
                         " GPUs; --allow-tp-outside-nvlink tries it)"),
            family);
        continue;
      }
      for (int cp : Divisors(gpus / tp)) {
        family.cp = cp;
        family.pp = 1;
        family.ep = 1;
        if (cp > 1 && seq % (2 * static_cast<uint64_t>(cp)) != 0) {
          pruning.Add("search rule",
                      absl::StrCat("CP ", cp, ": ", seq,
                                   " tokens do not split into 2 x CP equal "
                                   "chunks (load-balanced context parallelism)"),
                      family);
          continue;
        }
        for (int pp : Divisors(gpus / (tp * cp))) {
          if (pp > layers || pp > kPlanMaxPipelineStages) break;
          family.pp = pp;
          const int dp = gpus / (tp * cp * pp);
          for (int ep : moe ? Divisors(gpus / pp) : std::vector<int>{1}) {
            family.ep = ep;
            for (int vpp = 1; vpp <= (pp > 1 ? q.max_vpp : 1) && pp * vpp <= layers; ++vpp) {
              for (int mb = 1; mb <= q.max_micro_batch; ++mb) {
                for (const auto& [order, sharding] : orders_and_shardings) {
                  if (pp == 1 && order != RankOrder::kTpCpEpDpPp) continue;
                  Layout l = family;
                  l.vpp = vpp;
                  l.micro_batch = mb;
                  l.rank_order = order;
                  l.sharding = sharding;
                  l.schedule = vpp > 1 ? PipelineSchedule::kInterleaved : PipelineSchedule::k1F1B;
                  l.pp_layout = DerivedPpLayout(layers, pp * vpp);
                  ++out.layouts;
                  const uint64_t per_step = static_cast<uint64_t>(dp) * mb;
                  if (q.global_batch % per_step != 0) {
                    pruning.Add("divisibility",
                                absl::StrCat("global batch ", q.global_batch,
                                             " is not a multiple of micro-batch ", mb,
                                             " x data parallel ", dp),
                                l);
                    continue;
                  }
                  const uint64_t m = q.global_batch / per_step;
                  if (m > static_cast<uint64_t>(kPlanMaxMicrobatches)) {
                    pruning.Add("divisibility",
                                absl::StrCat("over ", kPlanMaxMicrobatches,
                                             " microbatches per step (global batch / (micro-batch "
                                             "x data parallel))"),
                                l);
                    continue;
                  }
                  l.microbatches = static_cast<int>(m);
                  const RunSettings run = ApplyLayout(q.base, l);
                  absl::Status valid = ValidateRun(q.model, run);
                  if (valid.ok()) valid = ValidatePipeline(q.model, run);
                  if (!valid.ok()) {
                    pruning.Add("divisibility", std::string(valid.message()), l);
                    continue;
                  }
                  ++out.valid;
                  candidates.push_back({std::move(l), out.layouts, 0});
                }
              }
            }
          }
        }
      }
    }
  }

  // Bounds first: fixed memory prunes, the step-time bound orders.
  std::vector<Candidate> open;
  for (Candidate& c : candidates) {
    absl::StatusOr<LayoutBound> bound =
        BoundLayout(q.model, q.hardware, ApplyLayout(q.base, c.layout), q.options);
    if (!bound.ok()) {
      pruning.Add("divisibility", std::string(bound.status().message()), c.layout);
      continue;
    }
    c.bound = bound->step_seconds;
    if (!bound->unfit.empty() && !q.exhaustive) {
      pruning.Add(bound->host ? "host memory" : "fixed memory", bound->unfit, c.layout);
      continue;
    }
    open.push_back(std::move(c));
  }
  std::stable_sort(open.begin(), open.end(), [](const Candidate& a, const Candidate& b) {
    return a.bound < b.bound || (a.bound == b.bound && a.index < b.index);
  });

  // Plan in bound order until nothing left can enter the table.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::pair<LayoutOutcome, int64_t>> fitting;  // with its enumeration index
  std::vector<double> steps;                               // fitting steps, kept sorted
  std::vector<char> planned(open.size(), 0);
  auto plan = [&](size_t i) -> const LayoutOutcome* {
    const Candidate& c = open[i];
    planned[i] = 1;
    absl::StatusOr<PipelineResult> pipeline =
        PlanPipeline(q.model, q.hardware, ApplyLayout(q.base, c.layout), q.options);
    if (!pipeline.ok()) {
      pruning.Add("divisibility", std::string(pipeline.status().message()), c.layout);
      return nullptr;
    }
    ++out.planned;
    out.stage_plans += static_cast<int64_t>(pipeline->stages.size());
    LayoutOutcome o = SummarizeLayout(c.layout, *pipeline, q.global_batch, q.base.seq_len);
    o.bound_seconds = c.bound;
    if (!o.feasible) {
      pruning.Add("does not fit", absl::StrCat("planned, does not fit: ", o.binding), c.layout);
      return nullptr;
    }
    steps.insert(std::upper_bound(steps.begin(), steps.end(), o.step_seconds), o.step_seconds);
    fitting.emplace_back(std::move(o), c.index);
    return &fitting.back().first;
  };
  const size_t top = static_cast<size_t>(std::max(1, q.top));
  for (size_t i = 0; i < open.size(); ++i) {
    if (!q.exhaustive && steps.size() >= top && open[i].bound > steps[top - 1]) break;
    plan(i);
  }
  // Each pattern's best match: its layouts in bound order until the next bound exceeds the
  // fastest found. Then, with exact_rank, every layout that might beat it.
  const size_t patterns = q.rank_also.size();
  std::vector<double> pattern_best(patterns, kInf);
  for (size_t k = 0; k < patterns; ++k) {
    for (const auto& [o, index] : fitting) {
      if (q.rank_also[k].Matches(o.layout))
        pattern_best[k] = std::min(pattern_best[k], o.step_seconds);
    }
    for (size_t i = 0; i < open.size(); ++i) {
      if (planned[i] || !q.rank_also[k].Matches(open[i].layout)) continue;
      if (open[i].bound > pattern_best[k]) break;
      if (const LayoutOutcome* o = plan(i); o != nullptr) {
        pattern_best[k] = std::min(pattern_best[k], o->step_seconds);
      }
    }
  }
  double rank_reach = 0;  // the slowest pattern's best step
  for (double best : pattern_best) {
    if (best < kInf) rank_reach = std::max(rank_reach, best);
  }
  if (q.exact_rank) {
    for (size_t i = 0; i < open.size() && open[i].bound <= rank_reach; ++i) {
      if (!planned[i]) plan(i);
    }
  }
  for (char p : planned) out.bounded_out += p ? 0 : 1;
  std::stable_sort(fitting.begin(), fitting.end(), [](const auto& a, const auto& b) {
    return a.first.step_seconds < b.first.step_seconds ||
           (a.first.step_seconds == b.first.step_seconds && a.second < b.second);
  });
  for (auto& [o, index] : fitting) out.ranked.push_back(std::move(o));
  out.top = std::min(static_cast<int>(out.ranked.size()), std::max(1, q.top));
  for (size_t k = 0; k < patterns; ++k) {
    int rank = 0;
    LayoutOutcome best;
    for (size_t i = 0; i < out.ranked.size(); ++i) {
      if (q.rank_also[k].Matches(out.ranked[i].layout)) {
        rank = static_cast<int>(i) + 1;
        best = out.ranked[i];
        break;
      }
    }
    // Layouts never planned whose bound is below its step might still rank above it.
    int unsure = 0;
    for (size_t i = 0; i < open.size() && rank > 0; ++i) {
      if (!planned[i] && open[i].bound < best.step_seconds) ++unsure;
    }
    out.rank_also_rank.push_back(rank);
    out.rank_also_rank_max.push_back(rank + unsure);
    out.rank_also_outcome.push_back(std::move(best));
  }
  out.pruned = std::move(pruning.families);
  return out;
}

}  // namespace stowage::planner
