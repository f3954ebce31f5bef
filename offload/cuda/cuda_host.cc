#include "offload/cuda/cuda_host.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "offload/cuda/cuda_status.h"
#include "offload/topology.h"

namespace stowage::offload {

namespace {

// Makes `device` current for a scope and restores the caller's device after: the arena is
// created and destroyed on the trainer's threads, whose current device must not change.
class ScopedDevice {
 public:
  ScopedDevice() = default;
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ~ScopedDevice() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  absl::Status Set(int device) {
    int previous = -1;
    STOWAGE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous),
                                 absl::StrCat("cudaGetDevice (for CUDA device ", device, ")"));
    if (previous == device) return absl::OkStatus();
    STOWAGE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device),
                                 absl::StrCat("cudaSetDevice(", device, ")"));
    previous_ = previous;
    return absl::OkStatus();
  }

 private:
  int previous_ = -1;
};

}  // namespace

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

absl::StatusOr<std::string> CudaDeviceUuid(int device) {
  if (absl::Status status = CudaCheckDevice(device); !status.ok()) return status;
  cudaDeviceProp prop{};
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device),
                               absl::StrCat("cudaGetDeviceProperties(device ", device, ")"));
  // 16 bytes as 8-4-4-4-12 hex digits, nvidia-smi's grouping.
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    absl::StrAppend(&out,
                    absl::Hex(static_cast<unsigned char>(prop.uuid.bytes[i]), absl::kZeroPad2));
  }
  return out;
}

absl::Status CudaHostRegisterRange(int device, void* ptr, uint64_t bytes, int numa_node) {
  ScopedDevice scoped;
  if (absl::Status status = scoped.Set(device); !status.ok()) return status;
  // Portable: the pages count as pinned in every context, so any device's copies may use them.
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable),
                               absl::StrCat("cudaHostRegister(device ", device, ", ", bytes,
                                            " bytes, numa node ", numa_node, ")"));
  return absl::OkStatus();
}

absl::Status CudaHostUnregisterRange(int device, void* ptr) {
  ScopedDevice scoped;
  if (absl::Status status = scoped.Set(device); !status.ok()) return status;
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaHostUnregister(ptr),
                               absl::StrCat("cudaHostUnregister(device ", device, ")"));
  return absl::OkStatus();
}

}  // namespace stowage::offload
