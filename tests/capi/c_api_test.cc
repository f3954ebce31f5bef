#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "runtime/runtime.h"
#include "stowage/plan.h"
#include "stowage/stowage.h"
#include "tests/runtime/test_plans.h"
#include "tests/test_util.h"

namespace {

TEST(CApi, StatusStringsAndOptionsDefaults) {
  EXPECT_STREQ(stowage_status_string(STOWAGE_OK), "OK");
  EXPECT_STREQ(stowage_status_string(STOWAGE_ERROR_DATA_LOSS), "DATA_LOSS");
  stowage_options options;
  ASSERT_EQ(stowage_options_init(&options), STOWAGE_OK);
  EXPECT_EQ(options.struct_size, sizeof(stowage_options));
  EXPECT_EQ(options.backend, STOWAGE_BACKEND_AUTO);
  EXPECT_EQ(options.numa_node, -1);
  EXPECT_EQ(stowage_options_init(nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stowage_last_error()).find("options"), std::string::npos);
}

}  // namespace

namespace {

std::string SmallPlan() { return stowage::PlanToJson(stowage::testing::MakeTestPlan(2, 4096)); }

stowage_options HostOptions() {
  stowage_options options;
  stowage_options_init(&options);
  options.backend = STOWAGE_BACKEND_HOST;
  options.copy_threads = 1;
  options.metrics_address = "";
  return options;
}

TEST(CApi, CreateChecksItsArguments) {
  const std::string plan = SmallPlan();
  stowage_options options = HostOptions();
  stowage_runtime* rt = reinterpret_cast<stowage_runtime*>(0x1);
  EXPECT_EQ(stowage_create(nullptr, 0, &options, &rt), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(rt, nullptr);  // *out is cleared on failure
  EXPECT_EQ(stowage_create(plan.data(), plan.size(), &options, nullptr),
            STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_create("{", 1, &options, &rt), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stowage_last_error()).find("JSON"), std::string::npos);

  stowage_options bad = options;
  bad.struct_size = sizeof(stowage_options) - 8;
  EXPECT_EQ(stowage_create(plan.data(), plan.size(), &bad, &rt), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stowage_last_error()).find("struct_size"), std::string::npos);
  bad = options;
  const int32_t nine = 9;  // as a C caller could store it
  std::memcpy(&bad.backend, &nine, sizeof(nine));
  EXPECT_EQ(stowage_create(plan.data(), plan.size(), &bad, &rt), STOWAGE_ERROR_INVALID_ARGUMENT);
  bad = options;
  bad.numa_node = -2;
  EXPECT_EQ(stowage_create(plan.data(), plan.size(), &bad, &rt), STOWAGE_ERROR_INVALID_ARGUMENT);
  bad = options;
  bad.copy_threads = -1;
  EXPECT_EQ(stowage_create(plan.data(), plan.size(), &bad, &rt), STOWAGE_ERROR_INVALID_ARGUMENT);
}

// Regression: copy_chunk_bytes = UINT64_MAX (option or plan) hung the first copy;
// 1 took about 1 GB of queue for 30 MiB of copies; copy_threads = 5000 aborted the process when
// thread creation failed. Each is now INVALID_ARGUMENT naming the field and its range.
// Note [Pipeline stages]: a rank loads its stage; it reserves host memory for that stage's layers
// only, one copy per in-flight microbatch.
TEST(CApi, StageOptionLoadsOneStage) {
  // Two stages of two layers, 4 microbatches: stage 0 holds 2 of each layer, stage 1 one.
  constexpr uint64_t kBytes = 4096;
  const std::string plan =
      stowage::PlanToJson(stowage::testing::MakePipelinedTestPlan(2, 2, 4, kBytes));
  std::vector<char> src(3 * kBytes, 7);
  stowage_tensor_id id = 0;

  stowage_options options = HostOptions();
  stowage_runtime* rt = nullptr;
  ASSERT_EQ(stowage_create(plan.data(), plan.size(), &options, &rt), STOWAGE_OK)
      << stowage_last_error();
  stowage_stats stats;
  ASSERT_EQ(stowage_get_stats(rt, &stats), STOWAGE_OK);
  EXPECT_GE(stats.arena_capacity_bytes, 2 * 2 * kBytes);
  ASSERT_EQ(stowage_begin_step(rt), STOWAGE_OK);
  // Two microbatches' saves of layer 0 fit its region (one slot each); a third in flight does
  // not, and neither does a second full save under one microbatch id.
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(stowage_save_microbatch(rt, 0, k, src.data(), kBytes, nullptr, &id), STOWAGE_OK);
    EXPECT_EQ(stowage_save_wait(rt, id), STOWAGE_OK);
  }
  EXPECT_EQ(stowage_save_microbatch(rt, 0, 2, src.data(), kBytes, nullptr, &id),
            STOWAGE_ERROR_RESOURCE_EXHAUSTED);
  EXPECT_EQ(stowage_save(rt, 0, src.data(), kBytes, nullptr, &id),
            STOWAGE_ERROR_FAILED_PRECONDITION);  // microbatch 0's saves ended when 1 saved
  EXPECT_EQ(stowage_save(rt, 2, src.data(), kBytes, nullptr, &id), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stowage_last_error()).find("layer 2 runs on pipeline stage 1"),
            std::string::npos)
      << stowage_last_error();
  EXPECT_EQ(stowage_end_step(rt), STOWAGE_OK);
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);

  options.stage = 1;
  ASSERT_EQ(stowage_create(plan.data(), plan.size(), &options, &rt), STOWAGE_OK)
      << stowage_last_error();
  ASSERT_EQ(stowage_begin_step(rt), STOWAGE_OK);
  EXPECT_EQ(stowage_save(rt, 0, src.data(), kBytes, nullptr, &id), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_save(rt, 3, src.data(), kBytes, nullptr, &id), STOWAGE_OK);
  EXPECT_EQ(stowage_save_wait(rt, id), STOWAGE_OK);
  EXPECT_EQ(stowage_save_microbatch(rt, 3, 1, src.data(), kBytes, nullptr, &id),
            STOWAGE_ERROR_RESOURCE_EXHAUSTED);  // the last stage holds one
  stowage_layer_info info;
  info.struct_size = sizeof(info);
  ASSERT_EQ(stowage_get_layer_info(rt, 0, &info), STOWAGE_OK);
  EXPECT_EQ(info.offloads, 0);  // stage 0's layer
  ASSERT_EQ(stowage_get_layer_info(rt, 2, &info), STOWAGE_OK);
  EXPECT_EQ(info.offloads, 1);
  EXPECT_EQ(info.save_wait_before_layer, 4);  // the chunk's end: its backward start
  EXPECT_EQ(stowage_end_step(rt), STOWAGE_OK);
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);

  options.stage = 2;
  EXPECT_EQ(stowage_create(plan.data(), plan.size(), &options, &rt),
            STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stowage_last_error()).find("options->stage is 2; allowed: 0 to 1"),
            std::string::npos)
      << stowage_last_error();
}

TEST(CApi, CopyChunkAndThreadCountOutsideTheirRangeAreInvalidArgument) {
  const std::string plan = SmallPlan();
  stowage_runtime* rt = nullptr;
  for (uint64_t chunk : {UINT64_MAX, uint64_t{1}, uint64_t{4095}, (uint64_t{1} << 30) + 1}) {
    stowage_options bad = HostOptions();
    bad.copy_chunk_bytes = chunk;
    EXPECT_EQ(stowage_create(plan.data(), plan.size(), &bad, &rt), STOWAGE_ERROR_INVALID_ARGUMENT)
        << chunk;
    EXPECT_NE(
        std::string(stowage_last_error()).find("copy_chunk_bytes is " + std::to_string(chunk)),
        std::string::npos)
        << stowage_last_error();
    EXPECT_NE(std::string(stowage_last_error()).find("[4096, 1073741824]"), std::string::npos);
  }
  stowage::Plan huge_chunk = stowage::testing::MakeTestPlan(2, 4096);
  huge_chunk.runtime.copy_chunk_bytes = UINT64_MAX;
  const std::string huge_json = stowage::PlanToJson(huge_chunk);
  stowage_options options = HostOptions();
  EXPECT_EQ(stowage_create(huge_json.data(), huge_json.size(), &options, &rt),
            STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stowage_last_error()).find("copy_chunk_bytes"), std::string::npos)
      << stowage_last_error();
  // The option overrides the plan's value; the bounds themselves are allowed. (A plan outside
  // them is invalid whatever the options: the validator judges the plan on its own.)
  for (uint64_t chunk : {uint64_t{4096}, uint64_t{1} << 30}) {
    options.copy_chunk_bytes = chunk;
    ASSERT_EQ(stowage_create(plan.data(), plan.size(), &options, &rt), STOWAGE_OK)
        << stowage_last_error();
    EXPECT_EQ(stowage::runtime::UnwrapForTesting(rt)->engine().chunk_bytes(), chunk);
    EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
  }
  for (int32_t threads : {-1, 65, 5000}) {
    stowage_options bad = HostOptions();
    bad.copy_threads = threads;
    EXPECT_EQ(stowage_create(plan.data(), plan.size(), &bad, &rt), STOWAGE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(stowage_last_error())
                  .find("copy_threads is " + std::to_string(threads) + "; it must be in [0, 64]"),
              std::string::npos)
        << stowage_last_error();
  }
}

// Regression (use after destroy through the C ABI): a second stowage_destroy, or any
// call after destroy, read and freed the runtime's memory again (heap use-after-free under ASan).
// A handle is now looked up, never dereferenced: a dead or foreign one is INVALID_ARGUMENT.
TEST(CApi, DestroyedAndForeignHandlesAreInvalidArgument) {
  const std::string plan = SmallPlan();
  stowage_options options = HostOptions();
  stowage_runtime* rt = nullptr;
  ASSERT_EQ(stowage_create(plan.data(), plan.size(), &options, &rt), STOWAGE_OK)
      << stowage_last_error();
  ASSERT_EQ(stowage_destroy(rt), STOWAGE_OK);
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stowage_last_error()).find("stowage_destroy: rt is not a live runtime"),
            std::string::npos)
      << stowage_last_error();

  int foreign_object = 0;
  stowage_runtime* foreign = reinterpret_cast<stowage_runtime*>(&foreign_object);
  for (stowage_runtime* dead : {rt, foreign}) {
    std::vector<std::byte> buffer(64);
    stowage_tensor_id id = 0;
    int32_t value = 0;
    stowage_stats stats{};
    stowage_layer_info info{};
    info.struct_size = sizeof(info);
    EXPECT_EQ(stowage_begin_step(dead), STOWAGE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(stowage_save(dead, 0, buffer.data(), 16, nullptr, &id),
              STOWAGE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(stowage_save_query(dead, id, &value), STOWAGE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(stowage_save_wait(dead, id), STOWAGE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(stowage_save_wait_stream(dead, id, nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(stowage_prefetch(dead, id, buffer.data(), nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(stowage_restore(dead, id, buffer.data(), nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(stowage_get_stats(dead, &stats), STOWAGE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(stowage_report_device_peak(dead, 1), STOWAGE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(stowage_num_layers(dead, &value), STOWAGE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(stowage_get_layer_info(dead, 0, &info), STOWAGE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(stowage_end_step(dead), STOWAGE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(stowage_destroy(dead), STOWAGE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(stowage_last_error()).find("not a live runtime"), std::string::npos);
  }
  EXPECT_EQ(foreign_object, 0);  // looked up, never written

  // A stale handle never reaches a newer runtime, even one created right after.
  stowage_runtime* next = nullptr;
  ASSERT_EQ(stowage_create(plan.data(), plan.size(), &options, &next), STOWAGE_OK);
  EXPECT_NE(next, rt);
  EXPECT_EQ(stowage_begin_step(rt), STOWAGE_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(stowage_begin_step(next), STOWAGE_OK);
  EXPECT_EQ(stowage_end_step(next), STOWAGE_OK);
  EXPECT_EQ(stowage_destroy(next), STOWAGE_OK);
}

TEST(CApi, CudaWithoutAGpuIsUnavailable) {
  if (stowage::testing::GpuAvailable()) GTEST_SKIP() << "a GPU is present";
  const std::string plan = SmallPlan();
  stowage_options options = HostOptions();
  options.backend = STOWAGE_BACKEND_CUDA;
  stowage_runtime* rt = nullptr;
  EXPECT_EQ(stowage_create(plan.data(), plan.size(), &options, &rt), STOWAGE_ERROR_UNAVAILABLE)
      << stowage_last_error();
  EXPECT_EQ(rt, nullptr);
  // AUTO falls back to the host backend.
  options.backend = STOWAGE_BACKEND_AUTO;
  ASSERT_EQ(stowage_create(plan.data(), plan.size(), &options, &rt), STOWAGE_OK)
      << stowage_last_error();
  stowage_stats stats;
  ASSERT_EQ(stowage_get_stats(rt, &stats), STOWAGE_OK);
  EXPECT_EQ(stats.backend, STOWAGE_BACKEND_HOST);
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
}

TEST(CApi, CreateStartsTheMetricsEndpointWhenAsked) {
  const std::string plan = SmallPlan();
  stowage_options options = HostOptions();
  options.metrics_address = "127.0.0.1:0";
  stowage_runtime* rt = nullptr;
  ASSERT_EQ(stowage_create(plan.data(), plan.size(), &options, &rt), STOWAGE_OK)
      << stowage_last_error();
  EXPECT_EQ(stowage::runtime::MetricsAddressForTesting(rt).rfind("127.0.0.1:", 0), 0u);
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
  options.metrics_address = "";
  ASSERT_EQ(stowage_create(plan.data(), plan.size(), &options, &rt), STOWAGE_OK);
  EXPECT_EQ(stowage::runtime::MetricsAddressForTesting(rt), "");
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
}

TEST(CApi, CallsOnANullRuntimeAreInvalidArgument) {
  stowage_tensor_id id = 0;
  int32_t n = 0;
  stowage_stats stats;
  stowage_layer_info info{};
  EXPECT_EQ(stowage_begin_step(nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_end_step(nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_save(nullptr, 0, &n, 4, nullptr, &id), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_save_query(nullptr, 1, &n), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_save_wait(nullptr, 1), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_save_wait_stream(nullptr, 1, nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_prefetch(nullptr, 1, &n, nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_restore(nullptr, 1, &n, nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_get_stats(nullptr, &stats), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_report_device_peak(nullptr, 1), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_num_layers(nullptr, &n), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_get_layer_info(nullptr, 0, &info), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stowage_last_error()).find("rt is NULL"), std::string::npos);
}

TEST(CApi, LastErrorIsPerThread) {
  EXPECT_EQ(stowage_begin_step(nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  std::string other;
  std::thread([&] { other = stowage_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(stowage_last_error()), "");
}

TEST(CApi, LayerInfoChecksStructSize) {
  const std::string plan = SmallPlan();
  stowage_options options = HostOptions();
  stowage_runtime* rt = nullptr;
  ASSERT_EQ(stowage_create(plan.data(), plan.size(), &options, &rt), STOWAGE_OK);
  int32_t n = 0;
  ASSERT_EQ(stowage_num_layers(rt, &n), STOWAGE_OK);
  EXPECT_EQ(n, 2);
  stowage_layer_info info{};
  EXPECT_EQ(stowage_get_layer_info(rt, 0, &info), STOWAGE_ERROR_INVALID_ARGUMENT);
  info.struct_size = sizeof(info);
  ASSERT_EQ(stowage_get_layer_info(rt, 0, &info), STOWAGE_OK);
  EXPECT_EQ(info.offloads, 1);
  EXPECT_EQ(info.host_bytes, 4096u);
  EXPECT_EQ(info.prefetch_after_layer, 1);
  EXPECT_EQ(info.save_wait_before_layer, 2);  // two layers: when backward starts
  ASSERT_EQ(stowage_report_device_peak(rt, 123), STOWAGE_OK);
  EXPECT_EQ(stowage::runtime::UnwrapForTesting(rt)->counters().observed_peak_device_bytes.load(),
            123u);
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
}

// stowage_pipeline_order is PipelineOrder through the C ABI (what Python's
// stowage.pipeline_order reads), with the plan's rules for its arguments.
TEST(CApi, PipelineOrderIsThePlannersOrder) {
  size_t count = 0;
  ASSERT_EQ(stowage_pipeline_order("interleaved", 2, 2, 4, 1, nullptr, 0, &count), STOWAGE_OK)
      << stowage_last_error();
  ASSERT_EQ(count, 16u);
  std::vector<stowage_pipeline_op> ops(count);
  ASSERT_EQ(stowage_pipeline_order("interleaved", 2, 2, 4, 1, ops.data(), ops.size(), &count),
            STOWAGE_OK);
  const std::vector<stowage::PipelineOp> expected =
      stowage::PipelineOrder(stowage::PipelineSchedule::kInterleaved, 2, 2, 4, 1);
  ASSERT_EQ(expected.size(), ops.size());
  for (size_t k = 0; k < ops.size(); ++k) {
    EXPECT_EQ(ops[k].forward, expected[k].forward ? 1 : 0) << k;
    EXPECT_EQ(ops[k].chunk, expected[k].chunk) << k;
    EXPECT_EQ(ops[k].microbatch, expected[k].microbatch) << k;
  }
  // A short buffer gets the first ops and the total.
  stowage_pipeline_op first[3];
  ASSERT_EQ(stowage_pipeline_order("1f1b", 4, 1, 6, 0, first, 3, &count), STOWAGE_OK);
  EXPECT_EQ(count, 12u);
  EXPECT_EQ(first[2].microbatch, 2);
  struct Bad {
    const char* schedule;
    int pp, vpp, m, stage;
    const char* says;
  };
  for (const Bad& bad :
       {Bad{"zigzag", 2, 1, 4, 0, "zigzag"}, Bad{"1f1b", 2, 2, 4, 0, "run.vpp"},
        Bad{"interleaved", 2, 2, 3, 0, "run.microbatches"}, Bad{"1f1b", 0, 1, 4, 0, "run.pp"},
        Bad{"1f1b", 2, 1, 4, 2, "stage is 2; allowed: 0 to 1"}}) {
    EXPECT_EQ(
        stowage_pipeline_order(bad.schedule, bad.pp, bad.vpp, bad.m, bad.stage, nullptr, 0, &count),
        STOWAGE_ERROR_INVALID_ARGUMENT)
        << bad.says;
    EXPECT_NE(std::string(stowage_last_error()).find(bad.says), std::string::npos)
        << stowage_last_error();
  }
  EXPECT_EQ(stowage_pipeline_order("1f1b", 2, 1, 4, 0, nullptr, 0, nullptr),
            STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_pipeline_order(nullptr, 2, 1, 4, 0, nullptr, 0, &count),
            STOWAGE_ERROR_INVALID_ARGUMENT);
}

}  // namespace
