// The runtime conformance suite: one contract, every backend. Instantiated for the host backend in
// runtime_conformance_test.cc and for CUDA in runtime_conformance_gpu_test.cc (label `gpu`,
// skipped without a GPU). Everything goes through the C ABI, as a trainer would; device memory
// comes from the backend under test.
#ifndef STOWAGE_TESTS_RUNTIME_RUNTIME_CONFORMANCE_H_
#define STOWAGE_TESTS_RUNTIME_RUNTIME_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "offload/host_backend.h"
#include "runtime/runtime.h"
#include "stowage/plan.h"
#include "stowage/stowage.h"
#include "tests/runtime/test_plans.h"
#include "tests/test_util.h"

#ifdef STOWAGE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace stowage::testing {

struct HostBackendTraits {
  static constexpr stowage_backend kBackend = STOWAGE_BACKEND_HOST;
  static bool Available() { return true; }
};
struct CudaBackendTraits {
  static constexpr stowage_backend kBackend = STOWAGE_BACKEND_CUDA;
  static bool Available() { return GpuAvailable(); }
};

#define STOWAGE_EXPECT_STATUS(call, expected)                                                      \
  do {                                                                                             \
    const stowage_status stowage_got_ = (call);                                                    \
    EXPECT_EQ(stowage_got_, (expected))                                                            \
        << #call << " -> " << stowage_status_string(stowage_got_) << ": " << stowage_last_error(); \
  } while (0)
#define STOWAGE_ASSERT_OK(call)                                                                    \
  do {                                                                                             \
    const stowage_status stowage_got_ = (call);                                                    \
    ASSERT_EQ(stowage_got_, STOWAGE_OK)                                                            \
        << #call << " -> " << stowage_status_string(stowage_got_) << ": " << stowage_last_error(); \
  } while (0)

template <typename Traits>
class RuntimeConformance : public ::testing::Test {
 public:  // RunPipelineOrder drives the fixture too
  void SetUp() override {
    if (!Traits::Available()) GTEST_SKIP() << "backend not available (no CUDA GPU)";
  }
  void TearDown() override {
    for (void* p : device_buffers_) backend().FreeDevice(p);
    device_buffers_.clear();
    if (rt_ != nullptr) {
      stowage_end_step(rt_);  // may fail: no step open
      EXPECT_EQ(stowage_destroy(rt_), STOWAGE_OK) << stowage_last_error();
      rt_ = nullptr;
    }
  }

  stowage_options Options(bool verify = false) {
    stowage_options options;
    stowage_options_init(&options);
    options.backend = Traits::kBackend;
    options.verify_checksums = verify ? 1 : 0;
    options.copy_threads = 2;
    options.metrics_address = "";  // no endpoint, whatever the environment says
    return options;
  }

  stowage_status Create(const Plan& plan, bool verify = false) {
    const std::string json = PlanToJson(plan);
    stowage_options options = Options(verify);
    return stowage_create(json.data(), json.size(), &options, &rt_);
  }

  runtime::Runtime& rt() { return *runtime::UnwrapForTesting(rt_); }
  offload::DeviceBackend& backend() { return rt().backend(); }

  void* DeviceAlloc(size_t bytes) {
    absl::StatusOr<void*> p = backend().AllocateDevice(bytes);
    EXPECT_TRUE(p.ok()) << p.status();
    device_buffers_.push_back(*p);
    return *p;
  }
  // A device buffer holding `bytes` pseudo-random bytes from `seed`.
  void* DeviceWithPattern(size_t bytes, uint32_t seed, std::vector<uint8_t>* pattern) {
    pattern->resize(bytes);
    std::mt19937 rng(seed);
    for (uint8_t& b : *pattern) b = static_cast<uint8_t>(rng());
    void* p = DeviceAlloc(bytes);
    EXPECT_TRUE(backend().CopyToDevice(p, pattern->data(), bytes).ok());
    return p;
  }
  std::vector<uint8_t> ReadDevice(const void* p, size_t bytes) {
    std::vector<uint8_t> out(bytes);
    EXPECT_TRUE(backend().CopyFromDevice(out.data(), p, bytes).ok());
    return out;
  }
  // The device synchronises before a read-back (CUDA: the legacy stream; host: nothing).
  void SyncDevice() {
#ifdef STOWAGE_HAVE_CUDA
    if (Traits::kBackend == STOWAGE_BACKEND_CUDA) {
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
#endif
  }

  // Holds the D2H of the next saves "in flight" until the returned function runs: the host
  // backend pauses its D2H workers; CUDA blocks the producer stream in a host function.
  std::function<void()> BlockCopies() {
    if (Traits::kBackend == STOWAGE_BACKEND_HOST) {
      auto* host = dynamic_cast<offload::HostBackend*>(&backend());
      host->SetPausedForTesting(offload::CopyDirection::kDeviceToHost, true);
      return [host] { host->SetPausedForTesting(offload::CopyDirection::kDeviceToHost, false); };
    }
#ifdef STOWAGE_HAVE_CUDA
    auto gate = std::make_shared<std::atomic<bool>>(false);
    auto* held = new std::shared_ptr<std::atomic<bool>>(gate);
    cudaLaunchHostFunc(
        nullptr,
        [](void* p) {
          auto* g = static_cast<std::shared_ptr<std::atomic<bool>>*>(p);
          while (!(*g)->load()) std::this_thread::yield();
          delete g;
        },
        held);
    return [gate] { gate->store(true); };
#else
    return []{};
#endif
  }

  stowage_runtime* rt_ = nullptr;
  std::vector<void*> device_buffers_;
};

TYPED_TEST_SUITE_P(RuntimeConformance);

TYPED_TEST_P(RuntimeConformance, RoundTripsAreBitExactOverSizes) {
  const std::vector<size_t> sizes = {0, 1, 3, 255, 256, 257, 4095, 65537, (1 << 20) + 13, 3 << 20};
  uint64_t per_layer = 0;
  for (size_t s : sizes) per_layer = std::max<uint64_t>(per_layer, s);
  ASSERT_EQ(this->Create(MakeTestPlan(static_cast<int>(sizes.size()), per_layer)), STOWAGE_OK)
      << stowage_last_error();
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  std::vector<std::vector<uint8_t>> patterns(sizes.size());
  std::vector<stowage_tensor_id> ids(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    void* src = this->DeviceWithPattern(sizes[i], static_cast<uint32_t>(i), &patterns[i]);
    STOWAGE_ASSERT_OK(
        stowage_save(this->rt_, static_cast<int32_t>(i), src, sizes[i], nullptr, &ids[i]));
  }
  // Half are prefetched first, half restored directly; in reverse (backward) order.
  std::vector<void*> dsts(sizes.size());
  for (size_t i = sizes.size(); i-- > 0;) {
    dsts[i] = this->DeviceAlloc(sizes[i]);
    if (i % 2 == 0) {
      STOWAGE_ASSERT_OK(stowage_prefetch(this->rt_, ids[i], dsts[i], nullptr));
    }
  }
  for (size_t i = sizes.size(); i-- > 0;) {
    STOWAGE_ASSERT_OK(stowage_restore(this->rt_, ids[i], dsts[i], nullptr));
  }
  this->SyncDevice();
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(this->ReadDevice(dsts[i], sizes[i]), patterns[i]) << "size " << sizes[i];
  }
  STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
  stowage_stats stats;
  STOWAGE_ASSERT_OK(stowage_get_stats(this->rt_, &stats));
  uint64_t total = 0;
  for (size_t s : sizes) total += s;
  EXPECT_EQ(stats.saves_total, sizes.size());
  EXPECT_EQ(stats.restores_total, sizes.size());
  EXPECT_EQ(stats.d2h_bytes_total, total);
  EXPECT_EQ(stats.h2d_bytes_total, total);
  EXPECT_EQ(stats.copies_in_flight, 0u);
  EXPECT_EQ(stats.arena_used_bytes, 0u);
  EXPECT_EQ(stats.arena_peak_bytes, total);
  EXPECT_EQ(stats.steps_completed, 1u);
  EXPECT_EQ(stats.errors_total, 0u);
  EXPECT_EQ(stats.backend, TypeParam::kBackend);
}

TYPED_TEST_P(RuntimeConformance, RandomSizesAndOrdersOverManySteps) {
  constexpr int kLayers = 6;
  constexpr uint64_t kPerLayer = 64 << 10;
  ASSERT_EQ(this->Create(MakeTestPlan(kLayers, kPerLayer)), STOWAGE_OK) << stowage_last_error();
  std::mt19937 rng(42);
  struct Saved {
    stowage_tensor_id id;
    size_t bytes;
    std::vector<uint8_t> pattern;
    void* dst;
  };
  for (int step = 0; step < 60; ++step) {
    STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
    std::vector<Saved> saved;
    for (int layer = 0; layer < kLayers; ++layer) {
      // Several tensors per layer whose sizes sum to at most the reservation.
      uint64_t left = kPerLayer;
      const int tensors = 1 + static_cast<int>(rng() % 4);
      for (int t = 0; t < tensors && left > 0; ++t) {
        const size_t bytes = t + 1 == tensors ? left : 1 + rng() % left;
        Saved s{0, bytes, {}, nullptr};
        void* src = this->DeviceWithPattern(bytes, rng(), &s.pattern);
        STOWAGE_ASSERT_OK(stowage_save(this->rt_, layer, src, bytes, nullptr, &s.id));
        s.dst = this->DeviceAlloc(bytes);
        left -= bytes;
        saved.push_back(std::move(s));
      }
    }
    std::shuffle(saved.begin(), saved.end(), rng);
    for (Saved& s : saved) {
      if (rng() % 2) {
        STOWAGE_ASSERT_OK(stowage_prefetch(this->rt_, s.id, s.dst, nullptr));
      }
    }
    std::shuffle(saved.begin(), saved.end(), rng);
    for (Saved& s : saved) STOWAGE_ASSERT_OK(stowage_restore(this->rt_, s.id, s.dst, nullptr));
    this->SyncDevice();
    for (Saved& s : saved) ASSERT_EQ(this->ReadDevice(s.dst, s.bytes), s.pattern);
    STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
    for (void* p : this->device_buffers_) this->backend().FreeDevice(p);
    this->device_buffers_.clear();
  }
}

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kUnderAddressSanitizer = true;
#else
inline constexpr bool kUnderAddressSanitizer = false;
#endif
#else
inline constexpr bool kUnderAddressSanitizer = false;
#endif

// Reads this process's resident set (pages) from /proc/self/statm; 0 when unavailable.
inline uint64_t ResidentPages() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident : 0;
}

TYPED_TEST_P(RuntimeConformance, ThousandsOfStepsDoNotGrowMemory) {
  constexpr int kLayers = 4;
  constexpr size_t kBytes = 4096 + 7;
  ASSERT_EQ(this->Create(MakeTestPlan(kLayers, kBytes)), STOWAGE_OK) << stowage_last_error();
  std::vector<uint8_t> pattern;
  void* src = this->DeviceWithPattern(kBytes, 7, &pattern);
  void* dst = this->DeviceAlloc(kBytes);
  auto run_steps = [&](int steps) {
    for (int step = 0; step < steps; ++step) {
      ASSERT_EQ(stowage_begin_step(this->rt_), STOWAGE_OK);
      stowage_tensor_id ids[kLayers];
      for (int l = 0; l < kLayers; ++l) {
        ASSERT_EQ(stowage_save(this->rt_, l, src, kBytes, nullptr, &ids[l]), STOWAGE_OK);
      }
      // One layer is left unrestored every step (only waited for): it must still be released.
      ASSERT_EQ(stowage_save_wait(this->rt_, ids[0]), STOWAGE_OK);
      for (int l = kLayers - 1; l > 0; --l) {
        ASSERT_EQ(stowage_restore(this->rt_, ids[l], dst, nullptr), STOWAGE_OK);
      }
      ASSERT_EQ(stowage_end_step(this->rt_), STOWAGE_OK) << stowage_last_error();
    }
  };
  run_steps(300);  // warm up: allocator caches, thread stacks
  const uint64_t before = ResidentPages();
  run_steps(2000);
  const uint64_t after = ResidentPages();
  if (before > 0 && !kUnderAddressSanitizer) {  // ASan's quarantine keeps freed memory resident
    EXPECT_LE(after, before + 256) << "resident pages grew over 2000 steps";
  }
  this->SyncDevice();
  EXPECT_EQ(this->ReadDevice(dst, kBytes), pattern);
  stowage_stats stats;
  STOWAGE_ASSERT_OK(stowage_get_stats(this->rt_, &stats));
  EXPECT_EQ(stats.steps_completed, 2300u);
  EXPECT_EQ(stats.saves_total, 2300u * kLayers);
  EXPECT_EQ(stats.restores_total, 2300u * (kLayers - 1));
  EXPECT_EQ(stats.arena_used_bytes, 0u);
  EXPECT_EQ(stats.arena_peak_bytes, kLayers * kBytes);
  EXPECT_EQ(stats.copies_in_flight, 0u);
}

TYPED_TEST_P(RuntimeConformance, StaleUnknownAndDoubleRestore) {
  ASSERT_EQ(this->Create(MakeTestPlan(2, 4096)), STOWAGE_OK) << stowage_last_error();
  std::vector<uint8_t> pattern;
  void* src = this->DeviceWithPattern(100, 1, &pattern);
  void* dst = this->DeviceAlloc(100);
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  stowage_tensor_id id = 0;
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 0, src, 100, nullptr, &id));
  STOWAGE_ASSERT_OK(stowage_restore(this->rt_, id, dst, nullptr));
  STOWAGE_EXPECT_STATUS(stowage_restore(this->rt_, id, dst, nullptr),
                        STOWAGE_ERROR_FAILED_PRECONDITION);
  EXPECT_NE(std::string(stowage_last_error()).find("already restored"), std::string::npos);
  STOWAGE_EXPECT_STATUS(stowage_prefetch(this->rt_, id, dst, nullptr),
                        STOWAGE_ERROR_FAILED_PRECONDITION);
  STOWAGE_EXPECT_STATUS(stowage_restore(this->rt_, id + 1, dst, nullptr), STOWAGE_ERROR_NOT_FOUND);
  STOWAGE_EXPECT_STATUS(stowage_restore(this->rt_, 0, dst, nullptr), STOWAGE_ERROR_NOT_FOUND);
  STOWAGE_EXPECT_STATUS(stowage_save_wait(this->rt_, 12345), STOWAGE_ERROR_NOT_FOUND);
  stowage_tensor_id kept = 0;
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 1, src, 100, nullptr, &kept));
  STOWAGE_ASSERT_OK(stowage_save_wait(this->rt_, kept));
  STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
  // Stale: the same slot in the next step is another tensor; the old id must not reach it.
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  stowage_tensor_id first = 0, fresh = 0;
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 0, src, 100, nullptr, &first));
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 1, src, 100, nullptr, &fresh));
  STOWAGE_ASSERT_OK(stowage_save_wait(this->rt_, first));
  STOWAGE_EXPECT_STATUS(stowage_restore(this->rt_, kept, dst, nullptr), STOWAGE_ERROR_NOT_FOUND);
  EXPECT_NE(std::string(stowage_last_error()).find("stale"), std::string::npos);
  int32_t done = 0;
  STOWAGE_EXPECT_STATUS(stowage_save_query(this->rt_, id, &done), STOWAGE_ERROR_NOT_FOUND);
  STOWAGE_ASSERT_OK(stowage_save_wait(this->rt_, fresh));
  STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
  STOWAGE_EXPECT_STATUS(stowage_restore(this->rt_, fresh, dst, nullptr), STOWAGE_ERROR_NOT_FOUND);
  stowage_stats stats;
  STOWAGE_ASSERT_OK(stowage_get_stats(this->rt_, &stats));
  EXPECT_EQ(stats.errors_total, 8u);
}

TYPED_TEST_P(RuntimeConformance, SavingMoreThanReservedIsResourceExhausted) {
  Plan plan = MakeTestPlan(3, 1000, /*offload_every=*/2);  // layers 0 and 2 offload
  ASSERT_EQ(this->Create(plan), STOWAGE_OK) << stowage_last_error();
  std::vector<uint8_t> pattern;
  void* src = this->DeviceWithPattern(1001, 3, &pattern);
  stowage_tensor_id id = 0;
  STOWAGE_EXPECT_STATUS(stowage_save(this->rt_, 0, src, 10, nullptr, &id),
                        STOWAGE_ERROR_FAILED_PRECONDITION);  // no step open
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  STOWAGE_EXPECT_STATUS(stowage_save(this->rt_, 0, src, 1001, nullptr, &id),
                        STOWAGE_ERROR_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(stowage_last_error()).find("reserved 1000"), std::string::npos)
      << stowage_last_error();
  STOWAGE_EXPECT_STATUS(stowage_save(this->rt_, 1, src, 1, nullptr, &id),
                        STOWAGE_ERROR_RESOURCE_EXHAUSTED);  // a "keep" layer
  STOWAGE_EXPECT_STATUS(stowage_save(this->rt_, 3, src, 1, nullptr, &id),
                        STOWAGE_ERROR_INVALID_ARGUMENT);
  STOWAGE_EXPECT_STATUS(stowage_save(this->rt_, -1, src, 1, nullptr, &id),
                        STOWAGE_ERROR_INVALID_ARGUMENT);
  // Exactly the reservation fits, in pieces of odd sizes.
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 0, src, 333, nullptr, &id));
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 0, src, 667, nullptr, &id));
  STOWAGE_EXPECT_STATUS(stowage_save(this->rt_, 0, src, 1, nullptr, &id),
                        STOWAGE_ERROR_RESOURCE_EXHAUSTED);
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 2, src, 1000, nullptr, &id));
  STOWAGE_ASSERT_OK(stowage_save_wait(this->rt_, id));
  stowage_layer_info info{};
  info.struct_size = sizeof(info);
  STOWAGE_ASSERT_OK(stowage_get_layer_info(this->rt_, 0, &info));
  EXPECT_EQ(info.host_bytes, 1000u);
  EXPECT_EQ(info.host_bytes_used, 1000u);
  EXPECT_EQ(info.offloads, 1);
  STOWAGE_ASSERT_OK(stowage_get_layer_info(this->rt_, 1, &info));
  EXPECT_EQ(info.offloads, 0);
  STOWAGE_EXPECT_STATUS(stowage_get_layer_info(this->rt_, 3, &info),
                        STOWAGE_ERROR_INVALID_ARGUMENT);
  // Wait for every save so that end_step is clean.
  for (stowage_tensor_id i = (id & ~0xffffffffull); i <= id; ++i) {
    STOWAGE_ASSERT_OK(stowage_save_wait(this->rt_, i));
  }
  STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
  // The reservation is whole again next step.
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 0, src, 1000, nullptr, &id));
  STOWAGE_ASSERT_OK(stowage_save_wait(this->rt_, id));
  STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
}

TYPED_TEST_P(RuntimeConformance, StepStateMachine) {
  ASSERT_EQ(this->Create(MakeTestPlan(1, 4096)), STOWAGE_OK) << stowage_last_error();
  STOWAGE_EXPECT_STATUS(stowage_end_step(this->rt_), STOWAGE_ERROR_FAILED_PRECONDITION);
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  STOWAGE_EXPECT_STATUS(stowage_begin_step(this->rt_), STOWAGE_ERROR_FAILED_PRECONDITION);
  STOWAGE_EXPECT_STATUS(stowage_destroy(this->rt_), STOWAGE_ERROR_FAILED_PRECONDITION);
  EXPECT_NE(std::string(stowage_last_error()).find("end_step"), std::string::npos);
  STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));  // the runtime survived the refused destroy
  STOWAGE_ASSERT_OK(stowage_destroy(this->rt_));
  this->rt_ = nullptr;
  STOWAGE_EXPECT_STATUS(stowage_destroy(nullptr), STOWAGE_OK);
}

TYPED_TEST_P(RuntimeConformance, EndStepWithCopiesInFlightDrainsAndFails) {
  ASSERT_EQ(this->Create(MakeTestPlan(2, 1 << 20)), STOWAGE_OK) << stowage_last_error();
  std::vector<uint8_t> pattern;
  void* src = this->DeviceWithPattern(1 << 20, 5, &pattern);
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  std::function<void()> release = this->BlockCopies();
  stowage_tensor_id id = 0;
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 0, src, 1 << 20, nullptr, &id));
  int32_t done = 1;
  STOWAGE_ASSERT_OK(stowage_save_query(this->rt_, id, &done));
  EXPECT_EQ(done, 0);
  // end_step drains, so the copies must be able to finish: release them from another thread.
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    release();
  });
  STOWAGE_EXPECT_STATUS(stowage_end_step(this->rt_), STOWAGE_ERROR_FAILED_PRECONDITION);
  releaser.join();
  EXPECT_NE(std::string(stowage_last_error()).find("still copying"), std::string::npos)
      << stowage_last_error();
  stowage_stats stats;
  STOWAGE_ASSERT_OK(stowage_get_stats(this->rt_, &stats));
  EXPECT_EQ(stats.copies_in_flight, 0u);
  EXPECT_EQ(stats.arena_used_bytes, 0u);
  EXPECT_EQ(stats.steps_completed, 1u);
  // The step was released: the id is gone and the next step works.
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  STOWAGE_EXPECT_STATUS(stowage_save_wait(this->rt_, id), STOWAGE_ERROR_NOT_FOUND);
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 0, src, 1 << 20, nullptr, &id));
  void* dst = this->DeviceAlloc(1 << 20);
  STOWAGE_ASSERT_OK(stowage_restore(this->rt_, id, dst, nullptr));
  this->SyncDevice();
  EXPECT_EQ(this->ReadDevice(dst, 1 << 20), pattern);
  STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
}

TYPED_TEST_P(RuntimeConformance, AnAbandonedStepRetainsNothing) {
  // A trainer exception mid-step: saves and a prefetch made, nothing restored, then end_step.
  ASSERT_EQ(this->Create(MakeTestPlan(3, 8192)), STOWAGE_OK) << stowage_last_error();
  std::vector<uint8_t> pattern;
  void* src = this->DeviceWithPattern(8192, 9, &pattern);
  void* dst = this->DeviceAlloc(8192);
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  stowage_tensor_id ids[3];
  for (int l = 0; l < 3; ++l)
    STOWAGE_ASSERT_OK(stowage_save(this->rt_, l, src, 8192, nullptr, &ids[l]));
  for (int l = 0; l < 3; ++l) STOWAGE_ASSERT_OK(stowage_save_wait(this->rt_, ids[l]));
  STOWAGE_ASSERT_OK(stowage_prefetch(this->rt_, ids[2], dst, nullptr));
  STOWAGE_EXPECT_STATUS(stowage_save(this->rt_, 0, src, 1, nullptr, &ids[0]),
                        STOWAGE_ERROR_RESOURCE_EXHAUSTED);  // an error mid-step too
  this->SyncDevice();
  {
    // Let the prefetch land so end_step has nothing unsynchronised to report.
    auto* r = runtime::UnwrapForTesting(this->rt_);
    ASSERT_TRUE(r->engine().Drain().ok());
  }
  STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
  stowage_stats stats;
  STOWAGE_ASSERT_OK(stowage_get_stats(this->rt_, &stats));
  EXPECT_EQ(stats.arena_used_bytes, 0u);
  EXPECT_EQ(stats.copies_in_flight, 0u);
  EXPECT_EQ(this->rt().arena()->used(), 0u);
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  for (int l = 0; l < 3; ++l) {
    STOWAGE_EXPECT_STATUS(stowage_restore(this->rt_, ids[l], dst, nullptr),
                          STOWAGE_ERROR_NOT_FOUND);
    STOWAGE_ASSERT_OK(stowage_save(this->rt_, l, src, 8192, nullptr, &ids[l]));
    STOWAGE_ASSERT_OK(stowage_restore(this->rt_, ids[l], dst, nullptr));
  }
  STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
}

TYPED_TEST_P(RuntimeConformance, VerifyModeCatchesHostCorruption) {
  ASSERT_EQ(this->Create(MakeTestPlan(3, 1 << 16), /*verify=*/true), STOWAGE_OK)
      << stowage_last_error();
  std::vector<uint8_t> pattern;
  void* src = this->DeviceWithPattern(1 << 16, 11, &pattern);
  void* dst = this->DeviceAlloc(1 << 16);
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  stowage_tensor_id good = 0, bad = 0, bad_prefetched = 0;
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 0, src, 1 << 16, nullptr, &good));
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 1, src, 1 << 16, nullptr, &bad));
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 2, src, 1 << 16, nullptr, &bad_prefetched));
  ASSERT_TRUE(this->rt().CorruptHostCopyForTesting(bad, 12345).ok());
  ASSERT_TRUE(this->rt().CorruptHostCopyForTesting(bad_prefetched, 0).ok());
  STOWAGE_ASSERT_OK(stowage_restore(this->rt_, good, dst, nullptr));
  this->SyncDevice();
  EXPECT_EQ(this->ReadDevice(dst, 1 << 16), pattern);
  ASSERT_TRUE(this->backend().FillDevice(dst, 0, 1 << 16).ok());
  STOWAGE_EXPECT_STATUS(stowage_restore(this->rt_, bad, dst, nullptr), STOWAGE_ERROR_DATA_LOSS);
  EXPECT_NE(std::string(stowage_last_error()).find("checksum"), std::string::npos);
  STOWAGE_EXPECT_STATUS(stowage_restore(this->rt_, bad, dst, nullptr), STOWAGE_ERROR_DATA_LOSS);
  STOWAGE_EXPECT_STATUS(stowage_prefetch(this->rt_, bad_prefetched, dst, nullptr),
                        STOWAGE_ERROR_DATA_LOSS);
  STOWAGE_EXPECT_STATUS(stowage_restore(this->rt_, bad_prefetched, dst, nullptr),
                        STOWAGE_ERROR_DATA_LOSS);
  this->SyncDevice();
  EXPECT_EQ(this->ReadDevice(dst, 1 << 16), std::vector<uint8_t>(1 << 16, 0))
      << "corrupt bytes reached the device";
  STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
}

TYPED_TEST_P(RuntimeConformance, ConcurrentSavesFromSeveralThreads) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 16;
  constexpr size_t kBytes = 3000;
  // One layer per thread, plus one shared layer that exactly fits every thread's extra save.
  Plan plan = MakeTestPlan(kThreads + 1, kPerThread * kBytes);
  plan.layers[kThreads].host_bytes = kThreads * kBytes;
  plan.layers[kThreads].transfers = {{"input", kThreads * kBytes}};
  plan.runtime.host_arena_bytes = (kThreads * kPerThread + kThreads) * kBytes;
  ASSERT_EQ(this->Create(plan), STOWAGE_OK) << stowage_last_error();
  std::vector<std::vector<uint8_t>> patterns(kThreads * kPerThread);
  std::vector<void*> srcs(kThreads * kPerThread);
  for (size_t i = 0; i < srcs.size(); ++i) {
    srcs[i] = this->DeviceWithPattern(kBytes, static_cast<uint32_t>(100 + i), &patterns[i]);
  }
  for (int step = 0; step < 5; ++step) {
    STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
    std::vector<stowage_tensor_id> ids(srcs.size());
    std::atomic<int> failures{0}, shared_ok{0}, shared_exhausted{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int k = 0; k < kPerThread; ++k) {
          const int i = t * kPerThread + k;
          if (stowage_save(this->rt_, t, srcs[i], kBytes, nullptr, &ids[i]) != STOWAGE_OK)
            ++failures;
        }
        // Everyone competes for the shared layer twice; exactly kThreads saves fit.
        for (int k = 0; k < 2; ++k) {
          stowage_tensor_id id;
          const stowage_status s = stowage_save(this->rt_, kThreads, srcs[t], kBytes, nullptr, &id);
          if (s == STOWAGE_OK) {
            ++shared_ok;
            if (stowage_save_wait(this->rt_, id) != STOWAGE_OK) ++failures;
          } else if (s == STOWAGE_ERROR_RESOURCE_EXHAUSTED) {
            ++shared_exhausted;
          } else {
            ++failures;
          }
        }
      });
    }
    for (std::thread& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(shared_ok.load(), kThreads);
    EXPECT_EQ(shared_exhausted.load(), kThreads);
    // Restore concurrently too, each thread someone else's tensors.
    std::vector<void*> dsts(srcs.size());
    for (void*& d : dsts) d = this->DeviceAlloc(kBytes);
    threads.clear();
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        const int owner = (t + 1) % kThreads;
        for (int k = 0; k < kPerThread; ++k) {
          const int i = owner * kPerThread + k;
          if (stowage_restore(this->rt_, ids[i], dsts[i], nullptr) != STOWAGE_OK) ++failures;
        }
      });
    }
    for (std::thread& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
    this->SyncDevice();
    for (size_t i = 0; i < srcs.size(); ++i)
      ASSERT_EQ(this->ReadDevice(dsts[i], kBytes), patterns[i]);
    STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
  }
}

TYPED_TEST_P(RuntimeConformance, ArgumentChecks) {
  ASSERT_EQ(this->Create(MakeTestPlan(1, 4096)), STOWAGE_OK) << stowage_last_error();
  stowage_tensor_id id;
  STOWAGE_EXPECT_STATUS(stowage_begin_step(nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  STOWAGE_EXPECT_STATUS(stowage_get_stats(this->rt_, nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  STOWAGE_EXPECT_STATUS(stowage_save(this->rt_, 0, nullptr, 10, nullptr, &id),
                        STOWAGE_ERROR_INVALID_ARGUMENT);
  void* src = this->DeviceAlloc(16);
  STOWAGE_EXPECT_STATUS(stowage_save(this->rt_, 0, src, 10, nullptr, nullptr),
                        STOWAGE_ERROR_INVALID_ARGUMENT);
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 0, src, 10, nullptr, &id));
  STOWAGE_EXPECT_STATUS(stowage_restore(this->rt_, id, nullptr, nullptr),
                        STOWAGE_ERROR_INVALID_ARGUMENT);
  void* dst = this->DeviceAlloc(16);
  void* other = this->DeviceAlloc(16);
  STOWAGE_ASSERT_OK(stowage_prefetch(this->rt_, id, dst, nullptr));
  STOWAGE_EXPECT_STATUS(stowage_prefetch(this->rt_, id, dst, nullptr),
                        STOWAGE_ERROR_FAILED_PRECONDITION);
  STOWAGE_EXPECT_STATUS(stowage_restore(this->rt_, id, other, nullptr),
                        STOWAGE_ERROR_INVALID_ARGUMENT);
  STOWAGE_ASSERT_OK(stowage_restore(this->rt_, id, dst, nullptr));
  STOWAGE_EXPECT_STATUS(stowage_save_query(this->rt_, id, nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
}

// Regression (the runtime hung forever): after a 1-byte save, a save of SIZE_MAX
// bytes returned OK (saved + bytes and offset + bytes wrapped in Runtime::Save) and the step then
// hung. It is RESOURCE_EXHAUSTED, and the step still ends cleanly.
TYPED_TEST_P(RuntimeConformance, ASaveWhoseSizeWouldWrapIsResourceExhausted) {
  ASSERT_EQ(this->Create(MakeTestPlan(1, 4096)), STOWAGE_OK) << stowage_last_error();
  void* src = this->DeviceAlloc(16);
  void* dst = this->DeviceAlloc(16);
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  stowage_tensor_id one = 0, huge = 0;
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 0, src, 1, nullptr, &one));
  for (size_t bytes : {SIZE_MAX, SIZE_MAX - 255, SIZE_MAX / 2 + 1}) {
    STOWAGE_EXPECT_STATUS(stowage_save(this->rt_, 0, src, bytes, nullptr, &huge),
                          STOWAGE_ERROR_RESOURCE_EXHAUSTED);
    EXPECT_NE(std::string(stowage_last_error()).find("the plan reserved 4096"), std::string::npos)
        << stowage_last_error();
  }
  STOWAGE_ASSERT_OK(stowage_restore(this->rt_, one, dst, nullptr));
  STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
  stowage_layer_info info{};
  info.struct_size = sizeof(info);
  STOWAGE_ASSERT_OK(stowage_get_layer_info(this->rt_, 0, &info));
  EXPECT_EQ(info.host_bytes_used, 0u);
}

// A step runs every microbatch of a pipeline schedule's order (PipelineOrder, the order
// in_flight_microbatches comes from) for one stage, saving two tensors per layer in each forward
// and prefetching and restoring them in each backward; every byte comes back as it went, over
// two steps, with each layer holding only its planned slots (slots are reused after restores).
template <typename Fixture>
void RunPipelineOrder(Fixture* t, const Plan& plan, int stage) {
  const std::string json = PlanToJson(plan);
  stowage_options options = t->Options();
  options.stage = stage;
  ASSERT_EQ(stowage_create(json.data(), json.size(), &options, &t->rt_), STOWAGE_OK)
      << stowage_last_error();
  const StagePlan& st = plan.stages[stage];
  uint64_t planned_slots_bytes = 0;
  for (const LayerRange& c : st.chunks) {
    for (int i = c.first_layer; i < c.end(); ++i) {
      planned_slots_bytes += plan.layers[i].host_bytes * plan.layers[i].in_flight_microbatches;
    }
  }
  const uint64_t bytes = plan.layers[0].host_bytes;
  const size_t first = static_cast<size_t>(bytes / 3);  // two tensors per layer and microbatch
  const std::vector<PipelineOp> order =
      PipelineOrder(plan.schedule, plan.pp, plan.vpp, plan.microbatches, stage);
  ASSERT_EQ(order.size(), size_t{2} * plan.microbatches * plan.vpp);
  // The layer info says how many microbatches each layer of the stage holds at once.
  for (const LayerRange& c : st.chunks) {
    for (int i = c.first_layer; i < c.end(); ++i) {
      stowage_layer_info info{};
      info.struct_size = sizeof(info);
      STOWAGE_ASSERT_OK(stowage_get_layer_info(t->rt_, i, &info));
      EXPECT_EQ(info.in_flight_microbatches, plan.layers[i].in_flight_microbatches) << i;
    }
  }
  STOWAGE_ASSERT_OK(stowage_set_trace_capacity(t->rt_, size_t{1} << 16));
  for (int step = 0; step < 2; ++step) {
    STOWAGE_ASSERT_OK(stowage_begin_step(t->rt_));
    struct Saved {
      stowage_tensor_id ids[2] = {0, 0};
      std::vector<uint8_t> pattern;
      void* src = nullptr;
    };
    std::map<std::pair<int, int>, Saved> saved;  // (layer, microbatch)
    void* dst = t->DeviceAlloc(bytes);
    uint64_t saves = 0;
    for (const PipelineOp& op : order) {
      const LayerRange& chunk = st.chunks[op.chunk];
      if (op.forward) {
        for (int i = chunk.first_layer; i < chunk.end(); ++i) {
          Saved& s = saved[{i, op.microbatch}];
          s.src = t->DeviceWithPattern(
              bytes, static_cast<uint32_t>(step * 100003 + i * 1009 + op.microbatch), &s.pattern);
          const void* srcs[2] = {s.src, static_cast<const uint8_t*>(s.src) + first};
          const size_t sizes[2] = {first, bytes - first};
          STOWAGE_ASSERT_OK(stowage_save_many_microbatch(t->rt_, i, op.microbatch, 2, srcs, sizes,
                                                         nullptr, s.ids, nullptr));
          saves += 2;
        }
        for (int i = chunk.first_layer; i < chunk.end(); ++i) {
          for (stowage_tensor_id id : saved[{i, op.microbatch}].ids) {
            STOWAGE_ASSERT_OK(stowage_save_wait(t->rt_, id));
          }
        }
      } else {
        for (int i = chunk.end() - 1; i >= chunk.first_layer; --i) {
          Saved& s = saved[{i, op.microbatch}];
          void* dsts[2] = {dst, static_cast<uint8_t*>(dst) + first};
          STOWAGE_ASSERT_OK(stowage_prefetch_many_microbatch(t->rt_, op.microbatch, 2, s.ids, dsts,
                                                             nullptr, nullptr));
          for (int k = 0; k < 2; ++k) {
            STOWAGE_ASSERT_OK(
                stowage_restore_microbatch(t->rt_, s.ids[k], op.microbatch, dsts[k], nullptr));
          }
          t->SyncDevice();
          ASSERT_EQ(t->ReadDevice(dst, bytes), s.pattern)
              << "step " << step << " layer " << i << " microbatch " << op.microbatch;
        }
      }
    }
    stowage_stats stats{};
    STOWAGE_ASSERT_OK(stowage_get_stats(t->rt_, &stats));
    EXPECT_EQ(stats.saves_total, (step + 1) * saves);
    EXPECT_EQ(stats.restores_total, (step + 1) * saves);
    // The slots of the stage's layers, never one per microbatch of the step.
    EXPECT_LT(stats.arena_capacity_bytes, planned_slots_bytes + (uint64_t{8} << 20));
    STOWAGE_ASSERT_OK(stowage_end_step(t->rt_));
    // The trace names each event's microbatch: every (layer, microbatch) of the stage saved,
    // waited for, prefetched and restored its two tensors, under its own microbatch.
    size_t count = 0;
    STOWAGE_ASSERT_OK(stowage_get_trace(t->rt_, nullptr, 0, &count, nullptr));
    std::vector<stowage_trace_event> events(count);
    STOWAGE_ASSERT_OK(stowage_get_trace(t->rt_, events.data(), count, &count, nullptr));
    std::map<std::tuple<int, int, int>, int> per_kind;  // (layer, microbatch, kind) -> events
    for (const stowage_trace_event& e : events) ++per_kind[{e.layer, e.microbatch, e.kind}];
    std::map<std::tuple<int, int, int>, int> expected;
    for (const auto& [key, s] : saved) {
      for (int kind = STOWAGE_EVENT_SAVE_ISSUED; kind <= STOWAGE_EVENT_RESTORE; ++kind) {
        expected[{key.first, key.second, kind}] = 2;
      }
    }
    EXPECT_EQ(per_kind, expected) << "step " << step;
    for (void* p : t->device_buffers_) t->backend().FreeDevice(p);
    t->device_buffers_.clear();
  }
  STOWAGE_ASSERT_OK(stowage_destroy(t->rt_));
  t->rt_ = nullptr;
}

TYPED_TEST_P(RuntimeConformance, OneFOneBOrderRoundTripsBitExact) {
  // 4 stages, 8 microbatches: stage 0 holds 4 at once, stage 3 one, each runs all 8.
  const Plan plan = MakePipelinedTestPlan(4, 2, 8, 48 << 10);
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE(stage);
    RunPipelineOrder(this, plan, stage);
  }
}

TYPED_TEST_P(RuntimeConformance, InterleavedOrderRoundTripsBitExact) {
  // 2 stages x 2 chunks, 4 microbatches (a multiple of pp); and 3 x 2 with 6.
  for (const auto& [pp, m] : {std::pair{2, 4}, std::pair{3, 6}}) {
    const Plan plan = MakePipelinedTestPlan(pp, 4, m, 40 << 10, /*vpp=*/2);
    for (int stage = 0; stage < pp; ++stage) {
      SCOPED_TRACE(::testing::Message() << "pp " << pp << " stage " << stage);
      RunPipelineOrder(this, plan, stage);
    }
  }
}

TYPED_TEST_P(RuntimeConformance, GradientAccumulationReusesOneSlot) {
  // pp 1: one slot per layer, 16 microbatches one after another in one step.
  Plan plan = MakeTestPlan(3, 24 << 10);
  plan.microbatches = 16;
  plan.stages.clear();
  RunPipelineOrder(
      this,
      [&] {
        Plan p = plan;
        p.stages = PlanStages(plan);
        return p;
      }(),
      0);
}

// Misused microbatches: each is its own status, naming the layer, the microbatch and the
// planned in-flight count, and the step still ends cleanly.
TYPED_TEST_P(RuntimeConformance, MicrobatchMisuseStatuses) {
  const Plan plan = MakePipelinedTestPlan(2, 1, 4, 4096);  // stage 0 holds 2 microbatches
  ASSERT_EQ(plan.layers[0].in_flight_microbatches, 2);
  ASSERT_EQ(this->Create(plan), STOWAGE_OK) << stowage_last_error();
  void* src = this->DeviceAlloc(4096);
  void* dst = this->DeviceAlloc(4096);
  auto error_has = [](const std::string& what) {
    const std::string error = stowage_last_error();
    EXPECT_NE(error.find(what), std::string::npos) << error << "\n  wanted: " << what;
  };
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  stowage_tensor_id a = 0, b = 0, c = 0;
  // Out of range of run.microbatches.
  STOWAGE_EXPECT_STATUS(stowage_save_microbatch(this->rt_, 0, 4, src, 4096, nullptr, &c),
                        STOWAGE_ERROR_INVALID_ARGUMENT);
  error_has("microbatch 4 of layer 0 is out of range; the plan's run.microbatches is 4");
  STOWAGE_EXPECT_STATUS(stowage_save_microbatch(this->rt_, 0, -1, src, 4096, nullptr, &c),
                        STOWAGE_ERROR_INVALID_ARGUMENT);
  STOWAGE_ASSERT_OK(stowage_save_microbatch(this->rt_, 0, 0, src, 3072, nullptr, &a));
  // Past the plan's bytes for one microbatch.
  STOWAGE_EXPECT_STATUS(stowage_save_microbatch(this->rt_, 0, 0, src, 2048, nullptr, &c),
                        STOWAGE_ERROR_RESOURCE_EXHAUSTED);
  error_has(
      "microbatch 0 of layer 0 would hold 5120 bytes this step but the plan reserved 4096 "
      "per microbatch");
  STOWAGE_ASSERT_OK(stowage_save_microbatch(this->rt_, 0, 1, src, 2048, nullptr, &b));
  // Microbatch 0's saves ended when microbatch 1 saved into the layer: saving it again is a
  // second forward under the same id.
  STOWAGE_EXPECT_STATUS(stowage_save_microbatch(this->rt_, 0, 0, src, 1, nullptr, &c),
                        STOWAGE_ERROR_FAILED_PRECONDITION);
  error_has("microbatch 0 of layer 0 is already saved (3072 bytes, 1 tensor(s)) and not restored");
  error_has("microbatches 0, 1 in flight of the 2 the plan holds");
  stowage_tensor_id b2 = 0, d = 0;
  STOWAGE_ASSERT_OK(stowage_save_microbatch(this->rt_, 0, 1, src, 2048, nullptr, &b2));
  // A third microbatch in flight: the plan holds 2.
  STOWAGE_EXPECT_STATUS(stowage_save_microbatch(this->rt_, 0, 2, src, 4096, nullptr, &c),
                        STOWAGE_ERROR_RESOURCE_EXHAUSTED);
  error_has(
      "microbatch 2 of layer 0 would be one more in flight than planned: microbatches 0, 1 "
      "in flight of the 2 the plan holds (layers[0].in_flight_microbatches)");
  // Restore naming a microbatch that never saved the layer, or another one's id.
  STOWAGE_EXPECT_STATUS(stowage_restore_microbatch(this->rt_, a, 3, dst, nullptr),
                        STOWAGE_ERROR_NOT_FOUND);
  error_has("restore: microbatch 3 of layer 0 was never saved in this step");
  STOWAGE_EXPECT_STATUS(stowage_prefetch_microbatch(this->rt_, a, 3, dst, nullptr),
                        STOWAGE_ERROR_NOT_FOUND);
  STOWAGE_EXPECT_STATUS(stowage_restore_microbatch(this->rt_, a, 1, dst, nullptr),
                        STOWAGE_ERROR_INVALID_ARGUMENT);
  error_has("tensor id");
  error_has("was saved by microbatch 0 of layer 0, not by microbatch 1");
  STOWAGE_EXPECT_STATUS(stowage_restore_microbatch(this->rt_, a, 9, dst, nullptr),
                        STOWAGE_ERROR_INVALID_ARGUMENT);
  // The failed calls changed nothing: microbatch 0 restores and frees its slot for microbatch 2.
  STOWAGE_ASSERT_OK(stowage_restore_microbatch(this->rt_, a, 0, dst, nullptr));
  STOWAGE_ASSERT_OK(stowage_save_microbatch(this->rt_, 0, 2, src, 4096, nullptr, &d));
  // A microbatch restored this step does not save the layer again.
  STOWAGE_EXPECT_STATUS(stowage_save_microbatch(this->rt_, 0, 0, src, 4096, nullptr, &a),
                        STOWAGE_ERROR_FAILED_PRECONDITION);
  error_has("microbatch 0 of layer 0 was already saved and restored in this step");
  // The single-microbatch calls are microbatch 0 (save) and the id's own (restore).
  for (stowage_tensor_id id : {b, b2, d})
    STOWAGE_ASSERT_OK(stowage_restore(this->rt_, id, dst, nullptr));
  STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
  // A new step starts every layer empty.
  STOWAGE_ASSERT_OK(stowage_begin_step(this->rt_));
  STOWAGE_ASSERT_OK(stowage_save(this->rt_, 0, src, 4096, nullptr, &a));
  STOWAGE_ASSERT_OK(stowage_restore(this->rt_, a, dst, nullptr));
  STOWAGE_ASSERT_OK(stowage_end_step(this->rt_));
}

REGISTER_TYPED_TEST_SUITE_P(RuntimeConformance, RoundTripsAreBitExactOverSizes,
                            RandomSizesAndOrdersOverManySteps, ThousandsOfStepsDoNotGrowMemory,
                            StaleUnknownAndDoubleRestore, SavingMoreThanReservedIsResourceExhausted,
                            StepStateMachine, EndStepWithCopiesInFlightDrainsAndFails,
                            AnAbandonedStepRetainsNothing, VerifyModeCatchesHostCorruption,
                            ConcurrentSavesFromSeveralThreads, ArgumentChecks,
                            ASaveWhoseSizeWouldWrapIsResourceExhausted,
                            OneFOneBOrderRoundTripsBitExact, InterleavedOrderRoundTripsBitExact,
                            GradientAccumulationReusesOneSlot, MicrobatchMisuseStatuses);

}  // namespace stowage::testing

#endif  // STOWAGE_TESTS_RUNTIME_RUNTIME_CONFORMANCE_H_
