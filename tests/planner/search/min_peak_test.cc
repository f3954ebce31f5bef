// MinimumPeak's words when the LM head and loss bind: the advice names what shrinks them in the
// run's own framework (--framework hf refuses any --loss-chunk-tokens but 0, so advising a smaller
// one there was advice the planner itself would refuse).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "planner/search/optimizer.h"

namespace stowage::planner {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Two small layers and a loss far larger than the GPU budget: nothing fits, the loss binds.
StepCost LossBound(Framework framework, uint64_t loss_chunk_tokens) {
  StepCost step;
  step.run.framework = framework;
  step.run.loss_chunk_tokens = loss_chunk_tokens;
  step.fixed.weights = 100;
  step.tail_bytes = 1'000'000;
  step.tail_seconds = 1;
  step.d2h_bytes_per_second = step.h2d_bytes_per_second = 100;
  step.bidir_d2h_bytes_per_second = step.bidir_h2d_bytes_per_second = 50;
  for (int i = 0; i < 2; ++i) {
    LayerCost l;
    l.index = i;
    l.type = "toy";
    l.input_bytes = l.output_bytes = 10;
    l.saved.push_back({"input", "", 10});
    l.saved_bytes = 10;
    l.forward_seconds = 1;
    l.backward_seconds = 2;
    step.layers.push_back(l);
  }
  return step;
}

std::string Explanation(const StepCost& step) {
  OptimizerOptions o;
  o.gpu_budget_bytes = 1000;
  o.host_budget_bytes = 1000;
  const OptimizeResult r = Optimize(step, o);
  EXPECT_FALSE(r.feasible);
  EXPECT_EQ(r.binding, "LM head and loss");
  return r.explanation;
}

TEST(MinimumPeak, LossAdviceIsInTheFrameworksOwnFlags) {
  const std::string hf = Explanation(LossBound(Framework::kHf, 0));
  EXPECT_THAT(hf, Not(HasSubstr("try a smaller --loss-chunk-tokens")));
  EXPECT_THAT(hf, HasSubstr("with --framework hf the loss covers every token at once "
                            "(transformers' ForCausalLMLoss), so only fewer tokens per step "
                            "shrink it: a shorter --seq-len or a smaller --micro-batch"));
  EXPECT_THAT(Explanation(LossBound(Framework::kMegatron, 4096)),
              HasSubstr("; try a smaller --loss-chunk-tokens (now 4096)"));
  // 0 already takes every token at once: smaller is not a number to try; chunking is.
  EXPECT_THAT(Explanation(LossBound(Framework::kMegatron, 0)),
              HasSubstr("; try --loss-chunk-tokens 8192 (the LM head and loss in chunks of that "
                        "many tokens; 0 takes every token at once)"));
}

}  // namespace
}  // namespace stowage::planner
