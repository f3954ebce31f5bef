// The hf profile against real transformers steps measured on an H200 (data/measured/: the
// public cases of the shared reference, copied with their configs). The planner runs as users
// run it; its predicted peak must be within 3% of the measured peak and its step time within
// 10% of the measured one.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "stowage/plan.h"
#include "tests/test_util.h"

namespace {

struct Case {
  std::string name, config;
  uint64_t seq_len = 0;
  bool checkpointing = false;
  double peak_bytes = 0, step_seconds = 0;
};

std::string DataDir() { return std::string(STOWAGE_SOURCE_DIR) + "/tests/planner/data/measured"; }

std::vector<Case> ReadCases() {
  std::vector<Case> cases;
  std::ifstream in(DataDir() + "/hf-h200.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("case")) continue;  // the header: torch, transformers, GPU
    cases.push_back({j["case"], j["config"], j["seq_len"], j["gradient_checkpointing"],
                     j["peak_bytes_2"], j["step_seconds"]});
  }
  return cases;
}

using CliRun = stowage::testing::CommandResult;

CliRun Plan(const Case& c) {
  const std::string command =
      std::string(STOWAGE_BINARY_DIR) + "/tools/stowage plan --model " + DataDir() + "/" +
      c.config + " --hardware h200 --seq-len " + std::to_string(c.seq_len) +
      " --micro-batch 1 --gpus 1 --cp 1 --ep 1 --tp 1 --sharding no_shard --framework hf"
      " --optimizer none --grad-dtype bf16 --loss-chunk-tokens 0 --force " +
      (c.checkpointing ? "recompute" : "keep") + " --format json 2>/dev/null";
  return stowage::testing::RunCommand(command);
}

// Runs every case, prints predicted vs measured and checks the bound on one quantity.
void CheckCases(bool peak_bound, bool time_bound) {
  const std::vector<Case> cases = ReadCases();
  ASSERT_EQ(cases.size(), 4u);
  std::printf("%-16s %-9s %12s %12s %7s %9s %9s %7s\n", "case", "policy", "peak GiB", "measured",
              "err", "step s", "measured", "err");
  for (const Case& c : cases) {
    const CliRun run = Plan(c);
    ASSERT_EQ(run.code, 0) << c.name << ": " << run.out;
    auto plan = stowage::ParsePlanJson(run.out);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->framework, "hf");
    const double peak = static_cast<double>(plan->predicted.peak_device_bytes);
    const double seconds = plan->predicted.step_seconds;
    const double peak_error = (peak - c.peak_bytes) / c.peak_bytes;
    const double time_error = (seconds - c.step_seconds) / c.step_seconds;
    std::printf("%-16s %-9s %12.3f %12.3f %+6.2f%% %9.4f %9.4f %+6.1f%%\n", c.name.c_str(),
                c.checkpointing ? "recompute" : "keep", peak / (1 << 30), c.peak_bytes / (1 << 30),
                100 * peak_error, seconds, c.step_seconds, 100 * time_error);
    if (peak_bound) {
      EXPECT_LE(std::abs(peak_error), 0.03) << c.name << " seq " << c.seq_len;
    }
    if (time_bound) {
      EXPECT_LE(std::abs(time_error), 0.10) << c.name << " seq " << c.seq_len;
    }
  }
}

TEST(HfMeasured, PeakWithin3Percent) { CheckCases(true, false); }

// Not met yet (issue 12, step time): with the per-op-class rates of Note [Op rates]
// (hardware.cc) the dense cases come out -10% (llama keep), -8% (llama recompute) and -5%
// (qwen2 recompute), the MoE case -27%: the hf recipe's kernel counts and element-wise traffic
// are still being counted (framework_hf.cc Note [Step time]).
TEST(HfMeasured, DISABLED_StepTimeWithin10Percent) { CheckCases(false, true); }

}  // namespace
