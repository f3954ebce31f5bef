// The Hugging Face model families the config reader knows (planner/model/hf_config.cc, Note
// [Family resolution]): each family's graph, the architectures and model_types that name it, and
// the defaults of its transformers configuration class (hf_defaults.inc).
#ifndef STOWAGE_PLANNER_MODEL_HF_FAMILIES_H_
#define STOWAGE_PLANNER_MODEL_HF_FAMILIES_H_

#include <string>
#include <vector>

namespace stowage::planner::hf_config {

enum class Graph {
  kDense,       // softmax attention + dense FFN on every layer (Llama, Qwen2/3, Gemma, OLMo, ...)
  kMoe,         // softmax attention + MoE (Mixtral, Qwen-MoE, gpt-oss, Llama 4, GLM-4.5)
  kMla,         // MLA (+ DSA indexer) with DeepSeek MoE (DeepSeek-V2/V3/V3.2, Kimi-K2, GLM-5)
  kGlm5Next,    // KDA + DSA + MLA hybrid with mHC (GLM-5.3-Flash)
  kKimiLinear,  // KDA + MLA hybrid with DeepSeek MoE
  kQwen3Next,   // gated DeltaNet + gated attention, with or without MoE (Qwen3-Next, Qwen3.5)
};

struct Family {
  const char* family;
  Graph graph;
  std::vector<const char*> architectures;
  std::vector<const char*> model_types;  // the text model_type first, then wrappers and aliases
};

// Every family (kFamilies), in the order ModelFamilies (model.h) lists them.
const std::vector<Family>& Families();

struct Defaults {
  const char* family;
  const char* config_class;
  const char* json;
  // The class's attribute_map: {spelling, attribute}; transformers reads either spelling of a
  // field into one attribute (Moonshot's num_experts is KimiLinearConfig's num_local_experts).
  const char* attribute_map;
};

// The defaults of `family`'s configuration class; null for a family without them.
const Defaults* DefaultsOf(const std::string& family);

// The families' names, comma-separated, for errors.
std::string SupportedList();

// The family named by an architecture (`architectures[0]`) or a model_type; null if none is.
const Family* ByArchitecture(const std::string& arch);
const Family* ByModelType(const std::string& type);

}  // namespace stowage::planner::hf_config

#endif  // STOWAGE_PLANNER_MODEL_HF_FAMILIES_H_
