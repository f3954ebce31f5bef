// The plan the runtime reads, the table people read and the timeline picture.
#include "planner/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "stowage/plan.h"

namespace stowage::planner {
namespace {

using ::testing::HasSubstr;

struct Planned {
  StepCost step;
  OptimizeResult result;
  Plan plan;
};

Planned PlanReference(uint64_t seq_len) {
  RunSettings run;
  run.seq_len = seq_len;
  Planned p{*BuildStepCost(*ModelPreset("glm-5.3-flash"), *HardwarePreset("b200"), run), {}, {}};
  OptimizerOptions o;
  o.gpu_budget_bytes = p.step.hardware.UsableBytes();
  o.host_budget_bytes = p.step.hardware.HostBytesPerGpu();
  p.result = Optimize(p.step, o);
  EXPECT_TRUE(p.result.feasible);
  const Baseline baseline = ComputeBaseline(p.step, o.gpu_budget_bytes);
  p.plan =
      MakePlan(p.step, p.result, baseline,
               {"stowage test", "glm-5.3-flash", "b200", o.gpu_budget_bytes, o.host_budget_bytes});
  return p;
}

TEST(MakePlan, ThePlanIsValidAndCarriesThePrediction) {
  const Planned p = PlanReference(1048576);
  ASSERT_TRUE(ValidatePlan(p.plan).ok()) << ValidatePlan(p.plan);
  EXPECT_EQ(p.plan.layers.size(), 45u);
  EXPECT_EQ(p.plan.predicted.peak_device_bytes, p.result.sim.peak_bytes);
  EXPECT_EQ(p.plan.predicted.host_bytes_per_gpu, p.result.sim.host_bytes);
  EXPECT_EQ(p.plan.predicted.host_bytes_per_numa_node, 4 * p.result.sim.host_bytes);
  EXPECT_EQ(p.plan.predicted.baseline, "recompute");  // keeping everything does not fit at 1M
  uint64_t host = 0;
  for (const LayerPlan& l : p.plan.layers) {
    host += l.host_bytes;
    if (PolicyOffloads(l.policy)) {
      EXPECT_GT(l.prefetch_after_layer, l.index);
      EXPECT_GT(l.d2h_seconds, 0);
      EXPECT_GT(l.h2d_seconds, 0);
    } else {
      EXPECT_EQ(l.prefetch_after_layer, -1);
    }
  }
  EXPECT_EQ(p.plan.runtime.host_arena_bytes, host);
  EXPECT_GT(host, 100ull << 30);  // 1M tokens must offload most layer inputs
  auto parsed = ParsePlanJson(PlanToJson(p.plan));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(PlanToJson(*parsed), PlanToJson(p.plan));
}

TEST(RenderTable, OneRowPerLayerAndASummary) {
  const Planned p = PlanReference(262144);
  const std::string table = RenderTable(p.step, p.plan, p.result);
  int rows = 0;
  for (char c : table) rows += c == '\n';
  EXPECT_EQ(rows, 46);  // header + 45 layers
  EXPECT_THAT(table, HasSubstr("dsa+moe"));
  const std::string summary = RenderSummary(p.step, p.plan, p.result);
  EXPECT_THAT(summary, HasSubstr("peak device memory"));
  EXPECT_THAT(summary, HasSubstr("per NUMA node"));
  EXPECT_THAT(summary, HasSubstr("step time"));
}

// The timeline must render: rsvg-convert (librsvg2-bin, installed by tools/setup-deps) turns
// it into a PNG.
TEST(RenderTimelineSvg, RendersToPng) {
  const Planned p = PlanReference(262144);
  const std::string svg = RenderTimelineSvg(p.step, p.plan, p.result);
  EXPECT_THAT(svg, HasSubstr("budget"));
  EXPECT_THAT(svg, HasSubstr("prefetch (H2D)"));
  if (std::system("command -v rsvg-convert >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "rsvg-convert is not installed (tools/setup-deps installs it)";
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("stowage_svg_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "t.svg") << svg; }
  const std::string command =
      "rsvg-convert '" + (dir / "t.svg").string() + "' -o '" + (dir / "t.png").string() + "'";
  ASSERT_EQ(std::system(command.c_str()), 0);
  std::ifstream png(dir / "t.png", std::ios::binary);
  std::string magic(8, '\0');
  png.read(magic.data(), 8);
  EXPECT_EQ(magic, "\x89PNG\r\n\x1a\n");
  EXPECT_GT(std::filesystem::file_size(dir / "t.png"), 10000u);
  std::filesystem::remove_all(dir);
}

TEST(FormatBytes, PicksAUnit) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(3ull << 20), "3.0 MiB");
  EXPECT_EQ(FormatBytes(180ull << 30), "180.0 GiB");
}

}  // namespace
}  // namespace stowage::planner
