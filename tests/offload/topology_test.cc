#include "offload/topology.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace stowage::offload {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string Tree(const std::string& name) {
  return std::string(STOWAGE_SOURCE_DIR) + "/tests/offload/data/topology/" + name + "/sys";
}

std::vector<int> Range(int first, int last) {
  std::vector<int> out;
  for (int i = first; i <= last; ++i) out.push_back(i);
  return out;
}

TEST(ParseCpuList, RangesSinglesAndWhitespace) {
  EXPECT_THAT(*ParseCpuList("0-3,8,10-11\n"), ElementsAre(0, 1, 2, 3, 8, 10, 11));
  EXPECT_THAT(*ParseCpuList("5"), ElementsAre(5));
  EXPECT_THAT(*ParseCpuList("3,1-2,2"), ElementsAre(1, 2, 3));  // sorted, deduplicated
  EXPECT_THAT(*ParseCpuList("\n"), IsEmpty());
  EXPECT_THAT(*ParseCpuList(""), IsEmpty());
}

TEST(ParseCpuList, RejectsMalformedText) {
  for (const char* bad : {"a", "3-1", "1-", "-1", "1,,2", "0-3-5", "1.5"}) {
    EXPECT_EQ(ParseCpuList(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(MeminfoField, ReadsProcAndNodeFormats) {
  const std::string proc = "MemTotal:  100 kB\nMemAvailable:   7 kB\nHugePages_Total:    3\n";
  EXPECT_EQ(MeminfoField(proc, "MemTotal"), 100u * 1024);
  EXPECT_EQ(MeminfoField(proc, "MemAvailable"), 7u * 1024);
  EXPECT_EQ(MeminfoField(proc, "HugePages_Total"), 3u);  // no unit: a plain number
  EXPECT_FALSE(MeminfoField(proc, "MemFree").has_value());
  const std::string node = "Node 1 Inactive(file): 4 kB\nNode 1 Active(file): 9 kB\n";
  EXPECT_EQ(MeminfoField(node, "Active(file)"), 9u * 1024);  // not the tail of Inactive(file)
  EXPECT_EQ(MeminfoField(node, "Inactive(file)"), 4u * 1024);
}

TEST(NormalizePciBusId, SysfsForm) {
  EXPECT_EQ(NormalizePciBusId("0000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(NormalizePciBusId("00000000:3B:00.0"), "0000:3b:00.0");  // nvidia-smi's form
  EXPECT_EQ(NormalizePciBusId("3b:00.0"), "0000:3b:00.0");
  EXPECT_EQ(NormalizePciBusId("0001:c1:00.0\n"), "0001:c1:00.0");
}

// The reference H200 VM: one node, every PCI device reports numa_node -1.
TEST(SysfsTopology, OneNodeWithUnknownPciNodeUsesTheOnlyNode) {
  const MachineNodes machine = ReadSysfsNodes(Tree("one_node"));
  ASSERT_EQ(machine.nodes.size(), 1u);
  EXPECT_EQ(machine.nodes[0].cpus, Range(0, 15));
  EXPECT_EQ(machine.nodes[0].mem_total_bytes, uint64_t{131981020} * 1024);
  EXPECT_THAT(ListSysfsGpus(Tree("one_node")), ElementsAre("0000:00:05.0"));

  TopologyOptions options;
  options.sys_root = Tree("one_node");
  absl::StatusOr<Placement> placement = DiscoverPciPlacement("0000:00:05.0", options);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->numa_node, 0);
  EXPECT_EQ(placement->cpus, Range(0, 15));
  EXPECT_EQ(placement->gpus_sharing_node, 1);
  EXPECT_EQ(placement->node_count, 1);
  EXPECT_EQ(placement->source, "sysfs");
  EXPECT_THAT(placement->note, HasSubstr("only node"));
}

TEST(SysfsTopology, ManyNodesReadsThePciNodeAndCountsSharers) {
  TopologyOptions options;
  options.sys_root = Tree("two_nodes");
  EXPECT_THAT(ListSysfsGpus(options.sys_root),
              ElementsAre("0000:17:00.0", "0000:3b:00.0", "0000:86:00.0", "0000:af:00.0",
                          "0000:d8:00.0"));  // not the bridge, not the NIC

  absl::StatusOr<Placement> gpu0 = DiscoverPciPlacement("0000:17:00.0", options);
  ASSERT_TRUE(gpu0.ok()) << gpu0.status();
  EXPECT_EQ(gpu0->numa_node, 0);
  EXPECT_EQ(gpu0->cpus, Range(0, 7));
  EXPECT_EQ(gpu0->gpus_sharing_node, 2);  // 17:00.0 and 3b:00.0
  EXPECT_TRUE(gpu0->note.empty()) << gpu0->note;

  // numa_node -1 but local_cpulist lies inside node 1: node 1, shared with 86:00.0.
  absl::StatusOr<Placement> inferred = DiscoverPciPlacement("0000:AF:00.0", options);
  ASSERT_TRUE(inferred.ok()) << inferred.status();
  EXPECT_EQ(inferred->numa_node, 1);
  EXPECT_EQ(inferred->cpus, Range(8, 15));
  EXPECT_EQ(inferred->gpus_sharing_node, 2);
  EXPECT_THAT(inferred->note, HasSubstr("local_cpulist"));

  // numa_node -1 and local_cpulist spanning both nodes: no binding, and it says why.
  absl::StatusOr<Placement> ambiguous = DiscoverPciPlacement("0000:d8:00.0", options);
  ASSERT_TRUE(ambiguous.ok()) << ambiguous.status();
  EXPECT_EQ(ambiguous->numa_node, -1);
  EXPECT_EQ(ambiguous->cpus, Range(0, 15));
  EXPECT_THAT(ambiguous->note, HasSubstr("not bound"));
  EXPECT_EQ(ambiguous->gpus_sharing_node, 5);  // unbound: every GPU shares the machine's RAM
}

TEST(SysfsTopology, NoNumaInformationMeansNoBinding) {
  TopologyOptions options;
  options.sys_root = Tree("no_numa");
  const MachineNodes machine = ReadSysfsNodes(options.sys_root);
  EXPECT_THAT(machine.nodes, IsEmpty());
  EXPECT_EQ(machine.online_cpus, Range(0, 3));
  absl::StatusOr<Placement> placement = DiscoverPciPlacement("0000:01:00.0", options);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->numa_node, -1);
  EXPECT_EQ(placement->node_count, 0);
  EXPECT_EQ(placement->cpus, Range(0, 3));
  EXPECT_EQ(placement->gpus_sharing_node, 1);
  EXPECT_THAT(placement->note, HasSubstr("no NUMA information"));

  const Placement host = DiscoverHostPlacement(options);
  EXPECT_EQ(host.numa_node, -1);
  EXPECT_EQ(host.cpus, Range(0, 3));
}

TEST(SysfsTopology, UnknownDeviceIsNotFound) {
  TopologyOptions options;
  options.sys_root = Tree("two_nodes");
  EXPECT_EQ(DiscoverPciPlacement("0000:99:00.0", options).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ResolvePlacement, ExplicitNodeNotOnTheMachineFallsBack) {
  MachineNodes machine;
  machine.nodes = {NumaNode{0, {0, 1}, {}, {}}, NumaNode{1, {2, 3}, {}, {}}};
  machine.online_cpus = {0, 1, 2, 3};
  PciLocality locality{"0000:01:00.0", 7, {2, 3}};  // node 7 does not exist; CPUs say node 1
  const Placement placement = ResolvePlacement(machine, locality, {locality});
  EXPECT_EQ(placement.numa_node, 1);
  EXPECT_EQ(placement.gpus_sharing_node, 1);
}

TEST(DiscoverGpuPlacement, WithoutAGpuIsUnavailable) {
  if (testing::GpuAvailable()) GTEST_SKIP() << "a GPU is present: pinned_arena_gpu_test covers it";
  const absl::Status status = DiscoverGpuPlacement(0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("device 0"));
}

// This machine, whatever it is: the host placement is self-consistent.
TEST(RealMachine, HostPlacementIsConsistent) {
  const Placement host = DiscoverHostPlacement();
  const MachineNodes machine = ReadSysfsNodes("/sys");
  EXPECT_FALSE(host.cpus.empty());
  EXPECT_EQ(host.node_count, static_cast<int>(machine.nodes.size()));
  if (machine.nodes.empty()) {
    EXPECT_EQ(host.numa_node, -1);
  } else {
    ASSERT_NE(machine.Find(host.numa_node), nullptr) << host.ToString();
    const int cpu = sched_getcpu();
    if (machine.NodeOfCpu(cpu) >= 0) {
      EXPECT_EQ(host.numa_node, machine.NodeOfCpu(cpu));
    }
  }
}

TEST(RealMachine, EveryPciDeviceResolvesThroughHwlocOrSysfs) {
  std::error_code error;
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/bus/pci/devices", error)) {
    const std::string bus_id = entry.path().filename().string();
    absl::StatusOr<Placement> placement = DiscoverPciPlacement(bus_id);
    ASSERT_TRUE(placement.ok()) << bus_id << ": " << placement.status();
    EXPECT_FALSE(placement->cpus.empty()) << placement->ToString();
    EXPECT_GE(placement->gpus_sharing_node, 1);
    const MachineNodes machine = ReadSysfsNodes("/sys");
    if (machine.nodes.size() == 1) {
      EXPECT_EQ(placement->numa_node, machine.nodes[0].id);
    }
    TopologyOptions sysfs_only;
    sysfs_only.use_hwloc = false;
    absl::StatusOr<Placement> from_sysfs = DiscoverPciPlacement(bus_id, sysfs_only);
    ASSERT_TRUE(from_sysfs.ok()) << from_sysfs.status();
    EXPECT_EQ(from_sysfs->numa_node, placement->numa_node) << placement->ToString();
    if (++checked == 8) break;
  }
  if (checked == 0) GTEST_SKIP() << "no PCI devices visible";
}

}  // namespace
}  // namespace stowage::offload
