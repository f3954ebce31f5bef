"""stowage for PyTorch: run a model's layers under a stowage plan (keep, recompute, offload the
layer input, offload the saved tensors), driving the runtime library libstowage.so through its C
ABI with ctypes — nothing is compiled against torch, so one build serves any torch version.

    import stowage
    planned = stowage.wrap(model.layers, gpu_budget_bytes=60 << 30, sample_input=x)  # or plan=
    for batch in data:
        with planned.step():
            loss = loss_fn(planned(embed(batch)))
            loss.backward()
        optimizer.step()

Ranks of a distributed job check they hold one plan with stowage.agree(plan) (torch.distributed).
The plan and runtime bindings (stowage.Plan, stowage.Runtime) do not need torch; the wrapper
(stowage.wrap, stowage.PlannedLayers), the profiler (stowage.profile_layers) and the planner
calls (stowage.plan_for_budget, stowage.evaluate: the C++ planner through the C ABI) import it.

The package's layers, each importing only those before it:
  _lib, plan, runtime, agree   the C ABI through ctypes and the plan's typed view; no torch
  _tensors                     what the wrapper and the profiler both say of a tensor
  _sharding                    which layers FSDP2 manages; the wrapping orders refused
  layers                       the torch wrapper: PlannedLayers runs layers under a plan
  measure                      measurements that write the layer profile the planner reads:
                               measure.profile (torch layers; `python -m stowage.measure.profile`)
                               and measure.hf_profile (a transformers model on fake tensors)
  planner                      the C++ planner's plans for a measured profile; wrap
  megatron                     Megatron-Core's layers under a plan: stowage.megatron.profile,
                               stowage.megatron.wrap (docs/megatron.md)
"""

from __future__ import annotations

import importlib
from typing import Any

from ._lib import AbiMismatchError, LibraryNotFoundError
from .plan import LayerPlan, Plan, PlanError, Transfer
from .runtime import (PipelineOp, Runtime, Stats, StowageError, Trace, TraceEvent, pipeline_order,
                      plan_hash, version)
from .agree import PlanAgreementError, agree


_TORCH_NAMES = {
    "PlannedLayers": "layers", "StaleTensorError": "layers", "check_plan_matches": "layers",
    "BudgetTooSmallError": "planner", "Evaluation": "planner", "evaluate": "planner",
    "plan_for_budget": "planner", "plan_request": "planner", "wrap": "planner",
    "ModelProfile": "measure.layer_profile", "LayerProfile": "measure.layer_profile",
    "profile_layers": "measure.profile",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        # The version exists once, in the build (CMake's project(VERSION) -> stowage/version.h):
        # read from the runtime library this package drives, not a second literal here.
        return version()
    if name == "megatron":  # the submodule, loaded on first use like the others
        return importlib.import_module(".megatron", __name__)
    # Torch-dependent parts load on first use so `import stowage` works without torch.
    module = _TORCH_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'stowage' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = ["AbiMismatchError", "LayerPlan", "LibraryNotFoundError", "PipelineOp", "Plan",
           "PlanAgreementError", "PlanError", "Runtime", "Stats", "StowageError", "Trace",
           "TraceEvent", "Transfer", "agree", "pipeline_order", "plan_hash", "version",
           "__version__", *_TORCH_NAMES]
