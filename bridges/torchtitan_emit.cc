// A plan as torchtitan job config sections (`stowage plan --emit torchtitan`;
// Note [torchtitan expressiveness] and Note [torchtitan under pipeline parallelism] in
// bridges/torchtitan_emit.h).
#include "bridges/torchtitan_emit.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bridges/emit_layers.h"
#include "planner/cost/run_settings.h"

namespace stowage::bridges {

using planner::OptimizerKind;
using planner::OptimizerKindName;
using planner::RunSettings;
using planner::Sharding;
using planner::ShardingName;

absl::StatusOr<TorchtitanJobToml> EmitTorchtitanJob(const Plan& plan, const RunSettings& run) {
  TorchtitanJobToml out;
  // torchtitan's device mesh is always pp, dp_replicate, dp_shard, cp, tp outermost first
  // (ParallelDims build_mesh): PP outermost, the links --rank-order tp-cp-ep-dp-pp plans.
  if (plan.pp > 1 && run.rank_order != RankOrder::kTpCpEpDpPp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rank-order is ", std::string(RankOrderName(run.rank_order)),
        "; torchtitan's device mesh puts the pipeline outermost (ParallelDims: pp, dp_replicate, "
        "dp_shard, cp, tp), which only --rank-order tp-cp-ep-dp-pp plans; plan with that order "
        "or emit megatron (--use-tp-pp-dp-mapping)"));
  }
  auto set = [&](const char* section, const char* key, std::string value) {
    out.entries.push_back({section, key, std::move(value)});
  };
  auto quoted = [](std::string_view s) { return absl::StrCat("\"", std::string(s), "\""); };

  // Data parallel: the GPUs left over by TP x CP x PP.
  const int64_t model_parallel = int64_t{plan.tp} * plan.cp * plan.pp;
  const int64_t dp =
      run.gpus > 0 && run.gpus % model_parallel == 0 ? run.gpus / model_parallel : -1;
  const std::string dp_text = absl::StrCat(dp);
  if (run.sharding == Sharding::kNoShard) {
    set("parallelism", "data_parallel_replicate_degree", dp_text);
    set("parallelism", "data_parallel_shard_degree", "1");
    if (plan.cp > 1) {
      out.notes.push_back(absl::StrCat(
          "--sharding no_shard: torchtitan applies FSDP over the CP ranks whenever CP > 1 "
          "(ParallelDims: the fsdp mesh is dp_shard x cp), so parameters, gradients and "
          "optimizer state are sharded over ",
          plan.cp, " ranks: less fixed memory than planned"));
    }
  } else {
    set("parallelism", "data_parallel_replicate_degree", "1");
    set("parallelism", "data_parallel_shard_degree", dp_text);  // -1: the rest of the GPUs
    if (run.sharding != Sharding::kOptimGradsParams) {
      out.notes.push_back(absl::StrCat(
          "--sharding ", ShardingName(run.sharding),
          ": torchtitan shards with FSDP2, which shards the parameters too (it has no "
          "optimizer-only or gradient-only sharding): less fixed memory than planned, and "
          "parameter all-gathers the plan did not count"));
    }
  }
  // The planner's TP is with sequence parallelism, as torchtitan's TP plans are (unless
  // --no-sequence-parallel); its experts are not tensor-parallel (the routed tokens are split
  // over TP instead).
  if (plan.tp > 1 && !plan.sequence_parallel) {
    out.notes.push_back(
        "the plan is TP without sequence parallelism (--no-sequence-parallel); torchtitan's TP "
        "plans always split the norms' tokens over TP (SequenceParallel): less activation memory "
        "than planned, and all-gathers / reduce-scatters instead of the planned all-reduces");
  }
  set("parallelism", "tensor_parallel_degree", absl::StrCat(plan.tp));
  set("parallelism", "context_parallel_degree", absl::StrCat(plan.cp));
  set("parallelism", "pipeline_parallel_degree", absl::StrCat(plan.pp));
  set("parallelism", "expert_parallel_degree", absl::StrCat(plan.ep));
  if (plan.ep > 1) set("parallelism", "expert_tensor_parallel_degree", "1");
  // Note [torchtitan under pipeline parallelism]: the schedule, the microbatch and every model
  // part's modules (the plan's split, whatever rule made it).
  const int n = static_cast<int>(plan.layers.size()) - std::max(0, plan.mtp_layers);
  const bool pipelined = plan.pp > 1;
  const std::vector<ChunkLayers> chunks = DecoderChunks(plan, n);
  if (pipelined) {
    set("parallelism", "pipeline_parallel_schedule",
        quoted(plan.schedule == PipelineSchedule::kInterleaved ? "Interleaved1F1B" : "1F1B"));
    set("parallelism", "pipeline_parallel_microbatch_size", absl::StrCat(plan.micro_batch));
    std::vector<std::string> parts;
    for (size_t v = 0; v < chunks.size(); ++v) {
      std::vector<std::string> names;
      if (v == 0) names.push_back(quoted("tok_embeddings"));
      for (int i = chunks[v].layers.first_layer; i < chunks[v].layers.end(); ++i) {
        names.push_back(quoted(absl::StrCat("layers.", i)));
      }
      if (v + 1 == chunks.size()) {
        names.push_back(quoted("norm"));
        names.push_back(quoted("output"));
      }
      parts.push_back(absl::StrCat("[", absl::StrJoin(names, ", "), "]"));
    }
    set("parallelism", "module_fqns_per_model_part",
        absl::StrCat("[", absl::StrJoin(parts, ", "), "]"));
  }
  set("training", "seq_len", absl::StrCat(plan.seq_len));
  // Under PP the local batch is split into the microbatches (build_pipeline_schedule); without
  // it they are gradient accumulation steps over global_batch_size (train.py).
  set("training", "local_batch_size",
      absl::StrCat(int64_t{plan.micro_batch} * (pipelined ? plan.microbatches : 1)));
  if (!pipelined && plan.microbatches > 1) {
    if (dp > 0) {
      set("training", "global_batch_size",
          absl::StrCat(int64_t{plan.micro_batch} * plan.microbatches * dp));
    } else {
      out.notes.push_back(absl::StrCat(
          "the plan accumulates ", plan.microbatches,
          " microbatches per step; set training.global_batch_size to local_batch_size x data "
          "parallel x ",
          plan.microbatches, " (--gpus ", run.gpus, " does not divide by TP x CP x PP)"));
    }
  }
  if (run.optimizer_offload) {
    set("training", "enable_cpu_offload", "true");
    out.notes.push_back(
        "--optimizer-offload: torchtitan's enable_cpu_offload (FSDP2's CPUOffloadPolicy) keeps "
        "parameters and gradients in host memory too and copies them every step");
  }
  switch (run.optimizer) {
    case OptimizerKind::kAdam:
      set("optimizer", "name", quoted("AdamW"));  // Adam's state, torchtitan's default name
      break;
    case OptimizerKind::kSgd:
    case OptimizerKind::kNone:
      out.notes.push_back(absl::StrCat("--optimizer ", OptimizerKindName(run.optimizer),
                                       ": torchtitan builds only Adam and AdamW "
                                       "(components/optimizer.py), which hold more state"));
      break;
  }

  // Note [torchtitan expressiveness]: the layers torchtitan checkpoints, and what it cannot do.
  // Its models build no multi-token-prediction module (Note [MTP layers] in stowage/plan.h).
  if (plan.mtp_layers > 0) {
    out.notes.push_back(absl::StrCat("the plan trains ", plan.mtp_layers,
                                     " MTP layer(s); torchtitan's models have no MTP module "
                                     "(plan with --mtp-layers 0 for a torchtitan run)"));
  }
  std::vector<int> recomputed, offload_input, offload_saved, selective;
  std::set<std::string> modules;
  for (const LayerPlan& l : plan.layers) {
    if (l.index >= n) continue;
    switch (l.policy) {
      case LayerPolicy::kKeep:
        break;
      case LayerPolicy::kRecompute:
        recomputed.push_back(l.index);
        break;
      case LayerPolicy::kSelectiveRecompute:
        // torchtitan cannot recompute chosen modules: the whole block, which holds less.
        recomputed.push_back(l.index);
        selective.push_back(l.index);
        modules.insert(l.recompute_modules.begin(), l.recompute_modules.end());
        break;
      case LayerPolicy::kOffloadInput:
        recomputed.push_back(l.index);  // its recompute; the input stays on the GPU
        offload_input.push_back(l.index);
        break;
      case LayerPolicy::kOffloadSaved:
        offload_saved.push_back(l.index);  // kept on the GPU: the nearest without offload
        break;
    }
  }
  std::vector<int> checkpointed;  // what the emitted config checkpoints
  if (pipelined && !recomputed.empty() && static_cast<int>(recomputed.size()) < n) {
    // Note [torchtitan under pipeline parallelism]: every N-th of each rank's own blocks.
    const std::set<int> recomputes(recomputed.begin(), recomputed.end());
    std::vector<std::vector<const ChunkLayers*>> stage_chunks(plan.pp);
    for (const ChunkLayers& c : chunks) stage_chunks[c.stage].push_back(&c);
    int every = 0, first_stage = 0;
    for (int s = 0; s < plan.pp && every == 0; ++s) {
      int block = 0;
      for (const ChunkLayers* c : stage_chunks[s]) {
        for (int i = c->layers.first_layer; i < c->layers.end() && every == 0; ++i) {
          ++block;
          if (recomputes.count(i) > 0) every = block, first_stage = s;
        }
      }
    }
    for (int s = 0; s < plan.pp; ++s) {
      int block = 0;
      for (const ChunkLayers* c : stage_chunks[s]) {
        for (int i = c->layers.first_layer; i < c->layers.end(); ++i) {
          ++block;
          const bool wanted = block % every == 0;
          if (wanted == (recomputes.count(i) > 0)) continue;
          return absl::InvalidArgumentError(absl::StrCat(
              "--emit torchtitan cannot express this pipelined plan: ", StageLayer(plan, *c, i),
              ", its rank's block ", block, ", is ", wanted ? "not recomputed" : "recomputed",
              ", where selective_ac_option \"", every, "\" (stage ", first_stage,
              " recomputes its block ", every, " first) ",
              wanted ? "checkpoints" : "does not checkpoint",
              " it. torchtitan checkpoints every block (mode \"full\"), none, or every N-th "
              "block of each pipeline rank, counted over that rank's model parts in order "
              "(distributed/activation_checkpoint.py _apply_layer_sac, a process-wide count; "
              "distributed/pipeline_parallel.py pipeline_llm applies parallelize_fn to each "
              "part). Run this plan under the stowage runtime (its C ABI or Python layer "
              "carries per-layer choices; write the plan with --out)"));
        }
      }
    }
    set("activation_checkpoint", "mode", quoted("selective"));
    set("activation_checkpoint", "selective_ac_option", quoted(absl::StrCat(every)));
  } else if (recomputed.empty()) {
    set("activation_checkpoint", "mode", quoted("none"));
  } else if (static_cast<int>(recomputed.size()) == n) {
    set("activation_checkpoint", "mode", quoted("full"));
    checkpointed = recomputed;
  } else {
    // Every N-th block (1-based) covers the recomputed layers exactly when N divides each
    // index + 1: the largest such N is their gcd.
    int every = 0;
    for (int i : recomputed) every = std::gcd(every, i + 1);
    if (every >= 2) {
      set("activation_checkpoint", "mode", quoted("selective"));
      set("activation_checkpoint", "selective_ac_option", quoted(absl::StrCat(every)));
      for (int i = every - 1; i < n; i += every) checkpointed.push_back(i);
    } else {
      set("activation_checkpoint", "mode", quoted("full"));
      for (int i = 0; i < n; ++i) checkpointed.push_back(i);
    }
    std::vector<int> extra;
    std::set_difference(checkpointed.begin(), checkpointed.end(), recomputed.begin(),
                        recomputed.end(), std::back_inserter(extra));
    if (!extra.empty()) {
      out.notes.push_back(
          absl::StrCat("the plan recomputes ", LayerList(recomputed), "; torchtitan checkpoints ",
                       every >= 2 ? absl::StrCat("the blocks whose position is a multiple of ",
                                                 every, " (selective_ac_option)")
                                  : std::string("every block (no every-N option covers them)"),
                       ", so ", LayerList(extra), Verb(extra, " is", " are"),
                       " recomputed too: slower than planned, less memory"));
    }
  }
  if (!selective.empty()) {
    out.notes.push_back(absl::StrCat(
        LayerList(selective), Verb(selective, " recomputes only ", " recompute only "),
        absl::StrJoin(std::vector<std::string>(modules.begin(), modules.end()), ", "),
        " (selective_recompute); torchtitan cannot recompute chosen modules, so they are "
        "checkpointed in full (its selective_ac_option \"op\" policy, which saves matmul and "
        "attention outputs, is the other choice, with memory the plan does not predict)"));
  }
  if (!offload_input.empty()) {
    out.notes.push_back(absl::StrCat(
        LayerList(offload_input),
        Verb(offload_input, " offloads its input to host memory and recomputes",
             " offload their input to host memory and recompute"),
        " the rest (offload_input); torchtitan has no activation offload, so ",
        Verb(offload_input, "it is", "they are"),
        " checkpointed with the input kept on the GPU: its peak is higher than the plan's by ",
        Verb(offload_input, "that input (run it", "those inputs (run them"),
        " under the stowage runtime)"));
  }
  if (!offload_saved.empty()) {
    out.notes.push_back(absl::StrCat(
        LayerList(offload_saved), Verb(offload_saved, " offloads its", " offload their"),
        " saved activations (offload_saved); torchtitan has no activation offload, so ",
        Verb(offload_saved,
             "they stay on the GPU: its peak is higher than the plan's by those "
             "bytes (run it",
             "they stay on the GPU: its peak is higher than the plan's by those bytes (run them"),
        " under the stowage runtime)"));
  }
  out.notes.push_back(absl::StrCat(
      "the plan's per-layer bytes are the ", plan.framework,
      " framework's recipe (--framework); torchtitan runs its own model code, so measure its "
      "layers (python -m stowage.measure.profile) and plan with --profile for its exact figures"));
  return out;
}

std::string RenderTorchtitanJob(const Plan& plan, const TorchtitanJobToml& job) {
  std::string out = absl::StrCat(
      "# torchtitan job config (0.2.2 names) for the stowage plan of ", plan.model, " (",
      plan.seq_len, " tokens): the nearest torchtitan can run; merge into your job's .toml\n");
  if (!plan.fits) {
    absl::StrAppend(&out, "# does not fit: ", plan.binding.what, " (", plan.binding.explanation,
                    "); this config runs the closest plan, which does not fit either\n");
  }
  std::string section;
  for (const TomlEntry& e : job.entries) {
    if (e.section != section) {
      absl::StrAppend(&out, section.empty() ? "" : "\n", "[", e.section, "]\n");
      section = e.section;
    }
    absl::StrAppend(&out, e.key, " = ", e.value, "\n");
  }
  if (!job.notes.empty()) absl::StrAppend(&out, "\n");
  for (const std::string& note : job.notes) {
    absl::StrAppend(&out, "# not expressed: ", note, "\n");
  }
  return out;
}

}  // namespace stowage::bridges
