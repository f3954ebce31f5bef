// Model descriptions: the shapes the cost model counts bytes and FLOPs from. Embedded presets,
// or a Hugging Face config.json of a supported family.
#ifndef STOWAGE_PLANNER_MODEL_H_
#define STOWAGE_PLANNER_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stowage::planner {

// Input limits (docs/limits.md). They keep every byte, token and FLOP count the cost model,
// simulator and optimizer derive far from overflowing, and the optimizer's work bounded; see
// Note [Limits] in cost_model.cc. The config reader refuses a model beyond them. A request beyond
// one is refused up front, naming it.
inline constexpr int kMaxLayers = 10000;
inline constexpr uint64_t kMaxSeqLen = 1ull << 30;               // tokens per sequence
inline constexpr uint64_t kMaxTokensPerMicroBatch = 1ull << 32;  // seq_len x micro_batch
inline constexpr int kMaxParallel = 1 << 20;  // micro_batch, tp, cp, ep, gpus each
inline constexpr int kMaxModelDim = 1 << 20;  // hidden, intermediate, head dims, ranks
inline constexpr int kMaxHeads = 1 << 16;     // heads, kv heads, experts, top-k
inline constexpr int kMaxVocab = 1 << 24;
// No single tensor, working set or fixed-memory part may exceed this (64 PiB) ...
inline constexpr uint64_t kMaxTensorBytes = 1ull << 56;
// ... and all of one step's bytes together (every layer's largest option, fixed memory and the
// loss) stay below this, so sums of them in uint64 or int64 cannot wrap (4 EiB).
inline constexpr uint64_t kMaxStepBytes = 1ull << 62;

enum class AttentionKind {
  kAttention,  // multi-head / grouped-query attention with a flash-style kernel
  kMla,        // multi-head latent attention (DeepSeek-V3)
  kDsa,        // MLA with a lightning indexer choosing index_topk keys per query
  kKda,        // Kimi Delta Attention: gated delta-rule linear attention with short convs
  kGdn,        // gated DeltaNet (Qwen3-Next, Qwen3.5): delta-rule linear attention, scalar gates
};

// Which keys a softmax-attention query sees (kAttention only).
enum class AttentionSpan {
  kFull,     // every earlier key (causal)
  kSliding,  // the last sliding_window keys (Mistral, Gemma 2/3, gpt-oss, OLMo 3)
  kChunked,  // keys of its own attention_chunk-token chunk (Llama 4's RoPE layers)
};

// How per-head query/key RMSNorms are shaped.
enum class QkNorm {
  kNone,
  kPerHead,  // one head_dim weight shared by all heads (Qwen3, Gemma 3, GLM-4.5)
  kWhole,    // over the whole projection: heads * head_dim weights (OLMo 2/3)
  kL2,       // a weightless L2 norm per head (Llama 4's use_qk_norm, on its RoPE layers)
};

enum class FfnKind {
  kDense,  // SwiGLU
  kMoe,    // top-k routed experts plus shared experts
};

// "attention", "mla", "dsa", "kda", "gdn" / "dense_ffn", "moe".
const char* AttentionKindName(AttentionKind kind);
const char* FfnKindName(FfnKind kind);

struct LayerSpec {
  AttentionKind attention = AttentionKind::kAttention;
  FfnKind ffn = FfnKind::kDense;
  AttentionSpan span = AttentionSpan::kFull;
  // Mllama's cross-attention layers: keys and values come from the vision encoder's states;
  // the text-only step plans them as gated attention over the text (see hf_config.cc).
  bool cross_attention = false;
  // e.g. "kda+moe", "sliding_attention+dense_ffn"; the plan's layers[].type
  std::string TypeName() const;
};

struct ModelConfig {
  std::string name;
  // The family the config was read as (hf_families.cc's table), and what the reader wants the
  // user to know: only the text decoder of a multimodal config is planned, which fields took
  // transformers' defaults, a quantization_config that training does not use.
  std::string family;
  std::vector<std::string> notes;
  int hidden = 0;
  int vocab = 0;
  bool tied_embeddings = false;
  // Residual streams (mHC hyper-connections); 1 for a plain residual. A layer's input is
  // hc_mult x hidden wide.
  int hc_mult = 1;
  std::vector<LayerSpec> layers;

  // Extra embedding rows beyond vocab (Mllama's 8 image tokens).
  int extra_embedding_rows = 0;
  // Vision tokens each sequence's cross-attention layers attend to (Mllama: images x
  // max_num_tiles x ((image_size / patch_size)^2 + 1) patches); 0: a text-only step, in which
  // transformers skips those layers (MllamaTextModel.forward).
  int vision_tokens = 0;
  // The LM head's logits leave the model in fp32 (MllamaForCausalLM.forward:
  // `self.lm_head(hidden_states).float()`); other classes hand the loss bf16 logits.
  bool fp32_logits = false;
  int norms_per_layer = 2;  // RMSNorms on the residual path of one layer (Gemma 2/3: 4)
  // Multi-token prediction modules (DeepSeek-V3, GLM-4.5, GLM-5): each is one more decoder layer
  // of the last layer's kind plus two norms, a 2*hidden -> hidden projection and a final norm.
  int mtp_layers = 0;
  // Final-logit soft-capping (Gemma 2): logits * cap * tanh(logits / cap); 0: none.
  double final_logit_softcap = 0;

  // Softmax attention (kAttention).
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  bool qkv_bias = false;
  bool o_bias = false;
  QkNorm qk_norm = QkNorm::kNone;
  bool attention_sinks = false;        // a learned logit per head (gpt-oss)
  bool attention_output_gate = false;  // q_proj also yields a sigmoid output gate (Qwen3-Next)
  int sliding_window = 0;              // keys a kSliding query sees
  int attention_chunk = 0;             // chunk length of kChunked layers
  double attn_logit_softcap = 0;       // Gemma 2; applied inside the flash kernel
  // RoPE's rotated dims per head where the family's apply_rotary_pos_emb is the partial-rotary
  // form (GLM-4.5, Phi-3, Qwen3-Next, Qwen3.5: it rotates q[..., :rotary_dim] and cats the
  // passed-through rest back on): the width of transformers' cos/sin, from
  // int(head_dim * partial_rotary_factor) (hf_config.cc ReadAttention). 0: the family rotates
  // the whole head in place, no cat (Note [hf partial rotary] in planner/frameworks/).
  int rotary_dim = 0;
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
  int short_conv_kernel = 0;  // also the gated DeltaNet's
  // Gated DeltaNet (kGdn).
  int gdn_key_heads = 0;
  int gdn_value_heads = 0;
  int gdn_key_head_dim = 0;
  int gdn_value_head_dim = 0;
  // Dense FFN.
  int intermediate = 0;
  bool mlp_bias = false;
  // MoE.
  int experts = 0;
  int experts_per_token = 0;
  int moe_intermediate = 0;
  // Shared experts: their total intermediate width (DeepSeek: n_shared_experts x
  // moe_intermediate_size; Qwen2-MoE: shared_expert_intermediate_size); 0: none.
  int shared_intermediate = 0;
  bool shared_expert_gate = false;  // a sigmoid hidden -> 1 gate on the shared expert (Qwen)
  bool router_bias = false;         // the router linear has a trained bias (gpt-oss)
  bool expert_bias = false;         // expert projections have biases (gpt-oss)

  int num_layers() const { return static_cast<int>(layers.size()); }
};

// Names accepted by ModelPreset, in the order --help lists them. Presets are Hugging Face
// config.json text (model_presets.cc), read by ParseHfConfigJson like any user's config.
std::vector<std::string> ModelPresetNames();
absl::StatusOr<ModelConfig> ModelPreset(const std::string& name);

// The families ParseHfConfigJson reads, with the architectures and model_types that name each.
struct ModelFamilyInfo {
  std::string family;  // the text decoder's model_type in transformers
  std::string config_class;
  std::vector<std::string> architectures;
  std::vector<std::string> model_types;
};
std::vector<ModelFamilyInfo> ModelFamilies();
// `stowage plan --list-models`: families with their aliases, and presets.
std::string ListModelsText();

// `stowage plan --vision-tokens N`: what a model's cross-attention layers attend to, in place of
// the one image its config implies; refused for a model without cross-attention layers.
absl::Status SetVisionTokens(ModelConfig& model, int vision_tokens);

// Checks the fields the layer kinds present need; errors name the field and its value.
absl::Status ValidateModel(const ModelConfig& model);

// The family is found by `architectures[0]`, then `text_config.model_type`, then `model_type`
// (ModelFamilies()). A nested `text_config` (multimodal configs) is read in place of the top
// level; fields it leaves out take the defaults of transformers' configuration class
// (hf_defaults.inc). Numbers are read strictly (base/json_reader.h); errors name the source, the
// field's JSON path, the value and what is allowed.
absl::StatusOr<ModelConfig> ParseHfConfigJson(const std::string& json, const std::string& name);
absl::StatusOr<ModelConfig> ReadHfConfigFile(const std::string& path);

// Whole-model parameter counts of one layer: everything but the routed experts (replicated or
// split by TP), and the routed experts (split by EP).
uint64_t DenseLayerParams(const ModelConfig& model, const LayerSpec& layer);
uint64_t RoutedExpertParams(const ModelConfig& model, const LayerSpec& layer);
// Parts of DenseLayerParams: the FFN/MoE block's dense parameters (the MLP, or the router, shared
// experts and their gate), and the attention's output side, what runs after its core (o_proj and
// its bias; linear attention's output norm and out_proj).
uint64_t FfnDenseParams(const ModelConfig& model, const LayerSpec& layer);
uint64_t AttentionOutputParams(const ModelConfig& model, const LayerSpec& layer);
// Embedding, LM head (unless tied) and final norm.
uint64_t EmbeddingParams(const ModelConfig& model);
// One multi-token-prediction module, all of it but its routed experts / its routed experts (the
// embedding and output head are shared with the main model, as Megatron-Core trains them).
uint64_t MtpDenseParams(const ModelConfig& model);
uint64_t MtpRoutedExpertParams(const ModelConfig& model);
// The same for `depths` MTP modules of the model's kind (a run may train another count:
// --mtp-layers).
uint64_t MtpDenseParams(const ModelConfig& model, int depths);
uint64_t MtpRoutedExpertParams(const ModelConfig& model, int depths);
// Every trained parameter: what `model_parameters` in the plan and the table report.
uint64_t ModelParameters(const ModelConfig& model);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_MODEL_H_
