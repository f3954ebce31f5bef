"""What the tests of the measured hf profile share (measure/test_hf_*.py): the model configs
they measure (tiny ones for real CPU steps; every family the hf profile has recipes for, at real
widths, for fake ones), the lengths and policies they plan at, and the calls of the `stowage` CLI
(STOWAGE_CLI, as CTest passes it) that plan from a measured profile and from the analytic one.

Torch 2.x with transformers only (the PATH python of scripts/setup-deps): torch 1.13 has neither
FakeTensorMode on "cpu" nor storage objects that live as long as their StorageImpl (the weakref
finalizers LiveBytes relies on); HAVE says whether this interpreter has them, and needs_hf skips
a test case where it does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import unittest

import support

try:
    import torch
    import transformers  # noqa: F401
    HAVE = int(torch.__version__.split(".")[0]) >= 2
except ImportError:  # Debian's torch 1.13 interpreter has no transformers
    HAVE = False

if HAVE:
    from stowage.measure.hf_fit import HfMeasurement
    from stowage.measure.hf_model import HfModel
    from stowage.measure.hf_profile import to_model_profile
    from stowage.measure.hf_step import evaluate
    from stowage.measure.hf_trace import trace_model_step
    from stowage.measure.live_bytes import replay

needs_hf = unittest.skipUnless(
    HAVE, "needs torch 2.x and transformers (the PATH python of scripts/setup-deps)")

MEASURED = os.path.join(support.REPO, "tests", "planner", "data", "measured")

# Small enough for a real CPU step in well under a second, wide enough that every term shows.
TINY = {
    "llama": dict(model_type="llama", hidden_size=128, intermediate_size=352,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=512, tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", hidden_size=128, intermediate_size=320,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=512, tie_word_embeddings=True),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=128, intermediate_size=256,
                      moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2,
                      decoder_sparse_step=1, mlp_only_layers=[0], norm_topk_prob=True,
                      vocab_size=512, tie_word_embeddings=False),
}

# MLA families at tiny widths (fake tensors only: Note [SDPA on the GPU] makes their fake step
# the GPU's, which real CPU tensors cannot run). DeepSeek-V3 with two expert groups, so its
# router drops a branch of the graph that saved tensors (Note [Saved by allocation]).
TINY_MLA = {
    "deepseek_v2": dict(model_type="deepseek_v2", hidden_size=128, intermediate_size=256,
                        moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32,
                        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2,
                        first_k_dense_replace=1, n_group=1, topk_group=1, vocab_size=512,
                        tie_word_embeddings=False),
    "deepseek_v3": dict(model_type="deepseek_v3", hidden_size=128, intermediate_size=256,
                        moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=32,
                        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                        first_k_dense_replace=1, n_group=2, topk_group=1, vocab_size=512,
                        tie_word_embeddings=False),
}

# Every family the hf profile has recipes for that transformers builds: real-looking widths
# (fake tensors cost nothing), few layers.
FAMILIES = {
    "llama": dict(model_type="llama", hidden_size=2048, intermediate_size=5632,
                  num_hidden_layers=3, num_attention_heads=16, num_key_value_heads=4,
                  vocab_size=32000, tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960,
                  num_hidden_layers=3, num_attention_heads=12, num_key_value_heads=2,
                  vocab_size=151936, tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", hidden_size=2048, intermediate_size=6144,
                  num_hidden_layers=3, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144,
                      moe_intermediate_size=768, num_hidden_layers=3, num_attention_heads=32,
                      num_key_value_heads=4, head_dim=128, num_experts=128,
                      num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[0],
                      norm_topk_prob=True, vocab_size=151936, tie_word_embeddings=False),
    "mistral": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336,
                    num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8,
                    head_dim=128, vocab_size=32768, sliding_window=None,
                    tie_word_embeddings=False),
    "mixtral": dict(model_type="mixtral", hidden_size=4096, intermediate_size=14336,
                    num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8,
                    num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                    sliding_window=None, tie_word_embeddings=False),
    # The families below (the hf recipe's other layer kinds): real checkpoints' widths, two layers;
    # one length (LENGTHS) where they differ from the families above only in terms linear in the
    # tokens.
    # Ministral-8B-Instruct-2410: Mistral's layer, sliding and full layers alternating.
    "ministral": dict(model_type="ministral", hidden_size=4096, intermediate_size=12288,
                      num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, vocab_size=131072, sliding_window=32768,
                      layer_types=["sliding_attention", "full_attention"],
                      tie_word_embeddings=False),
    # Ministral 3 8B's text decoder (Mistral3ForConditionalGeneration's text_config).
    "ministral3": dict(model_type="ministral3", hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=128, vocab_size=131072, tie_word_embeddings=False),
    # Qwen1.5-MoE-A2.7B: 60 experts top-4 and a sigmoid-gated shared expert, qkv biases.
    "qwen2_moe": dict(model_type="qwen2_moe", hidden_size=2048, intermediate_size=5632,
                      moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                      num_experts=60, num_experts_per_tok=4, num_hidden_layers=2,
                      num_attention_heads=16, num_key_value_heads=16, vocab_size=151936,
                      decoder_sparse_step=1, tie_word_embeddings=False),
    # phi-4 (Phi3ForCausalLM): fused qkv_proj and gate_up_proj, partial-rotary RoPE's cat
    # (Note [hf OLMo and Phi-3] in planner/frameworks/hf_build_layer.cc).
    "phi3": dict(model_type="phi3", hidden_size=5120, intermediate_size=17920,
                 num_hidden_layers=2, num_attention_heads=40, num_key_value_heads=10,
                 vocab_size=100352, tie_word_embeddings=False, rope_scaling=None,
                 max_position_embeddings=16384, original_max_position_embeddings=16384,
                 pad_token_id=100349),
    # OLMo-2-1124-7B: norms after the sublayers with an fp32 weight mul, whole-width q/k norms,
    # fp32 RoPE (the same note).
    "olmo2": dict(model_type="olmo2", hidden_size=4096, intermediate_size=11008,
                  num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=32,
                  vocab_size=100352, tie_word_embeddings=False, pad_token_id=100277),
    # OLMo-3.1-32B-Instruct: OLMo 2's layer with a 4096-token sliding window on three layers of
    # four, the fourth full (Olmo3Config's layer_types rule), four layers: one layer per kind
    # keeps the first and the fourth (Note [One layer per kind] in stowage/measure/hf_model.py).
    "olmo3": dict(model_type="olmo3", hidden_size=5120, intermediate_size=27648,
                  num_hidden_layers=4, num_attention_heads=40, num_key_value_heads=8,
                  vocab_size=100278, sliding_window=4096, tie_word_embeddings=False,
                  pad_token_id=100277),
    # Llama-4-Scout's text decoder, four layers: chunked attention on the RoPE layers, the
    # fourth NoPE and full, MoE on every second layer (Maverick's interleave) with all 16 experts
    # run on every token through bmm (Note [hf dialects]; Llama4MoeWork in planner/frameworks/).
    # A length on each side of the 8192-token chunk: above it the chunk mask appears (the
    # measured lengths lie on the planned one's side: Note [One side of every threshold]).
    "llama4_text": dict(model_type="llama4_text", hidden_size=5120, intermediate_size=8192,
                        intermediate_size_mlp=16384, num_hidden_layers=4,
                        num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                        num_local_experts=16, num_experts_per_tok=1,
                        interleave_moe_layer_step=2, attention_chunk_size=8192,
                        use_qk_norm=True, vocab_size=202048, tie_word_embeddings=False),
    # Llama-3.2-11B-Vision's text decoder (MllamaForCausalLM: fp32 logits), four layers with
    # cross-attention at 1 and 3 over one image of MllamaVisionConfig's 4 tiles x 1025 patches
    # (the planner's and hf_profile's default, Note [hf cross-attention]).
    "mllama_text_model": dict(model_type="mllama_text_model", hidden_size=4096,
                              intermediate_size=14336, num_hidden_layers=4,
                              num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                              cross_attention_layers=[1, 3], pad_token_id=128004,
                              rope_theta=500000.0, tie_word_embeddings=False),
    # Text decoders of multimodal wrappers (hf_profile builds the image-text-to-text model, whose
    # text-only step runs the decoder; the planner plans only that): Qwen2.5-VL-7B (Qwen2's
    # layer, multimodal RoPE), Qwen3-VL-8B (Qwen3's), Qwen3-VL-30B-A3B (Qwen3-MoE's). One
    # vision block: it is not planned and gets no pixels.
    "qwen2_5_vl": dict(model_type="qwen2_5_vl", tie_word_embeddings=False,
                       vision_config=dict(depth=1),
                       text_config=dict(model_type="qwen2_5_vl_text", hidden_size=3584,
                                        intermediate_size=18944, num_hidden_layers=2,
                                        num_attention_heads=28, num_key_value_heads=4,
                                        vocab_size=152064, rope_theta=1000000.0,
                                        rope_scaling={"type": "mrope",
                                                      "mrope_section": [16, 24, 24]},
                                        tie_word_embeddings=False)),
    "qwen3_vl": dict(model_type="qwen3_vl", tie_word_embeddings=False,
                     vision_config=dict(depth=1, deepstack_visual_indexes=[0]),
                     text_config=dict(model_type="qwen3_vl_text", hidden_size=4096,
                                      intermediate_size=12288, num_hidden_layers=2,
                                      num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                      vocab_size=151936, rope_theta=5000000)),
    "qwen3_vl_moe": dict(model_type="qwen3_vl_moe", tie_word_embeddings=False,
                         vision_config=dict(depth=1, deepstack_visual_indexes=[0]),
                         text_config=dict(model_type="qwen3_vl_moe_text", hidden_size=2048,
                                          intermediate_size=6144, moe_intermediate_size=768,
                                          num_experts=128, num_experts_per_tok=8,
                                          num_hidden_layers=2, num_attention_heads=32,
                                          num_key_value_heads=4, head_dim=128,
                                          vocab_size=151936, decoder_sparse_step=1)),
    # Eager attention (the classes refuse SDPA, Note [hf eager attention] in
    # planner/frameworks/hf_attention.cc) with logit soft-capping on the scores and the logits, a
    # sliding and a full layer: Gemma-2-9B's widths.
    "gemma2": dict(model_type="gemma2", hidden_size=3584, intermediate_size=14336,
                   num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=8,
                   head_dim=256, query_pre_attn_scalar=256, vocab_size=256000,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                   sliding_window=4096, hidden_activation="gelu_pytorch_tanh"),
    # SDPA with a 1024-token window (the mask from 1024 tokens on:
    # Note [One side of every threshold] in stowage/measure/hf_fit.py), q/k norms, two RoPE tables:
    # Gemma-3-4B's widths.
    "gemma3_text": dict(model_type="gemma3_text", hidden_size=2560, intermediate_size=10240,
                        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                        head_dim=256, query_pre_attn_scalar=256, vocab_size=262208,
                        sliding_window=1024, layer_types=["sliding_attention", "full_attention"],
                        rope_local_base_freq=10000, hidden_activation="gelu_pytorch_tanh"),
    # Eager attention with sinks (bf16 softmax over the keys and the sink), a 128-token window,
    # biased projections and experts: gpt-oss-20b's widths.
    "gpt_oss": dict(model_type="gpt_oss", hidden_size=2880, intermediate_size=2880,
                    num_hidden_layers=2, num_attention_heads=64, num_key_value_heads=8,
                    head_dim=64, num_local_experts=32, num_experts_per_tok=4, vocab_size=201088,
                    sliding_window=128, attention_bias=True, tie_word_embeddings=False),
    # DeepSeek-V2-Lite: MLA without q-LoRA (192/128 head dims: cuDNN on the H200,
    # Note [SDPA on the GPU]), complex RoPE, 64 experts top-6 with two shared, softmax router.
    "deepseek_v2": dict(model_type="deepseek_v2", hidden_size=2048, intermediate_size=10944,
                        moe_intermediate_size=1408, num_hidden_layers=2, num_attention_heads=16,
                        num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512,
                        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                        n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2,
                        first_k_dense_replace=1, n_group=1, topk_group=1, topk_method="greedy",
                        vocab_size=102400, tie_word_embeddings=False),
    # Kimi-K2 (DeepseekV3ForCausalLM): MLA with q-LoRA, interleaved RoPE, 384 experts top-8,
    # sigmoid router.
    "deepseek_v3": dict(model_type="deepseek_v3", hidden_size=7168, intermediate_size=18432,
                        moe_intermediate_size=2048, num_hidden_layers=2, num_attention_heads=64,
                        num_key_value_heads=64, q_lora_rank=1536, kv_lora_rank=512,
                        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                        n_routed_experts=384, num_experts_per_tok=8, n_shared_experts=1,
                        first_k_dense_replace=1, n_group=1, topk_group=1, vocab_size=163840,
                        tie_word_embeddings=False),
    # GLM-4.5-Air: GQA with partial RoPE, 128 experts top-8 and one shared.
    "glm4_moe": dict(model_type="glm4_moe", hidden_size=4096, intermediate_size=10944,
                     moe_intermediate_size=1408, num_hidden_layers=2, num_attention_heads=96,
                     num_key_value_heads=8, head_dim=128, partial_rotary_factor=0.5,
                     n_routed_experts=128, num_experts_per_tok=8, n_shared_experts=1,
                     first_k_dense_replace=1, n_group=1, topk_group=1, use_qk_norm=False,
                     vocab_size=151552, tie_word_embeddings=False),
    # GLM-5.1: MLA with q-LoRA (256/256 head dims) and the DSA indexer on every layer, 256
    # experts top-8. index_topk 128 (GLM-5: 2048) keeps min(index_topk, s) on one side of the
    # measuring lengths (GlmMoeDsaIndexer.forward): the fit is per allocation.
    "glm_moe_dsa": dict(model_type="glm_moe_dsa", hidden_size=6144, intermediate_size=12288,
                        moe_intermediate_size=2048, num_hidden_layers=2, num_attention_heads=64,
                        num_key_value_heads=64, q_lora_rank=2048, kv_lora_rank=512,
                        qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256,
                        n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1,
                        first_k_dense_replace=1, n_group=1, topk_group=1, index_n_heads=32,
                        index_head_dim=128, index_topk=128, vocab_size=154880,
                        tie_word_embeddings=False),
    # The linear-attention hybrids, through transformers' torch fallbacks of the chunk kernels
    # (flash-linear-attention and causal-conv1d are not installed, as on the GPU machines:
    # Note [hf linear attention] in planner/frameworks/hf.h), whose Python loops over 64-token
    # chunks are folded (Note [Loops in the step] in stowage/measure/hf_fold.py). A linear layer and
    # a full attention layer each. Qwen3-Next-80B-A3B: gated DeltaNet (16 key heads, 32 value heads
    # of 128), gated attention with partial RoPE, 512 experts top-10 and a gated shared expert.
    "qwen3_next": dict(model_type="qwen3_next", hidden_size=2048, intermediate_size=5120,
                       num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                       num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                       linear_num_key_heads=16, linear_num_value_heads=32,
                       linear_key_head_dim=128, linear_value_head_dim=128,
                       linear_conv_kernel_dim=4, num_experts=512, num_experts_per_tok=10,
                       moe_intermediate_size=512, shared_expert_intermediate_size=512,
                       decoder_sparse_step=1, partial_rotary_factor=0.25, vocab_size=151936,
                       tie_word_embeddings=False),
    # Qwen3.5's dense text decoder (transformers' Qwen3_5TextConfig defaults): in_proj_qkv and
    # in_proj_z apart, a dense SwiGLU.
    "qwen3_5_text": dict(model_type="qwen3_5_text", hidden_size=4096, intermediate_size=12288,
                         num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                         num_attention_heads=16, num_key_value_heads=4, head_dim=256,
                         linear_num_key_heads=16, linear_num_value_heads=32,
                         linear_key_head_dim=128, linear_value_head_dim=128,
                         linear_conv_kernel_dim=4, vocab_size=248320, tie_word_embeddings=False),
    # Qwen3.5-MoE's text decoder (Qwen3_5MoeTextConfig defaults): 256 experts top-8 and a gated
    # shared expert.
    "qwen3_5_moe_text": dict(model_type="qwen3_5_moe_text", hidden_size=2048,
                             num_hidden_layers=2,
                             layer_types=["linear_attention", "full_attention"],
                             num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                             linear_num_key_heads=16, linear_num_value_heads=32,
                             linear_key_head_dim=128, linear_value_head_dim=128,
                             linear_conv_kernel_dim=4, num_experts=256, num_experts_per_tok=8,
                             moe_intermediate_size=512, shared_expert_intermediate_size=512,
                             vocab_size=248320, tie_word_embeddings=False),
    # Kimi-Linear-48B-A3B: KDA (32 heads of 128, short conv 4) with a dense FFN, and NoPE MLA
    # (no q-LoRA, 192/128 head dims) with 256 experts top-8 and a shared expert.
    "kimi_linear": dict(model_type="kimi_linear", hidden_size=2304, intermediate_size=9216,
                        moe_intermediate_size=1024, num_hidden_layers=2,
                        layer_types=["linear_attention", "full_attention"],
                        num_attention_heads=32, num_key_value_heads=32, kv_lora_rank=512,
                        q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64,
                        v_head_dim=128, num_experts=256, num_experts_per_token=8,
                        num_shared_experts=1, first_k_dense_replace=1, linear_num_heads=32,
                        linear_head_dim=128, linear_conv_kernel_dim=4, vocab_size=163840,
                        pad_token_id=0, tie_word_embeddings=False),
}
# The lengths AgreementTest runs each family at: two by default; one where the family differs
# from a family checked at two only in terms linear in the tokens (python_torch2_cpu's time).
LENGTHS = {"ministral": (4096,), "ministral3": (4096,), "qwen2_moe": (4096,), "phi3": (4096,),
           "olmo2": (4096,), "qwen2_5_vl": (4096,), "qwen3_vl": (4096,), "qwen3_vl_moe": (4096,),
           "olmo3": (4096,), "mllama_text_model": (4096,), "deepseek_v2": (4096,),
           "deepseek_v3": (4096,), "glm4_moe": (4096,), "glm_moe_dsa": (4096,),
           "qwen3_next": (768,), "qwen3_5_text": (768,), "qwen3_5_moe_text": (768,),
           "kimi_linear": (768,)}
# The policies AgreementTest runs a family under where not both: Qwen3.5's and Qwen3.5-MoE's
# layers recompute as Qwen3-Next's do (the same gated DeltaNet and gated attention; their peak
# is in the embedding backward either way), so keep only (python_torch2_cpu's time).
POLICIES = {"qwen3_5_text": ("keep",), "qwen3_5_moe_text": ("keep",)}
# The lengths measure_hf runs a family at where not its defaults: the linear-attention hybrids'
# chunk loops run ceil(s / 64) times, and the bytes of a folded loop (Note [Loops in the step])
# are linear in the length only from the sixth chunk on (over the first iterations the moment a
# loop holds the most moves: GDN's backward peak grows by 38.6 MiB a chunk up to 4 chunks and by
# 61.7 MiB from 6; hf_profile refuses a fit through a kink), so 6, 7 and 8 chunks (KDA's: 5, 6
# and 7).
MEASURING = {"qwen3_next": (384, 448, 512), "qwen3_5_text": (384, 448, 512),
             "qwen3_5_moe_text": (384, 448, 512), "kimi_linear": (320, 384, 448)}

HF_FLAGS = ["--hardware", "h200", "--micro-batch", "1", "--gpus", "1", "--cp", "1", "--ep", "1",
            "--tp", "1", "--sharding", "no_shard", "--framework", "hf", "--optimizer", "none",
            "--grad-dtype", "bf16", "--loss-chunk-tokens", "0", *support.transformers_flag()]
# Held throughout a CUDA step and invisible on CPU: one cuBLAS workspace per handle, forward and
# backward thread, 32 MiB each on sm90+ (planner/frameworks/step_cost.h
# kTorchCublasWorkspacesBytes).
CUBLAS_WORKSPACES = 2 * 32 * 2**20


def cli() -> str:
    path = os.environ.get("STOWAGE_CLI", "")
    if not path or not os.path.exists(path):
        raise unittest.SkipTest("STOWAGE_CLI is not set to a built `stowage` CLI")
    return path


def plan(args: list[str]) -> dict:
    out = subprocess.run([cli(), "plan", *args, "--format", "json"], capture_output=True,
                         text=True, timeout=120)
    if out.returncode not in (0, 1):
        raise AssertionError(out.stdout + out.stderr)
    return json.loads(out.stdout)


def plan_both(config: dict, m: "HfMeasurement", seq_len: int, force: str
              ) -> tuple[dict, dict, list[int]]:
    """(analytic hf plan, measured-profile plan, the analytic plan's device bytes at each point
    of its timeline: plan_levels') for one length and policy."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg, prof = os.path.join(tmp, "config.json"), os.path.join(tmp, "profile.json")
        trace = os.path.join(tmp, "trace.json")
        with open(cfg, "w") as f:
            json.dump(config, f)
        to_model_profile(m, seq_len).save(prof)
        analytic = plan(["--model", cfg, "--seq-len", str(seq_len), *HF_FLAGS, "--force", force,
                         "--trace", trace])
        measured = plan(["--profile", prof, "--hardware", "h200", "--force", force])
        with open(trace) as f:
            levels = [e["args"]["bytes"] for e in json.load(f)["traceEvents"] if e.get("ph") == "C"]
    return analytic, measured, levels


def peak(p: dict) -> int:
    return p["predicted"]["peak_device_bytes"]


def live_step(full: "HfModel", seq_len: int, checkpointing: bool) -> tuple[int, list[int]]:
    """Weights plus the live-bytes peak of one training step of the full-depth model, and weights
    plus the most each layer's forward holds."""
    model = full.model
    with full.mode:
        if checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        try:
            trace = trace_model_step(model, seq_len)
        finally:
            if checkpointing:
                model.gradient_checkpointing_disable()
    _entered, peaks, _marks, _peak = replay(trace.events, trace.sizes)
    forward = [peaks[("forward", j)] + full.weights_bytes for j in range(len(trace.inputs))]
    return evaluate(trace).peak_bytes + full.weights_bytes, forward


def plan_levels(config: dict, seq_len: int) -> list[int]:
    """The planned device bytes at each point of the step's timeline (`stowage plan --trace`'s
    counter events under --force keep): the start, each layer's forward, the LM head and loss,
    each layer's backward from the last, the end."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg, trace = os.path.join(tmp, "config.json"), os.path.join(tmp, "trace.json")
        with open(cfg, "w") as f:
            json.dump(config, f)
        out = subprocess.run([cli(), "plan", "--model", cfg, "--seq-len", str(seq_len), *HF_FLAGS,
                              "--force", "keep", "--trace", trace], capture_output=True,
                             text=True, timeout=120)
        if out.returncode not in (0, 1):
            raise AssertionError(out.stdout + out.stderr)
        with open(trace) as f:
            return [e["args"]["bytes"] for e in json.load(f)["traceEvents"] if e.get("ph") == "C"]
