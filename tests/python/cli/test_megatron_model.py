"""`stowage plan --from-megatron` builds the model from Megatron-LM's own arguments
(bridges/megatron_model.h): its parameter count (the plan's `model_parameters`) must be what
Megatron-Core's GPTModel holds when built from the same arguments, for dense, GQA, MoE, MLA and
MTP models; for a GeLU / LayerNorm model (planned as the SwiGLU / RMSNorm of equal weight) the
difference must be the one the planner's note states.

Each case is a Megatron argument list (what the launch script passes) and, beside it, the
TransformerConfig / GPTModel arguments megatron/training/arguments.py derives from it (megatron-core
is installed without megatron.training): vocabulary 1000 padded to 1024 (128 x TP 1).
Needs torch 2.x and megatron-core; skipped without them or without the CLI (STOWAGE_CLI).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import megatron.core  # noqa: F401
    import torch  # noqa: F401
    HAVE = True
except ImportError:
    HAVE = False

COMMON = ["--num-layers", "3", "--hidden-size", "128", "--num-attention-heads", "4",
          "--seq-length", "1024", "--max-position-embeddings", "1024", "--micro-batch-size", "1",
          "--vocab-size", "1000", "--tokenizer-type", "NullTokenizer"]
SWIGLU = ["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope"]
BASE = dict(num_layers=3, hidden_size=128, num_attention_heads=4, normalization="RMSNorm")
ROPE = dict(vocab_size=1024, max_sequence_length=1024, position_embedding_type="rope")

CASES = {
    "dense": (COMMON + SWIGLU + ["--ffn-hidden-size", "352", "--disable-bias-linear",
                                 "--untie-embeddings-and-output-weights"],
              dict(config=dict(BASE, ffn_hidden_size=352, add_bias_linear=False),
                   model=dict(ROPE, share_embeddings_and_output_weights=False))),
    "gqa": (COMMON + SWIGLU + ["--group-query-attention", "--num-query-groups", "2",
                               "--kv-channels", "48", "--qk-layernorm"],
            # Biases on, tied embeddings: Megatron's defaults; ffn: int(8h/3 / 64) * 64.
            dict(config=dict(BASE, ffn_hidden_size=320, num_query_groups=2, kv_channels=48,
                             qk_layernorm=True, add_bias_linear=True),
                 model=dict(ROPE, share_embeddings_and_output_weights=True))),
    "moe": (COMMON + SWIGLU + ["--disable-bias-linear", "--num-experts", "8",
                               "--moe-router-topk", "2", "--moe-ffn-hidden-size", "64",
                               "--moe-shared-expert-intermediate-size", "96",
                               "--moe-layer-freq", "([0]*1+[1]*2)", "--ffn-hidden-size", "256",
                               "--untie-embeddings-and-output-weights"],
            dict(config=dict(BASE, ffn_hidden_size=256, add_bias_linear=False, num_moe_experts=8,
                             moe_router_topk=2, moe_ffn_hidden_size=64,
                             moe_shared_expert_intermediate_size=96, moe_layer_freq=[0, 1, 1],
                             moe_token_dispatcher_type="allgather"),
                 model=dict(ROPE, share_embeddings_and_output_weights=False))),
    "mla": (COMMON + SWIGLU + ["--disable-bias-linear", "--multi-latent-attention",
                               "--q-lora-rank", "64", "--kv-lora-rank", "32", "--qk-head-dim",
                               "32", "--qk-pos-emb-head-dim", "16", "--v-head-dim", "32",
                               "--qk-layernorm", "--ffn-hidden-size", "256",
                               "--untie-embeddings-and-output-weights"],
            dict(mla=True,
                 config=dict(BASE, ffn_hidden_size=256, add_bias_linear=False, q_lora_rank=64,
                             kv_lora_rank=32, qk_head_dim=32, qk_pos_emb_head_dim=16,
                             v_head_dim=32, qk_layernorm=True, multi_latent_attention=True,
                             rope_type="rope"),
                 model=dict(ROPE, share_embeddings_and_output_weights=False))),
    "mtp": (COMMON + SWIGLU + ["--disable-bias-linear", "--ffn-hidden-size", "256",
                               "--mtp-num-layers", "1", "--untie-embeddings-and-output-weights"],
            dict(config=dict(BASE, ffn_hidden_size=256, add_bias_linear=False, mtp_num_layers=1),
                 model=dict(ROPE, share_embeddings_and_output_weights=False))),
    # GPT-3's form: GeLU MLP of 4h, LayerNorm, biases, learned positions, tied embeddings.
    "gelu": (COMMON,
             dict(gelu=True,
                  config=dict(BASE, ffn_hidden_size=512, normalization="LayerNorm",
                              add_bias_linear=True),
                  model=dict(vocab_size=1024, max_sequence_length=1024,
                             position_embedding_type="learned_absolute",
                             share_embeddings_and_output_weights=True))),
}


def megatron_counts() -> dict:
    arg = json.dumps({name: case for name, (_, case) in CASES.items()})
    out = subprocess.run([sys.executable, os.path.join(HERE, "megatron_model_params.py"), arg],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise AssertionError(out.stderr[-4000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


@unittest.skipUnless(HAVE, "needs torch 2.x and megatron-core")
class MegatronModelTest(unittest.TestCase):
    def test_parameter_counts_match_megatron_core(self) -> None:
        cli = os.environ.get("STOWAGE_CLI")
        if not cli or not os.path.exists(cli):
            self.skipTest("STOWAGE_CLI is not set to a built `stowage` CLI")
        counts = megatron_counts()
        with tempfile.TemporaryDirectory() as tmp:
            for name, (arguments, _) in CASES.items():
                script = os.path.join(tmp, f"{name}.sh")
                with open(script, "w") as f:
                    f.write("torchrun --nproc_per_node 1 pretrain_gpt.py \\\n    "
                            + " ".join(f"'{a}'" for a in arguments) + "\n")
                out = subprocess.run([cli, "plan", "--from-megatron", script, "--hardware",
                                      "h200", "--format", "json"],
                                     capture_output=True, text=True, timeout=300)
                self.assertIn(out.returncode, (0, 1), f"{name}: {out.stderr}")
                planned = json.loads(out.stdout)["model_parameters"]
                said = re.search(r"Megatron-Core holds (\d+) more parameters", out.stderr)
                moved = int(said.group(1)) if said else 0
                with self.subTest(case=name):
                    self.assertEqual(planned + moved, counts[name], out.stderr)
                    if name != "gelu":
                        self.assertEqual(moved, 0, out.stderr)


if __name__ == "__main__":
    unittest.main()
