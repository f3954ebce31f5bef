// One `stowage calibrate` run (Measure, cli/calibrate.h): the device and its NUMA placement, the
// compute rates (calibrate_compute.cc), the pinning rate (arena setup against cudaMallocHost),
// pinned and pageable copy bandwidth by chunk size, both directions at once, copies to memory on
// other NUMA nodes, then the node's GPUs together (calibrate_node.cc). Built only with the CUDA
// backend.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "cli/calibrate.h"
#include "cli/calibrate_compute.h"
#include "cli/calibrate_copies.h"
#include "cli/calibrate_node.h"
#include "offload/cuda/cuda_handles.h"
#include "offload/cuda/cuda_status.h"
#include "offload/host_memory.h"
#include "offload/pinned_arena.h"
#include "offload/topology.h"
#include "planner/hardware/hardware.h"

namespace stowage::tools::calibrate {
namespace {

std::string DeviceSlug(const char* name) {
  std::string slug;
  for (const char* c = name; *c != '\0'; ++c) {
    if (std::isalnum(static_cast<unsigned char>(*c))) {
      slug += static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
    } else if (!slug.empty() && slug.back() != '-') {
      slug += '-';
    }
  }
  while (!slug.empty() && slug.back() == '-') slug.pop_back();
  return slug;
}

}  // namespace

absl::StatusOr<planner::HardwareProfile> Measure(const CalibrateSettings& s,
                                                 planner::HardwareProfile profile,
                                                 std::FILE* report) {
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaSetDevice(s.device),
                               absl::StrCat("cudaSetDevice(", s.device, ")"));
  cudaDeviceProp prop{};
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, s.device), "cudaGetDeviceProperties");
  absl::StatusOr<offload::Placement> placement = offload::DiscoverGpuPlacement(s.device);
  if (!placement.ok()) {
    std::fprintf(report, "placement of device %d unknown (%s): using the calling thread's\n",
                 s.device, placement.status().ToString().c_str());
    placement = offload::DiscoverHostPlacement();
  }
  absl::StatusOr<offload::HostMemorySnapshot> host = offload::ReadHostMemory(placement->numa_node);
  if (!host.ok()) return host.status();
  std::fprintf(report, "device %d: %s, %s device memory, %d async copy engines\n", s.device,
               prop.name, FormatBytesExact(prop.totalGlobalMem).c_str(), prop.asyncEngineCount);
  std::fprintf(report, "placement: %s\n", placement->ToString().c_str());
  if (absl::Status compute = MeasureCompute(s.device, prop, profile, report); !compute.ok()) {
    return compute;
  }
  if (s.compute_only) {
    profile.name = absl::StrCat(DeviceSlug(prop.name), "-calibrated");
    profile.source = "measured";
    profile.hbm_bytes = prop.totalGlobalMem;
    return profile;
  }
  std::fprintf(report, "host memory: %s\n", offload::DescribeHostMemory(*host).c_str());

  // ---- Arena setup vs cudaMallocHost (the pinning rate).
  offload::ArenaOptions arena_options;
  arena_options.bytes = s.setup_bytes;
  arena_options.numa_node = placement->numa_node;
  arena_options.touch_cpus = placement->cpus;
  arena_options.register_with_cuda = true;
  arena_options.cuda_device = s.device;
  arena_options.progress = [&](uint64_t done, uint64_t total) {
    std::fprintf(stderr, "\rarena setup: touched %5.1f%%", 100.0 * done / total);
    if (done == total) std::fputc('\n', stderr);
  };
  {
    // Warm-up: the first touch of memory this process (or a VM's guest) never used costs more
    // than any later one (the reference VM: 5.4 s for 32 GiB). Paid once here, unregistered, so
    // the arena and cudaMallocHost below are compared on equal terms.
    offload::ArenaOptions warm_up = arena_options;
    warm_up.register_with_cuda = false;
    warm_up.progress = nullptr;
    absl::StatusOr<std::unique_ptr<offload::PinnedArena>> warm =
        offload::PinnedArena::Create(warm_up);
    if (!warm.ok()) return warm.status();
    std::fprintf(report, "warm-up touch %.2f GiB: %.3f s\n",
                 static_cast<double>((*warm)->capacity()) / kGiB,
                 (*warm)->setup_stats().total_seconds);
  }
  absl::StatusOr<std::unique_ptr<offload::PinnedArena>> arena =
      offload::PinnedArena::Create(arena_options);
  if (!arena.ok()) return arena.status();
  const offload::ArenaSetupStats& st = (*arena)->setup_stats();
  const double gib = static_cast<double>((*arena)->capacity()) / kGiB;
  absl::StatusOr<offload::MappingResidency> residency =
      offload::ReadMappingResidency((*arena)->base(), (*arena)->capacity());
  std::fprintf(report,
               "arena setup %.2f GiB: %.3f s = %.1f GiB/s (map %.3f, touch %.3f with %d threads, "
               "register %.3f = %.3f s/GiB), node %d%s, resident %s (%s in huge pages)\n",
               gib, st.total_seconds, gib / st.total_seconds, st.map_seconds, st.touch_seconds,
               st.touch_threads, st.register_seconds, st.register_seconds / gib,
               (*arena)->numa_node(), st.numa_bound ? " (bound)" : " (not bound)",
               residency.ok() ? FormatBytesExact(residency->resident_bytes).c_str() : "unknown",
               residency.ok() ? FormatBytesExact(residency->huge_page_bytes).c_str() : "unknown");
  if (absl::StatusOr<std::map<int, uint64_t>> by_node =
          offload::BytesByNode((*arena)->base(), (*arena)->capacity());
      by_node.ok()) {
    std::string nodes;
    for (const auto& [node, bytes] : *by_node) {
      absl::StrAppend(&nodes, nodes.empty() ? "" : ", ", "node ", node, ": ",
                      FormatBytesExact(bytes));
    }
    std::fprintf(report, "arena pages by node (sampled every 2 MiB): %s\n", nodes.c_str());
  }
  if (!s.skip_malloc_host) {
    void* pinned = nullptr;
    const auto start = std::chrono::steady_clock::now();
    STOWAGE_CUDA_RETURN_IF_ERROR(
        cudaMallocHost(&pinned, (*arena)->capacity()),
        absl::StrCat("cudaMallocHost(device ", s.device, ", ", (*arena)->capacity(), " bytes)"));
    const double malloc_host = Seconds(start);
    const auto free_start = std::chrono::steady_clock::now();
    STOWAGE_CUDA_RETURN_IF_ERROR(cudaFreeHost(pinned), "cudaFreeHost");
    std::fprintf(report,
                 "cudaMallocHost %.2f GiB: %.3f s = %.1f GiB/s (%.3f s/GiB), cudaFreeHost %.3f s; "
                 "arena setup is %.1fx faster\n",
                 gib, malloc_host, gib / malloc_host, malloc_host / gib, Seconds(free_start),
                 malloc_host / st.total_seconds);
  }
  profile.pin_seconds_per_gib = st.register_seconds / gib;

  // ---- Bandwidth by chunk size: pinned (the arena), pageable (ordinary heap).
  absl::StatusOr<offload::DeviceBuffer> dev_a =
      offload::DeviceBuffer::Create(s.device, s.max_chunk);
  if (!dev_a.ok()) return dev_a.status();
  absl::StatusOr<offload::DeviceBuffer> dev_b =
      offload::DeviceBuffer::Create(s.device, s.max_chunk);
  if (!dev_b.ok()) return dev_b.status();
  absl::StatusOr<std::byte*> pinned_out = (*arena)->Allocate(s.max_chunk, 2 * kMiB);
  absl::StatusOr<std::byte*> pinned_in = (*arena)->Allocate(s.max_chunk, 2 * kMiB);
  if (!pinned_out.ok()) return pinned_out.status();
  if (!pinned_in.ok()) return pinned_in.status();
  std::vector<std::byte> pageable(s.max_chunk, std::byte{1});
  offload::Stream stream;
  if (absl::Status st_init = stream.Init(s.device); !st_init.ok()) return st_init;

  std::fprintf(report, "%-12s %9s %9s %10s %10s\n", "chunk", "D2H pin", "H2D pin", "D2H page",
               "H2D page");
  profile.chunk_bandwidth.clear();
  double pageable_d2h = 0;
  double pageable_h2d = 0;
  std::vector<uint64_t> chunks;
  for (uint64_t chunk = s.min_chunk; chunk < s.max_chunk; chunk *= 4) chunks.push_back(chunk);
  chunks.push_back(s.max_chunk);
  for (const uint64_t chunk : chunks) {
    absl::StatusOr<double> d2h = TimeCopies(
        *pinned_out, dev_a->get(), chunk, cudaMemcpyDeviceToHost, stream.get(), PinnedReps(chunk));
    absl::StatusOr<double> h2d = TimeCopies(dev_b->get(), *pinned_in, chunk, cudaMemcpyHostToDevice,
                                            stream.get(), PinnedReps(chunk));
    absl::StatusOr<double> pd2h =
        TimeCopies(pageable.data(), dev_a->get(), chunk, cudaMemcpyDeviceToHost, stream.get(),
                   PageableReps(chunk));
    absl::StatusOr<double> ph2d =
        TimeCopies(dev_b->get(), pageable.data(), chunk, cudaMemcpyHostToDevice, stream.get(),
                   PageableReps(chunk));
    for (const absl::StatusOr<double>* r : {&d2h, &h2d, &pd2h, &ph2d}) {
      if (!r->ok()) return r->status();
    }
    std::fprintf(report, "%-12s %9s %9s %10s %10s\n", FormatBytesExact(chunk).c_str(),
                 Gbps(*d2h).c_str(), Gbps(*h2d).c_str(), Gbps(*pd2h).c_str(), Gbps(*ph2d).c_str());
    profile.chunk_bandwidth.push_back(planner::ChunkBandwidth{chunk, *d2h, *h2d});
    pageable_d2h = std::max(pageable_d2h, *pd2h);
    pageable_h2d = std::max(pageable_h2d, *ph2d);
  }
  // Large-chunk rates: the best of the chunks >= 16 MiB (or the largest measured).
  double d2h_best = 0;
  double h2d_best = 0;
  for (const planner::ChunkBandwidth& c : profile.chunk_bandwidth) {
    if (c.chunk_bytes >= 16 * kMiB || &c == &profile.chunk_bandwidth.back()) {
      d2h_best = std::max(d2h_best, c.d2h_bytes_per_second);
      h2d_best = std::max(h2d_best, c.h2d_bytes_per_second);
    }
  }
  profile.d2h_bytes_per_second = d2h_best;
  profile.h2d_bytes_per_second = h2d_best;
  std::fprintf(report, "pageable best: D2H %s GB/s, H2D %s GB/s\n", Gbps(pageable_d2h).c_str(),
               Gbps(pageable_h2d).c_str());

  absl::StatusOr<BidirResult> bidir =
      TimeBidirectional(*pinned_out, *pinned_in, dev_a->get(), dev_b->get(), s.max_chunk,
                        static_cast<int>(std::clamp<uint64_t>((2 * kGiB) / s.max_chunk, 4, 400)));
  if (!bidir.ok()) return bidir.status();
  profile.bidir_d2h_bytes_per_second = bidir->d2h;
  profile.bidir_h2d_bytes_per_second = bidir->h2d;
  std::fprintf(report, "bidirectional %s chunks: D2H %s + H2D %s = %s GB/s\n",
               FormatBytesExact(s.max_chunk).c_str(), Gbps(bidir->d2h).c_str(),
               Gbps(bidir->h2d).c_str(), Gbps(bidir->d2h + bidir->h2d).c_str());

  // ---- NUMA placement: with several nodes, the same copies to memory on another node.
  const offload::MachineNodes machine = offload::ReadSysfsNodes("/sys");
  for (const offload::NumaNode& node : machine.nodes) {
    if (node.id == placement->numa_node || placement->numa_node < 0) continue;
    offload::ArenaOptions remote_options;
    remote_options.bytes = s.max_chunk;
    remote_options.numa_node = node.id;
    remote_options.touch_cpus = node.cpus;
    remote_options.register_with_cuda = true;
    remote_options.cuda_device = s.device;
    absl::StatusOr<std::unique_ptr<offload::PinnedArena>> remote =
        offload::PinnedArena::Create(remote_options);
    if (!remote.ok()) {
      std::fprintf(report, "remote node %d: %s\n", node.id, remote.status().ToString().c_str());
      continue;
    }
    absl::StatusOr<double> d2h =
        TimeCopies((*remote)->base(), dev_a->get(), s.max_chunk, cudaMemcpyDeviceToHost,
                   stream.get(), PinnedReps(s.max_chunk));
    absl::StatusOr<double> h2d =
        TimeCopies(dev_b->get(), (*remote)->base(), s.max_chunk, cudaMemcpyHostToDevice,
                   stream.get(), PinnedReps(s.max_chunk));
    if (!d2h.ok()) return d2h.status();
    if (!h2d.ok()) return h2d.status();
    std::fprintf(report, "remote node %d (GPU is on node %d): D2H %s GB/s, H2D %s GB/s\n", node.id,
                 placement->numa_node, Gbps(*d2h).c_str(), Gbps(*h2d).c_str());
  }

  if (absl::Status node = MeasureNode(s, profile, report); !node.ok()) return node;
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaSetDevice(s.device),
                               absl::StrCat("cudaSetDevice(", s.device, ")"));

  profile.name = absl::StrCat(DeviceSlug(prop.name), "-calibrated");
  profile.source = "measured";
  profile.hbm_bytes = prop.totalGlobalMem;
  profile.gpus_per_numa_node = std::max(1, placement->gpus_sharing_node);
  const offload::NumaNode* own = machine.Find(placement->numa_node);
  profile.host_bytes_per_numa_node =
      own != nullptr && own->mem_total_bytes.has_value() && machine.nodes.size() > 1
          ? *own->mem_total_bytes
          : host->mem_total_bytes;  // one node (or none): the machine is the node
  return profile;
}

}  // namespace stowage::tools::calibrate
