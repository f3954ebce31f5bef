// A plan in the words of the trainer a user already runs (`stowage plan --emit megatron`): the
// settings that carry the plan out as far as that trainer can express it, and, in plain words,
// the per-layer choices it cannot (those need the stowage runtime).
//
// Note [Megatron expressiveness]. Megatron-LM (megatron/core/transformer/transformer_config.py,
// TransformerConfig.__post_init__, at the commit tests/data/megatron-lm-arguments.json names)
// chooses per job, not per layer:
//   * recompute granularity is one for all layers: `full` (the layer's input is kept, everything
//     else recomputed) or `selective` (the listed submodules of every layer recomputed);
//   * full recompute covers every layer (`--recompute-method uniform --recompute-num-layers 1`)
//     or the first K layers of each pipeline stage (`--recompute-method block`);
//   * CPU offloading (`--cpu-offloading-num-layers N`) offloads the activations of the first N
//     layers, and is refused together with recompute or with pipeline parallelism;
//   * nothing offloads a layer's input while recomputing the rest (stowage's offload_input).
// So a plan maps exactly when its recompute set is all layers or a prefix, or its selective
// modules are the same on every layer, or its offload_saved layers are a prefix with no
// recompute; otherwise the emitted arguments are the nearest Megatron can run and the notes
// say what differs and which way the memory moves.
#ifndef STOWAGE_PLANNER_TRAINER_ARGUMENTS_H_
#define STOWAGE_PLANNER_TRAINER_ARGUMENTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "stowage/plan.h"

namespace stowage::planner {

struct TrainerArguments {
  // Command-line tokens, e.g. {"--tensor-model-parallel-size", "2", "--sequence-parallel"}.
  std::vector<std::string> args;
  // What the trainer cannot express, one sentence each; empty when the arguments carry the
  // whole plan.
  std::vector<std::string> notes;
  bool exact() const { return notes.empty(); }
};

// Note [Megatron under pipeline parallelism]. With pp > 1 (megatron/core/recompute.py
// checkpointed_forward; transformer_block.py builds one TransformerBlock per model chunk, whose
// num_layers_per_pipeline_rank is len(self.layers), that chunk's layers) the settings above apply
// per model chunk (virtual stage), all chunks alike:
//   * --recompute-method block --recompute-num-layers K recomputes the first min(K, its layers)
//     layers of every chunk of every stage; uniform with K = 1 every layer;
//   * --recompute-granularity selective recomputes the same --recompute-modules in every layer;
//   * --cpu-offloading-num-layers is refused with pipeline parallelism (TransformerConfig.
//     __post_init__); fine-grained activation offloading (--fine-grained-activation-offloading
//     --offload-modules) is allowed with it but offloads the chosen modules' inputs in every
//     layer, not chosen layers, so it carries no per-layer offload either.
// So a pipelined plan is expressed exactly when its recompute choices follow one of these on
// every chunk; its offload choices become the notes they are without pipelining (recompute with
// the input kept; keep). Otherwise MegatronArguments refuses, naming the stage and the layer that
// breaks the setting: such a plan needs the stowage runtime, which carries per-layer plans. The
// split is --pipeline-model-parallel-size with --num-virtual-stages-per-pipeline-rank when every
// virtual stage holds as many layers (Megatron's even split), else
// --pipeline-model-parallel-layout (pipeline_parallel_layer_layout.py: "E", "t", "m", "L" per
// virtual stage, "|" between them), which gives any split; the microbatches per step are
// --global-batch-size / (--micro-batch-size x data parallel). Megatron runs the interleaved
// schedule exactly when there are virtual stages, with groups of pp microbatches per chunk (the
// default --microbatch-group-size-per-virtual-pipeline-stage), as the plan's in-flight counts do.
//
// `run` gives what the plan does not carry: the GPUs (data parallel, for --global-batch-size).
// INVALID_ARGUMENT, only for a pipelined plan, naming the stage and layer as above.
absl::StatusOr<TrainerArguments> MegatronArguments(const Plan& plan, const RunSettings& run);

// The arguments one per line as a shell continuation, then the notes as comments.
std::string RenderMegatronArguments(const Plan& plan, const TrainerArguments& arguments);

// Note [torchtitan expressiveness]. torchtitan (the release scripts/setup-deps pins, 0.2.2:
// torchtitan/config/job_config.py for the names, torchtitan/distributed/activation_checkpoint.py
// for what they do) chooses activation checkpointing per job, from `[activation_checkpoint]`:
//   * mode "none": every block keeps its activations; "full": every block is checkpointed (its
//     input kept, the rest recomputed: stowage's recompute);
//   * mode "selective" with selective_ac_option "<N>": the blocks whose 1-based position is a
//     multiple of N are checkpointed in full (_apply_layer_sac counts from 1), i.e. layers
//     N-1, 2N-1, ... of the model; "op": every block under an op-level policy (the outputs of
//     matmuls, except every second one, and of attention are saved, the rest recomputed), which
//     is not a choice of modules;
//   * mode "memory_budget": the compiler's partitioner trades memory for compute.
// Nothing offloads activations to host memory per layer. So a plan maps exactly when it keeps
// every layer, recomputes every layer, or recomputes exactly every N-th; otherwise the config is
// the nearest one whose memory is not above the plan's (a superset of its recomputed layers:
// every N-th for the largest N that covers them, else full), and the notes say what differs.
// Parallel sizes are `[parallelism]`'s degrees (FSDP over data_parallel_shard_degree, which with
// CP > 1 spans the CP ranks too), sequence length and micro-batch `[training]`'s.
struct TomlEntry {
  std::string section;  // "parallelism"
  std::string key;      // "tensor_parallel_degree"
  std::string value;    // a TOML literal: 8, "full", true
};

struct TrainerConfig {
  std::vector<TomlEntry> entries;  // grouped by section, in the order they are written
  std::vector<std::string> notes;  // what torchtitan cannot express, one sentence each
};

//
// Note [torchtitan under pipeline parallelism]. With pp > 1 (torchtitan/distributed/
// pipeline_parallel.py of 0.2.2: pipeline_llm, pipeline_module_split) each rank builds its model
// parts, the virtual stages pp_rank, pp_rank + pp, ... ("loop" style, Megatron's order), from
// `[parallelism] module_fqns_per_model_part` (which gives any split: emitted from the plan's
// stages, "tok_embeddings" on the first part, "norm" and "output" on the last), and applies
// parallelize_fn, apply_ac with it, to each part in that order. _apply_layer_sac counts blocks in
// a process-wide counter (_layer_sac_count), so selective_ac_option "<N>" checkpoints the blocks
// whose 1-based position among the rank's own blocks, over its parts in order, is a multiple of N:
// positions per stage, not the model's layer ids. So a pipelined plan is expressed exactly when
// it keeps every layer, recomputes every layer, or recomputes on every stage exactly its every
// N-th block for one N; otherwise TorchtitanConfig refuses, naming the stage and the layer that
// breaks it (the stowage runtime carries per-layer plans). The schedule is "1F1B" or
// "Interleaved1F1B" (torch.distributed.pipelining's, which hold Megatron's in-flight counts when
// the microbatches are a multiple of pp, as the planner requires), the microbatches
// local_batch_size / pipeline_parallel_microbatch_size (build_pipeline_schedule). Without
// pipeline parallelism several microbatches are gradient accumulation: global_batch_size =
// local_batch_size x data parallel x microbatches (train.py).
//
// `run` gives what the plan does not carry: the GPUs (data parallel), the sharding, the optimizer.
// INVALID_ARGUMENT, only for a pipelined plan, naming the stage and layer as above.
absl::StatusOr<TrainerConfig> TorchtitanConfig(const Plan& plan, const RunSettings& run);

// The sections as TOML (to merge into a torchtitan job .toml), then the notes as
// `# not expressed:` comments.
std::string RenderTorchtitanConfig(const Plan& plan, const TrainerConfig& config);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_TRAINER_ARGUMENTS_H_
