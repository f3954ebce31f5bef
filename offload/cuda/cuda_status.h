// CUDA error -> absl::Status, in one place. Included only by CUDA-backend sources (cuda_*.cc)
// and code guarded by STOWAGE_HAVE_CUDA.
#ifndef STOWAGE_OFFLOAD_CUDA_STATUS_H_
#define STOWAGE_OFFLOAD_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stowage::offload {

// `what` names the call and its arguments that matter (device, bytes, node).
inline absl::Status CudaStatus(cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
      return absl::UnavailableError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace stowage::offload

#define STOWAGE_CUDA_RETURN_IF_ERROR(call, what)                                        \
  do {                                                                                  \
    absl::Status stowage_cuda_status_ = ::stowage::offload::CudaStatus((call), (what)); \
    if (!stowage_cuda_status_.ok()) return stowage_cuda_status_;                        \
  } while (0)

#endif  // STOWAGE_OFFLOAD_CUDA_STATUS_H_
