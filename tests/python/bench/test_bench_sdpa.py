"""bench/bench_sdpa.py on CPU at small shapes: what it times is transformers' SDPA call and its
backward, with the planner's FLOP counts, and the JSON it writes names the kernel.

The times mean nothing on a CPU; scripts/gpu-check runs the script on an H200
(Note [Op rates] in planner/hardware/hardware.cc).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import unittest

import support

import torch


def has_enable_gqa() -> bool:
    try:
        q, kv = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 1, 8)
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
        return True
    except (TypeError, AttributeError):
        return False


class BenchSdpaArgumentsTest(unittest.TestCase):
    def test_bad_cases_name_what_is_allowed(self) -> None:
        bench = support.load_tool("bench_sdpa")
        for bad in ("llama:32:8:128", "x:3:2:8:64", "x:4:2:0:64", "x:4:2:8:", ""):
            with self.assertRaises(argparse.ArgumentTypeError) as caught:
                bench.parse_cases(bad)
            self.assertIn("--cases", str(caught.exception))
        self.assertEqual(bench.parse_cases("a:4:2:16:64,128"), [("a", 4, 2, 16, [64, 128])])

    def test_flops_are_the_planners(self) -> None:
        # Causal forward 4 s^2 h d / 2, backward 2.5x (planner/hardware/op_time.h, Note [Op rates]).
        forward, backward = support.load_tool("bench_sdpa").attention_flops(16384, 32, 128)
        self.assertEqual(forward, 2 * 16384 ** 2 * 32 * 128)
        self.assertEqual(backward, 2.5 * forward)


@unittest.skipUnless(has_enable_gqa(), "torch without SDPA enable_gqa (before 2.5)")
class BenchSdpaRunTest(unittest.TestCase):
    def test_the_table_names_each_case_and_its_kernel(self) -> None:
        bench = support.load_tool("bench_sdpa")
        with tempfile.TemporaryDirectory(prefix="bench-sdpa-") as tmp:
            out = os.path.join(tmp, "sdpa.json")
            rc = bench.main(["--device", "cpu", "--cases", "g:4:2:16:64,96;m:2:2:8:32",
                             "--out", out])
            self.assertEqual(rc, 0)
            with open(out) as f:
                got = json.load(f)
        rows = got["rows"]
        self.assertEqual([(r["case"], r["seq_len"], r["heads"], r["kv_heads"]) for r in rows],
                         [("g", 64, 4, 2), ("g", 96, 4, 2), ("m", 32, 2, 2)])
        for r in rows:
            self.assertIn(r["kernel"], set(bench.KERNELS.values()) | {"math"})
            self.assertGreater(r["forward_seconds"], 0)
            self.assertGreater(r["backward_seconds"], 0)
            forward, backward = bench.attention_flops(r["seq_len"], r["heads"], r["head_dim"])
            self.assertEqual((r["forward_flops"], r["backward_flops"]), (forward, backward))
            self.assertAlmostEqual(r["forward_flops_per_second"], forward / r["forward_seconds"])


if __name__ == "__main__":
    unittest.main()
