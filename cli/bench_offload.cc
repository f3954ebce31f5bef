// `stowage bench offload`: the offload engine on a synthetic plan shaped like the reference run
// (45 layers, equal layer inputs, every one offloaded), scaled to fit this machine, against raw
// copies measured in the same run on the same memory:
//   - D2H, H2D and both directions at once: the engine (Runtime save / prefetch / restore) vs a
//     raw ceiling (CUDA: chunked cudaMemcpyAsync on the engine's own streams between the same
//     device buffers and the same pinned arena; host backend: memcpy on as many threads as the
//     backend has workers);
//   - arena setup: the pinned arena (map, bind, parallel touch, register) vs cudaMallocHost of
//     the same memory (host backend: malloc + a one-thread memset, the naive way);
//   - host bytes: arena capacity and resident bytes vs what the plan asked for;
//   - stall: time restores spent waiting for their H2D (no compute is simulated, so with
//     prefetch distance d only the first d layers' copies can be hidden... by nothing: it is an
//     upper bound on exposed copy time).
// A benchmark prints a table; it asserts nothing.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "offload/host_backend.h"
#include "offload/host_memory.h"
#include "runtime/runtime.h"
#include "stowage/plan.h"

#ifdef STOWAGE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "offload/cuda/cuda_backend.h"
#include "offload/cuda/cuda_handles.h"
#endif

namespace stowage::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kDefaultLayers = 45;  // GLM-5.3-Flash's decoder layers
constexpr int kBuffers = 4;         // device buffers per side, reused round-robin

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
double Gbps(uint64_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
double GiBps(uint64_t bytes, double seconds) {
  return seconds > 0 ? bytes / seconds / (1024.0 * 1024 * 1024) : 0;
}
std::string GiB(uint64_t bytes) {
  if (bytes < (uint64_t{1} << 30)) return absl::StrFormat("%.1f MiB", bytes / (1024.0 * 1024));
  return absl::StrFormat("%.3f GiB", bytes / (1024.0 * 1024 * 1024));
}

struct Config {
  runtime::BackendKind backend = runtime::BackendKind::kAuto;
  uint64_t host_bytes = 0;
  int layers = kDefaultLayers;
  int steps = 3;
  uint64_t chunk_bytes = 16 << 20;
  int threads = 0;
  int prefetch_distance = 1;
  uint64_t baseline_bytes = 0;
};

Plan BenchPlan(const Config& c, uint64_t layer_bytes) {
  Plan plan;
  plan.generator = absl::StrCat("stowage ", stowage_version(), " bench offload");
  plan.model = "glm-5.3-flash (synthetic: equal layer inputs)";
  plan.runtime.prefetch_distance = c.prefetch_distance;
  plan.runtime.copy_chunk_bytes = c.chunk_bytes;
  for (int i = 0; i < c.layers; ++i) {
    LayerPlan layer;
    layer.index = i;
    layer.type = i % 4 == 3 ? "dsa" : "kda";
    layer.policy = LayerPolicy::kOffloadInput;
    layer.host_bytes = layer_bytes;
    layer.transfers = {{"input", layer_bytes}};
    const LayerProtocol protocol =
        LayerProtocolFor(i, c.layers, true, c.prefetch_distance, plan.runtime.save_lag);
    layer.save_wait_before_layer = protocol.save_wait_before_layer;
    layer.prefetch_after_layer = protocol.prefetch_after_layer;
    plan.layers.push_back(layer);
  }
  plan.runtime.host_arena_bytes = layer_bytes * c.layers;
  plan.predicted.host_bytes_per_gpu = plan.runtime.host_arena_bytes;
  return plan;
}

// One copy of `bytes` from src[i] to dst[i] per job, split in chunks, on `threads` threads
// (host raw ceiling).
struct Job {
  void* dst;
  const void* src;
  uint64_t bytes;
};
void MemcpyJobs(const std::vector<Job>& jobs, uint64_t chunk, int threads) {
  struct Piece {
    char* dst;
    const char* src;
    uint64_t bytes;
  };
  std::vector<Piece> pieces;
  for (const Job& j : jobs) {
    for (uint64_t off = 0; off < j.bytes; off += chunk) {
      pieces.push_back({static_cast<char*>(j.dst) + off, static_cast<const char*>(j.src) + off,
                        std::min(chunk, j.bytes - off)});
    }
  }
  // Pieces are taken from a shared counter, as the engine's workers take chunks from their
  // queue: a static split would give one thread every full chunk and another every tail.
  std::atomic<size_t> next{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < pieces.size(); i = next++) {
        std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].bytes);
      }
    });
  }
  for (std::thread& w : workers) w.join();
}

// Per-repetition rates (GB/s); the table shows the median, which a busy machine disturbs least.
struct Rates {
  std::vector<double> d2h, h2d, both;
};
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Ceiling {
  double d2h_seconds = 0, h2d_seconds = 0, both_seconds = 0;
  uint64_t d2h_bytes = 0, h2d_bytes = 0, both_bytes = 0;
  Rates rates;
};

struct EngineResult {
  double d2h_seconds = 0, h2d_seconds = 0, both_seconds = 0;
  uint64_t d2h_bytes = 0, h2d_bytes = 0, both_bytes = 0;
  Rates rates;
  double stall_seconds = 0;
  bool bit_exact = true;
};

class Bench {
 public:
  explicit Bench(Config config) : c_(config) {}

  int Run() {
    if (absl::Status s = Setup(); !s.ok()) {
      std::fprintf(stderr, "stowage bench offload: %s\n", s.ToString().c_str());
      return s.code() == absl::StatusCode::kUnavailable ? kExitUnavailable : kExitUnmet;
    }
    Ceiling ceiling;
    absl::StatusOr<EngineResult> engine = MeasureEngine(ceiling);
    if (!engine.ok()) {
      std::fprintf(stderr, "stowage bench offload: %s\n", engine.status().ToString().c_str());
      return kExitUnmet;
    }
    Print(ceiling, *engine);
    Teardown();
    return kExitOk;
  }

 private:
  bool cuda() const { return rt_->backend_kind() == runtime::BackendKind::kCuda; }

  absl::Status Setup() {
    layer_bytes_ = c_.host_bytes / c_.layers / 4096 * 4096;
    if (layer_bytes_ == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--host-bytes ", c_.host_bytes, " is too small for ", c_.layers, " layers"));
    }
    plan_ = BenchPlan(c_, layer_bytes_);
    runtime::RuntimeOptions options;
    options.backend = c_.backend;
    options.copy_threads = c_.threads;
    const bool show_progress = plan_.runtime.host_arena_bytes >= (uint64_t{4} << 30);
    if (show_progress) {
      options.arena_progress = [](uint64_t done, uint64_t total) {
        std::fprintf(stderr, "\r  arena setup: %.1f / %.1f GiB", done / 1073741824.0,
                     total / 1073741824.0);
        if (done == total) std::fputc('\n', stderr);
      };
    }
    std::fprintf(stderr, "stowage bench offload: setting up a %s arena...\n",
                 GiB(plan_.runtime.host_arena_bytes).c_str());
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<std::unique_ptr<runtime::Runtime>> rt = runtime::Runtime::Create(plan_, options);
    if (!rt.ok()) return rt.status();
    create_seconds_ = Since(t0);
    rt_ = *std::move(rt);
    for (int i = 0; i < kBuffers; ++i) {
      for (auto* side : {&src_, &dst_}) {
        absl::StatusOr<void*> p = rt_->backend().AllocateDevice(layer_bytes_);
        if (!p.ok()) return p.status();
        side->push_back(*p);
      }
      std::vector<uint8_t> pattern(std::min<uint64_t>(layer_bytes_, 1 << 20));
      for (size_t k = 0; k < pattern.size(); ++k) pattern[k] = static_cast<uint8_t>(k * 31 + i);
      if (absl::Status s = rt_->backend().FillDevice(src_[i], i + 1, layer_bytes_); !s.ok()) {
        return s;
      }
      if (absl::Status s = rt_->backend().CopyToDevice(src_[i], pattern.data(), pattern.size());
          !s.ok()) {
        return s;
      }
    }
#ifdef STOWAGE_HAVE_CUDA
    if (cuda()) {
      // The trainer's compute streams: saves are produced on one, restores consumed on another,
      // so a restore's device-side wait never holds back the next save (as it would if both
      // used the legacy default stream). The runtime runs on device 0 (RuntimeOptions default).
      for (offload::Stream* stream : {&producer_stream_, &consumer_stream_}) {
        if (absl::Status s = stream->Init(/*device=*/0); !s.ok()) return s;
      }
      producer_ = producer_stream_.get();
      consumer_ = consumer_stream_.get();
    }
#endif
    MeasureBaselineSetup();
    return absl::OkStatus();
  }

  void Teardown() {
    for (void* p : src_) rt_->backend().FreeDevice(p);
    for (void* p : dst_) rt_->backend().FreeDevice(p);
    rt_.reset();
  }

  // cudaMallocHost (host backend: malloc + one-thread memset) of the baseline size.
  void MeasureBaselineSetup() {
    const uint64_t bytes = c_.baseline_bytes > 0
                               ? c_.baseline_bytes
                               : std::min<uint64_t>(plan_.runtime.host_arena_bytes, 8ull << 30);
    baseline_bytes_ = bytes;
#ifdef STOWAGE_HAVE_CUDA
    if (cuda()) {
      baseline_name_ = "cudaMallocHost";
      void* p = nullptr;
      const Clock::time_point t0 = Clock::now();
      if (cudaMallocHost(&p, bytes) == cudaSuccess) {
        baseline_seconds_ = Since(t0);
        cudaFreeHost(p);
      }
      return;
    }
#endif
    baseline_name_ = "malloc+memset, 1 thread";
    const Clock::time_point t0 = Clock::now();
    void* p = std::malloc(bytes);
    if (p == nullptr) return;
    std::memset(p, 1, bytes);
    asm volatile("" : : "r"(p) : "memory");  // the pages must really be written
    baseline_seconds_ = Since(t0);
    std::free(p);
  }

  // The arena memory of layer `l` (this step's layout is fixed: regions in layer order).
  std::byte* HostOf(int l) const {
    return rt_->arena()->base() + static_cast<uint64_t>(l) * AlignedRegion();
  }
  uint64_t AlignedRegion() const {
    // Mirrors the runtime's region sizing closely enough for a raw copy target: every region
    // is at least layer_bytes_, and capacity covers layers x stride.
    return rt_->arena()->capacity() / c_.layers / 256 * 256;
  }

  // One repetition of the raw copies, accumulated into `r` unless it is the warm-up. Raw and
  // engine repetitions alternate so that both see the same machine (load changes, caches).
  void MeasureCeiling(bool warm, Ceiling& r) {
    const int half = c_.layers / 2;
    std::vector<Job> d2h, h2d, both_d2h, both_h2d;
    for (int l = 0; l < c_.layers; ++l) {
      d2h.push_back({HostOf(l), src_[l % kBuffers], layer_bytes_});
      h2d.push_back({dst_[l % kBuffers], HostOf(l), layer_bytes_});
      if (l >= half) both_d2h.push_back(d2h.back());
      if (l < c_.layers - half) both_h2d.push_back(h2d.back());
    }
    const double d = Raw({&d2h}), h = Raw({nullptr, &h2d}), b = Raw({&both_d2h, &both_h2d});
    if (warm) return;
    r.d2h_bytes += layer_bytes_ * c_.layers;
    r.h2d_bytes += layer_bytes_ * c_.layers;
    r.both_bytes += layer_bytes_ * (both_d2h.size() + both_h2d.size());
    r.d2h_seconds += d;
    r.h2d_seconds += h;
    r.both_seconds += b;
    const uint64_t all = layer_bytes_ * c_.layers;
    r.rates.d2h.push_back(Gbps(all, d));
    r.rates.h2d.push_back(Gbps(all, h));
    r.rates.both.push_back(Gbps(layer_bytes_ * (both_d2h.size() + both_h2d.size()), b));
  }

  struct Directions {
    const std::vector<Job>* d2h = nullptr;
    const std::vector<Job>* h2d = nullptr;
  };
  double Raw(Directions jobs) {
    const Clock::time_point t0 = Clock::now();
#ifdef STOWAGE_HAVE_CUDA
    if (cuda()) {
      auto& backend = static_cast<offload::CudaBackend&>(rt_->backend());
      const std::vector<Job>* lists[2] = {jobs.d2h, jobs.h2d};
      for (int d = 0; d < 2; ++d) {
        if (lists[d] == nullptr) continue;
        auto stream =
            static_cast<cudaStream_t>(backend.stream(static_cast<offload::CopyDirection>(d)));
        for (const Job& j : *lists[d]) {
          for (uint64_t off = 0; off < j.bytes; off += c_.chunk_bytes) {
            cudaMemcpyAsync(static_cast<char*>(j.dst) + off, static_cast<const char*>(j.src) + off,
                            std::min(c_.chunk_bytes, j.bytes - off), cudaMemcpyDefault, stream);
          }
        }
      }
      backend.Synchronize().IgnoreError();
      return Since(t0);
    }
#endif
    const int threads = HostThreads();
    std::thread other;
    if (jobs.d2h != nullptr && jobs.h2d != nullptr) {
      other = std::thread([&] { MemcpyJobs(*jobs.h2d, c_.chunk_bytes, threads); });
      MemcpyJobs(*jobs.d2h, c_.chunk_bytes, threads);
      other.join();
    } else {
      MemcpyJobs(jobs.d2h != nullptr ? *jobs.d2h : *jobs.h2d, c_.chunk_bytes, threads);
    }
    return Since(t0);
  }

  int HostThreads() {
    auto* host = dynamic_cast<offload::HostBackend*>(&rt_->backend());
    return host != nullptr ? host->threads_per_stream() : 1;
  }

  // The consumer "stream" of the benchmark: the legacy default stream (CUDA), the calling
  // thread (host backend). Synchronises it.
  void SyncConsumer() {
#ifdef STOWAGE_HAVE_CUDA
    if (cuda()) cudaDeviceSynchronize();
#endif
  }

  absl::StatusOr<EngineResult> MeasureEngine(Ceiling& ceiling) {
    EngineResult r;
    runtime::Runtime& rt = *rt_;
    const int L = c_.layers, d = c_.prefetch_distance, half = L / 2;
    std::vector<runtime::TensorId> ids(L);
    for (int rep = 0; rep < c_.steps + 1; ++rep) {
      const bool warm = rep == 0;
      MeasureCeiling(warm, ceiling);
      // Step A: forward saves every layer, backward restores them in reverse with prefetch.
      if (absl::Status s = rt.BeginStep(); !s.ok()) return s;
      Clock::time_point t0 = Clock::now();
      for (int l = 0; l < L; ++l) {
        absl::StatusOr<runtime::TensorId> id =
            rt.Save(l, src_[l % kBuffers], layer_bytes_, producer_);
        if (!id.ok()) return id.status();
        ids[l] = *id;
      }
      for (int l = 0; l < L; ++l) {
        if (absl::Status s = rt.SaveWait(ids[l]); !s.ok()) return s;
      }
      const double d2h = Since(t0);
      const double stall_before = runtime::Seconds(rt.counters().stall_nanos);
      t0 = Clock::now();
      for (int l = L - 1; l >= std::max(0, L - d); --l) {
        if (absl::Status s = rt.Prefetch(ids[l], dst_[l % kBuffers], consumer_); !s.ok()) return s;
      }
      for (int l = L - 1; l >= 0; --l) {
        // Prefetch the layer `d` below before consuming this one (its buffer is free: buffers
        // rotate over kBuffers > d layers).
        if (l - d >= 0) {
          if (absl::Status s = rt.Prefetch(ids[l - d], dst_[(l - d) % kBuffers], consumer_);
              !s.ok())
            return s;
        }
        if (absl::Status s = rt.Restore(ids[l], dst_[l % kBuffers], consumer_); !s.ok()) return s;
      }
      SyncConsumer();
      const double h2d = Since(t0);
      if (rep == c_.steps) {
        // Spot-check the last restored buffer (layer 0) against its source.
        std::vector<uint8_t> a(std::min<uint64_t>(layer_bytes_, 1 << 20)), b(a.size());
        r.bit_exact = rt.backend().CopyFromDevice(a.data(), src_[0], a.size()).ok() &&
                      rt.backend().CopyFromDevice(b.data(), dst_[0], b.size()).ok() && a == b;
      }
      if (absl::Status s = rt.EndStep(); !s.ok()) return s;
      const double stall = runtime::Seconds(rt.counters().stall_nanos) - stall_before;

      // Step B: both directions at once: the second half's saves against the first half's
      // restores.
      if (absl::Status s = rt.BeginStep(); !s.ok()) return s;
      for (int l = 0; l < half; ++l) {
        absl::StatusOr<runtime::TensorId> id =
            rt.Save(l, src_[l % kBuffers], layer_bytes_, producer_);
        if (!id.ok()) return id.status();
        ids[l] = *id;
      }
      for (int l = 0; l < half; ++l) {
        if (absl::Status s = rt.SaveWait(ids[l]); !s.ok()) return s;
      }
      t0 = Clock::now();
      for (int k = 0; k < L - half; ++k) {
        absl::StatusOr<runtime::TensorId> id =
            rt.Save(half + k, src_[k % kBuffers], layer_bytes_, producer_);
        if (!id.ok()) return id.status();
        ids[half + k] = *id;
        if (k < half) {
          if (absl::Status s = rt.Restore(ids[k], dst_[k % kBuffers], consumer_); !s.ok()) return s;
        }
      }
      for (int l = half; l < L; ++l) {
        if (absl::Status s = rt.SaveWait(ids[l]); !s.ok()) return s;
      }
      SyncConsumer();
      const double both = Since(t0);
      if (absl::Status s = rt.EndStep(); !s.ok()) return s;
      if (warm) continue;
      r.d2h_seconds += d2h;
      r.h2d_seconds += h2d;
      r.both_seconds += both;
      r.rates.d2h.push_back(Gbps(layer_bytes_ * L, d2h));
      r.rates.h2d.push_back(Gbps(layer_bytes_ * L, h2d));
      r.rates.both.push_back(Gbps(layer_bytes_ * L, both));
      r.stall_seconds += stall;
      r.d2h_bytes += layer_bytes_ * L;
      r.h2d_bytes += layer_bytes_ * L;
      r.both_bytes += layer_bytes_ * ((L - half) + half);
    }
    return r;
  }

  void Print(const Ceiling& c, const EngineResult& e) {
    const offload::PinnedArena& arena = *rt_->arena();
    const offload::ArenaSetupStats& setup = arena.setup_stats();
    const uint64_t requested = plan_.runtime.host_arena_bytes;
    absl::StatusOr<uint64_t> resident =
        offload::ResidentBytesOfMapping(arena.base(), arena.capacity());
    const std::string threads =
        cuda() ? std::string() : absl::StrCat(", ", HostThreads(), " copy thread(s) per direction");
    std::printf(
        "stowage bench offload: backend %s, %d layers x %s = %s per step, chunk %s, "
        "prefetch distance %d, %d measured steps (+1 warm-up)%s\n",
        cuda() ? "cuda" : "host", c_.layers, GiB(layer_bytes_).c_str(), GiB(requested).c_str(),
        GiB(c_.chunk_bytes).c_str(), c_.prefetch_distance, c_.steps, threads.c_str());
    std::printf("\n%-30s %14s %14s %9s   (median of %d repetitions)\n", "",
                cuda() ? "raw cudaMemcpy" : "raw memcpy", "engine", "engine %", c_.steps);
    auto row = [](const char* name, double ceiling, double engine) {
      std::printf("%-30s %14.2f %14.2f %8.1f%%\n", name, ceiling, engine,
                  ceiling > 0 ? 100.0 * engine / ceiling : 0.0);
    };
    row("D2H GB/s", Median(c.rates.d2h), Median(e.rates.d2h));
    row("H2D GB/s", Median(c.rates.h2d), Median(e.rates.h2d));
    row("both directions GB/s (sum)", Median(c.rates.both), Median(e.rates.both));
    std::printf("\n%-30s %14s %14s %9s\n", "", baseline_name_.c_str(), "arena", "speed-up");
    std::printf("%-30s %14.2f %14.2f %8.1fx\n", "setup GiB/s",
                GiBps(baseline_bytes_, baseline_seconds_),
                GiBps(arena.capacity(), setup.total_seconds),
                baseline_seconds_ > 0 && setup.total_seconds > 0
                    ? GiBps(arena.capacity(), setup.total_seconds) /
                          GiBps(baseline_bytes_, baseline_seconds_)
                    : 0.0);
    std::printf(
        "%-30s %s of %s; arena: map %.3f s, touch %.3f s (%d threads), register %.3f s, "
        "NUMA node %d%s\n",
        "  measured on", GiB(baseline_bytes_).c_str(), GiB(arena.capacity()).c_str(),
        setup.map_seconds, setup.touch_seconds, setup.touch_threads, setup.register_seconds,
        arena.numa_node(), setup.numa_bound ? " (bound)" : "");
    std::printf("\n%-30s %s\n", "host bytes requested", GiB(requested).c_str());
    std::printf("%-30s %s (%.3f%% of requested)\n", "arena capacity", GiB(arena.capacity()).c_str(),
                100.0 * arena.capacity() / requested);
    if (resident.ok()) {
      std::printf("%-30s %s (%.3f%% of requested)\n", "arena resident", GiB(*resident).c_str(),
                  100.0 * *resident / requested);
    }
    std::printf("%-30s %.4f s per step (%.1f%% of the backward copy time; no compute simulated)\n",
                "restore stall", e.stall_seconds / c_.steps,
                e.h2d_seconds > 0 ? 100.0 * e.stall_seconds / e.h2d_seconds : 0.0);
    std::printf("%-30s %s\n", "round trip bit-exact", e.bit_exact ? "yes" : "NO");
    std::printf("%-30s %.3f s (Runtime::Create, admission and arena included)\n", "runtime create",
                create_seconds_);
  }

  Config c_;
  Plan plan_;
  uint64_t layer_bytes_ = 0;
  std::unique_ptr<runtime::Runtime> rt_;
  std::vector<void*> src_, dst_;
  void* producer_ = nullptr;  // cudaStream_t; null with the host backend (streams ignored)
  void* consumer_ = nullptr;
#ifdef STOWAGE_HAVE_CUDA
  offload::Stream producer_stream_;  // own the streams behind producer_ / consumer_
  offload::Stream consumer_stream_;
#endif
  double create_seconds_ = 0;
  std::string baseline_name_;
  uint64_t baseline_bytes_ = 0;
  double baseline_seconds_ = 0;
};

uint64_t DefaultHostBytes(bool want_cuda) {
  // CUDA: as much of the reference's per-GPU 180 GB as fits in 40% of available memory, at most
  // 64 GiB (the size the setup target names). Host backend: 1 GiB, enough to leave caches.
  if (!want_cuda) return 1ull << 30;
  absl::StatusOr<offload::HostMemorySnapshot> mem = offload::ReadHostMemory(-1);
  const uint64_t available = mem.ok() ? mem->mem_available_bytes : (8ull << 30);
  return std::min<uint64_t>(64ull << 30, available / 10 * 4);
}

}  // namespace

int RunBenchOffload(int argc, char** argv) {
  cli::FlagParser p("stowage bench offload [flags]",
                    "Runs the offload engine on a synthetic reference-shaped plan (45 equal layer "
                    "inputs, all offloaded) and prints achieved copy bandwidth against raw copies "
                    "measured in the same run, arena setup speed, host bytes and stall time.");
  p.Add({"backend", "auto|host|cuda", "engine backend", "auto"});
  p.Add({"host-bytes", "N", "pinned bytes per step (K/M/G suffixes)",
         "cuda: min(64G, 40% of available); host: 1G"});
  p.Add({"layers", "N", "layers (equal inputs)", "45"});
  p.Add({"steps", "N", "measured steps (after one warm-up)", "3"});
  p.Add({"chunk", "N", "copy chunk bytes", "16M"});
  p.Add({"threads", "N", "host-backend copy workers per direction and arena touch threads",
         "from topology"});
  p.Add({"prefetch-distance", "N", "layers prefetched ahead in backward", "1"});
  p.Add({"baseline-bytes", "N", "size of the cudaMallocHost (or malloc+memset) baseline",
         "min(host-bytes, 8G)"});
  if (absl::Status s = p.Parse(argc, argv, 1); !s.ok()) {
    std::fprintf(stderr, "stowage bench offload: %s\n", s.ToString().c_str());
    return kExitUsage;
  }
  if (p.help_requested()) {
    std::fputs(p.Help().c_str(), stdout);
    return kExitOk;
  }
  Config c;
  absl::StatusOr<std::string> backend = p.GetString("backend", "auto");
  if (!backend.ok()) return kExitUsage;
  if (*backend == "host") {
    c.backend = runtime::BackendKind::kHost;
  } else if (*backend == "cuda") {
    c.backend = runtime::BackendKind::kCuda;
  } else if (*backend != "auto") {
    std::fprintf(stderr, "stowage bench offload: --backend=%s: use auto, host or cuda\n",
                 backend->c_str());
    return kExitUsage;
  }
  bool want_cuda = c.backend == runtime::BackendKind::kCuda;
#ifdef STOWAGE_HAVE_CUDA
  if (c.backend == runtime::BackendKind::kAuto) want_cuda = offload::CudaDeviceCount() > 0;
#endif
  absl::StatusOr<uint64_t> host_bytes = p.GetCount("host-bytes", DefaultHostBytes(want_cuda));
  absl::StatusOr<int64_t> layers = p.GetInt("layers", kDefaultLayers, 1, 10000);
  absl::StatusOr<int64_t> steps = p.GetInt("steps", 3, 1, 1000);
  absl::StatusOr<uint64_t> chunk = p.GetCount("chunk", 16 << 20);
  absl::StatusOr<int64_t> threads = p.GetInt("threads", 0, 0, 1024);
  absl::StatusOr<int64_t> distance = p.GetInt("prefetch-distance", 1, 1, 3);
  absl::StatusOr<uint64_t> baseline = p.GetCount("baseline-bytes", 0);
  for (const absl::Status& s :
       {host_bytes.status(), layers.status(), steps.status(), chunk.status(), threads.status(),
        distance.status(), baseline.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "stowage bench offload: %s\n", std::string(s.message()).c_str());
      return kExitUsage;
    }
  }
  if (*chunk == 0) {
    std::fprintf(stderr, "stowage bench offload: --chunk must be positive\n");
    return kExitUsage;
  }
  c.host_bytes = *host_bytes;
  c.layers = static_cast<int>(*layers);
  c.steps = static_cast<int>(*steps);
  c.chunk_bytes = *chunk;
  c.threads = static_cast<int>(*threads);
  c.prefetch_distance = static_cast<int>(*distance);
  c.baseline_bytes = *baseline;
  return Bench(c).Run();
}

}  // namespace stowage::tools
