// Reading a Megatron-LM job (`stowage plan --from-megatron FILE`): its launch arguments or YAML
// config as the planner's flags, and its pipeline split as Megatron derives it.
#include "bridges/megatron_read.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "bridges/megatron_job.h"
#include "bridges/megatron_model.h"
#include "bridges/shell_script.h"
#include "planner/model/model.h"
#include "stowage/plan.h"

namespace stowage::bridges {
namespace {

// Megatron-LM's argument (megatron/training/arguments.py; names as in
// tests/data/megatron-lm-arguments.json) -> the `stowage plan` flag with the same meaning.
const std::map<std::string, std::string>& MegatronToStowage() {
  static const auto* table = new std::map<std::string, std::string>{
      {"tensor-model-parallel-size", "tp"},
      {"context-parallel-size", "cp"},
      {"expert-model-parallel-size", "ep"},
      {"pipeline-model-parallel-size", "pp"},
      {"seq-length", "seq-len"},
      {"micro-batch-size", "micro-batch"},
      {"global-batch-size", "global-batch"},
      // Megatron-FSDP's strategies are the planner's --sharding words.
      {"data-parallel-sharding-strategy", "sharding"},
      {"optimizer", "optimizer"},
      {"mtp-num-layers", "mtp-layers"},
  };
  return *table;
}

// Settings stowage decides itself, or that belong to the model's shape: named in a note.
bool IsPolicySetting(const std::string& name) {
  return name.rfind("recompute-", 0) == 0 || name.rfind("cpu-offloading", 0) == 0 ||
         name == "fine-grained-activation-offloading" || name == "offload-modules";
}

using Argument = MegatronArgument;

// A file that is not shell (an unbalanced quote): its `--name value` words, as a flat list.
std::vector<Argument> ArgumentList(absl::string_view text) {
  std::vector<std::string> tokens;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (auto hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    for (absl::string_view word :
         absl::StrSplit(line, absl::ByAnyChar(" \t\r\\"), absl::SkipEmpty())) {
      std::string token(word);
      // Quotes around a value: "8" or '8'.
      if (token.size() >= 2 && (token.front() == '"' || token.front() == '\'') &&
          token.back() == token.front()) {
        token = token.substr(1, token.size() - 2);
      }
      tokens.push_back(std::move(token));
    }
  }
  std::vector<Argument> out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].rfind("--", 0) != 0) continue;  // the launcher, the script, a list's tail
    Argument a{tokens[i].substr(2), std::nullopt, "", tokens[i]};
    if (auto eq = a.name.find('='); eq != std::string::npos) {
      a.value = a.name.substr(eq + 1);
      a.name = a.name.substr(0, eq);
    } else if (i + 1 < tokens.size() && tokens[i + 1].rfind("--", 0) != 0) {
      a.value = tokens[i + 1];
    }
    out.push_back(std::move(a));
  }
  return out;
}

absl::StatusOr<std::vector<Argument>> YamlScalars(absl::string_view text,
                                                  absl::string_view source) {
  std::vector<Argument> out;
  int number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++number;
    absl::string_view line = raw;
    if (auto hash = line.find(" #"); hash != absl::string_view::npos) line = line.substr(0, hash);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#' || line == "---") continue;
    if (line[0] == '-') continue;  // a list item: no run setting is a list
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", number, ": expected 'key: value' (a YAML mapping of scalars), got '",
          std::string(line), "'"));
    }
    std::string key(absl::StripAsciiWhitespace(line.substr(0, colon)));
    std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    if (value.empty()) continue;  // a section such as `model_parallel:`
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
        value.back() == value.front()) {
      value = value.substr(1, value.size() - 2);
    }
    std::replace(key.begin(), key.end(), '_', '-');
    const std::string lower = absl::AsciiStrToLower(value);
    if (lower == "false" || lower == "null" || lower == "~") continue;  // a switch left off
    out.push_back({key, lower == "true" ? std::nullopt : std::optional<std::string>(value), "",
                   absl::StrCat("--", key, lower == "true" ? "" : " " + value)});
  }
  return out;
}

// YAML when the first line that is not a comment or "---" is `key:` or `key: value` with a plain
// key (a shell line such as `X=${A:-1}` or `mkdir -p "$(dirname "$P")"` is not).
bool LooksLikeYaml(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#' || line == "---") continue;
    const size_t colon = line.find(':');
    if (colon == 0 || colon == absl::string_view::npos) return false;
    for (char c : line.substr(0, colon)) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') {
        return false;
      }
    }
    return line[0] != '-' && (colon + 1 == line.size() || line[colon + 1] == ' ');
  }
  return false;
}

// The arguments that split the decoder layers over the pipeline's stages (arguments.py
// validate_args, transformer_config.py __post_init__, transformer_block.py
// get_num_layers_to_build); --num-layers is read for them alone.
bool IsPipelineSplitArgument(const std::string& name) {
  static const auto* names = new std::set<std::string>{
      "num-layers",
      "pipeline-model-parallel-layout",
      "num-layers-per-virtual-pipeline-stage",
      "num-virtual-stages-per-pipeline-rank",
      "decoder-first-pipeline-num-layers",
      "decoder-last-pipeline-num-layers",
      "account-for-embedding-in-pipeline-split",
      "account-for-loss-in-pipeline-split",
  };
  return names->contains(name);
}

using ArgumentValues = std::map<std::string, std::optional<std::string>>;

// An integer argument in [min, max], or nullopt when the file does not set it.
absl::StatusOr<std::optional<int>> IntArgument(const ArgumentValues& args, const std::string& name,
                                               int min, int max, const std::string& source) {
  auto it = args.find(name);
  if (it == args.end()) return std::nullopt;
  int value = 0;
  if (!it->second.has_value() || !absl::SimpleAtoi(*it->second, &value) || value < min ||
      value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": --", name, " is '", it->second.value_or(""),
                     "'; allowed: an integer in [", min, ", ", max, "]"));
  }
  return value;
}

// Note [Pipeline split from Megatron]: the stages as Megatron builds them, said as --vpp and
// --pp-layout. The layout gives every virtual stage (its vpp is stages / pp, and it conflicts with
// the other split arguments); else --decoder-first/last-pipeline-num-layers give the first and
// last rank theirs and the middle ranks share the rest evenly, each rank's layers divided evenly
// over its model chunks; else the split is Megatron's even one, which `stowage plan` makes itself
// from --vpp and the two accounting switches. More than one model chunk runs the interleaved
// schedule (schedules.py get_forward_backward_func). The MTP depths go to the last virtual
// stage, where the planner runs them (Note [MTP layers] in planner/frameworks/megatron.cc): a
// layout that places them elsewhere (Megatron's standalone MTP stage) is refused. True when the
// split counted --num-layers.
absl::StatusOr<bool> ReadMegatronSplit(const ArgumentValues& args, int pp, int mtp_layers,
                                       const std::string& source, TrainerSettings& out) {
  // The planner's own limits bound every count (so nothing below overflows or allocates more
  // than a model can have).
  auto layers_arg = [&](const char* name, int min) {
    return IntArgument(args, name, min, planner::kMaxLayers, source);
  };
  auto num_layers = layers_arg("num-layers", 1);
  auto per_virtual = layers_arg("num-layers-per-virtual-pipeline-stage", 1);
  auto virtual_stages =
      IntArgument(args, "num-virtual-stages-per-pipeline-rank", 1, kPlanMaxVirtualStages, source);
  auto first = layers_arg("decoder-first-pipeline-num-layers", 0);
  auto last = layers_arg("decoder-last-pipeline-num-layers", 0);
  for (const auto* v : {&num_layers, &per_virtual, &virtual_stages, &first, &last}) {
    if (!v->ok()) return v->status();
  }
  const bool embedding_counted = args.contains("account-for-embedding-in-pipeline-split");
  const bool loss_counted = args.contains("account-for-loss-in-pipeline-split");
  const auto layout = args.find("pipeline-model-parallel-layout");
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", why));
  };
  const std::vector<std::string> exclusive = {"num-layers-per-virtual-pipeline-stage",
                                              "num-virtual-stages-per-pipeline-rank",
                                              "pipeline-model-parallel-layout"};
  std::vector<std::string> given;
  for (const std::string& name : exclusive) {
    if (args.contains(name)) given.push_back("--" + name);
  }
  if (given.size() > 1) {
    return refuse(absl::StrCat("sets ", absl::StrJoin(given, " and "),
                               "; Megatron takes at most one of them"));
  }
  auto needs_num_layers = [&](const char* name) {
    return refuse(absl::StrCat("--", name,
                               " splits --num-layers, which the file does not set; add it (the "
                               "model's decoder layers)"));
  };
  std::vector<int> counts;  // decoder layers per virtual stage, when not the even split
  int vpp = 1;
  if (layout != args.end()) {
    if (!layout->second.has_value()) return refuse("--pipeline-model-parallel-layout has no value");
    if (first->has_value() || last->has_value() || embedding_counted || loss_counted) {
      return refuse(
          "--pipeline-model-parallel-layout gives every stage's layers; Megatron refuses it "
          "together with --decoder-first/last-pipeline-num-layers and "
          "--account-for-embedding/loss-in-pipeline-split");
    }
    auto stages = MegatronLayoutStages(*layout->second);
    if (!stages.ok()) return refuse(std::string(stages.status().message()));
    const std::string value =
        absl::StrCat("--pipeline-model-parallel-layout is '", *layout->second, "'");
    if (stages->size() % pp != 0) {
      return refuse(absl::StrCat(value, ": its ", stages->size(),
                                 " stages do not divide over --pipeline-model-parallel-size ", pp));
    }
    vpp = static_cast<int>(stages->size()) / pp;
    std::string all;
    for (const std::string& stage : *stages) all += stage;
    auto occurrences = [&](char c) { return std::count(all.begin(), all.end(), c); };
    if (all.empty() || all.front() != 'E' || all.back() != 'L' || occurrences('E') != 1 ||
        occurrences('L') != 1) {
      return refuse(absl::StrCat(value,
                                 "; allowed: one E (the embedding) first and one L (the "
                                 "loss) last"));
    }
    if (occurrences('m') != mtp_layers) {
      return refuse(absl::StrCat(value, ": it places ", occurrences('m'),
                                 " MTP depths (m); --mtp-num-layers is ", mtp_layers));
    }
    if (num_layers->has_value() && occurrences('t') != **num_layers) {
      return refuse(absl::StrCat(value, ": it places ", occurrences('t'),
                                 " decoder layers (t); --num-layers is ", **num_layers));
    }
    for (size_t v = 0; v < stages->size(); ++v) {
      const std::string& stage = (*stages)[v];
      const size_t mtp = stage.find('m');
      if (mtp != std::string::npos &&
          (v + 1 != stages->size() || stage.find('t', mtp) != std::string::npos)) {
        return refuse(absl::StrCat(
            value, ": it places MTP depths on virtual stage ", v,
            "; allowed: in the last virtual stage, after its decoder layers (where the planner "
            "runs them; a standalone MTP stage is not planned)"));
      }
      counts.push_back(static_cast<int>(std::count(stage.begin(), stage.end(), 't')));
    }
  } else {
    if (virtual_stages->has_value()) vpp = **virtual_stages;
    if (per_virtual->has_value()) {
      if (first->has_value() || last->has_value()) {
        return refuse(
            "--num-layers-per-virtual-pipeline-stage with an uneven split "
            "(--decoder-first/last-pipeline-num-layers); Megatron asks for "
            "--num-virtual-stages-per-pipeline-rank instead");
      }
      if (!num_layers->has_value()) {
        return needs_num_layers("num-layers-per-virtual-pipeline-stage");
      }
      const int total = **num_layers + (embedding_counted ? 1 : 0) + (loss_counted ? 1 : 0);
      if (total % pp != 0 || (total / pp) % **per_virtual != 0) {
        return refuse(absl::StrCat(
            "--num-layers-per-virtual-pipeline-stage is ", **per_virtual, "; it must divide the ",
            total, " layers", total != **num_layers ? " (embedding / loss counted)" : "",
            " over --pipeline-model-parallel-size ", pp, " evenly per stage"));
      }
      vpp = total / pp / **per_virtual;
    }
    if (first->has_value() || last->has_value()) {
      if (embedding_counted || loss_counted) {
        return refuse(
            "--decoder-first/last-pipeline-num-layers with "
            "--account-for-embedding/loss-in-pipeline-split; Megatron refuses the two together");
      }
      if (!num_layers->has_value()) {
        return needs_num_layers(first->has_value() ? "decoder-first-pipeline-num-layers"
                                                   : "decoder-last-pipeline-num-layers");
      }
      int rest = **num_layers, middle_ranks = pp;
      for (const auto* given_count : {&*first, &*last}) {
        if (given_count->has_value()) {
          rest -= **given_count;
          --middle_ranks;
        }
      }
      if (rest < 0 || (middle_ranks > 0 && rest % middle_ranks != 0)) {
        return refuse(absl::StrCat("--decoder-first/last-pipeline-num-layers leave ", rest,
                                   " of --num-layers ", **num_layers, " for ",
                                   std::max(0, middle_ranks),
                                   " middle stages; allowed: a multiple of the middle stages"));
      }
      std::vector<int> per_rank(pp, middle_ranks > 0 ? rest / middle_ranks : 0);
      if (first->has_value()) per_rank.front() = **first;
      if (last->has_value()) per_rank.back() = **last;
      counts.assign(static_cast<size_t>(pp) * vpp, 0);
      for (int s = 0; s < pp; ++s) {
        if (per_rank[s] % vpp != 0) {
          return refuse(absl::StrCat("stage ", s, "'s ", per_rank[s],
                                     " layers do not divide over its ", vpp, " model chunks"));
        }
        for (int c = 0; c < vpp; ++c) counts[static_cast<size_t>(c) * pp + s] = per_rank[s] / vpp;
      }
    } else {
      // Megatron's even split, which the planner makes from the same switches.
      if (embedding_counted)
        out.flags.push_back({"account-for-embedding-in-pipeline-split", "true"});
      if (loss_counted) out.flags.push_back({"account-for-loss-in-pipeline-split", "true"});
    }
  }
  if (vpp > 1) {
    out.flags.push_back({"vpp", absl::StrCat(vpp)});
    out.flags.push_back({"schedule", "interleaved"});
  }
  if (!counts.empty()) {
    out.flags.push_back({"pp-layout", absl::StrJoin(counts, ",")});
    out.notes.push_back(absl::StrCat(source, "'s pipeline split: planned as ",
                                     vpp > 1 ? absl::StrCat("--vpp ", vpp, " ") : "",
                                     "--pp-layout ", absl::StrJoin(counts, ",")));
  }
  return num_layers->has_value() && (per_virtual->has_value() || first->has_value() ||
                                     last->has_value() || layout != args.end());
}

// The arguments bridges/megatron_model.h reads for the model's shape and vocabulary.
bool IsModelArgument(const std::string& name) {
  static const auto* names = new std::set<std::string>{"num-layers",
                                                       "hidden-size",
                                                       "num-attention-heads",
                                                       "ffn-hidden-size",
                                                       "kv-channels",
                                                       "group-query-attention",
                                                       "num-query-groups",
                                                       "swiglu",
                                                       "quick-geglu",
                                                       "geglu",
                                                       "normalization",
                                                       "disable-bias-linear",
                                                       "add-bias-linear",
                                                       "add-qkv-bias",
                                                       "untie-embeddings-and-output-weights",
                                                       "position-embedding-type",
                                                       "max-position-embeddings",
                                                       "no-position-embedding",
                                                       "qk-layernorm",
                                                       "num-experts",
                                                       "moe-router-topk",
                                                       "moe-ffn-hidden-size",
                                                       "moe-shared-expert-intermediate-size",
                                                       "moe-shared-expert-gate",
                                                       "moe-layer-freq",
                                                       "multi-latent-attention",
                                                       "q-lora-rank",
                                                       "kv-lora-rank",
                                                       "qk-head-dim",
                                                       "qk-nope-head-dim",
                                                       "qk-pos-emb-head-dim",
                                                       "qk-rope-head-dim",
                                                       "v-head-dim",
                                                       "vocab-size",
                                                       "tokenizer-type",
                                                       "tokenizer-model",
                                                       "make-vocab-size-divisible-by",
                                                       "softmax-type",
                                                       "window-size",
                                                       "window-attn-skip-freq"};
  return names->contains(name);
}

// Whether Megatron-LM itself takes --`name` (its parser's names at the commit the generated list
// names: bridges/megatron_lm_arguments.inc, from scripts/gen-megatron-argument-names), '_' read as
// '-' on both sides as YAML keys are read. An argument it does not take is a fork's or a typo:
// named apart from the Megatron-LM arguments the planner does not use, never an error.
bool IsMegatronLmArgument(const std::string& name) {
  static const std::set<std::string>* const names = [] {
    static constexpr const char* kNames[] = {
#include "bridges/megatron_lm_arguments.inc"
    };
    auto* set = new std::set<std::string>;
    for (const char* n : kNames) {
      std::string dashed(n);
      std::replace(dashed.begin(), dashed.end(), '_', '-');
      set->insert(std::move(dashed));
    }
    return set;
  }();
  std::string dashed = name;
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  return names->contains(dashed);
}

// Arguments the job's description below reads (precision, Megatron-FSDP).
bool IsJobArgument(const std::string& name) {
  return name == "bf16" || name == "fp16" || name.rfind("fp8-", 0) == 0 ||
         name == "use-megatron-fsdp" || name == "use-distributed-optimizer";
}

// The uniform policy that evaluates the script's own setting (--force): Megatron's full
// recompute, selective recompute (--recompute-activations is selective); empty for none.
std::string ScriptForce(const std::vector<std::string>& policy) {
  std::string force;
  for (const std::string& p : policy) {
    if (absl::StrContains(p, "recompute-granularity full")) force = "recompute";
    if (force.empty() && (absl::StrContains(p, "selective") || p == "--recompute-activations")) {
      force = "selective_recompute";
    }
  }
  return force;
}

// The job as read, for the lines printed beside the plan.
std::vector<std::string> JobLines(const ArgumentValues& all, const LaunchedJob& job,
                                  const std::string& where, const std::vector<std::string>& policy,
                                  bool sequence_parallel) {
  std::vector<std::string> lines;
  if (!job.launcher.empty()) {
    lines.push_back(absl::StrCat("launcher: ", job.launcher, " (", where, "), ",
                                 job.gpus.has_value()
                                     ? absl::StrCat(*job.gpus, " GPUs (", job.gpus_origin, ")")
                                     : absl::StrCat("GPUs not known: ", job.gpus_missing)));
  }
  std::string precision = all.contains("bf16") ? "bf16" : (all.contains("fp16") ? "fp16" : "fp32");
  if (auto it = all.find("fp8-format"); it != all.end()) {
    absl::StrAppend(&precision, " with fp8 ", it->second.value_or(""),
                    " (the planner counts bf16 activations)");
  }
  std::string sharding =
      all.contains("use-megatron-fsdp")
          ? absl::StrCat("Megatron-FSDP ",
                         all.contains("data-parallel-sharding-strategy")
                             ? all.at("data-parallel-sharding-strategy").value_or("")
                             : "no_shard")
          : (all.contains("use-distributed-optimizer") ? "distributed optimizer" : "DDP");
  auto value = [&](const char* name, const char* fallback) {
    auto it = all.find(name);
    return it == all.end() ? std::string(fallback) : it->second.value_or("");
  };
  // Under TP, whether the layer inputs are a TP shard of the sequence: Megatron-LM's default is
  // without (Note [Sequence parallelism] in planner/frameworks/megatron.cc).
  const std::string tp = value("tensor-model-parallel-size", "1");
  const std::string tensor_parallel =
      tp == "1" ? ""
                : absl::StrCat("; TP ", tp, sequence_parallel ? " with" : " without",
                               " sequence parallelism");
  lines.push_back(absl::StrCat("precision ", precision, "; ", sharding, tensor_parallel,
                               "; micro-batch ", value("micro-batch-size", "1"), ", global batch ",
                               value("global-batch-size", "(not set)")));
  const std::string force = ScriptForce(policy);
  lines.push_back(absl::StrCat(
      "the script recomputes / offloads: ",
      policy.empty() ? "nothing" : absl::StrJoin(policy, ", "),
      force.empty() ? "" : absl::StrCat(" (evaluated beside the plan as --force ", force, ")")));
  return lines;
}

// The settings of a job's arguments (Note [Pipeline split from Megatron] for the split).
absl::StatusOr<TrainerSettings> ReadMegatronJob(const std::vector<Argument>& arguments,
                                                const LaunchedJob& job,
                                                const std::vector<std::string>& unresolved,
                                                const std::string& source) {
  TrainerSettings out;
  std::vector<std::string> policy, unused, not_needed, model_unresolved;
  ArgumentValues split, all;
  bool distributed_optimizer = false, explicit_sharding = false, sequence_parallel = false;
  const std::string where = job.line > 0 ? absl::StrCat(source, ":", job.line) : source;
  for (const Argument& a : arguments) {
    const std::string spelled = absl::StrCat("--", a.name, a.value ? " " + *a.value : "");
    if (!a.unresolved.empty()) {
      auto it = MegatronToStowage().find(a.name);
      if (it != MegatronToStowage().end()) {
        out.needs.push_back({it->second, absl::StrCat(a.unresolved, " (--", a.name, ")")});
      } else if ((IsModelArgument(a.name) && a.name.rfind("tokenizer-", 0) != 0) ||
                 IsPipelineSplitArgument(a.name)) {
        // (The tokenizer matters only without --vocab-size, which then says what is missing.)
        model_unresolved.push_back(absl::StrCat(a.unresolved, " (--", a.name, ")"));
      } else {
        not_needed.push_back(absl::StrCat("--", a.name));
      }
      continue;
    }
    all[a.name] = a.value;
    if (IsPipelineSplitArgument(a.name)) {
      split[a.name] = a.value;
    } else if (auto it = MegatronToStowage().find(a.name); it != MegatronToStowage().end()) {
      if (!a.value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": --", a.name, " has no value"));
      }
      out.flags.push_back({it->second, *a.value});
      out.origins[it->second] = absl::StrCat(where, ": ", spelled);
      explicit_sharding |= it->second == "sharding";
    } else if (a.name == "use-distributed-optimizer") {
      distributed_optimizer = true;
    } else if (a.name == "optimizer-cpu-offload") {
      out.flags.push_back({"optimizer-offload", "true"});
    } else if (a.name == "sequence-parallel") {
      // A switch (a YAML config's `sequence_parallel: false` says it is off).
      sequence_parallel = !a.value.has_value() || (*a.value != "false" && *a.value != "False");
    } else if (a.name == "use-tp-pp-dp-mapping") {
      // initialize.py: order 'tp-cp-ep-pp-dp' under this switch (common_config.py).
      out.flags.push_back({"rank-order", "tp-cp-ep-pp-dp"});
    } else if (a.name == "grad-reduce-in-bf16" ||
               (a.name == "megatron-fsdp-main-grads-dtype" && a.value == "bf16")) {
      // The gradient buffer in bf16 (distributed_data_parallel_config.py grad_reduce_in_fp32
      // off; Megatron-FSDP's main grads).
      out.flags.push_back({"grad-dtype", "bf16"});
    } else if (IsPolicySetting(a.name)) {
      policy.push_back(a.spelled.empty() ? spelled : a.spelled);
    } else if (!IsModelArgument(a.name) && !IsJobArgument(a.name)) {
      unused.push_back(absl::StrCat("--", a.name));
    }
  }
  if (!model_unresolved.empty()) {
    out.needs.push_back({"model", absl::StrJoin(model_unresolved, "; ")});
  }
  if (HasMegatronModel(all) && model_unresolved.empty()) out.model_arguments = all;
  if (job.gpus.has_value()) {
    out.flags.push_back({"gpus", absl::StrCat(*job.gpus)});
    out.origins["gpus"] = job.gpus_origin;
  } else if (!job.gpus_missing.empty()) {
    out.needs.push_back({"gpus", job.gpus_missing});
  }
  out.job = JobLines(all, job, where, policy, sequence_parallel);
  out.script_force = ScriptForce(policy);
  if (!out.script_force.empty()) out.script_policy = absl::StrJoin(policy, ", ");
  if (!not_needed.empty() || !unresolved.empty()) {
    std::vector<std::string> shown = unresolved;
    if (shown.size() > 4) shown.resize(4);
    out.notes.push_back(
        absl::StrCat("not resolved in ", source, " and not needed for the plan: ",
                     not_needed.empty() ? "" : absl::StrCat(absl::StrJoin(not_needed, ", "), "; "),
                     absl::StrJoin(shown, "; "), unresolved.size() > 4 ? "; ..." : ""));
  }
  // Megatron's distributed optimizer shards optimizer state over data parallel: --sharding optim;
  // without it (and without a Megatron-FSDP strategy) every data-parallel rank holds it all,
  // Megatron's default (--data-parallel-sharding-strategy no_shard), not the planner's.
  if (!explicit_sharding) {
    out.flags.push_back({"sharding", distributed_optimizer ? "optim" : "no_shard"});
    out.origins["sharding"] = distributed_optimizer
                                  ? absl::StrCat(where, ": --use-distributed-optimizer")
                                  : absl::StrCat(where, ": no --use-distributed-optimizer");
  }
  // Megatron-LM's --sequence-parallel is off unless given (arguments.py; it turns it off with TP 1,
  // where it is moot): without it TP is planned without sequence parallelism
  // (Note [Sequence parallelism] in planner/frameworks/megatron.cc). A MoE model under TP > 1
  // without it is refused once the TP and the model are known (tools::CheckTrainerJob in
  // cli/plan_inputs.cc).
  if (!sequence_parallel) {
    out.flags.push_back({"no-sequence-parallel", "true"});
    out.origins["no-sequence-parallel"] =
        absl::StrCat(where, ": no --sequence-parallel (Megatron-LM's default: off)");
  }
  // Megatron-LM builds no MTP module without --mtp-num-layers (its default is None), whatever the
  // checkpoint's num_nextn_predict_layers (Note [MTP layers] in planner/frameworks/megatron.cc).
  int pp = 1, mtp_layers = 0;
  bool mtp_given = false;
  for (const auto& [flag, value] : out.flags) {
    const bool is_pp = flag == "pp", is_mtp = flag == "mtp-layers";
    mtp_given |= is_mtp;
    if (!is_pp && !is_mtp) continue;
    const int min = is_pp ? 1 : 0, max = is_pp ? kPlanMaxPipelineStages : kPlanMaxMtpLayers;
    int& read = is_pp ? pp : mtp_layers;
    if (!absl::SimpleAtoi(value, &read) || read < min || read > max) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": --", is_pp ? "pipeline-model-parallel-size" : "mtp-num-layers",
                       " is '", value, "'; allowed: an integer in [", min, ", ", max, "]"));
    }
  }
  if (!mtp_given) out.flags.push_back({"mtp-layers", "0"});
  auto counted_layers = ReadMegatronSplit(split, pp, mtp_layers, source, out);
  if (!counted_layers.ok()) return counted_layers.status();
  // Without the rest of the model's shape --num-layers is read by the split alone.
  if (split.contains("num-layers") && !*counted_layers && !out.model_arguments.has_value()) {
    unused.insert(unused.begin(), "--num-layers");
  }
  if (!policy.empty()) {
    out.notes.push_back(absl::StrCat(source, " sets ", absl::StrJoin(policy, ", "),
                                     ": stowage chooses recompute and offload per layer (compare "
                                     "with --force and --emit megatron)"));
  }
  // Arguments Megatron-LM does not have at all, apart: a fork's (read, not used) or a typo.
  std::vector<std::string> unknown;
  std::erase_if(unused, [&](const std::string& flag) {
    if (IsMegatronLmArgument(flag.substr(2))) return false;
    unknown.push_back(flag);
    return true;
  });
  if (!unknown.empty()) {
    out.notes.push_back(
        absl::StrCat("unknown to Megatron-LM (not among its own arguments; a fork's, or a typo), "
                     "not used, from ",
                     source, ": ", absl::StrJoin(unknown, ", ")));
  }
  if (!unused.empty()) {
    out.notes.push_back(absl::StrCat(
        "not used from ", source,
        out.model_arguments.has_value() ? ": " : " (the model's shape comes from --model): ",
        unused.size(), " settings, ",
        absl::StrJoin(unused.begin(), unused.begin() + std::min<size_t>(unused.size(), 8), ", "),
        unused.size() > 8 ? ", ..." : ""));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> MegatronLayoutStages(std::string_view layout_in) {
  const std::string layout(layout_in);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pipeline-model-parallel-layout is '", layout, "'; ", why));
  };
  // Beyond this many characters unrolled the layout cannot be a model's (at most
  // planner::kMaxLayers layers, kPlanMaxPipelineStages x kPlanMaxVirtualStages stages).
  constexpr size_t kMaxUnrolled = size_t{1} << 16;
  std::string text;
  for (char c : layout) {
    if (c != ',') text.push_back(c);  // purely cosmetic commas
  }
  // parse_str_to_list's two re.sub passes, each left to right: r'\(([^)]+)\)\*(\d+)' (a group up
  // to the first ")"), then r'(.)\*(\d+)'.
  auto repeat_count = [&](size_t at, size_t& end, int64_t& count) {
    end = at;
    count = 0;
    while (end < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[end]))) {
      count = std::min<int64_t>(count * 10 + (text[end] - '0'), int64_t{kMaxUnrolled} + 1);
      ++end;
    }
    return end > at;
  };
  for (const bool group : {true, false}) {
    std::string out;
    size_t i = 0;
    while (i < text.size()) {
      size_t body = i, length = 1, star = i + 1;
      if (group) {
        const size_t close = text[i] == '(' ? text.find(')', i + 1) : std::string::npos;
        if (close != std::string::npos && close > i + 1) {
          body = i + 1;
          length = close - i - 1;
          star = close + 1;
        } else {
          star = std::string::npos;
        }
      }
      size_t end = 0;
      int64_t count = 0;
      if (star == std::string::npos || star >= text.size() || text[star] != '*' ||
          !repeat_count(star + 1, end, count)) {
        out.push_back(text[i++]);
        continue;
      }
      if (out.size() + static_cast<uint64_t>(count) * length > kMaxUnrolled) {
        return bad(absl::StrCat("it unrolls to more than ", kMaxUnrolled, " layers"));
      }
      for (int64_t k = 0; k < count; ++k) out.append(text, body, length);
      i = end;
    }
    text = std::move(out);
  }
  std::vector<std::string> stages;
  for (absl::string_view stage : absl::StrSplit(text, '|')) {
    for (char c : stage) {
      if (std::string_view("EtmL").find(c) == std::string_view::npos) {
        return bad(absl::StrCat("'", std::string(1, c),
                                "' is not a layer; allowed: E (embedding), t (decoder layer), m "
                                "(MTP depth), L (loss), '|' between stages, (..)*N and x*N "
                                "repeats, commas"));
      }
    }
    stages.emplace_back(stage);
  }
  return stages;
}

absl::StatusOr<TrainerSettings> ReadMegatronSettings(std::string_view text,
                                                     std::string_view source) {
  return ReadMegatronSettings(text, source, ShellEnvironment{});
}

absl::StatusOr<TrainerSettings> ReadMegatronSettings(std::string_view text_in,
                                                     std::string_view source_in,
                                                     const ShellEnvironment& environment) {
  // Debian's Abseil has its own string_view; the splitting below works in its type.
  const absl::string_view text(text_in.data(), text_in.size());
  const std::string source(source_in);
  std::vector<Argument> arguments;
  LaunchedJob job;
  std::vector<std::string> unresolved;
  if (LooksLikeYaml(text)) {
    auto yaml = YamlScalars(text, source);
    if (!yaml.ok()) return yaml.status();
    arguments = *std::move(yaml);
  } else if (auto script = ReadShellScript(text_in, source, environment); script.ok()) {
    job = ReadLaunchedJob(*script, source);
    arguments = job.arguments;
    unresolved = script->unresolved;
  } else {
    // Not shell (an unterminated quote): its `--name value` words as a flat list.
    arguments = ArgumentList(text);
    unresolved.push_back(absl::StrCat(script.status().message(), " (read as a list of arguments)"));
  }
  // Note [No Megatron argument]: a file with no `--name` argument (and a YAML file with no key)
  // is not a Megatron-LM job; planning the default model for it would answer a question nobody
  // asked.
  if (arguments.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source,
        ": found no Megatron-LM argument in it (a launch script running pretrain_gpt.py "
        "--name value ..., a list of --name value arguments, or a YAML config of "
        "name: value lines)"));
  }
  return ReadMegatronJob(arguments, job, unresolved, source);
}

}  // namespace stowage::bridges
