// NormWorkOf and LinearAttentionWorkOf (planner/frameworks/) against the real transformers
// modules' measured work (tests/planner/data/hf_norm_work.json and
// hf_linear_attention_work.json, which tests/python/measure/test_hf_norm_work.py and
// test_hf_linear_attention_work.py measure on the real modules): each family's norm and
// linear-attention mixer costs what its code runs.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "planner/frameworks/hf.h"
#include "planner/model/model.h"

namespace stowage::planner {
namespace {

TEST(HfNormWork, EachFamilysNormCostsWhatTheRealModuleMeasures) {
  std::ifstream in(std::string(STOWAGE_SOURCE_DIR) + "/tests/planner/data/hf_norm_work.json");
  ASSERT_TRUE(in) << "tests/planner/data/hf_norm_work.json";
  const nlohmann::json data = nlohmann::json::parse(in);
  int rows = 0;
  for (const nlohmann::json& row : data.at("norms")) {
    ModelConfig m;
    m.family = row.at("family").get<std::string>();
    SCOPED_TRACE(m.family + " (" + row.at("class").get<std::string>() + ")");
    const HfNormWork w = NormWorkOf(m);
    EXPECT_EQ(w.fwd, row.at("forward_bytes").get<double>());
    EXPECT_EQ(w.bwd, row.at("backward_bytes").get<double>());
    EXPECT_EQ(w.fwd_kernels, row.at("forward_kernels").get<double>());
    EXPECT_EQ(w.bwd_kernels, row.at("backward_kernels").get<double>());
    ++rows;
  }
  EXPECT_GE(rows, 3);  // a row of each kind of norm code at least
}

// The gated DeltaNet / KDA mixers through transformers' torch fallbacks
// (Note [hf linear attention work]): bytes, kernels and the chunk loops' GEMM FLOPs, forward and
// backward, exactly.
TEST(HfLinearAttentionWork, EachMixerCostsWhatTheRealFallbackMeasures) {
  std::ifstream in(std::string(STOWAGE_SOURCE_DIR) +
                   "/tests/planner/data/hf_linear_attention_work.json");
  ASSERT_TRUE(in) << "tests/planner/data/hf_linear_attention_work.json";
  const nlohmann::json data = nlohmann::json::parse(in);
  int rows = 0;
  for (const nlohmann::json& row : data.at("mixers")) {
    const nlohmann::json& c = row.at("config");
    ModelConfig m;
    m.family = c.at("model_type").get<std::string>();
    m.hidden = c.at("hidden_size").get<int>();
    m.short_conv_kernel = c.at("linear_conv_kernel_dim").get<int>();
    AttentionKind kind = AttentionKind::kGdn;
    if (m.family == "kimi_linear") {
      kind = AttentionKind::kKda;
      m.linear_heads = c.at("linear_num_heads").get<int>();
      m.linear_head_dim = c.at("linear_head_dim").get<int>();
    } else {
      m.gdn_key_heads = c.at("linear_num_key_heads").get<int>();
      m.gdn_value_heads = c.at("linear_num_value_heads").get<int>();
      m.gdn_key_head_dim = c.at("linear_key_head_dim").get<int>();
      m.gdn_value_head_dim = c.at("linear_value_head_dim").get<int>();
    }
    const double seq_len = row.at("seq_len").get<double>();
    SCOPED_TRACE(m.family + " at " + std::to_string(seq_len) + " tokens");
    const HfLinearAttentionWork w = LinearAttentionWorkOf(m, kind, seq_len);
    EXPECT_EQ(w.fwd_bytes, row.at("forward_bytes").get<double>());
    EXPECT_EQ(w.bwd_bytes, row.at("backward_bytes").get<double>());
    EXPECT_EQ(w.fwd_kernels, row.at("forward_kernels").get<double>());
    EXPECT_EQ(w.bwd_kernels, row.at("backward_kernels").get<double>());
    EXPECT_EQ(w.fwd_fp32_gemm_flops, row.at("forward_fp32_gemm_flops").get<double>());
    EXPECT_EQ(w.bwd_fp32_gemm_flops, row.at("backward_fp32_gemm_flops").get<double>());
    ++rows;
  }
  EXPECT_GE(rows, 6);  // each mixer's code at two paddings
}

}  // namespace
}  // namespace stowage::planner
