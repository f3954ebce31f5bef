// `stowage calibrate`'s compute rates (cli/calibrate_compute.h): cuBLAS, loaded at run time, for
// the GEMM rates; calibrate_kernels.cu for the stream copy and the per-kernel floor.
#include "cli/calibrate_compute.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/bytes.h"
#include "cli/calibrate_kernels.h"
#include "offload/cuda/cuda_handles.h"
#include "offload/cuda/cuda_status.h"
#include "planner/hardware/hardware.h"

namespace stowage::tools::calibrate {
namespace {

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
  // planner/hardware/hardware.cc): a router's [tokens x hidden] x [hidden x experts] (DeepSeek-V3's
  // 7168 x 256 over 8192 tokens), and the linear-attention fallbacks' 64-token chunk blocks batched
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

}  // namespace

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

}  // namespace stowage::tools::calibrate
