#include "offload/cuda_host.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "offload/cuda_status.h"
#include "offload/topology.h"

namespace stowage::offload {

absl::Status CudaCheckDevice(int device) {
  int count = 0;
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count),
                               absl::StrCat("cudaGetDeviceCount (for CUDA device ", device, ")"));
  if (device < 0 || device >= count) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", device, " does not exist (", count, " visible)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CudaDevicePciBusId(int device) {
  if (absl::Status status = CudaCheckDevice(device); !status.ok()) return status;
  char bus_id[64] = {};
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device),
                               absl::StrCat("cudaDeviceGetPCIBusId(device ", device, ")"));
  return NormalizePciBusId(bus_id);
}

absl::Status CudaHostRegisterRange(int device, void* ptr, uint64_t bytes, int numa_node) {
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
  // Portable: the pages count as pinned in every context, so any device's copies may use them.
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable),
                               absl::StrCat("cudaHostRegister(device ", device, ", ", bytes,
                                            " bytes, numa node ", numa_node, ")"));
  return absl::OkStatus();
}

absl::Status CudaHostUnregisterRange(int device, void* ptr) {
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaHostUnregister(ptr),
                               absl::StrCat("cudaHostUnregister(device ", device, ")"));
  return absl::OkStatus();
}

}  // namespace stowage::offload
