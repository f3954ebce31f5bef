// The few CUDA runtime calls the host-memory side needs (topology, arena registration), behind
// absl::Status. Implemented in cuda_host.cc, which builds only with the CUDA backend: include this
// header only under STOWAGE_HAVE_CUDA.
#ifndef STOWAGE_OFFLOAD_CUDA_HOST_H_
#define STOWAGE_OFFLOAD_CUDA_HOST_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stowage::offload {

// UNAVAILABLE when there is no driver or no such device.
absl::Status CudaCheckDevice(int device);
// "0000:3b:00.0" (normalized to sysfs form).
absl::StatusOr<std::string> CudaDevicePciBusId(int device);
// "GPU-8c2f3e1a-...": the device's UUID as nvidia-smi and DCGM write it.
absl::StatusOr<std::string> CudaDeviceUuid(int device);
// cudaHostRegister(ptr, bytes, portable) on `device`; the message names device, bytes and node.
// Both leave the calling thread's current device as it was.
absl::Status CudaHostRegisterRange(int device, void* ptr, uint64_t bytes, int numa_node);
absl::Status CudaHostUnregisterRange(int device, void* ptr);

}  // namespace stowage::offload

#endif  // STOWAGE_OFFLOAD_CUDA_HOST_H_
