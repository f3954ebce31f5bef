#!/usr/bin/env python3
"""One Qwen3-MoE sparse block, forward and backward, kernel by kernel: where its time goes.

    python3 bench/bench_moe_block.py [--out moe-block.json] [--device cuda] [--tokens 8192,16384]

The block is what transformers' Qwen3MoeSparseMoeBlock runs with the default grouped_mm experts
(modeling_qwen3_moe.py Qwen3MoeTopKRouter; integrations/moe.py grouped_mm_experts_forward),
restated op for op in `moe_block` below: the router linear, fp32 softmax, top-k and its
renormalisation, the sort by expert, the gather `hidden[perm // k]`, histc and cumsum into
offsets, the gate/up _grouped_mm, silu(gate) * up, the down _grouped_mm, the routing-weight
mul, the inverse permutation and its gather, the sum over k. `--variant 5.17` adds what
transformers 5.17 (the version the public measured cases ran) runs besides: the EP-sentinel
mask made and applied unconditionally (one in-place masked_fill on the gathered states, one
out of place after each _grouped_mm, and the clamp); `5.23` (the pinned version) runs them
only under expert parallelism. tests/python/bench/test_bench_moe_block.py checks on CPU that the
5.23 restatement dispatches the same aten ops as the real block and gives its output.

The unknowns it settles (Note [torch._grouped_mm rate] in planner/hardware/hardware.cc): what
the H200 spends on each kernel of the block, the non-GEMM ones above all (CUB's radix sort,
index_put with duplicate rows, top-k, the gathers), and whether the host keeps up. For each
token count and variant it prints
  - wall: the synchronized wall time of forward + backward (median of 5 after 2 warm-ups);
  - host: the time the Python thread takes to issue them (forward + backward without a sync);
  - busy: the device time of all kernels, from torch.profiler (one step), and wall - busy, the
    device's idle time (launch gaps, host waits);
  - every aten op's device time (its kernels' total) and every kernel's, largest first.
`--out` writes it all as JSON; `--device cpu` runs the same code on small shapes as a smoke
test (times mean nothing there). Exits 3 without a CUDA device or a torch without _grouped_mm.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Dict, List

EXIT_UNAVAILABLE = 3  # cli/commands.h kExitUnavailable: the gpu-check runner's "skip"
VARIANTS = ("5.17", "5.23")


def parse_tokens(text: str) -> List[int]:
    tokens = [int(t) for t in text.split(",") if t.strip()]
    if not tokens or any(t <= 0 for t in tokens):
        raise argparse.ArgumentTypeError(f"--tokens {text!r}: positive integers, comma-separated")
    return tokens


def make_params(torch, device: str, experts: int, hidden: int, fe: int, gen) -> dict:
    """The block's weights as transformers initialises them (normal, std 0.02), bf16."""
    def w(*shape: int):
        return (torch.randn(*shape, generator=gen, device=device) * 0.02).to(
            torch.bfloat16).requires_grad_()
    return {"router": w(experts, hidden), "gate_up": w(experts, 2 * fe, hidden),
            "down": w(experts, hidden, fe)}


def moe_block(torch, x, p: dict, top_k: int, variant: str):
    """Qwen3MoeSparseMoeBlock.forward on x [t, h] with grouped_mm experts (module docstring)."""
    F = torch.nn.functional
    experts = p["router"].shape[0]
    logits = F.linear(x, p["router"])
    probs = F.softmax(logits, dtype=torch.float, dim=-1)
    top_value, top_index = torch.topk(probs, top_k, dim=-1)
    top_value /= top_value.sum(dim=-1, keepdim=True)  # norm_topk_prob
    weights = top_value.to(logits.dtype).reshape(-1)
    ids = top_index.reshape(-1)
    ids_sorted, perm = torch.sort(ids)
    gathered = x[perm // top_k]
    weights_sorted = weights[perm]
    counts = torch.histc(ids_sorted.int() if x.is_cuda else ids_sorted.float(), bins=experts,
                         min=0, max=experts - 1)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    mask = None
    if variant == "5.17":
        mask = (ids_sorted >= experts).unsqueeze(-1)
        ids_sorted.clamp_(max=experts - 1)
        gathered.masked_fill_(mask, 0.0)
    out = torch._grouped_mm(gathered, p["gate_up"].transpose(-2, -1), offs=offsets)
    if mask is not None:
        out = out.masked_fill(mask, 0.0)
    gate, up = out.chunk(2, dim=-1)
    out = torch._grouped_mm(F.silu(gate) * up, p["down"].transpose(-2, -1), offs=offsets)
    if mask is not None:
        out = out.masked_fill(mask, 0.0)
    weighted = out * weights_sorted.unsqueeze(-1)
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(perm.size(0), device=x.device)
    weighted = weighted[inv_perm]
    return weighted.view(x.shape[0], top_k, x.shape[1]).sum(dim=1).to(x.dtype)


def step(torch, x, p: dict, top_k: int, variant: str, grad):
    y = moe_block(torch, x, p, top_k, variant)
    y.backward(grad)


def synchronize(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def profile_step(torch, device: str, run) -> Dict[str, object]:
    """Device time per aten op and per kernel of one run (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        run()
        synchronize(torch, device)
    ops: Dict[str, List[float]] = {}
    kernels: Dict[str, List[float]] = {}
    busy = 0.0
    for e in prof.events():
        dev = getattr(e, "device_type", None)
        if dev is not None and str(dev).endswith("CUDA"):  # a kernel (or memcpy/memset)
            s = e.time_range.elapsed_us() * 1e-6  # the kernel's own interval on the device
            k = kernels.setdefault(e.name[:120], [0, 0.0])
            k[0] += 1
            k[1] += s
            busy += s
    for a in prof.key_averages():
        s = getattr(a, "self_device_time_total", getattr(a, "self_cuda_time_total", 0)) * 1e-6
        if a.key.startswith("aten::") and (s > 0 or device != "cuda"):
            ops[a.key] = [a.count, s]
    order = lambda d: sorted(d.items(), key=lambda kv: -kv[1][1])  # noqa: E731
    return {"busy_s": busy,
            "ops": [{"op": k, "calls": v[0], "device_s": v[1]} for k, v in order(ops)],
            "kernels": [{"kernel": k, "calls": v[0], "device_s": v[1]} for k, v in order(kernels)]}


def measure(torch, device: str, tokens: int, hidden: int, fe: int, experts: int, top_k: int,
            variant: str, gen) -> dict:
    p = make_params(torch, device, experts, hidden, fe, gen)
    x = torch.randn(tokens, hidden, generator=gen, device=device).to(torch.bfloat16)
    x.requires_grad_()
    grad = (torch.randn(tokens, hidden, generator=gen, device=device) * 0.1).to(torch.bfloat16)

    def run():
        for t in list(p.values()) + [x]:
            t.grad = None
        step(torch, x, p, top_k, variant, grad)

    for _ in range(2):  # CUTLASS and CUB initialise on their first calls
        run()
    synchronize(torch, device)
    walls, hosts = [], []
    for _ in range(5):
        synchronize(torch, device)
        start = time.perf_counter()
        run()
        hosts.append(time.perf_counter() - start)
        synchronize(torch, device)
        walls.append(time.perf_counter() - start)
    result = {"tokens": tokens, "variant": variant, "wall_s": statistics.median(walls),
              "host_s": statistics.median(hosts)}
    result.update(profile_step(torch, device, run))
    return result


def print_result(r: dict, rows: int) -> None:
    wall, busy = r["wall_s"], r["busy_s"]
    print(f"\n{r['tokens']} tokens, transformers {r['variant']} path: wall {wall * 1e3:.3f} ms, "
          f"host {r['host_s'] * 1e3:.3f} ms, device busy {busy * 1e3:.3f} ms, idle "
          f"{(wall - busy) * 1e3:.3f} ms")
    print(f"  {'aten op':44} {'calls':>5} {'device ms':>10}")
    for o in r["ops"][:rows]:
        print(f"  {o['op'][:44]:44} {o['calls']:5d} {o['device_s'] * 1e3:10.3f}")
    print(f"  {'kernel':90} {'calls':>5} {'device ms':>10}")
    for k in r["kernels"][:rows]:
        print(f"  {k['kernel'][:90]:90} {k['calls']:5d} {k['device_s'] * 1e3:10.3f}")


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--out", help="write the measurement JSON here")
    ap.add_argument("--tokens", type=parse_tokens, default=[8192, 16384],
                    help="tokens per step (default 8192,16384: the measured Qwen3-MoE cases)")
    ap.add_argument("--variant", choices=VARIANTS + ("both",), default="both")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--moe-intermediate", type=int, default=768)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--rows", type=int, default=40, help="table rows per list (default 40)")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print(f"bench_moe_block: no torch ({e})", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if not hasattr(torch, "_grouped_mm"):
        print(f"bench_moe_block: torch {torch.__version__} has no _grouped_mm", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_moe_block: no CUDA device", file=sys.stderr)
        return EXIT_UNAVAILABLE
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    variants = VARIANTS if args.variant == "both" else (args.variant,)
    print(f"torch {torch.__version__}, {device_name}: Qwen3-MoE block, {args.experts} experts, "
          f"top-{args.top_k}, hidden {args.hidden}, moe_intermediate {args.moe_intermediate}")
    results, failures = [], []
    for tokens in args.tokens:
        for variant in variants:
            gen = torch.Generator(device=args.device).manual_seed(0)
            try:
                r = measure(torch, args.device, tokens, args.hidden, args.moe_intermediate,
                            args.experts, args.top_k, variant, gen)
            except Exception as ex:  # one case failing (e.g. out of memory) keeps the others
                failures.append(f"{tokens} tokens, {variant}: {type(ex).__name__}: {ex}")
                print(f"{tokens} tokens, {variant}: failed: {type(ex).__name__}: {ex}")
                continue
            results.append(r)
            print_result(r, args.rows)
    for f in failures:
        print(f"failed: {f}", file=sys.stderr)
    if not results:
        return 1
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"block": "qwen3_moe grouped_mm", "device": device_name,
                       "torch": torch.__version__, "experts": args.experts,
                       "hidden": args.hidden, "moe_intermediate": args.moe_intermediate,
                       "top_k": args.top_k, "results": results}, f, indent=2)
            f.write("\n")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
