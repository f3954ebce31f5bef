// Timed copies for `stowage calibrate` (cli/calibrate_copies.h).
#include "cli/calibrate_copies.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/bytes.h"
#include "offload/cuda/cuda_handles.h"
#include "offload/cuda/cuda_status.h"

namespace stowage::tools::calibrate {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::StatusOr<double> TimeCopies(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind,
                                  cudaStream_t stream, int reps) {
  offload::Event start;
  offload::Event stop;
  if (absl::Status s = start.Init(/*timing=*/true); !s.ok()) return s;
  if (absl::Status s = stop.Init(/*timing=*/true); !s.ok()) return s;
  const std::string what = absl::StrCat("cudaMemcpyAsync(", bytes, " bytes)");
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, stream), what);
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), stream), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) {
    STOWAGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, stream), what);
  }
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), stream), "cudaEventRecord");
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
  float ms = 0;
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), stop.get()),
                               "cudaEventElapsedTime");
  return static_cast<double>(bytes) * reps / (ms * 1e-3);
}

int PinnedReps(uint64_t chunk) {
  return static_cast<int>(std::clamp<uint64_t>((2 * kGiB) / chunk, 4, 400));
}
int PageableReps(uint64_t chunk) {
  return static_cast<int>(std::clamp<uint64_t>((512 * kMiB) / chunk, 2, 32));
}

std::string Gbps(double bytes_per_second) {
  return absl::StrFormat("%.1f", bytes_per_second / 1e9);
}

absl::StatusOr<BidirResult> TimeBidirectional(std::byte* host_out, std::byte* host_in,
                                              std::byte* dev_a, std::byte* dev_b, uint64_t chunk,
                                              int reps) {
  offload::Stream d2h;
  offload::Stream h2d;
  offload::Event start;
  offload::Event d2h_done;
  offload::Event h2d_done;
  int device = 0;
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice");
  for (absl::Status s : {d2h.Init(device), h2d.Init(device), start.Init(true), d2h_done.Init(true),
                         h2d_done.Init(true)}) {
    if (!s.ok()) return s;
  }
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), d2h.get()), "cudaEventRecord");
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(h2d.get(), start.get(), 0),
                               "cudaStreamWaitEvent");
  for (int i = 0; i < reps; ++i) {
    STOWAGE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host_out, dev_a, chunk, cudaMemcpyDeviceToHost, d2h.get()),
        "cudaMemcpyAsync(D2H)");
    STOWAGE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dev_b, host_in, chunk, cudaMemcpyHostToDevice, h2d.get()),
        "cudaMemcpyAsync(H2D)");
  }
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventRecord(d2h_done.get(), d2h.get()), "cudaEventRecord");
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventRecord(h2d_done.get(), h2d.get()), "cudaEventRecord");
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  float d2h_ms = 0;
  float h2d_ms = 0;
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&d2h_ms, start.get(), d2h_done.get()),
                               "cudaEventElapsedTime");
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&h2d_ms, start.get(), h2d_done.get()),
                               "cudaEventElapsedTime");
  const double bytes = static_cast<double>(chunk) * reps;
  return BidirResult{bytes / (d2h_ms * 1e-3), bytes / (h2d_ms * 1e-3)};
}

}  // namespace stowage::tools::calibrate
