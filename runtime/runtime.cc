#include "runtime/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "offload/checksum.h"
#include "runtime/metrics.h"
#ifdef STOWAGE_HAVE_CUDA
#include "offload/cuda/cuda_host.h"
#endif

namespace stowage::runtime {
namespace {

using offload::CopyDirection;
using offload::CopyFence;

// What a rank of `stage` carries out (Note [Pipeline stages]): every layer keeps its model index,
// the other stages' layers reserve nothing and offload nothing here, and the predictions and the
// arena are the stage's. `plan` passed ValidatePlan.
absl::StatusOr<Plan> StageView(const Plan& plan, int stage, std::vector<int>* stage_of_layer) {
  if (stage < 0 || stage >= plan.pp) {
    return absl::InvalidArgumentError(absl::StrCat("options->stage is ", stage, "; allowed: 0 to ",
                                                   plan.pp - 1, " (the plan's run.pp is ", plan.pp,
                                                   ")"));
  }
  Plan view = plan;
  const std::vector<StagePlan> stages = PlanStages(plan);
  const StagePlan& mine = stages[stage];
  stage_of_layer->assign(plan.layers.size(), -1);
  for (const StagePlan& st : stages) {
    for (const LayerRange& c : st.chunks) {
      for (int i = c.first_layer; i < c.end(); ++i) (*stage_of_layer)[i] = st.stage;
    }
  }
  for (size_t i = 0; i < view.layers.size(); ++i) {
    if ((*stage_of_layer)[i] == stage) continue;
    LayerPlan& l = view.layers[i];
    l.host_bytes = 0;
    l.transfers.clear();
    l.save_wait_before_layer = l.prefetch_after_layer = -1;
  }
  view.stages = {mine};
  view.runtime.prefetch_distance = mine.prefetch_distance;
  view.runtime.host_arena_bytes = mine.host_arena_bytes;
  view.predicted.peak_device_bytes = mine.peak_device_bytes;
  view.predicted.fixed_device_bytes = mine.fixed_device_bytes;
  view.predicted.host_bytes_per_gpu = mine.host_bytes_per_gpu;
  return view;
}

// The `gpu` label (Note [Rank labels]): the UUID, else the PCI bus id, else the ordinal.
std::string GpuLabel(BackendKind kind, int device, const offload::Placement& placement) {
  if (kind != BackendKind::kCuda) return "host";
#ifdef STOWAGE_HAVE_CUDA
  if (absl::StatusOr<std::string> uuid = offload::CudaDeviceUuid(device); uuid.ok()) return *uuid;
#endif
  if (!placement.pci_bus_id.empty()) return placement.pci_bus_id;
  return absl::StrCat("cuda:", device);
}

}  // namespace

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

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const Plan& full_plan,
                                                         const RuntimeOptions& options) {
  // Note [Plans that do not fit] (plan.h): such a plan explains why nothing fits; running it would
  // run out of the budget it names.
  if (!full_plan.fits) {
    const PlanBinding& b = full_plan.binding;
    return absl::FailedPreconditionError(absl::StrFormat(
        "plan: fits is false: the plan exceeds its %s budget by %d bytes (%.2f GiB) at the %s "
        "(%s: %s); it explains why nothing fits and is not a plan to run: plan again with a "
        "larger budget, a shorter sequence or more parallelism",
        b.budget, b.exceeded_by_bytes, static_cast<double>(b.exceeded_by_bytes) / (1 << 30), b.at,
        b.what, b.explanation));
  }
  const bool chunk_from_plan = options.copy_chunk_bytes == 0;
  const uint64_t chunk_bytes =
      chunk_from_plan ? full_plan.runtime.copy_chunk_bytes : options.copy_chunk_bytes;
  if (absl::Status s = offload::CheckCopyChunkBytes(
          chunk_bytes, chunk_from_plan ? "plan: runtime.copy_chunk_bytes" : "copy_chunk_bytes");
      !s.ok()) {
    return s;
  }
  if (!options.step_seconds_buckets.empty()) {
    if (absl::Status s =
            CheckStepSecondsBuckets(options.step_seconds_buckets, "step_seconds_buckets");
        !s.ok()) {
      return s;
    }
  }
  std::unique_ptr<Runtime> rt(new Runtime());
  absl::StatusOr<Plan> staged = StageView(full_plan, options.stage, &rt->stage_of_layer_);
  if (!staged.ok()) return staged.status();
  const Plan& plan = *staged;
  rt->stage_ = options.stage;
  rt->verify_ = options.verify_checksums;
  rt->prefetch_distance_ = plan.runtime.prefetch_distance;
  rt->plan_hash_ = CanonicalPlanHash(full_plan);  // every rank holds the whole plan
  rt->layers_ = plan.layers;
  absl::StatusOr<StepRegions> regions = StepRegions::FromPlan(plan);
  if (!regions.ok()) return regions.status();
  {
    absl::MutexLock lock(&rt->mu_);
    rt->regions_ = *std::move(regions);
  }

  // The launcher's ranks (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE...) once, checked before anything
  // starts; admission, the CPU share and the metrics' labels all read these.
  absl::StatusOr<offload::LedgerOptions> ledger = offload::ResolveLedgerOptions(options.ledger);
  if (!ledger.ok()) return ledger.status();
  RuntimeOptions resolved = options;
  resolved.ledger = *std::move(ledger);

  offload::BackendOptions backend_options;
  backend_options.kind = options.backend;
  backend_options.device = options.device;
  backend_options.numa_node = options.numa_node;
  backend_options.copy_threads = options.copy_threads;
  absl::StatusOr<offload::Backend> backend = offload::PlaceBackend(backend_options);
  if (!backend.ok()) return backend.status();
  rt->backend_kind_ = backend->kind;
  // Note [CPU shares]: the ranks on this NUMA node, from the launcher's local world size where it
  // gives one (Note [Local world size]), else as the plan's hardware has them.
  backend_options.ranks_sharing_node =
      resolved.ledger.local_world_size > 0
          ? offload::RanksSharingNumaNode(resolved.ledger.local_world_size, backend->placement)
          : std::max(1, plan.runtime.gpus_per_numa_node);
  // Admitted with the node's other ranks first: the ledger's slot and count decide which CPUs
  // this rank's copy workers and page-touch threads use (Note [CPU shares]).
  if (absl::Status s = rt->Admit(plan, resolved, *backend, &backend_options); !s.ok()) return s;
  if (absl::Status s = offload::StartBackend(backend_options, &*backend); !s.ok()) return s;
  rt->cpu_share_ = offload::CopyCpus(backend_options, backend->placement);

  // Counters, set before anything can count.
  rt->counters_ = MakeCounters(plan, resolved, *backend->device, &rt->layer_type_of_);
  rt->counters_->gpu = GpuLabel(backend->kind, options.device, backend->placement);
  if (absl::Status s = rt->CreateArena(plan, resolved, *backend); !s.ok()) return s;

  offload::CopyEngineOptions engine_options;
  engine_options.chunk_bytes = chunk_bytes;
  rt->engine_ = std::make_unique<offload::CopyEngine>(
      std::move(backend->device), engine_options, static_cast<offload::CopyObserver*>(rt.get()));
  return rt;
}

std::shared_ptr<RuntimeCounters> Runtime::MakeCounters(const Plan& plan,
                                                       const RuntimeOptions& options,
                                                       const offload::DeviceBackend& backend,
                                                       std::vector<LayerTypeCounters*>* type_of) {
  auto counters = std::make_shared<RuntimeCounters>();
  counters->rank = options.ledger.rank >= 0 ? options.ledger.rank : offload::RankFromEnvironment();
  counters->local_rank = options.ledger.local_rank >= 0 ? options.ledger.local_rank
                                                        : offload::LocalRankFromEnvironment();
  counters->stage = options.stage;  // the stage this rank runs (Note [Pipeline stages])
  if (char name[256] = {}; gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') {
    counters->hostname = name;
  }
  if (!options.step_seconds_buckets.empty()) {
    counters->SetStepSecondsBuckets(options.step_seconds_buckets);
  }
  counters->backend = backend.name();
  counters->predicted_peak_device_bytes = plan.predicted.peak_device_bytes;
  counters->link_bytes_per_second = plan.runtime.link_bytes_per_second;
  counters->predicted_host_bytes_per_gpu = plan.predicted.host_bytes_per_gpu;
  counters->predicted_step_seconds = plan.predicted.step_seconds;
  counters->gpu_budget_bytes = plan.gpu_budget_bytes;
  std::map<std::string, LayerTypeCounters*> types;
  type_of->assign(plan.layers.size(), nullptr);
  for (const LayerPlan& layer : plan.layers) {
    auto [it, inserted] = types.emplace(layer.type, nullptr);
    if (inserted) {
      counters->layer_types.push_back(std::make_unique<LayerTypeCounters>());
      counters->layer_types.back()->layer_type = layer.type;
      it->second = counters->layer_types.back().get();
    }
    (*type_of)[layer.index] = it->second;
  }
  return counters;
}

uint64_t Runtime::ArenaBytes(const Plan& plan) const {
  absl::MutexLock lock(&mu_);
  return std::max(regions_.arena_bytes(), plan.runtime.host_arena_bytes);
}

// Note [CPU shares]. Ranks on one NUMA node divide its CPUs: rank r of n takes the r-th of n
// near-equal slices (CpuShare) for its host-backend copy workers and its arena's page-touch
// threads, so eight ranks starting together do not each run 16 touch threads on the same cores
// (the probe's 32 GiB touch took 0.6 s with 16 threads on one GPU's node, 7.3 s with one). n is
// the most of the ranks expected on the node and the live reservations the node ledger counts at
// admission (this one included); the ranks expected are the launcher's local world size on this
// node where it gives one (LOCAL_WORLD_SIZE: Note [Local world size] in offload/node_ledger.h),
// else the plan's gpus_per_numa_node. r is the ledger slot (the smallest free one, so a restarted
// rank takes the slice its predecessor left). Without admission (skip_admission, or nothing to
// offload) there is no slot: the local rank ($LOCAL_RANK) stands in for it when known, else the
// rank copies on all of the node's CPUs with 1/n of the threads.
absl::Status Runtime::Admit(const Plan& plan, const RuntimeOptions& options,
                            const offload::Backend& backend, offload::BackendOptions* share) {
  const uint64_t arena_bytes = ArenaBytes(plan);
  if (arena_bytes == 0 || options.skip_admission) {
    const int local_rank = options.ledger.local_rank >= 0 ? options.ledger.local_rank
                                                          : offload::LocalRankFromEnvironment();
    share->cpu_slot = local_rank >= 0 ? local_rank % share->ranks_sharing_node : -1;
    return absl::OkStatus();
  }
  // Admitted together with the other ranks on this node (Note [Node ledger]); the arena's own
  // check, which sees this process alone, is then redundant.
  offload::AdmissionRequest request;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  request.bytes = arena_bytes + (page - arena_bytes % page) % page;  // the arena's capacity
  request.numa_node = backend.placement.numa_node;
  request.what = backend.kind == BackendKind::kCuda
                     ? absl::StrCat("pinned host arena for CUDA device ", options.device)
                     : std::string("pinned host arena");
  absl::StatusOr<std::unique_ptr<offload::NodeReservation>> reservation =
      offload::NodeReservation::Admit(request, options.ledger);
  if (!reservation.ok()) return reservation.status();
  reservation_ = *std::move(reservation);
  share->ranks_sharing_node = std::max(share->ranks_sharing_node, reservation_->ranks_on_node());
  share->cpu_slot = reservation_->slot();
  return absl::OkStatus();
}

// The arena holds every layer's region (or the plan's host_arena_bytes if larger), sized once
// here: admission (Admit), NUMA binding and page touching happen before step 0, never in a step.
absl::Status Runtime::CreateArena(const Plan& plan, const RuntimeOptions& options,
                                  const offload::Backend& backend) {
  const uint64_t arena_bytes = ArenaBytes(plan);
  if (arena_bytes == 0) {
    counters_->numa_node = backend.placement.numa_node;
    return absl::OkStatus();
  }
  offload::ArenaOptions arena_options;
  arena_options.bytes = arena_bytes;
  arena_options.numa_node = backend.placement.numa_node;
  // Note [CPU shares]: this rank's slice of the node's CPUs, not all of them.
  arena_options.touch_cpus = cpu_share_;
  arena_options.touch_threads = options.copy_threads;
  arena_options.register_with_cuda = backend.kind == BackendKind::kCuda;
  arena_options.cuda_device = options.device;
  arena_options.skip_admission = true;
  arena_options.progress = options.arena_progress;
  absl::StatusOr<std::unique_ptr<offload::PinnedArena>> arena =
      offload::PinnedArena::Create(arena_options);
  if (!arena.ok()) return arena.status();
  arena_ = *std::move(arena);
  if (reservation_ != nullptr) {
    if (absl::Status s = reservation_->MarkResident(); !s.ok()) return s;
  }
  counters_->arena_capacity_bytes.store(arena_->capacity());
  counters_->numa_node = arena_->numa_node();
  return absl::OkStatus();
}

Runtime::~Runtime() {
  if (in_step()) EndStep().IgnoreError();
  engine_.reset();  // drains before the arena goes
  arena_.reset();
  reservation_.reset();  // after the memory is unmapped
}

bool Runtime::in_step() const {
  absl::MutexLock lock(&mu_);
  return in_step_;
}

// Note [One step call at a time]. The header forbids BeginStep and EndStep from racing each
// other, but a forbidden call must still be a status, never a crash: EndStep releases the step in
// two parts around the drain, so a BeginStep (or a second EndStep) from another thread between
// them opened a step whose regions the first EndStep then released, and the saves of that step
// wrote into freed slots. Each of them claims step_call_ first; a thread that finds it taken is
// refused with FAILED_PRECONDITION and changes nothing. The flag is not a lock: the refused call
// does not wait, since the header says the caller must not have made it.
namespace {

class StepCallClaim {
 public:
  explicit StepCallClaim(std::atomic<bool>* flag)
      : flag_(flag), claimed_(!flag->exchange(true, std::memory_order_acquire)) {}
  StepCallClaim(const StepCallClaim&) = delete;
  StepCallClaim& operator=(const StepCallClaim&) = delete;
  ~StepCallClaim() {
    if (claimed_) flag_->store(false, std::memory_order_release);
  }
  // FAILED_PRECONDITION naming `call` when another thread holds the flag.
  absl::Status Check(const char* call) const {
    if (claimed_) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        call,
        ": another thread is inside begin_step or end_step on this runtime; step calls must not "
        "run concurrently (stowage.h, Thread-safety): nothing was done"));
  }

 private:
  std::atomic<bool>* flag_;
  bool claimed_;
};

}  // namespace

absl::Status Runtime::BeginStep() {
  StepCallClaim claim(&step_call_);
  if (absl::Status s = claim.Check("begin_step"); !s.ok()) return s;
  return BeginStepAlone();
}

absl::Status Runtime::EndStep() {
  StepCallClaim claim(&step_call_);
  if (absl::Status s = claim.Check("end_step"); !s.ok()) return s;
  return EndStepAlone();
}

absl::Status Runtime::BeginStepAlone() {
  absl::MutexLock lock(&mu_);
  if (in_step_) {
    return absl::FailedPreconditionError(
        "begin_step: a step is already open; end it with end_step first");
  }
  // Same layout every step: regions in layer order (Note [Step lifecycle]).
  if (absl::Status s = regions_.Carve(arena_.get()); !s.ok()) return s;
  tensors_.Open();
  trace_.BeginStep();
  in_step_ = true;
  step_saved_bytes_ = 0;
  step_start_ = std::chrono::steady_clock::now();
  counters_->RecordArenaUse(0);
  return absl::OkStatus();
}

absl::Status Runtime::EndStepAlone() {
  std::vector<std::unique_ptr<TensorEntry>> entries;
  std::chrono::steady_clock::time_point start;
  {
    absl::MutexLock lock(&mu_);
    if (!in_step_) return absl::FailedPreconditionError("end_step: no step is open");
    in_step_ = false;  // new calls now fail; wait for those already inside
    mu_.Await(absl::Condition(
        +[](int* calls) { return *calls == 0; }, &active_calls_));
    entries = tensors_.Close();
    start = step_start_;
  }
  // Which copies did the caller never synchronise with? (Note [Step lifecycle])
  int unsynced_saves = 0, unsynced_prefetches = 0, unrestored = 0;
  for (const std::unique_ptr<TensorEntry>& e : entries) {
    switch (e->state) {
      case TensorState::kSaved:
        ++unrestored;
        if (e->d2h != nullptr && !e->synced.load() && !e->d2h->Done()) ++unsynced_saves;
        break;
      case TensorState::kPrefetched:
        ++unrestored;
        if (e->h2d != nullptr && !e->h2d->Done()) ++unsynced_prefetches;
        break;
      default:
        break;
    }
  }
  absl::Status drained = engine_->Drain();
  trace_.EndStep();  // after the drain: every landing of the step is in
  double stall = 0;
  for (const std::unique_ptr<TensorEntry>& e : entries) {
    if (e->state == TensorState::kRestored && e->h2d != nullptr) stall += e->h2d->stall_seconds();
  }
  entries.clear();
  {
    absl::MutexLock lock(&mu_);
    if (arena_ != nullptr) arena_->Reset();
    regions_.Release();
    step_saved_bytes_ = 0;
  }
  counters_->RecordArenaUse(0);
  counters_->device_pending_bytes.store(0, std::memory_order_relaxed);
  // The step-end hook: the step's duration, stall and maxima become the last step's gauges.
  counters_->RecordStep(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), stall);
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

absl::StatusOr<TensorEntry*> Runtime::Lookup(TensorId id) {
  if (!in_step_) {
    return absl::NotFoundError(absl::StrCat("tensor id ", id, " is unknown: no step is open"));
  }
  return tensors_.Find(id);
}

absl::StatusOr<TensorEntry*> Runtime::LookupSaved(TensorId id, const char* call) {
  absl::StatusOr<TensorEntry*> entry = Lookup(id);
  if (!entry.ok()) return entry.status();
  if ((*entry)->d2h == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(call, ": tensor id ", id, " has no copy (its save failed)"));
  }
  return entry;
}

absl::StatusOr<TensorId> Runtime::Save(int layer, int microbatch, const void* src, size_t bytes,
                                       void* stream) {
  absl::StatusOr<Reserved> reserved = ReserveSave(layer, microbatch, src, bytes);
  if (!reserved.ok()) return reserved.status();
  const TensorId id = reserved->id;
  TensorEntry* const entry = reserved->entry;
  CallScope scope(this);
  std::function<void()> on_landed;
  if (verify_) {
    on_landed = [entry = entry] {
      entry->checksum.store(offload::Checksum64(entry->host, entry->bytes),
                            std::memory_order_release);
    };
  }
  if (trace_.enabled()) {
    // Recorded before the copy is issued: its landing (on a backend thread) comes after it.
    trace_.Record(StepEventKind::kSaveIssued, layer, microbatch, bytes, id);
    on_landed = [this, layer = layer, microbatch = microbatch, bytes = bytes, id = id,
                 then = std::move(on_landed)] {
      if (then) then();
      trace_.Record(StepEventKind::kSaveLanded, layer, microbatch, bytes, id);
    };
  }
  counters_->AddDevicePending(bytes);
  // A reused slot (Note [Microbatch slots]): the D2H must not overwrite bytes an H2D of the
  // slot's previous microbatch may still read. The copy engine orders a copy after one fence;
  // the others have landed in practice (their restores made the consumer wait for them before
  // this forward ran), so waiting for them on the host costs nothing but covers every order.
  std::shared_ptr<CopyFence> after;
  for (std::shared_ptr<CopyFence>& f : reserved->after) {
    if (f->Done()) continue;
    if (after != nullptr) {
      if (absl::Status s = after->Wait(); !s.ok()) {
        return FinishSave(entry, s);
      }
    }
    after = std::move(f);
  }
  absl::Status saved =
      FinishSave(entry, engine_->DeviceToHost(entry->host, src, bytes, stream, std::move(on_landed),
                                              std::move(after)));
  if (!saved.ok()) return saved;
  return id;
}

// Under mu_: the checks, the placement in the layer's region and a new id. Counts the call as
// active (the caller's CallScope ends it).
absl::StatusOr<Runtime::Reserved> Runtime::ReserveSave(int layer, int microbatch, const void* src,
                                                       uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (!in_step_) {
    return absl::FailedPreconditionError("save: no step is open; call begin_step first");
  }
  if (layer < 0 || layer >= regions_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "save: layer ", layer, " is out of range; the plan has ", regions_.size(), " layers"));
  }
  if (src == nullptr && bytes > 0) {
    return absl::InvalidArgumentError(absl::StrCat("save: src is NULL (", bytes, " bytes)"));
  }
  if (stage_of_layer_[layer] != stage_) {
    return absl::InvalidArgumentError(
        absl::StrCat("save: layer ", layer, " runs on pipeline stage ", stage_of_layer_[layer],
                     "; this runtime runs stage ", stage_, " (its stage option)"));
  }
  if (!regions_.reserved(layer)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "save: layer ", layer, " (policy '", std::string(LayerPolicyName(layers_[layer].policy)),
        "') has no host memory reserved in the plan; ", bytes, " bytes cannot be saved"));
  }
  absl::StatusOr<SlotPlacement> placed = regions_.Place(layer, microbatch, bytes);
  if (!placed.ok()) return placed.status();
  absl::StatusOr<std::pair<TensorId, TensorEntry*>> added =
      tensors_.Add(layer, microbatch, placed->host, bytes);
  if (!added.ok()) {
    regions_.Abandon(layer, microbatch);
    return added.status();
  }
  // Bounded by the arena's size (Place succeeded), so this cannot wrap.
  step_saved_bytes_ += bytes;
  counters_->RecordArenaUse(step_saved_bytes_);
  ++active_calls_;
  return Reserved{added->first, added->second, std::move(placed->after)};
}

absl::Status Runtime::FinishSave(TensorEntry* entry,
                                 absl::StatusOr<std::shared_ptr<CopyFence>> fence) {
  absl::MutexLock lock(&mu_);
  if (!fence.ok()) {
    counters_->device_pending_bytes.fetch_sub(entry->bytes, std::memory_order_relaxed);
    entry->state = TensorState::kFailed;
    regions_.Abandon(entry->layer, entry->microbatch);
    return fence.status();
  }
  entry->d2h = *std::move(fence);
  entry->state = TensorState::kSaved;
  counters_->saves_total.fetch_add(1, std::memory_order_relaxed);
  if (LayerTypeCounters* t = layer_type_of_[entry->layer]; t != nullptr) {
    t->saved_bytes.fetch_add(entry->bytes, std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Runtime::SaveQuery(TensorId id) {
  std::shared_ptr<CopyFence> d2h;
  std::atomic<bool>* synced = nullptr;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<TensorEntry*> entry = LookupSaved(id, "save_query");
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
    absl::StatusOr<TensorEntry*> entry = LookupSaved(id, "save_wait");
    if (!entry.ok()) return entry.status();
    d2h = (*entry)->d2h;
    (*entry)->synced.store(true);
    trace_.Record(StepEventKind::kSaveWait, (*entry)->layer, (*entry)->microbatch, (*entry)->bytes,
                  id);
    ++active_calls_;
  }
  CallScope scope(this);
  absl::Status status = host ? d2h->Wait() : d2h->StreamWait(stream, false);
  engine_->Reap();
  return status;
}

absl::Status Runtime::VerifyHostCopy(TensorId id, TensorEntry& entry) {
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

absl::Status Runtime::CheckIdMicrobatch(const char* call, TensorId id, const TensorEntry& entry,
                                        std::optional<int> wanted) {
  if (!wanted.has_value() || *wanted == entry.microbatch) return absl::OkStatus();
  const int microbatch = *wanted;
  if (absl::Status s = regions_.CheckMicrobatch(entry.layer, microbatch, call); !s.ok()) return s;
  if (!regions_.Saved(entry.layer, microbatch)) {
    return absl::NotFoundError(
        absl::StrCat(call, ": microbatch ", microbatch, " of layer ", entry.layer,
                     " was never saved in this step (tensor id ", id, " is microbatch ",
                     entry.microbatch, "'s; ", regions_.InFlightText(entry.layer), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(call, ": tensor id ", id, " was saved by microbatch ", entry.microbatch,
                   " of layer ", entry.layer, ", not by microbatch ", microbatch));
}

absl::Status Runtime::Prefetch(TensorId id, void* dst, void* stream,
                               std::optional<int> microbatch) {
  TensorEntry* entry = nullptr;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<TensorEntry*> found = Lookup(id);
    if (!found.ok()) return found.status();
    entry = *found;
    if (absl::Status s = CheckIdMicrobatch("prefetch", id, *entry, microbatch); !s.ok()) return s;
    if (entry->state != TensorState::kSaved) {
      if (entry->state == TensorState::kCorrupt) {
        return absl::DataLossError(
            absl::StrCat("prefetch: tensor id ", id, " failed its integrity check earlier"));
      }
      return absl::FailedPreconditionError(
          absl::StrCat("prefetch: tensor id ", id, " is ", TensorStateName(entry->state),
                       "; a tensor is prefetched at most once, before its restore"));
    }
    if (dst == nullptr && entry->bytes > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefetch: dst is NULL (tensor id ", id, ", ", entry->bytes, " bytes)"));
    }
    entry->state = TensorState::kPrefetching;
    ++active_calls_;
  }
  CallScope scope(this);
  absl::StatusOr<std::shared_ptr<CopyFence>> fence = absl::InternalError("prefetch: not issued");
  if (absl::Status verified = verify_ ? VerifyHostCopy(id, *entry) : absl::OkStatus();
      verified.ok()) {
    fence = engine_->HostToDevice(dst, entry->host, entry->bytes, stream, entry->d2h,
                                  TraceH2D(id, *entry));
  } else {
    fence = verified;
  }
  absl::MutexLock lock(&mu_);
  if (!fence.ok()) {
    entry->state = fence.status().code() == absl::StatusCode::kDataLoss ? TensorState::kCorrupt
                                                                        : TensorState::kSaved;
    return fence.status();
  }
  entry->h2d = *std::move(fence);
  entry->prefetch_dst = dst;
  entry->state = TensorState::kPrefetched;
  return absl::OkStatus();
}

absl::Status Runtime::Restore(TensorId id, void* dst, void* stream, std::optional<int> microbatch) {
  TensorEntry* entry = nullptr;
  std::shared_ptr<CopyFence> h2d;  // the prefetch's H2D, if there was one
  if (absl::Status s = BeginRestore(id, dst, microbatch, &entry, &h2d); !s.ok()) return s;
  CallScope scope(this);
  const bool prefetched = h2d != nullptr;
  absl::Status status = prefetched ? absl::OkStatus() : CopyBack(id, *entry, dst, stream, &h2d);
  if (status.ok()) {
    trace_.Record(StepEventKind::kRestore, entry->layer, entry->microbatch, entry->bytes, id);
    status = h2d->StreamWait(stream, /*measure_stall=*/true);
  }
  if (status.ok()) status = CheckLanded(id, *entry, dst);
  return FinishRestore(entry, prefetched, std::move(h2d), std::move(status));
}

// Under mu_: the state checks and the move to kRestoring. Counts the call as active (the caller's
// CallScope ends it). `prefetched` is the prefetch's H2D when there was one.
absl::Status Runtime::BeginRestore(TensorId id, void* dst, std::optional<int> microbatch,
                                   TensorEntry** out, std::shared_ptr<CopyFence>* prefetched) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<TensorEntry*> found = Lookup(id);
  if (!found.ok()) return found.status();
  TensorEntry* entry = *found;
  if (absl::Status s = CheckIdMicrobatch("restore", id, *entry, microbatch); !s.ok()) return s;
  switch (entry->state) {
    case TensorState::kSaved:
      break;
    case TensorState::kPrefetched:
      if (dst != entry->prefetch_dst) {
        return absl::InvalidArgumentError(absl::StrCat(
            "restore: tensor id ", id,
            " was prefetched into another buffer; restore into the prefetch destination"));
      }
      break;
    case TensorState::kCorrupt:
      return absl::DataLossError(
          absl::StrCat("restore: tensor id ", id, " failed its integrity check"));
    case TensorState::kRestored:
    case TensorState::kRestoring:
      return absl::FailedPreconditionError(absl::StrCat(
          "restore: tensor id ", id, " was already restored; each saved tensor is restored once"));
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("restore: tensor id ", id, " is ", TensorStateName(entry->state)));
  }
  if (dst == nullptr && entry->bytes > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("restore: dst is NULL (tensor id ", id, ", ", entry->bytes, " bytes)"));
  }
  if (entry->state == TensorState::kPrefetched) *prefetched = entry->h2d;
  entry->state = TensorState::kRestoring;
  ++active_calls_;
  *out = entry;
  return absl::OkStatus();
}

// The H2D of a restore that was not prefetched (integrity mode: after checking the host copy).
std::function<void()> Runtime::TraceH2D(TensorId id, const TensorEntry& entry) {
  if (!trace_.enabled()) return {};
  // A restore without a prefetch issues the H2D itself: the trace shows it as a prefetch, as
  // the simulator does (Note [Step trace]).
  trace_.Record(StepEventKind::kPrefetchIssued, entry.layer, entry.microbatch, entry.bytes, id);
  return [this, layer = entry.layer, microbatch = entry.microbatch, bytes = entry.bytes, id] {
    trace_.Record(StepEventKind::kPrefetchLanded, layer, microbatch, bytes, id);
  };
}

absl::Status Runtime::SetTraceCapacity(size_t capacity) {
  if (capacity > kMaxTraceEvents) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trace capacity is ", capacity, " events; allowed: 0 (off) to ", kMaxTraceEvents));
  }
  absl::MutexLock lock(&mu_);
  if (in_step_) {
    return absl::FailedPreconditionError(
        "set_trace_capacity: a step is open; set the trace between steps");
  }
  trace_.SetCapacity(capacity);
  return absl::OkStatus();
}

absl::Status Runtime::CopyBack(TensorId id, TensorEntry& entry, void* dst, void* stream,
                               std::shared_ptr<CopyFence>* h2d) {
  if (verify_) {
    if (absl::Status s = VerifyHostCopy(id, entry); !s.ok()) return s;
  }
  absl::StatusOr<std::shared_ptr<CopyFence>> fence =
      engine_->HostToDevice(dst, entry.host, entry.bytes, stream, entry.d2h, TraceH2D(id, entry));
  if (!fence.ok()) return fence.status();
  *h2d = *std::move(fence);
  return absl::OkStatus();
}

// Integrity mode on the host backend, whose "device" is readable here: what actually landed.
absl::Status Runtime::CheckLanded(TensorId id, const TensorEntry& entry, const void* dst) const {
  if (!verify_ || backend_kind_ != BackendKind::kHost) return absl::OkStatus();
  const uint64_t expected = entry.checksum.load(std::memory_order_acquire);
  const uint64_t actual = offload::Checksum64(dst, entry.bytes);
  if (actual != expected) {
    return absl::DataLossError(
        absl::StrCat("restore: tensor id ", id, " (layer ", entry.layer, ", ", entry.bytes,
                     " bytes) arrived different from what was saved (checksum ", expected,
                     " at save, ", actual, " after the copy back)"));
  }
  return absl::OkStatus();
}

absl::Status Runtime::FinishRestore(TensorEntry* entry, bool prefetched,
                                    std::shared_ptr<CopyFence> h2d, absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (h2d != nullptr && entry->h2d == nullptr) entry->h2d = std::move(h2d);
  if (!status.ok()) {
    if (status.code() == absl::StatusCode::kDataLoss) {
      entry->state = TensorState::kCorrupt;
    } else {
      entry->state = prefetched ? TensorState::kPrefetched : TensorState::kSaved;
    }
    return status;
  }
  entry->state = TensorState::kRestored;
  regions_.Restored(entry->layer, entry->microbatch, entry->h2d);
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
  info.save_wait_before_layer = plan.save_wait_before_layer;
  info.in_flight_microbatches = plan.in_flight_microbatches;
  absl::MutexLock lock(&mu_);
  info.host_bytes_used = in_step_ ? regions_.saved(layer) : 0;
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
    absl::StatusOr<TensorEntry*> entry = Lookup(id);
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
  counters_->CopyIssued();
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
