// The metrics endpoint's HTTP server: GET and HEAD /metrics on one listening socket, served by one
// thread that waits on every connection at once (Note [Endpoint under slow clients] in
// metrics_http.cc), so idle and slow clients cost a file descriptor each, never a scrape's turn.
#ifndef STOWAGE_RUNTIME_METRICS_HTTP_H_
#define STOWAGE_RUNTIME_METRICS_HTTP_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace stowage::runtime {

class MetricsHttpServer {
 public:
  // Serves on `listen_fd` (a bound, listening TCP socket; the server owns and closes it) until
  // destroyed. `exposition` gives the body of GET /metrics (Prometheus text format); it runs on
  // the server's thread. INTERNAL where the thread or its wake-up pipe cannot be made.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      int listen_fd, std::function<std::string()> exposition);
  // Stops serving and closes every connection before it returns (promptly: the thread is woken).
  virtual ~MetricsHttpServer() = default;

  // The port the listening socket is bound to.
  virtual int port() const = 0;
};

}  // namespace stowage::runtime

#endif  // STOWAGE_RUNTIME_METRICS_HTTP_H_
