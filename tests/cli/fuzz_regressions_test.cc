// Every input a fuzzer crashed on, once fixed, is kept in tests/fuzz/corpus/<harness>/ under a
// name starting "regression-" (the fuzz_smoke test replays it under the sanitizers). Here each
// one goes through its reader in the ordinary build too: it must now be a clear error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "planner/frameworks/layer_profile.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "stowage/plan.h"

namespace {

namespace fs = std::filesystem;

std::vector<fs::path> Regressions(const std::string& harness) {
  std::vector<fs::path> out;
  const fs::path dir = fs::path(STOWAGE_SOURCE_DIR) / "tests" / "fuzz" / "corpus" / harness;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("regression-", 0) == 0) out.push_back(entry.path());
  }
  return out;
}

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Found by the hardware_profile fuzzer: a number literal beyond double's range (1e1232) made
// nlohmann throw out_of_range.406 through the reader, aborting the process.
TEST(FuzzRegressions, HardwareProfileInputsAreErrors) {
  const auto inputs = Regressions("hardware_profile");
  EXPECT_FALSE(inputs.empty());
  for (const fs::path& p : inputs) {
    auto profile = stowage::planner::ParseHardwareProfileJson(Read(p), p.filename().string());
    EXPECT_FALSE(profile.ok()) << p;
    EXPECT_THAT(profile.status().message(), ::testing::HasSubstr(p.filename().string()));
  }
}

// Found by the plan fuzzer: "run.tp": 1.1e39 was undefined behaviour (a double beyond int
// converted inside nlohmann's from_json); the strict plan reader now names the field.
TEST(FuzzRegressions, PlanInputsAreErrors) {
  const auto inputs = Regressions("plan");
  EXPECT_FALSE(inputs.empty());
  for (const fs::path& p : inputs) {
    auto plan = stowage::ParsePlanJson(Read(p));
    const bool refused = !plan.ok() || !stowage::ValidatePlan(*plan).ok();
    EXPECT_TRUE(refused) << p;
  }
}

TEST(FuzzRegressions, OtherHarnessesInputsAreErrors) {
  for (const fs::path& p : Regressions("hf_config")) {
    EXPECT_FALSE(stowage::planner::ParseHfConfigJson(Read(p), p.string()).ok()) << p;
  }
  for (const fs::path& p : Regressions("profile")) {
    EXPECT_FALSE(stowage::planner::ParseProfileJson(Read(p), p.string()).ok()) << p;
  }
}

}  // namespace
