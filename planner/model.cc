#include "planner/model.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace stowage::planner {
namespace {

using nlohmann::json;

// GLM-5.3-Flash (text model): the facts of the reference config, compiled in so the binary
// never reads files to plan the reference run.
ModelConfig GlmFlash() {
  ModelConfig m;
  m.name = "glm-5.3-flash";
  m.hidden = 4096;
  m.vocab = 154880;
  m.hc_mult = 4;
  m.heads = 64;
  m.kv_heads = 64;
  m.head_dim = 256;
  m.q_lora_rank = 1536;
  m.kv_lora_rank = 512;
  m.qk_nope_head_dim = 256;
  m.qk_rope_head_dim = 0;
  m.v_head_dim = 256;
  m.index_heads = 32;
  m.index_head_dim = 128;
  m.index_topk = 2048;
  m.linear_heads = 64;
  m.linear_head_dim = 128;
  m.short_conv_kernel = 4;
  m.intermediate = 12288;
  m.experts = 288;
  m.experts_per_token = 8;
  m.shared_experts = 1;
  m.moe_intermediate = 2048;
  for (int i = 0; i < 45; ++i) {
    m.layers.push_back({i % 4 == 3 ? AttentionKind::kDsa : AttentionKind::kKda,
                        i < 3 ? FfnKind::kDense : FfnKind::kMoe});
  }
  return m;
}

ModelConfig Llama3_8B() {
  ModelConfig m;
  m.name = "llama-3-8b";
  m.hidden = 4096;
  m.vocab = 128256;
  m.heads = 32;
  m.kv_heads = 8;
  m.head_dim = 128;
  m.intermediate = 14336;
  m.layers.assign(32, {AttentionKind::kAttention, FfnKind::kDense});
  return m;
}

ModelConfig Qwen3_30B_A3B() {
  ModelConfig m;
  m.name = "qwen3-30b-a3b";
  m.hidden = 2048;
  m.vocab = 151936;
  m.heads = 32;
  m.kv_heads = 4;
  m.head_dim = 128;
  m.intermediate = 6144;
  m.experts = 128;
  m.experts_per_token = 8;
  m.moe_intermediate = 768;
  m.layers.assign(48, {AttentionKind::kAttention, FfnKind::kMoe});
  return m;
}

ModelConfig DeepSeekV3() {
  ModelConfig m;
  m.name = "deepseek-v3";
  m.hidden = 7168;
  m.vocab = 129280;
  m.heads = 128;
  m.kv_heads = 128;
  m.q_lora_rank = 1536;
  m.kv_lora_rank = 512;
  m.qk_nope_head_dim = 128;
  m.qk_rope_head_dim = 64;
  m.v_head_dim = 128;
  m.intermediate = 18432;
  m.experts = 256;
  m.experts_per_token = 8;
  m.shared_experts = 1;
  m.moe_intermediate = 2048;
  for (int i = 0; i < 61; ++i) {
    m.layers.push_back({AttentionKind::kMla, i < 3 ? FfnKind::kDense : FfnKind::kMoe});
  }
  return m;
}

// Reads HF config fields, naming the family and field in errors.
class Fields {
 public:
  Fields(const json& j, std::string family) : j_(j), family_(std::move(family)) {}

  absl::Status Int(const char* key, int& out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config (", family_, "): missing field '", key, "'"));
    }
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("model config (", family_, "): field '", key,
                                                     "' is ", it->dump(),
                                                     "; it must be a non-negative integer"));
    }
    out = it->get<int>();
    return absl::OkStatus();
  }
  absl::Status IntOr(const char* key, int fallback, int& out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) {
      out = fallback;
      return absl::OkStatus();
    }
    return Int(key, out);
  }
  bool BoolOr(const char* key, bool fallback) const {
    auto it = j_.find(key);
    return (it != j_.end() && it->is_boolean()) ? it->get<bool>() : fallback;
  }
  const json& raw() const { return j_; }
  const std::string& family() const { return family_; }

 private:
  const json& j_;
  std::string family_;
};

#define STOWAGE_MODEL_RETURN_IF_ERROR(expr) \
  do {                                      \
    absl::Status status_ = (expr);          \
    if (!status_.ok()) return status_;      \
  } while (0)

absl::Status ReadCommon(const Fields& f, ModelConfig& m, int& layers) {
  STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("hidden_size", m.hidden));
  STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("vocab_size", m.vocab));
  STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("num_hidden_layers", layers));
  m.tied_embeddings = f.BoolOr("tie_word_embeddings", false);
  return absl::OkStatus();
}

absl::Status ReadAttention(const Fields& f, ModelConfig& m) {
  STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("num_attention_heads", m.heads));
  STOWAGE_MODEL_RETURN_IF_ERROR(f.IntOr("num_key_value_heads", m.heads, m.kv_heads));
  STOWAGE_MODEL_RETURN_IF_ERROR(
      f.IntOr("head_dim", m.heads > 0 ? m.hidden / m.heads : 0, m.head_dim));
  return absl::OkStatus();
}

absl::Status ReadMla(const Fields& f, ModelConfig& m) {
  STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("num_attention_heads", m.heads));
  m.kv_heads = m.heads;
  STOWAGE_MODEL_RETURN_IF_ERROR(f.IntOr("q_lora_rank", 0, m.q_lora_rank));
  STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("kv_lora_rank", m.kv_lora_rank));
  STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("qk_nope_head_dim", m.qk_nope_head_dim));
  STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("qk_rope_head_dim", m.qk_rope_head_dim));
  STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("v_head_dim", m.v_head_dim));
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> FromHf(const json& j, const std::string& family,
                                   const std::string& name) {
  static const char* const kFamilies[] = {"llama",   "qwen2",       "qwen3",    "qwen3_moe",
                                          "mixtral", "deepseek_v3", "glm5_next"};
  if (std::find(std::begin(kFamilies), std::end(kFamilies), family) == std::end(kFamilies)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: field 'model_type' is '", family,
        "'; supported: llama, qwen2, qwen3, qwen3_moe, mixtral, deepseek_v3, glm5_next"));
  }
  Fields f(j, family);
  ModelConfig m;
  m.name = name;
  int n = 0;
  STOWAGE_MODEL_RETURN_IF_ERROR(ReadCommon(f, m, n));
  if (family == "llama" || family == "qwen2" || family == "qwen3") {
    STOWAGE_MODEL_RETURN_IF_ERROR(ReadAttention(f, m));
    STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("intermediate_size", m.intermediate));
    m.layers.assign(n, {AttentionKind::kAttention, FfnKind::kDense});
  } else if (family == "qwen3_moe") {
    STOWAGE_MODEL_RETURN_IF_ERROR(ReadAttention(f, m));
    STOWAGE_MODEL_RETURN_IF_ERROR(f.IntOr("intermediate_size", 0, m.intermediate));
    STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("num_experts", m.experts));
    STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("num_experts_per_tok", m.experts_per_token));
    STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("moe_intermediate_size", m.moe_intermediate));
    int step = 1;
    STOWAGE_MODEL_RETURN_IF_ERROR(f.IntOr("decoder_sparse_step", 1, step));
    std::vector<int> mlp_only;
    if (auto it = j.find("mlp_only_layers"); it != j.end() && it->is_array()) {
      for (const json& v : *it) {
        if (v.is_number_integer()) mlp_only.push_back(v.get<int>());
      }
    }
    for (int i = 0; i < n; ++i) {
      bool dense = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end() || step <= 0 ||
                   (i + 1) % step != 0;
      m.layers.push_back({AttentionKind::kAttention, dense ? FfnKind::kDense : FfnKind::kMoe});
    }
  } else if (family == "mixtral") {
    STOWAGE_MODEL_RETURN_IF_ERROR(ReadAttention(f, m));
    STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("num_local_experts", m.experts));
    STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("num_experts_per_tok", m.experts_per_token));
    STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("intermediate_size", m.moe_intermediate));
    m.layers.assign(n, {AttentionKind::kAttention, FfnKind::kMoe});
  } else if (family == "deepseek_v3" || family == "glm5_next") {
    STOWAGE_MODEL_RETURN_IF_ERROR(ReadMla(f, m));
    STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("intermediate_size", m.intermediate));
    STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("n_routed_experts", m.experts));
    STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("num_experts_per_tok", m.experts_per_token));
    STOWAGE_MODEL_RETURN_IF_ERROR(f.IntOr("n_shared_experts", 0, m.shared_experts));
    STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("moe_intermediate_size", m.moe_intermediate));
    int first_dense = 0, freq = 1;
    STOWAGE_MODEL_RETURN_IF_ERROR(f.IntOr("first_k_dense_replace", 0, first_dense));
    STOWAGE_MODEL_RETURN_IF_ERROR(f.IntOr("moe_layer_freq", 1, freq));
    std::vector<AttentionKind> kinds(n, AttentionKind::kMla);
    if (family == "glm5_next") {
      auto types = j.find("layer_types");
      if (types == j.end() || !types->is_array()) {
        return absl::InvalidArgumentError(
            "model config (glm5_next): missing field 'layer_types' (a list with one entry per "
            "layer)");
      }
      if (static_cast<int>(types->size()) != n) {
        return absl::InvalidArgumentError(
            absl::StrCat("model config (glm5_next): field 'layer_types' has ", types->size(),
                         " entries but num_hidden_layers is ", n));
      }
      for (int i = 0; i < n; ++i) {
        const json& t = (*types)[i];
        std::string kind = t.is_string() ? t.get<std::string>() : t.dump();
        if (kind == "linear_attention") {
          kinds[i] = AttentionKind::kKda;
        } else if (kind == "deepseek_sparse_attention") {
          kinds[i] = AttentionKind::kDsa;
        } else if (kind == "full_attention" || kind == "mla") {
          kinds[i] = AttentionKind::kMla;
        } else {
          return absl::InvalidArgumentError(absl::StrCat(
              "model config (glm5_next): field 'layer_types[", i, "]' is '", kind,
              "'; allowed: linear_attention, deepseek_sparse_attention, full_attention"));
        }
      }
      bool any_kda = std::count(kinds.begin(), kinds.end(), AttentionKind::kKda) > 0;
      bool any_dsa = std::count(kinds.begin(), kinds.end(), AttentionKind::kDsa) > 0;
      if (any_kda) {
        auto lin = j.find("linear_attn_config");
        if (lin == j.end() || !lin->is_object()) {
          return absl::InvalidArgumentError(
              "model config (glm5_next): missing field 'linear_attn_config' (layer_types has "
              "linear_attention layers)");
        }
        Fields lf(*lin, "glm5_next linear_attn_config");
        STOWAGE_MODEL_RETURN_IF_ERROR(lf.Int("num_heads", m.linear_heads));
        STOWAGE_MODEL_RETURN_IF_ERROR(lf.Int("head_dim", m.linear_head_dim));
        STOWAGE_MODEL_RETURN_IF_ERROR(lf.IntOr("short_conv_kernel_size", 4, m.short_conv_kernel));
      }
      if (any_dsa) {
        STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("index_n_heads", m.index_heads));
        STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("index_head_dim", m.index_head_dim));
        STOWAGE_MODEL_RETURN_IF_ERROR(f.Int("index_topk", m.index_topk));
      }
      if (f.BoolOr("mhc", false)) STOWAGE_MODEL_RETURN_IF_ERROR(f.IntOr("hc_mult", 4, m.hc_mult));
    }
    for (int i = 0; i < n; ++i) {
      bool moe = i >= first_dense && freq > 0 && i % freq == 0;
      m.layers.push_back({kinds[i], moe ? FfnKind::kMoe : FfnKind::kDense});
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: field 'model_type' is '", family,
        "'; supported: llama, qwen2, qwen3, qwen3_moe, mixtral, deepseek_v3, glm5_next"));
  }
  STOWAGE_MODEL_RETURN_IF_ERROR(ValidateModel(m));
  return m;
}

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
  }
  return "unknown";
}

const char* FfnKindName(FfnKind kind) { return kind == FfnKind::kMoe ? "moe" : "dense_ffn"; }

std::string LayerSpec::TypeName() const {
  return absl::StrCat(AttentionKindName(attention), "+", FfnKindName(ffn));
}

std::vector<std::string> ModelPresetNames() {
  return {"glm-5.3-flash", "llama-3-8b", "qwen3-30b-a3b", "deepseek-v3"};
}

absl::StatusOr<ModelConfig> ModelPreset(const std::string& name) {
  if (name == "glm-5.3-flash") return GlmFlash();
  if (name == "llama-3-8b") return Llama3_8B();
  if (name == "qwen3-30b-a3b") return Qwen3_30B_A3B();
  if (name == "deepseek-v3") return DeepSeekV3();
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown model preset '", name, "'; allowed: ", absl::StrJoin(ModelPresetNames(), ", "),
      ", or a Hugging Face config.json path"));
}

absl::Status ValidateModel(const ModelConfig& m) {
  STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "hidden_size", m.hidden));
  STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "vocab_size", m.vocab));
  STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "hc_mult", m.hc_mult));
  if (m.layers.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", m.name, "': field 'num_hidden_layers' is 0"));
  }
  for (const LayerSpec& l : m.layers) {
    switch (l.attention) {
      case AttentionKind::kAttention:
        STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "num_attention_heads", m.heads));
        STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "num_key_value_heads", m.kv_heads));
        STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "head_dim", m.head_dim));
        break;
      case AttentionKind::kDsa:
        STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "index_n_heads", m.index_heads));
        STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "index_head_dim", m.index_head_dim));
        STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "index_topk", m.index_topk));
        [[fallthrough]];
      case AttentionKind::kMla:
        STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "num_attention_heads", m.heads));
        STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "kv_lora_rank", m.kv_lora_rank));
        STOWAGE_MODEL_RETURN_IF_ERROR(
            RequirePositive(m, "qk_nope_head_dim", m.qk_nope_head_dim + m.qk_rope_head_dim));
        STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "v_head_dim", m.v_head_dim));
        break;
      case AttentionKind::kKda:
        STOWAGE_MODEL_RETURN_IF_ERROR(
            RequirePositive(m, "linear_attn_config.num_heads", m.linear_heads));
        STOWAGE_MODEL_RETURN_IF_ERROR(
            RequirePositive(m, "linear_attn_config.head_dim", m.linear_head_dim));
        break;
    }
    if (l.ffn == FfnKind::kDense) {
      STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "intermediate_size", m.intermediate));
    } else {
      STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "n_routed_experts", m.experts));
      STOWAGE_MODEL_RETURN_IF_ERROR(RequirePositive(m, "num_experts_per_tok", m.experts_per_token));
      STOWAGE_MODEL_RETURN_IF_ERROR(
          RequirePositive(m, "moe_intermediate_size", m.moe_intermediate));
      if (m.experts_per_token > m.experts) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model '", m.name, "': field 'num_experts_per_tok' is ", m.experts_per_token,
            "; it must not exceed the number of experts (", m.experts, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseHfConfigJson(const std::string& text, const std::string& name) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("model config: not a JSON object");
  }
  std::string family;
  if (auto it = j.find("model_type"); it != j.end() && it->is_string()) family = *it;
  const json* body = &j;
  if (auto tc = j.find("text_config"); tc != j.end() && tc->is_object()) {
    body = &*tc;
    if (auto it = tc->find("model_type"); it != tc->end() && it->is_string()) family = *it;
  }
  if (family.empty()) {
    return absl::InvalidArgumentError(
        "model config: missing field 'model_type'; supported: llama, qwen2, qwen3, qwen3_moe, "
        "mixtral, deepseek_v3, glm5_next");
  }
  return FromHf(*body, family, name);
}

absl::StatusOr<ModelConfig> ReadHfConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open model config '", path, "'"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto model = ParseHfConfigJson(buffer.str(), path);
  if (!model.ok()) {
    return absl::Status(model.status().code(), absl::StrCat(path, ": ", model.status().message()));
  }
  return model;
}

uint64_t DenseLayerParams(const ModelConfig& m, const LayerSpec& layer) {
  const uint64_t h = m.hidden;
  uint64_t p = 2 * h;  // two RMSNorms
  switch (layer.attention) {
    case AttentionKind::kAttention:
      p += h * m.heads * m.head_dim + 2 * h * m.kv_heads * m.head_dim +
           uint64_t(m.heads) * m.head_dim * h;
      break;
    case AttentionKind::kDsa:
      p += uint64_t(m.q_lora_rank > 0 ? m.q_lora_rank : h) * m.index_heads * m.index_head_dim +
           h * m.index_head_dim + h * m.index_heads;
      [[fallthrough]];
    case AttentionKind::kMla: {
      const uint64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
      p += m.q_lora_rank > 0
               ? h * m.q_lora_rank + m.q_lora_rank + uint64_t(m.q_lora_rank) * m.heads * qk
               : h * m.heads * qk;
      p += h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank +
           uint64_t(m.kv_lora_rank) * m.heads * (m.qk_nope_head_dim + m.v_head_dim);
      p += uint64_t(m.heads) * m.v_head_dim * h;
      break;
    }
    case AttentionKind::kKda: {
      const uint64_t inner = uint64_t(m.linear_heads) * m.linear_head_dim;
      p += 3 * h * inner + 3 * inner * m.short_conv_kernel;
      // Forget and output gates are low rank (hidden -> head_dim -> inner); beta is per head.
      p += 2 * (h * m.linear_head_dim + uint64_t(m.linear_head_dim) * inner) + h * m.linear_heads;
      p += inner * h + m.linear_head_dim;
      break;
    }
  }
  if (layer.ffn == FfnKind::kDense) {
    p += 3 * h * m.intermediate;
  } else {
    p += h * m.experts + 3 * h * m.moe_intermediate * uint64_t(m.shared_experts);
  }
  if (m.hc_mult > 1) {
    // Two hyper-connections per layer, each mapping hc_mult*hidden to n*n + 2n coefficients.
    const uint64_t n = m.hc_mult;
    p += 2 * (n * h) * (n * n + 2 * n);
  }
  return p;
}

uint64_t RoutedExpertParams(const ModelConfig& m, const LayerSpec& layer) {
  if (layer.ffn != FfnKind::kMoe) return 0;
  return uint64_t(m.experts) * 3 * m.hidden * m.moe_intermediate;
}

}  // namespace stowage::planner
