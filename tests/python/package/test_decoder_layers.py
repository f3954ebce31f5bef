"""Layers shaped like Hugging Face decoder layers run under every policy, bit for bit: extra
positional and keyword inputs (position-embedding tuples, masks, cache objects set to None,
cache_position, flags) pass through unchanged to every layer, gradients reach every input that
requires them, and tuple or tensor returns come back as the layer made them. Real `transformers`
models (Llama, Qwen3, Qwen3-MoE, Mixtral) swap `model.model.layers` for the planned ones; those
tests skip where transformers is absent (Debian's torch 1.13)."""

from __future__ import annotations

import copy
import math
import unittest

import support
import torch
import torch.nn as nn

import plans
import stowage

try:
    import transformers
except ImportError:  # Debian's python3-torch has no transformers
    transformers = None

torch.set_num_threads(1)

LAYERS = 4
# (policies, recompute_modules of the selective_recompute layers)
PLANS = [
    (["keep"] * LAYERS, ()),
    (["recompute"] * LAYERS, ()),
    (["selective_recompute"] * LAYERS, ("mlp",)),
    (["offload_input"] * LAYERS, ()),
    (["offload_saved"] * LAYERS, ()),
    (["offload_input", "offload_saved", "selective_recompute", "recompute"], ("mlp",)),
    (["offload_saved", "keep", "offload_input", "offload_saved"], ()),
]


def assert_same(test: unittest.TestCase, want: list, got: list, what: str) -> None:
    test.assertEqual(len(want), len(got))
    for step, (a, b) in enumerate(zip(want, got)):
        test.assertEqual([n for n, _ in a], [n for n, _ in b])
        for (name, u), (_, v) in zip(a, b):
            test.assertTrue(torch.equal(u, v), f"{what}: {name} differs at step {step}")


# -- hand-written layers with Hugging Face's calling convention (any torch) -----------------------
class HFShapedLayer(nn.Module):
    """A pre-norm attention + MLP block called as transformers calls its decoder layers."""

    def __init__(self, hidden: int, returns_tuple: bool):
        super().__init__()
        self.returns_tuple = returns_tuple
        self.input_layernorm = nn.LayerNorm(hidden)
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(),
                                 nn.Linear(2 * hidden, hidden))

    def forward(self, hidden_states, attention_mask=None, position_ids=None,  # type: ignore
                past_key_values=None, use_cache=False, cache_position=None,
                position_embeddings=None, output_attentions=False, **kwargs):
        if past_key_values is not None or use_cache or kwargs.get("unexpected"):
            raise AssertionError("a pass-through input changed on its way to the layer")
        assert position_ids.shape == cache_position.shape
        cos, sin = position_embeddings
        h = self.input_layernorm(hidden_states)
        q, k = self.q(h) * cos + self.k(h) * sin, self.k(h) * cos - self.q(h) * sin
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + attention_mask
        weights = scores.softmax(-1)
        x = hidden_states + weights @ self.v(h)
        x = x + self.mlp(x)
        if self.returns_tuple:
            return (x, weights if output_attentions else None)
        return x


class HFShapedModel(nn.Module):
    """Embeddings, rotary inputs computed once per forward (from a learned frequency, so the
    position embeddings require grad), a causal mask, and a loop over the layers as in
    transformers' LlamaModel.forward."""

    def __init__(self, hidden: int = 16, returns_tuple: bool = True):
        super().__init__()
        self.embed = nn.Embedding(32, hidden)
        self.freq = nn.Parameter(torch.rand(hidden))
        self.layers = nn.ModuleList([HFShapedLayer(hidden, returns_tuple)
                                     for _ in range(LAYERS)])

    def inputs(self, ids: torch.Tensor) -> tuple:
        s = ids.shape[-1]
        position_ids = torch.arange(s)[None]
        angles = position_ids[..., None].float() * self.freq
        mask = torch.full((s, s), float("-inf")).triu(1)
        return self.embed(ids), dict(
            attention_mask=mask, position_ids=position_ids, past_key_values=None,
            use_cache=False, cache_position=torch.arange(s)[None],
            position_embeddings=(angles.cos(), angles.sin()), output_attentions=True)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden, kwargs = self.inputs(ids)
        weights = []
        for layer in self.layers[:LAYERS]:
            out = layer(hidden, **kwargs)
            hidden = out[0] if isinstance(out, tuple) else out
            if isinstance(out, tuple):
                weights.append(out[1])
        loss = hidden.square().mean()
        for w in weights:  # the tuple's other outputs are part of the graph too
            loss = loss + 1e-2 * w.square().mean()
        return loss


def train(model: nn.Module, ids: torch.Tensor, steps: int, loss_of,
          planned: "stowage.PlannedLayers | None" = None) -> list:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(5)
    out = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        if planned is None:
            loss = loss_of(model, ids)
            loss.backward()
        else:
            with planned.step():
                loss = loss_of(model, ids)
                loss.backward()
        out.append([("loss", loss.detach().clone())] +
                   [(n, p.grad.clone()) for n, p in model.named_parameters()
                    if p.grad is not None])
        opt.step()
    return out


class HandWrittenDecoderLayersTest(unittest.TestCase):
    def run_model(self, returns_tuple: bool) -> None:
        torch.manual_seed(0)
        model = HFShapedModel(returns_tuple=returns_tuple)
        ids = torch.randint(0, 32, (1, 12))
        loss_of = lambda m, i: m(i)  # noqa: E731
        want = train(copy.deepcopy(model), ids, 2, loss_of)
        self.assertIn("freq", [n for n, _ in want[0]], "the position embeddings get no grad")
        hidden, kwargs = model.inputs(ids)
        for policies, modules in PLANS:
            with self.subTest(policies=policies):
                wrapped = copy.deepcopy(model)
                plan = plans.plan_for(wrapped.layers, hidden, policies,
                                      recompute_modules=modules, **kwargs)
                planned = stowage.PlannedLayers(wrapped.layers, plan)
                wrapped.layers = planned  # the model's own loop now runs the plan
                got = train(wrapped, ids, 2, loss_of, planned)
                assert_same(self, want, got, f"{policies}")
                if planned.runtime is not None:
                    self.assertEqual(planned.stats().arena_used_bytes, 0)
                planned.close()

    def test_tuple_returns(self) -> None:
        self.run_model(returns_tuple=True)

    def test_tensor_returns(self) -> None:
        self.run_model(returns_tuple=False)

    def test_planned_layers_look_like_the_model_list(self) -> None:
        model = HFShapedModel()
        names = [n for n, _ in model.layers.named_parameters()]
        hidden, kwargs = model.inputs(torch.zeros(1, 4, dtype=torch.long))
        planned = stowage.PlannedLayers(model.layers, plans.plan_for(
            model.layers, hidden, ["keep"] * LAYERS, **kwargs))
        # The same parameter names, so a checkpoint of the model loads either way.
        self.assertEqual([n for n, _ in planned.named_parameters()], names)
        self.assertEqual(len(planned), LAYERS)
        self.assertEqual(len(planned[:2]), 2)
        self.assertIs(planned[1].input_layernorm, model.layers[1].input_layernorm)
        # Calling the whole sequence passes the hidden state (a tuple's first element) along
        # and returns what the last layer returned.
        out = planned(hidden, **kwargs)
        self.assertIsInstance(out, tuple)
        self.assertEqual(out[0].shape, hidden.shape)


# -- real transformers models (torch 2.x with transformers) ---------------------------------------
def _configs() -> dict:
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=LAYERS,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  use_cache=False, tie_word_embeddings=False)
    return {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(common)),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(common)),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
                  dict(common, head_dim=8)),
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                      dict(common, head_dim=8, num_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=16, decoder_sparse_step=1)),
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM,
                    dict(common, num_local_experts=4, num_experts_per_tok=2)),
    }


@unittest.skipIf(transformers is None,
                 "transformers is not installed for this Python (Debian's torch 1.13 has none; "
                 "scripts/setup-deps pins transformers 5.23 into the PATH python)")
class TransformersDecoderLayersTest(unittest.TestCase):
    def check(self, name: str) -> None:
        config_cls, model_cls, fields = _configs()[name]
        torch.manual_seed(0)
        model = model_cls(config_cls(**fields, attn_implementation="eager")).train()
        ids = torch.randint(0, 64, (1, 16))

        def loss_of(m: nn.Module, i: torch.Tensor) -> torch.Tensor:
            return m(input_ids=i, labels=i).loss

        want = train(copy.deepcopy(model), ids, 2, loss_of)
        hidden, args, kwargs = support.first_layer_inputs(model, ids)
        for policies, modules in PLANS:
            with self.subTest(model=name, policies=policies):
                wrapped = copy.deepcopy(model)
                plan = plans.plan_for(wrapped.model.layers, hidden, policies, *args,
                                      recompute_modules=modules, **kwargs)
                planned = stowage.PlannedLayers(wrapped.model.layers, plan)
                wrapped.model.layers = planned
                got = train(wrapped, ids, 2, loss_of, planned)
                assert_same(self, want, got, f"{name} {policies}")
                planned.close()

    def test_llama(self) -> None:
        self.check("llama")

    def test_llama_under_the_planners_plan(self) -> None:
        # The README's path: the layers profiled with the model's own layer inputs, the C++
        # planner's plan for an assignment, the model's layers swapped for the planned ones.
        config_cls, model_cls, fields = _configs()["llama"]
        torch.manual_seed(0)
        model = model_cls(config_cls(**fields, attn_implementation="eager")).train()
        ids = torch.randint(0, 64, (1, 16))
        loss_of = lambda m, i: m(input_ids=i, labels=i).loss  # noqa: E731
        want = train(copy.deepcopy(model), ids, 2, loss_of)
        hidden, args, kwargs = support.first_layer_inputs(model, ids)
        profile = stowage.profile_layers(model.model.layers, hidden, *args, **kwargs)
        policies = ["offload_input", "offload_saved", "recompute", "keep"]
        plan = stowage.evaluate(profile, policies).plan
        self.assertEqual(plan.policies(), policies)
        planned = stowage.PlannedLayers(model.model.layers, plan)
        model.model.layers = planned
        assert_same(self, want, train(model, ids, 2, loss_of, planned), "planner's plan")
        self.assertEqual(planned.stats().d2h_bytes_total, 2 * plan.runtime.host_arena_bytes)
        planned.close()

    def test_qwen2(self) -> None:
        self.check("qwen2")

    def test_qwen3(self) -> None:
        self.check("qwen3")

    def test_qwen3_moe(self) -> None:
        self.check("qwen3_moe")

    def test_mixtral(self) -> None:
        self.check("mixtral")


if __name__ == "__main__":
    unittest.main()
