#include "planner/model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace stowage::planner {
namespace {

using ::testing::HasSubstr;

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

TEST(HfConfig, NestedTextConfigIsRead) {
  auto m = ParseHfConfigJson(R"({"model_type": "some_vlm", "vision_config": {},
      "text_config": {"model_type": "qwen2", "hidden_size": 1024, "vocab_size": 1000,
      "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 4096}})",
                             "vlm");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->hidden, 1024);
  EXPECT_EQ(m->num_layers(), 2);
}

TEST(HfConfig, ErrorsNameTheField) {
  EXPECT_THAT(ParseHfConfigJson(R"({"model_type": "gpt2"})", "x").status().message(),
              HasSubstr("'model_type' is 'gpt2'; supported: llama"));
  EXPECT_THAT(ParseHfConfigJson(R"({"hidden_size": 1})", "x").status().message(),
              HasSubstr("missing field 'model_type'"));
  EXPECT_THAT(ParseHfConfigJson(R"({"model_type": "llama", "hidden_size": 4096,
      "num_hidden_layers": 2})",
                                "x")
                  .status()
                  .message(),
              HasSubstr("missing field 'vocab_size'"));
  EXPECT_THAT(ParseHfConfigJson(R"({"model_type": "llama", "hidden_size": "big",
      "vocab_size": 10, "num_hidden_layers": 2})",
                                "x")
                  .status()
                  .message(),
              HasSubstr("'hidden_size' is \"big\""));
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
  EXPECT_FALSE(ReadHfConfigFile(kDataDir + "no-such-config.json").ok());
}

}  // namespace
}  // namespace stowage::planner
