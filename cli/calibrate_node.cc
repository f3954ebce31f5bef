// `stowage calibrate`'s node measurements (cli/calibrate_node.h): every local GPU copying at once,
// and NCCL's all-to-all, all-gather and reduce-scatter among them (NCCL opened at run time:
// offload/cuda/nccl_api.h).
#include "cli/calibrate_node.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "cli/calibrate_copies.h"
#include "offload/cuda/cuda_handles.h"
#include "offload/cuda/cuda_status.h"
#include "offload/pinned_arena.h"
#include "offload/topology.h"
#include "planner/hardware/hardware.h"

#ifdef STOWAGE_HAVE_NCCL
#include <nccl.h>

#include "offload/cuda/nccl_api.h"
#endif

namespace stowage::tools::calibrate {
namespace {

// Every local GPU copying `chunk`-sized pieces at once, D2H and then H2D, each into a pinned
// arena on its own NUMA node: all ranks of a node run the same schedule, so this is what each
// rank's copies get. Writes gpus_per_host_link (the GPUs measured together) and
// host_link_bytes_per_second (their summed rate, the slower direction), which the planner
// divides among them (HardwareProfile::SharedHostLinkRate).
absl::Status MeasureSharedHostLink(int gpus, uint64_t chunk, planner::HardwareProfile& profile,
                                   std::FILE* report) {
  profile.gpus_per_node = gpus;
  if (gpus < 2) {
    profile.gpus_per_host_link = 1;
    profile.host_link_bytes_per_second = 0;
    std::fprintf(report, "host link, every GPU copying at once: one GPU here, nothing shared\n");
    return absl::OkStatus();
  }
  struct Lane {
    double d2h = 0, h2d = 0;
    absl::Status status;
  };
  std::vector<Lane> lanes(gpus);
  std::barrier sync(gpus);
  auto run = [&](int device) {
    Lane& lane = lanes[device];
    // Every lane reaches every barrier, failed or not, so none waits forever.
    auto fail = [&](absl::Status s) {
      if (lane.status.ok()) lane.status = std::move(s);
    };
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      fail(absl::InternalError(
          absl::StrCat("cudaSetDevice(", device, "): ", cudaGetErrorString(e))));
    }
    absl::StatusOr<offload::Placement> placement = offload::DiscoverGpuPlacement(device);
    offload::ArenaOptions options;
    options.bytes = chunk;
    options.numa_node = placement.ok() ? placement->numa_node : -1;
    if (placement.ok()) options.touch_cpus = placement->cpus;
    options.register_with_cuda = true;
    options.cuda_device = device;
    absl::StatusOr<std::unique_ptr<offload::PinnedArena>> arena =
        lane.status.ok() ? offload::PinnedArena::Create(options)
                         : absl::StatusOr<std::unique_ptr<offload::PinnedArena>>(lane.status);
    if (!arena.ok()) fail(arena.status());
    absl::StatusOr<offload::DeviceBuffer> dev =
        lane.status.ok() ? offload::DeviceBuffer::Create(device, chunk)
                         : absl::StatusOr<offload::DeviceBuffer>(lane.status);
    if (!dev.ok()) fail(dev.status());
    offload::Stream stream;
    if (lane.status.ok()) {
      if (absl::Status st = stream.Init(device); !st.ok()) fail(st);
    }
    for (bool d2h : {true, false}) {
      sync.arrive_and_wait();
      if (!lane.status.ok()) continue;
      absl::StatusOr<double> rate =
          d2h ? TimeCopies((*arena)->base(), dev->get(), chunk, cudaMemcpyDeviceToHost,
                           stream.get(), PinnedReps(chunk))
              : TimeCopies(dev->get(), (*arena)->base(), chunk, cudaMemcpyHostToDevice,
                           stream.get(), PinnedReps(chunk));
      if (!rate.ok()) {
        fail(rate.status());
      } else {
        (d2h ? lane.d2h : lane.h2d) = *rate;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int d = 0; d < gpus; ++d) threads.emplace_back(run, d);
  for (std::thread& t : threads) t.join();
  double d2h = 0, h2d = 0;
  std::string each;
  for (int d = 0; d < gpus; ++d) {
    if (!lanes[d].status.ok()) return lanes[d].status;
    d2h += lanes[d].d2h;
    h2d += lanes[d].h2d;
    absl::StrAppend(&each, each.empty() ? "" : ", ", d, ": ", Gbps(lanes[d].d2h), "/",
                    Gbps(lanes[d].h2d));
  }
  profile.gpus_per_host_link = gpus;
  profile.host_link_bytes_per_second = std::min(d2h, h2d);
  std::fprintf(report,
               "host link, every GPU copying at once (%s chunks): D2H %s GB/s, H2D %s GB/s in "
               "all over %d GPUs (D2H/H2D each: %s)\n",
               FormatBytesExact(chunk).c_str(), Gbps(d2h).c_str(), Gbps(h2d).c_str(), gpus,
               each.c_str());
  return absl::OkStatus();
}

#ifdef STOWAGE_HAVE_NCCL

using offload::NcclApi;
using offload::NcclClique;

// nccl-tests' bus bandwidth (doc/PERFORMANCE.md) of all-to-all, all-gather and reduce-scatter
// among the `gpus` local GPUs, `per_rank` bytes from each: busBw = size x (n-1)/n / time, size
// being the all-gather's output, the reduce-scatter's input, and what one rank sends in the
// all-to-all — the `bytes` of planner::CollectiveSeconds.
absl::Status MeasureNccl(int gpus, uint64_t per_rank, planner::HardwareProfile& profile,
                         std::FILE* report) {
  absl::StatusOr<std::unique_ptr<NcclApi>> opened = NcclApi::Open();
  if (!opened.ok()) {
    std::fprintf(report,
                 "NCCL: %s: the collective rates stay absent and the model uses --base's "
                 "datasheet NVLink rate (%s GB/s)\n",
                 std::string(opened.status().message()).c_str(),
                 Gbps(profile.nvlink_bytes_per_second).c_str());
    return absl::OkStatus();
  }
  const NcclApi& nccl = **opened;
  NcclClique clique(nccl);
  if (absl::Status s = clique.Init(gpus); !s.ok()) return s;
  std::vector<offload::DeviceBuffer> send, recv;
  std::vector<offload::Stream> streams(gpus);
  const uint64_t total = per_rank * static_cast<uint64_t>(gpus);
  for (int d = 0; d < gpus; ++d) {
    // Buffers and streams are made on the current device.
    STOWAGE_CUDA_RETURN_IF_ERROR(cudaSetDevice(d), absl::StrCat("cudaSetDevice(", d, ")"));
    absl::StatusOr<offload::DeviceBuffer> a = offload::DeviceBuffer::Create(d, total);
    if (!a.ok()) return a.status();
    absl::StatusOr<offload::DeviceBuffer> b = offload::DeviceBuffer::Create(d, total);
    if (!b.ok()) return b.status();
    send.push_back(*std::move(a));
    recv.push_back(*std::move(b));
    if (absl::Status s = streams[d].Init(d); !s.ok()) return s;
  }
  auto launch = [&](int op) -> absl::Status {
    if (absl::Status s = nccl.Ok(nccl.group_start(), "ncclGroupStart"); !s.ok()) return s;
    absl::Status status;
    for (int d = 0; d < gpus && status.ok(); ++d) {
      std::byte* in = send[d].get();
      std::byte* out = recv[d].get();
      if (op == 0) {
        for (int peer = 0; peer < gpus && status.ok(); ++peer) {
          status = nccl.Ok(nccl.send(in + peer * per_rank, per_rank, ncclInt8, peer, clique[d],
                                     streams[d].get()),
                           "ncclSend");
          if (status.ok()) {
            status = nccl.Ok(nccl.recv(out + peer * per_rank, per_rank, ncclInt8, peer, clique[d],
                                       streams[d].get()),
                             "ncclRecv");
          }
        }
      } else if (op == 1) {
        status = nccl.Ok(nccl.all_gather(in, out, per_rank, ncclInt8, clique[d], streams[d].get()),
                         "ncclAllGather");
      } else {
        status = nccl.Ok(nccl.reduce_scatter(in, out, per_rank / sizeof(float), ncclFloat, ncclSum,
                                             clique[d], streams[d].get()),
                         "ncclReduceScatter");
      }
    }
    absl::Status end = nccl.Ok(nccl.group_end(), "ncclGroupEnd");
    return status.ok() ? end : status;
  };
  auto sync_all = [&]() -> absl::Status {
    for (int d = 0; d < gpus; ++d) {
      STOWAGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(streams[d].get()),
                                   absl::StrCat("cudaStreamSynchronize(device ", d, ")"));
    }
    return absl::OkStatus();
  };
  constexpr int kWarmUp = 2, kReps = 10;
  const char* names[] = {"all-to-all", "all-gather", "reduce-scatter"};
  double* fields[] = {&profile.all_to_all_bytes_per_second, &profile.all_gather_bytes_per_second,
                      &profile.reduce_scatter_bytes_per_second};
  for (int op = 0; op < 3; ++op) {
    for (int i = 0; i < kWarmUp; ++i) {
      if (absl::Status s = launch(op); !s.ok()) return s;
    }
    if (absl::Status s = sync_all(); !s.ok()) return s;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kReps; ++i) {
      if (absl::Status s = launch(op); !s.ok()) return s;
    }
    if (absl::Status s = sync_all(); !s.ok()) return s;
    const double seconds = Seconds(start) / kReps;
    const double bus = static_cast<double>(total) * (gpus - 1) / gpus / seconds;
    *fields[op] = bus;
    std::fprintf(report, "NCCL %-14s %d GPUs, %s per rank: %.3f ms, bus bandwidth %s GB/s\n",
                 names[op], gpus, FormatBytesExact(per_rank).c_str(), seconds * 1e3,
                 Gbps(bus).c_str());
  }
  return absl::OkStatus();
}

#endif  // STOWAGE_HAVE_NCCL

}  // namespace

absl::Status MeasureNode(const CalibrateSettings& s, planner::HardwareProfile& profile,
                         std::FILE* report) {
  int gpus = 0;
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
  if (absl::Status st = MeasureSharedHostLink(gpus, s.max_chunk, profile, report); !st.ok()) {
    return st;
  }
  if (gpus < 2) {
    std::fprintf(report,
                 "NCCL: one GPU here, no collective to measure: the all-to-all, all-gather and "
                 "reduce-scatter rates stay absent and the model uses --base's datasheet NVLink "
                 "rate (%s GB/s)\n",
                 Gbps(profile.nvlink_bytes_per_second).c_str());
    return absl::OkStatus();
  }
#ifdef STOWAGE_HAVE_NCCL
  return MeasureNccl(gpus, s.max_chunk, profile, report);
#else
  std::fprintf(report,
               "NCCL: this stowage was built without NCCL (not found at configure): the "
               "collective rates stay absent and the model uses --base's datasheet NVLink rate "
               "(%s GB/s)\n",
               Gbps(profile.nvlink_bytes_per_second).c_str());
  return absl::OkStatus();
#endif
}

}  // namespace stowage::tools::calibrate
