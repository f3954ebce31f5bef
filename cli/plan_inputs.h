// `stowage plan --from-megatron FILE [-- ARG...]` and `--from-torchtitan FILE`: the trainer's own
// configuration read into the planner's flags (a flag given on the command line wins), the model
// a Megatron-LM job's arguments describe, and the checks that combine what the file and the
// command line say, each naming where its numbers came from.
#ifndef STOWAGE_CLI_PLAN_INPUTS_H_
#define STOWAGE_CLI_PLAN_INPUTS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bridges/trainer_settings.h"
#include "cli/cli.h"
#include "planner/cost/run_settings.h"
#include "planner/model/model.h"

namespace stowage::tools {

struct TrainerInputs {
  std::optional<bridges::TorchtitanSplit> torchtitan_split;
  // --from-megatron: the file, the arguments of the model it describes, where each flag came
  // from, and the job as read (printed beside the plan).
  std::string megatron_file;
  std::optional<std::map<std::string, std::optional<std::string>>> model_arguments;
  std::map<std::string, std::string> origins;
  std::vector<std::string> job;
  // What the script recomputes today, as the --force policy that evaluates it
  // (bridges::TrainerSettings::script_force), and its arguments; empty when it recomputes nothing.
  std::string script_force;
  std::string script_policy;
};

// Reads --from-megatron and --from-torchtitan into `flags` (as defaults: the command line wins,
// with a note on stderr) and checks that every flag the file leaves unresolved is given.
// `script_args` are the words after `--`: the launch script's positional parameters. Errors name
// the file, the line and the flag that supplies what is missing.
absl::StatusOr<TrainerInputs> ReadTrainerInputs(cli::FlagParser& flags,
                                                const std::vector<std::string>& script_args);

// The model of the Megatron-LM arguments, when the file describes one and no --model is given;
// nullopt otherwise. The vocabulary is the tokenizer's (or --vocab-size), padded for --tp.
absl::StatusOr<std::optional<planner::ModelConfig>> TrainerModel(const cli::FlagParser& flags,
                                                                 const TrainerInputs& trainer,
                                                                 std::vector<std::string>& notes);

// The run against the launcher, before the planner's own checks: the GPUs must hold TP x CP x PP
// whole and each pipeline stage's GPUs EP whole, each number named with where it came from (the
// file's line, the command line, Megatron's or the planner's default); a MoE model the file
// describes under TP > 1 needs --sequence-parallel.
absl::Status CheckTrainerJob(const cli::FlagParser& flags, const TrainerInputs& trainer);

}  // namespace stowage::tools

#endif  // STOWAGE_CLI_PLAN_INPUTS_H_
