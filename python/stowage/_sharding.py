"""What the wrapper (stowage.layers) says of the data-parallel engines around the layers it runs:
which layers FSDP2 manages, and which orders of wrapping it refuses.

Note [FSDP2 and DDP]. Supported orders: FSDP2 inside, stowage outside -- `fully_shard` on each
decoder layer (then, if wanted, on the root model) before stowage.wrap / PlannedLayers; DDP
outside, stowage inside -- stowage.wrap on the layers, then DistributedDataParallel(model).
PlannedLayers calls each layer module as the model would, so FSDP2's own hooks run around it:
the pre-forward hook all-gathers the layer's parameters, the post-forward hook frees them again,
and the pre-backward hook (torch/distributed/fsdp/_fully_shard/_fsdp_state.py, `_pre_backward`,
registered on the layer's outputs) all-gathers them before the layer's backward. A recompute
(recompute, offload_input, selective_recompute) reruns the layer inside that backward: FSDP2's
`_pre_forward` sees TrainingState.PRE_BACKWARD and only makes sure the group is unsharded
(gathering it again if a previous post-backward resharded it), and `_post_forward` leaves the
parameters gathered for the backward that follows (torch 2.11). The parameters an FSDP2 layer's
ops save are views of the all-gather buffers, which FSDP2 frees after forward (storage resized
to 0) and gathers again before backward, not necessarily at the same address; an offload_saved layer
therefore reads the layer's resident memory during its own forward, once its parameters are
gathered, and never copies them: a copy would read memory FSDP2 frees under it, and the plan's
host_bytes count activations only. The other order is refused (PlannedLayers names the change):
a layer sharded after it was wrapped (the runtime chose its backend from where the parameters
were, and fully_shard moves them to the mesh's device), fully_shard on the PlannedLayers or on
the layers' ModuleList (neither is called when the model loops over its layers, so FSDP2's
hooks would never gather the parameters), and a DistributedDataParallel given as the layers
(DDP wraps the whole model, after the layers are planned). DDP needs nothing else: its Reducer
hooks the parameters' gradient accumulation, which recompute and offloading leave unchanged.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn as nn

_FSDP_MODULE: list = []  # [torch.distributed.fsdp.FSDPModule or None], imported on first use


def fsdp_module_class() -> Optional[type]:
    """FSDP2's FSDPModule (fully_shard turns a module's class into a subclass of it), or None on
    a torch without it (torch 1.x; there torch.distributed.fsdp may not even import)."""
    if not _FSDP_MODULE:
        try:
            from torch.distributed.fsdp import FSDPModule
        except (ImportError, ValueError, AttributeError, RuntimeError):
            FSDPModule = None
        _FSDP_MODULE.append(FSDPModule)
    return _FSDP_MODULE[0]


def is_fsdp(module: Any) -> bool:
    cls = fsdp_module_class()
    return cls is not None and isinstance(module, cls)


def fsdp_managed(layer: nn.Module) -> bool:
    """Whether FSDP2 moves this layer's parameters between shards and gathered buffers: the
    layer (or a submodule) went through fully_shard, or its parameters are DTensors (an
    enclosing module's fully_shard)."""
    if fsdp_module_class() is None:
        return False
    return (any(is_fsdp(m) for m in layer.modules())
            or any(hasattr(p, "_local_tensor") for p in layer.parameters()))


SHARD_FIRST = ("shard first, then plan: call fully_shard on each decoder layer (then on the root "
               "model if wanted), then stowage.wrap / PlannedLayers on the sharded layers "
               "(docs/python.md, \"FSDP2 and DDP\")")


def check_wrapping_order(layers: Any) -> None:
    """Note [FSDP2 and DDP]: refuses the layers PlannedLayers is given in an unsupported order
    (before it iterates them: a DistributedDataParallel is not a sequence)."""
    ddp = torch.nn.parallel.DistributedDataParallel
    if isinstance(layers, ddp) or (isinstance(layers, (nn.ModuleList, list, tuple))
                                   and any(isinstance(l, ddp) for l in layers)):
        raise TypeError(
            "PlannedLayers was given a DistributedDataParallel module; pass the model's decoder "
            "layers themselves (model.model.layers) to stowage.wrap / PlannedLayers first, then "
            "wrap the whole model: DistributedDataParallel(model)")
    if is_fsdp(layers):
        raise TypeError(
            f"fully_shard was applied to the layers' container ({type(layers).__name__}), which "
            "the model never calls (it loops over the layers), so FSDP2 would never gather their "
            f"parameters; {SHARD_FIRST}")


__all__ = ["SHARD_FIRST", "check_wrapping_order", "fsdp_managed", "fsdp_module_class", "is_fsdp"]
