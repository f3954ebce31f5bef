// Run settings from the trainer's own configuration (`stowage plan --from-megatron FILE`): the
// settings the planner has a flag for, in that flag's words, plus notes on what the file says
// that the planner does not take (the model's shape comes from --model; recompute and offload
// settings are what stowage chooses per layer).
#ifndef STOWAGE_TOOLS_TRAINER_CONFIG_H_
#define STOWAGE_TOOLS_TRAINER_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace stowage::tools {

// torchtitan's own split of the decoder layers over its pipeline stages, used when the job config
// lists no model part's modules (torchtitan/distributed/pipeline_parallel.py of 0.2.2,
// pipeline_llm and generate_llm_fqn_per_model_part). It counts the model's layers, which come
// from --model, so `stowage plan` resolves it with TorchtitanStageLayers once the model is read.
struct TorchtitanSplit {
  std::string source;                       // the job config, for errors
  std::optional<int64_t> layers_per_stage;  // parallelism.pipeline_parallel_layers_per_stage
  int64_t first_stage_less_layers = 1;      // the embedding, counted as this many layers
  int64_t last_stage_less_layers = 1;       // norm and output, counted as this many layers
};

struct TrainerSettings {
  std::vector<std::pair<std::string, std::string>> flags;  // ("tp", "8"), ("sharding", "optim")
  std::vector<std::string> notes;
  std::optional<TorchtitanSplit> torchtitan_split;  // a pipelined job without its stages listed
};

// The stages and their layers as `stowage plan --vpp` and `--pp-layout` say them: model chunks per
// rank and the decoder layers of each virtual stage, in layer order.
struct StageLayers {
  int vpp = 1;
  std::vector<int> layers;
};

// torchtitan's split of `num_layers` decoder layers over `pp` ranks: pipeline_llm's virtual stages
// (ceil((layers + first + last weight) / layers_per_stage), else one per rank for a single-stage
// schedule and two for a multi-stage one; `vpp`, when the command line gives it, instead) and
// generate_llm_fqn_per_model_part's layers per stage. Errors are torchtitan's own refusals, naming
// the job config's key and value.
absl::StatusOr<StageLayers> TorchtitanStageLayers(const TorchtitanSplit& split, int num_layers,
                                                  int pp, bool multi_stage, std::optional<int> vpp);

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

// A torchtitan job config (.toml; torchtitan/config/job_config.py of the release scripts/setup-deps
// pins, 0.2.2): [parallelism] degrees (data parallel x CP x TP x PP -> --gpus when the shard
// degree is not -1; FSDP -> --sharding), the pipeline schedule and microbatch size, [training]
// seq_len, local_batch_size and global_batch_size, enable_cpu_offload, [optimizer] name and
// [model] name/flavor where a preset has that shape, and under PP the stages: the model parts'
// modules (module_fqns_per_model_part), else torchtitan's own split (`torchtitan_split`). What
// else it sets is named in notes
// (activation checkpointing: stowage's choice, with the --force that evaluates it). Errors name
// `source`, the key (its line for syntax errors), its value and what is allowed.
absl::StatusOr<TrainerSettings> ReadTorchtitanSettings(std::string_view text,
                                                       std::string_view source);

}  // namespace stowage::tools

#endif  // STOWAGE_TOOLS_TRAINER_CONFIG_H_
