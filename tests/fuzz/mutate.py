#!/usr/bin/env python3
"""Mutation pass over every JSON input stowage takes, through the CLI and the C ABI.

Seeds are the fuzz corpora (tests/fuzz/corpus/{plan,hf_config,hardware_profile}). Each mutant
deletes fields, changes types, puts in huge, negative, fractional or non-finite numbers, nests
arrays and objects deeply (at the root or in place of a field's value; around the readers' bound
of 100 levels and far past it, balanced or not), puts in strings past the readers' length limit,
or truncates the text; then:
  plans             stowage_plan_validate and (when valid and small) stowage_create/destroy on
                    the host backend through libstowage.so, and `stowage demo-runtime --plan`;
  HF configs        `stowage plan --model CONFIG --format json`;
  hardware profiles `stowage plan --model llama-3-8b --hardware PROFILE --format json`.
Every run must finish within 10 s (else: hang), never die by a signal (else: crash), and an
exit 0 must come with a plan free of zero, negative, NaN or wrapped numbers where the plan
promises positive ones (else: bad plan); the CLI and the C ABI must agree on which plans are
valid. Prints the counts; exits 1 on any failure, saving each failing input under --out.

  tests/fuzz/mutate.py --build build/dev [--plans 3000 --configs 500 --profiles 500]
"""

import argparse
import concurrent.futures
import copy
import json
import math
import os
import random
import select
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
TIMEOUT = 10.0
WRAPPED = 2**62  # no byte, token or count stowage plans reaches this (docs/limits.md)

SPECIAL_NUMBERS = [0, -1, 1, 2, 1.5, 0.5, -0.0, 2**31, 2**31 - 1, 2**32 + 2, 2**53, 2**63 - 1,
                   2**63, 2**64 - 1, 2**64, 2**70, -(2**63), 1e30, -1e30, 1e308, 1e-308,
                   float("inf"), float("-inf"), float("nan")]
OTHER_VALUES = [None, True, False, "", "1", "-1", "NaN", [], {}, [1], {"a": 1}]
# Nesting depths around the readers' bound (kMaxJsonDepth in base/json_reader.h: 100 levels, the
# document's own object included) and far past it (100,000 levels crashed every reader once).
NEST_DEPTHS = [98, 99, 100, 101, 1000, 100000]
LONG_STRING = 1 << 20  # base/json_reader.h Limits::max_string_bytes
PLACEHOLDER = "__stowage_mutate_nested__"


def dump(value):
    # allow_nan: NaN and Infinity are not JSON; they test that the readers say so.
    return json.dumps(value, indent=1, allow_nan=True)


def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, prefix + (i,))


def get(node, path):
    for p in path:
        node = node[p]
    return node


def mutate_once(doc, rng):
    all_paths = [p for p in paths(doc) if p]
    if not all_paths:
        return
    path = rng.choice(all_paths)
    parent = get(doc, path[:-1])
    key = path[-1]
    value = parent[key]
    op = rng.random()
    if op < 0.2:  # delete
        del parent[key]
    elif op < 0.55 and isinstance(value, (int, float)) and not isinstance(value, bool):
        choice = rng.random()
        if choice < 0.5:
            parent[key] = rng.choice(SPECIAL_NUMBERS)
        elif choice < 0.75:
            parent[key] = value * rng.choice([1024, 2**20, 2**32, -1, 0.5, 1.0001])
        else:
            parent[key] = value + rng.choice([1, -1, 0.25])
    elif op < 0.75:  # type change
        parent[key] = rng.choice(OTHER_VALUES + SPECIAL_NUMBERS)
    elif op < 0.85 and isinstance(value, list) and value:  # duplicate or drop elements
        if rng.random() < 0.5:
            value.append(copy.deepcopy(rng.choice(value)))
        else:
            value.pop(rng.randrange(len(value)))
    else:  # a string where a number was, or a number where a string was
        parent[key] = str(value) if not isinstance(value, str) else rng.choice(SPECIAL_NUMBERS)


def scale_once(doc, rng):
    """A plausible edit (a number grown or shrunk): mutants that still read, so the checks on
    what is accepted get exercised, not just the refusals."""
    numbers = [p for p in paths(doc) if p and isinstance(get(doc, p), (int, float))
               and not isinstance(get(doc, p), bool)]
    if numbers:
        path = rng.choice(numbers)
        parent = get(doc, path[:-1])
        value = parent[path[-1]]
        factor = rng.choice([2, 4, 1024, 2**20, 2**30])
        parent[path[-1]] = value * factor if rng.random() < 0.7 else type(value)(value / factor)


def brackets(rng, depth):
    """The opening and closing text of `depth` levels of arrays or objects (or both,
    alternating); one in four leaves them unclosed."""
    kind = rng.choice(["array", "object", "mixed"])
    opens, closes = [], []
    for level in range(depth):
        array = kind == "array" or (kind == "mixed" and level % 2 == 0)
        opens.append("[" if array else '{"a":')
        closes.append("]" if array else "}")
    return "".join(opens), "" if rng.random() < 0.25 else "".join(reversed(closes))


def nest_once(doc, rng):
    """Deep nesting at the root (alone, or around the whole document) or in place of one field's
    value. Done on the text: Python's own json cannot write (or read) 100,000 levels."""
    opening, closing = brackets(rng, rng.choice(NEST_DEPTHS))
    all_paths = [p for p in paths(doc) if p]
    if not all_paths or rng.random() < 0.3:
        inner = "1" if rng.random() < 0.5 else dump(doc)
        return opening + inner + closing
    path = rng.choice(all_paths)
    get(doc, path[:-1])[path[-1]] = PLACEHOLDER
    return dump(doc).replace(json.dumps(PLACEHOLDER), opening + "1" + closing, 1)


def long_string_once(doc, rng):
    """A string one byte past the readers' limit in place of one field's value or key."""
    all_paths = [p for p in paths(doc) if p]
    if not all_paths:
        return dump(doc)
    path = rng.choice(all_paths)
    parent = get(doc, path[:-1])
    if isinstance(parent, dict) and rng.random() < 0.3:
        parent["k" * (LONG_STRING + 1)] = 1
    else:
        parent[path[-1]] = "s" * (LONG_STRING + 1)
    return dump(doc)


def mutant_text(seed_doc, rng):
    doc = copy.deepcopy(seed_doc)
    r = rng.random()
    if r < 0.1:
        return nest_once(doc, rng)
    if r < 0.12:
        return long_string_once(doc, rng)
    if rng.random() < 0.3:
        scale_once(doc, rng)
        return dump(doc)
    for _ in range(rng.choice([1, 1, 1, 2, 3, 5])):
        mutate_once(doc, rng)
    try:
        text = dump(doc)
    except (ValueError, OverflowError):
        text = "{}"
    r = rng.random()
    if r < 0.08:  # truncation
        text = text[: rng.randrange(len(text) + 1)]
    elif r < 0.12:  # a byte flipped
        i = rng.randrange(len(text))
        text = text[:i] + chr(rng.randrange(1, 256)) + text[i + 1:]
    return text


def load_seeds(kind):
    seeds = []
    folder = os.path.join(CORPUS, kind)
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            try:
                seeds.append((name, json.loads(f.read().decode("utf-8"))))
            except (ValueError, UnicodeDecodeError, RecursionError):
                pass  # regression inputs that are not JSON (or nest too deep) stay fuzz-only
    return [(n, d) for n, d in seeds if isinstance(d, dict)]


# ---- checks on what an exit-0 run produced ---------------------------------------------------

def bad_numbers(node, where=""):
    """Numbers no plan may hold: NaN, infinities, negatives, wrapped (>= 2^62) values."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out += bad_numbers(v, f"{where}.{k}" if where else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += bad_numbers(v, f"{where}[{i}]")
    elif isinstance(node, bool):
        pass
    elif isinstance(node, (int, float)):
        if isinstance(node, float) and not math.isfinite(node):
            out.append(f"{where} = {node}")
        elif node < 0 and not (where.endswith((".prefetch_after_layer", ".save_wait_before_layer"))
                               and node == -1):
            out.append(f"{where} = {node} (negative)")  # -1 above: "never prefetched"
        elif node >= WRAPPED:
            out.append(f"{where} = {node} (wrapped)")
    return out


def plan_problems(plan, generated):
    """What an accepted plan must not contain (a zero where the plan promises a positive).

    `generated`: a plan `stowage plan` wrote, which has every field and must predict positive
    times and bytes. A plan read from a file may leave out what the runtime does not use (the
    reader's defaults); there only the numbers the runtime acts on are checked."""
    problems = bad_numbers(plan)
    if not generated:
        try:
            runtime = plan["runtime"]
            for field in ("prefetch_distance", "copy_chunk_bytes"):
                if field in runtime and not runtime[field] > 0:
                    problems.append(f"runtime.{field} = {runtime[field]}")
            for layer in plan["layers"]:
                # Left out, a layer's transfers are its input as one piece (ParsePlanJson).
                transfers = layer.get("transfers")
                if transfers is None:
                    transfers = [{"name": "input", "bytes": layer.get("host_bytes", 0)}]
                    transfers = [t for t in transfers if t["bytes"] != 0]
                if any(not t["bytes"] > 0 for t in transfers):
                    problems.append(f"layers[{layer.get('index')}] has an empty transfer")
                if sum(t["bytes"] for t in transfers) != layer.get("host_bytes", 0):
                    problems.append(f"layers[{layer.get('index')}] transfers != host_bytes")
        except (KeyError, TypeError) as e:
            problems.append(f"missing or mistyped field: {e!r}")
        return problems
    try:
        run, predicted, runtime = plan["run"], plan["predicted"], plan["runtime"]
        for field in ("seq_len", "micro_batch", "tp", "cp", "ep", "gpu_budget_bytes"):
            if not run[field] > 0:
                problems.append(f"run.{field} = {run[field]}")
        for field in ("peak_device_bytes", "step_seconds"):
            if not predicted[field] > 0:
                problems.append(f"predicted.{field} = {predicted[field]}")
        if predicted["peak_device_bytes"] > run["gpu_budget_bytes"]:
            problems.append("predicted.peak_device_bytes above run.gpu_budget_bytes")
        for field in ("prefetch_distance", "copy_chunk_bytes", "gpus_per_numa_node"):
            if not runtime[field] > 0:
                problems.append(f"runtime.{field} = {runtime[field]}")
        if not plan["layers"]:
            problems.append("no layers")
        for layer in plan["layers"]:
            i = layer["index"]
            if not layer["forward_seconds"] > 0 or not layer["backward_seconds"] > 0:
                problems.append(f"layers[{i}] has a zero time")
            for t in layer["transfers"]:
                if not t["bytes"] > 0:
                    problems.append(f"layers[{i}] transfer {t['name']} of {t['bytes']} bytes")
            if sum(t["bytes"] for t in layer["transfers"]) != layer["host_bytes"]:
                problems.append(f"layers[{i}] transfers do not add up to host_bytes")
            if layer["policy"] in ("keep", "selective_recompute", "recompute") and \
                    not layer["device_saved_bytes"] > 0:
                problems.append(f"layers[{i}] keeps {layer['device_saved_bytes']} bytes")
    except (KeyError, TypeError) as e:
        problems.append(f"missing or mistyped field: {e!r}")
    return problems


# ---- runners ---------------------------------------------------------------------------------

class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.failures = []

    def add(self, kind, outcome, detail=None, text=None):
        with self.lock:
            self.counts.setdefault(kind, {}).setdefault(outcome, 0)
            self.counts[kind][outcome] += 1
            if detail is not None:
                self.failures.append((kind, outcome, detail, text))


def run_cli(args):
    try:
        p = subprocess.run(args, capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return "hang", b"", b""
    if p.returncode < 0:
        return f"crash (signal {-p.returncode})", p.stdout, p.stderr
    return p.returncode, p.stdout, p.stderr


def check_plan_cli(stowage, kind, flags, text, tally):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        code, out, err = run_cli([stowage, "plan", *flags(path), "--format", "json"])
    finally:
        os.unlink(path)
    if not isinstance(code, int):
        tally.add(kind, code, err.decode(errors="replace")[-400:], text)
    elif code == 0:
        try:
            plan = json.loads(out)
        except ValueError:
            tally.add(kind, "bad plan", "exit 0 without a JSON plan", text)
            return
        problems = plan_problems(plan, generated=True)
        if problems:
            tally.add(kind, "bad plan", "; ".join(problems[:5]), text)
        else:
            tally.add(kind, "planned")
    elif code == 1:
        tally.add(kind, "does not fit")
    elif code == 2 and err.strip():
        tally.add(kind, "refused")
    else:
        tally.add(kind, f"exit {code}", err.decode(errors="replace")[-400:], text)


# The C ABI runs in a child process (a crash must not end the pass); it reads one plan per
# line (JSON-encoded text) and answers one line per plan: "valid", "invalid" or "created".
ABI_CHILD = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.stowage_plan_validate.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
lib.stowage_last_error.restype = ctypes.c_char_p
lib.stowage_create.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p,
                               ctypes.POINTER(ctypes.c_void_p)]
lib.stowage_destroy.argtypes = [ctypes.c_void_p]
lib.stowage_options_init.argtypes = [ctypes.c_void_p]
options = ctypes.create_string_buffer(256)
for line in sys.stdin:
    text = json.loads(line).encode("utf-8", "surrogateescape")
    status = lib.stowage_plan_validate(text, len(text))
    if status != 0:
        message = lib.stowage_last_error() or b""
        print("invalid" if message else "invalid-without-message", flush=True)
        continue
    answer = "valid"
    try:
        plan = json.loads(text)
        small = plan["runtime"]["host_arena_bytes"] <= (64 << 20) and len(plan["layers"]) <= 256
    except Exception:
        small = False
    if small:
        lib.stowage_options_init(options)
        ctypes.memmove(ctypes.addressof(options) + 4, ctypes.byref(ctypes.c_int(1)), 4)  # HOST
        rt = ctypes.c_void_p()
        if lib.stowage_create(text, len(text), options, ctypes.byref(rt)) == 0:
            answer = "created" if lib.stowage_destroy(rt) == 0 else "destroy-failed"
    print(answer, flush=True)
"""


class AbiChild:
    def __init__(self, lib):
        self.lib = lib
        self.proc = None

    def start(self):
        env = dict(os.environ, STOWAGE_METRICS_ADDR="")
        self.proc = subprocess.Popen([sys.executable, "-c", ABI_CHILD, self.lib], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, text):
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        try:
            self.proc.stdin.write(json.dumps(text) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self.restart("crash")
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT)
        if not ready:
            return self.restart("hang")
        line = self.proc.stdout.readline().strip()
        if not line:
            return self.restart(f"crash (exit {self.proc.wait()})")
        return line

    def restart(self, outcome):
        self.proc.kill()
        self.proc.wait()
        self.proc = None
        return outcome

    def close(self):
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()


def check_plan(stowage, abi, text, tally):
    abi_answer = abi.ask(text)
    if abi_answer in ("valid", "created"):
        tally.add("plan (C ABI)", abi_answer)
        try:
            problems = plan_problems(json.loads(text), generated=False)
        except (ValueError, RecursionError):
            problems = ["accepted text that is not JSON"]
        if problems:
            tally.add("plan (C ABI)", "accepted bad plan", "; ".join(problems[:5]), text)
    elif abi_answer == "invalid":
        tally.add("plan (C ABI)", "refused")
    else:
        tally.add("plan (C ABI)", abi_answer, "stowage_plan_validate / create", text)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        code, out, err = run_cli([stowage, "demo-runtime", "--plan", path, "--steps", "1",
                                  "--step-interval", "0", "--compute-scale", "0",
                                  "--metrics-address", "127.0.0.1:0"])
    finally:
        os.unlink(path)
    if not isinstance(code, int):
        tally.add("plan (demo-runtime)", code, err.decode(errors="replace")[-400:], text)
    elif code == 0:
        tally.add("plan (demo-runtime)", "ran")
        if abi_answer not in ("valid", "created"):
            tally.add("plan (demo-runtime)", "ran a plan the C ABI refused", abi_answer, text)
    elif err.strip():
        tally.add("plan (demo-runtime)", "refused")
    else:
        tally.add("plan (demo-runtime)", f"exit {code} without a message", "", text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "dev"))
    ap.add_argument("--plans", type=int, default=3000)
    ap.add_argument("--configs", type=int, default=500)
    ap.add_argument("--profiles", type=int, default=500)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None, help="folder for failing inputs")
    a = ap.parse_args()
    stowage = os.path.join(a.build, "cli", "stowage")
    lib = os.path.join(a.build, "capi", "libstowage.so")
    rng = random.Random(a.seed)
    tally = Tally()

    plan_seeds = load_seeds("plan")
    config_seeds = load_seeds("hf_config")
    profile_seeds = load_seeds("hardware_profile")
    jobs = []
    for _ in range(a.configs):
        text = mutant_text(rng.choice(config_seeds)[1], rng)
        jobs.append(("hf_config", text))
    for _ in range(a.profiles):
        text = mutant_text(rng.choice(profile_seeds)[1], rng)
        jobs.append(("hardware_profile", text))
    plan_texts = [mutant_text(rng.choice(plan_seeds)[1], rng) for _ in range(a.plans)]

    def config_flags(path):
        return ["--model", path, "--seq-len", "32K", "--cp", "1", "--gpus", "64"]

    def profile_flags(path):
        return ["--model", "llama-3-8b", "--seq-len", "32K", "--cp", "1", "--gpus", "8",
                "--hardware", path]

    def run_job(job):
        kind, text = job
        check_plan_cli(stowage, kind, config_flags if kind == "hf_config" else profile_flags,
                       text, tally)

    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        list(pool.map(run_job, jobs))
        chunks = [plan_texts[i::a.jobs] for i in range(a.jobs)]

        def run_plans(texts):
            abi = AbiChild(lib)
            try:
                for text in texts:
                    check_plan(stowage, abi, text, tally)
            finally:
                abi.close()

        list(pool.map(run_plans, chunks))

    failing = {"hang", "bad plan", "accepted bad plan", "ran a plan the C ABI refused"}
    failures = [f for f in tally.failures
                if f[1] in failing or f[1].startswith(("crash", "exit", "invalid-without"))]
    print(f"mutation pass: {a.plans} plans, {a.configs} HF configs, {a.profiles} hardware "
          f"profiles (seed {a.seed})")
    for kind in sorted(tally.counts):
        parts = ", ".join(f"{k} {v}" for k, v in sorted(tally.counts[kind].items()))
        print(f"  {kind:22s} {parts}")
    if failures:
        out = a.out or tempfile.mkdtemp(prefix="stowage-mutate-")
        os.makedirs(out, exist_ok=True)
        for i, (kind, outcome, detail, text) in enumerate(failures):
            name = os.path.join(out, f"{kind.split()[0]}-{i}.json")
            with open(name, "w") as f:
                f.write(text or "")
            print(f"FAIL {kind}: {outcome}: {detail} ({name})")
        return 1
    print("no crash, no hang, no exit-0 plan with a zero, negative, NaN or wrapped number")
    return 0


if __name__ == "__main__":
    sys.exit(main())
