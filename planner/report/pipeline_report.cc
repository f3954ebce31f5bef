// The plan and the per-stage table of a pipelined run.
#include "planner/report/pipeline_report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/bytes.h"
#include "planner/cost/communication.h"

namespace stowage::planner {

Plan MakePipelinePlan(const PipelineResult& pipeline, const PlanLabels& labels) {
  Plan plan;
  const StageResult& binding = pipeline.stages[pipeline.binding_stage];
  const RunSettings& run = binding.step.run;
  for (const StageResult& stage : pipeline.stages) {
    // The stage's own plan (local layer positions), then its layers at their model indices with
    // the protocol of their chunk.
    Plan part = MakePlan(stage.step, stage.result, stage.baseline, labels);
    if (stage.stage == pipeline.binding_stage) {
      const std::vector<LayerPlan> layers = std::move(plan.layers);
      const std::vector<StagePlan> stages = std::move(plan.stages);
      plan = part;  // its fits and binding too (Note [Plans that do not fit])
      plan.binding.stage = pipeline.binding_stage;
      plan.layers = layers;
      plan.stages = stages;
    }
    const int distance = stage.result.schedule.prefetch_distance;
    size_t local = 0;
    for (const LayerRange& chunk : stage.chunks) {
      for (int i = chunk.first_layer; i < chunk.end(); ++i, ++local) {
        LayerPlan l = part.layers[local];
        l.index = i;
        l.in_flight_microbatches = stage.step.layers[local].in_flight_microbatches;
        const LayerProtocol p =
            LayerProtocolFor(i, chunk, l.host_bytes > 0, distance, stage.result.schedule.save_lag);
        l.save_wait_before_layer = p.save_wait_before_layer;
        l.prefetch_after_layer = p.prefetch_after_layer;
        plan.layers.push_back(std::move(l));
      }
    }
    StagePlan sp;
    sp.stage = stage.stage;
    sp.chunks = stage.chunks;
    sp.prefetch_distance = distance;
    sp.embedding = stage.stage == 0;
    sp.lm_head = stage.stage == run.pp - 1;
    sp.peak_device_bytes = stage.result.sim.peak_bytes;
    sp.fixed_device_bytes = stage.step.fixed.total();
    sp.host_bytes_per_gpu = stage.result.sim.host_bytes;
    sp.host_arena_bytes = stage.result.sim.host_bytes;
    sp.microbatch_seconds = MicrobatchSeconds(stage.step, stage.result.sim);
    sp.exposed_copy_seconds = stage.result.sim.exposed_copy_seconds;
    sp.point_to_point_seconds = stage.p2p_steady_seconds;
    plan.stages.push_back(std::move(sp));
  }
  // Layers in model order (stages run interleaved chunks).
  std::sort(plan.layers.begin(), plan.layers.end(),
            [](const LayerPlan& a, const LayerPlan& b) { return a.index < b.index; });
  plan.pp = run.pp;
  plan.vpp = run.vpp;
  plan.schedule = run.schedule;
  plan.microbatches = run.microbatches;
  plan.rank_order = run.rank_order;
  PlanPrediction& p = plan.predicted;
  p.peak_device_bytes = 0;
  p.host_bytes_per_gpu = 0;
  plan.runtime.host_arena_bytes = 0;
  for (const StagePlan& st : plan.stages) {
    p.peak_device_bytes = std::max(p.peak_device_bytes, st.peak_device_bytes);
    p.host_bytes_per_gpu = std::max(p.host_bytes_per_gpu, st.host_bytes_per_gpu);
    plan.runtime.host_arena_bytes = std::max(plan.runtime.host_arena_bytes, st.host_arena_bytes);
  }
  p.fixed_device_bytes = binding.step.fixed.total();
  p.host_bytes_per_numa_node =
      p.host_bytes_per_gpu * static_cast<uint64_t>(binding.step.hardware.gpus_per_numa_node);
  p.step_seconds = pipeline.step_seconds;
  const double slots = run.microbatches + static_cast<double>(run.pp - 1) / run.vpp;
  p.exposed_copy_seconds =
      slots * pipeline.stages[pipeline.slowest_stage].result.sim.exposed_copy_seconds;
  p.baseline_step_seconds = pipeline.baseline_step_seconds;
  p.exposed_point_to_point_seconds = pipeline.p2p_step_seconds;
  // The weakest stage's search (proven < within_gap < unproven) and the worst stage's gap.
  p.optimality = plan.fits ? "proven" : "";
  p.optimality_gap = 0;
  for (const StageResult& s : pipeline.stages) {
    if (!plan.fits) break;
    const std::string name = OptimalityName(s.result);
    if (name == "unproven" || (name == "within_gap" && p.optimality == "proven")) {
      p.optimality = name;
    }
    p.optimality_gap = std::max(p.optimality_gap, OptimalityGap(s.result));
  }
  // The runtime settings a pp = 1 plan carries; with stages, each stage's distance is its own.
  plan.runtime.prefetch_distance = plan.stages.front().prefetch_distance;
  if (run.pp == 1) plan.stages.clear();  // the one stage PlanStages derives
  return plan;
}

std::string RenderStageTable(const PipelineResult& pipeline, const Plan& plan) {
  std::string out =
      absl::StrFormat("%5s  %-16s  %9s  %10s  %10s  %10s  %12s  %10s  %10s\n", "stage", "layers",
                      "in flight", "fixed", "peak", "host", "microbatch", "exposed", "p2p");
  for (const StageResult& s : pipeline.stages) {
    std::vector<std::string> ranges;
    std::vector<std::string> in_flight;
    size_t local = 0;
    for (const LayerRange& c : s.chunks) {
      // The MTP layers at the end of the last chunk by name (Note [MTP layers] in
      // planner/frameworks/megatron.cc).
      int mtp = 0;
      for (int i = 0; i < c.num_layers && local + i < s.step.layers.size(); ++i) {
        mtp += s.step.layers[local + i].name.empty() ? 0 : 1;
      }
      const int decoder = c.num_layers - mtp;
      ranges.push_back(
          absl::StrCat(decoder == 0 ? std::string("-")
                                    : absl::StrCat(c.first_layer, "-", c.first_layer + decoder - 1),
                       mtp == 0   ? std::string()
                       : mtp == 1 ? absl::StrCat("+", MtpLayerName(0))
                                  : absl::StrCat("+", MtpLayerName(0), "-", mtp - 1)));
      if (c.num_layers > 0) {
        in_flight.push_back(absl::StrCat(s.step.layers[local].in_flight_microbatches));
      }
      local += c.num_layers;
    }
    std::string extra;
    if (s.stage == 0) extra += "+emb";
    if (s.stage == plan.pp - 1) extra += "+head";
    const bool fits = s.result.feasible;
    absl::StrAppend(
        &out,
        absl::StrFormat("%5d  %-16s  %9s  %10s  %10s  %10s  %9.1f ms  %7.1f ms  %7.1f ms%s\n",
                        s.stage, absl::StrCat(absl::StrJoin(ranges, ","), extra),
                        in_flight.empty() ? "-" : absl::StrJoin(in_flight, ","),
                        FormatBytes(s.step.fixed.total()),
                        FormatBytes(fits ? s.result.sim.peak_bytes : s.result.min_peak_bytes),
                        FormatBytes(s.result.sim.host_bytes),
                        MicrobatchSeconds(s.step, s.result.sim) * 1e3,
                        s.result.sim.exposed_copy_seconds * 1e3, s.p2p_steady_seconds * 1e3,
                        s.stage == pipeline.binding_stage
                            ? (fits ? "  <- binding (highest peak)" : "  <- binding (does not fit)")
                            : ""));
  }
  const RunSettings& run = pipeline.stages.front().step.run;
  const double steady = pipeline.microbatch_seconds + pipeline.p2p_seconds;
  const std::string p2p =
      pipeline.p2p_seconds > 0
          ? absl::StrFormat(" (%.1f ms + %.1f ms point-to-point)",
                            pipeline.microbatch_seconds * 1e3, pipeline.p2p_seconds * 1e3)
          : std::string();
  // 1F1B: one slot for the steady state and the bubble; interleaved: the bubble's waits every
  // exchange (Note [Pipeline]).
  const bool one_slot = std::abs(pipeline.bubble_slot_seconds - steady) <= 1e-12 * steady;
  const std::string formula = one_slot
                                  ? absl::StrFormat("(%d + %d/%d) x %.1f ms%s", run.microbatches,
                                                    run.pp - 1, run.vpp, steady * 1e3, p2p)
                                  : absl::StrFormat(
                                        "%d x %.1f ms%s + %d/%d x %.1f ms (fill and drain, every "
                                        "exchange waited for)",
                                        run.microbatches, steady * 1e3, p2p, run.pp - 1, run.vpp,
                                        pipeline.bubble_slot_seconds * 1e3);
  absl::StrAppend(
      &out,
      absl::StrFormat("pipeline               PP %d%s, %s, %d microbatches: step = %s (stage %d's "
                      "microbatch)%s = %.3f s, bubble %.3f s\n",
                      run.pp, run.vpp > 1 ? absl::StrCat(" x VPP ", run.vpp) : std::string(),
                      std::string(PipelineScheduleName(run.schedule)), run.microbatches, formula,
                      pipeline.slowest_stage,
                      pipeline.once_seconds > 0
                          ? absl::StrFormat(" + %.3f s once per step", pipeline.once_seconds)
                          : std::string(),
                      pipeline.step_seconds, pipeline.bubble_seconds));
  if (run.pp > 1) {
    absl::StrAppend(
        &out, absl::StrFormat(
                  "point-to-point         %s per message each way, the slowest boundary over %s "
                  "(rank order %s: stages %d ranks apart); %.3f s exposed in the step (%s)\n",
                  FormatBytes(static_cast<uint64_t>(std::min(pipeline.p2p_message_bytes, 1.8e19))),
                  CommLinkName(pipeline.p2p_link), std::string(RankOrderName(run.rank_order)),
                  GroupsOf(run).stage_stride, pipeline.p2p_step_seconds,
                  run.schedule == PipelineSchedule::kInterleaved
                      ? "interleaved: the steady state hides each exchange behind a chunk's pass; "
                        "fill and drain wait"
                      : "1f1b: every exchange waited for"));
  }
  return out;
}

}  // namespace stowage::planner
