// Begin/end step from several threads at once (Note [One step call at a time] in
// runtime/runtime.cc): forbidden by stowage.h, so each such call may be refused, but only with a
// status (FAILED_PRECONDITION), never by a crash or a step whose memory was released under it.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stowage/plan.h"
#include "stowage/stowage.h"
#include "tests/runtime/test_plans.h"

namespace stowage {
namespace {

constexpr uint64_t kLayerBytes = 64 << 10;

class StepCallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/stowage-step-calls-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    setenv("STOWAGE_LEDGER_DIR", dir_.c_str(), 1);
    setenv("STOWAGE_JOB_ID", "step-calls-test", 1);
    unsetenv("STOWAGE_METRICS_ADDR");
    const std::string plan = PlanToJson(testing::MakeTestPlan(2, kLayerBytes));
    stowage_options options;
    stowage_options_init(&options);
    options.backend = STOWAGE_BACKEND_HOST;
    options.copy_threads = 1;
    options.metrics_address = "";
    ASSERT_EQ(stowage_create(plan.data(), plan.size(), &options, &rt_), STOWAGE_OK)
        << stowage_last_error();
  }
  void TearDown() override {
    if (rt_ != nullptr) {
      stowage_end_step(rt_);
      EXPECT_EQ(stowage_destroy(rt_), STOWAGE_OK) << stowage_last_error();
    }
    unsetenv("STOWAGE_LEDGER_DIR");
    unsetenv("STOWAGE_JOB_ID");
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
  stowage_runtime* rt_ = nullptr;
};

TEST_F(StepCallsTest, ConcurrentBeginAndEndAreStatusesNotCrashes) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 3000;
  std::atomic<int> unexpected{0}, refused_as_concurrent{0}, steps{0};
  std::vector<std::string> first_unexpected(kThreads);
  auto hammer = [&](int t) {
    std::vector<std::byte> device(kLayerBytes, std::byte{static_cast<unsigned char>(t + 1)});
    auto note = [&](const char* call, stowage_status status) {
      if (first_unexpected[t].empty()) {
        first_unexpected[t] =
            absl::StrCat(call, ": ", stowage_status_string(status), ": ", stowage_last_error());
      }
      unexpected.fetch_add(1);
    };
    for (int i = 0; i < kRounds; ++i) {
      const stowage_status begun = stowage_begin_step(rt_);
      if (begun == STOWAGE_OK) {
        steps.fetch_add(1);
      } else if (begun != STOWAGE_ERROR_FAILED_PRECONDITION) {
        note("stowage_begin_step", begun);
      } else if (std::string(stowage_last_error()).find("another thread is inside") !=
                 std::string::npos) {
        refused_as_concurrent.fetch_add(1);
      }
      // Saves and restores are allowed from any thread; in another thread's step, or after it
      // ended, they are refused (no step, the layer's slot taken, an id of an ended step).
      stowage_tensor_id id = 0;
      const stowage_status saved = stowage_save(rt_, 0, device.data(), device.size(), nullptr, &id);
      if (saved == STOWAGE_OK) {
        const stowage_status restored = stowage_restore(rt_, id, device.data(), nullptr);
        if (restored != STOWAGE_OK && restored != STOWAGE_ERROR_NOT_FOUND &&
            restored != STOWAGE_ERROR_FAILED_PRECONDITION) {
          note("stowage_restore", restored);
        }
      } else if (saved != STOWAGE_ERROR_FAILED_PRECONDITION &&
                 saved != STOWAGE_ERROR_RESOURCE_EXHAUSTED) {
        note("stowage_save", saved);
      }
      const stowage_status ended = stowage_end_step(rt_);
      if (ended != STOWAGE_OK && ended != STOWAGE_ERROR_FAILED_PRECONDITION) {
        note("stowage_end_step", ended);
      } else if (ended == STOWAGE_ERROR_FAILED_PRECONDITION &&
                 std::string(stowage_last_error()).find("another thread is inside") !=
                     std::string::npos) {
        refused_as_concurrent.fetch_add(1);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(hammer, t);
  for (std::thread& thread : threads) thread.join();
  for (const std::string& first : first_unexpected) EXPECT_EQ(first, "");
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_GT(steps.load(), 0);
  std::printf("%d steps opened, %d step calls refused as concurrent\n", steps.load(),
              refused_as_concurrent.load());

  // Still whole: one thread runs a step and gets its bytes back.
  stowage_end_step(rt_);
  ASSERT_EQ(stowage_begin_step(rt_), STOWAGE_OK) << stowage_last_error();
  std::vector<std::byte> src(kLayerBytes), dst(kLayerBytes);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7 + 3);
  stowage_tensor_id id = 0;
  ASSERT_EQ(stowage_save(rt_, 0, src.data(), src.size(), nullptr, &id), STOWAGE_OK)
      << stowage_last_error();
  ASSERT_EQ(stowage_restore(rt_, id, dst.data(), nullptr), STOWAGE_OK) << stowage_last_error();
  EXPECT_EQ(src, dst);
  EXPECT_EQ(stowage_end_step(rt_), STOWAGE_OK) << stowage_last_error();
}

}  // namespace
}  // namespace stowage
