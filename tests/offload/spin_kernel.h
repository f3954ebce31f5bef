// A kernel for the gpu-labelled offload tests: it holds an SM until the host releases it, so a
// test can prove ordering and overlap without timing anything.
#ifndef STOWAGE_TESTS_OFFLOAD_SPIN_KERNEL_H_
#define STOWAGE_TESTS_OFFLOAD_SPIN_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace stowage::testing {

// Spins until *release (host-mapped memory, device pointer) becomes non-zero -- or, as a safety
// net against a hung test, after `max_cycles` GPU clocks -- then fills out[0..bytes) with `value`.
cudaError_t LaunchSpinThenFill(cudaStream_t stream, const volatile int* release,
                               long long max_cycles, uint8_t* out, size_t bytes, uint8_t value);

}  // namespace stowage::testing

#endif  // STOWAGE_TESTS_OFFLOAD_SPIN_KERNEL_H_
