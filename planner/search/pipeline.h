// Pipeline parallelism: what each stage costs with the microbatches its schedule keeps in flight,
// each stage planned, and the step of the whole pipeline (which layers each stage runs:
// planner/cost/pipeline_layout.h; the plan and the table: planner/report/pipeline_report.h).
// Note [Pipeline] in pipeline.cc states the split, the memory and the step-time terms; the plan
// contract for stages is Note [Pipeline stages] in include/stowage/plan.h.
#ifndef STOWAGE_PLANNER_SEARCH_PIPELINE_H_
#define STOWAGE_PLANNER_SEARCH_PIPELINE_H_

#include <functional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/communication.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/run_settings.h"
#include "planner/frameworks/layer_profile.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "planner/search/baseline.h"
#include "planner/search/optimizer.h"
#include "planner/search/simulator.h"
#include "stowage/plan.h"

namespace stowage::planner {

// One stage planned: its step cost (its layers, each with its in-flight count), the optimizer's
// schedule for it, and what it is compared with.
struct StageResult {
  int stage = 0;
  std::vector<LayerRange> chunks;
  StepCost step;
  OptimizeResult result;
  Baseline baseline;
  // Point-to-point time per microbatch on the stage's critical path (Note [Pipeline]): with
  // every exchange waited for (1F1B throughout; the interleaved fill and drain), and in the
  // interleaved steady state, where each exchange runs behind another chunk's pass.
  double p2p_blocking_seconds = 0;
  double p2p_steady_seconds = 0;
  CommLink p2p_link = CommLink::kNone;  // the slowest link its messages cross
};

// One stage's slot: its simulated forward and backward of one microbatch, without what runs once
// per step (the optimizer offload's copies, the DP gradient reduction) or point-to-point time.
double MicrobatchSeconds(const StepCost& step, const SimResult& sim);

// The point-to-point messages of stage `step.stage` of `run` (p2p_* fields of StageResult, from
// the stage's chunks and its layers' compute), each `message_bytes` one way (a model's:
// PipelineMessageBytes; a profile's: ProfileMessageBytes); 0 without pipeline parallelism.
void ChargePointToPoint(double message_bytes, const HardwareProfile& hw, const RunSettings& run,
                        StageResult& stage);

struct PipelineResult {
  std::vector<StageResult> stages;
  bool feasible = false;  // every stage fits its budgets
  int binding_stage = 0;  // the stage whose peak is highest (infeasible: the first that fails)
  // The stage whose steady-state slot (microbatch + point-to-point) is longest.
  int slowest_stage = 0;
  double microbatch_seconds = 0;  // the slowest stage's forward + backward of one microbatch
  // The slowest stage's point-to-point per microbatch in the steady state.
  double p2p_seconds = 0;
  // One slot of the fill and drain: the longest microbatch + blocking point-to-point of any
  // stage (1F1B: microbatch_seconds + p2p_seconds).
  double bubble_slot_seconds = 0;
  double p2p_message_bytes = 0;         // one message, one way (PipelineMessageBytes)
  CommLink p2p_link = CommLink::kNone;  // the slowest link a stage boundary crosses
  double p2p_step_seconds = 0;          // the step's exposed point-to-point time
  double once_seconds = 0;    // once per step: optimizer offload copies, DP gradient reduction
  double bubble_seconds = 0;  // the pipeline's fill and drain
  double step_seconds = 0;
  double baseline_step_seconds = 0;  // the same pipeline with every stage at its baseline
};

// How one stage's schedule is chosen: Optimize(step, options) when planning, or a given
// assignment simulated when evaluating one (planner/request/plan_request.h). Empty: Optimize.
using StageScheduler = std::function<OptimizeResult(const StepCost& step)>;

// Combines the stages of `run` (their step costs in stage order, each scheduled by `schedule`)
// into the step (Note [Pipeline]): the binding and the slowest stage, the point-to-point time of
// `message_bytes` messages, the fill and drain, the once-per-step part and the baseline step
// (each stage's ComputeBaseline under options.gpu_budget_bytes). The one computation for a model's
// stages and a profile's.
absl::StatusOr<PipelineResult> PlanStages(std::vector<StepCost> stages, const HardwareProfile& hw,
                                          const RunSettings& run, double message_bytes,
                                          const OptimizerOptions& options,
                                          const StageScheduler& schedule = {});

// Plans every stage of `run` (pp >= 1) with Optimize, each within the same per-GPU budgets, and
// combines them into the step (Note [Pipeline]).
absl::StatusOr<PipelineResult> PlanPipeline(const ModelConfig& model, const HardwareProfile& hw,
                                            const RunSettings& run,
                                            const OptimizerOptions& options);
// The same for a measured profile's stages with `microbatches` per step (a pipelined profile's
// pipeline; without one, gradient accumulation over one stage): Note [Pipelined profiles] in
// planner/frameworks/layer_profile.cc. Errors name `field` for the microbatches.
absl::StatusOr<PipelineResult> PlanPipeline(const LayerProfileSet& profile,
                                            const HardwareProfile& hw, int microbatches,
                                            const OptimizerOptions& options,
                                            std::string_view field = "microbatches");

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_SEARCH_PIPELINE_H_
