// The simulator on instances small enough to work out by hand.
#include "planner/simulator.h"

#include <gtest/gtest.h>

namespace stowage::planner {
namespace {

// Copies at 100 B/s alone, 50 B/s each while both directions run; nothing fixed, no tail bytes.
StepCost Toy(int layers, double tail_seconds = 1) {
  StepCost step;
  step.layers.resize(layers);
  for (int i = 0; i < layers; ++i) step.layers[i].index = i;
  step.tail_seconds = tail_seconds;
  step.d2h_bytes_per_second = 100;
  step.h2d_bytes_per_second = 100;
  step.bidir_d2h_bytes_per_second = 50;
  step.bidir_h2d_bytes_per_second = 50;
  return step;
}

OptionCost Layer(uint64_t resident, uint64_t host, double fwd = 1, double rec = 0, double bwd = 2,
                 uint64_t fwd_peak = 0, uint64_t bwd_peak = 0) {
  OptionCost c;
  c.resident_bytes = resident;
  c.host_bytes = host;
  c.forward_seconds = fwd;
  c.recompute_seconds = rec;
  c.backward_seconds = bwd;
  c.forward_peak = std::max(fwd_peak, resident + host);
  c.backward_peak = std::max(bwd_peak, resident + host);
  return c;
}

TEST(Simulator, KeepEverythingIsComputeOnly) {
  const StepCost step = Toy(2);
  const SimResult r = Simulate(step, {Layer(10, 0), Layer(20, 0)}, 1, true);
  EXPECT_DOUBLE_EQ(r.step_seconds, 1 + 1 + 1 + 2 + 2);
  EXPECT_DOUBLE_EQ(r.exposed_copy_seconds, 0);
  EXPECT_EQ(r.peak_bytes, 30u);
  EXPECT_EQ(r.host_bytes, 0u);
  EXPECT_TRUE(r.copies.empty());
}

// The last layer's reload is issued when backward reaches it (the end of the loss) and cannot
// overlap anything: the whole H2D is exposed.
TEST(Simulator, ReloadOfTheLastLayerIsExposed) {
  const StepCost step = Toy(1);
  const SimResult r = Simulate(step, {Layer(0, 100, 1, 1, 2)}, 1, true);
  // forward [0,1], D2H [1,2] beside the loss [1,2], H2D [2,3], recompute + backward [3,6].
  EXPECT_DOUBLE_EQ(r.exposed_copy_seconds, 1);
  EXPECT_DOUBLE_EQ(r.step_seconds, 6);
  ASSERT_EQ(r.copies.size(), 2u);
  EXPECT_TRUE(r.copies[0].d2h);
  EXPECT_DOUBLE_EQ(r.copies[0].start, 1);
  EXPECT_DOUBLE_EQ(r.copies[0].end, 2);
  EXPECT_FALSE(r.copies[1].d2h);
  EXPECT_DOUBLE_EQ(r.copies[1].start, 2);
  EXPECT_DOUBLE_EQ(r.copies[1].end, 3);
}

// Layer 0 is prefetched while layer 1 runs backward: no wait.
TEST(Simulator, PrefetchHidesTheReload) {
  const StepCost step = Toy(2);
  const SimResult r = Simulate(step, {Layer(0, 100), Layer(5, 0)}, 1, true);
  // forward [0,1] [1,2]; D2H of layer 0 [1,2]; loss [2,3]; backward 1 [3,5] with the H2D of
  // layer 0 [3,4]; backward 0 [5,7].
  EXPECT_DOUBLE_EQ(r.exposed_copy_seconds, 0);
  EXPECT_DOUBLE_EQ(r.step_seconds, 7);
  // The offloaded bytes leave the GPU when the D2H completes and come back when the H2D starts.
  EXPECT_EQ(r.peak_bytes, 105u);
}

// A reload never starts before its own offload completes (the race that corrupts gradients).
TEST(Simulator, ReloadWaitsForItsOwnOffload) {
  const StepCost step = Toy(1, /*tail_seconds=*/0.1);
  const SimResult r = Simulate(step, {Layer(0, 300)}, 1, true);
  ASSERT_EQ(r.copies.size(), 2u);
  EXPECT_DOUBLE_EQ(r.copies[0].end, 4);    // D2H [1,4]
  EXPECT_DOUBLE_EQ(r.copies[1].start, 4);  // H2D starts when it completes, not at 1.1
  EXPECT_DOUBLE_EQ(r.exposed_copy_seconds, 7 - 1.1);
}

// Offloads queue on the one D2H engine in forward order, and reloads wait behind them: a
// reload is issued only after the offloads of every later layer (ahead of it in the queue) are
// done, so the two directions never overlap in this schedule shape.
TEST(Simulator, OffloadsQueueInOrder) {
  const StepCost step = Toy(3, /*tail_seconds=*/0.5);
  const SimResult r =
      Simulate(step, {Layer(0, 150, 1, 0, 2), Layer(0, 100, 0.5, 0, 2), Layer(0, 0)}, 2, true);
  // D2H 0 [1, 2.5]; D2H 1 ready at 1.5 but starts at 2.5, ends 3.5.
  ASSERT_GE(r.copies.size(), 2u);
  EXPECT_DOUBLE_EQ(r.copies[0].start, 1);
  EXPECT_DOUBLE_EQ(r.copies[0].end, 2.5);
  EXPECT_EQ(r.copies[1].layer, 1);
  EXPECT_DOUBLE_EQ(r.copies[1].start, 2.5);
  EXPECT_DOUBLE_EQ(r.copies[1].end, 3.5);
  for (const CopyInterval& h2d : r.copies) {
    if (h2d.d2h) continue;
    for (const CopyInterval& d2h : r.copies) {
      if (d2h.d2h) {
        EXPECT_LE(d2h.end, h2d.start + 1e-12);
      }
    }
  }
}

TEST(Simulator, TimelineStartsAndEndsAtFixedMemory) {
  StepCost step = Toy(2);
  step.fixed.weights = 1000;
  step.tail_bytes = 7;
  const SimResult r = Simulate(step, {Layer(10, 0, 1, 0, 2, 15, 30), Layer(0, 100)}, 1, true);
  ASSERT_FALSE(r.timeline.empty());
  EXPECT_EQ(r.timeline.front().bytes, 1000u);
  EXPECT_EQ(r.timeline.back().bytes, 1000u);
  uint64_t max = 0;
  for (const MemoryPoint& p : r.timeline) max = std::max(max, p.bytes);
  EXPECT_EQ(max, r.peak_bytes);
  EXPECT_DOUBLE_EQ(r.timeline.back().seconds, r.step_seconds);
}

}  // namespace
}  // namespace stowage::planner
