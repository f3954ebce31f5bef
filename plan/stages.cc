// Where a plan's layers run and when their bytes move: the runtime protocol's two fields
// (LayerProtocolFor, Note [Runtime protocol]), the one stage of a plan without pipeline
// parallelism, and the stage and chunk of each layer (Note [Pipeline stages]).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "plan/plan_checks.h"
#include "stowage/plan.h"

namespace stowage {

LayerProtocol LayerProtocolFor(int layer, int num_layers, bool offloads, int prefetch_distance,
                               int save_lag) {
  LayerProtocol p;
  if (!offloads || layer < 0 || layer >= num_layers) return p;
  // 64-bit sums: a hand-written plan may carry distances near INT_MAX.
  p.save_wait_before_layer =
      static_cast<int>(std::min<int64_t>(int64_t{layer} + std::max(save_lag, 1), num_layers));
  p.prefetch_after_layer = static_cast<int>(
      std::min<int64_t>(int64_t{layer} + std::max(prefetch_distance, 1), num_layers - 1));
  return p;
}

LayerProtocol LayerProtocolFor(int layer, LayerRange chunk, bool offloads, int prefetch_distance,
                               int save_lag) {
  LayerProtocol p;
  const int64_t end = int64_t{chunk.first_layer} + chunk.num_layers;
  if (!offloads || layer < chunk.first_layer || layer >= end) return p;
  p.save_wait_before_layer =
      static_cast<int>(std::min<int64_t>(int64_t{layer} + std::max(save_lag, 1), end));
  p.prefetch_after_layer =
      static_cast<int>(std::min<int64_t>(int64_t{layer} + std::max(prefetch_distance, 1), end - 1));
  return p;
}

StagePlan StageWithoutPipeline(const Plan& plan) {
  StagePlan stage;
  stage.stage = 0;
  stage.chunks = {{0, static_cast<int>(plan.layers.size())}};
  stage.embedding = stage.lm_head = true;
  stage.prefetch_distance = plan.runtime.prefetch_distance;
  stage.peak_device_bytes = plan.predicted.peak_device_bytes;
  stage.fixed_device_bytes = plan.predicted.fixed_device_bytes;
  stage.host_bytes_per_gpu = plan.predicted.host_bytes_per_gpu;
  stage.host_arena_bytes = plan.runtime.host_arena_bytes;
  stage.microbatch_seconds = plan.predicted.step_seconds / std::max(1, plan.microbatches);
  stage.exposed_copy_seconds = plan.predicted.exposed_copy_seconds / std::max(1, plan.microbatches);
  return stage;
}

std::vector<StagePlan> PlanStages(const Plan& plan) {
  if (plan.stages.empty() && plan.pp == 1) return {StageWithoutPipeline(plan)};
  return plan.stages;
}

LayerPlace PlaceOfLayer(const Plan& plan, int layer) {
  for (const StagePlan& stage : PlanStages(plan)) {
    for (size_t c = 0; c < stage.chunks.size(); ++c) {
      const LayerRange& r = stage.chunks[c];
      if (layer >= r.first_layer && int64_t{layer} < int64_t{r.first_layer} + r.num_layers) {
        return {stage.stage, static_cast<int>(c)};
      }
    }
  }
  return {};
}

namespace plan_internal {

// Where each layer runs; the stages passed CheckStages.
std::vector<LayerPlace> PlacesOfLayers(const Plan& plan) {
  std::vector<LayerPlace> places(plan.layers.size());
  for (const StagePlan& st : plan.stages) {
    for (size_t c = 0; c < st.chunks.size(); ++c) {
      for (int i = st.chunks[c].first_layer; i < st.chunks[c].end(); ++i) {
        places[i] = {st.stage, static_cast<int>(c)};
      }
    }
  }
  return places;
}

}  // namespace plan_internal

}  // namespace stowage
