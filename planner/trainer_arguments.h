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

TrainerArguments MegatronArguments(const Plan& plan);

// The arguments one per line as a shell continuation, then the notes as comments.
std::string RenderMegatronArguments(const Plan& plan, const TrainerArguments& arguments);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_TRAINER_ARGUMENTS_H_
