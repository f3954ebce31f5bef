#include "stowage/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

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

  // Note [Optimality gap] (planner/search/optimizer.cc): the search's three outcomes, a gap >= 0.
  plan = TwoLayerPlan();
  plan.predicted.optimality = "optimal";
  EXPECT_THAT(
      ValidatePlan(plan).message(),
      HasSubstr("predicted.optimality is 'optimal'; allowed: proven, within_gap, unproven"));
  plan = TwoLayerPlan();
  plan.predicted.optimality_gap = -1e-3;
  EXPECT_THAT(ValidatePlan(plan).message(), HasSubstr("predicted.optimality_gap"));
}

TEST(PlanJson, OptimalityRoundTripsAndIsOptional) {
  Plan plan = TwoLayerPlan();
  plan.predicted.optimality = "within_gap";
  plan.predicted.optimality_gap = 4.5e-5;
  const std::string json = PlanToJson(plan);
  EXPECT_THAT(json, HasSubstr("\"optimality\": \"within_gap\""));
  auto parsed = ParsePlanJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->predicted.optimality, "within_gap");
  EXPECT_DOUBLE_EQ(parsed->predicted.optimality_gap, 4.5e-5);
  // A plan written before the fields reads with none.
  std::string old = PlanToJson(TwoLayerPlan());
  old.replace(old.find(",\n    \"optimality\""), std::string(",\n    \"optimality\": \"\"").size(),
              "");
  auto read_old = ParsePlanJson(old);
  ASSERT_TRUE(read_old.ok()) << read_old.status() << old;
  EXPECT_EQ(read_old->predicted.optimality, "");
}

// run.sequence_parallel: written only when false (a plan with it keeps its bytes and hash),
// absent reads as true, anything but a JSON bool is refused naming the field.
TEST(PlanJson, SequenceParallelIsWrittenOnlyWhenFalse) {
  Plan plan = TwoLayerPlan();
  plan.tp = 8;
  const std::string with = PlanToJson(plan);
  EXPECT_THAT(with, ::testing::Not(HasSubstr("sequence_parallel")));
  auto read_with = ParsePlanJson(with);
  ASSERT_TRUE(read_with.ok()) << read_with.status();
  EXPECT_TRUE(read_with->sequence_parallel);
  const uint64_t hash = CanonicalPlanHash(plan);

  plan.sequence_parallel = false;
  const std::string without = PlanToJson(plan);
  EXPECT_THAT(without, HasSubstr("\"sequence_parallel\": false"));
  EXPECT_NE(CanonicalPlanHash(plan), hash);
  auto read_without = ParsePlanJson(without);
  ASSERT_TRUE(read_without.ok()) << read_without.status();
  EXPECT_FALSE(read_without->sequence_parallel);
  EXPECT_EQ(PlanToJson(*read_without), without);
  EXPECT_TRUE(ValidatePlan(*read_without).ok()) << ValidatePlan(*read_without);

  std::string explicit_true = without;
  explicit_true.replace(explicit_true.find("\"sequence_parallel\": false"),
                        std::string("\"sequence_parallel\": false").size(),
                        "\"sequence_parallel\": true");
  auto read_true = ParsePlanJson(explicit_true);
  ASSERT_TRUE(read_true.ok()) << read_true.status();
  EXPECT_TRUE(read_true->sequence_parallel);
  EXPECT_EQ(PlanToJson(*read_true), with);

  std::string bad = without;
  bad.replace(bad.find("\"sequence_parallel\": false"),
              std::string("\"sequence_parallel\": false").size(), "\"sequence_parallel\": 0");
  EXPECT_THAT(ParsePlanJson(bad).status().message(), HasSubstr("run.sequence_parallel"));
}

// Note [Plans that do not fit]: the closest plan when nothing fits, 200 bytes over its GPU budget.
Plan OverBudgetPlan() {
  Plan plan = TwoLayerPlan();
  plan.gpu_budget_bytes = 800;  // the peak is 1000
  plan.host_budget_bytes = 1000;
  plan.fits = false;
  plan.binding = {"gpu",
                  200,
                  0,
                  "backward of layer 1",
                  "working set of the backward of layer 1",
                  "one layer's working set does not fit next to 600 B of fixed memory"};
  return plan;
}

TEST(PlanFits, APlanThatDoesNotFitRoundTripsWithItsBinding) {
  const std::string json = PlanToJson(OverBudgetPlan());
  EXPECT_THAT(json, HasSubstr("\"fits\": false"));
  EXPECT_THAT(json, HasSubstr("\"exceeded_by_bytes\": 200"));
  auto parsed = ParsePlanJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->fits);
  EXPECT_EQ(parsed->binding.budget, "gpu");
  EXPECT_EQ(parsed->binding.at, "backward of layer 1");
  EXPECT_EQ(parsed->binding.what, "working set of the backward of layer 1");
  EXPECT_EQ(PlanToJson(*parsed), json);
  // A plan that fits says so, and carries no binding.
  const std::string fits = PlanToJson(TwoLayerPlan());
  EXPECT_THAT(fits, HasSubstr("\"fits\": true"));
  EXPECT_THAT(fits, ::testing::Not(HasSubstr("\"binding\"")));
  // Plans written before the field existed fit.
  nlohmann::json old = nlohmann::json::parse(fits);
  old.erase("fits");
  auto read = ParsePlanJson(old.dump());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->fits);
}

TEST(PlanFits, FitsAndBindingMustAgreeWithTheBudgets) {
  // Says it fits, but its peak is over the budget.
  Plan plan = OverBudgetPlan();
  plan.fits = true;
  EXPECT_THAT(ValidatePlan(plan).message(),
              HasSubstr("'fits' is true but stages[0].peak_device_bytes (1000) exceeds "
                        "run.gpu_budget_bytes (800) by 200 bytes"));
  plan = OverBudgetPlan();
  plan.fits = true;
  plan.gpu_budget_bytes = 0;  // no budget stated: nothing to exceed
  plan.host_budget_bytes = 299;
  EXPECT_THAT(ValidatePlan(plan).message(), HasSubstr("host_bytes_per_gpu (300) exceeds"));
  plan = OverBudgetPlan();
  plan.binding.exceeded_by_bytes = 199;
  EXPECT_THAT(ValidatePlan(plan).message(),
              HasSubstr("'binding.exceeded_by_bytes' has value 199; allowed: 200"));
  plan = OverBudgetPlan();
  plan.binding.budget = "host";  // 300 pinned bytes are within the host budget of 1000
  EXPECT_THAT(ValidatePlan(plan).message(), HasSubstr("allowed: none: the budget is not exceeded"));
  plan = OverBudgetPlan();
  plan.binding.budget = "disk";
  EXPECT_THAT(ValidatePlan(plan).message(),
              HasSubstr("'binding.budget' has value 'disk'; allowed: gpu, host"));
  plan = OverBudgetPlan();
  plan.binding.stage = 1;
  EXPECT_THAT(ValidatePlan(plan).message(), HasSubstr("'binding.stage' has value 1"));
  // The reader wants the reason of a plan that does not fit.
  nlohmann::json j = nlohmann::json::parse(PlanToJson(OverBudgetPlan()));
  j.erase("binding");
  EXPECT_THAT(ParsePlanJson(j.dump()).status().message(), HasSubstr("binding"));
  j = nlohmann::json::parse(PlanToJson(OverBudgetPlan()));
  j["binding"].erase("exceeded_by_bytes");
  EXPECT_THAT(ParsePlanJson(j.dump()).status().message(), HasSubstr("binding.exceeded_by_bytes"));
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

// Note [Pipeline stages]: hand counts of what each stage holds.
TEST(InFlightMicrobatches, OneFOneBHoldsPpMinusStage) {
  // pp 4, 8 microbatches: stage s runs 3 - s warmup forwards, then one more before each
  // backward.
  for (int stage = 0; stage < 4; ++stage) {
    EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::k1F1B, 4, 1, 8, stage, 0), 4 - stage);
  }
  // Fewer microbatches than stages: all of them, at most.
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::k1F1B, 4, 1, 2, 0, 0), 2);
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::k1F1B, 4, 1, 2, 2, 0), 2);
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::k1F1B, 4, 1, 2, 3, 0), 1);
  // DeepSeek-V3's pp 16 with 16 microbatches: stage 0 holds all 16, the last one.
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::k1F1B, 16, 1, 16, 0, 0), 16);
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::k1F1B, 16, 1, 16, 15, 0), 1);
  // No pipeline: one at a time (gradient accumulation).
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::k1F1B, 1, 1, 32, 0, 0), 1);
}

TEST(InFlightMicrobatches, InterleavedHandCount) {
  // pp 2, vpp 2, 4 microbatches. Forward order (groups of pp = 2 microbatches through chunk 0,
  // then chunk 1): c0 m0, c0 m1, c1 m0, c1 m1, c0 m2, c0 m3, c1 m2, c1 m3; backward the same with
  // the chunks reversed: c1 m0, c1 m1, c0 m0, c0 m1, c1 m2, c1 m3, c0 m2, c0 m3.
  // Stage 0: warmup 2 (2 - 0 - 1) + (2 - 1) 2 = 4 forwards (c0: 2, c1: 2); then F c0 m2 (c0 3),
  // B c1 m0, F c0 m3 (c0 4), B c1 m1 (c1 0), F c1 m2 (c1 1), B c0 m0, F c1 m3 (c1 2), ...
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::kInterleaved, 2, 2, 4, 0, 0), 4);
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::kInterleaved, 2, 2, 4, 0, 1), 2);
  // Stage 1: warmup 0 + 2 = 2 forwards (c0 m0, c0 m1); then F c1 m0, B c1 m0, F c1 m1, B c1 m1,
  // F c0 m2 (c0 3), B c0 m0, F c0 m3 (c0 3), B c0 m1, F c1 m2, B c1 m2, F c1 m3, B c1 m3.
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::kInterleaved, 2, 2, 4, 1, 0), 3);
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::kInterleaved, 2, 2, 4, 1, 1), 1);
  // Out of range: 1.
  EXPECT_EQ(InFlightMicrobatches(PipelineSchedule::kInterleaved, 2, 2, 4, 2, 0), 1);
}

// The whole schedule walked step by step (no shortcut), for the comparison below.
int WalkInterleaved(int pp, int vpp, int m, int stage, int chunk) {
  std::vector<std::pair<int, int>> table;  // (microbatch, chunk)
  for (int first = 0; first < m; first += pp) {
    const int last = std::min(m, first + pp);
    for (int c = 0; c < vpp; ++c) {
      for (int mb = first; mb < last; ++mb) table.push_back({mb, c});
    }
  }
  const int total = m * vpp;
  const int warmup = std::min(2 * (pp - stage - 1) + (vpp - 1) * pp, total);
  std::vector<int> held(vpp, 0);
  int most = 0;
  auto f = [&](int u) {
    if (++held[table[u].second] > most && table[u].second == chunk) most = held[chunk];
  };
  for (int u = 0; u < warmup; ++u) f(u);
  for (int k = 0; k < total - warmup; ++k) {
    f(warmup + k);
    --held[vpp - 1 - table[k].second];
  }
  return std::max(most, 1);
}

TEST(InFlightMicrobatches, InterleavedMatchesTheWholeWalk) {
  for (int pp : {2, 3, 4, 8}) {
    for (int vpp : {2, 3, 4}) {
      for (int m : {pp, 2 * pp, 5 * pp}) {
        for (int stage = 0; stage < pp; ++stage) {
          for (int chunk = 0; chunk < vpp; ++chunk) {
            EXPECT_EQ(
                InFlightMicrobatches(PipelineSchedule::kInterleaved, pp, vpp, m, stage, chunk),
                WalkInterleaved(pp, vpp, m, stage, chunk))
                << "pp " << pp << " vpp " << vpp << " m " << m << " stage " << stage << " chunk "
                << chunk;
          }
        }
      }
    }
  }
}

// Four layers on two 1F1B stages (layers 0-1 and 2-3), 4 microbatches; layers 1 and 3 offload.
Plan TwoStagePlan() {
  Plan plan;
  plan.generator = "stowage test";
  plan.pp = 2;
  plan.microbatches = 4;
  plan.runtime.prefetch_distance = 1;
  for (int i = 0; i < 4; ++i) {
    LayerPlan l;
    l.index = i;
    l.type = "attention+swiglu";
    if (i % 2 == 1) {
      l.policy = LayerPolicy::kOffloadInput;
      l.host_bytes = 100;
      l.transfers = {{"input", 100}};
    }
    const LayerRange chunk{i < 2 ? 0 : 2, 2};
    const LayerProtocol p = LayerProtocolFor(i, chunk, l.host_bytes > 0, 1, kDefaultSaveLag);
    l.save_wait_before_layer = p.save_wait_before_layer;
    l.prefetch_after_layer = p.prefetch_after_layer;
    l.in_flight_microbatches = i < 2 ? 2 : 1;
    plan.layers.push_back(l);
  }
  StagePlan first;
  first.stage = 0;
  first.chunks = {{0, 2}};
  first.prefetch_distance = 1;
  first.embedding = true;
  first.host_arena_bytes = 200;  // layer 1, two microbatches in flight
  StagePlan last;
  last.stage = 1;
  last.chunks = {{2, 2}};
  last.prefetch_distance = 1;
  last.lm_head = true;
  last.host_arena_bytes = 100;
  plan.stages = {first, last};
  plan.runtime.host_arena_bytes = 200;
  return plan;
}

TEST(PlanStages, TwoStagePlanRoundTrips) {
  const Plan plan = TwoStagePlan();
  ASSERT_TRUE(ValidatePlan(plan).ok()) << ValidatePlan(plan);
  const std::string json = PlanToJson(plan);
  EXPECT_THAT(json, HasSubstr("\"schedule\": \"1f1b\""));
  EXPECT_THAT(json, HasSubstr("\"in_flight_microbatches\": 2"));
  auto parsed = ParsePlanJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(PlanToJson(*parsed), json);
  ASSERT_EQ(parsed->stages.size(), 2u);
  EXPECT_EQ(parsed->stages[1].chunks[0].first_layer, 2);
  EXPECT_EQ(PlaceOfLayer(*parsed, 3).stage, 1);
  // Layer 1 ends its chunk: its save wait is the chunk's backward start (2), its prefetch its own
  // backward (1), not layer 2 of the next stage.
  EXPECT_EQ(parsed->layers[1].save_wait_before_layer, 2);
  EXPECT_EQ(parsed->layers[1].prefetch_after_layer, 1);
}

TEST(PlanStages, MissingInFlightAndProtocolAreTheSchedules) {
  nlohmann::json j = nlohmann::json::parse(PlanToJson(TwoStagePlan()));
  for (auto& layer : j["layers"]) {
    layer.erase("in_flight_microbatches");
    layer.erase("save_wait_before_layer");
    layer.erase("prefetch_after_layer");
  }
  auto parsed = ParsePlanJson(j.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(PlanToJson(*parsed), PlanToJson(TwoStagePlan()));
}

TEST(PlanStages, SingleStagePlanWithoutStagesReads) {
  nlohmann::json j = nlohmann::json::parse(PlanToJson(TwoLayerPlan()));
  ASSERT_TRUE(j.contains("stages"));
  EXPECT_EQ(j["stages"].size(), 1u);
  j.erase("stages");
  j["run"].erase("pp");
  auto parsed = ParsePlanJson(j.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->stages.size(), 1u);
  EXPECT_EQ(parsed->stages[0].chunks[0].num_layers, 2);
  EXPECT_EQ(parsed->stages[0].host_arena_bytes, 300u);
  EXPECT_EQ(PlanToJson(*parsed), PlanToJson(TwoLayerPlan()));

  nlohmann::json staged = nlohmann::json::parse(PlanToJson(TwoStagePlan()));
  staged.erase("stages");
  EXPECT_THAT(ParsePlanJson(staged.dump()).status().message(),
              HasSubstr("field 'stages' is missing; a plan with run.pp = 2 lists its 2 stages"));
}

TEST(PlanStages, RejectsInconsistentStages) {
  auto expect = [](Plan plan, const char* message) {
    const absl::Status status = ValidatePlan(plan);
    EXPECT_THAT(status.message(), HasSubstr(message)) << status;
    // The reader says the same of the plan's JSON.
    if (plan.stages.size() == static_cast<size_t>(plan.pp)) {
      EXPECT_THAT(ParsePlanJson(PlanToJson(plan)).status().message(), HasSubstr(message));
    }
  };
  Plan p = TwoStagePlan();
  p.stages.pop_back();
  expect(p, "field 'stages' has 1 stages; run.pp is 2");
  p = TwoStagePlan();
  p.stages[1].chunks[0].first_layer = 3;
  expect(p, "field 'stages[1].chunks[0].first_layer' is 3; allowed: 2");
  p = TwoStagePlan();
  p.stages[1].chunks[0].num_layers = 3;
  expect(p, "chunks cover 5 layers; the plan has 4");
  p = TwoStagePlan();
  p.vpp = 2;
  expect(p, "'run.vpp' has value 2 with run.schedule '1f1b'");
  p = TwoStagePlan();
  p.schedule = PipelineSchedule::kInterleaved;
  expect(p, "'run.vpp' has value 1 with run.schedule 'interleaved'");
  p = TwoStagePlan();
  p.stages[1].embedding = true;
  expect(p, "'stages[1].embedding' is true; the embedding runs on the first stage");
  p = TwoStagePlan();
  p.layers[0].in_flight_microbatches = 1;
  expect(p, "'layers[0].in_flight_microbatches' has value 1; allowed: 2");
  p = TwoStagePlan();
  p.stages[0].host_arena_bytes = 199;
  expect(p, "'stages[0].host_arena_bytes' is 199 but the stage's layers offload 200 bytes");
  p = TwoStagePlan();
  p.layers[1].save_wait_before_layer = 3;
  expect(p, "'layers[1].save_wait_before_layer' has value 3; allowed: 2");
  p = TwoStagePlan();
  p.pp = 1;
  expect(p, "field 'stages' has 2 stages; run.pp is 1");
}

TEST(PlanStages, InterleavedNeedsMicrobatchesInGroupsOfPp) {
  Plan p = TwoStagePlan();
  p.vpp = 2;
  p.schedule = PipelineSchedule::kInterleaved;
  p.microbatches = 3;
  EXPECT_THAT(ValidatePlan(p).message(),
              HasSubstr("'run.microbatches' has value 3; the interleaved schedule runs them in "
                        "groups of run.pp (2): allowed: a multiple of 2"));
}

TEST(PipelineSchedule, NamesRoundTrip) {
  for (PipelineSchedule s : {PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved}) {
    EXPECT_EQ(*ParsePipelineSchedule(PipelineScheduleName(s)), s);
  }
  EXPECT_THAT(ParsePipelineSchedule("gpipe").status().message(),
              HasSubstr("unknown pipeline schedule 'gpipe'; allowed: 1f1b, interleaved"));
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
