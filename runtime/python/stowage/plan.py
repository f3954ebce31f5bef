"""The plan (include/stowage/plan.h) as Python dataclasses, read and written as its JSON.

The field names, policy words and invariants are those of plan.h / planner/plan.cc, so a plan
written here is read by the runtime and the `stowage` CLI, and a plan written by the CLI drives
the PyTorch wrapper. Unknown fields are ignored when reading, as plan.h promises.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

SCHEMA_VERSION = 1

KEEP = "keep"
RECOMPUTE = "recompute"
SELECTIVE_RECOMPUTE = "selective_recompute"
OFFLOAD_INPUT = "offload_input"
OFFLOAD_SAVED = "offload_saved"
POLICIES = (KEEP, RECOMPUTE, SELECTIVE_RECOMPUTE, OFFLOAD_INPUT, OFFLOAD_SAVED)
OFFLOADING_POLICIES = (OFFLOAD_INPUT, OFFLOAD_SAVED)


class PlanError(ValueError):
    """A plan is malformed, or does not match the model it is applied to."""


@dataclasses.dataclass
class Transfer:
    name: str
    bytes: int


@dataclasses.dataclass
class LayerPlan:
    index: int
    type: str
    policy: str = KEEP
    device_saved_bytes: int = 0
    host_bytes: int = 0
    transfers: list[Transfer] = dataclasses.field(default_factory=list)
    prefetch_after_layer: int = -1
    moe_chunks: int = 1
    recompute_modules: list[str] = dataclasses.field(default_factory=list)
    forward_seconds: float = 0.0
    backward_seconds: float = 0.0
    recompute_seconds: float = 0.0
    d2h_seconds: float = 0.0
    h2d_seconds: float = 0.0


@dataclasses.dataclass
class Prediction:
    peak_device_bytes: int = 0
    fixed_device_bytes: int = 0
    host_bytes_per_gpu: int = 0
    host_bytes_per_numa_node: int = 0
    step_seconds: float = 0.0
    exposed_copy_seconds: float = 0.0
    baseline: str = ""
    baseline_step_seconds: float = 0.0


@dataclasses.dataclass
class RuntimeSettings:
    prefetch_distance: int = 1
    host_arena_bytes: int = 0
    copy_chunk_bytes: int = 16 << 20
    gpus_per_numa_node: int = 1
    link_bytes_per_second: float = 0.0


@dataclasses.dataclass
class RunSettings:
    seq_len: int = 0
    micro_batch: int = 1
    tp: int = 1
    cp: int = 1
    ep: int = 1
    gpu_budget_bytes: int = 0
    host_budget_bytes: int = 0


@dataclasses.dataclass
class Plan:
    layers: list[LayerPlan]
    predicted: Prediction = dataclasses.field(default_factory=Prediction)
    runtime: RuntimeSettings = dataclasses.field(default_factory=RuntimeSettings)
    run: RunSettings = dataclasses.field(default_factory=RunSettings)
    schema_version: int = SCHEMA_VERSION
    generator: str = "stowage-python"
    model: str = ""
    hardware: str = ""

    # -- serialization ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The plan.h JSON object, fields in the order PlanToJson writes them."""
        layers = []
        for l in self.layers:
            d: dict[str, Any] = {
                "index": l.index, "type": l.type, "policy": l.policy,
                "device_saved_bytes": int(l.device_saved_bytes), "host_bytes": int(l.host_bytes),
                "transfers": [{"name": t.name, "bytes": int(t.bytes)} for t in l.transfers],
                "prefetch_after_layer": l.prefetch_after_layer, "moe_chunks": l.moe_chunks,
                "forward_seconds": l.forward_seconds, "backward_seconds": l.backward_seconds,
                "recompute_seconds": l.recompute_seconds, "d2h_seconds": l.d2h_seconds,
                "h2d_seconds": l.h2d_seconds,
            }
            if l.recompute_modules:
                d["recompute_modules"] = list(l.recompute_modules)
            layers.append(d)
        p = self.predicted
        return {
            "schema_version": self.schema_version,
            "generator": self.generator,
            "model": self.model,
            "hardware": self.hardware,
            "run": dataclasses.asdict(self.run),
            "predicted": {
                "peak_device_bytes": int(p.peak_device_bytes),
                "fixed_device_bytes": int(p.fixed_device_bytes),
                "host_bytes_per_gpu": int(p.host_bytes_per_gpu),
                "host_bytes_per_numa_node": int(p.host_bytes_per_numa_node),
                "step_seconds": p.step_seconds,
                "exposed_copy_seconds": p.exposed_copy_seconds,
                "baseline": p.baseline,
                "baseline_step_seconds": p.baseline_step_seconds,
            },
            "runtime": dataclasses.asdict(self.runtime),
            "layers": layers,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json())

    @staticmethod
    def from_json(text: str) -> "Plan":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"plan: not valid JSON ({e})") from e
        return Plan.from_dict(obj)

    @staticmethod
    def load(path: str) -> "Plan":
        with open(path, encoding="utf-8") as f:
            try:
                return Plan.from_json(f.read())
            except PlanError as e:
                raise PlanError(f"{path}: {e}") from e

    @staticmethod
    def from_dict(obj: Any) -> "Plan":
        if not isinstance(obj, dict):
            raise PlanError("plan: the top level is not an object")
        version = _get(obj, "", "schema_version", int)
        if version != SCHEMA_VERSION:
            raise PlanError(f"plan: field 'schema_version' is {version}; this package reads "
                            f"schema_version {SCHEMA_VERSION}")
        pred = obj.get("predicted")
        if not isinstance(pred, dict):
            raise PlanError("plan: field 'predicted' is missing or not an object")
        predicted = Prediction(
            peak_device_bytes=_get(pred, "predicted.", "peak_device_bytes", int),
            host_bytes_per_gpu=_get(pred, "predicted.", "host_bytes_per_gpu", int),
            step_seconds=_get(pred, "predicted.", "step_seconds", float),
            exposed_copy_seconds=_get(pred, "predicted.", "exposed_copy_seconds", float),
            fixed_device_bytes=_get(pred, "predicted.", "fixed_device_bytes", int, 0),
            host_bytes_per_numa_node=_get(pred, "predicted.", "host_bytes_per_numa_node", int, 0),
            baseline=_get(pred, "predicted.", "baseline", str, ""),
            baseline_step_seconds=_get(pred, "predicted.", "baseline_step_seconds", float, 0.0),
        )
        rt = obj.get("runtime", {})
        if not isinstance(rt, dict):
            raise PlanError("plan: field 'runtime' is not an object")
        runtime = RuntimeSettings(
            prefetch_distance=_get(rt, "runtime.", "prefetch_distance", int, 1),
            host_arena_bytes=_get(rt, "runtime.", "host_arena_bytes", int, 0),
            copy_chunk_bytes=_get(rt, "runtime.", "copy_chunk_bytes", int, 16 << 20),
            gpus_per_numa_node=_get(rt, "runtime.", "gpus_per_numa_node", int, 1),
            link_bytes_per_second=_get(rt, "runtime.", "link_bytes_per_second", float, 0.0),
        )
        run_obj = obj.get("run", {})
        if not isinstance(run_obj, dict):
            raise PlanError("plan: field 'run' is not an object")
        run = RunSettings(**{f.name: _get(run_obj, "run.", f.name, int, f.default)
                             for f in dataclasses.fields(RunSettings)})
        layers_obj = obj.get("layers")
        if not isinstance(layers_obj, list):
            raise PlanError("plan: field 'layers' is missing or not an array")
        layers = []
        for i, l in enumerate(layers_obj):
            path = f"layers[{i}]."
            if not isinstance(l, dict):
                raise PlanError(f"plan: 'layers[{i}]' is not an object")
            policy = _get(l, path, "policy", str)
            if policy not in POLICIES:
                raise PlanError(f"plan: field '{path}policy' is {policy!r}; allowed: "
                                f"{', '.join(POLICIES)}")
            layer = LayerPlan(
                index=_get(l, path, "index", int), type=_get(l, path, "type", str),
                policy=policy,
                device_saved_bytes=_get(l, path, "device_saved_bytes", int),
                host_bytes=_get(l, path, "host_bytes", int),
                prefetch_after_layer=_get(l, path, "prefetch_after_layer", int, -1),
                moe_chunks=_get(l, path, "moe_chunks", int, 1),
                recompute_modules=list(_get(l, path, "recompute_modules", list, [])),
                forward_seconds=_get(l, path, "forward_seconds", float, 0.0),
                backward_seconds=_get(l, path, "backward_seconds", float, 0.0),
                recompute_seconds=_get(l, path, "recompute_seconds", float, 0.0),
                d2h_seconds=_get(l, path, "d2h_seconds", float, 0.0),
                h2d_seconds=_get(l, path, "h2d_seconds", float, 0.0),
            )
            if "transfers" in l:
                if not isinstance(l["transfers"], list):
                    raise PlanError(f"plan: field '{path}transfers' is not an array")
                for k, t in enumerate(l["transfers"]):
                    tpath = f"{path}transfers[{k}]."
                    if not isinstance(t, dict):
                        raise PlanError(f"plan: '{tpath[:-1]}' is not an object")
                    layer.transfers.append(Transfer(_get(t, tpath, "name", str, ""),
                                                    _get(t, tpath, "bytes", int)))
            elif layer.host_bytes > 0:
                layer.transfers.append(Transfer("input", layer.host_bytes))
            layers.append(layer)
        plan = Plan(layers=layers, predicted=predicted, runtime=runtime, run=run,
                    schema_version=version, generator=str(obj.get("generator", "")),
                    model=str(obj.get("model", "")), hardware=str(obj.get("hardware", "")))
        plan.validate()
        return plan

    # -- checks -----------------------------------------------------------------------------
    def validate(self) -> None:
        """The invariants planner/plan.cc's ValidatePlan checks, plus the prefetch layer range."""
        host_total = 0
        n = len(self.layers)
        for i, l in enumerate(self.layers):
            if l.index != i:
                raise PlanError(f"plan: layers[{i}].index is {l.index}; layers must be listed in "
                                "order from 0")
            if l.policy not in POLICIES:
                raise PlanError(f"plan: layers[{i}].policy is {l.policy!r}; allowed: "
                                f"{', '.join(POLICIES)}")
            tsum = sum(t.bytes for t in l.transfers)
            if tsum != l.host_bytes:
                raise PlanError(f"plan: layers[{i}].transfers sum to {tsum} bytes but host_bytes "
                                f"is {l.host_bytes}")
            if l.policy not in OFFLOADING_POLICIES and l.host_bytes != 0:
                raise PlanError(f"plan: layers[{i}].host_bytes is {l.host_bytes} but policy "
                                f"'{l.policy}' offloads nothing; only offload_input and "
                                "offload_saved may")
            if l.moe_chunks < 1:
                raise PlanError(f"plan: layers[{i}].moe_chunks is {l.moe_chunks}; it must be at "
                                "least 1")
            if l.policy in OFFLOADING_POLICIES and not (i <= l.prefetch_after_layer < n
                                                        or l.prefetch_after_layer == -1):
                raise PlanError(f"plan: layers[{i}].prefetch_after_layer is "
                                f"{l.prefetch_after_layer}; allowed: -1 (restore on demand) or "
                                f"a layer from {i} to {n - 1}")
            host_total += l.host_bytes
        if self.runtime.prefetch_distance < 1:
            raise PlanError(f"plan: runtime.prefetch_distance is {self.runtime.prefetch_distance}"
                            "; it must be at least 1")
        if self.runtime.copy_chunk_bytes <= 0:
            raise PlanError("plan: runtime.copy_chunk_bytes is 0; it must be positive")
        if self.runtime.host_arena_bytes < host_total:
            raise PlanError(f"plan: runtime.host_arena_bytes is {self.runtime.host_arena_bytes} "
                            f"but the layers offload {host_total} bytes in all; the arena must "
                            "hold them")

    @property
    def offloads(self) -> bool:
        return any(l.policy in OFFLOADING_POLICIES for l in self.layers)

    def policies(self) -> list[str]:
        return [l.policy for l in self.layers]

    def table(self) -> str:
        """A readable per-layer table."""
        rows = [f"{'layer':>5} {'type':<16} {'policy':<14} {'device MiB':>10} {'host MiB':>9} "
                f"{'prefetch@':>9}"]
        for l in self.layers:
            pf = "" if l.prefetch_after_layer < 0 else str(l.prefetch_after_layer)
            rows.append(f"{l.index:>5} {l.type[:16]:<16} {l.policy:<14} "
                        f"{l.device_saved_bytes / 2**20:>10.1f} {l.host_bytes / 2**20:>9.1f} "
                        f"{pf:>9}")
        p = self.predicted
        rows.append(f"predicted: peak {p.peak_device_bytes / 2**30:.3f} GiB "
                    f"(fixed {p.fixed_device_bytes / 2**30:.3f} GiB), host "
                    f"{p.host_bytes_per_gpu / 2**30:.3f} GiB, step {p.step_seconds * 1e3:.1f} ms")
        return "\n".join(rows)


_MISSING = object()


def _get(obj: dict, path: str, key: str, kind: type, default: Any = _MISSING) -> Any:
    if key not in obj:
        if default is _MISSING:
            raise PlanError(f"plan: missing field '{path}{key}'")
        return default
    value = obj[key]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        raise PlanError(f"plan: field '{path}{key}' has value {json.dumps(value)} of the wrong "
                        f"type (want {kind.__name__})")
    if kind is int and value < 0 and key not in ("prefetch_after_layer", "index"):
        raise PlanError(f"plan: field '{path}{key}' is {value}; it must not be negative")
    return value
