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

}  // namespace
