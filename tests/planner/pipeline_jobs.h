// Run settings of pipeline jobs that several planner tests plan.
#ifndef STOWAGE_TESTS_PLANNER_PIPELINE_JOBS_H_
#define STOWAGE_TESTS_PLANNER_PIPELINE_JOBS_H_

#include "planner/cost/cost_model.h"

namespace stowage::planner::jobs {

// The large pipeline job: DeepSeek-V3 on 2,048 GPUs, PP 16 (1F1B, 16 microbatches), EP 64, 4K
// tokens, distributed optimizer, the layout Megatron users give its 61 layers.
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

}  // namespace stowage::planner::jobs

#endif  // STOWAGE_TESTS_PLANNER_PIPELINE_JOBS_H_
