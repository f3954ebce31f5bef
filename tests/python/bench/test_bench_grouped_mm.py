"""bench/bench_grouped_mm.py on CPU at small shapes: what it times is what autograd runs, its
FLOP counts, and that `stowage calibrate --torch-grouped-mm` takes the file it writes.

The times mean nothing on a CPU; scripts/gpu-check runs the script on an H200
(Note [torch._grouped_mm rate] in planner/hardware/hardware.cc).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import unittest

import support

import torch


@unittest.skipUnless(hasattr(torch, "_grouped_mm"), "torch without _grouped_mm (before 2.8)")
class BenchGroupedMmTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.bench = support.load_tool("bench_grouped_mm")
        cls.tmp = tempfile.mkdtemp(prefix="bench-grouped-mm-")
        cls.out = os.path.join(cls.tmp, "rates.json")
        # 4 experts, hidden 32, moe_intermediate 16, top-2: 24 rows per expert routed, 16 aligned.
        cls.rc = cls.bench.main(["--device", "cpu", "--experts", "4", "--hidden", "32",
                                 "--moe-intermediate", "16", "--top-k", "2", "--rows", "24",
                                 "--aligned-rows", "16", "--out", cls.out])

    def test_the_timed_passes_are_autograds_and_counted(self) -> None:
        self.assertEqual(self.rc, 0)
        with open(self.out) as f:
            got = json.load(f)
        self.assertEqual(got["kernel"], "torch._grouped_mm")
        self.assertTrue(got["matches_autograd"])
        routed, aligned = got["points"]
        self.assertEqual((routed["routing"], aligned["routing"]), ("routed", "aligned"))
        self.assertEqual(routed["rows_per_expert"], 24)
        self.assertEqual((aligned["min_rows"], aligned["max_rows"]), (16, 16))
        # Three passes of 2 x S x K x N each, gate/up (K 32, N 32) and down (K 16, N 32).
        s = 24 * 4
        self.assertEqual(routed["flops"], 3 * 2 * s * (32 * 32 + 16 * 32))
        self.assertEqual(sorted(routed["seconds"]), sorted(
            f"{p}.{q}" for p in ("gate_up", "down")
            for q in ("forward", "input_gradient", "weight_gradient")))
        self.assertAlmostEqual(routed["flops_per_second"],
                               routed["flops"] / sum(routed["seconds"].values()))

    def test_a_pass_autograd_does_not_run_is_caught(self) -> None:
        counts = self.bench.routed_counts(torch, 4, 2, 8, False, torch.Generator().manual_seed(1))
        passes = self.bench.projection(torch, "cpu", counts, 32, 16,
                                       torch.Generator().manual_seed(2))
        self.assertEqual(self.bench.check_against_autograd(torch, passes), "")
        x, w, g, offs = passes["_tensors"]()
        # The weight gradient in the other layout: same values (transposed), another call.
        passes["weight_gradient"] = lambda: torch._grouped_mm(x.t(), g, offs=offs).transpose(-2, -1)
        self.assertIn("autograd runs", self.bench.check_against_autograd(torch, passes))

    @unittest.skipUnless(os.environ.get("STOWAGE_CLI"), "STOWAGE_CLI not set")
    def test_calibrate_takes_the_file(self) -> None:
        # No GPU visible: calibrate reads and checks the file first (a bad one exits 2), then
        # says there is no GPU (3).
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        run = subprocess.run([os.environ["STOWAGE_CLI"], "calibrate", "--torch-grouped-mm",
                              self.out], capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual(run.returncode, 3, run.stderr)


if __name__ == "__main__":
    unittest.main()
