/* Creates a host-backend runtime from a one-layer plan and runs one step through the C ABI alone;
 * exits non-zero if any call fails. Built by CMake (find_package) and by pkg-config. */
#include <stdio.h>
#include <string.h>

#include "stowage/stowage.h"

int main(void) {
  int32_t major = 0, minor = 0, patch = 0, abi = 0;
  if (stowage_get_version(&major, &minor, &patch, &abi) != STOWAGE_OK) return 1;
  if (major != STOWAGE_VERSION_MAJOR || minor != STOWAGE_VERSION_MINOR) {
    fprintf(stderr, "header %s but library %d.%d.%d\n", STOWAGE_VERSION_STRING, major, minor,
            patch);
    return 1;
  }
  stowage_options options;
  if (stowage_options_init(&options) != STOWAGE_OK) return 1;
  options.backend = STOWAGE_BACKEND_HOST;
  /* One layer kept on the device: the smallest complete plan (every field is required). */
  static const char kPlan[] =
      "{\"schema_version\":1,\"generator\":\"c-consumer\",\"model\":\"\",\"hardware\":\"\",\"run\":"
      "{\"se"
      "q_len\":0,\"micro_batch\":1,\"tp\":1,\"cp\":1,\"ep\":1,\"gpu_budget_bytes\":0,\"host_budget_"
      "bytes\":0},\"predicted\":{\"peak_device_bytes\":0,\"fixed_device_bytes\":0,\"host_bytes_"
      "per_gpu\":0,\"host_bytes_per_numa_node\":0,\"step_seconds\":0.0,\"exposed_copy_seconds"
      "\":0.0,\"baseline\":\"\",\"baseline_step_seconds\":0.0},\"runtime\":{\"prefetch_distance\":"
      "1,\"save_lag\":2,\"host_arena_bytes\":0,\"copy_chunk_bytes\":16777216,\"gpus_per_numa_n"
      "ode\":1,\"link_bytes_per_second\":0.0},\"layers\":[{\"index\":0,\"type\":\"t\",\"policy\":"
      "\"ke"
      "ep\",\"device_saved_bytes\":0,\"host_bytes\":0,\"transfers\":[],\"prefetch_after_layer\":"
      "-1,\"ffn_chunks\":1,\"forward_seconds\":0.0,\"backward_seconds\":0.0,\"recompute_second"
      "s\":0.0,\"d2h_seconds\":0.0,\"h2d_seconds\":0.0}]}";
  stowage_runtime* rt = NULL;
  if (stowage_create(kPlan, strlen(kPlan), &options, &rt) != STOWAGE_OK) {
    fprintf(stderr, "stowage_create: %s\n", stowage_last_error());
    return 1;
  }
  int ok = stowage_begin_step(rt) == STOWAGE_OK && stowage_end_step(rt) == STOWAGE_OK;
  if (!ok) fprintf(stderr, "step: %s\n", stowage_last_error());
  stowage_destroy(rt);
  if (!ok) return 1;
  printf("stowage %s C consumer ok\n", stowage_version());
  return 0;
}
