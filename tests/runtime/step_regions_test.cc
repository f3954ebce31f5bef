// StepRegions: the per-layer host regions of a step, sized from the plan with checked sums.
#include "runtime/step_regions.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "tests/runtime/test_plans.h"

namespace stowage::runtime {
namespace {

using ::testing::HasSubstr;

TEST(StepRegions, SizesComeFromThePlanTransfers) {
  Plan plan = testing::MakeTestPlan(3, 1000, /*offload_every=*/2);  // layers 0 and 2 offload
  absl::StatusOr<StepRegions> regions = StepRegions::FromPlan(plan);
  ASSERT_TRUE(regions.ok()) << regions.status();
  EXPECT_EQ(regions->size(), 3);
  EXPECT_TRUE(regions->reserved(0));
  EXPECT_FALSE(regions->reserved(1));
  // 1000 aligned to 1024, plus the slack, per offloading layer.
  EXPECT_EQ(regions->arena_bytes(), 2 * (1024 + kRegionSlack));
}

// Regression: the runtime summed the plan's transfer sizes unchecked, so a transfer
// of 2^64-1 bytes wrapped to a tiny region. It is an error naming the layer and the transfer.
TEST(StepRegions, ATransferThatWouldWrapIsOutOfRange) {
  Plan plan = testing::MakeTestPlan(2, 4096);
  plan.layers[1].transfers = {{"input", UINT64_MAX}, {"more", 1}};
  absl::StatusOr<StepRegions> regions = StepRegions::FromPlan(plan);
  ASSERT_EQ(regions.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(regions.status().message()), HasSubstr("layer 1"));
  EXPECT_THAT(std::string(regions.status().message()), HasSubstr("18446744073709551615"));
  plan.layers[1].transfers = {{"input", UINT64_MAX - 4096}};  // aligned fits, + slack does not
  EXPECT_EQ(StepRegions::FromPlan(plan).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(StepRegions, PlacesAlignedUntilTheSlackIsUsedThenPacks) {
  Plan plan = testing::MakeTestPlan(1, 64 * 1024);
  absl::StatusOr<StepRegions> regions = StepRegions::FromPlan(plan);
  ASSERT_TRUE(regions.ok()) << regions.status();
  offload::ArenaOptions arena_options;
  arena_options.bytes = regions->arena_bytes();
  arena_options.skip_admission = true;
  absl::StatusOr<std::unique_ptr<offload::PinnedArena>> arena =
      offload::PinnedArena::Create(arena_options);
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_TRUE(regions->Carve(arena->get()).ok());
  // 1-byte saves: the first 17 start 256-aligned (16 slack blocks of padding), then they pack.
  std::byte* previous = nullptr;
  for (int i = 0; i < 40; ++i) {
    absl::StatusOr<SlotPlacement> at = regions->Place(0, 0, 1);
    ASSERT_TRUE(at.ok()) << i << ": " << at.status();
    if (i <= 16) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(at->host) % kSaveAlignment, 0u) << i;
    }
    if (i > 17) {
      EXPECT_EQ(at->host, previous + 1) << i;
    }
    previous = at->host;
  }
  EXPECT_EQ(regions->saved(0), 40u);
  // Exactly the plan's bytes fit; one more, or a size that would wrap, does not.
  ASSERT_TRUE(regions->Place(0, 0, 64 * 1024 - 40).ok());
  EXPECT_EQ(regions->Place(0, 0, 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(regions->Place(0, 0, UINT64_MAX).status().code(), absl::StatusCode::kResourceExhausted);
  regions->Release();
  EXPECT_EQ(regions->saved(0), 0u);
}

// Note [Microbatch slots]: in_flight_microbatches slots per layer, each the plan's bytes; a slot
// goes to the next microbatch once its saves ended and were all restored.
TEST(StepRegions, SlotsPerInFlightMicrobatchAreReusedAfterRestore) {
  Plan plan = testing::MakeTestPlan(1, 1000);
  plan.layers[0].in_flight_microbatches = 2;
  plan.microbatches = 5;
  absl::StatusOr<StepRegions> regions = StepRegions::FromPlan(plan);
  ASSERT_TRUE(regions.ok()) << regions.status();
  EXPECT_EQ(regions->slots(0), 2);
  EXPECT_EQ(regions->arena_bytes(), 2 * (1024 + kRegionSlack));
  offload::ArenaOptions arena_options;
  arena_options.bytes = regions->arena_bytes();
  arena_options.skip_admission = true;
  absl::StatusOr<std::unique_ptr<offload::PinnedArena>> arena =
      offload::PinnedArena::Create(arena_options);
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_TRUE(regions->Carve(arena->get()).ok());
  absl::StatusOr<SlotPlacement> m0 = regions->Place(0, 0, 1000);
  absl::StatusOr<SlotPlacement> m1 = regions->Place(0, 1, 1000);
  ASSERT_TRUE(m0.ok() && m1.ok());
  EXPECT_NE(m0->slot, m1->slot);
  EXPECT_EQ(regions->Place(0, 2, 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(regions->Place(0, 5, 1).status().code(), absl::StatusCode::kInvalidArgument);
  // Microbatch 0's saves ended when 1 saved: its restore frees the slot, and 2 takes it with
  // the fence of the H2D that read it.
  regions->Restored(0, 0, nullptr);
  absl::StatusOr<SlotPlacement> m2 = regions->Place(0, 2, 1000);
  ASSERT_TRUE(m2.ok()) << m2.status();
  EXPECT_EQ(m2->slot, m0->slot);
  EXPECT_EQ(m2->host, m0->host);
  EXPECT_EQ(regions->Place(0, 0, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(regions->saved(0), 3000u);
  EXPECT_THAT(regions->InFlightText(0), HasSubstr("microbatches 1, 2 in flight of the 2"));
  regions->Release();
  EXPECT_EQ(regions->saved(0), 0u);
}

}  // namespace
}  // namespace stowage::runtime
