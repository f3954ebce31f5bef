"""stowage.megatron under Megatron-Core's parallelism on CPU over gloo, two ranks, Megatron's own
get_forward_backward_func() schedules: tensor parallelism 2 (no pipelining), pipeline
parallelism 2 under 1F1B, and 2 stages x 2 virtual chunks under the interleaved schedule. On
every rank, loss and gradients are bit-identical to the unwrapped model's over two optimizer steps
and each layer of the rank sends the plan's host_bytes per microbatch (under TP: the rank's
shards). The pipeline plans come from stowage.megatron.profile of the pipelined model (each rank
measures its own chunks, gathered over the pipeline group) and the C++ planner's evaluation of
its stages: each layer's host_bytes equal to those measured on the one-stage model, its in-flight
count the schedule's (stowage.pipeline_order, as package/test_microbatches.py pipelined counts
it). A plan for another stage's layers or another schedule (1F1B's for interleaved chunks, split
by hand: megatron_worker.py stages_1f1b) is refused, naming both sides.

Expert parallelism 2 (MoE, Megatron's allgather token dispatcher): offload_input, recompute,
selective recompute and keep bit-identical; offload_saved on a MoE layer refused, since under
dropless EP what its experts save changes with the routing.

Sequence parallelism (TP 2 + SP, dense and MoE: Megatron-Core requires SP for MoE under TP,
moe/moe_layer.py) runs with megatron_worker.py's SequenceParallelNorm in place of the local
spec's norm, which refuses SP (transformer/torch_norm.py WrappedTorchNorm asserts
`not config.sequence_parallel`; apex's and TransformerEngine's norms run it). The saved tensors
of the sequence-parallel region are then the rank's sequence shard: the layer input offloaded is
half of TP 1's."""

from __future__ import annotations

import unittest

import support  # noqa: F401  (puts the package on sys.path)

import stowage
from mcore import cases
from package.test_microbatches import pipelined


def pipeline_plan(pp: int, vpp: int, policies: list, modules: dict) -> dict:
    """The plan measured on the one-stage model of pp x vpp layers (one per model chunk): its
    host_bytes are what the pipelined profile must measure, and the misuse runs split it."""
    base = cases.run({"runs": [dict(policies=policies, modules=modules, layers=pp * vpp,
                                    emit_plan=True, steps=1)]})[0][0]
    return base["plan"]


class MegatronParallelTest(unittest.TestCase):
    @cases.skip_without_megatron
    def test_tensor_parallel(self):
        runs = [{"policies": ["offload_saved", "offload_input"], "microbatches": 2},
                {"policies": ["selective_recompute", "offload_saved"],
                 "modules": {"0": ["ffn_act", "core_attn"]}},
                {"policies": ["recompute", "keep"]}]
        for rank in cases.run({"tp": 2, "steps": 2, "runs": runs}, world=2):
            cases.check(self, rank, runs)

    @cases.skip_without_megatron
    def test_sequence_parallel(self):
        runs = [{"policies": ["offload_saved", "offload_input"], "microbatches": 2},
                {"policies": ["selective_recompute", "recompute"],
                 "modules": {"0": ["ffn_act", "core_attn", "layernorm"]}},
                {"moe": True, "policies": ["offload_saved", "selective_recompute"],
                 "modules": {"1": ["moe_act", "layernorm"]}, "microbatches": 2},
                {"moe": True, "policies": ["offload_input", "keep"]},
                {"policies": ["offload_input"], "misuse": "planned_with_sp", "sp": False}]
        ranks = cases.run({"tp": 2, "sp": True, "steps": 2, "runs": runs}, world=2)
        for rank in ranks:
            cases.check(self, rank[:4], runs[:4])
            # The layer input is the rank's half of the sequence: SEQ/2 tokens x hidden, fp32.
            self.assertEqual(rank[0]["host_bytes"][1],
                             cases.WORKER_SHAPE["seq"] // 2 * cases.WORKER_SHAPE["hidden"] * 4)
            self.assertEqual(rank[3]["host_bytes"][0], rank[0]["host_bytes"][1])
            self.assertIn("the plan's run.sequence_parallel is true but Megatron runs TP 2 "
                          "without sequence parallelism", rank[4]["error"])

    @cases.skip_without_megatron
    def test_expert_parallel(self):
        # EP 2 over gloo with Megatron's allgather token dispatcher (the alltoall one makes CUDA
        # streams at construction, token_dispatcher.py). Policies whose bytes do not follow the
        # routing run bit-identical; offload_saved on a MoE layer under dropless EP is refused
        # by wrap (Note [Routed bytes under expert parallelism]).
        runs = [{"policies": ["offload_input", "selective_recompute"],
                 "modules": {"1": ["moe_act", "layernorm"]}, "microbatches": 2},
                {"policies": ["recompute", "keep"]},
                {"policies": ["offload_saved", "keep"]},
                # The pad flag: the allgather dispatcher does not read it (only alltoall and
                # flex's HybridEP pad), so the routed bytes still vary.
                {"policies": ["offload_saved", "keep"], "pad": True}]
        ranks = cases.run({"moe": True, "ep": 2, "steps": 2, "runs": runs}, world=2)
        for rank in ranks:
            cases.check(self, rank[:2], runs[:2])
            for refused in rank[2:]:
                self.assertIn("decoder layer_number 1 (plan layer 0) is a MoE layer under "
                              "expert parallelism 2 with policy offload_saved", refused["error"])
                self.assertIn("(the allgather token dispatcher, unpadded)", refused["error"])
                self.assertIn("--moe-pad-expert-input-to-capacity", refused["error"])

    @cases.skip_without_megatron
    def test_pipeline_1f1b(self):
        policies = ["offload_saved", "recompute", "offload_input", "offload_saved"]
        plan = pipeline_plan(2, 2, policies, {})  # 4 layers, 2 per stage
        runs = [{"policies": policies, "microbatches": 4},
                {"policies": policies, "misuse": "other_stage", "microbatches": 4}]
        ranks = cases.run({"pp": 2, "layers": 4, "steps": 2, "one_stage_plan": plan,
                           "runs": runs}, world=2)
        self.assertEqual([r[0]["mine"] for r in ranks], [[0, 1], [2, 3]])
        for r, rank in enumerate(ranks):
            cases.check(self, rank[:1], runs[:1])
            # The planner's pipelined plan of the profile gathered over both stages: Megatron's
            # split, 1F1B's in-flight counts (stage s of p holds min(p - s, M)), the layers'
            # bytes those of the one-stage model.
            self.assertEqual(rank[0]["run"], [2, 1, "1f1b", 4])
            self.assertEqual(rank[0]["stages"], [[[0, 2]], [[2, 2]]])
            self.assertEqual(rank[0]["in_flight"], [2, 2, 1, 1])
            self.assertEqual(rank[0]["host_bytes"], [l["host_bytes"] for l in plan["layers"]])
            # Each stage holds its own chunks' parameters (the embedding on the first, the
            # output layer's copy of it on the last); the loss is the last stage's.
            profiled = rank[0]["profile"]
            stages = profiled["pipeline"]["stages"]
            self.assertEqual([s["chunks"] for s in stages],
                             [[{"first_layer": 0, "num_layers": 2}],
                              [{"first_layer": 2, "num_layers": 2}]])
            self.assertTrue(all(s["fixed_bytes"]["weights"] > 0 for s in stages))
            self.assertGreater(profiled["loss_peak_bytes"], 0)
            self.assertGreater(profiled["loss_seconds"], 0)
            want = ["layers [0, 1] (layer_number - 1) but the plan's stages[0] gives it layers "
                    "[0, 1, 2]", "layers [2, 3] (layer_number - 1) but the plan's stages[1] "
                    "gives it layers [3]"][r]
            self.assertIn(f"pipeline stage {r} runs decoder {want}", rank[1]["error"])

    @cases.skip_without_megatron
    def test_pipeline_interleaved(self):
        policies = ["offload_saved", "offload_input", "selective_recompute", "offload_saved"]
        modules = {"2": ["core_attn"]}
        plan = pipeline_plan(2, 2, policies, modules)
        runs = [{"policies": policies, "modules": modules, "microbatches": 4},
                {"policies": policies, "modules": modules, "misuse": "other_schedule",
                 "microbatches": 4}]
        ranks = cases.run({"pp": 2, "vpp": 2, "layers": 4, "steps": 2, "one_stage_plan": plan,
                           "runs": runs}, world=2)
        self.assertEqual([r[0]["mine"] for r in ranks], [[0, 2], [1, 3]])
        split = pipelined(stowage.Plan.from_dict(plan), "interleaved", 2, 2, 4)
        for rank in ranks:
            cases.check(self, rank[:1], runs[:1])
            self.assertEqual(rank[0]["run"], [2, 2, "interleaved", 4])
            self.assertEqual(rank[0]["stages"], [[[0, 1], [2, 1]], [[1, 1], [3, 1]]])
            self.assertEqual(rank[0]["in_flight"],
                             [l.in_flight_microbatches for l in split.layers])
            self.assertEqual(rank[0]["host_bytes"], [l["host_bytes"] for l in plan["layers"]])
            # The loss: measured after the chunk that ends the model (stage 1's second chunk).
            self.assertGreater(rank[0]["profile"]["loss_peak_bytes"], 0)
            self.assertIn("the plan's run.vpp is 1 but this rank holds 2 model chunks",
                          rank[1]["error"])


if __name__ == "__main__":
    unittest.main()
