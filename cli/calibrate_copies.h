// Timed host<->device copies for `stowage calibrate` (CUDA events), the repetition counts they
// run, and the GB/s the table prints. CUDA only: included from calibrate sources built with the
// CUDA backend.
#ifndef STOWAGE_CLI_CALIBRATE_COPIES_H_
#define STOWAGE_CLI_CALIBRATE_COPIES_H_

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace stowage::tools::calibrate {

// Seconds since `start`.
double Seconds(std::chrono::steady_clock::time_point start);

// Copies `reps` times on `stream` after one warm-up; returns bytes per second (event-timed).
absl::StatusOr<double> TimeCopies(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind,
                                  cudaStream_t stream, int reps);

// Repetitions of a `chunk`-sized copy: to or from pinned memory, and to or from pageable memory.
int PinnedReps(uint64_t chunk);
int PageableReps(uint64_t chunk);

// Bytes per second as GB/s (1e9 bytes), one decimal.
std::string Gbps(double bytes_per_second);

struct BidirResult {
  double d2h = 0;
  double h2d = 0;
};

// Both directions at once on two streams, `reps` chunks each, started together.
absl::StatusOr<BidirResult> TimeBidirectional(std::byte* host_out, std::byte* host_in,
                                              std::byte* dev_a, std::byte* dev_b, uint64_t chunk,
                                              int reps);

}  // namespace stowage::tools::calibrate

#endif  // STOWAGE_CLI_CALIBRATE_COPIES_H_
