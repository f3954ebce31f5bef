// Note [Routing kernels] and Note [hf transformers versions] (planner/frameworks/hf_ffn.cc): the
// routed-expert block's sort, index_put, top-k and histc kernels as torch 2.11 runs them, and
// transformers 5.17's EP-sentinel masks. stowage/hf_profile.py counts the same numbers for the
// same aten ops (tests/python/measure/ KernelBytesTest pins them there).
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "planner/cost/cost_model.h"
#include "planner/frameworks/hf.h"
#include "planner/frameworks/step_cost.h"

namespace stowage::planner {
namespace {

TEST(HfRouting, RadixSortPassesOverTheBitsItIsGiven) {
  // torch.sort of int64 keys: every bit, 8 passes of keys and int64 values read and written, the
  // histogram's read of the keys; 2 memsets, histogram, exclusive sum, and a memset and a
  // onesweep kernel per pass.
  const HfKernelWork full = RadixSortWork(8, 64);
  EXPECT_DOUBLE_EQ(full.bytes, 8 + 8 * 32);
  EXPECT_DOUBLE_EQ(full.kernels, 4 + 2 * 8);
  // index_put's sort of the destination's row ids: 13 bits (8192 tokens) and 16 (65536 routed
  // rows) are two passes, 17 three.
  EXPECT_DOUBLE_EQ(RadixSortWork(8, 13).bytes, 8 + 2 * 32);
  EXPECT_DOUBLE_EQ(RadixSortWork(8, 16).kernels, 8);
  EXPECT_DOUBLE_EQ(RadixSortWork(8, 17).bytes, 8 + 3 * 32);
  EXPECT_DOUBLE_EQ(RadixSortWork(4, 32).bytes, 4 + 4 * 24);
}

TEST(HfRouting, SortKeyBitsIsTorchsGetNumBits) {
  EXPECT_EQ(SortKeyBits(0), 1);
  EXPECT_EQ(SortKeyBits(1), 1);
  EXPECT_EQ(SortKeyBits(2), 2);
  EXPECT_EQ(SortKeyBits(127), 7);
  EXPECT_EQ(SortKeyBits(8191), 13);
  EXPECT_EQ(SortKeyBits(65535), 16);
  EXPECT_EQ(SortKeyBits(65536), 17);
}

TEST(HfRouting, TransformersVersionsFromTheRecipesFirst) {
  EXPECT_EQ(*ParseTransformersVersion("5.17"), 17);
  EXPECT_EQ(*ParseTransformersVersion("5.23.0"), 23);
  for (const char* bad : {"5.16", "4.57.1", "6.0", "5", "5.x", "5.17rc", ""}) {
    auto v = ParseTransformersVersion(bad);
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_NE(v.status().message().find("--transformers is '" + std::string(bad) + "'"),
              std::string::npos)
        << v.status();
    EXPECT_NE(v.status().message().find("N >= 17"), std::string::npos) << v.status();
  }
}

// The measured Qwen3-MoE case's shapes: 8192 tokens, 128 experts top-8, h 2048, fe 768.
ModelConfig Qwen3Moe() {
  auto m = ParseHfConfigJson(R"({"model_type": "qwen3_moe", "hidden_size": 2048,
      "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 2,
      "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
      "num_experts_per_tok": 8, "vocab_size": 151936, "decoder_sparse_step": 1,
      "norm_topk_prob": true, "tie_word_embeddings": false, "mlp_only_layers": []})",
                             "test");
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

StepCost HfStep(const ModelConfig& m, int transformers_minor) {
  RunSettings run;
  run.seq_len = 8192;
  run.framework = Framework::kHf;
  run.optimizer = OptimizerKind::kNone;
  run.grad_bytes = 2;
  run.loss_chunk_tokens = 0;
  run.sharding = Sharding::kNoShard;
  run.cp = run.ep = run.gpus = 1;
  run.transformers_minor = transformers_minor;
  auto step = BuildStepCost(m, *HardwarePreset("h200"), run);
  EXPECT_TRUE(step.ok()) << step.status();
  return *step;
}

// Note [hf transformers versions]: 5.17's masks, per routed row: forward the ge, the ids'
// clamp_, the gathered states' masked_fill_ and two out-of-place masked_fills (a clone and a
// fill each), 12h + 16fe + 28 bytes and 7 kernels; backward three gradients, each a clone and a
// fill, 16h + 16fe + 3 bytes and 6 kernels; the bool mask saved (one byte per routed row). 5.18
// and later run none of it.
TEST(HfRouting, Transformers517AppliesTheEpSentinelMasks) {
  const ModelConfig m = Qwen3Moe();
  const StepCost old = HfStep(m, 17), now = HfStep(m, 23);
  const double t = 8192, h = 2048, fe = 768, k = 8;
  const HardwareProfile hw = *HardwarePreset("h200");
  const double rate = hw.hbm_bytes_per_second * hw.elementwise_efficiency;
  ASSERT_EQ(old.layers.size(), now.layers.size());
  for (size_t i = 0; i < old.layers.size(); ++i) {
    EXPECT_NEAR(old.layers[i].forward_time.elementwise - now.layers[i].forward_time.elementwise,
                (12 * h + 16 * fe + 28) * k * t / rate, 1e-12);
    EXPECT_NEAR(old.layers[i].backward_time.elementwise - now.layers[i].backward_time.elementwise,
                (16 * h + 16 * fe + 3) * k * t / rate, 1e-12);
    EXPECT_NEAR(old.layers[i].forward_time.launch - now.layers[i].forward_time.launch,
                7 * hw.kernel_seconds, 1e-15);
    EXPECT_NEAR(old.layers[i].backward_time.launch - now.layers[i].backward_time.launch,
                6 * hw.kernel_seconds, 1e-15);
    EXPECT_EQ(old.layers[i].saved_bytes - now.layers[i].saved_bytes, static_cast<uint64_t>(k * t));
  }
}

// Note [Routing kernels]: histc zeroes its output and, from 100 bins (the MULTI_BLOCK kernel), a
// per-block partial histogram too: one kernel more than below 100 bins (SHARED).
TEST(HfRouting, HistcZeroesAPartialHistogramFromAHundredBins) {
  auto with_experts = [](int experts) {
    auto m =
        ParseHfConfigJson(absl::StrCat(R"({"model_type": "qwen3_moe", "hidden_size": 256,
        "intermediate_size": 512, "moe_intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "num_experts": )",
                                       experts, R"(, "num_experts_per_tok": 2, "vocab_size": 1000,
        "decoder_sparse_step": 1, "mlp_only_layers": []})"),
                          "test");
    EXPECT_TRUE(m.ok()) << m.status();
    return HfStep(*m, 23).layers[0].forward_time.launch;
  };
  const double kernel = HardwarePreset("h200")->kernel_seconds;
  EXPECT_NEAR(with_experts(100) - with_experts(99), kernel, 1e-15);
}

}  // namespace
}  // namespace stowage::planner
