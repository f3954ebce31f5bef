#include "planner/model/model.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace stowage::planner {

// Presets: Hugging Face config.json text (model_presets.cc), read like any user's config.
struct PresetText {
  const char* name;
  const char* json;
};
extern const PresetText kModelPresets[];
extern const int kModelPresetCount;

namespace {

absl::Status RequirePositive(const ModelConfig& m, const char* field, int value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("model '", m.name, "': field '", field, "' is ",
                                                 value, "; it must be positive"));
}

}  // namespace

const char* AttentionKindName(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kAttention:
      return "attention";
    case AttentionKind::kMla:
      return "mla";
    case AttentionKind::kDsa:
      return "dsa";
    case AttentionKind::kKda:
      return "kda";
    case AttentionKind::kGdn:
      return "gdn";
  }
  return "unknown";
}

const char* FfnKindName(FfnKind kind) { return kind == FfnKind::kMoe ? "moe" : "dense_ffn"; }

std::string LayerSpec::TypeName() const {
  std::string attn = AttentionKindName(attention);
  if (attention == AttentionKind::kAttention) {
    if (cross_attention) {
      attn = "cross_attention";
    } else if (span == AttentionSpan::kSliding) {
      attn = "sliding_attention";
    } else if (span == AttentionSpan::kChunked) {
      attn = "chunked_attention";
    }
  }
  return absl::StrCat(attn, "+", FfnKindName(ffn));
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (int i = 0; i < kModelPresetCount; ++i) names.push_back(kModelPresets[i].name);
  return names;
}

absl::StatusOr<ModelConfig> ModelPreset(const std::string& name) {
  for (int i = 0; i < kModelPresetCount; ++i) {
    if (name == kModelPresets[i].name) {
      auto m = ParseHfConfigJson(kModelPresets[i].json, name);
      if (!m.ok()) {
        // A preset that does not read is a bug of this build, said as such.
        return absl::InternalError(absl::StrCat("model preset ", name, ": ", m.status().message()));
      }
      // A preset's numbers are its published config's; nothing was defaulted or nested that
      // the user should hear about.
      m->notes.clear();
      return m;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown model preset '", name, "'; allowed: ", absl::StrJoin(ModelPresetNames(), ", "),
      ", or a Hugging Face config.json path (stowage plan --list-models)"));
}

std::string ListModelsText() {
  std::string out = "Hugging Face config.json families (--model path/to/config.json):\n";
  for (const ModelFamilyInfo& f : ModelFamilies()) {
    std::vector<std::string> names;
    for (const std::string& a : f.architectures) names.push_back(a);
    for (const std::string& t : f.model_types) {
      if (t != f.family) names.push_back(t);
    }
    absl::StrAppend(&out, "  ", f.family, names.empty() ? "" : ": ", absl::StrJoin(names, ", "),
                    "\n");
  }
  absl::StrAppend(&out, "\nPresets (--model NAME): parameters\n");
  for (const std::string& name : ModelPresetNames()) {
    auto m = ModelPreset(name);
    if (!m.ok()) continue;
    absl::StrAppend(&out, "  ", name, " (", m->family,
                    "): ", absl::StrFormat("%.2fB", static_cast<double>(ModelParameters(*m)) / 1e9),
                    "\n");
  }
  return out;
}

absl::Status ValidateModel(const ModelConfig& m) {
  STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "hidden_size", m.hidden));
  STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "vocab_size", m.vocab));
  STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "hc_mult", m.hc_mult));
  if (m.layers.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", m.name, "': field 'num_hidden_layers' is 0"));
  }
  for (const LayerSpec& l : m.layers) {
    switch (l.attention) {
      case AttentionKind::kAttention:
        STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "num_attention_heads", m.heads));
        STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "num_key_value_heads", m.kv_heads));
        STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "head_dim", m.head_dim));
        if (m.heads % m.kv_heads != 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("model '", m.name, "': field 'num_key_value_heads' is ", m.kv_heads,
                           "; it must divide num_attention_heads (", m.heads, ")"));
        }
        if (l.span == AttentionSpan::kSliding) {
          STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "sliding_window", m.sliding_window));
        }
        break;
      case AttentionKind::kDsa:
        STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "index_n_heads", m.index_heads));
        STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "index_head_dim", m.index_head_dim));
        STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "index_topk", m.index_topk));
        [[fallthrough]];
      case AttentionKind::kMla:
        STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "num_attention_heads", m.heads));
        STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "kv_lora_rank", m.kv_lora_rank));
        STOWAGE_RETURN_IF_ERROR(
            RequirePositive(m, "qk_nope_head_dim", m.qk_nope_head_dim + m.qk_rope_head_dim));
        STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "v_head_dim", m.v_head_dim));
        break;
      case AttentionKind::kKda:
        STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "linear_attn_config.num_heads", m.linear_heads));
        STOWAGE_RETURN_IF_ERROR(
            RequirePositive(m, "linear_attn_config.head_dim", m.linear_head_dim));
        break;
      case AttentionKind::kGdn:
        STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "linear_num_key_heads", m.gdn_key_heads));
        STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "linear_num_value_heads", m.gdn_value_heads));
        STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "linear_key_head_dim", m.gdn_key_head_dim));
        STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "linear_value_head_dim", m.gdn_value_head_dim));
        if (m.gdn_value_heads % m.gdn_key_heads != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "model '", m.name, "': field 'linear_num_key_heads' is ", m.gdn_key_heads,
              "; it must divide linear_num_value_heads (", m.gdn_value_heads, ")"));
        }
        break;
    }
    if (l.ffn == FfnKind::kDense) {
      STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "intermediate_size", m.intermediate));
    } else {
      STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "n_routed_experts", m.experts));
      STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "num_experts_per_tok", m.experts_per_token));
      STOWAGE_RETURN_IF_ERROR(RequirePositive(m, "moe_intermediate_size", m.moe_intermediate));
      if (m.experts_per_token > m.experts) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model '", m.name, "': field 'num_experts_per_tok' is ", m.experts_per_token,
            "; it must not exceed the number of experts (", m.experts, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ReadHfConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open model config '", path, "'"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseHfConfigJson(buffer.str(), path);
}

// Note [Parameter counts]
// Counted as transformers builds each module (the file named beside each term), so the total
// equals sum(p.numel() for p in model.parameters()) of the real model; tests/python/
// test_hf_models.py checks that on every config in tests/planner/data/hf. Buffers are not
// parameters: DeepSeek-V3's and GLM's router e_score_correction_bias (nn.Buffer in
// modeling_deepseek_v3.py DeepseekV3TopkRouter) gets no gradient and no optimizer state.
uint64_t DenseLayerParams(const ModelConfig& m, const LayerSpec& layer) {
  const uint64_t h = m.hidden;
  uint64_t p = uint64_t(m.norms_per_layer) * h;
  switch (layer.attention) {
    case AttentionKind::kAttention: {
      // modeling_llama.py LlamaAttention (q/k/v/o_proj); Qwen3-Next's q_proj doubles for its
      // output gate (modeling_qwen3_next.py Qwen3NextAttention).
      const uint64_t q = uint64_t(m.heads) * m.head_dim * (m.attention_output_gate ? 2 : 1);
      const uint64_t kv = uint64_t(m.kv_heads) * m.head_dim;
      p += h * q + 2 * h * kv + AttentionOutputParams(m, layer);
      if (m.qkv_bias) p += q + 2 * kv;
      if (m.qk_norm == QkNorm::kPerHead) p += 2 * uint64_t(m.head_dim);
      if (m.qk_norm == QkNorm::kWhole) p += uint64_t(m.heads) * m.head_dim + kv;
      if (m.attention_sinks) p += m.heads;  // modeling_gpt_oss.py GptOssAttention.sinks
      // modeling_mllama.py MllamaTextCrossAttention: q/k norms over head_dim, and the
      // decoder layer's cross_attn_attn_gate and cross_attn_mlp_gate (one scalar each).
      if (layer.cross_attention) p += 2 * uint64_t(m.head_dim) + 2;
      break;
    }
    case AttentionKind::kDsa:
      // modeling_glm_moe_dsa.py GlmMoeDsaIndexer: wq_b (from the q latent), wk, k_norm
      // (LayerNorm: weight and bias), weights_proj.
      p += uint64_t(m.q_lora_rank > 0 ? m.q_lora_rank : h) * m.index_heads * m.index_head_dim +
           h * m.index_head_dim + 2 * uint64_t(m.index_head_dim) + h * m.index_heads;
      [[fallthrough]];
    case AttentionKind::kMla: {
      // modeling_deepseek_v3.py DeepseekV3Attention.
      const uint64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
      p += m.q_lora_rank > 0
               ? h * m.q_lora_rank + m.q_lora_rank + uint64_t(m.q_lora_rank) * m.heads * qk
               : h * m.heads * qk;
      p += h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank +
           uint64_t(m.kv_lora_rank) * m.heads * (m.qk_nope_head_dim + m.v_head_dim);
      p += AttentionOutputParams(m, layer);
      break;
    }
    case AttentionKind::kKda: {
      // modeling_kimi_linear.py KimiLinearDeltaAttention: q/k/v_proj, depthwise conv1d over
      // q, k, v (no bias), the low-rank forget gate (f_a, f_b, dt_bias, A_log), b_proj, the
      // low-rank output gate (g_a, g_b), o_norm over head_dim, o_proj.
      const uint64_t inner = uint64_t(m.linear_heads) * m.linear_head_dim;
      p += 3 * h * inner + 3 * inner * m.short_conv_kernel;
      p += h * m.linear_head_dim + uint64_t(m.linear_head_dim) * inner + inner + m.linear_heads;
      p += h * m.linear_heads;
      p += h * m.linear_head_dim + uint64_t(m.linear_head_dim) * inner;
      p += AttentionOutputParams(m, layer);
      break;
    }
    case AttentionKind::kGdn: {
      // modeling_qwen3_next.py Qwen3NextGatedDeltaNet: in_proj_qkvz (q, k, v and the z gate),
      // in_proj_ba (beta and the decay input a, one per value head), depthwise conv1d over q,
      // k, v (no bias), dt_bias and A_log per value head, the gated RMSNorm over
      // head_v_dim, out_proj.
      const uint64_t key = uint64_t(m.gdn_key_heads) * m.gdn_key_head_dim;
      const uint64_t value = uint64_t(m.gdn_value_heads) * m.gdn_value_head_dim;
      p += h * (2 * key + 2 * value) + h * 2 * m.gdn_value_heads;
      p += (2 * key + value) * m.short_conv_kernel + 2 * uint64_t(m.gdn_value_heads);
      p += AttentionOutputParams(m, layer);
      break;
    }
  }
  p += FfnDenseParams(m, layer);
  if (m.hc_mult > 1) {
    // Two hyper-connections per layer, each mapping hc_mult*hidden to n*n + 2n coefficients.
    const uint64_t n = m.hc_mult;
    p += 2 * (n * h) * (n * n + 2 * n);
  }
  return p;
}

uint64_t FfnDenseParams(const ModelConfig& m, const LayerSpec& layer) {
  const uint64_t h = m.hidden;
  if (layer.ffn == FfnKind::kDense) {
    return 3 * h * m.intermediate + (m.mlp_bias ? 2 * uint64_t(m.intermediate) + h : 0);
  }
  uint64_t p = h * m.experts + 3 * h * m.shared_intermediate;
  if (m.router_bias) p += m.experts;  // modeling_gpt_oss.py GptOssTopKRouter.bias
  if (m.shared_expert_gate) p += h;   // modeling_qwen2_moe.py shared_expert_gate
  return p;
}

uint64_t AttentionOutputParams(const ModelConfig& m, const LayerSpec& layer) {
  const uint64_t h = m.hidden;
  switch (layer.attention) {
    case AttentionKind::kAttention:
      return uint64_t(m.heads) * m.head_dim * h + (m.o_bias ? h : 0);
    case AttentionKind::kMla:
    case AttentionKind::kDsa:
      return uint64_t(m.heads) * m.v_head_dim * h;
    case AttentionKind::kKda:  // o_norm over head_dim, o_proj
      return m.linear_head_dim + uint64_t(m.linear_heads) * m.linear_head_dim * h;
    case AttentionKind::kGdn:  // the gated RMSNorm over head_v_dim, out_proj
      return m.gdn_value_head_dim + uint64_t(m.gdn_value_heads) * m.gdn_value_head_dim * h;
  }
  return 0;
}

uint64_t RoutedExpertParams(const ModelConfig& m, const LayerSpec& layer) {
  if (layer.ffn != FfnKind::kMoe) return 0;
  uint64_t p = uint64_t(m.experts) * 3 * m.hidden * m.moe_intermediate;
  // modeling_gpt_oss.py GptOssExperts: gate_up_proj_bias and down_proj_bias.
  if (m.expert_bias) p += uint64_t(m.experts) * (2 * uint64_t(m.moe_intermediate) + m.hidden);
  return p;
}

uint64_t EmbeddingParams(const ModelConfig& m) {
  const uint64_t h = m.hidden;
  return (uint64_t(m.vocab) + m.extra_embedding_rows) * h + (m.tied_embeddings ? 0 : m.vocab * h) +
         h;
}

// Megatron-Core multi_token_prediction.py MultiTokenPredictionLayer (DeepSeek-V3's MTP module):
// enorm and hnorm, eh_proj (2*hidden -> hidden), one transformer layer, final_layernorm; the
// embedding and output layer are the main model's.
uint64_t MtpDenseParams(const ModelConfig& m, int depths) {
  if (depths <= 0 || m.layers.empty()) return 0;
  const uint64_t h = m.hidden;
  return uint64_t(depths) * (3 * h + 2 * h * h + DenseLayerParams(m, m.layers.back()));
}

uint64_t MtpRoutedExpertParams(const ModelConfig& m, int depths) {
  if (depths <= 0 || m.layers.empty()) return 0;
  return uint64_t(depths) * RoutedExpertParams(m, m.layers.back());
}

uint64_t MtpDenseParams(const ModelConfig& m) { return MtpDenseParams(m, m.mtp_layers); }
uint64_t MtpRoutedExpertParams(const ModelConfig& m) {
  return MtpRoutedExpertParams(m, m.mtp_layers);
}

uint64_t ModelParameters(const ModelConfig& m) {
  uint64_t p = EmbeddingParams(m) + MtpDenseParams(m) + MtpRoutedExpertParams(m);
  for (const LayerSpec& l : m.layers) p += DenseLayerParams(m, l) + RoutedExpertParams(m, l);
  return p;
}

}  // namespace stowage::planner
