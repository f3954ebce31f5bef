// Reading the Prometheus endpoint in the runtime's metrics tests: HTTP requests over a loopback
// socket, the exposition text parsed into samples, and the step-duration buckets it exports.
#ifndef STOWAGE_TESTS_RUNTIME_METRICS_SCRAPE_H_
#define STOWAGE_TESTS_RUNTIME_METRICS_SCRAPE_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace stowage::testing {

// GET http://<address>/metrics over a plain socket (loopback only); the response body.
// A connected loopback socket to `address` ("127.0.0.1:port") whose reads and writes give up
// after `timeout_seconds` (so a stalled server fails the test instead of hanging it); -1 if none.
inline int Connect(const std::string& address, int timeout_seconds = 20) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  const timeval timeout{timeout_seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The whole response (status line, headers, body) to `method` /metrics; "" on failure.
inline std::string Request(const std::string& address, const std::string& method) {
  const int fd = Connect(address);
  if (fd < 0) return "";
  std::string response;
  const std::string request = absl::StrCat(method, " /metrics HTTP/1.0\r\nHost: ", address,
                                           "\r\nConnection: close\r\n\r\n");
  if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
    char buffer[4096];
    ssize_t n;
    while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  }
  close(fd);
  return response;
}

// The body of GET /metrics; "" on failure.
inline std::string Scrape(const std::string& address) {
  const std::string response = Request(address, "GET");
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The identity labels every series carries (Note [Rank labels]).
inline constexpr const char* kIdentityLabels[] = {"gpu", "hostname", "local_rank", "rank", "stage"};

// Exposition text -> {"name{labels}" -> value}; labels exactly as served (sorted by name), less
// the identity labels, which go to `identities` ("name{...}" -> "gpu=...,local_rank=...";
// stowage_* series only).
inline std::map<std::string, double> ParseSamples(const std::string& text,
                                                  std::map<std::string, std::string>* identities) {
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
    const absl::string_view series = line.substr(0, space);
    const size_t open = series.find('{');
    std::string name(series.substr(0, open));
    std::vector<std::string> rest, identity;
    if (open != absl::string_view::npos) {
      // k="v",k="v" (no value of ours holds a quote or a comma).
      for (absl::string_view label :
           absl::StrSplit(series.substr(open + 1, series.size() - open - 2), ',')) {
        const std::string key(label.substr(0, label.find('=')));
        const bool is_identity = std::find(std::begin(kIdentityLabels), std::end(kIdentityLabels),
                                           key) != std::end(kIdentityLabels);
        (is_identity ? identity : rest).emplace_back(label);
      }
    }
    const std::string key = absl::StrCat(name, "{", absl::StrJoin(rest, ","), "}");
    samples[key] = value;
    // Only stowage's own series: prometheus-cpp adds its exposer_* ones.
    if (identities != nullptr && absl::StartsWith(name, "stowage_")) {
      (*identities)[key] = absl::StrJoin(identity, ",");
    }
  }
  return samples;
}
inline std::map<std::string, double> ParseSamples(const std::string& text) {
  return ParseSamples(text, nullptr);
}

inline std::optional<double> Sample(const std::map<std::string, double>& samples,
                                    const std::string& series) {
  auto it = samples.find(series);
  if (it == samples.end()) return std::nullopt;
  return it->second;
}

// One bucket of a classic histogram: its upper bound and the observations up to it.
struct Bucket {
  double upper_bound;
  double cumulative_count;
};

// The stowage_step_duration_seconds buckets of an exposition text.
inline std::vector<Bucket> ExportedStepBuckets(const std::string& text) {
  std::vector<Bucket> buckets;
  for (const auto& [series, value] : ParseSamples(text)) {
    const std::string prefix = R"(stowage_step_duration_seconds_bucket{le=")";
    if (!absl::StartsWith(series, prefix)) continue;
    const std::string le = series.substr(prefix.size(), series.size() - prefix.size() - 2);
    double bound = std::numeric_limits<double>::infinity();
    if (le != "+Inf" && !absl::SimpleAtod(le, &bound)) ADD_FAILURE() << series;
    buckets.push_back({bound, value});
  }
  return buckets;
}

}  // namespace stowage::testing

#endif  // STOWAGE_TESTS_RUNTIME_METRICS_SCRAPE_H_
