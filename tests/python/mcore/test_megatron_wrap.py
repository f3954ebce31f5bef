"""stowage.megatron on a Megatron-Core GPTModel (local layer spec, CPU, gloo, Megatron's own
get_forward_backward_func() schedule): for every policy alone and for mixed plans, dense and MoE,
with and without an MTP layer, the loss and every parameter gradient over three optimizer steps
are bit-identical to the unwrapped model's, the state_dict keys are unchanged, and the bytes each
layer sent to the host in each microbatch (the runtime's trace) equal the plan's host_bytes.
Misuse: Megatron's recompute left on, a forward outside .step(), a plan for another model, more
microbatches than the plan's -- each a clear error naming what to change."""

from __future__ import annotations

import unittest

import support  # noqa: F401  (puts the package on sys.path)

from mcore import cases

POLICIES = ["keep", "recompute", "selective_recompute", "offload_input", "offload_saved"]


class MegatronWrapTest(unittest.TestCase):
    @cases.skip_without_megatron
    def test_dense_every_policy_and_mixed(self):
        sel = {"core_attn": ["core_attn"], "layernorm": ["layernorm", "mlp"]}
        runs = [{"policies": [p], "modules": {"0": sel["core_attn"], "1": sel["layernorm"]}
                 if p == "selective_recompute" else {}} for p in POLICIES]
        runs.append({"layers": 5, "policies": POLICIES, "microbatches": 2,
                     "modules": {"2": ["self_attention", "input_layernorm"]}})
        runs.append({"layers": 5, "policies": list(reversed(POLICIES)), "microbatches": 2,
                     "modules": {"2": ["attn_core", "ffn_act"]}})
        cases.check(self, cases.run({"runs": runs})[0], runs)

    @cases.skip_without_megatron
    def test_moe_and_mtp(self):
        runs = [
            {"moe": True, "policies": ["offload_saved"]},
            {"moe": True, "policies": ["selective_recompute", "offload_input"], "microbatches": 2,
             "modules": {"0": ["moe_act", "core_attn"]}},
            {"mtp": True, "policies": ["offload_input", "selective_recompute", "offload_saved"],
             "modules": {"1": ["layernorm"]}},
            {"moe": True, "mtp": True, "microbatches": 2,
             "policies": ["offload_saved", "recompute", "offload_input"]},
            {"moe": True, "mtp": True, "policies": ["keep", "offload_input",
                                                    "selective_recompute"],
             "modules": {"2": ["moe_act", "core_attn"]}},
        ]
        cases.check(self, cases.run({"runs": runs})[0], runs)

    @cases.skip_without_megatron
    def test_misuse(self):
        runs = [{"policies": ["offload_saved"], "misuse": m} for m in (
            "megatron_recompute", "outside_step", "other_model", "more_microbatches")]
        errors = [r["error"] for r in cases.run({"runs": runs})[0]]
        self.assertIn("TransformerConfig.recompute_granularity is 'selective'", errors[0])
        self.assertIn("set recompute_granularity=None", errors[0])
        self.assertIn("outside `with planned.step():`", errors[1])
        self.assertIn("the plan has 3 layers but the model has 2 decoder layers", errors[2])
        self.assertIn("run.microbatches = 1", errors[3])
        self.assertIn("num_microbatches=1", errors[3])


if __name__ == "__main__":
    unittest.main()
