// A plan in the words of torchtitan, for a user who already runs it (`stowage plan --emit
// torchtitan`): job config sections that carry the plan out as far as torchtitan can express it,
// and, in plain words, the per-layer choices it cannot (those need the stowage runtime). The
// Megatron-LM counterpart is bridges/megatron_emit.h; reading a torchtitan job is
// bridges/torchtitan_read.h.
#ifndef STOWAGE_BRIDGES_TORCHTITAN_EMIT_H_
#define STOWAGE_BRIDGES_TORCHTITAN_EMIT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "stowage/plan.h"

namespace stowage::bridges {

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

// The torchtitan job config a plan is emitted as (what `--emit torchtitan` prints).
struct TorchtitanJobToml {
  std::vector<TomlEntry> entries;  // grouped by section, in the order they are written
  std::vector<std::string> notes;  // what torchtitan cannot express, one sentence each
};

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
// N-th block for one N; otherwise EmitTorchtitanJob refuses, naming the stage and the layer that
// breaks it (the stowage runtime carries per-layer plans). The schedule is "1F1B" or
// "Interleaved1F1B" (torch.distributed.pipelining's, which hold Megatron's in-flight counts when
// the microbatches are a multiple of pp, as the planner requires), the microbatches
// local_batch_size / pipeline_parallel_microbatch_size (build_pipeline_schedule). Without
// pipeline parallelism several microbatches are gradient accumulation: global_batch_size =
// local_batch_size x data parallel x microbatches (train.py).
//
// `run` gives what the plan does not carry: the GPUs (data parallel), the sharding, the optimizer.
// INVALID_ARGUMENT, only for a pipelined plan, naming the stage and layer as above.
absl::StatusOr<TorchtitanJobToml> EmitTorchtitanJob(const Plan& plan,
                                                    const planner::RunSettings& run);

// The sections as TOML (to merge into a torchtitan job .toml), then the notes as
// `# not expressed:` comments.
std::string RenderTorchtitanJob(const Plan& plan, const TorchtitanJobToml& job);

}  // namespace stowage::bridges

#endif  // STOWAGE_BRIDGES_TORCHTITAN_EMIT_H_
