// Prometheus endpoint of the runtime. See Note [Metrics read at scrape time] in metrics.h.
#include "runtime/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "prometheus/client_metric.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"
#include "prometheus/text_serializer.h"
#include "runtime/metrics_http.h"

namespace stowage::runtime {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// stowage_status codes (index into RuntimeCounters::errors_by_status) as `kind` label values:
// the status names of include/stowage/stowage.h in Prometheus's lower-case label style.
constexpr const char* kErrorKinds[] = {
    nullptr,  // STOWAGE_OK is not an error
    "invalid_argument",
    "not_found",
    "failed_precondition",
    "resource_exhausted",
    "unavailable",
    "data_loss",
    "internal",
};
static_assert(std::size(kErrorKinds) ==
              std::tuple_size_v<decltype(RuntimeCounters::errors_by_status)>);

double Load(const std::atomic<uint64_t>& value) {
  return static_cast<double>(value.load(std::memory_order_relaxed));
}

// Exports one RuntimeCounters. The families, their help, types and label sets are built once,
// in the constructor; a scrape copies them and fills in the values read from the atomics.
class RuntimeCollector final : public prometheus::Collectable {
 public:
  explicit RuntimeCollector(std::shared_ptr<const RuntimeCounters> counters);

  std::vector<MetricFamily> Collect() const override {
    std::vector<MetricFamily> families = families_;
    for (const Reader& reader : readers_) {
      reader.read(*counters_, families[reader.family].metric[reader.index]);
    }
    return families;
  }

 private:
  using Labels = std::vector<ClientMetric::Label>;
  using ReadFn = std::function<void(const RuntimeCounters&, ClientMetric&)>;
  struct Reader {
    size_t family;
    size_t index;
    ReadFn read;
  };

  size_t Family(std::string name, std::string help, MetricType type) {
    MetricFamily family;
    family.name = std::move(name);
    family.help = std::move(help);
    family.type = type;
    families_.push_back(std::move(family));
    return families_.size() - 1;
  }
  void Series(size_t family, Labels labels, ReadFn read) {
    ClientMetric metric;
    metric.label = std::move(labels);
    families_[family].metric.push_back(std::move(metric));
    readers_.push_back({family, families_[family].metric.size() - 1, std::move(read)});
  }
  void Gauge(const std::string& name, const std::string& help, Labels labels,
             std::function<double(const RuntimeCounters&)> value) {
    Series(Family(name, help, MetricType::Gauge), std::move(labels),
           [value = std::move(value)](const RuntimeCounters& c, ClientMetric& m) {
             m.gauge.value = value(c);
           });
  }
  void Counter(const std::string& name, const std::string& help, Labels labels,
               std::function<double(const RuntimeCounters&)> value) {
    Series(Family(name, help, MetricType::Counter), std::move(labels),
           [value = std::move(value)](const RuntimeCounters& c, ClientMetric& m) {
             m.counter.value = value(c);
           });
  }

  std::shared_ptr<const RuntimeCounters> counters_;
  std::vector<MetricFamily> families_;
  std::vector<Reader> readers_;
};

RuntimeCollector::RuntimeCollector(std::shared_ptr<const RuntimeCounters> counters)
    : counters_(std::move(counters)) {
  const RuntimeCounters& c = *counters_;
  const std::string node = c.numa_node >= 0 ? absl::StrCat(c.numa_node) : "unknown";
  auto id = [](int value) { return value >= 0 ? absl::StrCat(value) : std::string("unknown"); };
  // Note [Rank labels]: every series names its rank, local rank, stage and GPU.
  const Labels on_device = {{"gpu", c.gpu},
                            {"hostname", c.hostname},
                            {"local_rank", id(c.local_rank)},
                            {"rank", id(c.rank)},
                            {"stage", absl::StrCat(c.stage)}};
  Labels on_node = on_device;
  on_node.push_back({"numa_node", node});
  std::sort(on_node.begin(), on_node.end());
  auto with = [](Labels labels, std::string name, std::string value) {
    labels.push_back({std::move(name), std::move(value)});
    std::sort(labels.begin(), labels.end());
    return labels;
  };

  // Identity: a constant 1 carrying the labels dashboards build their variables from.
  Gauge("stowage_runtime_info",
        "Runtime identity (value 1): rank, local rank, stage, GPU, machine, NUMA node, backend.",
        with(on_node, "backend", c.backend), [](const RuntimeCounters&) { return 1.0; });

  // The plan's predictions and budgets, exported next to what is observed.
  Gauge("stowage_plan_peak_device_bytes", "Peak device memory the plan predicts for one step.",
        on_device, [](const RuntimeCounters& r) {
          return static_cast<double>(r.predicted_peak_device_bytes);
        });
  Gauge("stowage_plan_device_budget_bytes", "GPU memory budget the plan was made for.", on_device,
        [](const RuntimeCounters& r) { return static_cast<double>(r.gpu_budget_bytes); });
  Gauge("stowage_plan_host_per_gpu_bytes",
        "Pinned host memory the plan needs for this GPU (predicted.host_bytes_per_gpu); a NUMA "
        "node needs the sum over its GPUs.",
        on_node, [](const RuntimeCounters& r) {
          return static_cast<double>(r.predicted_host_bytes_per_gpu);
        });
  Gauge("stowage_plan_step_seconds", "Step time the plan predicts.", on_device,
        [](const RuntimeCounters& r) { return r.predicted_step_seconds; });

  // Device memory.
  Gauge("stowage_device_observed_peak_bytes",
        "Peak device memory the trainer last reported (stowage_report_device_peak); 0 until it "
        "reports.",
        on_device, [](const RuntimeCounters& r) { return Load(r.observed_peak_device_bytes); });
  // Pinned host arena.
  Gauge("stowage_host_pinned_reserved_bytes", "Pinned host bytes reserved by the arena.", on_node,
        [](const RuntimeCounters& r) { return Load(r.arena_capacity_bytes); });

  // The last completed step (Note [Per-step gauges] in runtime/runtime_counters.h): set once at
  // its end, so a scrape at any moment reads the same value until the next step ends.
  Gauge("stowage_step_last_host_pinned_peak_bytes",
        "Most pinned host bytes in use at once in the last completed step: what the step moved "
        "off the device at its high point.",
        on_node, [](const RuntimeCounters& r) { return Load(r.last_step_arena_peak_bytes); });
  Gauge("stowage_step_last_device_offload_pending_peak_bytes",
        "Most bytes handed to save() and still held on the device awaiting their D2H at once, in "
        "the last completed step.",
        on_device, [](const RuntimeCounters& r) { return Load(r.last_step_pending_peak_bytes); });
  Gauge("stowage_step_last_copy_in_flight_peak",
        "Most copies issued and not yet completed at once in the last completed step.", on_device,
        [](const RuntimeCounters& r) { return Load(r.last_step_in_flight_peak); });
  Gauge("stowage_step_last_compute_stall_seconds",
        "Time the compute stream waited for restores in the last completed step.", on_device,
        [](const RuntimeCounters& r) { return Seconds(r.last_step_stall_nanos); });

  // Copies, per direction.
  const std::pair<const char*, const CopyCounters RuntimeCounters::*> directions[] = {
      {"d2h", &RuntimeCounters::d2h}, {"h2d", &RuntimeCounters::h2d}};
  const size_t copy_bytes =
      Family("stowage_copy_bytes_total", "Bytes copied, by direction.", MetricType::Counter);
  // Totals only: PromQL's rate() over them gives bandwidth over any window (a since-start
  // average would hide the last hour under the first).
  const size_t copy_seconds =
      Family("stowage_copy_seconds_total", "Time the copy engine was busy, by direction.",
             MetricType::Counter);
  const size_t copies = Family("stowage_copy_operations_total", "Copies completed, by direction.",
                               MetricType::Counter);
  for (const auto& [direction, member] : directions) {
    const Labels labels = with(on_device, "direction", direction);
    Series(copy_bytes, labels, [member](const RuntimeCounters& r, ClientMetric& m) {
      m.counter.value = Load((r.*member).bytes);
    });
    Series(copy_seconds, labels, [member](const RuntimeCounters& r, ClientMetric& m) {
      m.counter.value = Seconds((r.*member).busy_nanos);
    });
    Series(copies, labels, [member](const RuntimeCounters& r, ClientMetric& m) {
      m.counter.value = Load((r.*member).copies);
    });
  }
  Gauge(
      "stowage_copy_link_bytes_per_second",
      "Host<->device link bandwidth per direction the plan assumed (runtime.link_bytes_per_second; "
      "0: unknown), to compare the achieved bandwidth against: rate(stowage_copy_bytes_total) / "
      "rate(stowage_copy_seconds_total).",
      on_device, [](const RuntimeCounters& r) { return r.link_bytes_per_second; });

  // Offload traffic by layer type, and save/restore calls.
  const size_t saved = Family("stowage_offload_saved_bytes_total",
                              "Bytes saved to the host (D2H), by layer type.", MetricType::Counter);
  const size_t restored =
      Family("stowage_offload_restored_bytes_total",
             "Bytes restored to the device (H2D), by layer type.", MetricType::Counter);
  for (size_t i = 0; i < c.layer_types.size(); ++i) {
    const Labels labels = with(on_device, "layer_type", c.layer_types[i]->layer_type);
    Series(saved, labels, [i](const RuntimeCounters& r, ClientMetric& m) {
      m.counter.value = Load(r.layer_types[i]->saved_bytes);
    });
    Series(restored, labels, [i](const RuntimeCounters& r, ClientMetric& m) {
      m.counter.value = Load(r.layer_types[i]->restored_bytes);
    });
  }
  Counter("stowage_offload_saves_total", "Tensors handed to save().", on_device,
          [](const RuntimeCounters& r) { return Load(r.saves_total); });
  Counter("stowage_offload_restores_total", "Tensors restored to the device.", on_device,
          [](const RuntimeCounters& r) { return Load(r.restores_total); });

  // Compute stalls.
  Counter("stowage_compute_stall_seconds_total",
          "Time the compute stream waited for a restore (prefetch not landed in time).", on_device,
          [](const RuntimeCounters& r) { return Seconds(r.stall_nanos); });

  // Steps.
  Counter("stowage_steps_total", "Training steps completed.", on_device,
          [](const RuntimeCounters& r) { return Load(r.steps_total); });
  Gauge("stowage_step_last_duration_seconds", "Duration of the last completed step.", on_device,
        [](const RuntimeCounters& r) { return Seconds(r.last_step_nanos); });
  Series(Family("stowage_step_duration_seconds",
                "Step duration, begin_step to end_step (buckets: Note [Step duration buckets]).",
                MetricType::Histogram),
         on_device, [](const RuntimeCounters& r, ClientMetric& m) {
           // Buckets are read before the count: RecordStep counts the step first, so a step
           // recorded concurrently can never leave the count below the last bucket.
           m.histogram.bucket.clear();
           uint64_t cumulative = 0;
           for (size_t i = 0; i < r.step_seconds_bounds.size(); ++i) {
             cumulative += r.step_seconds_bucket[i].load(std::memory_order_relaxed);
             m.histogram.bucket.push_back({cumulative, r.step_seconds_bounds[i]});
           }
           const uint64_t count =
               std::max(cumulative, r.steps_total.load(std::memory_order_relaxed));
           m.histogram.bucket.push_back({count, std::numeric_limits<double>::infinity()});
           m.histogram.sample_count = count;
           m.histogram.sample_sum = Seconds(r.step_nanos_sum);
         });

  // Errors: every kind exported from the start, so rate() and increase() see the first error.
  const size_t errors =
      Family("stowage_errors_total", "Failed runtime calls, by status kind.", MetricType::Counter);
  for (size_t code = 1; code < std::size(kErrorKinds); ++code) {
    Series(errors, with(on_device, "kind", kErrorKinds[code]),
           [code](const RuntimeCounters& r, ClientMetric& m) {
             m.counter.value = Load(r.errors_by_status[code]);
           });
  }
}

// Splits "host:port" / "[v6]:port" / "port" and checks both halves: nothing but one literal
// address is bound (no lists, suffixes or host names).
absl::StatusOr<std::pair<std::string, int>> ParseAddress(const std::string& address) {
  std::string host = "127.0.0.1";
  std::string port_text = address;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics address '", address, "': expected [ipv6]:port"));
    }
    host = address.substr(0, close + 1);
    port_text = address.substr(close + 2);
    const bool ipv6_literal =
        host.size() > 2 && std::all_of(host.begin() + 1, host.end() - 1, [](char ch) {
          return absl::ascii_isxdigit(ch) || ch == ':' || ch == '.';
        });
    if (!ipv6_literal) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics address '", address, "': not an IPv6 literal"));
    }
  } else if (const size_t colon = address.rfind(':'); colon != std::string::npos) {
    host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
    if (host.empty()) host = "127.0.0.1";
    if (host == "localhost") host = "127.0.0.1";
    const bool ipv4_literal =
        std::all_of(host.begin(), host.end(),
                    [](char ch) { return absl::ascii_isdigit(ch) || ch == '.'; }) &&
        std::count(host.begin(), host.end(), '.') == 3;
    if (!ipv4_literal) {
      return absl::InvalidArgumentError(absl::StrCat("metrics address '", address,
                                                     "': the host must be an IPv4 literal, [IPv6] "
                                                     "literal or localhost (e.g. 127.0.0.1:9464)"));
    }
  }
  int port = 0;
  if (port_text.empty() || !std::all_of(port_text.begin(), port_text.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "': port must be 0..65535"));
  }
  return std::make_pair(host, port);
}

// A host literal as ParseAddress returns it ("127.0.0.1", "[::1]") and a port, as a sockaddr.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&storage); }
  int port() const {
    return ntohs(storage.ss_family == AF_INET6
                     ? reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port
                     : reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  }
};

absl::StatusOr<SocketAddress> ToSocketAddress(const std::string& host, int port) {
  SocketAddress a;
  const bool v6 = !host.empty() && host.front() == '[';
  const std::string literal = v6 ? host.substr(1, host.size() - 2) : host;
  int parsed = 0;
  if (v6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    a.length = sizeof(*in6);
    parsed = inet_pton(AF_INET6, literal.c_str(), &in6->sin6_addr);
  } else {
    auto* in4 = reinterpret_cast<sockaddr_in*>(&a.storage);
    in4->sin_family = AF_INET;
    in4->sin_port = htons(static_cast<uint16_t>(port));
    a.length = sizeof(*in4);
    parsed = inet_pton(AF_INET, literal.c_str(), &in4->sin_addr);
  }
  if (parsed != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", host, ":", port, "': not a valid IP address"));
  }
  return a;
}

// A socket bound to `host:port` and listening; UNAVAILABLE naming the address and the reason
// when it cannot be (Note [Endpoint under slow clients] in metrics_http.cc: the backlog is the
// kernel's largest, as the server accepts as fast as connections come).
absl::StatusOr<int> Listen(const std::string& host, int port) {
  absl::StatusOr<SocketAddress> a = ToSocketAddress(host, port);
  if (!a.ok()) return a.status();
  const int fd = socket(a->storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket(): ", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, a->get(), a->length) != 0) {
    const int error = errno;
    close(fd);
    if (error == EADDRINUSE) {
      return absl::UnavailableError(absl::StrCat(
          "metrics endpoint ", host, ":", port,
          " is already in use by another process (another rank? with STOWAGE_METRICS_ADDR each "
          "rank listens on the base port + LOCAL_RANK; or pick another port)"));
    }
    return absl::UnavailableError(absl::StrCat("metrics endpoint: cannot bind ", host, ":", port,
                                               ": ", std::strerror(error)));
  }
  if (listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("metrics endpoint: cannot listen on ", host, ":",
                                               port, ": ", std::strerror(error)));
  }
  return fd;
}

class HttpMetricsExporter final : public MetricsExporter {
 public:
  HttpMetricsExporter(std::string host, std::unique_ptr<MetricsHttpServer> server)
      : host_(std::move(host)), server_(std::move(server)) {}

  std::string bound_address() const override { return absl::StrCat(host_, ":", server_->port()); }

 private:
  std::string host_;
  std::unique_ptr<MetricsHttpServer> server_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(
    const std::string& address, std::shared_ptr<const RuntimeCounters> counters) {
  if (counters == nullptr) return absl::InvalidArgumentError("metrics exporter: counters is null");
  absl::StatusOr<std::pair<std::string, int>> parsed = ParseAddress(address);
  if (!parsed.ok()) return parsed.status();
  const auto& [host, port] = *parsed;
  absl::StatusOr<int> fd = Listen(host, port);
  if (!fd.ok()) return fd.status();
  auto collector = std::make_shared<const RuntimeCollector>(std::move(counters));
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server = MetricsHttpServer::Start(
      *fd, [collector] { return prometheus::TextSerializer().Serialize(collector->Collect()); });
  if (!server.ok()) return server.status();
  return std::make_unique<HttpMetricsExporter>(host, *std::move(server));
}

absl::StatusOr<std::string> CanonicalMetricsAddress(const std::string& address) {
  absl::StatusOr<std::pair<std::string, int>> parsed = ParseAddress(address);
  if (!parsed.ok()) return parsed.status();
  return absl::StrCat(parsed->first, ":", parsed->second);
}

std::string ResolveMetricsAddress(const char* option) {
  std::string address;
  if (option != nullptr) {
    address = option;
  } else if (const char* env = std::getenv("STOWAGE_METRICS_ADDR"); env != nullptr) {
    address = env;
  }
  address = std::string(absl::StripAsciiWhitespace(address));
  if (!address.empty() && std::all_of(address.begin(), address.end(),
                                      [](char ch) { return absl::ascii_isdigit(ch); })) {
    return absl::StrCat("127.0.0.1:", address);
  }
  return address;
}

absl::StatusOr<std::string> RankMetricsAddress(const std::string& base, int local_rank,
                                               std::string_view source) {
  if (base.empty() || local_rank < 0) return base;
  absl::StatusOr<std::pair<std::string, int>> parsed = ParseAddress(base);
  if (!parsed.ok()) return parsed.status();
  const auto& [host, port] = *parsed;
  if (port == 0) return base;  // any free port: nothing to share out
  if (port + local_rank > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(source), " ", base, " with LOCAL_RANK ", local_rank, ": port ", port, " + ",
        local_rank, " is past 65535; each rank listens on the base port + its LOCAL_RANK"));
  }
  return absl::StrCat(host, ":", port + local_rank);
}

absl::StatusOr<std::string> ResolveRankMetricsAddress(const char* option, int local_rank) {
  const std::string address = ResolveMetricsAddress(option);
  if (option != nullptr) return address;  // the caller chose it for this rank
  return RankMetricsAddress(address, local_rank, "STOWAGE_METRICS_ADDR");
}

namespace {
constexpr char kBucketsAllowed[] =
    "allowed: upper bounds in seconds separated by commas, each finite and > 0, strictly "
    "increasing, 1 to 128 of them; +Inf is implied (e.g. \"1,2.5,5,10,30,60\")";
static_assert(kMaxStepSecondsBuckets == 128, "kBucketsAllowed names the limit");
}  // namespace

absl::Status CheckStepSecondsBuckets(const std::vector<double>& bounds, std::string_view source) {
  if (bounds.empty() || bounds.size() > kMaxStepSecondsBuckets) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source), ": ", bounds.size(), " bounds; ", kBucketsAllowed));
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || bounds[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": bound ", i + 1, " is ",
                                                     bounds[i], "; ", kBucketsAllowed));
    }
    if (i > 0 && bounds[i] <= bounds[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": bound ", i + 1, " (",
                                                     bounds[i], ") is not above bound ", i, " (",
                                                     bounds[i - 1], "); ", kBucketsAllowed));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> ParseStepSecondsBuckets(std::string_view text,
                                                            std::string_view source) {
  std::vector<double> bounds;
  const std::string quoted = absl::StrCat(std::string(source), " '", std::string(text), "'");
  size_t entry = 0;
  for (absl::string_view part : absl::StrSplit(absl::string_view(text.data(), text.size()), ',')) {
    ++entry;
    const std::string value(absl::StripAsciiWhitespace(part));
    double bound = 0;
    // SimpleAtod takes "inf" and "nan"; the finiteness check below names them.
    if (value.empty() || !absl::SimpleAtod(value, &bound)) {
      return absl::InvalidArgumentError(absl::StrCat(quoted, ": entry ", entry, " '", value,
                                                     "' is not a number; ", kBucketsAllowed));
    }
    bounds.push_back(bound);
  }
  if (absl::Status s = CheckStepSecondsBuckets(bounds, quoted); !s.ok()) return s;
  return bounds;
}

absl::StatusOr<std::vector<double>> ResolveStepSecondsBuckets(const char* option) {
  if (option != nullptr) {  // "" : the defaults, whatever the environment says
    if (absl::StripAsciiWhitespace(option).empty()) return std::vector<double>{};
    return ParseStepSecondsBuckets(option, "options->metrics_step_buckets");
  }
  const char* env = std::getenv("STOWAGE_METRICS_STEP_BUCKETS");
  if (env == nullptr || absl::StripAsciiWhitespace(env).empty()) return std::vector<double>{};
  return ParseStepSecondsBuckets(env, "STOWAGE_METRICS_STEP_BUCKETS");
}

absl::StatusOr<std::string> PickFreePort(const std::string& address) {
  absl::StatusOr<std::pair<std::string, int>> parsed = ParseAddress(address);
  if (!parsed.ok()) return parsed.status();
  const auto& [host, port] = *parsed;
  if (port != 0) return absl::StrCat(host, ":", port);
  absl::StatusOr<SocketAddress> socket_address = ToSocketAddress(host, 0);
  if (!socket_address.ok()) return socket_address.status();
  SocketAddress& a = *socket_address;
  const int fd = socket(a.storage.ss_family, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket(): ", std::strerror(errno)));
  int free_port = 0;
  if (bind(fd, a.get(), a.length) == 0 && getsockname(fd, a.get(), &a.length) == 0) {
    free_port = a.port();
  }
  const int saved_errno = errno;
  close(fd);
  if (free_port == 0) {
    return absl::UnavailableError(absl::StrCat("metrics address '", address,
                                               "': no free port: ", std::strerror(saved_errno)));
  }
  return absl::StrCat(host, ":", free_port);
}

}  // namespace stowage::runtime
