#include "offload/host_memory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "base/bytes.h"

namespace stowage::offload {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

HostRoots Tree(const std::string& name) {
  const std::string root =
      std::string(STOWAGE_SOURCE_DIR) + "/tests/offload/data/host_memory/" + name;
  return HostRoots{root + "/proc", root + "/sys", root + "/cgroup"};
}

// cgroup v2, two nodes: /kubepods/pod1 limits to 32 GiB with 20 GiB used, 4 GiB of it inactive
// file pages -> 16 GiB headroom; node 1 has 8 GiB free + 1 GiB inactive file + 1 GiB reclaimable.
TEST(ReadHostMemory, CgroupV2TightestLimitOnThePath) {
  absl::StatusOr<HostMemorySnapshot> s = ReadHostMemory(1, Tree("cgroup_v2"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->mem_total_bytes, 128 * kGiB);
  EXPECT_EQ(s->mem_available_bytes, 100 * kGiB);
  EXPECT_EQ(s->cgroup.version, 2);
  EXPECT_EQ(s->cgroup.path, "/kubepods/pod1/ctr");
  EXPECT_EQ(s->cgroup.limiting_path, "/kubepods/pod1");
  EXPECT_EQ(s->cgroup.limit_bytes, 32 * kGiB);
  EXPECT_EQ(s->cgroup.usage_bytes, 20 * kGiB);
  EXPECT_EQ(s->cgroup.reclaimable_bytes, 4 * kGiB);
  EXPECT_EQ(s->cgroup.headroom_bytes(), 16 * kGiB);
  EXPECT_EQ(s->memlock_used_bytes, 2u << 20);
  EXPECT_FALSE(s->cap_ipc_lock);
  EXPECT_EQ(s->online_nodes, 2);
  EXPECT_EQ(s->node, 1);
  EXPECT_EQ(s->node_total_bytes, 64 * kGiB);
  EXPECT_EQ(s->node_available_bytes, 10 * kGiB);
}

TEST(CheckAdmission, CgroupLimitBindsWithEveryNumberNamed) {
  absl::StatusOr<HostMemorySnapshot> s = ReadHostMemory(0, Tree("cgroup_v2"));
  ASSERT_TRUE(s.ok()) << s.status();
  AdmissionRequest request{.bytes = 12 * kGiB, .numa_node = 0};
  EXPECT_TRUE(CheckAdmission(*s, request).ok());
  request.bytes = 20 * kGiB;
  const absl::Status status = CheckAdmission(*s, request);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(
      std::string(status.message()),
      AllOf(HasSubstr("20.00 GiB (21474836480 bytes)"), HasSubstr("NUMA node 0"),
            HasSubstr("cgroup /kubepods/pod1 limit 32.00 GiB"), HasSubstr("leaves 16.00 GiB"),
            HasSubstr("MemAvailable 100.00 GiB"), HasSubstr("RLIMIT_MEMLOCK")))
      << status;
}

// Regression: admission let a request take 100% of the cgroup's headroom, so the
// trainer's next allocation was an OOM kill. A margin of 5% of the limit (at least 1 GiB) is kept
// back, and the error says so.
TEST(CheckAdmission, ARequestNeverTakesTheWholeCgroupHeadroom) {
  absl::StatusOr<HostMemorySnapshot> s = ReadHostMemory(0, Tree("cgroup_v2"));
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->cgroup.headroom_bytes(), 16 * kGiB);
  const uint64_t margin = AdmissionMarginBytes(32 * kGiB);
  EXPECT_EQ(margin, static_cast<uint64_t>(0.05 * 32 * kGiB));  // 1.6 GiB: above the 1 GiB floor
  EXPECT_TRUE(CheckAdmission(*s, {.bytes = 16 * kGiB - margin, .numa_node = 0}).ok());
  for (uint64_t bytes : {16 * kGiB - margin + 1, 16 * kGiB}) {
    const absl::Status status = CheckAdmission(*s, {.bytes = bytes, .numa_node = 0});
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << bytes;
    EXPECT_THAT(std::string(status.message()),
                AllOf(HasSubstr("leaves 16.00 GiB"),
                      HasSubstr("1.60 GiB (1717986918 bytes) is kept as the admission margin "
                                "(5% of the limit, at least 1 GiB)")))
        << status;
  }
  // The floor: small limits keep 1 GiB.
  EXPECT_EQ(AdmissionMarginBytes(4 * kGiB), kGiB);
  EXPECT_EQ(AdmissionMarginBytes(0), kGiB);
}

TEST(CheckAdmission, NodeFreeMemoryBindsOnAManyNodeMachine) {
  absl::StatusOr<HostMemorySnapshot> s = ReadHostMemory(1, Tree("cgroup_v2"));
  ASSERT_TRUE(s.ok()) << s.status();
  AdmissionRequest request{.bytes = 12 * kGiB, .numa_node = 1};
  const absl::Status status = CheckAdmission(*s, request);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("node 1 has 10.00 GiB (10737418240 bytes) available"),
                    Not(HasSubstr("leaves"))))
      << status;
  request.numa_node = -1;  // unbound: the node does not bind
  EXPECT_TRUE(CheckAdmission(*s, request).ok());
}

TEST(CheckAdmission, MissingNodeIsInvalid) {
  absl::StatusOr<HostMemorySnapshot> s = ReadHostMemory(5, Tree("cgroup_v2"));
  ASSERT_TRUE(s.ok()) << s.status();
  const absl::Status status = CheckAdmission(*s, {.bytes = 1, .numa_node = 5});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("no node 5 (2 nodes)"));
}

// cgroup v1 (hybrid hierarchy), root: 16 GiB limit, 10 GiB used, 2 GiB inactive file (the
// hierarchical total wins) -> 8 GiB. One node whose meminfo reports less than the machine (a VM
// with hot-plugged memory): the single node does not bind, MemAvailable does.
TEST(ReadHostMemory, CgroupV1AndTheSingleNodeDoesNotBind) {
  absl::StatusOr<HostMemorySnapshot> s = ReadHostMemory(0, Tree("cgroup_v1"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->cgroup.version, 1);
  EXPECT_EQ(s->cgroup.limiting_path, "/docker/abc");
  EXPECT_EQ(s->cgroup.limit_bytes, 16 * kGiB);
  EXPECT_EQ(s->cgroup.headroom_bytes(), 8 * kGiB);
  EXPECT_TRUE(s->cap_ipc_lock);
  EXPECT_EQ(s->online_nodes, 1);
  EXPECT_LT(*s->node_available_bytes, 6 * kGiB);

  EXPECT_TRUE(CheckAdmission(*s, {.bytes = 7 * kGiB, .numa_node = 0}).ok());
  const absl::Status status = CheckAdmission(*s, {.bytes = 9 * kGiB, .numa_node = 0});
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(status.message()), HasSubstr("cgroup /docker/abc limit 16.00 GiB"));
}

TEST(ReadHostMemory, CgroupNamespaceFallsBackToTheMountRoot) {
  absl::StatusOr<HostMemorySnapshot> s = ReadHostMemory(-1, Tree("cgroup_v1_namespace"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->cgroup.version, 1);
  EXPECT_EQ(s->cgroup.path, "/docker/gone");
  EXPECT_EQ(s->cgroup.limiting_path, "/");
  EXPECT_EQ(s->cgroup.headroom_bytes(), 3 * kGiB);
  EXPECT_EQ(s->online_nodes, 0);  // no sys tree: no NUMA information
  EXPECT_EQ(CheckAdmission(*s, {.bytes = 4 * kGiB}).code(), absl::StatusCode::kResourceExhausted);
}

TEST(CheckAdmission, MemlockEnforcedOnlyForLockedPagesWithoutCapIpcLock) {
  HostMemorySnapshot s;
  s.mem_total_bytes = s.mem_available_bytes = 64 * kGiB;
  s.memlock_limit_bytes = 8u << 20;
  s.memlock_used_bytes = 1u << 20;
  AdmissionRequest request{.bytes = 1 * kGiB};
  EXPECT_TRUE(CheckAdmission(s, request).ok());  // kReport: cudaHostRegister is not charged
  request.memlock = MemlockUse::kLocked;
  const absl::Status status = CheckAdmission(s, request);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("RLIMIT_MEMLOCK 8.00 MiB (8388608 bytes) leaves 7.00 MiB"),
                    HasSubstr("CAP_IPC_LOCK")));
  s.cap_ipc_lock = true;
  EXPECT_TRUE(CheckAdmission(s, request).ok());
  s.cap_ipc_lock = false;
  s.memlock_limit_bytes.reset();  // unlimited
  EXPECT_TRUE(CheckAdmission(s, request).ok());
}

TEST(CheckAdmission, MemAvailableBinds) {
  HostMemorySnapshot s;
  s.mem_total_bytes = 24 * kGiB;
  s.mem_available_bytes = 20 * kGiB;
  const absl::Status status = CheckAdmission(s, {.bytes = 21 * kGiB, .what = "arena for rank 3"});
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("arena for rank 3 of 21.00 GiB"),
                    HasSubstr("MemAvailable is 20.00 GiB"), HasSubstr("no memory cgroup")));
}

TEST(RealMachine, ReadsAndAdmits) {
  absl::StatusOr<HostMemorySnapshot> s = ReadHostMemory(-1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GT(s->mem_total_bytes, 0u);
  EXPECT_GT(s->mem_available_bytes, 0u);
  EXPECT_LE(s->mem_available_bytes, s->mem_total_bytes);
  EXPECT_FALSE(DescribeHostMemory(*s).empty());
  EXPECT_TRUE(AdmitHostMemory({.bytes = 1u << 20}).ok());
  const absl::Status huge = AdmitHostMemory({.bytes = uint64_t{1} << 60});
  EXPECT_EQ(huge.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(huge.message()), HasSubstr("MemAvailable"));
}

}  // namespace
}  // namespace stowage::offload
