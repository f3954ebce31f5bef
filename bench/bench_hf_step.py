#!/usr/bin/env python3
"""Measured transformers training steps, whole, by the planner's op classes: where the device's
time goes in the steps tests/planner/frameworks/hf_measured_test.cc predicts.

    python3 bench/bench_hf_step.py [--cases FILE] [--only NAME:keep|recompute,...]
                                   [--out hf-step.json] [--device cuda]

Each case is a line of FILE (default tests/planner/data/measured/hf-h200.jsonl, the public
measured cases; its config inline or a file beside FILE), built and stepped as those cases
were measured: AutoConfig.for_model with the line's config,
SDPA, bf16 weights, train(), the model's own loss (`model(input_ids=ids,
labels=ids).loss.backward()`), gradients set to None before each step, and
gradient_checkpointing_enable(use_reentrant=False) where the line says gradient_checkpointing.
For each it prints
  - wall: the synchronized step (median of 3 after 2 warm-ups), beside the line's step_seconds;
  - busy: every kernel's device time from torch.profiler (one step), and wall - busy, the time
    the device idles (launch gaps, the host falling behind);
  - the device time and kernel count of each of the planner's op classes (planner/hardware/op_time.h
    OpWork): dense GEMM (aten mm / addmm / bmm / baddbmm), attention forward and backward (the
    SDPA kernels' aten ops: cuDNN, flash, memory-efficient), grouped GEMM (aten::_grouped_mm),
    and the rest, which the planner prices as memory-bound element-wise work;
  - the aten ops with the most device time.
A kernel counts for the aten op that launched it (the innermost one), so every kernel is in one
class. What it settles: whether the step time hf_measured_test.cc's dense cases miss is
attention's, and what the MoE case's rest is. `--device cpu` runs
each case's family at tiny widths for a smoke test (times are host times and mean nothing).
Exits 3 without a CUDA device or without transformers.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from typing import Dict, List, Optional, Tuple

EXIT_UNAVAILABLE = 3  # cli/commands.h kExitUnavailable: the gpu-check runner's "skip"
SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CASES = os.path.join(SOURCE_DIR, "tests", "planner", "data", "measured", "hf-h200.jsonl")

# The planner's op classes (planner/hardware/op_time.h OpWork), by the aten op that launches the
# kernel.
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm"}
ATTENTION_FORWARD_OPS = {"aten::_scaled_dot_product_cudnn_attention",
                         "aten::_scaled_dot_product_flash_attention",
                         "aten::_scaled_dot_product_efficient_attention",
                         "aten::_flash_attention_forward", "aten::_efficient_attention_forward",
                         "aten::_scaled_dot_product_flash_attention_for_cpu"}
ATTENTION_BACKWARD_OPS = {op + "_backward" for op in ATTENTION_FORWARD_OPS}
GROUPED_OPS = {"aten::_grouped_mm"}
CLASSES = ("gemm", "attention_forward", "attention_backward", "grouped_gemm", "elementwise")

# --device cpu: each family at widths a CPU steps in well under a second.
TINY = {"hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 256, "num_experts": 4, "num_experts_per_tok": 2}
TINY_SEQ_LEN = 64


def op_class(name: str) -> str:
    if name in GEMM_OPS:
        return "gemm"
    if name in ATTENTION_FORWARD_OPS:
        return "attention_forward"
    if name in ATTENTION_BACKWARD_OPS:
        return "attention_backward"
    if name in GROUPED_OPS:
        return "grouped_gemm"
    return "elementwise"


def parse_only(text: str) -> List[Tuple[str, bool]]:
    """NAME:keep|recompute,... -> [(case name, gradient checkpointing)]."""
    picked = []
    for item in (i for i in text.split(",") if i.strip()):
        name, _, policy = item.strip().partition(":")
        if not name or policy not in ("keep", "recompute"):
            raise argparse.ArgumentTypeError(
                f"--only item {item!r}: expected NAME:keep or NAME:recompute (NAME a case of "
                "the cases file, e.g. llama-8layer:keep)")
        picked.append((name, policy == "recompute"))
    return picked


def read_cases(path: str, only: Optional[List[Tuple[str, bool]]]) -> List[dict]:
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    cases = [c for c in lines if "case" in c and "error" not in c]
    for c in cases:  # a line names its config's file beside FILE, or inlines the config
        if isinstance(c["config"], str):
            with open(os.path.join(os.path.dirname(path), c["config"])) as f:
                c["config"] = json.load(f)
    if only is not None:
        chosen = []
        for name, ckpt in only:
            match = [c for c in cases if c["case"] == name and c["gradient_checkpointing"] == ckpt]
            if not match:
                raise ValueError(f"--only {name}:{'recompute' if ckpt else 'keep'}: no such case "
                                 f"in {path}")
            chosen.extend(match)
        cases = chosen
    return cases


def synchronize(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def by_class(prof, device: str) -> Tuple[Dict[str, dict], List[dict], float]:
    """Device time and kernels per op class, the aten ops by device time, and the busy time."""
    classes = {c: {"device_s": 0.0, "kernels": 0} for c in CLASSES}
    ops: Dict[str, List[float]] = {}
    busy = 0.0
    for e in prof.events():
        if device == "cuda":
            seconds = sum(k.duration for k in e.kernels) * 1e-6
            kernels = len(e.kernels)
        else:  # no kernels: each aten op's own host time stands in (a smoke test)
            seconds = e.self_cpu_time_total * 1e-6 if e.name.startswith("aten::") else 0.0
            kernels = 1 if seconds > 0 else 0
        if kernels == 0:
            continue
        c = classes[op_class(e.name)]
        c["device_s"] += seconds
        c["kernels"] += kernels
        op = ops.setdefault(e.name, [0, 0.0])
        op[0] += kernels
        op[1] += seconds
        busy += seconds
    top = [{"op": k, "kernels": v[0], "device_s": v[1]}
           for k, v in sorted(ops.items(), key=lambda kv: -kv[1][1])]
    return classes, top, busy


def measure(torch, transformers, case: dict, device: str) -> dict:
    config = dict(case["config"])
    family = config.pop("model_type")
    seq_len = case["seq_len"]
    if device == "cpu":
        config.update({k: v for k, v in TINY.items() if k in config or k == "head_dim"})
        seq_len = TINY_SEQ_LEN
    cfg = transformers.AutoConfig.for_model(family, **config)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.train()
    if case["gradient_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, cfg.vocab_size, (case.get("micro_batch", 1), seq_len), device=device)

    def step():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()

    for _ in range(2):
        step()
    walls = []
    for _ in range(3):
        synchronize(torch, device)
        start = time.perf_counter()
        step()
        synchronize(torch, device)
        walls.append(time.perf_counter() - start)
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        synchronize(torch, device)
    classes, ops, busy = by_class(prof, device)
    return {"case": case["case"], "seq_len": seq_len,
            "policy": "recompute" if case["gradient_checkpointing"] else "keep",
            "wall_s": statistics.median(walls), "measured_step_s": case.get("step_seconds"),
            "busy_s": busy, "classes": classes, "ops": ops}


def print_result(r: dict, rows: int) -> None:
    wall, busy = r["wall_s"], r["busy_s"]
    measured = r["measured_step_s"]
    ref = f" (reference {measured * 1e3:.1f} ms)" if measured else ""
    print(f"\n{r['case']} {r['policy']}, {r['seq_len']} tokens: wall {wall * 1e3:.1f} ms{ref}, "
          f"busy {busy * 1e3:.1f} ms, idle {(wall - busy) * 1e3:.1f} ms")
    print(f"  {'class':20} {'device ms':>10} {'kernels':>8}")
    for name in CLASSES:
        c = r["classes"][name]
        print(f"  {name:20} {c['device_s'] * 1e3:10.2f} {c['kernels']:8d}")
    print(f"  {'aten op':48} {'kernels':>8} {'device ms':>10}")
    for o in r["ops"][:rows]:
        print(f"  {o['op'][:48]:48} {o['kernels']:8d} {o['device_s'] * 1e3:10.2f}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--cases", default=DEFAULT_CASES,
                    help="measured cases, one JSON line each (default: the public ones)")
    ap.add_argument("--only", type=parse_only,
                    help="NAME:keep|recompute,... (default: every case of the file)")
    ap.add_argument("--out", help="write the measurements as JSON here")
    ap.add_argument("--rows", type=int, default=15, help="aten ops listed per case (default 15)")
    args = ap.parse_args(argv)
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"bench_hf_step: needs torch and transformers ({e})", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_hf_step: no CUDA device", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        cases = read_cases(args.cases, args.only)
    except (OSError, ValueError) as e:
        print(f"bench_hf_step: {e}", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {device_name}")
    results, failures = [], []
    for case in cases:
        torch.manual_seed(0)
        try:
            r = measure(torch, transformers, case, args.device)
        except Exception as ex:  # one case failing (e.g. out of memory) keeps the others
            failures.append(f"{case['case']}: {type(ex).__name__}: {ex}")
            print(f"{case['case']}: failed: {type(ex).__name__}: {ex}")
            continue
        finally:  # the case's model is gone with measure's frame: give its memory back
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
        results.append(r)
        print_result(r, args.rows)
    for f in failures:
        print(f"failed: {f}", file=sys.stderr)
    if args.out and results:
        with open(args.out, "w") as f:
            json.dump({"device": device_name, "torch": torch.__version__,
                       "transformers": transformers.__version__, "results": results}, f, indent=2)
            f.write("\n")
        print(f"written to {args.out}")
    return 0 if results and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
