// Topology: which NUMA node a GPU's pinned host memory belongs on, which CPUs should touch it and
// drive its copies, and how many GPUs share that node's RAM.
//
// Note [Topology sources]. hwloc gives the PCI locality of the device (the nodes and CPUs of its
// first non-I/O ancestor). When hwloc cannot load or does not know the device, sysfs is read
// directly: /sys/bus/pci/devices/<bdf>/{numa_node,local_cpulist} and
// /sys/devices/system/node/node*/{cpulist,meminfo}. Three shapes are handled explicitly:
//  - no NUMA information (no node directory): node -1, no binding, all online CPUs;
//  - one node: the GPU's node is that node even when the PCI numa_node reads -1 (as on the
//    reference H200 VM, where every PCI device reports -1);
//  - many nodes: the PCI numa_node; if it reads -1, the node whose CPUs are the device's
//    local_cpulist; if that is ambiguous, -1 (no binding) with a note saying why.
// GPUs sharing the node are counted from sysfs (every NVIDIA display/3D controller), not from
// CUDA: ranks usually see one GPU each through CUDA_VISIBLE_DEVICES, yet share the node's RAM.
#ifndef STOWAGE_OFFLOAD_TOPOLOGY_H_
#define STOWAGE_OFFLOAD_TOPOLOGY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stowage::offload {

struct NumaNode {
  int id = -1;
  std::vector<int> cpus;
  std::optional<uint64_t> mem_total_bytes;
  std::optional<uint64_t> mem_free_bytes;
};

struct MachineNodes {
  std::vector<NumaNode> nodes;   // empty: no NUMA information
  std::vector<int> online_cpus;  // from <sys>/devices/system/cpu/online, else 0..n-1
  const NumaNode* Find(int id) const;
  int NodeOfCpu(int cpu) const;  // -1 when unknown
};

struct PciLocality {
  std::string bus_id;           // normalized: "0000:3b:00.0"
  int numa_node = -1;           // as sysfs reports it; -1: unknown
  std::vector<int> local_cpus;  // empty: unknown
};

// Where a GPU's (or the host backend's) host memory and host threads belong.
struct Placement {
  int numa_node = -1;         // -1: do not bind
  std::vector<int> cpus;      // CPUs for touch and copy threads (the node's; else all online)
  int gpus_sharing_node = 0;  // GPUs on numa_node (they share its RAM), this one included
  int node_count = 0;         // nodes on the machine; 0: no NUMA information
  std::string pci_bus_id;     // empty for the host backend
  std::string source;         // "hwloc", "sysfs", "calling thread"
  std::string note;           // how the node was inferred, when it was not read directly
  std::string ToString() const;
};

struct TopologyOptions {
  std::string sys_root = "/sys";  // tests point this at a fabricated tree
  bool use_hwloc = true;          // ignored (sysfs only) when sys_root is not "/sys"
};

// ---- Readers and parsers (sysfs, rooted) --------------------------------------------------------

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; empty or "\n" -> {}. INVALID_ARGUMENT on malformed text.
absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text);
// Whole small file (sysfs, proc). NOT_FOUND when it cannot be opened.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path);
// "MemTotal:  123 kB" style files (also "Node 0 MemFree: 1 kB"): the named field in bytes.
std::optional<uint64_t> MeminfoField(const std::string& meminfo_text, const std::string& field);
// "0000:3B:00.0" / "00000000:3b:00.0" -> "0000:3b:00.0".
std::string NormalizePciBusId(const std::string& bus_id);

MachineNodes ReadSysfsNodes(const std::string& sys_root);
// NOT_FOUND when <sys>/bus/pci/devices/<bus_id> does not exist.
absl::StatusOr<PciLocality> ReadSysfsPciLocality(const std::string& sys_root,
                                                 const std::string& bus_id);
// Bus ids of NVIDIA GPUs (vendor 0x10de, class 0x0300xx or 0x0302xx) under <sys>/bus/pci/devices.
std::vector<std::string> ListSysfsGpus(const std::string& sys_root);

// ---- Resolution (pure) ------------------------------------------------------------------------

// The node and CPUs for a device with `locality` on `machine` (Note [Topology sources]).
// `other_gpus`: every GPU's locality (this one may be among them), to count the node's sharers.
Placement ResolvePlacement(const MachineNodes& machine, const PciLocality& locality,
                           const std::vector<PciLocality>& all_gpus);

// ---- Discovery (this machine) -----------------------------------------------------------------

// The placement of the PCI device `bus_id`: hwloc first, sysfs fallback. NOT_FOUND if neither
// knows the device.
absl::StatusOr<Placement> DiscoverPciPlacement(const std::string& bus_id,
                                               const TopologyOptions& options = {});
// The placement of CUDA device `cuda_device` (its PCI bus id from cudaDeviceGetPCIBusId).
// UNAVAILABLE without the CUDA backend or without the device.
absl::StatusOr<Placement> DiscoverGpuPlacement(int cuda_device,
                                               const TopologyOptions& options = {});
// The host backend: the node of the CPU the calling thread runs on and that node's CPUs; with no
// NUMA information, node -1 and every online CPU.
Placement DiscoverHostPlacement(const TopologyOptions& options = {});

}  // namespace stowage::offload

#endif  // STOWAGE_OFFLOAD_TOPOLOGY_H_
