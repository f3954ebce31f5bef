// The Prometheus exporter: address handling, and the exposition text it serves for a
// RuntimeCounters filled by hand (so every value is known exactly).
#include "runtime/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stowage/stowage.h"

namespace stowage::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// GET http://<address>/metrics over a plain socket (loopback only); the response body.
std::string Scrape(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) return "";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        absl::StrCat("GET /metrics HTTP/1.0\r\nHost: ", address, "\r\nConnection: close\r\n\r\n");
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// Exposition text -> {"name{labels}" -> value}; labels exactly as served (sorted by name).
std::map<std::string, double> ParseSamples(const std::string& text) {
  std::map<std::string, double> samples;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line.front() == '#') continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    std::string value_text(line.substr(space + 1));
    if (value_text == "+Inf") {
      value = std::numeric_limits<double>::infinity();
    } else if (!absl::SimpleAtod(value_text, &value)) {
      continue;
    }
    samples[std::string(line.substr(0, space))] = value;
  }
  return samples;
}

std::optional<double> Sample(const std::map<std::string, double>& samples,
                             const std::string& series) {
  auto it = samples.find(series);
  if (it == samples.end()) return std::nullopt;
  return it->second;
}

std::shared_ptr<RuntimeCounters> KnownCounters() {
  auto c = std::make_shared<RuntimeCounters>();
  c->device = 3;
  c->numa_node = 1;
  c->backend = "host";
  c->predicted_peak_device_bytes = 98ull << 30;
  c->predicted_host_bytes = 45ull << 30;
  c->predicted_step_seconds = 2.5;
  c->gpu_budget_bytes = 140ull << 30;
  c->link_ceiling_bytes_per_second = 55.3e9;
  for (const char* type : {"kda+moe", "dsa+moe"}) {
    c->layer_types.push_back(std::make_unique<LayerTypeCounters>());
    c->layer_types.back()->layer_type = type;
  }
  c->arena_capacity_bytes = 1000;
  c->RecordArenaUse(600);
  c->RecordArenaUse(400);
  c->device_pending_bytes = 100;
  c->observed_peak_device_bytes = 97ull << 30;
  c->d2h.bytes = 4000;
  c->d2h.copies = 4;
  AddSeconds(c->d2h.busy_nanos, 2.0);
  c->h2d.bytes = 3000;
  c->h2d.copies = 3;
  AddSeconds(c->h2d.busy_nanos, 0.5);
  c->copies_in_flight = 2;
  c->saves_total = 4;
  c->restores_total = 3;
  AddSeconds(c->stall_nanos, 0.25);
  c->layer_types[0]->offloaded_bytes = 2500;
  c->layer_types[0]->restored_bytes = 2000;
  c->layer_types[1]->offloaded_bytes = 1500;
  c->layer_types[1]->restored_bytes = 1000;
  c->RecordStep(0.02);   // bucket 0.025
  c->RecordStep(0.3);    // bucket 0.5
  c->RecordStep(0.3);    // bucket 0.5
  c->RecordStep(100.0);  // beyond the last bound: +Inf only
  c->errors_by_status[STOWAGE_ERROR_RESOURCE_EXHAUSTED] = 2;
  c->errors_by_status[STOWAGE_ERROR_DATA_LOSS] = 1;
  return c;
}

TEST(ResolveMetricsAddressTest, OptionWinsOverEnvironment) {
  setenv("STOWAGE_METRICS_ADDR", "127.0.0.1:9999", 1);
  EXPECT_EQ(ResolveMetricsAddress("127.0.0.1:1234"), "127.0.0.1:1234");
  EXPECT_EQ(ResolveMetricsAddress(""), "");  // empty option: no endpoint, even with the env set
  EXPECT_EQ(ResolveMetricsAddress(nullptr), "127.0.0.1:9999");
  setenv("STOWAGE_METRICS_ADDR", "9465", 1);
  EXPECT_EQ(ResolveMetricsAddress(nullptr), "127.0.0.1:9465");  // bare port: loopback
  setenv("STOWAGE_METRICS_ADDR", "", 1);
  EXPECT_EQ(ResolveMetricsAddress(nullptr), "");
  unsetenv("STOWAGE_METRICS_ADDR");
  EXPECT_EQ(ResolveMetricsAddress(nullptr), "");
  EXPECT_EQ(ResolveMetricsAddress("0.0.0.0:9464"), "0.0.0.0:9464");  // all interfaces if asked
}

TEST(MetricsExporterTest, RejectsMalformedAddresses) {
  auto counters = std::make_shared<RuntimeCounters>();
  for (const char* bad : {"", "localhost:", "127.0.0.1:99999", "127.0.0.1:80,8080",
                          "example.com:9464", "127.0.0.1:9464s", "[::1]9464", "[zz]:9464"}) {
    absl::StatusOr<std::unique_ptr<MetricsExporter>> exporter =
        MetricsExporter::Start(bad, counters);
    ASSERT_FALSE(exporter.ok()) << bad;
    EXPECT_EQ(exporter.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(MetricsExporter::Start("127.0.0.1:0", nullptr).ok());
}

TEST(MetricsExporterTest, BindsLoopbackByDefaultWithARealPort) {
  auto exporter = MetricsExporter::Start("0", std::make_shared<RuntimeCounters>());
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  EXPECT_THAT((*exporter)->bound_address(), StartsWith("127.0.0.1:"));
  EXPECT_NE((*exporter)->bound_address(), "127.0.0.1:0");
}

TEST(MetricsExporterTest, PortInUseIsUnavailableAndNamesTheAddress) {
  auto first = MetricsExporter::Start("127.0.0.1:0", std::make_shared<RuntimeCounters>());
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = (*first)->bound_address();
  auto second = MetricsExporter::Start(taken, std::make_shared<RuntimeCounters>());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(taken));
}

TEST(MetricsExporterTest, ServesEveryCounterWithItsValue) {
  std::shared_ptr<RuntimeCounters> counters = KnownCounters();
  auto exporter = MetricsExporter::Start("127.0.0.1:0", counters);
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  const std::string text = Scrape((*exporter)->bound_address());
  ASSERT_FALSE(text.empty());
  const std::map<std::string, double> s = ParseSamples(text);
  const std::string dev = R"(device="3")";
  const std::string node = R"(device="3",numa_node="1")";
  auto at = [&](const std::string& series) { return Sample(s, series); };

  EXPECT_EQ(at(R"(stowage_runtime_info{backend="host",device="3",numa_node="1"})"), 1);
  EXPECT_EQ(at("stowage_plan_peak_device_bytes{" + dev + "}"), 98.0 * (1ull << 30));
  EXPECT_EQ(at("stowage_plan_device_budget_bytes{" + dev + "}"), 140.0 * (1ull << 30));
  EXPECT_EQ(at("stowage_plan_host_bytes{" + node + "}"), 45.0 * (1ull << 30));
  EXPECT_EQ(at("stowage_plan_step_seconds{" + dev + "}"), 2.5);
  EXPECT_EQ(at("stowage_device_observed_peak_bytes{" + dev + "}"), 97.0 * (1ull << 30));
  EXPECT_EQ(at("stowage_device_offloaded_bytes{" + dev + "}"), 300);  // 400 used - 100 pending
  EXPECT_EQ(at("stowage_device_offload_pending_bytes{" + dev + "}"), 100);
  EXPECT_EQ(at("stowage_host_pinned_reserved_bytes{" + node + "}"), 1000);
  EXPECT_EQ(at("stowage_host_pinned_used_bytes{" + node + "}"), 400);
  EXPECT_EQ(at("stowage_host_pinned_peak_bytes{" + node + "}"), 600);

  EXPECT_EQ(at(R"(stowage_copy_bytes_total{device="3",direction="d2h"})"), 4000);
  EXPECT_EQ(at(R"(stowage_copy_bytes_total{device="3",direction="h2d"})"), 3000);
  EXPECT_EQ(at(R"(stowage_copy_seconds_total{device="3",direction="d2h"})"), 2.0);
  EXPECT_EQ(at(R"(stowage_copy_seconds_total{device="3",direction="h2d"})"), 0.5);
  EXPECT_EQ(at(R"(stowage_copy_operations_total{device="3",direction="d2h"})"), 4);
  EXPECT_EQ(at(R"(stowage_copy_achieved_bandwidth_bytes_per_second{device="3",direction="d2h"})"),
            2000);
  EXPECT_EQ(at(R"(stowage_copy_achieved_bandwidth_bytes_per_second{device="3",direction="h2d"})"),
            6000);
  EXPECT_EQ(at("stowage_copy_link_ceiling_bytes_per_second{" + dev + "}"), 55.3e9);
  EXPECT_EQ(at("stowage_copy_in_flight{" + dev + "}"), 2);

  EXPECT_EQ(at(R"(stowage_offload_saved_bytes_total{device="3",layer_type="kda+moe"})"), 2500);
  EXPECT_EQ(at(R"(stowage_offload_saved_bytes_total{device="3",layer_type="dsa+moe"})"), 1500);
  EXPECT_EQ(at(R"(stowage_offload_restored_bytes_total{device="3",layer_type="kda+moe"})"), 2000);
  EXPECT_EQ(at(R"(stowage_offload_restored_bytes_total{device="3",layer_type="dsa+moe"})"), 1000);
  EXPECT_EQ(at("stowage_offload_saves_total{" + dev + "}"), 4);
  EXPECT_EQ(at("stowage_offload_restores_total{" + dev + "}"), 3);
  EXPECT_EQ(at("stowage_compute_stall_seconds_total{" + dev + "}"), 0.25);

  EXPECT_EQ(at("stowage_steps_total{" + dev + "}"), 4);
  EXPECT_EQ(at("stowage_step_last_duration_seconds{" + dev + "}"), 100);
  EXPECT_EQ(at(R"(stowage_step_duration_seconds_bucket{device="3",le="0.01"})"), 0);
  EXPECT_EQ(at(R"(stowage_step_duration_seconds_bucket{device="3",le="0.025"})"), 1);
  EXPECT_EQ(at(R"(stowage_step_duration_seconds_bucket{device="3",le="0.5"})"), 3);
  EXPECT_EQ(at(R"(stowage_step_duration_seconds_bucket{device="3",le="60"})"), 3);
  EXPECT_EQ(at(R"(stowage_step_duration_seconds_bucket{device="3",le="+Inf"})"), 4);
  EXPECT_EQ(at("stowage_step_duration_seconds_count{" + dev + "}"), 4);
  ASSERT_TRUE(at("stowage_step_duration_seconds_sum{" + dev + "}").has_value());
  EXPECT_NEAR(*at("stowage_step_duration_seconds_sum{" + dev + "}"), 100.62, 1e-6);

  EXPECT_EQ(at(R"(stowage_errors_total{device="3",kind="resource_exhausted"})"), 2);
  EXPECT_EQ(at(R"(stowage_errors_total{device="3",kind="data_loss"})"), 1);
  // Every kind is exported from the start, at zero.
  for (const char* kind :
       {"invalid_argument", "not_found", "failed_precondition", "unavailable", "internal"}) {
    EXPECT_EQ(at(absl::StrCat(R"(stowage_errors_total{device="3",kind=")", kind, "\"}")), 0)
        << kind;
  }
  EXPECT_THAT(text, HasSubstr("# TYPE stowage_steps_total counter"));
  EXPECT_THAT(text, HasSubstr("# TYPE stowage_step_duration_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("# TYPE stowage_host_pinned_used_bytes gauge"));
}

TEST(MetricsExporterTest, ScrapesSeeLaterUpdates) {
  auto counters = std::make_shared<RuntimeCounters>();
  auto exporter = MetricsExporter::Start("127.0.0.1:0", counters);
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  const std::string address = (*exporter)->bound_address();
  EXPECT_EQ(Sample(ParseSamples(Scrape(address)), R"(stowage_steps_total{device="0"})"), 0);
  counters->RecordStep(0.1);
  counters->d2h.bytes += 4096;
  const std::map<std::string, double> s = ParseSamples(Scrape(address));
  EXPECT_EQ(Sample(s, R"(stowage_steps_total{device="0"})"), 1);
  EXPECT_EQ(Sample(s, R"(stowage_copy_bytes_total{device="0",direction="d2h"})"), 4096);
  // An unknown NUMA node is labelled, not dropped, so per-node panels still show the host.
  EXPECT_EQ(Sample(s, R"(stowage_host_pinned_reserved_bytes{device="0",numa_node="unknown"})"), 0);
}

TEST(MetricsExporterTest, StopsServingWhenDestroyed) {
  auto exporter = MetricsExporter::Start("127.0.0.1:0", std::make_shared<RuntimeCounters>());
  ASSERT_TRUE(exporter.ok()) << exporter.status();
  const std::string address = (*exporter)->bound_address();
  EXPECT_THAT(Scrape(address), HasSubstr("stowage_steps_total"));
  exporter->reset();
  EXPECT_THAT(Scrape(address), Not(HasSubstr("stowage_steps_total")));
}

}  // namespace
}  // namespace stowage::runtime
