#include "stowage/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stowage {
namespace {

using ::testing::HasSubstr;

Plan TwoLayerPlan() {
  Plan plan;
  plan.generator = "stowage test";
  plan.model = "tiny";
  plan.seq_len = 4096;
  plan.predicted.peak_device_bytes = 1000;
  plan.predicted.host_bytes_per_gpu = 300;
  plan.predicted.step_seconds = 1.5;
  plan.predicted.exposed_copy_seconds = 0.25;
  plan.runtime.host_arena_bytes = 300;
  plan.runtime.prefetch_distance = 2;
  plan.runtime.link_bytes_per_second = 55.3e9;
  LayerPlan keep;
  keep.index = 0;
  keep.type = "attention+swiglu";
  keep.device_saved_bytes = 500;
  LayerPlan offload;
  offload.index = 1;
  offload.type = "attention+swiglu";
  offload.policy = LayerPolicy::kOffloadInput;
  offload.host_bytes = 300;
  offload.transfers = {{"input", 200}, {"extra", 100}};
  offload.save_wait_before_layer = 2;  // past the last layer: backward start
  offload.prefetch_after_layer = 1;
  plan.layers = {keep, offload};
  return plan;
}

TEST(PlanJson, RoundTripIsExactAndStable) {
  const Plan plan = TwoLayerPlan();
  const std::string json = PlanToJson(plan);
  auto parsed = ParsePlanJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(PlanToJson(*parsed), json);
  EXPECT_EQ(parsed->layers[1].policy, LayerPolicy::kOffloadInput);
  EXPECT_EQ(parsed->layers[1].transfers[1].bytes, 100u);
  EXPECT_EQ(parsed->runtime.prefetch_distance, 2);
  EXPECT_DOUBLE_EQ(parsed->runtime.link_bytes_per_second, 55.3e9);
  EXPECT_DOUBLE_EQ(parsed->predicted.step_seconds, 1.5);
}

TEST(PlanJson, ContractFieldsArePresent) {
  const std::string json = PlanToJson(TwoLayerPlan());
  for (const char* field :
       {"\"schema_version\"", "\"peak_device_bytes\"", "\"host_bytes_per_gpu\"", "\"step_seconds\"",
        "\"exposed_copy_seconds\"", "\"device_saved_bytes\"", "\"host_bytes\"",
        "\"policy\": \"offload_input\"", "\"prefetch_distance\""}) {
    EXPECT_THAT(json, HasSubstr(field));
  }
}

TEST(PlanJson, ErrorsNameTheField) {
  EXPECT_THAT(ParsePlanJson("{").status().message(), HasSubstr("plan: not valid JSON at line 1"));
  EXPECT_THAT(ParsePlanJson(R"({"schema_version": 99})").status().message(),
              HasSubstr("'schema_version' is 99"));

  std::string json = PlanToJson(TwoLayerPlan());
  std::string bad_policy = json;
  bad_policy.replace(bad_policy.find("offload_input"), 13, "offload_every");
  auto status = ParsePlanJson(bad_policy).status();
  EXPECT_THAT(status.message(), HasSubstr("layers[1].policy"));
  EXPECT_THAT(status.message(), HasSubstr("offload_every"));
  EXPECT_THAT(status.message(), HasSubstr("allowed: keep"));

  std::string bad_type = json;
  bad_type.replace(bad_type.find("\"host_bytes\": 300"), 17, "\"host_bytes\": \"x\"");
  EXPECT_THAT(ParsePlanJson(bad_type).status().message(),
              HasSubstr("'layers[1].host_bytes' has value \"x\""));
}

TEST(PlanValidation, RejectsInconsistentPlans) {
  Plan plan = TwoLayerPlan();
  plan.layers[1].transfers[0].bytes = 1;
  EXPECT_THAT(ValidatePlan(plan).message(), HasSubstr("layers[1].transfers' sum to 101"));

  plan = TwoLayerPlan();
  plan.runtime.host_arena_bytes = 299;
  EXPECT_THAT(ValidatePlan(plan).message(), HasSubstr("'runtime.host_arena_bytes' is 299"));

  plan = TwoLayerPlan();
  plan.layers[0].host_bytes = 5;
  plan.layers[0].transfers = {{"input", 5}};
  plan.runtime.host_arena_bytes = 305;
  EXPECT_THAT(ValidatePlan(plan).message(), HasSubstr("policy 'keep' offloads nothing"));

  plan = TwoLayerPlan();
  plan.layers[1].index = 7;
  EXPECT_THAT(ValidatePlan(plan).message(), HasSubstr("'layers[1].index' is 7"));
}

// Note [Runtime protocol]: the fields are LayerProtocolFor's, so what the simulator predicted is
// what the runtime and the wrapper run.
TEST(PlanProtocol, FieldsMustBeTheProtocolFunction) {
  EXPECT_EQ(LayerProtocolFor(1, 6, true, 2, 2).save_wait_before_layer, 3);
  EXPECT_EQ(LayerProtocolFor(1, 6, true, 2, 2).prefetch_after_layer, 3);
  EXPECT_EQ(LayerProtocolFor(4, 6, true, 2, 2).save_wait_before_layer, 6);  // backward start
  EXPECT_EQ(LayerProtocolFor(4, 6, true, 2, 2).prefetch_after_layer, 5);
  EXPECT_EQ(LayerProtocolFor(1, 6, false, 2, 2).save_wait_before_layer, -1);
  EXPECT_EQ(LayerProtocolFor(1, 6, true, 1 << 30, 1 << 30).prefetch_after_layer, 5);

  Plan plan = TwoLayerPlan();
  plan.layers[1].prefetch_after_layer = 0;
  EXPECT_THAT(ValidatePlan(plan).message(),
              HasSubstr("'layers[1].prefetch_after_layer' has value 0; allowed: -1 (restore on "
                        "demand) or 1"));
  plan = TwoLayerPlan();
  plan.layers[1].save_wait_before_layer = 1;
  EXPECT_THAT(ValidatePlan(plan).message(),
              HasSubstr("'layers[1].save_wait_before_layer' has value 1; allowed: 2 "
                        "(min(index + runtime.save_lag, number of layers))"));
  plan = TwoLayerPlan();
  plan.layers[0].prefetch_after_layer = 1;
  EXPECT_THAT(ValidatePlan(plan).message(), HasSubstr("the layer offloads nothing"));
  plan = TwoLayerPlan();
  plan.runtime.save_lag = 0;
  EXPECT_THAT(ValidatePlan(plan).message(), HasSubstr("'runtime.save_lag' has value 0"));
}

// A plan written before the protocol fields existed reads with the protocol's own values.
TEST(PlanProtocol, MissingFieldsAreTheProtocolFunction) {
  std::string json = PlanToJson(TwoLayerPlan());
  for (const char* field : {"\"save_wait_before_layer\": 2,", "\"prefetch_after_layer\": 1,"}) {
    const size_t at = json.find(field);
    ASSERT_NE(at, std::string::npos) << field;
    json.erase(at, std::string(field).size());
  }
  auto parsed = ParsePlanJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->layers[1].save_wait_before_layer, 2);
  EXPECT_EQ(parsed->layers[1].prefetch_after_layer, 1);
  EXPECT_EQ(parsed->layers[0].save_wait_before_layer, -1);
}

TEST(StepEventKind, Names) {
  EXPECT_EQ(StepEventKindName(StepEventKind::kSaveIssued), "save_issued");
  EXPECT_EQ(StepEventKindName(StepEventKind::kSaveLanded), "save_landed");
  EXPECT_EQ(StepEventKindName(StepEventKind::kSaveWait), "save_wait");
  EXPECT_EQ(StepEventKindName(StepEventKind::kPrefetchIssued), "prefetch_issued");
  EXPECT_EQ(StepEventKindName(StepEventKind::kPrefetchLanded), "prefetch_landed");
  EXPECT_EQ(StepEventKindName(StepEventKind::kRestore), "restore");
}

TEST(LayerPolicy, NamesRoundTrip) {
  for (LayerPolicy p :
       {LayerPolicy::kKeep, LayerPolicy::kRecompute, LayerPolicy::kSelectiveRecompute,
        LayerPolicy::kOffloadInput, LayerPolicy::kOffloadSaved}) {
    auto parsed = ParseLayerPolicy(LayerPolicyName(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_FALSE(ParseLayerPolicy("Keep").ok());
}

}  // namespace
}  // namespace stowage
