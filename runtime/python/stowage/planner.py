"""Builds a plan from the model itself when the user gives only a memory budget.

Three parts:
  profile_layers  runs each layer once, alone, on a sample input and measures what it saves for
                  backward (the bytes offload_saved would move, by the same rule the runtime
                  wrapper applies), its input and output sizes, its forward/backward times and,
                  on CUDA, its forward/backward peaks. The user's model is left as it was: no
                  .grad is touched (torch.autograd.grad) and the RNG state is restored.
  simulate        replays a step of a given per-layer policy assignment on three resources —
                  compute, the D2H copy engine, the H2D copy engine — following exactly what
                  stowage.layers does (saves retired kSaveLag layers later, prefetch at the plan's
                  distance), giving the step time, exposed copy time and the device peak.
  plan_for_budget picks per-layer policies by a greedy exchange: starting from keep-everything,
                  repeatedly take the change with the least added time per byte of peak saved,
                  until the predicted peak fits. If even the most frugal assignment does not fit,
                  BudgetTooSmallError says what the smallest reachable peak is and what binds.

Device-memory figures are bytes over the fixed memory (weights, gradients, the sample input), the
quantity torch_anchor.py measures. On CPU there is no allocator peak to read, so forward and
backward working sets are estimated from tensor sizes; the offload and recompute bookkeeping is
the same.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn as nn

from . import plan as plan_mod
from .layers import _storage_ptr, kSaveLag, offloadable, resident_storages
from .plan import LayerPlan, Plan, PlanError, Prediction, RunSettings, RuntimeSettings, Transfer


class BudgetTooSmallError(PlanError):
    """No per-layer assignment of policies fits the requested device budget."""


@dataclasses.dataclass
class LayerProfile:
    index: int
    type: str
    input_bytes: int
    output_bytes: int
    saved_bytes: int         # distinct non-parameter saved tensors: what offload_saved moves
    saves_input: bool        # the layer saves its own input (so saved_bytes includes it)
    forward_peak_bytes: int  # over memory before the forward (input already allocated)
    backward_peak_bytes: int  # over memory before the forward, during backward
    forward_seconds: float
    backward_seconds: float


@dataclasses.dataclass
class ModelProfile:
    layers: list[LayerProfile]
    device: str
    fixed_device_bytes: int
    loss_peak_bytes: int = 0
    loss_seconds: float = 0.0
    d2h_bytes_per_second: float = 10e9
    h2d_bytes_per_second: float = 10e9
    measured_memory: bool = False  # peaks measured by the CUDA allocator, not estimated
    tokens: int = 0  # rows of the sample input (all dimensions but the last)


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
            params = [p for p in layer.parameters() if p.requires_grad]
            param_storages = resident
            best_f = best_b = math.inf
            saved_bytes, saves_input = 0, False
            fwd_peak = bwd_peak = 0
            out_bytes = 0
            out: Optional[torch.Tensor] = None
            for _ in range(max(1, repeats)):
                seen: set = set()
                counted = [0]
                in_storage = _storage_ptr(x)
                found_input = [False]

                def pack(t: torch.Tensor) -> torch.Tensor:
                    if offloadable(t, device, param_storages):
                        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
                        if key not in seen:
                            seen.add(key)
                            counted[0] += t.numel() * t.element_size()
                        if _storage_ptr(t) == in_storage:
                            found_input[0] = True
                    return t

                out = None  # the previous repeat's graph must not count, nor stay allocated
                if cuda:
                    _sync(device)
                    before = torch.cuda.memory_allocated(device)
                    torch.cuda.reset_peak_memory_stats(device)
                t0 = time.perf_counter()
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    out = layer(x, *args, **kwargs)
                _sync(device)
                t1 = time.perf_counter()
                if not isinstance(out, torch.Tensor):
                    raise TypeError(f"layer {i} ({type(layer).__name__}) returned "
                                    f"{type(out).__name__}; stowage plans sequences of layers "
                                    "that pass one tensor along")
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
                saved_bytes, saves_input = counted[0], found_input[0]
                out_bytes = out.numel() * out.element_size()
                del grad_out
            assert out is not None
            out = out.detach()
            in_bytes = x.numel() * x.element_size()
            if not cuda:
                # Estimates: forward holds what it saves plus its output and one temporary of
                # that size; backward adds the output's gradient, the input's, one temporary.
                fwd_peak = saved_bytes - (in_bytes if saves_input else 0) + 2 * out_bytes
                bwd_peak = fwd_peak + out_bytes + in_bytes
            profiles.append(LayerProfile(
                index=i, type=type(layer).__name__, input_bytes=in_bytes, output_bytes=out_bytes,
                saved_bytes=saved_bytes, saves_input=saves_input,
                forward_peak_bytes=int(fwd_peak), backward_peak_bytes=int(bwd_peak),
                forward_seconds=best_f, backward_seconds=best_b))
            x = _no_grad_clone(out).requires_grad_(True)
            out = None
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
    fixed = sum(p.numel() * p.element_size() * (2 if p.requires_grad else 1)
                for layer in layers for p in layer.parameters())
    fixed += sample_input.numel() * sample_input.element_size()
    return ModelProfile(layers=profiles, device=str(device), fixed_device_bytes=fixed,
                        loss_peak_bytes=int(loss_peak), loss_seconds=loss_seconds,
                        d2h_bytes_per_second=d2h, h2d_bytes_per_second=h2d,
                        measured_memory=cuda,
                        tokens=sample_input.numel() // max(1, sample_input.shape[-1])
                        if sample_input.dim() else 1)


@dataclasses.dataclass
class Simulation:
    step_seconds: float
    exposed_copy_seconds: float
    peak_bytes: int  # over the fixed memory
    area_bytes: int  # sum of the memory at every point the peak is taken: a tie-breaker
    host_bytes: int
    device_saved: list[int]
    host: list[int]
    prefetch_after: list[int]


def _device_saved(p: LayerProfile, policy: str, first: bool) -> int:
    """Bytes layer p holds on the device from its forward to its backward (the sample input of
    layer 0 is fixed memory, not the layer's)."""
    if policy == plan_mod.KEEP:
        held = p.saved_bytes
        if first and p.saves_input:
            held -= p.input_bytes
        return held
    if policy in (plan_mod.RECOMPUTE, plan_mod.SELECTIVE_RECOMPUTE):
        return 0 if first else p.input_bytes
    return 0


def _host_bytes(p: LayerProfile, policy: str) -> int:
    if policy == plan_mod.OFFLOAD_SAVED:
        return p.saved_bytes
    if policy == plan_mod.OFFLOAD_INPUT:
        return p.input_bytes
    return 0


def simulate(profile: ModelProfile, policies: Sequence[str],
             prefetch_distance: int = 1) -> Simulation:
    """Replays one step of `policies` on compute, D2H and H2D (see the module docstring)."""
    lp = profile.layers
    n = len(lp)
    if len(policies) != n:
        raise PlanError(f"{len(policies)} policies for {n} layers")
    d2h_bw, h2d_bw = profile.d2h_bytes_per_second, profile.h2d_bytes_per_second
    dev = [_device_saved(p, pol, i == 0) for i, (p, pol) in enumerate(zip(lp, policies))]
    host = [_host_bytes(p, pol) for p, pol in zip(lp, policies)]
    offl = [pol in plan_mod.OFFLOADING_POLICIES for pol in policies]
    prefetch_after = [min(i + prefetch_distance, n - 1) if offl[i] else -1 for i in range(n)]
    ext_in = lp[0].input_bytes  # fixed memory

    t = 0.0
    stall = 0.0
    d2h_free = 0.0
    save_done = [0.0] * n
    held = 0  # sum of dev[k] for finished forwards
    peak = 0
    area = 0
    pending: list[tuple[int, float, int]] = []  # (layer, done time, device bytes it pins)
    for i, (p, pol) in enumerate(zip(lp, policies)):
        # retire: saves of layers <= i - kSaveLag are waited for on the stream
        for (k, done, _b) in pending:
            if k <= i - kSaveLag and done > t:
                stall += done - t
                t = done
        pending = [(k, d, b) for (k, d, b) in pending if d > t]
        pinned = sum(b for (_k, _d, b) in pending)
        x_in = 0 if i == 0 else p.input_bytes
        peak = max(peak, held + pinned + x_in + p.forward_peak_bytes)
        area += held + pinned + x_in + p.forward_peak_bytes
        if pol == plan_mod.OFFLOAD_INPUT:
            d2h_free = max(d2h_free, t) + host[i] / d2h_bw
            save_done[i] = d2h_free
        t += p.forward_seconds
        if pol == plan_mod.OFFLOAD_SAVED:
            d2h_free = max(d2h_free, t) + host[i] / d2h_bw
            save_done[i] = d2h_free
        if offl[i]:
            pinned_bytes = (p.input_bytes if pol == plan_mod.OFFLOAD_INPUT
                            else p.saved_bytes - (p.input_bytes if p.saves_input else 0))
            if i == 0 and pol == plan_mod.OFFLOAD_INPUT:
                pinned_bytes = 0
            pending.append((i, save_done[i], pinned_bytes))
        held += dev[i]
    # The output and the loss; the last layer's backward hook waits for every save.
    out = lp[-1].output_bytes
    pinned = sum(b for (_k, d, b) in pending if d > t)
    peak = max(peak, held + pinned + out + profile.loss_peak_bytes)
    t += profile.loss_seconds
    for (_k, done, _b) in pending:
        if done > t:
            stall += done - t
            t = done

    h2d_free = 0.0
    ready = [0.0] * n
    materialized = [0] * n  # prefetched bytes on the device before the layer's backward
    for j in range(n - 1, -1, -1):
        for k in range(n):
            if prefetch_after[k] == j:
                h2d_free = max(h2d_free, t) + host[k] / h2d_bw
                ready[k] = h2d_free
                materialized[k] = host[k]
        held -= dev[j]
        early = sum(materialized[k] for k in range(j))  # prefetched for layers still to come
        x_in = 0 if j == 0 else lp[j].input_bytes
        peak = max(peak, held + early + x_in + lp[j].backward_peak_bytes)
        area += held + early + x_in + lp[j].backward_peak_bytes
        if offl[j]:
            if prefetch_after[j] < 0 or ready[j] == 0.0:
                h2d_free = max(h2d_free, t) + host[j] / h2d_bw
                ready[j] = h2d_free
            if ready[j] > t:
                stall += ready[j] - t
                t = ready[j]
        materialized[j] = 0
        if policies[j] in (plan_mod.RECOMPUTE, plan_mod.OFFLOAD_INPUT,
                           plan_mod.SELECTIVE_RECOMPUTE):
            t += lp[j].forward_seconds
        t += lp[j].backward_seconds
    return Simulation(step_seconds=t, exposed_copy_seconds=stall, peak_bytes=int(peak),
                      area_bytes=int(area),
                      host_bytes=sum(host), device_saved=dev, host=host,
                      prefetch_after=prefetch_after)


_MOVES = {
    plan_mod.KEEP: (plan_mod.OFFLOAD_SAVED, plan_mod.RECOMPUTE, plan_mod.OFFLOAD_INPUT),
    plan_mod.OFFLOAD_SAVED: (plan_mod.RECOMPUTE, plan_mod.OFFLOAD_INPUT),
    plan_mod.RECOMPUTE: (plan_mod.OFFLOAD_INPUT,),
    plan_mod.OFFLOAD_INPUT: (),
}


def choose_policies(profile: ModelProfile, budget_bytes: int, *,
                    host_budget_bytes: Optional[int] = None,
                    prefetch_distance: int = 1) -> tuple[list[str], Simulation]:
    """The fastest assignment found that fits, else the one with the smallest peak.

    Candidates: a greedy exchange from keep-everything (each round takes the change with the
    least added time per byte of peak removed; when no single change lowers the peak, per byte
    of memory area removed, which is what lets a later change lower it), and the two-policy
    splits "layers below k use A, the rest B" for every k, A and B.
    """
    n = len(profile.layers)

    def sim_of(policies: list) -> Simulation:
        return simulate(profile, policies, prefetch_distance)

    def host_ok(s: Simulation) -> bool:
        return host_budget_bytes is None or s.host_bytes <= host_budget_bytes

    candidates: list[tuple[list[str], Simulation]] = []
    policies = [plan_mod.KEEP] * n
    sim = sim_of(policies)
    candidates.append((policies, sim))
    while sim.peak_bytes > budget_bytes:
        best: Optional[tuple[float, list[str], Simulation]] = None
        for i in range(n):
            for new in _MOVES[policies[i]]:
                cand = list(policies)
                cand[i] = new
                s = sim_of(cand)
                if not host_ok(s):
                    continue
                saved = sim.peak_bytes - s.peak_bytes
                area = sim.area_bytes - s.area_bytes
                if saved <= 0 and area <= 0:
                    continue
                gain = saved if saved > 0 else area * 1e-6
                cost = max(s.step_seconds - sim.step_seconds, 0.0) + 1e-12
                if best is None or cost / gain < best[0]:
                    best = (cost / gain, cand, s)
        if best is None:
            break
        _, policies, sim = best
        candidates.append((policies, sim))
    kinds = [plan_mod.KEEP, plan_mod.OFFLOAD_SAVED, plan_mod.RECOMPUTE, plan_mod.OFFLOAD_INPUT]
    for a in kinds:
        for b in kinds:
            for k in range(1, n + 1):
                if a == b and k < n:
                    continue
                cand = [a] * k + [b] * (n - k)
                candidates.append((cand, sim_of(cand)))
    fitting = [c for c in candidates if c[1].peak_bytes <= budget_bytes and host_ok(c[1])]
    if fitting:
        return min(fitting, key=lambda c: (c[1].step_seconds, c[1].peak_bytes))
    return min(candidates, key=lambda c: c[1].peak_bytes)


def plan_from_policies(profile: ModelProfile, policies: Sequence[str], *,
                       prefetch_distance: int = 1, budget_bytes: int = 0,
                       host_budget_bytes: int = 0, model: str = "",
                       copy_chunk_bytes: int = 16 << 20) -> Plan:
    """The plan.h JSON plan for a given per-layer policy assignment, with its prediction."""
    sim = simulate(profile, policies, prefetch_distance)
    keep = simulate(profile, [plan_mod.KEEP] * len(policies), prefetch_distance)
    layers = []
    for i, (p, pol) in enumerate(zip(profile.layers, policies)):
        host = sim.host[i]
        name = "input" if pol == plan_mod.OFFLOAD_INPUT else "saved"
        layers.append(LayerPlan(
            index=i, type=p.type, policy=pol, device_saved_bytes=sim.device_saved[i],
            host_bytes=host, transfers=[Transfer(name, host)] if host else [],
            prefetch_after_layer=sim.prefetch_after[i],
            forward_seconds=p.forward_seconds, backward_seconds=p.backward_seconds,
            recompute_seconds=p.forward_seconds if pol in (
                plan_mod.RECOMPUTE, plan_mod.OFFLOAD_INPUT) else 0.0,
            d2h_seconds=host / profile.d2h_bytes_per_second,
            h2d_seconds=host / profile.h2d_bytes_per_second))
    fixed = profile.fixed_device_bytes
    return Plan(
        layers=layers,
        predicted=Prediction(
            peak_device_bytes=fixed + sim.peak_bytes, fixed_device_bytes=fixed,
            host_bytes_per_gpu=sim.host_bytes, host_bytes_per_numa_node=sim.host_bytes,
            step_seconds=sim.step_seconds, exposed_copy_seconds=sim.exposed_copy_seconds,
            baseline="keep", baseline_step_seconds=keep.step_seconds),
        runtime=RuntimeSettings(prefetch_distance=prefetch_distance,
                                host_arena_bytes=sim.host_bytes,
                                copy_chunk_bytes=copy_chunk_bytes),
        run=RunSettings(seq_len=profile.tokens,
                        gpu_budget_bytes=fixed + budget_bytes if budget_bytes else 0,
                        host_budget_bytes=host_budget_bytes),
        model=model, hardware=profile.device,
        generator="stowage-python " + _package_version())


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB': sizes in messages readable at any scale."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _package_version() -> str:
    from . import __version__
    return __version__


def plan_for_budget(layers: Sequence[nn.Module], sample_input: torch.Tensor,
                    budget_bytes: int, *args: Any, host_budget_bytes: Optional[int] = None,
                    loss_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                    prefetch_distance: int = 1, profile: Optional[ModelProfile] = None,
                    **kwargs: Any) -> Plan:
    """A plan whose predicted activation peak (device bytes over weights and gradients) fits
    `budget_bytes`, at the least predicted step time the greedy finds.

    Raises BudgetTooSmallError naming the smallest peak any plan reaches and what binds.
    """
    if budget_bytes <= 0:
        raise BudgetTooSmallError(f"budget_bytes is {budget_bytes}; it must be positive")
    if prefetch_distance < 1:
        raise PlanError(f"prefetch_distance is {prefetch_distance}; it must be at least 1")
    if profile is None:
        profile = profile_layers(layers, sample_input, *args, loss_fn=loss_fn, **kwargs)
    if len(profile.layers) != len(list(layers)):
        raise PlanError(f"the profile has {len(profile.layers)} layers but the model has "
                        f"{len(list(layers))}")
    policies, sim = choose_policies(profile, budget_bytes, host_budget_bytes=host_budget_bytes,
                                    prefetch_distance=prefetch_distance)
    if sim.peak_bytes > budget_bytes:
        floor = simulate(profile, [plan_mod.OFFLOAD_INPUT] * len(profile.layers),
                         prefetch_distance)
        worst = max(profile.layers, key=lambda p: p.backward_peak_bytes)
        host_note = ""
        if host_budget_bytes is not None:
            host_note = (f"; host_budget_bytes {host_budget_bytes} allows offloading at most that "
                         "much")
        raise BudgetTooSmallError(
            f"budget_bytes is {budget_bytes} ({format_bytes(budget_bytes)}) but the smallest "
            f"peak any plan reaches for these layers is {floor.peak_bytes} "
            f"({format_bytes(floor.peak_bytes)}, every layer offload_input); what binds is "
            f"one layer's backward working set: layer {worst.index} ({worst.type}) needs "
            f"{format_bytes(worst.backward_peak_bytes)}{host_note}. Raise the budget or make "
            "the layers smaller (shorter sequence, micro-batch, more parallelism)")
    return plan_from_policies(profile, policies, prefetch_distance=prefetch_distance,
                              budget_bytes=budget_bytes,
                              host_budget_bytes=host_budget_bytes or 0,
                              model=f"{len(profile.layers)} x {profile.layers[0].type}")
