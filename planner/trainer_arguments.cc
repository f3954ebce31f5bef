#include "planner/trainer_arguments.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stowage::planner {
namespace {

// "layers 3-7 and 12" for {3,4,5,6,7,12}.
std::string LayerList(const std::vector<int>& layers) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    runs.push_back(j == i ? absl::StrCat(layers[i]) : absl::StrCat(layers[i], "-", layers[j]));
    i = j + 1;
  }
  if (runs.size() == 1) return absl::StrCat(layers.size() == 1 ? "layer " : "layers ", runs[0]);
  const std::string last = runs.back();
  runs.pop_back();
  return absl::StrCat("layers ", absl::StrJoin(runs, ", "), " and ", last);
}

// The verb for LayerList(layers): `one` for a single layer, `many` otherwise.
const char* Verb(const std::vector<int>& layers, const char* one, const char* many) {
  return layers.size() == 1 ? one : many;
}

bool IsPrefix(const std::vector<int>& layers) {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] != static_cast<int>(i)) return false;
  }
  return true;
}

// The planner's selective-recompute module names (planner/cost_model.cc) in Megatron's words
// (TransformerConfig.recompute_modules). The others have no Megatron counterpart.
const std::map<std::string, std::string>& MegatronModuleNames() {
  static const auto* names = new std::map<std::string, std::string>{
      {"attn_core", "core_attn"}, {"mla_up_proj", "mla_up_proj"}, {"moe_act", "moe_act"}};
  return *names;
}

}  // namespace

TrainerArguments MegatronArguments(const Plan& plan) {
  TrainerArguments out;
  auto add = [&](std::string flag, std::string value = "") {
    out.args.push_back(std::move(flag));
    if (!value.empty()) out.args.push_back(std::move(value));
  };
  add("--tensor-model-parallel-size", absl::StrCat(plan.tp));
  // The planner's TP is Megatron's with sequence parallelism (norms and dropout split too).
  if (plan.tp > 1) add("--sequence-parallel");
  add("--context-parallel-size", absl::StrCat(plan.cp));
  if (plan.ep > 1) add("--expert-model-parallel-size", absl::StrCat(plan.ep));
  add("--seq-length", absl::StrCat(plan.seq_len));
  add("--micro-batch-size", absl::StrCat(plan.micro_batch));
  // Note [MTP layers] (stowage/plan.h): the MTP depths are the plan's last layers; Megatron's
  // recompute flags count the decoder layers only.
  if (plan.mtp_layers > 0) add("--mtp-num-layers", absl::StrCat(plan.mtp_layers));

  std::vector<int> full, selective, offload_input, offload_saved;
  std::set<std::string> modules;
  const int n = static_cast<int>(plan.layers.size()) - std::max(0, plan.mtp_layers);
  std::vector<std::string> mtp_recomputed, mtp_kept;
  for (const LayerPlan& l : plan.layers) {
    if (l.index >= n) {
      (l.policy == LayerPolicy::kRecompute || l.policy == LayerPolicy::kOffloadInput
           ? mtp_recomputed
           : mtp_kept)
          .push_back(l.name);
      continue;
    }
    switch (l.policy) {
      case LayerPolicy::kKeep:
        break;
      case LayerPolicy::kRecompute:
        full.push_back(l.index);
        break;
      case LayerPolicy::kOffloadInput:
        offload_input.push_back(l.index);
        full.push_back(l.index);  // Megatron's nearest: recompute it with its input kept
        break;
      case LayerPolicy::kSelectiveRecompute:
        selective.push_back(l.index);
        modules.insert(l.recompute_modules.begin(), l.recompute_modules.end());
        break;
      case LayerPolicy::kOffloadSaved:
        offload_saved.push_back(l.index);
        break;
    }
  }
  std::sort(full.begin(), full.end());

  if (!offload_input.empty()) {
    out.notes.push_back(absl::StrCat(
        LayerList(offload_input),
        " offload their input to host memory and recompute the rest (offload_input); Megatron "
        "cannot offload a recomputed layer's input, so they are recomputed with the input kept "
        "on the GPU: its peak is higher than the plan's by those inputs"));
  }
  if (!full.empty() && !selective.empty()) {
    out.notes.push_back(absl::StrCat(
        "the plan recomputes ", LayerList(full), " in full and ", LayerList(selective),
        " selectively; Megatron has one recompute granularity per job, so only the full "
        "recompute is emitted and the selective layers keep everything"));
  }
  if (!full.empty()) {
    add("--recompute-granularity", "full");
    if (static_cast<int>(full.size()) == n) {
      add("--recompute-method", "uniform");
      add("--recompute-num-layers", "1");
    } else {
      add("--recompute-method", "block");
      add("--recompute-num-layers", absl::StrCat(full.size()));
      if (!IsPrefix(full)) {
        std::vector<int> first(full.size());
        for (size_t i = 0; i < first.size(); ++i) first[i] = static_cast<int>(i);
        out.notes.push_back(absl::StrCat(
            "the plan recomputes ", LayerList(full), "; Megatron's block method recomputes ",
            LayerList(first), " instead, which hold different activations when the layers differ"));
      }
    }
  }
  // MultiTokenPredictionLayer._checkpointed_forward recomputes an MTP layer exactly when
  // recompute_granularity is full with the uniform method (block: "not supported for MTP yet",
  // kept); a selective recompute applies inside its transformer layer as in any other.
  const bool megatron_recomputes_mtp = !full.empty() && static_cast<int>(full.size()) == n;
  if (!mtp_recomputed.empty() && !megatron_recomputes_mtp) {
    out.notes.push_back(absl::StrCat(
        "the plan recomputes ", absl::StrJoin(mtp_recomputed, " and "),
        "; Megatron recomputes MTP layers only under --recompute-granularity full with "
        "--recompute-method uniform (every decoder layer), so they keep their activations"));
  }
  if (!mtp_kept.empty() && megatron_recomputes_mtp) {
    out.notes.push_back(absl::StrCat(
        "the plan keeps ", absl::StrJoin(mtp_kept, " and "),
        "; Megatron's uniform full recompute recomputes MTP layers too (more recompute than "
        "planned, less memory)"));
  }
  if (full.empty() && !selective.empty()) {
    std::vector<std::string> megatron_modules, unmapped;
    for (const std::string& m : modules) {
      auto it = MegatronModuleNames().find(m);
      (it == MegatronModuleNames().end() ? unmapped : megatron_modules)
          .push_back(it == MegatronModuleNames().end() ? m : it->second);
    }
    if (!megatron_modules.empty()) {
      add("--recompute-granularity", "selective");
      out.args.push_back("--recompute-modules");
      out.args.insert(out.args.end(), megatron_modules.begin(), megatron_modules.end());
    }
    if (!unmapped.empty()) {
      out.notes.push_back(absl::StrCat("Megatron has no selective recompute of ",
                                       absl::StrJoin(unmapped, ", "), " (recompute_modules)"));
    }
    if (static_cast<int>(selective.size()) < n && !megatron_modules.empty()) {
      out.notes.push_back(absl::StrCat(
          "the plan recomputes modules of ", LayerList(selective),
          " only; Megatron's selective recompute applies to every layer (more recompute than "
          "planned, less memory)"));
    }
  }
  if (!offload_saved.empty()) {
    const bool prefix = IsPrefix(offload_saved) && static_cast<int>(offload_saved.size()) < n;
    if (prefix && full.empty() && selective.empty()) {
      add("--cpu-offloading-num-layers", absl::StrCat(offload_saved.size()));
      out.notes.push_back(
          "Megatron's CPU offloading copies on its own schedule (after each layer's forward, "
          "back before its backward), not the plan's prefetch distance and save lag");
    } else {
      out.notes.push_back(absl::StrCat(
          LayerList(offload_saved),
          " offload their saved activations (offload_saved); Megatron's CPU offloading takes "
          "only the first N layers (fewer than all) and is refused together with recompute, so "
          "they are not offloaded: run them under the stowage runtime"));
    }
  }
  return out;
}

std::string RenderMegatronArguments(const Plan& plan, const TrainerArguments& arguments) {
  std::string out = absl::StrCat("# Megatron-LM arguments for the stowage plan of ", plan.model,
                                 " (", plan.seq_len, " tokens)",
                                 arguments.exact() ? "" : ": the nearest Megatron can run", "\n");
  if (!plan.fits) {
    absl::StrAppend(&out, "# does not fit: ", plan.binding.what, " (", plan.binding.explanation,
                    "); these arguments run the closest plan, which does not fit either\n");
  }
  // One flag and its values per line.
  std::vector<std::string> lines;
  for (const std::string& token : arguments.args) {
    if (token.rfind("--", 0) == 0 || lines.empty()) {
      lines.push_back(token);
    } else {
      absl::StrAppend(&lines.back(), " ", token);
    }
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::StrAppend(&out, lines[i], i + 1 < lines.size() ? " \\\n" : "\n");
  }
  for (const std::string& note : arguments.notes)
    absl::StrAppend(&out, "# not expressed: ", note, "\n");
  return out;
}

TrainerConfig TorchtitanConfig(const Plan& plan, const RunSettings& run) {
  TrainerConfig out;
  auto set = [&](const char* section, const char* key, std::string value) {
    out.entries.push_back({section, key, std::move(value)});
  };
  auto quoted = [](std::string_view s) { return absl::StrCat("\"", std::string(s), "\""); };

  // Data parallel: the GPUs left over by TP x CP x PP (one stage: --emit refuses pipelines).
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
  // The planner's TP is with sequence parallelism, as torchtitan's TP plans are; its experts
  // are not tensor-parallel (the routed tokens are split over TP instead).
  set("parallelism", "tensor_parallel_degree", absl::StrCat(plan.tp));
  set("parallelism", "context_parallel_degree", absl::StrCat(plan.cp));
  set("parallelism", "pipeline_parallel_degree", absl::StrCat(plan.pp));
  set("parallelism", "expert_parallel_degree", absl::StrCat(plan.ep));
  if (plan.ep > 1) set("parallelism", "expert_tensor_parallel_degree", "1");
  set("training", "seq_len", absl::StrCat(plan.seq_len));
  set("training", "local_batch_size", absl::StrCat(plan.micro_batch));
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
  const int n = static_cast<int>(plan.layers.size()) - std::max(0, plan.mtp_layers);
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
  if (recomputed.empty()) {
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
        " the rest (offload_input); torchtitan "
        "has no activation offload, so they are checkpointed with the input kept on the GPU: its "
        "peak is higher than the plan's by those inputs (run them under the stowage runtime)"));
  }
  if (!offload_saved.empty()) {
    out.notes.push_back(absl::StrCat(
        LayerList(offload_saved), Verb(offload_saved, " offloads its", " offload their"),
        " saved activations (offload_saved); torchtitan has no activation offload, so they stay "
        "on the GPU: its peak is higher than the plan's by those bytes (run them under the "
        "stowage runtime)"));
  }
  out.notes.push_back(absl::StrCat(
      "the plan's per-layer bytes are the ", plan.framework,
      " framework's recipe (--framework); torchtitan runs its own model code, so measure its "
      "layers (python -m stowage.profile) and plan with --profile for its exact figures"));
  return out;
}

std::string RenderTorchtitanConfig(const Plan& plan, const TrainerConfig& config) {
  std::string out = absl::StrCat(
      "# torchtitan job config (0.2.2 names) for the stowage plan of ", plan.model, " (",
      plan.seq_len, " tokens): the nearest torchtitan can run; merge into your job's .toml\n");
  if (!plan.fits) {
    absl::StrAppend(&out, "# does not fit: ", plan.binding.what, " (", plan.binding.explanation,
                    "); this config runs the closest plan, which does not fit either\n");
  }
  std::string section;
  for (const TomlEntry& e : config.entries) {
    if (e.section != section) {
      absl::StrAppend(&out, section.empty() ? "" : "\n", "[", e.section, "]\n");
      section = e.section;
    }
    absl::StrAppend(&out, e.key, " = ", e.value, "\n");
  }
  if (!config.notes.empty()) absl::StrAppend(&out, "\n");
  for (const std::string& note : config.notes) {
    absl::StrAppend(&out, "# not expressed: ", note, "\n");
  }
  return out;
}

}  // namespace stowage::planner
