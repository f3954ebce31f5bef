// The CUDA backend: two non-blocking copy streams (D2H, H2D) on one device, an event for every
// dependency (Note [Copy ordering] in offload/device_backend.h). Built only with the CUDA backend
// (STOWAGE_HAVE_CUDA); this header has no CUDA includes so the runtime can name the class.
//
// Copies use cudaMemcpyAsync with cudaMemcpyDefault, so any pair of pointers the driver knows
// (device memory, pinned or registered host memory) is accepted; with pageable host memory the
// copy is correct but neither asynchronous nor at link speed. The calling thread's current device
// is preserved across every call.
#ifndef STOWAGE_OFFLOAD_CUDA_BACKEND_H_
#define STOWAGE_OFFLOAD_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "offload/device_backend.h"

namespace stowage::offload {

// Devices visible to the CUDA runtime; 0 when there is no driver or no device (never an error).
int CudaDeviceCount();

class CudaBackend final : public DeviceBackend {
 public:
  // UNAVAILABLE without a driver or device, INVALID_ARGUMENT for a bad ordinal, INTERNAL if a
  // stream cannot be created.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device);
  // Synchronizes both copy streams, then destroys them.
  ~CudaBackend() override;

  const char* name() const override { return "cuda"; }
  int device() const override;
  absl::StatusOr<std::shared_ptr<CopyFence>> Copy(CopyRequest request) override;
  absl::Status Synchronize() override;
  absl::StatusOr<void*> AllocateDevice(size_t bytes) override;
  void FreeDevice(void* ptr) override;
  absl::Status CopyToDevice(void* dst, const void* host_src, size_t bytes) override;
  absl::Status CopyFromDevice(void* host_dst, const void* src, size_t bytes) override;
  absl::Status FillDevice(void* dst, int value, size_t bytes) override;

  // The copy streams (cudaStream_t), e.g. for a benchmark's raw ceiling on the same streams.
  void* stream(CopyDirection direction) const;

  struct Impl;

 private:
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stowage::offload

#endif  // STOWAGE_OFFLOAD_CUDA_BACKEND_H_
