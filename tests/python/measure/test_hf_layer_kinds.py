"""The `hf` profile's layer kinds against the real transformers layers: sliding-window and chunked
attention with their masks, eager attention with logit soft-capping (Gemma 2) and with sinks
(gpt-oss), MLA with and without q-LoRA, the DSA indexer, Gemma / gpt-oss norms, q/k norms, the
routers of DeepSeek-V2/V3, GLM, gpt-oss and Llama 4, and the linear-attention hybrids: Qwen3-Next /
Qwen3.5 gated DeltaNet with gated attention and a gated shared expert, and Kimi Linear's KDA with
NoPE MLA, both through transformers' torch fallbacks (no fla installed), and Mllama's tanh-gated
cross-attention layers attending to a fixed number of vision tokens. Tiny models built from the real
configs' shapes (scaled down) run forward on CPU under torch 2.x with `saved_tensors_hooks`; what
autograd keeps per decoder layer (deduplicated by storage, parameters and the step's shared inputs
excluded) must match the planner's per-layer `device_saved_bytes` under `--force keep`, at two
sequence lengths, within 0.5%.

One substitution, where the CPU cannot run the kernel the GPUs run: SDPA with different q/k and v
head dims (MLA: qk_nope + qk_rope vs v_head_dim) has no CPU flash kernel, and CPU's math fallback
keeps an fp32 copy of q, k, v and of the attention matrix. On an H200 the same call runs cuDNN (or
the memory-efficient kernel: Note [SDPA on the GPU] in stowage/measure/hf_families.py), which saves
q, k, v (the caller's tensors), the output, the fp32 logsumexp and the additive mask (aten
derivatives.yaml), its output in the query's layout (cuDNN) or [b, s, h, d]. For those calls the
test counts exactly that set, from the real tensors of the call (`gpu_sdpa_saves`); everything
outside the kernel is measured. Calls with equal head dims run the CPU flash kernel, which saves the
same set, and are measured as they are. CTest passes the CLI as STOWAGE_CLI."""

from __future__ import annotations

import json
import os
import sys
import unittest
import weakref

import support

try:
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    HAVE = int(torch.__version__.split(".")[0]) >= 2
except ImportError:  # Debian's torch 1.13 interpreter has no transformers
    HAVE = False

if HAVE:
    from stowage.measure.hf_families import h200_sdpa_kernel

SEQ_LENS = (128, 512)
# The torch fallbacks of gated DeltaNet and KDA run a Python loop per chunk (and KDA one per
# row of each chunk): two and four chunks cover one-chunk-later and steady-state terms at a
# third of the time 512 tokens take.
LINEAR_SEQ_LENS = (128, 256)
LINEAR = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "kimi_linear"}
WINDOW = 64  # sliding window / attention chunk: below both sequence lengths, so masks are built

# Shapes of the real configs (tests/planner/data/hf/*.json), scaled down; every layer kind and
# feature of a family appears at least once.
COMMON = dict(hidden_size=256, num_attention_heads=4, vocab_size=1024,
              max_position_embeddings=4096, tie_word_embeddings=False)
MLA = dict(num_key_value_heads=4, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
           v_head_dim=32, head_dim=16, n_group=1, topk_group=1, moe_intermediate_size=64,
           n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1,
           intermediate_size=512)
CONFIGS = {
    # Mistral: Llama's graph with a sliding window on every layer.
    "mistral": dict(COMMON, intermediate_size=512, num_hidden_layers=2, num_key_value_heads=2,
                    head_dim=64, sliding_window=WINDOW),
    # Gemma 2: eager attention (SDPA refused: soft-capping), local/global alternation, 4 norms.
    "gemma2": dict(COMMON, intermediate_size=512, num_hidden_layers=2, num_key_value_heads=2,
                   head_dim=64, sliding_window=WINDOW, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, query_pre_attn_scalar=64,
                   tie_word_embeddings=True),
    # Gemma 3: SDPA, q/k norms, local/global layers.
    "gemma3_text": dict(COMMON, intermediate_size=512, num_hidden_layers=2,
                        num_key_value_heads=2, head_dim=64, sliding_window=WINDOW,
                        layer_types=["sliding_attention", "full_attention"],
                        query_pre_attn_scalar=64, tie_word_embeddings=True),
    # gpt-oss: eager attention with sinks, alternating sliding/full, biased MoE.
    "gpt_oss": dict(COMMON, intermediate_size=128, num_hidden_layers=2, num_key_value_heads=2,
                    head_dim=64, sliding_window=WINDOW, num_local_experts=8,
                    num_experts_per_tok=2),
    # Llama 4: chunked attention on RoPE layers (every 4th layer is NoPE, full), MoE every
    # second layer with a shared expert.
    "llama4_text": dict(COMMON, intermediate_size=128, intermediate_size_mlp=512,
                        num_hidden_layers=4, num_key_value_heads=2, head_dim=64,
                        attention_chunk_size=WINDOW, num_local_experts=4,
                        num_experts_per_tok=1, interleave_moe_layer_step=2, use_qk_norm=True),
    # DeepSeek-V2: MLA without q-LoRA, two shared experts, softmax router.
    "deepseek_v2": dict(COMMON, **MLA, num_hidden_layers=2, q_lora_rank=None, n_shared_experts=2),
    # DeepSeek-V3 / Kimi-K2: MLA with q-LoRA, sigmoid router with group-limited top-k.
    "deepseek_v3": dict(COMMON, **MLA, num_hidden_layers=2, q_lora_rank=96, n_shared_experts=1),
    # GLM-4.5: GQA with partial RoPE (half of each head rotated, the rest cat back on), a
    # dense first layer, sigmoid router with one shared expert.
    "glm4_moe": dict(COMMON, num_hidden_layers=2, num_key_value_heads=2, head_dim=64,
                     partial_rotary_factor=0.5, intermediate_size=512, moe_intermediate_size=64,
                     n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                     first_k_dense_replace=1, n_group=1, topk_group=1),
    # GLM-5: MLA with q-LoRA and the DSA lightning indexer.
    "glm_moe_dsa": dict(COMMON, **MLA, num_hidden_layers=2, q_lora_rank=96, n_shared_experts=1,
                        index_n_heads=4, index_head_dim=32, index_topk=WINDOW),
    # Qwen3-Next: gated DeltaNet layers (3 of 4) and a gated-attention layer, MoE with a gated
    # shared expert and one dense layer; the torch fallbacks of the chunk and conv kernels run.
    "qwen3_next": dict(COMMON, num_hidden_layers=4, num_key_value_heads=2, head_dim=64,
                       intermediate_size=512, linear_num_key_heads=2, linear_num_value_heads=4,
                       linear_key_head_dim=32, linear_value_head_dim=32,
                       linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
                       moe_intermediate_size=64, shared_expert_intermediate_size=64,
                       mlp_only_layers=[1]),
    # Qwen3.5 (dense): separate in_proj_qkv / in_proj_z / in_proj_b / in_proj_a projections.
    "qwen3_5_text": dict(COMMON, num_hidden_layers=4, num_key_value_heads=2, head_dim=64,
                         intermediate_size=512, linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=32,
                         linear_value_head_dim=48, linear_conv_kernel_dim=4),
    # Qwen3.5-MoE: Qwen3.5's gated DeltaNet and gated attention, experts with a gated shared
    # expert on every layer.
    "qwen3_5_moe_text": dict(COMMON, num_hidden_layers=2, num_key_value_heads=2, head_dim=64,
                             layer_types=["linear_attention", "full_attention"],
                             linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=32, linear_value_head_dim=48,
                             linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
                             moe_intermediate_size=64, shared_expert_intermediate_size=64),
    # Kimi Linear: KDA layers and an MLA layer (no RoPE, no q-LoRA), DeepSeek MoE.
    "kimi_linear": dict(COMMON, num_hidden_layers=5, num_key_value_heads=4, kv_lora_rank=64,
                        q_lora_rank=None, qk_nope_head_dim=32, qk_rope_head_dim=16,
                        v_head_dim=32, moe_intermediate_size=64, num_local_experts=8,
                        num_experts_per_tok=2, n_shared_experts=1, intermediate_size=512,
                        linear_num_heads=4, linear_head_dim=32, linear_conv_kernel_dim=4,
                        first_k_dense_replace=1, n_group=1, topk_group=1, pad_token_id=0),
    # Mllama's text decoder: self-attention layers and two cross-attention layers attending to
    # VISION_TOKENS vision states (one image of 4 tiles x 17 patches), tanh-gated.
    "mllama_text_model": dict(COMMON, num_hidden_layers=4, num_key_value_heads=2,
                              intermediate_size=512, cross_attention_layers=[1, 3],
                              pad_token_id=0),
}
VISION_TILES, VISION_PATCHES = 4, 17
VISION_TOKENS = VISION_TILES * VISION_PATCHES
# Flags the planner needs to see what the measured run sees.
PLAN_FLAGS = {"mllama_text_model": ("--vision-tokens", str(VISION_TOKENS))}


def forward_inputs(model_type: str, cfg, seq_len: int) -> dict:
    """What the decoder gets besides input_ids: Mllama's cross-attention layers get the
    projected vision states and the masks MllamaModel.forward prepares for them (every text
    token sees every tile of the one image)."""
    if model_type != "mllama_text_model":
        return {}
    from transformers.models.mllama.modeling_mllama import _prepare_cross_attention_mask
    states = torch.randn(1, VISION_TOKENS, cfg.hidden_size, dtype=torch.bfloat16)
    mask = torch.ones(1, seq_len, 1, VISION_TILES, dtype=torch.int64)
    cross_mask, row_mask = _prepare_cross_attention_mask(mask, VISION_PATCHES, torch.bfloat16)
    return dict(cross_attention_states=states, cross_attention_mask=cross_mask,
                full_text_row_masked_out_mask=row_mask)


# Families whose model class refuses SDPA (`_supports_sdpa = False`): transformers runs them
# with eager attention, and so does the planner's recipe.
EAGER = {"gemma2", "gpt_oss"}


def gpu_sdpa_saves(query, key, value, attn_mask, out) -> list[torch.Tensor | int]:
    """What the GPU's memory-efficient SDPA kernel keeps for backward: q, k, v and the output
    (their storages), the fp32 logsumexp [b, h, s] and the additive mask, which SDPA converts
    from bool to the query's dtype on every call (convert_boolean_attn_mask)."""
    saved: list[torch.Tensor | int] = [query, key, value, out]
    b, h, s = query.shape[0], query.shape[1], query.shape[2]
    saved.append(4 * b * h * s)
    if attn_mask is not None:
        saved.append(attn_mask if attn_mask.is_floating_point() else
                     2 * attn_mask.numel())
    return saved


def measured_saved_per_layer(model_type: str, seq_len: int, log: list | None = None,
                             checkpoint_core: bool = False,
                             checkpoint_act: bool = False) -> list[int]:
    """Bytes autograd saves inside each decoder layer's forward, each storage counted once, in
    the layer that first saves it; `log` collects (layer, shape, dtype, bytes) of each.
    `checkpoint_core`: every attention interface call (sdpa_attention_forward, or the family's
    eager_attention_forward) runs under torch.utils.checkpoint, as the planner's attn_core
    module reruns it (Note [hf attn_core]); what the call saves inside is then dropped, and the
    tensors it was called with are held by the checkpoint until backward. `checkpoint_act`:
    every SwiGLU activation (the experts' _apply_gate, integrations/moe.py or the family's own;
    a decoder layer's MLP's `act_fn(gate_proj(x)) * up_proj(x)`; Llama 4's bmm experts'
    `up * act_fn(gate)`) runs under torch.utils.checkpoint, as the planner's ffn_act / moe_act
    module reruns it (Note [hf FFN act] in planner/frameworks/hf_ffn.cc); shared experts are not
    rerun (no module)."""
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **CONFIGS[model_type])
    cfg._attn_implementation = "eager" if model_type in EAGER else "sdpa"
    if model_type == "mllama_text_model":  # no Auto class maps the text config
        model = transformers.MllamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    else:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    layers = model.model.layers
    current = [-1]
    # Every tensor autograd is handed, as a weak reference: what a branch of the graph that is
    # dropped before backward saved (e.g. router logits used only for an auxiliary loss) is
    # freed with it and does not count, and a freed storage's address, reused by a later
    # tensor, cannot hide that tensor.
    packed: list[tuple[int, weakref.ref]] = []
    extra = [0] * len(layers)  # bytes the GPU kernel keeps beyond the call's tensors
    # What the model hands every layer besides the hidden states (RoPE's cos/sin, the masks) is
    # the step's, not a layer's: the planner counts cos/sin as fixed memory, and a mask is
    # saved only as each SDPA call's own converted copy. Held here so their addresses stay
    # theirs.
    shared: list[torch.Tensor] = []
    in_kernel = [False]
    in_checkpoint = [False]
    kernel_held: list[torch.Tensor] = []

    def pre(i):
        def hook(module, args, kwargs):
            current[0] = i
            rest = list(args[1:]) + [v for k, v in kwargs.items() if k != "hidden_states"]
            rest += [x for v in kwargs.values() if isinstance(v, (tuple, list)) for x in v]
            if i == 0 and args:
                rest.append(args[0])
            shared.extend(t for t in rest if isinstance(t, torch.Tensor))
        return hook

    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(pre(i), with_kwargs=True)
    # The final norm is the LM head's part (the planner's tail), not the last layer's.
    model.model.norm.register_forward_pre_hook(lambda module, args: current.__setitem__(0, -1))

    sdpa = torch.nn.functional.scaled_dot_product_attention

    def sdpa_as_on_gpu(query, key, value, attn_mask=None, *args, **kwargs):
        # The kernel an H200 runs (Note [SDPA on the GPU] in stowage/measure/hf_families.py): cuDNN
        # and flash write their output in the query's layout (alloc_with_matching_layout; mha_fwd's
        # empty_like(q)), as CPU's flash kernel does; the memory-efficient kernel writes [b, s, h,
        # d]. A query in that layout (a transposed projection) gives the GPU's layout on CPU too and
        # is measured as it is. A query made by a cat ([b, h, s, d] contiguous: MLA, the
        # partial-rotary families, Note [hf partial rotary] in planner/frameworks/hf_attention.cc)
        # gets, from cuDNN or flash, an output the caller's `.transpose(1, 2).contiguous()` copies
        # for o_proj.
        unequal = query.shape[-1] != value.shape[-1]
        if not unequal and query.transpose(1, 2).is_contiguous():
            return sdpa(query, key, value, attn_mask, *args, **kwargs)
        kernel = h200_sdpa_kernel(query, value, attn_mask is not None)
        query_layout = (kernel == "cudnn" if unequal else kernel != "efficient") and \
            query.is_contiguous()
        in_kernel[0] = True
        try:
            out = sdpa(query, key, value, attn_mask, *args, **kwargs)
        finally:
            in_kernel[0] = False
        if query_layout:
            out = out.contiguous()
        else:
            # The GPU kernel writes the output as [b, s, h, d] and returns it transposed, so
            # the caller's `.transpose(1, 2).contiguous()` copies nothing (o_proj saves this
            # storage).
            out = out.transpose(1, 2).contiguous().transpose(1, 2)
        if in_checkpoint[0]:
            return out  # a checkpointed call keeps none of what the kernel saves
        for t in gpu_sdpa_saves(query, key, value, attn_mask, out):
            if isinstance(t, int):
                if current[0] >= 0:
                    extra[current[0]] += t
                    if log is not None:
                        log.append((current[0], "gpu sdpa", "", t))
            elif current[0] >= 0:
                kernel_held.append(t)  # what the GPU kernel's saved set keeps alive
                packed.append((current[0], weakref.ref(t)))
        return out

    def pack(t):
        # A detached alias, not `t` itself: an op that saves its own output (exp, sigmoid, tanh)
        # would otherwise hold output -> grad_fn -> saved output, a cycle through C++ that no
        # collector frees, and what a dropped branch saved that way would stay alive and count.
        # Autograd saves an output without that cycle, so in a real step it is freed.
        t = t.detach()
        if not in_kernel[0] and current[0] >= 0:
            packed.append((current[0], weakref.ref(t)))
        return t

    def checkpointed(call):
        def run(module, query, key, value, attention_mask, *args, **kwargs):
            # Non-reentrant checkpoint holds the call's arguments for the rerun.
            for t in (query, key, value, attention_mask):
                if isinstance(t, torch.Tensor) and current[0] >= 0:
                    kernel_held.append(t)
                    packed.append((current[0], weakref.ref(t)))
            in_checkpoint[0] = True
            try:
                return torch.utils.checkpoint.checkpoint(
                    call, module, query, key, value, attention_mask, *args,
                    use_reentrant=False, **kwargs)
            finally:
                in_checkpoint[0] = False
        return run

    def checkpointed_act(call):
        def run(*inputs):
            for t in inputs:  # held by the checkpoint for the rerun
                if current[0] >= 0:
                    kernel_held.append(t)
                    packed.append((current[0], weakref.ref(t)))
            return torch.utils.checkpoint.checkpoint(call, *inputs, use_reentrant=False)
        return run

    if checkpoint_act:
        for layer in layers:
            mlp = getattr(layer, "mlp", None) or getattr(layer, "feed_forward", None)
            experts = getattr(mlp, "experts", None)
            if experts is not None and hasattr(experts, "_apply_gate"):
                experts._apply_gate = checkpointed_act(experts._apply_gate)
            elif experts is not None and type(experts).__name__ == "Llama4TextExperts":
                def bmm_experts(x, e=experts):  # Llama4TextExperts.forward, the act rerun
                    x = x.view(e.gate_up_proj.shape[0], -1, e.hidden_size)
                    gate, up = torch.bmm(x, e.gate_up_proj).chunk(2, dim=-1)
                    act = checkpointed_act(lambda g, u: u * e.act_fn(g))(gate, up)
                    return torch.bmm(act, e.down_proj).view(-1, e.hidden_size)
                experts.forward = bmm_experts
            elif experts is None and hasattr(mlp, "gate_proj"):
                # LlamaMLP.forward and its copies (Llama4TextMLP names it activation_fn), the
                # act rerun.
                fn = getattr(mlp, "act_fn", None) or getattr(mlp, "activation_fn")

                def dense(x, f=mlp, fn=fn):
                    act = checkpointed_act(lambda g, u: fn(g) * u)(f.gate_proj(x), f.up_proj(x))
                    return f.down_proj(act)
                mlp.forward = dense
    from transformers.modeling_utils import AttentionInterface
    modeling = sys.modules[type(model).__module__]
    interfaces = AttentionInterface._global_mapping
    original = (interfaces["sdpa"], getattr(modeling, "eager_attention_forward", None))
    if checkpoint_core:
        interfaces["sdpa"] = checkpointed(original[0])
        if original[1] is not None:
            modeling.eager_attention_forward = checkpointed(original[1])
    ids = torch.randint(0, cfg.vocab_size, (1, seq_len))
    torch.nn.functional.scaled_dot_product_attention = sdpa_as_on_gpu
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            # The decoder layers only.
            out = model.model(input_ids=ids, use_cache=False,
                              **forward_inputs(model_type, cfg, seq_len))
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
        interfaces["sdpa"] = original[0]
        if original[1] is not None:
            modeling.eager_attention_forward = original[1]
    excluded = params | {t.untyped_storage().data_ptr() for t in shared}
    per_layer = list(extra)
    seen: set[int] = set()
    for layer_index, ref in packed:
        t = ref()
        if t is None:
            continue
        key = t.untyped_storage().data_ptr()
        if key in excluded or key in seen:
            continue
        seen.add(key)
        per_layer[layer_index] += t.untyped_storage().nbytes()
        if log is not None:
            log.append((layer_index, tuple(t.shape), str(t.dtype)[6:],
                        t.untyped_storage().nbytes()))
    del out
    return per_layer


def planned_saved_per_layer(cli: str, model_type: str, seq_len: int) -> list[int]:
    return support.planned_saved_per_layer(cli, dict(CONFIGS[model_type], model_type=model_type),
                                           seq_len, PLAN_FLAGS.get(model_type, ()))


@unittest.skipUnless(HAVE, "needs torch 2.x and transformers (the PATH python of "
                           "scripts/setup-deps)")
class HfLayerKindsTest(unittest.TestCase):
    def test_saved_bytes_per_layer_match_autograd(self) -> None:
        cli = os.environ.get("STOWAGE_CLI")
        if not cli or not os.path.exists(cli):
            self.skipTest("STOWAGE_CLI is not set to a built `stowage` CLI")
        only = os.environ.get("STOWAGE_HF_KINDS")  # a comma list, to iterate on one family
        for model_type in CONFIGS:
            if only and model_type not in only.split(","):
                continue
            for seq_len in LINEAR_SEQ_LENS if model_type in LINEAR else SEQ_LENS:
                with self.subTest(model=model_type, seq_len=seq_len):
                    measured = measured_saved_per_layer(model_type, seq_len)
                    planned = planned_saved_per_layer(cli, model_type, seq_len)
                    if os.environ.get("STOWAGE_HF_KINDS_VERBOSE"):
                        print(model_type, seq_len, "planned",
                              [round(p / seq_len, 2) for p in planned], "measured",
                              [round(m / seq_len, 2) for m in measured])
                    self.assertEqual(len(planned), len(measured))
                    for i, (m, p) in enumerate(zip(measured, planned)):
                        self.assertAlmostEqual(
                            p / seq_len, m / seq_len, delta=0.005 * m / seq_len,
                            msg=f"{model_type} layer {i}: planned {p / seq_len:.2f} B/token, "
                                f"autograd saved {m / seq_len:.2f} B/token (transformers "
                                f"{transformers.__version__})")


def planned_core_recompute_per_layer(model_type: str, seq_len: int) -> list[int]:
    """Each layer's device_saved_bytes that the planner (stowage_plan_evaluate, the C ABI)
    predicts under hf when every layer with an attn_core module recomputes it and the others keep
    everything: the settings of planned_saved_per_layer."""
    from stowage import planner
    request = {"model": dict(CONFIGS[model_type], model_type=model_type), "hardware": "h200",
               "run": {"seq_len": seq_len, "micro_batch": 1, "tp": 1, "cp": 1, "ep": 1,
                       "gpus": 1, "sharding": "no_shard", "framework": "hf",
                       "optimizer": "none", "grad_bytes": 2, "loss_chunk_tokens": 0}}
    n = CONFIGS[model_type]["num_hidden_layers"]
    keep = json.loads(planner._call("stowage_plan_evaluate",
                                    dict(request, layers=[{"policy": "keep"}] * n)))
    layers = []
    for layer in keep["plan"]["layers"]:
        attention = layer["type"].split("+")[0]
        layers.append({"policy": "keep"} if attention in ("kda", "gdn") else
                      {"policy": "selective_recompute", "recompute_modules": ["attn_core"]})
    result = json.loads(planner._call("stowage_plan_evaluate", dict(request, layers=layers)))
    return [layer["device_saved_bytes"] for layer in result["plan"]["layers"]]


def planned_act_recompute_per_layer(model_type: str, seq_len: int) -> list[int]:
    """Each layer's device_saved_bytes that the planner predicts under hf when every layer
    recomputes its ffn_act (dense) or moe_act (MoE) module and keeps the rest."""
    from stowage import planner
    request = {"model": dict(CONFIGS[model_type], model_type=model_type), "hardware": "h200",
               "run": {"seq_len": seq_len, "micro_batch": 1, "tp": 1, "cp": 1, "ep": 1,
                       "gpus": 1, "sharding": "no_shard", "framework": "hf",
                       "optimizer": "none", "grad_bytes": 2, "loss_chunk_tokens": 0}}
    n = CONFIGS[model_type]["num_hidden_layers"]
    keep = json.loads(planner._call("stowage_plan_evaluate",
                                    dict(request, layers=[{"policy": "keep"}] * n)))
    layers = [{"policy": "selective_recompute",
               "recompute_modules": ["moe_act" if "moe" in layer["type"] else "ffn_act"]}
              for layer in keep["plan"]["layers"]]
    result = json.loads(planner._call("stowage_plan_evaluate", dict(request, layers=layers)))
    return [layer["device_saved_bytes"] for layer in result["plan"]["layers"]]


# Families the act recompute check runs: a SiLU and a GELU MLP, the default experts' gate,
# gpt-oss's own (clamped, sigmoid-gated), Llama 4's bmm experts, DeepSeek-V3's dense layer and
# experts beside a shared expert.
RECOMPUTED_ACT = ("mistral", "gemma2", "gpt_oss", "llama4_text", "deepseek_v3")


@unittest.skipUnless(HAVE, "needs torch 2.x and transformers (the PATH python of "
                           "scripts/setup-deps)")
class RecomputedActTest(unittest.TestCase):
    """ffn_act / moe_act free exactly what the activation no longer holds when it is rerun:
    the layer's saved bytes with the activation checkpointed, measured, equal the planner's
    prediction for the layer recomputing the module (Note [hf FFN act])."""

    def test_checkpointed_activation_holds_what_the_planner_says(self) -> None:
        if not os.environ.get("STOWAGE_LIBRARY"):
            self.skipTest("STOWAGE_LIBRARY is not set to a built libstowage.so")
        only = os.environ.get("STOWAGE_HF_KINDS")
        for model_type in RECOMPUTED_ACT:
            if only and model_type not in only.split(","):
                continue
            seq_len = SEQ_LENS[0]
            with self.subTest(model=model_type, seq_len=seq_len):
                measured = measured_saved_per_layer(model_type, seq_len, checkpoint_act=True)
                planned = planned_act_recompute_per_layer(model_type, seq_len)
                if os.environ.get("STOWAGE_HF_KINDS_VERBOSE"):
                    print(model_type, seq_len, "act recompute planned",
                          [round(p / seq_len, 2) for p in planned], "measured",
                          [round(m / seq_len, 2) for m in measured])
                self.assertEqual(len(planned), len(measured))
                for i, (m, p) in enumerate(zip(measured, planned)):
                    self.assertAlmostEqual(
                        p / seq_len, m / seq_len, delta=0.005 * m / seq_len,
                        msg=f"{model_type} layer {i} with its activation recomputed: planned "
                            f"{p / seq_len:.2f} B/token, autograd held {m / seq_len:.2f} B/token")


# Families the recompute check runs: every attention kind with an attn_core module (SDPA with
# and without a mask, eager with soft-capping and with sinks, Llama 4's chunks, MLA with and
# without q-LoRA, DSA's per-layer mask, the gated attention of Qwen3-Next). Mllama's
# cross-attention needs --vision-tokens, which plan requests do not take; the linear layers have
# no module.
RECOMPUTED = ("mistral", "gemma2", "gemma3_text", "gpt_oss", "llama4_text", "deepseek_v2",
              "deepseek_v3", "glm_moe_dsa", "qwen3_next")


@unittest.skipUnless(HAVE, "needs torch 2.x and transformers (the PATH python of "
                           "scripts/setup-deps)")
class RecomputedCoreTest(unittest.TestCase):
    """attn_core frees exactly what the attention call no longer holds when it is rerun: the
    layer's saved bytes with the call checkpointed, measured, equal the planner's prediction
    for the layer recomputing attn_core (Note [hf attn_core])."""

    def test_checkpointed_core_holds_what_the_planner_says(self) -> None:
        if not os.environ.get("STOWAGE_LIBRARY"):
            self.skipTest("STOWAGE_LIBRARY is not set to a built libstowage.so")
        only = os.environ.get("STOWAGE_HF_KINDS")
        for model_type in RECOMPUTED:
            if only and model_type not in only.split(","):
                continue
            seq_len = LINEAR_SEQ_LENS[0] if model_type in LINEAR else SEQ_LENS[0]
            with self.subTest(model=model_type, seq_len=seq_len):
                measured = measured_saved_per_layer(model_type, seq_len, checkpoint_core=True)
                planned = planned_core_recompute_per_layer(model_type, seq_len)
                if os.environ.get("STOWAGE_HF_KINDS_VERBOSE"):
                    print(model_type, seq_len, "recompute planned",
                          [round(p / seq_len, 2) for p in planned], "measured",
                          [round(m / seq_len, 2) for m in measured])
                self.assertEqual(len(planned), len(measured))
                for i, (m, p) in enumerate(zip(measured, planned)):
                    self.assertAlmostEqual(
                        p / seq_len, m / seq_len, delta=0.005 * m / seq_len,
                        msg=f"{model_type} layer {i} with attn_core recomputed: planned "
                            f"{p / seq_len:.2f} B/token, autograd held {m / seq_len:.2f} B/token")


if __name__ == "__main__":
    unittest.main()
