// Pipeline parallelism (Note [Pipeline] in planner/search/pipeline.cc): each stage's fixed memory
// and in-flight microbatches, the step with its bubble and point-to-point time, the plan and the
// stage table, and DeepSeek-V3 on 2,048 GPUs with PP 16 planned stage by stage. The layer split
// is tests/planner/cost/pipeline_layout_test.cc's.
#include "planner/search/pipeline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "planner/cost/cost_model.h"
#include "planner/cost/reference_jobs.h"
#include "planner/frameworks/step_cost.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "planner/report/pipeline_report.h"
#include "planner/search/optimizer.h"
#include "stowage/plan.h"
#include "tests/planner/pipeline_runs.h"

namespace stowage::planner {
namespace {

using ::testing::HasSubstr;

// Each stage holds only its layers' state, sharded over its own data-parallel group: without
// sharding the stages' weights add up to the whole model's (untied embeddings), and the
// embedding and head sit only on the first and last stage.
TEST(PipelineCost, StageFixedMemoryIsItsOwnLayers) {
  const ModelConfig llama = *ModelPreset("llama-3.1-8b");
  const HardwareProfile hw = *HardwarePreset("h200");
  RunSettings run = PpRun(1, 1);
  run.sharding = Sharding::kNoShard;
  const StepCost whole = *BuildStepCost(llama, hw, run);
  run.pp = 4;
  run.microbatches = 8;
  uint64_t sum = 0;
  std::vector<StepCost> stages;
  for (int s = 0; s < 4; ++s) {
    auto step = BuildStepCost(llama, hw, run, s);
    ASSERT_TRUE(step.ok()) << step.status();
    sum += step->fixed.weights;
    stages.push_back(*step);
  }
  EXPECT_NEAR(static_cast<double>(sum), static_cast<double>(whole.fixed.weights), 64.0);
  // Embedding (128256 x 4096 x 2 bytes) on stage 0, the head and final norm on stage 3.
  const double layer_weights = static_cast<double>(stages[1].fixed.weights);
  EXPECT_NEAR(static_cast<double>(stages[0].fixed.weights) - layer_weights, 128256.0 * 4096 * 2,
              16.0);
  EXPECT_NEAR(static_cast<double>(stages[3].fixed.weights) - layer_weights,
              (128256.0 * 4096 + 4096) * 2, 16.0);
  EXPECT_GT(stages[0].embedding_seconds, 0);
  EXPECT_EQ(stages[1].embedding_seconds, 0);
  EXPECT_EQ(stages[1].tail_bytes, 0u);
  EXPECT_GT(stages[3].tail_bytes, 0u);
  // Sharded state divides by the stage's data-parallel group: 64 / 4 = 16 ranks.
  run.sharding = Sharding::kOptim;
  const StepCost sharded = *BuildStepCost(llama, hw, run, 1);
  EXPECT_NEAR(static_cast<double>(sharded.fixed.optimizer),
              static_cast<double>(stages[1].fixed.weights) / 2 * 12 / 16, 64.0);
  // In-flight microbatches: 1F1B stage s of 4 holds min(4 - s, 8).
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(stages[s].layers.front().in_flight_microbatches, 4 - s);
    EXPECT_EQ(stages[s].layers.front().index, 8 * s);
  }
}

// The simulator holds the other in-flight microbatches' resident bytes for the whole microbatch
// and a host copy each: keep-everything peaks grow by (in flight - 1) x the saved bytes.
TEST(PipelineCost, InFlightMicrobatchesMultiplyHeldBytes) {
  const ModelConfig llama = *ModelPreset("llama-3.1-8b");
  const HardwareProfile hw = *HardwarePreset("h200");
  RunSettings run = PpRun(4, 8);
  StepCost step = *BuildStepCost(llama, hw, run, 0);
  Schedule keep;
  keep.options.assign(step.layers.size(), {LayerPolicy::kKeep, 0, 1});
  const SimResult four = Simulate(step, keep, false);
  uint64_t saved = 0;
  for (const LayerCost& l : step.layers) saved += EvaluateOption(l, keep.options[0]).resident_bytes;
  for (LayerCost& l : step.layers) l.in_flight_microbatches = 1;
  const SimResult one = Simulate(step, keep, false);
  EXPECT_EQ(four.peak_bytes - one.peak_bytes, 3 * saved);
  Schedule offload;
  offload.options.assign(step.layers.size(), {LayerPolicy::kOffloadInput, 0, 1});
  const SimResult host_one = Simulate(step, offload, false);
  for (LayerCost& l : step.layers) l.in_flight_microbatches = 4;
  EXPECT_EQ(Simulate(step, offload, false).host_bytes, 4 * host_one.host_bytes);
}

TEST(PipelineStep, BubbleIsPMinusOneSlotsOverVpp) {
  const ModelConfig llama = *ModelPreset("llama-3.1-8b");
  const HardwareProfile hw = *HardwarePreset("h200");
  OptimizerOptions options;
  options.gpu_budget_bytes = hw.UsableBytes();
  options.host_budget_bytes = hw.HostBytesPerGpu();
  RunSettings run = PpRun(4, 8);
  auto p = PlanPipeline(llama, hw, run, options);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->feasible);
  const double slot = p->microbatch_seconds + p->p2p_seconds;
  EXPECT_NEAR(p->step_seconds, (8 + 3) * slot, 1e-9);
  EXPECT_NEAR(p->bubble_seconds, 3 * slot, 1e-9);
  run.vpp = 2;
  run.schedule = PipelineSchedule::kInterleaved;
  auto q = PlanPipeline(llama, hw, run, options);
  ASSERT_TRUE(q.ok()) << q.status();
  // Interleaved: the steady state hides exchanges, the fill and drain wait for them.
  const double qslot = q->microbatch_seconds + q->p2p_seconds;
  EXPECT_NEAR(q->step_seconds, 8 * qslot + 1.5 * q->bubble_slot_seconds, 1e-9);
  EXPECT_GE(q->bubble_slot_seconds, qslot);
  // The plan of the pipeline passes the contract, one section per stage.
  const Plan plan = MakePipelinePlan(*q, {"stowage test", "llama-3.1-8b", "h200",
                                          options.gpu_budget_bytes, options.host_budget_bytes});
  ASSERT_TRUE(ValidatePlan(plan).ok()) << ValidatePlan(plan);
  ASSERT_EQ(plan.stages.size(), 4u);
  EXPECT_EQ(plan.stages[0].chunks.size(), 2u);
  EXPECT_EQ(plan.schedule, PipelineSchedule::kInterleaved);
  auto parsed = ParsePlanJson(PlanToJson(plan));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
}

// Llama 3.1 8B at 8,192 tokens on TP 4: each message is 8192 / 4 x 4096 x 2 bytes = 16 MiB.
RunSettings PointToPointRun(int gpus, int pp, int microbatches) {
  RunSettings run;
  run.seq_len = 8192;
  run.tp = 4;
  run.cp = 1;
  run.ep = 1;
  run.gpus = gpus;
  run.pp = pp;
  run.microbatches = microbatches;
  return run;
}

// h200 with 4-GPU NVLink domains and nodes: PP 2 on 8 GPUs puts the two stages on two nodes.
HardwareProfile FourGpuNodes() {
  HardwareProfile hw = *HardwarePreset("h200");
  hw.nvlink_domain_gpus = 4;
  hw.gpus_per_node = 4;
  return hw;
}

OptimizerOptions Budgets(const HardwareProfile& hw) {
  OptimizerOptions options;
  options.gpu_budget_bytes = hw.UsableBytes();
  options.host_budget_bytes = hw.HostBytesPerGpu();
  return options;
}

// The DP gradient reduction runs once per step, after the last microbatch (Megatron syncs
// gradients on it only), not in every slot: without sharding each stage all-reduces its fp32
// gradients over its 16 data-parallel ranks once.
TEST(PipelineStep, GradientSyncOncePerStep) {
  const ModelConfig llama = *ModelPreset("llama-3.1-8b");
  const HardwareProfile hw = *HardwarePreset("h200");
  RunSettings run = PpRun(4, 8);
  run.sharding = Sharding::kNoShard;
  auto p = PlanPipeline(llama, hw, run, Budgets(hw));
  ASSERT_TRUE(p.ok()) << p.status();
  double once = 0;
  for (const StageResult& s : p->stages) {
    const double sync = s.step.comm.gradient_sync_exposed_seconds;
    EXPECT_GT(sync, 0);
    EXPECT_NEAR(s.result.sim.step_seconds - MicrobatchSeconds(s.step, s.result.sim), sync, 1e-12);
    once = std::max(once, sync);
  }
  EXPECT_DOUBLE_EQ(p->once_seconds, once);
  EXPECT_NEAR(p->step_seconds, (8 + 3) * (p->microbatch_seconds + p->p2p_seconds) + once, 1e-9);
}

// 1F1B waits for every exchange (Note [Pipeline]); each stage of two exchanges with the other
// once per microbatch (its activation one way, the gradient back at the same time). Inside one
// NVLink domain that is 16 MiB at 450 GB/s; across nodes at the NIC's 50 GB/s: the step grows
// by (M + p - 1) x the difference, nothing else changes (TP 4 stays inside a 4-GPU domain, and
// each stage's data-parallel group is 8 / (4 x 2) = 1 rank).
TEST(PipelineStep, PointToPointGrowsWhenNeighboursCrossNodes) {
  const ModelConfig llama = *ModelPreset("llama-3.1-8b");
  const RunSettings run = PointToPointRun(8, 2, 4);
  const HardwareProfile one_node = *HardwarePreset("h200");
  const HardwareProfile two_nodes = FourGpuNodes();
  auto a = PlanPipeline(llama, one_node, run, Budgets(one_node));
  auto b = PlanPipeline(llama, two_nodes, run, Budgets(two_nodes));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  const double message = 8192.0 / 4 * 4096 * 2;
  EXPECT_DOUBLE_EQ(a->p2p_message_bytes, message);
  const double nvlink = message / 450e9 + 3.4e-6, network = message / 50e9 + 14e-6;
  EXPECT_EQ(a->p2p_link, CommLink::kNvlink);
  EXPECT_EQ(b->p2p_link, CommLink::kNetwork);
  for (int s = 0; s < 2; ++s) {
    EXPECT_DOUBLE_EQ(a->stages[s].p2p_blocking_seconds, nvlink);
    EXPECT_DOUBLE_EQ(a->stages[s].p2p_steady_seconds, nvlink);
    EXPECT_DOUBLE_EQ(b->stages[s].p2p_blocking_seconds, network);
  }
  EXPECT_DOUBLE_EQ(b->p2p_seconds, network);
  EXPECT_DOUBLE_EQ(a->microbatch_seconds, b->microbatch_seconds);
  EXPECT_NEAR(b->step_seconds - a->step_seconds, (4 + 1) * (network - nvlink), 1e-12);
  EXPECT_GT(b->step_seconds, a->step_seconds);
  EXPECT_NEAR(b->p2p_step_seconds, 5 * network, 1e-12);
  // The plan carries it: per stage and in the step's prediction.
  const Plan plan = MakePipelinePlan(*b, {"stowage test", "llama-3.1-8b", "h200", 0, 0});
  ASSERT_TRUE(ValidatePlan(plan).ok()) << ValidatePlan(plan);
  EXPECT_DOUBLE_EQ(plan.stages[1].point_to_point_seconds, network);
  EXPECT_NEAR(plan.predicted.exposed_point_to_point_seconds, 5 * network, 1e-12);
  auto parsed = ParsePlanJson(PlanToJson(plan));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_DOUBLE_EQ(parsed->stages[1].point_to_point_seconds, network);
  EXPECT_DOUBLE_EQ(parsed->predicted.exposed_point_to_point_seconds,
                   plan.predicted.exposed_point_to_point_seconds);
  const std::string table = RenderStageTable(*b, plan);
  EXPECT_THAT(table, HasSubstr("ms point-to-point)"));
  EXPECT_THAT(table, HasSubstr("16.0 MiB per message each way, the slowest boundary over network"));
}

// The rank order decides the link of every boundary. 64 H200s (8 per NVLink domain),
// TP 4, PP 2: under Megatron's default tp-cp-ep-dp-pp the stages are ranks 0-31 and 32-63 and
// every message crosses the network; under tp-cp-ep-pp-dp the stages alternate in blocks of 4,
// rank r pairing with r + 4 in its domain, and every message runs on NVLink. 1F1B waits for
// every exchange, so the step drops by (M + p - 1) x the difference and nothing else changes
// but the data-parallel groups (one stage's 8 ranks, on the network either way) and their
// once-per-step reduction.
TEST(PipelineStep, TpPpDpOrderKeepsNeighboursOnNvlink) {
  const ModelConfig llama = *ModelPreset("llama-3.1-8b");
  const HardwareProfile hw = *HardwarePreset("h200");
  RunSettings run = PointToPointRun(64, 2, 4);
  auto a = PlanPipeline(llama, hw, run, Budgets(hw));
  run.rank_order = RankOrder::kTpCpEpPpDp;
  auto b = PlanPipeline(llama, hw, run, Budgets(hw));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  const double message = 8192.0 / 4 * 4096 * 2;
  const double nvlink = message / 450e9 + 3.4e-6, network = message / 50e9 + 14e-6;
  EXPECT_EQ(a->p2p_link, CommLink::kNetwork);
  EXPECT_EQ(b->p2p_link, CommLink::kNvlink);
  for (int s = 0; s < 2; ++s) {
    EXPECT_DOUBLE_EQ(a->stages[s].p2p_blocking_seconds, network);
    EXPECT_DOUBLE_EQ(b->stages[s].p2p_blocking_seconds, nvlink);
  }
  EXPECT_NEAR(a->p2p_step_seconds, 5 * network, 1e-12);
  EXPECT_NEAR(b->p2p_step_seconds, 5 * nvlink, 1e-12);
  EXPECT_DOUBLE_EQ(a->microbatch_seconds, b->microbatch_seconds);
  EXPECT_LT(b->step_seconds, a->step_seconds);
  const Plan plan = MakePipelinePlan(*b, {"stowage test", "llama-3.1-8b", "h200", 0, 0});
  EXPECT_THAT(RenderStageTable(*b, plan),
              HasSubstr("the slowest boundary over NVLink (rank order tp-cp-ep-pp-dp: stages 4 "
                        "ranks apart)"));
  const Plan plan_a = MakePipelinePlan(*a, {"stowage test", "llama-3.1-8b", "h200", 0, 0});
  EXPECT_THAT(RenderStageTable(*a, plan_a),
              HasSubstr("the slowest boundary over network (rank order tp-cp-ep-dp-pp: stages "
                        "32 ranks apart)"));
  // The plan says which order it was made for; the default's JSON is unchanged (no field).
  EXPECT_EQ(plan.rank_order, RankOrder::kTpCpEpPpDp);
  const std::string json = PlanToJson(plan);
  EXPECT_THAT(json, HasSubstr("\"rank_order\": \"tp-cp-ep-pp-dp\""));
  EXPECT_THAT(PlanToJson(plan_a), ::testing::Not(HasSubstr("rank_order")));
  auto parsed = ParsePlanJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rank_order, RankOrder::kTpCpEpPpDp);
  std::string bad = json;
  bad.replace(bad.find("tp-cp-ep-pp-dp"), 14, "pp-dp");
  EXPECT_THAT(std::string(ParsePlanJson(bad).status().message()),
              HasSubstr("plan: field 'run.rank_order' has value 'pp-dp'; allowed: "
                        "tp-cp-ep-dp-pp, tp-cp-ep-pp-dp"));
}

// 16 GPUs in PP 4 on 8-GPU nodes: stages 0-1 share node 0, stages 2-3 node 1. A middle stage
// exchanges with both neighbours per microbatch, the first and the last with one.
TEST(PipelineStep, EachBoundaryOnTheLinkItsRanksCross) {
  const ModelConfig llama = *ModelPreset("llama-3.1-8b");
  const HardwareProfile hw = *HardwarePreset("h200");
  auto p = PlanPipeline(llama, hw, PointToPointRun(16, 4, 8), Budgets(hw));
  ASSERT_TRUE(p.ok()) << p.status();
  const double message = 8192.0 / 4 * 4096 * 2;
  const double nvlink = message / 450e9 + 3.4e-6, network = message / 50e9 + 14e-6;
  EXPECT_DOUBLE_EQ(p->stages[0].p2p_blocking_seconds, nvlink);
  EXPECT_DOUBLE_EQ(p->stages[1].p2p_blocking_seconds, nvlink + network);
  EXPECT_DOUBLE_EQ(p->stages[2].p2p_blocking_seconds, network + nvlink);
  EXPECT_DOUBLE_EQ(p->stages[3].p2p_blocking_seconds, nvlink);
  EXPECT_EQ(p->stages[0].p2p_link, CommLink::kNvlink);
  EXPECT_EQ(p->stages[1].p2p_link, CommLink::kNetwork);
}

// Interleaved (overlap_p2p_comm): chunk v of stage s also feeds chunk v + 1 on stage s + 1 or,
// from the last stage, stage 0. PP 2 x VPP 2 across two nodes: stage 0 runs virtual stages 0
// and 2 (v0 -> v1, v1 -> v2 -> v3: three exchanges), stage 1 runs 1 and 3 (three as well). The
// fill and drain wait for all three; in the steady state a 0.35 ms message hides behind a
// chunk's 16 layers' passes.
TEST(PipelineStep, InterleavedHidesExchangesInTheSteadyState) {
  const ModelConfig llama = *ModelPreset("llama-3.1-8b");
  const HardwareProfile hw = FourGpuNodes();
  RunSettings run = PointToPointRun(8, 2, 4);
  run.vpp = 2;
  run.schedule = PipelineSchedule::kInterleaved;
  auto p = PlanPipeline(llama, hw, run, Budgets(hw));
  ASSERT_TRUE(p.ok()) << p.status();
  const double network = 8192.0 / 4 * 4096 * 2 / 50e9 + 14e-6;
  for (int s = 0; s < 2; ++s) {
    EXPECT_DOUBLE_EQ(p->stages[s].p2p_blocking_seconds, 3 * network);
    EXPECT_EQ(p->stages[s].p2p_steady_seconds, 0);
  }
  EXPECT_EQ(p->p2p_seconds, 0);
  const double slot = p->microbatch_seconds;
  EXPECT_NEAR(p->bubble_slot_seconds,
              std::max(MicrobatchSeconds(p->stages[0].step, p->stages[0].result.sim),
                       MicrobatchSeconds(p->stages[1].step, p->stages[1].result.sim)) +
                  3 * network,
              1e-12);
  EXPECT_NEAR(p->step_seconds, 4 * slot + 0.5 * p->bubble_slot_seconds + p->once_seconds, 1e-12);
  EXPECT_NEAR(p->p2p_step_seconds, 0.5 * 3 * network, 1e-12);
}

// DeepSeek-V3 on 2,048 GPUs with PP 16, EP 64 and 16 microbatches plans every
// stage, and stage 0 (16 microbatches in flight) needs more than the last (1); on H200s and on
// the 80 GB H800s it was trained on. 2048 / 16 = 128 ranks a stage: every boundary leaves its
// node, two 4096 x 7168 x 2-byte messages per microbatch on a middle stage.
TEST(PipelinePlan, DeepSeekV3On2048GpusPlansEveryStage) {
  const ModelConfig ds = *ModelPreset("deepseek-v3");  // 61 layers
  for (const std::string name : {"h200", "h800"}) {
    SCOPED_TRACE(name);
    const HardwareProfile hw = *HardwarePreset(name);
    const RunSettings run = DeepSeekV3Pp16Job();
    const OptimizerOptions options = Budgets(hw);
    auto p = PlanPipeline(ds, hw, run, options);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->stages.size(), 16u);
    EXPECT_TRUE(p->feasible);
    for (const StageResult& s : p->stages) {
      EXPECT_TRUE(s.result.feasible) << "stage " << s.stage;
      EXPECT_EQ(s.step.layers.front().in_flight_microbatches, 16 - s.stage);
    }
    EXPECT_GT(p->stages.front().result.sim.peak_bytes, p->stages.back().result.sim.peak_bytes);
    const double network = 4096.0 * 7168 * 2 / 50e9 + 14e-6;
    EXPECT_EQ(p->p2p_link, CommLink::kNetwork);
    EXPECT_DOUBLE_EQ(p->stages[0].p2p_blocking_seconds, network);
    EXPECT_DOUBLE_EQ(p->stages[7].p2p_blocking_seconds, 2 * network);
    const Plan plan = MakePipelinePlan(*p, {"stowage test", "deepseek-v3", name,
                                            options.gpu_budget_bytes, options.host_budget_bytes});
    ASSERT_TRUE(ValidatePlan(plan).ok()) << ValidatePlan(plan);
    EXPECT_EQ(plan.layers.size(), 62u);  // 61 decoder layers and mtp.0 on the last stage
    EXPECT_EQ(plan.layers[0].in_flight_microbatches, 16);
    EXPECT_EQ(plan.layers[60].in_flight_microbatches, 1);
    EXPECT_EQ(plan.layers[61].name, "mtp.0");
  }
}

}  // namespace
}  // namespace stowage::planner
