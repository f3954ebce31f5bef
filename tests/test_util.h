// Helpers shared by stowage's tests.
#ifndef STOWAGE_TESTS_TEST_UTIL_H_
#define STOWAGE_TESTS_TEST_UTIL_H_

#include <gtest/gtest.h>

#ifdef STOWAGE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace stowage::testing {

// True when a CUDA device can be used. "No driver" (cudaErrorInsufficientDriver) and "no device"
// both mean no GPU: that is a normal configuration, not a failure.
inline bool GpuAvailable() {
#ifdef STOWAGE_HAVE_CUDA
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
#else
  return false;
#endif
}

}  // namespace stowage::testing

// First statement of every test labelled `gpu`.
#define STOWAGE_REQUIRE_GPU()                                               \
  do {                                                                      \
    if (!::stowage::testing::GpuAvailable()) GTEST_SKIP() << "no CUDA GPU"; \
  } while (0)

#endif  // STOWAGE_TESTS_TEST_UTIL_H_
