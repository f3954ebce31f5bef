// PipelineOrder: the order of forwards and backwards one pipeline stage runs, worked
// out by hand for small cases, and the order InFlightMicrobatches counts from.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "stowage/plan.h"

namespace stowage {
namespace {

// "F0 B0 F1" (vpp 1) or "F0.1" (chunk 0, microbatch 1).
std::string Text(const std::vector<PipelineOp>& order, bool chunks) {
  std::string out;
  for (const PipelineOp& op : order) {
    if (!out.empty()) out += ' ';
    out += op.forward ? 'F' : 'B';
    if (chunks) out += std::to_string(op.chunk) + ".";
    out += std::to_string(op.microbatch);
  }
  return out;
}

TEST(PipelineOrder, OneFOneBByHand) {
  // Stage 0 of 4: 3 warmup forwards, then a forward before each backward, then the rest.
  EXPECT_EQ(Text(PipelineOrder(PipelineSchedule::k1F1B, 4, 1, 6, 0), false),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(Text(PipelineOrder(PipelineSchedule::k1F1B, 4, 1, 6, 2), false),
            "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  // The last stage: no warmup.
  EXPECT_EQ(Text(PipelineOrder(PipelineSchedule::k1F1B, 4, 1, 3, 3), false), "F0 B0 F1 B1 F2 B2");
  // Fewer microbatches than the warmup: every forward first.
  EXPECT_EQ(Text(PipelineOrder(PipelineSchedule::k1F1B, 8, 1, 2, 0), false), "F0 F1 B0 B1");
}

TEST(PipelineOrder, GradientAccumulationByHand) {
  EXPECT_EQ(Text(PipelineOrder(PipelineSchedule::k1F1B, 1, 1, 3, 0), false), "F0 B0 F1 B1 F2 B2");
}

TEST(PipelineOrder, InterleavedByHand) {
  // pp 2, vpp 2, 4 microbatches. The schedule table runs groups of pp = 2 microbatches through
  // chunk 0 then chunk 1: forwards F0.0 F0.1 F1.0 F1.1 | F0.2 F0.3 F1.2 F1.3, backwards the same
  // with the chunks reversed. Stage 0 warms up 2 (pp - 0 - 1) + (vpp - 1) pp = 4 forwards.
  EXPECT_EQ(Text(PipelineOrder(PipelineSchedule::kInterleaved, 2, 2, 4, 0), true),
            "F0.0 F0.1 F1.0 F1.1 F0.2 B1.0 F0.3 B1.1 F1.2 B0.0 F1.3 B0.1 B1.2 B1.3 B0.2 B0.3");
  // Stage 1 warms up 2.
  EXPECT_EQ(Text(PipelineOrder(PipelineSchedule::kInterleaved, 2, 2, 4, 1), true),
            "F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 B1.3 B0.2 B0.3");
}

// Every order: each (chunk, microbatch) forward and backward exactly once, a backward after its
// forward, the chunks forward in order and backward in reverse; the most held of each chunk is
// InFlightMicrobatches (the one count the planner and the runtime's slots use).
TEST(PipelineOrder, IsAScheduleAndItsHeldCountIsInFlightMicrobatches) {
  struct Case {
    PipelineSchedule schedule;
    int pp, vpp, m;
  };
  std::vector<Case> cases;
  for (int pp : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 5, 8, 16, 17}) cases.push_back({PipelineSchedule::k1F1B, pp, 1, m});
  }
  for (int pp : {2, 3, 4}) {
    for (int vpp : {2, 3, 4}) {
      for (int groups : {1, 2, 3, 5}) {
        cases.push_back({PipelineSchedule::kInterleaved, pp, vpp, pp * groups});
      }
    }
  }
  for (const Case& c : cases) {
    for (int stage = 0; stage < c.pp; ++stage) {
      SCOPED_TRACE(::testing::Message()
                   << "pp " << c.pp << " vpp " << c.vpp << " m " << c.m << " stage " << stage);
      const std::vector<PipelineOp> order = PipelineOrder(c.schedule, c.pp, c.vpp, c.m, stage);
      ASSERT_EQ(order.size(), size_t{2} * c.m * c.vpp);
      std::map<std::pair<int, int>, int> forward_at, backward_at;
      std::vector<int> held(c.vpp, 0), most(c.vpp, 0);
      for (size_t k = 0; k < order.size(); ++k) {
        const PipelineOp& op = order[k];
        ASSERT_GE(op.chunk, 0);
        ASSERT_LT(op.chunk, c.vpp);
        ASSERT_GE(op.microbatch, 0);
        ASSERT_LT(op.microbatch, c.m);
        auto& at = op.forward ? forward_at : backward_at;
        ASSERT_TRUE(at.emplace(std::pair{op.chunk, op.microbatch}, static_cast<int>(k)).second);
        if (op.forward) {
          most[op.chunk] = std::max(most[op.chunk], ++held[op.chunk]);
          if (op.chunk > 0) {
            ASSERT_TRUE(forward_at.count({op.chunk - 1, op.microbatch}));
          }
        } else {
          ASSERT_TRUE(forward_at.count({op.chunk, op.microbatch}));
          --held[op.chunk];
          if (op.chunk + 1 < c.vpp) {
            ASSERT_TRUE(backward_at.count({op.chunk + 1, op.microbatch}));
          }
        }
      }
      for (int chunk = 0; chunk < c.vpp; ++chunk) {
        EXPECT_EQ(most[chunk], InFlightMicrobatches(c.schedule, c.pp, c.vpp, c.m, stage, chunk))
            << "chunk " << chunk;
      }
    }
  }
}

TEST(PipelineOrder, OutsideThePlanLimitsIsEmpty) {
  EXPECT_TRUE(PipelineOrder(PipelineSchedule::k1F1B, 0, 1, 4, 0).empty());
  EXPECT_TRUE(PipelineOrder(PipelineSchedule::k1F1B, 2, 1, 0, 0).empty());
  EXPECT_TRUE(PipelineOrder(PipelineSchedule::k1F1B, 2, 1, 4, 2).empty());
  EXPECT_TRUE(CheckPipelineRun(PipelineSchedule::k1F1B, 2, 2, 4).code() ==
              absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckPipelineRun(PipelineSchedule::kInterleaved, 2, 2, 3).code() ==
              absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckPipelineRun(PipelineSchedule::kInterleaved, 2, 2, 4).ok());
}

}  // namespace
}  // namespace stowage
