"""Finds and loads libstowage.so and declares the C ABI (include/stowage/stowage.h) for ctypes.

Binding through ctypes rather than a compiled extension means one build of the library serves
every torch and Python version: nothing here is compiled against torch.

Search order (the first that exists wins):
  1. the STOWAGE_LIBRARY environment variable (a path to the .so file);
  2. a libstowage.so* shipped inside this package's directory;
  3. ctypes.util.find_library("stowage") and the dynamic loader's own search
     (LD_LIBRARY_PATH, the ld.so cache, system library directories).

The library that wins must speak this binding's ABI: its stowage_get_version() ABI number must be
ABI_VERSION, the STOWAGE_ABI_VERSION of the header these declarations copy; AbiMismatchError
otherwise (the structs' layouts differ between ABI versions, so calling it would corrupt memory).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading
from typing import Optional

ABI_VERSION = 4  # STOWAGE_ABI_VERSION of include/stowage/stowage.h that this binding declares

# stowage_status codes, by value.
STATUS_NAMES = {
    0: "OK",
    1: "INVALID_ARGUMENT",
    2: "NOT_FOUND",
    3: "FAILED_PRECONDITION",
    4: "RESOURCE_EXHAUSTED",
    5: "UNAVAILABLE",
    6: "DATA_LOSS",
    7: "INTERNAL",
}

BACKEND_AUTO = 0
BACKEND_HOST = 1
BACKEND_CUDA = 2
BACKEND_NAMES = {BACKEND_AUTO: "auto", BACKEND_HOST: "host", BACKEND_CUDA: "cuda"}

_HOW_TO_BUILD = (
    "build it with `cmake --preset dev && cmake --build build/dev --target stowage_runtime` "
    "(it is build/dev/capi/libstowage.so), then either set STOWAGE_LIBRARY to that file, "
    "copy it into the installed `stowage` package directory, or add its directory to "
    "LD_LIBRARY_PATH"
)


class LibraryNotFoundError(OSError):
    """libstowage.so could not be found or loaded; the message says where it looked."""


class AbiMismatchError(LibraryNotFoundError):
    """The libstowage.so found speaks another C ABI version than this package declares.
    `library_abi` and `package_abi` are the two numbers, `path` the library's."""

    def __init__(self, path: str, how: str, library_abi: int, library_version: str) -> None:
        self.path = path
        self.library_abi = library_abi
        self.package_abi = ABI_VERSION
        package = os.path.dirname(os.path.abspath(__file__))
        super().__init__(
            f"{path} (found via {how}) is libstowage {library_version} with C ABI version "
            f"{library_abi}, but this stowage Python package ({package}) declares ABI version "
            f"{ABI_VERSION} (STOWAGE_ABI_VERSION of include/stowage/stowage.h): the two come "
            "from different builds. Rebuild the library from the package's source tree (`cmake "
            "--preset dev && cmake --build build/dev --target stowage_runtime`, then "
            "build/dev/capi/libstowage.so), or set STOWAGE_LIBRARY to a libstowage.so whose ABI "
            f"version is {ABI_VERSION}")


class Options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("backend", ctypes.c_int),
        ("device", ctypes.c_int32),
        ("numa_node", ctypes.c_int32),
        ("verify_checksums", ctypes.c_int32),
        ("copy_chunk_bytes", ctypes.c_uint64),
        ("copy_threads", ctypes.c_int32),
        ("metrics_address", ctypes.c_char_p),
        ("stage", ctypes.c_int32),
        ("metrics_step_buckets", ctypes.c_char_p),
        # ABI 4: the launcher's ranks (-1: the environment's).
        ("rank", ctypes.c_int32),
        ("local_rank", ctypes.c_int32),
        ("local_world_size", ctypes.c_int32),
        ("world_size", ctypes.c_int32),
    ]


class Stats(ctypes.Structure):
    _fields_ = [
        ("steps_completed", ctypes.c_uint64),
        ("arena_capacity_bytes", ctypes.c_uint64),
        ("arena_used_bytes", ctypes.c_uint64),
        ("arena_peak_bytes", ctypes.c_uint64),
        ("saves_total", ctypes.c_uint64),
        ("restores_total", ctypes.c_uint64),
        ("d2h_bytes_total", ctypes.c_uint64),
        ("h2d_bytes_total", ctypes.c_uint64),
        ("d2h_seconds_total", ctypes.c_double),
        ("h2d_seconds_total", ctypes.c_double),
        ("stall_seconds_total", ctypes.c_double),
        ("last_step_seconds", ctypes.c_double),
        ("copies_in_flight", ctypes.c_uint64),
        ("errors_total", ctypes.c_uint64),
        ("numa_node", ctypes.c_int32),
        ("backend", ctypes.c_int32),
    ]


class TraceEvent(ctypes.Structure):
    _fields_ = [
        ("seq", ctypes.c_uint64),
        ("kind", ctypes.c_int32),
        ("layer", ctypes.c_int32),
        ("microbatch", ctypes.c_int32),
        ("bytes", ctypes.c_uint64),
        ("id", ctypes.c_uint64),
        ("nanos", ctypes.c_uint64),
    ]


class PipelineOp(ctypes.Structure):
    _fields_ = [
        ("forward", ctypes.c_int32),
        ("chunk", ctypes.c_int32),
        ("microbatch", ctypes.c_int32),
    ]


_status = ctypes.c_int
_rt = ctypes.c_void_p
_id = ctypes.c_uint64

# name -> (restype, argtypes)
_PROTOTYPES = {
    "stowage_version": (ctypes.c_char_p, []),
    "stowage_get_version": (_status, [ctypes.POINTER(ctypes.c_int32)] * 4),
    "stowage_status_string": (ctypes.c_char_p, [_status]),
    "stowage_last_error": (ctypes.c_char_p, []),
    "stowage_options_init": (_status, [ctypes.POINTER(Options)]),
    "stowage_plan_validate": (_status, [ctypes.c_char_p, ctypes.c_size_t]),
    "stowage_plan_hash": (
        _status, [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64)]),
    "stowage_get_plan_hash": (_status, [_rt, ctypes.POINTER(ctypes.c_uint64)]),
    "stowage_check_plan_agreement": (
        _status, [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]),
    "stowage_create": (
        _status,
        [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(Options), ctypes.POINTER(_rt)],
    ),
    "stowage_destroy": (_status, [_rt]),
    "stowage_begin_step": (_status, [_rt]),
    "stowage_end_step": (_status, [_rt]),
    "stowage_save": (
        _status,
        [_rt, ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
         ctypes.POINTER(_id)],
    ),
    "stowage_save_query": (_status, [_rt, _id, ctypes.POINTER(ctypes.c_int32)]),
    "stowage_save_wait": (_status, [_rt, _id]),
    "stowage_save_wait_stream": (_status, [_rt, _id, ctypes.c_void_p]),
    "stowage_prefetch": (_status, [_rt, _id, ctypes.c_void_p, ctypes.c_void_p]),
    "stowage_save_many": (
        _status,
        [_rt, ctypes.c_int32, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p),
         ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.POINTER(_id),
         ctypes.POINTER(ctypes.c_size_t)],
    ),
    "stowage_prefetch_many": (
        _status,
        [_rt, ctypes.c_size_t, ctypes.POINTER(_id), ctypes.POINTER(ctypes.c_void_p),
         ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)],
    ),
    "stowage_restore": (_status, [_rt, _id, ctypes.c_void_p, ctypes.c_void_p]),
    # ABI 2: microbatches in flight, and the schedule's order.
    "stowage_save_microbatch": (
        _status,
        [_rt, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
         ctypes.POINTER(_id)],
    ),
    "stowage_save_many_microbatch": (
        _status,
        [_rt, ctypes.c_int32, ctypes.c_int32, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p),
         ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.POINTER(_id),
         ctypes.POINTER(ctypes.c_size_t)],
    ),
    "stowage_prefetch_microbatch": (
        _status, [_rt, _id, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p]),
    "stowage_prefetch_many_microbatch": (
        _status,
        [_rt, ctypes.c_int32, ctypes.c_size_t, ctypes.POINTER(_id),
         ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)],
    ),
    "stowage_restore_microbatch": (
        _status, [_rt, _id, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p]),
    "stowage_pipeline_order": (
        _status,
        [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
         ctypes.POINTER(PipelineOp), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    ),
    "stowage_get_stats": (_status, [_rt, ctypes.POINTER(Stats)]),
    "stowage_report_device_peak": (_status, [_rt, ctypes.c_uint64]),
    # The planning service: the result is a malloc'd string freed with stowage_free_string.
    "stowage_plan_request": (
        _status, [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]),
    "stowage_plan_evaluate": (
        _status, [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]),
    "stowage_free_string": (None, [ctypes.c_void_p]),
    "stowage_set_trace_capacity": (_status, [_rt, ctypes.c_size_t]),
    "stowage_get_trace": (
        _status,
        [_rt, ctypes.POINTER(TraceEvent), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
         ctypes.POINTER(ctypes.c_uint64)],
    ),
    "stowage_event_kind_name": (ctypes.c_char_p, [ctypes.c_int32]),
    "stowage_get_trace_json": (_status, [_rt, ctypes.POINTER(ctypes.c_void_p)]),
}

_lock = threading.Lock()
_loaded: Optional[ctypes.CDLL] = None
_loaded_path: Optional[str] = None


def _candidates() -> list[tuple[str, str]]:
    """(how it was found, path or soname) in search order."""
    out: list[tuple[str, str]] = []
    env = os.environ.get("STOWAGE_LIBRARY")
    if env:
        out.append(("STOWAGE_LIBRARY", env))
    here = os.path.dirname(os.path.abspath(__file__))
    for path in sorted(glob.glob(os.path.join(here, "libstowage.so*"))):
        out.append(("package directory", path))
    found = ctypes.util.find_library("stowage")
    if found:
        out.append(("ctypes.util.find_library", found))
    out.append(("dynamic loader (LD_LIBRARY_PATH)", "libstowage.so"))
    return out


def _declare(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)  # AttributeError: not a stowage runtime library
        fn.restype = restype
        fn.argtypes = argtypes


def library_abi(lib: ctypes.CDLL) -> tuple[int, str]:
    """(ABI number, "MAJOR.MINOR.PATCH") that a declared library reports (stowage_get_version)."""
    major, minor, patch, abi = (ctypes.c_int32() for _ in range(4))
    lib.stowage_get_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch),
                            ctypes.byref(abi))
    return abi.value, f"{major.value}.{minor.value}.{patch.value}"


def load() -> ctypes.CDLL:
    """Returns the loaded library, loading it on first use. Raises LibraryNotFoundError."""
    global _loaded, _loaded_path
    with _lock:
        if _loaded is not None:
            return _loaded
        tried: list[str] = []
        env = os.environ.get("STOWAGE_LIBRARY")
        for how, path in _candidates():
            if how == "STOWAGE_LIBRARY" and not os.path.isfile(path):
                # An explicit setting that is wrong is an error, not something to search past.
                raise LibraryNotFoundError(
                    f"STOWAGE_LIBRARY is {path!r}, which is not a file; {_HOW_TO_BUILD}")
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                if how == "STOWAGE_LIBRARY":
                    raise LibraryNotFoundError(
                        f"STOWAGE_LIBRARY is {path!r} but it could not be loaded: {e}") from e
                tried.append(f"{how}: {path} ({e})")
                continue
            try:
                _declare(lib)
            except AttributeError as e:
                raise LibraryNotFoundError(
                    f"{path} (found via {how}) is not the stowage runtime: {e}") from e
            abi, version = library_abi(lib)
            if abi != ABI_VERSION:
                raise AbiMismatchError(path, how, abi, version)
            _loaded, _loaded_path = lib, path
            return lib
        where = "; ".join(tried) if tried else "nowhere"
        hint = "" if env else "STOWAGE_LIBRARY is not set; "
        raise LibraryNotFoundError(
            f"libstowage.so (the stowage runtime) was not found. Tried {where}. {hint}"
            f"{_HOW_TO_BUILD}")


def loaded_path() -> Optional[str]:
    """Path (or soname) of the library that load() picked, None before the first load."""
    return _loaded_path


def _reset_for_tests() -> None:
    """Forgets the loaded library so a test can exercise the search with other settings."""
    global _loaded, _loaded_path
    with _lock:
        _loaded, _loaded_path = None, None
