"""Megatron-Core's layers under a stowage plan: the runtime inside a Megatron-Core training job.

    profile = stowage.megatron.profile(model, batch)          # the model's own layers
    plan = stowage.evaluate(profile, policies).plan           # or plan_request(...), a file
    planned = stowage.megatron.wrap(model, plan)              # model: a GPTModel or its VPP chunks
    for batch in data:
        with planned.step():                                  # one optimizer step
            forward_backward_func(forward_step_func=..., model=model, num_microbatches=M, ...)
        optimizer.step()

What is planned: each `TransformerLayer` of the decoder, in Megatron's global order (its
`layer_number`), then each `MultiTokenPredictionLayer` of the MTP block (the plan's last
run.mtp_layers entries, Note [MTP layers] in include/stowage/plan.h). wrap() gives each of those
modules an instance `forward` that runs the class's own forward under the layer's policy through
stowage.layers.PlannedLayers; nothing else of the model changes: parameter names, state_dict keys,
hooks and Megatron's calling convention (keyword `hidden_states`, `(hidden_states, context)`
returned, `rotary_pos_emb`, `packed_seq_params`, `sequence_len_offset`, ...) are as they were.
`planned.unwrap()` removes the instance forwards.

Note [Megatron microbatches]. Megatron's schedules (get_forward_backward_func(): no pipelining,
1F1B, interleaved) call each model chunk's forward once per microbatch, in microbatch order per
chunk, and never interleave two forwards. So the k-th forward of a chunk within one
`planned.step()` is microbatch k: when a chunk's first planned layer starts a forward, the wrapper
enters microbatch k (stowage.layers Note [Microbatches in the wrapper]) and every tensor that
forward saves carries k, whatever order the schedule runs the backwards in. A schedule that runs
more forwards of a chunk than the plan's run.microbatches is refused at that forward; a step that
ran fewer is refused at its end; a pipeline or chunk layout other than the plan's (run.pp,
run.vpp, the stage's chunks) is refused by wrap(). Restores are keyed by (layer, microbatch), so
no schedule can restore one microbatch's tensor into another's backward.

Note [Megatron recompute names]. selective_recompute's recompute_modules may use Megatron's own
words (TransformerConfig.recompute_modules) or the planner's, each meaning submodules of the
layer (RECOMPUTE_PATHS), or any submodule path of the layer (what stowage.megatron.profile
measures: the layer's children). `moe_act` and `ffn_act` are the expert MLPs' and the dense
MLP's activation: Megatron's MLP calls its fused activation (megatron/core/transformer/mlp.py,
bias_swiglu_impl and the others, config.bias_activation_fusion) as a function of the module, so
while the layer's forward runs those functions are replaced by ones that, called from an MLP of
that scope, run the original under Megatron's own CheckpointWithoutOutput and discard its output
once linear_fc2 has used it: checkpointing the activation alone would keep its input and drop
nothing, since the fused function saves only that input; what goes is the output linear_fc2
keeps, recomputed when fc2's backward needs it, as Megatron's moe_act recompute does.

Note [Routed bytes under expert parallelism]. offload_saved reserves each layer's host_bytes per
microbatch, and the wrapper refuses a layer that saves more. A MoE layer's experts save tensors
sized by the tokens routed to them; without expert parallelism every expert is this rank's, so
their sum is tokens x top-k whatever the routing, but under expert parallelism (dropless:
Megatron-Core's default) this rank's experts get a share that changes with every batch. wrap()
refuses offload_saved on such a layer up front, naming what fixes the count (each expert's input
padded to its capacity, which the alltoall dispatcher and the flex one's HybridEP backend do:
each local expert then receives capacity x ep x tp tokens) and the policies whose bytes do not
depend on routing (offload_input: the layer input).

Note [Megatron pipelined profiles]. Under pipeline parallelism no rank holds the whole model, so
profile() is a collective over Megatron's pipeline group: each rank measures the layers of its
own chunks (a chunk that does not start the model gets a hidden state of the shape the schedules
send, through set_input_tensor, for the one no-grad forward that captures what its first layer
is called with), then every rank gathers every stage's layers and fixed bytes. The profile's
layers are the whole model's in Megatron's order (plan layer i = layer_number i + 1, the MTP
layers last); its `pipeline` says which layers each stage's chunks hold (virtual stage
v = c x pp + s is chunk c of stage s, each starting where the one before ends) and what each
stage holds throughout (its chunks' parameters: the embedding on the first, the output layer on
the last). The planner then plans every stage with its own layers, fixed bytes and in-flight
microbatches (docs/profile-format.md "pipeline"). Under TP every TP rank gathers its own shards'
profile; make the plan from one of them and give it to every rank (docs/megatron.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import torch
import torch.nn as nn

from .agree import agree
from .layers import PlannedLayers, checkpointed_submodules
from .measure.layer_profile import (
    TORCH_CUBLAS_WORKSPACES_BYTES, ModelProfile, PipelineProfile, StageProfile)
from .measure.profile import profile_layers
from .plan import OFFLOAD_SAVED, SELECTIVE_RECOMPUTE, Plan, PlanError
from .runtime import PlanLike, Runtime, plan_json_text

# Megatron's recompute words (TransformerConfig.recompute_modules) and the planner's
# (planner/frameworks/megatron.cc AddModule) as submodule paths of a TransformerLayer; the paths
# a layer does not have are skipped, and a name none of whose paths exist is an error.
RECOMPUTE_PATHS: dict[str, tuple[str, ...]] = {
    "core_attn": ("self_attention.core_attention",),
    "attn_core": ("self_attention.core_attention",),
    "layernorm": ("input_layernorm", "pre_mlp_layernorm"),
    "mla_up_proj": ("self_attention.linear_q_up_proj", "self_attention.linear_kv_up_proj"),
    "mlp": ("mlp",),
    "moe": ("mlp",),
    "shared_experts": ("mlp.shared_experts",),
}
# Activations (Note [Megatron recompute names]): the MLPs whose activation is rerun.
ACTIVATION_SCOPES: dict[str, str] = {"moe_act": "mlp.experts", "ffn_act": "mlp"}
_FUSED_ACTIVATIONS = ("bias_swiglu_impl", "weighted_bias_swiglu_impl", "bias_geglu_impl",
                      "bias_gelu_impl", "weighted_bias_quick_geglu_impl")

# Megatron's own recompute and offload settings: each would act on the same layers.
_REFUSED_SETTINGS = (
    ("recompute_granularity", None, "--recompute-granularity"),
    ("recompute_method", None, "--recompute-method"),
    ("recompute_num_layers", None, "--recompute-num-layers"),
    ("cpu_offloading", False, "--cpu-offloading"),
    ("fine_grained_activation_offloading", False, "--fine-grained-activation-offloading"),
)


def _unwrap_chunk(chunk: nn.Module) -> nn.Module:
    """The GPTModel inside Megatron's wrappers (DistributedDataParallel, Float16Module: each
    keeps it as `.module`)."""
    seen = 0
    while not hasattr(chunk, "decoder") and hasattr(chunk, "module") and seen < 8:
        chunk = chunk.module
        seen += 1
    if not hasattr(chunk, "decoder"):
        raise TypeError(f"stowage.megatron: {type(chunk).__name__} is not a Megatron-Core "
                        "GPTModel (no .decoder, nor a .module wrapping one); pass the model or "
                        "the list of model chunks get_model() returned")
    return chunk


def _chunks(model: Union[nn.Module, Sequence[nn.Module]]) -> list[nn.Module]:
    chunks = list(model) if isinstance(model, (list, tuple, nn.ModuleList)) else [model]
    if not chunks:
        raise TypeError("stowage.megatron: an empty list of model chunks")
    return [_unwrap_chunk(c) for c in chunks]


def check_megatron_settings(chunks: Sequence[nn.Module]) -> None:
    """Refuses a model on which Megatron's own recompute or CPU offloading is on: both would act
    on the layers the plan runs. The message names the setting and its flag."""
    for chunk in chunks:
        config = chunk.config
        for field, off, flag in _REFUSED_SETTINGS:
            value = getattr(config, field, off)
            if value != off and value is not None and value is not False:
                raise PlanError(
                    f"stowage.megatron: the model's TransformerConfig.{field} is {value!r} "
                    f"({flag}); the plan decides what each layer recomputes or offloads, so set "
                    f"{field}={off!r} (drop {flag}) when wrapping a model with stowage")


@dataclasses.dataclass
class _Unit:
    """One planned layer of this rank: a decoder TransformerLayer or an MTP layer."""
    index: int  # in the plan
    chunk: int  # the model chunk (virtual stage) of this rank that holds it
    layer: nn.Module
    mtp: bool


def _units(chunks: Sequence[nn.Module], decoder_layers: int) -> list[_Unit]:
    """This rank's planned layers, each with its index in the plan: a decoder layer's is its
    global layer_number - 1; the MTP layer of depth d is decoder_layers + d."""
    units = []
    for c, chunk in enumerate(chunks):
        for layer in chunk.decoder.layers:
            units.append(_Unit(layer.layer_number - 1, c, layer, False))
        mtp = getattr(chunk, "mtp", None)
        if mtp is not None and getattr(chunk, "mtp_process", True):
            for d, layer in enumerate(mtp.layers):
                depth = getattr(layer, "layer_number", d + 1) - 1
                units.append(_Unit(decoder_layers + depth, c, layer, True))
    return units


class _LayerCall(nn.Module):
    """A planned layer as PlannedLayers calls it, `call(x, *args, **kwargs)`: the class's own
    forward on the layer with `x` as its hidden_states. Its children are the layer's (the same
    modules), so submodule paths and parameters are the layer's; it is never a child of the
    model."""

    def __init__(self, layer: nn.Module, forward: Callable, keyword: bool):
        super().__init__()
        self.__dict__["layer"] = layer
        self.__dict__["_forward"] = forward
        self.__dict__["_keyword"] = keyword
        for name, child in layer.named_children():
            self.add_module(name, child)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self._keyword:
            return self._forward(self.layer, *args, hidden_states=x, **kwargs)
        return self._forward(self.layer, x, *args, **kwargs)


def _call_of(u: _Unit) -> _LayerCall:
    """The _LayerCall of a planned layer, its class named as the layer's (what the plan's and
    the wrapper's messages show)."""
    cls = type(u.layer)
    named = type(cls.__name__, (_LayerCall,), {"__qualname__": f"_LayerCall[{cls.__name__}]"})
    return named(u.layer, cls.forward, keyword=u.mtp)


class _Absent(nn.Module):
    """A layer of the plan that another pipeline stage runs."""

    def __init__(self, index: int):
        super().__init__()
        self.index = index

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"stowage.megatron: layer {self.index} of the plan belongs to another "
                           "pipeline stage")


def _total_layers(chunks: Sequence[nn.Module]) -> int:
    return int(chunks[0].config.num_layers)


def _mtp_depths(chunks: Sequence[nn.Module]) -> int:
    return int(getattr(chunks[0].config, "mtp_num_layers", None) or 0)


def _parallel() -> tuple[int, int, int]:
    """(pipeline stages, this rank's stage, tensor-parallel size) from Megatron's parallel_state;
    one stage when it is not initialized."""
    from megatron.core import parallel_state as ps
    if not ps.model_parallel_is_initialized():
        return 1, 0, 1
    return (ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank(),
            ps.get_tensor_model_parallel_world_size())


def _check_layout(plan: Plan, units: Sequence[_Unit], chunks: Sequence[nn.Module],
                  pp: int, stage: int, tp: int) -> None:
    """The plan was made for this model and this rank's pipeline stage and chunks."""
    total = _total_layers(chunks) + _mtp_depths(chunks)
    if len(plan.layers) != total:
        raise PlanError(
            f"stowage.megatron: the plan has {len(plan.layers)} layers but the model has "
            f"{_total_layers(chunks)} decoder layers (num_layers) and {_mtp_depths(chunks)} MTP "
            f"layers (mtp_num_layers); make the plan for this model (its layers in Megatron's "
            "order, the MTP layers last)")
    if plan.run.mtp_layers and plan.run.mtp_layers != _mtp_depths(chunks):
        raise PlanError(f"stowage.megatron: the plan's run.mtp_layers is {plan.run.mtp_layers} "
                        f"but the model's mtp_num_layers is {_mtp_depths(chunks)}")
    if plan.run.tp > 1 and plan.run.tp != tp:  # a measured profile's plan says 1: the rank's
        raise PlanError(
            f"stowage.megatron: the plan's run.tp is {plan.run.tp} but Megatron runs tensor "
            f"parallelism {tp} (parallel_state): its host_bytes are another shard's; make the "
            "plan for this layout")
    # Note [Sequence parallelism] (planner/frameworks/megatron.cc): under TP the layer inputs are
    # a TP rank's shard of the sequence with it, the whole sequence without.
    sp = bool(getattr(chunks[0].config, "sequence_parallel", False))
    if plan.run.tp > 1 and tp > 1 and plan.run.sequence_parallel != sp:
        raise PlanError(
            f"stowage.megatron: the plan's run.sequence_parallel is "
            f"{str(plan.run.sequence_parallel).lower()} but Megatron runs TP {tp} "
            f"{'with' if sp else 'without'} sequence parallelism "
            "(TransformerConfig.sequence_parallel): its layer inputs are "
            f"{'a TP shard of the' if sp else 'the whole'} sequence, not what the plan's "
            "host_bytes count; make the plan "
            + ("without --no-sequence-parallel" if sp else "with --no-sequence-parallel"))
    if plan.run.pp != pp:
        raise PlanError(
            f"stowage.megatron: the plan's run.pp is {plan.run.pp} but Megatron runs {pp} "
            "pipeline stages (parallel_state); make the plan for this pipeline layout")
    if pp > 1 and plan.run.vpp != len(chunks):
        raise PlanError(
            f"stowage.megatron: the plan's run.vpp is {plan.run.vpp} but this rank holds "
            f"{len(chunks)} model chunks; make the plan for this virtual pipeline layout")
    if plan.stages:
        mine = next((s for s in plan.stages if s.stage == stage), None)
        want = mine.layer_indices() if mine is not None else []
        have = [u.index for u in units if not u.mtp]
        if want and [i for i in want if i < _total_layers(chunks)] != have:
            raise PlanError(
                f"stowage.megatron: pipeline stage {stage} runs decoder layers {have} (layer_number"
                f" - 1) but the plan's stages[{stage}] gives it layers {want}; the plan was made "
                "for another layout (pipeline_model_parallel_size, virtual stages, "
                "num_layers_in_first/last_pipeline_stage)")
    for u in units:
        lp = plan.layers[u.index]
        if lp.name.startswith("mtp.") != u.mtp and lp.name:
            raise PlanError(f"stowage.megatron: plan layer {u.index} is {lp.name!r} but the "
                            f"model's layer there is a {type(u.layer).__name__}")


class MegatronLayers(PlannedLayers):
    """The plan's layers of one rank of a Megatron-Core model: PlannedLayers over the rank's
    TransformerLayers (and MTP layers), the other stages' layers absent. Made by wrap()."""

    def __init__(self, chunks: Sequence[nn.Module], plan: Plan, units: Sequence[_Unit],
                 stage: int, pp: int, **runtime_options: Any):
        calls: list[nn.Module] = [_Absent(i) for i in range(len(plan.layers))]
        for u in units:
            calls[u.index] = _call_of(u)
        if plan.offloads and pp > 1:
            runtime_options.setdefault("stage", stage)
        super().__init__(calls, plan, **runtime_options)
        self.__dict__["chunks"] = list(chunks)
        self.__dict__["units"] = list(units)
        self._first_of_chunk = {}
        for u in units:
            self._first_of_chunk.setdefault(u.chunk, u.index)
        self._forwards: dict[int, int] = {}
        self._wrapped = False

    # -- the layers' forwards -----------------------------------------------------------------
    def install(self) -> None:
        for u in self.units:
            u.layer.forward = self._router(u)
        self._wrapped = True

    def unwrap(self) -> None:
        """Gives the layers back their class's forward."""
        for u in self.units:
            u.layer.__dict__.pop("forward", None)
        self._wrapped = False

    def _router(self, u: _Unit) -> Callable:
        signature = inspect.signature(type(u.layer).forward) if u.mtp else None

        def forward(*args: Any, **kwargs: Any) -> Any:
            if signature is not None:  # MTP: every argument by name
                bound = signature.bind(u.layer, *args, **kwargs)
                kwargs = {k: v for k, v in bound.arguments.items() if k != "self"}
                kwargs.update(kwargs.pop("kwargs", {}))
                args = ()
                x = kwargs.pop("hidden_states")
            elif "hidden_states" in kwargs:
                x = kwargs.pop("hidden_states")
            else:
                x, args = args[0], args[1:]
            return self._layer_forward(u, x, args, kwargs)
        return forward

    def _layer_forward(self, u: _Unit, x: torch.Tensor, args: tuple, kwargs: dict) -> Any:
        if torch.is_grad_enabled():
            state = self._state
            if state is None:
                raise RuntimeError(
                    f"stowage.megatron: layer {u.index} ({type(u.layer).__name__}) ran a training "
                    "forward outside `with planned.step():`; run Megatron's "
                    "forward_backward_func (every microbatch of the optimizer step) inside it, "
                    "or the forward under torch.no_grad() for evaluation")
            if self._first_of_chunk[u.chunk] == u.index:
                k = self._forwards.get(u.chunk, 0)
                if k >= self.plan.run.microbatches:
                    raise RuntimeError(
                        f"stowage.megatron: model chunk {u.chunk} runs forward {k + 1} in one "
                        f"step but the plan was made for run.microbatches = "
                        f"{self.plan.run.microbatches} (Note [Megatron microbatches]); pass "
                        f"num_microbatches={self.plan.run.microbatches} to the schedule or make "
                        "the plan for this one")
                self._forwards[u.chunk] = k + 1
                state.enter_microbatch(k)
        try:
            return self._run(u.index, x, args, kwargs)
        except PlanError as e:
            where = (f"MTP layer {u.index - _total_layers(self.chunks)}" if u.mtp
                     else f"decoder layer_number {u.index + 1}")
            raise PlanError(
                f"stowage.megatron: {type(u.layer).__name__} {where} (plan layer {u.index}): "
                f"{e}. (A plan from `stowage plan --from-megatron` predicts the bytes of "
                "TransformerEngine's layers: plan for these layers' own bytes with "
                "stowage.megatron.profile(model, batch))") from None

    # -- selective recompute ------------------------------------------------------------------
    def checkpointed_submodules(self, i: int, layer: nn.Module,
                                names: Sequence[str]) -> contextlib.AbstractContextManager:
        """Note [Megatron recompute names]."""
        return _megatron_recompute(i, layer, names)

    # -- steps --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self) -> Iterator["MegatronLayers"]:
        """One optimizer step: every microbatch Megatron's schedule runs for it goes inside."""
        with super().step():
            self._forwards = {}
            yield self
            ran = {c: self._forwards.get(c, 0) for c in self._first_of_chunk}
            short = {c: n for c, n in ran.items() if 0 < n < self.plan.run.microbatches}
            if short:
                raise RuntimeError(
                    f"stowage.megatron: the step ran {short} forwards of model chunks {list(short)}"
                    f" but the plan was made for run.microbatches = {self.plan.run.microbatches}; "
                    "run the schedule with that num_microbatches or make the plan for yours")


def _mtp_path(layer: nn.Module, path: str) -> str:
    """A TransformerLayer path inside an MTP layer is under its transformer_layer."""
    return f"transformer_layer.{path}" if hasattr(layer, "transformer_layer") else path


def _has(layer: nn.Module, path: str) -> bool:
    try:
        m = layer.get_submodule(path)
    except AttributeError:
        return False
    return type(m).__name__ != "IdentityOp"


def recompute_targets(i: int, layer: nn.Module,
                      names: Sequence[str]) -> tuple[list[str], list[nn.Module]]:
    """What selective recompute of `names` reruns in plan layer i: the submodule paths
    checkpointed, and the MLPs whose activation is (Note [Megatron recompute names]). A name the
    layer has nothing for is a PlanError listing what is allowed."""
    paths: list[str] = []
    scopes: list[nn.Module] = []
    for name in names:
        if name in RECOMPUTE_PATHS:
            found = [_mtp_path(layer, p) for p in RECOMPUTE_PATHS[name]]
            found = [p for p in found if _has(layer, p)]
        elif name in ACTIVATION_SCOPES:
            scope = _mtp_path(layer, ACTIVATION_SCOPES[name])
            mlps = ([m for m in layer.get_submodule(scope).modules()
                     if type(m).__name__ == "MLP"] if _has(layer, scope) else [])
            if mlps and not mlps[0].config.bias_activation_fusion:
                raise PlanError(
                    f"plan: layers[{i}].recompute_modules names {name!r}: stowage reruns "
                    "Megatron's fused activation; set bias_activation_fusion=True "
                    "(--bias-swiglu-fusion) or recompute 'mlp' instead")
            scopes.extend(mlps)
            found = ["(activation)"] if mlps else []
        else:
            found = [name] if _has(layer, name) else []
        if not found:
            allowed = ", ".join(sorted({*RECOMPUTE_PATHS, *ACTIVATION_SCOPES}))
            raise PlanError(
                f"plan: layers[{i}].recompute_modules names {name!r} but layer {i} "
                f"({type(layer).__name__}) has no such module; allowed: Megatron's names ("
                f"{allowed}, those the layer has) or a submodule path of the layer")
        paths.extend(p for p in found if p != "(activation)")
    return paths, scopes


@contextlib.contextmanager
def _megatron_recompute(i: int, layer: nn.Module, names: Sequence[str]) -> Iterator[None]:
    paths, scopes = recompute_targets(i, layer, names)
    with contextlib.ExitStack() as stack:
        stack.enter_context(checkpointed_submodules(i, layer, paths))
        if scopes:
            stack.enter_context(_checkpointed_activations(scopes))
        yield


@contextlib.contextmanager
def _checkpointed_activations(mlps: Sequence[nn.Module]) -> Iterator[None]:
    """Within the block, Megatron's fused activation functions, called from an MLP of `mlps`,
    run under Megatron's own CheckpointWithoutOutput (tensor_parallel/random.py), whose output
    the MLP's linear_fc2 then discards and backward recomputes, as Megatron's moe_act recompute
    does (Note [Megatron recompute names])."""
    from megatron.core.tensor_parallel.random import CheckpointWithoutOutput
    from megatron.core.transformer import mlp as mlp_module
    current: list = []  # the MLPs of the scope whose forward runs, innermost last
    pending: dict = {}  # id(MLP) -> its activation's checkpoint, until linear_fc2 ran
    handles = []

    def enter(m: nn.Module, *_: Any) -> None:
        current.append(m)

    def leave(m: nn.Module, *_: Any) -> None:
        current.pop()

    def fc2_done(mlp: nn.Module) -> Callable:
        def hook(_fc2: nn.Module, _args: Any, out: Any) -> None:
            ckpt = pending.pop(id(mlp), None)
            if ckpt is not None:
                ckpt.discard_output_and_register_recompute(
                    out[0] if isinstance(out, tuple) else out)
        return hook

    for m in mlps:
        handles.append(m.register_forward_pre_hook(enter))
        handles.append(m.register_forward_hook(leave))
        handles.append(m.linear_fc2.register_forward_hook(fc2_done(m)))
    originals = {n: getattr(mlp_module, n) for n in _FUSED_ACTIVATIONS if hasattr(mlp_module, n)}

    def patched(f: Callable) -> Callable:
        def call(*args: Any) -> Any:
            if not current or not torch.is_grad_enabled():
                return f(*args)
            # fp8=None: megatron-core 0.16.1 reads any other value as fp8 on.
            ckpt = CheckpointWithoutOutput(fp8=None)
            pending[id(current[-1])] = ckpt
            # It saves its arguments with save_for_backward: tensors only, the rest bound here.
            at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

            def run(*tensors: torch.Tensor) -> Any:
                full = list(args)
                for i, t in zip(at, tensors):
                    full[i] = t
                return f(*full)
            return ckpt.checkpoint(run, *(args[i] for i in at))
        return call
    try:
        for n, f in originals.items():
            setattr(mlp_module, n, patched(f))
        yield
    finally:
        for n, f in originals.items():
            setattr(mlp_module, n, f)
        for h in handles:
            h.remove()


def _check_routed_bytes_fixed(u: _Unit) -> None:
    """Note [Routed bytes under expert parallelism]. An offload_saved MoE layer under expert
    parallelism must route a fixed number of tokens to each of this rank's experts."""
    inner = getattr(u.layer, "transformer_layer", u.layer)
    mlp = getattr(inner, "mlp", None)
    if mlp is None or type(mlp).__name__ != "MoELayer":
        return
    config = mlp.config
    ep = int(getattr(config, "expert_model_parallel_size", 1) or 1)
    # Only these dispatchers pad to capacity (transformer/moe/token_dispatcher.py: the alltoall
    # one and the flex one's HybridEP manager read moe_pad_expert_input_to_capacity; the
    # allgather one and DeepEP do not).
    dispatcher = getattr(config, "moe_token_dispatcher_type", "allgather")
    pads = dispatcher == "alltoall" or (
        dispatcher == "flex" and getattr(config, "moe_flex_dispatcher_backend", "") == "hybridep")
    if ep > 1 and not (pads and getattr(config, "moe_pad_expert_input_to_capacity", False)):
        where = (f"MTP layer {u.index - int(inner.config.num_layers)}" if u.mtp
                 else f"decoder layer_number {u.index + 1}")
        raise PlanError(
            f"stowage.megatron: {where} (plan layer {u.index}) is a MoE layer under expert "
            f"parallelism {ep} with policy offload_saved: what its experts save follows the "
            "tokens routed to this rank's experts, which change from batch to batch (the "
            f"{dispatcher} token dispatcher, unpadded), so no fixed host_bytes holds them; pad "
            "every expert's input to its capacity (the alltoall dispatcher with "
            "moe_expert_capacity_factor and moe_pad_expert_input_to_capacity=True: "
            "--moe-token-dispatcher-type alltoall --moe-expert-capacity-factor F "
            "--moe-pad-expert-input-to-capacity), or give the layer offload_input, recompute or "
            "selective_recompute")


def wrap(model: Union[nn.Module, Sequence[nn.Module]], plan: PlanLike, *,
         group: Optional[Any] = None, runtime: Optional[Runtime] = None,
         **runtime_options: Any) -> MegatronLayers:
    """Runs the layers of a Megatron-Core model (a GPTModel, or this rank's list of model chunks
    under virtual pipeline stages) under `plan`: a Plan, its JSON, or a path (`stowage plan
    --from-megatron ... --out plan.json`, or one made from stowage.megatron.profile). Returns the
    handle whose `.step()` brackets one optimizer step. Checks, before any step: Megatron's own
    recompute and CPU offloading are off, the plan's layers, stages and chunks are this model's
    and this rank's, and (torch.distributed initialized) every rank of `group` (default: the
    world, which holds every Megatron process group) holds the same plan (stowage.agree)."""
    chunks = _chunks(model)
    check_megatron_settings(chunks)
    if not isinstance(plan, Plan):
        plan = Plan.from_json(plan_json_text(plan))
    plan.validate()  # its own error here, before the ranks compare hashes
    pp, stage, tp = _parallel()
    units = _units(chunks, _total_layers(chunks))
    if not units:
        raise PlanError("stowage.megatron: the model has no TransformerLayer on this rank")
    _check_layout(plan, units, chunks, pp, stage, tp)
    for u in units:
        if "forward" in u.layer.__dict__:
            raise RuntimeError(f"stowage.megatron: layer {u.index} is wrapped already; call "
                               "unwrap() on the earlier handle first")
    for u in units:  # selective recompute's names, before any step
        lp = plan.layers[u.index]
        if lp.policy == SELECTIVE_RECOMPUTE:
            recompute_targets(u.index, _call_of(u), lp.recompute_modules)
        if lp.policy == OFFLOAD_SAVED:
            _check_routed_bytes_fixed(u)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        agree(plan, group)
    planned = MegatronLayers(chunks, plan, units, stage, pp, runtime=runtime, **runtime_options)
    planned.install()
    return planned


def _capture(module: nn.Module, store: dict) -> Any:
    def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        if "args" not in store:
            store["args"], store["kwargs"] = args, dict(kwargs)
    return module.register_forward_pre_hook(hook, with_kwargs=True)


def _stage_input(chunk: nn.Module, batch: Mapping[str, Any], tp: int) -> torch.Tensor:
    """What a chunk that does not start the model receives from the previous virtual stage: the
    hidden state [sequence, micro-batch, hidden] the schedules send (pipeline_parallel/
    schedules.py get_tensor_shapes: the rank's context-parallel share of the sequence, as the
    batch holds it, divided by TP under sequence parallelism; config.pipeline_dtype). Its values
    are random: what the layers save and how long they take depend on its shape."""
    config = chunk.config
    ids = batch["input_ids"]
    tokens = ids.shape[-1]
    if getattr(config, "sequence_parallel", False):
        tokens //= tp
    dtype = getattr(config, "pipeline_dtype", None) or config.params_dtype
    generator = torch.Generator(device=ids.device).manual_seed(0)
    return torch.randn(tokens, ids.shape[0], config.hidden_size, dtype=dtype, device=ids.device,
                       generator=generator)


def _loss_of(chunk: nn.Module, batch: Mapping[str, Any]) -> Optional[Callable]:
    """On the chunk that ends the model (post_process) with labels in the batch: what follows
    its last decoder layer, as GPTModel runs it (models/gpt/gpt_model.py _postprocess): the
    decoder's final norm, the output layer (on the embedding's weight when they are shared) and
    the language-model loss, summed. stowage.measure.profile measures it as the step's loss (the
    profile's `loss`). The MTP heads' own losses are not part of it."""
    labels = batch.get("labels")
    if labels is None or not getattr(chunk, "post_process", True):
        return None
    norm = getattr(chunk.decoder, "final_layernorm", None)

    def loss_fn(h: torch.Tensor) -> torch.Tensor:
        if norm is not None:
            h = norm(h)
        weight = (chunk.shared_embedding_or_output_weight()
                  if getattr(chunk, "share_embeddings_and_output_weights", False) else None)
        logits, _ = chunk.output_layer(h, weight=weight)
        return chunk.compute_language_model_loss(labels, logits).sum()
    return loss_fn


def _measure_chunk(chunk: nn.Module, units: Sequence[_Unit], batch: Mapping[str, Any],
                   tp: int, repeats: int) -> list[ModelProfile]:
    """Measures one model chunk's planned layers on what one no-grad forward of the chunk calls
    its first decoder layer (and its first MTP layer) with; a chunk that does not start the model
    is fed its input by set_input_tensor, as the schedules do. One ModelProfile per group
    (decoder layers, MTP layers), in the chunk's order."""
    if not units:
        return []
    groups = [[u for u in units if not u.mtp], [u for u in units if u.mtp]]
    stores: list[dict] = [{}, {}]
    handles = [_capture(g[0].layer, s) for g, s in zip(groups, stores) if g]
    rng = torch.get_rng_state()
    try:
        with torch.no_grad():
            if not getattr(chunk, "pre_process", True):
                chunk.set_input_tensor(_stage_input(chunk, batch, tp))
            chunk(**batch)
    finally:
        for h in handles:
            h.remove()
        if not getattr(chunk, "pre_process", True):
            chunk.set_input_tensor(None)
        torch.set_rng_state(rng)
    profiles = []
    for g, store in zip(groups, stores):
        if not g:
            continue
        mtp = g[0].mtp
        args, kwargs = store["args"], dict(store["kwargs"])
        if mtp:
            bound = inspect.signature(type(g[0].layer).forward).bind(g[0].layer, *args, **kwargs)
            kwargs = {k: v for k, v in bound.arguments.items() if k != "self"}
            args = ()
        if "hidden_states" in kwargs:
            x = kwargs.pop("hidden_states")
        else:
            x, args = args[0], args[1:]
        calls = [_call_of(u) for u in g]
        p = profile_layers(calls, x.detach().requires_grad_(True), *args, repeats=repeats,
                           loss_fn=None if mtp else _loss_of(chunk, batch), **kwargs)
        for lp, u in zip(p.layers, g):
            inner = getattr(u.layer, "transformer_layer", u.layer)
            # An MTP layer's type is "mtp+" its transformer layer's (plan.h Note [MTP layers]).
            lp.type = ("mtp+" if u.mtp else "") + type(inner).__name__
            lp.index = u.index
        profiles.append(p)
    return profiles


def _fixed_bytes(chunks: Sequence[nn.Module], batch: Mapping[str, Any]) -> StageProfile:
    """What the rank holds throughout: its chunks' weights and gradients, the batch, PyTorch's
    cuBLAS workspaces (stage and chunks filled in by the caller)."""
    params = [p for c in chunks for p in c.parameters()]
    return StageProfile(
        stage=0, chunks=[],
        weights_bytes=sum(p.numel() * p.element_size() for p in params),
        gradients_bytes=sum(p.numel() * p.element_size() for p in params if p.requires_grad),
        other_bytes=sum(t.numel() * t.element_size() for t in batch.values()
                        if isinstance(t, torch.Tensor)) + TORCH_CUBLAS_WORKSPACES_BYTES,
        model_parameters=sum(p.numel() for p in params))


def _gather_stages(mine: ModelProfile, fixed: StageProfile, counts: list[int], pp: int,
                   stage: int, vpp: int) -> ModelProfile:
    """Every stage's measured layers and fixed bytes, gathered over Megatron's pipeline group
    (each rank of it measured its own chunks), as one profile of the whole model with its
    `pipeline` (Note [Megatron pipelined profiles])."""
    from megatron.core import parallel_state as ps
    group = ps.get_pipeline_model_parallel_group()
    gathered: list[Any] = [None] * pp
    torch.distributed.all_gather_object(
        gathered, {"stage": stage, "profile": mine.to_dict(), "fixed": fixed.to_dict(),
                   "counts": counts}, group=group)
    by_stage = sorted(gathered, key=lambda g: g["stage"])
    if [g["stage"] for g in by_stage] != list(range(pp)):
        raise PlanError(f"stowage.megatron.profile: the pipeline group's ranks report stages "
                        f"{[g['stage'] for g in gathered]}; expected each of 0..{pp - 1} once")
    layers = sorted((lp for g in by_stage for lp in ModelProfile.from_dict(g["profile"]).layers),
                    key=lambda lp: lp.index)
    if [lp.index for lp in layers] != list(range(len(layers))):
        raise PlanError(f"stowage.megatron.profile: the stages measured layers "
                        f"{[lp.index for lp in layers]}; expected every layer of the model once")
    # Virtual stage v = c x pp + s is chunk c of stage s; each starts where the one before ends.
    first, ranges = 0, {}
    for v in range(pp * vpp):
        c, s = divmod(v, pp)
        n = by_stage[s]["counts"][c]
        ranges[(s, c)] = (first, n)
        first += n
    stages = []
    for g in by_stage:
        st = StageProfile.from_dict(g["fixed"])
        st.stage = g["stage"]
        st.chunks = [ranges[(st.stage, c)] for c in range(vpp)]
        stages.append(st)
    # The link rates are the first stage's; the loss is the last stage's (profile-format.md).
    head = ModelProfile.from_dict(by_stage[0]["profile"])
    tail = ModelProfile.from_dict(by_stage[-1]["profile"])
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else pp
    return dataclasses.replace(
        head, layers=layers, loss_peak_bytes=tail.loss_peak_bytes,
        loss_seconds=tail.loss_seconds, held_logits_bytes=tail.held_logits_bytes,
        weights_bytes=sum(s.weights_bytes for s in stages),
        gradients_bytes=sum(s.gradients_bytes for s in stages),
        other_bytes=max(s.other_bytes for s in stages),
        model_parameters=sum(s.model_parameters for s in stages),
        pipeline=PipelineProfile(pp=pp, vpp=vpp, gpus=world, stages=stages))


def profile(model: Union[nn.Module, Sequence[nn.Module]], batch: Mapping[str, Any], *,
            repeats: int = 2) -> ModelProfile:
    """Measures the model's own layers (stowage.measure.profile's rule, each layer alone) on the
    activations `batch` produces: `batch` is the keyword arguments of the model's forward
    (input_ids, position_ids, attention_mask, labels). The profile lists the decoder layers in
    Megatron's order, then the MTP layers; selective recompute's choices are each layer's
    children. `model` is a GPTModel or this rank's list of model chunks: under pipeline
    parallelism every rank of the pipeline group calls it (a collective), each measures its own
    chunks, and every rank gets the whole model's profile with its `pipeline`
    (Note [Megatron pipelined profiles])."""
    chunks = _chunks(model)
    check_megatron_settings(chunks)
    pp, stage, tp = _parallel()
    if pp == 1 and len(chunks) > 1:
        raise PlanError(f"stowage.megatron.profile: {len(chunks)} model chunks but Megatron runs "
                        "one pipeline stage (parallel_state); virtual stages need "
                        "pipeline_model_parallel_size > 1")
    units = _units(chunks, _total_layers(chunks))
    profiles: list[ModelProfile] = []
    ends: Optional[ModelProfile] = None  # the decoder layers after which the loss was measured
    for c, chunk in enumerate(chunks):
        measured = _measure_chunk(chunk, [u for u in units if u.chunk == c], batch, tp, repeats)
        if measured and getattr(chunk, "post_process", True):
            ends = measured[0]
        profiles.extend(measured)
    if not profiles:
        raise PlanError("stowage.megatron.profile: the model has no TransformerLayer on this "
                        "rank")
    layers = sorted((lp for p in profiles for lp in p.layers), key=lambda lp: lp.index)
    fixed = _fixed_bytes(chunks, batch)
    loss = ends if ends is not None else profiles[0]
    mine = dataclasses.replace(
        profiles[0], layers=layers, weights_bytes=fixed.weights_bytes,
        gradients_bytes=fixed.gradients_bytes, other_bytes=fixed.other_bytes,
        loss_peak_bytes=loss.loss_peak_bytes, loss_seconds=loss.loss_seconds,
        held_logits_bytes=loss.held_logits_bytes, framework="megatron",
        model_parameters=fixed.model_parameters)
    if pp == 1:
        return mine
    counts = [sum(1 for u in units if u.chunk == c) for c in range(len(chunks))]
    return _gather_stages(mine, fixed, counts, pp, stage, len(chunks))


__all__ = ["ACTIVATION_SCOPES", "MegatronLayers", "RECOMPUTE_PATHS", "check_megatron_settings",
           "profile", "recompute_targets", "wrap"]
