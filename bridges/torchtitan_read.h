// Reading a torchtitan job config (`stowage plan --from-torchtitan FILE`): its .toml as the
// planner's flags (bridges/trainer_settings.h), and torchtitan's own split of the layers over
// the pipeline stages when the config lists no model parts.
#ifndef STOWAGE_BRIDGES_TORCHTITAN_READ_H_
#define STOWAGE_BRIDGES_TORCHTITAN_READ_H_

#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "bridges/trainer_settings.h"

namespace stowage::bridges {

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

}  // namespace stowage::bridges

#endif  // STOWAGE_BRIDGES_TORCHTITAN_READ_H_
