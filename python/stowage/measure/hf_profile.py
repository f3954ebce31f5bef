"""A measured layer profile of a Hugging Face transformers model, without a GPU.

    python -m stowage.measure.profile --hf config.json --seq-len 16384 --out profile.json
    stowage plan --profile profile.json --hardware h200 --force keep

measure_hf() builds the transformers model of a config.json (bf16, SDPA, train mode) and runs
one training step (forward, the model's own loss, backward) at a few short sequence lengths,
watching every aten op with a TorchDispatchMode: live bytes by storage (LiveBytes), what autograd
saves (saved_tensors_hooks, each storage once), the peaks of each layer's forward and backward
and of the LM head and loss, and each op's work by class (GEMM, attention, grouped GEMM FLOPs,
memory-bound bytes, kernel count). Each figure is fitted as c0 + c1*s + c2*s^2 in the sequence
length s through the measured points (exactly, in rationals) and evaluated at the requested
length; to_model_profile() writes the "stowage-layer-profile" the C++ planner reads.

Note [Fake tensors at real widths]
The model runs on FakeTensorMode tensors that report device "cpu": every op runs its meta
kernel, so shapes, dtypes, strides and storages (and therefore every byte figure) are exactly
those of the CPU run, while no memory is allocated and no arithmetic is done. So the widths are
the config's own (an 8B model's layer costs nothing), and no scaling by dimensions is needed.
SDPA picks its kernel from the query's device and shapes before dispatch
(sdp::select_sdp_backend_cpp), so a fake "cpu" query takes the CPU flash kernel as a real one
does, and saves what the CUDA flash kernel saves (q, k, v, output, logsumexp). MoE routing is
data-dependent only in values (transformers' grouped_mm path: histc, sort, _grouped_mm over
t*k rows), not in shapes. `fake=False` runs real CPU tensors instead (tests compare the two).

Depth: one layer per distinct layer kind (the module tree's class names, parameter shapes and
attention_type), in model order; the others are dropped from model.model.layers before the step,
and the config's per-layer lists with them (Note [One layer per kind] in hf_model.py).
Weights are counted over the full-depth model (fake, so free): the text decoder and its LM
head, what the planner plans (a multimodal wrapper's vision tower is built but not counted, and
a text-only step gives it no pixels); each layer's figures are its kind's.

The measurement's parts, one job each:
  op_work.py      the work of each aten op by op class (Note [Kernel bytes])
  live_bytes.py   LiveBytes, the dispatch mode that logs allocations and frees; replay()
  hf_model.py     the model of a config.json, one layer per kind
  hf_families.py  what some families' fake steps need to run the GPU's step
  hf_trace.py     one logged step (StepTrace)
  hf_step.py      a step's figures, part by part (evaluate)
  hf_fold.py      loops folded (Note [Loops in the step])
  hf_fit.py       the fit in the sequence length (HfMeasurement)
  hf_profile.py   this: measure_hf, and the profile of a measurement (to_model_profile)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import torch

from ..plan import PlanError
from .hf_fit import (DEFAULT_LENGTHS, HfMeasurement, check_same_step, lengths_between,
                     mask_thresholds, softmax_thresholds, sort_thresholds)
from .hf_fold import fold_loops, unfolded_kink
from .hf_model import build_hf_model
from .hf_step import evaluate
from .hf_trace import trace_step
from .layer_profile import (MAX_MODULES, TORCH_CUBLAS_WORKSPACES_BYTES, LayerProfile,
                            ModelProfile, ModuleTime, SavedTensor)
from .op_work import OpWork

# CheckStepCostBounds allows 64 saved tensors per layer; beyond this many, a module's tensors
# are merged into one entry per module.
MAX_SAVED = 48

# The profile's grad_dtype names (planner/frameworks/layer_profile.cc); other dtypes are not
# stated.
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def measure_hf(config: Any, *, lengths: Optional[Sequence[int]] = None,
               seq_len: Optional[int] = None, dtype: torch.dtype = torch.bfloat16,
               fake: bool = True) -> HfMeasurement:
    """Runs one step of the model of `config` (a config.json path or dict) at each length:
    `lengths`, or lengths on seq_len's side of every threshold (Note [One side of every threshold];
    the defaults when seq_len is not given)."""
    hf = build_hf_model(config, dtype=dtype, fake=fake)
    windows = mask_thresholds(hf)
    chosen = lengths is None
    if chosen:
        lengths = DEFAULT_LENGTHS if seq_len is None else lengths_between(windows, seq_len)
    lengths = sorted(set(int(s) for s in lengths))
    if len(lengths) < 2 or lengths[0] < 1:
        raise PlanError(f"lengths are {lengths}; allowed: at least two distinct positive lengths "
                        "(three fit a constant term too)")
    traces = [trace_step(hf, s) for s in lengths]
    thresholds = sorted(set(windows + softmax_thresholds(traces) + sort_thresholds(traces)))
    m = HfMeasurement(hf=hf, lengths=lengths, traces=traces, thresholds=thresholds)
    straddled = any(lengths[0] < t <= lengths[-1] for t, _ in thresholds)
    if chosen and (straddled or (seq_len is not None and not m.covers(seq_len))):
        # A softmax or sort threshold between the defaults and seq_len (or among the defaults:
        # then the longest one's side): measure on its side.
        m.lengths = lengths = lengths_between(thresholds,
                                              seq_len if seq_len is not None else lengths[-1])
        m.traces = [trace_step(hf, s) for s in lengths]
    # Note [Loops in the step]: a step whose ops repeat with the length is folded first; where
    # a folded middle is not yet linear in the length (its first iterations), lengths chosen
    # here move up until it is.
    m.traces = fold_loops(m.traces)
    for _ in range(3):
        kink = unfolded_kink(m.traces)
        if kink is None or not chosen:
            break
        span = m.lengths[-1] - m.lengths[0]
        m.lengths = lengths = [x + 2 * span for x in m.lengths]
        m.traces = fold_loops([trace_step(hf, x) for x in lengths])
    kink = unfolded_kink(m.traces)
    if kink is not None:
        raise PlanError(
            f"a loop of the step holds bytes that are not linear in the length through "
            f"{m.lengths} (folded allocation {kink}: "
            f"{[t.sizes[kink] for t in m.traces]}): measure at longer lengths "
            "(Note [Loops in the step])")
    check_same_step(m.traces)
    return m


def to_model_profile(m: HfMeasurement, seq_len: int) -> ModelProfile:
    """The measured layer profile at `seq_len` tokens, each layer its kind's."""
    trace = m.at(seq_len)
    step = evaluate(trace)
    kinds = []
    for k, point in enumerate(step.layers):
        fwd = ("forward", k)
        by_module: dict[str, int] = {}
        for _n, b, mod in point.saved:
            if mod:
                by_module[mod] = by_module.get(mod, 0) + b
        listed = sorted(by_module, key=lambda x: -by_module[x])[:MAX_MODULES]
        saved = [(n, b, mod if mod in listed else "") for n, b, mod in point.saved]
        if len(saved) > MAX_SAVED:
            merged: dict[str, list] = {}
            for n, b, mod in saved:
                key = "input" if n == "input" else f"{mod or 'layer'}.all"
                merged.setdefault(key, [0, mod])[0] += b
            saved = [(n, b, mod) for n, (b, mod) in merged.items()]
        kinds.append(dict(
            input_bytes=point.input_bytes, output_bytes=point.output_bytes,
            saved=[SavedTensor(n, b, mod) for n, b, mod in saved],
            modules=[ModuleTime(name, 0.0, trace.module_work.get((fwd, name), OpWork()).to_dict())
                     for name in listed],
            forward_peak_bytes=max(0, point.forward_own_bytes - point.input_bytes),
            backward_peak_bytes=max(0, point.backward_own_bytes), grad_bytes=point.grad_bytes,
            backward_peak_grad_bytes=point.peak_grad_bytes,
            backward_peak_released_bytes=point.peak_released_bytes,
            checkpoint_held_bytes=point.checkpoint_held_bytes,
            checkpoint_held_group=point.checkpoint_held_group,
            forward_work=trace.work.get(fwd, OpWork()).to_dict(),
            backward_work=trace.work.get(("backward", k), OpWork()).to_dict()))
    layers = []
    for i, k in enumerate(m.hf.kinds):
        kk = kinds[k]
        layers.append(LayerProfile(
            index=i, type=m.hf.kind_names[k], input_bytes=kk["input_bytes"],
            output_bytes=kk["output_bytes"], saved=[dataclasses.replace(t) for t in kk["saved"]],
            modules=[dataclasses.replace(x) for x in kk["modules"]],
            forward_peak_bytes=kk["forward_peak_bytes"],
            backward_peak_bytes=kk["backward_peak_bytes"], forward_seconds=0.0,
            backward_seconds=0.0, grad_bytes=kk["grad_bytes"],
            backward_peak_grad_bytes=kk["backward_peak_grad_bytes"],
            backward_peak_released_bytes=kk["backward_peak_released_bytes"],
            checkpoint_held_bytes=kk["checkpoint_held_bytes"],
            checkpoint_held_group=kk["checkpoint_held_group"],
            forward_work=kk["forward_work"],
            backward_work=kk["backward_work"]))
    loss = trace.work.get("loss", OpWork())
    embedding = OpWork()
    for phase in ("embedding", "embedding_backward"):
        embedding.add(trace.work.get(phase, OpWork()))
    return ModelProfile(
        layers=layers, device="cpu (fake tensors)" if m.hf.fake else "cpu",
        weights_bytes=m.hf.weights_bytes, gradients_bytes=0,
        other_bytes=step.other_bytes - step.forward_freed_bytes + TORCH_CUBLAS_WORKSPACES_BYTES,
        loss_peak_bytes=step.loss_peak_bytes, held_logits_bytes=step.held_logits_bytes,
        measured_memory=False, tokens=seq_len,
        gradients_in_backward=True, loss_grad_bytes=step.loss_grad_bytes,
        loss_work=loss.to_dict(), embedding_grad_bytes=step.embedding_grad_bytes,
        embedding_work=embedding.to_dict(), d2h_bytes_per_second=0.0, h2d_bytes_per_second=0.0,
        # transformers' eager code, one step without an optimizer, gradients in the weights'
        # dtype as autograd creates them.
        framework="hf", optimizer="none", grad_dtype=_DTYPE_NAMES.get(m.hf.dtype),
        model_parameters=m.hf.parameters)


def profile_hf(config: Any, seq_len: int, *, lengths: Optional[Sequence[int]] = None,
               dtype: torch.dtype = torch.bfloat16, fake: bool = True) -> ModelProfile:
    """measure_hf + to_model_profile: the profile `stowage plan --profile` reads."""
    if seq_len < 1:
        raise PlanError(f"seq_len is {seq_len}; allowed: at least 1")
    return to_model_profile(
        measure_hf(config, lengths=lengths, seq_len=seq_len, dtype=dtype, fake=fake), seq_len)


__all__ = ["DEFAULT_LENGTHS", "measure_hf", "profile_hf", "to_model_profile"]
