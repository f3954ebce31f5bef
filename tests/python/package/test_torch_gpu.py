"""The PyTorch integration on a CUDA device with the runtime's CUDA backend (CTest label `gpu`;
run_tests.py skips the whole module with exit code 77 when torch sees no GPU).

The same bit-identity checks as on CPU, plus what only a GPU shows: device memory given back
every step, offloading lowering the measured peak, work on a non-default stream, and the bench
program end to end at a reduced size."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

# Deterministic cuBLAS, so recompute reproduces forward bit for bit; set before CUDA starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import support  # noqa: E402
import torch  # noqa: E402

import stowage  # noqa: E402
from stowage.planner import evaluate  # noqa: E402
from stowage.measure.profile import profile_layers  # noqa: E402

HIDDEN, TOKENS, LAYERS, STEPS = 256, 512, 4, 3
POLICIES = ["keep", "recompute", "offload_input", "offload_saved"]
MIXED = ["offload_input", "offload_saved", "recompute", "keep"]


@unittest.skipUnless(torch.cuda.is_available(), "no CUDA device")
class CudaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        probe = stowage.Plan(layers=[stowage.LayerPlan(index=0, type="probe", policy="keep")])
        try:
            stowage.Runtime(probe, backend="cuda").close()
        except stowage.StowageError as e:
            if e.status == "UNAVAILABLE":
                raise unittest.SkipTest(f"libstowage.so has no CUDA backend here: {e}")
            raise
        torch.use_deterministic_algorithms(True, warn_only=True)
        cls.dev = torch.device("cuda", torch.cuda.current_device())
        cls.fixtures = {}
        for kind in ("mlp", "attention"):
            layers = support.make_layers(kind, LAYERS, HIDDEN, device="cuda")
            torch.manual_seed(7)
            x0 = torch.randn(TOKENS, HIDDEN, device="cuda")
            profile = profile_layers(layers, x0, loss_fn=support.loss_fn)
            ref = support.train(support.clone_layers(layers), x0, STEPS)
            cls.fixtures[kind] = (layers, x0, profile, ref)

    def check(self, kind: str, policies: list, stream: bool = False) -> None:
        layers, x0, profile, ref = self.fixtures[kind]
        mine = support.clone_layers(layers)
        planned = stowage.PlannedLayers(mine, evaluate(profile, policies).plan)
        try:
            if stream:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    got = support.train(mine, x0, STEPS, planned=planned)
                torch.cuda.current_stream().wait_stream(s)
            else:
                got = support.train(mine, x0, STEPS, planned=planned)
            torch.cuda.synchronize()
            for step, ((l0, g0, i0), (l1, g1, i1)) in enumerate(zip(ref, got)):
                self.assertTrue(torch.equal(l0, l1), f"{kind} {policies}: loss, step {step}")
                for k, (a, b) in enumerate(zip(g0, g1)):
                    self.assertTrue(torch.equal(a, b),
                                    f"{kind} {policies}: grad {k}, step {step}")
                self.assertTrue(torch.equal(i0, i1), f"{kind} {policies}: input grad")
            stats = planned.stats()
            if stats is not None:
                self.assertEqual(stats.arena_used_bytes, 0)
                self.assertEqual(stats.backend, "cuda")
        finally:
            planned.close()

    def test_every_policy(self) -> None:
        for kind in ("mlp", "attention"):
            for policy in POLICIES:
                with self.subTest(kind=kind, policy=policy):
                    self.check(kind, [policy] * LAYERS)
            with self.subTest(kind=kind, policy="mixed"):
                self.check(kind, MIXED)

    def test_side_stream(self) -> None:
        self.check("mlp", ["offload_saved", "offload_input"] * (LAYERS // 2), stream=True)

    def test_memory_returns_and_offload_lowers_the_peak(self) -> None:
        layers, x0, profile, _ = self.fixtures["mlp"]
        peaks = {}
        for name, policies in (("keep", ["keep"] * LAYERS),
                               ("offload_saved", ["offload_saved"] * LAYERS),
                               ("offload_input", ["offload_input"] * LAYERS)):
            mine = support.clone_layers(layers)
            planned = stowage.PlannedLayers(mine, evaluate(profile, policies).plan)
            after = []

            def record(step: int) -> None:
                torch.cuda.synchronize()
                after.append(torch.cuda.memory_allocated())

            support.train(mine, x0, 2, planned=planned)  # grads and optimizer state exist
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            support.train(mine, x0, 3, planned=planned, after_step=record, record=False)
            peaks[name] = torch.cuda.max_memory_allocated() - base
            self.assertEqual(len(set(after)), 1, f"{name}: device memory grows: {after}")
            planned.close()
            del planned, mine
        self.assertLess(peaks["offload_saved"], peaks["keep"], peaks)
        self.assertLess(peaks["offload_input"], peaks["offload_saved"], peaks)

    def test_bench_runs(self) -> None:
        bench = os.path.join(support.HERE, "..", "..", "bench", "bench_torch.py")
        out = subprocess.run(
            [sys.executable, bench, "--device", "cuda", "--layers", "4", "--tokens", "4096",
             "--hidden", "1024", "--steps", "2", "--warmup", "1"],
            capture_output=True, text=True, timeout=600)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("stowage", out.stdout)
        print(out.stdout)


if __name__ == "__main__":
    unittest.main()
