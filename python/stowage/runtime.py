"""A thin, torch-free Python face of the C ABI: one Runtime object per GPU (per rank).

Pointers and streams are plain integers (a torch tensor's data_ptr(), a torch.cuda.Stream's
cuda_stream); None or 0 is the legacy default stream. With the host backend "device" pointers
are ordinary host memory, so CPU tensors work as they are.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import sys
from typing import Any, NamedTuple, Optional, Union

from ._lib import BACKEND_NAMES, STATUS_NAMES, Options
from ._lib import PipelineOp as PipelineOpStruct
from ._lib import Stats as StatsStruct
from ._lib import TraceEvent as TraceEventStruct
from ._lib import load as load_library
from .plan import Plan, PlanError


class StowageError(RuntimeError):
    """A C ABI call failed. `status` is the stowage_status name, `code` its value."""

    def __init__(self, call: str, code: int, message: str):
        self.call = call
        self.code = code
        self.status = STATUS_NAMES.get(code, f"status {code}")
        self.message = message
        super().__init__(f"{call}: {self.status}: {message}" if message
                         else f"{call}: {self.status}")


@dataclasses.dataclass(frozen=True)
class Stats:
    """A snapshot of stowage_stats (see include/stowage/stowage.h for each field)."""

    steps_completed: int
    arena_capacity_bytes: int
    arena_used_bytes: int
    arena_peak_bytes: int
    saves_total: int
    restores_total: int
    d2h_bytes_total: int
    h2d_bytes_total: int
    d2h_seconds_total: float
    h2d_seconds_total: float
    stall_seconds_total: float
    last_step_seconds: float
    copies_in_flight: int
    errors_total: int
    numa_node: int
    backend: str


@dataclasses.dataclass(frozen=True)
class TraceEvent:
    """One event of a step's trace (stowage_trace_event; README "Step trace"). `kind` is one of
    save_issued, save_landed, save_wait, prefetch_issued, prefetch_landed, restore."""

    seq: int
    kind: str
    layer: int
    bytes: int
    id: int
    nanos: int  # since begin_step: for reading, never for comparing
    microbatch: int = 0  # the one the tensor was saved under


@dataclasses.dataclass(frozen=True)
class Trace:
    """The last completed step's events in the order recorded, and how many did not fit."""

    events: list
    dropped: int


def check_status(call: str, code: int) -> None:
    """Raises StowageError for a failed C ABI call `call` that returned `code` (the thread's
    stowage_last_error() is its message); nothing for STOWAGE_OK."""
    if code != 0:
        lib = load_library()
        raise StowageError(call, code, lib.stowage_last_error().decode("utf-8", "replace"))


def version() -> str:
    """The runtime library's version string."""
    return load_library().stowage_version().decode()


_U64_MAX = 2**64 - 1
# The C ABI's int32_t arguments (layers, microbatches, stages): ctypes would wrap a larger value.
I32_MAX = 2**31 - 1
_I32 = (-2**31, I32_MAX)


def _int_arg(name: str, value: Any, low: int, high: int) -> int:
    """`value` as an int within [low, high], checked here: ctypes would silently wrap or truncate it
    (nbytes=2**64 became 0)."""
    if type(value) is int and low <= value <= high:  # the hot path: one check per call
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = value.__index__()  # numpy and torch integers
        except (AttributeError, TypeError):
            raise TypeError(f"{name} is {value!r} ({type(value).__name__}); allowed: an integer "
                            f"in [{low}, {high}]") from None
    if not low <= value <= high:
        raise ValueError(f"{name} is {value}; allowed: an integer in [{low}, {high}]")
    return value


def _ptr(name: str, value: Optional[int]) -> ctypes.c_void_p:
    return ctypes.c_void_p(_int_arg(name, value, 0, _U64_MAX) if value else None)


PlanLike = Union[Plan, dict, str, bytes, "os.PathLike[str]"]


def _looks_like_json(text: str) -> bool:
    # JSON text of a plan starts (after whitespace and an optional BOM) with '{'; '[' is JSON too,
    # so that an array is refused as a plan rather than opened as a file name.
    return text.lstrip("\ufeff \t\r\n")[:1] in ("{", "[")


def plan_json_text(plan: PlanLike) -> str:
    """JSON text of a plan given as a Plan, a dict in the plan format, JSON text (str or bytes), or
    a path to a plan file (os.PathLike, or a str that does not start with '{' or '[')."""
    if isinstance(plan, Plan):
        return plan.to_json()
    if isinstance(plan, dict):
        return json.dumps(plan)
    if isinstance(plan, (bytes, bytearray)):
        try:
            return bytes(plan).decode("utf-8")
        except UnicodeDecodeError as e:
            raise PlanError(f"plan: not UTF-8 text ({e})") from e
    if isinstance(plan, str) and _looks_like_json(plan):
        return plan
    if isinstance(plan, (str, os.PathLike)):
        path = os.fspath(plan)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            shown = path if len(path) <= 80 else path[:77] + "..."
            raise PlanError(f"plan {shown!r} is neither plan JSON text (which starts with '{{') "
                            f"nor a readable plan file: {e.strerror or e}") from e
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise PlanError(f"{path}: not UTF-8 text ({e})") from e
    raise TypeError(f"plan must be a stowage.Plan, a dict, JSON text or a path, not {type(plan)!r}")


def plan_hash(plan: PlanLike) -> int:
    """The canonical hash of a plan (stowage_plan_hash): equal for two plans exactly when the
    runtime would run them alike, whatever their whitespace, key order or ignored fields. Raises
    PlanError when the plan is not valid."""
    try:
        text = plan_json_text(plan).encode("utf-8")
    except UnicodeEncodeError as e:
        raise PlanError(f"plan: not valid UTF-8 text ({e})") from e
    lib = load_library()
    out = ctypes.c_uint64()
    if lib.stowage_plan_hash(text, len(text), ctypes.byref(out)) != 0:
        raise PlanError(lib.stowage_last_error().decode("utf-8", "replace"))
    return out.value


class PipelineOp(NamedTuple):
    """One forward or backward of one microbatch through one model chunk of a stage."""
    forward: bool
    chunk: int
    microbatch: int


def pipeline_order(schedule: str, pp: int, vpp: int, microbatches: int,
                   stage: int) -> list[PipelineOp]:
    """The order in which pipeline stage `stage` runs the forwards and backwards of one step
    (stowage_pipeline_order: the C++ PipelineOrder, the order the plan's in_flight_microbatches
    counts come from). schedule "1f1b" or "interleaved"; pp = 1 is gradient accumulation.
    Raises StowageError (INVALID_ARGUMENT) for values a plan's run fields could not hold."""
    lib = load_library()
    args = (str(schedule).encode(), _int_arg("pp", pp, *_I32), _int_arg("vpp", vpp, *_I32),
            _int_arg("microbatches", microbatches, *_I32), _int_arg("stage", stage, *_I32))
    count = ctypes.c_size_t()
    check_status("stowage_pipeline_order", lib.stowage_pipeline_order(*args, None, 0,
                                                                      ctypes.byref(count)))
    ops = (PipelineOpStruct * max(count.value, 1))()
    check_status("stowage_pipeline_order", lib.stowage_pipeline_order(*args, ops, count.value,
                                                                      ctypes.byref(count)))
    return [PipelineOp(bool(op.forward), op.chunk, op.microbatch) for op in ops[:count.value]]


def _distributed_ranks() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when the trainer has initialised it, else
    (-1, -1): the C library then reads RANK and WORLD_SIZE. The process group is the better
    source: a trainer that calls init_process_group(rank=..., world_size=...) itself (mp.spawn)
    sets no environment. torch.distributed has no local world size (the launcher's
    LOCAL_WORLD_SIZE, which the C library reads); torch is never imported here."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except (RuntimeError, ValueError):  # a half-torn-down group: fall back to the environment
        pass
    return -1, -1


def _id(tensor_id: int) -> int:
    return _int_arg("tensor_id", tensor_id, 0, _U64_MAX)


class Runtime:
    """Owns one stowage_runtime. Close it (or use `with`) to release the pinned arena promptly.

    Thread-safety follows the C ABI: saves, prefetches and restores may come from several
    threads; begin_step, end_step and close must not race with other calls.
    """

    def __init__(self, plan: PlanLike, *, backend: str = "auto", device: int = 0,
                 numa_node: int = -1, verify_checksums: bool = False,
                 copy_chunk_bytes: int = 0, copy_threads: int = 0,
                 metrics_address: Optional[str] = None, trace_capacity: int = 0,
                 stage: int = 0, metrics_step_buckets=None, rank: Optional[int] = None,
                 local_rank: Optional[int] = None, local_world_size: Optional[int] = None,
                 world_size: Optional[int] = None):
        backends = {v: k for k, v in BACKEND_NAMES.items()}
        if backend not in backends:
            raise ValueError(f"backend is {backend!r}; allowed: {', '.join(backends)}")
        self._lib = load_library()
        self._handle = ctypes.c_void_p()
        try:
            text = plan_json_text(plan).encode("utf-8")
        except UnicodeEncodeError as e:
            raise PlanError(f"plan: not valid UTF-8 text ({e})") from e
        opts = Options()
        check_status("stowage_options_init", self._lib.stowage_options_init(ctypes.byref(opts)))
        opts.backend = backends[backend]
        opts.device = _int_arg("device", device, 0, _I32[1])
        opts.numa_node = _int_arg("numa_node", numa_node, -1, _I32[1])
        opts.verify_checksums = 1 if verify_checksums else 0
        opts.copy_chunk_bytes = _int_arg("copy_chunk_bytes", copy_chunk_bytes, 0, _U64_MAX)
        opts.copy_threads = _int_arg("copy_threads", copy_threads, 0, _I32[1])
        # The pipeline stage this rank runs (the C library checks it against the plan's run.pp).
        opts.stage = _int_arg("stage", stage, _I32[0], _I32[1])
        # Keep the bytes alive for the call; NULL means "read STOWAGE_METRICS_ADDR".
        self._metrics = metrics_address.encode() if metrics_address is not None else None
        opts.metrics_address = self._metrics
        # Step-time histogram bounds in seconds: "1,2.5,5" or a sequence of numbers; None reads
        # STOWAGE_METRICS_STEP_BUCKETS (the C library checks them and names a bad entry).
        if metrics_step_buckets is not None and not isinstance(metrics_step_buckets, str):
            metrics_step_buckets = ",".join(repr(float(b)) for b in metrics_step_buckets)
        self._buckets = (metrics_step_buckets.encode()
                         if metrics_step_buckets is not None else None)
        opts.metrics_step_buckets = self._buckets
        # The launcher's ranks (README "Ranks sharing a machine admit together"): given, else
        # torch.distributed's rank and world size when it is initialised, else -1 (the C library
        # reads RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, WORLD_SIZE and checks them together).
        dist_rank, dist_world = _distributed_ranks()
        for name, value, fallback in (("rank", rank, dist_rank), ("local_rank", local_rank, -1),
                                      ("local_world_size", local_world_size, -1),
                                      ("world_size", world_size, dist_world)):
            setattr(opts, name, fallback if value is None else _int_arg(name, value, 0, _I32[1]))
        check_status("stowage_create", self._lib.stowage_create(
            text, len(text), ctypes.byref(opts), ctypes.byref(self._handle)))
        if trace_capacity:
            self.set_trace_capacity(trace_capacity)

    # -- lifetime ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return not self._handle

    @property
    def handle(self) -> ctypes.c_void_p:
        """The stowage_runtime pointer, for calling the C ABI directly (the wrapper's per-tensor
        path binds its calls once per step: stowage.layers); raises StowageError once closed."""
        return self._h()

    @property
    def library(self) -> ctypes.CDLL:
        """The loaded libstowage.so this runtime was created by, its C ABI declared."""
        return self._lib

    def _h(self) -> ctypes.c_void_p:
        if not self._handle:
            raise StowageError("stowage", 3, "the runtime is closed")
        return self._handle

    def close(self) -> None:
        """Destroys the runtime (ends an open step first). Idempotent."""
        if not self._handle:
            return
        code = self._lib.stowage_destroy(self._handle)
        if code == 3:  # FAILED_PRECONDITION: inside a step; end it, then destroy.
            self._lib.stowage_end_step(self._handle)
            code = self._lib.stowage_destroy(self._handle)
        self._handle = ctypes.c_void_p()
        check_status("stowage_destroy", code)

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 — destructors log and continue; nothing to log to here
            pass

    # -- steps ------------------------------------------------------------------------------
    def begin_step(self) -> None:
        check_status("stowage_begin_step", self._lib.stowage_begin_step(self._h()))

    def end_step(self) -> None:
        """Releases everything the step held, always (see stowage_end_step)."""
        check_status("stowage_end_step", self._lib.stowage_end_step(self._h()))

    # -- tensors ----------------------------------------------------------------------------
    def save(self, layer: int, src: int, nbytes: int, stream: Optional[int] = None, *,
             microbatch: int = 0) -> int:
        """Starts the copy of `nbytes` at `src` to the layer's host slot for `microbatch` (0 to
        the plan's run.microbatches - 1; README "Microbatches in flight"); returns its id."""
        out = ctypes.c_uint64()
        check_status("stowage_save_microbatch", self._lib.stowage_save_microbatch(
            self._h(), _int_arg("layer", layer, *_I32), _int_arg("microbatch", microbatch, *_I32),
            _ptr("src", src), _int_arg("nbytes", nbytes, 0, _U64_MAX), _ptr("stream", stream),
            ctypes.byref(out)))
        return out.value

    def save_query(self, tensor_id: int) -> bool:
        done = ctypes.c_int32()
        check_status("stowage_save_query",
                     self._lib.stowage_save_query(self._h(), _id(tensor_id), ctypes.byref(done)))
        return bool(done.value)

    def save_wait(self, tensor_id: int) -> None:
        check_status("stowage_save_wait", self._lib.stowage_save_wait(self._h(), _id(tensor_id)))

    def save_wait_stream(self, tensor_id: int, stream: Optional[int] = None) -> None:
        check_status("stowage_save_wait_stream",
                     self._lib.stowage_save_wait_stream(self._h(), _id(tensor_id),
                                                        _ptr("stream", stream)))

    def prefetch(self, tensor_id: int, dst: int, stream: Optional[int] = None, *,
                 microbatch: Optional[int] = None) -> None:
        """Issues the H2D of `tensor_id` into `dst`. `microbatch`, if given, must be the one
        the tensor was saved under (None: the id's own)."""
        if microbatch is None:
            check_status("stowage_prefetch",
                         self._lib.stowage_prefetch(self._h(), _id(tensor_id), _ptr("dst", dst),
                                                    _ptr("stream", stream)))
            return
        check_status("stowage_prefetch_microbatch", self._lib.stowage_prefetch_microbatch(
            self._h(), _id(tensor_id), _int_arg("microbatch", microbatch, *_I32),
            _ptr("dst", dst), _ptr("stream", stream)))

    def restore(self, tensor_id: int, dst: int, stream: Optional[int] = None, *,
                microbatch: Optional[int] = None) -> None:
        """`stream` waits until `dst` holds the tensor; `microbatch` as for prefetch. A
        microbatch's last restore of a layer frees its slot there for the next microbatch."""
        if microbatch is None:
            check_status("stowage_restore",
                         self._lib.stowage_restore(self._h(), _id(tensor_id), _ptr("dst", dst),
                                                   _ptr("stream", stream)))
            return
        check_status("stowage_restore_microbatch", self._lib.stowage_restore_microbatch(
            self._h(), _id(tensor_id), _int_arg("microbatch", microbatch, *_I32),
            _ptr("dst", dst), _ptr("stream", stream)))

    # -- observability ----------------------------------------------------------------------
    def stats(self) -> Stats:
        s = StatsStruct()
        check_status("stowage_get_stats", self._lib.stowage_get_stats(self._h(), ctypes.byref(s)))
        values = {name: getattr(s, name) for name, _ in StatsStruct._fields_}
        values["backend"] = BACKEND_NAMES.get(values["backend"], str(values["backend"]))
        return Stats(**values)

    def set_trace_capacity(self, events: int) -> None:
        """Records each following step's events, at most `events` per step (0: off); between
        steps only."""
        check_status("stowage_set_trace_capacity",
                     self._lib.stowage_set_trace_capacity(self._h(), int(events)))

    def trace(self) -> Trace:
        """The last completed step's trace (empty when the trace is off)."""
        count = ctypes.c_size_t()
        dropped = ctypes.c_uint64()
        check_status("stowage_get_trace", self._lib.stowage_get_trace(
            self._h(), None, 0, ctypes.byref(count), ctypes.byref(dropped)))
        buf = (TraceEventStruct * max(count.value, 1))()
        check_status("stowage_get_trace", self._lib.stowage_get_trace(
            self._h(), buf, count.value, ctypes.byref(count), ctypes.byref(dropped)))
        name = self._lib.stowage_event_kind_name
        events = [TraceEvent(seq=e.seq, kind=name(e.kind).decode(), layer=e.layer,
                             bytes=e.bytes, id=e.id, nanos=e.nanos, microbatch=e.microbatch)
                  for e in buf[:count.value]]
        return Trace(events=events, dropped=dropped.value)

    def trace_json(self) -> str:
        """The last completed step as Chrome trace-event JSON (Perfetto, chrome://tracing), in
        the tracks `stowage plan --trace` writes for the predicted step, so the two overlay."""
        out = ctypes.c_void_p()
        check_status("stowage_get_trace_json",
                     self._lib.stowage_get_trace_json(self._h(), ctypes.byref(out)))
        try:
            return ctypes.string_at(out.value).decode()
        finally:
            self._lib.stowage_free_string(out)

    def plan_hash(self) -> int:
        """The canonical hash of the plan this runtime was created from (stowage_get_plan_hash;
        what stowage.agree compares across ranks)."""
        out = ctypes.c_uint64()
        check_status("stowage_get_plan_hash",
                     self._lib.stowage_get_plan_hash(self._h(), ctypes.byref(out)))
        return out.value

    def report_device_peak(self, nbytes: int) -> None:
        nbytes = _int_arg("nbytes", nbytes, 0, _U64_MAX)
        check_status("stowage_report_device_peak",
                     self._lib.stowage_report_device_peak(self._h(), nbytes))
