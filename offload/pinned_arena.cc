#include "offload/pinned_arena.h"

#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>

#include "absl/strings/str_cat.h"
#include "offload/host_memory.h"

#ifdef STOWAGE_HAVE_CUDA
#include "offload/cuda/cuda_host.h"
#endif

namespace stowage::offload {
namespace {

// Transparent huge page size on x86-64 and (4K-granule) arm64: the mapping is aligned to it so
// the first and last 2 MiB can be huge pages too, and touch slices and registration pieces
// start on it.
constexpr uint64_t kHugePage = uint64_t{2} << 20;
// Touch threads report progress every this many bytes.
constexpr uint64_t kProgressGrain = uint64_t{64} << 20;
constexpr int kMaxTouchThreads = 256;
constexpr int kMaxRegisterThreads = 8;

uint64_t RoundUp(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string Errno(int error) { return absl::StrCat(std::strerror(error), " (errno ", error, ")"); }

void PinCurrentThreadTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (cpu < 0 || cpu >= CPU_SETSIZE) return;
  CPU_SET(cpu, &set);
  // A CPU outside this process's cpuset is refused; touching still works, only less locally.
  (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// Faults in [begin, begin + bytes): one write per base page (with THP the first write of each
// 2 MiB faults in the huge page and the rest hit it).
void Touch(std::byte* begin, uint64_t bytes, uint64_t page, std::atomic<uint64_t>* done) {
  uint64_t reported = 0;
  for (uint64_t offset = 0; offset < bytes; offset += page) {
    *reinterpret_cast<volatile std::byte*>(begin + offset) = std::byte{0};
    if (offset + page - reported >= kProgressGrain) {
      done->fetch_add(offset + page - reported, std::memory_order_relaxed);
      reported = offset + page;
    }
  }
  if (bytes > reported) done->fetch_add(bytes - reported, std::memory_order_relaxed);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PinnedArena>> PinnedArena::Create(const ArenaOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const std::string device_text =
      options.register_with_cuda ? absl::StrCat(" for CUDA device ", options.cuda_device) : "";
  if (options.bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned host arena", device_text, ": capacity must be more than 0 bytes"));
  }
  if (options.numa_node < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned host arena: NUMA node ", options.numa_node, " is not a node"));
  }
  if (options.register_with_cuda) {
#ifdef STOWAGE_HAVE_CUDA
    if (absl::Status status = CudaCheckDevice(options.cuda_device); !status.ok()) return status;
#else
    return absl::UnavailableError(absl::StrCat(
        "pinned host arena of ", options.bytes, " bytes", device_text,
        ": cudaHostRegister asked for, but stowage was built without the CUDA backend"));
#endif
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (options.bytes > UINT64_MAX - 2 * kHugePage) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned host arena of ", options.bytes, " bytes: too large"));
  }
  const uint64_t capacity = RoundUp(options.bytes, page);

  if (!options.skip_admission) {
    AdmissionRequest request;
    request.bytes = capacity;
    request.numa_node = options.numa_node;
    // cudaHostRegister is not charged to RLIMIT_MEMLOCK (Note [What admission checks, and why]).
    request.memlock = MemlockUse::kReport;
    request.what = absl::StrCat("pinned host arena", device_text);
    if (absl::Status status = AdmitHostMemory(request); !status.ok()) return status;
  }

  std::unique_ptr<PinnedArena> arena(new PinnedArena());
  arena->cuda_device_ = options.cuda_device;
  const std::string what = absl::StrCat("pinned host arena of ", capacity, " bytes", device_text,
                                        " on NUMA node ", options.numa_node);

  // ---- Map: over-reserve by one huge page, keep a 2 MiB-aligned window of exactly `capacity`.
  const uint64_t reserve = capacity + kHugePage;
  void* raw = mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    const int error = errno;
    return absl::ResourceExhaustedError(absl::StrCat(what, ": mmap failed: ", Errno(error)));
  }
  const uintptr_t raw_address = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(raw_address, kHugePage);
  if (aligned > raw_address) munmap(raw, aligned - raw_address);
  const uintptr_t tail = aligned + capacity;
  if (raw_address + reserve > tail) {
    munmap(reinterpret_cast<void*>(tail), raw_address + reserve - tail);
  }
  arena->base_ = reinterpret_cast<std::byte*>(aligned);
  arena->capacity_ = capacity;  // from here on the destructor unmaps: every error path rolls back

  if (options.transparent_huge_pages) {
    // EINVAL when the kernel has no THP: small pages then, slower to touch but still exact.
    (void)madvise(arena->base_, capacity, MADV_HUGEPAGE);
  }

  // ---- Bind (Note [Arena setup]). Without NUMA support, or where the sandbox forbids mbind
  // (EPERM: containers without CAP_SYS_NICE), touching from the node's CPUs still places pages
  // by first touch.
  if (options.numa_node >= 0 && numa_available() >= 0) {
    constexpr uint64_t kBitsPerWord = 8 * sizeof(unsigned long);
    std::vector<unsigned long> mask(static_cast<size_t>(options.numa_node) / kBitsPerWord + 2, 0);
    mask[static_cast<size_t>(options.numa_node) / kBitsPerWord] |=
        1ul << (static_cast<uint64_t>(options.numa_node) % kBitsPerWord);
    if (mbind(arena->base_, capacity, MPOL_BIND, mask.data(), mask.size() * kBitsPerWord, 0) == 0) {
      arena->stats_.numa_bound = true;
    } else {
      const int error = errno;
      if (error == EINVAL) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": mbind(MPOL_BIND) refused the node: ", Errno(error)));
      }
      std::fprintf(stderr, "stowage: %s: mbind(MPOL_BIND) failed (%s); relying on first touch\n",
                   what.c_str(), Errno(error).c_str());
    }
  }
  arena->numa_node_ = arena->stats_.numa_bound ? options.numa_node : -1;
  arena->stats_.map_seconds = SecondsSince(start);

  // ---- Touch, one thread per node-local CPU, each on its own contiguous 2 MiB-aligned slice.
  const auto touch_start = std::chrono::steady_clock::now();
  int threads = options.touch_threads;
  if (threads <= 0) {
    threads = !options.touch_cpus.empty()
                  ? static_cast<int>(options.touch_cpus.size())
                  : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  threads = static_cast<int>(std::clamp<uint64_t>(
      std::min<uint64_t>(threads, RoundUp(capacity, kHugePage) / kHugePage), 1, kMaxTouchThreads));
  const uint64_t slice = RoundUp((capacity + threads - 1) / threads, kHugePage);
  std::atomic<uint64_t> touched{0};
  std::atomic<int> finished{0};
  try {
    std::vector<std::jthread> workers;
    workers.reserve(threads);
    for (int t = 0; t < threads; ++t) {
      const uint64_t begin = std::min<uint64_t>(capacity, t * slice);
      const uint64_t end = std::min<uint64_t>(capacity, begin + slice);
      const int cpu = options.touch_cpus.empty()
                          ? -1
                          : options.touch_cpus[static_cast<size_t>(t) % options.touch_cpus.size()];
      std::byte* base = arena->base_;
      workers.emplace_back([=, &touched, &finished] {
        if (cpu >= 0) PinCurrentThreadTo(cpu);
        Touch(base + begin, end - begin, page, &touched);
        finished.fetch_add(1, std::memory_order_release);
      });
    }
    if (options.progress) {
      while (finished.load(std::memory_order_acquire) < threads) {
        options.progress(touched.load(std::memory_order_relaxed), capacity);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  } catch (const std::exception& e) {  // std::system_error: no thread could be started
    return absl::ResourceExhaustedError(absl::StrCat(what, ": touch threads: ", e.what()));
  }
  if (options.progress) options.progress(capacity, capacity);
  arena->stats_.touch_threads = threads;
  arena->stats_.touch_seconds = SecondsSince(touch_start);

  // ---- Register (Note [Registration pieces]).
  if (options.register_with_cuda) {
#ifdef STOWAGE_HAVE_CUDA
    const auto register_start = std::chrono::steady_clock::now();
    const uint64_t piece =
        options.register_piece_bytes == 0
            ? capacity
            : std::min(capacity, RoundUp(options.register_piece_bytes, kHugePage));
    std::vector<Piece> pieces;
    for (uint64_t offset = 0; offset < capacity; offset += piece) {
      pieces.push_back(Piece{offset, std::min(piece, capacity - offset)});
    }
    // A piece whose thread never ran is not registered (and must not be unregistered).
    std::vector<absl::Status> results(pieces.size(), absl::CancelledError("not registered"));
    absl::Status thread_error;
    auto register_some = [&](size_t first, size_t stride) {
      for (size_t i = first; i < pieces.size(); i += stride) {
        results[i] = CudaHostRegisterRange(options.cuda_device, arena->base_ + pieces[i].offset,
                                           pieces[i].bytes, options.numa_node);
      }
    };
    const size_t register_threads = std::min<size_t>(pieces.size(), kMaxRegisterThreads);
    if (register_threads <= 1) {
      register_some(0, 1);
    } else {
      try {
        std::vector<std::jthread> workers;
        for (size_t t = 0; t < register_threads; ++t) {
          workers.emplace_back(register_some, t, register_threads);
        }
      } catch (const std::exception& e) {
        // Threads that started have been joined; what they registered is rolled back below.
        thread_error =
            absl::ResourceExhaustedError(absl::StrCat(what, ": registration threads: ", e.what()));
      }
    }
    absl::Status first_error = thread_error;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (results[i].ok()) {
        arena->registered_pieces_.push_back(pieces[i]);
      } else if (first_error.ok()) {
        first_error = results[i];
      }
    }
    arena->stats_.register_pieces = static_cast<int>(arena->registered_pieces_.size());
    arena->stats_.register_seconds = SecondsSince(register_start);
    if (!first_error.ok()) return first_error;  // the destructor unregisters what succeeded
    arena->piece_bytes_ = pieces.size() > 1 ? piece : 0;
#endif
  }
  arena->stats_.total_seconds = SecondsSince(start);
  return arena;
}

PinnedArena::~PinnedArena() {
#ifdef STOWAGE_HAVE_CUDA
  for (const Piece& piece : registered_pieces_) {
    if (absl::Status status = CudaHostUnregisterRange(cuda_device_, base_ + piece.offset);
        !status.ok()) {
      std::fprintf(stderr, "stowage: pinned host arena teardown: %s\n", status.ToString().c_str());
    }
  }
#endif
  if (base_ != nullptr && munmap(base_, capacity_) != 0) {
    const int error = errno;
    std::fprintf(stderr, "stowage: pinned host arena teardown: munmap of %llu bytes: %s\n",
                 static_cast<unsigned long long>(capacity_), Errno(error).c_str());
  }
}

absl::StatusOr<std::byte*> PinnedArena::Allocate(uint64_t bytes, uint64_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned host arena: alignment ", alignment, " is not a power of two"));
  }
  const uintptr_t base_address = reinterpret_cast<uintptr_t>(base_);
  absl::MutexLock lock(&mu_);
  uint64_t offset = RoundUp(base_address + offset_, alignment) - base_address;
  if (piece_bytes_ != 0 && bytes > 0) {
    if (bytes > piece_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "pinned host arena (node ", numa_node_, "): ", bytes, " bytes exceed a registration ",
          "piece of ", piece_bytes_, " bytes (register_piece_bytes)"));
    }
    if (offset / piece_bytes_ != (offset + bytes - 1) / piece_bytes_) {
      offset = RoundUp(base_address + RoundUp(offset, piece_bytes_), alignment) - base_address;
    }
  }
  if (bytes == 0) return base_ + std::min(offset, capacity_);  // consumes nothing
  if (offset > capacity_ || bytes > capacity_ - offset) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pinned host arena (capacity ", capacity_, " bytes, node ", numa_node_,
                     "): cannot allocate ", bytes, " bytes aligned to ", alignment, ": ", offset_,
                     " bytes in use, ", capacity_ - offset_, " free"));
  }
  offset_ = offset + bytes;
  peak_ = std::max(peak_, offset_);
  return base_ + offset;
}

void PinnedArena::Reset() {
  absl::MutexLock lock(&mu_);
  offset_ = 0;
}

uint64_t PinnedArena::used() const {
  absl::MutexLock lock(&mu_);
  return offset_;
}

uint64_t PinnedArena::peak() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

std::vector<uint64_t> PinnedArena::registration_piece_offsets() const {
  std::vector<uint64_t> offsets;
  for (const Piece& piece : registered_pieces_) offsets.push_back(piece.offset);
  return offsets;
}

}  // namespace stowage::offload
