"""stowage.megatron checks a plan against the Megatron-Core model before any step: under tensor
parallelism the plan's run.sequence_parallel must be the model's TransformerConfig.sequence_parallel
(Note [Sequence parallelism] in planner/frameworks/megatron.cc: the layer inputs the plan's
host_bytes count are a TP shard of the sequence with it, the whole sequence without)."""

from __future__ import annotations

import types
import unittest

import support  # noqa: F401  (puts the package on sys.path)

import stowage
from stowage import plan as plan_mod


def chunk(sequence_parallel: bool) -> types.SimpleNamespace:
    """What the check reads of a model chunk: its TransformerConfig."""
    return types.SimpleNamespace(config=types.SimpleNamespace(
        num_layers=2, mtp_num_layers=None, sequence_parallel=sequence_parallel))


def tp_plan(tp: int, sequence_parallel: bool) -> stowage.Plan:
    return stowage.Plan(
        layers=[plan_mod.LayerPlan(index=i, type="t", policy="keep") for i in range(2)],
        run=plan_mod.RunSettings(tp=tp, sequence_parallel=sequence_parallel))


class MegatronPlanChecksTest(unittest.TestCase):
    def test_sequence_parallel_must_be_the_models_under_tp(self) -> None:
        import stowage.megatron as sm
        check = sm._check_layout
        with self.assertRaisesRegex(
                stowage.PlanError,
                r"run.sequence_parallel is true but Megatron runs TP 2 without sequence "
                r"parallelism \(TransformerConfig.sequence_parallel\).*make the plan with "
                r"--no-sequence-parallel"):
            check(tp_plan(2, True), [], [chunk(False)], 1, 0, 2)
        with self.assertRaisesRegex(stowage.PlanError,
                                    r"run.sequence_parallel is false but Megatron runs TP 2 with "
                                    r"sequence parallelism.*without --no-sequence-parallel"):
            check(tp_plan(2, False), [], [chunk(True)], 1, 0, 2)
        check(tp_plan(2, True), [], [chunk(True)], 1, 0, 2)
        check(tp_plan(2, False), [], [chunk(False)], 1, 0, 2)
        # TP 1 (or a measured profile's plan, run.tp 1): nothing to split, nothing checked.
        check(tp_plan(1, True), [], [chunk(False)], 1, 0, 1)
        check(tp_plan(1, True), [], [chunk(False)], 1, 0, 2)


if __name__ == "__main__":
    unittest.main()
