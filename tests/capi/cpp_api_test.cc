// The C++ API (stowage.hpp) over the C ABI, on the host backend.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "stowage/plan.h"
#include "stowage/stowage.hpp"
#include "tests/runtime/test_plans.h"

namespace {

stowage::Options HostOptions() {
  stowage::Options options;
  options.backend = STOWAGE_BACKEND_HOST;
  options.copy_threads = 1;
  options.metrics_address = "";
  return options;
}

TEST(CppApi, RoundTripThroughStepGuard) {
  const std::string plan = stowage::PlanToJson(stowage::testing::MakeTestPlan(2, 1024));
  stowage::StatusOr<stowage::Runtime> rt = stowage::Runtime::Create(plan, HostOptions());
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  std::vector<uint8_t> src(1000), dst(1000, 0);
  std::iota(src.begin(), src.end(), uint8_t{1});
  {
    stowage::StatusOr<stowage::Step> step = stowage::Step::Begin(*rt);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    stowage::StatusOr<stowage::TensorId> id = rt->Save(1, src.data(), src.size());
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    ASSERT_TRUE(rt->SaveWait(*id).ok());
    stowage::StatusOr<bool> done = rt->SaveQuery(*id);
    ASSERT_TRUE(done.ok());
    EXPECT_TRUE(*done);
    ASSERT_TRUE(rt->Restore(*id, dst.data()).ok());
    EXPECT_EQ(dst, src);
    const stowage::Status again = rt->Restore(*id, dst.data());
    EXPECT_EQ(again.code(), STOWAGE_ERROR_FAILED_PRECONDITION);
    EXPECT_NE(again.message().find("already restored"), std::string::npos) << again.ToString();
    EXPECT_TRUE(step->End().ok());
    EXPECT_EQ(step->End().code(), STOWAGE_ERROR_FAILED_PRECONDITION);
  }
  stowage::StatusOr<stowage::Stats> stats = rt->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->steps_completed, 1u);
  EXPECT_EQ(stats->errors_total, 1u);
  stowage::StatusOr<stowage::LayerInfo> info = rt->GetLayerInfo(0);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->prefetch_after_layer, 1);
  EXPECT_EQ(*rt->NumLayers(), 2);
}

TEST(CppApi, GuardEndsTheStepOnEarlyExitAndRuntimeMoves) {
  const std::string plan = stowage::PlanToJson(stowage::testing::MakeTestPlan(1, 64));
  stowage::StatusOr<stowage::Runtime> created = stowage::Runtime::Create(plan, HostOptions());
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  stowage::Runtime rt = std::move(created).value();
  std::vector<uint8_t> src(64, 7);
  for (int i = 0; i < 3; ++i) {
    stowage::StatusOr<stowage::Step> step = stowage::Step::Begin(rt);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    stowage::StatusOr<stowage::TensorId> id = rt.Save(0, src.data(), src.size());
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE(rt.SaveWait(*id).ok());
    // Leaves the scope without End or Restore, as an exception would.
  }
  EXPECT_EQ(rt.GetStats()->steps_completed, 3u);
  // Destroying a runtime with a step open ends the step first.
  ASSERT_TRUE(rt.BeginStep().ok());
}

TEST(CppApi, CreateErrorsCarryTheMessage) {
  stowage::StatusOr<stowage::Runtime> rt = stowage::Runtime::Create("{not json", HostOptions());
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(rt.status().message().find("JSON"), std::string::npos) << rt.status().ToString();
}

// Gradient accumulation through the C++ API: 3 microbatches in one step reuse the layer's one
// slot; a microbatch the plan's run.microbatches does not have is refused.
TEST(CppApi, MicrobatchesShareOneSlot) {
  stowage::Plan plan = stowage::testing::MakeTestPlan(1, 256);
  plan.microbatches = 3;
  stowage::StatusOr<stowage::Runtime> rt =
      stowage::Runtime::Create(stowage::PlanToJson(plan), HostOptions());
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  stowage::StatusOr<stowage::Step> step = stowage::Step::Begin(*rt);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  for (int k = 0; k < 3; ++k) {
    std::vector<uint8_t> src(256, static_cast<uint8_t>(k + 1)), dst(256, 0);
    stowage::StatusOr<stowage::TensorId> id = rt->SaveMicrobatch(0, k, src.data(), src.size());
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    ASSERT_TRUE(rt->PrefetchMicrobatch(*id, k, dst.data()).ok());
    ASSERT_TRUE(rt->RestoreMicrobatch(*id, k, dst.data()).ok());
    EXPECT_EQ(dst, src);
  }
  std::vector<uint8_t> src(256);
  const stowage::StatusOr<stowage::TensorId> past = rt->SaveMicrobatch(0, 3, src.data(), 256);
  EXPECT_EQ(past.status().code(), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(step->End().ok());
}

}  // namespace
