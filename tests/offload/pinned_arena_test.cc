#include "offload/pinned_arena.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "offload/host_memory.h"
#include "offload/topology.h"
#include "tests/test_util.h"

namespace stowage::offload {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

uint64_t PageSize() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

ArenaOptions Options(uint64_t bytes) {
  ArenaOptions options;
  options.bytes = bytes;
  return options;
}

TEST(PinnedArena, ExactCapacityRoundedToAPageOnly) {
  // 100 MiB + 1 byte: a power-of-two allocator would reserve 128 MiB or 256 MiB.
  const uint64_t asked = 100 * kMiB + 1;
  absl::StatusOr<std::unique_ptr<PinnedArena>> arena = PinnedArena::Create(Options(asked));
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_EQ((*arena)->capacity(), (asked + PageSize() - 1) / PageSize() * PageSize());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*arena)->base()) % (2 * kMiB), 0u);
  EXPECT_FALSE((*arena)->cuda_registered());
  EXPECT_EQ((*arena)->used(), 0u);
}

// Host memory used is what was asked, within 1%: every page is resident after Create (touched),
// and nothing beyond the mapping's exact size is.
TEST(PinnedArena, ResidentBytesWithinOnePercentOfTheRequest) {
  for (uint64_t asked : {uint64_t{3} * kMiB + 12345, 96 * kMiB + 7, 257 * kMiB}) {
    ArenaOptions options = Options(asked);
    options.touch_threads = 2;
    absl::StatusOr<std::unique_ptr<PinnedArena>> arena = PinnedArena::Create(options);
    ASSERT_TRUE(arena.ok()) << arena.status();
    absl::StatusOr<uint64_t> resident =
        ResidentBytesOfMapping((*arena)->base(), (*arena)->capacity());
    ASSERT_TRUE(resident.ok()) << resident.status();
    EXPECT_GE(*resident, asked) << "not every page was touched";
    EXPECT_LE(static_cast<double>(*resident), 1.01 * static_cast<double>(asked));
    absl::StatusOr<MappingResidency> residency =
        ReadMappingResidency((*arena)->base(), (*arena)->capacity());
    ASSERT_TRUE(residency.ok()) << residency.status();
    EXPECT_EQ(residency->resident_bytes, *resident);
    EXPECT_LE(residency->huge_page_bytes, residency->resident_bytes);
  }
}

TEST(PinnedArena, TouchesWithEveryThreadCountAndReportsProgress) {
  const Placement host = DiscoverHostPlacement();
  for (int threads : {1, 2, 3, 7}) {
    ArenaOptions options = Options(40 * kMiB);
    options.touch_threads = threads;
    options.touch_cpus = host.cpus;
    std::vector<uint64_t> reports;
    options.progress = [&](uint64_t done, uint64_t total) {
      EXPECT_EQ(total, 40 * kMiB);
      EXPECT_LE(done, total);
      reports.push_back(done);
    };
    absl::StatusOr<std::unique_ptr<PinnedArena>> arena = PinnedArena::Create(options);
    ASSERT_TRUE(arena.ok()) << arena.status();
    EXPECT_EQ((*arena)->setup_stats().touch_threads, threads);
    ASSERT_FALSE(reports.empty());
    EXPECT_EQ(reports.back(), 40 * kMiB);
    EXPECT_TRUE(std::is_sorted(reports.begin(), reports.end()));
    // Every byte reads back as zero (fresh anonymous memory) and is writable.
    std::byte* base = (*arena)->base();
    for (uint64_t i = 0; i < (*arena)->capacity(); i += 4099) ASSERT_EQ(base[i], std::byte{0});
    std::memset(base, 0xab, (*arena)->capacity());
  }
}

TEST(PinnedArena, BindsToTheHostNodeWhenThereIsOne) {
  const Placement host = DiscoverHostPlacement();
  ArenaOptions options = Options(16 * kMiB);
  options.numa_node = host.numa_node;
  options.touch_cpus = host.cpus;
  absl::StatusOr<std::unique_ptr<PinnedArena>> arena = PinnedArena::Create(options);
  ASSERT_TRUE(arena.ok()) << arena.status();
  if ((*arena)->setup_stats().numa_bound) {
    EXPECT_EQ((*arena)->numa_node(), host.numa_node);
    // Every page is resident on the node it was bound to.
    absl::StatusOr<std::map<int, uint64_t>> by_node =
        BytesByNode((*arena)->base(), (*arena)->capacity(), 64 * 1024);
    ASSERT_TRUE(by_node.ok()) << by_node.status();
    ASSERT_EQ(by_node->size(), 1u);
    EXPECT_EQ(by_node->begin()->first, host.numa_node);
    EXPECT_EQ(by_node->begin()->second, (*arena)->capacity());
  } else {
    EXPECT_EQ((*arena)->numa_node(), -1);  // no NUMA support, or mbind not permitted here
  }
}

TEST(PinnedArena, BumpAllocationAlignmentResetAndPeak) {
  absl::StatusOr<std::unique_ptr<PinnedArena>> created = PinnedArena::Create(Options(1 * kMiB));
  ASSERT_TRUE(created.ok()) << created.status();
  PinnedArena& arena = **created;
  absl::StatusOr<std::byte*> a = arena.Allocate(1);
  absl::StatusOr<std::byte*> b = arena.Allocate(100, 4096);
  absl::StatusOr<std::byte*> c = arena.Allocate(3);
  absl::StatusOr<std::byte*> zero = arena.Allocate(0);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && zero.ok());
  EXPECT_EQ(*a, arena.base());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*b) % 4096, 0u);
  EXPECT_EQ(*b, arena.base() + 4096);
  EXPECT_EQ(*c, arena.base() + 4096 + 256);
  EXPECT_EQ(arena.used(), 4096u + 256 + 3);
  EXPECT_EQ(arena.Allocate(8, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arena.Allocate(8, 0).status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<std::byte*> rest = arena.Allocate(arena.capacity() - 8192);
  ASSERT_TRUE(rest.ok()) << rest.status();
  const absl::Status full = arena.Allocate(8192).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()),
              AllOf(HasSubstr("cannot allocate 8192 bytes"), HasSubstr("capacity 1048576"),
                    HasSubstr("in use")));
  const uint64_t peak = arena.peak();
  EXPECT_EQ(peak, arena.used());

  arena.Reset();
  EXPECT_EQ(arena.used(), 0u);
  EXPECT_EQ(arena.peak(), peak);  // peak survives the step
  absl::StatusOr<std::byte*> again = arena.Allocate(arena.capacity(), 1);
  ASSERT_TRUE(again.ok()) << again.status();  // the whole capacity, exactly
  EXPECT_EQ(*again, arena.base());
  EXPECT_EQ(arena.Allocate(1, 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(arena.Allocate(UINT64_MAX, 1).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(PinnedArena, ConcurrentAllocationsNeverOverlap) {
  absl::StatusOr<std::unique_ptr<PinnedArena>> created = PinnedArena::Create(Options(8 * kMiB));
  ASSERT_TRUE(created.ok()) << created.status();
  PinnedArena& arena = **created;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 200;
  std::vector<std::vector<std::pair<std::byte*, uint64_t>>> got(kThreads);
  std::atomic<int> failures{0};
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          const uint64_t bytes = 1 + (t * 131 + i * 17) % 4000;
          absl::StatusOr<std::byte*> p = arena.Allocate(bytes, 64);
          if (!p.ok()) {
            failures.fetch_add(1);
            continue;
          }
          std::memset(*p, t, bytes);
          got[t].emplace_back(*p, bytes);
        }
      });
    }
  }
  EXPECT_EQ(failures.load(), 0);
  std::vector<std::pair<std::byte*, uint64_t>> all;
  for (int t = 0; t < kThreads; ++t) {
    for (const auto& [p, bytes] : got[t]) {
      for (uint64_t i = 0; i < bytes; ++i) ASSERT_EQ(p[i], static_cast<std::byte>(t));
      all.emplace_back(p, bytes);
    }
  }
  std::sort(all.begin(), all.end());
  for (size_t i = 1; i < all.size(); ++i) {
    EXPECT_LE(all[i - 1].first + all[i - 1].second, all[i].first);
  }
}

TEST(PinnedArena, RejectsBadOptions) {
  EXPECT_EQ(PinnedArena::Create(Options(0)).status().code(), absl::StatusCode::kInvalidArgument);
  ArenaOptions bad_node = Options(kMiB);
  bad_node.numa_node = -2;
  EXPECT_EQ(PinnedArena::Create(bad_node).status().code(), absl::StatusCode::kInvalidArgument);
}

uint64_t VirtualBytes() {
  absl::StatusOr<std::string> status = ReadSmallFile("/proc/self/status");
  return status.ok() ? MeminfoField(*status, "VmSize").value_or(0) : 0;
}

// A failure after the mapping (mbind refusing a node that does not exist) unmaps it again.
TEST(PinnedArena, FailureHalfwayRollsTheMappingBack) {
  ArenaOptions options = Options(uint64_t{1} << 30);
  options.numa_node = 1000;
  options.skip_admission = true;  // admission would refuse the node before mapping
  const uint64_t before = VirtualBytes();
  absl::StatusOr<std::unique_ptr<PinnedArena>> arena = PinnedArena::Create(options);
  if (arena.ok()) {
    EXPECT_EQ((*arena)->numa_node(), -1) << "no NUMA support: the node is ignored, not bound";
    GTEST_SKIP() << "this kernel has no NUMA support";
  }
  EXPECT_EQ(arena.status().code(), absl::StatusCode::kInvalidArgument) << arena.status();
  EXPECT_THAT(std::string(arena.status().message()),
              AllOf(HasSubstr("mbind"), HasSubstr("node 1000"), HasSubstr("1073741824 bytes")));
  EXPECT_LT(VirtualBytes(), before + (uint64_t{256} << 20)) << "the 1 GiB mapping leaked";
  // With admission on, the missing node is refused before anything is mapped.
  options.skip_admission = false;
  EXPECT_EQ(PinnedArena::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PinnedArena, AdmissionRefusesBeforeMapping) {
  const absl::Status status = PinnedArena::Create(Options(uint64_t{1} << 50)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("pinned host arena"), HasSubstr("1125899906842624 bytes"),
                    HasSubstr("MemAvailable")));
}

TEST(PinnedArena, RegistrationWithoutAGpuIsUnavailable) {
  ArenaOptions options = Options(kMiB);
  options.register_with_cuda = true;
  options.cuda_device = 0;
  if (testing::GpuAvailable()) {
    GTEST_SKIP() << "a GPU is present: pinned_arena_gpu_test covers registration";
  }
  const absl::Status status = PinnedArena::Create(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
}

}  // namespace
}  // namespace stowage::offload
