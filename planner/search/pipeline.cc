#include "planner/search/pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner/search/simulator.h"

namespace stowage::planner {

// Note [Pipeline]. What a pipelined run costs, stage by stage.
//  - Split. Megatron-Core (transformer_block.py get_num_layers_to_build, with
//    --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split) divides the
//    layers evenly over pp x vpp virtual stages, counting the embedding (the loss) as one more
//    layer of the first (last) virtual stage when asked; --pp-layout gives the layers of each
//    stage (or virtual stage) instead. Virtual stage v = c x pp + s is chunk c of stage s.
//  - Memory. A stage's step cost holds only its layers (cost_model.cc BuildStepCost with the
//    stage): their weights, gradients and optimizer state, sharded over the stage's data-parallel
//    group (gpus / (tp x pp) ranks for dense parameters, gpus / (ep x pp) for routed experts,
//    under either rank order; where they sit is communication.h GroupsOf's); the embedding on stage
//    0, the final norm, LM head, loss and MTP modules on the last. Each layer's
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
namespace {

absl::Status Bad(const std::string& flag, const std::string& value, const std::string& rule) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " is ", value, "; ", rule));
}

// Megatron's even split, or a suggestion when it does not divide: the remainder on the last
// stages, which hold the fewest microbatches in 1F1B.
std::string SuggestLayout(int layers, int pp) {
  std::vector<int> counts(pp, layers / pp);
  for (int s = 0; s < layers % pp; ++s) ++counts[pp - 1 - s];
  return absl::StrJoin(counts, ",");
}

}  // namespace

absl::Status ValidatePipeline(const ModelConfig& model, const RunSettings& run) {
  const int n = model.num_layers();
  if (run.pp < 1 || run.pp > kPlanMaxPipelineStages) {
    return Bad("pp", absl::StrCat(run.pp), absl::StrCat("allowed: 1 to ", kPlanMaxPipelineStages));
  }
  if (run.vpp < 1 || run.vpp > kPlanMaxVirtualStages) {
    return Bad("vpp", absl::StrCat(run.vpp), absl::StrCat("allowed: 1 to ", kPlanMaxVirtualStages));
  }
  if (run.microbatches < 1 || run.microbatches > kPlanMaxMicrobatches) {
    return Bad("microbatches", absl::StrCat(run.microbatches),
               absl::StrCat("allowed: 1 to ", kPlanMaxMicrobatches));
  }
  const bool interleaved = run.schedule == PipelineSchedule::kInterleaved;
  if (run.vpp > 1 && !interleaved) {
    return Bad("vpp", absl::StrCat(run.vpp),
               "virtual stages run only under --schedule interleaved");
  }
  if (interleaved && run.vpp < 2) {
    return Bad("schedule", "interleaved", "it needs --vpp 2 or more (model chunks per stage)");
  }
  if (interleaved && run.pp < 2) {
    return Bad("schedule", "interleaved", "it needs --pp 2 or more");
  }
  if (interleaved && run.microbatches < run.pp) {
    return Bad(
        "microbatches", absl::StrCat(run.microbatches),
        absl::StrCat("the interleaved schedule needs at least --pp (", run.pp, ") microbatches"));
  }
  if (interleaved && run.microbatches % run.pp != 0) {
    return Bad("microbatches", absl::StrCat(run.microbatches),
               absl::StrCat("the interleaved schedule runs microbatches in groups of --pp (",
                            run.pp, "): use a multiple of ", run.pp));
  }
  if (run.pp > 1 && run.framework == Framework::kHf) {
    return Bad("pp", absl::StrCat(run.pp),
               "the hf framework profile plans one transformers model per rank; pipeline "
               "stages are planned with --framework megatron");
  }
  const int64_t model_parallel = int64_t{run.tp} * run.cp * run.pp;
  if (run.gpus % model_parallel != 0) {
    return Bad("gpus", absl::StrCat(run.gpus),
               absl::StrCat("it must be a multiple of --tp x --cp x --pp (", model_parallel, ")"));
  }
  if ((run.gpus / run.pp) % run.ep != 0) {
    return Bad("ep", absl::StrCat(run.ep),
               absl::StrCat("it must divide the ", run.gpus / run.pp,
                            " GPUs of one pipeline stage (--gpus / --pp)"));
  }
  // Megatron-Core builds a dense grid (tp-cp-dp-pp or tp-cp-pp-dp) and an expert grid (expert
  // tp-ep-dp-pp or -pp-dp; expert tensor parallelism defaults to --tp, and is 1 in this cost
  // model's MoE layers) and, unless the order ends in pp, asserts that their data-parallel
  // sizes, and so their pipeline groups, agree (parallel_state.py initialize_model_parallel:
  // "When not using pp-last rank ordering, the data parallel size of the attention and moe
  // layers must be the same"): expert tp x ep = tp x cp.
  if (run.pp > 1 && run.rank_order == RankOrder::kTpCpEpPpDp) {
    bool has_moe = false;
    for (const LayerSpec& l : model.layers) has_moe |= l.ffn == FfnKind::kMoe;
    const int64_t expert_tp = has_moe ? 1 : run.tp, tp_cp = int64_t{run.tp} * run.cp;
    if (expert_tp * run.ep != tp_cp) {
      return Bad(
          "rank-order", std::string(RankOrderName(run.rank_order)),
          absl::StrCat("with --pp ", run.pp,
                       " Megatron-Core needs the expert grid's pipeline groups to be the dense "
                       "grid's (parallel_state.py initialize_model_parallel): expert tp x --ep (",
                       expert_tp, " x ", run.ep, ") must equal --tp x --cp (", run.tp, " x ",
                       run.cp, "); allowed: tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp with ",
                       has_moe ? "--ep = --tp x --cp (expert tensor parallelism 1)"
                               : "--cp 1 (expert tensor parallelism is --tp)"));
    }
  }
  const int virtual_stages = run.pp * run.vpp;
  if (!run.pp_layout.empty()) {
    if (run.account_for_embedding_in_pipeline_split || run.account_for_loss_in_pipeline_split) {
      return Bad("pp-layout", absl::StrJoin(run.pp_layout, ","),
                 "it gives every stage's layers; --account-for-embedding-in-pipeline-split and "
                 "--account-for-loss-in-pipeline-split apply to the even split only");
    }
    if (run.pp_layout.size() != static_cast<size_t>(virtual_stages)) {
      return Bad("pp-layout", absl::StrJoin(run.pp_layout, ","),
                 absl::StrCat("it lists ", run.pp_layout.size(), " counts; allowed: one per ",
                              run.vpp > 1 ? "virtual stage (--pp x --vpp = " : "stage (--pp = ",
                              virtual_stages, ")"));
    }
    int64_t sum = 0;
    for (int count : run.pp_layout) {
      if (count < 0) {
        return Bad("pp-layout", absl::StrJoin(run.pp_layout, ","), "layer counts are 0 or more");
      }
      sum += count;
    }
    if (sum != n) {
      return Bad("pp-layout", absl::StrJoin(run.pp_layout, ","),
                 absl::StrCat("it places ", sum, " layers; the model has ", n));
    }
    return absl::OkStatus();
  }
  if (virtual_stages == 1) return absl::OkStatus();
  const int total = n + (run.account_for_embedding_in_pipeline_split ? 1 : 0) +
                    (run.account_for_loss_in_pipeline_split ? 1 : 0);
  if (total % virtual_stages != 0) {
    return Bad(
        "pp", absl::StrCat(run.pp),
        absl::StrCat("the model's ", n, " layers",
                     total != n ? absl::StrCat(" (", total, " with the embedding / loss counted)")
                                : std::string(),
                     " do not divide evenly over ", virtual_stages,
                     run.vpp > 1 ? " virtual stages" : " stages",
                     "; give the layers of each with --pp-layout, e.g. --pp-layout ",
                     SuggestLayout(n, virtual_stages)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LayerRange>> VirtualStageLayers(const ModelConfig& model,
                                                           const RunSettings& run) {
  if (absl::Status s = ValidatePipeline(model, run); !s.ok()) return s;
  const int virtual_stages = run.pp * run.vpp;
  std::vector<int> counts = run.pp_layout;
  if (counts.empty()) {
    const int e = run.account_for_embedding_in_pipeline_split ? 1 : 0;
    const int l = run.account_for_loss_in_pipeline_split ? 1 : 0;
    const int per =
        virtual_stages == 1 ? model.num_layers() : (model.num_layers() + e + l) / virtual_stages;
    counts.assign(virtual_stages, per);
    if (virtual_stages > 1) {
      counts.front() -= e;
      counts.back() -= l;
    }
  }
  // Note [MTP layers] (cost_model.cc): the MTP depths run after the decoder layers, in the last
  // virtual stage (Megatron-Core mtp_on_this_rank without a custom layout), beyond the split.
  counts.back() = std::max(0, counts.back()) + TrainedMtpLayers(model, run);
  std::vector<LayerRange> out;
  int first = 0;
  for (int count : counts) {
    out.push_back({first, std::max(0, count)});
    first += std::max(0, count);
  }
  return out;
}

std::vector<LayerRange> StageChunks(const std::vector<LayerRange>& virtual_stages, int pp, int vpp,
                                    int stage) {
  std::vector<LayerRange> chunks;
  for (int c = 0; c < vpp; ++c) {
    const size_t v = static_cast<size_t>(c) * pp + stage;
    if (v < virtual_stages.size()) chunks.push_back(virtual_stages[v]);
  }
  return chunks;
}

double MicrobatchSeconds(const StepCost& step, const SimResult& sim) {
  return std::max(0.0, sim.step_seconds - step.optimizer_copy_seconds -
                           step.comm.gradient_sync_exposed_seconds);
}

void ChargePointToPoint(const ModelConfig& model, const HardwareProfile& hw, const RunSettings& run,
                        StageResult& stage) {
  stage.p2p_blocking_seconds = 0;
  stage.p2p_steady_seconds = 0;
  stage.p2p_link = CommLink::kNone;
  const int pp = run.pp, s = stage.stage;
  if (pp <= 1) return;
  const int virtual_stages = pp * run.vpp;
  const bool overlapped = run.schedule == PipelineSchedule::kInterleaved;
  const double bytes = PipelineMessageBytes(model, run);
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

absl::StatusOr<PipelineResult> PlanPipeline(const ModelConfig& model, const HardwareProfile& hw,
                                            const RunSettings& run,
                                            const OptimizerOptions& options) {
  if (absl::Status s = ValidatePipeline(model, run); !s.ok()) return s;
  PipelineResult out;
  out.feasible = true;
  double worst_peak = -1, slowest = -1, steady_baseline = 0, bubble_baseline = 0;
  double bubble_p2p = 0;
  out.p2p_message_bytes = run.pp > 1 ? PipelineMessageBytes(model, run) : 0;
  for (int s = 0; s < run.pp; ++s) {
    absl::StatusOr<StepCost> step = BuildStepCost(model, hw, run, s);
    if (!step.ok()) return step.status();
    StageResult stage;
    stage.stage = s;
    stage.chunks = step->chunks;
    stage.step = *std::move(step);
    stage.result = Optimize(stage.step, options);
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
    ChargePointToPoint(model, hw, run, stage);
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
      // The MTP layers at the end of the last chunk by name (Note [MTP layers] in cost_model.cc).
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
