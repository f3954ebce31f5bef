#include "planner/model/model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stowage::planner {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kDataDir = std::string(STOWAGE_SOURCE_DIR) + "/tests/planner/data/";

TEST(ModelPreset, EveryPresetIsValid) {
  for (const std::string& name : ModelPresetNames()) {
    auto m = ModelPreset(name);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status();
    EXPECT_TRUE(ValidateModel(*m).ok()) << name;
    EXPECT_EQ(m->name, name);
  }
  EXPECT_THAT(ModelPreset("gpt-5").status().message(), HasSubstr("allowed: glm-5.3-flash"));
}

TEST(ModelPreset, GlmFlashHasTheReferenceLayout) {
  const ModelConfig m = *ModelPreset("glm-5.3-flash");
  ASSERT_EQ(m.num_layers(), 45);
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.hc_mult, 4);
  int dsa = 0, kda = 0, dense = 0, moe = 0;
  for (const LayerSpec& l : m.layers) {
    dsa += l.attention == AttentionKind::kDsa;
    kda += l.attention == AttentionKind::kKda;
    dense += l.ffn == FfnKind::kDense;
    moe += l.ffn == FfnKind::kMoe;
  }
  EXPECT_EQ(dsa, 11);
  EXPECT_EQ(kda, 34);
  EXPECT_EQ(dense, 3);
  EXPECT_EQ(moe, 42);
  EXPECT_EQ(m.layers[3].TypeName(), "dsa+moe");
  EXPECT_EQ(m.layers[0].TypeName(), "kda+dense_ffn");
}

// The compiled-in preset and the reference config.json must describe the same model.
TEST(HfConfig, ReferenceGlmConfigMatchesThePreset) {
  auto parsed = ReadHfConfigFile(kDataDir + "glm-5.3-flash.config.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const ModelConfig preset = *ModelPreset("glm-5.3-flash");
  ASSERT_EQ(parsed->num_layers(), preset.num_layers());
  for (int i = 0; i < preset.num_layers(); ++i) {
    EXPECT_EQ(parsed->layers[i].TypeName(), preset.layers[i].TypeName()) << "layer " << i;
    EXPECT_EQ(DenseLayerParams(*parsed, parsed->layers[i]),
              DenseLayerParams(preset, preset.layers[i]));
    EXPECT_EQ(RoutedExpertParams(*parsed, parsed->layers[i]),
              RoutedExpertParams(preset, preset.layers[i]));
  }
  EXPECT_EQ(parsed->hc_mult, 4);
  EXPECT_EQ(parsed->index_topk, 2048);
  EXPECT_EQ(parsed->linear_heads, 64);
}

TEST(HfConfig, DenseFamilies) {
  for (const char* family : {"llama", "qwen2", "qwen3"}) {
    auto m = ParseHfConfigJson(absl::StrCat(R"({"model_type": ")", family, R"(",
        "hidden_size": 4096, "vocab_size": 128256, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336})"),
                               family);
    ASSERT_TRUE(m.ok()) << family << ": " << m.status();
    EXPECT_EQ(m->num_layers(), 32);
    EXPECT_EQ(m->head_dim, 128);  // hidden / heads when absent
    EXPECT_EQ(m->layers[5].TypeName(), "attention+dense_ffn");
  }
}

TEST(HfConfig, MoeFamilies) {
  auto qwen = ParseHfConfigJson(R"({"model_type": "qwen3_moe", "hidden_size": 2048,
      "vocab_size": 151936, "num_hidden_layers": 48, "num_attention_heads": 32,
      "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
      "moe_intermediate_size": 768, "decoder_sparse_step": 1, "mlp_only_layers": [0],
      "intermediate_size": 6144})",
                                "q");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->layers[0].TypeName(), "attention+dense_ffn");
  EXPECT_EQ(qwen->layers[1].TypeName(), "attention+moe");

  auto mixtral = ParseHfConfigJson(R"({"model_type": "mixtral", "hidden_size": 4096,
      "vocab_size": 32000, "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
      "intermediate_size": 14336})",
                                   "m");
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(mixtral->moe_intermediate, 14336);
  EXPECT_EQ(mixtral->layers[0].TypeName(), "attention+moe");

  auto ds = ParseHfConfigJson(R"({"model_type": "deepseek_v3", "hidden_size": 7168,
      "vocab_size": 129280, "num_hidden_layers": 61, "num_attention_heads": 128,
      "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "intermediate_size": 18432, "n_routed_experts": 256,
      "num_experts_per_tok": 8, "n_shared_experts": 1, "moe_intermediate_size": 2048,
      "first_k_dense_replace": 3})",
                              "d");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->layers[2].TypeName(), "mla+dense_ffn");
  EXPECT_EQ(ds->layers[3].TypeName(), "mla+moe");
  const ModelConfig preset = *ModelPreset("deepseek-v3");
  EXPECT_EQ(DenseLayerParams(*ds, ds->layers[10]), DenseLayerParams(preset, preset.layers[10]));
}

TEST(HfConfig, NestedTextConfigIsReadAndSaidSo) {
  auto m = ParseHfConfigJson(R"({"model_type": "some_vlm", "vision_config": {},
      "text_config": {"model_type": "qwen2", "hidden_size": 1024, "vocab_size": 1000,
      "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8,
      "intermediate_size": 4096}})",
                             "vlm");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->hidden, 1024);
  EXPECT_EQ(m->num_layers(), 2);
  EXPECT_EQ(m->family, "qwen2");
  EXPECT_THAT(absl::StrJoin(m->notes, "\n"),
              HasSubstr("only the text decoder (text_config, qwen2) is planned"));
  EXPECT_THAT(absl::StrJoin(m->notes, "\n"), HasSubstr("from text_config.model_type 'qwen2'"));
}

// Kimi-K2 is DeepSeek-V3's graph under model_type kimi_k2; the architecture decides.
TEST(HfConfig, ArchitectureDecidesTheFamily) {
  auto kimi = ReadHfConfigFile(kDataDir + "hf/kimi-k2-instruct.json");
  ASSERT_TRUE(kimi.ok()) << kimi.status();
  EXPECT_EQ(kimi->family, "deepseek_v3");
  EXPECT_THAT(absl::StrJoin(kimi->notes, "\n"),
              HasSubstr("from architectures[0] 'DeepseekV3ForCausalLM'"));
  EXPECT_THAT(absl::StrJoin(kimi->notes, "\n"), HasSubstr("quantization_config (fp8)"));
  EXPECT_EQ(kimi->layers[0].TypeName(), "mla+dense_ffn");
  EXPECT_EQ(kimi->layers[1].TypeName(), "mla+moe");
  EXPECT_EQ(kimi->q_lora_rank, 1536);

  auto mistral = ReadHfConfigFile(kDataDir + "hf/mistral-7b-v0.3.json");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->family, "mistral");
  // sliding_window: null is transformers' None: every layer attends to the whole sequence.
  EXPECT_EQ(mistral->layers[0].TypeName(), "attention+dense_ffn");
}

TEST(HfConfig, EveryReferenceConfigIsAccepted) {
  for (const char* name : {"deepseek-v2-lite-chat", "gemma-2-9b", "gemma-3-1b-it", "glm-4.5-fp8",
                           "glm-5.1", "gpt-oss-20b", "kimi-k2-instruct", "llama-4-scout",
                           "mistral-7b-v0.3", "olmo-3.1-32b-instruct", "phi-4", "qwen3-vl-8b"}) {
    auto m = ReadHfConfigFile(absl::StrCat(kDataDir, "hf/", name, ".json"));
    EXPECT_TRUE(m.ok()) << name << ": " << m.status();
  }
}

// Layer placement follows each family's configuration class (layer_types, or its rule).
TEST(HfConfig, SlidingChunkedAndInterleavedLayersAreWhereTheConfigSays) {
  auto gemma2 = *ReadHfConfigFile(kDataDir + "hf/gemma-2-9b.json");
  EXPECT_EQ(gemma2.layers[0].TypeName(), "sliding_attention+dense_ffn");
  EXPECT_EQ(gemma2.layers[1].TypeName(), "attention+dense_ffn");
  EXPECT_EQ(gemma2.sliding_window, 4096);
  EXPECT_EQ(gemma2.norms_per_layer, 4);
  EXPECT_DOUBLE_EQ(gemma2.final_logit_softcap, 30.0);
  EXPECT_TRUE(gemma2.tied_embeddings);  // Gemma2Config's default, named in the notes
  EXPECT_THAT(absl::StrJoin(gemma2.notes, "\n"),
              HasSubstr("Gemma2Config defaults: tie_word_embeddings=true"));

  auto gemma3 = *ReadHfConfigFile(kDataDir + "hf/gemma-3-1b-it.json");  // pattern 6
  for (int i = 0; i < gemma3.num_layers(); ++i) {
    EXPECT_EQ(gemma3.layers[i].span,
              (i + 1) % 6 == 0 ? AttentionSpan::kFull : AttentionSpan::kSliding)
        << i;
  }
  EXPECT_EQ(gemma3.qk_norm, QkNorm::kPerHead);

  auto olmo = *ReadHfConfigFile(kDataDir + "hf/olmo-3.1-32b-instruct.json");
  EXPECT_EQ(olmo.layers[3].span, AttentionSpan::kFull);
  EXPECT_EQ(olmo.layers[4].span, AttentionSpan::kSliding);
  EXPECT_EQ(olmo.qk_norm, QkNorm::kWhole);

  auto oss = *ReadHfConfigFile(kDataDir + "hf/gpt-oss-20b.json");
  EXPECT_EQ(oss.layers[0].TypeName(), "sliding_attention+moe");
  EXPECT_EQ(oss.layers[1].TypeName(), "attention+moe");
  EXPECT_TRUE(oss.attention_sinks);
  EXPECT_TRUE(oss.router_bias);
  EXPECT_TRUE(oss.expert_bias);
  EXPECT_EQ(oss.sliding_window, 128);

  auto scout = *ReadHfConfigFile(kDataDir + "hf/llama-4-scout.json");
  EXPECT_EQ(scout.family, "llama4_text");
  EXPECT_EQ(scout.layers[0].TypeName(), "chunked_attention+moe");
  EXPECT_EQ(scout.layers[3].TypeName(), "attention+moe");  // every 4th layer: NoPE, global
  EXPECT_EQ(scout.attention_chunk, 8192);
  EXPECT_EQ(scout.shared_intermediate, 8192);

  // Llama 4 Maverick-style interleaving: MoE every second layer, dense MLP in between.
  auto maverick = ParseHfConfigJson(R"({"architectures": ["Llama4ForCausalLM"],
      "model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 4,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100,
      "intermediate_size": 32, "intermediate_size_mlp": 128, "num_local_experts": 4,
      "num_experts_per_tok": 1, "interleave_moe_layer_step": 2})",
                                    "maverick");
  ASSERT_TRUE(maverick.ok()) << maverick.status();
  EXPECT_EQ(maverick->layers[0].ffn, FfnKind::kDense);
  EXPECT_EQ(maverick->layers[1].ffn, FfnKind::kMoe);
  EXPECT_EQ(maverick->layers[3].ffn, FfnKind::kMoe);
  EXPECT_EQ(maverick->intermediate, 128);

  auto next = *ReadHfConfigFile(kDataDir + "hf/synthetic/qwen3-next-small.json");
  EXPECT_EQ(next.layers[0].TypeName(), "gdn+moe");
  EXPECT_EQ(next.layers[1].TypeName(), "gdn+dense_ffn");  // mlp_only_layers [1]
  EXPECT_EQ(next.layers[3].TypeName(), "attention+moe");  // full_attention_interval 4
  EXPECT_TRUE(next.attention_output_gate);

  auto kimi_linear = *ReadHfConfigFile(kDataDir + "hf/synthetic/kimi-linear-small.json");
  EXPECT_EQ(kimi_linear.layers[0].TypeName(), "kda+dense_ffn");
  EXPECT_EQ(kimi_linear.layers[4].TypeName(), "mla+moe");
  EXPECT_EQ(kimi_linear.q_lora_rank, 0);  // null: q projected straight from the hidden state
}

// Moonshot's checkpoints carry KDA in linear_attn_config (1-based layer lists, heads, head_dim,
// conv kernel) and spell the MoE fields by KimiLinearConfig's attribute_map; transformers reads
// both (KimiLinearConfig.__post_init__), so the reader does too.
TEST(HfConfig, KimiLinearCheckpointLayout) {
  auto m = ReadHfConfigFile(kDataDir + "hf/synthetic/kimi-linear-checkpoint-small.json");
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<std::string> types;
  for (const LayerSpec& l : m->layers) types.push_back(l.TypeName());
  EXPECT_EQ(absl::StrJoin(types, " "),
            "kda+dense_ffn kda+moe mla+moe kda+moe kda+moe mla+moe");  // full_attn_layers [3, 6]
  EXPECT_EQ(m->linear_heads, 6);
  EXPECT_EQ(m->linear_head_dim, 24);
  EXPECT_EQ(m->short_conv_kernel, 3);
  EXPECT_EQ(m->experts, 8);                   // num_experts
  EXPECT_EQ(m->experts_per_token, 2);         // num_experts_per_token
  EXPECT_EQ(m->shared_intermediate, 2 * 64);  // num_shared_experts x moe_intermediate_size
  EXPECT_THAT(absl::StrJoin(m->notes, "\n"), Not(HasSubstr("num_local_experts")));

  const auto parse = [](const std::string& fields) {
    return ParseHfConfigJson(absl::StrCat(R"({"model_type": "kimi_linear", "hidden_size": 64,
        "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 100,
        "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, )",
                                          fields, "}"),
                             "kimi");
  };
  auto both = parse(R"("num_experts": 8, "num_local_experts": 16)");
  EXPECT_THAT(std::string(both.status().message()),
              HasSubstr("one of 'num_local_experts' and 'num_experts', or both equal"));
  EXPECT_TRUE(parse(R"("num_experts": 8, "num_local_experts": 8)").ok());
  auto twice =
      parse(R"("linear_attn_config": {"full_attn_layers": [2, 4], "kda_layers": [1, 2, 3]})");
  EXPECT_THAT(std::string(twice.status().message()),
              HasSubstr("linear_attn_config.kda_layers[1]' lists layer 2 again"));
  auto missing = parse(R"("linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2]})");
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("layer 3 is in neither"));
  auto range = parse(R"("linear_attn_config": {"full_attn_layers": [5], "kda_layers": [1, 2, 3]})");
  EXPECT_THAT(std::string(range.status().message()), HasSubstr("full_attn_layers[0]"));
}

TEST(HfConfig, MtpModulesAreCounted) {
  auto glm = *ReadHfConfigFile(kDataDir + "hf/glm-5.1.json");
  EXPECT_EQ(glm.mtp_layers, 1);
  EXPECT_EQ(glm.layers.back().TypeName(), "dsa+moe");
  const uint64_t h = glm.hidden;
  EXPECT_EQ(MtpDenseParams(glm), 3 * h + 2 * h * h + DenseLayerParams(glm, glm.layers.back()));
  EXPECT_EQ(MtpRoutedExpertParams(glm), RoutedExpertParams(glm, glm.layers.back()));
  uint64_t layers = 0;
  for (const LayerSpec& l : glm.layers) {
    layers += DenseLayerParams(glm, l) + RoutedExpertParams(glm, l);
  }
  EXPECT_EQ(ModelParameters(glm),
            EmbeddingParams(glm) + layers + MtpDenseParams(glm) + MtpRoutedExpertParams(glm));
  // The published 753.9B includes the MTP module; the main model alone is ~744B.
  EXPECT_NEAR(static_cast<double>(ModelParameters(glm)), 753.9e9, 0.05e9);
}

// Presets are published config.json numbers; their counts against the published totals.
TEST(ModelPreset, ParameterCountsMatchThePublishedOnes) {
  const std::pair<const char*, double> kPublished[] = {
      {"llama-3.1-8b", 8.03e9},
      {"llama-3.1-70b", 70.55e9},
      {"llama-3.1-405b", 405.85e9},
      {"qwen3-8b", 8.19e9},
      {"qwen3-32b", 32.76e9},
      {"qwen3-30b-a3b", 30.53e9},
      {"qwen3-235b-a22b", 235.09e9},
      {"kimi-k2", 1026.41e9},
      {"gpt-oss-120b", 116.83e9},
      {"mixtral-8x22b", 140.63e9},
      {"glm-4.5", 356.79e9},
      // 671B main model + the MTP module's 11.6B (its published 14B counts its own copies of
      // the embedding and head, which training shares with the main model).
      {"deepseek-v3", 682.64e9}};
  for (const auto& [name, published] : kPublished) {
    auto m = ModelPreset(name);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status();
    EXPECT_NEAR(static_cast<double>(ModelParameters(*m)) / published, 1.0, 1e-3) << name;
  }
}

TEST(HfConfig, ListModelsNamesFamiliesAliasesAndPresets) {
  const std::string text = ListModelsText();
  EXPECT_THAT(text, HasSubstr("deepseek_v3: DeepseekV3ForCausalLM, kimi_k2"));
  EXPECT_THAT(text, HasSubstr("llama4_text: Llama4ForCausalLM, Llama4ForConditionalGeneration"));
  EXPECT_THAT(text, HasSubstr("gpt-oss-120b (gpt_oss): 116.83B"));
}

// Numbers are read strictly, syntax errors say where.
TEST(HfConfig, NumbersAreStrict) {
  auto with = [](const std::string& field, const std::string& value) {
    std::string base = R"({"model_type": "llama", "hidden_size": 4096, "vocab_size": 1000,
        "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 14336})";
    const size_t at = base.find(absl::StrCat("\"", field, "\""));
    const size_t colon = base.find(':', at);
    const size_t end = base.find_first_of(",}", colon);
    base.replace(colon + 1, end - colon - 1, value);
    return ParseHfConfigJson(base, "x").status();
  };
  // 2^32 + 4096 once planned as 4096; 2^32 + 2 layers as 2.
  EXPECT_THAT(with("hidden_size", "4294971392").message(),
              HasSubstr("field 'hidden_size' has value 4294971392; allowed: an integer in [1, "));
  EXPECT_THAT(with("num_hidden_layers", "4294967298").message(),
              HasSubstr("field 'num_hidden_layers' has value 4294967298"));
  // Regression: the reader took up to 65,536 layers and the cost model then refused anything over
  // its 10,000; one limit (kMaxLayers) now holds for both, named by the reader.
  EXPECT_THAT(with("num_hidden_layers", "20000").message(),
              HasSubstr("field 'num_hidden_layers' has value 20000; allowed: an integer in [1, "
                        "10000]"));
  EXPECT_THAT(with("num_attention_heads", "-8").message(), HasSubstr("has value -8"));
  EXPECT_THAT(with("intermediate_size", "1.5").message(), HasSubstr("has value 1.5"));
  EXPECT_THAT(with("vocab_size", "true").message(), HasSubstr("has value true"));
  EXPECT_THAT(with("vocab_size", "\"big\"").message(), HasSubstr("has value \"big\""));
  EXPECT_TRUE(with("vocab_size", "1000").ok());
  EXPECT_THAT(
      ParseHfConfigJson("{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 4096,,\n}", "x")
          .status()
          .message(),
      HasSubstr("not valid JSON at line 3, column"));
  EXPECT_THAT(ParseHfConfigJson("[1, 2]", "x").status().message(),
              HasSubstr("expected a JSON object"));
  auto nested = ParseHfConfigJson(R"({"architectures": ["Qwen3VLForConditionalGeneration"],
      "text_config": {"hidden_size": -1}})",
                                  "vl");
  EXPECT_THAT(nested.status().message(), HasSubstr("field 'text_config.hidden_size' has value -1"));
}

TEST(HfConfig, ErrorsNameTheArchitectureTheFieldAndTheSupportedList) {
  EXPECT_THAT(ParseHfConfigJson(R"({"model_type": "gpt2"})", "x").status().message(),
              HasSubstr("unsupported model: 'gpt2' (model_type); supported families: llama"));
  EXPECT_THAT(ParseHfConfigJson(R"({"architectures": ["FalconForCausalLM"],
      "model_type": "falcon"})",
                                "x")
                  .status()
                  .message(),
              HasSubstr("architecture 'FalconForCausalLM' (architectures[0]), 'falcon' "
                        "(model_type); supported families:"));
  EXPECT_THAT(ParseHfConfigJson(R"({"model_type": "fancy_vlm",
      "text_config": {"model_type": "fancy_text"}})",
                                "x")
                  .status()
                  .message(),
              HasSubstr("'fancy_text' (text_config.model_type), 'fancy_vlm' (model_type)"));
  EXPECT_THAT(ParseHfConfigJson(R"({"hidden_size": 1})", "x").status().message(),
              HasSubstr("missing fields 'architectures' and 'model_type'"));
  // An explicit null is transformers' None, not its default.
  EXPECT_THAT(ParseHfConfigJson(R"({"model_type": "llama", "hidden_size": 4096,
      "vocab_size": null, "num_hidden_layers": 2})",
                                "x")
                  .status()
                  .message(),
              HasSubstr("missing field 'vocab_size'"));
  // glm5_next without its linear-attention block.
  EXPECT_THAT(ParseHfConfigJson(R"({"model_type": "glm5_next", "hidden_size": 64,
      "vocab_size": 10, "num_hidden_layers": 1, "num_attention_heads": 4, "kv_lora_rank": 8,
      "qk_nope_head_dim": 8, "qk_rope_head_dim": 0, "v_head_dim": 8, "intermediate_size": 128,
      "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
      "layer_types": ["linear_attention"]})",
                                "x")
                  .status()
                  .message(),
              HasSubstr("missing field 'linear_attn_config'"));
  EXPECT_THAT(ParseHfConfigJson(R"({"model_type": "gemma2", "layer_types": ["sliding"],
      "num_hidden_layers": 1})",
                                "x")
                  .status()
                  .message(),
              HasSubstr("field 'layer_types[0]' has value \"sliding\"; allowed: full_attention"));
  EXPECT_FALSE(ReadHfConfigFile(kDataDir + "no-such-config.json").ok());
}

// Note [hf partial rotary]: the rotated width of the families whose apply_rotary_pos_emb cats
// (ReadRotaryDim): the RoPE dict first (rope_scaling when given, else rope_parameters), then the
// top-level field, then the class default; other families rotate the whole head (0).
TEST(HfConfig, PartialRotaryFactorWhereTransformersReadsIt) {
  auto rotary = [](const std::string& family, const std::string& extra) {
    auto m = ParseHfConfigJson(absl::StrCat(R"({"model_type": ")", family, R"(",
        "hidden_size": 1024, "vocab_size": 1000, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
        "intermediate_size": 2048, "moe_intermediate_size": 64, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "num_experts": 4)",
                                            extra, "}"),
                               family);
    EXPECT_TRUE(m.ok()) << family << " " << extra << ": " << m.status();
    return m.ok() ? m->rotary_dim : -1;
  };
  EXPECT_EQ(rotary("glm4_moe", ""), 64);  // Glm4MoeConfig's 0.5
  EXPECT_EQ(rotary("phi3", ""), 128);     // Phi3Config's 1.0: still the cat form
  EXPECT_EQ(rotary("qwen3_next", ""), 32);
  EXPECT_EQ(rotary("glm4_moe", R"(, "partial_rotary_factor": 0.25)"), 32);
  EXPECT_EQ(rotary("glm4_moe", R"(, "partial_rotary_factor": 0.25,
      "rope_parameters": {"rope_theta": 10000, "partial_rotary_factor": 0.75})"),
            96);
  // `rope_scaling or rope_parameters`: a given rope_scaling replaces the other dict.
  EXPECT_EQ(rotary("glm4_moe", R"(, "rope_scaling": {"rope_type": "default"},
      "rope_parameters": {"partial_rotary_factor": 0.75})"),
            64);
  EXPECT_EQ(rotary("glm4_moe", R"(, "rope_scaling": null,
      "rope_parameters": {"partial_rotary_factor": 0.75})"),
            96);
  EXPECT_EQ(rotary("llama", R"(, "partial_rotary_factor": 0.5)"), 0);
  EXPECT_EQ(ReadHfConfigFile(kDataDir + "hf/glm-4.5-fp8.json")->rotary_dim, 64);
  EXPECT_EQ(ReadHfConfigFile(kDataDir + "hf/phi-4.json")->rotary_dim, 128);
  auto bad = [](const std::string& extra) {
    return std::string(ParseHfConfigJson(absl::StrCat(R"({"model_type": "glm4_moe",
        "hidden_size": 1024, "vocab_size": 1000, "num_hidden_layers": 2,
        "num_attention_heads": 8, "head_dim": 128, "intermediate_size": 2048,
        "moe_intermediate_size": 64, "n_routed_experts": 4, "num_experts_per_tok": 2)",
                                                      extra, "}"),
                                         "x")
                           .status()
                           .message());
  };
  EXPECT_THAT(
      bad(R"(, "partial_rotary_factor": 1.5)"),
      HasSubstr("field 'partial_rotary_factor' has value 1.5; allowed: a finite number in [0, 1]"));
  EXPECT_THAT(bad(R"(, "rope_parameters": {"partial_rotary_factor": 0.001})"),
              HasSubstr("field 'rope_parameters.partial_rotary_factor' has value 0.001, which "
                        "rotates int(head_dim 128 x 0.001) = 0 dims"));
}

// A sparse nested config takes what transformers would fill in, and says which fields.
TEST(HfConfig, SparseConfigsTakeTransformersDefaults) {
  auto m = ReadHfConfigFile(kDataDir + "hf/synthetic/qwen3-vl-moe-sparse.json");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string notes = absl::StrJoin(m->notes, "\n");
  EXPECT_THAT(notes, HasSubstr("Qwen3VLMoeTextConfig defaults: "));
  EXPECT_THAT(notes, HasSubstr("decoder_sparse_step=1"));
  // The wrapper's own tie_word_embeddings (false) wins over the text class default (true).
  EXPECT_FALSE(m->tied_embeddings);
  EXPECT_THAT(notes, Not(HasSubstr("tie_word_embeddings=")));
}

}  // namespace
}  // namespace stowage::planner
