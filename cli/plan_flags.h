// The run flags of `stowage plan` read into a model, hardware, run settings and budgets: shared by
// `stowage plan` (plan_command.cc) and `stowage search` (search_command.cc), which take the same
// flags for everything but the layout.
#ifndef STOWAGE_CLI_PLAN_FLAGS_H_
#define STOWAGE_CLI_PLAN_FLAGS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bridges/torchtitan_read.h"
#include "cli/cli.h"
#include "cli/plan_inputs.h"
#include "planner/cost/run_settings.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "planner/search/optimizer.h"

namespace stowage::tools {

// A --model or --hardware value that names a file rather than a preset.
bool LooksLikePath(const std::string& s);

struct Inputs {
  planner::ModelConfig model;
  planner::HardwareProfile hardware;
  planner::RunSettings run;
  planner::OptimizerOptions options;
  std::string model_label, hardware_label;
  std::vector<std::string> model_notes;  // what the config reader wants the user to know
};

// --force (a policy's own name) and --optimality-gap into `options`.
absl::Status ReadForce(const cli::FlagParser& flags, planner::OptimizerOptions& options);

// --pp, --vpp, --schedule, --rank-order, --microbatches or --global-batch, --pp-layout and
// Megatron's two accounting switches into `r` (whose tp, cp and gpus are read already).
absl::Status ReadPipeline(const cli::FlagParser& flags, int num_layers,
                          const std::optional<bridges::TorchtitanSplit>& torchtitan_split,
                          planner::RunSettings& r);

// --model, --hardware, the run settings (framework defaults first), the budgets and --force:
// every flag of `stowage plan` but --profile and the outputs. Flags not given take their
// defaults; the run is not validated here (planner::ValidateRun, ValidatePipeline are).
// `trainer` is what --from-megatron / --from-torchtitan read (empty without them): the model a
// Megatron-LM job's arguments describe when no --model is given, a torchtitan job's stage split.
absl::StatusOr<Inputs> ReadInputs(const cli::FlagParser& flags, const TrainerInputs& trainer);

}  // namespace stowage::tools

#endif  // STOWAGE_CLI_PLAN_FLAGS_H_
