// Reading a Hugging Face config.json: which family it is (the families: hf_families.h), and the
// shapes the cost model counts, per family (each field read as transformers reads it:
// hf_fields.h).
//
// Note [Family resolution]
// One graph often ships under several names: Kimi-K2 is `DeepseekV3ForCausalLM` with model_type
// `kimi_k2`; Mistral is Llama's graph; a multimodal checkpoint (`Qwen3VLForConditionalGeneration`,
// `Llama4ForConditionalGeneration`) wraps a text decoder in `text_config`. The family is found
// by `architectures[0]` first (what transformers instantiates), then the text decoder's
// `text_config.model_type`, then the top-level `model_type`, each looked up in kFamilies
// (hf_families.cc). For a wrapper only the text decoder is planned (the vision tower's activations
// and weights are not counted), and the output says so. Fields a config leaves out take the
// dataclass defaults of the family's transformers configuration class (hf_defaults.inc, generated
// from the pinned transformers by scripts/gen-hf-defaults), and the output names each one taken;
// an explicit null is transformers' None, not its default. Fields transformers derives in
// __post_init__ (head_dim, layer_types, no_rope_layers, moe_layers) are derived here by the same
// rules.
#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/json_reader.h"
#include "base/status_macros.h"
#include "planner/model/hf_families.h"
#include "planner/model/hf_fields.h"
#include "planner/model/model.h"

namespace stowage::planner {
namespace {

using hf_config::ByArchitecture;
using hf_config::ByModelType;
using hf_config::Defaults;
using hf_config::DefaultsOf;
using hf_config::Family;
using hf_config::Fields;
using hf_config::Graph;
using hf_config::kCount;
using hf_config::kDim;
using hf_config::kLayers;
using hf_config::SupportedList;
using json::Json;

absl::Status ReadCommon(const Fields& f, ModelConfig& m, int& layers) {
  STOWAGE_RETURN_IF_ERROR(f.Get("hidden_size", m.hidden, kDim));
  STOWAGE_RETURN_IF_ERROR(f.Get("vocab_size", m.vocab, kDim));
  STOWAGE_RETURN_IF_ERROR(f.Get("num_hidden_layers", layers, kLayers));
  STOWAGE_RETURN_IF_ERROR(f.GetOr("tie_word_embeddings", false, m.tied_embeddings));
  return absl::OkStatus();
}

// ModelConfig::rotary_dim for the families whose apply_rotary_pos_emb is the partial-rotary form
// (modeling_glm4_moe.py, modeling_phi3.py, modeling_qwen3_next.py, modeling_qwen3_5(_moe).py:
// `q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]`, then `torch.cat`); the other
// families' RoPE rotates the whole head and ignores the field. transformers takes
// partial_rotary_factor from the RoPE dict (`rope_scaling` when given, else `rope_parameters`),
// then the top-level field, then the configuration class's default
// (PreTrainedConfig.convert_rope_params_to_dict, modeling_rope_utils.py: setdefault into the
// dict): Glm4MoeConfig 0.5, Qwen3NextConfig / Qwen3_5TextConfig / Qwen3_5MoeTextConfig 0.25
// (their __post_init__'s `kwargs.setdefault`), Phi3Config 1.0 (its convert_rope_params_to_dict).
// cos/sin are `torch.cat((freqs, freqs))` over `arange(0, dim, 2)` with dim =
// int(head_dim * factor) (_compute_default_rope_parameters): 2 ceil(dim / 2) wide.
absl::Status ReadRotaryDim(const Fields& f, const std::string& family, ModelConfig& m) {
  double factor = 0;
  if (family == "glm4_moe") {
    factor = 0.5;
  } else if (family == "qwen3_next" || family == "qwen3_5_text" || family == "qwen3_5_moe_text") {
    factor = 0.25;
  } else if (family == "phi3") {
    factor = 1.0;
  } else {
    return absl::OkStatus();
  }
  constexpr json::Range<double> kFactor{0, 1};
  STOWAGE_RETURN_IF_ERROR(f.GetOr("partial_rotary_factor", factor, factor, kFactor));
  const json::Object& body = f.body();
  std::string path = body.PathOf("partial_rotary_factor");
  for (const char* dict : {"rope_scaling", "rope_parameters"}) {
    if (!body.Has(dict) || body.json().at(dict).is_null() || body.json().at(dict).empty()) {
      continue;
    }
    auto rope = body.Child(dict);
    if (!rope.ok()) return rope.status();
    if (rope->Has("partial_rotary_factor")) {
      STOWAGE_RETURN_IF_ERROR(rope->ReadOptional("partial_rotary_factor", factor, kFactor));
      path = rope->PathOf("partial_rotary_factor");
    }
    break;  // `rope_scaling or rope_parameters`: the first one given is the dict
  }
  const int dim = static_cast<int>(m.head_dim * factor);
  m.rotary_dim = 2 * ((dim + 1) / 2);
  if (m.rotary_dim < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(body.source(), ": field '", path, "' has value ", factor,
                     ", which rotates int(head_dim ", m.head_dim, " x ", factor, ") = ", dim,
                     " dims; allowed: a factor that rotates at least one pair of dims"));
  }
  return absl::OkStatus();
}

// Softmax attention shapes and biases (transformers' LlamaAttention and its descendants).
absl::Status ReadAttention(const Fields& f, const std::string& family, ModelConfig& m) {
  STOWAGE_RETURN_IF_ERROR(f.Get("num_attention_heads", m.heads, kDim));
  STOWAGE_RETURN_IF_ERROR(f.GetOr("num_key_value_heads", m.heads, m.kv_heads, kDim));
  STOWAGE_RETURN_IF_ERROR(f.GetOr("head_dim", m.hidden / m.heads, m.head_dim, kDim));
  bool bias = false;
  STOWAGE_RETURN_IF_ERROR(f.GetOr("attention_bias", false, bias));
  if (family == "qwen2" || family == "qwen2_5_vl_text") {
    // Qwen2Attention: q/k/v always carry biases, o_proj never does.
    m.qkv_bias = true;
  } else if (family == "qwen2_moe") {
    STOWAGE_RETURN_IF_ERROR(f.GetOr("qkv_bias", true, m.qkv_bias));
  } else if (family == "glm4_moe") {
    m.qkv_bias = bias;  // Glm4MoeAttention: o_proj has no bias
  } else {
    m.qkv_bias = m.o_bias = bias;
  }
  if (family == "qwen3" || family == "qwen3_vl_text" || family == "qwen3_moe" ||
      family == "qwen3_vl_moe_text" || family == "gemma3_text" || family == "qwen3_next" ||
      family == "qwen3_5_text" || family == "qwen3_5_moe_text") {
    m.qk_norm = QkNorm::kPerHead;
  } else if (family == "olmo2" || family == "olmo3") {
    m.qk_norm = QkNorm::kWhole;
  } else if (family == "glm4_moe") {
    bool qk = false;
    STOWAGE_RETURN_IF_ERROR(f.GetOr("use_qk_norm", false, qk));
    m.qk_norm = qk ? QkNorm::kPerHead : QkNorm::kNone;
  }
  if (family == "llama4_text") {
    // Llama4TextL2Norm: no weights (no parameters), but it keeps activations.
    bool qk = false;
    STOWAGE_RETURN_IF_ERROR(f.GetOr("use_qk_norm", false, qk));
    m.qk_norm = qk ? QkNorm::kL2 : QkNorm::kNone;
  }
  STOWAGE_RETURN_IF_ERROR(ReadRotaryDim(f, family, m));
  if (family == "gemma2" || family == "gemma3_text") m.norms_per_layer = 4;
  if (family == "gpt_oss") m.attention_sinks = true;
  if (family == "gemma2") {
    STOWAGE_RETURN_IF_ERROR(
        f.GetOr("attn_logit_softcapping", 0.0, m.attn_logit_softcap, json::Range<double>{0, 1e6}));
    STOWAGE_RETURN_IF_ERROR(f.GetOr("final_logit_softcapping", 0.0, m.final_logit_softcap,
                                    json::Range<double>{0, 1e6}));
  }
  if (family == "gemma3_text") {
    STOWAGE_RETURN_IF_ERROR(f.GetOr("final_logit_softcapping", 0.0, m.final_logit_softcap,
                                    json::Range<double>{0, 1e6}));
  }
  return absl::OkStatus();
}

// Where sliding-window and chunked layers are, by each family's rule (its configuration class's
// __post_init__) unless layer_types lists them.
absl::Status PlaceSpans(const Fields& f, const std::string& family, int n, ModelConfig& m) {
  STOWAGE_RETURN_IF_ERROR(f.GetOr("sliding_window", 0, m.sliding_window, kCount));
  auto types = f.LayerTypes(n);
  if (!types.ok()) return types.status();
  std::vector<AttentionSpan> spans(n, AttentionSpan::kFull);
  if (types->has_value()) {
    for (int i = 0; i < n; ++i) {
      const std::string& t = (**types)[i];
      if (t == "sliding_attention") {
        spans[i] = AttentionSpan::kSliding;
      } else if (t == "chunked_attention") {
        spans[i] = AttentionSpan::kChunked;
      } else if (t != "full_attention") {
        return f.BadLayerType(i, t, "full_attention, sliding_attention, chunked_attention");
      }
    }
  } else if (family == "gemma2" || family == "gpt_oss") {
    for (int i = 0; i < n; ++i) {
      if ((i + 1) % 2 != 0) spans[i] = AttentionSpan::kSliding;
    }
  } else if (family == "gemma3_text") {
    int pattern = 6;
    STOWAGE_RETURN_IF_ERROR(f.GetOr("sliding_window_pattern", 6, pattern, kDim));
    for (int i = 0; i < n; ++i) {
      if ((i + 1) % pattern != 0) spans[i] = AttentionSpan::kSliding;
    }
  } else if (family == "olmo3") {
    for (int i = 0; i < n; ++i) {
      if ((i + 1) % 4 != 0) spans[i] = AttentionSpan::kSliding;
    }
  } else if (family == "mistral" || family == "ministral" || family == "phi3" ||
             family == "ministral3") {
    if (m.sliding_window > 0) spans.assign(n, AttentionSpan::kSliding);
  } else if (family == "qwen2" || family == "qwen2_moe") {
    bool use = false;
    int from = 0;
    STOWAGE_RETURN_IF_ERROR(f.GetOr("use_sliding_window", false, use));
    STOWAGE_RETURN_IF_ERROR(f.GetOr("max_window_layers", 0, from, kCount));
    if (use && m.sliding_window > 0) {
      for (int i = from; i < n; ++i) spans[i] = AttentionSpan::kSliding;
    }
  } else if (family == "llama4_text") {
    STOWAGE_RETURN_IF_ERROR(f.GetOr("attention_chunk_size", 0, m.attention_chunk, kCount));
    auto rope = f.Indices("no_rope_layers", 1);
    if (!rope.ok()) return rope.status();
    int interval = 4;
    STOWAGE_RETURN_IF_ERROR(f.GetOr("no_rope_layer_interval", 4, interval, kDim));
    for (int i = 0; i < n; ++i) {
      // no_rope_layers[i] is 1 where the layer uses RoPE: those attend within their chunk.
      bool uses_rope = rope->has_value() && static_cast<int>((*rope)->size()) == n
                           ? (**rope)[i] != 0
                           : (i + 1) % interval != 0;
      if (uses_rope && m.attention_chunk > 0) spans[i] = AttentionSpan::kChunked;
    }
  }
  for (int i = 0; i < n; ++i) {
    if (spans[i] == AttentionSpan::kSliding && m.sliding_window <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.body().source(), ": layer ", i, " is a sliding-window layer but field '",
          f.body().PathOf("sliding_window"), "' is not set; allowed: a positive window"));
    }
    if (spans[i] == AttentionSpan::kChunked && m.attention_chunk <= 0)
      spans[i] = AttentionSpan::kFull;
    m.layers[i].span = spans[i];
  }
  return absl::OkStatus();
}

// DeepSeek-style MoE placement: dense before first_k_dense_replace, then every moe_layer_freq.
absl::Status PlaceDeepSeekMoe(const Fields& f, int n, int first_default, ModelConfig& m) {
  int first_dense = 0, freq = 1;
  STOWAGE_RETURN_IF_ERROR(f.GetOr("first_k_dense_replace", first_default, first_dense, kCount));
  STOWAGE_RETURN_IF_ERROR(f.GetOr("moe_layer_freq", 1, freq, kDim));
  for (int i = 0; i < n; ++i) {
    m.layers[i].ffn = i >= first_dense && i % freq == 0 ? FfnKind::kMoe : FfnKind::kDense;
  }
  return absl::OkStatus();
}

// Qwen-style MoE placement: every decoder_sparse_step-th layer unless in mlp_only_layers.
absl::Status PlaceQwenMoe(const Fields& f, int n, ModelConfig& m) {
  int step = 1;
  STOWAGE_RETURN_IF_ERROR(f.GetOr("decoder_sparse_step", 1, step, kCount));
  auto mlp_only = f.Indices("mlp_only_layers", n);
  if (!mlp_only.ok()) return mlp_only.status();
  for (int i = 0; i < n; ++i) {
    bool dense = (mlp_only->has_value() &&
                  std::find((*mlp_only)->begin(), (*mlp_only)->end(), i) != (*mlp_only)->end()) ||
                 m.experts == 0 || step <= 0 || (i + 1) % step != 0;
    m.layers[i].ffn = dense ? FfnKind::kDense : FfnKind::kMoe;
  }
  return absl::OkStatus();
}

absl::Status ReadMla(const Fields& f, ModelConfig& m) {
  STOWAGE_RETURN_IF_ERROR(f.Get("num_attention_heads", m.heads, kDim));
  m.kv_heads = m.heads;
  STOWAGE_RETURN_IF_ERROR(f.GetOr("q_lora_rank", 0, m.q_lora_rank, kCount));
  STOWAGE_RETURN_IF_ERROR(f.Get("kv_lora_rank", m.kv_lora_rank, kDim));
  STOWAGE_RETURN_IF_ERROR(f.Get("qk_nope_head_dim", m.qk_nope_head_dim, kCount));
  STOWAGE_RETURN_IF_ERROR(f.Get("qk_rope_head_dim", m.qk_rope_head_dim, kCount));
  STOWAGE_RETURN_IF_ERROR(f.Get("v_head_dim", m.v_head_dim, kDim));
  return absl::OkStatus();
}

absl::Status ReadDeepSeekMoe(const Fields& f, ModelConfig& m) {
  STOWAGE_RETURN_IF_ERROR(f.GetOr("intermediate_size", 0, m.intermediate, kCount));
  if (f.Set("n_routed_experts")) {
    STOWAGE_RETURN_IF_ERROR(f.Get("n_routed_experts", m.experts, kCount));
  } else {
    STOWAGE_RETURN_IF_ERROR(f.GetOr("num_local_experts", 0, m.experts, kCount));
  }
  STOWAGE_RETURN_IF_ERROR(f.GetOr("num_experts_per_tok", 0, m.experts_per_token, kCount));
  int shared = 0;
  STOWAGE_RETURN_IF_ERROR(f.GetOr("n_shared_experts", 0, shared, kCount));
  STOWAGE_RETURN_IF_ERROR(f.GetOr("moe_intermediate_size", 0, m.moe_intermediate, kCount));
  m.shared_intermediate = shared * m.moe_intermediate;
  STOWAGE_RETURN_IF_ERROR(f.GetOr("num_nextn_predict_layers", 0, m.mtp_layers, kCount));
  return absl::OkStatus();
}

absl::Status ReadIndexer(const Fields& f, ModelConfig& m) {
  STOWAGE_RETURN_IF_ERROR(f.Get("index_n_heads", m.index_heads, kDim));
  STOWAGE_RETURN_IF_ERROR(f.Get("index_head_dim", m.index_head_dim, kDim));
  STOWAGE_RETURN_IF_ERROR(f.Get("index_topk", m.index_topk, kDim));
  return absl::OkStatus();
}

// linear_attn_config's full_attn_layers and kda_layers (1-based layer numbers) as layer_types.
// Every layer must be listed exactly once: transformers leaves an unlisted layer's type None,
// which no model class builds.
absl::StatusOr<std::vector<std::string>> KimiLayerTypes(const json::Object& lin, int layers) {
  std::vector<std::string> types(layers);
  for (const auto& [key, type] :
       {std::pair<const char*, const char*>{"full_attn_layers", "full_attention"},
        {"kda_layers", "linear_attention"}}) {
    auto array = lin.Array(key);
    if (!array.ok()) return array.status();
    for (size_t i = 0; i < (*array)->size(); ++i) {
      int layer = 0;
      const std::string path = absl::StrCat(lin.PathOf(key), "[", i, "]");
      STOWAGE_RETURN_IF_ERROR(
          json::ReadValue((**array)[i], lin.source(), path, layer, json::Range<int>{1, layers}));
      if (!types[layer - 1].empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            lin.source(), ": field '", path, "' lists layer ", layer, " again; each layer (1-",
            layers, ") is in exactly one of full_attn_layers and kda_layers"));
      }
      types[layer - 1] = type;
    }
  }
  for (int i = 0; i < layers; ++i) {
    if (types[i].empty()) {
      return lin.Invalid("kda_layers", absl::StrCat("with full_attn_layers, every layer 1-", layers,
                                                    " once; layer ", i + 1, " is in neither"));
    }
  }
  return types;
}

absl::Status ReadBody(const Fields& f, const Family& fam, ModelConfig& m) {
  const std::string family = fam.family;
  int n = 0;
  STOWAGE_RETURN_IF_ERROR(ReadCommon(f, m, n));
  m.layers.assign(n, LayerSpec{});
  switch (fam.graph) {
    case Graph::kDense: {
      STOWAGE_RETURN_IF_ERROR(ReadAttention(f, family, m));
      STOWAGE_RETURN_IF_ERROR(f.Get("intermediate_size", m.intermediate, kDim));
      STOWAGE_RETURN_IF_ERROR(f.GetOr("mlp_bias", false, m.mlp_bias));
      STOWAGE_RETURN_IF_ERROR(PlaceSpans(f, family, n, m));
      if (family == "mllama_text_model") {
        // MllamaTextModel: embed_tokens has vocab_size + 8 rows (image tokens).
        m.extra_embedding_rows = 8;
        auto cross = f.Indices("cross_attention_layers", n);
        if (!cross.ok()) return cross.status();
        if (cross->has_value()) {
          for (int i : **cross) {
            if (i < n) m.layers[i].cross_attention = true;
          }
        }
      }
      break;
    }
    case Graph::kMoe: {
      STOWAGE_RETURN_IF_ERROR(ReadAttention(f, family, m));
      STOWAGE_RETURN_IF_ERROR(PlaceSpans(f, family, n, m));
      STOWAGE_RETURN_IF_ERROR(f.Get("num_experts_per_tok", m.experts_per_token, kDim));
      if (family == "mixtral" || family == "gpt_oss") {
        STOWAGE_RETURN_IF_ERROR(f.Get("num_local_experts", m.experts, kDim));
        STOWAGE_RETURN_IF_ERROR(f.Get("intermediate_size", m.moe_intermediate, kDim));
        for (LayerSpec& l : m.layers) l.ffn = FfnKind::kMoe;
        if (family == "gpt_oss") m.router_bias = m.expert_bias = true;
      } else if (family == "llama4_text") {
        // Llama4TextMoe: routed experts and one shared expert of intermediate_size; the dense
        // layers' MLP is intermediate_size_mlp wide.
        STOWAGE_RETURN_IF_ERROR(f.Get("num_local_experts", m.experts, kDim));
        STOWAGE_RETURN_IF_ERROR(f.Get("intermediate_size", m.moe_intermediate, kDim));
        STOWAGE_RETURN_IF_ERROR(f.Get("intermediate_size_mlp", m.intermediate, kDim));
        m.shared_intermediate = m.moe_intermediate;
        auto moe_layers = f.Indices("moe_layers", n);
        if (!moe_layers.ok()) return moe_layers.status();
        int step = 1;
        STOWAGE_RETURN_IF_ERROR(f.GetOr("interleave_moe_layer_step", 1, step, kDim));
        for (int i = 0; i < n; ++i) {
          bool moe = moe_layers->has_value()
                         ? std::find((*moe_layers)->begin(), (*moe_layers)->end(), i) !=
                               (*moe_layers)->end()
                         : (i - (step - 1)) >= 0 && (i - (step - 1)) % step == 0;
          m.layers[i].ffn = moe ? FfnKind::kMoe : FfnKind::kDense;
        }
      } else if (family == "glm4_moe") {
        STOWAGE_RETURN_IF_ERROR(ReadDeepSeekMoe(f, m));
        STOWAGE_RETURN_IF_ERROR(PlaceDeepSeekMoe(f, n, 1, m));
      } else {  // qwen2_moe, qwen3_moe, qwen3_vl_moe_text
        STOWAGE_RETURN_IF_ERROR(f.Get("num_experts", m.experts, kCount));
        STOWAGE_RETURN_IF_ERROR(f.Get("moe_intermediate_size", m.moe_intermediate, kDim));
        STOWAGE_RETURN_IF_ERROR(f.GetOr("intermediate_size", 0, m.intermediate, kCount));
        if (family == "qwen2_moe") {
          STOWAGE_RETURN_IF_ERROR(
              f.GetOr("shared_expert_intermediate_size", 0, m.shared_intermediate, kCount));
          m.shared_expert_gate = m.shared_intermediate > 0;
        }
        STOWAGE_RETURN_IF_ERROR(PlaceQwenMoe(f, n, m));
      }
      break;
    }
    case Graph::kMla: {
      STOWAGE_RETURN_IF_ERROR(ReadMla(f, m));
      STOWAGE_RETURN_IF_ERROR(ReadDeepSeekMoe(f, m));
      // DeepseekV2Config/V3Config default first_k_dense_replace to 0 / 3 (hf_defaults.inc).
      STOWAGE_RETURN_IF_ERROR(PlaceDeepSeekMoe(f, n, 0, m));
      const bool dsa = family == "deepseek_v32" || family == "glm_moe_dsa";
      if (dsa) STOWAGE_RETURN_IF_ERROR(ReadIndexer(f, m));
      for (LayerSpec& l : m.layers) l.attention = dsa ? AttentionKind::kDsa : AttentionKind::kMla;
      break;
    }
    case Graph::kGlm5Next: {
      STOWAGE_RETURN_IF_ERROR(ReadMla(f, m));
      STOWAGE_RETURN_IF_ERROR(ReadDeepSeekMoe(f, m));
      STOWAGE_RETURN_IF_ERROR(PlaceDeepSeekMoe(f, n, 0, m));
      auto types = f.LayerTypes(n);
      if (!types.ok()) return types.status();
      if (!types->has_value()) return f.body().Missing("layer_types");
      bool any_kda = false, any_dsa = false;
      for (int i = 0; i < n; ++i) {
        const std::string& t = (**types)[i];
        if (t == "linear_attention") {
          m.layers[i].attention = AttentionKind::kKda;
          any_kda = true;
        } else if (t == "deepseek_sparse_attention") {
          m.layers[i].attention = AttentionKind::kDsa;
          any_dsa = true;
        } else if (t == "full_attention" || t == "mla") {
          m.layers[i].attention = AttentionKind::kMla;
        } else {
          return f.BadLayerType(i, t,
                                "linear_attention, deepseek_sparse_attention, full_attention");
        }
      }
      if (any_kda) {
        if (!f.body().Has("linear_attn_config")) {
          return absl::InvalidArgumentError(absl::StrCat(
              f.body().source(), ": missing field '", f.body().PathOf("linear_attn_config"),
              "' (layer_types has linear_attention layers)"));
        }
        auto lin = f.body().Child("linear_attn_config");
        if (!lin.ok()) return lin.status();
        STOWAGE_RETURN_IF_ERROR(lin->Read("num_heads", m.linear_heads, kDim));
        STOWAGE_RETURN_IF_ERROR(lin->Read("head_dim", m.linear_head_dim, kDim));
        m.short_conv_kernel = 4;
        STOWAGE_RETURN_IF_ERROR(
            lin->ReadOptional("short_conv_kernel_size", m.short_conv_kernel, kDim));
      }
      if (any_dsa) STOWAGE_RETURN_IF_ERROR(ReadIndexer(f, m));
      bool mhc = false;
      STOWAGE_RETURN_IF_ERROR(f.GetOr("mhc", false, mhc));
      if (mhc) STOWAGE_RETURN_IF_ERROR(f.GetOr("hc_mult", 4, m.hc_mult, kDim));
      break;
    }
    case Graph::kKimiLinear: {
      // KimiLinearConfig: MLA layers (q_lora_rank defaults to None) and KDA layers, DeepSeek
      // MoE with first_k_dense_replace defaulting to 1 (read from kwargs in its __post_init__).
      STOWAGE_RETURN_IF_ERROR(ReadMla(f, m));
      STOWAGE_RETURN_IF_ERROR(f.GetOr("num_key_value_heads", m.heads, m.kv_heads, kDim));
      STOWAGE_RETURN_IF_ERROR(ReadDeepSeekMoe(f, m));
      STOWAGE_RETURN_IF_ERROR(PlaceDeepSeekMoe(f, n, 1, m));
      // KimiLinearConfig.__post_init__: a checkpoint's linear_attn_config (how Moonshot's
      // config.json files carry KDA) overrides linear_num_heads / linear_head_dim /
      // linear_conv_kernel_dim, and its 1-based full_attn_layers + kda_layers give the layer
      // kinds unless layer_types is set; without either, every 4th layer from 4 (0-based) is MLA.
      std::optional<json::Object> lin;
      if (f.body().Has("linear_attn_config") &&
          !f.body().json().at("linear_attn_config").is_null()) {
        auto child = f.body().Child("linear_attn_config");
        if (!child.ok()) return child.status();
        lin = *child;
      }
      const auto linear_field = [&](const char* in_block, const char* top, int& out) {
        if (lin.has_value() && lin->Has(in_block)) return lin->Read(in_block, out, kDim);
        return f.Get(top, out, kDim);
      };
      STOWAGE_RETURN_IF_ERROR(linear_field("num_heads", "linear_num_heads", m.linear_heads));
      STOWAGE_RETURN_IF_ERROR(linear_field("head_dim", "linear_head_dim", m.linear_head_dim));
      STOWAGE_RETURN_IF_ERROR(
          linear_field("short_conv_kernel_size", "linear_conv_kernel_dim", m.short_conv_kernel));
      auto types = f.LayerTypes(n);
      if (!types.ok()) return types.status();
      if (!types->has_value() && lin.has_value() && lin->Has("full_attn_layers") &&
          lin->Has("kda_layers")) {
        auto listed = KimiLayerTypes(*lin, n);
        if (!listed.ok()) return listed.status();
        *types = *std::move(listed);
      }
      for (int i = 0; i < n; ++i) {
        bool full = types->has_value() ? (**types)[i] == "full_attention" : i && i % 4 == 0;
        if (types->has_value() && !full && (**types)[i] != "linear_attention") {
          return f.BadLayerType(i, (**types)[i], "linear_attention, full_attention");
        }
        m.layers[i].attention = full ? AttentionKind::kMla : AttentionKind::kKda;
      }
      break;
    }
    case Graph::kQwen3Next: {
      STOWAGE_RETURN_IF_ERROR(ReadAttention(f, family, m));
      m.attention_output_gate = true;
      STOWAGE_RETURN_IF_ERROR(f.Get("linear_num_key_heads", m.gdn_key_heads, kDim));
      STOWAGE_RETURN_IF_ERROR(f.Get("linear_num_value_heads", m.gdn_value_heads, kDim));
      STOWAGE_RETURN_IF_ERROR(f.Get("linear_key_head_dim", m.gdn_key_head_dim, kDim));
      STOWAGE_RETURN_IF_ERROR(f.Get("linear_value_head_dim", m.gdn_value_head_dim, kDim));
      STOWAGE_RETURN_IF_ERROR(f.Get("linear_conv_kernel_dim", m.short_conv_kernel, kDim));
      STOWAGE_RETURN_IF_ERROR(f.GetOr("intermediate_size", 0, m.intermediate, kCount));
      if (family != "qwen3_5_text") {
        STOWAGE_RETURN_IF_ERROR(f.Get("num_experts", m.experts, kCount));
        STOWAGE_RETURN_IF_ERROR(f.Get("num_experts_per_tok", m.experts_per_token, kCount));
        STOWAGE_RETURN_IF_ERROR(f.Get("moe_intermediate_size", m.moe_intermediate, kDim));
        STOWAGE_RETURN_IF_ERROR(
            f.GetOr("shared_expert_intermediate_size", 0, m.shared_intermediate, kCount));
        m.shared_expert_gate = m.shared_intermediate > 0;
        STOWAGE_RETURN_IF_ERROR(PlaceQwenMoe(f, n, m));
      }
      auto types = f.LayerTypes(n);
      if (!types.ok()) return types.status();
      int interval = 4;
      STOWAGE_RETURN_IF_ERROR(f.GetOr("full_attention_interval", 4, interval, kDim));
      for (int i = 0; i < n; ++i) {
        bool full = types->has_value() ? (**types)[i] == "full_attention" : (i + 1) % interval == 0;
        if (types->has_value() && !full && (**types)[i] != "linear_attention") {
          return f.BadLayerType(i, (**types)[i], "linear_attention, full_attention");
        }
        m.layers[i].attention = full ? AttentionKind::kAttention : AttentionKind::kGdn;
      }
      break;
    }
  }
  return absl::OkStatus();
}

// Note [Vision tokens]
// An Mllama cross-attention layer attends to the vision tower's states: MllamaModel.forward
// reshapes the projector's output to [batch, images x tiles x patches, hidden], each image padded
// to max_num_tiles tiles of num_patches = (image_size // patch_size)^2 + 1 (the class token)
// patches (MllamaVisionModel.__init__). The planner assumes one image per sequence at
// max_num_tiles, from the wrapper's vision_config or MllamaVisionConfig's defaults (image_size
// 448, patch_size 14, max_num_tiles 4: 4,100 tokens); --vision-tokens says otherwise.
absl::Status ReadVisionTokens(const json::Object& top, ModelConfig& m) {
  int image = 448, patch = 14, tiles = 4;
  std::string from = "MllamaVisionConfig's defaults";
  if (top.Has("vision_config") && !top.json().at("vision_config").is_null()) {
    auto vision = top.Child("vision_config");
    if (!vision.ok()) return vision.status();
    STOWAGE_RETURN_IF_ERROR(vision->ReadOptional("image_size", image, kDim));
    STOWAGE_RETURN_IF_ERROR(vision->ReadOptional("patch_size", patch, kDim));
    STOWAGE_RETURN_IF_ERROR(vision->ReadOptional("max_num_tiles", tiles, kDim));
    from = "vision_config";
  }
  if (image < patch) {
    return absl::InvalidArgumentError(
        absl::StrCat(top.source(), ": field 'vision_config.image_size' is ", image,
                     "; it must be at least patch_size (", patch, ")"));
  }
  const int64_t side = image / patch;
  const int64_t tokens = int64_t{tiles} * (side * side + 1);
  if (tokens > (1 << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(top.source(), ": vision_config gives ", tokens,
                     " vision tokens per image; allowed: at most 2^30"));
  }
  m.vision_tokens = static_cast<int>(tokens);
  m.notes.push_back(absl::StrCat(
      "cross-attention layers attend to ", tokens, " vision tokens per sequence: one image of ",
      tiles, " tiles x ", side * side + 1, " patches (", from,
      "); --vision-tokens changes it, 0 plans a text-only step (transformers skips the layers)"));
  return absl::OkStatus();
}

std::string QuantMethod(const Json& q) {
  auto it = q.find("quant_method");
  return it != q.end() && it->is_string() ? it->get<std::string>() : std::string("unnamed");
}

}  // namespace

absl::Status SetVisionTokens(ModelConfig& m, int vision_tokens) {
  bool cross = false;
  for (const LayerSpec& l : m.layers) cross |= l.cross_attention;
  if (!cross) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vision-tokens is ", vision_tokens, "; model '", m.name,
                     "' has no cross-attention layers (only Mllama's attend to vision tokens)"));
  }
  if (vision_tokens < 0 || vision_tokens > (1 << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vision-tokens is ", vision_tokens, "; allowed: 0 to 2^30"));
  }
  m.vision_tokens = vision_tokens;
  m.notes.push_back(absl::StrCat("--vision-tokens: cross-attention layers attend to ",
                                 vision_tokens, " vision tokens per sequence",
                                 vision_tokens == 0 ? " (a text-only step skips them)" : ""));
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseHfConfigJson(const std::string& text, const std::string& name) {
  const std::string source = absl::StrCat("model config ", name);
  auto parsed = json::Parse(text, source);
  if (!parsed.ok()) return parsed.status();
  auto top = json::Object::Of(*parsed, source);
  if (!top.ok()) return top.status();

  // Note [Family resolution].
  std::string arch, model_type, text_type;
  if (top->Has("architectures") && !top->json().at("architectures").is_null()) {
    auto archs = top->Array("architectures");
    if (!archs.ok()) return archs.status();
    if (!(*archs)->empty()) {
      STOWAGE_RETURN_IF_ERROR(json::ReadValue((**archs)[0], source, "architectures[0]", arch));
    }
  }
  STOWAGE_RETURN_IF_ERROR(top->ReadOptional("model_type", model_type));
  const bool nested = top->Has("text_config") && !top->json().at("text_config").is_null();
  std::optional<json::Object> text_config;
  if (nested) {
    auto tc = top->Child("text_config");
    if (!tc.ok()) return tc.status();
    text_config = *tc;
    STOWAGE_RETURN_IF_ERROR(text_config->ReadOptional("model_type", text_type));
  }
  const Family* fam = nullptr;
  std::string from;
  if (!arch.empty() && (fam = ByArchitecture(arch)) != nullptr) {
    from = absl::StrCat("architectures[0] '", arch, "'");
  } else if (!text_type.empty() && (fam = ByModelType(text_type)) != nullptr) {
    from = absl::StrCat("text_config.model_type '", text_type, "'");
  } else if (!model_type.empty() && (fam = ByModelType(model_type)) != nullptr) {
    from = absl::StrCat("model_type '", model_type, "'");
  }
  if (fam == nullptr) {
    std::vector<std::string> tried;
    if (!arch.empty())
      tried.push_back(absl::StrCat("architecture '", arch, "' (architectures[0])"));
    if (!text_type.empty()) {
      tried.push_back(absl::StrCat("'", text_type, "' (text_config.model_type)"));
    }
    if (!model_type.empty()) tried.push_back(absl::StrCat("'", model_type, "' (model_type)"));
    if (tried.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": missing fields 'architectures' and 'model_type'; supported families: ",
          SupportedList(), " (stowage plan --list-models shows their aliases)"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": unsupported model: ", absl::StrJoin(tried, ", "), "; supported families: ",
        SupportedList(), " (stowage plan --list-models shows their aliases)"));
  }

  ModelConfig m;
  m.name = name;
  m.family = fam->family;
  m.notes.push_back(absl::StrCat("read as family ", fam->family, " (from ", from, ")"));
  // Mllama's text config alone is MllamaForCausalLM's, which returns fp32 logits;
  // MllamaForConditionalGeneration's are bf16.
  m.fp32_logits = std::string_view(fam->family) == "mllama_text_model" &&
                  (arch == "MllamaForCausalLM" || (arch.empty() && !nested));
  if (nested) {
    m.notes.push_back(absl::StrCat("only the text decoder (text_config, ", fam->family,
                                   ") is planned; other towers in the config are not counted"));
  }
  const Defaults* defaults = DefaultsOf(fam->family);
  std::vector<std::string> taken;
  Fields fields(nested ? *text_config : *top, defaults, &taken);
  STOWAGE_RETURN_IF_ERROR(fields.CheckSpellings());
  STOWAGE_RETURN_IF_ERROR(ReadBody(fields, *fam, m));
  if (nested && !text_config->Has("tie_word_embeddings") && top->Has("tie_word_embeddings")) {
    // A wrapper ties the text decoder's embedding and head by its own flag (Qwen3VLConfig);
    // a default taken from the text config's class gives way to it.
    STOWAGE_RETURN_IF_ERROR(top->Read("tie_word_embeddings", m.tied_embeddings));
    std::erase_if(taken,
                  [](const std::string& t) { return t.starts_with("tie_word_embeddings="); });
  }
  if (!taken.empty()) {
    m.notes.push_back(absl::StrCat("absent fields took transformers' ",
                                   defaults != nullptr ? defaults->config_class : fam->family,
                                   " defaults: ", absl::StrJoin(taken, ", ")));
  }
  for (const json::Object* o : {&*top, nested ? &*text_config : nullptr}) {
    if (o == nullptr || !o->Has("quantization_config")) continue;
    const Json& q = o->json().at("quantization_config");
    if (q.is_null()) continue;
    m.notes.push_back(absl::StrCat(
        "quantization_config (", q.is_object() ? QuantMethod(q) : std::string("?"),
        ") is not used for training: weights are counted in bf16 with fp32 gradients and fp32 "
        "master weights + Adam state"));
    break;
  }
  if (fam->family == std::string("mllama_text_model")) {
    STOWAGE_RETURN_IF_ERROR(ReadVisionTokens(*top, m));
  }
  if (m.mtp_layers > 0) {
    m.notes.push_back(
        absl::StrCat(m.mtp_layers,
                     " multi-token-prediction module(s) (num_nextn_predict_layers) "
                     "counted in the parameters; --framework megatron trains them as layers "
                     "of the last stage unless --mtp-layers 0 (transformers does not load "
                     "them)"));
  }
  STOWAGE_RETURN_IF_ERROR(ValidateModel(m));
  return m;
}

}  // namespace stowage::planner
