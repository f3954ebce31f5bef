"""Measures a model's layers and writes the measured layer profile the C++ planner plans from.

Python measures, C++ plans: profile_layers runs each layer once, alone, on the activations the
sample input produces and records what it saves for backward (the bytes offload_saved would move,
by the same rule the wrapper applies, each tensor with the child module whose rerun regenerates
it), its input and output sizes, its forward/backward times and, on CUDA, its forward/backward
peaks. ModelProfile.to_json() is the "stowage-layer-profile" format (README: "Layer profile
format") that `stowage plan --profile` and stowage_plan_request read (planner/frameworks/layer_profile.h).

The user's model is left as it was: no .grad is touched (torch.autograd.grad), the RNG state is
restored and the hooks used for measuring are removed.

Device memory: weights, gradients and the sample input are the profile's fixed bytes and count in
every predicted peak, so a GPU budget is the whole device. On CPU there is no allocator peak to
read: forward and backward working sets are estimated from tensor sizes and the profile says
"measured_memory": false.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn as nn

from .layers import (_hidden, _storage_ptr, offload_nbytes, offloadable, resident_storages,
                     saved_key)
from .plan import PlanError

FORMAT = "stowage-layer-profile"
# 2: layers[i].backward_peak_grad_bytes, .backward_peak_released_bytes, .checkpoint_held_bytes,
# .checkpoint_held_group and loss.held_logits_bytes (absent: what a version-1 profile means).
SCHEMA_VERSION = 2
# The planner tries every subset of a layer's modules for selective recompute (planner/frameworks/layer_profile.h
# kMaxProfileModules); the modules that save the most are listed, the rest count as the layer's.
MAX_MODULES = 8


@dataclasses.dataclass
class SavedTensor:
    name: str    # unique within the layer; "input" is the layer's own input
    bytes: int
    module: str = ""  # child module whose rerun regenerates it ("": only full recompute)


@dataclasses.dataclass
class ModuleTime:
    name: str        # a child of the layer, as layer.get_submodule(name) finds it
    seconds: float   # its forward time: what selective recompute of it costs
    # Instead of seconds: its forward's op work (planner/hardware/op_time.h OpWork fields), which the
    # planner turns into seconds on the hardware it plans for (stowage.hf_profile).
    work: Optional[dict[str, float]] = None


@dataclasses.dataclass
class LayerProfile:
    index: int
    type: str
    input_bytes: int
    output_bytes: int
    saved: list[SavedTensor]
    modules: list[ModuleTime]
    forward_peak_bytes: int   # over memory before the forward (input already allocated)
    backward_peak_bytes: int  # over memory before the forward, during backward
    forward_seconds: float
    backward_seconds: float
    # Parameter gradients this layer's backward creates (ModelProfile.gradients_in_backward).
    grad_bytes: int = 0
    # At the backward's peak: of grad_bytes, those made by then (None: all of them, the
    # backward_peak_bytes are net of every one); of the saved bytes, those released by then.
    backward_peak_grad_bytes: Optional[int] = None
    backward_peak_released_bytes: int = 0
    # What the layer's checkpoint holds beyond its input when it is recomputed, that its
    # forward_peak_bytes count while its forward runs (transformers: its layer type's mask);
    # layers of one group hold the same tensors, counted once (one group per layer type).
    checkpoint_held_bytes: int = 0
    checkpoint_held_group: int = 0
    # Instead of seconds: op work per pass (OpWork fields), converted by the planner.
    forward_work: Optional[dict[str, float]] = None
    backward_work: Optional[dict[str, float]] = None

    @property
    def saved_bytes(self) -> int:
        """What offload_saved moves: every distinct non-parameter saved tensor."""
        return sum(t.bytes for t in self.saved)

    @property
    def saves_input(self) -> bool:
        return any(t.name == "input" for t in self.saved)


@dataclasses.dataclass
class ModelProfile:
    layers: list[LayerProfile]
    device: str
    weights_bytes: int
    gradients_bytes: int
    other_bytes: int  # held throughout: the sample input
    loss_peak_bytes: int = 0
    loss_seconds: float = 0.0
    # Of loss_peak_bytes, what the caller holds to the step's end (the model output's logits);
    # the layers' backward_peak_bytes are net of it.
    held_logits_bytes: int = 0
    d2h_bytes_per_second: float = 10e9
    h2d_bytes_per_second: float = 10e9
    measured_memory: bool = False  # peaks measured by the CUDA allocator, not estimated
    tokens: int = 1  # rows of the sample input (all dimensions but the last)
    generator: str = ""
    # Eager PyTorch: each gradient is created when backward reaches its parameter (the LM
    # head's in the loss, each layer's in its backward, the embedding's last), not held
    # throughout; gradients_bytes is then 0.
    gradients_in_backward: bool = False
    loss_grad_bytes: int = 0
    loss_work: Optional[dict[str, float]] = None  # instead of loss_seconds
    embedding_grad_bytes: int = 0
    embedding_work: Optional[dict[str, float]] = None
    # What ran, when known (the plan summary reports it; None / 0: not stated): whose code the
    # layers are ("hf": transformers eager), the optimizer whose state is in fixed memory
    # ("none" when no optimizer ran), the gradients' dtype ("bf16", "fp32"), the parameters.
    framework: Optional[str] = None
    optimizer: Optional[str] = None
    grad_dtype: Optional[str] = None
    model_parameters: int = 0

    @property
    def fixed_device_bytes(self) -> int:
        return self.weights_bytes + self.gradients_bytes + self.other_bytes

    def to_dict(self) -> dict[str, Any]:
        """The profile JSON object (planner/frameworks/layer_profile.h ParseProfileJson reads it)."""
        def timed(d: dict[str, Any], key: str, seconds: float,
                  work: Optional[dict[str, float]]) -> dict[str, Any]:
            if work is None:
                d[key + "seconds"] = float(seconds)
            else:
                d[key + "work"] = {k: float(v) for k, v in work.items()}
            return d

        d: dict[str, Any] = {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "generator": self.generator or _generator(),
            "device": self.device,
            "measured_memory": bool(self.measured_memory),
            "tokens": max(1, int(self.tokens)),
            **{k: v for k, v in (("framework", self.framework), ("optimizer", self.optimizer),
                                 ("grad_dtype", self.grad_dtype)) if v is not None},
            **({"model_parameters": int(self.model_parameters)} if self.model_parameters else {}),
            "fixed_bytes": {"weights": int(self.weights_bytes),
                            "gradients": int(self.gradients_bytes), "optimizer": 0,
                            "other": int(self.other_bytes)},
            "loss": timed({"peak_bytes": int(self.loss_peak_bytes)}, "", self.loss_seconds,
                          self.loss_work),
        }
        if self.held_logits_bytes:
            d["loss"]["held_logits_bytes"] = int(self.held_logits_bytes)
        if self.gradients_in_backward:
            d["gradients_in_backward"] = True
            d["loss"]["grad_bytes"] = int(self.loss_grad_bytes)
        if self.gradients_in_backward or self.embedding_work is not None:
            d["embedding"] = timed({"grad_bytes": int(self.embedding_grad_bytes)}, "", 0.0,
                                   self.embedding_work)
        # A profile measured off the GPU has no link rates: the planner takes the hardware's.
        if self.d2h_bytes_per_second > 0 and self.h2d_bytes_per_second > 0:
            d["link"] = {"d2h_bytes_per_second": float(self.d2h_bytes_per_second),
                         "h2d_bytes_per_second": float(self.h2d_bytes_per_second)}
        layers = []
        for l in self.layers:
            out: dict[str, Any] = {
                "index": l.index, "type": l.type, "input_bytes": int(l.input_bytes),
                "output_bytes": int(l.output_bytes),
                "forward_peak_bytes": int(l.forward_peak_bytes),
                "backward_peak_bytes": int(l.backward_peak_bytes)}
            timed(out, "forward_", l.forward_seconds, l.forward_work)
            timed(out, "backward_", l.backward_seconds, l.backward_work)
            if self.gradients_in_backward:
                out["grad_bytes"] = int(l.grad_bytes)
                if l.backward_peak_grad_bytes is not None:
                    out["backward_peak_grad_bytes"] = int(l.backward_peak_grad_bytes)
            if l.backward_peak_released_bytes:
                out["backward_peak_released_bytes"] = int(l.backward_peak_released_bytes)
            if l.checkpoint_held_bytes:
                out["checkpoint_held_bytes"] = int(l.checkpoint_held_bytes)
            if l.checkpoint_held_group:
                out["checkpoint_held_group"] = int(l.checkpoint_held_group)
            out["modules"] = [timed({"name": m.name}, "", m.seconds, m.work) for m in l.modules]
            out["saved"] = [{"name": t.name, "bytes": int(t.bytes), "module": t.module}
                            for t in l.saved]
            layers.append(out)
        d["layers"] = layers
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def save(self, path: str) -> None:
        """Writes the profile for `stowage plan --profile PATH`."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json())

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "ModelProfile":
        """Reads what to_dict wrote (the C++ reader is the strict one; this is for round trips)."""
        layers = [LayerProfile(
            index=l["index"], type=l["type"], input_bytes=l["input_bytes"],
            output_bytes=l["output_bytes"],
            saved=[SavedTensor(t["name"], t["bytes"], t.get("module", "")) for t in l["saved"]],
            modules=[ModuleTime(m["name"], m.get("seconds", 0.0), m.get("work"))
                     for m in l.get("modules", [])],
            forward_peak_bytes=l["forward_peak_bytes"],
            backward_peak_bytes=l["backward_peak_bytes"],
            forward_seconds=l.get("forward_seconds", 0.0),
            backward_seconds=l.get("backward_seconds", 0.0), grad_bytes=l.get("grad_bytes", 0),
            backward_peak_grad_bytes=l.get("backward_peak_grad_bytes"),
            backward_peak_released_bytes=l.get("backward_peak_released_bytes", 0),
            checkpoint_held_bytes=l.get("checkpoint_held_bytes", 0),
            checkpoint_held_group=l.get("checkpoint_held_group", 0),
            forward_work=l.get("forward_work"), backward_work=l.get("backward_work"))
            for l in d["layers"]]
        fixed = d["fixed_bytes"]
        link = d.get("link", {})
        embedding = d.get("embedding", {})
        return ModelProfile(
            layers=layers, device=d.get("device", ""), weights_bytes=fixed["weights"],
            gradients_bytes=fixed.get("gradients", 0), other_bytes=fixed.get("other", 0),
            loss_peak_bytes=d["loss"]["peak_bytes"], loss_seconds=d["loss"].get("seconds", 0.0),
            held_logits_bytes=d["loss"].get("held_logits_bytes", 0),
            d2h_bytes_per_second=link.get("d2h_bytes_per_second", 0.0),
            h2d_bytes_per_second=link.get("h2d_bytes_per_second", 0.0),
            measured_memory=d["measured_memory"], tokens=d["tokens"],
            generator=d.get("generator", ""),
            gradients_in_backward=d.get("gradients_in_backward", False),
            loss_grad_bytes=d["loss"].get("grad_bytes", 0), loss_work=d["loss"].get("work"),
            embedding_grad_bytes=embedding.get("grad_bytes", 0),
            embedding_work=embedding.get("work"), framework=d.get("framework"),
            optimizer=d.get("optimizer"), grad_dtype=d.get("grad_dtype"),
            model_parameters=d.get("model_parameters", 0))


def _generator() -> str:
    from . import __version__
    return "stowage-python " + __version__


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
            storages = {_storage_ptr(a) for a in args if isinstance(a, torch.Tensor)}
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
        return "" if _storage_ptr(t) in inputs else name

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def _measure_layer(i: int, layer: nn.Module, x: torch.Tensor, args: tuple, kwargs: dict,
                   device: torch.device, resident: set, repeats: int
                   ) -> tuple[LayerProfile, torch.Tensor]:
    cuda = device.type == "cuda"
    params = [p for p in layer.parameters() if p.requires_grad]
    best_f = best_b = math.inf
    module_seconds: dict[str, float] = {}
    saved: list[SavedTensor] = []
    fwd_peak = bwd_peak = 0
    out_bytes = 0
    out: Optional[torch.Tensor] = None
    in_storage = _storage_ptr(x)
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
                    if (_storage_ptr(t) == in_storage and nbytes == in_bytes
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
        out = _hidden(out, i, layer)  # a tensor, or a tuple's first element, as PlannedLayers
        if cuda:
            fwd_peak = torch.cuda.max_memory_allocated(device) - before
        inputs = ([x] if x.requires_grad else []) + params
        grad_out = torch.ones_like(out)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        t2 = time.perf_counter()
        if inputs and out.requires_grad:
            grads = torch.autograd.grad(out, inputs, grad_out, allow_unused=True)
            del grads
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
            if cuda:
                _sync(device)
                before = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
            loss = loss_fn(x)
            torch.autograd.grad(loss, [x])
            _sync(device)
            loss_seconds = time.perf_counter() - t0
            if cuda:
                loss_peak = torch.cuda.max_memory_allocated(device) - before
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
        other_bytes=sample_input.numel() * sample_input.element_size(),
        loss_peak_bytes=int(loss_peak), loss_seconds=loss_seconds,
        d2h_bytes_per_second=d2h, h2d_bytes_per_second=h2d, measured_memory=cuda,
        tokens=sample_input.numel() // max(1, sample_input.shape[-1]) if sample_input.dim() else 1)


__all__ = ["LayerProfile", "ModelProfile", "ModuleTime", "SavedTensor", "main", "profile_layers"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """python -m stowage.profile --hf CONFIG: a measured profile of a transformers model, on CPU
    without a GPU (stowage.hf_profile)."""
    import argparse
    import sys
    parser = argparse.ArgumentParser(
        prog="python -m stowage.profile",
        description="Measure a Hugging Face transformers model's layers on CPU (fake tensors at "
                    "the config's own widths) and write the layer profile `stowage plan "
                    "--profile` reads.")
    parser.add_argument("--hf", required=True, metavar="CONFIG",
                        help="a config.json (model_type and the family's fields)")
    parser.add_argument("--seq-len", type=int, default=4096, metavar="N",
                        help="tokens per sequence the profile is for (4096)")
    parser.add_argument("--lengths", default=None, metavar="A,B,C",
                        help="the sequence lengths measured and fitted through (default: "
                             f"{','.join(map(str, _hf().DEFAULT_LENGTHS))}, scaled to lie on "
                             "--seq-len's side of the sliding window and of softmax rows of "
                             "48 KiB)")
    parser.add_argument("--real", action="store_true",
                        help="run real CPU tensors instead of fake ones (small configs only)")
    parser.add_argument("--out", metavar="FILE", help="write the profile here (default stdout)")
    args = parser.parse_args(argv)
    hf = _hf()
    try:
        lengths = (None if args.lengths is None else
                   [int(x) for x in args.lengths.split(",") if x.strip()])
    except ValueError:
        parser.error(f"--lengths is {args.lengths!r}; allowed: comma-separated integers")
    try:
        profile = hf.profile_hf(args.hf, args.seq_len, lengths=lengths, fake=not args.real)
    except (PlanError, OSError, ValueError) as e:
        print(f"python -m stowage.profile: {e}", file=sys.stderr)
        return 2
    if args.out:
        profile.save(args.out)
    else:
        sys.stdout.write(profile.to_json())
    return 0


def _hf() -> Any:
    from . import hf_profile
    return hf_profile


if __name__ == "__main__":
    raise SystemExit(main())
