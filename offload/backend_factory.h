// Which DeviceBackend a runtime gets, and where it runs: the one place that turns "auto / host /
// cuda, device N, node M, T copy threads" into a backend and its Placement (the GPU's NUMA node
// and local CPUs from topology; host backend: the calling thread's).
#ifndef STOWAGE_OFFLOAD_BACKEND_FACTORY_H_
#define STOWAGE_OFFLOAD_BACKEND_FACTORY_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "offload/device_backend.h"
#include "offload/host_backend.h"
#include "offload/topology.h"

namespace stowage::offload {

enum class BackendKind { kAuto, kHost, kCuda };

// copy_threads is the host backend's workers per copy stream and the arena's page-touch threads;
// bounded (HostBackend::kMaxThreadsPerStream) so that a typo is an error before any thread starts.
inline constexpr int kMaxCopyThreads = HostBackend::kMaxThreadsPerStream;

struct BackendOptions {
  BackendKind kind = BackendKind::kAuto;  // kAuto: CUDA when built with it and a GPU is visible
  int device = 0;
  int numa_node = -1;    // -1: from topology
  int copy_threads = 0;  // [0, kMaxCopyThreads]; 0: a quarter of this rank's share, 1 to 4
  // Ranks whose runtimes share the node's CPUs (the plan's gpus_per_numa_node, or more if the
  // node ledger counts more): with copy_threads 0 each takes a quarter of its
  // 1/ranks_sharing_node share, not of all CPUs.
  int ranks_sharing_node = 1;
  // This rank's slice of the node's CPUs (CpuShare(cpus, cpu_slot, ranks_sharing_node): its
  // node-ledger slot), where the host backend's copy workers run; -1: all of them (no slot
  // known).
  int cpu_slot = -1;
};

struct Backend {
  BackendKind kind = BackendKind::kHost;  // never kAuto
  Placement placement;
  std::unique_ptr<DeviceBackend> device;
};

// INVALID_ARGUMENT (copy_threads or numa_node out of range, no such device), UNAVAILABLE (CUDA
// asked for but not built, or no GPU), INTERNAL (the OS refused the worker threads or CUDA
// failed). Errors name the option and its allowed range.
absl::StatusOr<Backend> CreateBackend(const BackendOptions& options);

// CreateBackend in two parts, for a runtime that admits its arena through the node ledger
// between them (the ledger's slot decides the CPUs): PlaceBackend picks the kind and the
// placement and starts nothing (`device` null); StartBackend creates the device with `options`'
// threads and CPU slice.
absl::StatusOr<Backend> PlaceBackend(const BackendOptions& options);
absl::Status StartBackend(const BackendOptions& options, Backend* backend);

// The CPUs the host backend's copy workers of `options` run on, out of `placement`'s.
std::vector<int> CopyCpus(const BackendOptions& options, const Placement& placement);

}  // namespace stowage::offload

#endif  // STOWAGE_OFFLOAD_BACKEND_FACTORY_H_
