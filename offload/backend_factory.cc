#include "offload/backend_factory.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "offload/host_backend.h"
#include "offload/node_ledger.h"
#ifdef STOWAGE_HAVE_CUDA
#include "offload/cuda/cuda_backend.h"
#endif

namespace stowage::offload {

absl::StatusOr<Backend> PlaceBackend(const BackendOptions& options) {
  if (options.copy_threads < 0 || options.copy_threads > kMaxCopyThreads) {
    return absl::InvalidArgumentError(absl::StrCat("copy_threads is ", options.copy_threads,
                                                   "; it must be in [0, ", kMaxCopyThreads,
                                                   "] (0: chosen from the node's CPUs)"));
  }
  if (options.numa_node < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "numa_node is ", options.numa_node, "; it must be -1 (the GPU's node) or a node number"));
  }
  Backend out;
  out.kind = options.kind;
#ifdef STOWAGE_HAVE_CUDA
  if (out.kind == BackendKind::kAuto) {
    out.kind = CudaDeviceCount() > 0 ? BackendKind::kCuda : BackendKind::kHost;
  }
#else
  if (out.kind == BackendKind::kAuto) out.kind = BackendKind::kHost;
  if (out.kind == BackendKind::kCuda) {
    return absl::UnavailableError(
        "the CUDA backend was asked for but this build of stowage has no CUDA support");
  }
#endif

  if (out.kind == BackendKind::kCuda) {
    // A GPU without topology information still works, only unplaced.
    absl::StatusOr<Placement> found = DiscoverGpuPlacement(options.device);
    if (found.ok()) out.placement = *std::move(found);
  } else {
    out.placement = DiscoverHostPlacement();
  }
  if (options.numa_node >= 0) out.placement.numa_node = options.numa_node;
  return out;
}

std::vector<int> CopyCpus(const BackendOptions& options, const Placement& placement) {
  if (options.cpu_slot < 0) return placement.cpus;
  return CpuShare(placement.cpus, options.cpu_slot, std::max(1, options.ranks_sharing_node));
}

absl::Status StartBackend(const BackendOptions& options, Backend* backend) {
  if (backend->kind == BackendKind::kHost) {
    HostBackendOptions host;
    const int ranks = std::max(1, options.ranks_sharing_node);
    host.threads_per_stream =
        options.copy_threads > 0
            ? options.copy_threads
            : std::clamp(static_cast<int>(backend->placement.cpus.size()) / ranks / 4, 1, 4);
    // Ranks sharing the node copy on their own slices of its CPUs, not all on all of them.
    host.cpus = CopyCpus(options, backend->placement);
    absl::StatusOr<std::unique_ptr<HostBackend>> created = HostBackend::Create(host);
    if (!created.ok()) return created.status();
    backend->device = *std::move(created);
  } else {
#ifdef STOWAGE_HAVE_CUDA
    absl::StatusOr<std::unique_ptr<CudaBackend>> created = CudaBackend::Create(options.device);
    if (!created.ok()) return created.status();
    backend->device = *std::move(created);
#endif
  }
  return absl::OkStatus();
}

absl::StatusOr<Backend> CreateBackend(const BackendOptions& options) {
  absl::StatusOr<Backend> out = PlaceBackend(options);
  if (!out.ok()) return out.status();
  if (absl::Status s = StartBackend(options, &*out); !s.ok()) return s;
  return out;
}

}  // namespace stowage::offload
