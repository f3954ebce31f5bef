// The model a Megatron-LM job trains, from its own arguments: see bridges/megatron_model.h.
#include "bridges/megatron_model.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace stowage::bridges {
namespace {

bool Has(const MegatronArgumentValues& args, const char* name) { return args.contains(name); }

absl::StatusOr<std::optional<int>> Int(const MegatronArgumentValues& args, const char* name,
                                       int min, int max, const std::string& source) {
  auto it = args.find(name);
  if (it == args.end()) return std::nullopt;
  int v = 0;
  if (!it->second.has_value() || !absl::SimpleAtoi(*it->second, &v) || v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": --", name, " is '", it->second.value_or(""),
                     "'; allowed: an integer in [", min, ", ", max, "]"));
  }
  return v;
}

std::string Text(const MegatronArgumentValues& args, const char* name) {
  auto it = args.find(name);
  return it == args.end() ? "" : it->second.value_or("");
}

}  // namespace

bool HasMegatronModel(const MegatronArgumentValues& args) {
  return Has(args, "num-layers") && Has(args, "hidden-size") && Has(args, "num-attention-heads");
}

std::optional<int> MegatronTokenizerVocab(const MegatronArgumentValues& args, std::string& origin) {
  int v = 0;
  if (absl::SimpleAtoi(Text(args, "vocab-size"), &v) && v > 0) {
    origin = absl::StrCat("--vocab-size ", v);
    return v;
  }
  const std::string type = Text(args, "tokenizer-type");
  if (type == "GPT2BPETokenizer") {  // gpt2-vocab.json: 50,257 tokens
    origin = "--tokenizer-type GPT2BPETokenizer (50257 tokens)";
    return 50257;
  }
  // Hugging Face tokenizers by name: len(tokenizer), as Megatron's HuggingFaceTokenizer reports
  // it (the base vocabulary and its added tokens).
  struct Known {
    const char* name;
    int tokens;
  };
  static constexpr Known kKnown[] = {
      {"deepseek-ai/DeepSeek-V3", 128815},    {"deepseek-ai/DeepSeek-R1", 128815},
      {"meta-llama/Meta-Llama-3-8B", 128256}, {"meta-llama/Llama-3.1-8B", 128256},
      {"mistralai/Mixtral-8x7B-v0.1", 32000}, {"openai/gpt-oss-20b", 201088},
      {"openai/gpt-oss-120b", 201088},
  };
  const std::string model = Text(args, "tokenizer-model");
  for (const Known& k : kKnown) {
    if (absl::EqualsIgnoreCase(model, k.name)) {
      origin = absl::StrCat("--tokenizer-model ", k.name, " (", k.tokens, " tokens)");
      return k.tokens;
    }
  }
  return std::nullopt;
}

absl::StatusOr<std::vector<bool>> MegatronMoeLayers(const std::string& value, int num_layers) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--moe-layer-freq is '", value, "'; ", why,
        " (allowed: an integer k, every k-th layer MoE, or a list such as ([0]*3+[1]*58))"));
  };
  int every = 0;
  if (absl::SimpleAtoi(value, &every)) {
    if (every < 1) return bad("k must be at least 1");
    std::vector<bool> out(num_layers);
    for (int i = 0; i < num_layers; ++i) out[i] = i % every == 0;
    return out;
  }
  absl::string_view text = absl::StripAsciiWhitespace(value);
  while (absl::ConsumePrefix(&text, "(") && absl::ConsumeSuffix(&text, ")")) {
    text = absl::StripAsciiWhitespace(text);
  }
  std::vector<bool> out;
  for (absl::string_view term : absl::StrSplit(text, '+')) {
    term = absl::StripAsciiWhitespace(term);
    const size_t close = term.rfind(']');
    if (!absl::ConsumePrefix(&term, "[") || close == absl::string_view::npos) {
      return bad(absl::StrCat("'", term, "' is not a list"));
    }
    absl::string_view body = term.substr(0, close - 1);
    absl::string_view repeat = absl::StripAsciiWhitespace(term.substr(close));
    int times = 1;
    if (!repeat.empty() && (!absl::ConsumePrefix(&repeat, "*") ||
                            !absl::SimpleAtoi(absl::StripAsciiWhitespace(repeat), &times) ||
                            times < 0 || times > planner::kMaxLayers)) {
      return bad(absl::StrCat("'", repeat, "' is not a repeat count"));
    }
    std::vector<bool> items;
    for (absl::string_view item : absl::StrSplit(body, ',', absl::SkipWhitespace())) {
      int bit = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &bit) || (bit != 0 && bit != 1)) {
        return bad(absl::StrCat("'", item, "' is not 0 or 1"));
      }
      items.push_back(bit == 1);
    }
    for (int k = 0; k < times; ++k) {
      if (out.size() + items.size() > static_cast<size_t>(planner::kMaxLayers)) {
        return bad("it lists more layers than a model can have");
      }
      out.insert(out.end(), items.begin(), items.end());
    }
  }
  if (static_cast<int>(out.size()) != num_layers) {
    return bad(absl::StrCat("it lists ", out.size(), " layers; --num-layers is ", num_layers));
  }
  return out;
}

absl::StatusOr<planner::ModelConfig> MegatronModel(const MegatronArgumentValues& args, int tp,
                                                   int vocab, const std::string& source,
                                                   std::vector<std::string>& notes) {
  const int kDim = planner::kMaxModelDim, kHeads = planner::kMaxHeads;
  auto get = [&](const char* name, int min, int max) { return Int(args, name, min, max, source); };
  auto layers = get("num-layers", 1, planner::kMaxLayers);
  auto hidden = get("hidden-size", 1, kDim);
  auto heads = get("num-attention-heads", 1, kHeads);
  auto ffn = get("ffn-hidden-size", 1, kDim);
  auto kv_channels = get("kv-channels", 1, kDim);
  auto groups = get("num-query-groups", 1, kHeads);
  auto experts = get("num-experts", 0, kHeads);
  auto topk = get("moe-router-topk", 1, kHeads);
  auto moe_ffn = get("moe-ffn-hidden-size", 1, kDim);
  auto shared = get("moe-shared-expert-intermediate-size", 0, kDim);
  auto q_lora = get("q-lora-rank", 0, kDim);
  auto kv_lora = get("kv-lora-rank", 1, kDim);
  auto qk_head = get("qk-head-dim", 1, kDim);
  auto qk_nope = get("qk-nope-head-dim", 1, kDim);
  auto qk_pos = get("qk-pos-emb-head-dim", 0, kDim);
  auto qk_rope = get("qk-rope-head-dim", 0, kDim);
  auto v_head = get("v-head-dim", 1, kDim);
  auto mtp = get("mtp-num-layers", 0, 64);
  auto divisible = get("make-vocab-size-divisible-by", 1, planner::kMaxVocab);
  auto max_positions = get("max-position-embeddings", 1, planner::kMaxVocab);
  for (const auto* v : {&layers, &hidden,  &heads,  &ffn,    &kv_channels, &groups,       &experts,
                        &topk,   &moe_ffn, &shared, &q_lora, &kv_lora,     &qk_head,      &qk_nope,
                        &qk_pos, &qk_rope, &v_head, &mtp,    &divisible,   &max_positions}) {
    if (!v->ok()) return v->status();
  }
  planner::ModelConfig m;
  m.name = absl::StrCat("the Megatron-LM arguments of ", source);
  m.family = "megatron";
  const int h = **hidden, n = **heads, num_layers = **layers;
  m.hidden = h;
  // arguments.py validate_args: --swiglu (and --quick-geglu, a GLU too) halves 4h to 8h/3.
  const bool gated = Has(args, "swiglu") || Has(args, "quick-geglu") || Has(args, "geglu");
  const int f = ffn->has_value() ? **ffn : (gated ? (4 * h * 2 / 3) / 64 * 64 : 4 * h);
  const bool bias = !Has(args, "disable-bias-linear");
  m.heads = n;
  m.head_dim = kv_channels->has_value() ? **kv_channels : h / n;
  if (!kv_channels->has_value() && h % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": --hidden-size ", h,
                                                   " does not divide over --num-attention-heads ",
                                                   n, "; Megatron asks for --kv-channels then"));
  }
  m.kv_heads = Has(args, "group-query-attention") ? groups->value_or(1) : n;
  if (n % m.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": --num-query-groups ", m.kv_heads,
                                                   " does not divide --num-attention-heads ", n));
  }
  m.qkv_bias = bias || Has(args, "add-qkv-bias");
  m.o_bias = bias;
  m.mlp_bias = bias;
  if (Has(args, "qk-layernorm")) m.qk_norm = planner::QkNorm::kPerHead;
  m.attention_sinks = Text(args, "softmax-type") == "learnable";
  m.tied_embeddings = !Has(args, "untie-embeddings-and-output-weights");
  const std::string positions = Text(args, "position-embedding-type");
  if ((positions.empty() || positions == "learned_absolute") &&
      !Has(args, "no-position-embedding")) {
    if (!max_positions->has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source,
                       ": learned absolute position embeddings (Megatron's default "
                       "--position-embedding-type) need --max-position-embeddings"));
    }
    m.extra_embedding_rows = **max_positions;  // the position table: rows of width hidden
  }
  const int multiple = divisible->value_or(128) * tp;
  m.vocab = static_cast<int>((static_cast<int64_t>(vocab) + multiple - 1) / multiple * multiple);
  m.mtp_layers = mtp->value_or(0);
  // Megatron builds the dense FFN as fc1 (h -> f, or 2f gated) and fc2; the planner models the
  // SwiGLU one, so a GeLU MLP is planned as the SwiGLU of equal weight and FLOPs (2/3 the
  // width): its activations differ, its parameters do not unless 2f is not a multiple of 3.
  auto planned_width = [&](int width) { return gated ? width : width * 2 / 3; };
  m.intermediate = planned_width(f);
  const bool mla = Has(args, "multi-latent-attention");
  std::vector<bool> moe(num_layers, false);
  if (experts->value_or(0) > 0) {
    m.experts = **experts;
    m.experts_per_token = topk->value_or(2);
    if (m.experts_per_token > m.experts) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": --moe-router-topk ",
                                                     m.experts_per_token, " exceeds --num-experts ",
                                                     m.experts));
    }
    m.moe_intermediate = planned_width(moe_ffn->value_or(f));
    m.shared_intermediate = planned_width(shared->value_or(0));
    m.shared_expert_gate = Has(args, "moe-shared-expert-gate");
    m.expert_bias = bias;
    auto freq = MegatronMoeLayers(
        args.contains("moe-layer-freq") ? Text(args, "moe-layer-freq") : "1", num_layers);
    if (!freq.ok())
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", freq.status().message()));
    moe = *std::move(freq);
  }
  if (mla) {
    m.q_lora_rank = q_lora->value_or(0);
    m.kv_lora_rank = kv_lora->value_or(32);
    m.qk_nope_head_dim = qk_head->has_value() ? **qk_head : qk_nope->value_or(128);
    m.qk_rope_head_dim = qk_pos->has_value() ? **qk_pos : qk_rope->value_or(64);
    m.v_head_dim = v_head->value_or(128);
    m.qk_norm = planner::QkNorm::kNone;
    if (!Has(args, "qk-layernorm")) {
      notes.push_back(absl::StrCat(
          source,
          ": without --qk-layernorm Megatron's MLA has no norms on its q and kv latents; "
          "the planner counts them (",
          m.q_lora_rank + m.kv_lora_rank, " parameters a layer)"));
    }
  }
  // Sliding-window attention: --window-size L,R on the layers --window-attn-skip-freq k leaves
  // (megatron/core/transformer/utils.py is_layer_window_attention: layer numbers from 1, those
  // with number % k == 0 attend to every key).
  int window = 0, skip = 0;
  if (const std::string w = Text(args, "window-size"); !w.empty()) {
    std::vector<std::string> parts = absl::StrSplit(w, ',');
    if (parts.empty() || !absl::SimpleAtoi(parts[0], &window) || window < 0 || window > kDim) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": --window-size is '", w, "'; allowed: LEFT,RIGHT key counts"));
    }
    ++window;  // the query's own key
    if (const std::string k = Text(args, "window-attn-skip-freq");
        !k.empty() && (!absl::SimpleAtoi(k, &skip) || skip < 1)) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": --window-attn-skip-freq is '", k,
                                                     "'; allowed: an integer k >= 1"));
    }
    m.sliding_window = window;
  }
  m.layers.resize(num_layers);
  for (int i = 0; i < num_layers; ++i) {
    planner::LayerSpec& l = m.layers[i];
    l.attention = mla ? planner::AttentionKind::kMla : planner::AttentionKind::kAttention;
    l.ffn = moe[i] ? planner::FfnKind::kMoe : planner::FfnKind::kDense;
    if (window > 0 && !mla && (skip == 0 || (i + 1) % skip != 0)) {
      l.span = planner::AttentionSpan::kSliding;
    }
  }
  // What the planner counts differently from Megatron-Core's modules.
  int64_t moved = 0;
  if (!gated) {
    moved += int64_t{num_layers} * (2 * int64_t{h} * f - 3 * int64_t{h} * m.intermediate);
    if (bias) moved += int64_t{num_layers} * (f - 2 * int64_t{m.intermediate});
  }
  const std::string norm = Text(args, "normalization");
  if (norm.empty() || norm == "LayerNorm") moved += (2 * int64_t{num_layers} + 1) * h;
  if (!gated || norm.empty() || norm == "LayerNorm") {
    notes.push_back(absl::StrCat(
        source, ": ",
        gated ? ""
              : "the GeLU MLP is planned as the SwiGLU of equal weight and "
                "FLOPs; ",
        norm.empty() || norm == "LayerNorm" ? "LayerNorm is planned as RMSNorm (no bias); " : "",
        "Megatron-Core holds ", moved, " more parameters than the planner counts"));
  }
  if (absl::Status s = planner::ValidateModel(m); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the model of its arguments: ", s.message()));
  }
  return m;
}

}  // namespace stowage::bridges
