// The runtime: one per GPU (per rank). Carries out a plan every step over the copy engine and
// the pinned arena: per-layer host regions, tensor ids, the step lifecycle, integrity checks,
// counters. The C ABI (capi/c_api.cc) is a thin shell over this class; it also owns the
// Prometheus exporter and the mapping of statuses to the C codes. The parts: the backend comes
// from offload::CreateBackend, the per-layer host regions are StepRegions
// (runtime/step_regions.h), the ids and states of saved tensors a TensorTable
// (runtime/tensor_table.h).
//
// Note [Step lifecycle]. BeginStep carves one host region per offloading layer out of the arena
// (sizes from the plan, same layout every step); saves for a layer are placed in its region and
// fail with RESOURCE_EXHAUSTED past the plan's reservation. A tensor id encodes the step and a
// slot, so an id from an earlier step is NOT_FOUND rather than a pointer into memory that now
// holds another tensor. EndStep always releases: it drains the copy engine, resets the arena and
// forgets every id -- whatever went wrong in the step (an exception in the trainer, a failed
// call), nothing is retained. Copies the caller never synchronised with (a save whose D2H had not
// landed and was never restored, a prefetch never restored whose H2D had not landed) make EndStep
// return FAILED_PRECONDITION after releasing. A save the caller waited for (SaveWait,
// SaveWaitStream, or a SaveQuery that saw it done) and restored tensors whose H2D is still running
// on the device are normal (the caller's streams wait for them) and are only drained.
//
// Microbatches (Note [Microbatch slots] in runtime/step_regions.h): a step is one optimizer step,
// every microbatch of it; saves name their microbatch (0 to run.microbatches - 1), each layer
// holds up to its in_flight_microbatches at once, and a microbatch's slot is reused once all of
// its tensors in the layer were restored. The single-microbatch calls are microbatch 0.
//
// Note [Integrity mode]. With verify_checksums, each saved buffer is summed (Checksum64) on the
// backend thread the moment its D2H lands, and re-summed before its H2D is issued (prefetch or
// restore); the host backend also sums the destination after the H2D. A mismatch is DATA_LOSS and
// the corrupt bytes are never copied to the device.
//
// Thread-safety: Save, SaveQuery/Wait/WaitStream, Prefetch, Restore, GetStats and
// ReportDevicePeak may be called from several threads at once. BeginStep, EndStep and destruction
// must not race with other calls (EndStep still waits for calls already inside the runtime). A
// BeginStep or EndStep that does race another one (EndStep runs in two parts, so a BeginStep
// between them would get its regions released under it) is refused with FAILED_PRECONDITION
// instead of running (step_call_, Note [One step call at a time] in runtime.cc).
// Lock order: Runtime::mu_ -> PinnedArena's lock; CopyEngine's lock is never taken under mu_,
// and no backend (CUDA) call is made while mu_ is held.
#ifndef STOWAGE_RUNTIME_RUNTIME_H_
#define STOWAGE_RUNTIME_RUNTIME_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "offload/backend_factory.h"
#include "offload/copy_engine.h"
#include "offload/node_ledger.h"
#include "offload/pinned_arena.h"
#include "runtime/runtime_counters.h"
#include "runtime/step_regions.h"
#include "runtime/step_trace.h"
#include "runtime/tensor_table.h"
#include "stowage/plan.h"
#include "stowage/stowage.h"

namespace stowage::runtime {

using BackendKind = offload::BackendKind;

struct RuntimeOptions {
  BackendKind backend = BackendKind::kAuto;
  int device = 0;
  int numa_node = -1;  // -1: the GPU's (host backend: the calling thread's) node from topology
  bool verify_checksums = false;
  // 0: the plan's; else in [offload::kMinCopyChunkBytes, offload::kMaxCopyChunkBytes].
  uint64_t copy_chunk_bytes = 0;
  // Host-backend workers per stream and arena touch threads, in [0, offload::kMaxCopyThreads];
  // 0: chosen from the node's CPUs.
  int copy_threads = 0;
  // The pipeline stage this rank runs (Note [Pipeline stages] in include/stowage/plan.h), in
  // [0, run.pp): the runtime reserves host memory for that stage's layers only.
  int stage = 0;
  // Skip the host-memory admission check and the node ledger (tests on small machines).
  bool skip_admission = false;
  // The node ledger the arena is admitted through (offload/node_ledger.h, Note [Node ledger]);
  // empty fields come from the environment.
  offload::LedgerOptions ledger;
  // Upper bounds of the step-duration histogram in seconds, increasing (ParseStepSecondsBuckets in
  // runtime/metrics.h reads them from text); empty: the defaults (Note [Step duration buckets]).
  std::vector<double> step_seconds_buckets;
  // Arena setup progress (bytes touched so far, total), for long setups; called on the thread
  // that calls Create.
  std::function<void(uint64_t, uint64_t)> arena_progress;
};

// Most events one step's trace may hold (Note [Step trace]): 48 MiB per buffer.
inline constexpr size_t kMaxTraceEvents = size_t{1} << 20;

struct LayerInfo {
  int index = 0;
  bool offloads = false;
  uint64_t host_bytes = 0;          // the plan's reservation
  uint64_t host_bytes_used = 0;     // saved into it this step
  int save_wait_before_layer = -1;  // from the plan (Note [Runtime protocol])
  int prefetch_after_layer = -1;    // from the plan
  int in_flight_microbatches = 1;   // from the plan: the layer's slots
};

class Runtime : private offload::CopyObserver {
 public:
  // Parses nothing: `plan` is already validated (ParsePlanJson does that). Errors:
  // UNAVAILABLE (CUDA asked for but not built or no device), RESOURCE_EXHAUSTED (host memory
  // admission), INVALID_ARGUMENT (options, or plan values outside what the runtime supports),
  // OUT_OF_RANGE (plan sizes that overflow), INTERNAL (OS/CUDA).
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(const Plan& plan,
                                                         const RuntimeOptions& options);
  // Ends an open step (draining its copies) before tearing down.
  ~Runtime() override;
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // FAILED_PRECONDITION when a step is already open.
  absl::Status BeginStep();
  // Note [Step lifecycle]. FAILED_PRECONDITION when no step is open, or (after releasing) when
  // copies were still in flight.
  absl::Status EndStep();
  bool in_step() const;

  // D2H of `bytes` at device `src` into `layer`'s slot for `microbatch`, after the work on
  // `stream` so far (and after any H2D still reading the slot for an earlier microbatch).
  // INVALID_ARGUMENT (layer or microbatch out of range, null src), FAILED_PRECONDITION (no step
  // open; the microbatch already saved the layer this step), RESOURCE_EXHAUSTED (past the plan's
  // reservation for one microbatch of the layer, or more microbatches in flight than planned).
  absl::StatusOr<TensorId> Save(int layer, int microbatch, const void* src, size_t bytes,
                                void* stream);
  absl::StatusOr<TensorId> Save(int layer, const void* src, size_t bytes, void* stream) {
    return Save(layer, 0, src, bytes, stream);
  }
  // NOT_FOUND for unknown or stale ids.
  absl::StatusOr<bool> SaveQuery(TensorId id);
  absl::Status SaveWait(TensorId id);
  absl::Status SaveWaitStream(TensorId id, void* stream);
  // Issues the H2D into `dst` after the work on `stream` so far; returns at once.
  // FAILED_PRECONDITION if already prefetched or restored; DATA_LOSS in integrity mode.
  // `microbatch` (none: the id's own) must be the one the id was saved under: NOT_FOUND
  // when that microbatch never saved the layer this step, INVALID_ARGUMENT when it did (another
  // tensor) or is out of range.
  absl::Status Prefetch(TensorId id, void* dst, void* stream,
                        std::optional<int> microbatch = std::nullopt);
  // `stream` waits until `dst` holds the bytes (host backend: returns when it does). Consumes
  // the id: FAILED_PRECONDITION the second time. INVALID_ARGUMENT if prefetched into another dst.
  // `microbatch` as for Prefetch. The microbatch's last restore of a layer frees its slot.
  absl::Status Restore(TensorId id, void* dst, void* stream,
                       std::optional<int> microbatch = std::nullopt);

  // Note [Step trace]: records the next steps' events, at most `capacity` per step (0: off).
  // INVALID_ARGUMENT past kMaxTraceEvents; FAILED_PRECONDITION inside a step.
  absl::Status SetTraceCapacity(size_t capacity);
  // The last completed step's events.
  std::vector<TraceEvent> LastTrace(uint64_t* dropped) const { return trace_.Last(dropped); }

  void ReportDevicePeak(uint64_t bytes);
  LayerInfo GetLayerInfo(int layer) const;  // layer must be in [0, num_layers())
  int num_layers() const { return static_cast<int>(layers_.size()); }
  int prefetch_distance() const { return prefetch_distance_; }
  // CanonicalPlanHash of the plan this runtime was created from (plan agreement).
  uint64_t plan_hash() const { return plan_hash_; }

  const RuntimeCounters& counters() const { return *counters_; }
  std::shared_ptr<const RuntimeCounters> shared_counters() const { return counters_; }
  // The one counter the C shell writes (errors by status code).
  RuntimeCounters& mutable_counters() { return *counters_; }
  BackendKind backend_kind() const { return backend_kind_; }
  const offload::PinnedArena* arena() const { return arena_.get(); }
  offload::DeviceBackend& backend() { return engine_->backend(); }
  offload::CopyEngine& engine() { return *engine_; }
  uint64_t copies_in_flight();  // reaps first
  // This rank's share of its NUMA node's CPUs (Note [CPU shares] in runtime.cc): where the host
  // backend's copy workers and the arena's touch threads run.
  const std::vector<int>& cpu_share() const { return cpu_share_; }

  // Test-only: flips one byte of the host copy of `id` (after its D2H landed), to prove that
  // integrity mode catches host-side corruption.
  absl::Status CorruptHostCopyForTesting(TensorId id, size_t offset);

 private:
  // Holds active_calls_ for the scope of one call (EndStep waits for zero).
  class CallScope;

  Runtime() = default;
  // Parts of Create.
  static std::shared_ptr<RuntimeCounters> MakeCounters(const Plan& plan,
                                                       const RuntimeOptions& options,
                                                       const offload::DeviceBackend& backend,
                                                       std::vector<LayerTypeCounters*>* type_of);
  uint64_t ArenaBytes(const Plan& plan) const;
  // Node admission (Note [Node ledger]) and this rank's CPU share (Note [CPU shares] in
  // runtime.cc): sets `share`'s ranks_sharing_node and cpu_slot.
  absl::Status Admit(const Plan& plan, const RuntimeOptions& options,
                     const offload::Backend& backend, offload::BackendOptions* share);
  absl::Status CreateArena(const Plan& plan, const RuntimeOptions& options,
                           const offload::Backend& backend);

  // Parts of Save: the checks and the placement under mu_, the D2H outside it, the bookkeeping.
  struct Reserved {
    TensorId id = 0;
    TensorEntry* entry = nullptr;
    std::vector<std::shared_ptr<offload::CopyFence>> after;  // SlotPlacement::after
  };
  absl::StatusOr<Reserved> ReserveSave(int layer, int microbatch, const void* src, uint64_t bytes);
  // The id was saved under `microbatch` (Prefetch, Restore); errors name `call`.
  absl::Status CheckIdMicrobatch(const char* call, TensorId id, const TensorEntry& entry,
                                 std::optional<int> microbatch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FinishSave(TensorEntry* entry,
                          absl::StatusOr<std::shared_ptr<offload::CopyFence>> fence);
  // Parts of Restore: the state change under mu_, the H2D (unless prefetched) and the wait, the
  // integrity check of what landed (host backend), the bookkeeping.
  absl::Status BeginRestore(TensorId id, void* dst, std::optional<int> microbatch,
                            TensorEntry** entry, std::shared_ptr<offload::CopyFence>* prefetched);
  absl::Status CopyBack(TensorId id, TensorEntry& entry, void* dst, void* stream,
                        std::shared_ptr<offload::CopyFence>* h2d);
  // Trace on: records the H2D's issue and returns what records its landing; else empty.
  std::function<void()> TraceH2D(TensorId id, const TensorEntry& entry);
  absl::Status CheckLanded(TensorId id, const TensorEntry& entry, const void* dst) const;
  absl::Status FinishRestore(TensorEntry* entry, bool prefetched,
                             std::shared_ptr<offload::CopyFence> h2d, absl::Status status);

  void OnCopyIssued(offload::CopyDirection direction, uint64_t bytes) override;
  void OnCopyLanded(offload::CopyDirection direction, uint64_t bytes, double busy_seconds) override;
  // Finds `id` in the open step; NOT_FOUND otherwise.
  absl::StatusOr<TensorEntry*> Lookup(TensorId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lookup, and the save's D2H was issued; errors name `call`.
  absl::StatusOr<TensorEntry*> LookupSaved(TensorId id, const char* call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WaitForSave(TensorId id, bool host, void* stream);
  // Integrity mode: waits for the D2H, compares the host copy's checksum.
  absl::Status VerifyHostCopy(TensorId id, TensorEntry& entry);
  void EndCall();
  // The bodies of BeginStep and EndStep, run while this thread holds step_call_.
  absl::Status BeginStepAlone();
  absl::Status EndStepAlone();

  std::shared_ptr<RuntimeCounters> counters_;
  // Destroyed after the arena: the reservation goes once the memory is unmapped.
  std::unique_ptr<offload::NodeReservation> reservation_;
  std::unique_ptr<offload::PinnedArena> arena_;
  std::unique_ptr<offload::CopyEngine> engine_;
  BackendKind backend_kind_ = BackendKind::kHost;
  bool verify_ = false;
  int prefetch_distance_ = 1;
  int stage_ = 0;
  std::vector<int> stage_of_layer_;  // the stage that runs each layer
  std::vector<int> cpu_share_;
  uint64_t plan_hash_ = 0;
  std::vector<LayerPlan> layers_;
  std::vector<LayerTypeCounters*> layer_type_of_;  // by layer index
  StepTrace trace_;  // outlives engine_'s callbacks: ~Runtime drains the engine first

  // Set while a thread is inside BeginStep or EndStep (Note [One step call at a time]).
  std::atomic<bool> step_call_{false};
  mutable absl::Mutex mu_;
  bool in_step_ ABSL_GUARDED_BY(mu_) = false;
  int active_calls_ ABSL_GUARDED_BY(mu_) = 0;
  StepRegions regions_ ABSL_GUARDED_BY(mu_);
  TensorTable tensors_ ABSL_GUARDED_BY(mu_);
  uint64_t step_saved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point step_start_ ABSL_GUARDED_BY(mu_);
};

// The Runtime behind a C handle (defined in c_api.cc), for tests that reach past the C ABI (e.g.
// CorruptHostCopyForTesting). Null for a null or unknown handle.
Runtime* UnwrapForTesting(stowage_runtime* rt);
// The metrics endpoint a C handle serves ("127.0.0.1:40123"); empty without one.
std::string MetricsAddressForTesting(stowage_runtime* rt);

}  // namespace stowage::runtime

#endif  // STOWAGE_RUNTIME_RUNTIME_H_
