#include "planner/search/pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner/cost/pipeline_layout.h"
#include "planner/frameworks/step_cost.h"

namespace stowage::planner {

// Note [Pipeline]. What a pipelined run costs, stage by stage.
//  - Split. Megatron-Core (transformer_block.py get_num_layers_to_build, with
//    --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split) divides the
//    layers evenly over pp x vpp virtual stages, counting the embedding (the loss) as one more
//    layer of the first (last) virtual stage when asked; --pp-layout gives the layers of each
//    stage (or virtual stage) instead. Virtual stage v = c x pp + s is chunk c of stage s
//    (planner/cost/pipeline_layout.h).
//  - Memory. A stage's step cost holds only its layers (planner/frameworks/step_cost.h
//    BuildStepCost with the stage): their weights, gradients and optimizer state, sharded over the
//    stage's data-parallel group (gpus / (tp x pp) ranks for dense parameters, gpus / (ep x pp) for
//    routed experts, under either rank order; where they sit is communication.h GroupsOf's); the
//    embedding on stage 0, the final norm, LM head, loss and MTP modules on the last. Each layer's
//    in_flight_microbatches (plan.h InFlightMicrobatches: 1F1B stage s of p holds min(p - s, M))
//    multiplies what the layer keeps between its forward and backward: the simulator holds the
//    other in-flight microbatches' resident bytes throughout and counts a host copy for each
//    (simulator.h).
//  - Time. Every stage runs each microbatch's forward and backward once; in 1F1B the step is
//    (M + p - 1) microbatch slots of the slowest stage, with interleaving the fill and drain
//    shrink to (p - 1) / vpp slots (Narayanan et al. 2021, "Efficient Large-Scale Language Model
//    Training on GPU Clusters Using Megatron-LM", section 2.2: bubble fraction (p - 1) / (v m)).
//    A slot is the stage's simulated microbatch (compute, exposed collectives and copy waits)
//    plus its point-to-point time; the once-per-step part of a stage (the optimizer offload's
//    copies, the DP gradient reduction: StepComm::gradient_sync_exposed_seconds) is added once:
//    step = M x steady slot + (p - 1) / vpp x fill-and-drain slot + once, each slot the longest
//    of any stage.
//  - Point-to-point (communication.h StageLink, PointToPointSeconds, PipelineMessageBytes).
//    Per microbatch, each chunk (virtual stage v) exchanges over the boundary to v - 1 (its
//    input activation in, the input's gradient out) and to v + 1 (its output out, the output's
//    gradient in): one message each way over each boundary, on the link the two stages' ranks
//    cross in Megatron's rank order (stage s is ranks s x gpus/pp ...: neighbours stay inside an
//    NVLink domain only when gpus/pp x 2 fits one; with interleaving the last stage's chunks
//    feed the first stage's next chunk, gpus x (pp - 1)/pp ranks away; under --rank-order
//    tp-cp-ep-pp-dp neighbours are tp x cp ranks apart: GroupsOf's stage_stride). The two
//    directions of an exchange run at once, so one exchange costs one message. What is exposed
//    follows Megatron-Core's schedules (pipeline_parallel/schedules.py):
//     - 1F1B (forward_backward_pipelining_without_interleaving): no overlap; Megatron-LM turns
//       overlap_p2p_comm off for it and uses batched isend/irecv that are waited for
//       (p2p_communication.py _communicate, wait_on_reqs; batch_p2p_sync), in warmup
//       (recv_forward, send_forward), steady state (send_forward_recv_backward, then
//       send_backward_recv_forward) and cooldown alike: every exchange is on the critical path,
//       the first and last stage one per microbatch, the others two.
//     - Interleaved with overlap_p2p_comm (Megatron-LM's default for it,
//       --no-overlap-p2p-communication turns it off): in the steady state each send/receive is
//       posted after a chunk's pass and waited for just before the chunk that needs it, so it
//       runs behind the opposite pass: a forward's exchange is exposed by what exceeds the
//       chunk's backward compute, a backward's by what exceeds its forward compute (the
//       chunk's own compute stands for the neighbouring chunk's). Warmup and flush wait for
//       every exchange (overlap_p2p_comm_warmup_flush is off by default), so the fill-and-drain
//       slots pay every message.
double MicrobatchSeconds(const StepCost& step, const SimResult& sim) {
  return std::max(0.0, sim.step_seconds - step.optimizer_copy_seconds -
                           step.comm.gradient_sync_exposed_seconds);
}

void ChargePointToPoint(double message_bytes, const HardwareProfile& hw, const RunSettings& run,
                        StageResult& stage) {
  stage.p2p_blocking_seconds = 0;
  stage.p2p_steady_seconds = 0;
  stage.p2p_link = CommLink::kNone;
  const int pp = run.pp, s = stage.stage;
  if (pp <= 1) return;
  const int virtual_stages = pp * run.vpp;
  const bool overlapped = run.schedule == PipelineSchedule::kInterleaved;
  const double bytes = message_bytes;
  // Neighbouring stages are gpus / pp ranks apart, or tp x cp under tp-cp-ep-pp-dp.
  const int stage_stride = GroupsOf(run).stage_stride;
  size_t local = 0;
  for (size_t k = 0; k < stage.chunks.size(); ++k) {
    const int v = static_cast<int>(k) * pp + s;
    double exchange[2] = {0, 0};  // with virtual stage v - 1, with v + 1
    for (int side = 0; side < 2; ++side) {
      const int neighbour = side == 0 ? v - 1 : v + 1;
      if (neighbour < 0 || neighbour >= virtual_stages) continue;
      const CommLink link = StageLink(hw, run.gpus, pp, s, neighbour % pp, stage_stride);
      if (link == CommLink::kNetwork || stage.p2p_link == CommLink::kNone) stage.p2p_link = link;
      exchange[side] = PointToPointSeconds(hw, link, bytes);
    }
    stage.p2p_blocking_seconds += exchange[0] + exchange[1];
    if (!overlapped) continue;
    double forward = 0, backward = 0;
    const size_t end = std::min(stage.step.layers.size(), local + stage.chunks[k].num_layers);
    for (; local < end; ++local) {
      const LayerCost& l = stage.step.layers[local];
      forward += l.forward_seconds + l.forward_comm_seconds;
      backward += l.backward_seconds + l.backward_comm_seconds;
    }
    // The forward's exchange (output out, next input in) behind a backward, the backward's
    // behind a forward.
    const double both = std::max(exchange[0], exchange[1]);
    stage.p2p_steady_seconds += std::max(0.0, both - backward) + std::max(0.0, both - forward);
  }
  if (!overlapped) stage.p2p_steady_seconds = stage.p2p_blocking_seconds;
}

absl::StatusOr<PipelineResult> PlanStages(std::vector<StepCost> stages, const HardwareProfile& hw,
                                          const RunSettings& run, double message_bytes,
                                          const OptimizerOptions& options,
                                          const StageScheduler& schedule) {
  if (stages.size() != static_cast<size_t>(run.pp) || run.pp < 1 || run.vpp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline: ", stages.size(),
                                                   " stage step costs for pp ", run.pp, " (vpp ",
                                                   run.vpp, "); allowed: one per stage"));
  }
  PipelineResult out;
  out.feasible = true;
  double worst_peak = -1, slowest = -1, steady_baseline = 0, bubble_baseline = 0;
  double bubble_p2p = 0;
  out.p2p_message_bytes = run.pp > 1 ? message_bytes : 0;
  for (int s = 0; s < run.pp; ++s) {
    StageResult stage;
    stage.stage = s;
    stage.chunks = stages[s].chunks;
    stage.step = std::move(stages[s]);
    stage.result = schedule ? schedule(stage.step) : Optimize(stage.step, options);
    stage.baseline = ComputeBaseline(stage.step, options.gpu_budget_bytes);
    const bool fits = stage.result.feasible;
    const double peak =
        static_cast<double>(fits ? stage.result.sim.peak_bytes : stage.result.min_peak_bytes);
    // The binding stage: the first that does not fit, else the one with the highest peak.
    if (out.feasible && !fits) {
      out.binding_stage = s;
      worst_peak = peak;
    } else if (out.feasible == fits && peak > worst_peak) {
      out.binding_stage = s;
      worst_peak = peak;
    }
    out.feasible &= fits;
    ChargePointToPoint(message_bytes, hw, run, stage);
    if (stage.p2p_link == CommLink::kNetwork || out.p2p_link == CommLink::kNone) {
      out.p2p_link = stage.p2p_link;
    }
    const double slot = MicrobatchSeconds(stage.step, stage.result.sim);
    if (slot + stage.p2p_steady_seconds > slowest) {
      slowest = slot + stage.p2p_steady_seconds;
      out.slowest_stage = s;
      out.microbatch_seconds = slot;
      out.p2p_seconds = stage.p2p_steady_seconds;
    }
    if (slot + stage.p2p_blocking_seconds > out.bubble_slot_seconds) {
      out.bubble_slot_seconds = slot + stage.p2p_blocking_seconds;
      bubble_p2p = stage.p2p_blocking_seconds;
    }
    const double base = MicrobatchSeconds(stage.step, stage.baseline.sim);
    steady_baseline = std::max(steady_baseline, base + stage.p2p_steady_seconds);
    bubble_baseline = std::max(bubble_baseline, base + stage.p2p_blocking_seconds);
    out.once_seconds =
        std::max(out.once_seconds,
                 stage.step.optimizer_copy_seconds + stage.step.comm.gradient_sync_exposed_seconds);
    out.stages.push_back(std::move(stage));
  }
  const double fill = static_cast<double>(run.pp - 1) / run.vpp;
  const double m = run.microbatches;
  out.bubble_seconds = fill * out.bubble_slot_seconds;
  out.step_seconds =
      m * (out.microbatch_seconds + out.p2p_seconds) + out.bubble_seconds + out.once_seconds;
  out.p2p_step_seconds = m * out.p2p_seconds + fill * bubble_p2p;
  out.baseline_step_seconds = m * steady_baseline + fill * bubble_baseline + out.once_seconds;
  return out;
}

absl::StatusOr<PipelineResult> PlanPipeline(const ModelConfig& model, const HardwareProfile& hw,
                                            const RunSettings& run,
                                            const OptimizerOptions& options) {
  if (absl::Status s = ValidatePipeline(model, run); !s.ok()) return s;
  std::vector<StepCost> stages;
  for (int s = 0; s < run.pp; ++s) {
    absl::StatusOr<StepCost> step = BuildStepCost(model, hw, run, s);
    if (!step.ok()) return step.status();
    stages.push_back(*std::move(step));
  }
  return PlanStages(std::move(stages), hw, run, run.pp > 1 ? PipelineMessageBytes(model, run) : 0,
                    options);
}

absl::StatusOr<PipelineResult> PlanPipeline(const LayerProfileSet& profile,
                                            const HardwareProfile& hw, int microbatches,
                                            const OptimizerOptions& options,
                                            std::string_view field) {
  absl::StatusOr<RunSettings> run = ProfileRunSettings(profile.pipeline, microbatches, field);
  if (!run.ok()) return run.status();
  absl::StatusOr<std::vector<StepCost>> stages = BuildStageStepCostsFromProfile(profile, hw, *run);
  if (!stages.ok()) return stages.status();
  return PlanStages(*std::move(stages), hw, *run, ProfileMessageBytes(profile), options);
}

}  // namespace stowage::planner
