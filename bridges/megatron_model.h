// The model a Megatron-LM job trains, from its own arguments (`stowage plan --from-megatron FILE`
// without --model): the same planner::ModelConfig that planner/model/ builds from a Hugging Face
// config.json, so its parameter count is what Megatron-Core's GPTModel holds
// (tests/python/cli/test_megatron_model.py checks it against megatron-core).
#ifndef STOWAGE_BRIDGES_MEGATRON_MODEL_H_
#define STOWAGE_BRIDGES_MEGATRON_MODEL_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/model/model.h"

namespace stowage::bridges {

// Argument name (dashes, no leading "--") -> its value (nullopt for a switch).
using MegatronArgumentValues = std::map<std::string, std::optional<std::string>>;

// True when the arguments describe a model: --num-layers, --hidden-size and
// --num-attention-heads are all given.
bool HasMegatronModel(const MegatronArgumentValues& args);

// The vocabulary Megatron's tokenizer reports before padding: --vocab-size, else the size of a
// tokenizer this reader knows (--tokenizer-type GPT2BPETokenizer, or a --tokenizer-model naming a
// known Hugging Face tokenizer), else nullopt. `origin` says which.
std::optional<int> MegatronTokenizerVocab(const MegatronArgumentValues& args, std::string& origin);

// Megatron's --moe-layer-freq: an integer k (every k-th layer, counting from the first, is MoE)
// or a Python list expression such as "([0]*3+[1]*58)" (1: MoE). Errors name the value.
absl::StatusOr<std::vector<bool>> MegatronMoeLayers(const std::string& value, int num_layers);

// Builds the model (megatron/training/arguments.py's defaults: --ffn-hidden-size 4h, or
// int(8h/3 / 64) * 64 with --swiglu; --kv-channels h / heads; LayerNorm, biases on, learned
// absolute positions and tied embeddings unless the arguments say otherwise). The vocabulary is
// `vocab` (the tokenizer's) padded to a multiple of --make-vocab-size-divisible-by x `tp`
// (megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding). What the planner
// models differently (a GeLU MLP as the SwiGLU of equal weight, LayerNorm as RMSNorm) is said
// in `notes` with the parameters it moves. Errors name `source`, the argument and its value.
absl::StatusOr<planner::ModelConfig> MegatronModel(const MegatronArgumentValues& args, int tp,
                                                   int vocab, const std::string& source,
                                                   std::vector<std::string>& notes);

}  // namespace stowage::bridges

#endif  // STOWAGE_BRIDGES_MEGATRON_MODEL_H_
