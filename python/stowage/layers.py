"""Runs a model's sequence of layers under a plan: the PyTorch side of the runtime.

Policies, per layer (the plan's words):
  keep           the layer runs as usual; autograd keeps what it saves on the device.
  recompute      torch.utils.checkpoint (non-reentrant): only the input stays; forward reruns.
  selective_recompute  the submodules the plan names in recompute_modules are checkpointed.
  offload_input  recompute, and the input itself goes to the runtime's host arena in forward and
                 comes back (prefetched) for the recompute in backward.
  offload_saved  no recompute: every tensor the layer saves for backward (except parameters) goes
                 to the host arena through saved-tensor hooks and comes back in backward.

Note [Device memory and streams]. PyTorch's caching allocator owns all device memory: restore
buffers are torch tensors allocated on the current stream, so the allocator's stream-ordered
reuse rules hold without record_stream. A tensor handed to stowage_save is kept referenced by
this module until its D2H is known complete (stowage_save_query) or the current stream has been
made to wait for it (stowage_save_wait_stream); only then is the reference dropped, so the
allocator can never hand the block out while the copy still reads it. When saves are waited
for, prefetched and restored is the plan's (Note [Runtime protocol] in include/stowage/plan.h):
before layer i runs, the saves of layers whose save_wait_before_layer is i are waited for on the
stream and dropped (the rest when backward starts), so copies overlap the next layers' compute;
the simulator frees their device bytes at that same wait, and the runtime's trace shows it. A
prefetch destination that was never restored is kept until stowage_end_step has drained the copy
into it.

Note [Per-tensor cost]. A layer can save hundreds of small tensors, so what the wrapper does per
saved tensor is kept to a few attribute reads, one dict lookup and an append: parameters are
recognised by address (ResidentMemory, a bisection) rather than by building each tensor's
storage object; duplicates are found by data_ptr, the full saved_key built only when two tensors
start at one address; the C ABI's functions are bound once per step (_Calls), their arguments
being ints made here. An offload_saved layer's saves are gathered and issued together
(stowage_save_many) when kSaveBatchBytes or kSaveBatchTensors have gathered and when the layer's
forward returns; a layer's prefetches go out in one stowage_prefetch_many. That takes one
ctypes call per batch instead of one per tensor, and lets the copy workers wake once for many
copies: on the host backend a worker's wake-up costs more than a small copy. A batch holds
at most kSaveBatchBytes (a 1 MiB copy takes about 20 us even at 55 GB/s), so large tensors'
copies start as early as before. `bench/bench_torch.py --overhead` measures the cost.

Note [Microbatches in the wrapper]. One `with planned.step():` is one optimizer step: every
microbatch of it runs inside, each forward under `with planned.microbatch(k):` (k from 0 to the
plan's run.microbatches - 1; outside any, microbatch 0). A tensor saved in that forward carries
k, and its backward -- whenever it comes, in any order the schedule runs them
(stowage.pipeline_order gives 1F1B's and interleaved's) -- prefetches and restores it under k;
the runtime holds each layer's in_flight_microbatches slots and reuses a slot once its
microbatch is restored (README "Microbatches in flight"). Entering another microbatch first
waits for the saves of the forward before it (its save waits are past: the plan's waits run
within one microbatch's forward), so pending saves are always of one microbatch.

Note [FSDP2 and DDP] (in _sharding.py): fully_shard each decoder layer before wrapping; wrap
the layers before DistributedDataParallel(model); the other orders are refused.

Note [Bit-identical gradients]. Offloading moves bytes, never values: a restored tensor is a
byte copy with the original's size, stride and dtype; recompute reruns the same kernels under the
RNG state checkpoint saved. Loss and gradients therefore equal those of the unwrapped model.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import warnings
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.utils.checkpoint as torch_checkpoint

from ._sharding import (SHARD_FIRST, check_wrapping_order, fsdp_managed, fsdp_module_class,
                        is_fsdp)
from ._tensors import ResidentMemory, hidden_state, offload_nbytes, offloadable, saved_key
from .plan import (KEEP, OFFLOAD_INPUT, OFFLOAD_SAVED, OFFLOADING_POLICIES, POLICIES, RECOMPUTE,
                   SELECTIVE_RECOMPUTE, Plan, PlanError)
from .runtime import I32_MAX, PlanLike, Runtime, Stats, StowageError, check_status, plan_json_text

# An offload_saved layer's saves are issued in batches (see Note [Per-tensor cost]): when this
# many bytes or tensors have gathered, and when the layer's forward returns.
kSaveBatchBytes = 1 << 20
kSaveBatchTensors = 1024

# The C ABI takes a microbatch as int32_t: ctypes would wrap a larger index (2**32 + 1 became 1).
_MICROBATCH_MAX = I32_MAX


def _microbatch_range_error(where: str, index: Any, microbatches: Optional[int]) -> ValueError:
    """The error for a microbatch index outside 0 .. run.microbatches - 1 (and the int32 limit),
    in the caller's terms: the value passed and the allowed range."""
    allowed = (f"0 to run.microbatches - 1 ({microbatches - 1})" if microbatches is not None
               else "0 to run.microbatches - 1")
    return ValueError(f"{where}: microbatch index is {index!r}; allowed: an integer from "
                      f"{allowed}, and at most {_MICROBATCH_MAX} (2**31 - 1, the C ABI's int32)")


def _check_microbatch(where: str, microbatch: int) -> None:
    """The fast path's own check (_Calls): the index reaches ctypes unchecked otherwise."""
    if not 0 <= microbatch <= _MICROBATCH_MAX:
        raise _microbatch_range_error(where, microbatch, None)


class StaleTensorError(RuntimeError):
    """Backward reached a tensor offloaded in a step that has already ended."""


def _checkpoint(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    return torch_checkpoint.checkpoint(fn, *args, use_reentrant=False, **kwargs)


class _Stowed:
    """One tensor in the host arena for the current step: its id and how to rebuild it."""

    __slots__ = ("state", "layer", "microbatch", "id", "size", "stride", "dtype", "saved_stride",
                 "tensor", "restored", "__weakref__")

    def __init__(self, state: "_StepState", layer: int, microbatch: int, tensor_id: int,
                 like: torch.Tensor, saved_stride: tuple):
        self.state = state
        self.layer = layer
        self.microbatch = microbatch
        self.id = tensor_id
        self.size = like.shape
        self.stride = like.stride()
        self.dtype = like.dtype
        self.saved_stride = saved_stride
        self.tensor: Optional[torch.Tensor] = None
        self.restored = False

    def alloc_for_prefetch(self) -> bool:
        """Allocates the buffer a prefetch copies into; False if none is needed (restored, or
        prefetched already)."""
        if self.restored or self.tensor is not None:
            return False
        self.tensor = torch.empty_strided(self.size, self.stride, dtype=self.dtype,
                                          device=self.state.device)
        return True

    def get(self) -> torch.Tensor:
        t = self.tensor
        if self.restored:
            assert t is not None
            return t
        state = self.state
        if not state.active:
            raise StaleTensorError(
                f"backward needs a tensor that layer {self.layer} offloaded in a step that has "
                "ended; run forward and backward inside the same `with layers.step():`")
        if self.id == 0:
            state.flush()  # backward inside the forward that saved it (autograd.grad in a layer)
        prefetched = t is not None
        if not prefetched:
            t = self.tensor = torch.empty_strided(self.size, self.stride, dtype=self.dtype,
                                                  device=state.device)
        state.calls.restore(self.id, self.microbatch, t.data_ptr(), state.stream())
        self.restored = True
        if prefetched:
            del state.prefetched[self.id]
        return t

    def drop(self) -> None:
        self.tensor = None


class _Calls:
    """The per-tensor C ABI calls of one step, bound once. Their arguments are made here
    (pointers from data_ptr(), sizes from numel(), layer indices from the plan), so the argument
    checks of the public Runtime methods are not repeated for every saved tensor; a failed call
    still raises StowageError with the runtime's message."""

    __slots__ = ("_handle", "_save", "_save_many", "_query", "_wait", "_wait_stream",
                 "_prefetch", "_prefetch_many", "_restore")

    def __init__(self, rt: Runtime):
        lib, self._handle = rt.library, rt.handle
        self._save, self._save_many = lib.stowage_save_microbatch, lib.stowage_save_many_microbatch
        self._query = lib.stowage_save_query
        self._wait, self._wait_stream = lib.stowage_save_wait, lib.stowage_save_wait_stream
        self._prefetch = lib.stowage_prefetch_microbatch
        self._prefetch_many = lib.stowage_prefetch_many_microbatch
        self._restore = lib.stowage_restore_microbatch

    def save(self, layer: int, microbatch: int, src: int, nbytes: int,
             stream: Optional[int]) -> int:
        _check_microbatch("stowage_save_microbatch", microbatch)
        out = ctypes.c_uint64()
        code = self._save(self._handle, layer, microbatch, src, nbytes, stream, ctypes.byref(out))
        if code:
            check_status("stowage_save_microbatch", code)
        return out.value

    def save_many(self, layer: int, microbatch: int, srcs: list, sizes: list,
                  stream: Optional[int]) -> tuple[list, int]:
        """(ids of the tensors saved, status): on a failure, the ids of those saved before it
        (their copies are under way) and the failure's code for _check."""
        _check_microbatch("stowage_save_many_microbatch", microbatch)
        n = len(srcs)
        ids = (ctypes.c_uint64 * n)()
        saved = ctypes.c_size_t()
        code = self._save_many(self._handle, layer, microbatch, n, (ctypes.c_void_p * n)(*srcs),
                               (ctypes.c_size_t * n)(*sizes), stream, ids, ctypes.byref(saved))
        return (ids[:] if not code else ids[:saved.value]), code

    def prefetch_many(self, microbatch: int, ids: list, dsts: list,
                      stream: Optional[int]) -> tuple[int, int]:
        """(how many prefetches were issued, status)."""
        _check_microbatch("stowage_prefetch_many_microbatch", microbatch)
        n = len(ids)
        issued = ctypes.c_size_t()
        code = self._prefetch_many(self._handle, microbatch, n, (ctypes.c_uint64 * n)(*ids),
                                   (ctypes.c_void_p * n)(*dsts), stream, ctypes.byref(issued))
        return (n if not code else issued.value), code

    def query(self, tensor_id: int) -> bool:
        done = ctypes.c_int32()
        code = self._query(self._handle, tensor_id, ctypes.byref(done))
        if code:
            check_status("stowage_save_query", code)
        return bool(done.value)

    def wait(self, tensor_id: int, stream: Optional[int]) -> None:
        # No streams on the host: the CPU itself must not reuse the block before the copy.
        code = (self._wait(self._handle, tensor_id) if stream is None
                else self._wait_stream(self._handle, tensor_id, stream))
        if code:
            check_status("stowage_save_wait", code)

    def prefetch(self, tensor_id: int, microbatch: int, dst: int, stream: Optional[int]) -> None:
        _check_microbatch("stowage_prefetch_microbatch", microbatch)
        code = self._prefetch(self._handle, tensor_id, microbatch, dst, stream)
        if code:
            check_status("stowage_prefetch_microbatch", code)

    def restore(self, tensor_id: int, microbatch: int, dst: int, stream: Optional[int]) -> None:
        _check_microbatch("stowage_restore_microbatch", microbatch)
        code = self._restore(self._handle, tensor_id, microbatch, dst, stream)
        if code:
            check_status("stowage_restore_microbatch", code)


class _InputBox:
    """Hands a layer its input inside checkpoint. Checkpoint keeps its arguments for the
    recompute; the box lets the input itself leave the device in between and come back from
    the host arena when the recompute asks for it."""

    __slots__ = ("x", "handle", "requires_grad", "layer")

    def __init__(self, x: torch.Tensor, layer: int):
        self.x: Optional[torch.Tensor] = x
        self.handle: Optional[_Stowed] = None
        self.requires_grad = x.requires_grad
        self.layer = layer

    def get(self) -> torch.Tensor:
        if self.x is not None:
            return self.x
        if self.handle is None:
            raise RuntimeError(
                f"layer {self.layer}'s offloaded input was already restored once; backward "
                "through an offload_input layer twice (retain_graph) is not supported")
        t = self.handle.get().requires_grad_(self.requires_grad)
        self.handle.drop()
        self.handle = None  # one shot: the recompute's saved tensors now own the input
        return t


class _StepState:
    """Everything one training step holds; released by close() whatever happened."""

    def __init__(self, owner: "PlannedLayers", rt: Optional[Runtime]):
        self.owner = owner
        self.rt = rt  # type: ignore[assignment]
        self.calls = _Calls(rt) if rt is not None else None  # type: ignore[assignment]
        self.active = True
        # Issued batches of saves whose D2H may still read their tensors, in the order issued:
        # [layer, ids, tensors, k], the saves before k being known complete (their tensors None).
        self.pending: collections.deque = collections.deque()
        # Saves gathered but not issued yet, all of one layer and stream (see flush).
        self.batch: list = []  # tensors
        self.batch_handles: list = []
        self.batch_sizes: list = []
        self.batch_bytes = 0
        self.batch_layer = -1
        self.batch_microbatch = 0
        self.batch_stream: Optional[int] = None
        # Note [Microbatches in the wrapper]: the microbatch whose forward runs now.
        self.microbatch = 0
        # (layer, microbatch) -> that forward's saved tensors.
        self.handles: dict[tuple, list[weakref.ref]] = collections.defaultdict(list)
        self.prefetched: dict[int, _Stowed] = {}
        self.host_used: dict[tuple, int] = collections.defaultdict(int)  # (layer, microbatch)
        self.host_limit = [l.host_bytes for l in owner.plan.layers]
        self.cuda = owner._backend == "cuda"
        self.device: Optional[torch.device] = None  # the offloading layers' device
        # An error raised inside a saved-tensor hook reaches the caller as a plain RuntimeError
        # (torch converts it on its way through C++); forward re-raises the original from here.
        self.hook_error: Optional[BaseException] = None
        self._resident: Optional[ResidentMemory] = None

    def stream(self) -> Optional[int]:
        """The stream copies are ordered on: torch's current one (None on the host backend)."""
        return torch.cuda.current_stream(self.device).cuda_stream if self.cuda else None

    # -- forward ----------------------------------------------------------------------------
    def enter_layer(self, layer: int, device: torch.device) -> None:
        """Before an offloading layer runs on `device`: the runtime copies from one kind of
        memory, and a tensor of the other kind must never reach it (a device pointer read as
        host memory crashes)."""
        backend = self.owner._backend
        if (device.type == "cuda") != self.cuda or (self.device is not None
                                                    and device != self.device):
            where = "" if self.device is None else f" and earlier layers offloaded on {self.device}"
            raise RuntimeError(
                f"layer {layer} offloads tensors on {device} but the runtime uses the "
                f"{backend} backend (chosen from where the layers were when wrapped){where}; "
                "wrap the layers after moving them to the one device they train on")
        self.device = device

    def save(self, layer: int, t: torch.Tensor, now: bool = False) -> _Stowed:
        """Offloads `t` (on the step's device; enter_layer checked it): its D2H is issued with
        the layer's batch, or at once with `now`."""
        saved_stride = t.stride()
        nbytes = offload_nbytes(t)  # the restore buffer, empty_strided alike, spans as much
        microbatch = self.microbatch
        key = (layer, microbatch)
        used = self.host_used[key] + nbytes
        if used > self.host_limit[layer]:
            lp = self.owner.plan.layers[layer]
            raise PlanError(
                f"layer {layer} ({type(self.owner.layers[layer]).__name__}, policy "
                f"{lp.policy}) offloads {used} bytes in microbatch {microbatch}'s forward but "
                f"the plan reserves layers[{layer}].host_bytes = {lp.host_bytes} per microbatch: "
                "the plan was made for another model, shape or batch (rebuild it for this one), "
                "or two forwards ran under one microbatch id (give each its own: "
                "`with planned.microbatch(k):`)")
        stream = self.stream()
        if self.batch and (layer != self.batch_layer or stream != self.batch_stream):
            self.flush()  # a save is ordered after its producer's stream: one stream per batch
        self.host_used[key] = used
        h = _Stowed(self, layer, microbatch, 0, t, saved_stride)  # the id comes with the batch
        self.handles[key].append(weakref.ref(h))
        self.batch.append(t)
        self.batch_handles.append(h)
        self.batch_sizes.append(nbytes)
        self.batch_bytes += nbytes
        self.batch_layer, self.batch_stream = layer, stream
        self.batch_microbatch = microbatch
        if now or self.batch_bytes >= kSaveBatchBytes or len(self.batch) >= kSaveBatchTensors:
            self.flush()
        return h

    def _drop_batch(self) -> None:
        self.batch, self.batch_handles, self.batch_sizes, self.batch_bytes = [], [], [], 0

    def flush(self) -> None:
        """Issues the gathered saves, in the order they were made, in one call."""
        tensors = self.batch
        if not tensors:
            return
        handles, sizes = self.batch_handles, self.batch_sizes
        self._drop_batch()
        layer = self.batch_layer
        ids, code = self.calls.save_many(layer, self.batch_microbatch,
                                         [t.data_ptr() for t in tensors], sizes,
                                         self.batch_stream)
        for h, tensor_id in zip(handles, ids):
            h.id = tensor_id
        if ids:  # copies under way, failure or not
            self.pending.append([layer, ids, tensors[:len(ids)] if code else tensors, 0])
        if code:
            check_status("stowage_save_many", code)

    def resident(self) -> "ResidentMemory":
        """Memory of every parameter and buffer of the wrapped layers (shared or tied weights
        included): saved tensors in it stay on the device. Computed once per step."""
        if self._resident is None:
            self._resident = ResidentMemory(self.owner.layers)
        return self._resident

    def retire(self, before_layer: Optional[int]) -> None:
        """Waits for the saves the plan makes the forward of `before_layer` wait for (all of
        them when before_layer is None: backward starts) and drops their references. Pending
        saves are in layer order and so are their waits: the first not due ends the walk."""
        if self.calls is None:
            return
        self.flush()
        pending, calls = self.pending, self.calls
        wait_at = self.owner._save_wait_before
        stream = self.stream() if pending else None
        # A tensor is dropped only after its wait or query returned: the reference is what
        # keeps its memory from reuse while the copy may still read it.
        while pending:
            entry = pending[0]
            ids, tensors, k = entry[1], entry[2], entry[3]
            if before_layer is not None and wait_at[entry[0]] > before_layer:
                return
            while k < len(ids):
                calls.wait(ids[k], stream)
                tensors[k] = None
                k += 1
                entry[3] = k
            pending.popleft()

    def enter_microbatch(self, microbatch: int) -> None:
        """Note [Microbatches in the wrapper]: the forwards that follow are `microbatch`'s."""
        if microbatch != self.microbatch:
            self.retire(None)  # the previous forward's saves: pending saves are of one microbatch
            self.microbatch = microbatch

    # -- backward ---------------------------------------------------------------------------
    def on_backward_of(self, layer: int, microbatch: int) -> None:
        """Called when the gradient of `layer`'s output in `microbatch` is ready, i.e. its
        backward starts."""
        if not self.active:
            return
        self.flush()
        if layer == len(self.owner.plan.layers) - 1:
            self.retire(None)
        for k in self.owner._prefetch_after.get(layer, ()):
            todo = []
            for ref in self.handles.get((k, microbatch), ()):
                h = ref()
                if h is not None and h.alloc_for_prefetch():
                    todo.append(h)
            if not todo:
                continue
            issued, code = self.calls.prefetch_many(microbatch, [h.id for h in todo],
                                                    [h.tensor.data_ptr() for h in todo],
                                                    self.stream())
            for h in todo[:issued]:
                self.prefetched[h.id] = h  # see Note [Device memory and streams]
            for h in todo[issued:]:
                h.tensor = None  # never written: restore allocates again
            if code:
                check_status("stowage_prefetch_many", code)

    # -- end --------------------------------------------------------------------------------
    def close(self, failing: bool = False) -> None:
        """Retires every save, lands every prefetch, ends the runtime's step, and drops every
        tensor the step held. With `failing` (the step body raised), errors here are reported
        as warnings so they do not hide the body's exception."""
        self.active = False
        if failing:
            self._drop_batch()  # never issued: nothing reads these tensors
        try:
            if self.rt is not None:
                self.retire(None)
                # A prefetch the graph never asked for: restore it into its own buffer so its
                # copy has landed before the buffer goes back to the allocator.
                for h in list(self.prefetched.values()):
                    self.calls.restore(h.id, h.microbatch, h.tensor.data_ptr(), self.stream())
        except Exception as e:  # noqa: BLE001
            if not failing:
                raise
            warnings.warn(f"stowage: while ending a failed step: {e}", RuntimeWarning)
        finally:
            self._drop_batch()
            self.pending.clear()
            try:
                if self.rt is not None:
                    self.rt.end_step()  # drains anything still in flight
            except StowageError as e:
                if not failing:
                    raise
                warnings.warn(f"stowage: while ending a failed step: {e}", RuntimeWarning)
            finally:
                self.prefetched.clear()
                for refs in self.handles.values():
                    for ref in refs:
                        h = ref()
                        if h is not None:
                            h.drop()
                self.handles.clear()


class PlannedLayers(nn.Module):
    """A sequence of layers run under a plan. Call it like the layers in sequence:
    `y = planned(x, *args, **kwargs)` runs `x = layer(x, *args, **kwargs)` for each layer; or
    use it where the model keeps its ModuleList of layers (`model.model.layers = planned`):
    indexing and iterating give each layer under its plan (PlannedLayer).

    Every training step that runs forward and backward through offloading layers must be inside
    `with planned.step():` (the runtime's begin/end step; the end always runs, so an exception
    leaves nothing held). Plans that only keep or recompute need no runtime and no step.
    """

    def __init__(self, layers: Union[nn.ModuleList, Sequence[nn.Module]], plan: PlanLike, *,
                 runtime: Optional[Runtime] = None, backend: Optional[str] = None,
                 **runtime_options: Any):
        super().__init__()
        # The layers are this module's children "0", "1", ... as in the ModuleList they came
        # from, so parameter names and checkpoints are the same whether a model holds its
        # layers or the planned ones (model.model.layers = planned).
        check_wrapping_order(layers)  # Note [FSDP2 and DDP]
        layer_list = layers if isinstance(layers, nn.ModuleList) else nn.ModuleList(list(layers))
        self.__dict__["layers"] = layer_list  # a view of the children, not one itself
        for i, layer in enumerate(layer_list):
            self.add_module(str(i), layer)
        self._views = [PlannedLayer(self, i) for i in range(len(layer_list))]
        # Note [FSDP2 and DDP]: each layer's class as wrapped (fully_shard swaps it for an
        # FSDP subclass), this module's own, and which layers FSDP2 manages.
        self._layer_types = [type(l) for l in layer_list]
        self._own_type = type(self)
        self._fsdp = [fsdp_managed(l) for l in layer_list]
        if not isinstance(plan, Plan):
            plan = Plan.from_json(plan_json_text(plan))
        self.plan: Plan = plan
        check_plan_matches(plan, self.layers)
        # The plan's protocol, read, never recomputed: prefetches triggered by one layer highest
        # first; a save whose wait is not given is waited for when backward starts.
        self._prefetch_after: dict[int, list[int]] = collections.defaultdict(list)
        for l in reversed(plan.layers):
            if l.policy in OFFLOADING_POLICIES and l.prefetch_after_layer >= 0:
                self._prefetch_after[l.prefetch_after_layer].append(l.index)
        n = len(plan.layers)
        self._save_wait_before = [l.save_wait_before_layer if l.save_wait_before_layer >= 0 else n
                                  for l in plan.layers]
        self._state: Optional[_StepState] = None
        self._runtime = runtime
        if runtime is None and plan.offloads:
            device = _module_device(self.layers)
            if backend is None:
                backend = "cuda" if device.type == "cuda" else "host"
            if device.type == "cuda":
                runtime_options.setdefault("device", device.index or 0)
            self._runtime = Runtime(plan, backend=backend, **runtime_options)
        # Which memory the runtime copies from: host pointers or device pointers. A tensor of
        # the other kind must never reach it (a device pointer read as host memory crashes).
        self._backend = self._runtime.stats().backend if self._runtime is not None else None

    def extra_repr(self) -> str:
        return "policies=[" + ", ".join(self.plan.policies()) + "]"

    # -- runtime ----------------------------------------------------------------------------
    @property
    def runtime(self) -> Optional[Runtime]:
        return self._runtime

    def stats(self) -> Optional[Stats]:
        return self._runtime.stats() if self._runtime is not None else None

    def report_device_peak(self, nbytes: int) -> None:
        if self._runtime is not None:
            self._runtime.report_device_peak(nbytes)

    def close(self) -> None:
        if self._runtime is not None:
            self._runtime.close()

    @contextlib.contextmanager
    def step(self) -> Iterator["PlannedLayers"]:
        """One training step: forward and backward go inside. Always ends the runtime's step."""
        if self._state is not None:
            raise RuntimeError("PlannedLayers.step(): a step is already open; steps do not nest")
        state = _StepState(self, self._runtime)
        # Which layers' parameters FSDP2 moves, read again (outside forward they are DTensors):
        # a root fully_shard may come after wrapping.
        self._fsdp = [fsdp_managed(l) for l in self.layers]
        if self._runtime is not None:
            self._runtime.begin_step()
        self._state = state
        try:
            yield self
        except BaseException:
            self._state = None
            state.close(failing=True)
            raise
        self._state = None
        state.close()

    @contextlib.contextmanager
    def microbatch(self, index: int) -> Iterator["PlannedLayers"]:
        """Inside a step: the forwards run in this block are microbatch `index`'s (0 to the
        plan's run.microbatches - 1; Note [Microbatches in the wrapper]). Their backwards may
        run here or later, in the order the schedule gives. Restores the previous microbatch on
        exit."""
        state = self._state
        if state is None:
            raise RuntimeError("PlannedLayers.microbatch(): no step is open; use it inside "
                               "`with planned.step():`")
        microbatches = self.plan.run.microbatches
        if (isinstance(index, bool) or not isinstance(index, int) or not
                0 <= index <= min(microbatches - 1, _MICROBATCH_MAX)):
            raise _microbatch_range_error("PlannedLayers.microbatch()", index, microbatches)
        previous = state.microbatch
        state.enter_microbatch(index)
        try:
            yield self
        finally:
            if state.active:
                state.microbatch = previous

    # -- forward ----------------------------------------------------------------------------
    def checkpointed_submodules(self, i: int, layer: nn.Module,
                                names: Sequence[str]) -> contextlib.AbstractContextManager:
        """selective_recompute: a context in which layer i's forward runs with the parts the
        plan names in recompute_modules checkpointed. Here each name is a submodule path of the
        layer; a wrapper for another framework (stowage.megatron) maps its own names."""
        return checkpointed_submodules(i, layer, names)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Runs every layer in order on `x`, passing `args` and `kwargs` unchanged to each; a
        layer may return a tensor or a tuple whose first element is the next layer's input.
        Returns what the last layer returned."""
        out: Any = x
        for view in self:
            out = view(x, *args, **kwargs)
            x = hidden_state(out, view.index, view.layer)
        return out

    # -- a sequence of layers, as a model's ModuleList is used ------------------------------
    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator["PlannedLayer"]:
        return iter(self._views)

    def __getitem__(self, index: Union[int, slice]) -> Any:
        return self._views[index]

    def _run(self, i: int, x: torch.Tensor, args: tuple, kwargs: dict) -> Any:
        """Layer i under its policy (see PlannedLayer)."""
        layer = self.layers[i]
        if type(layer) is not self._layer_types[i] or type(self) is not self._own_type:
            self._check_sharded_after_wrap(i, layer)
        if not torch.is_grad_enabled():
            return layer(x, *args, **kwargs)
        state = self._state
        if state is None and self._runtime is not None:
            offloading = [l.index for l in self.plan.layers
                          if l.policy in OFFLOADING_POLICIES]
            raise RuntimeError(
                f"the plan offloads layers {offloading}: run forward and backward inside "
                "`with planned.step():`")
        if state is not None:
            state.retire(i)
        try:
            out = self._run_layer(i, layer, self.plan.layers[i].policy, x, args, kwargs, state)
        except RuntimeError:
            if state is not None and state.hook_error is not None:
                raise state.hook_error from None
            raise
        y = hidden_state(out, i, layer)
        if state is not None and y.requires_grad and (i in self._prefetch_after
                                                      or i == len(self.layers) - 1):
            y.register_hook(_BackwardStart(state, i, state.microbatch))
        return out

    def _check_sharded_after_wrap(self, i: int, layer: nn.Module) -> None:
        """A class changed since wrapping: fully_shard applied in the refused order raises
        (Note [FSDP2 and DDP]); any other class change is recorded."""
        if is_fsdp(self):
            raise RuntimeError(
                "fully_shard was applied to the PlannedLayers itself, which the model does not "
                "call when it loops over its layers, so FSDP2 would never gather the layers' "
                f"parameters; {SHARD_FIRST}")
        if is_fsdp(layer) and not issubclass(self._layer_types[i], fsdp_module_class()):
            raise RuntimeError(
                f"layer {i} ({self._layer_types[i].__name__}) was sharded with fully_shard after "
                "stowage.wrap / PlannedLayers was built (the runtime chose its backend from where "
                f"the parameters were, and fully_shard moves them); {SHARD_FIRST}")
        self._layer_types[i] = type(layer)
        self._own_type = type(self)

    def _run_layer(self, i: int, layer: nn.Module, policy: str, x: torch.Tensor,
                   args: tuple, kwargs: dict, state: Optional[_StepState]) -> torch.Tensor:
        if policy == KEEP:
            return layer(x, *args, **kwargs)
        if policy == RECOMPUTE:
            return _checkpoint(layer, x, *args, **kwargs)
        if policy == SELECTIVE_RECOMPUTE:
            with self.checkpointed_submodules(i, layer, self.plan.layers[i].recompute_modules):
                return layer(x, *args, **kwargs)
        assert state is not None
        state.enter_layer(i, x.device)
        if policy == OFFLOAD_SAVED:
            hooks = _saved_hooks(state, i, x.device, layer if self._fsdp[i] else None)
            with torch.autograd.graph.saved_tensors_hooks(*hooks):
                out = layer(x, *args, **kwargs)
            state.flush()
            return out
        if policy == OFFLOAD_INPUT:
            box = _InputBox(x, i)
            handle = state.save(i, x, now=True)  # the D2H overlaps this layer's forward
            # A zero-size tensor on the input's device: checkpoint looks at its tensor arguments
            # to decide whose RNG state to save for the recompute.
            anchor = torch.empty(0, device=x.device)
            out = _checkpoint(lambda b, _a: layer(b.get(), *args, **kwargs), box, anchor)
            box.x = None
            box.handle = handle
            return out
        raise PlanError(f"plan: layers[{i}].policy is {policy!r}; allowed: "
                        f"{', '.join(POLICIES)}")


class PlannedLayer:
    """Layer `index` of a PlannedLayers, run under its policy: what iterating or indexing the
    PlannedLayers gives, so a model that loops over its layers itself (Hugging Face's
    `for decoder_layer in self.layers[:n]: hidden = decoder_layer(hidden, **kwargs)`) runs each
    one under the plan. Call it as the layer: extra positional and keyword arguments pass
    through unchanged, and it returns what the layer returns (a tensor, or a tuple whose first
    element is the hidden state). Other attributes are the layer's (e.g. `attention_type`).
    Layers must run in order within a step, as the model's forward runs them."""

    __slots__ = ("owner", "index")

    def __init__(self, owner: "PlannedLayers", index: int):
        self.owner = owner
        self.index = index

    @property
    def layer(self) -> nn.Module:
        return self.owner.layers[self.index]

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return self.owner._run(self.index, x, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.owner.layers[self.index], name)

    def __repr__(self) -> str:
        return (f"PlannedLayer({self.index}, {self.owner.plan.layers[self.index].policy}, "
                f"{type(self.layer).__name__})")


class _BackwardStart:
    """Tensor hook on a layer's output: the layer's backward is about to start."""

    def __init__(self, state: _StepState, layer: int, microbatch: int):
        self.state = weakref.ref(state)
        self.layer = layer
        self.microbatch = microbatch

    def __call__(self, grad: torch.Tensor) -> None:
        state = self.state()
        if state is not None:
            state.on_backward_of(self.layer, self.microbatch)


def _saved_hooks(state: _StepState, layer_index: int, device: torch.device,
                 fsdp_layer: Optional[nn.Module] = None) -> tuple[Callable, Callable]:
    """pack/unpack for an offload_saved layer. Parameters (and views of them) stay where they
    are; each distinct saved tensor (saved_key) is offloaded once however many ops save it.
    `fsdp_layer`: the layer, when FSDP2 manages its parameters: its resident memory is read at
    the first save, once FSDP2 has gathered them (Note [FSDP2 and DDP])."""
    resident = state.resident() if fsdp_layer is None else None
    save = state.save
    # data_ptr -> handle of the first save at that address, this layer only. Its tensor is
    # referenced until the save retires, so no address is reused meanwhile.
    seen: dict = {}
    views: dict = {}  # saved_key -> handle for other views at an address already seen

    def pack(t: torch.Tensor) -> Any:
        nonlocal resident
        if resident is None:
            resident = ResidentMemory(fsdp_layer)  # gathered now: the forward has begun
        if not offloadable(t, device, resident):
            return t
        ptr = t.data_ptr()
        first = seen.get(ptr)
        if first is None:
            key = None
        else:
            key = saved_key(t)
            if key == (ptr, tuple(first.size), tuple(first.saved_stride), first.dtype):
                return first
            h = views.get(key)
            if h is not None:
                return h
        try:
            h = save(layer_index, t)
        except Exception as e:
            state.hook_error = e
            raise
        if first is None:
            seen[ptr] = h  # keys are built only when another tensor starts here
        else:
            views[key] = h
        return h

    def unpack(packed: Any) -> torch.Tensor:
        if type(packed) is _Stowed:
            return packed.get()
        return packed

    return pack, unpack


@contextlib.contextmanager
def checkpointed_submodules(i: int, layer: nn.Module, names: Iterable[str]) -> Iterator[None]:
    """Within the block, the forward of each submodule of `layer` named (a path for
    get_submodule) runs under checkpoint; an unknown name is a PlanError listing the layer's
    submodules."""
    patched = []
    try:
        for name in names:
            try:
                m = layer.get_submodule(name)
            except AttributeError:
                children = ", ".join(n for n, _ in layer.named_modules() if n) or "none"
                raise PlanError(
                    f"plan: layers[{i}].recompute_modules names {name!r} but layer {i} "
                    f"({type(layer).__name__}) has no such submodule; it has: {children}") from None
            orig = m.forward
            m.forward = (lambda f: lambda *a, **k: _checkpoint(f, *a, **k))(orig)
            patched.append(m)
        yield
    finally:
        for m in patched:
            del m.forward  # back to the class's forward


def _module_device(layers: nn.Module) -> torch.device:
    for p in layers.parameters():
        return p.device
    for b in layers.buffers():
        return b.device
    return torch.device("cpu")


def check_plan_matches(plan: Plan, layers: Sequence[nn.Module]) -> None:
    """Raises PlanError if the plan was not made for this sequence of layers."""
    if len(plan.layers) != len(layers):
        raise PlanError(
            f"the plan has {len(plan.layers)} layers but the model has {len(layers)}; a plan "
            "must list every layer of the sequence it is applied to, in order")
    for i, lp in enumerate(plan.layers):
        if lp.policy == SELECTIVE_RECOMPUTE and not lp.recompute_modules:
            raise PlanError(f"plan: layers[{i}].policy is selective_recompute but "
                            "recompute_modules is empty")
        if lp.ffn_chunks > 1:
            warnings.warn(f"plan: layers[{i}].ffn_chunks is {lp.ffn_chunks}; PlannedLayers "
                          "runs each layer as the model defines it, so chunking its MoE/FFN is "
                          "up to the model", RuntimeWarning, stacklevel=3)


__all__ = ["PlannedLayer", "PlannedLayers", "ResidentMemory", "StaleTensorError",
           "check_plan_matches", "checkpointed_submodules", "offload_nbytes",
           "offloadable", "saved_key", "StowageError"]
