"""stowage.megatron on a GPU (run_tests.py gpu mcore; scripts/gpu-check): a Megatron-Core GPTModel
(local layer spec, dense and MoE, with an MTP layer) on CUDA under Megatron's own schedule, with
the runtime's CUDA backend (copy streams, pinned host arena): loss and every gradient over three
optimizer steps bit-identical to the unwrapped model's, for a plan that uses every policy, and
each layer sends the plan's host_bytes per microbatch. Skipped without CUDA (run_tests.py) or
megatron-core."""

from __future__ import annotations

import unittest

import support  # noqa: F401  (puts the package on sys.path)

from mcore import cases


class MegatronGpuTest(unittest.TestCase):
    @cases.skip_without_megatron
    def test_every_policy_on_cuda(self):
        runs = [{"layers": 5, "microbatches": 2,
                 "policies": ["keep", "recompute", "selective_recompute", "offload_input",
                              "offload_saved"], "modules": {"2": ["core_attn", "ffn_act"]}},
                {"moe": True, "mtp": True, "microbatches": 2,
                 "policies": ["offload_saved", "selective_recompute", "offload_input"],
                 "modules": {"1": ["moe_act", "layernorm"]}}]
        cases.check(self, cases.run({"cuda": True, "runs": runs})[0], runs)


if __name__ == "__main__":
    unittest.main()
