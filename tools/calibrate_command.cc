// `stowage calibrate`: measures this machine's host link and pinning cost for one GPU and writes
// the hardware profile the planner reads (planner/hardware.h). What it cannot measure (FLOP/s,
// HBM bandwidth, efficiency) comes from the --base preset.
//
// Measured: pinned D2H / H2D bandwidth by chunk size (into the pinned NUMA-local arena, the
// memory the runtime copies into), both directions at once, pageable bandwidth, arena setup
// (mmap + THP + parallel touch + cudaHostRegister) against cudaMallocHost of the same size, and
// the NUMA placement: the GPU's node, the arena's binding and, on machines with several nodes,
// the bandwidth to memory on another node. All GB/s are 1e9 bytes per second.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "offload/host_memory.h"
#include "offload/pinned_arena.h"
#include "offload/topology.h"
#include "planner/hardware.h"
#include "tools/cli.h"
#include "tools/commands.h"

#ifdef STOWAGE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>

#include "offload/cuda_handles.h"
#include "offload/cuda_host.h"
#include "offload/cuda_status.h"
#endif

namespace stowage::tools {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

struct CalibrateSettings {
  int device = 0;
  std::string base = "h200";
  std::string out;
  uint64_t min_chunk = 256 * 1024;
  uint64_t max_chunk = 256 * kMiB;
  uint64_t setup_bytes = 4 * kGiB;
  bool skip_malloc_host = false;
};

cli::FlagParser MakeParser() {
  cli::FlagParser parser(
      "stowage calibrate [flags]",
      "Measures this machine: pinned D2H/H2D/bidirectional bandwidth by chunk size, pageable\n"
      "bandwidth, pinning rate (arena setup vs cudaMallocHost) and NUMA placement, then\n"
      "writes the hardware profile the planner reads. Fields it cannot measure (FLOP/s, HBM\n"
      "bandwidth) come from --base. With --out the table goes to stdout; without, the table\n"
      "goes to stderr and the profile JSON to stdout. Exits 3 without a GPU.");
  parser.Add({"device", "N", "CUDA device to measure", "0"});
  parser.Add({"base", "PRESET", "preset for the fields calibrate cannot measure", "h200"});
  parser.Add({"out", "PATH", "write the profile JSON here", ""});
  parser.Add({"min-chunk", "SIZE", "smallest copy chunk measured (K/M/G suffixes)", "256K"});
  parser.Add({"max-chunk", "SIZE", "largest copy chunk measured", "256M"});
  parser.Add({"setup-bytes", "SIZE", "arena size for the setup and pinning-rate comparison", "4G"});
  parser.Add({"skip-malloc-host", "", "do not time cudaMallocHost (it is slow: ~0.4 s/GiB)", ""});
  return parser;
}

absl::StatusOr<CalibrateSettings> ParseSettings(const cli::FlagParser& parser) {
  CalibrateSettings s;
  absl::StatusOr<int64_t> device = parser.GetInt("device", 0, 0, 1023);
  if (!device.ok()) return device.status();
  s.device = static_cast<int>(*device);
  absl::StatusOr<std::string> base = parser.GetString("base", s.base);
  if (!base.ok()) return base.status();
  s.base = *base;
  absl::StatusOr<std::string> out = parser.GetString("out", "");
  if (!out.ok()) return out.status();
  s.out = *out;
  absl::StatusOr<uint64_t> min_chunk = parser.GetCount("min-chunk", s.min_chunk);
  if (!min_chunk.ok()) return min_chunk.status();
  absl::StatusOr<uint64_t> max_chunk = parser.GetCount("max-chunk", s.max_chunk);
  if (!max_chunk.ok()) return max_chunk.status();
  absl::StatusOr<uint64_t> setup = parser.GetCount("setup-bytes", s.setup_bytes);
  if (!setup.ok()) return setup.status();
  s.min_chunk = *min_chunk;
  s.max_chunk = *max_chunk;
  s.setup_bytes = *setup;
  if (s.min_chunk < 4096 || s.max_chunk < s.min_chunk || s.max_chunk > 4 * kGiB) {
    return absl::InvalidArgumentError(absl::StrCat("--min-chunk ", s.min_chunk, " and --max-chunk ",
                                                   s.max_chunk,
                                                   ": need 4096 <= min-chunk <= max-chunk <= 4G"));
  }
  if (s.setup_bytes < 2 * s.max_chunk) {
    return absl::InvalidArgumentError(absl::StrCat("--setup-bytes ", s.setup_bytes,
                                                   " must hold two max chunks (", 2 * s.max_chunk,
                                                   " bytes)"));
  }
  s.skip_malloc_host = parser.GetBool("skip-malloc-host");
  return s;
}

#ifdef STOWAGE_HAVE_CUDA

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Copies `reps` times on `stream` after one warm-up; returns bytes per second (event-timed).
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

struct BidirResult {
  double d2h = 0;
  double h2d = 0;
};

// Both directions at once on two streams, `reps` chunks each, started together.
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

// The measurements; `report` receives the table lines. Returns the profile.
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
               prop.name, offload::FormatBytes(prop.totalGlobalMem).c_str(), prop.asyncEngineCount);
  std::fprintf(report, "placement: %s\n", placement->ToString().c_str());
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
  std::fprintf(
      report,
      "arena setup %.2f GiB: %.3f s = %.1f GiB/s (map %.3f, touch %.3f with %d threads, "
      "register %.3f = %.3f s/GiB), node %d%s, resident %s (%s in huge pages)\n",
      gib, st.total_seconds, gib / st.total_seconds, st.map_seconds, st.touch_seconds,
      st.touch_threads, st.register_seconds, st.register_seconds / gib, (*arena)->numa_node(),
      st.numa_bound ? " (bound)" : " (not bound)",
      residency.ok() ? offload::FormatBytes(residency->resident_bytes).c_str() : "unknown",
      residency.ok() ? offload::FormatBytes(residency->huge_page_bytes).c_str() : "unknown");
  if (absl::StatusOr<std::map<int, uint64_t>> by_node =
          offload::BytesByNode((*arena)->base(), (*arena)->capacity());
      by_node.ok()) {
    std::string nodes;
    for (const auto& [node, bytes] : *by_node) {
      absl::StrAppend(&nodes, nodes.empty() ? "" : ", ", "node ", node, ": ",
                      offload::FormatBytes(bytes));
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
    std::fprintf(report, "%-12s %9s %9s %10s %10s\n", offload::FormatBytes(chunk).c_str(),
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
               offload::FormatBytes(s.max_chunk).c_str(), Gbps(bidir->d2h).c_str(),
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

#endif  // STOWAGE_HAVE_CUDA

}  // namespace

int RunCalibrateCommand(int argc, char** argv) {
  cli::FlagParser parser = MakeParser();
  if (absl::Status status = parser.Parse(argc, argv, 1); !status.ok()) {
    std::fprintf(stderr, "stowage calibrate: %s\n", std::string(status.message()).c_str());
    return kExitUsage;
  }
  if (parser.help_requested()) {
    std::fputs(parser.Help().c_str(), stdout);
    return kExitOk;
  }
  absl::StatusOr<CalibrateSettings> settings = ParseSettings(parser);
  if (!settings.ok()) {
    std::fprintf(stderr, "stowage calibrate: %s\n",
                 std::string(settings.status().message()).c_str());
    return kExitUsage;
  }
  absl::StatusOr<planner::HardwareProfile> base = planner::HardwarePreset(settings->base);
  if (!base.ok()) {
    std::fprintf(stderr, "stowage calibrate: --base: %s\n",
                 std::string(base.status().message()).c_str());
    return kExitUsage;
  }
#ifndef STOWAGE_HAVE_CUDA
  std::fprintf(stderr,
               "stowage calibrate: no GPU: this stowage was built without the CUDA backend, and "
               "calibrate measures a GPU's host link. Plan with a hardware preset instead "
               "(e.g. %s).\n",
               settings->base.c_str());
  return kExitUnavailable;
#else
  if (absl::Status status = offload::CudaCheckDevice(settings->device); !status.ok()) {
    std::fprintf(stderr,
                 "stowage calibrate: no GPU: CUDA device %d is not usable (%s). calibrate "
                 "measures a GPU's host link; plan with a hardware preset instead (e.g. %s).\n",
                 settings->device, std::string(status.message()).c_str(), settings->base.c_str());
    return status.code() == absl::StatusCode::kUnavailable ? kExitUnavailable : kExitUnmet;
  }
  std::FILE* report = settings->out.empty() ? stderr : stdout;
  absl::StatusOr<planner::HardwareProfile> profile = Measure(*settings, *base, report);
  if (!profile.ok()) {
    std::fprintf(stderr, "stowage calibrate: %s\n", profile.status().ToString().c_str());
    return profile.status().code() == absl::StatusCode::kUnavailable ? kExitUnavailable
                                                                     : kExitUnmet;
  }
  if (absl::Status valid = planner::ValidateHardwareProfile(*profile); !valid.ok()) {
    std::fprintf(stderr, "stowage calibrate: measured profile is not valid: %s\n",
                 valid.ToString().c_str());
    return kExitUnmet;
  }
  const std::string json = planner::HardwareProfileToJson(*profile);
  if (settings->out.empty()) {
    std::fputs(json.c_str(), stdout);
    return kExitOk;
  }
  if (absl::Status written = WriteFile(settings->out, json); !written.ok()) {
    std::fprintf(stderr, "stowage calibrate: %s\n", std::string(written.message()).c_str());
    return kExitUnmet;
  }
  std::fprintf(report, "profile written to %s\n", settings->out.c_str());
  return kExitOk;
#endif
}

}  // namespace stowage::tools
