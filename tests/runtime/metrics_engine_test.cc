// The Prometheus exporter over a running runtime: the values it serves follow real engine
// activity (host backend), and through the C ABI it counts failed calls by kind and takes its
// address and step buckets from the options or the environment.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/metrics.h"
#include "runtime/runtime.h"
#include "stowage/plan.h"
#include "stowage/stowage.h"
#include "tests/runtime/metrics_scrape.h"

namespace stowage::runtime {
namespace {

using ::stowage::testing::Bucket;
using ::stowage::testing::Connect;
using ::stowage::testing::ExportedStepBuckets;
using ::stowage::testing::ParseSamples;
using ::stowage::testing::Request;
using ::stowage::testing::Sample;
using ::stowage::testing::Scrape;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// --- Against real engine activity (host backend) ---

constexpr uint64_t kKib = 1024;

// Three layers: "kda+moe" offloads two transfers (512 KiB + 256 KiB), "dsa+moe" one (128 KiB),
// the last is kept. Every byte count below follows from these.
Plan SmallPlan() {
  Plan plan;
  plan.gpu_budget_bytes = 80ull << 30;
  plan.predicted.peak_device_bytes = 70ull << 30;
  plan.predicted.host_bytes_per_gpu = 896 * kKib;
  plan.predicted.step_seconds = 0.5;
  plan.runtime.prefetch_distance = 1;
  plan.runtime.host_arena_bytes = 896 * kKib;
  plan.runtime.copy_chunk_bytes = 64 * kKib;
  plan.runtime.link_bytes_per_second = 52e9;
  const char* types[] = {"kda+moe", "dsa+moe", "kda+moe"};
  for (int i = 0; i < 3; ++i) {
    LayerPlan layer;
    layer.index = i;
    layer.type = types[i];
    plan.layers.push_back(layer);
  }
  plan.layers[0].policy = LayerPolicy::kOffloadSaved;
  plan.layers[0].transfers = {{"attn.q", 512 * kKib}, {"moe.act", 256 * kKib}};
  plan.layers[0].host_bytes = 768 * kKib;
  plan.layers[0].save_wait_before_layer = 2;
  plan.layers[0].prefetch_after_layer = 1;
  plan.layers[1].policy = LayerPolicy::kOffloadInput;
  plan.layers[1].transfers = {{"input", 128 * kKib}};
  plan.layers[1].host_bytes = 128 * kKib;
  plan.layers[1].save_wait_before_layer = 3;
  plan.layers[1].prefetch_after_layer = 2;
  return plan;
}

// One step as a trainer runs it: saves in forward; in backward layer 1 is prefetched then
// restored, layer 0 restored without a prefetch.
void RunOneStep(Runtime& rt, std::vector<std::byte>& device, std::vector<std::byte>& back) {
  ASSERT_TRUE(rt.BeginStep().ok());
  absl::StatusOr<TensorId> q = rt.Save(0, device.data(), 512 * kKib, nullptr);
  absl::StatusOr<TensorId> act = rt.Save(0, device.data() + 512 * kKib, 256 * kKib, nullptr);
  absl::StatusOr<TensorId> input = rt.Save(1, device.data() + 768 * kKib, 128 * kKib, nullptr);
  ASSERT_TRUE(q.ok() && act.ok() && input.ok()) << q.status() << act.status() << input.status();
  for (TensorId id : {*q, *act, *input}) ASSERT_TRUE(rt.SaveWait(id).ok());
  ASSERT_TRUE(rt.Prefetch(*input, back.data() + 768 * kKib, nullptr).ok());
  ASSERT_TRUE(rt.Restore(*input, back.data() + 768 * kKib, nullptr).ok());
  ASSERT_TRUE(rt.Restore(*q, back.data(), nullptr).ok());
  ASSERT_TRUE(rt.Restore(*act, back.data() + 512 * kKib, nullptr).ok());
  ASSERT_TRUE(rt.EndStep().ok());
}

TEST(RuntimeMetricsTest, ExportedValuesFollowEngineActivity) {
  RuntimeOptions options;
  options.backend = BackendKind::kHost;
  options.skip_admission = true;
  options.copy_threads = 1;
  setenv("RANK", "5", 1);  // as torchrun sets them
  setenv("LOCAL_RANK", "2", 1);
  absl::StatusOr<std::unique_ptr<Runtime>> rt = Runtime::Create(SmallPlan(), options);
  unsetenv("RANK");
  unsetenv("LOCAL_RANK");
  ASSERT_TRUE(rt.ok()) << rt.status();
  absl::StatusOr<std::unique_ptr<MetricsExporter>> exporter =
      MetricsExporter::Start("127.0.0.1:0", (*rt)->shared_counters());
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  const std::string address = (*exporter)->bound_address();
  ASSERT_THAT(address, StartsWith("127.0.0.1:"));

  std::vector<std::byte> device(896 * kKib), back(896 * kKib);
  for (size_t i = 0; i < device.size(); ++i) device[i] = static_cast<std::byte>(i * 13);
  constexpr int kSteps = 3;
  for (int step = 0; step < kSteps; ++step) {
    RunOneStep(**rt, device, back);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(back, device);  // the bytes made the round trip
  (*rt)->ReportDevicePeak(69ull << 30);

  std::map<std::string, std::string> identities;
  const std::map<std::string, double> s = ParseSamples(Scrape(address), &identities);
  char hostname[256] = {};
  ASSERT_EQ(gethostname(hostname, sizeof(hostname) - 1), 0);
  for (const auto& [series, identity] : identities) {
    EXPECT_EQ(identity, absl::StrCat(R"(gpu="host",hostname=")", hostname,
                                     R"(",local_rank="2",rank="5",stage="0")"))
        << series;
  }
  const RuntimeCounters& c = (*rt)->counters();
  const std::string dev = "";
  const std::string node = absl::StrCat(
      R"(numa_node=")", c.numa_node >= 0 ? absl::StrCat(c.numa_node) : "unknown", "\"");
  auto at = [&](const std::string& series) { return Sample(s, series); };
  constexpr double kStepBytes = 896 * kKib;

  EXPECT_EQ(at("stowage_steps_total{" + dev + "}"), kSteps);
  // The ceiling the plan assumed is exported next to the achieved bandwidth.
  EXPECT_EQ(at("stowage_copy_link_bytes_per_second{" + dev + "}"), 52e9);
  EXPECT_EQ(at("stowage_step_duration_seconds_count{" + dev + "}"), kSteps);
  EXPECT_EQ(at(R"(stowage_step_duration_seconds_bucket{le="+Inf"})"), kSteps);
  EXPECT_EQ(at(R"(stowage_copy_bytes_total{direction="d2h"})"), kSteps * kStepBytes);
  EXPECT_EQ(at(R"(stowage_copy_bytes_total{direction="h2d"})"), kSteps * kStepBytes);
  EXPECT_GE(at(R"(stowage_copy_operations_total{direction="d2h"})").value_or(0), kSteps * 3);
  EXPECT_GT(at(R"(stowage_copy_seconds_total{direction="d2h"})").value_or(0), 0);
  EXPECT_GT(at(R"(stowage_copy_seconds_total{direction="h2d"})").value_or(0), 0);
  EXPECT_EQ(at(R"(stowage_offload_saved_bytes_total{layer_type="kda+moe"})"),
            kSteps * 768.0 * kKib);
  EXPECT_EQ(at(R"(stowage_offload_saved_bytes_total{layer_type="dsa+moe"})"),
            kSteps * 128.0 * kKib);
  EXPECT_EQ(at(R"(stowage_offload_restored_bytes_total{layer_type="kda+moe"})"),
            kSteps * 768.0 * kKib);
  EXPECT_EQ(at(R"(stowage_offload_restored_bytes_total{layer_type="dsa+moe"})"),
            kSteps * 128.0 * kKib);
  EXPECT_EQ(at("stowage_offload_saves_total{" + dev + "}"), kSteps * 3);
  EXPECT_EQ(at("stowage_offload_restores_total{" + dev + "}"), kSteps * 3);
  // The last step's high points (Note [Per-step gauges]): every byte of the step was pinned at
  // once; the three saves were issued back to back, so at least the first (512 KiB) awaited its
  // D2H and at least one copy was in flight.
  EXPECT_EQ(at("stowage_step_last_host_pinned_peak_bytes{" + node + "}"), kStepBytes);
  EXPECT_GE(at("stowage_step_last_device_offload_pending_peak_bytes{" + dev + "}").value_or(0),
            512.0 * kKib);
  EXPECT_LE(at("stowage_step_last_device_offload_pending_peak_bytes{" + dev + "}").value_or(0),
            kStepBytes);
  EXPECT_GE(at("stowage_step_last_copy_in_flight_peak{" + dev + "}").value_or(0), 1);
  EXPECT_GE(at("stowage_step_last_compute_stall_seconds{" + dev + "}").value_or(-1), 0);
  EXPECT_GE(at("stowage_host_pinned_reserved_bytes{" + node + "}").value_or(0), kStepBytes);
  EXPECT_EQ(at("stowage_plan_host_per_gpu_bytes{" + node + "}"), kStepBytes);
  EXPECT_EQ(at("stowage_plan_peak_device_bytes{" + dev + "}"), 70.0 * (1ull << 30));
  EXPECT_EQ(at("stowage_plan_device_budget_bytes{" + dev + "}"), 80.0 * (1ull << 30));
  EXPECT_EQ(at("stowage_plan_step_seconds{" + dev + "}"), 0.5);
  EXPECT_EQ(at("stowage_device_observed_peak_bytes{" + dev + "}"), 69.0 * (1ull << 30));
  EXPECT_EQ(at(absl::StrCat("stowage_runtime_info{backend=\"", c.backend, "\",",
                            node.substr(0, node.size()), "}")),
            1);
  // No call failed (the C++ API does not count errors; the C ABI does, see below).
  EXPECT_EQ(at(R"(stowage_errors_total{kind="internal"})"), 0);
}

// Regression: "this step" gauges were read at scrape time, so a scrape between steps
// read 0 and one inside a step anything up to the peak. They now hold the last completed step's
// values from its end to the next step's end, whenever the scrape comes.
TEST(RuntimeMetricsTest, PerStepGaugesHoldTheLastCompletedStep) {
  RuntimeOptions options;
  options.backend = BackendKind::kHost;
  options.skip_admission = true;
  options.copy_threads = 1;
  absl::StatusOr<std::unique_ptr<Runtime>> rt = Runtime::Create(SmallPlan(), options);
  ASSERT_TRUE(rt.ok()) << rt.status();
  absl::StatusOr<std::unique_ptr<MetricsExporter>> exporter =
      MetricsExporter::Start("127.0.0.1:0", (*rt)->shared_counters());
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  const std::string address = (*exporter)->bound_address();
  const std::string node = absl::StrCat(
      R"(numa_node=")",
      (*rt)->counters().numa_node >= 0 ? absl::StrCat((*rt)->counters().numa_node) : "unknown",
      "\"");
  auto pinned_peak = [&] {
    return Sample(ParseSamples(Scrape(address)),
                  "stowage_step_last_host_pinned_peak_bytes{" + node + "}");
  };
  EXPECT_EQ(pinned_peak(), 0);  // no step completed yet

  std::vector<std::byte> device(896 * kKib), back(896 * kKib);
  RunOneStep(**rt, device, back);
  if (HasFatalFailure()) return;
  EXPECT_EQ(pinned_peak(), 896.0 * kKib);  // between steps: the step's peak, not 0

  // Inside the next step, with only 128 KiB pinned so far: still the last completed step's.
  ASSERT_TRUE((*rt)->BeginStep().ok());
  absl::StatusOr<TensorId> input = (*rt)->Save(1, device.data(), 128 * kKib, nullptr);
  ASSERT_TRUE(input.ok()) << input.status();
  ASSERT_TRUE((*rt)->SaveWait(*input).ok());
  EXPECT_EQ(pinned_peak(), 896.0 * kKib);
  ASSERT_TRUE((*rt)->Restore(*input, back.data(), nullptr).ok());
  ASSERT_TRUE((*rt)->EndStep().ok());
  EXPECT_EQ(pinned_peak(), 128.0 * kKib);  // that step's own peak, set at its end
  const std::map<std::string, double> s = ParseSamples(Scrape(address));
  EXPECT_EQ(Sample(s, "stowage_step_last_device_offload_pending_peak_bytes{}"), 128.0 * kKib);
  // The D2H may still count as in flight when the restore issues its H2D.
  EXPECT_GE(Sample(s, "stowage_step_last_copy_in_flight_peak{}").value_or(0), 1);
  EXPECT_LE(Sample(s, "stowage_step_last_copy_in_flight_peak{}").value_or(9), 2);
}

TEST(RuntimeMetricsTest, CApiErrorsAreCountedByKind) {
  absl::StatusOr<std::string> address = PickFreePort("127.0.0.1:0");
  ASSERT_TRUE(address.ok()) << address.status();
  const std::string json = PlanToJson(SmallPlan());
  stowage_options options;
  stowage_options_init(&options);
  options.backend = STOWAGE_BACKEND_HOST;
  options.metrics_address = address->c_str();
  stowage_runtime* rt = nullptr;
  ASSERT_EQ(stowage_create(json.data(), json.size(), &options, &rt), STOWAGE_OK)
      << stowage_last_error();
  std::vector<std::byte> device(896 * kKib);
  stowage_tensor_id id = 0;
  // Outside a step: failed_precondition.
  EXPECT_EQ(stowage_save(rt, 0, device.data(), 1024, nullptr, &id),
            STOWAGE_ERROR_FAILED_PRECONDITION);
  ASSERT_EQ(stowage_begin_step(rt), STOWAGE_OK);
  // Past the layer's reservation: resource_exhausted.
  EXPECT_EQ(stowage_save(rt, 1, device.data(), 256 * kKib, nullptr, &id),
            STOWAGE_ERROR_RESOURCE_EXHAUSTED);
  // Unknown id: not_found.
  EXPECT_EQ(stowage_restore(rt, 12345, device.data(), nullptr), STOWAGE_ERROR_NOT_FOUND);
  ASSERT_EQ(stowage_save(rt, 1, device.data(), 128 * kKib, nullptr, &id), STOWAGE_OK);
  ASSERT_EQ(stowage_restore(rt, id, device.data(), nullptr), STOWAGE_OK);
  // Restored twice: failed_precondition.
  EXPECT_EQ(stowage_restore(rt, id, device.data(), nullptr), STOWAGE_ERROR_FAILED_PRECONDITION);
  ASSERT_EQ(stowage_end_step(rt), STOWAGE_OK);

  const std::map<std::string, double> s = ParseSamples(Scrape(*address));
  EXPECT_EQ(Sample(s, R"(stowage_errors_total{kind="failed_precondition"})"), 2);
  EXPECT_EQ(Sample(s, R"(stowage_errors_total{kind="resource_exhausted"})"), 1);
  EXPECT_EQ(Sample(s, R"(stowage_errors_total{kind="not_found"})"), 1);
  EXPECT_EQ(Sample(s, R"(stowage_errors_total{kind="data_loss"})"), 0);
  stowage_stats stats{};
  ASSERT_EQ(stowage_get_stats(rt, &stats), STOWAGE_OK);
  EXPECT_EQ(stats.errors_total, 4u);  // the same counters as the C ABI's stats
  EXPECT_EQ(Sample(s, R"(stowage_steps_total{})"), stats.steps_completed);
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
}

TEST(RuntimeMetricsTest, CApiReadsTheEnvironmentWhenTheOptionIsNull) {
  absl::StatusOr<std::string> address = PickFreePort("127.0.0.1:0");
  ASSERT_TRUE(address.ok()) << address.status();
  // A bare port, as a launcher would set it per rank: served on loopback.
  setenv("STOWAGE_METRICS_ADDR", address->substr(address->rfind(':') + 1).c_str(), 1);
  const std::string json = PlanToJson(SmallPlan());
  stowage_options options;
  stowage_options_init(&options);  // metrics_address NULL: read the environment
  options.backend = STOWAGE_BACKEND_HOST;
  stowage_runtime* rt = nullptr;
  ASSERT_EQ(stowage_create(json.data(), json.size(), &options, &rt), STOWAGE_OK)
      << stowage_last_error();
  unsetenv("STOWAGE_METRICS_ADDR");
  EXPECT_EQ(Sample(ParseSamples(Scrape(*address)), R"(stowage_steps_total{})"), 0);
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
  EXPECT_EQ(Scrape(*address), "");  // the endpoint went with the runtime
}

TEST(RuntimeMetricsTest, CApiStepBucketsComeFromTheOptionOrTheEnvironment) {
  absl::StatusOr<std::string> address = PickFreePort("127.0.0.1:0");
  ASSERT_TRUE(address.ok()) << address.status();
  const std::string json = PlanToJson(SmallPlan());
  stowage_options options;
  stowage_options_init(&options);
  options.backend = STOWAGE_BACKEND_HOST;
  options.metrics_address = address->c_str();
  options.metrics_step_buckets = "0.5, 1";
  setenv("STOWAGE_METRICS_STEP_BUCKETS", "7,8", 1);  // the option wins
  stowage_runtime* rt = nullptr;
  ASSERT_EQ(stowage_create(json.data(), json.size(), &options, &rt), STOWAGE_OK)
      << stowage_last_error();
  std::vector<Bucket> buckets = ExportedStepBuckets(Scrape(*address));
  ASSERT_EQ(buckets.size(), 3u);
  std::sort(buckets.begin(), buckets.end(),
            [](const Bucket& a, const Bucket& b) { return a.upper_bound < b.upper_bound; });
  EXPECT_EQ(buckets[0].upper_bound, 0.5);
  EXPECT_EQ(buckets[1].upper_bound, 1);
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);

  // NULL: the environment's; a bad one fails the create, naming the variable and the entry.
  options.metrics_step_buckets = nullptr;
  setenv("STOWAGE_METRICS_STEP_BUCKETS", "30,10", 1);
  EXPECT_EQ(stowage_create(json.data(), json.size(), &options, &rt),
            STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(stowage_last_error()),
              HasSubstr("STOWAGE_METRICS_STEP_BUCKETS '30,10': bound 2 (10) is not above bound 1"));
  EXPECT_EQ(rt, nullptr);
  unsetenv("STOWAGE_METRICS_STEP_BUCKETS");

  // The C++ runtime checks numbers given directly by the same rules.
  RuntimeOptions direct;
  direct.backend = BackendKind::kHost;
  direct.skip_admission = true;
  direct.step_seconds_buckets = {1, 0.5};
  absl::StatusOr<std::unique_ptr<Runtime>> refused = Runtime::Create(SmallPlan(), direct);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("step_seconds_buckets"));
}

TEST(RuntimeMetricsTest, NoEndpointUnlessAsked) {
  unsetenv("STOWAGE_METRICS_ADDR");
  const std::string json = PlanToJson(SmallPlan());
  stowage_options options;
  stowage_options_init(&options);  // metrics_address NULL and no environment: no endpoint
  options.backend = STOWAGE_BACKEND_HOST;
  stowage_runtime* rt = nullptr;
  ASSERT_EQ(stowage_create(json.data(), json.size(), &options, &rt), STOWAGE_OK)
      << stowage_last_error();
  EXPECT_EQ(stowage::runtime::MetricsAddressForTesting(rt), "");
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
}
}  // namespace
}  // namespace stowage::runtime
