"""Small models and helpers shared by the PyTorch integration tests (every suite, whatever its
folder: run_tests.py puts this folder on sys.path).

Two layer types: an MLP block (pre-norm, a 4x-wide GELU MLP, residual) and a
pre-norm transformer block with causal attention; both carry dropout so recompute has RNG state
to get right.
"""

from __future__ import annotations

import copy
import importlib.machinery
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
from typing import Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
# The source tree's root: the package is python/stowage, the test data tests/planner/data.
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import stowage  # noqa: E402


def load_tool(name: str):
    """bench/<name>.py as a module: the benchmark scripts are files to run, not a package."""
    path = os.path.join(REPO, "bench", name + ".py")
    loader = importlib.machinery.SourceFileLoader(name, os.path.realpath(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class MLPBlock(nn.Module):
    def __init__(self, hidden: int, dropout: float = 0.1):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln(x)))))


class AttentionBlock(nn.Module):
    def __init__(self, hidden: int, heads: int = 4, dropout: float = 0.1):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                                 nn.Linear(4 * hidden, hidden))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(s, 3, self.heads, h // self.heads).permute(1, 2, 0, 3)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(h // self.heads)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        att = self.drop(att.masked_fill(mask, float("-inf")).softmax(-1))
        y = (att @ v).transpose(0, 1).reshape(s, h)
        x = x + self.drop(self.proj(y))
        return x + self.mlp(self.ln2(x))


def make_layers(kind: str, n: int, hidden: int, device: str = "cpu",
                dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.ModuleList:
    torch.manual_seed(seed)
    block = {"mlp": MLPBlock, "attention": AttentionBlock}[kind]
    return nn.ModuleList([block(hidden) for _ in range(n)]).to(device=device, dtype=dtype)


def loss_fn(y: torch.Tensor) -> torch.Tensor:
    return y.float().square().mean()


def train(layers: nn.ModuleList, x0: torch.Tensor, steps: int,
          planned: Optional["stowage.PlannedLayers"] = None, seed: int = 1,
          after_step: Optional[Callable[[int], None]] = None, record: bool = True) -> list:
    """Runs `steps` SGD steps and returns, per step, (loss, parameter grads, input grad).

    With `planned`, the forward goes through it inside its step(); otherwise the plain layers.
    The RNG is seeded identically so dropout masks are the same in both runs.
    """
    opt = torch.optim.SGD(layers.parameters(), lr=0.1)
    torch.manual_seed(seed)
    out = []
    for k in range(steps):
        opt.zero_grad(set_to_none=True)
        x = x0.detach().clone().requires_grad_(True)
        if planned is None:
            y = x
            for layer in layers:
                y = layer(y)
            loss = loss_fn(y)
            loss.backward()
        else:
            with planned.step():
                loss = loss_fn(planned(x))
                loss.backward()
        if record:
            out.append((loss.detach().clone(),
                        [p.grad.detach().clone() for p in layers.parameters()],
                        x.grad.detach().clone()))
        opt.step()
        if after_step is not None:
            after_step(k)
    return out


def clone_layers(layers: nn.ModuleList) -> nn.ModuleList:
    return copy.deepcopy(layers)


def transformers_flag() -> list:
    """`--transformers` set to the installed transformers release, for an hf plan compared with
    the installed code's measurements (Note [hf transformers versions] in
    planner/frameworks/hf_ffn.cc: the planner's default is the release of the measured reference
    steps); empty without transformers."""
    try:
        import transformers
    except ImportError:
        return []
    return ["--transformers", transformers.__version__]


def planned_saved_per_layer(cli: str, config: dict, seq_len: int, extra: tuple = ()) -> list:
    """Each layer's device_saved_bytes that `stowage plan --framework hf --force keep` predicts for
    a config.json (`config`, with its model_type) at `seq_len` tokens on one GPU, the settings of
    the measured runs; `extra`: more flags."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        out = subprocess.run(
            [cli, "plan", "--model", path, "--hardware", "h200", "--seq-len", str(seq_len),
             "--micro-batch", "1", "--gpus", "1", "--cp", "1", "--ep", "1", "--tp", "1",
             "--sharding", "no_shard", "--framework", "hf", "--optimizer", "none",
             "--grad-dtype", "bf16", "--loss-chunk-tokens", "0", "--force", "keep",
             "--format", "json", *transformers_flag(), *extra], capture_output=True, text=True,
            timeout=120)
    if out.returncode != 0:
        raise AssertionError(out.stdout + out.stderr)
    plan = json.loads(out.stdout)
    assert plan["run"]["framework"] == "hf"
    return [layer["device_saved_bytes"] for layer in plan["layers"]]


def first_layer_inputs(model: nn.Module, ids: torch.Tensor) -> tuple:
    """The hidden state (a leaf that requires grad), the other positional arguments and the
    keyword arguments a transformers causal LM passes its first decoder layer for `ids`."""
    seen: list = []

    def hook(module, args, kwargs):  # type: ignore[no-untyped-def]
        seen.append((args, kwargs))
        raise StopIteration  # one layer call is all we need

    handle = model.model.layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(ids)
    except StopIteration:
        pass
    finally:
        handle.remove()
    args, kwargs = seen[0]
    return args[0].detach().requires_grad_(True), args[1:], kwargs
