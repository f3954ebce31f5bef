// The C ABI (include/stowage/stowage.h) over runtime::Runtime: argument checks, status codes,
// the per-thread last error, error counters, and the Prometheus exporter a handle serves. No
// exception crosses this boundary: every entry point runs its body inside Guard, which turns one
// into INTERNAL.
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "plan/chrome_trace.h"
#include "planner/request/plan_request.h"
#include "runtime/metrics.h"
#include "runtime/plan_agreement.h"
#include "runtime/runtime.h"
#include "stowage/plan.h"
#include "stowage/stowage.h"

struct stowage_runtime {
  std::unique_ptr<stowage::runtime::Runtime> runtime;
  // Declared after the runtime so it stops serving (reading the runtime's counters) first.
  std::unique_ptr<stowage::runtime::MetricsExporter> exporter;
};

namespace {

// Note [Handles]. The stowage_runtime* a caller holds is a token, never the address of the
// object: the registry maps live tokens to their objects, and tokens are never reused. So a
// destroyed handle (double stowage_destroy, a call after destroy) or a foreign one is looked up,
// not dereferenced -- INVALID_ARGUMENT instead of a use after free -- and a stale handle can
// never reach a newer runtime that happens to live at the old address. Each call holds a lease
// (a shared_ptr) for its duration, so even a destroy that races a call (a caller bug the header
// forbids) frees the object only when that call returns. Tokens are multiples of 16 below
// 2^60: they look like aligned pointers to tools and are never valid addresses of ours.
class HandleRegistry {
 public:
  stowage_runtime* Add(std::shared_ptr<stowage_runtime> object) {
    absl::MutexLock lock(&mu_);
    const uintptr_t token = ++issued_ << 4;
    live_.emplace(token, std::move(object));
    return reinterpret_cast<stowage_runtime*>(token);
  }
  // Null for a token that is not live.
  std::shared_ptr<stowage_runtime> Find(const stowage_runtime* token) {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(reinterpret_cast<uintptr_t>(token));
    return it == live_.end() ? nullptr : it->second;
  }
  // Forgets `token`; null if it was not live (e.g. a concurrent destroy took it).
  std::shared_ptr<stowage_runtime> Remove(const stowage_runtime* token) {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(reinterpret_cast<uintptr_t>(token));
    if (it == live_.end()) return nullptr;
    std::shared_ptr<stowage_runtime> object = std::move(it->second);
    live_.erase(it);
    return object;
  }

 private:
  absl::Mutex mu_;
  uintptr_t issued_ ABSL_GUARDED_BY(mu_) = 0;
  std::unordered_map<uintptr_t, std::shared_ptr<stowage_runtime>> live_ ABSL_GUARDED_BY(mu_);
};

// Never destroyed: a call from a static destructor elsewhere must still find an empty registry.
HandleRegistry& Handles() {
  static HandleRegistry* registry = new HandleRegistry();
  return *registry;
}

}  // namespace

namespace stowage::runtime {
Runtime* UnwrapForTesting(stowage_runtime* rt) {
  std::shared_ptr<stowage_runtime> object = Handles().Find(rt);
  return object == nullptr ? nullptr : object->runtime.get();
}
std::string MetricsAddressForTesting(stowage_runtime* rt) {
  std::shared_ptr<stowage_runtime> object = Handles().Find(rt);
  return object == nullptr || object->exporter == nullptr ? std::string()
                                                          : object->exporter->bound_address();
}
}  // namespace stowage::runtime

namespace {

// The C ABI's event kinds are StepEventKind's values (one vocabulary, Note [Step trace]).
static_assert(STOWAGE_EVENT_SAVE_ISSUED == static_cast<int>(stowage::StepEventKind::kSaveIssued));
static_assert(STOWAGE_EVENT_SAVE_LANDED == static_cast<int>(stowage::StepEventKind::kSaveLanded));
static_assert(STOWAGE_EVENT_SAVE_WAIT == static_cast<int>(stowage::StepEventKind::kSaveWait));
static_assert(STOWAGE_EVENT_PREFETCH_ISSUED ==
              static_cast<int>(stowage::StepEventKind::kPrefetchIssued));
static_assert(STOWAGE_EVENT_PREFETCH_LANDED ==
              static_cast<int>(stowage::StepEventKind::kPrefetchLanded));
static_assert(STOWAGE_EVENT_RESTORE == static_cast<int>(stowage::StepEventKind::kRestore));

using stowage::runtime::Runtime;

thread_local std::string last_error;

// absl::Status -> the C ABI's code. OUT_OF_RANGE (a size that overflows) is an invalid argument
// to a C caller; ABORTED and ALREADY_EXISTS are preconditions.
stowage_status StatusToStowageCode(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return STOWAGE_OK;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return STOWAGE_ERROR_INVALID_ARGUMENT;
    case absl::StatusCode::kNotFound:
      return STOWAGE_ERROR_NOT_FOUND;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return STOWAGE_ERROR_FAILED_PRECONDITION;
    case absl::StatusCode::kResourceExhausted:
      return STOWAGE_ERROR_RESOURCE_EXHAUSTED;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kUnimplemented:
      return STOWAGE_ERROR_UNAVAILABLE;
    case absl::StatusCode::kDataLoss:
      return STOWAGE_ERROR_DATA_LOSS;
    default:
      return STOWAGE_ERROR_INTERNAL;
  }
}

// The longest message stowage_last_error() returns. Messages quote what they refuse, and a caller
// may hand the library a 100 MB name: the thread's last error stays a readable size whatever the
// input (the real messages are well under 1 KiB).
constexpr size_t kMaxErrorChars = 4096;

stowage_status Fail(stowage_status status, std::string message) {
  if (message.size() > kMaxErrorChars) {
    const size_t cut = message.size() - kMaxErrorChars;
    message.resize(kMaxErrorChars);
    absl::StrAppend(&message, "... (", cut, " more characters)");
  }
  last_error = std::move(message);
  return status;
}

stowage_status Record(stowage_runtime* rt, const absl::Status& status, const char* call) {
  if (status.ok()) return STOWAGE_OK;
  const stowage_status code = StatusToStowageCode(status);
  if (rt != nullptr && rt->runtime != nullptr) {
    // errors_by_status is the one counter the C ABI owns.
    rt->runtime->mutable_counters().errors_by_status[code].fetch_add(1, std::memory_order_relaxed);
  }
  return Fail(code, absl::StrCat(call, ": ", status.message()));
}

// Runs `body` (returning absl::Status) with exceptions turned into INTERNAL.
template <typename Body>
stowage_status Guard(stowage_runtime* rt, const char* call, Body&& body) {
  try {
    return Record(rt, body(), call);
  } catch (const std::exception& e) {
    return Record(rt, absl::InternalError(absl::StrCat("unexpected exception: ", e.what())), call);
  } catch (...) {
    return Record(rt, absl::InternalError("unexpected exception"), call);
  }
}

// The handle `rt` names a live runtime, or the call fails INVALID_ARGUMENT (Note [Handles]).
// Then rebinds `rt` to the object itself, held by a lease until the calling function returns,
// so the body uses rt->runtime as before. A statement at function scope only.
stowage_status HandleError(const stowage_runtime* rt, const char* call) {
  if (rt == nullptr)
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, absl::StrCat(call, ": rt is NULL"));
  return Fail(STOWAGE_ERROR_INVALID_ARGUMENT,
              absl::StrCat(call,
                           ": rt is not a live runtime (already destroyed, or not a handle "
                           "from stowage_create)"));
}
#define STOWAGE_CHECK_RUNTIME(rt, call)                                                      \
  const std::shared_ptr<stowage_runtime> rt##_lease = Handles().Find(rt);                    \
  if (rt##_lease == nullptr || rt##_lease->runtime == nullptr) return HandleError(rt, call); \
  rt = rt##_lease.get()

// `metrics_address` is the endpoint option (null: read the environment), for the exporter.
absl::Status ToRuntimeOptions(const stowage_options* in, stowage::runtime::RuntimeOptions* out,
                              std::optional<std::string>* metrics_address) {
  stowage_options options;
  stowage_options_init(&options);
  if (in != nullptr) {
    if (in->struct_size != sizeof(stowage_options)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "options->struct_size is ", in->struct_size, "; this library (ABI ", STOWAGE_ABI_VERSION,
          ") expects ", sizeof(stowage_options), ": initialise options with stowage_options_init"));
    }
    std::memcpy(&options, in, sizeof(options));
  }
  // Read as the integer a C caller may have stored: an out-of-range enum value must be rejected,
  // not loaded as the enum type (undefined behaviour).
  int32_t backend = 0;
  static_assert(sizeof(backend) == sizeof(options.backend));
  std::memcpy(&backend, &options.backend, sizeof(backend));
  switch (backend) {
    case STOWAGE_BACKEND_AUTO:
      out->backend = stowage::runtime::BackendKind::kAuto;
      break;
    case STOWAGE_BACKEND_HOST:
      out->backend = stowage::runtime::BackendKind::kHost;
      break;
    case STOWAGE_BACKEND_CUDA:
      out->backend = stowage::runtime::BackendKind::kCuda;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("options->backend is ", backend,
                                                     "; use STOWAGE_BACKEND_AUTO, _HOST or _CUDA"));
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("options->device is ", options.device));
  }
  if (options.numa_node < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("options->numa_node is ", options.numa_node, "; -1 means the GPU's node"));
  }
  out->device = options.device;
  out->numa_node = options.numa_node;
  out->verify_checksums = options.verify_checksums != 0;
  out->copy_chunk_bytes = options.copy_chunk_bytes;
  out->copy_threads = options.copy_threads;
  out->stage = options.stage;
  // -1: the environment's (offload/node_ledger.h ResolveLedgerOptions checks them together).
  for (auto [name, value] : {std::pair<const char*, int32_t>{"rank", options.rank},
                             {"local_rank", options.local_rank},
                             {"local_world_size", options.local_world_size},
                             {"world_size", options.world_size}}) {
    if (value < -1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "options->", name, " is ", value, "; allowed: -1 (from the environment) or 0 and up"));
    }
  }
  out->ledger.rank = options.rank;
  out->ledger.local_rank = options.local_rank;
  out->ledger.local_world_size = options.local_world_size;
  out->ledger.world_size = options.world_size;
  if (options.metrics_address != nullptr) *metrics_address = options.metrics_address;
  absl::StatusOr<std::vector<double>> buckets =
      stowage::runtime::ResolveStepSecondsBuckets(options.metrics_step_buckets);
  if (!buckets.ok()) return buckets.status();
  out->step_seconds_buckets = *std::move(buckets);
  return absl::OkStatus();
}

// A malloc'd copy for the caller to free with stowage_free_string.
absl::Status CopyOut(const std::string& text, char** out) {
  char* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (copy == nullptr) return absl::ResourceExhaustedError("out of memory for the result");
  std::memcpy(copy, text.c_str(), text.size() + 1);
  *out = copy;
  return absl::OkStatus();
}

// The planning service (planner/request/plan_request.h): a request in, a malloc'd string out.
template <typename Service>
stowage_status PlanningCall(const char* call, const char* request, size_t bytes, char** out,
                            Service&& service) {
  if (out == nullptr)
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, absl::StrCat(call, ": out is NULL"));
  *out = nullptr;
  if (request == nullptr) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, absl::StrCat(call, ": request_json is NULL"));
  }
  return Guard(nullptr, call, [&]() -> absl::Status {
    absl::StatusOr<std::string> text =
        service(std::string_view(request, bytes), absl::StrCat("stowage ", stowage_version()));
    if (!text.ok()) return text.status();
    return CopyOut(*text, out);
  });
}

}  // namespace

extern "C" {

const char* stowage_version(void) { return STOWAGE_VERSION_STRING; }

stowage_status stowage_get_version(int32_t* major, int32_t* minor, int32_t* patch, int32_t* abi) {
  if (major != nullptr) *major = STOWAGE_VERSION_MAJOR;
  if (minor != nullptr) *minor = STOWAGE_VERSION_MINOR;
  if (patch != nullptr) *patch = STOWAGE_VERSION_PATCH;
  if (abi != nullptr) *abi = STOWAGE_ABI_VERSION;
  return STOWAGE_OK;
}

const char* stowage_status_string(stowage_status status) {
  switch (status) {
    case STOWAGE_OK:
      return "OK";
    case STOWAGE_ERROR_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case STOWAGE_ERROR_NOT_FOUND:
      return "NOT_FOUND";
    case STOWAGE_ERROR_FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case STOWAGE_ERROR_RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case STOWAGE_ERROR_UNAVAILABLE:
      return "UNAVAILABLE";
    case STOWAGE_ERROR_DATA_LOSS:
      return "DATA_LOSS";
    case STOWAGE_ERROR_INTERNAL:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

const char* stowage_last_error(void) { return last_error.c_str(); }

stowage_status stowage_options_init(stowage_options* options) {
  if (options == nullptr) return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "options is NULL");
  *options = stowage_options{};
  options->struct_size = sizeof(stowage_options);
  options->backend = STOWAGE_BACKEND_AUTO;
  options->numa_node = -1;
  options->rank = options->local_rank = options->local_world_size = options->world_size = -1;
  return STOWAGE_OK;
}

// The plan validator and the copy engine bound copy_chunk_bytes alike, so that a plan the
// validator accepts is one the runtime runs, and its option and its plan field mean one range.
static_assert(stowage::kPlanMinCopyChunkBytes == stowage::offload::kMinCopyChunkBytes);
static_assert(stowage::kPlanMaxCopyChunkBytes == stowage::offload::kMaxCopyChunkBytes);

stowage_status stowage_plan_validate(const char* plan_json, size_t plan_json_bytes) {
  if (plan_json == nullptr) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "stowage_plan_validate: plan_json is NULL");
  }
  return Guard(nullptr, "stowage_plan_validate", [&]() -> absl::Status {
    return stowage::ParsePlanJson(std::string_view(plan_json, plan_json_bytes)).status();
  });
}

stowage_status stowage_plan_hash(const char* plan_json, size_t plan_json_bytes,
                                 uint64_t* out_hash) {
  if (plan_json == nullptr) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "stowage_plan_hash: plan_json is NULL");
  }
  if (out_hash == nullptr) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "stowage_plan_hash: out_hash is NULL");
  }
  return Guard(nullptr, "stowage_plan_hash", [&]() -> absl::Status {
    absl::StatusOr<stowage::Plan> plan =
        stowage::ParsePlanJson(std::string_view(plan_json, plan_json_bytes));
    if (!plan.ok()) return plan.status();
    *out_hash = stowage::CanonicalPlanHash(*plan);
    return absl::OkStatus();
  });
}

stowage_status stowage_get_plan_hash(stowage_runtime* rt, uint64_t* out_hash) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_get_plan_hash");
  if (out_hash == nullptr) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "stowage_get_plan_hash: out_hash is NULL");
  }
  *out_hash = rt->runtime->plan_hash();
  return STOWAGE_OK;
}

stowage_status stowage_check_plan_agreement(const uint64_t* hashes, size_t count) {
  if (hashes == nullptr && count > 0) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT,
                absl::StrCat("stowage_check_plan_agreement: hashes is NULL, count ", count));
  }
  return Guard(nullptr, "stowage_check_plan_agreement", [&]() -> absl::Status {
    return stowage::runtime::CheckPlanAgreement(
        std::vector<uint64_t>(hashes, hashes == nullptr ? hashes : hashes + count));
  });
}

stowage_status stowage_agree_nccl(stowage_runtime* rt, void* nccl_comm) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_agree_nccl");
  if (nccl_comm == nullptr) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "stowage_agree_nccl: nccl_comm is NULL");
  }
  return Guard(rt, "stowage_agree_nccl", [&]() -> absl::Status {
    return stowage::runtime::AgreeOverNccl(rt->runtime->plan_hash(), nccl_comm);
  });
}

stowage_status stowage_create(const char* plan_json, size_t plan_json_bytes,
                              const stowage_options* options, stowage_runtime** out) {
  if (out == nullptr) return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "stowage_create: out is NULL");
  *out = nullptr;
  if (plan_json == nullptr) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "stowage_create: plan_json is NULL");
  }
  return Guard(nullptr, "stowage_create", [&]() -> absl::Status {
    stowage::runtime::RuntimeOptions runtime_options;
    std::optional<std::string> metrics_option;
    if (absl::Status s = ToRuntimeOptions(options, &runtime_options, &metrics_option); !s.ok()) {
      return s;
    }
    absl::StatusOr<stowage::Plan> plan =
        stowage::ParsePlanJson(std::string_view(plan_json, plan_json_bytes));
    if (!plan.ok()) return plan.status();
    auto handle = std::make_shared<stowage_runtime>();
    absl::StatusOr<std::unique_ptr<Runtime>> runtime = Runtime::Create(*plan, runtime_options);
    if (!runtime.ok()) return runtime.status();
    handle->runtime = *std::move(runtime);
    const absl::StatusOr<std::string> address = stowage::runtime::ResolveRankMetricsAddress(
        metrics_option.has_value() ? metrics_option->c_str() : nullptr,
        handle->runtime->counters().local_rank);
    if (!address.ok()) return address.status();
    if (!address->empty()) {
      absl::StatusOr<std::unique_ptr<stowage::runtime::MetricsExporter>> exporter =
          stowage::runtime::MetricsExporter::Start(*address, handle->runtime->shared_counters());
      if (!exporter.ok()) return exporter.status();
      handle->exporter = *std::move(exporter);
    }
    *out = Handles().Add(std::move(handle));
    return absl::OkStatus();
  });
}

stowage_status stowage_destroy(stowage_runtime* rt) {
  if (rt == nullptr) return STOWAGE_OK;  // like free(NULL)
  stowage_runtime* const token = rt;
  STOWAGE_CHECK_RUNTIME(rt, "stowage_destroy");
  if (rt->runtime->in_step()) {
    return Record(rt,
                  absl::FailedPreconditionError(
                      "a step is open; call stowage_end_step first (nothing was destroyed)"),
                  "stowage_destroy");
  }
  // From here the token is dead to every other call; the object goes when the last lease does
  // (this one, unless a call races the destroy).
  if (Handles().Remove(token) == nullptr) return HandleError(token, "stowage_destroy");
  return STOWAGE_OK;
}

stowage_status stowage_begin_step(stowage_runtime* rt) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_begin_step");
  return Guard(rt, "stowage_begin_step", [&] { return rt->runtime->BeginStep(); });
}

stowage_status stowage_end_step(stowage_runtime* rt) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_end_step");
  return Guard(rt, "stowage_end_step", [&] { return rt->runtime->EndStep(); });
}

namespace {

stowage_status SaveOne(const char* call, stowage_runtime* rt, int32_t layer, int32_t microbatch,
                       const void* src, size_t bytes, void* stream, stowage_tensor_id* out_id) {
  STOWAGE_CHECK_RUNTIME(rt, call);
  if (out_id == nullptr) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, absl::StrCat(call, ": out_id is NULL"));
  }
  return Guard(rt, call, [&]() -> absl::Status {
    absl::StatusOr<stowage::runtime::TensorId> id =
        rt->runtime->Save(layer, microbatch, src, bytes, stream);
    if (!id.ok()) return id.status();
    *out_id = *id;
    return absl::OkStatus();
  });
}

}  // namespace

stowage_status stowage_save(stowage_runtime* rt, int32_t layer, const void* src, size_t bytes,
                            void* stream, stowage_tensor_id* out_id) {
  return SaveOne("stowage_save", rt, layer, 0, src, bytes, stream, out_id);
}

stowage_status stowage_save_microbatch(stowage_runtime* rt, int32_t layer, int32_t microbatch,
                                       const void* src, size_t bytes, void* stream,
                                       stowage_tensor_id* out_id) {
  return SaveOne("stowage_save_microbatch", rt, layer, microbatch, src, bytes, stream, out_id);
}

stowage_status stowage_save_query(stowage_runtime* rt, stowage_tensor_id id, int32_t* done) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_save_query");
  if (done == nullptr)
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "stowage_save_query: done is NULL");
  return Guard(rt, "stowage_save_query", [&]() -> absl::Status {
    absl::StatusOr<bool> landed = rt->runtime->SaveQuery(id);
    if (!landed.ok()) return landed.status();
    *done = *landed ? 1 : 0;
    return absl::OkStatus();
  });
}

stowage_status stowage_save_wait(stowage_runtime* rt, stowage_tensor_id id) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_save_wait");
  return Guard(rt, "stowage_save_wait", [&] { return rt->runtime->SaveWait(id); });
}

stowage_status stowage_save_wait_stream(stowage_runtime* rt, stowage_tensor_id id, void* stream) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_save_wait_stream");
  return Guard(rt, "stowage_save_wait_stream",
               [&] { return rt->runtime->SaveWaitStream(id, stream); });
}

stowage_status stowage_prefetch(stowage_runtime* rt, stowage_tensor_id id, void* dst,
                                void* stream) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_prefetch");
  return Guard(rt, "stowage_prefetch", [&] { return rt->runtime->Prefetch(id, dst, stream); });
}

stowage_status stowage_prefetch_microbatch(stowage_runtime* rt, stowage_tensor_id id,
                                           int32_t microbatch, void* dst, void* stream) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_prefetch_microbatch");
  return Guard(rt, "stowage_prefetch_microbatch",
               [&] { return rt->runtime->Prefetch(id, dst, stream, microbatch); });
}

stowage_status stowage_restore(stowage_runtime* rt, stowage_tensor_id id, void* dst, void* stream) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_restore");
  return Guard(rt, "stowage_restore", [&] { return rt->runtime->Restore(id, dst, stream); });
}

stowage_status stowage_restore_microbatch(stowage_runtime* rt, stowage_tensor_id id,
                                          int32_t microbatch, void* dst, void* stream) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_restore_microbatch");
  return Guard(rt, "stowage_restore_microbatch",
               [&] { return rt->runtime->Restore(id, dst, stream, microbatch); });
}

// The batched forms are loops over the single calls, here rather than in Runtime: what they
// save is the per-call cost of the caller's language (a ctypes call from Python costs more than
// the save itself) and the copy workers' wake-ups, which coalesce when copies are issued back to
// back.
namespace {

stowage_status SaveMany(const char* call, stowage_runtime* rt, int32_t layer, int32_t microbatch,
                        size_t count, const void* const* srcs, const size_t* bytes, void* stream,
                        stowage_tensor_id* out_ids, size_t* out_saved) {
  STOWAGE_CHECK_RUNTIME(rt, call);
  if (out_saved != nullptr) *out_saved = 0;
  if (count > 0 && (srcs == nullptr || bytes == nullptr || out_ids == nullptr)) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, absl::StrCat(call, ": ", count, " tensors but ",
                                                             srcs == nullptr    ? "srcs"
                                                             : bytes == nullptr ? "bytes"
                                                                                : "out_ids",
                                                             " is NULL"));
  }
  return Guard(rt, call, [&]() -> absl::Status {
    for (size_t k = 0; k < count; ++k) {
      absl::StatusOr<stowage::runtime::TensorId> id =
          rt->runtime->Save(layer, microbatch, srcs[k], bytes[k], stream);
      if (!id.ok()) {
        return absl::Status(id.status().code(), absl::StrCat("tensor ", k, " of ", count, ": ",
                                                             std::string(id.status().message())));
      }
      out_ids[k] = *id;
      if (out_saved != nullptr) *out_saved = k + 1;
    }
    return absl::OkStatus();
  });
}

}  // namespace

stowage_status stowage_save_many(stowage_runtime* rt, int32_t layer, size_t count,
                                 const void* const* srcs, const size_t* bytes, void* stream,
                                 stowage_tensor_id* out_ids, size_t* out_saved) {
  return SaveMany("stowage_save_many", rt, layer, 0, count, srcs, bytes, stream, out_ids,
                  out_saved);
}

stowage_status stowage_save_many_microbatch(stowage_runtime* rt, int32_t layer, int32_t microbatch,
                                            size_t count, const void* const* srcs,
                                            const size_t* bytes, void* stream,
                                            stowage_tensor_id* out_ids, size_t* out_saved) {
  return SaveMany("stowage_save_many_microbatch", rt, layer, microbatch, count, srcs, bytes, stream,
                  out_ids, out_saved);
}

namespace {

stowage_status PrefetchMany(const char* call, stowage_runtime* rt, std::optional<int> microbatch,
                            size_t count, const stowage_tensor_id* ids, void* const* dsts,
                            void* stream, size_t* out_issued) {
  STOWAGE_CHECK_RUNTIME(rt, call);
  if (out_issued != nullptr) *out_issued = 0;
  if (count > 0 && (ids == nullptr || dsts == nullptr)) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT,
                absl::StrCat(call, ": ", count, " tensors but ", ids == nullptr ? "ids" : "dsts",
                             " is NULL"));
  }
  return Guard(rt, call, [&]() -> absl::Status {
    for (size_t k = 0; k < count; ++k) {
      if (absl::Status s = rt->runtime->Prefetch(ids[k], dsts[k], stream, microbatch); !s.ok()) {
        return absl::Status(
            s.code(), absl::StrCat("tensor ", k, " of ", count, ": ", std::string(s.message())));
      }
      if (out_issued != nullptr) *out_issued = k + 1;
    }
    return absl::OkStatus();
  });
}

}  // namespace

stowage_status stowage_prefetch_many(stowage_runtime* rt, size_t count,
                                     const stowage_tensor_id* ids, void* const* dsts, void* stream,
                                     size_t* out_issued) {
  return PrefetchMany("stowage_prefetch_many", rt, std::nullopt, count, ids, dsts, stream,
                      out_issued);
}

stowage_status stowage_prefetch_many_microbatch(stowage_runtime* rt, int32_t microbatch,
                                                size_t count, const stowage_tensor_id* ids,
                                                void* const* dsts, void* stream,
                                                size_t* out_issued) {
  return PrefetchMany("stowage_prefetch_many_microbatch", rt, microbatch, count, ids, dsts, stream,
                      out_issued);
}

stowage_status stowage_pipeline_order(const char* schedule, int32_t pp, int32_t vpp,
                                      int32_t microbatches, int32_t stage, stowage_pipeline_op* out,
                                      size_t capacity, size_t* count) {
  if (count == nullptr) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "stowage_pipeline_order: count is NULL");
  }
  *count = 0;
  if (capacity > 0 && out == nullptr) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT,
                absl::StrCat("stowage_pipeline_order: out is NULL with capacity ", capacity));
  }
  return Guard(nullptr, "stowage_pipeline_order", [&]() -> absl::Status {
    if (schedule == nullptr) return absl::InvalidArgumentError("schedule is NULL");
    absl::StatusOr<stowage::PipelineSchedule> parsed = stowage::ParsePipelineSchedule(schedule);
    if (!parsed.ok()) return parsed.status();
    // The plan's rules for these fields (ValidatePlan), on a plan of just them.
    if (absl::Status s = stowage::CheckPipelineRun(*parsed, pp, vpp, microbatches); !s.ok()) {
      return s;
    }
    if (stage < 0 || stage >= pp) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage is ", stage, "; allowed: 0 to ", pp - 1, " (pp is ", pp, ")"));
    }
    const std::vector<stowage::PipelineOp> order =
        stowage::PipelineOrder(*parsed, pp, vpp, microbatches, stage);
    *count = order.size();
    for (size_t k = 0; k < order.size() && k < capacity; ++k) {
      out[k] = {order[k].forward ? 1 : 0, order[k].chunk, order[k].microbatch};
    }
    return absl::OkStatus();
  });
}

stowage_status stowage_get_stats(stowage_runtime* rt, stowage_stats* out) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_get_stats");
  if (out == nullptr) return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "stowage_get_stats: out is NULL");
  return Guard(rt, "stowage_get_stats", [&]() -> absl::Status {
    Runtime& r = *rt->runtime;
    const uint64_t in_flight = r.copies_in_flight();  // reaps landed copies first
    const stowage::runtime::RuntimeCounters& c = r.counters();
    constexpr auto kRelaxed = std::memory_order_relaxed;
    stowage_stats s{};
    s.steps_completed = c.steps_total.load(kRelaxed);
    s.arena_capacity_bytes = c.arena_capacity_bytes.load(kRelaxed);
    s.arena_used_bytes = c.arena_used_bytes.load(kRelaxed);
    s.arena_peak_bytes = c.arena_peak_bytes.load(kRelaxed);
    s.saves_total = c.saves_total.load(kRelaxed);
    s.restores_total = c.restores_total.load(kRelaxed);
    s.d2h_bytes_total = c.d2h.bytes.load(kRelaxed);
    s.h2d_bytes_total = c.h2d.bytes.load(kRelaxed);
    s.d2h_seconds_total = stowage::runtime::Seconds(c.d2h.busy_nanos);
    s.h2d_seconds_total = stowage::runtime::Seconds(c.h2d.busy_nanos);
    s.stall_seconds_total = stowage::runtime::Seconds(c.stall_nanos);
    s.last_step_seconds = stowage::runtime::Seconds(c.last_step_nanos);
    s.copies_in_flight = in_flight;
    uint64_t errors = 0;
    for (const auto& e : c.errors_by_status) errors += e.load(kRelaxed);
    s.errors_total = errors;
    s.numa_node = c.numa_node;
    s.backend = r.backend_kind() == stowage::runtime::BackendKind::kCuda ? STOWAGE_BACKEND_CUDA
                                                                         : STOWAGE_BACKEND_HOST;
    *out = s;
    return absl::OkStatus();
  });
}

stowage_status stowage_report_device_peak(stowage_runtime* rt, uint64_t bytes) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_report_device_peak");
  rt->runtime->ReportDevicePeak(bytes);
  return STOWAGE_OK;
}

stowage_status stowage_num_layers(stowage_runtime* rt, int32_t* out) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_num_layers");
  if (out == nullptr)
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "stowage_num_layers: out is NULL");
  *out = rt->runtime->num_layers();
  return STOWAGE_OK;
}

stowage_status stowage_get_layer_info(stowage_runtime* rt, int32_t layer, stowage_layer_info* out) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_get_layer_info");
  if (out == nullptr) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "stowage_get_layer_info: out is NULL");
  }
  if (out->struct_size != sizeof(stowage_layer_info)) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT,
                absl::StrCat("stowage_get_layer_info: out->struct_size is ", out->struct_size,
                             "; expected ", sizeof(stowage_layer_info)));
  }
  return Guard(rt, "stowage_get_layer_info", [&]() -> absl::Status {
    if (layer < 0 || layer >= rt->runtime->num_layers()) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", layer,
                                                     " is out of range; the plan has ",
                                                     rt->runtime->num_layers(), " layers"));
    }
    const stowage::runtime::LayerInfo info = rt->runtime->GetLayerInfo(layer);
    out->index = info.index;
    out->offloads = info.offloads ? 1 : 0;
    out->prefetch_after_layer = info.prefetch_after_layer;
    out->save_wait_before_layer = info.save_wait_before_layer;
    out->host_bytes = info.host_bytes;
    out->host_bytes_used = info.host_bytes_used;
    out->in_flight_microbatches = info.in_flight_microbatches;
    return absl::OkStatus();
  });
}

stowage_status stowage_set_trace_capacity(stowage_runtime* rt, size_t capacity) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_set_trace_capacity");
  return Guard(rt, "stowage_set_trace_capacity",
               [&]() -> absl::Status { return rt->runtime->SetTraceCapacity(capacity); });
}

stowage_status stowage_get_trace(stowage_runtime* rt, stowage_trace_event* out, size_t capacity,
                                 size_t* count, uint64_t* dropped) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_get_trace");
  if (count == nullptr)
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "stowage_get_trace: count is NULL");
  if (out == nullptr && capacity > 0) {
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT,
                absl::StrCat("stowage_get_trace: out is NULL but capacity is ", capacity));
  }
  return Guard(rt, "stowage_get_trace", [&]() -> absl::Status {
    uint64_t lost = 0;
    const std::vector<stowage::runtime::TraceEvent> events = rt->runtime->LastTrace(&lost);
    for (size_t i = 0; i < events.size() && i < capacity; ++i) {
      const stowage::runtime::TraceEvent& e = events[i];
      out[i] = {e.seq, static_cast<int32_t>(e.kind), e.layer, e.microbatch, e.bytes, e.id, e.nanos};
    }
    *count = events.size();
    if (dropped != nullptr) *dropped = lost;
    return absl::OkStatus();
  });
}

const char* stowage_event_kind_name(int32_t kind) {
  if (kind < STOWAGE_EVENT_SAVE_ISSUED || kind > STOWAGE_EVENT_RESTORE) return "unknown";
  // string_view literals: NUL-terminated.
  return stowage::StepEventKindName(static_cast<stowage::StepEventKind>(kind)).data();
}

stowage_status stowage_get_trace_json(stowage_runtime* rt, char** out) {
  STOWAGE_CHECK_RUNTIME(rt, "stowage_get_trace_json");
  if (out == nullptr)
    return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "stowage_get_trace_json: out is NULL");
  *out = nullptr;
  return Guard(rt, "stowage_get_trace_json", [&]() -> absl::Status {
    uint64_t lost = 0;
    stowage::StepTraceInput trace;
    trace.pid = static_cast<int>(getpid());
    trace.process_name = absl::StrCat("measured: stowage runtime (pid ", trace.pid, ")");
    for (const stowage::runtime::TraceEvent& e : rt->runtime->LastTrace(&lost)) {
      trace.events.push_back(
          {e.kind, e.layer, e.bytes, e.id, static_cast<double>(e.nanos) * 1e-9, e.microbatch});
    }
    if (lost > 0) absl::StrAppend(&trace.process_name, ", ", lost, " events past the capacity");
    return CopyOut(stowage::StepTraceJson(trace), out);
  });
}

stowage_status stowage_plan_request(const char* request_json, size_t request_json_bytes,
                                    char** plan_json_out) {
  return PlanningCall("stowage_plan_request", request_json, request_json_bytes, plan_json_out,
                      [plan_json_out](std::string_view request,
                                      const std::string& generator) -> absl::StatusOr<std::string> {
                        std::string closest;
                        absl::StatusOr<std::string> plan =
                            stowage::planner::PlanFromRequestJson(request, generator, &closest);
                        // RESOURCE_EXHAUSTED still hands back the closest plan ("fits": false) when
                        // there is one.
                        if (!plan.ok() && !closest.empty()) {
                          if (absl::Status s = CopyOut(closest, plan_json_out); !s.ok()) return s;
                        }
                        return plan;
                      });
}

stowage_status stowage_plan_evaluate(const char* request_json, size_t request_json_bytes,
                                     char** result_json_out) {
  return PlanningCall("stowage_plan_evaluate", request_json, request_json_bytes, result_json_out,
                      stowage::planner::EvaluateRequestJson);
}

void stowage_free_string(char* s) { std::free(s); }

}  // extern "C"
