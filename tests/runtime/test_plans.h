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

}  // namespace stowage::testing

#endif  // STOWAGE_TESTS_RUNTIME_TEST_PLANS_H_
