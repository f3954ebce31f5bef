// `stowage calibrate` on a real GPU: it measures, prints the table and writes a measured profile.
// (Without a GPU, tests/offload/check_calibrate_without_gpu.cmake checks the exit code 3.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/test_util.h"

namespace stowage::offload {
namespace {

using ::testing::HasSubstr;

TEST(CalibrateGpu, WritesAMeasuredProfile) {
  STOWAGE_REQUIRE_GPU();
  const std::string out = ::testing::TempDir() + "/stowage-calibrated.json";
  const std::string table = ::testing::TempDir() + "/stowage-calibrate.txt";
  // STOWAGE_CLI names the CLI where the build tree is not at hand (tools/gpu-check's folder).
  const char* cli = std::getenv("STOWAGE_CLI");
  const std::string command =
      (cli != nullptr && *cli != '\0' ? std::string(cli)
                                      : std::string(STOWAGE_BINARY_DIR) + "/tools/stowage") +
      " calibrate --setup-bytes 1G --max-chunk 64M --skip-malloc-host --out " + out + " > " + table;
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << command;
  ASSERT_EQ(WEXITSTATUS(status), 0) << command;

  std::ifstream profile_file(out);
  std::stringstream profile;
  profile << profile_file.rdbuf();
  EXPECT_THAT(profile.str(), HasSubstr("\"measured\""));
  EXPECT_THAT(profile.str(), HasSubstr("d2h_bytes_per_second"));
  EXPECT_THAT(profile.str(), HasSubstr("chunk_bandwidth"));

  std::ifstream table_file(table);
  std::stringstream text;
  text << table_file.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("arena setup"));
  EXPECT_THAT(text.str(), HasSubstr("bidirectional"));
  std::printf("%s", text.str().c_str());
}

}  // namespace
}  // namespace stowage::offload
