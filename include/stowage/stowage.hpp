// stowage runtime — C++ API over the C ABI (stowage.h). Header-only, so a C++ trainer links only
// libstowage.so and never depends on stowage's internals or their compiler settings.
//
//   auto rt = stowage::Runtime::Create(plan_json);            // StatusOr<Runtime>
//   if (!rt.ok()) die(rt.status().ToString());
//   {
//     auto step = stowage::Step::Begin(*rt);                  // ends the step when it goes
//     auto id = rt->Save(layer, ptr, bytes, stream);          // forward
//     rt->SaveWaitStream(*id, stream);                        // before reusing ptr
//     rt->Restore(*id, dst, stream);                          // backward
//     step->End();                                            // or let the guard end it
//   }
//   auto plan = stowage::PlanRequest(request_json);           // StatusOr<std::string>
//
// Semantics, stream rules, thread-safety and error codes are those of the C calls (stowage.h);
// every method returns a Status (or StatusOr) carrying the C status code and the message of
// stowage_last_error(). No method throws.
#ifndef STOWAGE_STOWAGE_HPP_
#define STOWAGE_STOWAGE_HPP_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "stowage/stowage.h"

namespace stowage {

class Status {
 public:
  Status() = default;  // OK
  Status(stowage_status code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == STOWAGE_OK; }
  stowage_status code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const {
    return ok() ? "OK" : std::string(stowage_status_string(code_)) + ": " + message_;
  }

 private:
  stowage_status code_ = STOWAGE_OK;
  std::string message_;
};

// A value or a non-OK Status. Accessing the value of an error is undefined (like std::optional).
template <typename T>
class StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT: must not be OK
  bool ok() const { return status_.ok() && value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

namespace internal {
inline Status Check(stowage_status code) {
  return code == STOWAGE_OK ? Status() : Status(code, stowage_last_error());
}
}  // namespace internal

using TensorId = stowage_tensor_id;
using Stats = stowage_stats;
using LayerInfo = stowage_layer_info;

struct Options {
  stowage_backend backend = STOWAGE_BACKEND_AUTO;
  int device = 0;
  int numa_node = -1;
  bool verify_checksums = false;
  uint64_t copy_chunk_bytes = 0;
  int copy_threads = 0;
  // nullopt: STOWAGE_METRICS_ADDR decides; "": no endpoint; "host:port" or a bare port.
  std::optional<std::string> metrics_address;
  int stage = 0;  // the pipeline stage this rank runs (stowage_options.stage)
  // nullopt: STOWAGE_METRICS_STEP_BUCKETS decides; "": the defaults; else "1,2.5,5,10,30,60".
  std::optional<std::string> metrics_step_buckets;
};

// Owns one stowage_runtime. Movable, not copyable. The destructor ends an open step (draining its
// copies) and destroys the runtime.
class Runtime {
 public:
  static StatusOr<Runtime> Create(std::string_view plan_json, const Options& options = {}) {
    stowage_options c;
    stowage_options_init(&c);
    c.backend = options.backend;
    c.device = options.device;
    c.numa_node = options.numa_node;
    c.verify_checksums = options.verify_checksums ? 1 : 0;
    c.copy_chunk_bytes = options.copy_chunk_bytes;
    c.copy_threads = options.copy_threads;
    c.metrics_address = options.metrics_address ? options.metrics_address->c_str() : nullptr;
    c.stage = options.stage;
    c.metrics_step_buckets =
        options.metrics_step_buckets ? options.metrics_step_buckets->c_str() : nullptr;
    stowage_runtime* rt = nullptr;
    Status status = internal::Check(stowage_create(plan_json.data(), plan_json.size(), &c, &rt));
    if (!status.ok()) return status;
    return Runtime(rt);
  }

  Runtime(Runtime&& other) noexcept : rt_(std::exchange(other.rt_, nullptr)) {}
  Runtime& operator=(Runtime&& other) noexcept {
    if (this != &other) {
      Reset();
      rt_ = std::exchange(other.rt_, nullptr);
    }
    return *this;
  }
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  ~Runtime() { Reset(); }

  Status BeginStep() { return internal::Check(stowage_begin_step(rt_)); }
  Status EndStep() { return internal::Check(stowage_end_step(rt_)); }

  StatusOr<TensorId> Save(int layer, const void* src, size_t bytes, void* stream = nullptr) {
    TensorId id = 0;
    Status s = internal::Check(stowage_save(rt_, layer, src, bytes, stream, &id));
    if (!s.ok()) return s;
    return id;
  }
  StatusOr<bool> SaveQuery(TensorId id) {
    int32_t done = 0;
    Status s = internal::Check(stowage_save_query(rt_, id, &done));
    if (!s.ok()) return s;
    return done != 0;
  }
  Status SaveWait(TensorId id) { return internal::Check(stowage_save_wait(rt_, id)); }
  Status SaveWaitStream(TensorId id, void* stream) {
    return internal::Check(stowage_save_wait_stream(rt_, id, stream));
  }
  Status Prefetch(TensorId id, void* dst, void* stream = nullptr) {
    return internal::Check(stowage_prefetch(rt_, id, dst, stream));
  }
  Status Restore(TensorId id, void* dst, void* stream = nullptr) {
    return internal::Check(stowage_restore(rt_, id, dst, stream));
  }
  // Microbatch `microbatch` of the step (stowage.h, "Microbatches").
  StatusOr<TensorId> SaveMicrobatch(int layer, int microbatch, const void* src, size_t bytes,
                                    void* stream = nullptr) {
    TensorId id = 0;
    Status s =
        internal::Check(stowage_save_microbatch(rt_, layer, microbatch, src, bytes, stream, &id));
    if (!s.ok()) return s;
    return id;
  }
  Status PrefetchMicrobatch(TensorId id, int microbatch, void* dst, void* stream = nullptr) {
    return internal::Check(stowage_prefetch_microbatch(rt_, id, microbatch, dst, stream));
  }
  Status RestoreMicrobatch(TensorId id, int microbatch, void* dst, void* stream = nullptr) {
    return internal::Check(stowage_restore_microbatch(rt_, id, microbatch, dst, stream));
  }

  StatusOr<Stats> GetStats() {
    Stats stats{};
    Status s = internal::Check(stowage_get_stats(rt_, &stats));
    if (!s.ok()) return s;
    return stats;
  }
  Status ReportDevicePeak(uint64_t bytes) {
    return internal::Check(stowage_report_device_peak(rt_, bytes));
  }
  StatusOr<int> NumLayers() {
    int32_t n = 0;
    Status s = internal::Check(stowage_num_layers(rt_, &n));
    if (!s.ok()) return s;
    return static_cast<int>(n);
  }
  StatusOr<LayerInfo> GetLayerInfo(int layer) {
    LayerInfo info{};
    info.struct_size = sizeof(info);
    Status s = internal::Check(stowage_get_layer_info(rt_, layer, &info));
    if (!s.ok()) return s;
    return info;
  }

  stowage_runtime* get() const { return rt_; }

 private:
  explicit Runtime(stowage_runtime* rt) : rt_(rt) {}
  void Reset() {
    if (rt_ == nullptr) return;
    if (stowage_destroy(rt_) != STOWAGE_OK) {  // a step is open: end it, then destroy
      stowage_end_step(rt_);
      stowage_destroy(rt_);
    }
    rt_ = nullptr;
  }

  stowage_runtime* rt_ = nullptr;
};

// One training step: begun by Begin, ended by End or, failing that, by the destructor (whose
// status is dropped -- call End to see it). Not copyable; movable.
class Step {
 public:
  static StatusOr<Step> Begin(Runtime& runtime) {
    Status s = runtime.BeginStep();
    if (!s.ok()) return s;
    return Step(&runtime);
  }
  Step(Step&& other) noexcept : runtime_(std::exchange(other.runtime_, nullptr)) {}
  Step& operator=(Step&&) = delete;
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;
  ~Step() {
    if (runtime_ != nullptr) runtime_->EndStep();
  }
  // FAILED_PRECONDITION when called twice (the step is already over).
  Status End() {
    if (runtime_ == nullptr) return Status(STOWAGE_ERROR_FAILED_PRECONDITION, "step already ended");
    return std::exchange(runtime_, nullptr)->EndStep();
  }

 private:
  explicit Step(Runtime* runtime) : runtime_(runtime) {}
  Runtime* runtime_;
};

namespace internal {
inline StatusOr<std::string> PlanningCall(stowage_status (*call)(const char*, size_t, char**),
                                          std::string_view request_json,
                                          std::string* closest_plan = nullptr) {
  char* out = nullptr;
  Status s = Check(call(request_json.data(), request_json.size(), &out));
  std::string text = out != nullptr ? std::string(out) : std::string();
  stowage_free_string(out);  // also the closest plan a RESOURCE_EXHAUSTED answer carries
  if (!s.ok()) {
    if (closest_plan != nullptr) *closest_plan = std::move(text);
    return s;
  }
  return text;
}
}  // namespace internal

// The planner (stowage_plan_request): the plan JSON for a request (docs/runtime-api.md "Planning
// through the C ABI"); RESOURCE_EXHAUSTED, naming the smallest peak and what binds, when nothing
// fits — and then the closest plan ("fits": false) in `*closest_plan` when given (empty only when
// some layer has no option at all).
inline StatusOr<std::string> PlanRequest(std::string_view request_json,
                                         std::string* closest_plan = nullptr) {
  return internal::PlanningCall(stowage_plan_request, request_json, closest_plan);
}
// The simulator's prediction for the request's per-layer assignment (stowage_plan_evaluate).
inline StatusOr<std::string> PlanEvaluate(std::string_view request_json) {
  return internal::PlanningCall(stowage_plan_evaluate, request_json);
}

}  // namespace stowage

#endif  // STOWAGE_STOWAGE_HPP_
