"""Simulator ≡ runtime with real torch layers.

Real MLP blocks and attention blocks run on CPU with the host backend. For plans that mix every
policy and each prefetch distance 1-4, the C++ simulator's predicted events (stowage_plan_evaluate
on the measured profile) must be what the runtime's trace shows when PlannedLayers carries the
plan out: the calls (save issued, save wait, prefetch issued, restore) in the same order with the
same bytes per layer, and the same bytes landed per layer. Times are not compared. The runtime
traces each tensor and the simulator each layer, so a run of calls of one kind for one layer is
one call here.
"""

from __future__ import annotations

import unittest

import support

import torch
import torch.nn as nn

import stowage
from stowage.planner import evaluate
from stowage.measure.profile import profile_layers

HIDDEN = 32
TOKENS = 16
LANDED = ("save_landed", "prefetch_landed")

# Every policy in each plan where it fits, neighbours and gaps between offloading layers, the
# last layer offloading (its save is waited for, and its prefetch issued, when backward starts)
# and not.
ASSIGNMENTS = [
    ["offload_input", "offload_saved", "keep", "recompute", "selective_recompute",
     "offload_input"],
    ["offload_saved", "offload_saved", "offload_saved", "offload_input", "offload_input",
     "offload_saved"],
    ["keep", "offload_input", "selective_recompute", "offload_saved", "recompute", "keep"],
]


def _mixed_layers() -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList([support.MLPBlock(HIDDEN) if i % 2 == 0 else support.AttentionBlock(HIDDEN)
                          for i in range(6)])


def _calls_and_landed(events) -> tuple[list, dict]:
    """(calls in order, a run of one kind and layer merged with its bytes summed; landed bytes
    per (kind, layer)) from dicts or TraceEvents."""
    calls: list = []
    landed: dict = {}
    for e in events:
        kind, layer, nbytes = ((e["kind"], e["layer"], e["bytes"]) if isinstance(e, dict)
                               else (e.kind, e.layer, e.bytes))
        if kind in LANDED:
            landed[(kind, layer)] = landed.get((kind, layer), 0) + nbytes
        elif calls and calls[-1][0] == kind and calls[-1][1] == layer:
            calls[-1][2] += nbytes
        else:
            calls.append([kind, layer, nbytes])
    return calls, landed


class TraceMatchesSimulatorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.layers = _mixed_layers()
        cls.x0 = torch.randn(TOKENS, HIDDEN)
        cls.profile = profile_layers(cls.layers, cls.x0, loss_fn=support.loss_fn, repeats=1)

    def _modules(self, policies: list) -> dict:
        """The first measured module of each selective_recompute layer."""
        out = {}
        for i, p in enumerate(policies):
            if p == "selective_recompute":
                names = [m.name for m in self.profile.layers[i].modules]
                self.assertTrue(names, f"layer {i} has no module to recompute")
                out[i] = [names[0]]
        return out

    def test_every_policy_and_prefetch_distance(self) -> None:
        for a, policies in enumerate(ASSIGNMENTS):
            for distance in (1, 2, 3, 4):
                with self.subTest(assignment=a, prefetch_distance=distance):
                    ev = evaluate(self.profile, policies, prefetch_distance=distance,
                                  recompute_modules=self._modules(policies))
                    want_calls, want_landed = _calls_and_landed(ev.events)
                    self.assertTrue(want_calls)
                    layers = support.clone_layers(self.layers)
                    planned = stowage.PlannedLayers(layers, ev.plan, backend="host",
                                                    copy_threads=1, trace_capacity=4096)
                    try:
                        for _ in range(2):  # every step traces the same
                            support.train(layers, self.x0, 1, planned=planned, record=False)
                            trace = planned.runtime.trace()
                            self.assertEqual(trace.dropped, 0)
                            self.assertEqual([e.seq for e in trace.events],
                                             list(range(len(trace.events))))
                            got_calls, got_landed = _calls_and_landed(trace.events)
                            self.assertEqual(got_calls, want_calls)
                            self.assertEqual(got_landed, want_landed)
                    finally:
                        planned.close()

    def test_trace_is_off_by_default(self) -> None:
        ev = evaluate(self.profile, ASSIGNMENTS[1])
        layers = support.clone_layers(self.layers)
        planned = stowage.PlannedLayers(layers, ev.plan, backend="host", copy_threads=1)
        try:
            support.train(layers, self.x0, 1, planned=planned, record=False)
            trace = planned.runtime.trace()
            self.assertEqual(trace.events, [])
            self.assertEqual(trace.dropped, 0)
            with self.assertRaisesRegex(stowage.StowageError, "INVALID_ARGUMENT"):
                planned.runtime.set_trace_capacity((1 << 20) + 1)
        finally:
            planned.close()


if __name__ == "__main__":
    unittest.main()
