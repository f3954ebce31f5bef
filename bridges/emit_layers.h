// What both emitters (bridges/megatron_emit.h, bridges/torchtitan_emit.h) share: the plan's
// decoder layers by model chunk, and the words their notes and refusals name layers in.
#ifndef STOWAGE_BRIDGES_EMIT_LAYERS_H_
#define STOWAGE_BRIDGES_EMIT_LAYERS_H_

#include <string>
#include <vector>

#include "stowage/plan.h"

namespace stowage::bridges {

// "layers 3-7 and 12" for {3,4,5,6,7,12}.
std::string LayerList(const std::vector<int>& layers);

// The verb for LayerList(layers): `one` for a single layer, `many` otherwise.
const char* Verb(const std::vector<int>& layers, const char* one, const char* many);

// The decoder layers of one model chunk (Note [Pipeline stages]; the MTP depths,
// Note [MTP layers], left out): the chunk's layers within [0, decoder layers).
struct ChunkLayers {
  int stage = 0;
  int chunk = 0;
  LayerRange layers;
};

// Every chunk in virtual-stage order (v = chunk x pp + stage), which is layer order.
std::vector<ChunkLayers> DecoderChunks(const Plan& plan, int decoder_layers);

// "stage 2's layer 19 (of its chunk 1: layers 16-23)"; without virtual stages "stage 2's layer
// 19 (of its layers 16-23)".
std::string StageLayer(const Plan& plan, const ChunkLayers& chunk, int layer);

}  // namespace stowage::bridges

#endif  // STOWAGE_BRIDGES_EMIT_LAYERS_H_
