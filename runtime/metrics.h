// Prometheus endpoint of the runtime. The exporter reads RuntimeCounters at scrape time (a
// prometheus::Collectable), so the engine's hot paths only ever touch atomics.
//
// Note [Metrics read at scrape time]
// Every metric is a view of one RuntimeCounters field: the families (names, help, types, label
// sets) are built once in Start(), and a scrape copies them and fills in the values it reads
// from the atomics. Nothing is registered per step or per tensor, so the label sets stay
// bounded: the identity labels below, `numa_node`, `direction` (d2h, h2d), `layer_type` (the
// plan's distinct layer types), `kind` (the stowage_status names, lower case). docs/metrics.md
// "Metrics" lists every metric; dashboards/stowage.json queries them.
//
// Note [Rank labels]. Every series carries `rank` and `local_rank` (the launcher's RANK and
// LOCAL_RANK; "unknown" when unset), `stage` (the pipeline stage; 0 without pipeline
// parallelism), `hostname` (the machine, from gethostname: ranks on one machine share its NUMA
// nodes and RAM, so per-node sums group by it -- Prometheus's `instance` is whatever address
// the scrape config names, not always host:port of the machine) and `gpu`: the GPU's UUID
// ("GPU-8c2f...", DCGM's `UUID` label and nvidia-smi's spelling, so stowage's series join DCGM's),
// "host" on the host backend. A CUDA ordinal would not do: under CUDA_VISIBLE_DEVICES every rank's
// GPU is device 0. One endpoint per rank: the port of STOWAGE_METRICS_ADDR is the base, and a rank
// listens on base + LOCAL_RANK (ResolveMetricsAddress).
//
// The fields of RuntimeCounters marked "set once at creation" (the identity, numa_node, backend,
// the plan's predictions, layer_types, the step-duration bounds) must be final before Start() is
// called: they become labels and are read without synchronisation at scrape time.
#ifndef STOWAGE_RUNTIME_METRICS_H_
#define STOWAGE_RUNTIME_METRICS_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/runtime_counters.h"

namespace stowage::runtime {

class MetricsExporter {
 public:
  // Serves GET /metrics on `address` ("host:port"; port 0 picks a free port). Binds exactly the
  // host given: "127.0.0.1:9464" listens on loopback only; all interfaces only if asked
  // ("0.0.0.0:9464"). The host must be a literal IPv4 address, a bracketed IPv6 literal, or
  // "localhost" (127.0.0.1); a bare port means 127.0.0.1. INVALID_ARGUMENT for a malformed address,
  // UNAVAILABLE when it cannot be bound; errors name the address. Thread-safe: scrapes are served
  // on the exporter's own thread, which idle and slow clients cannot hold up
  // (Note [Endpoint under slow clients] in metrics_http.cc); destroying it stops serving before it
  // returns.
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(
      const std::string& address, std::shared_ptr<const RuntimeCounters> counters);
  virtual ~MetricsExporter() = default;

  // The address actually bound, with the real port ("127.0.0.1:40123").
  virtual std::string bound_address() const = 0;
};

// `address` as Start() reads it, spelled so that it can be connected to and printed in a URL: the
// host Start() binds ("127.0.0.1" for a bare port, ":9464" and "localhost:9464") and the port.
// INVALID_ARGUMENT naming the address where Start() would refuse it.
absl::StatusOr<std::string> CanonicalMetricsAddress(const std::string& address);

// The endpoint to open: `option` when non-null (empty string: none), else STOWAGE_METRICS_ADDR
// (unset or empty: none). A bare port ("9464") means 127.0.0.1:9464.
std::string ResolveMetricsAddress(const char* option);
// A rank's endpoint: as above, and when it comes from STOWAGE_METRICS_ADDR (`option` null: one
// setting for the whole job) its port is the base and this rank listens on base + local_rank
// (local_rank >= 0, port not 0; Note [Rank labels]). An option is taken as given: the caller chose
// it for this rank. INVALID_ARGUMENT naming the address and LOCAL_RANK when the sum passes 65535.
absl::StatusOr<std::string> ResolveRankMetricsAddress(const char* option, int local_rank);

// The endpoint of the rank with `local_rank` when `base` ("host:port", as ResolveMetricsAddress
// returns it) is one setting for the whole job: port base + local_rank (unchanged for port 0 or
// local_rank < 0). INVALID_ARGUMENT naming `source`, the address and LOCAL_RANK past 65535.
absl::StatusOr<std::string> RankMetricsAddress(const std::string& base, int local_rank,
                                               std::string_view source);

// Step-duration histogram bounds (Note [Step duration buckets] in runtime/runtime_counters.h)
// from text: upper bounds in seconds separated by commas ("1,2.5,5,10,30,60"; spaces allowed),
// each finite and > 0, strictly increasing, 1 to kMaxStepSecondsBuckets of them (+Inf is
// implied). INVALID_ARGUMENT naming `source`, the entry, its value and what is allowed.
absl::StatusOr<std::vector<double>> ParseStepSecondsBuckets(std::string_view text,
                                                            std::string_view source);
// The bounds a runtime uses: `option` when non-null (its source "options->metrics_step_buckets"),
// else STOWAGE_METRICS_STEP_BUCKETS when set and not empty, else empty (the defaults).
absl::StatusOr<std::vector<double>> ResolveStepSecondsBuckets(const char* option);
// The same rules for bounds given as numbers (RuntimeOptions::step_seconds_buckets).
absl::Status CheckStepSecondsBuckets(const std::vector<double>& bounds, std::string_view source);

// `address` ("host:0") with port 0 replaced by a port that is free on that host right now, for
// callers that must know the endpoint before the runtime binds it (the C ABI does not report the
// bound address). Another process may take the port in between; Start() then fails UNAVAILABLE.
absl::StatusOr<std::string> PickFreePort(const std::string& address);

}  // namespace stowage::runtime

#endif  // STOWAGE_RUNTIME_METRICS_H_
