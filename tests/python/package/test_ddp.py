"""stowage under DistributedDataParallel, two ranks on CPU over gloo: a small transformers
Llama whose decoder layers run under a plan, the whole model then wrapped in DDP, trains with
loss and every parameter gradient bit-identical to the same DDP model without stowage, under
every policy and a mixed plan, over several optimizer steps (data_parallel_runs.py); the bytes
sent to the host are the plan's. A DDP module given to PlannedLayers (the refused order, Note
[FSDP2 and DDP] in python/stowage/_sharding.py) names what to change.

Needs torch 2.x and transformers (skipped on Debian's torch 1.13).
"""

from __future__ import annotations

import unittest

import support  # noqa: F401  (puts the package on sys.path)

from package import data_parallel_runs as runs


@unittest.skipUnless(runs.AVAILABLE, "needs torch 2.x and transformers")
class DdpTest(unittest.TestCase):
    results: list = []

    @classmethod
    def setUpClass(cls) -> None:
        cls.results = [r["ddp"] | {"rank": r["rank"]} for r in runs.spawn(("ddp",))]

    def test_every_policy_is_bit_identical_to_ddp_alone(self) -> None:
        for result in self.results:
            self.assertEqual(sorted(result["differences"]),
                             sorted(name for name, _, _ in runs.PLANS))
            for name, differences in result["differences"].items():
                with self.subTest(rank=result["rank"], plan=name):
                    self.assertEqual(differences, [])

    def test_the_host_receives_the_plans_bytes(self) -> None:
        for result in self.results:
            self.assertEqual(sorted(result["d2h"]),
                             sorted(["offload_input", "offload_saved", "mixed"]))
            for name, (sent, planned) in result["d2h"].items():
                with self.subTest(rank=result["rank"], plan=name):
                    self.assertGreater(planned, 0)
                    self.assertEqual(sent, planned)

    def test_a_ddp_module_given_as_the_layers_is_refused(self) -> None:
        for result in self.results:
            for case, message in result["refusals"].items():
                with self.subTest(rank=result["rank"], case=case):
                    self.assertIn("PlannedLayers was given a DistributedDataParallel module",
                                  message)
                    self.assertIn("then wrap the whole model: DistributedDataParallel(model)",
                                  message)


if __name__ == "__main__":
    unittest.main()
