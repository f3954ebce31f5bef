// Model presets: the published config.json numbers of the models users ask about most, as
// config data read by the same Hugging Face reader as a user's file (hf_config.cc). Only the
// fields the planner reads are kept. `stowage plan --list-models` prints them with their
// parameter counts.
namespace stowage::planner {

struct PresetText {
  const char* name;
  const char* json;
};

extern const PresetText kModelPresets[];
extern const int kModelPresetCount;

const PresetText kModelPresets[] = {
    // GLM-5.3-Flash config.json, the text model's fields
    {"glm-5.3-flash", R"json({
 "model_type": "glm5_next",
 "num_hidden_layers": 45,
 "hidden_size": 4096,
 "intermediate_size": 12288,
 "num_attention_heads": 64,
 "num_key_value_heads": 64,
 "vocab_size": 154880,
 "max_position_embeddings": 1048576,
 "hidden_act": "silu",
 "torch_dtype": "bfloat16",
 "first_k_dense_replace": 3,
 "layer_types": [
  "linear_attention",
  "linear_attention",
  "linear_attention",
  "deepseek_sparse_attention",
  "linear_attention",
  "linear_attention",
  "linear_attention",
  "deepseek_sparse_attention",
  "linear_attention",
  "linear_attention",
  "linear_attention",
  "deepseek_sparse_attention",
  "linear_attention",
  "linear_attention",
  "linear_attention",
  "deepseek_sparse_attention",
  "linear_attention",
  "linear_attention",
  "linear_attention",
  "deepseek_sparse_attention",
  "linear_attention",
  "linear_attention",
  "linear_attention",
  "deepseek_sparse_attention",
  "linear_attention",
  "linear_attention",
  "linear_attention",
  "deepseek_sparse_attention",
  "linear_attention",
  "linear_attention",
  "linear_attention",
  "deepseek_sparse_attention",
  "linear_attention",
  "linear_attention",
  "linear_attention",
  "deepseek_sparse_attention",
  "linear_attention",
  "linear_attention",
  "linear_attention",
  "deepseek_sparse_attention",
  "linear_attention",
  "linear_attention",
  "linear_attention",
  "deepseek_sparse_attention",
  "linear_attention"
 ],
 "linear_attn_config": {
  "num_heads": 64,
  "head_dim": 128,
  "short_conv_kernel_size": 4,
  "gate_lower_bound": -5.0
 },
 "kv_lora_rank": 512,
 "q_lora_rank": 1536,
 "qk_nope_head_dim": 256,
 "qk_rope_head_dim": 0,
 "v_head_dim": 256,
 "index_n_heads": 32,
 "index_head_dim": 128,
 "index_topk": 2048,
 "n_routed_experts": 288,
 "n_shared_experts": 1,
 "num_experts_per_tok": 8,
 "moe_intermediate_size": 2048,
 "scoring_func": "sigmoid",
 "routed_scaling_factor": 2.5,
 "mhc": true,
 "hc_mult": 4,
 "num_nextn_predict_layers": 1
})json"},
    // meta-llama/Meta-Llama-3-8B config.json
    {"llama-3-8b", R"json({
 "architectures": [
  "LlamaForCausalLM"
 ],
 "model_type": "llama",
 "hidden_size": 4096,
 "intermediate_size": 14336,
 "num_hidden_layers": 32,
 "num_attention_heads": 32,
 "num_key_value_heads": 8,
 "vocab_size": 128256,
 "tie_word_embeddings": false
})json"},
    // meta-llama/Llama-3.1-8B config.json
    {"llama-3.1-8b", R"json({
 "architectures": [
  "LlamaForCausalLM"
 ],
 "model_type": "llama",
 "hidden_size": 4096,
 "intermediate_size": 14336,
 "num_hidden_layers": 32,
 "num_attention_heads": 32,
 "num_key_value_heads": 8,
 "vocab_size": 128256,
 "tie_word_embeddings": false
})json"},
    // meta-llama/Llama-3.1-70B config.json
    {"llama-3.1-70b", R"json({
 "architectures": [
  "LlamaForCausalLM"
 ],
 "model_type": "llama",
 "hidden_size": 8192,
 "intermediate_size": 28672,
 "num_hidden_layers": 80,
 "num_attention_heads": 64,
 "num_key_value_heads": 8,
 "vocab_size": 128256,
 "tie_word_embeddings": false
})json"},
    // meta-llama/Llama-3.1-405B config.json
    {"llama-3.1-405b", R"json({
 "architectures": [
  "LlamaForCausalLM"
 ],
 "model_type": "llama",
 "hidden_size": 16384,
 "intermediate_size": 53248,
 "num_hidden_layers": 126,
 "num_attention_heads": 128,
 "num_key_value_heads": 8,
 "vocab_size": 128256,
 "tie_word_embeddings": false
})json"},
    // Qwen/Qwen3-8B config.json
    {"qwen3-8b", R"json({
 "architectures": [
  "Qwen3ForCausalLM"
 ],
 "model_type": "qwen3",
 "hidden_size": 4096,
 "intermediate_size": 12288,
 "num_hidden_layers": 36,
 "num_attention_heads": 32,
 "num_key_value_heads": 8,
 "head_dim": 128,
 "vocab_size": 151936,
 "tie_word_embeddings": false
})json"},
    // Qwen/Qwen3-32B config.json
    {"qwen3-32b", R"json({
 "architectures": [
  "Qwen3ForCausalLM"
 ],
 "model_type": "qwen3",
 "hidden_size": 5120,
 "intermediate_size": 25600,
 "num_hidden_layers": 64,
 "num_attention_heads": 64,
 "num_key_value_heads": 8,
 "head_dim": 128,
 "vocab_size": 151936,
 "tie_word_embeddings": false
})json"},
    // Qwen/Qwen3-30B-A3B config.json
    {"qwen3-30b-a3b", R"json({
 "architectures": [
  "Qwen3MoeForCausalLM"
 ],
 "model_type": "qwen3_moe",
 "hidden_size": 2048,
 "intermediate_size": 6144,
 "moe_intermediate_size": 768,
 "num_hidden_layers": 48,
 "num_attention_heads": 32,
 "num_key_value_heads": 4,
 "head_dim": 128,
 "num_experts": 128,
 "num_experts_per_tok": 8,
 "decoder_sparse_step": 1,
 "mlp_only_layers": [],
 "vocab_size": 151936,
 "tie_word_embeddings": false
})json"},
    // Qwen/Qwen3-235B-A22B config.json
    {"qwen3-235b-a22b", R"json({
 "architectures": [
  "Qwen3MoeForCausalLM"
 ],
 "model_type": "qwen3_moe",
 "hidden_size": 4096,
 "intermediate_size": 12288,
 "moe_intermediate_size": 1536,
 "num_hidden_layers": 94,
 "num_attention_heads": 64,
 "num_key_value_heads": 4,
 "head_dim": 128,
 "num_experts": 128,
 "num_experts_per_tok": 8,
 "decoder_sparse_step": 1,
 "mlp_only_layers": [],
 "vocab_size": 151936,
 "tie_word_embeddings": false
})json"},
    // deepseek-ai/DeepSeek-V3 config.json
    {"deepseek-v3", R"json({
 "architectures": [
  "DeepseekV3ForCausalLM"
 ],
 "model_type": "deepseek_v3",
 "hidden_size": 7168,
 "intermediate_size": 18432,
 "moe_intermediate_size": 2048,
 "num_hidden_layers": 61,
 "num_attention_heads": 128,
 "num_key_value_heads": 128,
 "n_shared_experts": 1,
 "n_routed_experts": 256,
 "q_lora_rank": 1536,
 "kv_lora_rank": 512,
 "qk_nope_head_dim": 128,
 "qk_rope_head_dim": 64,
 "v_head_dim": 128,
 "num_experts_per_tok": 8,
 "first_k_dense_replace": 3,
 "moe_layer_freq": 1,
 "num_nextn_predict_layers": 1,
 "vocab_size": 129280,
 "tie_word_embeddings": false
})json"},
    // moonshotai/Kimi-K2-Instruct config.json
    {"kimi-k2", R"json({
 "architectures": [
  "DeepseekV3ForCausalLM"
 ],
 "model_type": "kimi_k2",
 "hidden_size": 7168,
 "intermediate_size": 18432,
 "moe_intermediate_size": 2048,
 "num_hidden_layers": 61,
 "num_attention_heads": 64,
 "num_key_value_heads": 64,
 "n_shared_experts": 1,
 "n_routed_experts": 384,
 "q_lora_rank": 1536,
 "kv_lora_rank": 512,
 "qk_nope_head_dim": 128,
 "qk_rope_head_dim": 64,
 "v_head_dim": 128,
 "num_experts_per_tok": 8,
 "first_k_dense_replace": 1,
 "moe_layer_freq": 1,
 "num_nextn_predict_layers": 0,
 "vocab_size": 163840,
 "tie_word_embeddings": false
})json"},
    // zai-org/GLM-4.5 config.json
    {"glm-4.5", R"json({
 "architectures": [
  "Glm4MoeForCausalLM"
 ],
 "model_type": "glm4_moe",
 "hidden_size": 5120,
 "intermediate_size": 12288,
 "moe_intermediate_size": 1536,
 "num_hidden_layers": 92,
 "num_attention_heads": 96,
 "num_key_value_heads": 8,
 "n_shared_experts": 1,
 "n_routed_experts": 160,
 "num_experts_per_tok": 8,
 "first_k_dense_replace": 3,
 "num_nextn_predict_layers": 1,
 "vocab_size": 151552,
 "tie_word_embeddings": false,
 "head_dim": 128,
 "attention_bias": true,
 "use_qk_norm": true
})json"},
    // openai/gpt-oss-120b config.json
    {"gpt-oss-120b", R"json({
 "architectures": [
  "GptOssForCausalLM"
 ],
 "model_type": "gpt_oss",
 "hidden_size": 2880,
 "intermediate_size": 2880,
 "num_hidden_layers": 36,
 "num_attention_heads": 64,
 "num_key_value_heads": 8,
 "head_dim": 64,
 "num_local_experts": 128,
 "num_experts_per_tok": 4,
 "attention_bias": true,
 "sliding_window": 128,
 "layer_types": [
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "full_attention"
 ],
 "vocab_size": 201088,
 "tie_word_embeddings": false
})json"},
    // mistralai/Mixtral-8x22B-v0.1 config.json
    {"mixtral-8x22b", R"json({
 "architectures": [
  "MixtralForCausalLM"
 ],
 "model_type": "mixtral",
 "hidden_size": 6144,
 "intermediate_size": 16384,
 "num_hidden_layers": 56,
 "num_attention_heads": 48,
 "num_key_value_heads": 8,
 "num_local_experts": 8,
 "num_experts_per_tok": 2,
 "sliding_window": null,
 "vocab_size": 32768,
 "tie_word_embeddings": false
})json"},
};
const int kModelPresetCount = sizeof(kModelPresets) / sizeof(kModelPresets[0]);

}  // namespace stowage::planner
