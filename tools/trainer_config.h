// Run settings from the trainer's own configuration (`stowage plan --from-megatron FILE`): the
// settings the planner has a flag for, in that flag's words, plus notes on what the file says
// that the planner does not take (the model's shape comes from --model; recompute and offload
// settings are what stowage chooses per layer).
#ifndef STOWAGE_TOOLS_TRAINER_CONFIG_H_
#define STOWAGE_TOOLS_TRAINER_CONFIG_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace stowage::tools {

struct TrainerSettings {
  std::vector<std::pair<std::string, std::string>> flags;  // ("tp", "8"), ("sharding", "optim")
  std::vector<std::string> notes;
};

// A Megatron-LM argument list (as in a launch script: `--tensor-model-parallel-size 8 \`, `#`
// comments, `--name=value`) or a Megatron YAML config (block mappings of scalars, e.g.
// `tensor_model_parallel_size: 8` at any nesting; megatron/training/yaml_arguments.py's keys are
// the argument names with underscores). Errors name `source`, the line and what was expected.
absl::StatusOr<TrainerSettings> ReadMegatronSettings(std::string_view text,
                                                     std::string_view source);

// A torchtitan job config (.toml; torchtitan/config/job_config.py of the release tools/setup-deps
// pins, 0.2.2): [parallelism] degrees (data parallel x CP x TP x PP -> --gpus when the shard
// degree is not -1; FSDP -> --sharding), the pipeline schedule and microbatch size, [training]
// seq_len, local_batch_size and global_batch_size, enable_cpu_offload, [optimizer] name and
// [model] name/flavor where a preset has that shape. What else it sets is named in notes
// (activation checkpointing: stowage's choice, with the --force that evaluates it). Errors name
// `source`, the key (its line for syntax errors), its value and what is allowed.
absl::StatusOr<TrainerSettings> ReadTorchtitanSettings(std::string_view text,
                                                       std::string_view source);

}  // namespace stowage::tools

#endif  // STOWAGE_TOOLS_TRAINER_CONFIG_H_
