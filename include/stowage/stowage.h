/* stowage runtime — stable C ABI.
 *
 * A trainer creates one runtime per GPU (per rank) from a plan, then every training step:
 *
 *   stowage_begin_step(rt);
 *   forward:  for each offloaded tensor  stowage_save(rt, layer, dev_ptr, bytes, stream, &id);
 *             before reusing dev_ptr      stowage_save_wait_stream(rt, id, stream)  (or poll)
 *   backward: ahead of the layer          stowage_prefetch(rt, id, dst, stream);
 *             before the layer uses dst   stowage_restore(rt, id, dst, stream);
 *   stowage_end_step(rt);   -- releases everything the step held, always
 *
 * Microbatches. A step is one optimizer step: every microbatch of it (gradient accumulation, or
 * a pipeline schedule's forwards and backwards in any order) runs between one begin_step and one
 * end_step. The _microbatch forms of save, prefetch and restore name the microbatch, 0 to the
 * plan's run.microbatches - 1; the plain forms are microbatch 0 (save) or the id's own
 * (prefetch, restore). A layer holds at most its plan's in_flight_microbatches at once: a
 * microbatch's first save into a layer takes one of the layer's slots; its saves there end when
 * another microbatch saves into the layer, and the slot is free for the next microbatch once
 * they have ended and all of them were restored -- so a step may run many more microbatches than
 * are in flight. Misuse, each naming the layer, the microbatch and the planned count: a
 * microbatch outside run.microbatches (INVALID_ARGUMENT); a save of a microbatch whose saves
 * ended, restored or not -- a second forward under one id (FAILED_PRECONDITION); one microbatch
 * more in flight than planned, or more than the plan's bytes for one microbatch
 * (RESOURCE_EXHAUSTED); a prefetch or restore naming a microbatch that never saved the id's
 * layer in this step (NOT_FOUND) or another microbatch's id (INVALID_ARGUMENT).
 *
 * Streams. A `stream` argument is a cudaStream_t passed as void* (NULL: the legacy default
 * stream). With the host backend streams are ignored and "device" pointers are ordinary host
 * memory. The runtime copies on its own non-blocking D2H and H2D streams:
 *   - stowage_save orders its D2H after all work enqueued on `stream` so far (the producer);
 *   - the device block passed to stowage_save may be reused once the save completed: poll
 *     stowage_save_query, block in stowage_save_wait, or make a stream wait with
 *     stowage_save_wait_stream (a device-side wait, no host sync);
 *   - stowage_prefetch orders its H2D after work enqueued on `stream` so far (so a buffer the
 *     caller just allocated on that stream is safe to overwrite) and returns at once;
 *   - stowage_restore makes `stream` wait (device-side) until the bytes are in `dst`; it issues
 *     the H2D itself if no prefetch was made.
 *
 * Thread-safety. All calls on one runtime are safe from several threads (saves from several
 * threads at once are supported). begin/end step and destroy must not race with other calls on
 * the same runtime; a begin/end step made while another thread is inside one of them is refused
 * (FAILED_PRECONDITION) and does nothing. stowage_last_error() is per thread.
 *
 * Errors. Every call returns a stowage_status; on failure stowage_last_error() describes it. A
 * failed call changes nothing, except where documented.
 */
#ifndef STOWAGE_STOWAGE_H_
#define STOWAGE_STOWAGE_H_

#include <stddef.h>
#include <stdint.h>

#include "stowage/version.h" /* STOWAGE_VERSION_MAJOR, _MINOR, _PATCH, _STRING */

#if defined(_WIN32)
#define STOWAGE_API
#else
#define STOWAGE_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* 2: the _microbatch calls and stowage_pipeline_order were added; every ABI 1 call is kept.
 * 3: stowage_trace_event carries the tensor's microbatch and stowage_layer_info the layer's
 * in_flight_microbatches (both structs changed size: rebuild against this header).
 * 4: stowage_options carries the launcher's ranks (rank, local_rank, local_world_size,
 * world_size; it changed size: rebuild against this header). */
#define STOWAGE_ABI_VERSION 4

typedef enum stowage_status {
  STOWAGE_OK = 0,
  STOWAGE_ERROR_INVALID_ARGUMENT = 1,    /* bad pointer, size, plan field, option */
  STOWAGE_ERROR_NOT_FOUND = 2,           /* unknown tensor id, or one from an earlier step */
  STOWAGE_ERROR_FAILED_PRECONDITION = 3, /* wrong state: restore twice, save outside a step... */
  STOWAGE_ERROR_RESOURCE_EXHAUSTED = 4,  /* more than the plan reserved; host memory admission */
  STOWAGE_ERROR_UNAVAILABLE = 5,         /* no GPU / backend not built */
  STOWAGE_ERROR_DATA_LOSS = 6,           /* checksum mismatch on restore (verify mode) */
  STOWAGE_ERROR_INTERNAL = 7,            /* CUDA or OS call failed */
} stowage_status;

typedef enum stowage_backend {
  STOWAGE_BACKEND_AUTO = 0, /* CUDA when built and a GPU is present, else host */
  STOWAGE_BACKEND_HOST = 1, /* "device" memory is host memory; copies on worker threads */
  STOWAGE_BACKEND_CUDA = 2,
} stowage_backend;

typedef struct stowage_runtime stowage_runtime; /* opaque */
typedef uint64_t stowage_tensor_id;             /* names one saved tensor within one step */

typedef struct stowage_options {
  uint32_t struct_size; /* sizeof(stowage_options); set by stowage_options_init */
  stowage_backend backend;
  int32_t device;            /* CUDA device ordinal (default 0) */
  int32_t numa_node;         /* -1 (default): the GPU's own node from topology */
  int32_t verify_checksums;  /* non-zero: checksum every save, verify on restore */
  uint64_t copy_chunk_bytes; /* 0: the plan's value; else 4 KiB to 1 GiB (INVALID_ARGUMENT) */
  int32_t copy_threads;      /* host backend / arena touch threads, 0 to 64; 0: the node's CPUs */
  /* Prometheus endpoint, "host:port". NULL: read STOWAGE_METRICS_ADDR, whose port is the job's
   * base: this rank listens on base + LOCAL_RANK; empty or unset: no endpoint. Bound to the
   * address given (127.0.0.1 unless asked otherwise). */
  const char* metrics_address;
  /* The pipeline stage this rank runs, 0 to the plan's run.pp - 1 (default 0, the only stage of a
   * plan without pipeline parallelism); INVALID_ARGUMENT otherwise. The runtime reserves host
   * memory for that stage's layers only; saving into another stage's layer is INVALID_ARGUMENT. */
  int32_t stage;
  /* Upper bounds in seconds of the stowage_step_duration_seconds histogram, comma-separated,
   * increasing ("1,2.5,5,10,30,60"; +Inf implied; 1 to 128 of them). NULL: read
   * STOWAGE_METRICS_STEP_BUCKETS. "" (or NULL with that unset or empty): 12 per decade from 10 ms
   * to 681 s (docs/metrics.md). INVALID_ARGUMENT naming the setting and the entry otherwise. */
  const char* metrics_step_buckets;
  /* The launcher's ranks (docs/runtime-api.md "Ranks sharing a machine admit together"): this
   * rank, its rank on this machine, the job's ranks on this machine and in all. -1 (default): from
   * the environment, RANK / LOCAL_RANK / LOCAL_WORLD_SIZE / WORLD_SIZE as torchrun sets them (else
   * SLURM_PROCID / SLURM_LOCALID / - / SLURM_NTASKS). The local world size divides the node's CPUs
   * among its ranks from the first one to start; it must be at most the world size and above the
   * local rank: INVALID_ARGUMENT naming the setting (or variable) and its value otherwise. */
  int32_t rank;
  int32_t local_rank;
  int32_t local_world_size;
  int32_t world_size;
} stowage_options;

typedef struct stowage_stats {
  uint64_t steps_completed;
  uint64_t arena_capacity_bytes; /* pinned host bytes reserved */
  uint64_t arena_used_bytes;     /* in use by the current step */
  uint64_t arena_peak_bytes;     /* most ever in use within one step */
  uint64_t saves_total;
  uint64_t restores_total;
  uint64_t d2h_bytes_total;
  uint64_t h2d_bytes_total;
  double d2h_seconds_total; /* copy-engine busy time */
  double h2d_seconds_total;
  double stall_seconds_total; /* consumer waited on a restore that had not landed */
  double last_step_seconds;
  uint64_t copies_in_flight;
  uint64_t errors_total;
  int32_t numa_node; /* node the arena is bound to; -1 unknown */
  int32_t backend;   /* stowage_backend actually in use */
} stowage_stats;

/* The library's version, "MAJOR.MINOR.PATCH" (STOWAGE_VERSION_STRING of the build). */
STOWAGE_API const char* stowage_version(void);
/* The library's version and its ABI number (STOWAGE_ABI_VERSION: bumped when this header changes
 * incompatibly). A caller compiled against another header compares them with its own macros. Any
 * pointer may be NULL. Always OK. */
STOWAGE_API stowage_status stowage_get_version(int32_t* major, int32_t* minor, int32_t* patch,
                                               int32_t* abi);
STOWAGE_API const char* stowage_status_string(stowage_status status);
/* Message of the last failed call on this thread ("" if none). Valid until the next call. */
STOWAGE_API const char* stowage_last_error(void);

STOWAGE_API stowage_status stowage_options_init(stowage_options* options);

/* Reads and validates a plan (JSON text of `plan_json_bytes` bytes, not NUL-terminated) exactly as
 * stowage_create does, without creating anything: OK, or INVALID_ARGUMENT with
 * stowage_last_error() naming the field, its value and what is allowed. Every rule of the plan
 * lives in the C++ validator; bindings (Python's stowage.Plan) validate through this call.
 * Thread-safe. */
STOWAGE_API stowage_status stowage_plan_validate(const char* plan_json, size_t plan_json_bytes);

/* Plan agreement (docs/runtime-api.md "Plan agreement"): the ranks of a job check before step 0
 * that they hold the same plan by comparing one number, the hash of the canonical plan (XXH3-64 of
 * the plan as the strict reader fills it, written by the one writer: whitespace, key order and
 * fields the reader ignores do not change it). stowage_plan_hash validates as stowage_plan_validate
 * does (INVALID_ARGUMENT otherwise); stowage_get_plan_hash is that of the plan `rt` was created
 * from. stowage_check_plan_agreement is the rule every rank applies to the gathered hashes
 * (hashes[r]: rank r's; 0: rank r has no valid plan): OK when all ranks hold one valid plan, else
 * FAILED_PRECONDITION with stowage_last_error() naming the ranks that differ and the hash each
 * holds -- the same text on every rank. Thread-safe. */
STOWAGE_API stowage_status stowage_plan_hash(const char* plan_json, size_t plan_json_bytes,
                                             uint64_t* out_hash);
STOWAGE_API stowage_status stowage_get_plan_hash(stowage_runtime* rt, uint64_t* out_hash);
STOWAGE_API stowage_status stowage_check_plan_agreement(const uint64_t* hashes, size_t count);
/* C++ trainers: all-gathers rt's plan hash over `nccl_comm` (the trainer's ncclComm_t; every rank
 * of it must call, as for any collective) on a stream of its own on the communicator's device,
 * waits for it, then applies stowage_check_plan_agreement. NCCL is the one already loaded in the
 * process (else libnccl.so.2). UNAVAILABLE when this library was built without NCCL or none can
 * be loaded; INTERNAL naming the CUDA or NCCL call that failed. Blocks like any collective. */
STOWAGE_API stowage_status stowage_agree_nccl(stowage_runtime* rt, void* nccl_comm);

/* Creates a runtime from a plan (JSON text, see docs/plan-format.md). Checks host memory
 * admission, then maps, binds, touches and pins the arena the plan asks for. */
STOWAGE_API stowage_status stowage_create(const char* plan_json, size_t plan_json_bytes,
                                          const stowage_options* options, stowage_runtime** out);
/* Fails with FAILED_PRECONDITION (and destroys nothing) inside a step: end the step first.
 * A handle is dead after destroy: every call with it (destroy again included) is
 * INVALID_ARGUMENT, as for a pointer that never came from stowage_create. */
STOWAGE_API stowage_status stowage_destroy(stowage_runtime* rt);

STOWAGE_API stowage_status stowage_begin_step(stowage_runtime* rt);
/* Releases everything the step held, always. If copies were still in flight they are drained
 * first and FAILED_PRECONDITION is returned; if saved tensors were never restored the step is
 * still ended and OK is returned (stats count them). */
STOWAGE_API stowage_status stowage_end_step(stowage_runtime* rt);

/* Copies `bytes` at device pointer `src` to the host region the plan reserved for `layer`.
 * RESOURCE_EXHAUSTED if the layer would exceed its reservation. */
STOWAGE_API stowage_status stowage_save(stowage_runtime* rt, int32_t layer, const void* src,
                                        size_t bytes, void* stream, stowage_tensor_id* out_id);
/* As stowage_save, for `microbatch` (see Microbatches above). */
STOWAGE_API stowage_status stowage_save_microbatch(stowage_runtime* rt, int32_t layer,
                                                   int32_t microbatch, const void* src,
                                                   size_t bytes, void* stream,
                                                   stowage_tensor_id* out_id);
STOWAGE_API stowage_status stowage_save_query(stowage_runtime* rt, stowage_tensor_id id,
                                              int32_t* done);
STOWAGE_API stowage_status stowage_save_wait(stowage_runtime* rt, stowage_tensor_id id);
STOWAGE_API stowage_status stowage_save_wait_stream(stowage_runtime* rt, stowage_tensor_id id,
                                                    void* stream);

/* At most once per id, before its restore (FAILED_PRECONDITION otherwise). With
 * verify_checksums it first waits for the save's D2H and checks the host copy: DATA_LOSS (and no
 * copy) on mismatch; the id then fails its restore with DATA_LOSS too. */
STOWAGE_API stowage_status stowage_prefetch(stowage_runtime* rt, stowage_tensor_id id, void* dst,
                                            void* stream);
/* As stowage_prefetch; `microbatch` must be the one `id` was saved under. */
STOWAGE_API stowage_status stowage_prefetch_microbatch(stowage_runtime* rt, stowage_tensor_id id,
                                                       int32_t microbatch, void* dst, void* stream);
/* Consumes the id: a second restore fails with FAILED_PRECONDITION. After a prefetch, `dst` must
 * be the prefetch's (INVALID_ARGUMENT otherwise). With verify_checksums, DATA_LOSS if the host
 * copy no longer matches what was saved (nothing is copied); the host backend also checks `dst`
 * after the copy. Host backend: returns once `dst` holds the bytes. */
STOWAGE_API stowage_status stowage_restore(stowage_runtime* rt, stowage_tensor_id id, void* dst,
                                           void* stream);

/* As stowage_restore; `microbatch` must be the one `id` was saved under. The microbatch's last
 * restore of a layer frees its slot there. */
STOWAGE_API stowage_status stowage_restore_microbatch(stowage_runtime* rt, stowage_tensor_id id,
                                                      int32_t microbatch, void* dst, void* stream);

/* The batched forms, for callers whose every call costs (Python through ctypes): the same as
 * stowage_save for each (srcs[k], bytes[k]) of `layer` in order, writing out_ids[k], and as
 * stowage_prefetch for each (ids[k], dsts[k]), all on `stream`. They stop at the first failure
 * and return its status, its message naming the tensor's index; the calls before it took effect
 * (*out_saved / *out_issued, if not NULL, say how many). */
STOWAGE_API stowage_status stowage_save_many(stowage_runtime* rt, int32_t layer, size_t count,
                                             const void* const* srcs, const size_t* bytes,
                                             void* stream, stowage_tensor_id* out_ids,
                                             size_t* out_saved);
STOWAGE_API stowage_status stowage_prefetch_many(stowage_runtime* rt, size_t count,
                                                 const stowage_tensor_id* ids, void* const* dsts,
                                                 void* stream, size_t* out_issued);

/* The batched forms for one microbatch: every tensor is `microbatch`'s. */
STOWAGE_API stowage_status stowage_save_many_microbatch(
    stowage_runtime* rt, int32_t layer, int32_t microbatch, size_t count, const void* const* srcs,
    const size_t* bytes, void* stream, stowage_tensor_id* out_ids, size_t* out_saved);
STOWAGE_API stowage_status stowage_prefetch_many_microbatch(stowage_runtime* rt, int32_t microbatch,
                                                            size_t count,
                                                            const stowage_tensor_id* ids,
                                                            void* const* dsts, void* stream,
                                                            size_t* out_issued);

/* The order in which pipeline stage `stage` runs the forwards and backwards of one step under
 * `schedule` ("1f1b" or "interleaved") with `pp` stages, `vpp` model chunks per stage and
 * `microbatches` microbatches -- the order the planner's in_flight_microbatches counts come from
 * (docs/runtime-api.md "Microbatches in flight"). pp = 1 is gradient accumulation: each
 * microbatch's forward and backward before the next. Copies min(capacity, total) ops into `out`
 * (NULL when capacity is 0) and sets *count to the total, 2 x microbatches x vpp. INVALID_ARGUMENT
 * for values the plan's run fields could not hold (naming the field, its value and what is allowed)
 * or a stage outside [0, pp). Thread-safe. */
typedef struct stowage_pipeline_op {
  int32_t forward;    /* 1: forward, 0: backward */
  int32_t chunk;      /* the stage's model chunk, 0 to vpp - 1 */
  int32_t microbatch; /* 0 to microbatches - 1 */
} stowage_pipeline_op;
STOWAGE_API stowage_status stowage_pipeline_order(const char* schedule, int32_t pp, int32_t vpp,
                                                  int32_t microbatches, int32_t stage,
                                                  stowage_pipeline_op* out, size_t capacity,
                                                  size_t* count);

STOWAGE_API stowage_status stowage_get_stats(stowage_runtime* rt, stowage_stats* out);

/* What the plan says about one layer, so a trainer can drive the plan's protocol
 * (docs/plan-format.md "Runtime protocol"): wait for a layer's saves before the forward of
 * `save_wait_before_layer` (the number of layers: when backward starts), prefetch its tensors when
 * the backward of `prefetch_after_layer` starts. */
typedef struct stowage_layer_info {
  uint32_t struct_size; /* sizeof(stowage_layer_info); set by the caller */
  int32_t index;
  int32_t offloads;               /* non-zero: the plan reserved host memory for this layer */
  int32_t prefetch_after_layer;   /* -1: nothing to prefetch */
  uint64_t host_bytes;            /* the plan's reservation */
  uint64_t host_bytes_used;       /* saved into it in the current step (0 outside a step) */
  int32_t save_wait_before_layer; /* -1: nothing to wait for */
  int32_t in_flight_microbatches; /* the microbatches the layer holds at once (its slots) */
} stowage_layer_info;
/* Every layer of the plan, its MTP layers (the last run.mtp_layers, plan.h Note [MTP layers])
 * included: a trainer saves and restores an MTP layer under its index like any other. */
STOWAGE_API stowage_status stowage_num_layers(stowage_runtime* rt, int32_t* out);
/* INVALID_ARGUMENT for a layer outside [0, stowage_num_layers). */
STOWAGE_API stowage_status stowage_get_layer_info(stowage_runtime* rt, int32_t layer,
                                                  stowage_layer_info* out);
/* The trainer reports its measured device peak (e.g. torch.cuda.max_memory_allocated) so it is
 * exported next to the plan's prediction. */
STOWAGE_API stowage_status stowage_report_device_peak(stowage_runtime* rt, uint64_t bytes);

/* Step trace (docs/runtime-api.md "Step trace"). Off by default; stowage_set_trace_capacity(rt, n)
 * switches it on between steps (FAILED_PRECONDITION inside a step; INVALID_ARGUMENT past 1<<20
 * events; 0 switches it off). Then each step records, in the order the runtime sees them: a save
 * issued (stowage_save), its landing in host memory, each save wait (stowage_save_wait[_stream]), a
 * prefetch issued (stowage_prefetch, or a restore that issues the H2D itself), its landing in
 * device memory, each restore (stowage_restore). Calls are recorded when made; landings on the
 * copy threads when they happen, so their place among the calls depends on copy speed. At most
 * `n` events per step: later ones are not stored but counted (`dropped`). With the trace off a
 * call pays one atomic load. */
typedef enum stowage_event_kind {
  STOWAGE_EVENT_SAVE_ISSUED = 0,
  STOWAGE_EVENT_SAVE_LANDED = 1,
  STOWAGE_EVENT_SAVE_WAIT = 2,
  STOWAGE_EVENT_PREFETCH_ISSUED = 3,
  STOWAGE_EVENT_PREFETCH_LANDED = 4,
  STOWAGE_EVENT_RESTORE = 5,
} stowage_event_kind;

typedef struct stowage_trace_event {
  uint64_t seq; /* 0, 1, 2, ... within the step: the order recorded */
  int32_t kind; /* stowage_event_kind */
  int32_t layer;
  int32_t microbatch;   /* the one the tensor was saved under (0 for the single-microbatch calls) */
  uint64_t bytes;       /* the tensor's */
  stowage_tensor_id id; /* the tensor's */
  uint64_t nanos;       /* since begin_step; for reading, never for comparing */
} stowage_trace_event;

STOWAGE_API stowage_status stowage_set_trace_capacity(stowage_runtime* rt, size_t capacity);
/* The last completed step's events: copies min(capacity, *count) of them into `out` (NULL when
 * capacity is 0), sets *count to how many the step recorded (call again with a larger buffer if
 * it exceeds capacity) and, if `dropped` is not NULL, *dropped to the events past the trace
 * capacity the step could not record. No step completed with the trace on: *count = 0. */
STOWAGE_API stowage_status stowage_get_trace(stowage_runtime* rt, stowage_trace_event* out,
                                             size_t capacity, size_t* count, uint64_t* dropped);
/* "save_issued", "save_landed", "save_wait", "prefetch_issued", "prefetch_landed", "restore"
 * (the plan's and the simulator's words); "unknown" for other values. */
STOWAGE_API const char* stowage_event_kind_name(int32_t kind);
/* The last completed step's events as Chrome trace-event JSON (chrome://tracing, Perfetto): each
 * save and prefetch a span on the D2H / H2D track from issue to landing, the trainer's waits as
 * instants -- the tracks and names `stowage plan --trace` writes for the predicted step, so the
 * two files overlay. Empty of events when the trace is off (stowage_set_trace_capacity). On
 * success *out is a NUL-terminated string the caller frees with stowage_free_string. */
STOWAGE_API stowage_status stowage_get_trace_json(stowage_runtime* rt, char** out);

/* Planning (the C++ planner, in this library too). A request is JSON (docs/runtime-api.md
 * "Planning through the C ABI"): a cost source -- "profile" (a measured layer profile) or "model"
 * (a preset name or a Hugging Face config.json object) with "hardware" and "run" -- and
 * "gpu_budget_bytes" (the whole device memory a step may peak at, fixed memory included), optional
 * "host_budget_bytes", "force" (a policy name), "prefetch_distance" and "optimality_gap" (0 to
 * 0.01, default 1e-4: the search stops within that relative gap of its bound; 0 proves the plan
 * optimal). On success *out points at a NUL-terminated string the caller frees with
 * stowage_free_string; on failure *out is NULL, except as below. Errors: INVALID_ARGUMENT for a bad
 * request (the message names the field, its value and what is allowed); RESOURCE_EXHAUSTED from
 * stowage_plan_request when no plan fits (the message names the smallest peak any plan reaches and
 * what binds) -- and then *out holds the closest plan, "fits": false with its "binding" (what
 * `stowage plan` prints then; the runtime refuses to run it), to be freed the same way; NULL only
 * when some layer has no option at all. Safe from any thread. */
/* The plan JSON of the fastest plan within the budgets. */
STOWAGE_API stowage_status stowage_plan_request(const char* request_json, size_t request_json_bytes,
                                                char** plan_json_out);
/* The simulator's prediction for the request's "layers" (per layer {"policy", optional
 * "recompute_modules"}) at its "prefetch_distance" (default 1): peak_device_bytes, step_seconds,
 * exposed_copy_seconds, host_bytes, the recorded "compute" and "copies" intervals, "timeline",
 * "events" (the step's predicted events in order: {"kind", "layer", "bytes", "seconds"}, kinds
 * as in stowage_get_trace, bytes per layer), and "plan", the plan of that assignment. */
STOWAGE_API stowage_status stowage_plan_evaluate(const char* request_json,
                                                 size_t request_json_bytes, char** result_json_out);
/* Frees a string the planning calls or stowage_get_trace_json returned; NULL is ignored. */
STOWAGE_API void stowage_free_string(char* s);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STOWAGE_STOWAGE_H_ */
