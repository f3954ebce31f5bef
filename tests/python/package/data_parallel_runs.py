"""Two ranks training a small transformers Llama under FSDP2 (fully_shard) or
DistributedDataParallel, with and without stowage, for test_fsdp2.py, test_ddp.py and their GPU
variant (test_fsdp2_gpu.py). Not a suite itself: run() is what torch.multiprocessing spawns on
each rank; it returns, per rank, what differed from the run without stowage (nothing, when the
wrapper is right), the bytes the runtime sent to the host per plan, and the messages of the
refused wrapping orders (Note [FSDP2 and DDP] in python/stowage/_sharding.py).

Every rank starts from the same weights (seed 0) and trains on its own token ids, so the
gradients are averaged (DDP) or reduce-scattered (FSDP2) over ranks that disagree. Loss and every
parameter's full gradient (FSDP2: DTensor.full_tensor()) are compared bit for bit after each of
STEPS optimizer steps.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Callable, Optional

import support

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM
except (ImportError, ValueError):
    # Debian's torch 1.13: no fully_shard, no transformers; under Python 3.11 its
    # torch.distributed.fsdp does not even import (a dataclass with a mutable default).
    fully_shard = None

import plans
import stowage

LAYERS, SEQ, STEPS, VOCAB = 4, 16, 3, 64
# (name, policies, recompute_modules of the selective_recompute layers)
PLANS = [
    ("keep", ["keep"] * LAYERS, ()),
    ("recompute", ["recompute"] * LAYERS, ()),
    ("selective_recompute", ["selective_recompute"] * LAYERS, ("mlp",)),
    ("offload_input", ["offload_input"] * LAYERS, ()),
    ("offload_saved", ["offload_saved"] * LAYERS, ()),
    ("mixed", ["offload_input", "offload_saved", "selective_recompute", "recompute"], ("mlp",)),
]
AVAILABLE = fully_shard is not None


def _config() -> "LlamaConfig":
    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                       num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, use_cache=False, tie_word_embeddings=False,
                       attn_implementation="eager")


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return LlamaForCausalLM(_config()).to(device).train()


def _plan(device: torch.device, ids: torch.Tensor, policies: list,
          modules: tuple) -> "stowage.Plan":
    """The plan for the unsharded layers: host_bytes are what they save, exactly, so a parameter
    offloaded by mistake overruns it (PlanError) as well as the byte count checked below."""
    model = _model(device)
    hidden, args, kwargs = support.first_layer_inputs(model, ids)
    return plans.plan_for(model.model.layers, hidden, policies, *args,
                          recompute_modules=modules, **kwargs)


def _full(grad: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    if grad is None:
        return None
    if hasattr(grad, "full_tensor"):
        return grad.full_tensor()  # collective: every rank gathers, in parameter order
    return grad.detach().clone()


def _train(model: nn.Module, ids: torch.Tensor, planned: Any = None) -> list:
    """STEPS SGD steps; per step (loss, [(name, full gradient)])."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    out = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        if planned is None:
            loss = model(input_ids=ids[step], labels=ids[step]).loss
            loss.backward()
        else:
            with planned.step():
                loss = model(input_ids=ids[step], labels=ids[step]).loss
                loss.backward()
        out.append((loss.detach().clone(),
                    [(n, _full(p.grad)) for n, p in model.named_parameters()]))
        opt.step()
    return out


def _differences(want: list, got: list) -> list:
    out = []
    for step, ((l0, g0), (l1, g1)) in enumerate(zip(want, got)):
        if not torch.equal(l0, l1):
            out.append(f"loss differs at step {step}: {l0.item()!r} != {l1.item()!r}")
        if [n for n, _ in g0] != [n for n, _ in g1]:
            out.append(f"parameter names differ: {[n for n, _ in g0]} != {[n for n, _ in g1]}")
            continue
        for (name, a, b) in ((n, a, b) for (n, a), (_, b) in zip(g0, g1)):
            if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
                out.append(f"gradient of {name} differs at step {step}")
    return out


def _fsdp_shard(model: nn.Module, root: bool = True) -> None:
    for layer in model.model.layers:
        fully_shard(layer)
    if root:
        fully_shard(model)


def _wrap(model: nn.Module, plan: "stowage.Plan") -> "stowage.PlannedLayers":
    planned = stowage.PlannedLayers(model.model.layers, plan)
    model.model.layers = planned
    return planned


def _refusal(fn: Callable[[], Any]) -> str:
    """The message of the error fn raises ('' if it raises none)."""
    try:
        fn()
    except (TypeError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return ""


def _fsdp_refusals(device: torch.device, ids: torch.Tensor, keep: "stowage.Plan") -> dict:
    def shard_after_wrap() -> None:
        model = _model(device)
        planned = _wrap(model, keep)
        for layer in planned.layers:
            fully_shard(layer)
        model(input_ids=ids[0], labels=ids[0]).loss.backward()

    def shard_the_planned_layers() -> None:
        model = _model(device)
        planned = _wrap(model, keep)
        fully_shard(planned)
        model(input_ids=ids[0], labels=ids[0]).loss.backward()

    def shard_the_container() -> None:
        # torch itself refuses fully_shard on a ModuleList (it has no forward); a Sequential has
        layers = nn.Sequential(*_model(device).model.layers)
        fully_shard(layers)
        stowage.PlannedLayers(layers, keep)

    return {"shard_after_wrap": _refusal(shard_after_wrap),
            "shard_the_planned_layers": _refusal(shard_the_planned_layers),
            "shard_the_container": _refusal(shard_the_container)}


def _ddp_refusals(device: torch.device, keep: "stowage.Plan") -> dict:
    ddp = torch.nn.parallel.DistributedDataParallel
    ids = [device.index] if device.type == "cuda" else None

    def wrap_the_ddp_model() -> None:
        stowage.PlannedLayers(ddp(_model(device), device_ids=ids), keep)

    def wrap_ddp_layers() -> None:
        model = _model(device)
        stowage.PlannedLayers([ddp(l, device_ids=ids) for l in model.model.layers], keep)

    return {"wrap_the_ddp_model": _refusal(wrap_the_ddp_model),
            "wrap_ddp_layers": _refusal(wrap_ddp_layers)}


def _run_engine(engine: str, device: torch.device, ids: torch.Tensor) -> dict:
    """Trains without stowage, then under every plan, under `engine` ("fsdp2" or "ddp"):
    {differences: {plan: [...]}, d2h: {plan: (sent, planned)}, refusals: {case: message}}."""
    result: dict = {"differences": {}, "d2h": {}}

    def engine_model(plan: Optional["stowage.Plan"], root_after_wrap: bool = False) -> tuple:
        model = _model(device)
        planned = None
        if engine == "fsdp2":
            _fsdp_shard(model, root=not root_after_wrap)
            if plan is not None:
                planned = _wrap(model, plan)
            if root_after_wrap:
                fully_shard(model)
            return model, planned
        if plan is not None:
            planned = _wrap(model, plan)
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
        return ddp, planned

    reference, _ = engine_model(None)
    want = _train(reference, ids)
    cases = [(name, policies, modules, False) for name, policies, modules in PLANS]
    if engine == "fsdp2":  # the root sharded after the layers were wrapped works as well
        cases.append(("mixed, root sharded after wrap", PLANS[-1][1], PLANS[-1][2], True))
    keep = None
    for name, policies, modules, root_after_wrap in cases:
        plan = _plan(device, ids[0], policies, modules)
        stowage.agree(plan)  # every rank made the same plan
        keep = plan if name == "keep" else keep
        model, planned = engine_model(plan, root_after_wrap)
        got = _train(model, ids, planned)
        result["differences"][name] = _differences(want, got)
        stats = planned.stats()
        if stats is not None:
            result["d2h"][name] = (stats.d2h_bytes_total, STEPS * plan.runtime.host_arena_bytes)
        planned.close()
    result["refusals"] = (_fsdp_refusals(device, ids, keep) if engine == "fsdp2"
                          else _ddp_refusals(device, keep))
    return result


def run(rank: int, port: int, out: Any, engines: tuple, device_type: str, world: int) -> None:
    """One rank: puts {"rank": rank, engine: _run_engine's result for each of `engines`} on
    `out`."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", rank=rank,
                            world_size=world)
    try:
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
        ids = torch.randint(0, VOCAB, (STEPS, 1, SEQ), generator=gen).to(device)
        result = {"rank": rank}
        for engine in engines:
            result[engine] = _run_engine(engine, device, ids)
        out.put(result)
    finally:
        dist.destroy_process_group()


def spawn(engines: tuple, device_type: str = "cpu", world: int = 2) -> list:
    """Runs run() on `world` ranks; their results, by rank."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.get_context("spawn").SimpleQueue()
    mp.spawn(run, args=(port, out, tuple(engines), device_type, world), nprocs=world)
    return sorted((out.get() for _ in range(world)), key=lambda r: r["rank"])
