// A plan in the words of Megatron-LM, for a user who already runs it (`stowage plan --emit
// megatron`): the arguments that carry the plan out as far as Megatron can express it, and, in
// plain words, the per-layer choices it cannot (those run under stowage.megatron). The torchtitan
// counterpart is bridges/torchtitan_emit.h; reading a Megatron job is bridges/megatron_read.h.
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
#ifndef STOWAGE_BRIDGES_MEGATRON_EMIT_H_
#define STOWAGE_BRIDGES_MEGATRON_EMIT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "stowage/plan.h"

namespace stowage::bridges {

// The Megatron-LM arguments a plan is emitted as (what `--emit megatron` prints).
struct MegatronArguments {
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
// the input kept; keep). Otherwise EmitMegatronArguments refuses, naming the stage and the layer
// that breaks the setting: such a plan runs under the Python module stowage.megatron, which runs
// each TransformerLayer under its own policy.
// The split is --pipeline-model-parallel-size with --num-virtual-stages-per-pipeline-rank when
// every virtual stage holds as many layers (Megatron's even split), else
// --pipeline-model-parallel-layout (pipeline_parallel_layer_layout.py: "E", "t", "m", "L" per
// virtual stage, "|" between them), which gives any split; the microbatches per step are
// --global-batch-size / (--micro-batch-size x data parallel). Megatron runs the interleaved
// schedule exactly when there are virtual stages, with groups of pp microbatches per chunk (the
// default --microbatch-group-size-per-virtual-pipeline-stage), as the plan's in-flight counts do.
//
// `run` gives what the plan does not carry: the GPUs (data parallel, for --global-batch-size).
// INVALID_ARGUMENT, only for a pipelined plan, naming the stage and layer as above.
absl::StatusOr<MegatronArguments> EmitMegatronArguments(const Plan& plan,
                                                        const planner::RunSettings& run);

// The arguments one per line as a shell continuation, then the notes as comments.
std::string RenderMegatronArguments(const Plan& plan, const MegatronArguments& arguments);

}  // namespace stowage::bridges

#endif  // STOWAGE_BRIDGES_MEGATRON_EMIT_H_
