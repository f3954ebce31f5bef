#include "tools/trainer_config.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

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
    } else if (IsPolicySetting(a.name)) {
      policy.push_back(absl::StrCat("--", a.name, a.value ? " " + *a.value : ""));
    } else {
      unused.push_back(absl::StrCat("--", a.name));
    }
  }
  // Megatron's distributed optimizer shards optimizer state over data parallel: --sharding optim.
  if (distributed_optimizer && !explicit_sharding) out.flags.push_back({"sharding", "optim"});
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

}  // namespace stowage::tools
