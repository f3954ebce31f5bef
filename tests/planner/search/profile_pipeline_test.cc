// Pipelined measured profiles (schema_version 3's `pipeline`): the strict reader and writer, each
// stage's step cost (its layers at their global indices, in-flight counts, fixed memory, the
// embedding and the loss where they run), the pipeline's step combined from the stages' own
// simulations, the plan it writes, and gradient accumulation over a one-stage profile.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "planner/cost/communication.h"
#include "planner/frameworks/layer_profile.h"
#include "planner/frameworks/step_cost.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "planner/report/pipeline_report.h"
#include "planner/search/optimizer.h"
#include "planner/search/pipeline.h"
#include "planner/search/simulator.h"
#include "stowage/plan.h"
#include "tests/planner/pipeline_runs.h"
#include "tests/planner/profile_json.h"

namespace stowage::planner {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Four layers, layer i's input (i + 1) x 8 MiB so each message size is told apart; fixed memory
// of 100 MiB per stage (stage 1: 120 MiB), the embedding on stage 0 and the loss on stage 1.
Json Layers() {
  Json layers = Json::array();
  for (int i = 0; i < 4; ++i) {
    const uint64_t input = static_cast<uint64_t>(i + 1) * 8 * kMiB;
    Json l = {{"index", i},
              {"type", "Block"},
              {"input_bytes", input},
              {"output_bytes", 8 * kMiB},
              {"forward_peak_bytes", 200 * kMiB},
              {"backward_peak_bytes", 300 * kMiB},
              {"forward_seconds", 0.01},
              {"backward_seconds", 0.02},
              {"saved", Json::array({{{"name", "input"}, {"bytes", input}},
                                     {{"name", "act"}, {"bytes", 120 * kMiB}}})}};
    layers.push_back(l);
  }
  return layers;
}

Json Stage(int s, Json chunks) {
  return {{"stage", s},
          {"chunks", std::move(chunks)},
          {"fixed_bytes",
           {{"weights", 40 * kMiB},
            {"gradients", 40 * kMiB},
            {"optimizer", 0},
            {"other", (20 + 20 * s) * kMiB}}},
          {"model_parameters", 1000 + s}};
}

Json Chunk(int first, int n) { return {{"first_layer", first}, {"num_layers", n}}; }

// pp 2; vpp 1: stage 0 runs layers 0-1, stage 1 layers 2-3; vpp 2: stage 0 runs 0 and 2, stage 1
// runs 1 and 3 (virtual stage v = c x pp + s).
Json PipelinedProfile(int vpp) {
  Json p = {
      {"format", "stowage-layer-profile"},
      {"schema_version", 3},
      {"generator", "test"},
      {"device", "cuda:0"},
      {"measured_memory", true},
      {"tokens", 4096},
      {"fixed_bytes", {{"weights", 80 * kMiB}, {"gradients", 80 * kMiB}, {"other", 40 * kMiB}}},
      {"loss", {{"peak_bytes", 64 * kMiB}, {"seconds", 0.004}}},
      {"embedding", {{"seconds", 0.002}}},
      {"link", {{"d2h_bytes_per_second", 5e10}, {"h2d_bytes_per_second", 5e10}}},
      {"layers", Layers()}};
  Json stages = Json::array();
  if (vpp == 1) {
    stages = {Stage(0, {Chunk(0, 2)}), Stage(1, {Chunk(2, 2)})};
  } else {
    stages = {Stage(0, {Chunk(0, 1), Chunk(2, 1)}), Stage(1, {Chunk(1, 1), Chunk(3, 1)})};
  }
  p["pipeline"] = {{"pp", 2}, {"vpp", vpp}, {"gpus", 2}, {"stages", stages}};
  return p;
}

HardwareProfile H200() { return *HardwarePreset("h200"); }

TEST(PipelinedProfileReader, RoundTripsExactly) {
  for (int vpp : {1, 2}) {
    const LayerProfileSet p = Parse(PipelinedProfile(vpp));
    ASSERT_TRUE(p.pipeline.has_value());
    EXPECT_EQ(p.pipeline->pp, 2);
    EXPECT_EQ(p.pipeline->vpp, vpp);
    EXPECT_EQ(p.pipeline->gpus, 2);
    ASSERT_EQ(p.pipeline->stages.size(), 2u);
    ASSERT_EQ(p.pipeline->stages[1].chunks.size(), static_cast<size_t>(vpp));
    EXPECT_EQ(p.pipeline->stages[1].chunks[0].first_layer, vpp == 1 ? 2 : 1);
    EXPECT_EQ(p.pipeline->stages[1].fixed.other, 40 * kMiB);
    EXPECT_EQ(p.pipeline->stages[1].model_parameters, 1001u);
    const std::string text = ProfileToJson(p);
    EXPECT_THAT(text, HasSubstr("\"schema_version\": 3"));
    const LayerProfileSet again = Parse(Json::parse(text));
    EXPECT_EQ(ProfileToJson(again), text);
    ASSERT_TRUE(again.pipeline.has_value());
    EXPECT_EQ(Json::parse(text)["pipeline"], PipelinedProfile(vpp)["pipeline"]);
  }
  // gpus defaults to pp and is written back.
  Json j = PipelinedProfile(1);
  j["pipeline"].erase("gpus");
  EXPECT_EQ(Parse(j).pipeline->gpus, 2);
  // A one-stage profile writes no pipeline.
  j.erase("pipeline");
  EXPECT_THAT(ProfileToJson(Parse(j)), ::testing::Not(HasSubstr("pipeline")));
}

TEST(PipelinedProfileReader, ErrorsNameThePath) {
  Json j = PipelinedProfile(1);
  j["pipeline"]["pp"] = 1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'pipeline.pp' has value 1; allowed: an integer in [2,"));

  j = PipelinedProfile(1);
  j["pipeline"]["stages"].erase(1);
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'pipeline.stages' has value"));
  EXPECT_THAT(ErrorOf(j), HasSubstr("exactly pp (2) entries, one per stage; got 1"));

  j = PipelinedProfile(2);
  j["pipeline"]["stages"][1]["chunks"].erase(1);
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'pipeline.stages[1].chunks' has value"));
  EXPECT_THAT(ErrorOf(j), HasSubstr("exactly vpp (2) model chunks; got 1"));

  j = PipelinedProfile(1);  // a gap: stage 1 starts at layer 3
  j["pipeline"]["stages"][1]["chunks"][0] = Chunk(3, 1);
  EXPECT_THAT(
      ErrorOf(j),
      HasSubstr("field 'pipeline.stages[1].chunks[0].first_layer' has value 3; allowed: 2"));

  j = PipelinedProfile(2);  // an overlap: virtual stage 2 (chunk 1 of stage 0) starts at layer 1
  j["pipeline"]["stages"][0]["chunks"][1] = Chunk(1, 2);
  EXPECT_THAT(
      ErrorOf(j),
      HasSubstr("field 'pipeline.stages[0].chunks[1].first_layer' has value 1; allowed: 2"));

  j = PipelinedProfile(1);  // not covering the last layer
  j["pipeline"]["stages"][1]["chunks"][0] = Chunk(2, 1);
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'pipeline.stages[1].chunks[0].num_layers' has value 1; "
                                    "allowed: 2: the last virtual stage"));

  j = PipelinedProfile(1);
  j["pipeline"]["gpus"] = 3;
  EXPECT_THAT(ErrorOf(j),
              HasSubstr("field 'pipeline.gpus' has value 3; allowed: a multiple of pp (2)"));

  j = PipelinedProfile(1);
  j["pipeline"]["stages"][0]["stage"] = 1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'pipeline.stages[0].stage' has value 1"));

  j = PipelinedProfile(1);
  j["schema_version"] = 2;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'pipeline' has value"));
  EXPECT_THAT(ErrorOf(j), HasSubstr("absent in a schema_version 2 profile (schema_version 3 added "
                                    "it)"));

  j = PipelinedProfile(1);
  j["pipeline"]["schedule"] = "1f1b";
  EXPECT_THAT(ErrorOf(j), HasSubstr("unknown field 'pipeline.schedule'; allowed in 'pipeline'"));
  j = PipelinedProfile(1);
  j["pipeline"]["stages"][1]["chunks"][0]["last_layer"] = 3;
  EXPECT_THAT(ErrorOf(j), HasSubstr("unknown field 'pipeline.stages[1].chunks[0].last_layer'"));
  j = PipelinedProfile(1);
  j["pipeline"]["stages"][0]["fixed_bytes"].erase("weights");
  EXPECT_THAT(ErrorOf(j), HasSubstr("pipeline.stages[0].fixed_bytes.weights"));
}

TEST(PipelinedProfileStepCost, EachStageHasItsLayersInFlightCountsAndFixedMemory) {
  const HardwareProfile hw = H200();
  for (int vpp : {1, 2}) {
    const LayerProfileSet p = Parse(PipelinedProfile(vpp));
    auto run = ProfileRunSettings(p.pipeline, 4, "microbatches");
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->schedule, vpp > 1 ? PipelineSchedule::kInterleaved : PipelineSchedule::k1F1B);
    auto stages = BuildStageStepCostsFromProfile(p, hw, *run);
    ASSERT_TRUE(stages.ok()) << stages.status();
    ASSERT_EQ(stages->size(), 2u);
    const std::vector<std::vector<int>> indices =
        vpp == 1 ? std::vector<std::vector<int>>{{0, 1}, {2, 3}}
                 : std::vector<std::vector<int>>{{0, 2}, {1, 3}};
    for (int s = 0; s < 2; ++s) {
      const StepCost& c = (*stages)[s];
      EXPECT_EQ(c.stage, s);
      EXPECT_EQ(c.run.pp, 2);
      EXPECT_EQ(c.run.vpp, vpp);
      EXPECT_EQ(c.run.microbatches, 4);
      EXPECT_EQ(c.run.gpus, 2);
      EXPECT_EQ(c.run.tp * c.run.cp * c.run.ep, 1);
      ASSERT_EQ(c.chunks.size(), static_cast<size_t>(vpp));
      ASSERT_EQ(c.layers.size(), 2u);
      for (size_t k = 0; k < 2; ++k) {
        EXPECT_EQ(c.layers[k].index, indices[s][k]);
        EXPECT_EQ(c.layers[k].input_bytes, p.layers[indices[s][k]].input_bytes);
        const int chunk = vpp == 1 ? 0 : static_cast<int>(k);
        EXPECT_EQ(c.layers[k].in_flight_microbatches,
                  InFlightMicrobatches(run->schedule, 2, vpp, 4, s, chunk))
            << "vpp " << vpp << " stage " << s << " layer " << k;
      }
      EXPECT_EQ(c.fixed.total(), (100 + 20 * s) * kMiB);
      EXPECT_EQ(c.model_parameters, 1000u + s);
      EXPECT_TRUE(c.comm.layers.empty());
    }
    // The first stage holds two microbatches under 1F1B.
    if (vpp == 1) {
      EXPECT_EQ((*stages)[0].layers[0].in_flight_microbatches, 2);
    }
    EXPECT_DOUBLE_EQ((*stages)[0].embedding_seconds, 0.002);
    EXPECT_DOUBLE_EQ((*stages)[1].embedding_seconds, 0);
    EXPECT_EQ((*stages)[0].tail_bytes, 0u);
    EXPECT_DOUBLE_EQ((*stages)[0].tail_seconds, 0);
    EXPECT_EQ((*stages)[1].tail_bytes, 8 * kMiB + 64 * kMiB);
    EXPECT_DOUBLE_EQ((*stages)[1].tail_seconds, 0.004);
    // The hidden state a stage receives: vpp 1: layer 2's input; vpp 2: layers 1, 2, 3's, the
    // largest layer 3's.
    EXPECT_DOUBLE_EQ(ProfileMessageBytes(p), (vpp == 1 ? 24 : 32) * static_cast<double>(kMiB));
  }
}

TEST(PipelinedProfileStepCost, MicrobatchesTheScheduleCannotRunAreRefused) {
  const LayerProfileSet p = Parse(PipelinedProfile(2));
  auto run = ProfileRunSettings(p.pipeline, 3, "--microbatches");
  ASSERT_FALSE(run.ok());
  EXPECT_THAT(
      run.status().message(),
      HasSubstr("--microbatches is 3; allowed: a multiple of the profile's pipeline.pp (2)"));
  EXPECT_FALSE(PlanPipeline(p, H200(), 3, OptimizerOptions{}).ok());
  EXPECT_FALSE(ProfileRunSettings(p.pipeline, 0, "microbatches").ok());
  // 1F1B runs any count.
  EXPECT_TRUE(ProfileRunSettings(Parse(PipelinedProfile(1)).pipeline, 3, "microbatches").ok());
}

// The step from the stages' own simulations: M x steady slot + (pp - 1) / vpp x fill-and-drain
// slot + once, each slot the longest of any stage, the point-to-point time from the messages the
// stages receive over the link their boundary crosses.
TEST(PipelinedProfilePlanning, TheStepCombinesTheStagesSimulations) {
  const HardwareProfile hw = H200();
  for (int vpp : {1, 2}) {
    const LayerProfileSet p = Parse(PipelinedProfile(vpp));
    OptimizerOptions options;
    options.gpu_budget_bytes = 4ull << 30;
    options.host_budget_bytes = 4ull << 30;
    auto pipeline = PlanPipeline(p, hw, 4, options);
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    ASSERT_TRUE(pipeline->feasible);
    ASSERT_EQ(pipeline->stages.size(), 2u);
    auto run = ProfileRunSettings(p.pipeline, 4, "microbatches");
    const double message = ProfileMessageBytes(p);
    EXPECT_DOUBLE_EQ(pipeline->p2p_message_bytes, message);
    double steady = 0, bubble = 0;
    uint64_t peak = 0;
    int binding = 0;
    for (int s = 0; s < 2; ++s) {
      auto step = BuildStageStepCostFromProfile(p, hw, *run, s);
      ASSERT_TRUE(step.ok());
      const OptimizeResult own = Optimize(*step, options);
      const double slot = MicrobatchSeconds(*step, own.sim);
      EXPECT_DOUBLE_EQ(MicrobatchSeconds(pipeline->stages[s].step, pipeline->stages[s].result.sim),
                       slot);
      // Both stages' ranks share one NVLink domain; each chunk exchanges with the virtual stages
      // beside it, one message per exchange.
      const CommLink link = StageLink(hw, 2, 2, s, 1 - s, GroupsOf(*run).stage_stride);
      const double one = PointToPointSeconds(hw, link, message);
      int exchanges = 0;
      for (int k = 0; k < vpp; ++k) {
        const int v = k * 2 + s;
        exchanges += (v > 0 ? 1 : 0) + (v < 2 * vpp - 1 ? 1 : 0);
      }
      const double blocking = exchanges * one;
      EXPECT_DOUBLE_EQ(pipeline->stages[s].p2p_blocking_seconds, blocking);
      double steady_p2p = blocking;
      if (vpp > 1) {  // each exchange behind the chunk's opposite pass
        steady_p2p = 0;
        for (const LayerCost& l : step->layers) {
          steady_p2p +=
              std::max(0.0, one - l.backward_seconds) + std::max(0.0, one - l.forward_seconds);
        }
      }
      EXPECT_NEAR(pipeline->stages[s].p2p_steady_seconds, steady_p2p, 1e-15);
      steady = std::max(steady, slot + steady_p2p);
      bubble = std::max(bubble, slot + blocking);
      if (own.sim.peak_bytes > peak) peak = own.sim.peak_bytes, binding = s;
    }
    const double expected = 4 * steady + 1.0 / vpp * bubble;  // nothing once per step
    EXPECT_NEAR(pipeline->step_seconds, expected, 1e-12 * expected) << "vpp " << vpp;
    EXPECT_EQ(pipeline->binding_stage, binding);
    EXPECT_GT(pipeline->step_seconds, 4 * 2 * 0.03);  // at least each stage's compute
  }
}

TEST(PipelinedProfilePlanning, ThePipelinedPlanValidatesAndRoundTrips) {
  for (int vpp : {1, 2}) {
    const LayerProfileSet p = Parse(PipelinedProfile(vpp));
    OptimizerOptions options;
    options.gpu_budget_bytes = 4ull << 30;
    options.host_budget_bytes = 4ull << 30;
    auto pipeline = PlanPipeline(p, H200(), 4, options);
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    const Plan plan = MakePipelinePlan(
        *pipeline,
        PlanLabels{"test", "profile", "h200", options.gpu_budget_bytes, options.host_budget_bytes});
    ASSERT_TRUE(ValidatePlan(plan).ok()) << ValidatePlan(plan);
    EXPECT_EQ(plan.pp, 2);
    EXPECT_EQ(plan.vpp, vpp);
    EXPECT_EQ(plan.microbatches, 4);
    ASSERT_EQ(plan.stages.size(), 2u);
    ASSERT_EQ(plan.layers.size(), 4u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(plan.layers[i].index, i);
    EXPECT_EQ(plan.stages[1].chunks[0].first_layer, vpp == 1 ? 2 : 1);
    EXPECT_EQ(plan.stages[0].fixed_device_bytes, 100 * kMiB);
    EXPECT_EQ(plan.stages[1].fixed_device_bytes, 120 * kMiB);
    auto again = ParsePlanJson(PlanToJson(plan));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(PlanToJson(*again), PlanToJson(plan));
  }
}

// Keeping everything holds each in-flight microbatch's 128-152 MiB per layer: a budget below that
// peak fits only when the binding stage moves saved tensors to the host.
TEST(PipelinedProfilePlanning, ATightBudgetMakesTheBindingStageOffload) {
  const LayerProfileSet p = Parse(PipelinedProfile(1));
  OptimizerOptions roomy;
  roomy.gpu_budget_bytes = 8ull << 30;
  roomy.host_budget_bytes = 8ull << 30;
  auto kept = PlanPipeline(p, H200(), 4, roomy);
  ASSERT_TRUE(kept.ok());
  const StageResult& b = kept->stages[kept->binding_stage];
  for (const LayerOption& o : b.result.schedule.options) EXPECT_EQ(o.policy, LayerPolicy::kKeep);
  OptimizerOptions tight = roomy;
  tight.gpu_budget_bytes = b.result.sim.peak_bytes - 100 * kMiB;
  auto planned = PlanPipeline(p, H200(), 4, tight);
  ASSERT_TRUE(planned.ok());
  ASSERT_TRUE(planned->feasible);
  const StageResult& tb = planned->stages[planned->binding_stage];
  EXPECT_LE(tb.result.sim.peak_bytes, tight.gpu_budget_bytes);
  EXPECT_GT(tb.result.sim.host_bytes, 0u);
  EXPECT_TRUE(std::any_of(tb.result.schedule.options.begin(), tb.result.schedule.options.end(),
                          [](const LayerOption& o) {
                            return o.policy == LayerPolicy::kOffloadSaved ||
                                   o.policy == LayerPolicy::kOffloadInput;
                          }));
  // Nothing fits below the smallest peak: the binding stage says so.
  tight.gpu_budget_bytes = 150 * kMiB;
  auto none = PlanPipeline(p, H200(), 4, tight);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->feasible);
}

// A one-stage profile with M microbatches is gradient accumulation: one stage, each layer one
// microbatch in flight, the step M slots; M = 1 is the one-stage plan.
TEST(PipelinedProfilePlanning, OneStageWithMicrobatchesIsGradientAccumulation) {
  Json j = PipelinedProfile(1);
  j.erase("pipeline");
  const LayerProfileSet p = Parse(j);
  OptimizerOptions options;
  options.gpu_budget_bytes = 4ull << 30;
  options.host_budget_bytes = 4ull << 30;
  auto one = BuildStepCostFromProfile(p, H200());
  ASSERT_TRUE(one.ok());
  const OptimizeResult alone = Optimize(*one, options);
  auto m1 = PlanPipeline(p, H200(), 1, options);
  ASSERT_TRUE(m1.ok());
  EXPECT_DOUBLE_EQ(m1->step_seconds, alone.sim.step_seconds);
  auto m3 = PlanPipeline(p, H200(), 3, options);
  ASSERT_TRUE(m3.ok());
  ASSERT_EQ(m3->stages.size(), 1u);
  for (const LayerCost& l : m3->stages[0].step.layers) EXPECT_EQ(l.in_flight_microbatches, 1);
  EXPECT_NEAR(m3->step_seconds, 3 * MicrobatchSeconds(*one, alone.sim), 1e-12);
  const Plan plan = MakePipelinePlan(
      *m3,
      PlanLabels{"test", "profile", "h200", options.gpu_budget_bytes, options.host_budget_bytes});
  EXPECT_TRUE(ValidatePlan(plan).ok()) << ValidatePlan(plan);
  EXPECT_EQ(plan.microbatches, 3);
  EXPECT_EQ(plan.pp, 1);
}

// The model path is PlanStages over BuildStepCost's stages and PipelineMessageBytes: the same
// combination as a profile's.
TEST(PipelinedProfilePlanning, AModelsPipelineIsPlanStagesOverItsStages) {
  const ModelConfig llama = *ModelPreset("llama-3.1-8b");
  const HardwareProfile hw = H200();
  RunSettings run = PpRun(4, 8);
  run.seq_len = 8192;
  OptimizerOptions options;
  options.gpu_budget_bytes = 40ull << 30;
  options.host_budget_bytes = 40ull << 30;
  auto model = PlanPipeline(llama, hw, run, options);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<StepCost> stages;
  for (int s = 0; s < 4; ++s) stages.push_back(*BuildStepCost(llama, hw, run, s));
  auto combined = PlanStages(stages, hw, run, PipelineMessageBytes(llama, run), options);
  ASSERT_TRUE(combined.ok()) << combined.status();
  EXPECT_EQ(combined->binding_stage, model->binding_stage);
  EXPECT_EQ(combined->slowest_stage, model->slowest_stage);
  EXPECT_DOUBLE_EQ(combined->step_seconds, model->step_seconds);
  EXPECT_DOUBLE_EQ(combined->baseline_step_seconds, model->baseline_step_seconds);
  EXPECT_DOUBLE_EQ(combined->p2p_step_seconds, model->p2p_step_seconds);
  EXPECT_GT(model->p2p_step_seconds, 0);
  // One stage step cost per stage, or an error.
  stages.pop_back();
  EXPECT_FALSE(PlanStages(stages, hw, run, 0, options).ok());
}

}  // namespace
}  // namespace stowage::planner
