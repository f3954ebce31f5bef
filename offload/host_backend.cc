#include "offload/host_backend.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <latch>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace stowage::offload {
namespace {

using Clock = std::chrono::steady_clock;

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

class HostFence final : public CopyFence {
 public:
  HostFence(CopyDirection direction, uint64_t bytes) : CopyFence(direction, bytes) {}

  bool Done() override { return done_.load(std::memory_order_acquire); }

  absl::Status Wait() override {
    if (Done()) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::atomic<bool>* done) { return done->load(std::memory_order_acquire); }, &done_));
    return absl::OkStatus();
  }

  absl::Status StreamWait(void* /*stream*/, bool measure_stall) override {
    if (Done()) return absl::OkStatus();
    const int64_t start = NowNanos();
    absl::Status status = Wait();
    if (measure_stall) stall_nanos_.fetch_add(NowNanos() - start, std::memory_order_relaxed);
    return status;
  }

  double busy_seconds() override {
    return Done() ? static_cast<double>(busy_nanos_.load(std::memory_order_relaxed)) * 1e-9 : 0;
  }
  double stall_seconds() override {
    return static_cast<double>(stall_nanos_.load(std::memory_order_relaxed)) * 1e-9;
  }

  void Complete(int64_t busy_nanos) {
    busy_nanos_.store(busy_nanos, std::memory_order_relaxed);
    absl::MutexLock lock(&mu_);
    done_.store(true, std::memory_order_release);
  }

 private:
  absl::Mutex mu_;
  std::atomic<bool> done_{false};
  std::atomic<int64_t> busy_nanos_{0};
  std::atomic<int64_t> stall_nanos_{0};
};

// One issued copy, shared by its chunks.
struct Job {
  CopyRequest request;
  std::shared_ptr<HostFence> fence;
  std::atomic<size_t> chunks_left{0};
  std::atomic<int64_t> start_nanos{0};
};

struct Chunk {
  std::shared_ptr<Job> job;
  size_t offset = 0;
  size_t bytes = 0;
};

void PinToCpus(const std::vector<int>& cpus, bool* pinned) {
  *pinned = false;
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
  }
  *pinned = pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

}  // namespace

// A FIFO of chunks served by worker threads. Lock order: Stream::mu_ is a leaf; the workers
// release it before copying, waiting on a dependency or running on_landed.
class HostBackend::Stream {
 public:
  // Each worker counts `started` down once it tried to pin itself (`pinned_ok` counts
  // successes), so Create can report exactly where the workers run.
  Stream(int threads, const std::vector<int>& cpus, std::atomic<int>* pinned_ok,
         std::latch* started) {
    workers_.reserve(threads);
    for (int i = 0; i < threads; ++i) {
      workers_.emplace_back([this, cpus, pinned_ok, started] {
        bool pinned = false;
        PinToCpus(cpus, &pinned);
        if (pinned) pinned_ok->fetch_add(1);
        started->count_down();
        Run();
      });
    }
  }

  ~Stream() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : workers_) t.join();
  }

  void Enqueue(const std::shared_ptr<Job>& job) {
    const size_t bytes = job->request.bytes;
    size_t chunk = job->request.chunk_bytes == 0 ? bytes : job->request.chunk_bytes;
    if (chunk == 0) chunk = 1;
    const size_t n = bytes == 0 ? 1 : (bytes + chunk - 1) / chunk;
    job->chunks_left.store(n, std::memory_order_relaxed);
    absl::MutexLock lock(&mu_);
    ++jobs_pending_;
    for (size_t i = 0; i < n; ++i) {
      const size_t offset = i * chunk;
      queue_.push_back(Chunk{job, offset, bytes == 0 ? 0 : std::min(chunk, bytes - offset)});
    }
  }

  void SetPaused(bool paused) {
    absl::MutexLock lock(&mu_);
    paused_ = paused;
  }

  void Synchronize() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* pending) { return *pending == 0; }, &jobs_pending_));
  }

 private:
  void Run() {
    while (true) {
      Chunk chunk;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &Stream::HasWorkOrStop));
        if (queue_.empty()) return;  // stop_ and drained
        chunk = std::move(queue_.front());
        queue_.pop_front();
      }
      Job& job = *chunk.job;
      // A dependency on the other stream (an H2D after its D2H): never one on this stream, so a
      // worker blocked here cannot hold up the copy it waits for.
      if (job.request.after != nullptr) job.request.after->Wait().IgnoreError();
      int64_t expected = 0;
      job.start_nanos.compare_exchange_strong(expected, NowNanos());
      if (chunk.bytes > 0) {
        std::memcpy(static_cast<char*>(job.request.dst) + chunk.offset,
                    static_cast<const char*>(job.request.src) + chunk.offset, chunk.bytes);
      }
      if (job.chunks_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        if (job.request.on_landed) job.request.on_landed();
        job.fence->Complete(NowNanos() - job.start_nanos.load());
        chunk.job.reset();
        absl::MutexLock lock(&mu_);
        --jobs_pending_;
      }
    }
  }

  bool HasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (!queue_.empty() && !paused_) || stop_;
  }

  absl::Mutex mu_;
  std::deque<Chunk> queue_ ABSL_GUARDED_BY(mu_);
  int jobs_pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

absl::StatusOr<std::unique_ptr<HostBackend>> HostBackend::Create(
    const HostBackendOptions& options) {
  if (options.threads_per_stream < 0) {
    return absl::InvalidArgumentError(absl::StrCat("host backend: threads_per_stream is ",
                                                   options.threads_per_stream,
                                                   "; it must be at least 0 (0: one)"));
  }
  std::unique_ptr<HostBackend> backend(new HostBackend());
  backend->threads_per_stream_ = std::max(1, options.threads_per_stream);
  std::atomic<int> pinned_ok{0};
  std::latch started(2 * backend->threads_per_stream_);
  for (auto& stream : backend->streams_) {
    stream =
        std::make_unique<Stream>(backend->threads_per_stream_, options.cpus, &pinned_ok, &started);
  }
  started.wait();
  if (!options.cpus.empty() && pinned_ok.load() == 2 * backend->threads_per_stream_) {
    backend->pinned_cpus_ = options.cpus;
  }
  return backend;
}

HostBackend::~HostBackend() {
  for (auto& stream : streams_) stream->SetPaused(false);
  Synchronize().IgnoreError();
  for (auto& stream : streams_) stream.reset();
}

absl::StatusOr<std::shared_ptr<CopyFence>> HostBackend::Copy(CopyRequest request) {
  if (request.bytes > 0 && (request.dst == nullptr || request.src == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("host backend: ", request.bytes,
                                                   "-byte copy with a null ",
                                                   request.dst == nullptr ? "dst" : "src"));
  }
  auto job = std::make_shared<Job>();
  const CopyDirection direction = request.direction;
  job->fence = std::make_shared<HostFence>(direction, request.bytes);
  job->request = std::move(request);
  std::shared_ptr<CopyFence> fence = job->fence;
  streams_[static_cast<int>(direction)]->Enqueue(job);
  return fence;
}

void HostBackend::SetPausedForTesting(CopyDirection direction, bool paused) {
  streams_[static_cast<int>(direction)]->SetPaused(paused);
}

absl::Status HostBackend::Synchronize() {
  for (auto& stream : streams_) {
    if (stream != nullptr) stream->Synchronize();
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> HostBackend::AllocateDevice(size_t bytes) {
  constexpr size_t kAlign = 256;
  const size_t rounded = std::max(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host backend: cannot allocate ", bytes, " bytes of \"device\" memory"));
  }
  return p;
}

void HostBackend::FreeDevice(void* ptr) { std::free(ptr); }

absl::Status HostBackend::CopyToDevice(void* dst, const void* host_src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
  return absl::OkStatus();
}

absl::Status HostBackend::CopyFromDevice(void* host_dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
  return absl::OkStatus();
}

absl::Status HostBackend::FillDevice(void* dst, int value, size_t bytes) {
  if (bytes > 0) std::memset(dst, value, bytes);
  return absl::OkStatus();
}

}  // namespace stowage::offload
