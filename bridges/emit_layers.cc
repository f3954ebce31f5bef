// The words both emitters (megatron_emit.cc, torchtitan_emit.cc) use for a plan's layers and
// model chunks (bridges/emit_layers.h).
#include "bridges/emit_layers.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stowage::bridges {

std::string LayerList(const std::vector<int>& layers) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    runs.push_back(j == i ? absl::StrCat(layers[i]) : absl::StrCat(layers[i], "-", layers[j]));
    i = j + 1;
  }
  if (runs.size() == 1) return absl::StrCat(layers.size() == 1 ? "layer " : "layers ", runs[0]);
  const std::string last = runs.back();
  runs.pop_back();
  return absl::StrCat("layers ", absl::StrJoin(runs, ", "), " and ", last);
}

const char* Verb(const std::vector<int>& layers, const char* one, const char* many) {
  return layers.size() == 1 ? one : many;
}

std::vector<ChunkLayers> DecoderChunks(const Plan& plan, int decoder_layers) {
  const std::vector<StagePlan> stages = PlanStages(plan);
  std::vector<ChunkLayers> out;
  for (int c = 0; c < plan.vpp; ++c) {
    for (const StagePlan& stage : stages) {
      if (c >= static_cast<int>(stage.chunks.size())) continue;
      const LayerRange& r = stage.chunks[c];
      const int first = std::min(r.first_layer, decoder_layers);
      const int end = std::min(r.end(), decoder_layers);
      out.push_back({stage.stage, c, {first, end - first}});
    }
  }
  return out;
}

std::string StageLayer(const Plan& plan, const ChunkLayers& chunk, int layer) {
  std::vector<int> range;
  for (int i = chunk.layers.first_layer; i < chunk.layers.end(); ++i) range.push_back(i);
  return absl::StrCat("stage ", chunk.stage, "'s layer ", layer, " (of its ",
                      plan.vpp > 1 ? absl::StrCat("chunk ", chunk.chunk, ": ") : std::string(),
                      LayerList(range), ")");
}

}  // namespace stowage::bridges
