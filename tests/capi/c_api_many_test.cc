// stowage_save_many / stowage_prefetch_many: the batched forms behave as their single calls in
// order, and a failure part-way leaves the calls before it in effect and says how many.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "stowage/plan.h"
#include "stowage/stowage.h"
#include "tests/runtime/test_plans.h"

namespace {

constexpr size_t kBytes = 1024;

class CApiMany : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string plan = stowage::PlanToJson(stowage::testing::MakeTestPlan(2, 4 * kBytes));
    stowage_options options;
    stowage_options_init(&options);
    options.backend = STOWAGE_BACKEND_HOST;
    options.copy_threads = 1;
    options.metrics_address = "";
    ASSERT_EQ(stowage_create(plan.data(), plan.size(), &options, &rt_), STOWAGE_OK)
        << stowage_last_error();
    ASSERT_EQ(stowage_begin_step(rt_), STOWAGE_OK);
    for (size_t k = 0; k < src_.size(); ++k) {
      src_[k].resize(kBytes);
      std::iota(src_[k].begin(), src_[k].end(), static_cast<uint8_t>(17 * k));
      dst_[k].assign(kBytes, 0);
    }
  }
  void TearDown() override { EXPECT_EQ(stowage_destroy(rt_), STOWAGE_OK); }

  stowage_runtime* rt_ = nullptr;
  std::array<std::vector<uint8_t>, 5> src_;
  std::array<std::vector<uint8_t>, 5> dst_;
};

TEST_F(CApiMany, SavesAndPrefetchesInOrderAndRoundTrips) {
  const void* srcs[4] = {src_[0].data(), src_[1].data(), src_[2].data(), src_[3].data()};
  const size_t bytes[4] = {kBytes, kBytes, kBytes, kBytes};
  stowage_tensor_id ids[4] = {};
  size_t saved = 99;
  ASSERT_EQ(stowage_save_many(rt_, 0, 4, srcs, bytes, nullptr, ids, &saved), STOWAGE_OK)
      << stowage_last_error();
  EXPECT_EQ(saved, 4u);
  for (int k = 0; k < 4; ++k) {
    EXPECT_NE(ids[k], 0u);
    if (k > 0) {
      EXPECT_GT(ids[k], ids[k - 1]) << "ids follow the order of the saves";
    }
    ASSERT_EQ(stowage_save_wait(rt_, ids[k]), STOWAGE_OK);
  }
  void* dsts[4] = {dst_[0].data(), dst_[1].data(), dst_[2].data(), dst_[3].data()};
  size_t issued = 99;
  ASSERT_EQ(stowage_prefetch_many(rt_, 4, ids, dsts, nullptr, &issued), STOWAGE_OK)
      << stowage_last_error();
  EXPECT_EQ(issued, 4u);
  for (int k = 0; k < 4; ++k) {
    ASSERT_EQ(stowage_restore(rt_, ids[k], dsts[k], nullptr), STOWAGE_OK) << stowage_last_error();
    EXPECT_EQ(dst_[k], src_[k]) << "tensor " << k;
  }
  stowage_stats stats;
  ASSERT_EQ(stowage_end_step(rt_), STOWAGE_OK);
  ASSERT_EQ(stowage_get_stats(rt_, &stats), STOWAGE_OK);
  EXPECT_EQ(stats.saves_total, 4u);
  EXPECT_EQ(stats.restores_total, 4u);
}

TEST_F(CApiMany, SaveManyStopsAtTheFirstFailure) {
  // Layer 0 reserves 4 tensors' worth: the fifth does not fit.
  const void* srcs[5] = {src_[0].data(), src_[1].data(), src_[2].data(), src_[3].data(),
                         src_[4].data()};
  const size_t bytes[5] = {kBytes, kBytes, kBytes, kBytes, kBytes};
  stowage_tensor_id ids[5] = {};
  size_t saved = 0;
  EXPECT_EQ(stowage_save_many(rt_, 0, 5, srcs, bytes, nullptr, ids, &saved),
            STOWAGE_ERROR_RESOURCE_EXHAUSTED);
  EXPECT_EQ(saved, 4u);
  const std::string error = stowage_last_error();
  EXPECT_NE(error.find("stowage_save_many: tensor 4 of 5"), std::string::npos) << error;
  EXPECT_NE(error.find("layer 0"), std::string::npos) << error;
  // The four before it were saved and come back.
  for (int k = 0; k < 4; ++k) {
    ASSERT_EQ(stowage_restore(rt_, ids[k], dst_[k].data(), nullptr), STOWAGE_OK);
    EXPECT_EQ(dst_[k], src_[k]);
  }
  EXPECT_EQ(stowage_end_step(rt_), STOWAGE_OK);
}

TEST_F(CApiMany, PrefetchManyStopsAtTheFirstFailure) {
  stowage_tensor_id id = 0;
  ASSERT_EQ(stowage_save(rt_, 1, src_[0].data(), kBytes, nullptr, &id), STOWAGE_OK);
  // The same id twice: a tensor is prefetched at most once.
  const stowage_tensor_id ids[2] = {id, id};
  void* dsts[2] = {dst_[0].data(), dst_[0].data()};
  size_t issued = 0;
  EXPECT_EQ(stowage_prefetch_many(rt_, 2, ids, dsts, nullptr, &issued),
            STOWAGE_ERROR_FAILED_PRECONDITION);
  EXPECT_EQ(issued, 1u);
  EXPECT_NE(std::string(stowage_last_error()).find("stowage_prefetch_many: tensor 1 of 2"),
            std::string::npos)
      << stowage_last_error();
  ASSERT_EQ(stowage_restore(rt_, id, dst_[0].data(), nullptr), STOWAGE_OK);
  EXPECT_EQ(dst_[0], src_[0]);
  EXPECT_EQ(stowage_end_step(rt_), STOWAGE_OK);
}

TEST_F(CApiMany, ChecksItsArguments) {
  const void* srcs[1] = {src_[0].data()};
  const size_t bytes[1] = {kBytes};
  stowage_tensor_id ids[1] = {};
  void* dsts[1] = {dst_[0].data()};
  size_t n = 7;
  EXPECT_EQ(stowage_save_many(nullptr, 0, 1, srcs, bytes, nullptr, ids, &n),
            STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_save_many(rt_, 0, 1, nullptr, bytes, nullptr, ids, &n),
            STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stowage_last_error()).find("srcs is NULL"), std::string::npos);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(stowage_save_many(rt_, 0, 1, srcs, nullptr, nullptr, ids, &n),
            STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_save_many(rt_, 0, 1, srcs, bytes, nullptr, nullptr, &n),
            STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_save_many(rt_, 7, 1, srcs, bytes, nullptr, ids, &n),
            STOWAGE_ERROR_INVALID_ARGUMENT);  // no layer 7
  EXPECT_EQ(stowage_prefetch_many(nullptr, 1, ids, dsts, nullptr, &n),
            STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_prefetch_many(rt_, 1, nullptr, dsts, nullptr, &n),
            STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_prefetch_many(rt_, 1, ids, nullptr, nullptr, &n),
            STOWAGE_ERROR_INVALID_ARGUMENT);
  // Nothing to do is not an error, and needs no arrays; out counts are optional.
  EXPECT_EQ(stowage_save_many(rt_, 0, 0, nullptr, nullptr, nullptr, nullptr, &n), STOWAGE_OK);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(stowage_prefetch_many(rt_, 0, nullptr, nullptr, nullptr, nullptr), STOWAGE_OK);
  ASSERT_EQ(stowage_save_many(rt_, 0, 1, srcs, bytes, nullptr, ids, nullptr), STOWAGE_OK);
  ASSERT_EQ(stowage_prefetch_many(rt_, 1, ids, dsts, nullptr, nullptr), STOWAGE_OK);
  ASSERT_EQ(stowage_restore(rt_, ids[0], dsts[0], nullptr), STOWAGE_OK);
  EXPECT_EQ(dst_[0], src_[0]);
  EXPECT_EQ(stowage_end_step(rt_), STOWAGE_OK);
}

}  // namespace
