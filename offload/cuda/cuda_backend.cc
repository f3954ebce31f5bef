#include "offload/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "offload/cuda/cuda_handles.h"
#include "offload/cuda/cuda_status.h"

namespace stowage::offload {
namespace {

class CudaFence final : public CopyFence {
 public:
  CudaFence(CopyDirection direction, uint64_t bytes, int device, Event start, Event end)
      : CopyFence(direction, bytes),
        device_(device),
        start_(std::move(start)),
        end_(std::move(end)) {}

  cudaEvent_t end_event() const { return end_.get(); }

  bool Done() override {
    if (done_.load(std::memory_order_acquire)) return true;
    const cudaError_t e = cudaEventQuery(end_.get());
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) error_.store(e);
    done_.store(true, std::memory_order_release);
    return true;
  }

  absl::Status Wait() override {
    if (!done_.load(std::memory_order_acquire)) {
      const cudaError_t e = cudaEventSynchronize(end_.get());
      if (e != cudaSuccess) error_.store(e);
      done_.store(true, std::memory_order_release);
    }
    return CudaStatus(error_.load(),
                      absl::StrCat("copy of ", bytes(), " bytes (", CopyDirectionName(direction()),
                                   ", device ", device_, ")"));
  }

  absl::Status StreamWait(void* stream, bool measure_stall) override {
    auto s = static_cast<cudaStream_t>(stream);
    if (measure_stall && !Done() && !probe_claimed_.exchange(true)) {
      // The consumer reaches this point at `probe`; it stalls until `end` (if later).
      absl::StatusOr<Event> probe = Event::Create(/*timing=*/true);
      if (probe.ok() && cudaEventRecord(probe->get(), s) == cudaSuccess) {
        probe_ = *std::move(probe);
        probe_ready_.store(true, std::memory_order_release);
      }
    }
    return CudaStatus(cudaStreamWaitEvent(s, end_.get(), 0), "cudaStreamWaitEvent");
  }

  double busy_seconds() override {
    if (!Done() || error_.load() != cudaSuccess) return 0;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, start_.get(), end_.get()) != cudaSuccess) return 0;
    return std::max(0.0, ms * 1e-3);
  }

  double stall_seconds() override {
    if (!probe_ready_.load(std::memory_order_acquire) || !Done()) return 0;
    if (cudaEventQuery(probe_.get()) != cudaSuccess) return 0;  // consumer not there yet
    float ms = 0;
    if (cudaEventElapsedTime(&ms, probe_.get(), end_.get()) != cudaSuccess) return 0;
    return std::max(0.0, ms * 1e-3);
  }

 private:
  int device_;
  Event start_;
  Event end_;
  Event probe_;
  std::atomic<bool> probe_claimed_{false};
  std::atomic<bool> probe_ready_{false};
  std::atomic<bool> done_{false};
  std::atomic<cudaError_t> error_{cudaSuccess};
};

void CUDART_CB RunOnLanded(void* data) {
  auto* fn = static_cast<std::function<void()>*>(data);
  (*fn)();
  delete fn;
}

}  // namespace

struct CudaBackend::Impl {
  int device = 0;
  Stream streams[2];
};

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("CUDA backend: no usable GPU (",
                     e != cudaSuccess ? cudaGetErrorString(e) : "no device", ")"));
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA backend: device ", device, " does not exist; ", count, " visible"));
  }
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  DeviceScope scope(device);
  if (!scope.status().ok()) return scope.status();
  for (Stream& s : impl->streams) {
    if (absl::Status st = s.Init(device); !st.ok()) return st;
  }
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaBackend::~CudaBackend() {
  DeviceScope scope(impl_->device);
  if (absl::Status s = Synchronize(); !s.ok()) {
    std::fprintf(stderr, "stowage: CUDA backend teardown: %s\n", s.ToString().c_str());
  }
}

int CudaBackend::device() const { return impl_->device; }

void* CudaBackend::stream(CopyDirection direction) const {
  return impl_->streams[static_cast<int>(direction)].get();
}

absl::StatusOr<std::shared_ptr<CopyFence>> CudaBackend::Copy(CopyRequest request) {
  if (request.bytes > 0 && (request.dst == nullptr || request.src == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA backend: ", request.bytes,
                                                   "-byte copy with a null ",
                                                   request.dst == nullptr ? "dst" : "src"));
  }
  DeviceScope scope(impl_->device);
  if (!scope.status().ok()) return scope.status();
  cudaStream_t stream = impl_->streams[static_cast<int>(request.direction)].get();
  const std::string what = absl::StrCat(CopyDirectionName(request.direction), " copy of ",
                                        request.bytes, " bytes on device ", impl_->device);

  // Ordered after the work enqueued so far on the caller's stream.
  {
    absl::StatusOr<Event> after = Event::Create(/*timing=*/false);
    if (!after.ok()) return after.status();
    STOWAGE_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(after->get(), static_cast<cudaStream_t>(request.after_stream)),
        absl::StrCat(what, ": cudaEventRecord on the caller's stream"));
    STOWAGE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, after->get(), 0),
                                 absl::StrCat(what, ": cudaStreamWaitEvent"));
  }
  // And after the copy it depends on (an H2D after its D2H).
  if (request.after != nullptr) {
    if (auto* fence = dynamic_cast<CudaFence*>(request.after.get()); fence != nullptr) {
      STOWAGE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, fence->end_event(), 0),
                                   absl::StrCat(what, ": cudaStreamWaitEvent (dependency)"));
    } else if (absl::Status s = request.after->Wait(); !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<Event> start = Event::Create(/*timing=*/true);
  if (!start.ok()) return start.status();
  absl::StatusOr<Event> end = Event::Create(/*timing=*/true);
  if (!end.ok()) return end.status();
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start->get(), stream),
                               absl::StrCat(what, ": cudaEventRecord"));
  const size_t chunk = request.chunk_bytes == 0 ? request.bytes : request.chunk_bytes;
  // Advanced by what was copied, never past request.bytes: `offset += chunk` wraps for a chunk
  // size near SIZE_MAX and would copy the start again.
  for (size_t offset = 0, n = 0; offset < request.bytes; offset += n) {
    n = std::min(chunk, request.bytes - offset);
    STOWAGE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(request.dst) + offset,
                                                 static_cast<const char*>(request.src) + offset, n,
                                                 cudaMemcpyDefault, stream),
                                 absl::StrCat(what, ": cudaMemcpyAsync at offset ", offset));
  }
  if (request.on_landed) {
    auto* fn = new std::function<void()>(std::move(request.on_landed));
    const cudaError_t e = cudaLaunchHostFunc(stream, RunOnLanded, fn);
    if (e != cudaSuccess) {
      delete fn;
      return CudaStatus(e, absl::StrCat(what, ": cudaLaunchHostFunc"));
    }
  }
  STOWAGE_CUDA_RETURN_IF_ERROR(cudaEventRecord(end->get(), stream),
                               absl::StrCat(what, ": cudaEventRecord"));
  return std::shared_ptr<CopyFence>(std::make_shared<CudaFence>(
      request.direction, request.bytes, impl_->device, *std::move(start), *std::move(end)));
}

absl::Status CudaBackend::Synchronize() {
  DeviceScope scope(impl_->device);
  if (!scope.status().ok()) return scope.status();
  for (const Stream& s : impl_->streams) {
    STOWAGE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s.get()),
                                 absl::StrCat("cudaStreamSynchronize(device ", impl_->device, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaBackend::AllocateDevice(size_t bytes) {
  DeviceScope scope(impl_->device);
  if (!scope.status().ok()) return scope.status();
  void* p = nullptr;
  STOWAGE_CUDA_RETURN_IF_ERROR(
      cudaMalloc(&p, std::max<size_t>(bytes, 1)),
      absl::StrCat("cudaMalloc(", bytes, " bytes, device ", impl_->device, ")"));
  return p;
}

void CudaBackend::FreeDevice(void* ptr) {
  DeviceScope scope(impl_->device);
  cudaFree(ptr);
}

absl::Status CudaBackend::CopyToDevice(void* dst, const void* host_src, size_t bytes) {
  DeviceScope scope(impl_->device);
  if (!scope.status().ok()) return scope.status();
  return CudaStatus(cudaMemcpy(dst, host_src, bytes, cudaMemcpyDefault),
                    absl::StrCat("cudaMemcpy(", bytes, " bytes to device ", impl_->device, ")"));
}

absl::Status CudaBackend::CopyFromDevice(void* host_dst, const void* src, size_t bytes) {
  DeviceScope scope(impl_->device);
  if (!scope.status().ok()) return scope.status();
  return CudaStatus(cudaMemcpy(host_dst, src, bytes, cudaMemcpyDefault),
                    absl::StrCat("cudaMemcpy(", bytes, " bytes from device ", impl_->device, ")"));
}

absl::Status CudaBackend::FillDevice(void* dst, int value, size_t bytes) {
  DeviceScope scope(impl_->device);
  if (!scope.status().ok()) return scope.status();
  return CudaStatus(cudaMemset(dst, value, bytes),
                    absl::StrCat("cudaMemset(", bytes, " bytes, device ", impl_->device, ")"));
}

}  // namespace stowage::offload
