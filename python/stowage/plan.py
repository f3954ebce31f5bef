"""The plan (include/stowage/plan.h) as a thin typed view: dataclasses to read and write its
fields as JSON. Every rule a plan obeys lives in C++ (plan/plan_json.cc's reader and ValidatePlan):
Plan.from_json, Plan.load, Plan.from_dict and Plan.validate ask the runtime library through the C
ABI's stowage_plan_validate and raise PlanError with its message. So a plan this module accepts is
exactly one the runtime and the `stowage` CLI accept. Unknown fields are ignored when reading, as
plan.h promises.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Union

from ._lib import load as load_library

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
    # Note [MTP layers] in include/stowage/plan.h: "mtp.K" for multi-token-prediction depth K
    # (the plan's last run.mtp_layers layers), "" for a decoder layer.
    name: str = ""
    device_saved_bytes: int = 0
    host_bytes: int = 0
    transfers: list[Transfer] = dataclasses.field(default_factory=list)
    # Note [Runtime protocol] in include/stowage/plan.h: the forward of layer
    # save_wait_before_layer waits for this layer's saves (len(layers): backward start); its
    # prefetch is issued when the backward of prefetch_after_layer starts. -1: offloads nothing
    # (save_wait_before_layer -1 on an offloading layer: not given; the C++ reader fills it in
    # and the wrapper waits when backward starts).
    save_wait_before_layer: int = -1
    prefetch_after_layer: int = -1
    # Note [Pipeline stages] in include/stowage/plan.h: how many microbatches of this layer its
    # stage holds at once (the C++ InFlightMicrobatches; 1 without pipeline parallelism).
    in_flight_microbatches: int = 1
    ffn_chunks: int = 1
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
    unoverlapped_step_seconds: float = 0.0
    exposed_point_to_point_seconds: float = 0.0
    optimality: str = ""  # "proven", "within_gap", "unproven" (plan.h)
    optimality_gap: float = 0.0


@dataclasses.dataclass
class RuntimeSettings:
    prefetch_distance: int = 1
    save_lag: int = 2  # kDefaultSaveLag
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
    pp: int = 1
    vpp: int = 1
    schedule: str = "1f1b"
    microbatches: int = 1
    # Note [MTP layers]: multi-token-prediction depths trained, the last entries of layers.
    mtp_layers: int = 0
    # Megatron's --sequence-parallel under TP (plan.h Plan::sequence_parallel): written only when
    # False, as PlanToJson writes it; absent means True.
    sequence_parallel: bool = True
    # The job the plan was made for: its GPUs and its global batch (sequences per step); 0 where
    # the plan does not state them (plans written before these fields).
    gpus: int = 0
    global_batch: int = 0
    gpu_budget_bytes: int = 0
    host_budget_bytes: int = 0


@dataclasses.dataclass
class LayerRange:
    """One model chunk: layers first_layer .. first_layer + num_layers - 1."""
    first_layer: int
    num_layers: int


@dataclasses.dataclass
class StagePlan:
    """One pipeline stage (Note [Pipeline stages] in include/stowage/plan.h)."""
    stage: int
    chunks: list[LayerRange]
    prefetch_distance: int = 1
    embedding: bool = False
    lm_head: bool = False
    peak_device_bytes: int = 0
    fixed_device_bytes: int = 0
    host_bytes_per_gpu: int = 0
    host_arena_bytes: int = 0
    microbatch_seconds: float = 0.0
    exposed_copy_seconds: float = 0.0
    point_to_point_seconds: float = 0.0

    def layer_indices(self) -> list[int]:
        """The model indices of the layers this stage runs, in its forward order."""
        return [i for c in self.chunks for i in range(c.first_layer, c.first_layer + c.num_layers)]


@dataclasses.dataclass
class Binding:
    """Why a plan does not fit (Note [Plans that do not fit] in include/stowage/plan.h)."""
    budget: str  # "gpu" or "host"
    exceeded_by_bytes: int
    stage: int = 0
    at: str = ""
    what: str = ""
    explanation: str = ""


@dataclasses.dataclass
class Plan:
    layers: list[LayerPlan]
    predicted: Prediction = dataclasses.field(default_factory=Prediction)
    runtime: RuntimeSettings = dataclasses.field(default_factory=RuntimeSettings)
    run: RunSettings = dataclasses.field(default_factory=RunSettings)
    # One per pipeline stage; empty: the one stage of every layer (a plan without pipeline
    # parallelism, as plan.h's PlanStages reads it).
    stages: list[StagePlan] = dataclasses.field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    generator: str = "stowage-python"
    model: str = ""
    hardware: str = ""
    # False for the closest plan when nothing fits; the runtime refuses to load such a plan.
    fits: bool = True
    binding: "Binding | None" = None

    # -- serialization ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The plan.h JSON object, fields in the order PlanToJson writes them. Values are written
        as they are (no int() here): a field holding 1.5 or -1 is refused by validate(), not
        rounded."""
        layers = []
        for l in self.layers:
            d: dict[str, Any] = {
                "index": l.index, "type": l.type, **({"name": l.name} if l.name else {}),
                "policy": l.policy,
                "device_saved_bytes": l.device_saved_bytes, "host_bytes": l.host_bytes,
                "transfers": [{"name": t.name, "bytes": t.bytes} for t in l.transfers],
                **({"save_wait_before_layer": l.save_wait_before_layer}
                   if l.save_wait_before_layer >= 0 else {}),
                "prefetch_after_layer": l.prefetch_after_layer,
                "in_flight_microbatches": l.in_flight_microbatches, "ffn_chunks": l.ffn_chunks,
                "forward_seconds": l.forward_seconds, "backward_seconds": l.backward_seconds,
                "recompute_seconds": l.recompute_seconds, "d2h_seconds": l.d2h_seconds,
                "h2d_seconds": l.h2d_seconds,
            }
            if l.recompute_modules:
                d["recompute_modules"] = list(l.recompute_modules)
            layers.append(d)
        return {
            "schema_version": self.schema_version,
            "generator": self.generator,
            "model": self.model,
            "hardware": self.hardware,
            "run": {k: v for k, v in dataclasses.asdict(self.run).items()
                    if k != "sequence_parallel" or v is not True},
            "fits": self.fits,
            **({"binding": dataclasses.asdict(self.binding)}
               if not self.fits and self.binding is not None else {}),
            "predicted": dataclasses.asdict(self.predicted),
            "runtime": dataclasses.asdict(self.runtime),
            **({"stages": [dataclasses.asdict(st) for st in self.stages]} if self.stages else {}),
            "layers": layers,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def save(self, path: "Union[str, os.PathLike[str]]") -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json())

    @staticmethod
    def from_json(text: Union[str, bytes]) -> "Plan":
        """Reads plan JSON text (never a path: see load). The C++ reader and validator decide
        (through stowage_plan_validate); a plan they refuse raises PlanError with their message."""
        if isinstance(text, (bytes, bytearray)):
            try:
                text = bytes(text).decode("utf-8")
            except UnicodeDecodeError as e:
                raise PlanError(f"plan: not UTF-8 text ({e})") from e
        if not isinstance(text, str):
            raise TypeError(f"Plan.from_json takes JSON text (str or bytes), not "
                            f"{type(text).__name__}; use Plan.load for a file, Plan.from_dict "
                            "for a dict")
        validate_json(text)
        # Accepted by the C++ reader, so this parse only builds the view: it has nothing to refuse
        # (a leading BOM, which the C++ reader skips, is all that Python's json would trip on).
        try:
            obj = json.loads(text[1:] if text.startswith("\ufeff") else text)
        except (ValueError, RecursionError) as e:
            raise PlanError(f"plan: accepted by the C++ reader but not by Python's json ({e})") \
                from e
        return Plan._view(obj)

    @staticmethod
    def load(path: "Union[str, os.PathLike[str]]") -> "Plan":
        """Reads a plan file. Errors (PlanError) start with the file's path."""
        with open(path, "rb") as f:
            data = f.read()
        try:
            return Plan.from_json(data)
        except PlanError as e:
            raise PlanError(f"{os.fspath(path)}: {e}") from e

    @staticmethod
    def from_dict(obj: Any) -> "Plan":
        """A plan from a dict in the plan format (validated like from_json)."""
        try:
            text = json.dumps(obj)
        except (TypeError, ValueError) as e:
            raise PlanError(f"plan: not representable as JSON ({e})") from e
        return Plan.from_json(text)

    @staticmethod
    def _view(obj: dict) -> "Plan":
        """The dataclasses over a plan the C++ validator accepted. Absent and null optional fields
        take the defaults plan.h gives them, as the C++ reader does."""
        def get(d: dict, key: str, default: Any) -> Any:
            value = d.get(key)
            return default if value is None else value

        pred = obj["predicted"]
        rt = get(obj, "runtime", {})
        run = get(obj, "run", {})
        layers = []
        for l in obj["layers"]:
            host_bytes = l["host_bytes"]
            if "transfers" in l and l["transfers"] is not None:
                transfers = [Transfer(get(t, "name", ""), t["bytes"]) for t in l["transfers"]]
            else:
                # As plan_json.cc's reader: a layer without transfers copies its input as one piece.
                transfers = [Transfer("input", host_bytes)] if host_bytes > 0 else []
            layers.append(LayerPlan(
                index=l["index"], type=l["type"], name=get(l, "name", ""), policy=l["policy"],
                device_saved_bytes=l["device_saved_bytes"], host_bytes=host_bytes,
                transfers=transfers,
                save_wait_before_layer=get(l, "save_wait_before_layer", -1),
                prefetch_after_layer=get(l, "prefetch_after_layer", -1),
                in_flight_microbatches=get(l, "in_flight_microbatches", 1),
                ffn_chunks=get(l, "ffn_chunks", 1),
                recompute_modules=list(get(l, "recompute_modules", [])),
                **{k: float(get(l, k, 0.0)) for k in _LAYER_SECONDS}))
        # As the C++ reader: a stage without prefetch_distance has the runtime's.
        stage_defaults = {"prefetch_distance": get(rt, "prefetch_distance", 1)}
        stages = [StagePlan(
            stage=st["stage"],
            chunks=[LayerRange(c["first_layer"], c["num_layers"]) for c in st["chunks"]],
            **{f.name: (float if f.type in (float, "float") else _same)(
                get(st, f.name, stage_defaults.get(f.name, f.default)))
               for f in dataclasses.fields(StagePlan) if f.name not in ("stage", "chunks")})
            for st in get(obj, "stages", [])]
        return Plan(
            layers=layers, stages=stages,
            predicted=Prediction(**{
                f.name: (float if f.type in (float, "float") else _same)(
                    get(pred, f.name, f.default))
                for f in dataclasses.fields(Prediction)}),
            runtime=RuntimeSettings(**{
                f.name: (float if f.type in (float, "float") else _same)(
                    get(rt, f.name, f.default))
                for f in dataclasses.fields(RuntimeSettings)}),
            run=RunSettings(**{f.name: get(run, f.name, f.default)
                               for f in dataclasses.fields(RunSettings)}),
            schema_version=obj["schema_version"], generator=get(obj, "generator", ""),
            model=get(obj, "model", ""), hardware=get(obj, "hardware", ""),
            fits=get(obj, "fits", True),
            binding=(None if get(obj, "fits", True) else Binding(**{
                f.name: get(obj["binding"], f.name, f.default)
                for f in dataclasses.fields(Binding)})))

    # -- checks -----------------------------------------------------------------------------
    def validate(self) -> None:
        """Raises PlanError unless the C++ validator (stowage_plan_validate) accepts this plan."""
        validate_json(self.to_json())

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
            rows.append(f"{l.name or l.index:>5} {l.type[:16]:<16} {l.policy:<14} "
                        f"{l.device_saved_bytes / 2**20:>10.1f} {l.host_bytes / 2**20:>9.1f} "
                        f"{pf:>9}")
        p = self.predicted
        rows.append(f"predicted: peak {p.peak_device_bytes / 2**30:.3f} GiB "
                    f"(fixed {p.fixed_device_bytes / 2**30:.3f} GiB), host "
                    f"{p.host_bytes_per_gpu / 2**30:.3f} GiB, step {p.step_seconds * 1e3:.1f} ms")
        return "\n".join(rows)


_LAYER_SECONDS = ("forward_seconds", "backward_seconds", "recompute_seconds", "d2h_seconds",
                  "h2d_seconds")


def _same(value: Any) -> Any:
    return value


def validate_json(text: str) -> None:
    """Raises PlanError with the C++ reader's message unless it accepts `text` as a plan."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate: no UTF-8 spelling exists
        raise PlanError(f"plan: not valid UTF-8 text ({e})") from e
    lib = load_library()
    if lib.stowage_plan_validate(data, len(data)) != 0:
        message = lib.stowage_last_error().decode("utf-8", "replace")
        prefix = "stowage_plan_validate: "
        raise PlanError(message[len(prefix):] if message.startswith(prefix) else message)
