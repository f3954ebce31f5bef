"""The wrapper's per-tensor path (layers.py: saved-tensor hooks, batched saves and prefetches,
lazy retiring) keeps its guarantees: bit-identical gradients, a saved tensor referenced until
its copy is known complete, everything released every step."""

from __future__ import annotations

import unittest

import support  # noqa: F401  (puts the package on sys.path)
import torch
import torch.nn as nn

import plans
import stowage
from stowage import layers as stowage_layers

torch.set_num_threads(1)


class ManySmallSaves(nn.Module):
    """Elementwise ops that each save their input (sin, tanh's output, a product), some of them
    views at one address (x and x.t() are saved once each), plus a weight that stays put."""

    def __init__(self, hidden: int, ops: int):
        super().__init__()
        self.ops = ops
        self.w = nn.Parameter(torch.randn(hidden, hidden) / hidden**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x @ self.w  # saves x and the weight (which stays on the device)
        for k in range(self.ops):
            x = torch.sin(x) if k % 2 else torch.tanh(x) * x
        return x + (x.t() @ x).sum() * 1e-3  # x and its transpose: one address, two views


def make(layers: int = 3, hidden: int = 8, ops: int = 12) -> nn.ModuleList:
    torch.manual_seed(3)
    return nn.ModuleList([ManySmallSaves(hidden, ops) for _ in range(layers)])


def run(layers: nn.ModuleList, x0: torch.Tensor, steps: int,
        planned: "stowage.PlannedLayers | None" = None) -> list:
    out = []
    for _ in range(steps):
        for p in layers.parameters():
            p.grad = None
        x = x0.detach().clone().requires_grad_(True)
        if planned is None:
            y = x
            for layer in layers:
                y = layer(y)
            y.square().mean().backward()
        else:
            with planned.step():
                planned(x).square().mean().backward()
        out.append([x.grad.clone()] + [p.grad.clone() for p in layers.parameters()])
    return out


class HotPathTest(unittest.TestCase):
    def setUp(self) -> None:
        self.x0 = torch.randn(6, 8)
        self.layers = make()
        self.want = run(self.layers, self.x0, 2)
        self.plan = plans.plan_for(self.layers, self.x0, ["offload_saved"] * 3)

    def check(self, what: str, **options) -> stowage.PlannedLayers:
        planned = stowage.PlannedLayers(self.layers, self.plan, **options)
        got = run(self.layers, self.x0, 2, planned)
        for step, (a, b) in enumerate(zip(self.want, got)):
            for k, (u, v) in enumerate(zip(a, b)):
                self.assertTrue(torch.equal(u, v), f"{what}: tensor {k} differs at step {step}")
        s = planned.stats()
        self.assertEqual(s.arena_used_bytes, 0)
        self.assertEqual(s.saves_total, s.restores_total)
        # Exactly the bytes the plan reserved moved each step: each distinct tensor once.
        self.assertEqual(s.d2h_bytes_total, 2 * self.plan.runtime.host_arena_bytes)
        return planned

    def test_batches_of_every_size(self) -> None:
        saved = (stowage_layers.kSaveBatchTensors, stowage_layers.kSaveBatchBytes)
        try:
            for tensors, nbytes in ((1, 1 << 20), (3, 1 << 20), (1024, 100), (1024, 1 << 20)):
                with self.subTest(tensors=tensors, nbytes=nbytes):
                    stowage_layers.kSaveBatchTensors = tensors
                    stowage_layers.kSaveBatchBytes = nbytes
                    self.check(f"batches of {tensors} tensors / {nbytes} bytes").close()
        finally:
            stowage_layers.kSaveBatchTensors, stowage_layers.kSaveBatchBytes = saved

    def test_a_save_stays_referenced_until_its_copy_is_known_done(self) -> None:
        # Regression: retire() once dropped a save's entry (the only reference keeping the
        # tensor's memory from reuse) before the wait for its copy returned, and a mixed plan
        # trained with wrong gradients about one run in ten. Every wait and poll must find its
        # entry still pending.
        planned = stowage.PlannedLayers(self.layers, self.plan)
        calls = stowage_layers._Calls
        orig_wait, orig_query = calls.wait, calls.query
        checked = [0]

        def pending_ids() -> set:  # saves not yet known complete, their tensors still held
            return {i for _, ids, tensors, k in planned._state.pending
                    for i, t in zip(ids[k:], tensors[k:]) if t is not None}

        def wait(self_, tensor_id, stream):  # type: ignore[no-untyped-def]
            self.assertIn(tensor_id, pending_ids(), "waited for a save no longer referenced")
            orig_wait(self_, tensor_id, stream)
            self.assertIn(tensor_id, pending_ids(), "dropped before its wait returned")
            checked[0] += 1

        def query(self_, tensor_id):  # type: ignore[no-untyped-def]
            self.assertIn(tensor_id, pending_ids(), "polled a save no longer referenced")
            return orig_query(self_, tensor_id)

        calls.wait, calls.query = wait, query
        try:
            run(self.layers, self.x0, 2, planned)
        finally:
            calls.wait, calls.query = orig_wait, orig_query
        self.assertGreater(checked[0], 0)
        planned.close()

    def test_mixed_plans_and_prefetch_distances(self) -> None:
        for policies in (["offload_input", "offload_saved", "keep"],
                         ["offload_saved", "recompute", "offload_input"]):
            for distance in (1, 2, 3):
                with self.subTest(policies=policies, distance=distance):
                    self.plan = plans.plan_for(self.layers, self.x0, policies,
                                               prefetch_distance=distance)
                    self.check(f"{policies} at distance {distance}").close()

    def test_exception_inside_a_layer_leaves_nothing(self) -> None:
        planned = stowage.PlannedLayers(self.layers, self.plan)
        orig = ManySmallSaves.forward

        def failing(self_, x):  # type: ignore[no-untyped-def]
            y = orig(self_, x)
            if self_ is self.layers[1]:
                raise ValueError("layer 1 failed after saving")
            return y

        ManySmallSaves.forward = failing
        try:
            with self.assertRaisesRegex(ValueError, "layer 1 failed"):
                with planned.step():
                    planned(self.x0.clone().requires_grad_(True))
        finally:
            ManySmallSaves.forward = orig
        s = planned.stats()
        self.assertEqual((s.arena_used_bytes, s.copies_in_flight), (0, 0))
        self.assertIsNone(planned._state)
        # The next steps train as if nothing happened.
        got = run(self.layers, self.x0, 2, planned)
        for a, b in zip(self.want, got):
            self.assertTrue(all(torch.equal(u, v) for u, v in zip(a, b)))
        planned.close()


if __name__ == "__main__":
    unittest.main()
