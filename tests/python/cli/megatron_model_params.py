"""Builds Megatron-Core's GPTModel (its local, non-TransformerEngine layer spec) on CPU for each
case and prints, as JSON, sum(p.numel() for p in model.parameters()) per case.
test_megatron_model.py runs this in a subprocess (it initialises torch.distributed and patches
torch.cuda for the one process, as tests/python/measure/megatron_layers.py does).

    megatron_model_params.py '{"dense": {"config": {...}, "model": {...}}}'

A case's "config" is TransformerConfig's (MLATransformerConfig's with "mla") keyword arguments,
"model" GPTModel's vocab_size, max_sequence_length, share_embeddings_and_output_weights and
position_embedding_type; "gelu" uses GeLU instead of SwiGLU.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "measure"))

from megatron_layers import patch_for_cpu  # noqa: E402


def patch_mla_core_attention() -> None:
    """megatron-core 0.16.1's MLA hands its core attention k_channels and v_channels, which the
    local spec's DotProductAttention does not take (only TransformerEngine's does). The core
    attention holds no parameters: dropping the two keywords leaves the count as it is.
    (megatron_layers.py's patch_for_cpu covers the rest.)"""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    init = DotProductAttention.__init__

    def without_channels(self, *args, k_channels=None, v_channels=None, **kwargs):
        init(self, *args, **kwargs)

    DotProductAttention.__init__ = without_channels
    # Without TransformerEngine it also asks isinstance(linear_proj, TELinear), TELinear being a
    # stand-in that is no class: a class nothing is an instance of answers what that check means
    # (the projection is not TE's).
    from megatron.core.transformer import multi_latent_attention
    if not isinstance(getattr(multi_latent_attention, "TELinear", None), type):
        multi_latent_attention.TELinear = type("NoTransformerEngineLinear", (), {})


def count(case: dict) -> int:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_decoder_block_spec,
                                                          get_gpt_mtp_block_spec)
    from megatron.core.transformer.transformer_config import (MLATransformerConfig,
                                                              TransformerConfig)
    kw = dict(case["config"])
    kw.update(use_cpu_initialization=True, params_dtype=torch.float32, hidden_dropout=0.0,
              attention_dropout=0.0, gradient_accumulation_fusion=False,
              bias_activation_fusion=False, apply_rope_fusion=False,
              masked_softmax_fusion=False)
    kw["activation_func"] = (torch.nn.functional.gelu if case.get("gelu")
                             else torch.nn.functional.silu)
    kw["gated_linear_unit"] = not case.get("gelu")
    config = (MLATransformerConfig if case.get("mla") else TransformerConfig)(**kw)
    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                       normalization=config.normalization)
    mtp = None
    if config.mtp_num_layers:
        mtp = get_gpt_mtp_block_spec(config, block.layer_specs[-1], use_transformer_engine=False)
    model = GPTModel(config, block, mtp_block_spec=mtp, **case["model"])
    return sum(p.numel() for p in model.parameters())


def main() -> int:
    warnings.filterwarnings("ignore")
    cases = json.loads(sys.argv[1])
    patch_for_cpu()
    patch_mla_core_attention()
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
        model_parallel_cuda_manual_seed(1234)
        result = {name: count(case) for name, case in cases.items()}
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
