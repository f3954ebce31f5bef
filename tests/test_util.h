// Helpers shared by stowage's tests.
#ifndef STOWAGE_TESTS_TEST_UTIL_H_
#define STOWAGE_TESTS_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

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

// What a shell command printed on stdout, and its exit code (-1 if it did not exit normally).
struct CommandResult {
  int code = -1;
  std::string out;
};

inline CommandResult RunCommand(const std::string& command) {
  CommandResult run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) run.out.append(buffer, n);
  const int status = pclose(pipe);
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// The built `stowage` CLI run with `args`: its stdout, and its stderr merged in unless
// `with_stderr` is false (then dropped), and its exit code.
inline CommandResult RunStowage(const std::string& args, bool with_stderr = true) {
  return RunCommand(std::string(STOWAGE_BINARY_DIR) + "/cli/stowage " + args +
                    (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

}  // namespace stowage::testing

// First statement of every test labelled `gpu`.
#define STOWAGE_REQUIRE_GPU()                                               \
  do {                                                                      \
    if (!::stowage::testing::GpuAvailable()) GTEST_SKIP() << "no CUDA GPU"; \
  } while (0)

#endif  // STOWAGE_TESTS_TEST_UTIL_H_
