"""The planner's `megatron` profile (Note [megatron profile] in planner/cost/cost_model.cc) against
Megatron-Core's own layers: megatron_layers.py builds a `TransformerLayer` from the local
(non-TransformerEngine) layer spec on CPU and reports what autograd keeps per Megatron-Core module;
this test compares each module group, at two sequence lengths, with what
`stowage plan --framework megatron --force offload_saved` lists for the same shape, plus the
documented differences between the local spec and the TE kernels the profile models (LOCAL_*
below, each cited to the code). The terms both paths share (linear inputs, Megatron's fused
SwiGLU, the router, the permute, the experts) are asserted exactly as the profile counts them.
Needs torch 2.x and megatron-core (scripts/setup-deps pins it for the PATH python3); skipped
otherwise, e.g. under Debian's torch 1.13."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest

import support  # noqa: F401  (puts the package on sys.path)
from measure.megatron_layers import SHAPE

try:
    import torch
    import megatron.core  # noqa: F401
    HAVE = int(torch.__version__.split(".")[0]) >= 2
except ImportError:  # Debian's torch 1.13 interpreter has no megatron-core
    HAVE = False

HERE = os.path.dirname(os.path.abspath(__file__))

DT = 2  # bf16
H, HQ, HKV, D = SHAPE["hidden"], SHAPE["heads"], SHAPE["kv_heads"], SHAPE["head_dim"]
SEQS = (128, 512)

# --- What the local spec keeps instead of what TE's kernels keep (bytes per token) ---
# Norms: the local spec's norm is torch.nn.RMSNorm (transformer/torch_norm.py WrappedTorchNorm);
# torch 2.x's composite rms_norm keeps the fp32 upcast input, the fp32 normalised input (for the
# weight's gradient) and one fp32 rstd per row. TE keeps the bf16 input and rsigma
# (module/layernorm_linear.py _LayerNormLinear.forward; ops/basic/rmsnorm.py op_forward).


def local_norm_delta(width: float, rows: float = 1) -> float:
    return (4 * width + 4 * width + 4 * rows) - (DT * width + 4 * rows)


# RoPE unfused (apply_rope_fusion needs TE/apex): models/common/embeddings/rope_utils.py
# _apply_rotary_pos_emb_bshd makes cos and sin in the activation dtype on every call (q and k)
# and the muls keep them; TE's FusedRoPEFunc (attention/rope.py) keeps only the shared freqs.
LOCAL_ROPE = 2 * 2 * D * DT
# Local DotProductAttention (transformer/dot_product_attention.py forward) repeats k and v to
# all query heads (repeat_interleave) before baddbmm/bmm, which keep them; flash/cuDNN keep
# them at kv heads.
LOCAL_GQA_EXPAND = 2 * (HQ - HKV) * D * DT


# ...and keeps the fp32 softmax output (fusions/fused_softmax.py forward_torch_softmax,
# attention_softmax_in_fp32) and its bf16 copy for the bmm with v: seq keys per query, instead
# of flash's fp32 softmax_lse (one per head).
def local_softmax(seq: int) -> float:
    return HQ * seq * (4 + DT) - HQ * 4


# Selective recompute of core_attn (transformer/attention.py _checkpointed_attention_forward,
# tensor_parallel.checkpoint) keeps its arguments: q and k after RoPE and v, a view into
# linear_qkv's output, so all of that output; linear_proj still keeps the core's output. This
# part is the same code under TE, which is why the profile has no attn_core module for softmax
# attention: it would hold more than the flash kernel's own saved set.
SELECTIVE_CORE_ATTN = (HQ + HKV + HQ + 2 * HKV) * D * DT + HQ * D * DT

# --- What TE's fused kernels keep that the local spec cannot run (documented, not asserted) ---
# moe_permute_fusion=True: TE's moe_permute_with_probs (permutation.py
# _moe_permute_mask_map_setup_context) keeps row_id_map, int32 [tokens, 2 E + 1], instead of the
# unfused permute's routing map, transposed probs and sorted indices.
TE_FUSED_PERMUTE_MAP = 4 * (2 * SHAPE["experts"] + 1)

CASES = {
    "dense": dict(family="llama", moe=False, qk_layernorm=False, selective=False),
    "dense_qk_norm": dict(family="qwen3", moe=False, qk_layernorm=True, selective=False),
    "dense_selective": dict(family="llama", moe=False, qk_layernorm=False, selective=True),
    "moe": dict(family="mixtral", moe=True, qk_layernorm=False, selective=False),
    "moe_qk_norm": dict(family="qwen3_moe", moe=True, qk_layernorm=True, selective=False),
}


def hf_config(case: dict) -> dict:
    c = dict(model_type=case["family"], hidden_size=H, num_hidden_layers=1,
             num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=D, vocab_size=1024,
             max_position_embeddings=4096, tie_word_embeddings=False, hidden_act="silu",
             intermediate_size=SHAPE["ffn"])
    if case["family"] == "mixtral":
        c.update(num_local_experts=SHAPE["experts"], num_experts_per_tok=SHAPE["top_k"],
                 intermediate_size=SHAPE["expert_ffn"])
    if case["family"] == "qwen3_moe":
        c.update(num_experts=SHAPE["experts"], num_experts_per_tok=SHAPE["top_k"],
                 moe_intermediate_size=SHAPE["expert_ffn"], decoder_sparse_step=1,
                 mlp_only_layers=[], norm_topk_prob=True)
    return c


def group_of(module: str) -> str:
    """The module group a Megatron-Core submodule's saved tensors are compared in. A norm and
    the linear after it form one group: TE fuses them (the norm's input and ln_out are kept by
    one function) while the local spec keeps the norm's part in the norm."""
    if module in ("input_layernorm", "self_attention.linear_qkv"):
        return "input_norm+linear_qkv"
    if module in ("self_attention.q_layernorm", "self_attention.k_layernorm"):
        return "q/k_layernorm"
    if module.startswith("self_attention"):
        return "rope+core_attention+linear_proj"
    if module in ("pre_mlp_layernorm", "mlp.linear_fc1", "mlp.router"):
        return "pre_mlp_layernorm+linear_fc1/router"
    if module.startswith("mlp.experts."):
        tail = module.rsplit(".", 1)[-1]
        return {"linear_fc1": "experts.linear_fc1",
                "linear_fc2": "experts.linear_fc2"}.get(tail, "experts.weighted_swiglu")
    return {"mlp": "mlp (swiglu / permute)", "mlp.linear_fc2": "linear_fc2"}.get(module, module)


def predicted(case: dict, seq: int, t: dict) -> dict:
    """Per group: the profile's tensors (t: bytes per token by name) plus the local deltas."""
    g = {"input_norm+linear_qkv": t["input"] + t["attn.norm"] + local_norm_delta(H)}
    if case["qk_layernorm"]:
        g["q/k_layernorm"] = t["attn.qk_norm_in"] + local_norm_delta((HQ + HKV) * D, HQ + HKV)
    if case["selective"]:
        g["rope+core_attention+linear_proj"] = LOCAL_ROPE + SELECTIVE_CORE_ATTN
    else:
        g["rope+core_attention+linear_proj"] = (t["attn.qkv"] + t["attn.core_out"] + LOCAL_ROPE
                                                + LOCAL_GQA_EXPAND + local_softmax(seq))
    if case["moe"]:
        g["pre_mlp_layernorm+linear_fc1/router"] = (t["mid"] + t["ffn.norm"] + t["moe.router"]
                                                    + local_norm_delta(H))
        g["mlp (swiglu / permute)"] = t["moe.permute_map"]
        g["experts.linear_fc1"] = t["moe.dispatched"]
        g["experts.weighted_swiglu"] = t["moe.gate_up"] + t["moe.probs"]
        g["experts.linear_fc2"] = t["moe.act"]
    else:
        g["pre_mlp_layernorm+linear_fc1/router"] = t["mid"] + t["ffn.norm"] + local_norm_delta(H)
        g["mlp (swiglu / permute)"] = t["ffn.gate_up"]
        g["linear_fc2"] = t["ffn.act"]
    return g


def measured() -> dict:
    """case name -> seq -> group -> bytes per token, from one megatron_layers.py process."""
    arg = json.dumps({name: {k: c[k] for k in ("moe", "qk_layernorm", "selective")}
                      for name, c in CASES.items()})
    # Megatron-Core's jit_fuser is torch.compile: compiling its SwiGLU kernels on CPU triples the
    # run time and changes nothing saved (SwiGLUFunction saves by save_for_backward either way;
    # the measured bytes are identical with and without).
    env = dict(os.environ, TORCHDYNAMO_DISABLE="1")
    out = subprocess.run([sys.executable, os.path.join(HERE, "megatron_layers.py"), arg]
                         + [str(s) for s in SEQS], capture_output=True, text=True, timeout=600,
                         env=env)
    if out.returncode != 0:
        raise AssertionError(out.stdout + out.stderr[-4000:])
    result = {}
    for name, per_seq in json.loads(out.stdout.strip().splitlines()[-1]).items():
        result[name] = {}
        for seq, modules in per_seq.items():
            groups: dict[str, float] = {}
            for module, nbytes in modules.items():
                groups[group_of(module)] = groups.get(group_of(module), 0) + nbytes / int(seq)
            result[name][int(seq)] = groups
    return result


def planned(cli: str, case: dict, seq: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(hf_config(case), f)
        out = subprocess.run(
            [cli, "plan", "--model", path, "--hardware", "h200", "--seq-len", str(seq),
             "--micro-batch", "1", "--gpus", "1", "--cp", "1", "--ep", "1", "--tp", "1",
             "--sharding", "no_shard", "--framework", "megatron", "--optimizer", "none",
             "--force", "offload_saved", "--format", "json"],
            capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(out.stdout + out.stderr)
    plan = json.loads(out.stdout)
    assert plan["run"]["framework"] == "megatron"
    return {x["name"]: x["bytes"] / seq for x in plan["layers"][0]["transfers"]}


@unittest.skipUnless(HAVE, "needs torch 2.x and megatron-core (the PATH python of "
                           "scripts/setup-deps)")
class MegatronProfileTest(unittest.TestCase):
    def test_saved_bytes_per_module_match_megatron_core(self) -> None:
        cli = os.environ.get("STOWAGE_CLI")
        if not cli or not os.path.exists(cli):
            self.skipTest("STOWAGE_CLI is not set to a built `stowage` CLI")
        rows = []
        all_measured = measured()
        for name, case in CASES.items():
            got = all_measured[name]
            for seq in SEQS:
                tensors = planned(cli, case, seq)
                want = predicted(case, seq, tensors)
                with self.subTest(case=name, seq=seq):
                    self.assertEqual(sorted(got[seq]), sorted(want),
                                     msg="module groups measured vs predicted")
                    for group, w in want.items():
                        m = got[seq][group]
                        rows.append((name, seq, group, w, m))
                        # Exact but for a few bytes per layer (the checkpoint's RNG bookkeeping).
                        self.assertAlmostEqual(m, w, delta=0.05,
                                               msg=f"{name} seq {seq} {group}: predicted "
                                                   f"{w:.2f} B/token, Megatron-Core kept "
                                                   f"{m:.2f}")
                    # The selective layer: what Megatron's core_attn recompute keeps is more
                    # than the flash kernel's own saved set, hence no attn_core module.
                    if case["selective"]:
                        self.assertGreater(SELECTIVE_CORE_ATTN,
                                           tensors["attn.qkv"] + tensors["attn.core_out"])
        if os.environ.get("STOWAGE_VERBOSE"):
            print(f"\n{'case':16} {'seq':>4} {'module group':34} {'predicted':>10} "
                  f"{'megatron':>10}  B/token")
            for name, seq, group, w, m in rows:
                print(f"{name:16} {seq:4} {group:34} {w:10.2f} {m:10.2f}")


if __name__ == "__main__":
    unittest.main()
