// Small plans built in code for the runtime's tests.
#ifndef STOWAGE_TESTS_RUNTIME_TEST_PLANS_H_
#define STOWAGE_TESTS_RUNTIME_TEST_PLANS_H_

#include <algorithm>
#include <cstdint>

#include "stowage/plan.h"

namespace stowage::testing {

// A plan of `layers` layers; every `offload_every`-th layer offloads `bytes_per_layer` (as one
// transfer), the others keep.
inline Plan MakeTestPlan(int layers, uint64_t bytes_per_layer, int offload_every = 1,
                         int prefetch_distance = 1, uint64_t chunk_bytes = 64 << 10) {
  Plan plan;
  plan.generator = "conformance test";
  plan.runtime.prefetch_distance = prefetch_distance;
  plan.runtime.copy_chunk_bytes = chunk_bytes;
  for (int i = 0; i < layers; ++i) {
    LayerPlan layer;
    layer.index = i;
    layer.type = i % 4 == 3 ? "dsa+moe" : "kda+moe";
    if (i % offload_every == 0) {
      layer.policy = LayerPolicy::kOffloadInput;
      layer.host_bytes = bytes_per_layer;
      layer.transfers.push_back({"input", bytes_per_layer});
      const LayerProtocol protocol =
          LayerProtocolFor(i, layers, true, prefetch_distance, plan.runtime.save_lag);
      layer.save_wait_before_layer = protocol.save_wait_before_layer;
      layer.prefetch_after_layer = protocol.prefetch_after_layer;
    }
    plan.runtime.host_arena_bytes += layer.host_bytes;
    plan.layers.push_back(layer);
  }
  plan.predicted.host_bytes_per_gpu = plan.runtime.host_arena_bytes;
  return plan;
}

// A plan of `pp` stages of `layers_per_stage` layers each (in `vpp` chunks of equal size, chunk c
// of stage s being virtual stage c x pp + s) and `microbatches` microbatches, under 1F1B (vpp 1)
// or the interleaved schedule (vpp > 1); every layer offloads `bytes_per_layer`, each stage's
// arena holds its in-flight copies (Note [Pipeline stages]).
inline Plan MakePipelinedTestPlan(int pp, int layers_per_stage, int microbatches,
                                  uint64_t bytes_per_layer, int vpp = 1) {
  Plan plan = MakeTestPlan(pp * layers_per_stage, bytes_per_layer);
  plan.pp = pp;
  plan.vpp = vpp;
  plan.schedule = vpp > 1 ? PipelineSchedule::kInterleaved : PipelineSchedule::k1F1B;
  plan.microbatches = microbatches;
  plan.runtime.host_arena_bytes = 0;
  const int per_chunk = layers_per_stage / vpp;
  for (int s = 0; s < pp; ++s) {
    StagePlan stage;
    stage.stage = s;
    stage.prefetch_distance = plan.runtime.prefetch_distance;
    stage.embedding = s == 0;
    stage.lm_head = s == pp - 1;
    for (int c = 0; c < vpp; ++c) {
      const LayerRange chunk{(c * pp + s) * per_chunk, per_chunk};
      stage.chunks.push_back(chunk);
      const int in_flight = InFlightMicrobatches(plan.schedule, pp, vpp, microbatches, s, c);
      for (int i = chunk.first_layer; i < chunk.end(); ++i) {
        LayerPlan& layer = plan.layers[i];
        const LayerProtocol protocol =
            LayerProtocolFor(i, chunk, true, plan.runtime.prefetch_distance, plan.runtime.save_lag);
        layer.save_wait_before_layer = protocol.save_wait_before_layer;
        layer.prefetch_after_layer = protocol.prefetch_after_layer;
        layer.in_flight_microbatches = in_flight;
        stage.host_arena_bytes += layer.host_bytes * layer.in_flight_microbatches;
      }
    }
    stage.host_bytes_per_gpu = stage.host_arena_bytes;
    plan.runtime.host_arena_bytes = std::max(plan.runtime.host_arena_bytes, stage.host_arena_bytes);
    plan.stages.push_back(stage);
  }
  plan.predicted.host_bytes_per_gpu = plan.runtime.host_arena_bytes;
  return plan;
}

}  // namespace stowage::testing

#endif  // STOWAGE_TESTS_RUNTIME_TEST_PLANS_H_
