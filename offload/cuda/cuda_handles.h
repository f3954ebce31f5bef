// RAII for the CUDA handles stowage uses (events, streams, device buffers, the current device),
// in one place for the CUDA backend and the tools that measure the machine. CUDA-only: include
// from cuda_*.cc files and code guarded by STOWAGE_HAVE_CUDA. Destructors ignore errors: they run
// on teardown paths where there is no one left to tell.
#ifndef STOWAGE_OFFLOAD_CUDA_HANDLES_H_
#define STOWAGE_OFFLOAD_CUDA_HANDLES_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "offload/cuda/cuda_status.h"

namespace stowage::offload {

// Makes `device` current for a scope and restores the caller's device after it.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) {
      status_ = CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
    }
    switched_ = previous_ != device && status_.ok();
  }
  ~DeviceScope() {
    if (switched_ && previous_ >= 0) cudaSetDevice(previous_);
  }
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  absl::Status status_;
};

// RAII for a cudaEvent_t.
class Event {
 public:
  Event() = default;
  explicit Event(cudaEvent_t event) : event_(event) {}
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  Event& operator=(Event&& other) noexcept {
    std::swap(event_, other.event_);
    return *this;
  }
  ~Event() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  // `timing`: the event can be used with cudaEventElapsedTime (costs a little per record).
  static absl::StatusOr<Event> Create(bool timing) {
    Event event;
    if (absl::Status s = event.Init(timing); !s.ok()) return s;
    return event;
  }
  absl::Status Init(bool timing) {
    if (event_ != nullptr) cudaEventDestroy(std::exchange(event_, nullptr));
    return CudaStatus(
        cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming),
        "cudaEventCreateWithFlags");
  }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// RAII for a non-blocking cudaStream_t.
class Stream {
 public:
  Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  // Creates the stream on the current device; `device` names it in errors.
  absl::Status Init(int device) {
    return CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                      absl::StrCat("cudaStreamCreateWithFlags(device ", device, ")"));
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// RAII for a cudaMalloc'd buffer.
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Create(int device, uint64_t bytes) {
    DeviceBuffer buffer;
    STOWAGE_CUDA_RETURN_IF_ERROR(
        cudaMalloc(&buffer.ptr_, bytes),
        absl::StrCat("cudaMalloc(device ", device, ", ", bytes, " bytes)"));
    return buffer;
  }
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(std::exchange(other.ptr_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  std::byte* get() const { return static_cast<std::byte*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

}  // namespace stowage::offload

#endif  // STOWAGE_OFFLOAD_CUDA_HANDLES_H_
