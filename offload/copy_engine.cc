#include "offload/copy_engine.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stowage::offload {

absl::Status CheckCopyChunkBytes(uint64_t bytes, std::string_view what) {
  if (bytes >= kMinCopyChunkBytes && bytes <= kMaxCopyChunkBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(std::string(what), " is ", bytes,
                                                 "; it must be in [", kMinCopyChunkBytes, ", ",
                                                 kMaxCopyChunkBytes, "] bytes (4 KiB to 1 GiB)"));
}

CopyEngine::CopyEngine(std::unique_ptr<DeviceBackend> backend, const CopyEngineOptions& options,
                       CopyObserver* observer)
    : backend_(std::move(backend)), chunk_bytes_(options.chunk_bytes), observer_(observer) {}

CopyEngine::~CopyEngine() { Drain().IgnoreError(); }

absl::StatusOr<std::shared_ptr<CopyFence>> CopyEngine::DeviceToHost(
    void* host_dst, const void* src, size_t bytes, void* producer_stream,
    std::function<void()> on_landed, std::shared_ptr<CopyFence> after) {
  CopyRequest request;
  request.direction = CopyDirection::kDeviceToHost;
  request.dst = host_dst;
  request.src = src;
  request.bytes = bytes;
  request.after_stream = producer_stream;
  request.after = std::move(after);
  request.on_landed = std::move(on_landed);
  return Issue(std::move(request));
}

absl::StatusOr<std::shared_ptr<CopyFence>> CopyEngine::HostToDevice(
    void* dst, const void* host_src, size_t bytes, void* consumer_stream,
    std::shared_ptr<CopyFence> after, std::function<void()> on_landed) {
  CopyRequest request;
  request.direction = CopyDirection::kHostToDevice;
  request.dst = dst;
  request.src = host_src;
  request.bytes = bytes;
  request.after_stream = consumer_stream;
  request.after = std::move(after);
  request.on_landed = std::move(on_landed);
  return Issue(std::move(request));
}

absl::StatusOr<std::shared_ptr<CopyFence>> CopyEngine::Issue(CopyRequest request) {
  Reap();
  request.chunk_bytes = chunk_bytes_;
  const CopyDirection direction = request.direction;
  const uint64_t bytes = request.bytes;
  absl::StatusOr<std::shared_ptr<CopyFence>> fence = backend_->Copy(std::move(request));
  if (!fence.ok()) return fence.status();
  in_flight_.fetch_add(1, std::memory_order_relaxed);
  if (observer_ != nullptr) observer_->OnCopyIssued(direction, bytes);
  absl::MutexLock lock(&mu_);
  pending_.push_back(*fence);
  return fence;
}

void CopyEngine::Reap() {
  std::vector<std::shared_ptr<CopyFence>> pending;
  {
    absl::MutexLock lock(&mu_);
    if (pending_.empty()) return;
    pending.swap(pending_);
  }
  // Poll outside the lock (CUDA calls); what has not landed goes back.
  std::vector<std::shared_ptr<CopyFence>> still;
  for (std::shared_ptr<CopyFence>& fence : pending) {
    if (!fence->Done()) {
      still.push_back(std::move(fence));
      continue;
    }
    in_flight_.fetch_sub(1, std::memory_order_relaxed);
    if (observer_ != nullptr) {
      observer_->OnCopyLanded(fence->direction(), fence->bytes(), fence->busy_seconds());
    }
  }
  if (still.empty()) return;
  absl::MutexLock lock(&mu_);
  pending_.insert(pending_.end(), std::make_move_iterator(still.begin()),
                  std::make_move_iterator(still.end()));
}

absl::Status CopyEngine::Drain() {
  absl::Status status = backend_->Synchronize();
  Reap();
  return status;
}

}  // namespace stowage::offload
