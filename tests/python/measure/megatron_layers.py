"""Measures what Megatron-Core's own layers (its local, non-TransformerEngine layer spec) keep for
backward on CPU: builds one `TransformerLayer` from `get_gpt_layer_local_spec`, runs forward and
backward under `saved_tensors_hooks`, and prints, as JSON, the bytes each storage saved by
autograd holds (each storage counted once, parameters and the layer's inputs excluded), grouped
by the Megatron-Core module that saved it, for each case and sequence length.
test_megatron_profile.py and test_megatron_mtp.py run this in a subprocess: it patches
torch.cuda for the one process (below) and initialises torch.distributed.

    megatron_layers.py '{"dense": {"moe": false, "qk_layernorm": false, "selective": false}}' \
        128 512

Megatron-Core places tensors with `torch.cuda.current_device()`, keeps CUDA RNG states for dropout
and checkpointing, even where the local spec computes on CPU. The patches below answer those calls
on CPU; none of them touches what a layer computes or saves. megatron-core 0.16.1 also leaves
`te_general_gemm` undefined when TransformerEngine is absent (moe_utils.py
RouterGatingLinearFunction.forward raises NameError); None is the value its fallback branch expects.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import warnings

import torch


def patch_for_cpu() -> None:
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.manual_seed = lambda *a, **k: None
    from megatron.core.tensor_parallel import random
    random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    random._set_cuda_rng_state = lambda *a, **k: None
    from megatron.core.transformer.moe import moe_utils
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


# The shape every case uses (the planner gets the same as a config.json): GQA, so that Megatron's
# local attention expands k and v (test_megatron_profile.py LOCAL_GQA_EXPAND).
SHAPE = dict(hidden=256, heads=8, kv_heads=2, head_dim=32, ffn=896, experts=16, top_k=4,
             expert_ffn=64)


def build_layer(case: dict):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig
    s = SHAPE
    kw = dict(num_layers=1, hidden_size=s["hidden"], num_attention_heads=s["heads"],
              num_query_groups=s["kv_heads"], kv_channels=s["head_dim"],
              ffn_hidden_size=s["ffn"], gated_linear_unit=True,
              activation_func=torch.nn.functional.silu, normalization="RMSNorm",
              add_bias_linear=False, bf16=True, params_dtype=torch.bfloat16,
              use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0,
              gradient_accumulation_fusion=False,
              # Megatron-Core's own fused SwiGLU (pure PyTorch, runs on CPU): the one the TE
              # spec uses too. RoPE fusion and the fused softmax need TE/apex kernels.
              bias_activation_fusion=True, apply_rope_fusion=False, masked_softmax_fusion=False,
              qk_layernorm=case["qk_layernorm"])
    if case["moe"]:
        # The allgather dispatcher (Megatron-Core's default): alltoall copies token counts on a
        # CUDA side stream (token_dispatcher.py _maybe_dtoh_and_synchronize). Both permute with
        # moe_utils.py permute and keep the same tensors at EP 1.
        kw.update(num_moe_experts=s["experts"], moe_router_topk=s["top_k"],
                  moe_ffn_hidden_size=s["expert_ffn"], moe_token_dispatcher_type="allgather",
                  moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0)
    if case["selective"]:
        kw.update(recompute_granularity="selective", recompute_modules=["core_attn"])
    config = TransformerConfig(**kw)
    spec = get_gpt_layer_local_spec(num_experts=s["experts"] if case["moe"] else None,
                                    qk_layernorm=case["qk_layernorm"], normalization="RMSNorm")
    return build_module(spec, config=config, layer_number=1)


def build_mtp_layer(case: dict):
    """One MultiTokenPredictionLayer (transformer/multi_token_prediction.py) around the local
    spec's layer of `case` (Note [MTP layers] in planner/cost/cost_model.cc), and the embedding it
    shares with the model: the local spec's VocabParallelEmbedding at TP 1 is F.embedding, which
    is what torch.nn.Embedding runs."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.multi_token_prediction import get_mtp_layer_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig
    config = TransformerConfig(**dict(build_layer(case).config.__dict__ | {"mtp_num_layers": 1}))
    spec = get_mtp_layer_spec(get_gpt_layer_local_spec(qk_layernorm=case["qk_layernorm"],
                                                       normalization="RMSNorm"),
                              use_transformer_engine=False)
    pg = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["cp"])
    layer = build_module(spec, config=config, layer_number=1, pg_collection=pg)
    layer.shared_embedding = torch.nn.Embedding(1024, SHAPE["hidden"], dtype=torch.bfloat16)
    return layer


def measure_mtp(layer, seq: int) -> dict:
    """As measure(), for an MTP layer: its input is the hidden states of the depth before (kept
    by hnorm, so counted here), and it embeds the tokens shifted by one itself; the shifted ids
    the embedding keeps are reported as "shifted_ids"."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    emb = layer.shared_embedding
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    stack = ["shifted_ids"]
    handles = []
    for name, mod in layer.named_modules():
        if not name or name == "shared_embedding":
            continue
        handles.append(mod.register_forward_pre_hook(lambda m, a, name=name: stack.append(name)))
        handles.append(mod.register_forward_hook(lambda m, a, o: stack.pop() and None))
    x = torch.randn(seq, 1, SHAPE["hidden"], dtype=torch.bfloat16, requires_grad=True)
    ids = torch.randint(0, 1024, (1, seq))
    pos = torch.arange(seq)[None]
    rope = RotaryEmbedding(kv_channels=SHAPE["head_dim"], rotary_percent=1.0,
                           use_cpu_initialization=True)(seq)
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)[None, None]
    inputs = {t.untyped_storage().data_ptr() for t in (ids, pos, rope, mask)}
    saved: dict[int, tuple[str, int]] = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params and key not in inputs and key not in saved:
            saved[key] = (stack[-1], t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _, _ = layer(input_ids=ids, position_ids=pos, hidden_states=x, attention_mask=mask,
                          rotary_pos_emb=rope,
                          embedding=lambda input_ids, position_ids:
                              emb(input_ids).transpose(0, 1).contiguous())
    out.float().sum().backward()
    for h in handles:
        h.remove()
    per_module: dict[str, int] = collections.OrderedDict()
    for module, nbytes in saved.values():
        per_module[module] = per_module.get(module, 0) + nbytes
    return per_module


def measure(layer, seq: int) -> dict:
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    stack = ["layer"]
    handles = []
    for name, mod in layer.named_modules():
        if not name:
            continue
        handles.append(mod.register_forward_pre_hook(lambda m, a, name=name: stack.append(name)))
        handles.append(mod.register_forward_hook(lambda m, a, o: stack.pop() and None))
    x = torch.randn(seq, 1, SHAPE["hidden"], dtype=torch.bfloat16, requires_grad=True)
    rope = RotaryEmbedding(kv_channels=SHAPE["head_dim"], rotary_percent=1.0,
                           use_cpu_initialization=True)(seq)
    # An explicit causal mask, as Megatron's data loader makes by default: the local softmax's
    # own default mask is built on "cuda".
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)[None, None]
    inputs = {t.untyped_storage().data_ptr() for t in (x, rope, mask)}
    saved: dict[int, tuple[str, int]] = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params and key not in inputs and key not in saved:
            saved[key] = (stack[-1], t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _ = layer(x, attention_mask=mask, rotary_pos_emb=rope)
    out.float().sum().backward()  # the saved set must be one backward can run from
    for h in handles:
        h.remove()
    per_module: dict[str, int] = collections.OrderedDict()
    for module, nbytes in saved.values():
        per_module[module] = per_module.get(module, 0) + nbytes
    return per_module


def main() -> int:
    warnings.filterwarnings("ignore")
    cases = json.loads(sys.argv[1])
    seqs = [int(a) for a in sys.argv[2:]]
    patch_for_cpu()
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    with tempfile.TemporaryDirectory() as tmp:
        # A file store: no port to collide with another test run.
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
        model_parallel_cuda_manual_seed(1234)
        torch.manual_seed(0)
        result = {}
        for name, case in cases.items():
            if case.get("mtp"):
                layer = build_mtp_layer(case)
                result[name] = {str(seq): measure_mtp(layer, seq) for seq in seqs}
            else:
                layer = build_layer(case)
                result[name] = {str(seq): measure(layer, seq) for seq in seqs}
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
