// `stowage calibrate`: measures this machine's host link and pinning cost for one GPU and the
// GPU's per-op-class rates (planner/hardware/op_time.h), and writes the hardware profile the planner
// reads (planner/hardware/hardware.h). What it cannot measure (peak FLOP/s, the fused attention rates)
// comes from the --base preset.
//
// Compute (Note [Calibrated op rates]): cuBLAS bf16 GEMMs at training shapes (gemm_efficiency
// of the preset's dense_bf16_flops), fp32 GEMMs without TF32 (fp32_gemm_efficiency of its
// dense_fp32_flops), strided-batched GEMMs over 64 experts at several tokens
// per expert (grouped_gemm_efficiency and grouped_gemm_half_tokens, fitted to
// rate = R * t / (t + half)), a 16-byte stream copy (elementwise_efficiency), and empty kernels
// back to back (kernel_seconds). torch._grouped_mm, the hf experts' kernel, is another
// kernel than the cuBLAS GEMMs timed here: --torch-grouped-mm folds in what
// bench/bench_grouped_mm.py measured of it (torch_grouped_mm_efficiency, _half_tokens).
//
// Measured: pinned D2H / H2D bandwidth by chunk size (into the pinned NUMA-local arena, the
// memory the runtime copies into), both directions at once, pageable bandwidth, arena setup
// (mmap + THP + parallel touch + cudaHostRegister) against cudaMallocHost of the same size, and
// the NUMA placement: the GPU's node, the arena's binding and, on machines with several nodes,
// the bandwidth to memory on another node. With several local GPUs: the host link with every
// GPU copying at once (what each gets when all ranks of a node run one schedule), and NCCL's
// all-to-all, all-gather and reduce-scatter bus bandwidth among them (when built with NCCL),
// written into the topology fields the communication model reads (planner/cost/communication.h).
// All GB/s are 1e9 bytes per second.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/bytes.h"
#include "offload/host_memory.h"
#include "offload/pinned_arena.h"
#include "offload/topology.h"
#include "planner/hardware/hardware.h"
#include "cli/cli.h"
#include "cli/commands.h"

#ifdef STOWAGE_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <barrier>
#include <chrono>
#include <cstring>
#include <thread>
#include <type_traits>

#include "offload/cuda/cuda_handles.h"
#include "offload/cuda/cuda_host.h"
#include "offload/cuda/cuda_status.h"
#include "cli/calibrate_kernels.h"
#endif

#ifdef STOWAGE_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>
#endif

namespace stowage::tools {
namespace {


struct CalibrateSettings {
  int device = 0;
  std::string base = "h200";
  std::string out;
  uint64_t min_chunk = 256 * 1024;
  uint64_t max_chunk = 256 * kMiB;
  uint64_t setup_bytes = 4 * kGiB;
  bool skip_malloc_host = false;
  bool compute_only = false;
  // bench/bench_grouped_mm.py's measurement of torch._grouped_mm (its JSON), folded into the
  // profile; empty: the --base preset's torch._grouped_mm rate is kept.
  std::string torch_grouped_mm;
  std::string torch_grouped_mm_json;
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
  parser.Add(
      {"compute-only", "", "measure only the compute rates; host-link fields from --base", ""});
  parser.Add({"torch-grouped-mm", "PATH",
              "torch._grouped_mm rates bench/bench_grouped_mm.py measured (its --out JSON), "
              "written into torch_grouped_mm_efficiency / _half_tokens",
              ""});
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
  s.compute_only = parser.GetBool("compute-only");
  absl::StatusOr<std::string> torch_grouped_mm = parser.GetString("torch-grouped-mm", "");
  if (!torch_grouped_mm.ok()) return torch_grouped_mm.status();
  s.torch_grouped_mm = *torch_grouped_mm;
  if (!s.torch_grouped_mm.empty()) {
    // Read (and checked below) before any measuring, so a bad file costs no GPU time.
    std::ifstream in(s.torch_grouped_mm, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("--torch-grouped-mm: cannot open '", s.torch_grouped_mm, "'"));
    }
    std::stringstream text;
    text << in.rdbuf();
    s.torch_grouped_mm_json = text.str();
  }
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

// Note [Calibrated op rates]
// Each rate is timed with CUDA events over enough repetitions to run >= 50 ms, after a warm-up,
// on data that is not zero (a memset pattern: zeros draw less power and clock higher than
// training data does). The shares are of the --base preset's peak dense_bf16_flops and, for the
// copy, of its hbm_bytes_per_second (raised to the measured rate when the copy beats it, which
// then makes elementwise_efficiency 1). Strided-batched GEMMs with equal tokens per expert stand
// in for TE GroupedLinear's per-expert cuBLAS GEMMs, which give each expert its own count; the
// fit 1/rate = (1 + half / t) / R is least squares over the measured t (planner::
// FitSaturatingRate). torch._grouped_mm runs a CUTLASS kernel this binary does not link:
// bench/bench_grouped_mm.py times it from PyTorch, and --torch-grouped-mm fits its points the
// same way (planner::ApplyTorchGroupedMmRates; Note [torch._grouped_mm rate]). Fused
// attention needs a kernel this build does not link (cuDNN / flash-attention), so the attention
// rates stay the preset's, and the table says so.

// cuBLAS, loaded when calibrate runs rather than linked: the library is over 500 MiB with its
// Lt half, which the CLI would otherwise carry everywhere (scripts/gpu-check packages what the
// binary links). Without it the GEMM rates stay the --base preset's, and the table says so.
class Cublas {
 public:
  static absl::StatusOr<std::unique_ptr<Cublas>> Load(cudaStream_t stream) {
    auto c = std::unique_ptr<Cublas>(new Cublas());
    for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
      c->library_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (c->library_ != nullptr) break;
    }
    if (c->library_ == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot load cuBLAS: ", dlerror()));
    }
    c->create_ = reinterpret_cast<Create>(dlsym(c->library_, "cublasCreate_v2"));
    c->destroy_ = reinterpret_cast<Destroy>(dlsym(c->library_, "cublasDestroy_v2"));
    c->set_stream_ = reinterpret_cast<SetStream>(dlsym(c->library_, "cublasSetStream_v2"));
    c->gemm_ = reinterpret_cast<Gemm>(dlsym(c->library_, "cublasGemmStridedBatchedEx"));
    if (c->create_ == nullptr || c->destroy_ == nullptr || c->set_stream_ == nullptr ||
        c->gemm_ == nullptr) {
      return absl::UnavailableError("cuBLAS lacks cublasCreate_v2 or cublasGemmStridedBatchedEx");
    }
    if (absl::Status s = Ok(c->create_(&c->handle_), "cublasCreate"); !s.ok()) return s;
    if (absl::Status s = Ok(c->set_stream_(c->handle_, stream), "cublasSetStream"); !s.ok()) {
      return s;
    }
    return c;
  }
  ~Cublas() {
    if (handle_ != nullptr) destroy_(handle_);
    if (library_ != nullptr) dlclose(library_);
  }
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;

  // Column-major bf16 C[m x n] = A[m x k] B[k x n] with fp32 accumulation, `batch` times (the
  // batches' A and C strided, B too when batch > 1).
  absl::Status Gemm16(int m, int n, int k, int batch, const void* a, const void* b, void* c) {
    return GemmOf(CUDA_R_16BF, m, n, k, batch, a, b, c);
  }
  // The same on fp32 operands, as torch runs a float32 mm / bmm with TF32 off: compute type
  // CUBLAS_COMPUTE_32F under the handle's default math mode (CUBLAS_DEFAULT_MATH, never changed
  // here), which keeps cuBLAS off the tensor cores.
  absl::Status Gemm32(int m, int n, int k, int batch, const void* a, const void* b, void* c) {
    return GemmOf(CUDA_R_32F, m, n, k, batch, a, b, c);
  }

 private:
  using Create = cublasStatus_t (*)(cublasHandle_t*);
  using Destroy = cublasStatus_t (*)(cublasHandle_t);
  using SetStream = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
  using Gemm = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                  int, const void*, const void*, cudaDataType, int, long long,
                                  const void*, cudaDataType, int, long long, const void*, void*,
                                  cudaDataType, int, long long, int, cublasComputeType_t,
                                  cublasGemmAlgo_t);
  Cublas() = default;
  absl::Status GemmOf(cudaDataType type, int m, int n, int k, int batch, const void* a,
                      const void* b, void* c) {
    const float alpha = 1, beta = 0;
    return Ok(gemm_(handle_, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a, type, m,
                    static_cast<long long>(m) * k, b, type, k,
                    batch > 1 ? static_cast<long long>(k) * n : 0, &beta, c, type, m,
                    static_cast<long long>(m) * n, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              absl::StrCat("cublasGemmStridedBatchedEx(", type == CUDA_R_32F ? "fp32 " : "bf16 ", m,
                           "x", n, "x", k, ", batch ", batch, ")"));
  }
  static absl::Status Ok(cublasStatus_t status, const std::string& what) {
    if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat(what, " failed: cuBLAS status ", static_cast<int>(status)));
  }
  void* library_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  Create create_ = nullptr;
  Destroy destroy_ = nullptr;
  SetStream set_stream_ = nullptr;
  Gemm gemm_ = nullptr;
};

// Seconds per call of `run` (event-timed, >= 50 ms in all after one warm-up call).
template <typename Run>
absl::StatusOr<double> TimePerCall(cudaStream_t stream, Run run) {
  offload::Event start;
  offload::Event stop;
  if (absl::Status s = start.Init(/*timing=*/true); !s.ok()) return s;
  if (absl::Status s = stop.Init(/*timing=*/true); !s.ok()) return s;
  if (absl::Status s = run(); !s.ok()) return s;
  int reps = 1;
  for (;;) {
    STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), stream), "cudaEventRecord");
    for (int i = 0; i < reps; ++i) {
      if (absl::Status s = run(); !s.ok()) return s;
    }
    STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), stream), "cudaEventRecord");
    STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
    float ms = 0;
    STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), stop.get()),
                                 "cudaEventElapsedTime");
    if (ms >= 50 || reps >= (1 << 16)) return ms * 1e-3 / reps;
    reps *= ms > 0 ? std::clamp(static_cast<int>(60 / ms) + 1, 2, 64) : 64;
  }
}

absl::Status MeasureGemms(int device, Cublas& cublas, cudaStream_t stream,
                          planner::HardwareProfile& p, std::FILE* report) {
  // Dense GEMMs at shapes of the reference cases (tokens x FFN width x hidden and back).
  struct Shape {
    int m, n, k;
  };
  const std::vector<Shape> dense = {{8192, 8192, 8192}, {16384, 14336, 4096}, {16384, 4096, 14336}};
  // Expert GEMMs: 64 experts of [t x 2048] x [2048 x 1536] (hidden 2048, two 768-wide
  // projections, as Qwen3-30B-A3B's experts), t tokens each.
  constexpr int kExperts = 64, kHidden = 2048, kWidth = 1536, kMaxTokens = 2048;
  uint64_t a_elems = uint64_t{1} * kExperts * kMaxTokens * kHidden;
  uint64_t b_elems = uint64_t{1} * kExperts * kHidden * kWidth;
  uint64_t c_elems = uint64_t{1} * kExperts * kMaxTokens * kWidth;
  for (const Shape& s : dense) {
    a_elems = std::max<uint64_t>(a_elems, uint64_t{1} * s.m * s.k);
    b_elems = std::max<uint64_t>(b_elems, uint64_t{1} * s.k * s.n);
    c_elems = std::max<uint64_t>(c_elems, uint64_t{1} * s.m * s.n);
  }
  absl::StatusOr<offload::DeviceBuffer> a = offload::DeviceBuffer::Create(device, 2 * a_elems);
  absl::StatusOr<offload::DeviceBuffer> b = offload::DeviceBuffer::Create(device, 2 * b_elems);
  absl::StatusOr<offload::DeviceBuffer> c = offload::DeviceBuffer::Create(device, 2 * c_elems);
  for (const auto* buffer : {&a, &b, &c}) {
    if (!buffer->ok()) return buffer->status();
  }
  // 0x3C3C as bf16 is 0.0115: small, finite, not zero.
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaMemset(a->get(), 0x3C, 2 * a_elems), "cudaMemset");
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaMemset(b->get(), 0x3C, 2 * b_elems), "cudaMemset");
  auto gemm = [&](int m, int n, int k, int batch) {
    return [&, m, n, k, batch]() {
      return cublas.Gemm16(m, n, k, batch, a->get(), b->get(), c->get());
    };
  };
  double dense_sum = 0;
  for (const Shape& s : dense) {
    absl::StatusOr<double> seconds = TimePerCall(stream, gemm(s.m, s.n, s.k, 1));
    if (!seconds.ok()) return seconds.status();
    const double rate = 2.0 * s.m * s.n * s.k / *seconds;
    dense_sum += rate;
    std::fprintf(report, "%-34s %7.0f TF/s %8.3f\n",
                 absl::StrFormat("GEMM bf16 %dx%dx%d", s.m, s.n, s.k).c_str(), rate / 1e12,
                 rate / p.dense_bf16_flops);
  }
  p.gemm_efficiency = std::min(1.0, dense_sum / dense.size() / p.dense_bf16_flops);
  // fp32 GEMMs at the two kinds of shape the hf recipes run on fp32 operands (Note [Op rates] in
  // planner/hardware/hardware.cc): a router's [tokens x hidden] x [hidden x experts] (DeepSeek-V3's 7168
  // x 256 over 8192 tokens), and the linear-attention fallbacks' 64-token chunk blocks batched
  // over heads and chunks ([64 x 128] x [128 x 128], 32 heads x 64 chunks).
  const std::vector<Shape> fp32 = {{256, 8192, 7168}, {64, 128, 128}};
  const std::vector<int> fp32_batch = {1, 32 * 64};
  uint64_t fa = 0, fb = 0, fc = 0;
  for (size_t i = 0; i < fp32.size(); ++i) {
    const Shape& s = fp32[i];
    fa = std::max<uint64_t>(fa, uint64_t{1} * fp32_batch[i] * s.m * s.k);
    fb = std::max<uint64_t>(fb, uint64_t{1} * fp32_batch[i] * s.k * s.n);
    fc = std::max<uint64_t>(fc, uint64_t{1} * fp32_batch[i] * s.m * s.n);
  }
  absl::StatusOr<offload::DeviceBuffer> a32 = offload::DeviceBuffer::Create(device, 4 * fa);
  absl::StatusOr<offload::DeviceBuffer> b32 = offload::DeviceBuffer::Create(device, 4 * fb);
  absl::StatusOr<offload::DeviceBuffer> c32 = offload::DeviceBuffer::Create(device, 4 * fc);
  for (const auto* buffer : {&a32, &b32, &c32}) {
    if (!buffer->ok()) return buffer->status();
  }
  // 0x3C3C3C3C as fp32 is 0.0115 too.
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaMemset(a32->get(), 0x3C, 4 * fa), "cudaMemset");
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaMemset(b32->get(), 0x3C, 4 * fb), "cudaMemset");
  double fp32_sum = 0;
  for (size_t i = 0; i < fp32.size(); ++i) {
    const Shape& s = fp32[i];
    const int batch = fp32_batch[i];
    absl::StatusOr<double> seconds = TimePerCall(stream, [&]() {
      return cublas.Gemm32(s.m, s.n, s.k, batch, a32->get(), b32->get(), c32->get());
    });
    if (!seconds.ok()) return seconds.status();
    const double rate = 2.0 * batch * s.m * s.n * s.k / *seconds;
    fp32_sum += rate;
    std::fprintf(report, "%-34s %7.0f TF/s %8.3f\n",
                 absl::StrFormat("GEMM fp32 %dx%dx%d, batch %d", s.m, s.n, s.k, batch).c_str(),
                 rate / 1e12, rate / p.dense_fp32_flops);
  }
  p.fp32_gemm_efficiency = std::min(1.0, fp32_sum / fp32.size() / p.dense_fp32_flops);
  std::vector<std::pair<double, double>> points;
  for (int t : {32, 128, 512, kMaxTokens}) {
    absl::StatusOr<double> seconds = TimePerCall(stream, gemm(t, kWidth, kHidden, kExperts));
    if (!seconds.ok()) return seconds.status();
    const double rate = 2.0 * kExperts * t * kWidth * kHidden / *seconds;
    std::fprintf(report, "%-34s %7.0f TF/s %8.3f\n",
                 absl::StrFormat("expert GEMMs, %d tokens/expert", t).c_str(), rate / 1e12,
                 rate / p.dense_bf16_flops);
    points.emplace_back(t, rate);
  }
  if (absl::StatusOr<planner::SaturatingRate> fit = planner::FitSaturatingRate(points); fit.ok()) {
    p.grouped_gemm_efficiency = std::min(1.0, fit->flops_per_second / p.dense_bf16_flops);
    p.grouped_gemm_half_tokens = std::min(1e6, fit->half_tokens);
    std::fprintf(report, "%-34s %8.3f share, half of it at %.0f tokens/expert\n",
                 "  fitted R * t / (t + half)", p.grouped_gemm_efficiency,
                 p.grouped_gemm_half_tokens);
  } else {
    std::fprintf(report, "%-34s %s: the --base preset's kept\n", "  fitted R * t / (t + half)",
                 std::string(fit.status().message()).c_str());
  }
  return absl::OkStatus();
}

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

// NCCL, opened at run time (cmake/StowageCuda.cmake says why it is not linked): the few
// entry points calibrate uses, closed with it.
class NcclApi {
 public:
  NcclApi(const NcclApi&) = delete;
  NcclApi& operator=(const NcclApi&) = delete;
  ~NcclApi() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  static absl::StatusOr<std::unique_ptr<NcclApi>> Open() {
    std::unique_ptr<NcclApi> api(new NcclApi());
    std::vector<std::string> tried = {"libnccl.so.2"};
#ifdef STOWAGE_NCCL_LIBRARY
    tried.push_back(STOWAGE_NCCL_LIBRARY);
#endif
    std::string errors;
    for (const std::string& name : tried) {
      api->handle_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (api->handle_ != nullptr) break;
      const char* e = dlerror();
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", e != nullptr ? e : name);
    }
    if (api->handle_ == nullptr) {
      return absl::UnavailableError(absl::StrCat("NCCL not found at run time (", errors, ")"));
    }
    bool ok = true;
    auto get = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api->handle_, symbol));
      ok = ok && fn != nullptr;
    };
    get(api->comm_init_all, "ncclCommInitAll");
    get(api->comm_destroy, "ncclCommDestroy");
    get(api->get_error_string, "ncclGetErrorString");
    get(api->group_start, "ncclGroupStart");
    get(api->group_end, "ncclGroupEnd");
    get(api->send, "ncclSend");
    get(api->recv, "ncclRecv");
    get(api->all_gather, "ncclAllGather");
    get(api->reduce_scatter, "ncclReduceScatter");
    if (!ok) return absl::UnavailableError("the NCCL library lacks an entry point calibrate uses");
    return api;
  }
  absl::Status Ok(ncclResult_t result, const std::string& what) const {
    if (result == ncclSuccess) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(what, ": ", get_error_string(result)));
  }

  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;

 private:
  NcclApi() = default;
  void* handle_ = nullptr;
};

// One communicator per local GPU (ncclCommInitAll), destroyed with it.
class NcclClique {
 public:
  explicit NcclClique(const NcclApi& api) : api_(api) {}
  NcclClique(const NcclClique&) = delete;
  NcclClique& operator=(const NcclClique&) = delete;
  ~NcclClique() {
    for (ncclComm_t c : comms_) api_.comm_destroy(c);
  }
  absl::Status Init(int gpus) {
    comms_.assign(gpus, nullptr);
    absl::Status s = api_.Ok(api_.comm_init_all(comms_.data(), gpus, nullptr), "ncclCommInitAll");
    if (!s.ok()) comms_.clear();
    return s;
  }
  ncclComm_t operator[](int i) const { return comms_[i]; }

 private:
  const NcclApi& api_;
  std::vector<ncclComm_t> comms_;
};

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

absl::Status MeasureCompute(int device, const cudaDeviceProp& prop, planner::HardwareProfile& p,
                            std::FILE* report) {
  offload::Stream stream;
  if (absl::Status s = stream.Init(device); !s.ok()) return s;
  std::fprintf(report, "%-34s %12s %8s\n", "compute", "rate", "share");
  if (absl::StatusOr<std::unique_ptr<Cublas>> cublas = Cublas::Load(stream.get()); !cublas.ok()) {
    std::fprintf(report, "%-34s not measured (%s): the --base preset's %.3f / %.3f / %.3f kept\n",
                 "GEMM bf16, fp32, expert GEMMs", std::string(cublas.status().message()).c_str(),
                 p.gemm_efficiency, p.fp32_gemm_efficiency, p.grouped_gemm_efficiency);
  } else if (absl::Status gemms = MeasureGemms(device, **cublas, stream.get(), p, report);
             !gemms.ok()) {
    return gemms;
  }
  // Memory-bound: a 16-byte stream copy over 1 GiB (well past any cache).
  constexpr uint64_t kCopyBytes = kGiB;
  absl::StatusOr<offload::DeviceBuffer> src = offload::DeviceBuffer::Create(device, kCopyBytes);
  absl::StatusOr<offload::DeviceBuffer> dst = offload::DeviceBuffer::Create(device, kCopyBytes);
  if (!src.ok()) return src.status();
  if (!dst.ok()) return dst.status();
  absl::StatusOr<double> copy = TimePerCall(stream.get(), [&]() -> absl::Status {
    STOWAGE_CUDA_RETURN_IF_ERROR(LaunchCopyKernel(src->get(), dst->get(), kCopyBytes,
                                                  prop.multiProcessorCount, stream.get()),
                                 "copy kernel");
    return absl::OkStatus();
  });
  if (!copy.ok()) return copy.status();
  const double copy_rate = 2.0 * kCopyBytes / *copy;
  p.hbm_bytes_per_second = std::max(p.hbm_bytes_per_second, copy_rate);
  p.elementwise_efficiency = copy_rate / p.hbm_bytes_per_second;
  std::fprintf(report, "%-34s %7.0f GB/s %8.3f\n", "stream copy (read + write)", copy_rate / 1e9,
               p.elementwise_efficiency);
  // The per-kernel floor: empty kernels back to back.
  absl::StatusOr<double> empty = TimePerCall(stream.get(), [&]() -> absl::Status {
    for (int i = 0; i < 100; ++i) {
      STOWAGE_CUDA_RETURN_IF_ERROR(LaunchEmptyKernel(stream.get()), "empty kernel");
    }
    return absl::OkStatus();
  });
  if (!empty.ok()) return empty.status();
  p.kernel_seconds = std::min(1e-2, *empty / 100);
  std::fprintf(report, "%-34s %7.2f us\n", "empty kernel, back to back", p.kernel_seconds * 1e6);
  std::fprintf(report,
               "%-34s %8.3f / %.3f of the --base preset (not measured: no fused attention "
               "kernel is linked)\n",
               "attention forward / backward", p.flash_forward_efficiency,
               p.flash_backward_efficiency);
  return absl::OkStatus();
}

#endif  // STOWAGE_HAVE_NCCL

// The node's GPUs together: the shared host link, then NCCL among them.
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
  std::fprintf(
      report,
      "arena setup %.2f GiB: %.3f s = %.1f GiB/s (map %.3f, touch %.3f with %d threads, "
      "register %.3f = %.3f s/GiB), node %d%s, resident %s (%s in huge pages)\n",
      gib, st.total_seconds, gib / st.total_seconds, st.map_seconds, st.touch_seconds,
      st.touch_threads, st.register_seconds, st.register_seconds / gib, (*arena)->numa_node(),
      st.numa_bound ? " (bound)" : " (not bound)",
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
  std::string torch_grouped_mm_line;
  if (!settings->torch_grouped_mm.empty()) {
    absl::StatusOr<std::string> line = planner::ApplyTorchGroupedMmRates(
        settings->torch_grouped_mm_json,
        absl::StrCat("--torch-grouped-mm ", settings->torch_grouped_mm), *base);
    if (!line.ok()) {
      std::fprintf(stderr, "stowage calibrate: %s\n", std::string(line.status().message()).c_str());
      return kExitUsage;
    }
    torch_grouped_mm_line = *line;
  }
#ifndef STOWAGE_HAVE_CUDA
  std::fprintf(
      stderr,
      "stowage calibrate: no GPU: this stowage was built without the CUDA backend, and "
      "calibrate measures a GPU's host link and compute rates. Plan with a hardware "
      "preset instead (e.g. %s), whose compute rates are derived from datasheets and "
      "the H200 probe (hardware.cc Note [Op rates]) and whose link and communication fields are "
      "datasheet values.\n",
      settings->base.c_str());
  return kExitUnavailable;
#else
  if (absl::Status status = offload::CudaCheckDevice(settings->device); !status.ok()) {
    std::fprintf(
        stderr,
        "stowage calibrate: no GPU: CUDA device %d is not usable (%s). calibrate "
        "measures a GPU's host link and compute rates; plan with a hardware preset "
        "instead (e.g. %s), whose compute rates are derived from datasheets and the "
        "H200 probe (hardware.cc Note [Op rates]) and whose link and communication fields are "
        "datasheet values.\n",
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
  if (!torch_grouped_mm_line.empty()) {
    std::fprintf(report, "%s (from %s)\n", torch_grouped_mm_line.c_str(),
                 settings->torch_grouped_mm.c_str());
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
