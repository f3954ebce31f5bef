// The copy-engine suite on the CUDA backend (label `gpu`; skips without a GPU), plus ordering and
// overlap against a running kernel.
#include <gtest/gtest.h>

#include "tests/test_util.h"

#ifdef STOWAGE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "offload/cuda/cuda_backend.h"
#include "tests/offload/copy_engine_suite.h"
#ifdef STOWAGE_HAVE_TEST_KERNELS
#include "tests/offload/spin_kernel.h"
#endif

namespace stowage::testing {
namespace {

struct CudaTraits {
  static std::unique_ptr<offload::DeviceBackend> Make() {
    if (!GpuAvailable()) return nullptr;
    auto backend = offload::CudaBackend::Create(0);
    return backend.ok() ? *std::move(backend) : nullptr;
  }
  static const char* SkipReason() { return "no CUDA GPU"; }
  static void* PinnedHost(size_t bytes) {
    void* p = nullptr;
    return cudaMallocHost(&p, bytes == 0 ? 1 : bytes) == cudaSuccess ? p : nullptr;
  }
  static void FreeHost(void* p) { cudaFreeHost(p); }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, CopyEngineConformance, CudaTraits);

#ifdef STOWAGE_HAVE_TEST_KERNELS
// Enough GPU clocks that the safety net never fires while a test runs (minutes at 2 GHz).
constexpr long long kSafetyCycles = 400'000'000'000LL;

class CudaOrdering : public ::testing::Test {
 protected:
  void SetUp() override {
    STOWAGE_REQUIRE_GPU();
    auto backend = offload::CudaBackend::Create(0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = backend->get();
    engine_ = std::make_unique<offload::CopyEngine>(*std::move(backend),
                                                    offload::CopyEngineOptions{}, nullptr);
    ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&release_), sizeof(int), cudaHostAllocMapped),
              cudaSuccess);
    *release_ = 0;
    ASSERT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&release_device_), release_, 0),
              cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (release_ != nullptr) {
      *const_cast<volatile int*>(release_) = 1;
      cudaDeviceSynchronize();
    }
    engine_.reset();
    if (compute_ != nullptr) cudaStreamDestroy(compute_);
    if (release_ != nullptr) cudaFreeHost(release_);
  }
  void Release() { *const_cast<volatile int*>(release_) = 1; }

  offload::DeviceBackend* backend_ = nullptr;
  std::unique_ptr<offload::CopyEngine> engine_;
  int* release_ = nullptr;
  int* release_device_ = nullptr;
  cudaStream_t compute_ = nullptr;
};

TEST_F(CudaOrdering, D2HWaitsForItsProducer) {
  constexpr size_t kBytes = 1 << 20;
  void* src = *backend_->AllocateDevice(kBytes);
  ASSERT_TRUE(backend_->FillDevice(src, 0, kBytes).ok());
  void* host = nullptr;
  ASSERT_EQ(cudaMallocHost(&host, kBytes), cudaSuccess);
  // Allocate before the kernel runs: allocation calls may synchronise the device.
  void* scratch = *backend_->AllocateDevice(kBytes);
  ASSERT_EQ(LaunchSpinThenFill(compute_, release_device_, kSafetyCycles, static_cast<uint8_t*>(src),
                               kBytes, 0x5c),
            cudaSuccess);
  auto d2h = engine_->DeviceToHost(host, src, kBytes, compute_);
  ASSERT_TRUE(d2h.ok()) << d2h.status();
  // An unrelated copy on the H2D stream completes meanwhile; the D2H must still be waiting.
  auto other = engine_->HostToDevice(scratch, host, kBytes, nullptr, nullptr);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->Wait().ok());
  EXPECT_FALSE((*d2h)->Done()) << "the D2H ran before its producer finished";
  Release();
  ASSERT_TRUE((*d2h)->Wait().ok());
  const auto* bytes = static_cast<const uint8_t*>(host);
  for (size_t i = 0; i < kBytes; i += 4093) ASSERT_EQ(bytes[i], 0x5c) << "offset " << i;
  backend_->FreeDevice(scratch);
  backend_->FreeDevice(src);
  cudaFreeHost(host);
}

TEST_F(CudaOrdering, CopiesOverlapARunningKernel) {
  constexpr size_t kBytes = 64 << 20;
  void* busy = *backend_->AllocateDevice(256);
  void* src = *backend_->AllocateDevice(kBytes);
  void* back = *backend_->AllocateDevice(kBytes);
  void* host = nullptr;
  ASSERT_EQ(cudaMallocHost(&host, kBytes), cudaSuccess);
  cudaStream_t idle = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking), cudaSuccess);
  // Everything is allocated before the kernel runs: allocation calls may synchronise.
  ASSERT_EQ(LaunchSpinThenFill(compute_, release_device_, kSafetyCycles,
                               static_cast<uint8_t*>(busy), 256, 1),
            cudaSuccess);
  cudaEvent_t kernel_done = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&kernel_done, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(kernel_done, compute_), cudaSuccess);
  // Both directions at once, ordered after an idle stream, while the kernel holds its SM.
  auto d2h = engine_->DeviceToHost(host, src, kBytes, idle);
  auto h2d = engine_->HostToDevice(back, host, kBytes, idle, *d2h);
  ASSERT_TRUE(d2h.ok() && h2d.ok());
  ASSERT_TRUE((*h2d)->Wait().ok());
  EXPECT_EQ(cudaEventQuery(kernel_done), cudaErrorNotReady)
      << "the kernel finished before the copies; they did not overlap it";
  Release();
  ASSERT_EQ(cudaEventSynchronize(kernel_done), cudaSuccess);
  cudaEventDestroy(kernel_done);
  cudaStreamDestroy(idle);
  backend_->FreeDevice(src);
  backend_->FreeDevice(back);
  backend_->FreeDevice(busy);
  cudaFreeHost(host);
}
#endif  // STOWAGE_HAVE_TEST_KERNELS

}  // namespace
}  // namespace stowage::testing

#else  // !STOWAGE_HAVE_CUDA

TEST(CudaCopyEngine, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif  // STOWAGE_HAVE_CUDA
