// MinimumPeak: where no plan fits, the smallest peak stowage's options reach within the host
// budget and which term binds (fixed memory, host memory, the LM head and loss, a layer's working
// set), for Optimize's infeasible answers.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "planner/search/optimizer.h"
#include "planner/search/optimizer_internal.h"

namespace stowage::planner {
namespace {

// What shrinks the LM head and loss, in the flags of the run's framework. Megatron's loss runs in
// --loss-chunk-tokens chunks (0: every token at once); transformers' loss (ForCausalLMLoss) always
// covers every token at once, and --framework hf refuses any other --loss-chunk-tokens
// (ValidateHfRun in planner/frameworks/hf_build_layer.cc), so there only fewer tokens per step
// help.
std::string LossAdvice(const RunSettings& run) {
  if (run.framework == Framework::kHf) {
    return "with --framework hf the loss covers every token at once (transformers' "
           "ForCausalLMLoss), so only fewer tokens per step shrink it: a shorter --seq-len or a "
           "smaller --micro-batch (--framework megatron computes it in --loss-chunk-tokens "
           "chunks)";
  }
  if (run.loss_chunk_tokens == 0) {
    return absl::StrCat("try --loss-chunk-tokens ", RunSettings{}.loss_chunk_tokens,
                        " (the LM head and loss in chunks of that many tokens; 0 takes every "
                        "token at once)");
  }
  return absl::StrCat("try a smaller --loss-chunk-tokens (now ", run.loss_chunk_tokens, ")");
}

}  // namespace

OptimizeResult MinimumPeak(const StepCost& step, const OptimizerOptions& o) {
  const uint64_t fixed = step.fixed.total();
  const int chunks = *std::max_element(o.chunk_counts.begin(), o.chunk_counts.end());
  // Offload every layer input the host budget takes (the rest recompute), largest chunks: the
  // least each layer keeps on the GPU and the smallest working sets.
  std::vector<LayerOption> options;
  uint64_t host = 0;
  bool host_limited = false;
  for (const LayerCost& l : step.layers) {
    LayerOption option{LayerPolicy::kRecompute, 0, l.ffn_chunkable ? chunks : 1};
    if (o.force.has_value()) {
      option.policy = *o.force;
    } else if (const uint64_t held =
                   l.input_bytes * static_cast<uint64_t>(std::max(
                                       1, l.in_flight_microbatches));  // CheckStepCostBounds
               host + held <= o.host_budget_bytes) {
      option.policy = LayerPolicy::kOffloadInput;
      host += held;
    } else {
      host_limited = true;
    }
    options.push_back(option);
  }
  OptimizeResult r = optimizer_internal::Finish(step, options, 1);
  r.feasible = false;
  r.min_peak_bytes = r.sim.peak_bytes;
  const std::string fixed_parts = absl::StrCat(
      "weights ", FormatBytes(step.fixed.weights), ", gradients ",
      FormatBytes(step.fixed.gradients), ", optimizer state ", FormatBytes(step.fixed.optimizer),
      ", communication buffers ", FormatBytes(step.fixed.comm_buffers),
      step.fixed.other > 0 ? absl::StrCat(", other ", FormatBytes(step.fixed.other)) : "");
  if (fixed >= o.gpu_budget_bytes) {
    r.binding = "fixed memory";
    r.explanation = absl::StrCat("fixed memory alone is ", FormatBytes(fixed), " (", fixed_parts,
                                 ") against a GPU budget of ", FormatBytes(o.gpu_budget_bytes));
  } else if (host_limited && !o.force.has_value()) {
    r.binding = "host memory";
    r.explanation = absl::StrCat("the host budget of ", FormatBytes(o.host_budget_bytes),
                                 " per GPU takes the inputs of only part of the layers; the rest "
                                 "stay on the GPU and the peak is ",
                                 FormatBytes(r.sim.peak_bytes));
  } else if (r.sim.peak_at == "LM head and loss") {
    r.binding = "LM head and loss";
    r.explanation =
        absl::StrCat("the LM head and loss need ", FormatBytes(step.tail_bytes), " on top of ",
                     FormatBytes(fixed), " fixed memory; ", LossAdvice(step.run));
  } else {
    r.binding = absl::StrCat("working set of the ", r.sim.peak_at);
    r.explanation = absl::StrCat("one layer's working set does not fit next to ",
                                 FormatBytes(fixed), " of fixed memory (", fixed_parts, ")");
  }
  return r;
}

}  // namespace stowage::planner
