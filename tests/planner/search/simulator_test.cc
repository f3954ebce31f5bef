// The simulator on instances small enough to work out by hand.
#include "planner/search/simulator.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

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

// Note [Gradient timing]: gradients made in the backward (eager PyTorch). Each layer's
// backward_peak counts the gradients it has made by its peak; the rest come at its end; the tail
// leaves the held logits and the LM head's gradients; the embedding's come last. By hand, with
// the LM head's 7 B of gradients, 40 B of held logits in a 100 B tail, layer gradients 30 B
// (layer 0) and 50 B (layer 1), embedding 11 B, layer 0's input 4 B:
//   forward: 10, 30; tail: 130; tail end: 30 + 40 + 7 = 77, and at that instant the backward
//   of 1 starts: 77 - 20 + 80 = 137; its end: 137 - 80 + 50 = 107 (= 10 + 97), and the backward
//   of 0 starts: 107 - 10 + 65 = 162 (the peak); its end, the embedding's backward: 162 - 65 +
//   30 + 11 + 4 = 142, the 4 B the gradient the embedding receives (layer 0's input's). (The
//   timeline merges the events of one instant.) The regression: that gradient was not counted
//   at the end (138), where a short sequence with a large vocabulary peaks.
TEST(Simulator, GradientsAndHeldLogitsThroughTheBackward) {
  StepCost step = Toy(2);
  step.tail_bytes = 100;
  step.held_logits_bytes = 40;
  step.gradients_in_backward = true;
  step.tail_grad_bytes = 7;
  step.embedding_grad_bytes = 11;
  step.layers[0].grad_bytes = 30;
  step.layers[1].grad_bytes = 50;
  step.layers[0].input_bytes = 4;
  const BackwardHeld held = BackwardHeldBytes(step);
  EXPECT_EQ(held.in_layer, (std::vector<uint64_t>{97, 47}));
  EXPECT_EQ(held.at_end, 142u);
  const SimResult r =
      Simulate(step, {Layer(10, 0, 1, 0, 2, 0, 65), Layer(20, 0, 1, 0, 2, 0, 80)}, 1, true);
  EXPECT_EQ(r.peak_bytes, 162u);
  EXPECT_EQ(r.peak_at, "backward of layer 0");
  std::vector<uint64_t> levels;
  for (const MemoryPoint& p : r.timeline) levels.push_back(p.bytes);
  EXPECT_EQ(levels, (std::vector<uint64_t>{0, 10, 30, 130, 137, 162, 142}));
  // Without gradients made in backward (Megatron's buffers) only the held logits stay (40 B to
  // the end).
  step.gradients_in_backward = false;
  step.layers[0].grad_bytes = step.layers[1].grad_bytes = 0;
  const SimResult plain =
      Simulate(step, {Layer(10, 0, 1, 0, 2, 0, 65), Layer(20, 0, 1, 0, 2, 0, 80)}, 1, true);
  EXPECT_EQ(plain.timeline.back().bytes, 40u);
  EXPECT_EQ(plain.peak_bytes, 130u);  // the tail; the backward of 1: 30 + 40 - 20 + 80 = 130
}

// Note [Checkpoint-held inputs]: the step's masks, held by a recomputed layer's checkpoint (8 B,
// counted in that layer's own backward_peak), are alive in the loss and in the backward of
// every layer above it, kept ones included, and freed with the lowest holder's backward. By
// hand, layer 0 recomputed (resident 5, backward 30 with the masks), layers 1 and 2 kept
// (resident 20 and 10, backward 50 and 40), a 100 B tail:
//   forward 5, 25, 35; the tail 35 + 100 + 8 = 143; the backward of 2 starts 35 - 10 + 40 + 8 =
//   73; of 1: 73 - 48 - 20 + 58 = 63; of 0: 63 - 58 - 5 + 30 = 30; the end 0.
// The regression: the masks were counted in the holder's backward only (143 -> 135, 73 -> 65,
// 63 -> 55).
TEST(Simulator, CheckpointHeldInputsLiveUntilTheLowestHoldersBackward) {
  StepCost step = Toy(3);
  step.tail_bytes = 100;
  OptionCost holder = Layer(5, 0, 1, 1, 2, 0, 30);
  holder.checkpoint_held_bytes = 8;
  const std::vector<OptionCost> costs = {holder, Layer(20, 0, 1, 0, 2, 0, 50),
                                         Layer(10, 0, 1, 0, 2, 0, 40)};
  SimResult r = Simulate(step, costs, 1, true);
  std::vector<uint64_t> levels;
  for (const MemoryPoint& p : r.timeline) levels.push_back(p.bytes);
  EXPECT_EQ(levels, (std::vector<uint64_t>{0, 5, 25, 35, 143, 73, 63, 30, 0}));
  EXPECT_EQ(r.peak_bytes, 143u);
  EXPECT_EQ(r.peak_at, "LM head and loss");
  // A small tail: the kept layer 2's backward binds, with the masks.
  step.tail_bytes = 10;
  r = Simulate(step, costs, 1, false);
  EXPECT_EQ(r.peak_bytes, 73u);
  EXPECT_EQ(r.peak_at, "backward of layer 2");
  // Held once: a second holder (layer 2, its own backward_peak counting them) adds nothing.
  std::vector<OptionCost> two = costs;
  two[2].checkpoint_held_bytes = 8;
  two[2].backward_peak = 48;
  EXPECT_EQ(Simulate(step, two, 1, false).peak_bytes, 73u);
  // A holder above the kept layers only: they run their backward after it freed the masks.
  std::vector<OptionCost> above = {Layer(5, 0, 1, 0, 2, 0, 30), Layer(20, 0, 1, 0, 2, 0, 50),
                                   two[2]};
  r = Simulate(step, above, 1, true);
  levels.clear();
  for (const MemoryPoint& p : r.timeline) levels.push_back(p.bytes);
  // forward 5, 25, 35; tail 35 + 10 + 8 = 53; backward of 2: 35 - 10 + 48 = 73; of 1: 73 - 48
  // - 20 + 50 = 55; of 0: 55 - 50 - 5 + 30 = 30.
  EXPECT_EQ(levels, (std::vector<uint64_t>{0, 5, 25, 35, 53, 73, 55, 30, 0}));
}

// Two groups (LayerCost::checkpoint_held_group: Gemma 2's sliding and full masks), each held by
// its own checkpoints and counted once per group: layer 0 holds group 0's 8 B, layer 1 group
// 1's 6 B (in its own backward_peak, 56), layer 2 is kept. Tail 35 + 100 + 8 + 6 = 149;
// backward of 2: 25 + 40 + 14 = 79; of 1: 5 + 56 + 8 (group 0's, below it) = 69; of 0: 30.
// One group would hold the larger once: 143, 73, 5 + 56 + 2 = 63.
TEST(Simulator, CheckpointHeldGroupsAreEachHeldOnce) {
  StepCost step = Toy(3);
  step.tail_bytes = 100;
  OptionCost sliding = Layer(5, 0, 1, 1, 2, 0, 30);
  sliding.checkpoint_held_bytes = 8;
  OptionCost full = Layer(20, 0, 1, 1, 2, 0, 56);
  full.checkpoint_held_bytes = 6;
  const std::vector<OptionCost> costs = {sliding, full, Layer(10, 0, 1, 0, 2, 0, 40)};
  step.layers[1].checkpoint_held_group = 1;
  auto levels_of = [&](const StepCost& s) {
    std::vector<uint64_t> levels;
    for (const MemoryPoint& p : Simulate(s, costs, 1, true).timeline) levels.push_back(p.bytes);
    return levels;
  };
  EXPECT_EQ(levels_of(step), (std::vector<uint64_t>{0, 5, 25, 35, 149, 79, 69, 30, 0}));
  step.layers[1].checkpoint_held_group = 0;
  EXPECT_EQ(levels_of(step), (std::vector<uint64_t>{0, 5, 25, 35, 143, 73, 63, 30, 0}));
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
  // The offloaded bytes leave the GPU at the wait when backward starts (3) and come back when
  // the prefetch is issued (3).
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
// reload is issued only after the offloads of every layer are done (backward starts by waiting
// for them), so the two directions never overlap.
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

OptionCost OffloadInput(uint64_t host, double fwd, double bwd) {
  OptionCost c = Layer(0, host, fwd, /*rec=*/fwd, bwd);
  c.save_at_forward_start = true;
  return c;
}

std::string Events(const SimResult& r) {
  std::string out;
  for (const StepEvent& e : r.events) {
    absl::StrAppend(&out, out.empty() ? "" : " ", std::string(StepEventKindName(e.kind)), "(",
                    e.layer, ",", e.bytes, ")@", e.seconds);
  }
  return out;
}

// Note [Runtime protocol]: the forward of layer i + save_lag waits for layer i's save.
// forward 0 [0,1], its save issued at 1 (offload_saved: at forward end), D2H [1,4]; forward 1
// [1,2]; forward 2 waits for layer 0's save until 4 (2 s), runs [4,5]; loss [5,6]; backward 2
// [6,8]; at 8 the backward of layer 1 issues layer 0's prefetch (distance 1), H2D [8,11];
// backward 1 [8,10]; backward 0 restores at 10, waits until 11 (1 s), runs [11,13].
TEST(Simulator, ForwardWaitsForTheSaveLag) {
  const StepCost step = Toy(3);
  const SimResult r = Simulate(step, {Layer(0, 300), Layer(0, 0), Layer(0, 0)}, 1, true);
  EXPECT_DOUBLE_EQ(r.step_seconds, 13);
  EXPECT_DOUBLE_EQ(r.exposed_copy_seconds, 3);
  ASSERT_EQ(r.compute.size(), 9u);  // embedding, 3 forward, tail, 3 backward, embedding
  EXPECT_EQ(r.compute[3].layer, 2);
  EXPECT_DOUBLE_EQ(r.compute[3].start, 4);
  EXPECT_DOUBLE_EQ(r.compute[3].stall, 2);
  EXPECT_EQ(Events(r),
            "save_issued(0,300)@1 save_wait(0,300)@2 save_landed(0,300)@4 "
            "prefetch_issued(0,300)@8 restore(0,300)@10 prefetch_landed(0,300)@11");
}

// The device bytes of a save are freed at its wait, not when its D2H lands: layer 0's 100 bytes
// land at 2 (D2H [1,2]) but stay through layer 1's long forward [1,4] (10 bytes of its own).
// With save lag 2 they go when layer 2 starts (peak 110); with save lag 3 they wait for
// backward, beside layer 2's 80 bytes (peak 180).
TEST(Simulator, SaveBytesStayOnTheDeviceUntilTheWait) {
  const StepCost step = Toy(3);
  const std::vector<OptionCost> costs = {Layer(0, 100), Layer(0, 0, 3, 0, 2, 10, 0),
                                         Layer(0, 0, 1, 0, 2, 80, 0)};
  const SimResult lag2 = Simulate(step, costs, ProtocolFor(costs, 1, 2), true);
  EXPECT_EQ(lag2.peak_bytes, 110u);
  uint64_t at_3s = 0;  // the level in force at 3 s, after the D2H landed
  for (const MemoryPoint& p : lag2.timeline) {
    if (p.seconds <= 3) at_3s = p.bytes;
  }
  EXPECT_EQ(at_3s, 110u);
  const SimResult lag3 = Simulate(step, costs, ProtocolFor(costs, 1, 3), true);
  EXPECT_EQ(lag3.peak_bytes, 180u);
  EXPECT_EQ(lag3.peak_at, "forward of layer 2");
  EXPECT_DOUBLE_EQ(lag2.step_seconds, lag3.step_seconds);  // the D2H landed long before
}

// offload_input issues its save when the forward starts; prefetches triggered by one layer go
// highest layer first. forward 0 [0,1]; 1 [1,2] with D2H [1,2]; 2 [2,3] with D2H [2,3]; loss
// [3,4]; backward starts at 4: both saves waited for (landed), layer 2 then layer 1 prefetched
// (distance 2: both after layer 2), H2D [4,5] and [5,6]; backward 2 restores at 4, waits until 5,
// recompute + backward [5,8]; backward 1 restores at 8 (landed at 6), runs [8,11]; 0 [11,13].
TEST(Simulator, PrefetchesOfOneTriggerGoHighestFirst) {
  const StepCost step = Toy(3);
  const std::vector<OptionCost> costs = {Layer(0, 0), OffloadInput(100, 1, 2),
                                         OffloadInput(100, 1, 2)};
  const SimResult r = Simulate(step, costs, 2, true);
  EXPECT_DOUBLE_EQ(r.step_seconds, 13);
  EXPECT_DOUBLE_EQ(r.exposed_copy_seconds, 1);
  EXPECT_EQ(Events(r),
            "save_issued(1,100)@1 save_landed(1,100)@2 save_issued(2,100)@2 "
            "save_landed(2,100)@3 save_wait(1,100)@4 save_wait(2,100)@4 "
            "prefetch_issued(2,100)@4 prefetch_issued(1,100)@4 restore(2,100)@4 "
            "prefetch_landed(2,100)@5 prefetch_landed(1,100)@6 restore(1,100)@8");
}

// The plan's fields and the simulator come from one function.
TEST(Simulator, ProtocolIsTheOnePlanFunction) {
  const std::vector<OptionCost> costs = {Layer(0, 10), Layer(5, 0), Layer(0, 10), Layer(0, 10)};
  const std::vector<LayerProtocol> p = ProtocolFor(costs, 2, 2);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].save_wait_before_layer, 2);
  EXPECT_EQ(p[0].prefetch_after_layer, 2);
  EXPECT_EQ(p[1].save_wait_before_layer, -1);
  EXPECT_EQ(p[1].prefetch_after_layer, -1);
  EXPECT_EQ(p[2].save_wait_before_layer, 4);  // past the last layer: backward start
  EXPECT_EQ(p[2].prefetch_after_layer, 3);
  EXPECT_EQ(p[3].save_wait_before_layer, 4);
  EXPECT_EQ(p[3].prefetch_after_layer, 3);  // clamped to the last layer
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
