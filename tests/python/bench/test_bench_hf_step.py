"""bench/bench_hf_step.py on CPU at tiny widths: it steps each measured case's family as the
case was measured, puts every timed op in one of the planner's op classes (the SDPA ops in
attention forward and backward, _grouped_mm only for the MoE family), and writes it all.

The times mean nothing on a CPU; scripts/gpu-check runs the script on an H200 (where the
measured steps' time goes, against tests/planner/frameworks/hf_measured_test.cc's terms).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import unittest

import support


try:
    import transformers  # noqa: F401
except ImportError:  # Debian's torch 1.13 interpreter has no transformers
    transformers = None


class BenchHfStepArgumentsTest(unittest.TestCase):
    def test_only_names_what_is_allowed(self) -> None:
        bench = support.load_tool("bench_hf_step")
        for bad in ("llama-8layer", "llama-8layer:offload", ":keep"):
            with self.assertRaises(argparse.ArgumentTypeError) as caught:
                bench.parse_only(bad)
            self.assertIn("NAME:keep or NAME:recompute", str(caught.exception))
        self.assertEqual(bench.parse_only("a:keep,b:recompute"), [("a", False), ("b", True)])
        with self.assertRaises(ValueError) as caught:
            bench.read_cases(bench.DEFAULT_CASES, [("qwen2-6layer", False)])
        self.assertIn("qwen2-6layer:keep: no such case", str(caught.exception))

    def test_classes_are_the_planners(self) -> None:
        bench = support.load_tool("bench_hf_step")
        self.assertEqual(bench.op_class("aten::_scaled_dot_product_cudnn_attention"),
                         "attention_forward")
        self.assertEqual(bench.op_class("aten::_scaled_dot_product_cudnn_attention_backward"),
                         "attention_backward")
        self.assertEqual(bench.op_class("aten::_grouped_mm"), "grouped_gemm")
        self.assertEqual(bench.op_class("aten::addmm"), "gemm")
        self.assertEqual(bench.op_class("aten::mul"), "elementwise")


@unittest.skipIf(transformers is None, "needs transformers")
class BenchHfStepRunTest(unittest.TestCase):
    def test_each_case_steps_and_its_time_is_in_one_class(self) -> None:
        bench = support.load_tool("bench_hf_step")
        with tempfile.TemporaryDirectory(prefix="bench-hf-step-") as tmp:
            out = os.path.join(tmp, "hf-step.json")
            rc = bench.main(["--device", "cpu", "--only",
                             "llama-8layer:recompute,qwen3moe-6layer:keep", "--out", out])
            self.assertEqual(rc, 0)
            with open(out) as f:
                got = json.load(f)
        rows = got["results"]
        self.assertEqual([(r["case"], r["policy"]) for r in rows],
                         [("llama-8layer", "recompute"), ("qwen3moe-6layer", "keep")])
        for r in rows:
            classes = r["classes"]
            self.assertEqual(set(classes), set(bench.CLASSES))
            self.assertAlmostEqual(sum(c["device_s"] for c in classes.values()), r["busy_s"])
            for name in ("gemm", "attention_forward", "attention_backward", "elementwise"):
                self.assertGreater(classes[name]["kernels"], 0, f"{r['case']} {name}")
            self.assertGreater(r["measured_step_s"], 0)
        llama, moe = rows
        self.assertEqual(llama["classes"]["grouped_gemm"]["kernels"], 0)
        self.assertGreater(moe["classes"]["grouped_gemm"]["kernels"], 0)
        # Under recompute every layer's attention runs forward twice per backward.
        self.assertEqual(llama["classes"]["attention_forward"]["kernels"],
                         2 * llama["classes"]["attention_backward"]["kernels"])


if __name__ == "__main__":
    unittest.main()
