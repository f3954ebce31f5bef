// The C ABI's planning calls on a pipelined measured profile (schema_version 3's `pipeline`) and
// the request's `microbatches`: the pipelined plan, the evaluation's per-stage answer, and the
// errors that name the field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "nlohmann/json.hpp"
#include "planner/frameworks/layer_profile.h"
#include "planner/search/pipeline.h"
#include "planner/search/simulator.h"
#include "stowage/plan.h"
#include "stowage/stowage.h"
#include "tests/capi/plan_request_calls.h"

namespace {

using ::stowage::testing::Answer;
using ::stowage::testing::Call;
using ::stowage::testing::Json;
using ::testing::HasSubstr;

// Three layers; pp 2: stage 0 runs layers 0-1, stage 1 layer 2 (and the loss).
Json Profile(bool pipelined) {
  Json p = ::stowage::testing::ThreeLayerProfile();
  p["schema_version"] = 3;
  if (pipelined) {
    p["pipeline"] = Json::parse(R"({"pp": 2, "vpp": 1, "stages": [
        {"stage": 0, "chunks": [{"first_layer": 0, "num_layers": 2}],
         "fixed_bytes": {"weights": 12000, "gradients": 12000, "other": 1000}},
        {"stage": 1, "chunks": [{"first_layer": 2, "num_layers": 1}],
         "fixed_bytes": {"weights": 8000, "gradients": 8000, "other": 1000}}]})");
  }
  return p;
}

TEST(PipelinedPlanRequest, PlansEveryStage) {
  const Answer a = Call(false, {{"profile", Profile(true)}, {"gpu_budget_bytes", 100000}});
  ASSERT_EQ(a.status, STOWAGE_OK) << a.text;
  auto plan = stowage::ParsePlanJson(a.text);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(stowage::ValidatePlan(*plan).ok());
  EXPECT_EQ(plan->pp, 2);
  EXPECT_EQ(plan->vpp, 1);
  EXPECT_EQ(plan->microbatches, 2);  // the default: pp
  ASSERT_EQ(plan->stages.size(), 2u);
  EXPECT_EQ(plan->stages[0].fixed_device_bytes, 25000u);
  EXPECT_EQ(plan->stages[1].fixed_device_bytes, 17000u);
  ASSERT_EQ(plan->layers.size(), 3u);
  // The same step as the planner called directly.
  auto profile = stowage::planner::ParseProfileJson(Profile(true).dump(), "p");
  ASSERT_TRUE(profile.ok());
  stowage::planner::OptimizerOptions o;
  o.gpu_budget_bytes = 100000;
  o.host_budget_bytes = 2 * 3 * 4000;  // every saved byte, stage 0's two in flight
  auto direct = stowage::planner::PlanPipeline(
      *profile, stowage::planner::HardwareForProfile(*profile), 2, o);
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_DOUBLE_EQ(plan->predicted.step_seconds, direct->step_seconds);

  // microbatches as asked; 1F1B takes any count.
  const Answer four =
      Call(false, {{"profile", Profile(true)}, {"gpu_budget_bytes", 100000}, {"microbatches", 3}});
  ASSERT_EQ(four.status, STOWAGE_OK) << four.text;
  EXPECT_EQ(stowage::ParsePlanJson(four.text)->microbatches, 3);

  // Nothing fits: the binding stage is named and the closest pipelined plan comes back.
  const Answer none = Call(false, {{"profile", Profile(true)}, {"gpu_budget_bytes", 26000}});
  EXPECT_EQ(none.status, STOWAGE_ERROR_RESOURCE_EXHAUSTED);
  EXPECT_THAT(none.text, HasSubstr("on pipeline stage 0 (the binding stage) the smallest peak"));
  ASSERT_FALSE(none.closest.empty());
  auto closest = stowage::ParsePlanJson(none.closest);
  ASSERT_TRUE(closest.ok()) << closest.status();
  EXPECT_FALSE(closest->fits);
  EXPECT_EQ(closest->stages.size(), 2u);
}

TEST(PipelinedPlanRequest, OneStageWithMicrobatchesAccumulates) {
  const Answer one = Call(false, {{"profile", Profile(false)}, {"gpu_budget_bytes", 100000}});
  ASSERT_EQ(one.status, STOWAGE_OK) << one.text;
  const Answer three =
      Call(false, {{"profile", Profile(false)}, {"gpu_budget_bytes", 100000}, {"microbatches", 3}});
  ASSERT_EQ(three.status, STOWAGE_OK) << three.text;
  auto p1 = stowage::ParsePlanJson(one.text);
  auto p3 = stowage::ParsePlanJson(three.text);
  ASSERT_TRUE(p1.ok() && p3.ok());
  EXPECT_EQ(p1->microbatches, 1);
  EXPECT_EQ(p3->microbatches, 3);
  EXPECT_EQ(p3->pp, 1);
  EXPECT_TRUE(stowage::ValidatePlan(*p3).ok());
  EXPECT_NEAR(p3->predicted.step_seconds, 3 * p1->predicted.step_seconds,
              1e-9 * p1->predicted.step_seconds);
}

TEST(PipelinedPlanRequest, MicrobatchesErrorsNameTheField) {
  Answer a = Call(false, {{"model", "llama-3-8b"}, {"hardware", "h200"}, {"microbatches", 2}});
  EXPECT_EQ(a.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(a.text, HasSubstr("field 'microbatches' has value 2; allowed: absent with 'model'"));
  a = Call(false, {{"profile", Profile(true)}, {"gpu_budget_bytes", 100000}, {"microbatches", 0}});
  EXPECT_EQ(a.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(a.text, HasSubstr("field 'microbatches' has value 0"));
  Json interleaved = Profile(true);
  interleaved["pipeline"] = Json::parse(R"({"pp": 2, "vpp": 2, "stages": [
      {"stage": 0, "chunks": [{"first_layer": 0, "num_layers": 1}, {"first_layer": 2,
       "num_layers": 0}], "fixed_bytes": {"weights": 1}},
      {"stage": 1, "chunks": [{"first_layer": 1, "num_layers": 1}, {"first_layer": 2,
       "num_layers": 1}], "fixed_bytes": {"weights": 1}}]})");
  a = Call(false, {{"profile", interleaved}, {"gpu_budget_bytes", 100000}, {"microbatches", 3}});
  EXPECT_EQ(a.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(a.text, HasSubstr("microbatches is 3; allowed: a multiple of the profile's "
                                "pipeline.pp (2)"));
  a = Call(false, {{"profile", interleaved}, {"gpu_budget_bytes", 100000}, {"microbatches", 4}});
  EXPECT_EQ(a.status, STOWAGE_OK) << a.text;
}

TEST(PipelinedPlanEvaluate, AnswersTheBindingStageAndEveryStage) {
  Json request = {{"profile", Profile(true)},
                  {"gpu_budget_bytes", 100000},
                  {"microbatches", 4},
                  {"layers",
                   {{{"policy", "offload_saved"}},
                    {{"policy", "selective_recompute"}, {"recompute_modules", {"mlp"}}},
                    {{"policy", "keep"}}}}};
  const Answer a = Call(true, request);
  ASSERT_EQ(a.status, STOWAGE_OK) << a.text;
  const Json r = Json::parse(a.text);
  ASSERT_TRUE(r.contains("stages"));
  ASSERT_EQ(r["stages"].size(), 2u);
  uint64_t peak = 0, host = 0;
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(r["stages"][s]["stage"].get<int>(), s);
    peak = std::max(peak, r["stages"][s]["peak_device_bytes"].get<uint64_t>());
    host = std::max(host, r["stages"][s]["host_bytes"].get<uint64_t>());
    EXPECT_GT(r["stages"][s]["microbatch_seconds"].get<double>(), 0);
  }
  EXPECT_EQ(r["stages"][0]["fixed_device_bytes"].get<uint64_t>(), 25000u);
  // Each stage is its own layers' options simulated on its own step.
  auto profile = stowage::planner::ParseProfileJson(Profile(true).dump(), "p");
  ASSERT_TRUE(profile.ok());
  auto run = stowage::planner::ProfileRunSettings(profile->pipeline, 4, "microbatches");
  ASSERT_TRUE(run.ok());
  auto steps = stowage::planner::BuildStageStepCostsFromProfile(
      *profile, stowage::planner::HardwareForProfile(*profile), *run);
  ASSERT_TRUE(steps.ok());
  const stowage::planner::LayerOption options[3] = {
      {stowage::LayerPolicy::kOffloadSaved, 0, 1},
      {stowage::LayerPolicy::kSelectiveRecompute, 1, 1},
      {stowage::LayerPolicy::kKeep, 0, 1}};
  for (int s = 0; s < 2; ++s) {
    stowage::planner::Schedule schedule;
    for (const auto& l : (*steps)[s].layers) schedule.options.push_back(options[l.index]);
    const auto sim = stowage::planner::Simulate((*steps)[s], schedule, false);
    EXPECT_EQ(r["stages"][s]["peak_device_bytes"].get<uint64_t>(), sim.peak_bytes);
    EXPECT_EQ(r["stages"][s]["host_bytes"].get<uint64_t>(), sim.host_bytes);
    EXPECT_DOUBLE_EQ(r["stages"][s]["microbatch_seconds"].get<double>(),
                     stowage::planner::MicrobatchSeconds((*steps)[s], sim));
  }
  EXPECT_EQ(r["peak_device_bytes"].get<uint64_t>(), peak);
  // The binding stage's intervals name its layers by their model index (stage 0: 0 and 1; stage
  // 1: 2), the embedding and the loss as -1.
  const bool first = r["stages"][0]["peak_device_bytes"].get<uint64_t>() == peak;
  ASSERT_FALSE(r["compute"].empty());
  bool saw_own = false;
  for (const Json& c : r["compute"]) {
    const int layer = c["layer"].get<int>();
    EXPECT_TRUE(layer == -1 || (first ? layer <= 1 : layer == 2)) << c.dump();
    saw_own |= layer == (first ? 1 : 2);
  }
  EXPECT_TRUE(saw_own);
  EXPECT_EQ(r["host_bytes"].get<uint64_t>(), host);
  // Stage 0's layer 0 offloads its 4000 saved bytes for each of its two microbatches in flight.
  EXPECT_EQ(r["stages"][0]["host_bytes"].get<uint64_t>(), 2 * 4000u);
  EXPECT_EQ(r["stages"][1]["host_bytes"].get<uint64_t>(), 0u);
  // The pipelined plan of that assignment, its step the answer's.
  auto plan = stowage::ParsePlanJson(r["plan"].dump());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(stowage::ValidatePlan(*plan).ok());
  EXPECT_EQ(plan->microbatches, 4);
  EXPECT_EQ(plan->layers[0].policy, stowage::LayerPolicy::kOffloadSaved);
  EXPECT_EQ(plan->layers[1].recompute_modules, std::vector<std::string>{"mlp"});
  EXPECT_EQ(plan->layers[2].policy, stowage::LayerPolicy::kKeep);
  EXPECT_DOUBLE_EQ(r["step_seconds"].get<double>(), plan->predicted.step_seconds);
  EXPECT_TRUE(r["fits"].get<bool>());
  // The assignment is every layer of the model, in global order.
  request["layers"].erase(2);
  const Answer short_one = Call(true, request);
  EXPECT_EQ(short_one.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(short_one.text, HasSubstr("one entry per layer of the cost source (3), got 2"));
  // A one-stage profile answers no `stages`.
  request["profile"] = Profile(false);
  request["microbatches"] = 1;
  request["layers"].push_back({{"policy", "keep"}});
  const Answer plain = Call(true, request);
  ASSERT_EQ(plain.status, STOWAGE_OK) << plain.text;
  EXPECT_FALSE(Json::parse(plain.text).contains("stages"));
}

}  // namespace
