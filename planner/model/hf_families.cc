// The Hugging Face model families the config reader knows, and their lookups (hf_families.h);
// ModelFamilies (planner/model/model.h) lists them.
#include "planner/model/hf_families.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "planner/model/model.h"

namespace stowage::planner {
namespace hf_config {

const std::vector<Family>& Families() {
  static const std::vector<Family> kFamilies = {
      {"llama", Graph::kDense, {"LlamaForCausalLM"}, {"llama"}},
      {"mistral", Graph::kDense, {"MistralForCausalLM"}, {"mistral"}},
      {"ministral", Graph::kDense, {"MinistralForCausalLM"}, {"ministral"}},
      {"ministral3",
       Graph::kDense,
       {"Ministral3ForCausalLM", "Mistral3ForConditionalGeneration"},
       {"ministral3", "mistral3"}},
      {"qwen2", Graph::kDense, {"Qwen2ForCausalLM"}, {"qwen2"}},
      {"qwen2_5_vl_text",
       Graph::kDense,
       {"Qwen2_5_VLForConditionalGeneration"},
       {"qwen2_5_vl_text", "qwen2_5_vl"}},
      {"qwen3", Graph::kDense, {"Qwen3ForCausalLM"}, {"qwen3"}},
      {"qwen3_vl_text",
       Graph::kDense,
       {"Qwen3VLForConditionalGeneration"},
       {"qwen3_vl_text", "qwen3_vl"}},
      {"phi3", Graph::kDense, {"Phi3ForCausalLM"}, {"phi3"}},
      {"olmo2", Graph::kDense, {"Olmo2ForCausalLM"}, {"olmo2"}},
      {"olmo3", Graph::kDense, {"Olmo3ForCausalLM"}, {"olmo3"}},
      {"gemma2", Graph::kDense, {"Gemma2ForCausalLM"}, {"gemma2"}},
      {"gemma3_text",
       Graph::kDense,
       {"Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"},
       {"gemma3_text", "gemma3"}},
      {"mllama_text_model",
       Graph::kDense,
       {"MllamaForConditionalGeneration", "MllamaForCausalLM"},
       {"mllama_text_model", "mllama"}},
      {"mixtral", Graph::kMoe, {"MixtralForCausalLM"}, {"mixtral"}},
      {"qwen2_moe", Graph::kMoe, {"Qwen2MoeForCausalLM"}, {"qwen2_moe"}},
      {"qwen3_moe", Graph::kMoe, {"Qwen3MoeForCausalLM"}, {"qwen3_moe"}},
      {"qwen3_vl_moe_text",
       Graph::kMoe,
       {"Qwen3VLMoeForConditionalGeneration"},
       {"qwen3_vl_moe_text", "qwen3_vl_moe"}},
      {"gpt_oss", Graph::kMoe, {"GptOssForCausalLM"}, {"gpt_oss"}},
      {"llama4_text",
       Graph::kMoe,
       {"Llama4ForCausalLM", "Llama4ForConditionalGeneration"},
       {"llama4_text", "llama4"}},
      {"glm4_moe", Graph::kMoe, {"Glm4MoeForCausalLM"}, {"glm4_moe"}},
      {"deepseek_v2", Graph::kMla, {"DeepseekV2ForCausalLM"}, {"deepseek_v2"}},
      {"deepseek_v3", Graph::kMla, {"DeepseekV3ForCausalLM"}, {"deepseek_v3", "kimi_k2"}},
      {"deepseek_v32", Graph::kMla, {"DeepseekV32ForCausalLM"}, {"deepseek_v32"}},
      {"glm_moe_dsa", Graph::kMla, {"GlmMoeDsaForCausalLM"}, {"glm_moe_dsa"}},
      {"glm5_next", Graph::kGlm5Next, {}, {"glm5_next"}},
      {"kimi_linear", Graph::kKimiLinear, {"KimiLinearForCausalLM"}, {"kimi_linear"}},
      {"qwen3_next", Graph::kQwen3Next, {"Qwen3NextForCausalLM"}, {"qwen3_next"}},
      {"qwen3_5_text",
       Graph::kQwen3Next,
       {"Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"},
       {"qwen3_5_text", "qwen3_5"}},
      {"qwen3_5_moe_text",
       Graph::kQwen3Next,
       {"Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"},
       {"qwen3_5_moe_text", "qwen3_5_moe"}},
  };
  return kFamilies;
}

namespace {

constexpr Defaults kDefaults[] = {
#include "planner/model/hf_defaults.inc"
};

}  // namespace

const Defaults* DefaultsOf(const std::string& family) {
  for (const Defaults& d : kDefaults) {
    if (family == d.family) return &d;
  }
  return nullptr;
}

std::string SupportedList() {
  std::vector<std::string> names;
  for (const Family& f : Families()) names.push_back(f.family);
  return absl::StrJoin(names, ", ");
}

const Family* ByArchitecture(const std::string& arch) {
  for (const Family& f : Families()) {
    for (const char* a : f.architectures) {
      if (arch == a) return &f;
    }
  }
  return nullptr;
}

const Family* ByModelType(const std::string& type) {
  for (const Family& f : Families()) {
    for (const char* t : f.model_types) {
      if (type == t) return &f;
    }
  }
  return nullptr;
}

}  // namespace hf_config

std::vector<ModelFamilyInfo> ModelFamilies() {
  using hf_config::Defaults;
  using hf_config::Family;
  std::vector<ModelFamilyInfo> out;
  for (const Family& f : hf_config::Families()) {
    ModelFamilyInfo info;
    info.family = f.family;
    const Defaults* d = hf_config::DefaultsOf(f.family);
    info.config_class = d != nullptr ? d->config_class : "";
    for (const char* a : f.architectures) info.architectures.push_back(a);
    for (const char* t : f.model_types) info.model_types.push_back(t);
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace stowage::planner
