// The metrics endpoint's HTTP server. See Note [Endpoint under slow clients].
#include "runtime/metrics_http.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace stowage::runtime {
namespace {

// Note [Endpoint under slow clients]
// A scrape must be answered however many connections other clients on the same host hold open or
// feed slowly (idle keep-alives, health checkers, port scanners, slowloris). A server with a
// thread per connection cannot promise that: civetweb (under prometheus-cpp's Exposer) held a
// worker from accept until the request was read, so 230 held connections (its listen backlog
// plus 8 workers) made a scrape time out and 16 trickling ones delayed one by seconds. Here one
// thread waits on every connection at once with poll(), so a connection that sends nothing costs
// a file descriptor and nothing else, and:
//   - accepting never waits for a worker: every pending connection is accepted as soon as the
//     listening socket is readable;
//   - at most kMaxConnections are open; accepting one more closes the oldest first. A scrape
//     sends its request at once and is answered within the same few poll rounds, so it is never
//     the oldest for long; the connections that stay are the ones that send nothing;
//   - each connection has kRequestTimeout from accept to the end of its request headers and
//     kResponseTimeout to take the whole response, then it is closed (a slowloris client gets no
//     more than that, and no more than its one descriptor meanwhile);
//   - a request is at most kMaxRequestBytes of headers (else 431), one request per connection
//     (Connection: close; Prometheus opens a new TCP connection per scrape for microseconds on an
//     interval of seconds).
// Rendering the exposition runs on this thread too: a read of the counters' atomics
// (Note [Metrics read at scrape time] in metrics.h), well under a millisecond.
constexpr size_t kMaxConnections = 128;
constexpr auto kRequestTimeout = std::chrono::seconds(3);
constexpr auto kResponseTimeout = std::chrono::seconds(10);
constexpr size_t kMaxRequestBytes = 8192;
// What prometheus-cpp's text serializer writes.
constexpr char kContentType[] = "text/plain; charset=utf-8";

using Clock = std::chrono::steady_clock;

struct Connection {
  int fd = -1;
  Clock::time_point accepted;
  std::string in;   // the request so far
  std::string out;  // the response, once the request is read
  size_t sent = 0;
  bool responding() const { return !out.empty(); }
  Clock::time_point deadline() const {
    return accepted + (responding() ? kResponseTimeout : kRequestTimeout);
  }
};

std::string Response(absl::string_view status, absl::string_view extra_headers,
                     absl::string_view body, bool send_body) {
  std::string response = absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", kContentType,
                                      "\r\nContent-Length: ", body.size(), "\r\n", extra_headers);
  absl::StrAppend(&response, "Connection: close\r\n\r\n");
  if (send_body) absl::StrAppend(&response, body);
  return response;
}

// The response to the request whose headers are `request` (complete: they end in a blank line).
std::string Answer(absl::string_view request, const std::function<std::string()>& exposition) {
  const absl::string_view line = request.substr(0, request.find_first_of("\r\n"));
  const size_t method_end = line.find(' ');
  const size_t target_end =
      method_end == absl::string_view::npos ? method_end : line.find(' ', method_end + 1);
  if (target_end == absl::string_view::npos) {
    return Response("400 Bad Request", "", "expected: GET /metrics HTTP/1.1\n", true);
  }
  const absl::string_view method = line.substr(0, method_end);
  absl::string_view target = line.substr(method_end + 1, target_end - method_end - 1);
  target = target.substr(0, target.find('?'));  // Prometheus may add ?parameters
  if (target != "/metrics") {
    return Response("404 Not Found", "", "only /metrics is served here\n", true);
  }
  if (method != "GET" && method != "HEAD") {
    return Response("405 Method Not Allowed", "Allow: GET, HEAD\r\n", "GET or HEAD /metrics\n",
                    true);
  }
  std::string body;
  try {
    body = exposition();
  } catch (const std::exception& e) {
    return Response("500 Internal Server Error", "", absl::StrCat(e.what(), "\n"), true);
  }
  return Response("200 OK", "", body, method == "GET");
}

class PollServer final : public MetricsHttpServer {
 public:
  PollServer(int listen_fd, int wake_read, int wake_write, std::function<std::string()> exposition)
      : listen_fd_(listen_fd),
        wake_read_(wake_read),
        wake_write_(wake_write),
        exposition_(std::move(exposition)) {}

  absl::Status StartThread() {
    try {
      thread_ = std::thread([this] { Run(); });
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("metrics endpoint: cannot start its thread: ", e.what()));
    }
    return absl::OkStatus();
  }

  ~PollServer() override {
    if (thread_.joinable()) {
      const char stop = 1;
      while (write(wake_write_, &stop, 1) < 0 && errno == EINTR) {
      }
      thread_.join();
    }
    for (const Connection& c : connections_) close(c.fd);
    close(listen_fd_);
    close(wake_read_);
    close(wake_write_);
  }

  int port() const override {
    sockaddr_storage storage{};
    socklen_t length = sizeof(storage);
    if (getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&storage), &length) != 0) return 0;
    return ntohs(storage.ss_family == AF_INET6
                     ? reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port
                     : reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  }

 private:
  void Run() {
    std::vector<pollfd> fds;
    Clock::time_point accept_paused_until;
    for (;;) {
      const Clock::time_point now = Clock::now();
      // Connections past their time are closed; the nearest deadline bounds the wait.
      std::erase_if(connections_, [&](const Connection& c) {
        if (c.deadline() > now) return false;
        close(c.fd);
        return true;
      });
      Clock::time_point wake = now + std::chrono::hours(1);
      for (const Connection& c : connections_) wake = std::min(wake, c.deadline());
      const bool accepting = now >= accept_paused_until;
      if (!accepting) wake = std::min(wake, accept_paused_until);
      fds.clear();
      fds.push_back({wake_read_, POLLIN, 0});
      fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
      for (const Connection& c : connections_) {
        fds.push_back({c.fd, static_cast<short>(c.responding() ? POLLOUT : POLLIN), 0});
      }
      const auto wait =
          std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1;
      const int ready = poll(fds.data(), fds.size(), static_cast<int>(wait));
      if (ready < 0 && errno != EINTR) return;  // cannot wait: nothing more to serve
      if (ready <= 0) continue;
      if (fds[0].revents != 0) return;  // destroyed
      // Serve the connections before accepting more, so a scrape already read is answered first.
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents != 0) Serve(connections_[i - 2], fds[i].revents);
      }
      std::erase_if(connections_, [](const Connection& c) { return c.fd < 0; });
      if (fds[1].revents != 0 && !AcceptAll()) {
        // Out of descriptors with no connection of ours to give back: another part of the
        // process holds them. Try again shortly instead of spinning on the readable socket.
        accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
      }
    }
  }

  // Accepts every pending connection; false when the process is out of descriptors and none of
  // this server's can be closed to make room.
  bool AcceptAll() {
    for (;;) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          if (connections_.empty()) return false;
          CloseOldest();
          continue;
        }
        return true;  // EAGAIN: none left
      }
      if (connections_.size() >= kMaxConnections) CloseOldest();
      Connection c;
      c.fd = fd;
      c.accepted = Clock::now();
      connections_.push_back(std::move(c));
    }
  }

  void CloseOldest() {
    close(connections_.front().fd);
    connections_.erase(connections_.begin());
  }

  // Reads or writes what `c` is ready for; sets c.fd to -1 once it is done with.
  void Serve(Connection& c, short revents) {
    const auto finish = [&c] {
      close(c.fd);
      c.fd = -1;
    };
    if (!c.responding()) {
      if ((revents & (POLLIN | POLLHUP | POLLERR)) == 0) return;
      char buffer[4096];
      const ssize_t n = read(c.fd, buffer, sizeof(buffer));
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return finish();
      if (n < 0) return;
      c.in.append(buffer, static_cast<size_t>(n));
      size_t end = c.in.find("\r\n\r\n");
      if (end == std::string::npos) end = c.in.find("\n\n");
      if (end == std::string::npos) {
        if (c.in.size() > kMaxRequestBytes) {
          c.out = Response("431 Request Header Fields Too Large", "",
                           absl::StrCat("at most ", kMaxRequestBytes, " bytes of headers\n"), true);
        }
        return;
      }
      c.out = Answer(c.in, exposition_);
      // Fall through: the socket can usually take the whole response at once.
    }
    while (c.sent < c.out.size()) {
      const ssize_t n =
          send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return finish();
      }
      c.sent += static_cast<size_t>(n);
    }
    shutdown(c.fd, SHUT_WR);
    finish();
  }

  const int listen_fd_;
  const int wake_read_;
  const int wake_write_;
  const std::function<std::string()> exposition_;
  std::vector<Connection> connections_;  // oldest first
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    int listen_fd, std::function<std::string()> exposition) {
  const int flags = fcntl(listen_fd, F_GETFL);
  if (flags < 0 || fcntl(listen_fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    const int error = errno;
    close(listen_fd);
    return absl::InternalError(absl::StrCat(
        "metrics endpoint: cannot make its socket non-blocking: ", std::strerror(error)));
  }
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    const int error = errno;
    close(listen_fd);
    return absl::InternalError(
        absl::StrCat("metrics endpoint: cannot make its wake-up pipe: ", std::strerror(error)));
  }
  auto server = std::make_unique<PollServer>(listen_fd, wake[0], wake[1], std::move(exposition));
  if (absl::Status started = server->StartThread(); !started.ok()) return started;
  return server;
}

}  // namespace stowage::runtime
