// The pipeline split (Note [Pipeline] in planner/search/pipeline.cc): the checks of a run's
// pipeline settings and the layers of each virtual stage and stage.
#include "planner/cost/pipeline_layout.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stowage::planner {
namespace {

absl::Status Bad(const std::string& flag, const std::string& value, const std::string& rule) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " is ", value, "; ", rule));
}

// Megatron's even split, or a suggestion when it does not divide: the remainder on the last
// stages, which hold the fewest microbatches in 1F1B.
std::string SuggestLayout(int layers, int pp) {
  std::vector<int> counts(pp, layers / pp);
  for (int s = 0; s < layers % pp; ++s) ++counts[pp - 1 - s];
  return absl::StrJoin(counts, ",");
}

}  // namespace

absl::Status ValidatePipeline(const ModelConfig& model, const RunSettings& run) {
  const int n = model.num_layers();
  if (run.pp < 1 || run.pp > kPlanMaxPipelineStages) {
    return Bad("pp", absl::StrCat(run.pp), absl::StrCat("allowed: 1 to ", kPlanMaxPipelineStages));
  }
  if (run.vpp < 1 || run.vpp > kPlanMaxVirtualStages) {
    return Bad("vpp", absl::StrCat(run.vpp), absl::StrCat("allowed: 1 to ", kPlanMaxVirtualStages));
  }
  if (run.microbatches < 1 || run.microbatches > kPlanMaxMicrobatches) {
    return Bad("microbatches", absl::StrCat(run.microbatches),
               absl::StrCat("allowed: 1 to ", kPlanMaxMicrobatches));
  }
  const bool interleaved = run.schedule == PipelineSchedule::kInterleaved;
  if (run.vpp > 1 && !interleaved) {
    return Bad("vpp", absl::StrCat(run.vpp),
               "virtual stages run only under --schedule interleaved");
  }
  if (interleaved && run.vpp < 2) {
    return Bad("schedule", "interleaved", "it needs --vpp 2 or more (model chunks per stage)");
  }
  if (interleaved && run.pp < 2) {
    return Bad("schedule", "interleaved", "it needs --pp 2 or more");
  }
  if (interleaved && run.microbatches < run.pp) {
    return Bad(
        "microbatches", absl::StrCat(run.microbatches),
        absl::StrCat("the interleaved schedule needs at least --pp (", run.pp, ") microbatches"));
  }
  if (interleaved && run.microbatches % run.pp != 0) {
    return Bad("microbatches", absl::StrCat(run.microbatches),
               absl::StrCat("the interleaved schedule runs microbatches in groups of --pp (",
                            run.pp, "): use a multiple of ", run.pp));
  }
  if (run.pp > 1 && run.framework == Framework::kHf) {
    return Bad("pp", absl::StrCat(run.pp),
               "the hf framework profile plans one transformers model per rank; pipeline "
               "stages are planned with --framework megatron");
  }
  const int64_t model_parallel = int64_t{run.tp} * run.cp * run.pp;
  if (run.gpus % model_parallel != 0) {
    return Bad("gpus", absl::StrCat(run.gpus),
               absl::StrCat("it must be a multiple of --tp x --cp x --pp (", model_parallel, ")"));
  }
  if ((run.gpus / run.pp) % run.ep != 0) {
    return Bad("ep", absl::StrCat(run.ep),
               absl::StrCat("it must divide the ", run.gpus / run.pp,
                            " GPUs of one pipeline stage (--gpus / --pp)"));
  }
  // Megatron-Core builds a dense grid (tp-cp-dp-pp or tp-cp-pp-dp) and an expert grid (expert
  // tp-ep-dp-pp or -pp-dp; expert tensor parallelism defaults to --tp, and is 1 in this cost
  // model's MoE layers) and, unless the order ends in pp, asserts that their data-parallel
  // sizes, and so their pipeline groups, agree (parallel_state.py initialize_model_parallel:
  // "When not using pp-last rank ordering, the data parallel size of the attention and moe
  // layers must be the same"): expert tp x ep = tp x cp.
  if (run.pp > 1 && run.rank_order == RankOrder::kTpCpEpPpDp) {
    bool has_moe = false;
    for (const LayerSpec& l : model.layers) has_moe |= l.ffn == FfnKind::kMoe;
    const int64_t expert_tp = has_moe ? 1 : run.tp, tp_cp = int64_t{run.tp} * run.cp;
    if (expert_tp * run.ep != tp_cp) {
      return Bad(
          "rank-order", std::string(RankOrderName(run.rank_order)),
          absl::StrCat("with --pp ", run.pp,
                       " Megatron-Core needs the expert grid's pipeline groups to be the dense "
                       "grid's (parallel_state.py initialize_model_parallel): expert tp x --ep (",
                       expert_tp, " x ", run.ep, ") must equal --tp x --cp (", run.tp, " x ",
                       run.cp, "); allowed: tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp with ",
                       has_moe ? "--ep = --tp x --cp (expert tensor parallelism 1)"
                               : "--cp 1 (expert tensor parallelism is --tp)"));
    }
  }
  const int virtual_stages = run.pp * run.vpp;
  if (!run.pp_layout.empty()) {
    if (run.account_for_embedding_in_pipeline_split || run.account_for_loss_in_pipeline_split) {
      return Bad("pp-layout", absl::StrJoin(run.pp_layout, ","),
                 "it gives every stage's layers; --account-for-embedding-in-pipeline-split and "
                 "--account-for-loss-in-pipeline-split apply to the even split only");
    }
    if (run.pp_layout.size() != static_cast<size_t>(virtual_stages)) {
      return Bad("pp-layout", absl::StrJoin(run.pp_layout, ","),
                 absl::StrCat("it lists ", run.pp_layout.size(), " counts; allowed: one per ",
                              run.vpp > 1 ? "virtual stage (--pp x --vpp = " : "stage (--pp = ",
                              virtual_stages, ")"));
    }
    int64_t sum = 0;
    for (int count : run.pp_layout) {
      if (count < 0) {
        return Bad("pp-layout", absl::StrJoin(run.pp_layout, ","), "layer counts are 0 or more");
      }
      sum += count;
    }
    if (sum != n) {
      return Bad("pp-layout", absl::StrJoin(run.pp_layout, ","),
                 absl::StrCat("it places ", sum, " layers; the model has ", n));
    }
    return absl::OkStatus();
  }
  if (virtual_stages == 1) return absl::OkStatus();
  const int total = n + (run.account_for_embedding_in_pipeline_split ? 1 : 0) +
                    (run.account_for_loss_in_pipeline_split ? 1 : 0);
  if (total % virtual_stages != 0) {
    return Bad(
        "pp", absl::StrCat(run.pp),
        absl::StrCat("the model's ", n, " layers",
                     total != n ? absl::StrCat(" (", total, " with the embedding / loss counted)")
                                : std::string(),
                     " do not divide evenly over ", virtual_stages,
                     run.vpp > 1 ? " virtual stages" : " stages",
                     "; give the layers of each with --pp-layout, e.g. --pp-layout ",
                     SuggestLayout(n, virtual_stages)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LayerRange>> VirtualStageLayers(const ModelConfig& model,
                                                           const RunSettings& run) {
  if (absl::Status s = ValidatePipeline(model, run); !s.ok()) return s;
  const int virtual_stages = run.pp * run.vpp;
  std::vector<int> counts = run.pp_layout;
  if (counts.empty()) {
    const int e = run.account_for_embedding_in_pipeline_split ? 1 : 0;
    const int l = run.account_for_loss_in_pipeline_split ? 1 : 0;
    const int per =
        virtual_stages == 1 ? model.num_layers() : (model.num_layers() + e + l) / virtual_stages;
    counts.assign(virtual_stages, per);
    if (virtual_stages > 1) {
      counts.front() -= e;
      counts.back() -= l;
    }
  }
  // Note [MTP layers] (planner/frameworks/megatron.cc): the MTP depths run after the decoder
  // layers, in the last virtual stage (Megatron-Core mtp_on_this_rank without a custom layout),
  // beyond the split.
  counts.back() = std::max(0, counts.back()) + TrainedMtpLayers(model, run);
  std::vector<LayerRange> out;
  int first = 0;
  for (int count : counts) {
    out.push_back({first, std::max(0, count)});
    first += std::max(0, count);
  }
  return out;
}

std::vector<LayerRange> StageChunks(const std::vector<LayerRange>& virtual_stages, int pp, int vpp,
                                    int stage) {
  std::vector<LayerRange> chunks;
  for (int c = 0; c < vpp; ++c) {
    const size_t v = static_cast<size_t>(c) * pp + stage;
    if (v < virtual_stages.size()) chunks.push_back(virtual_stages[v]);
  }
  return chunks;
}

}  // namespace stowage::planner
