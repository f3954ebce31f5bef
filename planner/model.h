// Model descriptions: the shapes the cost model counts bytes and FLOPs from. Embedded presets,
// or a Hugging Face config.json of a supported family.
#ifndef STOWAGE_PLANNER_MODEL_H_
#define STOWAGE_PLANNER_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stowage::planner {

enum class AttentionKind {
  kAttention,  // multi-head / grouped-query attention with a flash-style kernel
  kMla,        // multi-head latent attention (DeepSeek-V3)
  kDsa,        // MLA with a lightning indexer choosing index_topk keys per query
  kKda,        // Kimi Delta Attention: gated delta-rule linear attention with short convs
};

enum class FfnKind {
  kDense,  // SwiGLU
  kMoe,    // top-k routed experts plus shared experts
};

// "attention", "mla", "dsa", "kda" / "dense_ffn", "moe".
const char* AttentionKindName(AttentionKind kind);
const char* FfnKindName(FfnKind kind);

struct LayerSpec {
  AttentionKind attention = AttentionKind::kAttention;
  FfnKind ffn = FfnKind::kDense;
  std::string TypeName() const;  // e.g. "kda+moe"; the plan's layers[].type
};

struct ModelConfig {
  std::string name;
  int hidden = 0;
  int vocab = 0;
  bool tied_embeddings = false;
  // Residual streams (mHC hyper-connections); 1 for a plain residual. A layer's input is
  // hc_mult x hidden wide.
  int hc_mult = 1;
  std::vector<LayerSpec> layers;

  // Softmax attention (kAttention).
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  // MLA / DSA.
  int q_lora_rank = 0;  // 0: q is projected directly from the hidden state
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  // DSA lightning indexer.
  int index_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  // KDA.
  int linear_heads = 0;
  int linear_head_dim = 0;
  int short_conv_kernel = 0;
  // Dense FFN.
  int intermediate = 0;
  // MoE.
  int experts = 0;
  int experts_per_token = 0;
  int shared_experts = 0;
  int moe_intermediate = 0;

  int num_layers() const { return static_cast<int>(layers.size()); }
};

// Names accepted by ModelPreset, in the order --help lists them.
std::vector<std::string> ModelPresetNames();
absl::StatusOr<ModelConfig> ModelPreset(const std::string& name);

// Checks the fields the layer kinds present need; errors name the field and its value.
absl::Status ValidateModel(const ModelConfig& model);

// Families: llama, qwen2, qwen3, qwen3_moe, mixtral, deepseek_v3, glm5_next. A nested
// `text_config` (multimodal configs) is read in place of the top level. Errors name the missing
// or bad field and the family.
absl::StatusOr<ModelConfig> ParseHfConfigJson(const std::string& json, const std::string& name);
absl::StatusOr<ModelConfig> ReadHfConfigFile(const std::string& path);

// Whole-model parameter counts of one layer: everything but the routed experts (replicated or
// split by TP), and the routed experts (split by EP).
uint64_t DenseLayerParams(const ModelConfig& model, const LayerSpec& layer);
uint64_t RoutedExpertParams(const ModelConfig& model, const LayerSpec& layer);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_MODEL_H_
