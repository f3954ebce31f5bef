#!/usr/bin/env python3
"""torch._grouped_mm at the shapes of an MoE layer, each pass timed apart: a table of TFLOP/s.

    python3 bench/bench_grouped_mm.py [--out rates.json] [--device cuda] [--rows 256,512,...]

What it times is what autograd runs for transformers' grouped_mm experts (integrations/moe.py
grouped_mm_experts_forward; planner/hardware/hardware.cc Note [torch._grouped_mm rate]), per
projection with K inputs and N outputs per expert and S routed rows:

    forward          x [S, K] @ W [E, N, K]^T   -> [S, N]      (2-D x 3-D, groups of rows)
    input gradient   g [S, N] @ W [E, N, K]     -> [S, K]      (2-D x 3-D)
    weight gradient  g^T [N, S] @ x [S, K]      -> [E, N, K]   (2-D x 2-D, groups of the reduction)

for the experts' gate/up projection (K = hidden, N = 2 x moe_intermediate) and down projection
(K = moe_intermediate, N = hidden). The backward calls are checked once against torch.autograd.grad
of the forward: the same _grouped_mm operands (shapes and strides, seen by a TorchDispatchMode) and
values. Rows per expert come from routing: top-k of random logits over the experts (counts not
multiples of any tile, as in a routed training step), and once with every expert given exactly the
same count ("aligned"), the public benchmark's "uniform" case. A dense torch.mm with the FLOPs of
the gate/up forward at 512 rows per expert is the reference. Rows per expert at or below 128 take
another kernel (GroupMM.cu's pingpong 64x128x128 tiles) and are left out of the default list.

Each time is CUDA-event timed over enough calls to run >= 50 ms after a warm-up call, on data
that is not zero. `--out` writes the JSON `stowage calibrate --torch-grouped-mm` reads (rates in
FLOP/s; calibrate divides by its profile's dense_bf16_flops). `--device cpu` runs the same code
on small shapes for a smoke test (the times mean nothing there). Exits 3 when the device is not
there (no CUDA device, or a torch without _grouped_mm).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable, Dict, List

EXIT_UNAVAILABLE = 3  # cli/commands.h kExitUnavailable: the gpu-check runner's "skip"
PASSES = ("forward", "input_gradient", "weight_gradient")


def parse_rows(text: str) -> List[int]:
    rows = [int(r) for r in text.split(",") if r.strip()]
    if not rows or any(r <= 0 for r in rows):
        raise argparse.ArgumentTypeError(f"--rows {text!r}: positive integers, comma-separated")
    return rows


def seconds_per_call(torch, device: str, run: Callable[[], object]) -> float:
    run()  # warm-up: a first call initialises its kernel (CUTLASS's, cuDNN's graph)
    if device != "cuda":
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 1
    while True:
        start.record()
        for _ in range(reps):
            run()
        stop.record()
        stop.synchronize()
        ms = start.elapsed_time(stop)
        if ms >= 50 or reps >= 1 << 14:
            return ms * 1e-3 / reps
        reps *= max(2, min(64, int(60 / ms) + 1)) if ms > 0 else 64


def routed_counts(torch, experts: int, top_k: int, rows: int, aligned: bool, gen):
    """Rows per expert for `rows` rows per expert on average: an int64 tensor of `experts`."""
    if aligned:
        return torch.full((experts,), rows, dtype=torch.int64)
    tokens = rows * experts // top_k
    logits = torch.randn(tokens, experts, generator=gen)
    ids = logits.topk(top_k, dim=-1).indices.reshape(-1)
    return torch.bincount(ids, minlength=experts)


def projection(torch, device: str, counts, k: int, n: int, gen) -> Dict[str, Callable[[], object]]:
    """The three passes of one projection over `counts` rows per expert, as callables."""
    experts, rows = counts.numel(), int(counts.sum())
    offs = torch.cumsum(counts, 0).to(torch.int32).to(device)
    # Small, finite, not zero: zeros draw less power and clock higher than training data. Made
    # on the device (`gen` is the device's generator): gigabytes of randn on one CPU thread
    # would take longer than the timing.

    def randn(*shape: int, scale: float):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(torch.bfloat16)

    x, w, g = randn(rows, k, scale=0.1), randn(experts, n, k, scale=0.02), randn(rows, n, scale=0.1)
    return {
        "forward": lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs),
        "input_gradient": lambda: torch._grouped_mm(g, w, offs=offs),
        "weight_gradient": lambda: torch._grouped_mm(g.t(), x, offs=offs),
        "_tensors": lambda: (x, w, g, offs),
    }


def grouped_mm_layouts(torch, run: Callable[[], object]) -> List[tuple]:
    """(shape, strides) of both operands of every aten._grouped_mm that `run` dispatches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: List[tuple] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._grouped_mm.default:
                self.calls.append(tuple((tuple(a.shape), tuple(a.stride())) for a in args[:2]))
            return func(*args, **(kwargs or {}))

    with Record() as r:
        run()
    return r.calls


def check_against_autograd(torch, passes: Dict[str, Callable[[], object]]) -> str:
    """Whether the timed backward passes are autograd's own: the same _grouped_mm calls
    (operand shapes and strides) and the same values. Returns "" or what differs."""
    x, w, g, offs = passes["_tensors"]()
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    out = torch._grouped_mm(xr, wr.transpose(-2, -1), offs=offs)
    grads: List[object] = []
    theirs = grouped_mm_layouts(
        torch, lambda: grads.extend(torch.autograd.grad(out, (xr, wr), g)))
    mine = grouped_mm_layouts(torch, passes["input_gradient"]) + grouped_mm_layouts(
        torch, passes["weight_gradient"])
    if sorted(theirs) != sorted(mine):
        return f"autograd runs {sorted(theirs)}, the timed passes {sorted(mine)}"
    for timed, ref in ((passes["input_gradient"](), grads[0]),
                       (passes["weight_gradient"](), grads[1])):
        scale = float(ref.float().abs().max()) or 1.0
        if float((timed.float() - ref.float()).abs().max()) > 1e-2 * scale:
            return "the timed passes' values differ from autograd's"
    return ""


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--out", help="write the measurement JSON here")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--moe-intermediate", type=int, default=768)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--rows", type=parse_rows, default=[256, 512, 1024, 2048],
                    help="rows per expert, routed (default 256,512,1024,2048)")
    ap.add_argument("--aligned-rows", type=int, default=512,
                    help="rows per expert of the aligned case; 0: none (default 512)")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print(f"bench_grouped_mm: no torch ({e})", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if not hasattr(torch, "_grouped_mm"):
        print(f"bench_grouped_mm: torch {torch.__version__} has no _grouped_mm", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_grouped_mm: no CUDA device", file=sys.stderr)
        return EXIT_UNAVAILABLE
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    e, h, fe = args.experts, args.hidden, args.moe_intermediate
    shapes = {"gate_up": (h, 2 * fe), "down": (fe, h)}  # (K, N) per expert
    gen = torch.Generator().manual_seed(0)  # the routing
    data_gen = torch.Generator(device=args.device).manual_seed(1)  # the operands
    print(f"torch {torch.__version__}, {device_name}: torch._grouped_mm, {e} experts, hidden {h}, "
          f"moe_intermediate {fe}, top-{args.top_k}")
    print(f"{'rows/expert':>11} {'routing':8} {'projection':10} {'pass':16} {'ms':>9} "
          f"{'TFLOP/s':>8}")
    cases = [(r, False) for r in args.rows]
    if args.aligned_rows > 0:
        cases.append((args.aligned_rows, True))
    points, failures = [], []
    autograd_mismatch = None
    for rows, aligned in cases:
        routing = "aligned" if aligned else "routed"
        try:
            counts = routed_counts(torch, e, args.top_k, rows, aligned, gen)
            seconds: Dict[str, float] = {}
            flops = 0.0
            for name, (k, n) in shapes.items():
                passes = projection(torch, args.device, counts, k, n, data_gen)
                if autograd_mismatch is None:
                    autograd_mismatch = check_against_autograd(torch, passes)
                pass_flops = 2.0 * float(counts.sum()) * k * n
                for p in PASSES:
                    s = seconds_per_call(torch, args.device, passes[p])
                    seconds[f"{name}.{p}"] = s
                    flops += pass_flops
                    print(f"{rows:>11} {routing:8} {name:10} {p:16} {s * 1e3:9.3f} "
                          f"{pass_flops / s / 1e12:8.1f}")
                del passes
            total = sum(seconds.values())
            print(f"{rows:>11} {routing:8} {'both':10} {'all six':16} {total * 1e3:9.3f} "
                  f"{flops / total / 1e12:8.1f}")
            points.append({"rows_per_expert": float(counts.sum()) / e, "routing": routing,
                           "min_rows": int(counts.min()), "max_rows": int(counts.max()),
                           "flops": flops, "seconds": seconds,
                           "flops_per_second": flops / total})
        except Exception as ex:  # one case failing (e.g. out of memory) keeps the others
            failures.append(f"{rows} rows per expert, {routing}: {type(ex).__name__}: {ex}")
            print(f"{rows:>11} {routing:8} failed: {type(ex).__name__}: {ex}")
    m, k, n = 512 * e, h, 2 * fe
    a = (torch.randn(m, k, generator=data_gen, device=args.device) * 0.1).to(torch.bfloat16)
    b = (torch.randn(k, n, generator=data_gen, device=args.device) * 0.02).to(torch.bfloat16)
    dense_s = seconds_per_call(torch, args.device, lambda: torch.mm(a, b))
    dense = 2.0 * m * k * n / dense_s
    print(f"dense torch.mm {m}x{n}x{k}: {dense_s * 1e3:.3f} ms, {dense / 1e12:.1f} TFLOP/s")
    print("timed backward passes are autograd's (same _grouped_mm operands and values): " +
          ("yes" if not autograd_mismatch else f"NO: {autograd_mismatch}"))
    for f in failures:
        print(f"failed: {f}", file=sys.stderr)
    if not points:
        return 1
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"kernel": "torch._grouped_mm", "device": device_name,
                       "torch": torch.__version__, "experts": e, "hidden": h,
                       "moe_intermediate": fe, "top_k": args.top_k,
                       "dense_mm_flops_per_second": dense,
                       "matches_autograd": not autograd_mismatch, "points": points},
                      f, indent=2)
            f.write("\n")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
