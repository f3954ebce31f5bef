// The plan the runtime reads, the table people read and the timeline picture.
#include "planner/report/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/frameworks/step_cost.h"
#include "planner/search/baseline.h"
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
  EXPECT_EQ(p.plan.layers.size(), 46u);  // 45 decoder layers and mtp.0 (Note [MTP layers])
  EXPECT_EQ(p.plan.layers.back().name, "mtp.0");
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
  // With no copy overlapped: compute plus every byte D2H and back H2D at the one-way rates.
  const double copies = static_cast<double>(host) / p.step.d2h_bytes_per_second +
                        static_cast<double>(host) / p.step.h2d_bytes_per_second;
  EXPECT_NEAR(p.plan.predicted.unoverlapped_step_seconds, p.result.sim.compute_seconds + copies,
              1e-6 * copies);
  EXPECT_GT(p.plan.predicted.unoverlapped_step_seconds, p.plan.predicted.step_seconds);
  auto parsed = ParsePlanJson(PlanToJson(p.plan));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(PlanToJson(*parsed), PlanToJson(p.plan));
}

TEST(RenderTable, OneRowPerLayerAndASummary) {
  const Planned p = PlanReference(262144);
  const std::string table = RenderTable(p.step, p.plan, p.result);
  // Every layer in exactly one row: a row names one layer ("7") or a run of identical ones
  // ("0-2"); the rows' first columns cover 0..44 in order.
  std::istringstream lines(table);
  std::string line;
  std::getline(lines, line);  // the header
  EXPECT_THAT(line, HasSubstr("layers"));
  int next = 0;
  while (std::getline(lines, line)) {
    std::istringstream cells(line);
    std::string first;
    cells >> first;
    if (first == "mtp.0") {  // the MTP layer's own row, after the decoder layers
      EXPECT_EQ(next, 45) << line;
      next = 46;
      continue;
    }
    const size_t dash = first.find('-');
    const int from = std::stoi(first.substr(0, dash));
    const int to = dash == std::string::npos ? from : std::stoi(first.substr(dash + 1));
    EXPECT_EQ(from, next) << line;
    EXPECT_GE(to, from) << line;
    next = to + 1;
  }
  EXPECT_EQ(next, 46);
  EXPECT_THAT(table, HasSubstr("dsa+moe"));
  const std::string summary = RenderSummary(p.step, p.plan, p.result);
  EXPECT_THAT(summary, HasSubstr("peak device memory"));
  EXPECT_THAT(summary, HasSubstr("per NUMA node"));
  EXPECT_THAT(summary, HasSubstr("step time"));
  // The range a user can expect: the planned step and the step with no copy overlapped.
  EXPECT_THAT(summary, HasSubstr("copies not overlapped"));
  EXPECT_THAT(summary,
              HasSubstr(absl::StrFormat("expect %.3f-%.3f s", p.plan.predicted.step_seconds,
                                        p.plan.predicted.unoverlapped_step_seconds)));
}

// The timeline must render: rsvg-convert (librsvg2-bin, installed by scripts/setup-deps) turns
// it into a PNG.
TEST(RenderTimelineSvg, RendersToPng) {
  const Planned p = PlanReference(262144);
  const std::string svg = RenderTimelineSvg(p.step, p.plan, p.result);
  EXPECT_THAT(svg, HasSubstr("budget"));
  EXPECT_THAT(svg, HasSubstr("prefetch (H2D)"));
  if (std::system("command -v rsvg-convert >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "rsvg-convert is not installed (scripts/setup-deps installs it)";
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

// Every layer kept, simulated as planned: the picture of a plan at any scale.
Planned PlanKeep(const std::string& model, uint64_t seq_len, int ep = 8) {
  RunSettings run;
  run.seq_len = seq_len;
  run.ep = ep;
  Planned p{*BuildStepCost(*ModelPreset(model), *HardwarePreset("b200"), run), {}, {}};
  p.result.feasible = true;
  p.result.schedule.options.assign(p.step.layers.size(), {LayerPolicy::kKeep, 0, 1});
  p.result.sim = Simulate(p.step, p.result.schedule, /*record=*/true);
  const uint64_t budget = p.step.hardware.UsableBytes();
  p.plan = MakePlan(p.step, p.result, ComputeBaseline(p.step, budget),
                    {"stowage test", model, "b200", budget, p.step.hardware.HostBytesPerGpu()});
  return p;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(RenderTimelineSvg, LegendAndLanesOnlyForWhatAppears) {
  const Planned keep = PlanKeep("glm-5.3-flash", 16384);
  const std::string svg = RenderTimelineSvg(keep.step, keep.plan, keep.result);
  EXPECT_THAT(svg, HasSubstr(">keep</text>"));
  for (const char* absent : {"offload (D2H)", "prefetch (H2D)", "waiting for a prefetch",
                             ">D2H</text>", ">offload_input</text>", ">recompute</text>"}) {
    EXPECT_THAT(svg, ::testing::Not(HasSubstr(absent))) << absent;
  }
  // The reference plan at 256K offloads and recomputes: its legend names those and the copies.
  const Planned p = PlanReference(262144);
  const std::string offloading = RenderTimelineSvg(p.step, p.plan, p.result);
  EXPECT_THAT(offloading, HasSubstr("offload (D2H)"));
  EXPECT_THAT(offloading, HasSubstr(">D2H</text>"));
  for (const LayerPlan& l : p.plan.layers) {
    EXPECT_THAT(offloading,
                HasSubstr(absl::StrCat(">", std::string(LayerPolicyName(l.policy)), "</text>")));
  }
  // Layers are labelled with their index where their block has room.
  EXPECT_GE(Count(offloading, "fill=\"#222\">"), 10);
}

TEST(RenderTimelineSvg, AxisStartsJustBelowFixedMemoryWithSaneTicksAtAnyScale) {
  for (const auto& [model, seq_len] : std::vector<std::pair<std::string, uint64_t>>{
           {"glm-5.3-flash", 4096}, {"glm-5.3-flash", 1048576}, {"glm-5.3-flash", 8388608}}) {
    const Planned p = PlanKeep(model, seq_len);
    const std::string svg = RenderTimelineSvg(p.step, p.plan, p.result);
    const double fixed_gib = static_cast<double>(p.step.fixed.total()) / (1ull << 30);
    const double top_gib =
        static_cast<double>(std::max(p.result.sim.peak_bytes, p.plan.gpu_budget_bytes)) /
        (1ull << 30);
    const std::string marker = "the axis starts at ";
    const size_t at = svg.find(marker);
    ASSERT_NE(at, std::string::npos);
    const double axis_gib = std::stod(svg.substr(at + marker.size()));
    EXPECT_LE(axis_gib, fixed_gib) << seq_len;
    // Below fixed memory by at most half the height the step's own bytes span.
    EXPECT_GE(axis_gib, fixed_gib - 0.5 * (top_gib - fixed_gib) - 1) << seq_len;
    // At most 8 labels on each axis, however large the peak (8M tokens kept: terabytes).
    EXPECT_LE(Count(svg, "GiB</text>") - Count(svg, "budget") - Count(svg, "peak"), 8) << seq_len;
    EXPECT_LE(Count(svg, "text-anchor=\"middle\">") - Count(svg, "text-anchor=\"middle\" fill"), 10)
        << seq_len;
  }
}

TEST(RenderTable, RunsOfIdenticalLayersAreOneRowAndColumnsAlign) {
  const Planned keep = PlanKeep("llama-3-8b", 8192, /*ep=*/1);
  const std::string table = RenderTable(keep.step, keep.plan, keep.result);
  std::istringstream lines(table);
  std::string header, row, extra;
  std::getline(lines, header);
  std::getline(lines, row);
  EXPECT_FALSE(std::getline(lines, extra)) << table;  // 32 identical layers: one row
  EXPECT_THAT(row, HasSubstr(" 0-31  attention+dense_ffn  keep "));
  // The type column is as wide as its longest entry: the next column starts at the same place.
  EXPECT_EQ(header.find("choice"), row.find("keep"));
  // Nothing is pinned: the summary has no pinning line.
  EXPECT_THAT(RenderSummary(keep.step, keep.plan, keep.result),
              ::testing::Not(HasSubstr("pinning takes")));
}

// A pipeline stage's step numbers its layers from 0 (and its stage plan by position): the table
// names them by their model index, as the pipelined plan does, and runs do not cross a chunk.
TEST(RenderTable, AStageNamesItsLayersByModelIndex) {
  RunSettings run;
  run.seq_len = 8192;
  run.ep = run.cp = 1;
  run.gpus = 8;
  run.pp = 2;
  run.vpp = 2;
  run.schedule = PipelineSchedule::kInterleaved;
  run.microbatches = 4;
  Planned p{*BuildStepCost(*ModelPreset("llama-3-8b"), *HardwarePreset("b200"), run, 1), {}, {}};
  ASSERT_EQ(p.step.layers.size(), 16u);
  ASSERT_EQ(p.step.layers.front().index, 8);  // chunk 0 of stage 1: virtual stage 1
  p.result.feasible = true;
  p.result.schedule.options.assign(p.step.layers.size(), {LayerPolicy::kKeep, 0, 1});
  p.result.sim = Simulate(p.step, p.result.schedule, /*record=*/true);
  const uint64_t budget = p.step.hardware.UsableBytes();
  p.plan = MakePlan(p.step, p.result, ComputeBaseline(p.step, budget),
                    {"stowage test", "llama-3-8b", "b200", budget, budget});
  const std::string table = RenderTable(p.step, p.plan, p.result);
  EXPECT_THAT(table, HasSubstr("\n     8-15  attention+dense_ffn  keep ")) << table;
  EXPECT_THAT(table, HasSubstr("\n    24-31  attention+dense_ffn  keep ")) << table;
}

TEST(FormatBytes, PicksAUnit) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(3ull << 20), "3.0 MiB");
  EXPECT_EQ(FormatBytes(180ull << 30), "180.0 GiB");
}

}  // namespace
}  // namespace stowage::planner
