"""Measures a model's layers and writes the measured layer profile the C++ planner plans from.

    python -m stowage.measure.profile --hf config.json --seq-len 16384 --out profile.json

Python measures, C++ plans: profile_layers runs each layer once, alone, on the activations the
sample input produces and records what it saves for backward (the bytes offload_saved would move,
by the same rule the wrapper applies, each tensor with the child module whose rerun regenerates
it), its input and output sizes, its forward/backward times and, on CUDA, its forward/backward
peaks. ModelProfile.to_json() is the "stowage-layer-profile" format (stowage.measure.layer_profile;
README: "Layer profile format") that `stowage plan --profile` and stowage_plan_request read
(planner/frameworks/layer_profile.h).

The user's model is left as it was: no .grad is touched (torch.autograd.grad), the RNG state is
restored and the hooks used for measuring are removed.

Device memory: weights, gradients and the sample input are the profile's fixed bytes and count in
every predicted peak, so a GPU budget is the whole device. On CPU there is no allocator peak to
read: forward and backward working sets are estimated from tensor sizes and the profile says
"measured_memory": false.

The command line measures a Hugging Face transformers model instead (`--hf CONFIG`: its
config.json), on CPU without a GPU: stowage.measure.hf_profile.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn as nn

from .._tensors import (ResidentMemory, hidden_state, offload_nbytes, offloadable,
                        resident_storages, saved_key, storage_ptr)
from ..plan import PlanError
from .hf_profile import DEFAULT_LENGTHS, profile_hf
from .layer_profile import (MAX_MODULES, TORCH_CUBLAS_WORKSPACES_BYTES, LayerProfile,
                            ModelProfile, ModuleTime, SavedTensor)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _layer_device(layer: nn.Module, x: torch.Tensor) -> torch.device:
    for p in layer.parameters():
        return p.device
    return x.device


def _measure_bandwidth(device: torch.device, nbytes: int) -> tuple[float, float]:
    """(D2H, H2D) bytes/s for pinned copies of nbytes; a host memcpy figure on CPU."""
    n = max(1, nbytes // 4)
    if device.type == "cuda":
        dev = torch.empty(n, dtype=torch.float32, device=device)
        host = torch.empty(n, dtype=torch.float32, pin_memory=True)
        figures = []
        for dst, src in ((host, dev), (dev, host)):
            dst.copy_(src, non_blocking=True)  # warm up
            _sync(device)
            t = time.perf_counter()
            for _ in range(3):
                dst.copy_(src, non_blocking=True)
            _sync(device)
            figures.append(3 * nbytes / max(time.perf_counter() - t, 1e-9))
        return figures[0], figures[1]
    src = torch.empty(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = time.perf_counter()
    for _ in range(3):
        dst.copy_(src)
    bw = 3 * nbytes / max(time.perf_counter() - t, 1e-9)
    return bw, bw


@torch.no_grad()
def _no_grad_clone(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone()


class _ChildTracker:
    """Forward hooks on a layer's children: which child runs now (so a saved tensor can name the
    module that regenerates it), each child's input storages (a checkpointed module keeps its
    inputs, so those are not its to drop) and each child's forward time."""

    def __init__(self, layer: nn.Module, device: torch.device):
        self.device = device
        self.active: list[tuple[str, set]] = []
        self.seconds: dict[str, float] = {}
        self._start: list[float] = []
        self._handles = []
        for name, child in layer.named_children():
            self._handles.append(child.register_forward_pre_hook(self._pre(name)))
            self._handles.append(child.register_forward_hook(self._post(name)))

    def _pre(self, name: str) -> Callable:
        def hook(_module: nn.Module, args: tuple) -> None:
            storages = {storage_ptr(a) for a in args if isinstance(a, torch.Tensor)}
            self.active.append((name, storages))
            _sync(self.device)
            self._start.append(time.perf_counter())
        return hook

    def _post(self, name: str) -> Callable:
        def hook(_module: nn.Module, _args: tuple, _out: Any) -> None:
            _sync(self.device)
            elapsed = time.perf_counter() - self._start.pop()
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed
            self.active.pop()
        return hook

    def module_of(self, t: torch.Tensor) -> str:
        if not self.active:
            return ""
        name, inputs = self.active[0]  # the outermost child: what get_submodule(name) reruns
        return "" if storage_ptr(t) in inputs else name

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def _measure_layer(i: int, layer: nn.Module, x: torch.Tensor, args: tuple, kwargs: dict,
                   device: torch.device, resident: ResidentMemory, repeats: int
                   ) -> tuple[LayerProfile, torch.Tensor]:
    cuda = device.type == "cuda"
    params = [p for p in layer.parameters() if p.requires_grad]
    best_f = best_b = math.inf
    module_seconds: dict[str, float] = {}
    saved: list[SavedTensor] = []
    fwd_peak = bwd_peak = 0
    out_bytes = 0
    out: Optional[torch.Tensor] = None
    in_storage = storage_ptr(x)
    in_bytes = x.numel() * x.element_size()
    for _ in range(max(1, repeats)):
        seen: set = set()
        tensors: list[SavedTensor] = []
        counts: dict[str, int] = {}
        tracker = _ChildTracker(layer, device)

        def pack(t: torch.Tensor) -> torch.Tensor:
            if offloadable(t, device, resident):
                key = saved_key(t)
                if key not in seen:
                    seen.add(key)
                    nbytes = offload_nbytes(t)
                    if (storage_ptr(t) == in_storage and nbytes == in_bytes
                            and not any(s.name == "input" for s in tensors)):
                        tensors.append(SavedTensor("input", nbytes, ""))
                    else:
                        module = tracker.module_of(t)
                        k = counts.get(module, 0)
                        counts[module] = k + 1
                        tensors.append(SavedTensor(f"{module or 'layer'}.{k}", nbytes, module))
            return t

        out = None  # the previous repeat's graph must not count, nor stay allocated
        try:
            if cuda:
                _sync(device)
                before = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = layer(x, *args, **kwargs)
            _sync(device)
            t1 = time.perf_counter()
        finally:
            tracker.remove()
        out = hidden_state(out, i, layer)  # a tensor, or a tuple's first element, as PlannedLayers
        if cuda:
            fwd_peak = torch.cuda.max_memory_allocated(device) - before
        inputs = ([x] if x.requires_grad else []) + params
        grad_out = torch.ones_like(out)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        t2 = time.perf_counter()
        if inputs and out.requires_grad:
            # The gradients themselves are dropped at once: only the pass's time and peak count.
            torch.autograd.grad(out, inputs, grad_out, allow_unused=True)
        _sync(device)
        t3 = time.perf_counter()
        if cuda:
            bwd_peak = torch.cuda.max_memory_allocated(device) - before
        best_f = min(best_f, t1 - t0)
        best_b = min(best_b, t3 - t2)
        for name, secs in tracker.seconds.items():
            module_seconds[name] = min(module_seconds.get(name, math.inf), secs)
        saved = tensors
        out_bytes = out.numel() * out.element_size()
        del grad_out
    assert out is not None
    saved_bytes = sum(t.bytes for t in saved)
    saves_input = any(t.name == "input" for t in saved)
    if not cuda:
        # Estimates: forward holds what it saves plus its output and one temporary of that
        # size; backward adds the output's gradient, the input's, one temporary.
        fwd_peak = saved_bytes - (in_bytes if saves_input else 0) + 2 * out_bytes
        bwd_peak = fwd_peak + out_bytes + in_bytes
    # The modules that regenerate the most, at most MAX_MODULES; the others' tensors are the
    # layer's (full recompute only).
    by_module: dict[str, int] = {}
    for t in saved:
        if t.module:
            by_module[t.module] = by_module.get(t.module, 0) + t.bytes
    listed = sorted(by_module, key=lambda m: -by_module[m])[:MAX_MODULES]
    for t in saved:
        if t.module and t.module not in listed:
            t.module = ""
    modules = [ModuleTime(m, module_seconds.get(m, 0.0))
               for m, _ in layer.named_children() if m in listed]
    profile = LayerProfile(
        index=i, type=type(layer).__name__, input_bytes=in_bytes, output_bytes=out_bytes,
        saved=saved, modules=modules, forward_peak_bytes=int(fwd_peak),
        backward_peak_bytes=int(bwd_peak), forward_seconds=best_f, backward_seconds=best_b)
    return profile, out.detach()


def profile_layers(layers: Sequence[nn.Module], sample_input: torch.Tensor, *args: Any,
                   loss_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                   repeats: int = 2, **kwargs: Any) -> ModelProfile:
    """Measures each layer alone on the activations the sample input produces.

    Only one layer's activations are alive at a time, so profiling fits wherever a one-layer
    step fits. `loss_fn`, if given, is measured on the last output (its peak and time are part
    of the step). `args`/`kwargs` are passed to every layer, as PlannedLayers does.
    """
    layers = list(layers)
    if not layers:
        raise PlanError("cannot plan an empty sequence of layers")
    device = _layer_device(layers[0], sample_input)
    cuda = device.type == "cuda"
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and cuda else None
    profiles: list[LayerProfile] = []
    resident = resident_storages(nn.ModuleList(layers))  # the rule PlannedLayers applies
    x = sample_input.detach().requires_grad_(sample_input.requires_grad)
    try:
        for i, layer in enumerate(layers):
            profile, out = _measure_layer(i, layer, x, args, kwargs, device, resident, repeats)
            profiles.append(profile)
            x = _no_grad_clone(out).requires_grad_(True)
            del out
        loss_peak, loss_seconds = 0, 0.0
        if loss_fn is not None:
            # As each layer's: the best of `repeats` runs, so that the first call's one-time
            # work (kernel selection, workspace allocation) is not counted as the step's.
            loss_seconds = math.inf
            for _ in range(max(1, repeats)):
                if cuda:
                    _sync(device)
                    before = torch.cuda.memory_allocated(device)
                    torch.cuda.reset_peak_memory_stats(device)
                t0 = time.perf_counter()
                loss = loss_fn(x)
                torch.autograd.grad(loss, [x])
                _sync(device)
                loss_seconds = min(loss_seconds, time.perf_counter() - t0)
                del loss
                if cuda:
                    loss_peak = max(loss_peak, torch.cuda.max_memory_allocated(device) - before)
                else:
                    loss_peak = 2 * x.numel() * x.element_size()
        del x
        probe = max(p.input_bytes for p in profiles)
        d2h, h2d = _measure_bandwidth(device, min(max(probe, 1 << 20), 256 << 20))
    finally:
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    params = [p for layer in layers for p in layer.parameters()]
    return ModelProfile(
        layers=profiles, device=str(device),
        weights_bytes=sum(p.numel() * p.element_size() for p in params),
        gradients_bytes=sum(p.numel() * p.element_size() for p in params if p.requires_grad),
        other_bytes=sample_input.numel() * sample_input.element_size() +
        TORCH_CUBLAS_WORKSPACES_BYTES,
        loss_peak_bytes=int(loss_peak), loss_seconds=loss_seconds,
        d2h_bytes_per_second=d2h, h2d_bytes_per_second=h2d, measured_memory=cuda,
        tokens=sample_input.numel() // max(1, sample_input.shape[-1]) if sample_input.dim() else 1)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """python -m stowage.measure.profile --hf CONFIG: a measured profile of a transformers model,
    on CPU without a GPU (stowage.measure.hf_profile)."""
    parser = argparse.ArgumentParser(
        prog="python -m stowage.measure.profile",
        description="Measure a Hugging Face transformers model's layers on CPU (fake tensors at "
                    "the config's own widths) and write the layer profile `stowage plan "
                    "--profile` reads.")
    parser.add_argument("--hf", required=True, metavar="CONFIG",
                        help="a config.json (model_type and the family's fields)")
    parser.add_argument("--seq-len", type=int, default=4096, metavar="N",
                        help="tokens per sequence the profile is for (4096)")
    parser.add_argument("--lengths", default=None, metavar="A,B,C",
                        help="the sequence lengths measured and fitted through (default: "
                             f"{','.join(map(str, DEFAULT_LENGTHS))}, scaled to lie "
                             "on --seq-len's side of the sliding window and of softmax rows of "
                             "48 KiB)")
    parser.add_argument("--real", action="store_true",
                        help="run real CPU tensors instead of fake ones (small configs only)")
    parser.add_argument("--out", metavar="FILE", help="write the profile here (default stdout)")
    args = parser.parse_args(argv)
    try:
        lengths = (None if args.lengths is None else
                   [int(x) for x in args.lengths.split(",") if x.strip()])
    except ValueError:
        parser.error(f"--lengths is {args.lengths!r}; allowed: comma-separated integers")
    try:
        profile = profile_hf(args.hf, args.seq_len, lengths=lengths,
                             fake=not args.real)
    except (PlanError, OSError, ValueError) as e:
        print(f"python -m stowage.measure.profile: {e}", file=sys.stderr)
        return 2
    if args.out:
        profile.save(args.out)
    else:
        sys.stdout.write(profile.to_json())
    return 0


__all__ = ["main", "profile_layers"]


if __name__ == "__main__":
    raise SystemExit(main())
