#include "tests/offload/spin_kernel.h"

namespace stowage::testing {
namespace {

__global__ void SpinThenFill(const volatile int* release, long long max_cycles, uint8_t* out,
                             size_t bytes, uint8_t value) {
  __shared__ int go;
  if (threadIdx.x == 0) {
    const long long start = clock64();
    while (*release == 0 && clock64() - start < max_cycles) {
    }
    go = 1;
  }
  __syncthreads();
  if (go == 0) return;
  for (size_t i = threadIdx.x; i < bytes; i += blockDim.x) out[i] = value;
}

}  // namespace

cudaError_t LaunchSpinThenFill(cudaStream_t stream, const volatile int* release,
                               long long max_cycles, uint8_t* out, size_t bytes, uint8_t value) {
  SpinThenFill<<<1, 256, 0, stream>>>(release, max_cycles, out, bytes, value);
  return cudaGetLastError();
}

}  // namespace stowage::testing
