"""Runs megatron_worker.py on `world` gloo ranks (subprocesses: it patches torch.cuda for its
process) and returns each rank's list of run results. Skips the calling test when this Python has
no megatron-core (Debian's torch 1.13 interpreter)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
HAVE_MEGATRON = (importlib.util.find_spec("megatron") is not None
                 and importlib.util.find_spec("megatron.core") is not None)
skip_without_megatron = unittest.skipUnless(HAVE_MEGATRON, "needs megatron-core (torch 2.x)")
# The GPTModel megatron_worker.py builds (its SEQ, VOCAB, HIDDEN and config()).
WORKER_SHAPE = dict(seq=32, vocab=96, hidden=64, heads=4, kv_heads=2, ffn=128)


def run(spec: dict, world: int = 1, timeout: int = 600) -> list:
    """[rank][run] results of megatron_worker.py for `spec`."""
    env = dict(os.environ, TORCHDYNAMO_DISABLE="1", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "megatron_worker.py"),
                                   json.dumps(spec), str(r), str(world), tmp],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env) for r in range(world)]
        outs = [p.communicate(timeout=timeout) for p in procs]
    results = []
    for r, (p, (out, err)) in zip(range(world), zip(procs, outs)):
        if p.returncode != 0:
            raise AssertionError(f"rank {r} exited {p.returncode}:\n{out[-2000:]}{err[-6000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def check(test: unittest.TestCase, results: list, runs: list) -> None:
    """One rank's results of `runs`: no error; per optimizer step the loss and every gradient
    bit-identical to the unwrapped model's; the bytes each of the rank's layers sent to the host
    in each microbatch equal to the plan's host_bytes; state_dict keys unchanged; and less kept
    by autograd on the device unless every layer keeps."""
    test.assertEqual(len(results), len(runs))
    for run, r in zip(runs, results):
        with test.subTest(run=run, rank=r["rank"]):
            test.assertNotIn("error", r, r.get("error"))
            test.assertTrue(all(r["state_dict_keys_equal"]))
            test.assertTrue(r.get("eval_equal", True), "a no_grad forward outside any step")
            want = {f"{i}.{k}": r["host_bytes"][i] for i in r["mine"] if r["host_bytes"][i]
                    for k in range(r["microbatches"])}
            for s, step in enumerate(r["steps"]):
                test.assertTrue(step["loss_equal"], f"step {s}")
                test.assertTrue(step["grad_names_equal"], f"step {s}")
                test.assertGreater(step["grads"], 5)
                test.assertEqual(step["grads_unequal"], [], f"step {s}")
                test.assertEqual(step["sent"], want, f"step {s}: bytes sent to the host per "
                                 "layer.microbatch against the plan's host_bytes")
            mine = [r["policies"][i] for i in r["mine"]]
            offloading = [p for p in mine if p.startswith("offload")]
            test.assertEqual(bool(offloading), any(r["host_bytes"][i] for i in r["mine"]))
            ref, wrapped = r["saved_bytes"]
            if ref < 0:
                continue  # a pipeline stage: measured on one-stage models only
            if set(mine) == {"keep"}:
                test.assertEqual(wrapped, ref)
            else:
                test.assertLess(wrapped, ref, mine)
