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
allocator can never hand the block out while the copy still reads it. Saves are retired lazily:
before layer i runs, saves of layers <= i - kSaveLag are waited for on the stream, later ones are
only polled, so copies overlap the next layers' compute. A prefetch destination that was never
restored is kept until stowage_end_step has drained the copy into it.

Note [Bit-identical gradients]. Offloading moves bytes, never values: a restored tensor is a
byte copy with the original's size, stride and dtype; recompute reruns the same kernels under the
RNG state checkpoint saved. Loss and gradients therefore equal those of the unwrapped model.
"""

from __future__ import annotations

import collections
import contextlib
import warnings
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.utils.checkpoint as torch_checkpoint

from . import plan as plan_mod
from .plan import Plan, PlanError
from .runtime import PlanLike, Runtime, Stats, StowageError, plan_json_text

# Saves of layer i - kSaveLag (and earlier) are waited for before layer i runs (see the note).
kSaveLag = 2


class StaleTensorError(RuntimeError):
    """Backward reached a tensor offloaded in a step that has already ended."""


def _storage_ptr(t: torch.Tensor) -> int:
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().data_ptr()
    return t.storage().data_ptr()  # torch 1.x


def _is_dense(t: torch.Tensor) -> bool:
    """True if t's elements fill exactly numel() slots of its storage, from data_ptr() upward."""
    if t.is_contiguous():
        return True
    dims = sorted((s, n) for n, s in zip(t.shape, t.stride()) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _stream_of(device: torch.device) -> Optional[int]:
    if device.type == "cuda":
        return torch.cuda.current_stream(device).cuda_stream
    return None


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _checkpoint(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    return torch_checkpoint.checkpoint(fn, *args, use_reentrant=False, **kwargs)


class _Stowed:
    """One tensor in the host arena for the current step: its id and how to rebuild it."""

    __slots__ = ("state", "layer", "id", "size", "stride", "dtype", "device", "tensor",
                 "restored", "__weakref__")

    def __init__(self, state: "_StepState", layer: int, tensor_id: int, like: torch.Tensor):
        self.state = state
        self.layer = layer
        self.id = tensor_id
        self.size = tuple(like.shape)
        self.stride = tuple(like.stride())
        self.dtype = like.dtype
        self.device = like.device
        self.tensor: Optional[torch.Tensor] = None
        self.restored = False

    def _alloc(self) -> torch.Tensor:
        return torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device)

    def prefetch(self) -> None:
        if self.restored or self.tensor is not None or not self.state.active:
            return
        self.tensor = self._alloc()
        self.state.rt.prefetch(self.id, self.tensor.data_ptr(), _stream_of(self.device))
        self.state.prefetched[self.id] = self  # see Note [Device memory and streams]

    def get(self) -> torch.Tensor:
        if self.restored:
            assert self.tensor is not None
            return self.tensor
        if not self.state.active:
            raise StaleTensorError(
                f"backward needs a tensor that layer {self.layer} offloaded in a step that has "
                "ended; run forward and backward inside the same `with layers.step():`")
        if self.tensor is None:
            self.tensor = self._alloc()
        self.state.rt.restore(self.id, self.tensor.data_ptr(), _stream_of(self.device))
        self.restored = True
        self.state.prefetched.pop(self.id, None)
        return self.tensor

    def drop(self) -> None:
        self.tensor = None


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
        self.active = True
        # (layer, id, tensor) of saves whose D2H may still read `tensor`.
        self.pending: collections.deque = collections.deque()
        self.handles: dict[int, list[weakref.ref]] = collections.defaultdict(list)
        self.prefetched: dict[int, _Stowed] = {}
        self.host_used: dict[int, int] = collections.defaultdict(int)
        self.device: Optional[torch.device] = None
        # An error raised inside a saved-tensor hook reaches the caller as a plain RuntimeError
        # (torch converts it on its way through C++); forward re-raises the original from here.
        self.hook_error: Optional[BaseException] = None
        self._param_storages: Optional[set] = None

    # -- forward ----------------------------------------------------------------------------
    def save(self, layer: int, t: torch.Tensor) -> _Stowed:
        backend = self.owner._backend
        if t.device.type != ("cuda" if backend == "cuda" else "cpu"):
            raise RuntimeError(
                f"layer {layer} offloads a tensor on {t.device} but the runtime uses the "
                f"{backend} backend (chosen from where the layers were when wrapped); wrap the "
                "layers after moving them to the device they train on")
        if not _is_dense(t):
            t = t.contiguous()
        nbytes = _nbytes(t)
        lp = self.owner.plan.layers[layer]
        used = self.host_used[layer] + nbytes
        if used > lp.host_bytes:
            raise PlanError(
                f"layer {layer} ({type(self.owner.layers[layer]).__name__}, policy "
                f"{lp.policy}) offloads {used} bytes this step but the plan reserves "
                f"layers[{layer}].host_bytes = {lp.host_bytes}: the plan was made for another "
                "model, shape or batch; rebuild it for this one")
        assert self.rt is not None
        tensor_id = self.rt.save(layer, t.data_ptr(), nbytes, _stream_of(t.device))
        self.host_used[layer] = used
        self.pending.append((layer, tensor_id, t))
        self.device = t.device
        h = _Stowed(self, layer, tensor_id, t)
        self.handles[layer].append(weakref.ref(h))
        return h

    def param_storages(self) -> set:
        """Storages of every parameter and buffer of the wrapped layers (shared or tied weights
        included): saved tensors in them stay on the device. Computed once per step."""
        if self._param_storages is None:
            self._param_storages = resident_storages(self.owner.layers)
        return self._param_storages

    def _wait(self, tensor_id: int, device: torch.device) -> None:
        assert self.rt is not None
        if device.type == "cuda":
            self.rt.save_wait_stream(tensor_id, _stream_of(device))
        else:  # no streams on the host: the CPU itself must not reuse the block before the copy
            self.rt.save_wait(tensor_id)

    def retire(self, before_layer: Optional[int]) -> None:
        """Drops references to saved tensors whose D2H is over; waits for those of layers
        <= before_layer - kSaveLag (all of them when before_layer is None)."""
        if self.rt is None:
            return
        keep = collections.deque()
        while self.pending:
            layer, tensor_id, t = self.pending.popleft()
            if before_layer is None or layer <= before_layer - kSaveLag:
                self._wait(tensor_id, t.device)
            elif not self.rt.save_query(tensor_id):
                keep.append((layer, tensor_id, t))
        self.pending = keep

    # -- backward ---------------------------------------------------------------------------
    def on_backward_of(self, layer: int) -> None:
        """Called when the gradient of `layer`'s output is ready, i.e. its backward starts."""
        if not self.active:
            return
        if layer == len(self.owner.plan.layers) - 1:
            self.retire(None)
        for k in self.owner._prefetch_after.get(layer, ()):
            for ref in self.handles.get(k, ()):
                h = ref()
                if h is not None:
                    h.prefetch()

    # -- end --------------------------------------------------------------------------------
    def close(self, failing: bool = False) -> None:
        """Retires every save, lands every prefetch, ends the runtime's step, and drops every
        tensor the step held. With `failing` (the step body raised), errors here are reported
        as warnings so they do not hide the body's exception."""
        self.active = False
        try:
            if self.rt is not None:
                self.retire(None)
                # A prefetch the graph never asked for: restore it into its own buffer so its
                # copy has landed before the buffer goes back to the allocator.
                for h in list(self.prefetched.values()):
                    self.rt.restore(h.id, h.tensor.data_ptr(), _stream_of(h.device))
        except Exception as e:  # noqa: BLE001
            if not failing:
                raise
            warnings.warn(f"stowage: while ending a failed step: {e}", RuntimeWarning)
        finally:
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
    `y = planned(x, *args, **kwargs)` runs `x = layer(x, *args, **kwargs)` for each layer.

    Every training step that runs forward and backward through offloading layers must be inside
    `with planned.step():` (the runtime's begin/end step; the end always runs, so an exception
    leaves nothing held). Plans that only keep or recompute need no runtime and no step.
    """

    def __init__(self, layers: Union[nn.ModuleList, Sequence[nn.Module]], plan: PlanLike, *,
                 runtime: Optional[Runtime] = None, backend: Optional[str] = None,
                 **runtime_options: Any):
        super().__init__()
        self.layers = layers if isinstance(layers, nn.ModuleList) else nn.ModuleList(list(layers))
        if not isinstance(plan, Plan):
            plan = Plan.from_json(plan_json_text(plan))
        self.plan: Plan = plan
        check_plan_matches(plan, self.layers)
        self._prefetch_after: dict[int, list[int]] = collections.defaultdict(list)
        for l in plan.layers:
            if l.policy in plan_mod.OFFLOADING_POLICIES and l.prefetch_after_layer >= 0:
                self._prefetch_after[l.prefetch_after_layer].append(l.index)
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

    # -- forward ----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not torch.is_grad_enabled():
            for layer in self.layers:
                x = layer(x, *args, **kwargs)
            return x
        state = self._state
        if state is None and self._runtime is not None:
            offloading = [l.index for l in self.plan.layers
                          if l.policy in plan_mod.OFFLOADING_POLICIES]
            raise RuntimeError(
                f"the plan offloads layers {offloading}: run forward and backward inside "
                "`with planned.step():`")
        last = len(self.layers) - 1
        for i, (layer, lp) in enumerate(zip(self.layers, self.plan.layers)):
            if state is not None:
                state.retire(i)
            try:
                x = self._run_layer(i, layer, lp.policy, x, args, kwargs, state)
            except RuntimeError:
                if state is not None and state.hook_error is not None:
                    raise state.hook_error from None
                raise
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"layer {i} ({type(layer).__name__}) returned "
                                f"{type(x).__name__}; PlannedLayers passes one tensor from layer "
                                "to layer")
            if state is not None and x.requires_grad and (i in self._prefetch_after or i == last):
                x.register_hook(_BackwardStart(state, i))
        return x

    def _run_layer(self, i: int, layer: nn.Module, policy: str, x: torch.Tensor,
                   args: tuple, kwargs: dict, state: Optional[_StepState]) -> torch.Tensor:
        if policy == plan_mod.KEEP:
            return layer(x, *args, **kwargs)
        if policy == plan_mod.RECOMPUTE:
            return _checkpoint(layer, x, *args, **kwargs)
        if policy == plan_mod.SELECTIVE_RECOMPUTE:
            with _checkpointed_submodules(i, layer, self.plan.layers[i].recompute_modules):
                return layer(x, *args, **kwargs)
        assert state is not None
        if policy == plan_mod.OFFLOAD_SAVED:
            with torch.autograd.graph.saved_tensors_hooks(*_saved_hooks(state, i, layer, x)):
                return layer(x, *args, **kwargs)
        if policy == plan_mod.OFFLOAD_INPUT:
            box = _InputBox(x, i)
            handle = state.save(i, x)  # the D2H overlaps this layer's forward
            # A zero-size tensor on the input's device: checkpoint looks at its tensor arguments
            # to decide whose RNG state to save for the recompute.
            anchor = torch.empty(0, device=x.device)
            out = _checkpoint(lambda b, _a: layer(b.get(), *args, **kwargs), box, anchor)
            box.x = None
            box.handle = handle
            return out
        raise PlanError(f"plan: layers[{i}].policy is {policy!r}; allowed: "
                        f"{', '.join(plan_mod.POLICIES)}")


class _BackwardStart:
    """Tensor hook on a layer's output: the layer's backward is about to start."""

    def __init__(self, state: _StepState, layer: int):
        self.state = weakref.ref(state)
        self.layer = layer

    def __call__(self, grad: torch.Tensor) -> None:
        state = self.state()
        if state is not None:
            state.on_backward_of(self.layer)


def _saved_hooks(state: _StepState, layer_index: int, layer: nn.Module,
                 x: torch.Tensor) -> tuple[Callable, Callable]:
    """pack/unpack for an offload_saved layer. Parameters (and views of them) stay where they
    are; each distinct saved tensor is offloaded once however many ops save it."""
    param_storages = state.param_storages()
    device = x.device
    seen: dict[tuple, _Stowed] = {}  # lives for this layer's forward only

    def pack(t: torch.Tensor) -> Any:
        if not offloadable(t, device, param_storages):
            return t
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        h = seen.get(key)
        if h is None:
            try:
                h = state.save(layer_index, t)
            except Exception as e:
                state.hook_error = e
                raise
            seen[key] = h
        return h

    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        return packed.get()

    return pack, unpack


def resident_storages(module: nn.Module) -> set:
    """Storage addresses of a module's parameters and buffers."""
    out = {_storage_ptr(p) for p in module.parameters()}
    out.update(_storage_ptr(b) for b in module.buffers())
    return out


def offloadable(t: torch.Tensor, device: torch.device, param_storages: set) -> bool:
    """Whether an offload_saved layer sends this saved tensor to the host. The profiler
    (stowage.profile) uses the same rule, so plan host_bytes and the bytes saved agree."""
    return (t.device == device and t.numel() > 0 and not t.is_sparse
            and _storage_ptr(t) not in param_storages)


@contextlib.contextmanager
def _checkpointed_submodules(i: int, layer: nn.Module, names: Iterable[str]) -> Iterator[None]:
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
        if lp.policy == plan_mod.SELECTIVE_RECOMPUTE and not lp.recompute_modules:
            raise PlanError(f"plan: layers[{i}].policy is selective_recompute but "
                            "recompute_modules is empty")
        if lp.moe_chunks > 1:
            warnings.warn(f"plan: layers[{i}].moe_chunks is {lp.moe_chunks}; PlannedLayers "
                          "runs each layer as the model defines it, so chunking its MoE/FFN is "
                          "up to the model", RuntimeWarning, stacklevel=3)


def wrap(layers: Union[nn.ModuleList, Sequence[nn.Module]], plan: Optional[PlanLike] = None, *,
         gpu_budget_bytes: Optional[int] = None, sample_input: Optional[torch.Tensor] = None,
         **kwargs: Any) -> PlannedLayers:
    """Wraps layers under a given plan, or under the C++ planner's plan for `gpu_budget_bytes`
    (the whole device memory a step may peak at, weights, gradients and the sample input
    included, as `stowage plan --gpu-mem`), the layers profiled on `sample_input`."""
    if "budget_bytes" in kwargs:
        raise TypeError("wrap(): budget_bytes= is now gpu_budget_bytes=, the whole device memory "
                        "a step may peak at (fixed memory included), as `stowage plan --gpu-mem`")
    if (plan is None) == (gpu_budget_bytes is None):
        raise ValueError("wrap(): give exactly one of plan= and gpu_budget_bytes=")
    if plan is None:
        if sample_input is None:
            raise ValueError("wrap(gpu_budget_bytes=...) needs sample_input= (a batch's "
                             "first-layer input) to measure the layers")
        from .planner import plan_for_budget
        plan_kwargs = {k: kwargs.pop(k) for k in list(kwargs)
                       if k in ("host_budget_bytes", "loss_fn", "prefetch_distance", "profile",
                                "force")}
        plan = plan_for_budget(layers, sample_input, gpu_budget_bytes, **plan_kwargs)
    return PlannedLayers(layers, plan, **kwargs)


__all__ = ["PlannedLayers", "StaleTensorError", "check_plan_matches", "offloadable", "wrap",
           "StowageError"]
