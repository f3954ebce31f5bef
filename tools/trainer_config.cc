#include "tools/trainer_config.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "toml++/toml.h"

namespace stowage::tools {
namespace {

// Megatron-LM's argument (megatron/training/arguments.py; names as in
// tests/data/megatron-lm-arguments.json) -> the `stowage plan` flag with the same meaning.
const std::map<std::string, std::string>& MegatronToStowage() {
  static const auto* table = new std::map<std::string, std::string>{
      {"tensor-model-parallel-size", "tp"},
      {"context-parallel-size", "cp"},
      {"expert-model-parallel-size", "ep"},
      {"pipeline-model-parallel-size", "pp"},
      {"virtual-pipeline-model-parallel-size", "vpp"},
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

struct Argument {
  std::string name;  // without "--", dashes
  std::optional<std::string> value;
};

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
    Argument a{tokens[i].substr(2), std::nullopt};
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
    out.push_back({key, lower == "true" ? std::nullopt : std::optional<std::string>(value)});
  }
  return out;
}

bool LooksLikeYaml(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    return line.rfind("--", 0) != 0 && line.find(':') != absl::string_view::npos;
  }
  return false;
}

}  // namespace

absl::StatusOr<TrainerSettings> ReadMegatronSettings(std::string_view text_in,
                                                     std::string_view source_in) {
  // Debian's Abseil has its own string_view; the splitting below works in its type.
  const absl::string_view text(text_in.data(), text_in.size());
  const std::string source(source_in);
  std::vector<Argument> arguments;
  if (LooksLikeYaml(text)) {
    auto yaml = YamlScalars(text, source);
    if (!yaml.ok()) return yaml.status();
    arguments = *std::move(yaml);
  } else {
    arguments = ArgumentList(text);
  }
  TrainerSettings out;
  std::vector<std::string> policy, unused;
  bool distributed_optimizer = false, explicit_sharding = false;
  for (const Argument& a : arguments) {
    if (auto it = MegatronToStowage().find(a.name); it != MegatronToStowage().end()) {
      if (!a.value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": --", a.name, " has no value"));
      }
      out.flags.push_back({it->second, *a.value});
      explicit_sharding |= it->second == "sharding";
    } else if (a.name == "use-distributed-optimizer") {
      distributed_optimizer = true;
    } else if (a.name == "optimizer-cpu-offload") {
      out.flags.push_back({"optimizer-offload", "true"});
    } else if (a.name == "use-tp-pp-dp-mapping") {
      // initialize.py: order 'tp-cp-ep-pp-dp' under this switch (common_config.py).
      out.flags.push_back({"rank-order", "tp-cp-ep-pp-dp"});
    } else if (IsPolicySetting(a.name)) {
      policy.push_back(absl::StrCat("--", a.name, a.value ? " " + *a.value : ""));
    } else {
      unused.push_back(absl::StrCat("--", a.name));
    }
  }
  // Megatron's distributed optimizer shards optimizer state over data parallel: --sharding optim.
  if (distributed_optimizer && !explicit_sharding) out.flags.push_back({"sharding", "optim"});
  // Megatron-LM builds no MTP module without --mtp-num-layers (its default is None), whatever the
  // checkpoint's num_nextn_predict_layers (Note [MTP layers] in planner/cost_model.cc).
  bool mtp_given = false;
  for (const auto& flag : out.flags) mtp_given |= flag.first == "mtp-layers";
  if (!mtp_given) out.flags.push_back({"mtp-layers", "0"});
  if (!policy.empty()) {
    out.notes.push_back(absl::StrCat(source, " sets ", absl::StrJoin(policy, ", "),
                                     ": stowage chooses recompute and offload per layer (compare "
                                     "with --force and --emit megatron)"));
  }
  if (!unused.empty()) {
    out.notes.push_back(absl::StrCat(
        "not used from ", source,
        " (the model's shape comes from "
        "--model): ",
        unused.size(), " settings, ",
        absl::StrJoin(unused.begin(), unused.begin() + std::min<size_t>(unused.size(), 8), ", "),
        unused.size() > 8 ? ", ..." : ""));
  }
  return out;
}

namespace {

// torchtitan's [model] name and flavor -> the preset of the same shape (torchtitan/models/<name>/
// __init__.py of 0.2.2: e.g. llama3 "8B" is dim 4096, 32 layers, 8 KV heads, FFN 14336, vocab
// 128256, Llama 3.1 8B's). Flavors without one (debug models, attention-kernel variants such as
// "8B_flex") are named in a note.
const std::map<std::pair<std::string, std::string>, std::string>& TorchtitanPresets() {
  static const auto* table = new std::map<std::pair<std::string, std::string>, std::string>{
      {{"llama3", "8B"}, "llama-3.1-8b"},
      {{"llama3", "70B"}, "llama-3.1-70b"},
      {{"llama3", "405B"}, "llama-3.1-405b"},
      {{"qwen3", "8B"}, "qwen3-8b"},
      {{"qwen3", "32B"}, "qwen3-32b"},
      {{"qwen3", "30B-A3B"}, "qwen3-30b-a3b"},
      {{"qwen3", "235B-A22B"}, "qwen3-235b-a22b"},
      {{"deepseek_v3", "671B"}, "deepseek-v3"},
      {{"gpt_oss", "120b"}, "gpt-oss-120b"},
  };
  return *table;
}

// Typed reads of `section.key` from a parsed job config; every key read is remembered, so the
// rest can be named as not used.
class TomlSettings {
 public:
  TomlSettings(const toml::table& root, std::string source)
      : root_(root), source_(std::move(source)) {}

  const toml::node* Find(const std::string& section, const std::string& key) {
    used_.insert(absl::StrCat(section, ".", key));
    const toml::table* table = root_[section].as_table();
    return table == nullptr ? nullptr : table->get(key);
  }

  absl::StatusOr<std::optional<int64_t>> Int(const std::string& section, const std::string& key,
                                             int64_t min, int64_t max) {
    const toml::node* node = Find(section, key);
    if (node == nullptr) return std::nullopt;
    const std::optional<int64_t> value = node->value_exact<int64_t>();
    if (!value.has_value() || *value < min || *value > max) {
      return Invalid(section, key, *node, absl::StrCat("an integer in [", min, ", ", max, "]"));
    }
    return value;
  }

  absl::StatusOr<std::optional<std::string>> String(const std::string& section,
                                                    const std::string& key) {
    const toml::node* node = Find(section, key);
    if (node == nullptr) return std::nullopt;
    if (!node->is_string()) return Invalid(section, key, *node, "a string");
    return std::optional<std::string>(std::string(*node->value<std::string_view>()));
  }

  absl::StatusOr<std::optional<bool>> Bool(const std::string& section, const std::string& key) {
    const toml::node* node = Find(section, key);
    if (node == nullptr) return std::nullopt;
    if (!node->is_boolean()) return Invalid(section, key, *node, "true or false");
    return node->value<bool>();
  }

  absl::Status Invalid(const std::string& section, const std::string& key, const toml::node& node,
                       const std::string& allowed) const {
    std::ostringstream value;
    node.visit([&](const auto& v) { value << v; });  // as TOML writes it: "two", 0, [1, 2]
    return absl::InvalidArgumentError(absl::StrCat(source_, ":", node.source().begin.line, ": ",
                                                   section, ".", key, " has value ", value.str(),
                                                   "; allowed: ", allowed));
  }

  // Every key of the file not read, as "section.key" ("quantize.linear.float8.fqns").
  std::vector<std::string> Unused() const {
    std::vector<std::string> out;
    Walk(root_, "", out);
    return out;
  }

 private:
  void Walk(const toml::table& table, const std::string& prefix,
            std::vector<std::string>& out) const {
    for (const auto& [key, node] : table) {
      const std::string name = absl::StrCat(prefix, std::string(key.str()));
      if (const toml::table* child = node.as_table(); child != nullptr) {
        Walk(*child, name + ".", out);
      } else if (!used_.contains(name)) {
        out.push_back(name);
      }
    }
  }

  const toml::table& root_;
  std::string source_;
  std::set<std::string> used_;
};

#define STOWAGE_ASSIGN_OR_RETURN(lhs, expr)     \
  auto lhs##_or = (expr);                       \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  const auto lhs = *lhs##_or

}  // namespace

absl::StatusOr<TrainerSettings> ReadTorchtitanSettings(std::string_view text,
                                                       std::string_view source_in) {
  const std::string source(source_in);
  toml::table root;
  try {
    root = toml::parse(text, source_in);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.source().begin.line, ":",
                                                   e.source().begin.column,
                                                   ": not TOML: ", std::string(e.description())));
  }
  TomlSettings toml(root, source);
  TrainerSettings out;
  auto flag = [&](const char* name, int64_t value) {
    out.flags.push_back({name, absl::StrCat(value)});
  };
  constexpr int64_t kMaxDegree = 1 << 20;  // the planner's own limit on a parallel size

  // [parallelism]: torchtitan's world is dp_replicate x dp_shard x cp x tp x pp
  // (distributed/parallel_dims.py, ParallelDims._validate).
  const std::string par = "parallelism";
  STOWAGE_ASSIGN_OR_RETURN(tp, toml.Int(par, "tensor_parallel_degree", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(cp, toml.Int(par, "context_parallel_degree", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(pp, toml.Int(par, "pipeline_parallel_degree", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(ep, toml.Int(par, "expert_parallel_degree", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(etp, toml.Int(par, "expert_tensor_parallel_degree", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(replicate,
                           toml.Int(par, "data_parallel_replicate_degree", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(shard, toml.Int(par, "data_parallel_shard_degree", -1, kMaxDegree));
  if (shard.has_value() && *shard == 0) {
    return toml.Invalid(par, "data_parallel_shard_degree",
                        *toml.Find(par, "data_parallel_shard_degree"),
                        "-1 (every GPU the other degrees leave) or an integer of at least 1");
  }
  STOWAGE_ASSIGN_OR_RETURN(reshard, toml.String(par, "fsdp_reshard_after_forward"));
  STOWAGE_ASSIGN_OR_RETURN(schedule, toml.String(par, "pipeline_parallel_schedule"));
  STOWAGE_ASSIGN_OR_RETURN(pp_microbatch,
                           toml.Int(par, "pipeline_parallel_microbatch_size", 1, kMaxDegree));
  const int64_t tp_v = tp.value_or(1), cp_v = cp.value_or(1), pp_v = pp.value_or(1);
  const int64_t replicate_v = replicate.value_or(1), shard_v = shard.value_or(-1);
  if (tp) flag("tp", *tp);
  if (cp) flag("cp", *cp);
  if (pp) flag("pp", *pp);
  if (ep) flag("ep", *ep);
  if (etp.value_or(1) != 1) {
    out.notes.push_back(absl::StrCat(
        source, " sets parallelism.expert_tensor_parallel_degree = ", *etp,
        ": the planner's experts are not tensor-parallel (TP splits their routed tokens)"));
  }
  if (shard_v >= 1) {
    flag("gpus", replicate_v * shard_v * cp_v * tp_v * pp_v);
  } else {
    out.notes.push_back(absl::StrCat(
        source,
        " sets parallelism.data_parallel_shard_degree = -1 (every GPU the other degrees "
        "leave): give --gpus, the job's world size"));
  }
  // FSDP2 shards parameters, gradients and optimizer state over dp_shard x cp; with neither
  // above 1 the replicas are plain data parallel.
  const bool fsdp = shard_v != 1 || cp_v > 1;
  if (fsdp && reshard.has_value() && *reshard == "never") {
    // Parameters stay gathered from the forward to the backward: replicated through the step.
    out.flags.push_back({"sharding", "optim_grads"});
    out.notes.push_back(
        absl::StrCat(source,
                     " sets parallelism.fsdp_reshard_after_forward = \"never\": parameters stay "
                     "gathered between forward and backward, planned as --sharding optim_grads"));
  } else {
    out.flags.push_back({"sharding", fsdp ? "optim_grads_params" : "no_shard"});
  }
  if (reshard.has_value() && *reshard != "default" && *reshard != "always" && *reshard != "never") {
    return toml.Invalid(par, "fsdp_reshard_after_forward",
                        *toml.Find(par, "fsdp_reshard_after_forward"),
                        "\"default\", \"always\", \"never\"");
  }
  if (pp_v > 1 && schedule.has_value()) {
    if (*schedule == "1F1B") {
      out.flags.push_back({"schedule", "1f1b"});
    } else if (*schedule == "Interleaved1F1B") {
      out.flags.push_back({"schedule", "interleaved"});
      out.notes.push_back(
          absl::StrCat(source,
                       ": torchtitan derives the model chunks per stage of Interleaved1F1B from "
                       "parallelism.pipeline_parallel_layers_per_stage: give --vpp"));
    } else {
      out.notes.push_back(
          absl::StrCat(source, " sets parallelism.pipeline_parallel_schedule = \"", *schedule,
                       "\": the planner models 1F1B and Interleaved1F1B; planned as 1F1B"));
    }
  }

  // [training]: torchtitan's local_batch_size is per data-parallel rank; under PP it is split
  // into microbatches of pipeline_parallel_microbatch_size (train.py, build_pipeline_schedule),
  // and global_batch_size > 0 accumulates gradients over global / (local x dp) of them.
  const std::string tr = "training";
  STOWAGE_ASSIGN_OR_RETURN(seq_len, toml.Int(tr, "seq_len", 1, int64_t{1} << 40));
  STOWAGE_ASSIGN_OR_RETURN(local, toml.Int(tr, "local_batch_size", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(global, toml.Int(tr, "global_batch_size", -1, int64_t{1} << 40));
  STOWAGE_ASSIGN_OR_RETURN(cpu_offload, toml.Bool(tr, "enable_cpu_offload"));
  STOWAGE_ASSIGN_OR_RETURN(param_dtype, toml.String(tr, "mixed_precision_param"));
  if (seq_len) flag("seq-len", *seq_len);
  const bool global_given = global.has_value() && *global > 0;
  if (pp_v > 1) {
    const int64_t micro = pp_microbatch.value_or(1);
    flag("micro-batch", micro);
    if (global_given) {
      flag("global-batch", *global);
    } else if (local.has_value()) {
      if (*local % micro != 0) {
        return toml.Invalid(tr, "local_batch_size", *toml.Find(tr, "local_batch_size"),
                            absl::StrCat("a multiple of parallelism.pipeline_parallel_microbatch_"
                                         "size (",
                                         micro, ")"));
      }
      flag("microbatches", *local / micro);
    }
  } else {
    if (local) flag("micro-batch", *local);
    if (global_given) flag("global-batch", *global);
  }
  if (cpu_offload.value_or(false)) {
    out.flags.push_back({"optimizer-offload", "true"});
    out.notes.push_back(absl::StrCat(
        source,
        " sets training.enable_cpu_offload: planned as --optimizer-offload; FSDP2's CPU "
        "offload also keeps parameters and gradients in host memory"));
  }
  if (param_dtype.has_value() && *param_dtype == "float32") {
    out.notes.push_back(absl::StrCat(source,
                                     " sets training.mixed_precision_param = \"float32\": the "
                                     "planner counts bf16 weights and activations"));
  }

  // [optimizer]: torchtitan builds Adam and AdamW (components/optimizer.py), Adam's state.
  STOWAGE_ASSIGN_OR_RETURN(optimizer, toml.String("optimizer", "name"));
  if (optimizer.has_value()) {
    if (*optimizer != "Adam" && *optimizer != "AdamW") {
      return toml.Invalid("optimizer", "name", *toml.Find("optimizer", "name"),
                          "\"Adam\", \"AdamW\" (what torchtitan builds)");
    }
    out.flags.push_back({"optimizer", "adam"});
  }

  // [model]: a preset where one has the flavor's shape.
  STOWAGE_ASSIGN_OR_RETURN(model, toml.String("model", "name"));
  STOWAGE_ASSIGN_OR_RETURN(flavor, toml.String("model", "flavor"));
  if (model.has_value() || flavor.has_value()) {
    const std::pair<std::string, std::string> key{model.value_or("llama3"),
                                                  flavor.value_or("debugmodel")};
    if (auto it = TorchtitanPresets().find(key); it != TorchtitanPresets().end()) {
      out.flags.push_back({"model", it->second});
    } else {
      out.notes.push_back(absl::StrCat(source, " sets model ", key.first, " flavor ", key.second,
                                       ", which no preset has the shape of: give --model (a "
                                       "preset or the model's config.json)"));
    }
  }

  // [activation_checkpoint]: stowage's own choice, per layer; the --force that evaluates the
  // file's setting as it is (Note [torchtitan expressiveness] in planner/trainer_arguments.h).
  // Absent, torchtitan's default applies: selective, every 2nd block.
  const std::string ac = "activation_checkpoint";
  STOWAGE_ASSIGN_OR_RETURN(mode, toml.String(ac, "mode"));
  STOWAGE_ASSIGN_OR_RETURN(option, toml.String(ac, "selective_ac_option"));
  const std::string mode_v = mode.value_or("selective"), option_v = option.value_or("2");
  std::string compare;
  if (mode_v == "none") {
    compare = "--force keep runs it as it is";
  } else if (mode_v == "full") {
    compare = "--force recompute runs it as it is";
  } else if (mode_v == "selective" || mode_v == "memory_budget") {
    compare = "no uniform --force is the same; --emit torchtitan prints the plan in these terms";
  } else {
    return toml.Invalid(ac, "mode", *toml.Find(ac, "mode"),
                        "\"none\", \"full\", \"selective\", \"memory_budget\"");
  }
  out.notes.push_back(absl::StrCat(
      source, mode.has_value() ? " sets" : " leaves torchtitan's default,",
      " activation_checkpoint.mode = \"", mode_v, "\"",
      mode_v == "selective" ? absl::StrCat(" (selective_ac_option = \"", option_v, "\")") : "",
      ": stowage chooses recompute and offload per layer (", compare, ")"));
  STOWAGE_ASSIGN_OR_RETURN(compile, toml.Bool("compile", "enable"));
  if (compile.value_or(false)) {
    out.notes.push_back(absl::StrCat(source,
                                     " sets compile.enable: torch.compile fuses kernels and "
                                     "changes what is saved; the planner counts eager kernels"));
  }
  const std::vector<std::string> unused = toml.Unused();
  if (!unused.empty()) {
    out.notes.push_back(absl::StrCat(
        "not used from ", source, " (the model's shape comes from --model): ", unused.size(),
        " settings, ",
        absl::StrJoin(unused.begin(), unused.begin() + std::min<size_t>(unused.size(), 8), ", "),
        unused.size() > 8 ? ", ..." : ""));
  }
  return out;
}

}  // namespace stowage::tools
