// Prometheus endpoint of the runtime. The exporter reads RuntimeCounters at scrape time (a
// prometheus::Collectable), so the engine's hot paths only ever touch atomics.
#ifndef STOWAGE_RUNTIME_METRICS_H_
#define STOWAGE_RUNTIME_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/runtime_counters.h"

namespace stowage::runtime {

class MetricsExporter {
 public:
  // Serves GET /metrics on `address` ("host:port"; port 0 picks a free port). Binds exactly the
  // host given: "127.0.0.1:9464" listens on loopback only; all interfaces only if asked
  // ("0.0.0.0:9464"). Errors name the address.
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(
      const std::string& address, std::shared_ptr<const RuntimeCounters> counters);
  virtual ~MetricsExporter() = default;

  // The address actually bound, with the real port ("127.0.0.1:40123").
  virtual std::string bound_address() const = 0;
};

// The endpoint to open: `option` when non-null (empty string: none), else STOWAGE_METRICS_ADDR
// (unset or empty: none). A bare port ("9464") means 127.0.0.1:9464.
std::string ResolveMetricsAddress(const char* option);

}  // namespace stowage::runtime

#endif  // STOWAGE_RUNTIME_METRICS_H_
