// The copy engine: moves offloaded activations between device memory and the pinned host arena
// on a backend's dedicated D2H and H2D streams, with an event for every dependency.
//
// Note [Copy engine]. Every save is one D2H, ordered after the producer's stream (an event recorded
// there at the call) and split into chunks of `chunk_bytes` (16 MiB reaches 55 GB/s on the
// reference H200; 256 KiB only 35-42). The caller learns when the device block may be reused from
// the returned fence (poll, host wait, or a device-side stream wait). A reload is one H2D into a
// device buffer the caller provides, ordered after the consumer stream's work so far (the buffer
// may have just been allocated there) and after the D2H that filled its host source, so it can
// never race its own D2H. Restores make the consumer stream wait on the H2D's event.
//
// The engine counts every copy exactly once when it is seen to have landed (a CopyObserver gets
// bytes and busy time). The CUDA backend has no completion callbacks on the fast path (a host
// function on a copy stream stalls it by tens of microseconds per copy), so landed copies are
// "reaped" by polling: Reap() runs at each engine call and Drain() at step end.
//
// Thread-safety: all methods may be called from several threads at once. Lock order: the
// engine's mu_ is a leaf; no backend call is made while holding it.
#ifndef STOWAGE_OFFLOAD_COPY_ENGINE_H_
#define STOWAGE_OFFLOAD_COPY_ENGINE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "offload/device_backend.h"

namespace stowage::offload {

// Told about every copy; called without engine locks held, possibly from several threads.
class CopyObserver {
 public:
  virtual ~CopyObserver() = default;
  virtual void OnCopyIssued(CopyDirection direction, uint64_t bytes) = 0;
  // Exactly once per issued copy, after it landed.
  virtual void OnCopyLanded(CopyDirection direction, uint64_t bytes, double busy_seconds) = 0;
};

// The range of a runtime's copy chunk (the plan's runtime.copy_chunk_bytes, or the option that
// overrides it). Every chunk is one backend operation (a cudaMemcpyAsync, a worker's memcpy), so
// a tiny chunk costs a call per few bytes (1-byte chunks took about 1 GB of queue for 30 MiB of
// copies) while buying nothing: below a page the link is far from its ceiling. Above 1 GiB a
// chunk no longer lets the other direction interleave and is no faster than 16 MiB.
inline constexpr uint64_t kMinCopyChunkBytes = uint64_t{4} << 10;
inline constexpr uint64_t kMaxCopyChunkBytes = uint64_t{1} << 30;
// INVALID_ARGUMENT naming `what` (e.g. "plan: runtime.copy_chunk_bytes") when `bytes` is outside
// [kMinCopyChunkBytes, kMaxCopyChunkBytes].
absl::Status CheckCopyChunkBytes(uint64_t bytes, std::string_view what);

struct CopyEngineOptions {
  size_t chunk_bytes = size_t{16} << 20;  // see Note [Copy engine]; 0: unchunked
};

class CopyEngine {
 public:
  // `observer` may be null; it must outlive the engine.
  CopyEngine(std::unique_ptr<DeviceBackend> backend, const CopyEngineOptions& options,
             CopyObserver* observer);
  // Drains every copy in flight (a copy reading freed memory would be worse than a slow exit).
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // D2H of `bytes` at device `src` into host `host_dst`, after the work enqueued on
  // `producer_stream` so far and after `after` (may be null: an H2D that last read host_dst).
  // `on_landed` (may be empty) runs on a backend thread once the bytes are in host memory, before
  // the fence reports Done (see CopyRequest::on_landed). Errors: those of DeviceBackend::Copy.
  absl::StatusOr<std::shared_ptr<CopyFence>> DeviceToHost(void* host_dst, const void* src,
                                                          size_t bytes, void* producer_stream,
                                                          std::function<void()> on_landed = {},
                                                          std::shared_ptr<CopyFence> after = {});
  // H2D of `bytes` at `host_src` into device `dst`, after the work enqueued on `consumer_stream`
  // so far and after `after` (the D2H that filled host_src; may be null).
  absl::StatusOr<std::shared_ptr<CopyFence>> HostToDevice(void* dst, const void* host_src,
                                                          size_t bytes, void* consumer_stream,
                                                          std::shared_ptr<CopyFence> after,
                                                          std::function<void()> on_landed = {});

  // Accounts every landed copy with the observer; cheap when nothing is in flight.
  void Reap();
  // Blocks until every copy issued so far landed, then reaps. INTERNAL if the backend failed.
  absl::Status Drain();

  uint64_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
  size_t chunk_bytes() const { return chunk_bytes_; }
  DeviceBackend& backend() { return *backend_; }

 private:
  absl::StatusOr<std::shared_ptr<CopyFence>> Issue(CopyRequest request);

  std::unique_ptr<DeviceBackend> backend_;
  size_t chunk_bytes_;
  CopyObserver* observer_;
  std::atomic<uint64_t> in_flight_{0};
  absl::Mutex mu_;
  std::vector<std::shared_ptr<CopyFence>> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stowage::offload

#endif  // STOWAGE_OFFLOAD_COPY_ENGINE_H_
