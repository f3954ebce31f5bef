// The copy-engine suite on the host backend, plus what only the host backend can show: its
// workers, pinning, and an H2D held back by its D2H.
#include <sched.h>

#include <cstdlib>

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

}  // namespace
}  // namespace stowage::testing
