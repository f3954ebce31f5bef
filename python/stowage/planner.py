"""Plans and predictions from the one C++ planner, through the C ABI (stowage_plan_request,
stowage_plan_evaluate). Python measures (stowage.measure.profile.profile_layers), C++ plans: there
is no planning arithmetic here, only the request and the answer.

  plan_for_budget  the fastest plan whose predicted peak fits `gpu_budget_bytes` — the whole
                   device memory a step may peak at, fixed memory (weights, gradients, the sample
                   input) included, the same meaning as `stowage plan --gpu-mem`. Raises
                   BudgetTooSmallError, naming the smallest peak any plan reaches and what binds,
                   when none fits.
  evaluate         the simulator's prediction for a given per-layer assignment (peak, step time,
                   exposed copy time, host bytes, the recorded intervals) and the plan of it.
  wrap             layers under a given plan, or under plan_for_budget's plan (PlannedLayers).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
from typing import Any, Callable, Optional, Sequence, Union

import torch
import torch.nn as nn

from ._lib import load as load_library
from .layers import PlannedLayers
from .measure.layer_profile import ModelProfile
from .measure.profile import profile_layers
from .plan import Plan, PlanError
from .runtime import PlanLike, StowageError

_RESOURCE_EXHAUSTED = 4


class BudgetTooSmallError(PlanError):
    """No per-layer assignment of policies fits the requested device budget (the C++ planner's
    "does not fit" answer; the message names the smallest reachable peak and what binds).
    `closest` is the closest plan (`fits` False, `binding` saying by how much and where), as
    `stowage plan` prints it; None only when some layer has no option at all."""

    def __init__(self, message: str, closest: Optional[Plan] = None) -> None:
        super().__init__(message)
        self.closest = closest


@dataclasses.dataclass
class Evaluation:
    """stowage_plan_evaluate's answer: the simulator's replay of one assignment."""

    peak_device_bytes: int  # fixed memory included
    fixed_device_bytes: int
    peak_at: str
    step_seconds: float
    exposed_copy_seconds: float
    host_bytes: int
    compute: list[dict]   # {"phase", "layer", "start", "end", "stall"}, in order
    copies: list[dict]    # {"layer", "direction": "d2h"|"h2d", "bytes", "start", "end"}
    timeline: list[dict]  # {"seconds", "bytes"}
    plan: Plan
    # The step's predicted events in order (README "Step trace"): {"kind", "layer", "bytes",
    # "seconds"}, what the runtime's trace (Runtime.trace()) shows when the plan runs.
    events: list[dict] = dataclasses.field(default_factory=list)
    # A pipelined profile: each stage's {"stage", "peak_device_bytes", "fixed_device_bytes",
    # "host_bytes", "microbatch_seconds"}; the fields above are then the binding stage's (the
    # highest peak), step_seconds the pipeline's. Empty for one stage.
    stages: list[dict] = dataclasses.field(default_factory=list)


def _call(name: str, request: dict) -> str:
    lib = load_library()
    text = json.dumps(request).encode()
    out = ctypes.c_void_p()
    code = getattr(lib, name)(text, len(text), ctypes.byref(out))
    if code != 0:
        message = lib.stowage_last_error().decode("utf-8", "replace")
        if code == _RESOURCE_EXHAUSTED and name == "stowage_plan_request":
            closest = None
            if out.value:  # the closest plan ("fits": false), freed here like any answer
                try:
                    closest = Plan.from_json(ctypes.string_at(out.value).decode())
                finally:
                    lib.stowage_free_string(out)
            raise BudgetTooSmallError(message, closest)
        raise StowageError(name, code, message)
    try:
        return ctypes.string_at(out.value).decode()
    finally:
        lib.stowage_free_string(out)


def _source(profile: Union[ModelProfile, dict]) -> dict:
    return profile.to_dict() if isinstance(profile, ModelProfile) else profile


def _layer_entries(policies: Sequence[str],
                   recompute_modules: Optional[dict[int, Sequence[str]]]) -> list[dict]:
    entries = []
    for i, policy in enumerate(policies):
        entry: dict[str, Any] = {"policy": policy}
        if recompute_modules and i in recompute_modules:
            entry["recompute_modules"] = list(recompute_modules[i])
        entries.append(entry)
    return entries


def evaluate(profile: Union[ModelProfile, dict], policies: Sequence[str], *,
             prefetch_distance: int = 1,
             recompute_modules: Optional[dict[int, Sequence[str]]] = None,
             gpu_budget_bytes: Optional[int] = None, model: Optional[str] = None,
             microbatches: Optional[int] = None) -> Evaluation:
    """The C++ simulator's prediction for `policies` (one per layer; `recompute_modules[i]`
    names the modules of a selective_recompute layer i), and the plan of that assignment.
    `microbatches`: per optimizer step (gradient accumulation, or the pipeline schedule's of a
    pipelined profile; None: one, or the profile's pp stages)."""
    request: dict[str, Any] = {"profile": _source(profile),
                               "layers": _layer_entries(policies, recompute_modules),
                               "prefetch_distance": prefetch_distance}
    if microbatches is not None:
        request["microbatches"] = microbatches
    if gpu_budget_bytes is not None:
        request["gpu_budget_bytes"] = gpu_budget_bytes
    if model is not None:
        request["model_label"] = model
    r = json.loads(_call("stowage_plan_evaluate", request))
    return Evaluation(
        peak_device_bytes=r["peak_device_bytes"], fixed_device_bytes=r["fixed_device_bytes"],
        peak_at=r["peak_at"], step_seconds=r["step_seconds"],
        exposed_copy_seconds=r["exposed_copy_seconds"], host_bytes=r["host_bytes"],
        compute=r["compute"], copies=r["copies"], timeline=r["timeline"],
        plan=Plan.from_dict(r["plan"]), events=r["events"], stages=r.get("stages", []))


def plan_request(profile: Union[ModelProfile, dict], gpu_budget_bytes: int, *,
                 host_budget_bytes: Optional[int] = None, force: Optional[str] = None,
                 prefetch_distance: Optional[int] = None, model: Optional[str] = None,
                 microbatches: Optional[int] = None) -> Plan:
    """The C++ planner's fastest plan for a measured profile within the budgets (a pipelined
    profile: every stage planned, the plan's `stages` each stage's; `microbatches` as for
    evaluate)."""
    request: dict[str, Any] = {"profile": _source(profile), "gpu_budget_bytes": gpu_budget_bytes}
    if microbatches is not None:
        request["microbatches"] = microbatches
    if host_budget_bytes is not None:
        request["host_budget_bytes"] = host_budget_bytes
    if force is not None:
        request["force"] = force
    if prefetch_distance is not None:
        request["prefetch_distance"] = prefetch_distance
    if model is not None:
        request["model_label"] = model
    return Plan.from_json(_call("stowage_plan_request", request))


def plan_for_budget(layers: Sequence[nn.Module], sample_input: torch.Tensor,
                    gpu_budget_bytes: int, *args: Any, host_budget_bytes: Optional[int] = None,
                    loss_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                    prefetch_distance: Optional[int] = None,
                    profile: Optional[ModelProfile] = None, force: Optional[str] = None,
                    **kwargs: Any) -> Plan:
    """A plan whose predicted peak device memory (fixed memory included) fits
    `gpu_budget_bytes`, at the least predicted step time: the layers are profiled (unless
    `profile` is given) and the C++ planner chooses. `prefetch_distance` None lets it choose.

    Raises BudgetTooSmallError naming the smallest peak any plan reaches and what binds.
    """
    if profile is None:
        profile = profile_layers(layers, sample_input, *args, loss_fn=loss_fn, **kwargs)
    if len(profile.layers) != len(list(layers)):
        raise PlanError(f"the profile has {len(profile.layers)} layers but the model has "
                        f"{len(list(layers))}")
    return plan_request(profile, gpu_budget_bytes, host_budget_bytes=host_budget_bytes,
                        force=force, prefetch_distance=prefetch_distance)


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
        plan_kwargs = {k: kwargs.pop(k) for k in list(kwargs)
                       if k in ("host_budget_bytes", "loss_fn", "prefetch_distance", "profile",
                                "force")}
        plan = plan_for_budget(layers, sample_input, gpu_budget_bytes, **plan_kwargs)
    return PlannedLayers(layers, plan, **kwargs)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB': sizes in messages readable at any scale."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


__all__ = ["BudgetTooSmallError", "Evaluation", "evaluate", "format_bytes", "plan_for_budget",
           "plan_request", "wrap"]
