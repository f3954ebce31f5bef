"""stowage.megatron on a Megatron-Core GPTModel (local layer spec, CPU, gloo, Megatron's own
get_forward_backward_func() schedule): for every policy alone and for mixed plans, dense and MoE,
with and without an MTP layer, the loss and every parameter gradient over three optimizer steps
are bit-identical to the unwrapped model's, the state_dict keys are unchanged, and the bytes each
layer sent to the host in each microbatch (the runtime's trace) equal the plan's host_bytes.
A no_grad forward outside any step (evaluation) equals the unwrapped model's. Misuse: Megatron's
recompute left on, a forward outside .step(), a plan for another model, more microbatches than
the plan's, a selective recompute name the layer has not -- each a clear error naming what to
change. A plan from `stowage plan
--from-megatron ... --out plan.json` for the same job (bf16): offload_input runs bit-identical and
moves the planned input bytes; offload_saved, whose host_bytes the planner predicts for
TransformerEngine's layers, is refused at the layer that saves more, naming it."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
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
            "megatron_recompute", "outside_step", "other_model", "more_microbatches",
            "unknown_module")]
        errors = [r["error"] for r in cases.run({"runs": runs})[0]]
        self.assertIn("TransformerConfig.recompute_granularity is 'selective'", errors[0])
        self.assertIn("set recompute_granularity=None", errors[0])
        self.assertIn("outside `with planned.step():`", errors[1])
        self.assertIn("the plan has 3 layers but the model has 2 decoder layers", errors[2])
        self.assertIn("run.microbatches = 1", errors[3])
        self.assertIn("num_microbatches=1", errors[3])
        self.assertIn("layers[0].recompute_modules names 'core_attention' but layer 0 "
                      "(TransformerLayer) has no such module; allowed: Megatron's names "
                      "(attn_core, core_attn, ffn_act, layernorm,", errors[4])

    @cases.skip_without_megatron
    @unittest.skipUnless(os.environ.get("STOWAGE_CLI"), "needs the stowage CLI (STOWAGE_CLI)")
    def test_plan_from_megatron_arguments(self):
        w = cases.WORKER_SHAPE
        config = dict(model_type="llama", hidden_size=w["hidden"], num_hidden_layers=2,
                      num_attention_heads=w["heads"], num_key_value_heads=w["kv_heads"],
                      head_dim=w["hidden"] // w["heads"], vocab_size=w["vocab"],
                      max_position_embeddings=w["seq"], tie_word_embeddings=False,
                      hidden_act="silu", intermediate_size=w["ffn"])
        arguments = (f"--num-layers 2 --hidden-size {w['hidden']} --seq-length {w['seq']} "
                     "--micro-batch-size 1 --global-batch-size 1 "
                     "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --bf16\n")
        plans = {}
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(config, f)
            with open(os.path.join(tmp, "args.txt"), "w") as f:
                f.write(arguments)
            for policy in ("offload_input", "offload_saved"):
                out = os.path.join(tmp, f"{policy}.json")
                done = subprocess.run(
                    [os.environ["STOWAGE_CLI"], "plan", "--model", os.path.join(tmp, "config.json"),
                     "--from-megatron", os.path.join(tmp, "args.txt"), "--hardware", "h200",
                     "--gpus", "1", "--tp", "1", "--cp", "1", "--ep", "1", "--sharding",
                     "no_shard", "--force", policy, "--out", out],
                    capture_output=True, text=True, timeout=120)
                self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
                with open(out) as f:
                    plans[policy] = json.load(f)
        runs = [{"bf16": True, "policies": [], "plan": plans[p]}
                for p in ("offload_input", "offload_saved")]
        results = cases.run({"runs": runs})[0]
        self.assertEqual(plans["offload_input"]["layers"][0]["host_bytes"],
                         w["seq"] * w["hidden"] * 2)  # the layer's bf16 input
        cases.check(self, results[:1], runs[:1])
        self.assertIn("TransformerLayer decoder layer_number 1 (plan layer 0): layer 0 "
                      "(TransformerLayer, policy offload_saved) offloads", results[1]["error"])
        self.assertIn("but the plan reserves layers[0].host_bytes = "
                      f"{plans['offload_saved']['layers'][0]['host_bytes']}", results[1]["error"])
        self.assertIn("stowage.megatron.profile(model, batch)", results[1]["error"])


if __name__ == "__main__":
    unittest.main()
