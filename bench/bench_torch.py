#!/usr/bin/env python3
"""Trains one model under what PyTorch users pick today and under stowage plans, side by side.

Modes: keep everything; full per-layer recompute (torch.utils.checkpoint, non-reentrant);
torch.autograd.graph.save_on_cpu (pinned on CUDA); stowage plans from the C++ planner (through
the C ABI, from the profile the package measures) for several device-memory budgets. Prints a
table: step time, peak device memory over the fixed memory (weights, gradients, the input:
torch.cuda.max_memory_allocated minus what is allocated between steps), the plan's predicted
peak and step time, and the pinned host memory used.

Default model: 12 MLP blocks (pre-norm, a 4x-wide GELU MLP, residual) at 32K tokens, hidden
4096, bf16, and a
transformer with causal attention of the same size. `--device cpu --small` runs everything on
the CPU with small sizes (the runtime's host backend), so the program is exercised without a GPU;
on CPU there is no allocator peak to measure, so that column shows only predictions.

    bench/bench_torch.py                         # H200: both models, default budgets
    bench/bench_torch.py --device cpu --small    # anywhere

The runtime library is found as the package finds it (STOWAGE_LIBRARY, ...); the package is
imported from python when it is not installed.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import time
from typing import Callable, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint as ckpt  # noqa: E402

import stowage  # noqa: E402
from stowage import plan as plan_mod  # noqa: E402
from stowage import planner  # noqa: E402


# -- models -----------------------------------------------------------------------------------
class MLPBlock(nn.Module):
    """Pre-norm, a 4x-wide GELU MLP, residual: the default model's block."""

    def __init__(self, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    if hasattr(F, "scaled_dot_product_attention"):  # torch 2.x: flash / memory-efficient
        # (batch, heads, seq, dim): the fused kernels want 4-D inputs.
        return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
    s = q.shape[-2]
    att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    return att.masked_fill(mask, float("-inf")).softmax(-1) @ v


class AttentionBlock(nn.Module):
    """Pre-norm transformer block: causal multi-head attention, then a GELU MLP."""

    def __init__(self, hidden: int, head_dim: int = 128):
        super().__init__()
        self.heads = max(1, hidden // head_dim)
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(s, 3, self.heads, h // self.heads).permute(1, 2, 0, 3)
        y = causal_attention(q, k, v).transpose(0, 1).reshape(s, h)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


BLOCKS = {"mlp": MLPBlock, "attention": AttentionBlock}


def loss_fn(y: torch.Tensor) -> torch.Tensor:
    return y.float().square().mean()


# -- measurement ------------------------------------------------------------------------------
class Row:
    def __init__(self, mode: str):
        self.mode = mode
        self.budget: Optional[int] = None
        self.step_s: Optional[float] = None
        self.peak: Optional[int] = None
        self.pred_peak: Optional[int] = None
        self.pred_s: Optional[float] = None
        self.host: Optional[int] = None
        self.policies = ""
        self.note = ""


class Bench:
    def __init__(self, args: argparse.Namespace, kind: str):
        self.args = args
        self.kind = kind
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[args.dtype]
        torch.manual_seed(0)
        self.layers = nn.ModuleList([BLOCKS[kind](args.hidden) for _ in range(args.layers)]).to(
            device=self.device, dtype=dtype)
        self.x0 = torch.randn(args.tokens, args.hidden, device=self.device, dtype=dtype,
                              requires_grad=True)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def forward_plain(self, recompute: bool) -> torch.Tensor:
        x = self.x0
        for b in self.layers:
            x = ckpt.checkpoint(b, x, use_reentrant=False) if recompute else b(x)
        return loss_fn(x)

    def measure(self, step: Callable[[], None]) -> tuple[float, Optional[int]]:
        """(seconds per step, peak over what is allocated between steps)."""
        for _ in range(self.args.warmup):
            step()
        self.sync()
        base = 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
        t = time.perf_counter()
        for _ in range(self.args.steps):
            step()
        self.sync()
        dt = (time.perf_counter() - t) / self.args.steps
        peak = torch.cuda.max_memory_allocated(self.device) - base if self.cuda else None
        return dt, peak

    def run_baseline(self, mode: str) -> Row:
        row = Row(mode)

        def step() -> None:
            if mode == "save_on_cpu":
                with torch.autograd.graph.save_on_cpu(pin_memory=self.cuda):
                    loss = self.forward_plain(False)
            else:
                loss = self.forward_plain(mode == "recompute")
            loss.backward()

        try:
            row.step_s, row.peak = self.measure(step)
        except RuntimeError as e:  # torch 1.x raises RuntimeError for CUDA OOM
            row.note = _oom_note(e)
        if mode == "save_on_cpu":
            row.host = self.save_on_cpu_host_bytes()
        elif mode in ("keep", "recompute"):
            sim = planner.evaluate(self.profile, [mode] * len(self.layers))
            row.pred_peak = sim.peak_device_bytes - sim.fixed_device_bytes
            row.pred_s, row.host = sim.step_seconds, 0
        return row

    def save_on_cpu_host_bytes(self) -> int:
        """Bytes save_on_cpu copies to the host in one step: every saved tensor, weights too."""
        total = [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = self.forward_plain(False)
        del loss
        return total[0]

    def run_stowage(self, budget: int) -> Row:
        row = Row("stowage")
        row.budget = budget
        try:
            # The table's budgets are over the fixed memory; the planner's is the whole device.
            plan = stowage.plan_for_budget(self.layers, self.x0,
                                           self.profile.fixed_device_bytes + budget,
                                           loss_fn=loss_fn, profile=self.profile,
                                           prefetch_distance=self.args.prefetch_distance)
        except stowage.BudgetTooSmallError as e:
            row.note = "infeasible: " + str(e).split(";")[0]
            return row
        fixed = plan.predicted.fixed_device_bytes
        row.pred_peak = plan.predicted.peak_device_bytes - fixed
        row.pred_s = plan.predicted.step_seconds
        row.policies = _policy_summary(plan.policies())
        if self.args.plans_dir:
            os.makedirs(self.args.plans_dir, exist_ok=True)
            plan.save(os.path.join(self.args.plans_dir,
                                   f"{self.kind}-{budget / 2**30:.2f}GiB.plan.json"))
        try:
            planned = stowage.PlannedLayers(self.layers, plan)
        except stowage.StowageError as e:  # e.g. host memory admission refused the arena
            row.note = f"runtime: {e}"
            return row
        try:
            def step() -> None:
                with planned.step():
                    loss = loss_fn(planned(self.x0))
                    loss.backward()

            row.step_s, row.peak = self.measure(step)
            s = planned.stats()
            row.host = s.arena_peak_bytes if s is not None else 0
            if row.peak is not None:
                planned.report_device_peak(row.peak + fixed)
        except RuntimeError as e:
            row.note = _oom_note(e)
        finally:
            planned.close()
            planned = None  # the step closure's reference too: the layers' memory goes now
        return row

    def run(self) -> list[Row]:
        a = self.args
        print(f"\n== {self.kind}: {a.layers} layers, {a.tokens} tokens, hidden {a.hidden}, "
              f"{a.dtype}, {self.device} (torch {torch.__version__}) ==", flush=True)
        self.profile = stowage.profile_layers(self.layers, self.x0, loss_fn=loss_fn)
        p = self.profile
        print(f"profile: saved/layer {_fmt(p.layers[-1].saved_bytes)}, input/layer "
              f"{_fmt(p.layers[-1].input_bytes)}, fwd {p.layers[-1].forward_seconds * 1e3:.2f} "
              f"ms, bwd {p.layers[-1].backward_seconds * 1e3:.2f} ms, D2H "
              f"{p.d2h_bytes_per_second / 1e9:.1f} GB/s, H2D {p.h2d_bytes_per_second / 1e9:.1f} "
              f"GB/s, memory {'measured' if p.measured_memory else 'estimated'}", flush=True)
        print(_header(), flush=True)
        rows = []
        for mode in ("keep", "recompute", "save_on_cpu"):
            rows.append(self.run_baseline(mode))
            _free(self)
            print(_format_row(rows[-1]), flush=True)
        for budget in self.budgets(rows):
            rows.append(self.run_stowage(budget))
            _free(self)
            print(_format_row(rows[-1]), flush=True)
        return rows

    def budgets(self, rows: list[Row]) -> list[int]:
        if self.args.budgets_gib:
            return [int(float(b) * 2**30) for b in self.args.budgets_gib.split(",")]
        n = len(self.layers)

        def sim(policy: str) -> int:  # predicted peak over the fixed memory
            e = planner.evaluate(self.profile, [policy] * n)
            return e.peak_device_bytes - e.fixed_device_bytes
        by = {r.mode: r for r in rows}
        keep = by["keep"].peak or sim("keep")
        rec = by["recompute"].peak or sim("recompute")
        floor = sim("offload_input")
        soc = by["save_on_cpu"].peak
        tight = int(1.25 * soc) if soc else int(1.1 * floor)
        out = [max(tight, int(floor * 1.02)), rec, (rec + keep) // 2, int(0.75 * keep)]
        return sorted(set(out))


def _policy_summary(policies: list[str]) -> str:
    short = {"keep": "K", "recompute": "R", "selective_recompute": "s", "offload_input": "I",
             "offload_saved": "S"}
    return "".join(short[p] for p in policies)


def _oom_note(e: RuntimeError) -> str:
    if "out of memory" in str(e):
        return "out of device memory"
    raise e


def _free(bench: Bench) -> None:
    for p in bench.layers.parameters():
        p.grad = None
    bench.x0.grad = None
    gc.collect()
    if bench.cuda:
        torch.cuda.empty_cache()


_UNIT = (2**30, "GiB")


def _fmt(n: Optional[float]) -> str:
    return "-" if n is None else f"{n / _UNIT[0]:.3f}"


def _format_row(r: Row) -> str:
    budget = "" if r.budget is None else _fmt(r.budget)
    ms = "-" if r.step_s is None else f"{r.step_s * 1e3:.1f}"
    pms = "-" if r.pred_s is None else f"{r.pred_s * 1e3:.1f}"
    return (f"{r.mode:<12} {budget:>9} {ms:>10} {_fmt(r.peak):>10} {_fmt(r.pred_peak):>10} "
            f"{pms:>10} {_fmt(r.host):>9}  {r.policies} {r.note}").rstrip()


def _header() -> str:
    u = _UNIT[1]
    return (f"{'mode':<12} {'budget':>9} {'step ms':>10} {'peak':>10} {'pred peak':>10} "
            f"{'pred ms':>10} {'host':>9}  policies (K keep, R recompute, s selective_recompute, "
            f"I offload_input, S offload_saved); memory in {u} over the fixed memory "
            "(weights, grads, input)")


def _targets(rows: list[Row]) -> list[str]:
    """The targets stowage's plans are held to against the PyTorch modes (step time at a peak
    near save_on_cpu's or halfway between recompute's and keep's; predictions within 10% and
    15%), checked where the measurements allow (device peaks: CUDA only)."""
    by = {r.mode: r for r in rows if r.mode != "stowage"}
    st = [r for r in rows if r.mode == "stowage" and r.step_s is not None]
    rec, soc, keep = by["recompute"], by["save_on_cpu"], by["keep"]
    out = []
    if None in (rec.peak, soc.peak, keep.peak, rec.step_s):
        return ["targets: need measured device peaks (CUDA)"]
    near = [r for r in st if r.peak <= 1.25 * soc.peak]
    if near:
        best = min(near, key=lambda r: r.step_s)
        out.append(f"peak <= 1.25x save_on_cpu: best step {best.step_s * 1e3:.1f} ms = "
                   f"{best.step_s / rec.step_s:.3f}x recompute (target <= 1.05)")
    else:
        out.append("peak <= 1.25x save_on_cpu: no stowage run reached it")
    half = (rec.peak + keep.peak) / 2
    mid = [r for r in st if r.peak <= half]
    if mid:
        best = min(mid, key=lambda r: r.step_s)
        out.append(f"peak <= halfway recompute..keep: best step {best.step_s / rec.step_s:.3f}x "
                   "recompute (target < 1)")
    for r in st:
        out.append(f"budget {_fmt(r.budget)}: predicted peak "
                   f"{100 * (r.pred_peak / r.peak - 1):+.1f}% (target within 10%), step "
                   f"{100 * (r.pred_s / r.step_s - 1):+.1f}% (target within 15%)")
    return out


# -- --overhead: the wrapper's cost per saved tensor ----------------------------------------------
class ManySaves(nn.Module):
    """`saves` elementwise ops in a row, each saving its own input for backward (sin saves x):
    a layer made of many small saved tensors, so per-tensor costs dominate the step."""

    def __init__(self, saves: int):
        super().__init__()
        self.saves = saves

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.saves):
            x = torch.sin(x)
        return x


def _saved_bytes_per_layer(layers: nn.ModuleList, x0: torch.Tensor) -> list[int]:
    """Bytes each layer saves for backward (distinct tensors), as an offload_saved layer sends
    them to the host: what its plan entry must reserve."""
    out = []
    x = x0
    for layer in layers:
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            seen[t.data_ptr()] = t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            x = layer(x)
        out.append(sum(seen.values()))
    return out


def _overhead_row(args: argparse.Namespace, elements: int) -> tuple:
    layers = nn.ModuleList([ManySaves(args.saves_per_layer) for _ in range(args.layers)])
    x0 = torch.randn(elements, requires_grad=True)
    per_layer = _saved_bytes_per_layer(layers, x0)
    # Every layer offload_saved, each prefetched when the backward of the layer after it starts
    # (prefetch distance 1), so restores find their bytes landed as in a planned step.
    last = len(per_layer) - 1
    plan = stowage.Plan(
        layers=[stowage.LayerPlan(index=i, type="many_saves", policy="offload_saved",
                                  host_bytes=b, transfers=[stowage.Transfer("saved", b)],
                                  prefetch_after_layer=min(i + 1, last))
                for i, b in enumerate(per_layer)],
        runtime=plan_mod.RuntimeSettings(host_arena_bytes=sum(per_layer)))
    planned = stowage.PlannedLayers(layers, plan, backend="host")

    def forward_plain() -> torch.Tensor:
        x = x0
        for layer in layers:
            x = layer(x)
        return x

    def torch_hooks() -> None:
        # The baseline: torch's own hooks moving every saved tensor, as a plain copy.
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
            y = forward_plain()
        y.sum().backward()

    def with_stowage() -> None:
        with planned.step():
            planned(x0).sum().backward()

    def no_hooks() -> None:
        forward_plain().sum().backward()

    modes = (no_hooks, torch_hooks, with_stowage)
    wall: dict = {m: [] for m in modes}
    cpu: dict = {m: [] for m in modes}
    for rep in range(args.warmup + args.repeats):
        for m in modes:  # interleaved: load on the machine hits every mode alike
            t, c = time.perf_counter(), time.process_time()
            m()
            if rep >= args.warmup:
                wall[m].append(time.perf_counter() - t)
                cpu[m].append(time.process_time() - c)
    before = planned.stats().saves_total
    with_stowage()
    n = planned.stats().saves_total - before
    planned.close()
    want = args.layers * args.saves_per_layer
    if n != want:
        raise RuntimeError(f"stowage saved {n} tensors per step but the layers save {want}")
    per = lambda v: statistics.median(v) / n * 1e6  # noqa: E731
    return (elements * 4, n, [per(wall[m]) for m in modes], [per(cpu[m]) for m in modes])


def run_overhead(args: argparse.Namespace) -> int:
    """Per saved tensor: what stowage adds over torch's saved_tensors_hooks doing a plain copy.
    Wall time is what a step takes; CPU time (all of the process's threads, the copy workers
    included) is what it costs, and is the steadier figure on a machine shared with other work."""
    torch.set_num_threads(1)
    print(f"overhead: {args.layers} offload_saved layers x {args.saves_per_layer} saved tensors, "
          f"fp32, CPU, host backend, median of {args.repeats} steps (torch {torch.__version__}); "
          "us per saved tensor; baseline = saved_tensors_hooks(pack=clone)")
    print(f"{'':>23} {'--------- wall ----------':>34}   {'---------- cpu ----------':>34}")
    cols = f"{'no hooks':>8} {'baseline':>8} {'stowage':>8} {'added':>7}"
    print(f"{'tensor bytes':>12} {'saved/step':>10} {cols}   {cols}")
    for elements in (int(e) for e in args.tensor_elements.split(",")):
        nbytes, n, wall, cpu = _overhead_row(args, elements)
        cells = ["   ".join(f"{p:>8.1f} {b:>8.1f} {s:>8.1f} {s - b:>7.1f}" for p, b, s in (v,))
                 for v in (wall, cpu)]
        print(f"{nbytes:>12} {n:>10} {cells[0]}   {cells[1]}", flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="torch device to run on (default: cuda when torch sees one, else cpu)")
    ap.add_argument("--small", action="store_true",
                    help="4 layers, 128 tokens, hidden 64, fp32: seconds on a CPU")
    ap.add_argument("--model", default="all", choices=["mlp", "attention", "all"],
                    help="layer kind: SwiGLU MLP blocks, attention blocks, or both in turn")
    ap.add_argument("--layers", type=int, help="layers in the model (default: 12; --small: 4; "
                    "--overhead: 8)")
    ap.add_argument("--tokens", type=int, help="tokens per step (default: 32768; --small: 128)")
    ap.add_argument("--hidden", type=int, help="hidden size (default: 4096; --small: 64)")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"],
                    help="parameter and activation dtype (default: bf16; --small: fp32)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per mode")
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed steps per mode before the timed ones")
    ap.add_argument("--budgets-gib", help="comma-separated device budgets over the fixed memory "
                    "(weights, grads, input; the planner gets fixed + budget as "
                    "gpu_budget_bytes); default: 1.25x save_on_cpu's peak, recompute's, "
                    "halfway to keep's, 0.75x keep's")
    ap.add_argument("--prefetch-distance", type=int,
                    help="fix the prefetch distance (default: the planner chooses)")
    ap.add_argument("--plans-dir", help="write each stowage plan's JSON here")
    ap.add_argument("--overhead", action="store_true",
                    help="instead: per saved tensor, the wrapper's cost over torch's "
                    "saved_tensors_hooks (CPU, host backend)")
    ap.add_argument("--saves-per-layer", type=int, default=256,
                    help="--overhead: saved tensors per layer and step")
    ap.add_argument("--tensor-elements", default="16,1024,16384",
                    help="--overhead: comma-separated sizes (fp32 elements) of the saved tensors")
    ap.add_argument("--repeats", type=int, default=21, help="--overhead: timed steps per mode")
    return ap


def main() -> int:
    args = build_parser().parse_args()
    if args.overhead:
        args.layers = args.layers or 8
        return run_overhead(args)
    small = dict(layers=4, tokens=128, hidden=64, dtype="fp32")
    full = dict(layers=12, tokens=32768, hidden=4096, dtype="bf16")
    for key, value in (small if args.small else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_torch: --device cuda but torch sees no CUDA device; use --device cpu --small",
              file=sys.stderr)
        return 2
    if args.small and args.device == "cpu":
        torch.set_num_threads(1)  # tiny matrices: threads cost more than they give
    global _UNIT
    if args.small:
        _UNIT = (2**20, "MiB")
    kinds = ["mlp", "attention"] if args.model == "all" else [args.model]
    print(f"stowage {stowage.__version__} (runtime {stowage.version()}); command: "
          f"{' '.join(['bench/bench_torch.py'] + sys.argv[1:])}")
    for kind in kinds:
        bench = Bench(args, kind)
        rows = bench.run()
        for line in _targets(rows):
            print("  " + line)
        del bench
        gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
