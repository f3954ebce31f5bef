"""bench/bench_moe_block.py on CPU at small shapes: the block it times is transformers' own
Qwen3MoeSparseMoeBlock (the same aten ops, forward and backward, and the same values), the 5.17
path adds only its sentinel masks, and the JSON it writes has every field.

The times mean nothing on a CPU; scripts/gpu-check runs the script on an H200 (the MoE step
time: Note [torch._grouped_mm rate] in planner/hardware/hardware.cc).
"""

from __future__ import annotations

import collections
import json
import os
import tempfile
import unittest

import support

import torch
from torch.utils._python_dispatch import TorchDispatchMode


try:
    from transformers import AutoConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
except ImportError:  # Debian's torch 1.13 interpreter has no transformers
    Qwen3MoeSparseMoeBlock = None


class Ops(TorchDispatchMode):
    """The aten ops that run kernels (views and detaches left out), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        if not getattr(func, "is_view", False) and name not in ("detach", "alias"):
            self.names.append(name)
        return func(*args, **(kwargs or {}))


E, H, FE, K, T = 8, 32, 16, 2, 24


@unittest.skipUnless(hasattr(torch, "_grouped_mm"), "torch without _grouped_mm (before 2.8)")
class BenchMoeBlockTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.bench = support.load_tool("bench_moe_block")

    def run_mine(self, p: dict, x: torch.Tensor, grad: torch.Tensor, variant: str):
        x = x.detach().requires_grad_()
        for t in p.values():
            t.grad = None  # a gradient left from an earlier run would be accumulated into
        with Ops() as ops:
            y = self.bench.moe_block(torch, x, p, K, variant)
            y.backward(grad)
        return y.detach(), x.grad, ops.names

    @unittest.skipIf(Qwen3MoeSparseMoeBlock is None, "no transformers")
    def test_the_block_is_transformers_own(self) -> None:
        cfg = AutoConfig.for_model("qwen3_moe", hidden_size=H, moe_intermediate_size=FE,
                                   num_experts=E, num_experts_per_tok=K, norm_topk_prob=True,
                                   num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=16)
        cfg._experts_implementation = "grouped_mm"
        torch.manual_seed(0)
        block = Qwen3MoeSparseMoeBlock(cfg).to(torch.bfloat16)
        for q in block.parameters():
            torch.nn.init.normal_(q, std=0.02)
        p = {"router": block.gate.weight, "gate_up": block.experts.gate_up_proj,
             "down": block.experts.down_proj}
        x = torch.randn(T, H).to(torch.bfloat16)
        grad = torch.randn(T, H).to(torch.bfloat16)
        xt = x.detach().clone().view(1, T, H).requires_grad_()
        with Ops() as ops:
            yt = block(xt)
            yt.backward(grad.view(1, T, H))
        theirs = ops.names
        block.zero_grad(set_to_none=True)
        y, gx, mine = self.run_mine(p, x, grad, "5.23")
        self.assertEqual(mine, theirs)
        torch.testing.assert_close(y, yt.detach().view(T, H), rtol=0, atol=0)
        torch.testing.assert_close(gx, xt.grad.view(T, H), rtol=0, atol=0)

    def test_517_adds_only_the_sentinel_masks(self) -> None:
        gen = torch.Generator().manual_seed(0)
        p = self.bench.make_params(torch, "cpu", E, H, FE, gen)
        x = torch.randn(T, H, generator=gen).to(torch.bfloat16)
        grad = torch.randn(T, H, generator=gen).to(torch.bfloat16)
        y23, g23, ops23 = self.run_mine(p, x, grad, "5.23")
        y17, g17, ops17 = self.run_mine(p, x, grad, "5.17")
        added = collections.Counter(ops17)
        added.subtract(collections.Counter(ops23))
        # The mask (ge), the clamp, the in-place fill of the gathered states and its backward's
        # fill, and the two out-of-place fills after the grouped GEMMs with their backward's.
        self.assertEqual({k: v for k, v in added.items() if v}, {
            "ge": 1, "clamp_": 1, "masked_fill_": 1, "masked_fill": 5})
        torch.testing.assert_close(y17, y23, rtol=0, atol=0)  # no sentinels without EP
        torch.testing.assert_close(g17, g23, rtol=0, atol=0)

    def test_it_writes_every_field(self) -> None:
        out = os.path.join(tempfile.mkdtemp(prefix="bench-moe-block-"), "moe.json")
        rc = self.bench.main(["--device", "cpu", "--tokens", "16", "--experts", "4", "--hidden",
                              "32", "--moe-intermediate", "16", "--top-k", "2", "--out", out])
        self.assertEqual(rc, 0)
        with open(out) as f:
            got = json.load(f)
        self.assertEqual([(r["tokens"], r["variant"]) for r in got["results"]],
                         [(16, "5.17"), (16, "5.23")])
        for r in got["results"]:
            self.assertGreater(r["wall_s"], 0)
            self.assertGreaterEqual(r["wall_s"], r["host_s"])
            self.assertIn("aten::_grouped_mm", [o["op"] for o in r["ops"]])

    def test_bad_tokens_are_refused(self) -> None:
        with self.assertRaises(SystemExit):
            self.bench.main(["--device", "cpu", "--tokens", "0"])


if __name__ == "__main__":
    unittest.main()
