"""FSDP2 and DDP around stowage on CUDA (CTest label `gpu`; run_tests.py skips the module with
exit code 77 when torch sees no GPU): the runs of test_fsdp2.py and test_ddp.py over NCCL with the
runtime's CUDA backend -- copies on CUDA streams beside FSDP2's all-gather and reduce-scatter
streams, FSDP2's gathered buffers freed and gathered again between forward and backward. One rank
per GPU, two at most (one on a machine with one GPU: fully_shard and DDP over a group of one).
"""

from __future__ import annotations

import os
import unittest

# Deterministic cuBLAS, so recompute reproduces forward bit for bit; set before CUDA starts (the
# spawned ranks inherit it).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import support  # noqa: F401,E402  (puts the package on sys.path)
import torch  # noqa: E402

import stowage  # noqa: E402
from package import data_parallel_runs as runs  # noqa: E402


def _usable() -> str:
    """Why the GPU runs cannot go ('' when they can)."""
    if not runs.AVAILABLE:
        return "needs torch 2.x (fully_shard) and transformers"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if not torch.distributed.is_nccl_available():
        return "torch was built without NCCL"
    probe = stowage.Plan(layers=[stowage.LayerPlan(index=0, type="probe", policy="keep")])
    try:
        stowage.Runtime(probe, backend="cuda").close()
    except stowage.StowageError as e:
        if e.status == "UNAVAILABLE":
            return f"libstowage.so has no CUDA backend here: {e}"
        raise
    return ""


class CudaDataParallelTest(unittest.TestCase):
    def setUp(self) -> None:
        why = _usable()
        if why:
            self.skipTest(why)
        self.world = min(2, torch.cuda.device_count())

    def test_fsdp2_and_ddp(self) -> None:
        for ranked in runs.spawn(("fsdp2", "ddp"), "cuda", self.world):
            for engine in ("fsdp2", "ddp"):
                result = ranked[engine]
                for name, differences in result["differences"].items():
                    with self.subTest(engine=engine, rank=ranked["rank"], plan=name):
                        self.assertEqual(differences, [])
                self.assertTrue(result["d2h"], f"{engine}: no plan offloaded")
                for name, (sent, planned) in result["d2h"].items():
                    with self.subTest(engine=engine, rank=ranked["rank"], plan=name):
                        self.assertEqual(sent, planned)
                self.assertTrue(all(result["refusals"].values()), result["refusals"])


if __name__ == "__main__":
    unittest.main()
