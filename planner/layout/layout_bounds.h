// The layout search's bounds (Note [Layout bounds] in layout_bounds.cc): what a layout's step
// costs before any stage is planned, from the step costs of some of its stages.
#ifndef STOWAGE_PLANNER_LAYOUT_LAYOUT_BOUNDS_H_
#define STOWAGE_PLANNER_LAYOUT_LAYOUT_BOUNDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/run_settings.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "planner/search/optimizer.h"

namespace stowage::planner {

struct LayoutBound {
  // No plan of the layout within the budgets steps faster than this.
  double step_seconds = 0;
  // Where fixed memory (weights, gradients, optimizer state, buffers) alone exceeds the GPU
  // budget, or the optimizer state alone the host budget, no plan fits: why ("" when none).
  std::string unfit;
  bool host = false;  // the host budget (else the GPU's) is what `unfit` names
};

// A stage's microbatch slot can be no shorter than its least compute: the embedding, LM head
// and loss, the once-per-step exposed collectives less the gradient reduction and optimizer
// copies the pipeline adds once, and each layer's cheapest option (keep, in one chunk).
double SlotLowerBound(const StepCost& step);

// The bound of `run` (valid: ValidateRun and ValidatePipeline pass) from the step costs of the
// stages BoundStages names.
absl::StatusOr<LayoutBound> BoundLayout(const ModelConfig& model, const HardwareProfile& hw,
                                        const RunSettings& run, const OptimizerOptions& options);

// The stages whose step costs bound a layout: all of them up to 4 stages, else the first two,
// the last two and the one with the most layers.
std::vector<int> BoundStages(const ModelConfig& model, const RunSettings& run);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_LAYOUT_LAYOUT_BOUNDS_H_
