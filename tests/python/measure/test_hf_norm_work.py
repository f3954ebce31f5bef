"""The real transformers RMSNorms' element-wise work against NormWorkOf (planner/frameworks/).

tests/planner/data/hf_norm_work.json states each family's norm work per element of its width: bytes
read + written and kernels, forward and backward. planner_hf_norm_work_test checks that NormWorkOf
says so; this suite checks that the real module runs it: every aten op its forward and its backward
dispatch, counted by stowage.measure.live_bytes' LiveBytes (a TorchDispatchMode; op_work's bytes:
each op's tensors read and written, Note [Kernel bytes] for the ops whose CUDA kernels move other
bytes), on bf16 [1024, 4096] fake tensors on the CPU. The per-row terms (the variance, rsqrt) and
the weight's gradient summed over the rows add under 0.03 B per element at this size.

Torch 2.x with transformers only (the PATH python of scripts/setup-deps).
"""

from __future__ import annotations

import importlib
import json
import os
import unittest

import support

try:
    import torch
    import transformers  # noqa: F401
    HAVE = int(torch.__version__.split(".")[0]) >= 2
except ImportError:  # Debian's torch 1.13 interpreter has no transformers
    HAVE = False

if HAVE:
    from stowage.measure.live_bytes import LiveBytes
    from stowage.measure.op_work import OpWork

DATA = os.path.join(support.REPO, "tests", "planner", "data", "hf_norm_work.json")
ROWS, WIDTH = 1024, 4096
# Bytes per element the per-row and per-weight terms may add (measured: 0.008 to 0.023).
PER_ROW = 0.03


def measure(cls: type) -> tuple["OpWork", "OpWork"]:
    """(forward, backward) op work of one norm of WIDTH over ROWS bf16 rows, on fake tensors
    (the ops and their sizes without the arithmetic, as stowage.measure.hf_profile measures)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    fake = FakeTensorMode()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # the weight made in bf16, as training loads it
    try:
        with fake:
            norm = cls(WIDTH)
    finally:
        torch.set_default_dtype(default)
    with fake:
        x = torch.empty(ROWS, WIDTH, dtype=torch.bfloat16, requires_grad=True)
        grad = torch.empty(ROWS, WIDTH, dtype=torch.bfloat16)
        mode = LiveBytes()
        with mode:
            mode.set_phase("forward")
            y = norm(x)
            mode.set_phase("backward")
            y.backward(grad)
    return mode.work["forward"], mode.work["backward"]


@unittest.skipUnless(HAVE, "needs torch 2.x and transformers (the PATH python of "
                           "scripts/setup-deps)")
class NormWorkTest(unittest.TestCase):
    def test_each_real_norm_runs_what_norm_work_of_counts(self) -> None:
        with open(DATA) as f:
            rows = json.load(f)["norms"]
        self.assertGreaterEqual(len(rows), 3)
        for row in rows:
            with self.subTest(family=row["family"], cls=row["class"]):
                module, name = row["class"].rsplit(".", 1)
                fwd, bwd = measure(getattr(importlib.import_module(module), name))
                n = ROWS * WIDTH
                self.assertEqual((fwd.kernels, bwd.kernels),
                                 (row["forward_kernels"], row["backward_kernels"]))
                for what, work, expected in (("forward", fwd, row["forward_bytes"]),
                                             ("backward", bwd, row["backward_bytes"])):
                    per_element = work.elementwise_bytes / n
                    self.assertGreaterEqual(per_element, expected, what)
                    self.assertLess(per_element - expected, PER_ROW, what)
                # No GEMM or attention hides in a norm.
                self.assertEqual(fwd.gemm_flops + bwd.gemm_flops, 0)


if __name__ == "__main__":
    unittest.main()
