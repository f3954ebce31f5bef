"""One rank of a Megatron-Core GPTModel trained under Megatron's own schedule
(get_forward_backward_func()) twice from the same weights and batches: unwrapped, and with
stowage.megatron.wrap(model, plan). Prints, as JSON on its last line, for each run and each
optimizer step whether the loss and every parameter gradient are bit-identical, and the bytes
each planned layer sent to the host (the runtime's trace) next to the plan's host_bytes.
test_megatron_wrap.py and test_megatron_parallel.py run it in subprocesses (it patches torch.cuda
for its process: measure/megatron_layers.py patch_for_cpu), one per rank:

    megatron_worker.py SPEC_JSON RANK WORLD STORE_DIR

SPEC keys: cuda (run on GPU `rank`, NCCL, no CPU patches), bf16, moe, mtp (bools), policies (one per
plan layer, or one for all), modules ({layer: [names]} for selective_recompute), tp, sp (sequence
parallelism: the norms are SequenceParallelNorm), ep, dispatcher (the MoE token dispatcher,
default allgather), pad (moe_pad_expert_input_to_capacity, capacity factor 1), pp, vpp, layers,
microbatches, steps, plan (the plan to run, as it is; without it the plan is measured: plan_for),
one_stage_plan (a one-stage plan the misuse runs split into pp stages), runs (a list of specs run
one after another in this process, each over the keys above), emit_plan, misuse (a name from
MISUSES: run that mistake and report its error instead).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "measure"))
sys.path.insert(0, os.path.join(HERE, ".."))  # package.test_microbatches: plans split in stages
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "python"))

from megatron_layers import patch_for_cpu  # noqa: E402
from mcore.cases import WORKER_SHAPE as SHAPE  # noqa: E402

SEQ, VOCAB, HIDDEN = SHAPE["seq"], SHAPE["vocab"], SHAPE["hidden"]
MISUSES = ("megatron_recompute", "outside_step", "other_model", "more_microbatches",
           "other_stage", "other_schedule", "unknown_module", "planned_with_sp")


def config(spec: dict):
    from megatron.core.transformer.transformer_config import TransformerConfig
    kw = dict(num_layers=spec.get("layers", 2), hidden_size=HIDDEN,
              num_attention_heads=SHAPE["heads"], num_query_groups=SHAPE["kv_heads"],
              ffn_hidden_size=SHAPE["ffn"], gated_linear_unit=True,
              activation_func=torch.nn.functional.silu, normalization="RMSNorm",
              add_bias_linear=False, hidden_dropout=0.0,
              attention_dropout=0.0, gradient_accumulation_fusion=False,
              bias_activation_fusion=True, apply_rope_fusion=False, masked_softmax_fusion=False,
              params_dtype=torch.bfloat16 if spec.get("bf16") else torch.float32,
              bf16=bool(spec.get("bf16")), use_cpu_initialization=not spec.get("cuda"),
              tensor_model_parallel_size=spec.get("tp", 1),
              sequence_parallel=spec.get("sp", False),
              pipeline_model_parallel_size=spec.get("pp", 1),
              pipeline_dtype=torch.bfloat16 if spec.get("bf16") else torch.float32)
    if spec.get("vpp", 1) > 1:
        kw["virtual_pipeline_model_parallel_size"] = spec["vpp"]
    if spec.get("moe"):
        kw.update(num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
                  moe_token_dispatcher_type=spec.get("dispatcher", "allgather"),
                  moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
                  expert_model_parallel_size=spec.get("ep", 1))
        if spec.get("pad"):  # each expert's input padded to its capacity (where it pads)
            kw.update(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
    if spec.get("mtp"):
        kw.update(mtp_num_layers=1, mtp_loss_scaling_factor=0.1)
    if spec.get("misuse") == "megatron_recompute":
        kw.update(recompute_granularity="selective", recompute_modules=["core_attn"])
    return TransformerConfig(**kw)


class SequenceParallelNorm(torch.nn.RMSNorm):
    """An RMSNorm that runs under sequence parallelism, as TransformerEngine's and apex's norms do
    and Megatron-Core 0.16.1's local spec norm does not (transformer/torch_norm.py WrappedTorchNorm
    asserts `not config.sequence_parallel`): each rank normalizes its own sequence shard, and the
    weight is marked `sequence_parallel`, the attribute distributed/finalize_model_grads.py reads
    to all-reduce its gradient over the tensor-parallel group."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused):
        super().__init__(hidden_size, eps=eps)
        setattr(self.weight, "sequence_parallel", config.sequence_parallel)


def sequence_parallel_spec(layer_spec, cfg, vp_stage):
    """The local layer spec with its norms (and the block's final norm) SequenceParallelNorm."""
    import copy

    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.transformer_block import (TransformerBlockSubmodules,
                                                             get_num_layers_to_build)
    layer_spec = copy.deepcopy(layer_spec)
    for name in ("input_layernorm", "pre_mlp_layernorm"):
        if getattr(layer_spec.submodules, name) is not IdentityOp:
            setattr(layer_spec.submodules, name, SequenceParallelNorm)
    n = get_num_layers_to_build(cfg, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[layer_spec] * n,
                                      layer_norm=SequenceParallelNorm)


def build(spec: dict) -> list:
    """This rank's model chunks, the same weights on every call (seeded)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(1234)
    cfg = config(spec)
    layer_spec = get_gpt_layer_local_spec(num_experts=4 if spec.get("moe") else None,
                                          normalization="RMSNorm")
    mtp_spec = None
    if spec.get("mtp"):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec
        mtp_spec = get_gpt_mtp_block_spec(cfg, layer_spec, use_transformer_engine=False)
    vpp = spec.get("vpp", 1)
    chunks = []
    for v in range(vpp):
        kw = {}
        if vpp > 1:
            kw["vp_stage"] = v
        pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=v)
        post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=v)
        block_spec = (sequence_parallel_spec(layer_spec, cfg, v if vpp > 1 else None)
                      if spec.get("sp") else layer_spec)
        chunks.append(GPTModel(cfg, block_spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                               pre_process=pre, post_process=post, position_embedding_type="rope",
                               mtp_block_spec=mtp_spec if post else None, **kw))
    return chunks


def batches(n: int, device: str = "cpu") -> list:
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (1, SEQ), generator=g)
        b = dict(input_ids=ids, position_ids=torch.arange(SEQ)[None],
                 attention_mask=torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1)[None, None],
                 labels=torch.roll(ids, -1, 1))
        out.append({k: v.to(device) for k, v in b.items()})
    return out


class CudaToCpu(torch.overrides.TorchFunctionMode):
    """Megatron-Core 0.16.1's schedules make a few tensors on "cuda" themselves
    (pipeline_parallel/schedules.py forward_backward_no_pipelining: total_num_tokens =
    torch.zeros(..., device="cuda"); the p2p buffers with torch.cuda.current_device()): on this CPU
    run those factories and .cuda() calls make CPU tensors. What the layers compute is untouched."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        dev = kwargs.get("device")
        if dev is not None and str(dev).startswith("cuda"):
            kwargs["device"] = "cpu"
        if getattr(func, "__name__", "") == "cuda":
            return args[0]
        if getattr(func, "__name__", "") == "to" and args[1:] and str(args[1]).startswith("cuda"):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def run_step(chunks: list, data: list, spec: dict) -> list:
    """One optimizer step's forwards and backwards under Megatron's schedule; the losses."""
    from megatron.core.pipeline_parallel import get_forward_backward_func
    losses = []

    def forward_step(iterator, model):
        b = next(iterator)
        out = model(**b)

        def loss_func(output):
            loss = output.float().mean()
            losses.append(loss.detach().clone())
            return loss, {"loss": loss.detach()}
        return out, loss_func

    vpp = len(chunks)
    iters = [iter(data) for _ in range(vpp)] if vpp > 1 else iter(data)
    with contextlib.nullcontext() if spec.get("cuda") else CudaToCpu():
        get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iters,
            model=chunks if vpp > 1 else chunks[0], num_microbatches=len(data), seq_length=SEQ,
            micro_batch_size=1, forward_only=False)
    return losses


def saved_bytes(chunks: list, data: list, step) -> int:
    """Bytes of the storages autograd saves outside checkpoints and offloading hooks in the first
    microbatch's forward, when it ends (their own hooks are innermost): what recompute and
    selective recompute drop shows here. Every microbatch runs, as a step of the plan does."""
    saved: dict = {}  # storage address when saved -> the tensor; its size read at the end

    def pack(t):
        saved.setdefault(t.untyped_storage().data_ptr(), t)
        return t
    if len(chunks) > 1 or not chunks[0].pre_process or not chunks[0].post_process:
        return -1
    with step:
        for k, batch in enumerate(data):
            with torch.autograd.graph.saved_tensors_hooks(pack if k == 0 else (lambda t: t),
                                                          lambda t: t):
                out = chunks[0](**batch)
            if k == 0:  # what the forward left saved (an activation's output may be discarded)
                total = sum(t.untyped_storage().nbytes() for t in saved.values())
            out.float().mean().backward()
    for p in chunks[0].parameters():
        p.grad = None
    return total


def grads(chunks: list) -> dict:
    return {f"{c}.{n}": p.grad.clone() for c, m in enumerate(chunks)
            for n, p in m.named_parameters() if p.grad is not None}


def stages_1f1b(base, pp: int, microbatches: int, shift: int = 0):
    """`base` split into pp stages of equal runs of layers under 1F1B, as Megatron splits them
    (with `shift`, stage 0 takes that many layers of stage 1: a plan for another layout). Each
    layer's in-flight count is the most its stage holds (stowage.pipeline_order) and its
    protocol fields are the validator's (package/test_microbatches.py pipelined, for stages of
    several layers)."""
    import copy

    import stowage
    from stowage import plan as plan_mod
    plan = copy.deepcopy(base)
    n = len(plan.layers) // pp
    plan.run.pp, plan.run.vpp, plan.run.schedule = pp, 1, "1f1b"
    plan.run.microbatches = microbatches
    plan.run.global_batch = 0  # the planned job's batch no longer holds: not stated
    plan.stages, arena = [], 0
    for s in range(pp):
        held = most = 0
        for op in stowage.pipeline_order("1f1b", pp, 1, microbatches, s):
            held += 1 if op.forward else -1
            most = max(most, held)
        first = s * n + (shift if s else 0)
        count = n + (shift if s == 0 else -shift if s == 1 else 0)
        host = 0
        for layer in plan.layers[first:first + count]:
            layer.in_flight_microbatches = most
            if layer.host_bytes:  # plan/validate.cc LayerProtocolFor, within the stage's chunk
                layer.save_wait_before_layer = min(layer.index + plan.runtime.save_lag,
                                                   first + count)
                layer.prefetch_after_layer = min(layer.index + plan.runtime.prefetch_distance,
                                                 first + count - 1)
            host += layer.host_bytes * most
        plan.stages.append(plan_mod.StagePlan(
            stage=s, chunks=[plan_mod.LayerRange(first, count)], embedding=s == 0,
            prefetch_distance=plan.runtime.prefetch_distance,
            lm_head=s == pp - 1, host_bytes_per_gpu=host, host_arena_bytes=host))
        arena = max(arena, host)
    plan.runtime.host_arena_bytes = arena
    plan.predicted.host_bytes_per_gpu = arena
    plan.predicted.host_bytes_per_numa_node = 0
    return plan


def plan_for(chunks: list, spec: dict, data: list, result: dict):
    """spec's plan, or the plan of its policies from stowage.megatron.profile of the model as
    built: one stage, or (pp > 1) every stage's chunks measured on its rank and gathered over the
    pipeline group; the C++ planner's evaluation of them for the step's microbatches."""
    import stowage
    import stowage.megatron as sm
    if "plan" in spec:  # given as it is (a `stowage plan --from-megatron` plan)
        return stowage.Plan.from_dict(spec["plan"])
    profile = sm.profile(chunks if len(chunks) > 1 else chunks[0], data[0])
    result["profile"] = {"loss_peak_bytes": profile.loss_peak_bytes,
                         "loss_seconds": profile.loss_seconds,
                         "pipeline": profile.pipeline.to_dict() if profile.pipeline else None}
    n = len(profile.layers)
    policies = spec["policies"]
    policies = policies * n if len(policies) == 1 else policies
    modules = {int(k): v for k, v in spec.get("modules", {}).items()}
    measured_modules = {i: names for i, names in modules.items()
                        if all(x in {mm.name for mm in profile.layers[i].modules} for x in names)}
    plan = stowage.evaluate(profile, [("keep" if i in modules and i not in measured_modules
                                       else p) for i, p in enumerate(policies)],
                            recompute_modules=measured_modules,
                            microbatches=spec.get("microbatches", 1)).plan
    for i, names in modules.items():
        if i not in measured_modules:  # Megatron's own words: the planner's profile lists children
            plan.layers[i].policy = "selective_recompute"
            plan.layers[i].recompute_modules = list(names)
    if spec.get("mtp"):
        plan.run.mtp_layers = 1
        plan.layers[-1].name = "mtp.0"
    if torch.distributed.get_world_size() > 1:  # one plan for every rank: rank 0's (its times)
        shared = [plan.to_dict()]
        torch.distributed.broadcast_object_list(shared, src=0)
        plan = stowage.Plan.from_dict(shared[0])
    return plan


def one_run(spec: dict, rank: int) -> dict:
    """One plan (or one misuse): the unwrapped and the wrapped model side by side."""
    import stowage
    import stowage.megatron as sm
    steps, m = spec.get("steps", 3), spec.get("microbatches", 1)
    data = [batches(m, "cuda" if spec.get("cuda") else "cpu") for _ in range(steps)]
    result: dict = {"rank": rank}
    ref = build(spec)
    misuse = spec.get("misuse")
    made_for = dict(spec, misuse=None)
    if misuse == "other_model":  # a plan measured on a model one layer deeper
        made_for["layers"] = spec.get("layers", 2) + 1
    plan = plan_for(build(made_for), made_for, data[0], result)
    if rank == 0 and spec.get("emit_plan"):
        result["plan"] = plan.to_dict()
    if misuse == "other_stage":  # stage 0 given one layer more than Megatron gives it
        plan = stages_1f1b(stowage.Plan.from_dict(spec["one_stage_plan"]), spec["pp"], m,
                           shift=1)
    if misuse == "other_schedule":  # a 1F1B plan for interleaved chunks
        plan = stages_1f1b(stowage.Plan.from_dict(spec["one_stage_plan"]), spec["pp"], m)
    if misuse == "planned_with_sp":  # the planner's plan for TP 2 with SP (its run.tp is 2)
        plan.run.tp, plan.run.sequence_parallel = 2, True
    if misuse == "unknown_module":
        plan.layers[0].policy, plan.layers[0].host_bytes = "selective_recompute", 0
        plan.layers[0].transfers, plan.layers[0].recompute_modules = [], ["core_attention"]
        plan.layers[0].save_wait_before_layer = plan.layers[0].prefetch_after_layer = -1
    mine = build(spec)
    try:
        planned = sm.wrap(mine if len(mine) > 1 else mine[0], plan)
        if misuse == "outside_step":
            run_step(mine, data[0], spec)
        if misuse == "more_microbatches":
            with planned.step():
                run_step(mine, data[0] + data[0][:1], spec)
    except Exception as e:  # noqa: BLE001
        result["error"] = f"{type(e).__name__}: {e}"
        return result
    if misuse is not None:
        result["error"] = None
        return result
    rt = planned.runtime
    if rt is not None:
        rt.set_trace_capacity(1 << 16)
    opt_ref = torch.optim.SGD([p for c in ref for p in c.parameters()], lr=0.1)
    opt_mine = torch.optim.SGD([p for c in mine for p in c.parameters()], lr=0.1)
    result["steps"] = []
    for s in range(steps):
        opt_ref.zero_grad(set_to_none=True)
        opt_mine.zero_grad(set_to_none=True)
        want = run_step(ref, data[s], spec)
        try:
            with planned.step():
                got = run_step(mine, data[s], spec)
        except Exception as e:  # noqa: BLE001  (a plan the layers do not fit: its message)
            result["error"] = f"{type(e).__name__}: {e}"
            planned.unwrap()
            planned.close()
            return result
        g_ref, g_mine = grads(ref), grads(mine)
        sent: dict = {}
        if rt is not None:
            for e in rt.trace().events:
                if e.kind == "save_issued":
                    key = f"{e.layer}.{e.microbatch}"
                    sent[key] = sent.get(key, 0) + e.bytes
        result["steps"].append({
            "losses": len(want), "loss_equal": len(want) == len(got) and all(
                torch.equal(a, b) for a, b in zip(want, got)),
            "grads": len(g_ref), "grad_names_equal": sorted(g_ref) == sorted(g_mine),
            "grads_unequal": [n for n in g_ref if n not in g_mine
                              or not torch.equal(g_ref[n], g_mine[n])],
            "sent": sent})
        opt_ref.step()
        opt_mine.step()
    result["saved_bytes"] = [saved_bytes(ref, data[0], contextlib.nullcontext()),
                             saved_bytes(mine, data[0], planned.step())]
    result["host_bytes"] = [l.host_bytes for l in plan.layers]
    result["in_flight"] = [l.in_flight_microbatches for l in plan.layers]
    result["stages"] = [[[c.first_layer, c.num_layers] for c in st.chunks] for st in plan.stages]
    result["run"] = [plan.run.pp, plan.run.vpp, plan.run.schedule, plan.run.microbatches]
    result["microbatches"] = m
    result["mine"] = sorted(u.index for u in planned.units)
    result["policies"] = plan.policies()
    result["state_dict_keys_equal"] = [sorted(a.state_dict()) == sorted(b.state_dict())
                                       for a, b in zip(ref, mine)]
    if len(ref) == 1 and ref[0].pre_process and ref[0].post_process:  # evaluation, no step
        with torch.no_grad():
            result["eval_equal"] = torch.equal(ref[0](**data[0][0]), mine[0](**data[0][0]))
    planned.unwrap()
    planned.close()
    return result


def main() -> int:
    warnings.filterwarnings("ignore")
    spec = json.loads(sys.argv[1])
    rank, world, store_dir = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    cuda = bool(spec.get("cuda"))
    if cuda:
        torch.cuda.set_device(rank)
    else:
        patch_for_cpu()
        # The pipeline schedules' p2p_communication.py _communicate synchronizes the device after
        # its batch_isend_irecv: nothing to wait for on CPU, where gloo's waits have returned.
        torch.cuda.synchronize = lambda *a, **k: None
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    dist.init_process_group("nccl" if cuda else "gloo",
                            store=dist.FileStore(os.path.join(store_dir, "store"), world),
                            rank=rank, world_size=world)
    vpp = spec.get("vpp", 1)
    ps.initialize_model_parallel(spec.get("tp", 1), spec.get("pp", 1),
                                 virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
                                 expert_model_parallel_size=spec.get("ep", 1))
    out = [one_run(dict(spec, **r), rank) for r in spec.get("runs", [{}])]
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
