"""Fake tensors at real widths (Note [Fake tensors at real widths] in
stowage/measure/hf_profile.py) against real CPU tensors: the same bytes, layer by layer; MLA
attention keeping what the GPU's kernel keeps; one layer per kind keeping its layer type and the
full depth's weights."""

from __future__ import annotations

import unittest

import support  # noqa: F401  (puts the package on sys.path)
from measure.hf_cases import HAVE, TINY, TINY_MLA, needs_hf

if HAVE:
    from stowage.measure.hf_model import build_hf_model
    from stowage.measure.hf_step import evaluate
    from stowage.measure.hf_trace import trace_step


@needs_hf
class FakeTensorTest(unittest.TestCase):
    def test_fake_tensors_measure_what_real_ones_do(self) -> None:
        for family, config in TINY.items():
            with self.subTest(family=family):
                real = evaluate(trace_step(build_hf_model(config, fake=False), 96))
                fake = evaluate(trace_step(build_hf_model(config, fake=True), 96))
                self.assertEqual(fake, real)

    def test_mla_attention_keeps_what_the_gpu_kernel_keeps(self) -> None:
        # Note [SDPA on the GPU]: q/k head dims 48, v 32. The CPU would run SDPA's math path
        # (s x s scores kept: quadratic, and GEMMs); the GPU's fused kernel keeps q, k, v, the
        # output and the logsumexp: linear in the length, and attention work.
        hf = build_hf_model(TINY_MLA["deepseek_v2"])
        traces = [trace_step(hf, s) for s in (128, 256, 384)]
        steps = [evaluate(t) for t in traces]
        for j in range(len(steps[0].layers)):
            with self.subTest(layer=j):
                a, b, c = (step.layers[j].saved_bytes for step in steps)
                self.assertEqual(c - 2 * b + a, 0)
                self.assertGreater(traces[0].work[("forward", j)].attention_forward_flops, 0)

    def test_kept_layers_keep_their_layer_types(self) -> None:
        # Note [One layer per kind]: OLMo 3's fourth layer is its full-attention one; with one
        # layer per kind it is the decoder's second, and Olmo3Model.forward hands layer j
        # config.layer_types[j]'s mask: it ran with the sliding-window mask, so its measured
        # figures were the sliding layer's (measured step +1.2% against the analytic).
        config = dict(model_type="olmo3", hidden_size=128, intermediate_size=256,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=512, sliding_window=64)
        one = evaluate(trace_step(build_hf_model(config), 128))
        full = evaluate(trace_step(build_hf_model(config, one_per_kind=False), 128))
        self.assertNotEqual(full.layers[0].saved_bytes, full.layers[3].saved_bytes)
        self.assertEqual(one.layers[0], full.layers[0])
        self.assertEqual(one.layers[1].saved_bytes, full.layers[3].saved_bytes)
        self.assertEqual(one.layers[1].forward_own_bytes, full.layers[3].forward_own_bytes)

    def test_one_layer_per_kind_full_weights(self) -> None:
        config = dict(TINY["qwen3_moe"], num_hidden_layers=5, mlp_only_layers=[0, 3])
        hf = build_hf_model(config)
        self.assertEqual(hf.kinds, [0, 1, 1, 0, 1])
        full = build_hf_model(dict(config), fake=False)
        self.assertEqual(hf.weights_bytes, full.weights_bytes)
        self.assertEqual(len(hf.model.model.layers), 2)


if __name__ == "__main__":
    unittest.main()
