"""The "stowage-layer-profile" format (README: "Layer profile format"): what a measurement of a
model's layers says, as the C++ planner reads it (`stowage plan --profile`, stowage_plan_request;
planner/frameworks/layer_profile.h ParseProfileJson). ModelProfile.to_json() writes it and
ModelProfile.from_dict() reads it back.

Two measurements write it: stowage.measure.profile.profile_layers (the user's torch layers, run
one at a time) and stowage.measure.hf_profile.profile_hf (a transformers model on fake tensors).
Torch-free: a profile is data.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

from ..runtime import version

FORMAT = "stowage-layer-profile"
# 2: layers[i].backward_peak_grad_bytes, .backward_peak_released_bytes, .checkpoint_held_bytes,
# .checkpoint_held_group and loss.held_logits_bytes (absent: what a version-1 profile means).
# 3: pipeline (a profile measured on every stage of a pipelined model: PipelineProfile).
SCHEMA_VERSION = 3
# The planner tries every subset of a layer's modules for selective recompute
# (planner/frameworks/layer_profile.h kMaxProfileModules); the modules that save the most are
# listed, the rest count as the layer's.
MAX_MODULES = 8
# PyTorch's cuBLAS workspaces, which a CUDA training step holds throughout and no measurement
# sees (off the GPU there are none; on it they are allocated by the first GEMM, before any
# baseline): one per (handle, stream), the forward on the Python thread's handle and the backward
# on the autograd engine's device thread with its own, each 32 MiB on sm90+ (torch 2.11
# aten/src/ATen/cuda/CublasHandlePool.cpp, getChosenWorkspaceSize). Every profile counts them in
# fixed_bytes.other, as the analytic recipes do (planner/frameworks/step_cost.h
# kTorchCublasWorkspacesBytes).
TORCH_CUBLAS_WORKSPACES_BYTES = 2 * (32 << 20)


@dataclasses.dataclass
class SavedTensor:
    name: str    # unique within the layer; "input" is the layer's own input
    bytes: int
    module: str = ""  # child module whose rerun regenerates it ("": only full recompute)


@dataclasses.dataclass
class ModuleTime:
    name: str        # a child of the layer, as layer.get_submodule(name) finds it
    seconds: float   # its forward time: what selective recompute of it costs
    # Instead of seconds: its forward's op work (planner/hardware/op_time.h OpWork fields), which
    # the planner turns into seconds on the hardware it plans for (stowage.measure.hf_profile).
    work: Optional[dict[str, float]] = None


@dataclasses.dataclass
class LayerProfile:
    index: int
    type: str
    input_bytes: int
    output_bytes: int
    saved: list[SavedTensor]
    modules: list[ModuleTime]
    forward_peak_bytes: int   # over memory before the forward (input already allocated)
    backward_peak_bytes: int  # over memory before the forward, during backward
    forward_seconds: float
    backward_seconds: float
    # Parameter gradients this layer's backward creates (ModelProfile.gradients_in_backward).
    grad_bytes: int = 0
    # At the backward's peak: of grad_bytes, those made by then (None: all of them, the
    # backward_peak_bytes are net of every one); of the saved bytes, those released by then.
    backward_peak_grad_bytes: Optional[int] = None
    backward_peak_released_bytes: int = 0
    # What the layer's checkpoint holds beyond its input when it is recomputed, that its
    # forward_peak_bytes count while its forward runs (transformers: its layer type's mask);
    # layers of one group hold the same tensors, counted once (one group per layer type).
    checkpoint_held_bytes: int = 0
    checkpoint_held_group: int = 0
    # Instead of seconds: op work per pass (OpWork fields), converted by the planner.
    forward_work: Optional[dict[str, float]] = None
    backward_work: Optional[dict[str, float]] = None

    @property
    def saved_bytes(self) -> int:
        """What offload_saved moves: every distinct non-parameter saved tensor."""
        return sum(t.bytes for t in self.saved)

    @property
    def saves_input(self) -> bool:
        return any(t.name == "input" for t in self.saved)


@dataclasses.dataclass
class StageProfile:
    """One pipeline stage of a pipelined profile: its model chunks (virtual stage v = c x pp + s
    is chunk c of stage s; each a (first_layer, num_layers) range of the profile's layers) and
    the fixed device bytes its rank holds (its chunks' weights and gradients, the batch, the
    cuBLAS workspaces)."""
    stage: int
    chunks: list[tuple[int, int]]
    weights_bytes: int
    gradients_bytes: int
    other_bytes: int
    model_parameters: int = 0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "stage": int(self.stage),
            "chunks": [{"first_layer": int(f), "num_layers": int(n)} for f, n in self.chunks],
            "fixed_bytes": {"weights": int(self.weights_bytes),
                            "gradients": int(self.gradients_bytes), "optimizer": 0,
                            "other": int(self.other_bytes)}}
        if self.model_parameters:
            d["model_parameters"] = int(self.model_parameters)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "StageProfile":
        fixed = d["fixed_bytes"]
        return StageProfile(
            stage=d["stage"], chunks=[(c["first_layer"], c["num_layers"]) for c in d["chunks"]],
            weights_bytes=fixed["weights"], gradients_bytes=fixed.get("gradients", 0),
            other_bytes=fixed.get("other", 0), model_parameters=d.get("model_parameters", 0))


@dataclasses.dataclass
class PipelineProfile:
    """What a profile measured on every stage of a pipelined model adds (docs/profile-format.md
    "pipeline"): the stages (pp of them, each with vpp chunks) and the job's world size, which
    places the stage boundaries on links. The profile's layers are the whole model's, in
    Megatron's global order; the embedding is stage 0's, the loss the last stage's."""
    pp: int
    vpp: int
    stages: list[StageProfile]
    gpus: int = 0  # the job's world size (0: not stated, read as pp)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"pp": int(self.pp), "vpp": int(self.vpp)}
        if self.gpus:
            d["gpus"] = int(self.gpus)
        d["stages"] = [s.to_dict() for s in self.stages]
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "PipelineProfile":
        return PipelineProfile(pp=d["pp"], vpp=d["vpp"], gpus=d.get("gpus", 0),
                               stages=[StageProfile.from_dict(s) for s in d["stages"]])


@dataclasses.dataclass
class ModelProfile:
    layers: list[LayerProfile]
    device: str
    weights_bytes: int
    gradients_bytes: int
    other_bytes: int  # held throughout: the sample input, the cuBLAS workspaces
    loss_peak_bytes: int = 0
    loss_seconds: float = 0.0
    # Of loss_peak_bytes, what the caller holds to the step's end (the model output's logits);
    # the layers' backward_peak_bytes are net of it.
    held_logits_bytes: int = 0
    d2h_bytes_per_second: float = 10e9
    h2d_bytes_per_second: float = 10e9
    measured_memory: bool = False  # peaks measured by the CUDA allocator, not estimated
    tokens: int = 1  # rows of the sample input (all dimensions but the last)
    generator: str = ""
    # Eager PyTorch: each gradient is created when backward reaches its parameter (the LM
    # head's in the loss, each layer's in its backward, the embedding's last), not held
    # throughout; gradients_bytes is then 0.
    gradients_in_backward: bool = False
    loss_grad_bytes: int = 0
    loss_work: Optional[dict[str, float]] = None  # instead of loss_seconds
    embedding_grad_bytes: int = 0
    embedding_work: Optional[dict[str, float]] = None
    # What ran, when known (the plan summary reports it; None / 0: not stated): whose code the
    # layers are ("hf": transformers eager), the optimizer whose state is in fixed memory
    # ("none" when no optimizer ran), the gradients' dtype ("bf16", "fp32"), the parameters.
    framework: Optional[str] = None
    optimizer: Optional[str] = None
    grad_dtype: Optional[str] = None
    model_parameters: int = 0
    # Measured on every stage of a pipelined model: each stage's chunks and fixed bytes (the
    # fixed bytes above are then the whole model's: sums, and the most any stage holds of
    # `other`); None: one stage.
    pipeline: Optional[PipelineProfile] = None

    @property
    def fixed_device_bytes(self) -> int:
        return self.weights_bytes + self.gradients_bytes + self.other_bytes

    def to_dict(self) -> dict[str, Any]:
        """The profile JSON object (planner/frameworks/layer_profile.h ParseProfileJson reads
        it)."""
        def timed(d: dict[str, Any], key: str, seconds: float,
                  work: Optional[dict[str, float]]) -> dict[str, Any]:
            if work is None:
                d[key + "seconds"] = float(seconds)
            else:
                d[key + "work"] = {k: float(v) for k, v in work.items()}
            return d

        d: dict[str, Any] = {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "generator": self.generator or _generator(),
            "device": self.device,
            "measured_memory": bool(self.measured_memory),
            "tokens": max(1, int(self.tokens)),
            **{k: v for k, v in (("framework", self.framework), ("optimizer", self.optimizer),
                                 ("grad_dtype", self.grad_dtype)) if v is not None},
            **({"model_parameters": int(self.model_parameters)} if self.model_parameters else {}),
            "fixed_bytes": {"weights": int(self.weights_bytes),
                            "gradients": int(self.gradients_bytes), "optimizer": 0,
                            "other": int(self.other_bytes)},
            "loss": timed({"peak_bytes": int(self.loss_peak_bytes)}, "", self.loss_seconds,
                          self.loss_work),
        }
        if self.held_logits_bytes:
            d["loss"]["held_logits_bytes"] = int(self.held_logits_bytes)
        if self.gradients_in_backward:
            d["gradients_in_backward"] = True
            d["loss"]["grad_bytes"] = int(self.loss_grad_bytes)
        if self.gradients_in_backward or self.embedding_work is not None:
            d["embedding"] = timed({"grad_bytes": int(self.embedding_grad_bytes)}, "", 0.0,
                                   self.embedding_work)
        # A profile measured off the GPU has no link rates: the planner takes the hardware's.
        if self.d2h_bytes_per_second > 0 and self.h2d_bytes_per_second > 0:
            d["link"] = {"d2h_bytes_per_second": float(self.d2h_bytes_per_second),
                         "h2d_bytes_per_second": float(self.h2d_bytes_per_second)}
        layers = []
        for l in self.layers:
            out: dict[str, Any] = {
                "index": l.index, "type": l.type, "input_bytes": int(l.input_bytes),
                "output_bytes": int(l.output_bytes),
                "forward_peak_bytes": int(l.forward_peak_bytes),
                "backward_peak_bytes": int(l.backward_peak_bytes)}
            timed(out, "forward_", l.forward_seconds, l.forward_work)
            timed(out, "backward_", l.backward_seconds, l.backward_work)
            if self.gradients_in_backward:
                out["grad_bytes"] = int(l.grad_bytes)
                if l.backward_peak_grad_bytes is not None:
                    out["backward_peak_grad_bytes"] = int(l.backward_peak_grad_bytes)
            if l.backward_peak_released_bytes:
                out["backward_peak_released_bytes"] = int(l.backward_peak_released_bytes)
            if l.checkpoint_held_bytes:
                out["checkpoint_held_bytes"] = int(l.checkpoint_held_bytes)
            if l.checkpoint_held_group:
                out["checkpoint_held_group"] = int(l.checkpoint_held_group)
            out["modules"] = [timed({"name": m.name}, "", m.seconds, m.work) for m in l.modules]
            out["saved"] = [{"name": t.name, "bytes": int(t.bytes), "module": t.module}
                            for t in l.saved]
            layers.append(out)
        d["layers"] = layers
        if self.pipeline is not None:
            d["pipeline"] = self.pipeline.to_dict()
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def save(self, path: str) -> None:
        """Writes the profile for `stowage plan --profile PATH`."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json())

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "ModelProfile":
        """Reads what to_dict wrote (the C++ reader is the strict one; this is for round trips)."""
        layers = [LayerProfile(
            index=l["index"], type=l["type"], input_bytes=l["input_bytes"],
            output_bytes=l["output_bytes"],
            saved=[SavedTensor(t["name"], t["bytes"], t.get("module", "")) for t in l["saved"]],
            modules=[ModuleTime(m["name"], m.get("seconds", 0.0), m.get("work"))
                     for m in l.get("modules", [])],
            forward_peak_bytes=l["forward_peak_bytes"],
            backward_peak_bytes=l["backward_peak_bytes"],
            forward_seconds=l.get("forward_seconds", 0.0),
            backward_seconds=l.get("backward_seconds", 0.0), grad_bytes=l.get("grad_bytes", 0),
            backward_peak_grad_bytes=l.get("backward_peak_grad_bytes"),
            backward_peak_released_bytes=l.get("backward_peak_released_bytes", 0),
            checkpoint_held_bytes=l.get("checkpoint_held_bytes", 0),
            checkpoint_held_group=l.get("checkpoint_held_group", 0),
            forward_work=l.get("forward_work"), backward_work=l.get("backward_work"))
            for l in d["layers"]]
        fixed = d["fixed_bytes"]
        link = d.get("link", {})
        embedding = d.get("embedding", {})
        return ModelProfile(
            layers=layers, device=d.get("device", ""), weights_bytes=fixed["weights"],
            gradients_bytes=fixed.get("gradients", 0), other_bytes=fixed.get("other", 0),
            loss_peak_bytes=d["loss"]["peak_bytes"], loss_seconds=d["loss"].get("seconds", 0.0),
            held_logits_bytes=d["loss"].get("held_logits_bytes", 0),
            d2h_bytes_per_second=link.get("d2h_bytes_per_second", 0.0),
            h2d_bytes_per_second=link.get("h2d_bytes_per_second", 0.0),
            measured_memory=d["measured_memory"], tokens=d["tokens"],
            generator=d.get("generator", ""),
            gradients_in_backward=d.get("gradients_in_backward", False),
            loss_grad_bytes=d["loss"].get("grad_bytes", 0), loss_work=d["loss"].get("work"),
            embedding_grad_bytes=embedding.get("grad_bytes", 0),
            embedding_work=embedding.get("work"), framework=d.get("framework"),
            optimizer=d.get("optimizer"), grad_dtype=d.get("grad_dtype"),
            model_parameters=d.get("model_parameters", 0),
            pipeline=PipelineProfile.from_dict(d["pipeline"]) if "pipeline" in d else None)


def _generator() -> str:
    return "stowage-python " + version()


__all__ = ["FORMAT", "LayerProfile", "MAX_MODULES", "ModelProfile", "ModuleTime",
           "PipelineProfile", "SCHEMA_VERSION", "SavedTensor", "StageProfile"]
