// The arena with cudaHostRegister on a real GPU: registration, copies at pinned speed and bit
// exact, registration pieces, teardown, and the topology of the device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "offload/host_memory.h"
#include "offload/pinned_arena.h"
#include "offload/topology.h"
#include "tests/test_util.h"

#ifdef STOWAGE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace stowage::offload {
namespace {

#ifdef STOWAGE_HAVE_CUDA

constexpr uint64_t kMiB = uint64_t{1} << 20;

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

bool IsRegistered(const void* p) {
  unsigned int flags = 0;
  return cudaHostGetFlags(&flags, const_cast<void*>(p)) == cudaSuccess;
}

TEST(PinnedArenaGpu, GpuPlacementIsKnown) {
  STOWAGE_REQUIRE_GPU();
  absl::StatusOr<Placement> placement = DiscoverGpuPlacement(0);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_FALSE(placement->pci_bus_id.empty());
  EXPECT_FALSE(placement->cpus.empty());
  EXPECT_GE(placement->gpus_sharing_node, 1);
  const MachineNodes machine = ReadSysfsNodes("/sys");
  if (!machine.nodes.empty() && machine.nodes.size() == 1) {
    EXPECT_EQ(placement->numa_node, machine.nodes[0].id) << placement->ToString();
  }
  std::printf("GPU 0 placement: %s\n", placement->ToString().c_str());
}

TEST(PinnedArenaGpu, RegisteredCopiesRoundTripBitExact) {
  STOWAGE_REQUIRE_GPU();
  absl::StatusOr<Placement> placement = DiscoverGpuPlacement(0);
  ASSERT_TRUE(placement.ok()) << placement.status();
  ArenaOptions options;
  options.bytes = 256 * kMiB + 4096 + 1;
  options.numa_node = placement->numa_node;
  options.touch_cpus = placement->cpus;
  options.register_with_cuda = true;
  absl::StatusOr<std::unique_ptr<PinnedArena>> arena = PinnedArena::Create(options);
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_TRUE((*arena)->cuda_registered());
  EXPECT_EQ((*arena)->setup_stats().register_pieces, 1);
  EXPECT_TRUE(IsRegistered((*arena)->base()));
  EXPECT_TRUE(IsRegistered((*arena)->base() + (*arena)->capacity() - 1));
  absl::StatusOr<uint64_t> resident =
      ResidentBytesOfMapping((*arena)->base(), (*arena)->capacity());
  ASSERT_TRUE(resident.ok()) << resident.status();
  EXPECT_LE(static_cast<double>(*resident), 1.01 * static_cast<double>(options.bytes));

  const uint64_t bytes = 64 * kMiB + 3;
  absl::StatusOr<std::byte*> out = (*arena)->Allocate(bytes);
  absl::StatusOr<std::byte*> in = (*arena)->Allocate(bytes);
  ASSERT_TRUE(out.ok() && in.ok());
  std::mt19937_64 rng(42);
  for (uint64_t i = 0; i < bytes; ++i) (*out)[i] = static_cast<std::byte>(rng());
  void* device = nullptr;
  ASSERT_CUDA(cudaMalloc(&device, bytes));
  cudaStream_t stream = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSERT_CUDA(cudaMemcpyAsync(device, *out, bytes, cudaMemcpyHostToDevice, stream));
  ASSERT_CUDA(cudaMemcpyAsync(*in, device, bytes, cudaMemcpyDeviceToHost, stream));
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(std::memcmp(*out, *in, bytes), 0);
  ASSERT_CUDA(cudaStreamDestroy(stream));
  ASSERT_CUDA(cudaFree(device));

  std::byte* base = (*arena)->base();
  arena->reset();  // unregisters and unmaps
  EXPECT_FALSE(IsRegistered(base));
}

TEST(PinnedArenaGpu, PiecesRegisterInParallelAndAllocationsNeverStraddle) {
  STOWAGE_REQUIRE_GPU();
  ArenaOptions options;
  options.bytes = 64 * kMiB;
  options.register_with_cuda = true;
  options.register_piece_bytes = 16 * kMiB;
  absl::StatusOr<std::unique_ptr<PinnedArena>> arena = PinnedArena::Create(options);
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_EQ((*arena)->setup_stats().register_pieces, 4);
  EXPECT_THAT((*arena)->registration_piece_offsets(),
              ::testing::ElementsAre(0, 16 * kMiB, 32 * kMiB, 48 * kMiB));
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<std::byte*> p = (*arena)->Allocate(10 * kMiB);
    ASSERT_TRUE(p.ok()) << p.status();
    const uint64_t offset = static_cast<uint64_t>(*p - (*arena)->base());
    EXPECT_EQ(offset / (16 * kMiB), (offset + 10 * kMiB - 1) / (16 * kMiB)) << offset;
  }
  EXPECT_EQ((*arena)->Allocate(17 * kMiB).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(PinnedArenaGpu, MissingDeviceFailsBeforeMapping) {
  STOWAGE_REQUIRE_GPU();
  ArenaOptions options;
  options.bytes = kMiB;
  options.register_with_cuda = true;
  options.cuda_device = 4096;
  EXPECT_EQ(PinnedArena::Create(options).status().code(), absl::StatusCode::kUnavailable);
}

TEST(PinnedArenaGpu, RepeatedCreateDestroyLeavesNothingRegistered) {
  STOWAGE_REQUIRE_GPU();
  for (int i = 0; i < 5; ++i) {
    ArenaOptions options;
    options.bytes = 32 * kMiB + static_cast<uint64_t>(i) * 4096;
    options.register_with_cuda = true;
    absl::StatusOr<std::unique_ptr<PinnedArena>> arena = PinnedArena::Create(options);
    ASSERT_TRUE(arena.ok()) << arena.status();
    std::byte* base = (*arena)->base();
    arena->reset();
    EXPECT_FALSE(IsRegistered(base));
  }
}

// Not a timed assertion: prints the setup rate next to cudaMallocHost for the record.
TEST(PinnedArenaGpu, PrintsSetupRateAgainstCudaMallocHost) {
  STOWAGE_REQUIRE_GPU();
  absl::StatusOr<Placement> placement = DiscoverGpuPlacement(0);
  ASSERT_TRUE(placement.ok()) << placement.status();
  ArenaOptions options;
  options.bytes = 1024 * kMiB;
  options.numa_node = placement->numa_node;
  options.touch_cpus = placement->cpus;
  options.register_with_cuda = true;
  absl::StatusOr<std::unique_ptr<PinnedArena>> arena = PinnedArena::Create(options);
  ASSERT_TRUE(arena.ok()) << arena.status();
  const ArenaSetupStats& s = (*arena)->setup_stats();
  std::printf("arena 1 GiB: %.3f s (touch %.3f s, %d threads; register %.3f s)\n", s.total_seconds,
              s.touch_seconds, s.touch_threads, s.register_seconds);
}

#else

TEST(PinnedArenaGpu, NeedsTheCudaBackend) { STOWAGE_REQUIRE_GPU(); }

#endif  // STOWAGE_HAVE_CUDA

}  // namespace
}  // namespace stowage::offload
