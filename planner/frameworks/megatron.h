// The `megatron` framework recipe: what a Megatron-Core layer with TransformerEngine kernels
// keeps for backward and spends in one training step on one rank, counted from the model's
// shapes, the run's parallelism and the hardware's rates (Note [Cost model] and
// Note [megatron profile] in megatron.cc), its multi-token-prediction layers (Note [MTP layers]),
// and the step's fixed memory, LM head and loss and embedding, which the hf recipe adjusts.
#ifndef STOWAGE_PLANNER_FRAMEWORKS_MEGATRON_H_
#define STOWAGE_PLANNER_FRAMEWORKS_MEGATRON_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/run_settings.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"

namespace stowage::planner {

// Decoder layer `index` of `model` under the megatron recipe (tokens: per rank). Errors name a
// tensor beyond kMaxTensorBytes and the inputs it grows with (Note [Limits] in
// planner/cost/cost_model.cc).
absl::StatusOr<LayerCost> BuildMegatronLayer(const ModelConfig& model,
                                             const HardwareProfile& hardware,
                                             const RunSettings& run, int index, double tokens);

// Multi-token-prediction depth `depth` (Note [MTP layers] in megatron.cc): layer index
// model.num_layers() + depth, named MtpLayerName(depth).
absl::StatusOr<LayerCost> BuildMegatronMtpLayer(const ModelConfig& model,
                                                const HardwareProfile& hardware,
                                                const RunSettings& run, int depth, double tokens);

// The step-level counts of `step` (its stage, tokens_per_rank, mtp_layers and layers set): the
// fixed memory of the stage's layers and StageNonLayerParams (weights, gradients and optimizer
// state sharded by --sharding over the stage's data-parallel group, the optimizer state in host
// memory under --optimizer-offload, the sharding's communication buffers), and the final norm, LM
// head and loss with the MTP heads (the tail) and the embedding, which BuildStepCost keeps on the
// last and the first stage. Under hf, ApplyHfStep and ApplyHfDataParallel adjust them. Errors
// name a count beyond kMaxTensorBytes.
absl::Status ApplyMegatronStep(const ModelConfig& model, const HardwareProfile& hardware,
                               const RunSettings& run, StepCost& step);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_FRAMEWORKS_MEGATRON_H_
