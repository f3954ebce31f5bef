// The trainer's own configuration as `stowage plan` inputs: see cli/plan_inputs.h.
#include "cli/plan_inputs.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bridges/megatron_model.h"
#include "bridges/megatron_read.h"
#include "bridges/shell_script.h"
#include "bridges/torchtitan_read.h"

extern char** environ;

namespace stowage::tools {
namespace {

// The variables of stowage's own environment: what the launch script would see when run here.
std::map<std::string, std::string> ProcessEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    if (const size_t eq = entry.find('='); eq != std::string::npos) {
      env[entry.substr(0, eq)] = entry.substr(eq + 1);
    }
  }
  return env;
}

// Megatron-LM's defaults for the parallel sizes a script leaves out (arguments.py: each 1); the
// planner's own defaults (CP 8, EP 8) are for its reference job, not this one.
constexpr const char* kMegatronDefaultOnes[] = {"tp", "cp", "ep", "pp"};

// Where a flag's value came from, for messages.
std::string Origin(const cli::FlagParser& flags, const TrainerInputs& trainer,
                   const std::string& flag, bool command_line) {
  if (command_line) return absl::StrCat("--", flag, " on the command line");
  if (auto it = trainer.origins.find(flag); it != trainer.origins.end()) return it->second;
  (void)flags;
  return "the planner's default";
}

}  // namespace

absl::StatusOr<TrainerInputs> ReadTrainerInputs(cli::FlagParser& flags,
                                                const std::vector<std::string>& script_args) {
  TrainerInputs out;
  if (!script_args.empty() && !flags.Has("from-megatron")) {
    return absl::InvalidArgumentError(
        "arguments after `--` are a launch script's positional parameters; they need "
        "--from-megatron FILE");
  }
  for (const char* from : {"from-megatron", "from-torchtitan"}) {
    auto file = flags.Get(from);
    if (!file.has_value()) continue;
    std::ifstream in(*file, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", from, "=", *file, ": cannot read the file"));
    }
    const bool megatron = std::string(from) == "from-megatron";
    absl::StatusOr<bridges::TrainerSettings> settings =
        megatron
            ? bridges::ReadMegatronSettings(
                  text.str(), *file, bridges::ShellEnvironment{script_args, ProcessEnvironment()})
            : bridges::ReadTorchtitanSettings(text.str(), *file);
    if (!settings.ok()) return settings.status();
    // Checked before the flags are set: "given" means on the command line.
    for (const auto& [flag, why] : settings->needs) {
      if (flags.Has(flag)) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          why, "; the plan needs it: give ",
          flag == "model" ? "--model NAME|PATH (the model's shape)" : absl::StrCat("--", flag),
          " on the command line"));
    }
    for (const auto& [flag, value] : settings->flags) {
      if (flags.Has(flag)) {
        std::fprintf(stderr, "note: %s sets --%s %s; the command line's --%s wins\n", file->c_str(),
                     flag.c_str(), value.c_str(), flag.c_str());
      } else if (!flags.SetDefault(flag, value)) {
        std::fprintf(stderr, "note: %s sets --%s, which this planner does not take\n",
                     file->c_str(), flag.c_str());
      } else {
        out.origins.insert({flag, settings->origins.contains(flag) ? settings->origins.at(flag)
                                                                   : absl::StrCat(*file)});
      }
    }
    if (megatron) {
      out.megatron_file = *file;
      for (const char* flag : kMegatronDefaultOnes) {
        if (!flags.Has(flag) && flags.SetDefault(flag, "1")) {
          out.origins.insert(
              {flag, absl::StrCat("Megatron's default (", *file, " does not set it)")});
        }
      }
      out.model_arguments = settings->model_arguments;
      out.job = settings->job;
      out.script_force = settings->script_force;
      out.script_policy = settings->script_policy;
    }
    for (const std::string& note : settings->notes) {
      std::fprintf(stderr, "note: %s\n", note.c_str());
    }
    if (settings->torchtitan_split.has_value()) out.torchtitan_split = settings->torchtitan_split;
  }
  return out;
}

absl::StatusOr<std::optional<planner::ModelConfig>> TrainerModel(const cli::FlagParser& flags,
                                                                 const TrainerInputs& trainer,
                                                                 std::vector<std::string>& notes) {
  if (!trainer.model_arguments.has_value() || flags.Has("model") || flags.Has("profile")) {
    if (trainer.model_arguments.has_value() && flags.Has("model")) {
      notes.push_back(absl::StrCat(trainer.megatron_file,
                                   " describes a model; --model on the command line wins"));
    }
    return std::nullopt;
  }
  auto tp = flags.GetInt("tp", 1, 1, planner::kMaxParallel);
  if (!tp.ok()) return tp.status();
  std::string origin;
  std::optional<int> vocab;
  if (flags.Has("vocab-size")) {
    auto v = flags.GetInt("vocab-size", 0, 1, planner::kMaxVocab);
    if (!v.ok()) return v.status();
    vocab = static_cast<int>(*v);
    origin = absl::StrCat("--vocab-size ", *vocab, " on the command line");
  } else {
    vocab = bridges::MegatronTokenizerVocab(*trainer.model_arguments, origin);
  }
  if (!vocab.has_value()) {
    auto said = [&](const char* name) {
      auto it = trainer.model_arguments->find(name);
      return it == trainer.model_arguments->end()
                 ? std::string()
                 : absl::StrCat(" --", name, " ", it->second.value_or(""));
    };
    return absl::InvalidArgumentError(absl::StrCat(
        trainer.megatron_file, ": the tokenizer's vocabulary is not known (",
        said("tokenizer-type").empty() && said("tokenizer-model").empty()
            ? "no --vocab-size or --tokenizer-type"
            : absl::StrCat("no --vocab-size;", said("tokenizer-type"), said("tokenizer-model")),
        "); give --vocab-size N (the tokenizer's size before Megatron pads it)"));
  }
  auto model = bridges::MegatronModel(*trainer.model_arguments, static_cast<int>(*tp), *vocab,
                                      trainer.megatron_file, notes);
  if (!model.ok()) return model.status();
  notes.push_back(absl::StrCat("the model its arguments describe: ", model->num_layers(),
                               " layers, hidden ", model->hidden, ", vocabulary ", model->vocab,
                               " (", origin, ", padded for TP ", *tp, "), ",
                               planner::ModelParameters(*model), " parameters"));
  return *std::move(model);
}

absl::Status CheckTrainerJob(const cli::FlagParser& flags, const TrainerInputs& trainer) {
  if (trainer.megatron_file.empty()) return absl::OkStatus();
  const planner::RunSettings defaults;
  auto from = [&](const char* flag) {
    // A value set from the file is a default of the parser; the command line's is given.
    const bool command_line = flags.Has(flag) && !trainer.origins.contains(flag);
    return Origin(flags, trainer, flag, command_line);
  };
  int64_t v[5] = {};
  const char* names[5] = {"gpus", "tp", "cp", "pp", "ep"};
  const int fallback[5] = {defaults.gpus, defaults.tp, defaults.cp, 1, defaults.ep};
  for (int k = 0; k < 5; ++k) {
    auto got = flags.GetInt(names[k], fallback[k], 1, planner::kMaxParallel);
    if (!got.ok()) return got.status();
    v[k] = *got;
  }
  const auto [gpus, tp, cp, pp, ep] = std::tuple(v[0], v[1], v[2], v[3], v[4]);
  const int64_t model_parallel = tp * cp * pp;
  if (gpus % model_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job runs ", gpus, " GPUs (", from("gpus"), ") but asks for TP ", tp, " (", from("tp"),
        ") x CP ", cp, " (", from("cp"), ") x PP ", pp, " (", from("pp"), ") = ", model_parallel,
        " GPUs per data-parallel replica; the GPUs must be a multiple of it"));
  }
  // Expert parallelism within one pipeline stage's GPUs (the planner's rule, RunSettings).
  if ((gpus / pp) % ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job runs ", gpus, " GPUs (", from("gpus"), ") over PP ", pp, " (",
                     from("pp"), "): ", gpus / pp, " GPUs per pipeline stage, which EP ", ep, " (",
                     from("ep"), ") does not divide"));
  }
  // Megatron-LM refuses MoE under TP without --sequence-parallel: Megatron-LM 0.16.1
  // megatron/training/yaml_arguments.py asserts "When using MoE and tensor parallelism, sequence
  // parallelism must be used.", and Megatron-Core 0.16.1 transformer/moe/moe_layer.py
  // MoELayer.forward raises a ValueError in training. A model from --model is checked by
  // planner::ValidateRun.
  const bool moe = trainer.model_arguments.has_value() && !flags.Has("model") &&
                   trainer.model_arguments->contains("num-experts");
  if (moe && tp > 1 && flags.GetBool("no-sequence-parallel")) {
    const auto& experts = trainer.model_arguments->at("num-experts");
    return absl::InvalidArgumentError(absl::StrCat(
        "the job trains a MoE model (--num-experts ", experts.value_or(""), ") under TP ", tp, " (",
        from("tp"), ") without --sequence-parallel (", from("no-sequence-parallel"),
        "); Megatron-LM refuses that (yaml_arguments.py: \"When using MoE and tensor "
        "parallelism, sequence parallelism must be used.\"; moe_layer.py MoELayer.forward); add "
        "--sequence-parallel to the script"));
  }
  return absl::OkStatus();
}

}  // namespace stowage::tools
