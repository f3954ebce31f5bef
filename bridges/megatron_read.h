// Reading a Megatron-LM job's settings (`stowage plan --from-megatron FILE`): its launch
// arguments or YAML config as the planner's flags (bridges/trainer_settings.h), its pipeline
// split included.
#ifndef STOWAGE_BRIDGES_MEGATRON_READ_H_
#define STOWAGE_BRIDGES_MEGATRON_READ_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "bridges/shell_script.h"
#include "bridges/trainer_settings.h"

namespace stowage::bridges {

// Megatron-LM's --pipeline-model-parallel-layout (megatron/core/transformer/
// pipeline_parallel_layer_layout.py, parse_str_to_list: commas dropped, "(..)*N" and "x*N"
// unrolled, stages split at "|"): each virtual stage's layers in layer order, one character each
// (E embedding, t decoder layer, m MTP depth, L loss). Errors name the layout and the character.
absl::StatusOr<std::vector<std::string>> MegatronLayoutStages(std::string_view layout);

// A Megatron-LM argument list (as in a launch script: `--tensor-model-parallel-size 8 \`, `#`
// comments, `--name=value`) or a Megatron YAML config (block mappings of scalars, e.g.
// `tensor_model_parallel_size: 8` at any nesting; megatron/training/yaml_arguments.py's keys are
// the argument names with underscores). The pipeline split is read as Megatron derives it
// (arguments.py validate_args; transformer_block.py get_num_layers_to_build): the layout, or
// --decoder-first/last-pipeline-num-layers, with --num-virtual-stages-per-pipeline-rank or
// --num-layers-per-virtual-pipeline-stage for the model chunks. Errors name `source`, the line or
// the argument, its value and what is allowed.
absl::StatusOr<TrainerSettings> ReadMegatronSettings(std::string_view text,
                                                     std::string_view source);

// The same for a launch script (bridges/shell_script.h reads it without running it; the file
// is then the script, its positional parameters and environment those of `environment`): the
// training command's arguments, the GPUs its launcher starts (bridges/megatron_job.h), the model
// its arguments describe (TrainerSettings::model_arguments, for bridges/megatron_model.h), and
// what it leaves unresolved (TrainerSettings::needs when a flag depends on it, a note otherwise).
// A file with no Megatron argument at all is refused.
absl::StatusOr<TrainerSettings> ReadMegatronSettings(std::string_view text, std::string_view source,
                                                     const ShellEnvironment& environment);

}  // namespace stowage::bridges

#endif  // STOWAGE_BRIDGES_MEGATRON_READ_H_
