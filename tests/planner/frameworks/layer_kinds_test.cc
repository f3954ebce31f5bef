// The layer kinds and features of docs/models.md, each checked against a hand count of what its
// Megatron-Core/TE layer keeps per token (megatron.cc names the code each term comes from), and
// the parameter terms they add. One rank, TP 1, CP 1, bf16 activations: a tensor of width w
// keeps 2w bytes per token.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "planner/cost/cost_model.h"
#include "planner/frameworks/hf.h"
#include "planner/frameworks/step_cost.h"
#include "planner/search/optimizer.h"

namespace stowage::planner {
namespace {

const std::string kData = std::string(STOWAGE_SOURCE_DIR) + "/tests/planner/data/hf/";
constexpr uint64_t kSeq = 16384;

StepCost Step(const ModelConfig& m, uint64_t seq = kSeq) {
  RunSettings run;
  run.seq_len = seq;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 1;
  auto step = BuildStepCost(m, *HardwarePreset("h200"), run);
  EXPECT_TRUE(step.ok()) << step.status();
  return *step;
}

ModelConfig Read(const std::string& file) {
  auto m = ReadHfConfigFile(kData + file);
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

ModelConfig Parse(const std::string& json) {
  auto m = ParseHfConfigJson(json, "test");
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

// Bytes per token of one saved tensor of layer `index` (0 when the layer does not keep it).
double PerToken(const StepCost& s, int index, const std::string& name) {
  for (const SavedTensor& t : s.layers[index].saved) {
    if (t.name == name) return static_cast<double>(t.bytes) / static_cast<double>(kSeq);
  }
  return 0;
}

double LayerPerToken(const StepCost& s, int index) {
  return static_cast<double>(s.layers[index].saved_bytes) / static_cast<double>(kSeq);
}

// Llama-shaped: hidden 256, 4 heads of 64, 2 KV heads, FFN 512.
std::string Dense(const std::string& family, const std::string& extra = "") {
  return absl::StrCat(R"({"model_type": ")", family, R"(", "hidden_size": 256,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
      "intermediate_size": 512, "vocab_size": 1000)",
                      extra, "}");
}

TEST(LayerKinds, DenseAttentionLayerByHand) {
  const StepCost s = Step(Parse(Dense("llama")));
  // input, attn.norm, mid, ffn.norm: 4 x 256 x 2, and the two norms' fp32 rsigma; qkv
  // (4 + 2 x 2) x 64 x 2; core out 4 x 64 x 2 + 4 fp32 softmax statistics; gate/up 2 x 512 x 2;
  // act 512 x 2.
  EXPECT_DOUBLE_EQ(LayerPerToken(s, 0),
                   4 * 256 * 2 + 2 * 4 + 8 * 64 * 2 + (4 * 64 * 2 + 16) + 2 * 512 * 2 + 512 * 2);
  // No attn_core module: linear_proj keeps the core's output whatever the core recomputes
  // (Note [megatron profile], tests/python/measure/test_megatron_profile.py).
  for (const RecomputeModule& mod : s.layers[0].modules) EXPECT_NE(mod.name, "attn_core");
}

// Mistral / Gemma 2/3 / gpt-oss / OLMo 3: a window changes the attention work, not what flash
// attention keeps; so does Gemma 2's attention logit soft-capping (applied in the kernel).
TEST(LayerKinds, SlidingWindowKeepsTheSameTensorsAndDoesLessWork) {
  const ModelConfig m = Parse(Dense("gemma2", R"(, "sliding_window": 1024,
      "attn_logit_softcapping": 50.0, "final_logit_softcapping": 0.0)"));
  ASSERT_EQ(m.layers[0].span, AttentionSpan::kSliding);
  ASSERT_EQ(m.layers[1].span, AttentionSpan::kFull);
  const StepCost s = Step(m);
  EXPECT_EQ(s.layers[0].saved_bytes, s.layers[1].saved_bytes);
  // Core FLOPs: 4 x heads x head_dim x keys per query x tokens; a sliding query sees
  // W - W^2 / 2S keys on average, a full one S / 2.
  const double w = 1024, seq = kSeq;
  const double full = 4.0 * 4 * 64 * (seq / 2) * seq;
  const double sliding = 4.0 * 4 * 64 * (w - w * w / (2 * seq)) * seq;
  EXPECT_NEAR(s.layers[1].forward_flops - s.layers[0].forward_flops, full - sliding, 1.0);
}

// Llama 4: RoPE layers attend within their attention_chunk_size chunk (half a chunk on average).
TEST(LayerKinds, ChunkedAttentionSeesHalfAChunk) {
  const ModelConfig m = Parse(R"({"architectures": ["Llama4ForCausalLM"], "hidden_size": 256,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
      "intermediate_size": 128, "intermediate_size_mlp": 512, "num_local_experts": 4,
      "num_experts_per_tok": 1, "attention_chunk_size": 2048, "vocab_size": 1000})");
  ASSERT_EQ(m.layers[0].span, AttentionSpan::kChunked);
  ASSERT_EQ(m.layers[3].span, AttentionSpan::kFull);
  const StepCost s = Step(m);
  // The same tensors but the q/k L2 norm's, which the NoPE layer 3 lacks (use_qk_norm defaults
  // to true; Llama4NopeLayersHaveNoQkNorm).
  EXPECT_EQ(s.layers[0].saved_bytes - s.layers[3].saved_bytes, (4u + 2) * (64 * 2 + 4) * kSeq);
  const double seq = kSeq;
  EXPECT_NEAR(s.layers[3].forward_flops - s.layers[0].forward_flops,
              4.0 * 4 * 64 * (seq / 2 - 1024) * seq, 1.0);
  // The shared expert (intermediate_size wide) is saved beside the routed one:
  // gate/up 2 x (1 x 128 + 128) x 2, act (128 + 128) x 2.
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "moe.gate_up"), 2 * (128 + 128) * 2);
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "moe.act"), (128 + 128) * 2);
}

// Qwen3 / Gemma 3 / OLMo: q_layernorm and k_layernorm keep their inputs, (heads + kv) x d wide,
// and one fp32 rstdev per head.
TEST(LayerKinds, QkNormKeepsItsInputs) {
  const StepCost llama = Step(Parse(Dense("llama")));
  const StepCost qwen3 = Step(Parse(Dense("qwen3")));
  EXPECT_DOUBLE_EQ(PerToken(qwen3, 0, "attn.qk_norm_in"), (4 + 2) * (64 * 2 + 4));
  EXPECT_DOUBLE_EQ(LayerPerToken(qwen3, 0) - LayerPerToken(llama, 0), (4 + 2) * (64 * 2 + 4));
  // Parameters: one head_dim weight each for q and k per layer.
  const ModelConfig q = Parse(Dense("qwen3")), l = Parse(Dense("llama"));
  EXPECT_EQ(DenseLayerParams(q, q.layers[0]) - DenseLayerParams(l, l.layers[0]), 2u * 64);
}

// gpt-oss: sinks are one learned logit per head folded into the softmax statistics; nothing
// more is kept per token. Biases and router biases are parameters, not activations.
TEST(LayerKinds, GptOssLayerByHand) {
  const ModelConfig m = Read("gpt-oss-20b.json");
  const StepCost s = Step(m);
  const double h = 2880, hq = 64, hkv = 8, d = 64, e = 32, k = 4, f = 2880;
  const double expected = 4 * h * 2 + 2 * 4 + (hq + 2 * hkv) * d * 2 + (hq * d * 2 + hq * 4) +
                          k * (8 + 4) +            // router top-k indices and fp32 softmax
                          e * (1 + 2) + 8 * k +    // permute: routing map, probs, token indices
                          k * h * 2 +              // dispatched tokens
                          k * 2 * f * 2 + k * 2 +  // expert gate/up and permuted probs
                          k * f * 2;               // expert activation
  EXPECT_DOUBLE_EQ(LayerPerToken(s, 0), expected);
  EXPECT_EQ(s.layers[0].saved_bytes, s.layers[1].saved_bytes);  // sliding and full alike
  // Parameters the feature adds: sinks (64), q/k/v/o biases, router bias (32), expert biases.
  ModelConfig plain = m;
  plain.attention_sinks = plain.qkv_bias = plain.o_bias = false;
  plain.router_bias = plain.expert_bias = false;
  EXPECT_EQ(DenseLayerParams(m, m.layers[0]) - DenseLayerParams(plain, plain.layers[0]),
            64u + (64 + 2 * 8) * 64 + 2880 + 32);
  EXPECT_EQ(RoutedExpertParams(m, m.layers[0]) - RoutedExpertParams(plain, plain.layers[0]),
            32u * (2 * 2880 + 2880));
}

// Gemma 2: final-logit soft-capping keeps the tanh output, one more fp32 logits chunk.
TEST(LayerKinds, FinalLogitSoftcapKeepsOneMoreLogitsChunk) {
  ModelConfig m = Read("gemma-2-9b.json");
  ASSERT_GT(m.final_logit_softcap, 0);
  const StepCost capped = Step(m);
  m.final_logit_softcap = 0;
  const StepCost plain = Step(m);
  EXPECT_EQ(capped.tail_bytes - plain.tail_bytes, 8192ull * 256000 * 4);
}

// Qwen3-Next: the attention layers' q_proj also yields a sigmoid output gate, kept for backward.
// The gated DeltaNet layers keep what Megatron-Core 0.16.1's GatedDeltaNet and fla's
// chunk_gated_delta_rule save (Note [megatron linear attention]), counted here from that code:
// 2 key heads x 32 (key 64), 4 value heads x 32 (value 128), bf16.
TEST(LayerKinds, GatedDeltaNetAndGatedAttentionByHand) {
  const ModelConfig m = Read("synthetic/qwen3-next-small.json");
  ASSERT_EQ(m.layers[0].attention, AttentionKind::kGdn);
  ASSERT_EQ(m.layers[3].attention, AttentionKind::kAttention);
  const StepCost s = Step(m);
  const double hk = 2, hv = 4, dk = 32, key = hk * dk, value = hv * 32;
  // causal_conv1d_fn saves its input, the contiguous [b, conv, s] copy of q, k, v.
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.conv_in"), (2 * key + value) * 2);
  // L2NormFunction saves its bf16 output and one fp32 rstd per key head, for q and for k.
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.qk_l2norm"), 2 * key * 2 + 2 * hk * 4);
  // repeat_interleave to the 4 value heads: the core keeps the repeated q and k.
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.qk_repeated"), 2 * hv * dk * 2);
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.v"), value * 2);
  // softplus's fp32 input, the decay mul's fp32 output, sigmoid's bf16 output (the core's beta).
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.gates"), hv * (4 + 4 + 2));
  // fla's A, [B, T, HV, 64] bf16, and the fp32 chunk-local cumsum of g.
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.chunk_a"), hv * 64 * 2 + hv * 4);
  // TENorm keeps the core's output and one fp32 rstdev per value head.
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.core_out"), value * 2 + hv * 4);
  // The compiled gate keeps its bf16 inputs, the norm's output and the gate; out_proj the
  // gated output.
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.out_gate"), 2 * value * 2);
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.norm_out"), value * 2);
  EXPECT_DOUBLE_EQ(PerToken(s, 3, "attn.out_gate"), 4 * 32 * 2);
  // Shared expert (64 wide) beside 2 routed experts of 64: gate/up 2 x (2 x 64 + 64) x 2.
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "moe.gate_up"), 2 * (2 * 64 + 64) * 2);
  // The layer by hand: input, mid and the two norms (4 x 128 x 2 + 2 x 4) and the attention
  // part above.
  const double attention = (2 * key + value) * 2 + (2 * key * 2 + 2 * hk * 4) + 2 * hv * dk * 2 +
                           value * 2 + hv * 10 + (hv * 128 + hv * 4) + (value * 2 + hv * 4) +
                           4 * value + 2 * value;
  EXPECT_DOUBLE_EQ(LayerPerToken(s, 0) - s.layers[0].ffn_saved_bytes / double(kSeq),
                   4 * 128 * 2 + 2 * 4 + attention);
}

// Kimi Linear (and GLM-5.3-Flash's 34 KDA layers): what fla's KimiDeltaAttention layer and
// chunk_kda keep (Note [megatron linear attention]), by hand: 4 heads x 16 (inner 64), bf16.
TEST(LayerKinds, KdaLayerByHand) {
  const ModelConfig m = Read("synthetic/kimi-linear-small.json");
  ASSERT_EQ(m.layers[0].attention, AttentionKind::kKda);
  const StepCost s = Step(m);
  const double heads = 4, d = 16, inner = heads * d, chunk = 64;
  // The three short convs keep their inputs (the q, k, v projections).
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.qkv"), 3 * inner * 2);
  // chunk_kda's l2norm_fwd: normalised q and k (bf16) and an fp32 rstd per head each.
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.qk_l2norm"), 2 * inner * 2 + 2 * heads * 4);
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.v"), inner * 2);
  // The raw gate (H d), beta's logits (H) and fp32 sigmoid (H), f_proj's and g_proj's
  // low-rank inputs of the second linears (d each).
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.gates"), (inner + heads + 2 * d) * 2 + heads * 4);
  // Aqk and Akk: [B, T, H, 64] bf16 each, 4 x H x 64 bytes together.
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.chunk_a"), 4 * heads * chunk);
  // The gated output norm keeps the core's output, one fp32 rstd per head and the gate;
  // o_proj keeps the norm's output.
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.core_out"), inner * 2 + heads * 4);
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.out_gate"), 2 * inner * 2);
  const double attention = 20 * inner + 4 * d + 274 * heads;
  EXPECT_DOUBLE_EQ(LayerPerToken(s, 0) - s.layers[0].ffn_saved_bytes / double(kSeq),
                   4 * 128 * 2 + 2 * 4 + attention);
}

// Regression: kda_conv and gdn_conv claimed to free the conv output, but
// the convs save only their inputs and the core keeps what it needs of their output (v itself,
// l2-normalised copies of q and k), so rerunning a conv frees nothing: the optimizer was
// promised 3 x inner x 2 bytes per token (KDA) that no recompute returns. Neither layer has a
// recompute module of its attention now; every attention tensor is held under every option
// but full recompute.
TEST(LayerKinds, LinearAttentionConvRecomputeFreesNothing) {
  for (const char* file : {"synthetic/qwen3-next-small.json", "synthetic/kimi-linear-small.json"}) {
    SCOPED_TRACE(file);
    const StepCost s = Step(Read(file));
    const LayerCost& l = s.layers[0];
    for (const SavedTensor& t : l.saved) {
      if (t.name.rfind("attn.", 0) == 0) {
        EXPECT_EQ(t.module, "") << t.name;
      }
    }
    for (const RecomputeModule& mod : l.modules) {
      EXPECT_TRUE(mod.in_ffn) << mod.name;
      EXPECT_NE(mod.name, "kda_conv");
      EXPECT_NE(mod.name, "gdn_conv");
    }
  }
}

// Regression: KDA and gated DeltaNet listed attn.core_out under an attn_core
// module, so selective recompute of the core claimed to free it, although the gated output
// norm, its consumer, keeps it. Neither layer has an attn_core module now, and core_out is
// held under every selective recompute.
TEST(LayerKinds, LinearAttentionCoreOutputIsKeptByItsConsumer) {
  for (const char* file : {"synthetic/qwen3-next-small.json", "synthetic/kimi-linear-small.json"}) {
    SCOPED_TRACE(file);
    const ModelConfig m = Read(file);
    const StepCost s = Step(m);
    const LayerCost& l = s.layers[0];
    ASSERT_TRUE(m.layers[0].attention == AttentionKind::kGdn ||
                m.layers[0].attention == AttentionKind::kKda);
    EXPECT_GT(PerToken(s, 0, "attn.core_out"), 0);
    for (const SavedTensor& t : l.saved) {
      if (t.name == "attn.core_out") {
        EXPECT_EQ(t.module, "");
      }
    }
    for (const RecomputeModule& mod : l.modules) EXPECT_NE(mod.name, "attn_core");
  }
}

// Under hf the gated DeltaNet and KDA recipes model transformers' torch fallbacks
// (Note [hf linear attention]): what runs where flash-linear-attention and causal-conv1d are not
// installed. The summary says so for a step with such layers, and only under hf: megatron's recipes
// are fla's and Megatron-Core's kernels, and a model without them has nothing to say.
TEST(LayerKinds, HfSummarySaysWhichLinearAttentionPathItModels) {
  RunSettings run;
  run.seq_len = 4096;
  run.cp = run.ep = run.gpus = 1;
  RunSettings hf = run;
  hf.framework = Framework::kHf;
  hf.optimizer = OptimizerKind::kNone;
  hf.loss_chunk_tokens = 0;
  const HardwareProfile hw = *HardwarePreset("h200");
  for (const char* file : {"synthetic/qwen3-next-small.json", "synthetic/kimi-linear-small.json"}) {
    SCOPED_TRACE(file);
    const std::string line = HfLinearAttentionPath(*BuildStepCost(Read(file), hw, hf));
    EXPECT_THAT(line, ::testing::HasSubstr("without flash-linear-attention and causal-conv1d"));
    EXPECT_EQ(HfLinearAttentionPath(*BuildStepCost(Read(file), hw, run)), "");
  }
  EXPECT_EQ(HfLinearAttentionPath(*BuildStepCost(Parse(Dense("llama")), hw, hf)), "");
}

// Under hf, attn_core is the attention call rerun under torch.utils.checkpoint
// (Note [hf attn_core]): it frees what the call keeps inside and never the output, which o_proj
// keeps. Regression: the module claimed the output too (2 x heads x head_dim bytes per token).
// Llama (SDPA, no mask): the fp32 logsumexp only. Mistral past its window (a mask): k and v
// repeated from 2 to 4 heads and SDPA's bf16 copy of the mask, 2 bytes per key. Gemma 2 (eager):
// the s x s scores (softmax fp32 + its bf16 copy, the soft-capping tanh) and the repeats.
// tests/python/measure/test_hf_layer_kinds.py RecomputedCoreTest measures the same on the real
// layers.
TEST(LayerKinds, HfAttnCoreFreesOnlyWhatTheCallKeepsInside) {
  RunSettings run;
  run.seq_len = 4096;
  run.framework = Framework::kHf;
  run.optimizer = OptimizerKind::kNone;
  run.loss_chunk_tokens = 0;
  run.cp = run.ep = run.gpus = 1;
  const double t = 4096, s = 4096, hq = 4, hkv = 2, d = 64;
  auto core = [&](const std::string& json) {
    const StepCost step = *BuildStepCost(Parse(json), *HardwarePreset("h200"), run);
    const LayerCost& l = step.layers[0];
    for (const SavedTensor& tensor : l.saved) {
      if (tensor.name == "attn.core_out") {
        EXPECT_EQ(tensor.module, "");
        EXPECT_EQ(tensor.bytes, static_cast<uint64_t>(2 * hq * d * t));
      }
    }
    for (size_t k = 0; k < l.modules.size(); ++k) {
      if (l.modules[k].name != "attn_core") continue;
      const OptionCost c = EvaluateOption(l, {LayerPolicy::kSelectiveRecompute, 1u << k, 1});
      EXPECT_EQ(c.resident_bytes, l.saved_bytes - l.modules[k].saved_bytes);
      return static_cast<double>(l.modules[k].saved_bytes);
    }
    ADD_FAILURE() << "no attn_core module";
    return 0.0;
  };
  EXPECT_DOUBLE_EQ(core(Dense("llama")), 4 * hq * t);
  EXPECT_DOUBLE_EQ(core(Dense("mistral", R"(, "sliding_window": 1024)")),
                   (4 * (hq - hkv) * d + 2 * s + 4 * hq) * t);
  EXPECT_DOUBLE_EQ(core(Dense("gemma2", R"(, "sliding_window": 1024,
      "attn_logit_softcapping": 50.0, "final_logit_softcapping": 0.0)")),
                   (4 * (hq - hkv) * d + 6 * hq * s + 2 * hq * s) * t);
}

// Note [hf partial rotary]: after the partial-rotary cat ([b, h, s, d] q) the kernel an H200 runs
// writes the query's layout and o_proj keeps a copy of the output, 2 hq d per token, which a
// recompute of attn_core does not free (the kernel's own output it does); Llama's in-place RoPE
// and the memory-efficient kernel a mask sends 256-dim heads to write [b, s, h, d]: no copy. The
// cos/sin tables are the rotated width: 2 x 2r per token.
TEST(LayerKinds, HfPartialRotaryCopiesTheOutputForOProj) {
  RunSettings run;
  run.seq_len = 4096;
  run.framework = Framework::kHf;
  run.optimizer = OptimizerKind::kNone;
  run.loss_chunk_tokens = 0;
  run.cp = run.ep = run.gpus = 1;
  const double t = 4096;
  auto step = [&](const std::string& json) {
    return *BuildStepCost(Parse(json), *HardwarePreset("h200"), run);
  };
  auto saved = [&](const StepCost& s, const std::string& name) {
    for (const SavedTensor& tensor : s.layers[0].saved) {
      if (tensor.name == name) return tensor;
    }
    return SavedTensor{};
  };
  auto copy = [&](const std::string& json) {
    return static_cast<double>(saved(step(json), "attn.o_proj_in").bytes) / t;
  };
  const double hq = 4;
  EXPECT_DOUBLE_EQ(copy(Dense("phi3")), 2 * hq * 64);
  EXPECT_DOUBLE_EQ(copy(Dense("phi3", R"(, "sliding_window": 1024)")), 2 * hq * 64);  // cuDNN
  EXPECT_DOUBLE_EQ(copy(R"({"model_type": "phi3", "hidden_size": 256, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 256,
      "intermediate_size": 512, "vocab_size": 1000, "sliding_window": 1024})"),
                   0);  // masked 256 dims: the memory-efficient kernel
  EXPECT_DOUBLE_EQ(copy(Dense("llama")), 0);
  EXPECT_DOUBLE_EQ(copy(Dense("mistral", R"(, "sliding_window": 1024)")), 0);
  const std::string glm = R"({"model_type": "glm4_moe", "hidden_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
      "intermediate_size": 512, "moe_intermediate_size": 64, "n_routed_experts": 8,
      "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
      "vocab_size": 1000)";
  const StepCost g = step(glm + "}");
  EXPECT_DOUBLE_EQ(static_cast<double>(saved(g, "attn.o_proj_in").bytes) / t, 2 * hq * 64);
  EXPECT_EQ(saved(g, "attn.o_proj_in").module, "");
  EXPECT_EQ(saved(g, "attn.core_out").module, "attn_core");
  const StepCost whole = step(glm + R"(, "partial_rotary_factor": 1.0})");
  EXPECT_DOUBLE_EQ(static_cast<double>(whole.fixed.other) - static_cast<double>(g.fixed.other),
                   2 * 2 * (64 - 32) * t);
}

// Regression: under hf, mla_up_proj claimed to free q, k and kv_b_proj's output, which are the
// attention call's inputs: SDPA keeps them whatever reruns the projections (torch.utils.checkpoint
// cannot drop an output its consumer saved). Megatron's CheckpointWithoutOutput can, so the
// module stays there.
TEST(LayerKinds, HfMlaHasNoUpProjectionModule) {
  const ModelConfig m = Read("deepseek-v2-lite-chat.json");
  RunSettings run;
  run.seq_len = 4096;
  run.cp = run.ep = run.gpus = 1;
  auto names = [&](Framework framework) {
    run.framework = framework;
    run.loss_chunk_tokens = framework == Framework::kHf ? 0 : 8192;
    const StepCost step = *BuildStepCost(m, *HardwarePreset("h200"), run);
    std::vector<std::string> out;
    for (const RecomputeModule& mod : step.layers[1].modules) out.push_back(mod.name);
    return out;
  };
  EXPECT_THAT(names(Framework::kHf), ::testing::Not(::testing::Contains("mla_up_proj")));
  EXPECT_THAT(names(Framework::kHf), ::testing::Contains("attn_core"));
  EXPECT_THAT(names(Framework::kMegatron), ::testing::Contains("mla_up_proj"));
}

// Mllama under hf (Note [hf cross-attention]): a cross-attention layer keeps per vision token
// k_norm's fp32 x, rsqrt and bf16 output and the repeated keys and values, (6 x 2 + 4 x 4) x 64 +
// 4 x 2 bytes, whatever the text length; with --vision-tokens 0 (a text-only step) transformers
// skips it and it keeps nothing; the vision states and masks are fixed memory.
TEST(LayerKinds, HfCrossAttentionAttendsToTheVisionTokens) {
  ModelConfig m = Read("synthetic/mllama-small.json");
  ASSERT_TRUE(m.layers[1].cross_attention);
  ASSERT_EQ(m.vision_tokens, 4 * (32 * 32 + 1));  // MllamaVisionConfig defaults: 448 / 14, 4 tiles
  RunSettings run;
  run.seq_len = 4096;
  run.framework = Framework::kHf;
  run.optimizer = OptimizerKind::kNone;
  run.loss_chunk_tokens = 0;
  run.cp = run.ep = run.gpus = 1;
  // k_norm's tensors and k, v (attn.kv) and the rest of their repeats (attn.kv_repeated, what
  // an attn_core recompute frees).
  auto kv_bytes = [&](const StepCost& s) {
    uint64_t bytes = 0;
    for (const SavedTensor& t : s.layers[1].saved) {
      if (t.name == "attn.kv" || t.name == "attn.kv_repeated") bytes += t.bytes;
    }
    return bytes;
  };
  ASSERT_TRUE(SetVisionTokens(m, 100).ok());
  const StepCost with = *BuildStepCost(m, *HardwarePreset("h200"), run);
  const double hq = 4, hkv = 2, d = 32;  // 128 hidden / 4 heads
  EXPECT_EQ(kv_bytes(with), static_cast<uint64_t>(100 * (6 * hkv * d + 4 * hkv + 4 * hq * d)));
  run.seq_len = 8192;
  EXPECT_EQ(kv_bytes(*BuildStepCost(m, *HardwarePreset("h200"), run)), kv_bytes(with));
  run.seq_len = 4096;
  ASSERT_TRUE(SetVisionTokens(m, 0).ok());
  const StepCost text_only = *BuildStepCost(m, *HardwarePreset("h200"), run);
  EXPECT_EQ(text_only.layers[1].saved_bytes, 0u);
  EXPECT_EQ(text_only.layers[1].forward_seconds, 0.0);
  EXPECT_GT(text_only.layers[0].saved_bytes, 0u);
  // Vision states (2 x 128 per token) and the masks (2 x 4096 per vision token, 2 per text
  // token) held for the step.
  EXPECT_EQ(with.fixed.other - text_only.fixed.other, 100u * 2 * 128 + 2 * 4096 * 100 + 2 * 4096);
  // A model without cross-attention layers refuses the flag.
  ModelConfig llama = Parse(Dense("llama"));
  EXPECT_FALSE(SetVisionTokens(llama, 10).ok());
}

// Llama 4's NoPE layers (every 4th, full span) have no q/k norm under Megatron either:
// Megatron-Bridge's get_llama4_layer_spec adds L2Norm only on RoPE layers. The RoPE layers keep
// the norm's inputs, (4 + 2) heads x (64 x 2 + 4) bytes, the NoPE layers nothing of it.
TEST(LayerKinds, Llama4NopeLayersHaveNoQkNorm) {
  const ModelConfig m = Parse(R"({"architectures": ["Llama4ForCausalLM"], "hidden_size": 256,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
      "intermediate_size": 128, "intermediate_size_mlp": 512, "num_local_experts": 4,
      "num_experts_per_tok": 1, "attention_chunk_size": 2048, "vocab_size": 1000,
      "use_qk_norm": true, "interleave_moe_layer_step": 1})");
  ASSERT_EQ(m.qk_norm, QkNorm::kL2);
  ASSERT_EQ(m.layers[3].span, AttentionSpan::kFull);
  const StepCost s = Step(m);
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.qk_norm_in"), (4 + 2) * (64 * 2 + 4));
  EXPECT_DOUBLE_EQ(PerToken(s, 3, "attn.qk_norm_in"), 0);
  EXPECT_DOUBLE_EQ(LayerPerToken(s, 0) - LayerPerToken(s, 3), (4 + 2) * (64 * 2 + 4));
}

// DeepSeek-V2-Lite: MLA without q-LoRA keeps no q latent (q comes from the normed input,
// already kept); two shared experts are 2 x 1408 wide.
TEST(LayerKinds, MlaWithoutQLoraAndSeveralSharedExperts) {
  const ModelConfig m = Read("deepseek-v2-lite-chat.json");
  ASSERT_EQ(m.q_lora_rank, 0);
  ASSERT_EQ(m.shared_intermediate, 2 * 1408);
  const StepCost s = Step(m);
  EXPECT_DOUBLE_EQ(PerToken(s, 1, "attn.q_latent"), 0);
  EXPECT_DOUBLE_EQ(PerToken(s, 1, "attn.kv_latent"), (2 * 512 + 64) * 2 + 4);  // + rsigma
  // Rerunning the MLA core frees its softmax_lse only (16 heads, fp32): linear_proj keeps the
  // output (Note [megatron profile]).
  uint64_t core_frees = 0;
  for (const RecomputeModule& mod : s.layers[1].modules) {
    if (mod.name == "attn_core") core_frees = mod.saved_bytes;
  }
  EXPECT_EQ(core_frees, 16u * 4 * kSeq);
  // 6 routed experts of 1408 plus the shared 2816: gate/up 2 x (6 x 1408 + 2816) x 2.
  EXPECT_DOUBLE_EQ(PerToken(s, 1, "moe.gate_up"), 2 * (6 * 1408 + 2816) * 2);
}

// GLM-5 (glm_moe_dsa): the DSA indexer on MLA keeps its q/k (bf16) and head weights (fp32), and
// the top-k indices (int32) per query.
TEST(LayerKinds, DsaIndexerOnMla) {
  const ModelConfig m = Read("glm-5.1.json");
  ASSERT_EQ(m.layers[0].attention, AttentionKind::kDsa);
  const StepCost s = Step(m);
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.index_qk"), (32 * 128 + 128) * 2 + 32 * 4);
  EXPECT_DOUBLE_EQ(PerToken(s, 0, "attn.topk_indices"), 2048 * 4);
  // Indexer parameters: wq_b (q_lora 2048 -> 32 x 128), wk (6144 -> 128), k_norm (LayerNorm
  // 128: weight and bias), weights_proj (6144 -> 32).
  ModelConfig mla = m;
  LayerSpec plain = m.layers[0];
  plain.attention = AttentionKind::kMla;
  EXPECT_EQ(DenseLayerParams(m, m.layers[0]) - DenseLayerParams(mla, plain),
            2048u * 32 * 128 + 6144 * 128 + 2 * 128 + 6144 * 32);
}

// DeepSeek-V3 / GLM: the MTP module's weights, gradients and optimizer state are fixed memory.
TEST(LayerKinds, MtpModuleIsInFixedMemory) {
  ModelConfig m = *ModelPreset("deepseek-v3");
  ASSERT_EQ(m.mtp_layers, 1);
  RunSettings run;
  run.seq_len = 4096;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 1;
  run.sharding = Sharding::kNoShard;
  const StepCost with = *BuildStepCost(m, *HardwarePreset("h200"), run);
  EXPECT_EQ(with.model_parameters, ModelParameters(m));
  EXPECT_NEAR(static_cast<double>(with.fixed.weights), 2.0 * ModelParameters(m), 8.0);
  m.mtp_layers = 0;
  const StepCost without = *BuildStepCost(m, *HardwarePreset("h200"), run);
  const double mtp = static_cast<double>(MtpDenseParams(*ModelPreset("deepseek-v3")) +
                                         MtpRoutedExpertParams(*ModelPreset("deepseek-v3")));
  EXPECT_NEAR(static_cast<double>(with.fixed.weights - without.fixed.weights), 2 * mtp, 8.0);
}

// transformers drops the MTP weights on load and never runs the module (Note [MTP layers] in
// planner/frameworks/megatron.cc): under the hf recipe the fixed memory holds none of it, though
// the model's parameter count still names it.
TEST(LayerKinds, MtpModuleIsNotLoadedByTransformers) {
  ModelConfig m = Read("glm-5.1.json");
  ASSERT_EQ(m.mtp_layers, 1);
  RunSettings run;
  run.seq_len = 4096;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 1;
  run.sharding = Sharding::kNoShard;
  run.framework = Framework::kHf;
  run.loss_chunk_tokens = 0;
  const StepCost with = *BuildStepCost(m, *HardwarePreset("h200"), run);
  EXPECT_EQ(with.model_parameters, ModelParameters(m));
  const double mtp = static_cast<double>(MtpDenseParams(m) + MtpRoutedExpertParams(m));
  EXPECT_NEAR(static_cast<double>(with.fixed.weights), 2.0 * (ModelParameters(m) - mtp), 8.0);
  m.mtp_layers = 0;
  const StepCost without = *BuildStepCost(m, *HardwarePreset("h200"), run);
  EXPECT_EQ(with.fixed.weights, without.fixed.weights);
  EXPECT_EQ(with.layers.size(), without.layers.size());
}

// transformers runs an FFN over every token at once: under the hf recipe no option chunks it,
// and a plan that must squeeze memory still never picks ffn_chunks > 1 (it chose 2-8 before,
// below what the real code holds).
TEST(LayerKinds, HfLayersAreNeverChunked) {
  const ModelConfig m = Read("mistral-7b-v0.3.json");
  RunSettings run;
  run.seq_len = 16384;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 1;
  run.sharding = Sharding::kNoShard;
  run.framework = Framework::kHf;
  run.loss_chunk_tokens = 0;
  const StepCost hf = *BuildStepCost(m, *HardwarePreset("h200"), run);
  for (const LayerCost& l : hf.layers) {
    EXPECT_FALSE(l.ffn_chunkable);
    for (const LayerOption& o : AllOptions(l, {1, 2, 4, 8})) EXPECT_EQ(o.chunks, 1);
  }
  OptimizerOptions o;
  o.gpu_budget_bytes = MinimumPeak(hf, o).min_peak_bytes + (1ull << 30);
  o.host_budget_bytes = 0;
  const OptimizeResult r = Optimize(hf, o);
  ASSERT_TRUE(r.feasible) << r.explanation;
  for (const LayerOption& option : r.schedule.options) EXPECT_EQ(option.chunks, 1);
  // The megatron recipe keeps its chunked options.
  run.framework = Framework::kMegatron;
  const StepCost megatron = *BuildStepCost(m, *HardwarePreset("h200"), run);
  EXPECT_EQ(AllOptions(megatron.layers[0], {1, 2}).size(),
            2 * AllOptions(megatron.layers[0], {1}).size());
}

// Mllama: cross-attention layers carry q/k norms and two scalar gates.
TEST(LayerKinds, CrossAttentionLayerParameters) {
  const ModelConfig m = Read("synthetic/mllama-small.json");
  ASSERT_TRUE(m.layers[1].cross_attention);
  ASSERT_FALSE(m.layers[0].cross_attention);
  EXPECT_EQ(m.layers[1].TypeName(), "cross_attention+dense_ffn");
  EXPECT_EQ(DenseLayerParams(m, m.layers[1]) - DenseLayerParams(m, m.layers[0]),
            2u * m.head_dim + 2);
}

}  // namespace
}  // namespace stowage::planner
