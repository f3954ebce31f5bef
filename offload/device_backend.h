// The device backend: the few primitives the copy engine needs from "a device with its own copy
// streams". Two implementations share this contract and one typed conformance suite
// (tests/offload/copy_engine*_test.cc): the CUDA backend (offload/cuda/cuda_backend.h) and the host
// backend (offload/host_backend.h), in which "device" memory is ordinary memory and the copy
// streams are worker threads, so the engine's logic runs in CPU-only CI.
//
// Note [Copy ordering]. A backend has two copy streams, one per direction (D2H, H2D). Copies on
// one stream complete in issue order. A copy starts only after
//   - all work enqueued on `after_stream` before the Copy call (the producer, or the consumer
//     that just allocated the destination) -- CUDA: an event recorded there and waited on by the
//     copy stream; host backend: streams do not exist, the call itself is the point in time;
//   - `after` completed (an H2D waits for the D2H that filled its host source, so a reload can
//     never race its own D2H; a D2H into reused host memory waits for the H2D that last read it).
// Completion is observed through the returned CopyFence: polled, waited for on the host, or
// waited for by another stream (device-side; host backend: a host wait, since the caller's
// "stream" is the calling thread).
#ifndef STOWAGE_OFFLOAD_DEVICE_BACKEND_H_
#define STOWAGE_OFFLOAD_DEVICE_BACKEND_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stowage::offload {

enum class CopyDirection { kDeviceToHost = 0, kHostToDevice = 1 };
inline const char* CopyDirectionName(CopyDirection d) {
  return d == CopyDirection::kDeviceToHost ? "d2h" : "h2d";
}

// One issued copy. Thread-safe: every method may be called from any thread at once.
class CopyFence {
 public:
  virtual ~CopyFence() = default;

  // Non-blocking: true once the bytes landed (and the copy's on_landed callback returned).
  virtual bool Done() = 0;
  // Blocks the calling thread until Done(). INTERNAL if the backend reports a failure.
  virtual absl::Status Wait() = 0;
  // Makes `stream` wait (device-side, no host sync) until Done(). Host backend: Wait().
  // With `measure_stall`, the time `stream` spends blocked is measured (stall_seconds()).
  virtual absl::Status StreamWait(void* stream, bool measure_stall) = 0;

  // Seconds the copy stream spent on this copy; valid once Done() (0 before).
  virtual double busy_seconds() = 0;
  // Seconds a stream passed to StreamWait(measure_stall) was blocked; valid once that stream got
  // past the wait (the runtime reads it after draining), 0 when not measured.
  virtual double stall_seconds() = 0;

  uint64_t bytes() const { return bytes_; }
  CopyDirection direction() const { return direction_; }

 protected:
  CopyFence(CopyDirection direction, uint64_t bytes) : direction_(direction), bytes_(bytes) {}

 private:
  CopyDirection direction_;
  uint64_t bytes_;
};

struct CopyRequest {
  CopyDirection direction = CopyDirection::kDeviceToHost;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  // Split the copy into pieces of at most this many bytes (0: one piece). Large enough chunks
  // reach the full link bandwidth (16 MiB on the reference H200) while letting the other
  // direction's copies interleave.
  size_t chunk_bytes = 0;
  void* after_stream = nullptr;      // see Note [Copy ordering]
  std::shared_ptr<CopyFence> after;  // may be null
  // Runs once, on a backend thread, after the bytes landed and before the fence reports Done.
  // Must not call into the backend (CUDA host-function rules) and must not block on locks that
  // a caller of Copy may hold. Used by the integrity mode to checksum the host copy.
  std::function<void()> on_landed;
};

// Thread-safety: Copy and the device-memory helpers may be called from several threads at once.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual const char* name() const = 0;  // "host" or "cuda"
  virtual int device() const = 0;        // CUDA ordinal; 0 for the host backend

  // Issues one copy (Note [Copy ordering]). INVALID_ARGUMENT for null pointers with bytes > 0;
  // INTERNAL when the backend fails to enqueue. A zero-byte copy is a valid fence.
  virtual absl::StatusOr<std::shared_ptr<CopyFence>> Copy(CopyRequest request) = 0;

  // Blocks until every copy issued so far on both copy streams completed.
  virtual absl::Status Synchronize() = 0;

  // Device memory, for tests and benchmarks (the trainer owns device memory in real use).
  // Allocations are at least 256-byte aligned.
  virtual absl::StatusOr<void*> AllocateDevice(size_t bytes) = 0;
  virtual void FreeDevice(void* ptr) = 0;
  // Synchronous copies between device memory and ordinary host memory (test setup and checks).
  virtual absl::Status CopyToDevice(void* dst, const void* host_src, size_t bytes) = 0;
  virtual absl::Status CopyFromDevice(void* host_dst, const void* src, size_t bytes) = 0;
  virtual absl::Status FillDevice(void* dst, int value, size_t bytes) = 0;
};

}  // namespace stowage::offload

#endif  // STOWAGE_OFFLOAD_DEVICE_BACKEND_H_
