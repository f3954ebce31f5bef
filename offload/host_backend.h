// The host backend: a DeviceBackend whose "device" memory is ordinary host memory and whose two
// copy streams (D2H, H2D) are queues served by worker threads. It keeps the CUDA backend's
// ordering contract (Note [Copy ordering] in offload/device_backend.h) so the copy engine and the
// runtime run unchanged in CPU-only CI, and so a CPU-only trainer (e.g. PyTorch CPU tensors) can
// drive the runtime for tests.
//
// Streams do not exist here: `after_stream` is ignored (the Copy call is the ordering point) and
// StreamWait blocks the calling thread, which stands in for the caller's stream.
#ifndef STOWAGE_OFFLOAD_HOST_BACKEND_H_
#define STOWAGE_OFFLOAD_HOST_BACKEND_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "offload/device_backend.h"

namespace stowage::offload {

struct HostBackendOptions {
  // Worker threads per copy stream, in [0, HostBackend::kMaxThreadsPerStream]; chunks of one copy
  // are spread over them. 0: 1.
  int threads_per_stream = 1;
  // CPUs the workers are pinned to (the GPU-local CPUs from topology); empty: not pinned.
  // Pinning failures are not errors (a container may forbid them): the workers then float.
  std::vector<int> cpus;
};

class HostBackend final : public DeviceBackend {
 public:
  // Copy workers per stream: memcpy on 64 threads already saturates a socket's memory bandwidth,
  // and a typo (5000) must be an error before any thread exists.
  static constexpr int kMaxThreadsPerStream = 64;

  // INVALID_ARGUMENT for a thread count outside [0, kMaxThreadsPerStream]; INTERNAL when the OS
  // refuses a worker thread (those already started are joined first). Returns once every worker
  // runs.
  static absl::StatusOr<std::unique_ptr<HostBackend>> Create(const HostBackendOptions& options);
  // Drains both streams, then joins the workers.
  ~HostBackend() override;

  const char* name() const override { return "host"; }
  int device() const override { return 0; }
  absl::StatusOr<std::shared_ptr<CopyFence>> Copy(CopyRequest request) override;
  absl::Status Synchronize() override;
  absl::StatusOr<void*> AllocateDevice(size_t bytes) override;
  void FreeDevice(void* ptr) override;
  absl::Status CopyToDevice(void* dst, const void* host_src, size_t bytes) override;
  absl::Status CopyFromDevice(void* host_dst, const void* src, size_t bytes) override;
  absl::Status FillDevice(void* dst, int value, size_t bytes) override;

  int threads_per_stream() const { return threads_per_stream_; }
  // CPUs the workers were actually pinned to (empty when pinning was not asked for or failed).
  const std::vector<int>& pinned_cpus() const { return pinned_cpus_; }

  // Test-only: while paused, the workers of `direction` take no new chunks, so a test can hold a
  // copy "in flight" deterministically (the host backend's stand-in for a busy device).
  void SetPausedForTesting(CopyDirection direction, bool paused);

  class Stream;  // one per direction; defined in host_backend.cc

 private:
  HostBackend() = default;

  int threads_per_stream_ = 1;
  std::vector<int> pinned_cpus_;
  std::unique_ptr<Stream> streams_[2];
};

}  // namespace stowage::offload

#endif  // STOWAGE_OFFLOAD_HOST_BACKEND_H_
