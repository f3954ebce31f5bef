// A small pipelined run that the pipeline layout and pipeline tests both plan.
#ifndef STOWAGE_TESTS_PLANNER_PIPELINE_RUNS_H_
#define STOWAGE_TESTS_PLANNER_PIPELINE_RUNS_H_

#include "planner/cost/run_settings.h"

namespace stowage::planner {

// 8K tokens on 64 GPUs, no context or expert parallelism, `pp` stages, `microbatches`.
inline RunSettings PpRun(int pp, int microbatches) {
  RunSettings run;
  run.seq_len = 8192;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 64;
  run.pp = pp;
  run.microbatches = microbatches;
  return run;
}

}  // namespace stowage::planner

#endif  // STOWAGE_TESTS_PLANNER_PIPELINE_RUNS_H_
