// The C ABI's planning calls (stowage_plan_request, stowage_plan_evaluate, stowage_free_string):
// plans and predictions from the one C++ planner, errors as status codes with messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "planner/frameworks/layer_profile.h"
#include "planner/search/optimizer.h"
#include "planner/search/simulator.h"
#include "stowage/plan.h"
#include "stowage/stowage.h"
#include "stowage/stowage.hpp"
#include "tests/capi/plan_request_calls.h"

namespace {

using ::stowage::testing::Answer;
using ::stowage::testing::Call;
using ::stowage::testing::Json;
using ::testing::HasSubstr;

Json Profile() { return ::stowage::testing::ThreeLayerProfile(); }

TEST(PlanRequest, PlansAProfileWithinTheWholeDeviceBudget) {
  Json request = {{"profile", Profile()}, {"gpu_budget_bytes", 60000}};
  const Answer a = Call(false, request);
  ASSERT_EQ(a.status, STOWAGE_OK) << a.text;
  auto plan = stowage::ParsePlanJson(a.text);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(stowage::ValidatePlan(*plan).ok());
  EXPECT_EQ(plan->gpu_budget_bytes, 60000u);
  EXPECT_EQ(plan->predicted.fixed_device_bytes, 41000u);  // fixed memory counts in the peak
  EXPECT_LE(plan->predicted.peak_device_bytes, 60000u);
  EXPECT_THAT(plan->generator, HasSubstr(stowage_version()));
  ASSERT_EQ(plan->layers.size(), 3u);
  // The same answer as the planner called directly.
  auto profile = stowage::planner::ParseProfileJson(Profile().dump(), "p");
  auto step = stowage::planner::BuildStepCostFromProfile(
      *profile, stowage::planner::HardwareForProfile(*profile));
  stowage::planner::OptimizerOptions o;
  o.gpu_budget_bytes = 60000;
  o.host_budget_bytes = 3 * 4000;
  const auto direct = stowage::planner::Optimize(*step, o);
  ASSERT_TRUE(direct.feasible);
  EXPECT_EQ(plan->predicted.peak_device_bytes, direct.sim.peak_bytes);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(plan->layers[i].policy, direct.schedule.options[i].policy);
  }
  // A fixed prefetch distance and a forced policy are honoured.
  request["prefetch_distance"] = 2;
  request["force"] = "offload_saved";
  request["gpu_budget_bytes"] = 1000000;
  const Answer forced = Call(false, request);
  ASSERT_EQ(forced.status, STOWAGE_OK) << forced.text;
  auto fp = stowage::ParsePlanJson(forced.text);
  ASSERT_TRUE(fp.ok());
  EXPECT_EQ(fp->runtime.prefetch_distance, 2);
  for (const auto& l : fp->layers) EXPECT_EQ(l.policy, stowage::LayerPolicy::kOffloadSaved);
}

TEST(PlanRequest, TooSmallABudgetNamesTheSmallestPeakAndWhatBinds) {
  const Answer a = Call(false, {{"profile", Profile()}, {"gpu_budget_bytes", 42000}});
  EXPECT_EQ(a.status, STOWAGE_ERROR_RESOURCE_EXHAUSTED);
  EXPECT_THAT(a.text, HasSubstr("stowage_plan_request: gpu_budget_bytes is 42000"));
  EXPECT_THAT(a.text, HasSubstr("the smallest peak any plan reaches is "));
  EXPECT_THAT(a.text, HasSubstr("what binds: "));
  // The closest plan comes back too, as `stowage plan` prints it (Note [Plans that do not fit]):
  // "fits": false, the GPU budget exceeded by what its peak is over, every layer planned.
  ASSERT_FALSE(a.closest.empty());
  auto closest = stowage::ParsePlanJson(a.closest);
  ASSERT_TRUE(closest.ok()) << closest.status();
  EXPECT_TRUE(stowage::ValidatePlan(*closest).ok());
  EXPECT_FALSE(closest->fits);
  EXPECT_EQ(closest->binding.budget, "gpu");
  EXPECT_EQ(closest->binding.exceeded_by_bytes, closest->predicted.peak_device_bytes - 42000);
  EXPECT_EQ(closest->layers.size(), 3u);
  // ... and the runtime refuses to run it.
  stowage_options options;
  stowage_options_init(&options);
  options.backend = STOWAGE_BACKEND_HOST;
  stowage_runtime* rt = nullptr;
  EXPECT_EQ(stowage_create(a.closest.data(), a.closest.size(), &options, &rt),
            STOWAGE_ERROR_FAILED_PRECONDITION);
  EXPECT_EQ(rt, nullptr);
}

TEST(PlanRequest, ModelConfigsPlanToo) {
  const Answer a = Call(false, {{"model", "llama-3-8b"},
                                {"hardware", "h200"},
                                {"run", {{"seq_len", 131072}, {"cp", 2}, {"gpus", 8}}}});
  ASSERT_EQ(a.status, STOWAGE_OK) << a.text;
  auto plan = stowage::ParsePlanJson(a.text);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->seq_len, 131072u);
  EXPECT_EQ(plan->cp, 2);
}

// A request that names only its framework plans what that framework runs
// (planner::DefaultRunSettings): under hf, CP 1, EP 1 and the loss over every token, where the
// megatron defaults (CP 8, EP 8, 8K-token loss chunks) were refused as though asked for.
TEST(PlanRequest, HfRequestsDefaultToWhatTransformersRuns) {
  Json request = {{"model", "qwen3-30b-a3b"},
                  {"hardware", "h200"},
                  {"run", {{"seq_len", 8192}, {"gpus", 8}, {"framework", "hf"}}}};
  const Answer hf = Call(false, request);
  ASSERT_EQ(hf.status, STOWAGE_OK) << hf.text;
  auto plan = stowage::ParsePlanJson(hf.text);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->cp, 1);
  EXPECT_EQ(plan->ep, 1);
  request["run"]["ep"] = 2;
  const Answer given = Call(false, request);
  EXPECT_EQ(given.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(given.text, HasSubstr("--ep is 2 with --framework hf"));
}

// "sequence_parallel": false plans TP as --no-sequence-parallel does (a bool, else an error naming
// it); the plan says so, and holds the layer inputs for the whole sequence on every TP rank.
TEST(PlanRequest, SequenceParallelAsTheFlag) {
  Json request = {{"model", "llama-3.1-8b"},
                  {"hardware", "h200"},
                  {"run", {{"seq_len", 32768}, {"tp", 4}, {"cp", 1}, {"ep", 1}, {"gpus", 8}}}};
  const Answer with = Call(false, request);
  ASSERT_EQ(with.status, STOWAGE_OK) << with.text;
  EXPECT_THAT(with.text, ::testing::Not(HasSubstr("sequence_parallel")));
  request["run"]["sequence_parallel"] = false;
  const Answer without = Call(false, request);
  ASSERT_EQ(without.status, STOWAGE_OK) << without.text;
  auto a = stowage::ParsePlanJson(with.text), b = stowage::ParsePlanJson(without.text);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->sequence_parallel);
  EXPECT_FALSE(b->sequence_parallel);
  EXPECT_GT(b->predicted.peak_device_bytes, a->predicted.peak_device_bytes);
  request["run"]["sequence_parallel"] = "off";
  const Answer bad = Call(false, request);
  EXPECT_EQ(bad.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(bad.text, HasSubstr("run.sequence_parallel"));
}

// Note [MTP layers]: "mtp_layers" means what --mtp-layers means — absent, the config's count
// (GLM-5.3-Flash trains one MTP layer after its 45); 0, none; under hf, an error naming it.
TEST(PlanRequest, MtpLayersAsTheFlag) {
  Json request = {{"model", "glm-5.3-flash"},
                  {"hardware", "b200"},
                  {"run", {{"seq_len", 65536}, {"cp", 8}, {"ep", 8}, {"gpus", 64}}}};
  const Answer trained = Call(false, request);
  ASSERT_EQ(trained.status, STOWAGE_OK) << trained.text;
  auto with_mtp = stowage::ParsePlanJson(trained.text);
  ASSERT_TRUE(with_mtp.ok()) << with_mtp.status();
  ASSERT_EQ(with_mtp->layers.size(), 46u);
  EXPECT_EQ(with_mtp->layers.back().name, "mtp.0");
  request["run"]["mtp_layers"] = 0;
  const Answer none = Call(false, request);
  ASSERT_EQ(none.status, STOWAGE_OK) << none.text;
  auto without = stowage::ParsePlanJson(none.text);
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_EQ(without->layers.size(), 45u);
  EXPECT_LT(without->predicted.fixed_device_bytes, with_mtp->predicted.fixed_device_bytes);
  request["run"]["mtp_layers"] = 1;
  request["run"]["framework"] = "hf";
  const Answer hf = Call(false, request);
  EXPECT_EQ(hf.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(hf.text, HasSubstr("mtp-layers"));
  request["run"]["mtp_layers"] = -1;
  EXPECT_EQ(Call(false, request).status, STOWAGE_ERROR_INVALID_ARGUMENT);
}

TEST(PlanRequest, BadRequestsAreInvalidArguments) {
  const std::string broken = "{\"profile\": ";
  char* out = nullptr;
  EXPECT_EQ(stowage_plan_request(broken.data(), broken.size(), &out),
            STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(stowage_last_error()), HasSubstr("line 1"));
  EXPECT_EQ(stowage_plan_request(nullptr, 0, &out), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_plan_request("{}", 2, nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  Answer a = Call(false, {{"gpu_budget_bytes", 1}});
  EXPECT_EQ(a.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(a.text, HasSubstr("exactly one of 'profile'"));
  a = Call(false, {{"profile", Profile()}});
  EXPECT_EQ(a.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(a.text, HasSubstr("gpu_budget_bytes"));
  Json p = Profile();
  p["layers"][2]["saved"][1]["bytes"] = 1.5;
  a = Call(false, {{"profile", p}, {"gpu_budget_bytes", 60000}});
  EXPECT_EQ(a.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(a.text, HasSubstr("'layers[2].saved[1].bytes' has value 1.5"));
  a = Call(false, {{"profile", Profile()}, {"gpu_budget_bytes", 60000}, {"force", "offload"}});
  EXPECT_THAT(a.text, HasSubstr("'force' has value \"offload\"; allowed: keep, recompute"));
  a = Call(true, {{"profile", Profile()}, {"layers", {{{"policy", "keep"}}}}});
  EXPECT_THAT(a.text, HasSubstr("one entry per layer of the cost source (3), got 1"));
  a = Call(true, {{"profile", Profile()},
                  {"layers",
                   {{{"policy", "selective_recompute"}, {"recompute_modules", {"attn"}}},
                    {{"policy", "keep"}},
                    {{"policy", "keep"}}}}});
  EXPECT_THAT(a.text, HasSubstr("'layers[0].recompute_modules[0]' has value \"attn\"; allowed: "
                                "mlp"));
  a = Call(false, {{"profile", Profile()}, {"gpu_budget_bytes", 60000}, {"model_label", 7}});
  EXPECT_THAT(a.text, HasSubstr("'model_label' has value 7"));
  a = Call(false, {{"model", "llama-3-8b"}, {"run", {{"grad_bytes", 3}}}});
  EXPECT_THAT(a.text, HasSubstr("'run.grad_bytes' has value 3; allowed: 2 (bf16) or 4 (fp32)"));
  // Note [hf transformers versions]: "transformers" means what --transformers means.
  a = Call(false,
           {{"model", "llama-3-8b"}, {"run", {{"framework", "hf"}, {"transformers", "5.16"}}}});
  EXPECT_THAT(a.text, HasSubstr("'run.transformers' has value \"5.16\"; allowed: a transformers "
                                "release 5.N with N >= 17"));
  a = Call(false, {{"model", 5}});
  EXPECT_THAT(a.text, HasSubstr("'model' has value 5; allowed: a preset name"));
  stowage_free_string(nullptr);  // like free(NULL)
}

TEST(PlanEvaluate, ReturnsTheSimulatorsRecordedStep) {
  Json request = {{"profile", Profile()},
                  {"prefetch_distance", 2},
                  {"layers",
                   {{{"policy", "offload_saved"}},
                    {{"policy", "selective_recompute"}, {"recompute_modules", {"mlp"}}},
                    {{"policy", "offload_input"}}}}};
  const Answer a = Call(true, request);
  ASSERT_EQ(a.status, STOWAGE_OK) << a.text;
  const Json r = Json::parse(a.text);
  // The same figures and intervals as Simulate on the same schedule.
  auto profile = stowage::planner::ParseProfileJson(Profile().dump(), "p");
  auto step = stowage::planner::BuildStepCostFromProfile(
      *profile, stowage::planner::HardwareForProfile(*profile));
  stowage::planner::Schedule schedule;
  schedule.prefetch_distance = 2;
  schedule.options = {{stowage::LayerPolicy::kOffloadSaved, 0, 1},
                      {stowage::LayerPolicy::kSelectiveRecompute, 1, 1},
                      {stowage::LayerPolicy::kOffloadInput, 0, 1}};
  const auto sim = stowage::planner::Simulate(*step, schedule, true);
  EXPECT_EQ(r["peak_device_bytes"].get<uint64_t>(), sim.peak_bytes);
  EXPECT_EQ(r["host_bytes"].get<uint64_t>(), 4000u + 1000u);
  EXPECT_DOUBLE_EQ(r["step_seconds"].get<double>(), sim.step_seconds);
  EXPECT_DOUBLE_EQ(r["exposed_copy_seconds"].get<double>(), sim.exposed_copy_seconds);
  ASSERT_EQ(r["compute"].size(), sim.compute.size());
  for (size_t i = 0; i < sim.compute.size(); ++i) {
    EXPECT_EQ(r["compute"][i]["layer"].get<int>(), sim.compute[i].layer);
    EXPECT_DOUBLE_EQ(r["compute"][i]["start"].get<double>(), sim.compute[i].start);
    EXPECT_DOUBLE_EQ(r["compute"][i]["end"].get<double>(), sim.compute[i].end);
  }
  ASSERT_EQ(r["copies"].size(), sim.copies.size());
  ASSERT_EQ(sim.copies.size(), 4u);  // two layers, each D2H and H2D
  for (size_t i = 0; i < sim.copies.size(); ++i) {
    EXPECT_EQ(r["copies"][i]["layer"].get<int>(), sim.copies[i].layer);
    EXPECT_EQ(r["copies"][i]["direction"].get<std::string>(), sim.copies[i].d2h ? "d2h" : "h2d");
    EXPECT_EQ(r["copies"][i]["bytes"].get<uint64_t>(), sim.copies[i].bytes);
  }
  EXPECT_EQ(r["timeline"].size(), sim.timeline.size());
  // And the plan of that assignment, which the runtime accepts.
  auto plan = stowage::ParsePlanJson(r["plan"].dump());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->layers[0].policy, stowage::LayerPolicy::kOffloadSaved);
  EXPECT_EQ(plan->layers[0].transfers.size(), 2u);
  EXPECT_EQ(plan->layers[0].prefetch_after_layer, 2);
  EXPECT_EQ(plan->layers[1].recompute_modules, std::vector<std::string>{"mlp"});
  EXPECT_EQ(plan->runtime.host_arena_bytes, 5000u);
  stowage_runtime* rt = nullptr;
  const std::string text = r["plan"].dump();
  stowage_options options;
  stowage_options_init(&options);
  options.backend = STOWAGE_BACKEND_HOST;
  ASSERT_EQ(stowage_create(text.data(), text.size(), &options, &rt), STOWAGE_OK)
      << stowage_last_error();
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
}

TEST(PlanRequest, CppApi) {
  const std::string request = Json{{"profile", Profile()}, {"gpu_budget_bytes", 60000}}.dump();
  stowage::StatusOr<std::string> plan = stowage::PlanRequest(request);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_TRUE(stowage::ParsePlanJson(*plan).ok());
  const stowage::StatusOr<std::string> small =
      stowage::PlanRequest(Json{{"profile", Profile()}, {"gpu_budget_bytes", 42000}}.dump());
  EXPECT_EQ(small.status().code(), STOWAGE_ERROR_RESOURCE_EXHAUSTED);
  EXPECT_THAT(small.status().message(), HasSubstr("smallest peak"));
  std::string closest;
  EXPECT_FALSE(stowage::PlanRequest(
                   Json{{"profile", Profile()}, {"gpu_budget_bytes", 42000}}.dump(), &closest)
                   .ok());
  auto closest_plan = stowage::ParsePlanJson(closest);
  ASSERT_TRUE(closest_plan.ok()) << closest_plan.status();
  EXPECT_FALSE(closest_plan->fits);
  Json evaluate = {{"profile", Profile()},
                   {"layers", {{{"policy", "keep"}}, {{"policy", "keep"}}, {{"policy", "keep"}}}}};
  stowage::StatusOr<std::string> result = stowage::PlanEvaluate(evaluate.dump());
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(Json::parse(*result)["host_bytes"].get<uint64_t>(), 0u);
}

}  // namespace

namespace {

// A misspelt field was a default silently used in its place: `gpu_budget_byts` planned the whole
// device, `run.seqlen` the default length. Every key of a request is now one it reads.
TEST(PlanRequest, UnknownKeysAreErrorsNamingTheKeysAllowed) {
  const Answer root = Call(false, Json{{"model", "llama-3-8b"}, {"gpu_budget_byts", 1000}});
  EXPECT_EQ(root.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(root.text, HasSubstr("unknown field 'gpu_budget_byts'"));
  EXPECT_THAT(root.text, HasSubstr("gpu_budget_bytes"));
  const Answer run = Call(false, Json{{"model", "llama-3-8b"}, {"run", {{"seqlen", 99}}}});
  EXPECT_EQ(run.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(run.text,
              HasSubstr("unknown field 'run.seqlen'; allowed in 'run': framework, seq_len"));
  Json layers = Json::array();
  for (int i = 0; i < 32; ++i) layers.push_back({{"policy", "keep"}});  // llama-3-8b's layers
  layers[3] = {{"policy", "keep"}, {"chunk", 2}};
  const Answer layer = Call(true, Json{{"model", "llama-3-8b"}, {"layers", layers}});
  EXPECT_EQ(layer.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(layer.text, HasSubstr("unknown field 'layers[3].chunk'"));
}

// 100,000 nested brackets crashed every reader (a recursive dump() for the error message).
TEST(PlanRequest, DeepNestingIsAnErrorNotACrash) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  char* out = nullptr;
  EXPECT_EQ(stowage_plan_request(deep.data(), deep.size(), &out), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(stowage_last_error()), HasSubstr("nest more than 100 levels deep"));
  EXPECT_EQ(stowage_plan_validate(deep.data(), deep.size()), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(stowage_last_error()), HasSubstr("nest more than 100 levels deep"));
  const std::string field = R"({"model": )" + deep + "}";
  EXPECT_EQ(stowage_plan_request(field.data(), field.size(), &out), STOWAGE_ERROR_INVALID_ARGUMENT);
}

// A 100 MB name made stowage_last_error() 100 MB long.
TEST(PlanRequest, TheLastErrorStaysReadableWhateverTheInput) {
  // A name within the reader's string limit (1 MiB) is quoted as an excerpt...
  const std::string name((1 << 20) - 16, 'x');
  const Answer a = Call(false, Json{{"model", name}});
  EXPECT_EQ(a.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_LT(a.text.size(), 8192u);
  EXPECT_THAT(a.text, HasSubstr("more characters)"));
  // ...and a longer one is refused while it is read (Note [JSON limits while reading]).
  const Answer huge = Call(false, Json{{"model", std::string(10 << 20, 'x')}});
  EXPECT_EQ(huge.status, STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_LT(huge.text.size(), 8192u);
  EXPECT_THAT(huge.text, HasSubstr("field 'model' holds a string longer than 1048576 bytes"));
}

}  // namespace
