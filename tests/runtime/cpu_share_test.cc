// Ranks on one NUMA node split its CPUs for their copy workers and page-touch threads by
// node-ledger slot, instead of each taking all of them (Note [CPU shares] in runtime/runtime.cc).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "offload/host_backend.h"
#include "offload/node_ledger.h"
#include "offload/topology.h"
#include "runtime/runtime.h"
#include "tests/runtime/test_plans.h"

namespace stowage::runtime {
namespace {

class CpuShareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    node_cpus_ = offload::DiscoverHostPlacement().cpus;
    if (node_cpus_.size() < 2) GTEST_SKIP() << "the node has fewer than 2 CPUs to share";
    char pattern[] = "/tmp/stowage-cpu-share-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<Runtime> Start(int gpus_per_numa_node, int local_world_size = -1) {
    Plan plan = testing::MakeTestPlan(1, 1 << 20);
    plan.runtime.gpus_per_numa_node = gpus_per_numa_node;
    RuntimeOptions options;
    options.ledger.local_world_size = local_world_size;
    options.backend = BackendKind::kHost;
    options.ledger.dir = dir_;
    options.ledger.job_id = "cpu-share-test";
    options.ledger.node_budget_bytes = uint64_t{64} << 30;
    absl::StatusOr<std::unique_ptr<Runtime>> rt = Runtime::Create(plan, options);
    EXPECT_TRUE(rt.ok()) << rt.status();
    if (!rt.ok()) return nullptr;
    // The workers were pinned to the share, where the container allows pinning at all.
    const auto* host = dynamic_cast<const offload::HostBackend*>(&(*rt)->backend());
    EXPECT_NE(host, nullptr);
    if (host != nullptr && !host->pinned_cpus().empty()) {
      EXPECT_EQ(host->pinned_cpus(), (*rt)->cpu_share());
    }
    return *std::move(rt);
  }

  std::vector<int> Slice(int slot, int share) const {
    return offload::CpuShare(node_cpus_, slot, share);
  }

  std::vector<int> node_cpus_;
  std::string dir_;
};

bool Disjoint(const std::vector<int>& a, const std::vector<int>& b) {
  std::set<int> seen(a.begin(), a.end());
  return std::none_of(b.begin(), b.end(), [&](int cpu) { return seen.count(cpu) > 0; });
}

TEST_F(CpuShareTest, TwoPlannedRanksTakeDisjointHalves) {
  std::unique_ptr<Runtime> a = Start(2);
  std::unique_ptr<Runtime> b = Start(2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->cpu_share(), Slice(0, 2));
  EXPECT_EQ(b->cpu_share(), Slice(1, 2));
  EXPECT_FALSE(a->cpu_share().empty());
  EXPECT_FALSE(b->cpu_share().empty());
  EXPECT_TRUE(Disjoint(a->cpu_share(), b->cpu_share()));
}

// The plan says one GPU per node, but the ledger counts two live ranks when the second admits:
// it takes the second slice; after the first exits, a newcomer takes the slice it left.
TEST_F(CpuShareTest, TheLedgerCountsRanksThePlanDidNot) {
  std::unique_ptr<Runtime> a = Start(1);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->cpu_share(), node_cpus_);  // alone on the node
  std::unique_ptr<Runtime> b = Start(1);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->cpu_share(), Slice(1, 2));
  a.reset();
  std::unique_ptr<Runtime> c = Start(1);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->cpu_share(), Slice(0, 2));
  EXPECT_TRUE(Disjoint(b->cpu_share(), c->cpu_share()));
}

// Note [Local world size] (regression: a first rank admitted alone with a one-GPU plan took all
// of the node's CPUs until it restarted): with the launcher's LOCAL_WORLD_SIZE the first rank
// takes its slice at once, and the second the other one.
TEST_F(CpuShareTest, TheLocalWorldSizeSharesFromTheFirstRank) {
  const int local = offload::RanksSharingNumaNode(2, offload::DiscoverHostPlacement());
  ASSERT_EQ(local, 2);  // the host backend counts every local rank on its node
  std::unique_ptr<Runtime> a = Start(1, 2);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->cpu_share(), Slice(0, 2));
  std::unique_ptr<Runtime> b = Start(1, 2);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->cpu_share(), Slice(1, 2));
  EXPECT_TRUE(Disjoint(a->cpu_share(), b->cpu_share()));
  // More live ranks than the launcher said (several runtimes in one process): the ledger's count.
  std::unique_ptr<Runtime> c = Start(1, 2);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->cpu_share(), Slice(2, 3));
}

}  // namespace
}  // namespace stowage::runtime
