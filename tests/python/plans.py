"""Plans for the wrapper's tests, written by hand from what the layers really save.

The wrapper needs from a plan only the policy of each layer, the host bytes it may offload and
when its prefetch is issued; tests that exercise the wrapper itself (not the planner) build such
plans here, measuring each layer once with the wrapper's own rule for what an offload_saved layer
sends to the host (stowage.layers.offloadable and saved_key), so host_bytes are exact.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn as nn

import support  # noqa: F401  (puts the package on sys.path)
import stowage
from stowage import layers as stowage_layers
from stowage import plan as plan_mod


def _first_tensor(out: Any) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out[0]


def measure(layers: Sequence[nn.Module], x: torch.Tensor, *args: Any,
            **kwargs: Any) -> list[tuple[int, int]]:
    """(input bytes, offloadable saved bytes) of each layer on the activations `x` produces."""
    resident = stowage_layers.ResidentMemory(nn.ModuleList(list(layers)))
    out = []
    x = x.detach().requires_grad_(x.requires_grad)
    for layer in layers:
        seen: dict = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if stowage_layers.offloadable(t, x.device, resident):
                seen[stowage_layers.saved_key(t)] = stowage_layers.offload_nbytes(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = _first_tensor(layer(x, *args, **kwargs))
        out.append((x.numel() * x.element_size(), sum(seen.values())))
        x = y.detach().requires_grad_(True)
    return out


def plan_for(layers: Sequence[nn.Module], x: torch.Tensor, policies: Sequence[str], *args: Any,
             prefetch_distance: int = 1, recompute_modules: Sequence[str] = (),
             **kwargs: Any) -> stowage.Plan:
    """A plan running layer i under policies[i], each offloading layer prefetched when the
    backward of the layer `prefetch_distance` later starts (the last layer's, at most)."""
    sizes = measure(layers, x, *args, **kwargs)
    last = len(policies) - 1
    out = []
    for i, (policy, (input_bytes, saved_bytes)) in enumerate(zip(policies, sizes)):
        host = {plan_mod.OFFLOAD_INPUT: input_bytes,
                plan_mod.OFFLOAD_SAVED: saved_bytes}.get(policy, 0)
        offloads = policy in plan_mod.OFFLOADING_POLICIES
        out.append(stowage.LayerPlan(
            index=i, type=type(layers[i]).__name__, policy=policy, host_bytes=host,
            transfers=[stowage.Transfer("input" if policy == plan_mod.OFFLOAD_INPUT else "saved",
                                        host)] if host else [],
            prefetch_after_layer=min(i + prefetch_distance, last) if offloads else -1,
            recompute_modules=list(recompute_modules)
            if policy == plan_mod.SELECTIVE_RECOMPUTE else []))
    return stowage.Plan(layers=out, runtime=plan_mod.RuntimeSettings(
        prefetch_distance=prefetch_distance, host_arena_bytes=sum(l.host_bytes for l in out)))
