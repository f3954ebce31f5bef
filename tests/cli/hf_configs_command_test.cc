// `stowage plan` end to end on every Hugging Face config the tests carry (the published ones in
// tests/planner/data/hf/ and the small synthetic ones), under both framework recipes: each
// either plans (exit 0, a JSON plan with one entry per layer) or says it does not fit and what
// the smallest peak is (exit 1); neither recipe refuses any of them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace {

using ::testing::HasSubstr;

const std::filesystem::path kData =
    std::filesystem::path(STOWAGE_SOURCE_DIR) / "tests/planner/data/hf";

std::vector<std::filesystem::path> Configs() {
  std::vector<std::filesystem::path> out;
  for (const auto& dir : {kData, kData / "synthetic"}) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().extension() == ".json" && entry.path().filename() != "SOURCES.json") {
        out.push_back(entry.path());
      }
    }
  }
  return out;
}

stowage::testing::CommandResult Plan(const std::filesystem::path& config, const std::string& run) {
  return stowage::testing::RunCommand(std::string(STOWAGE_BINARY_DIR) +
                                      "/cli/stowage plan --model " + config.string() +
                                      " --hardware h200 " + run + " --format json 2>&1");
}

void ExpectPlannedOrDoesNotFit(const stowage::testing::CommandResult& r) {
  if (r.code == 0) {
    EXPECT_THAT(r.out, HasSubstr("\"layers\""));
    EXPECT_THAT(r.out, HasSubstr("\"device_saved_bytes\""));
  } else {
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_THAT(r.out, HasSubstr("does not fit"));
    EXPECT_THAT(r.out, HasSubstr("needs at least"));
  }
}

TEST(HfConfigsCommand, EveryConfigPlansUnderMegatron) {
  const std::vector<std::filesystem::path> configs = Configs();
  ASSERT_GE(configs.size(), 12u);
  for (const auto& config : configs) {
    SCOPED_TRACE(config.filename().string());
    ExpectPlannedOrDoesNotFit(
        Plan(config, "--framework megatron --seq-len 32768 --gpus 64 --tp 1 --cp 8 --ep 1"));
  }
}

// The command line of the measured cases (tests/planner/data/measured/), at 8K tokens on one GPU:
// every layer kind has an hf recipe (gated DeltaNet, KDA and Mllama's cross-attention included), so
// nothing is refused.
TEST(HfConfigsCommand, EveryConfigPlansUnderHf) {
  for (const auto& config : Configs()) {
    SCOPED_TRACE(config.filename().string());
    ExpectPlannedOrDoesNotFit(
        Plan(config,
             "--framework hf --seq-len 8192 --micro-batch 1 --gpus 1 --cp 1 "
             "--ep 1 --tp 1 --sharding no_shard --optimizer none --grad-dtype "
             "bf16 --loss-chunk-tokens 0"));
  }
}

}  // namespace
