// The one strict reader for every JSON input stowage takes (plans, hardware profiles, model
// configs, layer profiles). Numbers are typed and range-checked per field: an integer field takes
// only a JSON integer inside its range (no 1.5, no true, no -1 read as 2^64-1, no 1e30); a real
// field takes only a finite JSON number. Errors name the source (file or "plan"), the JSON path of
// the field, the value found and what is allowed, e.g.
//   hardware profile h200.json: field 'link.d2h_bytes_per_second' has value -1; allowed: a
//   number in [1, 1e+15]
#ifndef STOWAGE_BASE_JSON_READER_H_
#define STOWAGE_BASE_JSON_READER_H_

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"

namespace stowage::json {

using Json = nlohmann::ordered_json;

// How deeply arrays and objects may nest in any JSON input. Real inputs nest under 10 levels (a
// plan request holding a config.json); the bound keeps every recursive walk of a parsed document
// (nlohmann's dump(), used in error messages) far inside the smallest thread stack a trainer gives
// a worker (a few hundred KiB).
inline constexpr int kMaxJsonDepth = 100;

// How much one JSON input may hold. Parse checks them in one pass over the text that stops at the
// first one broken, before any tree is built: refusing a 100 MB input costs the milliseconds it
// takes to scan up to the limit, not the seconds it takes to build it whole. Each reader may
// narrow them (a plan's arrays hold at most kPlanMaxLayers elements); docs/limits.md lists them.
struct Limits {
  // The whole text.
  size_t max_bytes = size_t{256} << 20;
  // One string (key or value) as written, escapes included.
  size_t max_string_bytes = size_t{1} << 20;
  // The elements of one array or the members of one object.
  size_t max_elements = size_t{1} << 20;
  // Every value of the document (containers, strings, numbers, true, false, null) together.
  size_t max_values = size_t{1} << 24;
};

// Parses `text`; a syntax error names `source` and the line and column where it was found. Text
// nested deeper than kMaxJsonDepth, or breaking one of `limits`, is refused (naming the field, the
// line and column and the limit) before anything recursive runs on it.
absl::StatusOr<Json> Parse(std::string_view text, std::string_view source,
                           const Limits& limits = Limits());

// At most `max_chars` of `text` for an error message: longer text is cut and says how much was cut,
// so a huge input never makes a huge message.
std::string Excerpt(std::string_view text, size_t max_chars = 64);

template <typename T>
struct Range {
  T min = std::numeric_limits<T>::lowest();
  T max = std::numeric_limits<T>::max();
};

// A view of one JSON object at `path` ("" for the document root) within `source`.
class Object {
 public:
  // Fails (naming source and path) unless `value` is a JSON object.
  static absl::StatusOr<Object> Of(const Json& value, std::string source, std::string path = "");

  const Json& json() const { return *json_; }
  const std::string& source() const { return source_; }
  // "a.b" for key "b" of the object at "a".
  std::string PathOf(std::string_view key) const;
  bool Has(std::string_view key) const { return json_->contains(key); }

  // Fails naming the first key of this object that is not in `allowed`, and the keys allowed: a
  // misspelt optional field is an error, never a default silently used in its place.
  absl::Status OnlyKeys(absl::Span<const std::string_view> allowed) const;

  // Required fields: a missing one is an error naming it.
  absl::Status Read(std::string_view key, int64_t& out, Range<int64_t> range = {}) const;
  absl::Status Read(std::string_view key, uint64_t& out, Range<uint64_t> range = {}) const;
  absl::Status Read(std::string_view key, int& out, Range<int> range = {}) const;
  absl::Status Read(std::string_view key, double& out, Range<double> range = {}) const;
  absl::Status Read(std::string_view key, bool& out) const;
  absl::Status Read(std::string_view key, std::string& out) const;

  // Optional fields: `out` keeps its value (the default) when the key is absent or null.
  template <typename T, typename... Rest>
  absl::Status ReadOptional(std::string_view key, T& out, Rest... rest) const {
    auto it = json_->find(key);
    if (it == json_->end() || it->is_null()) return absl::OkStatus();
    return Read(key, out, rest...);
  }

  // A nested object (required / optional: nullopt-like empty StatusOr is not used; check Has()).
  absl::StatusOr<Object> Child(std::string_view key) const;
  // The array at `key` (required); its elements are read with the Element* helpers below.
  absl::StatusOr<const Json*> Array(std::string_view key) const;

  // The error every reader uses for a field whose value breaks a rule that is not a range.
  absl::Status Invalid(std::string_view key, std::string_view allowed) const;
  absl::Status Missing(std::string_view key) const;

 private:
  Object(const Json* json, std::string source, std::string path)
      : json_(json), source_(std::move(source)), path_(std::move(path)) {}
  const Json* json_;
  std::string source_;
  std::string path_;
};

// Reads one value (an array element, or a value already found) named `path` within `source`.
absl::Status ReadValue(const Json& value, std::string_view source, std::string_view path,
                       int64_t& out, Range<int64_t> range = {});
absl::Status ReadValue(const Json& value, std::string_view source, std::string_view path,
                       uint64_t& out, Range<uint64_t> range = {});
absl::Status ReadValue(const Json& value, std::string_view source, std::string_view path, int& out,
                       Range<int> range = {});
absl::Status ReadValue(const Json& value, std::string_view source, std::string_view path,
                       double& out, Range<double> range = {});
absl::Status ReadValue(const Json& value, std::string_view source, std::string_view path,
                       bool& out);
absl::Status ReadValue(const Json& value, std::string_view source, std::string_view path,
                       std::string& out);

}  // namespace stowage::json

#endif  // STOWAGE_BASE_JSON_READER_H_
