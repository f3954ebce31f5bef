// The node ledger (offload/node_ledger.h, Note [Node ledger]) and CheckAdmission with other
// ranks' shares (Note [Admission with other ranks]).
#include "offload/node_ledger.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace stowage::offload {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class NodeLedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/stowage-ledger-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    options_.dir = dir_;
    options_.job_id = "unit";
    options_.rank = 3;
    options_.local_rank = 1;
    // A fixed budget: the machine's own memory is far larger than what these tests reserve, so
    // the budget is what binds. 1 GiB of it is the margin (Note [Admission margin]).
    options_.node_budget_bytes = kGiB + 100 * kMiB;
    ledger_ = absl::StrCat(dir_, "/stowage-", getuid(), "-unit.ledger");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  AdmissionRequest Request(uint64_t bytes) const {
    AdmissionRequest request;
    request.bytes = bytes;
    request.numa_node = -1;
    return request;
  }
  void WriteLedger(const std::string& text) const { std::ofstream(ledger_) << text; }
  LedgerEntry Entry(int64_t pid, uint64_t start, uint64_t bytes) const {
    LedgerEntry e;
    e.pid = pid;
    e.start_time = start;
    e.id = 99;
    e.rank = 7;
    e.local_rank = 7;
    e.bytes = bytes;
    e.pid_namespace = PidNamespace(getpid());
    return e;
  }

  std::string dir_;
  std::string ledger_;
  LedgerOptions options_;
};

TEST_F(NodeLedgerTest, FormatParseRoundTrip) {
  LedgerEntry a = Entry(12, 345, 6 * kMiB);
  a.numa_node = 1;
  a.slot = 2;
  a.resident = true;
  const LedgerEntry b = Entry(13, 346, 7);
  absl::StatusOr<std::vector<LedgerEntry>> parsed = ParseLedger(FormatLedger({a, b}), "x");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[0].pid, 12);
  EXPECT_EQ((*parsed)[0].start_time, 345u);
  EXPECT_EQ((*parsed)[0].numa_node, 1);
  EXPECT_EQ((*parsed)[0].slot, 2);
  EXPECT_EQ((*parsed)[0].bytes, 6 * kMiB);
  EXPECT_TRUE((*parsed)[0].resident);
  EXPECT_FALSE((*parsed)[1].resident);
  EXPECT_EQ(FormatLedger(*parsed), FormatLedger({a, b}));
}

TEST_F(NodeLedgerTest, AdmitsRecordsAndReleases) {
  {
    absl::StatusOr<std::unique_ptr<NodeReservation>> r =
        NodeReservation::Admit(Request(40 * kMiB), options_);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->ledger_path(), ledger_);
    absl::StatusOr<std::vector<LedgerEntry>> entries = ParseLedger(ReadAll(ledger_), ledger_);
    ASSERT_TRUE(entries.ok()) << entries.status();
    ASSERT_EQ(entries->size(), 1u);
    EXPECT_EQ((*entries)[0].pid, getpid());
    EXPECT_EQ((*entries)[0].rank, 3);
    EXPECT_EQ((*entries)[0].local_rank, 1);
    EXPECT_EQ((*entries)[0].bytes, 40 * kMiB);
    EXPECT_FALSE((*entries)[0].resident);
    ASSERT_TRUE((*r)->MarkResident().ok());
    entries = ParseLedger(ReadAll(ledger_), ledger_);
    ASSERT_TRUE(entries.ok());
    EXPECT_TRUE((*entries)[0].resident);
  }
  // Destroyed: the last reservation went, and the ledger with it.
  EXPECT_FALSE(std::filesystem::exists(ledger_));
}

TEST_F(NodeLedgerTest, SecondReservationThatDoesNotFitNamesEveryShare) {
  absl::StatusOr<std::unique_ptr<NodeReservation>> first =
      NodeReservation::Admit(Request(60 * kMiB), options_);
  ASSERT_TRUE(first.ok()) << first.status();
  LedgerOptions other = options_;
  other.rank = 4;
  other.local_rank = 2;
  absl::StatusOr<std::unique_ptr<NodeReservation>> second =
      NodeReservation::Admit(Request(60 * kMiB), other);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(second.status().message());
  EXPECT_THAT(message, HasSubstr("STOWAGE_NODE_MEMORY_BYTES"));
  EXPECT_THAT(message, HasSubstr("rank 3 (local rank 1) pid"));
  EXPECT_THAT(message, HasSubstr("this request: rank 4 (local rank 2)"));
  EXPECT_THAT(message, HasSubstr(ledger_));
  // One that fits beside it is admitted, on the next CPU slot.
  absl::StatusOr<std::unique_ptr<NodeReservation>> third =
      NodeReservation::Admit(Request(30 * kMiB), other);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ((*first)->slot(), 0);
  EXPECT_EQ((*third)->slot(), 1);
  EXPECT_EQ((*third)->ranks_on_node(), 2);
}

// A rank SIGKILLed (or OOM-killed) leaves its line: the next admission reclaims it.
TEST_F(NodeLedgerTest, ReclaimsTheReservationOfADeadProcess) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  absl::StatusOr<uint64_t> start = ProcessStartTime(child);  // a zombie still has its stat
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(start.ok()) << start.status();
  // 90 MiB of the 100 MiB budget held by the dead child: counted, a 40 MiB request would fail.
  WriteLedger(FormatLedger({Entry(child, *start, 90 * kMiB)}));
  EXPECT_FALSE(ReservationAlive(Entry(child, *start, 0)));
  absl::StatusOr<std::unique_ptr<NodeReservation>> r =
      NodeReservation::Admit(Request(40 * kMiB), options_);
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<std::vector<LedgerEntry>> entries = ParseLedger(ReadAll(ledger_), ledger_);
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].pid, getpid());
}

// The names in `dir`, sorted.
std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Note [Ledger lock]: a process stopped while it holds the ledger's lock (SIGSTOP, a debugger)
// neither blocks an admission nor a release for the whole lock timeout: both give up within a
// second, the admission naming the stopped process; an admission that failed releases nothing.
TEST_F(NodeLedgerTest, AStoppedLockHolderIsNamedPromptly) {
  absl::StatusOr<std::unique_ptr<NodeReservation>> held =
      NodeReservation::Admit(Request(10 * kMiB), options_);
  ASSERT_TRUE(held.ok()) << held.status();
  const std::string lock = absl::StrCat(dir_, "/stowage-", getuid(), "-unit.lock");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int fd = open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) _exit(1);
    raise(SIGSTOP);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  using Clock = std::chrono::steady_clock;
  Clock::time_point start = Clock::now();
  absl::StatusOr<std::unique_ptr<NodeReservation>> r =
      NodeReservation::Admit(Request(10 * kMiB), options_);
  const double admit_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  start = Clock::now();
  held->reset();  // the release gives up too (its line is reclaimed once this process is gone)
  const double release_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  kill(child, SIGKILL);
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_LT(admit_seconds, 5.0);
  EXPECT_LT(release_seconds, 5.0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(),
              HasSubstr(absl::StrCat("node ledger lock ", lock, " is held by process ", child,
                                     ", which is stopped (SIGSTOP)")));
  EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("kill -CONT ", child)));
  // The holder gone, the kernel dropped its lock: the next admission goes through at once.
  r = NodeReservation::Admit(Request(10 * kMiB), options_);
  EXPECT_TRUE(r.ok()) << r.status();
}

// Note [Reclaiming other jobs]: ranks of a job id never seen again, SIGKILLed (no destructor
// ran), leave nothing in the directory once any other job admits; and the job's own last rank
// takes its ledger and lock file with it.
TEST_F(NodeLedgerTest, KilledRanksOfAJobLeaveNothingBehind) {
  LedgerOptions killed = options_;
  killed.job_id = absl::StrCat("killed-", getpid());
  std::vector<pid_t> ranks;
  for (int rank = 0; rank < 3; ++rank) {
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(ready[0]);
      killed.rank = rank;
      killed.local_rank = rank;
      absl::StatusOr<std::unique_ptr<NodeReservation>> r =
          NodeReservation::Admit(Request(10 * kMiB), killed);
      const char byte = r.ok() ? 'y' : 'n';
      if (write(ready[1], &byte, 1) != 1 || !r.ok()) _exit(1);
      while (true) pause();
    }
    close(ready[1]);
    char byte = 0;
    EXPECT_EQ(read(ready[0], &byte, 1), 1);
    EXPECT_EQ(byte, 'y');
    close(ready[0]);
    ranks.push_back(pid);
  }
  for (pid_t pid : ranks) {
    kill(pid, SIGKILL);
    ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  }
  const std::string stem = absl::StrCat("stowage-", getuid(), "-");
  EXPECT_THAT(Listing(dir_), ::testing::ElementsAre(absl::StrCat(stem, killed.job_id, ".ledger"),
                                                    absl::StrCat(stem, killed.job_id, ".lock")));
  {
    absl::StatusOr<std::unique_ptr<NodeReservation>> r =
        NodeReservation::Admit(Request(10 * kMiB), options_);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(Listing(dir_), ::testing::ElementsAre(absl::StrCat(stem, "unit.ledger"),
                                                      absl::StrCat(stem, "unit.lock")));
  }
  EXPECT_THAT(Listing(dir_), ::testing::IsEmpty());
  // A refused admission leaves nothing either.
  absl::StatusOr<std::unique_ptr<NodeReservation>> refused =
      NodeReservation::Admit(Request(10 * kGiB), options_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(Listing(dir_), ::testing::IsEmpty());
}

// A pid the kernel gave to a new process after the rank died: same pid, another start time.
TEST_F(NodeLedgerTest, ReclaimsAReusedPid) {
  absl::StatusOr<uint64_t> start = ProcessStartTime(getpid());
  ASSERT_TRUE(start.ok());
  const LedgerEntry reused = Entry(getpid(), *start + 1, 90 * kMiB);
  EXPECT_FALSE(ReservationAlive(reused));
  EXPECT_TRUE(ReservationAlive(Entry(getpid(), *start, 0)));
  WriteLedger(FormatLedger({reused}));
  absl::StatusOr<std::unique_ptr<NodeReservation>> r =
      NodeReservation::Admit(Request(40 * kMiB), options_);
  ASSERT_TRUE(r.ok()) << r.status();
  // The same entry with the right start time is alive, and binds.
  WriteLedger(FormatLedger({Entry(getpid(), *start, 90 * kMiB)}));
  absl::StatusOr<std::unique_ptr<NodeReservation>> refused =
      NodeReservation::Admit(Request(40 * kMiB), options_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  std::filesystem::remove(ledger_);  // so that `r` releases into an empty ledger
}

TEST_F(NodeLedgerTest, CorruptLedgerIsAnErrorNamingFileAndLine) {
  WriteLedger("not a ledger\n");
  absl::StatusOr<std::unique_ptr<NodeReservation>> r =
      NodeReservation::Admit(Request(kMiB), options_);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr(ledger_));
  EXPECT_THAT(r.status().message(), HasSubstr("line 1 is 'not a ledger'"));

  WriteLedger(
      "stowage node ledger v1\npid=1 start=2 id=3 rank=0 local_rank=0 node=0 slot=0 "
      "bytes=12abc resident=0 pidns=0\n");
  r = NodeReservation::Admit(Request(kMiB), options_);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("line 2 is not a reservation"));
  EXPECT_THAT(r.status().message(), HasSubstr("bytes=12abc"));
  // Nothing was rebuilt behind the caller's back.
  EXPECT_THAT(ReadAll(ledger_), HasSubstr("bytes=12abc"));
}

TEST_F(NodeLedgerTest, EnvironmentFillsTheOptions) {
  setenv("TORCHELASTIC_RUN_ID", "run/42 x", 1);
  setenv("LOCAL_RANK", "5", 1);
  setenv("STOWAGE_NODE_MEMORY_BYTES", "123", 1);
  absl::StatusOr<LedgerOptions> resolved = ResolveLedgerOptions({});
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->job_id, "run/42 x");
  EXPECT_EQ(resolved->local_rank, 5);
  EXPECT_EQ(resolved->node_budget_bytes, 123u);
  // The job id is made safe for a file name.
  LedgerOptions options = options_;
  options.job_id = "run/42 x";
  options.node_budget_bytes.reset();
  options.node_budget_bytes = 100 * kGiB;
  {
    absl::StatusOr<std::unique_ptr<NodeReservation>> r =
        NodeReservation::Admit(Request(kMiB), options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)->ledger_path(), absl::StrCat(dir_, "/stowage-", getuid(), "-run_42_x.ledger"));
  }
  setenv("STOWAGE_NODE_MEMORY_BYTES", "12 GiB", 1);
  EXPECT_EQ(ResolveLedgerOptions({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ResolveLedgerOptions({}).status().message(), HasSubstr("STOWAGE_NODE_MEMORY_BYTES"));
  setenv("LOCAL_RANK", "-1", 1);
  unsetenv("STOWAGE_NODE_MEMORY_BYTES");
  EXPECT_THAT(ResolveLedgerOptions({}).status().message(), HasSubstr("LOCAL_RANK is '-1'"));
  unsetenv("LOCAL_RANK");
  unsetenv("TORCHELASTIC_RUN_ID");
}

// Note [Local world size]: torchrun's LOCAL_WORLD_SIZE, checked against WORLD_SIZE and
// LOCAL_RANK; unset, the count is unknown (-1) and the runtime falls back to the ledger's count.
TEST_F(NodeLedgerTest, LocalWorldSizeFromTheEnvironmentIsChecked) {
  for (const char* name : {"LOCAL_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS", "LOCAL_RANK"}) {
    unsetenv(name);
  }
  absl::StatusOr<LedgerOptions> unset = ResolveLedgerOptions({});
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_EQ(unset->local_world_size, -1);
  EXPECT_EQ(unset->world_size, -1);

  setenv("LOCAL_WORLD_SIZE", "4", 1);
  setenv("WORLD_SIZE", "16", 1);
  setenv("LOCAL_RANK", "3", 1);
  absl::StatusOr<LedgerOptions> set = ResolveLedgerOptions({});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->local_world_size, 4);
  EXPECT_EQ(set->world_size, 16);
  EXPECT_EQ(set->local_rank, 3);
  // Resolving again (the runtime resolves once, admission again) changes nothing.
  absl::StatusOr<LedgerOptions> again = ResolveLedgerOptions(*set);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->local_world_size, 4);

  for (const char* bad : {"0", "-2", "four", "4x", "99999999999"}) {
    setenv("LOCAL_WORLD_SIZE", bad, 1);
    absl::Status s = ResolveLedgerOptions({}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("environment variable LOCAL_WORLD_SIZE is '",
                                                    bad, "'; allowed: a positive integer")));
  }
  setenv("LOCAL_WORLD_SIZE", "32", 1);
  EXPECT_THAT(ResolveLedgerOptions({}).status().message(),
              HasSubstr("environment variable LOCAL_WORLD_SIZE is 32; allowed: a positive integer "
                        "no larger than the world size (environment variable WORLD_SIZE is 16)"));
  setenv("LOCAL_WORLD_SIZE", "3", 1);  // LOCAL_RANK is 3: local ranks are 0 to 2
  EXPECT_THAT(ResolveLedgerOptions({}).status().message(),
              HasSubstr("environment variable LOCAL_WORLD_SIZE is 3 but environment variable "
                        "LOCAL_RANK is 3"));
  // Options win over the environment and are checked the same way.
  LedgerOptions given;
  given.local_world_size = 8;
  given.local_rank = 7;
  absl::StatusOr<LedgerOptions> from_options = ResolveLedgerOptions(given);
  ASSERT_TRUE(from_options.ok()) << from_options.status();
  EXPECT_EQ(from_options->local_world_size, 8);
  given.local_world_size = 0;
  EXPECT_THAT(ResolveLedgerOptions(given).status().message(),
              HasSubstr("local_world_size is 0; allowed: -1 (from LOCAL_WORLD_SIZE)"));
  given.local_world_size = 8;
  given.world_size = 4;
  EXPECT_THAT(ResolveLedgerOptions(given).status().message(),
              HasSubstr("local_world_size is 8; allowed: a positive integer no larger than the "
                        "world size (world_size is 4)"));
  // Under srun without WORLD_SIZE, SLURM_NTASKS is the world size.
  unsetenv("WORLD_SIZE");
  unsetenv("LOCAL_RANK");
  setenv("SLURM_NTASKS", "2", 1);
  setenv("LOCAL_WORLD_SIZE", "4", 1);
  EXPECT_THAT(ResolveLedgerOptions({}).status().message(),
              HasSubstr("(environment variable SLURM_NTASKS is 2)"));
  for (const char* name : {"LOCAL_WORLD_SIZE", "SLURM_NTASKS"}) unsetenv(name);
}

TEST(RanksSharingNumaNodeTest, LocalRanksOnTheGpusNode) {
  Placement one_node;
  one_node.node_count = 1;
  one_node.gpus_sharing_node = 8;
  EXPECT_EQ(RanksSharingNumaNode(8, one_node), 8);
  EXPECT_EQ(RanksSharingNumaNode(2, one_node), 2);
  EXPECT_EQ(RanksSharingNumaNode(-1, one_node), 1);  // unknown: the caller falls back
  Placement no_numa;                                 // node_count 0
  EXPECT_EQ(RanksSharingNumaNode(3, no_numa), 3);
  // Two sockets of four GPUs each: eight local ranks put four on this node; two local ranks
  // may both be here.
  Placement socket;
  socket.node_count = 2;
  socket.gpus_sharing_node = 4;
  EXPECT_EQ(RanksSharingNumaNode(8, socket), 4);
  EXPECT_EQ(RanksSharingNumaNode(2, socket), 2);
  // The host backend on a two-node CPU machine counts no GPUs: every local rank may be here.
  socket.gpus_sharing_node = 0;
  EXPECT_EQ(RanksSharingNumaNode(6, socket), 6);
}

TEST(CpuShareTest, SplitsTheNodesCpusAmongItsRanks) {
  const std::vector<int> cpus = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(CpuShare(cpus, 0, 1), cpus);
  EXPECT_EQ(CpuShare(cpus, 0, 4), (std::vector<int>{0, 1}));
  EXPECT_EQ(CpuShare(cpus, 1, 4), (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(CpuShare(cpus, 3, 4), (std::vector<int>{7, 8, 9}));
  EXPECT_EQ(CpuShare(cpus, 5, 4), (std::vector<int>{2, 3, 4}));  // slot past the share: wraps
  // Fewer CPUs than ranks: each keeps them all rather than none.
  EXPECT_EQ(CpuShare({0, 1}, 1, 4), (std::vector<int>{0, 1}));
}

// Note [Admission with other ranks]: resident reservations are already in the readings.
TEST(CheckAdmissionWithSharesTest, ResidentSharesAreInTheReadingsPendingOnesAreAdded) {
  HostMemorySnapshot s;
  s.mem_total_bytes = 20 * kGiB;
  s.mem_available_bytes = 10 * kGiB;  // margin: 1 GiB; 9 GiB usable
  AdmissionRequest request;
  request.bytes = 4 * kGiB;
  NodeShares shares;
  shares.ledger = "ledger";
  shares.others.push_back({0, 0, 100, -1, 5 * kGiB, /*resident=*/true});
  EXPECT_TRUE(CheckAdmission(s, request, shares).ok());
  shares.others[0].resident = false;  // 4 + 5 pending = 9: still fits
  EXPECT_TRUE(CheckAdmission(s, request, shares).ok());
  shares.others.push_back({1, 1, 101, -1, 1, false});
  absl::Status refused = CheckAdmission(s, request, shares);
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("admitted and not yet resident"));
  EXPECT_THAT(refused.message(), HasSubstr("rank 0 (local rank 0) pid 100 node -1: 5.00 GiB"));
  EXPECT_THAT(refused.message(), HasSubstr("rank 1 (local rank 1) pid 101"));
  // A fixed budget counts every reservation, resident or not.
  shares.others.pop_back();
  shares.others[0].resident = true;
  shares.node_budget_bytes = 10 * kGiB;  // 9 usable: 4 + 5 reserved fit
  EXPECT_TRUE(CheckAdmission(s, request, shares).ok());
  shares.node_budget_bytes = 10 * kGiB - 1;
  refused = CheckAdmission(s, request, shares);
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("node budget (STOWAGE_NODE_MEMORY_BYTES)"));
}

// Only reservations on the same NUMA node count against that node's free memory.
TEST(CheckAdmissionWithSharesTest, NodeMemoryCountsTheSameNodesPendingShares) {
  HostMemorySnapshot s;
  s.mem_total_bytes = 200 * kGiB;
  s.mem_available_bytes = 150 * kGiB;
  s.node = 1;
  s.online_nodes = 2;
  s.node_total_bytes = 100 * kGiB;
  s.node_available_bytes = 50 * kGiB;  // margin 5 GiB: 45 usable
  AdmissionRequest request;
  request.bytes = 30 * kGiB;
  request.numa_node = 1;
  NodeShares shares;
  shares.others.push_back({0, 0, 100, 0, 20 * kGiB, false});  // on node 0
  EXPECT_TRUE(CheckAdmission(s, request, shares).ok());
  shares.others[0].numa_node = 1;
  absl::Status refused = CheckAdmission(s, request, shares);
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("node 1 has 50.00 GiB"));
}

}  // namespace
}  // namespace stowage::offload
