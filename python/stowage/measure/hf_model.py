"""The transformers model a measurement runs: a config.json built as transformers trains it (bf16,
SDPA, train mode), on fake tensors by default (Note [Fake tensors at real widths] in
stowage/measure/hf_profile.py), with one decoder layer per distinct layer kind
(Note [One layer per kind]) and the full depth's weights counted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any

import torch
import torch.nn as nn

from ..plan import PlanError
from .live_bytes import storage_nbytes


def read_config(config: Any) -> dict[str, Any]:
    """A config.json path or dict, as a dict (model_type included)."""
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding="utf-8") as f:
            config = json.load(f)
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise PlanError("the config must be a JSON object with a string field 'model_type'")
    return dict(config)


def build_config(config: dict[str, Any]) -> Any:
    from transformers import AutoConfig
    d = dict(config)
    model_type = d.pop("model_type")
    # Training runs bf16 weights (as the measured cases of tests/planner/data/measured did); a
    # checkpoint's quantization is not trained.
    for k in ("torch_dtype", "dtype", "quantization_config", "architectures",
              "transformers_version"):
        d.pop(k, None)
    try:
        cfg = AutoConfig.for_model(model_type, **d)
    except (KeyError, ValueError) as e:
        raise PlanError(f"transformers cannot build model_type {model_type!r}: {e}") from e
    cfg._attn_implementation = "sdpa"
    cfg.use_cache = False
    return cfg


def _model_class(cfg: Any) -> tuple[Any, type]:
    """The auto class and model class transformers trains `cfg` with: its causal LM, or for a
    multimodal wrapper without one (Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE) its image-text-to-text
    model, whose text decoder a text-only step runs (the vision tower gets no pixels)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText):
        model_class = auto._model_mapping.get(type(cfg), None)
        if model_class is not None:
            return auto, model_class
    # A text config whose causal LM is registered under its wrapper's config (MllamaTextConfig:
    # MllamaForCausalLM).
    import transformers
    name = type(cfg).__name__.replace("TextConfig", "ForCausalLM")
    model_class = getattr(transformers, name, None)
    if model_class is not None and getattr(model_class, "config_class", None) is type(cfg):
        return model_class, model_class
    raise PlanError(f"transformers has no causal LM or image-text-to-text model for "
                    f"{type(cfg).__name__}: not a decoder stowage.measure.hf_profile knows")


def _text_parameters(model: nn.Module, decoder: nn.Module) -> list[nn.Parameter]:
    """The parameters of the text decoder and its LM head, each once: what the planner plans
    (a multimodal wrapper's vision tower is not)."""
    head = model.get_output_embeddings()
    params: dict[int, nn.Parameter] = {}
    for p in list(decoder.parameters()) + (list(head.parameters()) if head is not None else []):
        params.setdefault(id(p), p)
    return list(params.values())


def decoder_of(model: nn.Module) -> nn.Module:
    inner = getattr(model, "model", None)
    # Multimodal wrappers keep the text decoder as model.model.language_model.
    inner = getattr(inner, "language_model", inner)
    if inner is None or not isinstance(getattr(inner, "layers", None), nn.ModuleList):
        raise PlanError(f"{type(model).__name__} has no model.layers ModuleList: not a decoder "
                        "stowage.measure.hf_profile knows")
    return inner


def layer_kind(layer: nn.Module) -> tuple:
    """What makes two decoder layers cost the same: their module tree, parameter shapes and the
    attributes that choose a code path (attention_type: sliding or full)."""
    sig = []
    for name, m in layer.named_modules():
        attrs = tuple((a, repr(getattr(m, a))) for a in ("attention_type", "sliding_window",
                                                         "is_sliding", "layer_type")
                      if hasattr(m, a) and not callable(getattr(m, a)))
        params = tuple((n, tuple(p.shape), str(p.dtype))
                       for n, p in m.named_parameters(recurse=False))
        sig.append((name, type(m).__name__, params, attrs))
    return tuple(sig)


@dataclasses.dataclass
class HfModel:
    """The model measure_hf runs: one layer per kind, and what the full depth has."""
    model: nn.Module
    kinds: list[int]           # per layer of the full model: its kind (index into `layers`)
    kind_names: list[str]      # per kind: the class name of its layer
    weights_bytes: int         # the full-depth text decoder's and LM head's parameters
    parameters: int            # their count
    model_type: str
    fake: bool
    mode: Any = None           # the FakeTensorMode the model lives in
    dtype: Any = None          # the weights' (and so the gradients') dtype


def build_hf_model(config: Any, *, dtype: torch.dtype = torch.bfloat16, fake: bool = True,
                   one_per_kind: bool = True) -> HfModel:
    """The transformers model of `config` with one decoder layer per distinct kind (every
    layer with one_per_kind=False)."""
    d = read_config(config)
    cfg = build_config(d)
    fake_mode = None
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode
        fake_mode = FakeTensorMode()
    torch.manual_seed(0)
    ctx = fake_mode if fake_mode is not None else contextlib.nullcontext()
    with ctx:
        auto, model_class = _model_class(cfg)
        if not getattr(model_class, "_supports_sdpa", True):
            # Gemma 2, gpt-oss: the class refuses SDPA (soft-capping, sinks) and transformers
            # runs eager attention, as the hf profile's recipe does (Note [hf dialects]).
            cfg._attn_implementation = "eager"
        model = (auto.from_config(cfg, dtype=dtype) if auto is not model_class else
                 model_class._from_config(cfg, dtype=dtype))
    model.train()
    decoder = decoder_of(model)
    text = _text_parameters(model, decoder)
    weights = sum(storage_nbytes(p) for p in text)
    parameters = sum(p.numel() for p in text)
    signatures: list[tuple] = []
    kinds = []
    for layer in decoder.layers:
        sig = layer_kind(layer)
        if sig not in signatures:
            signatures.append(sig)
        kinds.append(signatures.index(sig))
    firsts = [kinds.index(k) for k in range(len(signatures))]
    names = [type(decoder.layers[i]).__name__ for i in firsts]
    if one_per_kind:
        _keep_layers(decoder, firsts)
    else:
        kinds = list(range(len(kinds)))
        names = [type(layer).__name__ for layer in decoder.layers]
    return HfModel(model=model, kinds=kinds, kind_names=names, weights_bytes=weights,
                   parameters=parameters, model_type=d["model_type"], fake=fake, mode=fake_mode,
                   dtype=dtype)


def _keep_layers(decoder: nn.Module, keep: list[int]) -> None:
    """Note [One layer per kind]: the decoder keeps only the layers `keep` (model order). Its
    forward hands the j-th layer what the config says of layer j: `causal_mask_mapping[self.
    config.layer_types[i]]` and `position_embeddings[...layer_types[i]]` (Olmo3Model, Llama4Text
    Model, Gemma2/3, gpt-oss, Qwen2/3, Qwen3-Next, ...), Mllama's `idx in self.
    cross_attention_layers`; so those lists are cut to the kept layers too. Left as they were,
    the kept layers would run with their neighbours' masks (OLMo 3's full layer, fourth of four,
    took the second layer's sliding-window mask; Llama 4's NoPE layer the RoPE layers' chunk
    mask above 8192 tokens)."""
    decoder.layers = nn.ModuleList([decoder.layers[i] for i in keep])
    cfg = getattr(decoder, "config", None)
    types = getattr(cfg, "layer_types", None)
    if isinstance(types, (list, tuple)) and len(types) > max(keep):
        cfg.layer_types = [types[i] for i in keep]
    cross = getattr(decoder, "cross_attention_layers", None)
    if isinstance(cross, (list, tuple)):
        decoder.cross_attention_layers = [j for j, i in enumerate(keep) if i in cross]


__all__ = ["HfModel", "build_config", "build_hf_model", "decoder_of", "layer_kind",
           "read_config"]
