// The CUDA kernels `stowage calibrate` times to measure the memory-bound and per-kernel rates
// of a GPU (the GEMM rates come from cuBLAS). Built only with the CUDA backend.
#ifndef STOWAGE_CLI_CALIBRATE_KERNELS_H_
#define STOWAGE_CLI_CALIBRATE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>

namespace stowage::tools {

// A kernel that does nothing: back to back, its launches measure the per-kernel floor.
cudaError_t LaunchEmptyKernel(cudaStream_t stream);

// dst[i] = src[i] over `bytes` (a multiple of 16) with 16-byte loads and stores: the stream
// copy an element-wise kernel reaches (read + write).
cudaError_t LaunchCopyKernel(const void* src, void* dst, size_t bytes, int sm_count,
                             cudaStream_t stream);

}  // namespace stowage::tools

#endif  // STOWAGE_CLI_CALIBRATE_KERNELS_H_
