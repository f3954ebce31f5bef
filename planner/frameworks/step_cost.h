// The step's assembly: one pipeline stage's StepCost built from the model, the hardware and the
// run by the framework recipe the run names (megatron.h, hf.h), with the stage's collectives
// (planner/cost/communication.h) and host-link rates.
#ifndef STOWAGE_PLANNER_FRAMEWORKS_STEP_COST_H_
#define STOWAGE_PLANNER_FRAMEWORKS_STEP_COST_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/run_settings.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"

namespace stowage::planner {

// PyTorch's cuBLAS workspaces, held from the first GEMM on each thread to the end of the process:
// one per (handle, stream), the forward on the Python thread's handle, the backward on the
// autograd engine's device thread with its own, each 32 MiB on sm90+, every preset's GPU (torch
// 2.11 aten/src/ATen/cuda/CublasHandlePool.cpp, getChosenWorkspaceSize). Fixed memory of every
// step the recipes count (hf: Note [hf profile] in hf_layer.h; megatron: Note [GEMM workspaces]
// in megatron.cc); the Python measurement adds the same to a profile
// (TORCH_CUBLAS_WORKSPACES_BYTES, python/stowage/measure/layer_profile.py).
inline constexpr uint64_t kTorchCublasWorkspacesBytes = 2 * (uint64_t{32} << 20);

// One pipeline stage's step (run.pp = 1: the whole model; planner/search/pipeline.h): that stage's
// layers (LayerCost::index is the model's layer index; in_flight_microbatches the schedule's),
// their weights, gradients and optimizer state sharded over the stage's data-parallel group, the
// embedding on stage 0 and the final norm, LM head and loss on the last stage.
absl::StatusOr<StepCost> BuildStepCost(const ModelConfig& model, const HardwareProfile& hardware,
                                       const RunSettings& run, int stage = 0);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_FRAMEWORKS_STEP_COST_H_
