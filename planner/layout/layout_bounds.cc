#include "planner/layout/layout_bounds.h"

#include <algorithm>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "planner/cost/pipeline_layout.h"
#include "planner/frameworks/step_cost.h"
#include "planner/search/pipeline.h"

namespace stowage::planner {

// Note [Layout bounds]
// Two bounds let the layout search (layout_search.cc) skip planning most layouts; both hold for
// every plan the optimizer could choose, so a layout they rule out is one PlanPipeline would
// rank lower or find unfit (tests/planner/layout/layout_search_test.cc checks both against
// full planning).
//  - Fixed memory alone. The simulator's peak counts StepCost::fixed.total() at every moment
//    (simulator.cc) and its host bytes the optimizer state in host memory
//    (optimizer_host_bytes): where either exceeds its budget on any stage, no option of any layer
//    fits.
//  - Compute-only step time. The simulator's step is at least the embedding, LM head and loss,
//    the optimizer copies, the once-per-step exposed collectives and every layer's forward,
//    recompute and backward with their exposed communication (EvaluateOption's compute_seconds),
//    run one after another; the optimizer's own bound counts the same (bound_model.cc). Each
//    layer's cheapest option (keep, one chunk: nothing recomputed, no chunk overhead) bounds what
//    any plan spends on it, so the stage's microbatch slot
//    (pipeline.cc MicrobatchSeconds: the step less the optimizer copies and the gradient
//    reduction) is at least SlotLowerBound. Point-to-point time and the once-per-step part
//    depend on the layout only (ChargePointToPoint, the step cost), not on the plan. Pipeline.cc
//    takes the longest slot of any stage: the longest bound over any subset of stages is below
//    it, so bounding only some stages (BoundStages) stays valid:
//      step >= M x max_s(slot_s + p2p steady_s) + (p - 1) / vpp x max_s(slot_s + p2p blocking_s)
//              + max_s(once_s).
//    It leaves out what memory costs (recompute, copy waits), so it is tight where the
//    activations fit and loose at long sequences; the search plans in order of it and stops
//    once it exceeds the steps already found.
double SlotLowerBound(const StepCost& step) {
  double seconds = step.embedding_seconds + step.tail_seconds + step.optimizer_copy_seconds +
                   step.comm.step_exposed_seconds;
  // EvaluateOption's compute of any option is the pass times with their exposed communication,
  // plus what it adds: (chunks - 1) x chunk_overhead_seconds per pass and a recompute, each
  // non-negative (CheckStepCostBounds). Keep in one chunk adds neither: it is the least.
  for (const LayerCost& layer : step.layers) {
    seconds += layer.forward_seconds + layer.forward_comm_seconds + layer.backward_seconds +
               layer.backward_comm_seconds;
  }
  return std::max(0.0,
                  seconds - step.optimizer_copy_seconds - step.comm.gradient_sync_exposed_seconds);
}

std::vector<int> BoundStages(const ModelConfig& model, const RunSettings& run) {
  std::vector<int> all;
  if (run.pp <= 4) {
    for (int s = 0; s < run.pp; ++s) all.push_back(s);
    return all;
  }
  std::set<int> stages = {0, 1, run.pp - 2, run.pp - 1};
  auto virtual_stages = VirtualStageLayers(model, run);
  if (virtual_stages.ok()) {
    int most = -1, heaviest = 0;
    for (int s = 0; s < run.pp; ++s) {
      int layers = 0;
      for (const LayerRange& r : StageChunks(*virtual_stages, run.pp, run.vpp, s)) {
        layers += r.num_layers;
      }
      if (layers > most) {
        most = layers;
        heaviest = s;
      }
    }
    stages.insert(heaviest);
  }
  return {stages.begin(), stages.end()};
}

absl::StatusOr<LayoutBound> BoundLayout(const ModelConfig& model, const HardwareProfile& hw,
                                        const RunSettings& run, const OptimizerOptions& options) {
  LayoutBound out;
  double steady = 0, blocking = 0, once = 0;
  for (int s : BoundStages(model, run)) {
    absl::StatusOr<StepCost> step = BuildStepCost(model, hw, run, s);
    if (!step.ok()) return step.status();
    if (out.unfit.empty() && step->fixed.total() > options.gpu_budget_bytes) {
      out.unfit =
          absl::StrCat("fixed memory alone (", FormatBytes(step->fixed.total()),
                       run.pp > 1 ? absl::StrCat(" on stage ", s) : std::string(),
                       ") exceeds the GPU budget (", FormatBytes(options.gpu_budget_bytes), ")");
    } else if (out.unfit.empty() && step->optimizer_host_bytes > options.host_budget_bytes) {
      out.unfit = absl::StrCat(
          "the optimizer state in host memory alone (", FormatBytes(step->optimizer_host_bytes),
          ") exceeds the host budget per GPU (", FormatBytes(options.host_budget_bytes), ")");
      out.host = true;
    }
    StageResult stage;
    stage.stage = s;
    stage.chunks = step->chunks;
    stage.step = *std::move(step);
    ChargePointToPoint(run.pp > 1 ? PipelineMessageBytes(model, run) : 0, hw, run, stage);
    const double slot = SlotLowerBound(stage.step);
    steady = std::max(steady, slot + stage.p2p_steady_seconds);
    blocking = std::max(blocking, slot + stage.p2p_blocking_seconds);
    once = std::max(
        once, stage.step.optimizer_copy_seconds + stage.step.comm.gradient_sync_exposed_seconds);
  }
  const double fill = static_cast<double>(run.pp - 1) / run.vpp;
  out.step_seconds = run.microbatches * steady + fill * blocking + once;
  return out;
}

}  // namespace stowage::planner
