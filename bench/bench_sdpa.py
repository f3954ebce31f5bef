#!/usr/bin/env python3
"""SDPA at the attention shapes of the measured transformers cases, forward and backward timed
apart: a table of TFLOP/s and the kernel torch picked.

    python3 bench/bench_sdpa.py [--out sdpa.json] [--device cuda] [--cases NAME:HQ:HKV:D:S1,S2;...]

What it times is what transformers' sdpa_attention_forward runs for a causal decoder without a
padding mask (integrations/sdpa_attention.py: no mask, so use_gqa_in_sdpa() is true and k/v are not
repeated; `is_causal=True`): F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hkv
< hq) on bf16 q [1, hq, s, d], k and v [1, hkv, s, d], each the transpose of a [1, s, h, d]
projection output as the model makes them, and its backward (autograd.grad of all three inputs).
FLOPs are counted as the planner counts them (planner/hardware/op_time.h, Note [Op rates]): forward
4 s^2 hq d halved by the causal mask, backward 2.5x the forward. The kernel is the aten op autograd
recorded (_scaled_dot_product_cudnn_attention, _flash_attention, _efficient_attention or the math
decomposition), read from torch.profiler. The backward is timed alone: one forward's graph, its
autograd.grad rerun (retain_graph).

The H200 preset's attention rates (flash_forward_efficiency, flash_backward_efficiency) are cuDNN
9.19's on an H200 from cudnn-frontend's own benchmark at 64/8 heads (planner/hardware/hardware.cc
Note [SDPA on sm90]: 673 / 579 TFLOP/s at 16K tokens, the kernel torch 2.11 picks for this call);
this table is the H200's own at the public and held-back measured cases' shapes
(tests/planner/data/measured: Llama 32/8 heads, Qwen2 28/4, Qwen3-MoE 32/4, head dim 128), and its
kernel column says whether cuDNN ran.

Each time is CUDA-event timed over enough calls to run >= 50 ms after a warm-up call. `--device
cpu` runs the same code on small shapes for a smoke test (the times mean nothing there). Exits 3
when the device is not there (no CUDA device, or a torch without enable_gqa: before 2.5).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, List, Tuple

# The one CUDA-event timing loop of the benchmarks: bench_grouped_mm.py's, the file beside this
# one (in bench/ and in the gpu-check folder).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_grouped_mm import seconds_per_call  # noqa: E402

EXIT_UNAVAILABLE = 3  # cli/commands.h kExitUnavailable: the gpu-check runner's "skip"
DEFAULT_CASES = ("llama:32:8:128:4096,16384,32768;qwen2:28:4:128:8192,32768;"
                 "qwen3moe:32:4:128:8192,16384")
KERNELS = {  # the aten op autograd records -> the kernel's name in this table
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
}


def parse_cases(text: str) -> List[Tuple[str, int, int, int, List[int]]]:
    cases = []
    for item in (c for c in text.split(";") if c.strip()):
        parts = item.split(":")
        try:
            if len(parts) != 5:
                raise ValueError
            name, hq, hkv, d = parts[0], int(parts[1]), int(parts[2]), int(parts[3])
            lengths = [int(s) for s in parts[4].split(",") if s.strip()]
            if not name or hq <= 0 or hkv <= 0 or hq % hkv or d <= 0 or not lengths or min(
                    lengths) <= 0:
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--cases {item!r}: NAME:HEADS:KV_HEADS:HEAD_DIM:LEN[,LEN...], heads a multiple "
                "of kv heads, every number positive") from None
        cases.append((name, hq, hkv, d, lengths))
    if not cases:
        raise argparse.ArgumentTypeError("--cases is empty")
    return cases


def attention_flops(seq_len: int, heads: int, head_dim: int) -> Tuple[float, float]:
    """Forward and backward FLOPs of causal attention over one sequence (Note [Op rates])."""
    forward = 4.0 * seq_len * seq_len * heads * head_dim / 2
    return forward, 2.5 * forward


def kernel_of(torch, run: Callable[[], object]) -> str:
    """The SDPA kernel `run` dispatches, from the aten ops torch.profiler records."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:  # aten ops are CPU events
        run()
    names = {e.name for e in prof.events()}
    found = [KERNELS[n] for n in KERNELS if n in names]
    return found[0] if found else "math"


def measure(torch, device: str, seq_len: int, hq: int, hkv: int, d: int, gen) -> dict:
    F = torch.nn.functional

    def projected(heads: int):
        # [1, s, h, d] as the projection's view makes it, transposed to [1, h, s, d].
        x = (torch.randn(1, seq_len, heads, d, generator=gen, device=device) * 0.5)
        return x.to(torch.bfloat16).transpose(1, 2).requires_grad_()

    q, k, v = projected(hq), projected(hkv), projected(hkv)
    grad = (torch.randn(1, hq, seq_len, d, generator=gen, device=device) * 0.1).to(
        torch.bfloat16)

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hkv < hq)

    with torch.no_grad():
        forward_s = seconds_per_call(torch, device, forward)
    out = forward()  # one graph, its backward run again and again (retain_graph)
    backward_s = seconds_per_call(
        torch, device, lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))
    fwd_flops, bwd_flops = attention_flops(seq_len, hq, d)
    return {
        "seq_len": seq_len, "heads": hq, "kv_heads": hkv, "head_dim": d,
        "kernel": kernel_of(torch, lambda: torch.autograd.grad(forward(), (q, k, v), grad)),
        "forward_seconds": forward_s, "backward_seconds": backward_s,
        "forward_flops": fwd_flops, "backward_flops": bwd_flops,
        "forward_flops_per_second": fwd_flops / forward_s if forward_s > 0 else 0.0,
        "backward_flops_per_second": bwd_flops / backward_s if backward_s > 0 else 0.0,
    }


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--cases", type=parse_cases, default=parse_cases(DEFAULT_CASES),
                    help="NAME:HEADS:KV_HEADS:HEAD_DIM:LEN[,LEN...] separated by ';' (default: "
                         "the measured cases' attention)")
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="dense bf16 peak the efficiency column divides by (default 989: H100 "
                         "SXM and H200)")
    ap.add_argument("--out", help="write the table as JSON here")
    args = ap.parse_args(argv)
    if not args.peak_tflops > 0:
        ap.error(f"--peak-tflops {args.peak_tflops}: must be > 0")
    try:
        import torch
    except ImportError as e:
        print(f"bench_sdpa: no torch ({e})", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:  # a builtin: no signature to read, so one call on the CPU
        q, kv = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 1, 8)
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except (TypeError, AttributeError):
        print(f"bench_sdpa: torch {torch.__version__} has no SDPA enable_gqa (2.5+)",
              file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_sdpa: no CUDA device", file=sys.stderr)
        return EXIT_UNAVAILABLE
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    gen = torch.Generator(device=args.device).manual_seed(0)
    rows = []
    print(f"SDPA (causal, bf16, transformers' layout) on {device_name}, torch {torch.__version__}")
    print(f"{'case':>10} {'tokens':>7} {'heads':>7} {'kernel':>10} {'fwd ms':>9} {'bwd ms':>9} "
          f"{'fwd TFLOP/s':>12} {'bwd TFLOP/s':>12} {'fwd eff':>8} {'bwd eff':>8}")
    for name, hq, hkv, d, lengths in args.cases:
        for s in lengths:
            row = dict(case=name, **measure(torch, args.device, s, hq, hkv, d, gen))
            rows.append(row)
            fwd, bwd = row["forward_flops_per_second"], row["backward_flops_per_second"]
            print(f"{name:>10} {s:>7} {f'{hq}/{hkv}x{d}':>7} {row['kernel']:>10} "
                  f"{row['forward_seconds'] * 1e3:>9.3f} {row['backward_seconds'] * 1e3:>9.3f} "
                  f"{fwd / 1e12:>12.1f} {bwd / 1e12:>12.1f} "
                  f"{fwd / 1e12 / args.peak_tflops:>8.3f} {bwd / 1e12 / args.peak_tflops:>8.3f}",
                  flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": device_name, "torch": torch.__version__,
                       "peak_flops_per_second": args.peak_tflops * 1e12, "rows": rows}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
