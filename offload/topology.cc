#include "offload/topology.h"

#include <hwloc.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#ifdef STOWAGE_HAVE_CUDA
#include "offload/cuda/cuda_host.h"
#endif

namespace stowage::offload {
namespace {

namespace fs = std::filesystem;

std::string Trim(const std::string& text) {
  size_t begin = 0;
  size_t end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

std::vector<int> AllCpus() {
  std::vector<int> cpus;
  const unsigned n = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 0; i < n; ++i) cpus.push_back(static_cast<int>(i));
  return cpus;
}

// Parses "node12" -> 12.
std::optional<int> NodeDirId(const std::string& name) {
  if (name.size() <= 4 || name.compare(0, 4, "node") != 0) return std::nullopt;
  int id = 0;
  if (!absl::SimpleAtoi(name.substr(4), &id) || id < 0) return std::nullopt;
  return id;
}

bool Contains(const std::vector<int>& sorted, int value) {
  return std::binary_search(sorted.begin(), sorted.end(), value);
}

// The node for a device (Note [Topology sources]); `note` says how, when it was inferred.
int ResolveNode(const MachineNodes& machine, const PciLocality& locality, std::string* note) {
  if (machine.nodes.empty()) {
    *note = "no NUMA information on this machine: memory is not bound";
    return -1;
  }
  if (locality.numa_node >= 0 && machine.Find(locality.numa_node) != nullptr) {
    return locality.numa_node;
  }
  if (machine.nodes.size() == 1) {
    *note = absl::StrCat("PCI numa_node reads ", locality.numa_node, "; node ",
                         machine.nodes.front().id, " is the only node");
    return machine.nodes.front().id;
  }
  if (!locality.local_cpus.empty()) {
    std::vector<int> candidates;
    for (const NumaNode& node : machine.nodes) {
      const bool all_local = std::all_of(locality.local_cpus.begin(), locality.local_cpus.end(),
                                         [&](int cpu) { return Contains(node.cpus, cpu); });
      if (all_local) candidates.push_back(node.id);
    }
    if (candidates.size() == 1) {
      *note = absl::StrCat("PCI numa_node reads ", locality.numa_node, "; node ", candidates[0],
                           " holds every CPU of local_cpulist");
      return candidates[0];
    }
  }
  *note =
      absl::StrCat("PCI numa_node reads ", locality.numa_node,
                   " and local_cpulist does not "
                   "name one of the ",
                   machine.nodes.size(), " nodes: memory is not bound (set the node explicitly)");
  return -1;
}

// hwloc topology with PCI devices, owned.
struct HwlocDeleter {
  void operator()(hwloc_topology* topology) const { hwloc_topology_destroy(topology); }
};
using HwlocTopology = std::unique_ptr<hwloc_topology, HwlocDeleter>;

HwlocTopology LoadHwloc() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return nullptr;
  HwlocTopology topology(raw);
  if (hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0 ||
      hwloc_topology_load(raw) != 0) {
    return nullptr;
  }
  return topology;
}

std::vector<int> BitmapToVector(hwloc_const_bitmap_t bitmap) {
  std::vector<int> out;
  if (bitmap == nullptr || hwloc_bitmap_weight(bitmap) < 0) return out;  // infinite: unknown
  for (int i = hwloc_bitmap_first(bitmap); i != -1; i = hwloc_bitmap_next(bitmap, i)) {
    out.push_back(i);
  }
  return out;
}

// The device's locality as hwloc sees it: nodes and CPUs of its first non-I/O ancestor.
std::optional<PciLocality> HwlocLocality(const std::string& bus_id) {
  HwlocTopology topology = LoadHwloc();
  if (topology == nullptr) return std::nullopt;
  hwloc_obj_t device = hwloc_get_pcidev_by_busidstring(topology.get(), bus_id.c_str());
  if (device == nullptr) return std::nullopt;
  hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topology.get(), device);
  if (ancestor == nullptr) return std::nullopt;
  PciLocality locality;
  locality.bus_id = bus_id;
  const std::vector<int> nodes = BitmapToVector(ancestor->nodeset);
  if (nodes.size() == 1) locality.numa_node = nodes.front();
  locality.local_cpus = BitmapToVector(ancestor->cpuset);
  return locality;
}

std::vector<PciLocality> AllGpuLocalities(const std::string& sys_root) {
  std::vector<PciLocality> out;
  for (const std::string& gpu : ListSysfsGpus(sys_root)) {
    absl::StatusOr<PciLocality> locality = ReadSysfsPciLocality(sys_root, gpu);
    if (locality.ok()) out.push_back(*std::move(locality));
  }
  return out;
}

}  // namespace

const NumaNode* MachineNodes::Find(int id) const {
  for (const NumaNode& node : nodes) {
    if (node.id == id) return &node;
  }
  return nullptr;
}

int MachineNodes::NodeOfCpu(int cpu) const {
  for (const NumaNode& node : nodes) {
    if (Contains(node.cpus, cpu)) return node.id;
  }
  return -1;
}

std::string Placement::ToString() const {
  std::string out = absl::StrCat("numa node ", numa_node, " of ", node_count, ", cpus [",
                                 absl::StrJoin(cpus, ","), "], ", gpus_sharing_node,
                                 " GPU(s) on the node, from ", source);
  if (!pci_bus_id.empty()) absl::StrAppend(&out, ", pci ", pci_bus_id);
  if (!note.empty()) absl::StrAppend(&out, " (", note, ")");
  return out;
}

absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text) {
  std::set<int> cpus;
  const std::string trimmed = Trim(text);
  if (trimmed.empty()) return std::vector<int>{};
  for (absl::string_view part : absl::StrSplit(trimmed, ',')) {
    const std::string item = Trim(std::string(part));
    std::vector<std::string> bounds = absl::StrSplit(item, '-');
    int first = 0;
    int last = 0;
    if (bounds.size() == 1 && absl::SimpleAtoi(bounds[0], &first) && first >= 0) {
      last = first;
    } else if (bounds.size() != 2 || !absl::SimpleAtoi(bounds[0], &first) ||
               !absl::SimpleAtoi(bounds[1], &last) || first < 0 || last < first ||
               last - first > (1 << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed CPU list '", trimmed, "' at '", item, "'"));
    }
    for (int cpu = first; cpu <= last; ++cpu) cpus.insert(cpu);
  }
  return std::vector<int>(cpus.begin(), cpus.end());
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::optional<uint64_t> MeminfoField(const std::string& meminfo_text, const std::string& field) {
  const std::string key = field + ":";
  for (absl::string_view line : absl::StrSplit(meminfo_text, '\n')) {
    const size_t at = line.find(key);
    if (at == absl::string_view::npos) continue;
    if (at > 0 && line[at - 1] != ' ') continue;  // "Active(file):" must not match "file):"
    std::vector<std::string> words =
        absl::StrSplit(line.substr(at + key.size()), absl::ByAnyChar(" \t"), absl::SkipEmpty());
    uint64_t value = 0;
    if (words.empty() || !absl::SimpleAtoi(words[0], &value)) return std::nullopt;
    if (words.size() > 1 && (words[1] == "kB" || words[1] == "KB")) value *= 1024;
    return value;
  }
  return std::nullopt;
}

std::string NormalizePciBusId(const std::string& bus_id) {
  std::string out = Trim(bus_id);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const size_t colon = out.find(':');
  // A 8-digit domain ("00000000:3b:00.0", as nvidia-smi prints it) -> the 4 digits sysfs uses.
  if (colon == 8 && out.compare(0, 4, "0000") == 0) out.erase(0, 4);
  // No domain ("3b:00.0") -> domain 0.
  if (std::count(out.begin(), out.end(), ':') == 1) out = "0000:" + out;
  return out;
}

MachineNodes ReadSysfsNodes(const std::string& sys_root) {
  MachineNodes machine;
  const fs::path node_dir = fs::path(sys_root) / "devices/system/node";
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(node_dir, error)) {
    const std::optional<int> id = NodeDirId(entry.path().filename().string());
    if (!id.has_value()) continue;
    NumaNode node;
    node.id = *id;
    if (absl::StatusOr<std::string> list = ReadSmallFile((entry.path() / "cpulist").string());
        list.ok()) {
      if (absl::StatusOr<std::vector<int>> cpus = ParseCpuList(*list); cpus.ok()) {
        node.cpus = *std::move(cpus);
      }
    }
    if (absl::StatusOr<std::string> meminfo = ReadSmallFile((entry.path() / "meminfo").string());
        meminfo.ok()) {
      node.mem_total_bytes = MeminfoField(*meminfo, "MemTotal");
      node.mem_free_bytes = MeminfoField(*meminfo, "MemFree");
    }
    machine.nodes.push_back(std::move(node));
  }
  std::sort(machine.nodes.begin(), machine.nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  if (absl::StatusOr<std::string> online =
          ReadSmallFile((fs::path(sys_root) / "devices/system/cpu/online").string());
      online.ok()) {
    if (absl::StatusOr<std::vector<int>> cpus = ParseCpuList(*online); cpus.ok()) {
      machine.online_cpus = *std::move(cpus);
    }
  }
  if (machine.online_cpus.empty()) {
    std::set<int> from_nodes;
    for (const NumaNode& node : machine.nodes)
      from_nodes.insert(node.cpus.begin(), node.cpus.end());
    machine.online_cpus.assign(from_nodes.begin(), from_nodes.end());
  }
  if (machine.online_cpus.empty()) machine.online_cpus = AllCpus();
  return machine;
}

absl::StatusOr<PciLocality> ReadSysfsPciLocality(const std::string& sys_root,
                                                 const std::string& bus_id) {
  PciLocality locality;
  locality.bus_id = NormalizePciBusId(bus_id);
  const fs::path device = fs::path(sys_root) / "bus/pci/devices" / locality.bus_id;
  std::error_code error;
  if (!fs::exists(device, error)) {
    return absl::NotFoundError(absl::StrCat("PCI device ", locality.bus_id, " not found under ",
                                            (fs::path(sys_root) / "bus/pci/devices").string()));
  }
  if (absl::StatusOr<std::string> node = ReadSmallFile((device / "numa_node").string());
      node.ok()) {
    int value = -1;
    if (absl::SimpleAtoi(Trim(*node), &value)) locality.numa_node = value;
  }
  if (absl::StatusOr<std::string> list = ReadSmallFile((device / "local_cpulist").string());
      list.ok()) {
    if (absl::StatusOr<std::vector<int>> cpus = ParseCpuList(*list); cpus.ok()) {
      locality.local_cpus = *std::move(cpus);
    }
  }
  return locality;
}

std::vector<std::string> ListSysfsGpus(const std::string& sys_root) {
  std::vector<std::string> gpus;
  std::error_code error;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(fs::path(sys_root) / "bus/pci/devices", error)) {
    absl::StatusOr<std::string> vendor = ReadSmallFile((entry.path() / "vendor").string());
    absl::StatusOr<std::string> device_class = ReadSmallFile((entry.path() / "class").string());
    if (!vendor.ok() || !device_class.ok() || Trim(*vendor) != "0x10de") continue;
    const std::string klass = Trim(*device_class);
    // 0x0300xx VGA controller, 0x0302xx 3D controller (data-centre GPUs).
    if (klass.rfind("0x0300", 0) == 0 || klass.rfind("0x0302", 0) == 0) {
      gpus.push_back(NormalizePciBusId(entry.path().filename().string()));
    }
  }
  std::sort(gpus.begin(), gpus.end());
  return gpus;
}

Placement ResolvePlacement(const MachineNodes& machine, const PciLocality& locality,
                           const std::vector<PciLocality>& all_gpus) {
  Placement placement;
  placement.node_count = static_cast<int>(machine.nodes.size());
  placement.pci_bus_id = locality.bus_id;
  placement.source = "sysfs";
  placement.numa_node = ResolveNode(machine, locality, &placement.note);
  const NumaNode* node = machine.Find(placement.numa_node);
  if (node != nullptr && !node->cpus.empty()) {
    placement.cpus = node->cpus;
  } else if (!locality.local_cpus.empty()) {
    placement.cpus = locality.local_cpus;
  } else {
    placement.cpus = machine.online_cpus;
  }
  bool self_listed = false;
  for (const PciLocality& gpu : all_gpus) {
    std::string unused;
    if (gpu.bus_id == locality.bus_id) self_listed = true;
    // With no binding every GPU shares the one pool of RAM.
    if (placement.numa_node < 0 || ResolveNode(machine, gpu, &unused) == placement.numa_node) {
      ++placement.gpus_sharing_node;
    }
  }
  if (!self_listed) ++placement.gpus_sharing_node;
  return placement;
}

absl::StatusOr<Placement> DiscoverPciPlacement(const std::string& bus_id,
                                               const TopologyOptions& options) {
  const std::string normalized = NormalizePciBusId(bus_id);
  const MachineNodes machine = ReadSysfsNodes(options.sys_root);
  const std::vector<PciLocality> gpus = AllGpuLocalities(options.sys_root);
  if (options.use_hwloc && options.sys_root == "/sys") {
    if (std::optional<PciLocality> locality = HwlocLocality(normalized); locality.has_value()) {
      // hwloc names no single node when the device hangs off a package with several (sub-NUMA
      // clustering) or off the machine; sysfs may still know the PCI node.
      if (locality->numa_node < 0) {
        absl::StatusOr<PciLocality> sysfs = ReadSysfsPciLocality(options.sys_root, normalized);
        if (sysfs.ok()) locality->numa_node = sysfs->numa_node;
      }
      Placement placement = ResolvePlacement(machine, *locality, gpus);
      placement.source = "hwloc";
      if (!locality->local_cpus.empty() && placement.numa_node >= 0) {
        // The device's own CPUs (its package or node), when hwloc knows them.
        placement.cpus = locality->local_cpus;
      }
      return placement;
    }
  }
  absl::StatusOr<PciLocality> locality = ReadSysfsPciLocality(options.sys_root, normalized);
  if (!locality.ok()) return locality.status();
  return ResolvePlacement(machine, *locality, gpus);
}

absl::StatusOr<Placement> DiscoverGpuPlacement(int cuda_device, const TopologyOptions& options) {
#ifdef STOWAGE_HAVE_CUDA
  absl::StatusOr<std::string> bus_id = CudaDevicePciBusId(cuda_device);
  if (!bus_id.ok()) return bus_id.status();
  return DiscoverPciPlacement(*bus_id, options);
#else
  (void)options;
  return absl::UnavailableError(absl::StrCat("GPU placement of CUDA device ", cuda_device,
                                             ": stowage was built without the CUDA backend"));
#endif
}

Placement DiscoverHostPlacement(const TopologyOptions& options) {
  const MachineNodes machine = ReadSysfsNodes(options.sys_root);
  Placement placement;
  placement.source = "calling thread";
  placement.node_count = static_cast<int>(machine.nodes.size());
  const int cpu = sched_getcpu();
  placement.numa_node = cpu >= 0 ? machine.NodeOfCpu(cpu) : -1;
  if (placement.numa_node < 0 && machine.nodes.size() == 1) {
    placement.numa_node = machine.nodes.front().id;
  }
  if (machine.nodes.empty()) placement.note = "no NUMA information on this machine";
  const NumaNode* node = machine.Find(placement.numa_node);
  placement.cpus = node != nullptr && !node->cpus.empty() ? node->cpus : machine.online_cpus;
  for (const PciLocality& gpu : AllGpuLocalities(options.sys_root)) {
    std::string unused;
    if (placement.numa_node < 0 || ResolveNode(machine, gpu, &unused) == placement.numa_node) {
      ++placement.gpus_sharing_node;
    }
  }
  return placement;
}

}  // namespace stowage::offload
