// Pipeline parallelism: which layers each stage runs, what each stage costs with the microbatches
// its schedule keeps in flight, and the step of the whole pipeline. Note [Pipeline] in
// pipeline.cc states the split, the memory and the step-time terms; the plan contract for stages
// is Note [Pipeline stages] in include/stowage/plan.h.
#ifndef STOWAGE_PLANNER_PIPELINE_H_
#define STOWAGE_PLANNER_PIPELINE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/communication.h"
#include "planner/cost/cost_model.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "planner/search/optimizer.h"
#include "planner/report/report.h"
#include "stowage/plan.h"

namespace stowage::planner {

// Checks the pipeline settings of `run` against each other and the model (errors name the flag,
// its value and the rule): --pp, --vpp only with --schedule interleaved (which needs --pp >= 2
// and --microbatches a multiple of --pp), --microbatches, and --pp-layout (one count per stage,
// or per virtual stage with --vpp, summing to the model's layers) or, without it, layers (with
// the embedding and loss when counted) dividing evenly over pp x vpp virtual stages.
absl::Status ValidatePipeline(const ModelConfig& model, const RunSettings& run);

// The layers of every virtual stage, in virtual-stage order (virtual stage v = chunk c of stage
// s, v = c x pp + s): --pp-layout, or Megatron-Core's even split, of the decoder layers; the
// last virtual stage also runs the TrainedMtpLayers after them (Note [MTP layers]). pp = 1: one
// range of every layer.
absl::StatusOr<std::vector<LayerRange>> VirtualStageLayers(const ModelConfig& model,
                                                           const RunSettings& run);
// Stage `stage`'s chunks (vpp of them) out of VirtualStageLayers.
std::vector<LayerRange> StageChunks(const std::vector<LayerRange>& virtual_stages, int pp, int vpp,
                                    int stage);

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
// the stage's chunks and its layers' compute); 0 without pipeline parallelism.
void ChargePointToPoint(const ModelConfig& model, const HardwareProfile& hw, const RunSettings& run,
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

// Plans every stage of `run` (pp >= 1) with Optimize, each within the same per-GPU budgets, and
// combines them into the step (Note [Pipeline]).
absl::StatusOr<PipelineResult> PlanPipeline(const ModelConfig& model, const HardwareProfile& hw,
                                            const RunSettings& run,
                                            const OptimizerOptions& options);

// The plan of a pipelined run: every layer with its stage's choices, one section per stage, the
// whole step's predictions (peak and host bytes: the binding stage's). Passes ValidatePlan.
Plan MakePipelinePlan(const PipelineResult& pipeline, const PlanLabels& labels);

// The per-stage table (layers, peaks, in-flight counts, time) and the lines the summary adds for
// the pipeline: the binding and the slowest stage, bubble and point-to-point time.
std::string RenderStageTable(const PipelineResult& pipeline, const Plan& plan);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_PIPELINE_H_
