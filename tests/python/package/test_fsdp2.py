"""stowage under FSDP2 (torch.distributed.fsdp.fully_shard), two ranks on CPU over gloo: a small
transformers Llama, every decoder layer sharded and then run under a plan, trains with loss and
every parameter's full gradient bit-identical to the same FSDP2 model without stowage, under
every policy and a mixed plan, over several optimizer steps (data_parallel_runs.py). FSDP2 frees
each layer's gathered parameters after its forward (reshard_after_forward, the default), so the
recomputing policies run on parameters gathered again in backward. The bytes the runtime sends
to the host are the plan's, step after step: no parameter (FSDP2's gathered buffers) is ever
offloaded. The refused order of wrapping (Note [FSDP2 and DDP] in
python/stowage/_sharding.py) names what to change.

Needs torch 2.x with fully_shard and transformers (skipped on Debian's torch 1.13).
"""

from __future__ import annotations

import unittest

import support  # noqa: F401  (puts the package on sys.path)

from package import data_parallel_runs as runs


@unittest.skipUnless(runs.AVAILABLE, "needs torch 2.x (fully_shard) and transformers")
class Fsdp2Test(unittest.TestCase):
    results: list = []

    @classmethod
    def setUpClass(cls) -> None:
        cls.results = [r["fsdp2"] | {"rank": r["rank"]} for r in runs.spawn(("fsdp2",))]

    def test_every_policy_is_bit_identical_to_fsdp2_alone(self) -> None:
        names = [name for name, _, _ in runs.PLANS] + ["mixed, root sharded after wrap"]
        for result in self.results:
            self.assertEqual(sorted(result["differences"]), sorted(names))
            for name, differences in result["differences"].items():
                with self.subTest(rank=result["rank"], plan=name):
                    self.assertEqual(differences, [])

    def test_the_host_receives_the_plans_bytes_and_no_parameter(self) -> None:
        for result in self.results:
            self.assertEqual(sorted(result["d2h"]), sorted(
                ["offload_input", "offload_saved", "mixed", "mixed, root sharded after wrap"]))
            for name, (sent, planned) in result["d2h"].items():
                with self.subTest(rank=result["rank"], plan=name):
                    self.assertGreater(planned, 0)
                    self.assertEqual(sent, planned)

    def test_the_other_order_is_refused_naming_the_change(self) -> None:
        for result in self.results:
            refused = result["refusals"]
            self.assertIn("layer 0 (LlamaDecoderLayer) was sharded with fully_shard after "
                          "stowage.wrap", refused["shard_after_wrap"])
            self.assertIn("fully_shard was applied to the PlannedLayers itself",
                          refused["shard_the_planned_layers"])
            self.assertIn("fully_shard was applied to the layers' container (FSDPSequential)",
                          refused["shard_the_container"])
            for message in refused.values():
                self.assertIn("call fully_shard on each decoder layer", message)


if __name__ == "__main__":
    unittest.main()
