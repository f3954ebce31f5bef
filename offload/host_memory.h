// Host-memory admission: before the arena maps a byte, check that the machine, the process's
// cgroup, its locked-memory limit and the target NUMA node can all hold what the plan asks for,
// and fail with one message that names every number when they cannot.
//
// Note [What admission checks, and why].
//  - cgroup memory limit (v2 memory.max / v1 memory.limit_in_bytes, the tightest on the path from
//    the process's cgroup to the root) minus the cgroup's working set (usage less inactive file
//    pages, which the kernel reclaims before it OOM-kills). Exceeding it kills the trainer
//    mid-touch with no message; that is the failure this check exists for.
//  - MemAvailable (/proc/meminfo): the kernel's estimate of what can be allocated without
//    swapping.
//  - the node's free memory (MemFree + Inactive(file) + KReclaimable from the node's meminfo),
//    because MPOL_BIND makes the node, not the machine, the limit. Enforced only when the machine
//    has more than one node: with one node the node is the machine and MemAvailable governs (in
//    VMs with hot-plugged memory the single node's meminfo can report less than the machine has).
//  - RLIMIT_MEMLOCK. cudaHostRegister pins through the NVIDIA driver, which does not charge the
//    pages to the process's locked_vm, so the limit does not bind it (root or not). It does bind
//    mlock() and RDMA registration of the same buffers (ibv_reg_mr, e.g. by NCCL's network
//    transport) for a process without CAP_IPC_LOCK. So it is always read and reported, and
//    enforced only when the request says the pages will be locked that way (MemlockUse::kLocked).
//
// Note [Admission margin]. A request never gets a budget to its last byte: the trainer goes on
// allocating after the arena is set up (the CUDA context and its staging buffers, the framework's
// CPU tensors, data loader workers in the same cgroup), and with the arena at 100% of the cgroup's
// headroom the first of those is the OOM kill admission exists to prevent. So each of the three
// memory budgets (cgroup headroom, MemAvailable, the node's available memory) keeps back
// AdmissionMarginBytes(its total): 5% of the cgroup limit / MemTotal / the node's total, at least
// 1 GiB. The error names the margin. RLIMIT_MEMLOCK is a hard count of pages, not a pool others
// draw from, and keeps none.
#ifndef STOWAGE_OFFLOAD_HOST_MEMORY_H_
#define STOWAGE_OFFLOAD_HOST_MEMORY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stowage::offload {

// Where the readers look. Tests point these at fabricated trees (tests/offload/data/).
struct HostRoots {
  std::string proc = "/proc";
  std::string sys = "/sys";
  std::string cgroup = "/sys/fs/cgroup";
};

struct CgroupMemory {
  int version = 0;   // 0: no memory controller found; 1 or 2
  std::string path;  // the process's cgroup, as /proc/self/cgroup names it
  // The tightest limit on the path to the root, and the cgroup that sets it. nullopt: unlimited.
  std::optional<uint64_t> limit_bytes;
  std::string limiting_path;
  uint64_t usage_bytes = 0;        // of the limiting cgroup (or the leaf when unlimited)
  uint64_t reclaimable_bytes = 0;  // its inactive file pages
  // limit - (usage - reclaimable); nullopt when unlimited.
  std::optional<uint64_t> headroom_bytes() const;
};

struct HostMemorySnapshot {
  uint64_t mem_total_bytes = 0;
  uint64_t mem_available_bytes = 0;
  CgroupMemory cgroup;
  std::optional<uint64_t> memlock_limit_bytes;  // RLIMIT_MEMLOCK (soft); nullopt: unlimited
  uint64_t memlock_used_bytes = 0;              // VmLck of this process
  bool cap_ipc_lock = false;                    // CAP_IPC_LOCK in the effective set (e.g. root)
  int node = -1;                                // the node asked about; -1: none
  int online_nodes = 0;                         // 0: no NUMA information
  std::optional<uint64_t> node_total_bytes;
  std::optional<uint64_t> node_available_bytes;  // MemFree + Inactive(file) + KReclaimable
};

enum class MemlockUse {
  kReport,  // pinned by cudaHostRegister, or not pinned: RLIMIT_MEMLOCK is reported, not enforced
  kLocked,  // mlock()ed or RDMA-registered: RLIMIT_MEMLOCK binds unless CAP_IPC_LOCK
};

struct AdmissionRequest {
  uint64_t bytes = 0;
  int numa_node = -1;  // -1: no binding, node free memory not checked
  MemlockUse memlock = MemlockUse::kReport;
  std::string what = "pinned host arena";  // names the request in messages
};

inline constexpr double kAdmissionMarginFraction = 0.05;
inline constexpr uint64_t kAdmissionMarginMinBytes = uint64_t{1} << 30;
// max(kAdmissionMarginMinBytes, kAdmissionMarginFraction x total_bytes) (Note [Admission margin]).
uint64_t AdmissionMarginBytes(uint64_t total_bytes);

// Reads /proc/meminfo, /proc/self/status, /proc/self/cgroup, the cgroup files, the node's
// meminfo and getrlimit. Missing optional sources leave their fields empty; NOT_FOUND only when
// <proc>/meminfo cannot be read.
absl::StatusOr<HostMemorySnapshot> ReadHostMemory(int numa_node, const HostRoots& roots = {});

// Another rank's reservation on this node, as the node ledger (offload/node_ledger.h) holds it.
// Note [Admission with other ranks]: a reservation whose arena is already resident is part of what
// MemAvailable, the cgroup usage and the node's free memory already show, so against those
// readings only the reservations still pending (admitted, not yet touched) are added to the
// request; against a fixed node budget (STOWAGE_NODE_MEMORY_BYTES) every reservation counts.
struct RankShare {
  int rank = -1;        // -1: unknown
  int local_rank = -1;  // -1: unknown
  int64_t pid = 0;
  int numa_node = -1;
  uint64_t bytes = 0;
  bool resident = false;  // the arena is touched: the readings include it
};

struct NodeShares {
  std::vector<RankShare> others;  // live reservations of the other ranks on this node
  // A fixed budget for every rank's arenas on this node together (STOWAGE_NODE_MEMORY_BYTES);
  // nullopt: none. The margin of Note [Admission margin] is kept from it too.
  std::optional<uint64_t> node_budget_bytes;
  std::string ledger;  // where the reservations were read, for messages
  int rank = -1;       // this request's rank and local rank, for messages
  int local_rank = -1;
};

// Pure: OK, or RESOURCE_EXHAUSTED naming the requested bytes, every limit read, the margin kept
// (Note [Admission margin]) and the node. With `shares`, the other ranks' reservations are added
// as Note [Admission with other ranks] says, and a refusal names every rank's share.
absl::Status CheckAdmission(const HostMemorySnapshot& snapshot, const AdmissionRequest& request,
                            const NodeShares& shares = {});

// ReadHostMemory + CheckAdmission.
absl::Status AdmitHostMemory(const AdmissionRequest& request, const HostRoots& roots = {});

// One line naming every number in the snapshot, e.g. for logs and `stowage calibrate`.
std::string DescribeHostMemory(const HostMemorySnapshot& snapshot);

// Resident bytes of this process in [begin, begin + bytes), summed over the mappings in
// <proc>/self/smaps that overlap it (whole mappings: pass a mapping's exact bounds).
absl::StatusOr<uint64_t> ResidentBytesOfMapping(const void* begin, uint64_t bytes,
                                                const HostRoots& roots = {});

struct MappingResidency {
  uint64_t resident_bytes = 0;
  uint64_t huge_page_bytes = 0;  // AnonHugePages: resident in transparent huge pages
};
// As ResidentBytesOfMapping, with the share in transparent huge pages.
absl::StatusOr<MappingResidency> ReadMappingResidency(const void* begin, uint64_t bytes,
                                                      const HostRoots& roots = {});

// The NUMA node of every `stride`-th page of [begin, begin + bytes) (move_pages query, nothing
// moves): node -> bytes (each sampled page stands for `stride` bytes). Pages not yet faulted
// in are counted under node -1. UNAVAILABLE when the kernel has no NUMA support.
absl::StatusOr<std::map<int, uint64_t>> BytesByNode(const void* begin, uint64_t bytes,
                                                    uint64_t stride = uint64_t{2} << 20);

}  // namespace stowage::offload

#endif  // STOWAGE_OFFLOAD_HOST_MEMORY_H_
