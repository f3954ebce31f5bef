// The copy-engine conformance suite: the ordering contract of Note [Copy ordering]
// (offload/device_backend.h) and the engine's accounting, for every backend. Instantiated for the
// host backend in copy_engine_test.cc and for CUDA in copy_engine_gpu_test.cc (label `gpu`).
#ifndef STOWAGE_TESTS_OFFLOAD_COPY_ENGINE_SUITE_H_
#define STOWAGE_TESTS_OFFLOAD_COPY_ENGINE_SUITE_H_

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "offload/copy_engine.h"
#include "offload/device_backend.h"

namespace stowage::testing {

// Counts what the engine reports; checks every copy lands exactly once.
class CountingObserver : public offload::CopyObserver {
 public:
  void OnCopyIssued(offload::CopyDirection d, uint64_t bytes) override {
    issued[static_cast<int>(d)] += 1;
    issued_bytes[static_cast<int>(d)] += bytes;
  }
  void OnCopyLanded(offload::CopyDirection d, uint64_t bytes, double busy) override {
    landed[static_cast<int>(d)] += 1;
    landed_bytes[static_cast<int>(d)] += bytes;
    if (busy < 0) negative_busy = true;
  }
  std::atomic<uint64_t> issued[2] = {0, 0}, issued_bytes[2] = {0, 0};
  std::atomic<uint64_t> landed[2] = {0, 0}, landed_bytes[2] = {0, 0};
  std::atomic<bool> negative_busy{false};
};

// Traits: static std::unique_ptr<offload::DeviceBackend> Make() (null: skip, with a reason in
// SkipReason()); static void* PinnedHost(size_t) / FreeHost(void*) for the host side.
template <typename Traits>
class CopyEngineConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    std::unique_ptr<offload::DeviceBackend> backend = Traits::Make();
    if (backend == nullptr) GTEST_SKIP() << Traits::SkipReason();
    offload::CopyEngineOptions options;
    options.chunk_bytes = 4096 + 3;  // odd on purpose: chunk edges inside words
    backend_ = backend.get();
    engine_ = std::make_unique<offload::CopyEngine>(std::move(backend), options, &observer_);
  }
  void TearDown() override {
    if (engine_ != nullptr) {
      EXPECT_TRUE(engine_->Drain().ok());
    }
    for (void* p : device_) backend_->FreeDevice(p);
    for (void* p : host_) Traits::FreeHost(p);
    engine_.reset();
  }
  void* Device(size_t bytes) {
    void* p = *backend_->AllocateDevice(bytes);
    device_.push_back(p);
    return p;
  }
  void* Host(size_t bytes) {
    void* p = Traits::PinnedHost(bytes);
    host_.push_back(p);
    return p;
  }
  static std::vector<uint8_t> Pattern(size_t bytes, uint32_t seed) {
    std::vector<uint8_t> v(bytes);
    std::mt19937 rng(seed);
    for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
    return v;
  }

  CountingObserver observer_;
  offload::DeviceBackend* backend_ = nullptr;
  std::unique_ptr<offload::CopyEngine> engine_;
  std::vector<void*> device_, host_;
};

TYPED_TEST_SUITE_P(CopyEngineConformance);

TYPED_TEST_P(CopyEngineConformance, ChunkedRoundTripIsBitExact) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4099}, size_t{4096 + 3}, size_t{1 << 20},
                       size_t{(5 << 20) + 17}}) {
    const std::vector<uint8_t> pattern = this->Pattern(bytes, static_cast<uint32_t>(bytes));
    void* src = this->Device(bytes);
    void* back = this->Device(bytes);
    void* host = this->Host(bytes);
    ASSERT_TRUE(this->backend_->CopyToDevice(src, pattern.data(), bytes).ok());
    auto d2h = this->engine_->DeviceToHost(host, src, bytes, nullptr);
    ASSERT_TRUE(d2h.ok()) << d2h.status();
    // Issued at once, with only the dependency to order it after the D2H.
    auto h2d = this->engine_->HostToDevice(back, host, bytes, nullptr, *d2h);
    ASSERT_TRUE(h2d.ok()) << h2d.status();
    ASSERT_TRUE((*h2d)->Wait().ok());
    EXPECT_TRUE((*d2h)->Done());
    std::vector<uint8_t> out(bytes);
    ASSERT_TRUE(this->backend_->CopyFromDevice(out.data(), back, bytes).ok());
    EXPECT_EQ(out, pattern) << bytes << " bytes";
  }
}

TYPED_TEST_P(CopyEngineConformance, EveryCopyIsAccountedOnce) {
  constexpr size_t kBytes = 10000;
  void* src = this->Device(kBytes);
  void* host = this->Host(kBytes);
  for (int i = 0; i < 20; ++i) {
    auto d2h = this->engine_->DeviceToHost(host, src, kBytes, nullptr);
    ASSERT_TRUE(d2h.ok());
    auto h2d = this->engine_->HostToDevice(src, host, kBytes, nullptr, *d2h);
    ASSERT_TRUE(h2d.ok());
    if (i % 3 == 0) {
      ASSERT_TRUE((*h2d)->Wait().ok());
    }
    this->engine_->Reap();
  }
  ASSERT_TRUE(this->engine_->Drain().ok());
  EXPECT_EQ(this->engine_->in_flight(), 0u);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(this->observer_.issued[d].load(), 20u);
    EXPECT_EQ(this->observer_.landed[d].load(), 20u);
    EXPECT_EQ(this->observer_.landed_bytes[d].load(), 20u * kBytes);
  }
  EXPECT_FALSE(this->observer_.negative_busy.load());
}

TYPED_TEST_P(CopyEngineConformance, OnLandedRunsBeforeDone) {
  constexpr size_t kBytes = 1 << 20;
  const std::vector<uint8_t> pattern = this->Pattern(kBytes, 3);
  void* src = this->Device(kBytes);
  void* host = this->Host(kBytes);
  ASSERT_TRUE(this->backend_->CopyToDevice(src, pattern.data(), kBytes).ok());
  auto seen = std::make_shared<std::atomic<int>>(0);
  auto first_byte = std::make_shared<std::atomic<int>>(-1);
  auto d2h = this->engine_->DeviceToHost(host, src, kBytes, nullptr, [seen, first_byte, host] {
    first_byte->store(*static_cast<uint8_t*>(host));  // the bytes are there already
    seen->fetch_add(1);
  });
  ASSERT_TRUE(d2h.ok());
  ASSERT_TRUE((*d2h)->Wait().ok());
  EXPECT_EQ(seen->load(), 1);
  EXPECT_EQ(first_byte->load(), pattern[0]);
}

TYPED_TEST_P(CopyEngineConformance, ConcurrentIssuersRoundTrip) {
  constexpr int kThreads = 4;
  constexpr size_t kBytes = 50000;
  std::vector<std::vector<uint8_t>> patterns;
  std::vector<void*> src, host, back;
  for (int t = 0; t < kThreads; ++t) {
    patterns.push_back(this->Pattern(kBytes, 100 + t));
    src.push_back(this->Device(kBytes));
    back.push_back(this->Device(kBytes));
    host.push_back(this->Host(kBytes));
    ASSERT_TRUE(this->backend_->CopyToDevice(src[t], patterns[t].data(), kBytes).ok());
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        auto d2h = this->engine_->DeviceToHost(host[t], src[t], kBytes, nullptr);
        if (!d2h.ok()) {
          ++failures;
          return;
        }
        auto h2d = this->engine_->HostToDevice(back[t], host[t], kBytes, nullptr, *d2h);
        if (!h2d.ok() || !(*h2d)->Wait().ok()) ++failures;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (int t = 0; t < kThreads; ++t) {
    std::vector<uint8_t> out(kBytes);
    ASSERT_TRUE(this->backend_->CopyFromDevice(out.data(), back[t], kBytes).ok());
    EXPECT_EQ(out, patterns[t]);
  }
}

TYPED_TEST_P(CopyEngineConformance, NullPointersAreInvalidArgument) {
  auto d2h = this->engine_->DeviceToHost(nullptr, this->Device(8), 8, nullptr);
  EXPECT_EQ(d2h.status().code(), absl::StatusCode::kInvalidArgument);
  auto h2d = this->engine_->HostToDevice(this->Device(8), nullptr, 8, nullptr, nullptr);
  EXPECT_EQ(h2d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(this->engine_->in_flight(), 0u);
}

// Regression (the runtime hung forever): a chunk size of SIZE_MAX (a plan's
// copy_chunk_bytes of -1 read as 2^64-1) made the host backend's chunk count
// (bytes + chunk - 1) / chunk wrap to 0, so the copy was never queued and its fence never done.
// Any chunk size at or above the copy's size is one chunk.
TYPED_TEST_P(CopyEngineConformance, AChunkSizeNearSizeMaxIsOneChunk) {
  constexpr size_t kBytes = 8192 + 5;
  for (size_t chunk : {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX / 2 + 1, kBytes, kBytes - 1}) {
    offload::CopyEngineOptions options;
    options.chunk_bytes = chunk;
    std::unique_ptr<offload::DeviceBackend> backend = TypeParam::Make();
    offload::DeviceBackend* raw = backend.get();
    offload::CopyEngine engine(std::move(backend), options, nullptr);
    const std::vector<uint8_t> pattern = this->Pattern(kBytes, 7);
    void* src = *raw->AllocateDevice(kBytes);
    void* back = *raw->AllocateDevice(kBytes);
    void* host = this->Host(kBytes);
    ASSERT_TRUE(raw->CopyToDevice(src, pattern.data(), kBytes).ok());
    auto d2h = engine.DeviceToHost(host, src, kBytes, nullptr);
    ASSERT_TRUE(d2h.ok()) << d2h.status();
    auto h2d = engine.HostToDevice(back, host, kBytes, nullptr, *d2h);
    ASSERT_TRUE(h2d.ok()) << h2d.status();
    ASSERT_TRUE((*h2d)->Wait().ok());
    std::vector<uint8_t> out(kBytes);
    ASSERT_TRUE(raw->CopyFromDevice(out.data(), back, kBytes).ok());
    EXPECT_EQ(out, pattern) << "chunk " << chunk;
    raw->FreeDevice(src);
    raw->FreeDevice(back);
  }
}

REGISTER_TYPED_TEST_SUITE_P(CopyEngineConformance, ChunkedRoundTripIsBitExact,
                            EveryCopyIsAccountedOnce, OnLandedRunsBeforeDone,
                            ConcurrentIssuersRoundTrip, NullPointersAreInvalidArgument,
                            AChunkSizeNearSizeMaxIsOneChunk);

}  // namespace stowage::testing

#endif  // STOWAGE_TESTS_OFFLOAD_COPY_ENGINE_SUITE_H_
