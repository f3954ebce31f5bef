#include "planner/trainer_arguments.h"

#include <algorithm>
#include <map>
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

  std::vector<int> full, selective, offload_input, offload_saved;
  std::set<std::string> modules;
  const int n = static_cast<int>(plan.layers.size());
  for (const LayerPlan& l : plan.layers) {
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
  } else if (!selective.empty()) {
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

}  // namespace stowage::planner
