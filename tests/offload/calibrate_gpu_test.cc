// `stowage calibrate` on a real GPU: it measures, prints the table and writes a measured profile.
// (Without a GPU, tests/offload/check_calibrate_without_gpu.cmake checks the exit code 3.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace stowage::offload {
namespace {

using ::testing::HasSubstr;

// STOWAGE_CLI names the CLI where the build tree is not at hand (scripts/gpu-check's folder).
std::string Cli() {
  const char* cli = std::getenv("STOWAGE_CLI");
  return cli != nullptr && *cli != '\0' ? std::string(cli)
                                        : std::string(STOWAGE_BINARY_DIR) + "/cli/stowage";
}

TEST(CalibrateGpu, WritesAMeasuredProfile) {
  STOWAGE_REQUIRE_GPU();
  const std::string out = ::testing::TempDir() + "/stowage-calibrated.json";
  const std::string table = ::testing::TempDir() + "/stowage-calibrate.txt";
  const std::string command =
      Cli() + " calibrate --setup-bytes 1G --max-chunk 64M --skip-malloc-host --out " + out +
      " > " + table;
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << command;
  ASSERT_EQ(WEXITSTATUS(status), 0) << command;

  std::ifstream profile_file(out);
  std::stringstream profile;
  profile << profile_file.rdbuf();
  EXPECT_THAT(profile.str(), HasSubstr("\"measured\""));
  EXPECT_THAT(profile.str(), HasSubstr("d2h_bytes_per_second"));
  EXPECT_THAT(profile.str(), HasSubstr("chunk_bandwidth"));
  // The node's GPUs together: the shared host link, and NCCL's rates among them (or a line
  // saying why not: one GPU, or no NCCL).
  EXPECT_THAT(profile.str(), HasSubstr("\"gpus_per_host_link\""));
  EXPECT_THAT(profile.str(), HasSubstr("\"all_to_all_bytes_per_second\""));

  std::ifstream table_file(table);
  std::stringstream text;
  text << table_file.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("arena setup"));
  EXPECT_THAT(text.str(), HasSubstr("bidirectional"));
  EXPECT_THAT(text.str(), HasSubstr("GEMM bf16"));
  EXPECT_THAT(text.str(), HasSubstr("host link, every GPU copying at once"));
  EXPECT_THAT(text.str(), HasSubstr("NCCL"));
  std::printf("%s", text.str().c_str());
}

// The per-op-class rates (cli/calibrate_compute.cc Note [Calibrated op rates]): each measured
// share in (0, 1], the launch floor under a millisecond, and the table says what it did not
// measure (fused attention).
TEST(CalibrateGpu, MeasuresTheComputeRates) {
  STOWAGE_REQUIRE_GPU();
  const std::string out = ::testing::TempDir() + "/stowage-compute.json";
  const std::string table = ::testing::TempDir() + "/stowage-compute.txt";
  const std::string command = Cli() + " calibrate --compute-only --out " + out + " > " + table;
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << command;
  ASSERT_EQ(WEXITSTATUS(status), 0) << command;
  std::ifstream profile_file(out);
  const nlohmann::json profile = nlohmann::json::parse(profile_file);
  EXPECT_EQ(profile["source"], "measured");
  for (const char* share : {"gemm_efficiency", "fp32_gemm_efficiency", "grouped_gemm_efficiency",
                            "elementwise_efficiency"}) {
    const double value = profile[share];
    EXPECT_GT(value, 0) << share;
    EXPECT_LE(value, 1) << share;
  }
  const double half = profile["grouped_gemm_half_tokens"];
  EXPECT_GE(half, 0);
  const double launch = profile["kernel_seconds"];
  EXPECT_GT(launch, 0);
  EXPECT_LT(launch, 1e-3);
  std::ifstream table_file(table);
  std::stringstream text;
  text << table_file.rdbuf();
  for (const char* needle :
       {"GEMM bf16", "GEMM fp32", "expert GEMMs", "stream copy", "empty kernel", "not measured"}) {
    EXPECT_THAT(text.str(), HasSubstr(needle));
  }
  std::printf("%s", text.str().c_str());
}

}  // namespace
}  // namespace stowage::offload
