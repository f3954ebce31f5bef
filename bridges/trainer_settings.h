// What reading a trainer's own configuration gives (`stowage plan --from-megatron FILE`,
// `--from-torchtitan FILE`; bridges/megatron_read.h, bridges/torchtitan_read.h): the settings the
// planner has a flag for, in that flag's words, plus notes on what the file says that the planner
// does not take (recompute and offload settings are what stowage chooses per layer); for a
// Megatron-LM job also the model its arguments describe and what the file leaves unresolved.
#ifndef STOWAGE_BRIDGES_TRAINER_SETTINGS_H_
#define STOWAGE_BRIDGES_TRAINER_SETTINGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace stowage::bridges {

// torchtitan's own split of the decoder layers over its pipeline stages, used when the job config
// lists no model part's modules (torchtitan/distributed/pipeline_parallel.py of 0.2.2,
// pipeline_llm and generate_llm_fqn_per_model_part). It counts the model's layers, which come
// from --model, so `stowage plan` resolves it with TorchtitanStageLayers (bridges/
// torchtitan_read.h) once the model is read.
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
  // Megatron-LM: every argument of a job whose arguments describe a model (--num-layers,
  // --hidden-size, --num-attention-heads), for bridges::MegatronModel once the tensor parallel
  // size and the vocabulary are settled.
  std::optional<std::map<std::string, std::optional<std::string>>> model_arguments;
  // Where a flag's value came from ("train.sh:77: --tensor-model-parallel-size 8"), for the
  // messages of checks that combine them.
  std::map<std::string, std::string> origins;
  // Flags the file leaves unresolved (its value depends on what stowage cannot know): (flag,
  // why); an error unless the command line gives the flag.
  std::vector<std::pair<std::string, std::string>> needs;
  // The job as read: launcher, GPUs, precision, batch, what it recomputes or offloads.
  std::vector<std::string> job;
  // What the job recomputes today as the uniform --force policy that evaluates it ("recompute",
  // "selective_recompute"; empty when it recomputes nothing), and the arguments that say so
  // ("--recompute-granularity selective, --recompute-modules mlp"): `stowage plan` evaluates it
  // beside the plan.
  std::string script_force;
  std::string script_policy;
};

}  // namespace stowage::bridges

#endif  // STOWAGE_BRIDGES_TRAINER_SETTINGS_H_
