// The test of node-level admission (Note [Node ledger]): eight runtime
// processes started at once through the C ABI against a node budget that fits five.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stowage/plan.h"
#include "stowage/stowage.h"
#include "tests/runtime/test_plans.h"

namespace stowage {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kArenaBytes = 8 * kMiB;  // per process: one layer of 8 MiB
// The budget keeps the 1 GiB admission margin (Note [Admission margin]) and fits 5.5 arenas.
constexpr uint64_t kBudgetBytes = (uint64_t{1} << 30) + 11 * kArenaBytes / 2;

std::string ReadPipe(int fd) {
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof buffer)) > 0) out.append(buffer, static_cast<size_t>(n));
  return out;
}

// One runtime process. It waits for `go` to close, creates a runtime, writes "admitted\n" or
// "refused <status>: <message>\n" to its report pipe and closes it; admitted, it runs one step
// and holds the runtime until `release` closes, then destroys it and exits 0.
struct Rank {
  pid_t pid = -1;
  int report = -1;   // read end
  int release = -1;  // write end
  std::string result;
};

Rank StartRank(int rank, int go, const std::string& plan_json) {
  int report[2], release[2];
  if (pipe2(report, O_CLOEXEC) != 0 || pipe2(release, O_CLOEXEC) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    // Keep only this rank's pipes: a sibling's write end held here would keep its reads open.
    for (int fd = 3; fd < 1024; ++fd) {
      if (fd != go && fd != report[1] && fd != release[0]) close(fd);
    }
    const std::string r = absl::StrCat(rank);
    setenv("RANK", r.c_str(), 1);
    setenv("LOCAL_RANK", r.c_str(), 1);
    char byte;
    while (read(go, &byte, 1) > 0) {
    }
    stowage_options options;
    stowage_options_init(&options);
    options.backend = STOWAGE_BACKEND_HOST;
    options.copy_threads = 1;
    stowage_runtime* rt = nullptr;
    const stowage_status status = stowage_create(plan_json.data(), plan_json.size(), &options, &rt);
    const std::string line = status == STOWAGE_OK
                                 ? std::string("admitted\n")
                                 : absl::StrCat("refused ", stowage_status_string(status), ": ",
                                                stowage_last_error(), "\n");
    if (write(report[1], line.data(), line.size()) < 0) _exit(2);
    close(report[1]);
    if (status != STOWAGE_OK) _exit(0);
    std::vector<std::byte> device(kArenaBytes, std::byte{7});
    stowage_tensor_id id = 0;
    if (stowage_begin_step(rt) != STOWAGE_OK ||
        stowage_save(rt, 0, device.data(), device.size(), nullptr, &id) != STOWAGE_OK ||
        stowage_restore(rt, id, device.data(), nullptr) != STOWAGE_OK ||
        stowage_end_step(rt) != STOWAGE_OK) {
      _exit(3);
    }
    while (read(release[0], &byte, 1) > 0) {
    }
    _exit(stowage_destroy(rt) == STOWAGE_OK ? 0 : 4);
  }
  close(report[1]);
  close(release[0]);
  Rank out;
  out.pid = pid;
  out.report = report[0];
  out.release = release[1];
  return out;
}

class NodeAdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/stowage-admission-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    setenv("STOWAGE_LEDGER_DIR", dir_.c_str(), 1);
    setenv("STOWAGE_JOB_ID", "admission-test", 1);
    setenv("STOWAGE_NODE_MEMORY_BYTES", absl::StrCat(kBudgetBytes).c_str(), 1);
    unsetenv("STOWAGE_METRICS_ADDR");
    plan_json_ = PlanToJson(testing::MakeTestPlan(1, kArenaBytes));
  }
  void TearDown() override {
    unsetenv("STOWAGE_LEDGER_DIR");
    unsetenv("STOWAGE_JOB_ID");
    unsetenv("STOWAGE_NODE_MEMORY_BYTES");
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
  std::string plan_json_;
};

TEST_F(NodeAdmissionTest, EightRanksAtOnceAgainstABudgetOfFive) {
  int go[2];
  ASSERT_EQ(pipe2(go, O_CLOEXEC), 0);
  std::vector<Rank> ranks;
  for (int r = 0; r < 8; ++r) {
    ranks.push_back(StartRank(r, go[0], plan_json_));
    ASSERT_GT(ranks.back().pid, 0);
  }
  close(go[0]);
  close(go[1]);  // all eight start creating at once
  int admitted = 0, refused = 0;
  for (Rank& rank : ranks) {
    rank.result = ReadPipe(rank.report);
    close(rank.report);
    if (rank.result == "admitted\n") {
      ++admitted;
    } else {
      ++refused;
      EXPECT_THAT(rank.result, HasSubstr("refused RESOURCE_EXHAUSTED: stowage_create: "));
      EXPECT_THAT(rank.result, HasSubstr("STOWAGE_NODE_MEMORY_BYTES"));
      EXPECT_THAT(rank.result, HasSubstr("this request: rank "));
      // Every other live rank's share is named: the five admitted.
      int shares = 0;
      for (const char* state : {" bytes) resident", " bytes) pending"}) {
        for (size_t at = 0; (at = rank.result.find(state, at)) != std::string::npos; ++at) {
          ++shares;
        }
      }
      EXPECT_EQ(shares, 5) << rank.result;
    }
  }
  EXPECT_EQ(admitted, 5);
  EXPECT_EQ(refused, 3);

  // The refused exit on their own, and cleanly: none was killed.
  std::vector<Rank> holding;
  for (Rank& rank : ranks) {
    if (rank.result == "admitted\n") {
      holding.push_back(rank);
      continue;
    }
    close(rank.release);
    int status = 0;
    ASSERT_EQ(waitpid(rank.pid, &status, 0), rank.pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << rank.result;
  }
  ASSERT_EQ(holding.size(), 5u);

  // A ninth while five hold their arenas: refused.
  int go2[2];
  ASSERT_EQ(pipe2(go2, O_CLOEXEC), 0);
  close(go2[1]);
  Rank ninth = StartRank(8, go2[0], plan_json_);
  close(go2[0]);
  ninth.result = ReadPipe(ninth.report);
  EXPECT_THAT(ninth.result, HasSubstr("refused RESOURCE_EXHAUSTED"));
  close(ninth.release);
  waitpid(ninth.pid, nullptr, 0);

  // SIGKILL one admitted rank (no destructor runs): the next admission reclaims its share.
  ASSERT_EQ(kill(holding[0].pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(holding[0].pid, &status, 0), holding[0].pid);
  EXPECT_TRUE(WIFSIGNALED(status));
  close(holding[0].release);
  holding.erase(holding.begin());
  int go3[2];
  ASSERT_EQ(pipe2(go3, O_CLOEXEC), 0);
  close(go3[1]);
  Rank tenth = StartRank(9, go3[0], plan_json_);
  close(go3[0]);
  tenth.result = ReadPipe(tenth.report);
  EXPECT_EQ(tenth.result, "admitted\n");
  holding.push_back(tenth);

  for (Rank& rank : holding) {
    close(rank.release);
    ASSERT_EQ(waitpid(rank.pid, &status, 0), rank.pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  // Every reservation released: the ledger is gone, and its lock file with it.
  EXPECT_FALSE(
      std::filesystem::exists(absl::StrCat(dir_, "/stowage-", getuid(), "-admission-test.ledger")));
  EXPECT_FALSE(
      std::filesystem::exists(absl::StrCat(dir_, "/stowage-", getuid(), "-admission-test.lock")));
}

}  // namespace
}  // namespace stowage
