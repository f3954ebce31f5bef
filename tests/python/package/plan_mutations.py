"""Mutation agreement: thousands of mutated plans, each judged by Python's stowage.Plan.from_json
and by the C++ reader and validator through the C ABI, both as stowage_plan_validate and as the
runtime's own stowage_create (host backend). All must accept or refuse alike, refuse in the same
words, and every plan Python accepts must survive its own round trip (view -> JSON -> C++ -> view).

    plan_mutations.py [--count N] [--seed S]

Base plans: two from the `stowage plan` CLI (STOWAGE_CLI; a dense model that keeps, and the
reference MoE model that offloads and recomputes selectively) and two built in Python. Mutations:
field deletions, type changes, huge / negative / fractional / non-finite numbers, wrong strings,
truncation, duplicated / dropped / reordered layers, transfer and host sums that wrap, duplicate
keys, unknown fields, and repairs that make a mutated plan valid again (so both verdicts occur).
Prints accepted / rejected / disagreed; exits 1 on any disagreement.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import json
import os
import random
import subprocess
import sys
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "python"))

import stowage  # noqa: E402
from stowage import _lib  # noqa: E402
from stowage import plan as plan_mod  # noqa: E402

ODD_VALUES: list[Any] = [
    None, True, False, "x", "", "1", [], {}, [1], {"a": 1}, 0, 1, -1, 2, 1.5, -0.5, 2.0, 0.0,
    2**31, 2**31 - 1, 2**32 + 1, 2**53 + 1, 2**60, 2**60 + 1, 2**63, 2**64 - 1, 2**64, 2**70,
    -(2**63), 1e30, 1e-300, 1e16, 4096, 65536, 1 << 30, (1 << 30) + 1,
]
WORDS = ["keep", "recompute", "selective_recompute", "offload_input", "offload_saved", "offload",
         "Keep", "", "spill", "keep ", "moe", "input"]


def base_plans() -> list[tuple[str, str]]:
    out = []
    cli = os.environ.get("STOWAGE_CLI")
    if cli and os.path.exists(cli):
        for name, args in [
            ("cli llama-3-8b 32K", ["--model", "llama-3-8b", "--seq-len", "32K", "--hardware",
                                    "h200", "--cp", "1", "--gpus", "8"]),
            ("cli glm-5.3-flash 256K", ["--seq-len", "256K"]),
        ]:
            run = subprocess.run([cli, "plan", *args, "--format", "json"], capture_output=True,
                                 text=True, timeout=120)
            if run.returncode != 0:
                raise SystemExit(f"{cli} plan {' '.join(args)} failed: {run.stderr}")
            out.append((name, run.stdout))
    else:
        print("STOWAGE_CLI not set: only the plans built in Python are mutated", flush=True)
    L, T = plan_mod.LayerPlan, plan_mod.Transfer
    built = stowage.Plan(
        layers=[L(index=0, type="attention+swiglu", policy="offload_saved", host_bytes=12288,
                  transfers=[T("attn.q", 4096), T("attn.kv", 8192)], prefetch_after_layer=1,
                  forward_seconds=0.01, backward_seconds=0.02, d2h_seconds=0.001,
                  h2d_seconds=0.001),
                L(index=1, type="attention+swiglu", policy="selective_recompute",
                  device_saved_bytes=1 << 20, recompute_modules=["attn", "mlp"]),
                L(index=2, type="mla+moe", policy="offload_input", host_bytes=1 << 16,
                  transfers=[T("input", 1 << 16)], prefetch_after_layer=2, ffn_chunks=4),
                L(index=3, type="mla+moe", policy="recompute", device_saved_bytes=4096)],
        predicted=plan_mod.Prediction(peak_device_bytes=1 << 30, fixed_device_bytes=1 << 29,
                                      host_bytes_per_gpu=12288 + (1 << 16),
                                      host_bytes_per_numa_node=2 * (12288 + (1 << 16)),
                                      step_seconds=0.5, baseline="keep",
                                      baseline_step_seconds=0.4),
        runtime=plan_mod.RuntimeSettings(prefetch_distance=1, host_arena_bytes=12288 + (1 << 16),
                                         gpus_per_numa_node=2, link_bytes_per_second=5e10),
        run=plan_mod.RunSettings(seq_len=8192, tp=2, gpu_budget_bytes=1 << 31))
    out.append(("python 4 layers", built.to_json()))
    minimal = {"schema_version": 1,
               "predicted": {"peak_device_bytes": 0, "host_bytes_per_gpu": 0, "step_seconds": 0,
                             "exposed_copy_seconds": 0},
               "layers": [{"index": 0, "type": "t", "policy": "offload_input",
                           "device_saved_bytes": 0, "host_bytes": 4096}],
               "runtime": {"host_arena_bytes": 4096}}
    out.append(("python minimal", json.dumps(minimal)))
    return out


def paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys and indices) to a value inside obj."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append(prefix + (k,))
            out.extend(paths(v, prefix + (k,)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.append(prefix + (i,))
            out.extend(paths(v, prefix + (i,)))
    return out


def parent(obj: Any, path: tuple) -> Any:
    for key in path[:-1]:
        obj = obj[key]
    return obj


def repair(obj: dict) -> None:
    """Makes sums consistent again, so that many mutants are valid and both verdicts are tested."""
    layers = obj.get("layers")
    if not isinstance(layers, list):
        return
    total = 0
    for i, l in enumerate(layers):
        if not isinstance(l, dict):
            continue
        l["index"] = i
        ts = l.get("transfers")
        if isinstance(ts, list) and all(isinstance(t, dict) and isinstance(t.get("bytes"), int)
                                        and not isinstance(t.get("bytes"), bool) for t in ts):
            l["host_bytes"] = sum(t["bytes"] for t in ts)
        if isinstance(l.get("host_bytes"), int) and not isinstance(l.get("host_bytes"), bool):
            total += l["host_bytes"]
            if isinstance(l.get("prefetch_after_layer"), int):
                l["prefetch_after_layer"] = min(max(l["prefetch_after_layer"], i), len(layers) - 1)
    rt = obj.get("runtime")
    if isinstance(rt, dict) and total >= 0:
        rt["host_arena_bytes"] = total
    pred = obj.get("predicted")
    if isinstance(pred, dict):
        pred["host_bytes_per_numa_node"] = 0


def mutate(rng: random.Random, text: str) -> str:
    obj = json.loads(text)
    kind = rng.randrange(14)
    if kind == 0:  # truncation
        return text[:rng.randrange(len(text))]
    if kind == 1:  # duplicate key, textually
        return text.replace('"host_bytes": ', '"host_bytes": 0, "host_bytes": ', 1) \
            if rng.random() < 0.5 else text.replace("{", '{"schema_version": 1, ', 1)
    for _ in range(rng.randint(1, 3)):
        all_paths = paths(obj)
        if not all_paths:
            break
        path = rng.choice(all_paths)
        where = parent(obj, path)
        key = path[-1]
        kind = rng.randrange(13)
        if kind in (0, 1):  # delete
            del where[key]
        elif kind in (2, 3, 4):  # type or magnitude change
            where[key] = copy.deepcopy(rng.choice(ODD_VALUES))
        elif kind == 5:  # arithmetic perturbation of a number
            v = where[key]
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                where[key] = rng.choice([v * 2, v + 1, -v, v + 0.5, v - 1, v * 1024, v // 3])
        elif kind == 6:  # wrong strings
            if isinstance(where[key], str) or key == "policy":
                where[key] = rng.choice(WORDS)
        elif kind == 7 and isinstance(obj.get("layers"), list) and obj["layers"]:  # layer order
            layers = obj["layers"]
            op = rng.randrange(3)
            if op == 0:
                layers.insert(rng.randrange(len(layers) + 1), copy.deepcopy(rng.choice(layers)))
            elif op == 1:
                del layers[rng.randrange(len(layers))]
            elif len(layers) > 1:
                i, j = rng.sample(range(len(layers)), 2)
                layers[i], layers[j] = layers[j], layers[i]
        elif kind == 8 and isinstance(obj.get("layers"), list) and obj["layers"]:  # wrapped sums
            l = rng.choice(obj["layers"])
            if isinstance(l, dict):
                big = rng.choice([[2**64 - 1, 1], [2**63, 2**63], [2**60] * 17, [2**60, 2**60]])
                l["transfers"] = [{"name": f"t{i}", "bytes": b} for i, b in enumerate(big)]
                l["host_bytes"] = sum(big) % 2**64 if rng.random() < 0.5 else sum(big)
        elif kind == 9:  # unknown field
            if isinstance(where, dict):
                where[f"future_{rng.randrange(100)}"] = rng.choice(ODD_VALUES)
        elif kind == 10:  # null (read as absent where optional)
            where[key] = None
        elif kind == 11 and isinstance(obj.get("runtime"), dict):
            obj["runtime"]["copy_chunk_bytes"] = rng.choice(
                [1, 4095, 4096, 65536, 1 << 30, (1 << 30) + 1, 2**64 - 1, 0, 16 << 20])
        else:
            repair(obj)
    if rng.random() < 0.35:
        repair(obj)
    return json.dumps(obj, indent=rng.choice([None, 2]))


MAX_CREATE_ARENA_BYTES = 64 << 20


def arena_bytes(text: str) -> int:
    """The arena a plan would reserve, read loosely (0 when the text says nothing readable)."""
    try:
        value = json.loads(text).get("runtime", {}).get("host_arena_bytes", 0)
    except (ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) else 0


class CApi:
    def __init__(self) -> None:
        self.lib = _lib.load()
        self.options = _lib.Options()
        self.lib.stowage_options_init(ctypes.byref(self.options))
        self.options.backend = _lib.BACKEND_HOST
        self.options.copy_threads = 1
        self.options.metrics_address = b""

    def error(self) -> str:
        return self.lib.stowage_last_error().decode("utf-8", "replace")

    def validate(self, data: bytes) -> Optional[str]:
        code = self.lib.stowage_plan_validate(data, len(data))
        return None if code == 0 else self.error().removeprefix("stowage_plan_validate: ")

    def create(self, data: bytes) -> Optional[str]:
        """None when the plan was accepted (created, or refused later for host memory)."""
        handle = ctypes.c_void_p()
        code = self.lib.stowage_create(data, len(data), ctypes.byref(self.options),
                                       ctypes.byref(handle))
        if code == 0:
            self.lib.stowage_destroy(handle)
            return None
        if code != 1:  # not INVALID_ARGUMENT: the plan was read and judged valid
            return None
        return self.error().removeprefix("stowage_create: ")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=20261201)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    bases = base_plans()
    capi = CApi()
    start = time.monotonic()
    accepted = rejected = created = 0
    disagreements: list[str] = []
    for n in range(args.count):
        name, base = bases[n % len(bases)]
        text = mutate(rng, base)
        data = text.encode("utf-8")
        try:
            view = stowage.Plan.from_json(text)
            py = None
        except stowage.PlanError as e:
            view, py = None, str(e)
        except Exception as e:  # noqa: BLE001 — anything else is a bug in the view
            view, py = None, f"CRASH {type(e).__name__}: {e}"
            disagreements.append(f"#{n} ({name}): Python raised {py}")
            continue
        via_validate = capi.validate(data)
        verdicts = {"python": py, "stowage_plan_validate": via_validate}
        # stowage_create really maps and touches the arena the plan asks for: only plans that ask
        # for little go through it (a mutated arena of 4 GiB would be allocated, and the reference
        # plan's 36 GB would be on a machine that has them).
        if arena_bytes(text) <= MAX_CREATE_ARENA_BYTES:
            verdicts["stowage_create"] = capi.create(data)
            created += 1
        if len({v is None for v in verdicts.values()}) > 1 or \
                (py is not None and not (py == via_validate and
                                         via_validate in verdicts.get("stowage_create", py))):
            disagreements.append(f"#{n} ({name}): {verdicts}\n  plan: {text[:300]}")
            continue
        if view is not None:
            accepted += 1
            again = stowage.Plan.from_json(view.to_json())
            if again != view:
                disagreements.append(f"#{n} ({name}): the view does not survive its round trip")
        else:
            rejected += 1
    seconds = time.monotonic() - start
    print(f"{args.count} mutated plans from {len(bases)} bases ({', '.join(n for n, _ in bases)}) "
          f"in {seconds:.1f} s")
    print(f"accepted {accepted}, rejected {rejected}, disagreed {len(disagreements)} "
          f"({created} also through stowage_create)")
    for d in disagreements[:20]:
        print(d)
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
