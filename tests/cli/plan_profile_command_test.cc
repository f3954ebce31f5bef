// `stowage plan --profile FILE` end to end: table, summary, JSON, --out, --timeline, and a budget
// too small.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "stowage/plan.h"
#include "tests/test_util.h"

namespace {

using ::testing::HasSubstr;

using Result = stowage::testing::CommandResult;  // out: stdout and stderr

using stowage::testing::RunStowage;

// Four 64 MiB-input blocks; 1.06 GiB fixed. Keeping everything peaks at about 2.6 GiB; the
// smallest peak is about 1.8 GiB (the last layer's backward working set).
constexpr char kProfile[] = R"({
  "format": "stowage-layer-profile", "schema_version": 1, "generator": "test",
  "device": "cuda:0", "measured_memory": true, "tokens": 8192,
  "fixed_bytes": {"weights": 536870912, "gradients": 536870912, "optimizer": 0,
                  "other": 67108864},
  "loss": {"peak_bytes": 134217728, "seconds": 0.005},
  "link": {"d2h_bytes_per_second": 2e10, "h2d_bytes_per_second": 2e10},
  "layers": [LAYERS]
})";

constexpr char kLayer[] = R"({"index": INDEX, "type": "MLPBlock",
  "input_bytes": 67108864, "output_bytes": 67108864,
  "forward_peak_bytes": 469762048, "backward_peak_bytes": 671088640,
  "forward_seconds": 0.010, "backward_seconds": 0.020,
  "modules": [{"name": "fc1", "seconds": 0.002}, {"name": "ln", "seconds": 0.0005}],
  "saved": [{"name": "input", "bytes": 67108864, "module": ""},
            {"name": "ln.0", "bytes": 67108864, "module": "ln"},
            {"name": "fc1.0", "bytes": 268435456, "module": "fc1"}]})";

class PlanProfileCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("stowage_plan_profile_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    std::string layers;
    for (int i = 0; i < 4; ++i) {
      std::string layer = kLayer;
      layer.replace(layer.find("INDEX"), 5, std::to_string(i));
      layers += (i ? ", " : "") + layer;
    }
    std::string text = kProfile;
    text.replace(text.find("LAYERS"), 6, layers);
    std::ofstream(Path("profile.json")) << text;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

TEST_F(PlanProfileCommand, TableAndSummary) {
  const Result run = RunStowage("plan --profile " + Path("profile.json") + " --gpu-mem 2.3");
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("on cuda:0 (measured figures), 8192 tokens"));
  EXPECT_THAT(run.out, HasSubstr("MLPBlock"));
  // Recomputing fc1 in one layer and ln in another costs what recomputing both in one layer does,
  // and frees the same bytes: either optimum may be the plan.
  EXPECT_THAT(run.out, HasSubstr("selective_recompute(fc1"));
  EXPECT_THAT(run.out, HasSubstr("(fits)"));
  EXPECT_THAT(run.out, HasSubstr("other 64.0 MiB"));
  // Nothing offloaded, so nothing pinned: the summary has no pinning line.
  EXPECT_THAT(run.out, ::testing::Not(HasSubstr("pinning takes")));
  EXPECT_THAT(run.out, ::testing::Not(HasSubstr("WARNING")));  // host RAM unknown, not 0
}

// Regression: a profile-driven plan said "framework megatron, optimizer adam" and "model
// parameters 0" — the planner's defaults, not what was measured. It reports what the profile
// states, and "not stated" for what it does not.
TEST_F(PlanProfileCommand, SummarySaysWhatTheProfileStates) {
  const Result unstated = RunStowage("plan --profile " + Path("profile.json") + " --gpu-mem 2.3");
  ASSERT_EQ(unstated.code, 0) << unstated.out;
  EXPECT_THAT(unstated.out, HasSubstr("model parameters       not stated by the layer profile"));
  EXPECT_THAT(unstated.out, HasSubstr("framework              (not stated), optimizer (not "
                                      "stated), gradients (not stated); from the layer profile"));
  std::ifstream in(Path("profile.json"));
  std::stringstream text;
  text << in.rdbuf();
  std::string stated = text.str();
  stated.replace(stated.find("\"tokens\": 8192,"), 15,
                 R"("tokens": 8192, "framework": "hf", "optimizer": "none", )"
                 R"("grad_dtype": "bf16", "model_parameters": 268435456,)");
  std::ofstream(Path("stated.json")) << stated;
  const Result run = RunStowage("plan --profile " + Path("stated.json") + " --gpu-mem 2.3");
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("model parameters       268435456 (0.27B)"));
  EXPECT_THAT(run.out, HasSubstr("framework              hf, optimizer none, gradients bf16; "
                                 "from the layer profile"));
  const Result json =
      RunStowage("plan --profile " + Path("stated.json") + " --gpu-mem 2.3 --format json", false);
  auto plan = stowage::ParsePlanJson(json.out);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->framework, "hf");
  EXPECT_EQ(plan->model_parameters, 268435456u);
  // A framework the planner has no name for is refused, naming the field and the value.
  stated.replace(stated.find("\"hf\""), 4, "\"jax\"");
  std::ofstream(Path("bad.json")) << stated;
  const Result bad = RunStowage("plan --profile " + Path("bad.json") + " --gpu-mem 2.3");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("field 'framework' has value \"jax\"; allowed: \"megatron\" or "
                                 "\"hf\""));
}

TEST_F(PlanProfileCommand, JsonOutAndTimeline) {
  const Result run =
      RunStowage("plan --profile " + Path("profile.json") + " --gpu-mem 2 --format json --out " +
                     Path("plan.json") + " --timeline " + Path("t.svg"),
                 /*with_stderr=*/false);
  ASSERT_EQ(run.code, 0) << run.out;
  auto plan = stowage::ParsePlanJson(run.out);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(stowage::ValidatePlan(*plan).ok());
  EXPECT_EQ(plan->seq_len, 8192u);
  EXPECT_EQ(plan->gpu_budget_bytes, 2ull << 30);
  EXPECT_LE(plan->predicted.peak_device_bytes, 2ull << 30);
  EXPECT_EQ(plan->predicted.fixed_device_bytes, 1140850688u);
  ASSERT_EQ(plan->layers.size(), 4u);
  for (const stowage::LayerPlan& l : plan->layers) EXPECT_EQ(l.ffn_chunks, 1);
  auto file = stowage::ReadPlanFile(Path("plan.json"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(stowage::PlanToJson(*file), run.out);
  std::ifstream svg(Path("t.svg"));
  std::stringstream text;
  text << svg.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("<svg"));
}

TEST_F(PlanProfileCommand, TooSmallABudgetSaysWhatBinds) {
  const Result run = RunStowage("plan --profile " + Path("profile.json") + " --gpu-mem 1.3");
  EXPECT_EQ(run.code, 1) << run.out;
  EXPECT_THAT(run.out, HasSubstr("does not fit"));
  EXPECT_THAT(run.out, HasSubstr("needs at least 1.8 GiB"));
  EXPECT_THAT(run.out, HasSubstr("binding: working set of the backward of layer 3"));
}

TEST_F(PlanProfileCommand, UsageErrors) {
  Result run = RunStowage("plan --profile " + Path("profile.json"));
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("--gpu-mem is required with --profile"));
  run = RunStowage("plan --profile " + Path("profile.json") + " --gpu-mem 2 --seq-len 1M");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("--seq-len describes a model config"));
  run = RunStowage("plan --profile " + Path("missing.json") + " --gpu-mem 2");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("missing.json"));
  std::ofstream(Path("bad.json")) << R"({"format": "stowage-layer-profile", "schema_version": 1,
      "measured_memory": true, "tokens": -1})";
  run = RunStowage("plan --profile " + Path("bad.json") + " --gpu-mem 2");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("field 'tokens' has value -1"));
  // With --hardware the budget defaults to its usable memory.
  run = RunStowage("plan --profile " + Path("profile.json") + " --hardware h200");
  EXPECT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("on h200"));
}

// A profile measured on every stage of a pipeline (schema_version 3's `pipeline`): pp 2 x vpp 2,
// stage 0 runs layers 0 and 2, stage 1 layers 1 and 3.
constexpr char kPipeline[] = R"("pipeline": {"pp": 2, "vpp": 2, "gpus": 2, "stages": [
  {"stage": 0, "chunks": [{"first_layer": 0, "num_layers": 1}, {"first_layer": 2, "num_layers": 1}],
   "fixed_bytes": {"weights": 268435456, "gradients": 268435456, "other": 67108864}},
  {"stage": 1, "chunks": [{"first_layer": 1, "num_layers": 1}, {"first_layer": 3, "num_layers": 1}],
   "fixed_bytes": {"weights": 268435456, "gradients": 268435456, "other": 67108864}}]},
)";

TEST_F(PlanProfileCommand, PipelinedProfilePlansEveryStage) {
  std::ifstream in(Path("profile.json"));
  std::stringstream text;
  text << in.rdbuf();
  std::string pipelined = text.str();
  pipelined.replace(pipelined.find("\"schema_version\": 1"), 19, "\"schema_version\": 3");
  pipelined.replace(pipelined.find("\"layers\""), 0, kPipeline);
  std::ofstream(Path("pipelined.json")) << pipelined;
  const std::string plan = "plan --profile " + Path("pipelined.json") + " --gpu-mem 8 ";
  const Result run = RunStowage(plan + "--microbatches 4 --out " + Path("plan.json"));
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("PP 2, 4 microbatches"));
  EXPECT_THAT(run.out, HasSubstr("\nstage 0\n"));
  EXPECT_THAT(run.out, HasSubstr("\nstage 1\n"));
  EXPECT_THAT(run.out, HasSubstr("<- binding (highest peak)"));
  EXPECT_THAT(run.out, HasSubstr("PP 2 x VPP 2, interleaved, 4 microbatches"));
  auto file = stowage::ReadPlanFile(Path("plan.json"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(stowage::ValidatePlan(*file).ok());
  EXPECT_EQ(file->pp, 2);
  EXPECT_EQ(file->vpp, 2);
  EXPECT_EQ(file->microbatches, 4);
  ASSERT_EQ(file->stages.size(), 2u);
  EXPECT_EQ(file->stages[1].chunks[0].first_layer, 1);
  EXPECT_EQ(file->stages[0].fixed_device_bytes, 603979776u);
  // Without --microbatches: the profile's pp.
  const Result defaulted = RunStowage(plan + "--format json", /*with_stderr=*/false);
  ASSERT_EQ(defaulted.code, 0) << defaulted.out;
  EXPECT_EQ(stowage::ParsePlanJson(defaulted.out)->microbatches, 2);

  // The interleaved schedule runs microbatches in groups of pp.
  Result bad = RunStowage(plan + "--microbatches 3");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("--microbatches is 3; allowed: a multiple of the profile's "
                                 "pipeline.pp (2)"));
  // The profile's pipeline decides the stages.
  for (const char* flag : {"--pp 2", "--vpp 2", "--schedule 1f1b"}) {
    bad = RunStowage(plan + flag);
    EXPECT_EQ(bad.code, 2) << bad.out;
    EXPECT_THAT(bad.out, HasSubstr("is refused with --profile"));
    EXPECT_THAT(bad.out, HasSubstr("stowage.megatron.profile(model_chunks, batch) on every rank"));
  }
  bad = RunStowage(plan + "--force keep");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("--force evaluates one stage"));
}

TEST_F(PlanProfileCommand, OneStageProfileWithMicrobatchesAccumulates) {
  const std::string plan = "plan --profile " + Path("profile.json") + " --gpu-mem 2.3 ";
  const Result one = RunStowage(plan + "--format json", /*with_stderr=*/false);
  ASSERT_EQ(one.code, 0) << one.out;
  const Result three = RunStowage(plan + "--microbatches 3 --format json", /*with_stderr=*/false);
  ASSERT_EQ(three.code, 0) << three.out;
  auto p1 = stowage::ParsePlanJson(one.out);
  auto p3 = stowage::ParsePlanJson(three.out);
  ASSERT_TRUE(p1.ok() && p3.ok());
  EXPECT_EQ(p1->microbatches, 1);
  EXPECT_EQ(p3->microbatches, 3);
  EXPECT_TRUE(stowage::ValidatePlan(*p3).ok());
  EXPECT_NEAR(p3->predicted.step_seconds, 3 * p1->predicted.step_seconds,
              1e-9 * p1->predicted.step_seconds);
}

}  // namespace
