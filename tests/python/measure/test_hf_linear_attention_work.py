"""The real linear-attention token mixers' op work against LinearAttentionWorkOf
(planner/frameworks/hf_linear_attention.cc, Note [hf linear attention work]).

tests/planner/data/hf_linear_attention_work.json states, per row (a family's mixer at small
widths and a length), what the mixer runs through transformers' torch fallbacks
(torch_chunk_gated_delta_rule, chunk_kimi_delta_attention, causal_conv1d_fn): element-wise bytes,
kernels and GEMM FLOPs, forward and backward, its projections' GEMMs left out.
planner_hf_norm_work_test (HfLinearAttentionWork.*) checks that the recipe says so; this suite
checks that the real module runs it: every aten op of its forward and backward, counted by
stowage.measure.live_bytes' LiveBytes (op_work), on fake tensors. Either drifting fails one of them.
Rows cover both paddings (a length a multiple of the 64-token chunk and one that is not) and
Qwen3-Next's value heads with and without repeat_interleave.

Torch 2.x with transformers only (the PATH python of scripts/setup-deps).
"""

from __future__ import annotations

import json
import os
import sys
import unittest

import support

try:
    import torch
    import transformers  # noqa: F401
    HAVE = int(torch.__version__.split(".")[0]) >= 2
except ImportError:  # Debian's torch 1.13 interpreter has no transformers
    HAVE = False

if HAVE:
    from stowage.measure.hf_model import build_hf_model, decoder_of
    from stowage.measure.live_bytes import LiveBytes

DATA = os.path.join(support.REPO, "tests", "planner", "data", "hf_linear_attention_work.json")
FIELDS = ("forward_bytes", "backward_bytes", "forward_kernels", "backward_kernels",
          "forward_fp32_gemm_flops", "backward_fp32_gemm_flops")


def measure(config: dict, seq_len: int) -> dict[str, float]:
    """The op work of the first layer's token mixer (a linear-attention layer) on one sequence
    of `seq_len` tokens, forward and backward: its element-wise work and its fp32 GEMMs (the
    chunk loops' matmuls), and `projection_*_gemm_flops`, its bf16 GEMMs (which the recipe counts
    from the layer's parameters: 2 and 4 FLOPs per nn.Linear weight and token)."""
    hf = build_hf_model(dict(config, num_hidden_layers=1, layer_types=["linear_attention"]))
    layer = decoder_of(hf.model).layers[0]
    mixer = getattr(layer, "linear_attn", None) or layer.self_attn
    linears = sum(m.weight.numel() for m in mixer.modules() if isinstance(m, torch.nn.Linear))
    with hf.mode:
        x = torch.empty(1, seq_len, config["hidden_size"], dtype=torch.bfloat16,
                        requires_grad=True)
        mode = LiveBytes()
        with mode:
            mode.set_phase("forward")
            y = mixer(x)
            y = y[0] if isinstance(y, tuple) else y
            grad = torch.empty_like(y)
            mode.set_phase("backward")
            y.backward(grad)
    fwd, bwd = mode.work["forward"], mode.work["backward"]
    return {"forward_bytes": fwd.elementwise_bytes, "backward_bytes": bwd.elementwise_bytes,
            "forward_kernels": fwd.kernels, "backward_kernels": bwd.kernels,
            "forward_fp32_gemm_flops": fwd.fp32_gemm_flops,
            "backward_fp32_gemm_flops": bwd.fp32_gemm_flops,
            "projection_forward_gemm_flops": fwd.gemm_flops,
            "projection_backward_gemm_flops": bwd.gemm_flops,
            "linear_weights": linears}


@unittest.skipUnless(HAVE, "needs torch 2.x and transformers (the PATH python of "
                           "scripts/setup-deps)")
class LinearAttentionWorkTest(unittest.TestCase):
    def test_each_real_mixer_runs_what_linear_attention_work_of_counts(self) -> None:
        with open(DATA) as f:
            rows = json.load(f)["mixers"]
        self.assertGreaterEqual(len(rows), 6)
        for row in rows:
            config = row["config"]
            with self.subTest(family=config["model_type"], seq_len=row["seq_len"]):
                got = measure(config, row["seq_len"])
                self.assertEqual({k: got[k] for k in FIELDS}, {k: row[k] for k in FIELDS})
                # The chunk loops' matmuls are fp32 GEMMs (bmm); the only bf16 GEMMs are the
                # projections'.
                self.assertGreater(got["forward_fp32_gemm_flops"], 0)
                self.assertEqual(got["projection_forward_gemm_flops"],
                                 2 * got["linear_weights"] * row["seq_len"])
                self.assertEqual(got["projection_backward_gemm_flops"],
                                 4 * got["linear_weights"] * row["seq_len"])


if __name__ == "__main__":
    # `python3 -m measure.test_hf_linear_attention_work --write` from tests/python: the data
    # file's numbers from the real mixers (review the diff: the recipe must then be made to say
    # the same).
    if "--write" in sys.argv:
        with open(DATA) as f:
            data = json.load(f)
        for row in data["mixers"]:
            got = measure(row["config"], row["seq_len"])
            row.update({k: got[k] for k in FIELDS})
        with open(DATA, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
    else:
        unittest.main()
