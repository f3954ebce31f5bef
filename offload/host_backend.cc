#include "offload/host_backend.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/checked_math.h"

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

// One issued copy. Its chunks are claimed one at a time from the stream's queue
// (Note [Host stream queue]), so a copy costs one Job whatever its chunk size.
struct Job {
  CopyRequest request;
  std::shared_ptr<HostFence> fence;
  size_t chunk = 0;        // bytes per chunk, > 0
  size_t next_offset = 0;  // guarded by the stream's mu_: the next chunk to claim
  std::atomic<size_t> chunks_left{0};
  std::atomic<int64_t> start_nanos{0};
};

struct Chunk {
  std::shared_ptr<Job> job;
  size_t offset = 0;
  size_t bytes = 0;
};

// Counts workers as they start (and how many pinned themselves), so Create returns only once
// every worker runs -- and, on failure, only once no worker can touch this any more.
struct StartCount {
  absl::Mutex mu;
  int started = 0;  // guarded by mu (read through a Condition's argument)
  int pinned = 0;   // guarded by mu
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

// Note [Host stream queue]. A stream is a FIFO of copies served by worker threads. A worker
// claims the next chunk of the copy at the front under the lock (offset and size from the
// copy's cursor) and pops the copy once its last chunk is claimed, so chunks of one copy are
// spread over the workers in order and the queue holds one entry per copy: a copy of N bytes in
// C-byte chunks costs O(1) memory, not O(N / C). Lock order: Stream::mu_ is a leaf; the workers
// release it before copying, waiting on a dependency or running on_landed.
class HostBackend::Stream {
 public:
  Stream() = default;
  // Stops and joins the workers (after they drained the queue).
  ~Stream() { Stop(); }

  // Starts `threads` workers pinned to `cpus` (best effort). If the OS refuses a thread, the
  // workers already started are stopped and joined, and INTERNAL says how many could start.
  absl::Status Start(int threads, const std::vector<int>& cpus, StartCount* count) {
    workers_.reserve(threads);
    for (int i = 0; i < threads; ++i) {
      try {
        workers_.emplace_back([this, cpus, count] {
          bool pinned = false;
          PinToCpus(cpus, &pinned);
          {
            absl::MutexLock lock(&count->mu);
            ++count->started;
            if (pinned) ++count->pinned;
          }
          Run();
        });
      } catch (const std::system_error& e) {
        const size_t started = workers_.size();
        Stop();
        return absl::InternalError(absl::StrCat("host backend: cannot start copy worker ", i + 1,
                                                " of ", threads, " (", started,
                                                " started): ", e.what()));
      }
    }
    return absl::OkStatus();
  }

  void Enqueue(const std::shared_ptr<Job>& job) {
    const size_t bytes = job->request.bytes;
    // 0 (unchunked) or larger than the copy: one chunk. CeilDiv cannot wrap, unlike
    // (bytes + chunk - 1) / chunk, which made a huge chunk size a copy that never ran.
    job->chunk = job->request.chunk_bytes == 0 || job->request.chunk_bytes > bytes
                     ? std::max<size_t>(bytes, 1)
                     : job->request.chunk_bytes;
    job->chunks_left.store(bytes == 0 ? 1 : CeilDiv(bytes, job->chunk), std::memory_order_relaxed);
    absl::MutexLock lock(&mu_);
    ++jobs_pending_;
    queue_.push_back(job);
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
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

  // The next chunk of the copy at the front; pops the copy with its last chunk.
  Chunk Claim() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::shared_ptr<Job>& front = queue_.front();
    Chunk chunk;
    chunk.job = front;
    chunk.offset = front->next_offset;
    chunk.bytes = std::min(front->chunk, front->request.bytes - front->next_offset);
    front->next_offset += chunk.bytes;  // <= request.bytes
    if (front->next_offset >= front->request.bytes) queue_.pop_front();
    return chunk;
  }

  void Run() {
    while (true) {
      Chunk chunk;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &Stream::HasWorkOrStop));
        if (queue_.empty()) return;  // stop_ and drained
        chunk = Claim();
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
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  int jobs_pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

absl::StatusOr<std::unique_ptr<HostBackend>> HostBackend::Create(
    const HostBackendOptions& options) {
  if (options.threads_per_stream < 0 || options.threads_per_stream > kMaxThreadsPerStream) {
    return absl::InvalidArgumentError(
        absl::StrCat("host backend: threads_per_stream is ", options.threads_per_stream,
                     "; it must be in [0, ", kMaxThreadsPerStream, "] (0: one)"));
  }
  std::unique_ptr<HostBackend> backend(new HostBackend());
  backend->threads_per_stream_ = std::max(1, options.threads_per_stream);
  StartCount count;
  for (auto& stream : backend->streams_) {
    stream = std::make_unique<Stream>();
    if (absl::Status s = stream->Start(backend->threads_per_stream_, options.cpus, &count);
        !s.ok()) {
      backend.reset();  // joins every worker started so far: none touches `count` after this
      return s;
    }
  }
  struct Waiting {
    StartCount* count;
    int workers;
  } waiting{&count, 2 * backend->threads_per_stream_};
  absl::MutexLock lock(&count.mu);
  count.mu.Await(absl::Condition(
      +[](Waiting* w) { return w->count->started == w->workers; }, &waiting));
  if (!options.cpus.empty() && count.pinned == waiting.workers) {
    backend->pinned_cpus_ = options.cpus;
  }
  return backend;
}

HostBackend::~HostBackend() {
  for (auto& stream : streams_) {
    if (stream != nullptr) stream->SetPaused(false);
  }
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
  // Rounded up without wrapping: SIZE_MAX must fail, not become a 256-byte block.
  const std::optional<size_t> rounded =
      CheckedMul(std::max<size_t>(CeilDiv(bytes, kAlign), 1), kAlign);
  void* p = rounded ? std::aligned_alloc(kAlign, *rounded) : nullptr;
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
