"""The fit in the sequence length (stowage.measure.hf_fit, stowage.measure.hf_fold): the step
extrapolated to another length is the step measured there, byte for byte, loops folded; the
thresholds a fit must not cross; the lengths it takes."""

from __future__ import annotations

import unittest

import support  # noqa: F401  (puts the package on sys.path)
from measure.hf_cases import FAMILIES, HAVE, MEASURING, TINY, needs_hf

if HAVE:
    from stowage.measure.hf_fit import extrapolate, fit
    from stowage.measure.hf_fold import unfolded_kink
    from stowage.measure.hf_profile import measure_hf
    from stowage.measure.hf_step import StepPoint, evaluate
    from stowage.measure.hf_trace import StepTrace, trace_step
    from stowage.measure.op_work import WORK_FIELDS


@needs_hf
class FitTest(unittest.TestCase):
    def test_fit_recovers_a_quadratic(self) -> None:
        pts = [(s, 7 + 3 * s + 2 * s * s) for s in (100, 200, 400)]
        self.assertEqual(fit(pts), [7, 3, 2])
        self.assertEqual(extrapolate(pts, 10**6), 7 + 3 * 10**6 + 2 * 10**12)
        # Two points fit the linear and quadratic terms only.
        self.assertEqual(fit([(10, 30 + 200), (20, 60 + 800)]), [0, 3, 2])

    def test_extrapolated_step_is_the_measured_step(self) -> None:
        # Each allocation's size is fitted through 384, 512, 768 tokens and the step replayed at
        # 2048 (Note [Replaying the step]): every figure equals the step measured there, peaks
        # included, though a peak is a max of sums and no polynomial itself. (Qwen3-MoE's index_put
        # sorts take one pass more from 257 tokens: Note [One side of every threshold]; all four
        # lengths are past it.)
        for family in ("llama", "qwen3_moe"):
            with self.subTest(family=family):
                m = measure_hf(FAMILIES[family], lengths=(384, 512, 768))
                extrapolated = m.at(2048)
                direct = trace_step(m.hf, 2048)
                self.assertEqual(extrapolated.sizes, direct.sizes)
                self.assertEqual(evaluate(extrapolated), evaluate(direct))
                for phase, w in direct.work.items():
                    for field in WORK_FIELDS:
                        self.assertAlmostEqual(getattr(extrapolated.work[phase], field),
                                               getattr(w, field),
                                               delta=1e-9 * max(1.0, getattr(w, field)),
                                               msg=f"{phase} {field}")

    def test_index_put_sorts_have_thresholds(self) -> None:
        # Note [One side of every threshold] (3): Qwen3-MoE top-8's gather backwards sort the
        # ids of t and 8t destination rows, one pass more from 257 and 65537 rows: at 33, 257,
        # 8193 and 65537 tokens.
        m = measure_hf(FAMILIES["qwen3_moe"], lengths=(384, 512, 768))
        sorts = {t for t, what in m.thresholds if "index_put" in what}
        self.assertLessEqual({33, 257, 8193, 65537}, sorts)
        self.assertTrue(m.covers(8192))
        self.assertFalse(m.covers(8193))
        self.assertFalse(m.covers(256))

    def test_chunk_loops_fold_and_extrapolate(self) -> None:
        # Note [Loops in the step]: the torch fallback of gated DeltaNet scans 64-token chunks in
        # a Python loop, so each length runs other ops (it failed with "ran other ops"); folded,
        # the step at 640 tokens extrapolated from 384, 448 and 512 (MEASURING) is the step
        # traced there, in every figure the planner reads.
        config = dict(FAMILIES["qwen3_5_text"], num_hidden_layers=1,
                      layer_types=["linear_attention"])
        m = measure_hf(config, lengths=MEASURING["qwen3_5_text"])
        self.assertTrue(m.traces[0].folded)

        def figures(p: "StepPoint") -> tuple:
            return ([(x.input_bytes, x.output_bytes, x.saved_bytes, x.retained_bytes,
                      x.forward_own_bytes, x.backward_own_bytes, x.grad_bytes) for x in p.layers],
                    p.other_bytes, p.loss_peak_bytes, p.loss_grad_bytes, p.embedding_grad_bytes,
                    p.peak_bytes)

        direct = trace_step(m.hf, 640)
        self.assertEqual(figures(evaluate(m.at(640))), figures(evaluate(direct)))
        extrapolated = m.at(640)
        for phase, w in direct.work.items():
            for field in WORK_FIELDS:
                self.assertAlmostEqual(getattr(extrapolated.work[phase], field),
                                       getattr(w, field), delta=1e-9 * max(1.0, getattr(w, field)),
                                       msg=f"{phase} {field}")

    def test_a_loop_not_yet_linear_is_refused(self) -> None:
        # A folded middle's bytes through the measured lengths must be linear in the length
        # (GDN's and KDA's are not over their first five chunks): one that is not names itself
        # rather than extrapolate a kink.
        def step(s: int, v: int) -> "StepTrace":
            return StepTrace(seq_len=s, events=[("a", 0), ("f", 0)], sizes=[v], saved=[],
                             inputs=[], outputs=[], grads={}, work={}, module_work={},
                             folded=[0])
        self.assertIsNone(unfolded_kink([step(128, 10), step(192, 20), step(320, 40)]))
        self.assertEqual(unfolded_kink([step(128, 10), step(192, 20), step(256, 25)]), 0)

    def test_lengths_must_be_two_distinct(self) -> None:
        with self.assertRaisesRegex(Exception, "at least two distinct"):
            measure_hf(TINY["llama"], lengths=(256, 256))


if __name__ == "__main__":
    unittest.main()
