// The copy-engine suite on the host backend, plus what only the host backend can show: its
// workers, pinning, and an H2D held back by its D2H.
#include <gmock/gmock.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "offload/host_backend.h"
#include "tests/offload/copy_engine_suite.h"

namespace stowage::testing {
namespace {

struct HostTraits {
  static std::unique_ptr<offload::DeviceBackend> Make() {
    offload::HostBackendOptions options;
    options.threads_per_stream = 2;
    return *offload::HostBackend::Create(options);
  }
  static const char* SkipReason() { return ""; }
  static void* PinnedHost(size_t bytes) { return std::malloc(bytes == 0 ? 1 : bytes); }
  static void FreeHost(void* p) { std::free(p); }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Host, CopyEngineConformance, HostTraits);

TEST(HostBackend, AnH2DNeverOvertakesItsD2H) {
  // Regression guard for the failure mode "a reload racing its own D2H": with the D2H stream
  // held, the H2D that depends on it must not run, even though its own stream is idle.
  auto backend = *offload::HostBackend::Create({});
  offload::CopyEngine engine(std::move(backend), {}, nullptr);
  auto& host_backend = static_cast<offload::HostBackend&>(engine.backend());
  std::vector<uint8_t> device(4096, 0xab), host(4096, 0), back(4096, 0);
  host_backend.SetPausedForTesting(offload::CopyDirection::kDeviceToHost, true);
  auto d2h = engine.DeviceToHost(host.data(), device.data(), device.size(), nullptr);
  ASSERT_TRUE(d2h.ok());
  auto h2d = engine.HostToDevice(back.data(), host.data(), host.size(), nullptr, *d2h);
  ASSERT_TRUE(h2d.ok());
  // Give the H2D worker every chance to (wrongly) run.
  for (int i = 0; i < 100; ++i) std::this_thread::yield();
  EXPECT_FALSE((*d2h)->Done());
  EXPECT_FALSE((*h2d)->Done());
  EXPECT_EQ(back[0], 0);
  host_backend.SetPausedForTesting(offload::CopyDirection::kDeviceToHost, false);
  ASSERT_TRUE((*h2d)->Wait().ok());
  EXPECT_EQ(back, device);
}

TEST(HostBackend, WorkersRunOnTheGivenCpus) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed)) ++cpu;
  offload::HostBackendOptions options;
  options.cpus = {cpu};
  auto backend = offload::HostBackend::Create(options);
  ASSERT_TRUE(backend.ok());
  EXPECT_EQ((*backend)->pinned_cpus(), std::vector<int>{cpu});
  EXPECT_EQ((*backend)->threads_per_stream(), 1);
  offload::HostBackendOptions negative;
  negative.threads_per_stream = -1;
  EXPECT_EQ(offload::HostBackend::Create(negative).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Regression: copy_threads = 5000 got as far as creating threads. The count is bounded
// before any thread starts, and the error names the range.
TEST(HostBackend, ThreadCountIsBounded) {
  offload::HostBackendOptions options;
  options.threads_per_stream = 5000;
  absl::StatusOr<std::unique_ptr<offload::HostBackend>> refused =
      offload::HostBackend::Create(options);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("5000"));
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("[0, 64]"));
  options.threads_per_stream = offload::HostBackend::kMaxThreadsPerStream;
  absl::StatusOr<std::unique_ptr<offload::HostBackend>> most =
      offload::HostBackend::Create(options);
  ASSERT_TRUE(most.ok()) << most.status();
  EXPECT_EQ((*most)->threads_per_stream(), 64);
}

#if defined(__SANITIZE_ADDRESS__)
#define STOWAGE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STOWAGE_TEST_ASAN 1
#endif
#endif

#ifndef STOWAGE_TEST_ASAN
// In a death-test child: caps the address space just above its current size, so that worker
// threads (each needs a stack) are refused, and exits 0 when Create says so with INTERNAL.
[[noreturn]] void CreateWithThreadsRefused() {
  long pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  const rlim_t now = static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE);
  const rlimit limit{now + (rlim_t{24} << 20), now + (rlim_t{24} << 20)};
  if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(2);
  offload::HostBackendOptions options;
  options.threads_per_stream = offload::HostBackend::kMaxThreadsPerStream;
  absl::StatusOr<std::unique_ptr<offload::HostBackend>> backend =
      offload::HostBackend::Create(options);
  if (backend.ok()) _exit(3);  // the limit did not bite: the test proves nothing
  const bool named =
      backend.status().code() == absl::StatusCode::kInternal &&
      backend.status().message().find("cannot start copy worker") != std::string_view::npos;
  std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
  _exit(named ? 0 : 4);
}
#endif

// Regression (an abort instead of an error): when the OS refused a worker thread, the
// std::system_error unwound through the stream's constructor and destroyed joinable threads:
// "terminate called without an active exception" inside libstowage.so. Now the workers already
// started are joined and Create returns INTERNAL. The OS is made to refuse threads by capping the
// address space of a forked child just above its current size (each thread needs a stack).
TEST(HostBackendDeathTest, RefusedWorkerThreadsAreAnErrorNotAnAbort) {
#ifdef STOWAGE_TEST_ASAN
  GTEST_SKIP() << "the sanitizer's shadow memory does not fit under an address-space limit";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(CreateWithThreadsRefused(), ::testing::ExitedWithCode(0), "cannot start copy worker");
#endif
}

}  // namespace
}  // namespace stowage::testing
