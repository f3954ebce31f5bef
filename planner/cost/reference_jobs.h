// The jobs stowage plans when told nothing, and the published job its benchmarks and tests plan:
// one home for their names and settings (the CLI, plan requests, `stowage bench plan` and the
// tests all read them here).
#ifndef STOWAGE_PLANNER_COST_REFERENCE_JOBS_H_
#define STOWAGE_PLANNER_COST_REFERENCE_JOBS_H_

#include "planner/cost/run_settings.h"

namespace stowage::planner {

// `stowage plan` with no flags, and a plan request without "model" / "hardware": the reference
// run, GLM-5.3-Flash at 1M tokens on B200s (its run settings: DefaultRunSettings).
inline constexpr char kDefaultModel[] = "glm-5.3-flash";
inline constexpr char kDefaultHardware[] = "b200";

// The published large pipeline job: DeepSeek-V3 on 2,048 GPUs, PP 16 (1F1B, 16 microbatches),
// EP 64, 4K tokens, distributed optimizer, the layout Megatron users give its 61 layers (3 dense
// layers and 58 MoE layers over 16 stages, the last one lighter for the LM head).
inline constexpr char kDeepSeekV3Pp16Model[] = "deepseek-v3";
inline RunSettings DeepSeekV3Pp16Job() {
  RunSettings run;
  run.seq_len = 4096;
  run.tp = 1;
  run.cp = 1;
  run.ep = 64;
  run.gpus = 2048;
  run.pp = 16;
  run.microbatches = 16;
  run.sharding = Sharding::kOptim;
  run.pp_layout = {3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2};
  return run;
}

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_COST_REFERENCE_JOBS_H_
