#include "runtime/runtime.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "offload/checksum.h"
#include "offload/host_backend.h"
#include "offload/topology.h"
#ifdef STOWAGE_HAVE_CUDA
#include "offload/cuda_backend.h"
#endif

namespace stowage::runtime {
namespace {

using offload::CopyDirection;
using offload::CopyFence;

// Alignment of each save inside its layer's region. DMA runs at full speed from 256-byte aligned
// host addresses; the plan's exact transfer sizes get this much slack each (see Region).
constexpr uint64_t kSaveAlignment = 256;

// Extra bytes per offloading layer so that tensors the trainer splits differently from the
// plan's transfers still start aligned (up to 16 of them; later ones are packed). 45 layers cost
// 180 KiB, far below 1% of any real arena.
constexpr uint64_t kRegionSlack = 16 * kSaveAlignment;

uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

uint32_t StepOf(TensorId id) { return static_cast<uint32_t>(id >> 32); }
uint32_t SlotOf(TensorId id) { return static_cast<uint32_t>(id & 0xffffffffu); }
TensorId MakeId(uint32_t step, uint32_t slot) { return (static_cast<uint64_t>(step) << 32) | slot; }

const char* StateName(int state) {
  static constexpr const char* kNames[] = {"being saved", "saved",          "being prefetched",
                                           "prefetched",  "being restored", "restored",
                                           "corrupt",     "failed"};
  return kNames[state];
}

}  // namespace

int StatusToStowageCode(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 0;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 1;
    case absl::StatusCode::kNotFound:
      return 2;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 3;
    case absl::StatusCode::kResourceExhausted:
      return 4;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kUnimplemented:
      return 5;
    case absl::StatusCode::kDataLoss:
      return 6;
    default:
      return 7;
  }
}

class Runtime::CallScope {
 public:
  explicit CallScope(Runtime* rt) : rt_(rt) {}
  ~CallScope() { rt_->EndCall(); }

 private:
  Runtime* rt_;
};

void Runtime::EndCall() {
  absl::MutexLock lock(&mu_);
  --active_calls_;
}

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const Plan& plan,
                                                         const RuntimeOptions& options) {
  if (options.copy_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy_threads is ", options.copy_threads, "; it must be at least 0"));
  }
  std::unique_ptr<Runtime> rt(new Runtime());
  rt->verify_ = options.verify_checksums;
  rt->prefetch_distance_ = plan.runtime.prefetch_distance;
  rt->layers_ = plan.layers;

  // Backend.
  BackendKind kind = options.backend;
#ifdef STOWAGE_HAVE_CUDA
  if (kind == BackendKind::kAuto)
    kind = offload::CudaDeviceCount() > 0 ? BackendKind::kCuda : BackendKind::kHost;
#else
  if (kind == BackendKind::kAuto) kind = BackendKind::kHost;
  if (kind == BackendKind::kCuda) {
    return absl::UnavailableError(
        "the CUDA backend was asked for but this build of stowage has no CUDA support");
  }
#endif
  rt->backend_kind_ = kind;

  // Placement: the GPU's node and local CPUs (host backend: the calling thread's).
  offload::Placement placement;
  if (kind == BackendKind::kCuda) {
    absl::StatusOr<offload::Placement> found = offload::DiscoverGpuPlacement(options.device);
    if (found.ok()) placement = *std::move(found);
  } else {
    placement = offload::DiscoverHostPlacement();
  }
  if (options.numa_node >= 0) placement.numa_node = options.numa_node;

  std::unique_ptr<offload::DeviceBackend> backend;
  if (kind == BackendKind::kHost) {
    offload::HostBackendOptions host_options;
    host_options.threads_per_stream =
        options.copy_threads > 0 ? options.copy_threads
                                 : std::clamp(static_cast<int>(placement.cpus.size()) / 4, 1, 4);
    host_options.cpus = placement.cpus;
    absl::StatusOr<std::unique_ptr<offload::HostBackend>> host =
        offload::HostBackend::Create(host_options);
    if (!host.ok()) return host.status();
    backend = *std::move(host);
  } else {
#ifdef STOWAGE_HAVE_CUDA
    absl::StatusOr<std::unique_ptr<offload::CudaBackend>> cuda =
        offload::CudaBackend::Create(options.device);
    if (!cuda.ok()) return cuda.status();
    backend = *std::move(cuda);
#endif
  }

  // Counters, set before anything can count.
  auto counters = std::make_shared<RuntimeCounters>();
  counters->device = options.device;
  counters->backend = backend->name();
  counters->predicted_peak_device_bytes = plan.predicted.peak_device_bytes;
  counters->link_ceiling_bytes_per_second = plan.runtime.link_bytes_per_second;
  counters->predicted_host_bytes = plan.predicted.host_bytes_per_gpu;
  counters->predicted_step_seconds = plan.predicted.step_seconds;
  counters->gpu_budget_bytes = plan.gpu_budget_bytes;
  std::map<std::string, LayerTypeCounters*> types;
  rt->layer_type_of_.resize(plan.layers.size(), nullptr);
  for (const LayerPlan& layer : plan.layers) {
    auto [it, inserted] = types.emplace(layer.type, nullptr);
    if (inserted) {
      counters->layer_types.push_back(std::make_unique<LayerTypeCounters>());
      counters->layer_types.back()->layer_type = layer.type;
      it->second = counters->layer_types.back().get();
    }
    rt->layer_type_of_[layer.index] = it->second;
  }
  rt->counters_ = counters;

  // Regions and the arena that holds them.
  uint64_t arena_bytes = 0;
  rt->regions_.resize(plan.layers.size());
  for (const LayerPlan& layer : plan.layers) {
    Region& region = rt->regions_[layer.index];
    region.plan_bytes = layer.host_bytes;
    for (const PlannedTransfer& t : layer.transfers) {
      region.reserved += AlignUp(t.bytes, kSaveAlignment);
    }
    if (region.reserved > 0) region.reserved += kRegionSlack;
    arena_bytes += AlignUp(region.reserved, kSaveAlignment);
  }
  arena_bytes = std::max(arena_bytes, plan.runtime.host_arena_bytes);
  if (arena_bytes > 0) {
    offload::ArenaOptions arena_options;
    arena_options.bytes = arena_bytes;
    arena_options.numa_node = placement.numa_node;
    arena_options.touch_cpus = placement.cpus;
    arena_options.touch_threads = options.copy_threads;
    arena_options.register_with_cuda = kind == BackendKind::kCuda;
    arena_options.cuda_device = options.device;
    arena_options.skip_admission = options.skip_admission;
    arena_options.progress = options.arena_progress;
    absl::StatusOr<std::unique_ptr<offload::PinnedArena>> arena =
        offload::PinnedArena::Create(arena_options);
    if (!arena.ok()) return arena.status();
    rt->arena_ = *std::move(arena);
    counters->arena_capacity_bytes.store(rt->arena_->capacity());
    counters->numa_node = rt->arena_->numa_node();
  } else {
    counters->numa_node = placement.numa_node;
  }

  offload::CopyEngineOptions engine_options;
  engine_options.chunk_bytes =
      options.copy_chunk_bytes > 0 ? options.copy_chunk_bytes : plan.runtime.copy_chunk_bytes;
  rt->engine_ = std::make_unique<offload::CopyEngine>(
      std::move(backend), engine_options, static_cast<offload::CopyObserver*>(rt.get()));

  const std::string address = ResolveMetricsAddress(
      options.metrics_address.has_value() ? options.metrics_address->c_str() : nullptr);
  if (!address.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsExporter>> exporter =
        MetricsExporter::Start(address, counters);
    if (!exporter.ok()) return exporter.status();
    rt->exporter_ = *std::move(exporter);
  }
  return rt;
}

Runtime::~Runtime() {
  if (in_step()) EndStep().IgnoreError();
  exporter_.reset();
  engine_.reset();  // drains before the arena goes
  arena_.reset();
}

bool Runtime::in_step() const {
  absl::MutexLock lock(&mu_);
  return in_step_;
}

std::string Runtime::metrics_address() const {
  return exporter_ == nullptr ? std::string() : exporter_->bound_address();
}

absl::Status Runtime::BeginStep() {
  absl::MutexLock lock(&mu_);
  if (in_step_) {
    return absl::FailedPreconditionError(
        "begin_step: a step is already open; end it with end_step first");
  }
  // Same layout every step: regions in layer order (Note [Step lifecycle]).
  for (Region& region : regions_) {
    region.used = region.saved = 0;
    region.base = nullptr;
    if (region.reserved == 0) continue;
    absl::StatusOr<std::byte*> base = arena_->Allocate(region.reserved, kSaveAlignment);
    if (!base.ok()) {
      arena_->Reset();
      return absl::InternalError(
          absl::StrCat("begin_step: carving layer regions: ", base.status().message()));
    }
    region.base = *base;
  }
  ++step_seq_;
  if (step_seq_ == 0) step_seq_ = 1;  // wrapped after 2^32 steps; 0 stays invalid
  in_step_ = true;
  step_saved_bytes_ = 0;
  step_start_ = std::chrono::steady_clock::now();
  counters_->RecordArenaUse(0);
  return absl::OkStatus();
}

absl::Status Runtime::EndStep() {
  std::vector<std::unique_ptr<Entry>> entries;
  std::chrono::steady_clock::time_point start;
  {
    absl::MutexLock lock(&mu_);
    if (!in_step_) return absl::FailedPreconditionError("end_step: no step is open");
    in_step_ = false;  // new calls now fail; wait for those already inside
    mu_.Await(absl::Condition(
        +[](int* calls) { return *calls == 0; }, &active_calls_));
    entries.swap(entries_);
    start = step_start_;
  }
  // Which copies did the caller never synchronise with? (Note [Step lifecycle])
  int unsynced_saves = 0, unsynced_prefetches = 0, unrestored = 0;
  for (const std::unique_ptr<Entry>& e : entries) {
    switch (e->state) {
      case State::kSaved:
        ++unrestored;
        if (e->d2h != nullptr && !e->synced.load() && !e->d2h->Done()) ++unsynced_saves;
        break;
      case State::kPrefetched:
        ++unrestored;
        if (e->h2d != nullptr && !e->h2d->Done()) ++unsynced_prefetches;
        break;
      default:
        break;
    }
  }
  absl::Status drained = engine_->Drain();
  double stall = 0;
  for (const std::unique_ptr<Entry>& e : entries) {
    if (e->state == State::kRestored && e->h2d != nullptr) stall += e->h2d->stall_seconds();
  }
  AddSeconds(counters_->stall_nanos, stall);
  entries.clear();
  {
    absl::MutexLock lock(&mu_);
    if (arena_ != nullptr) arena_->Reset();
    for (Region& region : regions_) region.base = nullptr;
    step_saved_bytes_ = 0;
  }
  counters_->RecordArenaUse(0);
  counters_->device_pending_bytes.store(0, std::memory_order_relaxed);
  counters_->RecordStep(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  if (!drained.ok()) return drained;
  if (unsynced_saves + unsynced_prefetches > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "end_step: ", unsynced_saves, " save(s) and ", unsynced_prefetches,
        " prefetch(es) were still copying and never restored; they were drained and the step "
        "released (",
        unrestored, " tensor(s) saved but not restored)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Runtime::Entry*> Runtime::Lookup(TensorId id) {
  if (!in_step_) {
    return absl::NotFoundError(absl::StrCat("tensor id ", id, " is unknown: no step is open"));
  }
  if (StepOf(id) != step_seq_) {
    return absl::NotFoundError(absl::StrCat("tensor id ", id,
                                            " is stale or unknown: it does not belong to the "
                                            "current step (ids are valid only in their step)"));
  }
  const uint32_t slot = SlotOf(id);
  if (slot >= entries_.size()) {
    return absl::NotFoundError(absl::StrCat("tensor id ", id, " is unknown in this step"));
  }
  return entries_[slot].get();
}

absl::StatusOr<Runtime::Entry*> Runtime::LookupSaved(TensorId id, const char* call) {
  absl::StatusOr<Entry*> entry = Lookup(id);
  if (!entry.ok()) return entry.status();
  if ((*entry)->d2h == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(call, ": tensor id ", id, " has no copy (its save failed)"));
  }
  return entry;
}

absl::StatusOr<TensorId> Runtime::Save(int layer, const void* src, size_t bytes, void* stream) {
  Entry* entry = nullptr;
  TensorId id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!in_step_) {
      return absl::FailedPreconditionError("save: no step is open; call begin_step first");
    }
    if (layer < 0 || layer >= static_cast<int>(regions_.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "save: layer ", layer, " is out of range; the plan has ", regions_.size(), " layers"));
    }
    if (src == nullptr && bytes > 0) {
      return absl::InvalidArgumentError(absl::StrCat("save: src is NULL (", bytes, " bytes)"));
    }
    Region& region = regions_[layer];
    if (region.reserved == 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "save: layer ", layer, " (policy '", std::string(LayerPolicyName(layers_[layer].policy)),
          "') has no host memory reserved in the plan; ", bytes, " bytes cannot be saved"));
    }
    // Aligned while the region's slack lasts, packed after that: a trainer that splits a
    // layer's transfer into many tensors must never fail on alignment padding. Invariant:
    // padding so far (used - saved) <= slack (reserved - plan_bytes), so saved + bytes <=
    // plan_bytes implies offset + bytes <= reserved.
    uint64_t offset = AlignUp(region.used, kSaveAlignment);
    if ((region.used - region.saved) + (offset - region.used) >
        region.reserved - region.plan_bytes) {
      offset = region.used;
    }
    if (region.saved + bytes > region.plan_bytes || offset + bytes > region.reserved) {
      return absl::ResourceExhaustedError(
          absl::StrCat("save: layer ", layer, " would hold ", region.saved + bytes,
                       " bytes this step but the plan reserved ", region.plan_bytes, " (",
                       region.saved, " already saved, ", bytes, " asked for)"));
    }
    if (entries_.size() >= 0xffffffffu) {
      return absl::ResourceExhaustedError("save: more than 2^32-1 saves in one step");
    }
    auto owned = std::make_unique<Entry>();
    entry = owned.get();
    entry->layer = layer;
    entry->host = region.base + offset;
    entry->bytes = bytes;
    region.used = offset + bytes;
    region.saved += bytes;
    step_saved_bytes_ += bytes;
    counters_->RecordArenaUse(step_saved_bytes_);
    id = MakeId(step_seq_, static_cast<uint32_t>(entries_.size()));
    entries_.push_back(std::move(owned));
    ++active_calls_;
  }
  CallScope scope(this);
  std::function<void()> on_landed;
  if (verify_) {
    on_landed = [entry] {
      entry->checksum.store(offload::Checksum64(entry->host, entry->bytes),
                            std::memory_order_release);
    };
  }
  counters_->device_pending_bytes.fetch_add(bytes, std::memory_order_relaxed);
  absl::StatusOr<std::shared_ptr<CopyFence>> fence =
      engine_->DeviceToHost(entry->host, src, bytes, stream, std::move(on_landed));
  absl::MutexLock lock(&mu_);
  if (!fence.ok()) {
    counters_->device_pending_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    entry->state = State::kFailed;
    return fence.status();
  }
  entry->d2h = *std::move(fence);
  entry->state = State::kSaved;
  counters_->saves_total.fetch_add(1, std::memory_order_relaxed);
  if (LayerTypeCounters* t = layer_type_of_[layer]; t != nullptr) {
    t->offloaded_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  return id;
}

absl::StatusOr<bool> Runtime::SaveQuery(TensorId id) {
  std::shared_ptr<CopyFence> d2h;
  std::atomic<bool>* synced = nullptr;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Entry*> entry = LookupSaved(id, "save_query");
    if (!entry.ok()) return entry.status();
    d2h = (*entry)->d2h;
    synced = &(*entry)->synced;
    ++active_calls_;
  }
  CallScope scope(this);
  engine_->Reap();
  const bool done = d2h->Done();
  if (done) synced->store(true);
  return done;
}

absl::Status Runtime::SaveWait(TensorId id) { return WaitForSave(id, /*host=*/true, nullptr); }

// A null `stream` is the legacy default stream (as for every other call), so it gets a
// device-side wait like any stream: PyTorch trainers on the default stream pass 0, and a host
// wait there would serialize the step on every save.
absl::Status Runtime::SaveWaitStream(TensorId id, void* stream) {
  return WaitForSave(id, /*host=*/false, stream);
}

absl::Status Runtime::WaitForSave(TensorId id, bool host, void* stream) {
  std::shared_ptr<CopyFence> d2h;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Entry*> entry = LookupSaved(id, "save_wait");
    if (!entry.ok()) return entry.status();
    d2h = (*entry)->d2h;
    (*entry)->synced.store(true);
    ++active_calls_;
  }
  CallScope scope(this);
  absl::Status status = host ? d2h->Wait() : d2h->StreamWait(stream, false);
  engine_->Reap();
  return status;
}

absl::Status Runtime::VerifyHostCopy(TensorId id, Entry& entry) {
  if (absl::Status s = entry.d2h->Wait(); !s.ok()) return s;
  const uint64_t expected = entry.checksum.load(std::memory_order_acquire);
  const uint64_t actual = offload::Checksum64(entry.host, entry.bytes);
  if (actual != expected) {
    return absl::DataLossError(
        absl::StrCat("tensor id ", id, " (layer ", entry.layer, ", ", entry.bytes,
                     " bytes): the host copy no longer matches what was saved (checksum ", expected,
                     " at save, ", actual, " now); it was not copied back"));
  }
  return absl::OkStatus();
}

absl::Status Runtime::Prefetch(TensorId id, void* dst, void* stream) {
  Entry* entry = nullptr;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Entry*> found = Lookup(id);
    if (!found.ok()) return found.status();
    entry = *found;
    if (entry->state != State::kSaved) {
      if (entry->state == State::kCorrupt) {
        return absl::DataLossError(
            absl::StrCat("prefetch: tensor id ", id, " failed its integrity check earlier"));
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "prefetch: tensor id ", id, " is ", StateName(static_cast<int>(entry->state)),
          "; a tensor is prefetched at most once, before its restore"));
    }
    if (dst == nullptr && entry->bytes > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefetch: dst is NULL (tensor id ", id, ", ", entry->bytes, " bytes)"));
    }
    entry->state = State::kPrefetching;
    ++active_calls_;
  }
  CallScope scope(this);
  absl::StatusOr<std::shared_ptr<CopyFence>> fence = absl::InternalError("prefetch: not issued");
  if (absl::Status verified = verify_ ? VerifyHostCopy(id, *entry) : absl::OkStatus();
      verified.ok()) {
    fence = engine_->HostToDevice(dst, entry->host, entry->bytes, stream, entry->d2h);
  } else {
    fence = verified;
  }
  absl::MutexLock lock(&mu_);
  if (!fence.ok()) {
    entry->state =
        fence.status().code() == absl::StatusCode::kDataLoss ? State::kCorrupt : State::kSaved;
    return fence.status();
  }
  entry->h2d = *std::move(fence);
  entry->prefetch_dst = dst;
  entry->state = State::kPrefetched;
  return absl::OkStatus();
}

absl::Status Runtime::Restore(TensorId id, void* dst, void* stream) {
  Entry* entry = nullptr;
  bool prefetched = false;
  std::shared_ptr<CopyFence> h2d;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Entry*> found = Lookup(id);
    if (!found.ok()) return found.status();
    entry = *found;
    switch (entry->state) {
      case State::kSaved:
        break;
      case State::kPrefetched:
        prefetched = true;
        h2d = entry->h2d;
        if (dst != entry->prefetch_dst) {
          return absl::InvalidArgumentError(absl::StrCat(
              "restore: tensor id ", id,
              " was prefetched into another buffer; restore into the prefetch destination"));
        }
        break;
      case State::kCorrupt:
        return absl::DataLossError(
            absl::StrCat("restore: tensor id ", id, " failed its integrity check"));
      case State::kRestored:
      case State::kRestoring:
        return absl::FailedPreconditionError(
            absl::StrCat("restore: tensor id ", id,
                         " was already restored; each saved tensor is restored "
                         "once"));
      default:
        return absl::FailedPreconditionError(absl::StrCat(
            "restore: tensor id ", id, " is ", StateName(static_cast<int>(entry->state))));
    }
    if (dst == nullptr && entry->bytes > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("restore: dst is NULL (tensor id ", id, ", ", entry->bytes, " bytes)"));
    }
    entry->state = State::kRestoring;
    ++active_calls_;
  }
  CallScope scope(this);
  absl::Status status;
  if (!prefetched) {
    if (verify_) status = VerifyHostCopy(id, *entry);
    if (status.ok()) {
      absl::StatusOr<std::shared_ptr<CopyFence>> fence =
          engine_->HostToDevice(dst, entry->host, entry->bytes, stream, entry->d2h);
      if (fence.ok()) {
        h2d = *std::move(fence);
      } else {
        status = fence.status();
      }
    }
  }
  if (status.ok()) status = h2d->StreamWait(stream, /*measure_stall=*/true);
  if (status.ok() && verify_ && backend_kind_ == BackendKind::kHost) {
    // The host backend's "device" is readable here: check what actually landed.
    const uint64_t expected = entry->checksum.load(std::memory_order_acquire);
    const uint64_t actual = offload::Checksum64(dst, entry->bytes);
    if (actual != expected) {
      status = absl::DataLossError(
          absl::StrCat("restore: tensor id ", id, " (layer ", entry->layer, ", ", entry->bytes,
                       " bytes) arrived different from what was saved (checksum ", expected,
                       " at save, ", actual, " after the copy back)"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (h2d != nullptr && entry->h2d == nullptr) entry->h2d = h2d;
  if (!status.ok()) {
    if (status.code() == absl::StatusCode::kDataLoss) {
      entry->state = State::kCorrupt;
    } else {
      entry->state = prefetched ? State::kPrefetched : State::kSaved;
    }
    return status;
  }
  entry->state = State::kRestored;
  counters_->restores_total.fetch_add(1, std::memory_order_relaxed);
  if (LayerTypeCounters* t = layer_type_of_[entry->layer]; t != nullptr) {
    t->restored_bytes.fetch_add(entry->bytes, std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

void Runtime::ReportDevicePeak(uint64_t bytes) {
  counters_->observed_peak_device_bytes.store(bytes, std::memory_order_relaxed);
}

LayerInfo Runtime::GetLayerInfo(int layer) const {
  LayerInfo info;
  const LayerPlan& plan = layers_[layer];
  info.index = layer;
  info.offloads = PolicyOffloads(plan.policy) && plan.host_bytes > 0;
  info.host_bytes = plan.host_bytes;
  info.prefetch_after_layer = plan.prefetch_after_layer;
  absl::MutexLock lock(&mu_);
  info.host_bytes_used = in_step_ ? regions_[layer].saved : 0;
  return info;
}

uint64_t Runtime::copies_in_flight() {
  engine_->Reap();
  return engine_->in_flight();
}

absl::Status Runtime::CorruptHostCopyForTesting(TensorId id, size_t offset) {
  std::shared_ptr<CopyFence> d2h;
  std::byte* host = nullptr;
  uint64_t bytes = 0;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Entry*> entry = Lookup(id);
    if (!entry.ok()) return entry.status();
    d2h = (*entry)->d2h;
    host = (*entry)->host;
    bytes = (*entry)->bytes;
  }
  if (offset >= bytes || d2h == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("offset ", offset, " is past the ", bytes, "-byte tensor"));
  }
  if (absl::Status s = d2h->Wait(); !s.ok()) return s;
  host[offset] ^= std::byte{0x5a};
  return absl::OkStatus();
}

void Runtime::OnCopyIssued(CopyDirection direction, uint64_t /*bytes*/) {
  (void)direction;
  counters_->copies_in_flight.fetch_add(1, std::memory_order_relaxed);
}

void Runtime::OnCopyLanded(CopyDirection direction, uint64_t bytes, double busy_seconds) {
  CopyCounters& c = direction == CopyDirection::kDeviceToHost ? counters_->d2h : counters_->h2d;
  c.bytes.fetch_add(bytes, std::memory_order_relaxed);
  c.copies.fetch_add(1, std::memory_order_relaxed);
  AddSeconds(c.busy_nanos, busy_seconds);
  counters_->copies_in_flight.fetch_sub(1, std::memory_order_relaxed);
  if (direction == CopyDirection::kDeviceToHost) {
    // Saturating: EndStep zeroes it, and a straggler reaped later must not wrap it.
    uint64_t pending = counters_->device_pending_bytes.load(std::memory_order_relaxed);
    while (!counters_->device_pending_bytes.compare_exchange_weak(
        pending, pending >= bytes ? pending - bytes : 0, std::memory_order_relaxed)) {
    }
  }
}

}  // namespace stowage::runtime
