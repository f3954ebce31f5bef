// The step's assembly: one pipeline stage's StepCost built from the model, the hardware and the
// run by the framework recipe the run names (megatron.h, hf.h), with the stage's collectives
// (planner/cost/communication.h) and host-link rates.
#ifndef STOWAGE_PLANNER_FRAMEWORKS_STEP_COST_H_
#define STOWAGE_PLANNER_FRAMEWORKS_STEP_COST_H_

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/run_settings.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"

namespace stowage::planner {

// One pipeline stage's step (run.pp = 1: the whole model; planner/search/pipeline.h): that stage's
// layers (LayerCost::index is the model's layer index; in_flight_microbatches the schedule's),
// their weights, gradients and optimizer state sharded over the stage's data-parallel group, the
// embedding on stage 0 and the final norm, LM head and loss on the last stage.
absl::StatusOr<StepCost> BuildStepCost(const ModelConfig& model, const HardwareProfile& hardware,
                                       const RunSettings& run, int stage = 0);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_FRAMEWORKS_STEP_COST_H_
