#include "base/json_reader.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace stowage::json {
namespace {

std::string Quoted(std::string_view source, std::string_view path) {
  return absl::StrCat(std::string(source), ": field '", Excerpt(path, 256), "'");
}

// A value as the error shows it; long values (a whole object) are cut.
std::string Shown(const Json& value) {
  std::string text = value.dump();
  if (text.size() > 64) text = text.substr(0, 61) + "...";
  return text;
}

template <typename T>
std::string RangeText(Range<T> range) {
  if constexpr (std::is_floating_point_v<T>) {
    return absl::StrFormat("a finite number in [%g, %g]", range.min, range.max);
  } else {
    return absl::StrCat("an integer in [", range.min, ", ", range.max, "]");
  }
}

template <typename T>
absl::Status Bad(const Json& value, std::string_view source, std::string_view path,
                 Range<T> range) {
  return absl::InvalidArgumentError(absl::StrCat(Quoted(source, path), " has value ", Shown(value),
                                                 "; allowed: ", RangeText(range)));
}

template <typename T>
absl::Status ReadInteger(const Json& value, std::string_view source, std::string_view path, T& out,
                         Range<T> range) {
  // nlohmann keeps integers exactly (int64 or uint64); 1.0, 1e3, true and "1" are not integers.
  if (!value.is_number_integer()) return Bad(value, source, path, range);
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(range.max) ||
        (range.min > 0 && v < static_cast<uint64_t>(range.min))) {
      return Bad(value, source, path, range);
    }
    out = static_cast<T>(v);
    return absl::OkStatus();
  }
  const int64_t v = value.get<int64_t>();
  if (v < 0 && (std::is_unsigned_v<T> || v < static_cast<int64_t>(range.min))) {
    return Bad(value, source, path, range);
  }
  if (v >= 0 && static_cast<uint64_t>(v) > static_cast<uint64_t>(range.max)) {
    return Bad(value, source, path, range);
  }
  if (v >= 0 && range.min > 0 && static_cast<uint64_t>(v) < static_cast<uint64_t>(range.min)) {
    return Bad(value, source, path, range);
  }
  out = static_cast<T>(v);
  return absl::OkStatus();
}

}  // namespace

std::string Excerpt(std::string_view text, size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  return absl::StrCat(std::string(text.substr(0, max_chars)), "... (", text.size() - max_chars,
                      " more characters)");
}

namespace {

// The first place `text` nests deeper than kMaxJsonDepth, as an error naming its line and column;
// OK otherwise. One pass over the bytes, brackets inside strings not counted.
absl::Status CheckDepth(std::string_view text, std::string_view source) {
  int depth = 0;
  bool in_string = false;
  size_t line = 1, column = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    ++column;
    if (c == '\n') {
      ++line;
      column = 0;
    }
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character (an escaped newline is not valid JSON; the parser says so)
        ++column;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        return absl::InvalidArgumentError(
            absl::StrCat(Excerpt(source), ": arrays and objects nest more than ", kMaxJsonDepth,
                         " levels deep at line ", line, ", column ", column, "; at most ",
                         kMaxJsonDepth, " are allowed"));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Json> Parse(std::string_view text, std::string_view source) {
  if (absl::Status deep = CheckDepth(text, source); !deep.ok()) return deep;
  // Keys seen so far in each object being read, innermost last. A duplicate key is an error: JSON
  // readers disagree on which copy wins (nlohmann's ordered_json keeps the first, Python's json the
  // last), so two readers of one file would see two different documents.
  std::vector<absl::flat_hash_set<std::string>> keys;
  std::string duplicate;
  const Json::parser_callback_t track = [&](int /*depth*/, nlohmann::detail::parse_event_t event,
                                            Json& parsed) {
    using Event = nlohmann::detail::parse_event_t;
    if (event == Event::object_start) {
      keys.emplace_back();
    } else if (event == Event::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (event == Event::key && !keys.empty() && duplicate.empty()) {
      if (!keys.back().insert(parsed.get<std::string>()).second) {
        duplicate = parsed.get<std::string>();
      }
    }
    return true;
  };
  try {
    Json json = Json::parse(text.begin(), text.end(), track);
    if (!duplicate.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": duplicate key '",
                                                     Excerpt(duplicate),
                                                     "' in one object; each key may appear once"));
    }
    return json;
  } catch (const Json::parse_error& e) {
    // e.byte is 1-based, one past the offending character.
    const size_t at = e.byte == 0 ? 0 : std::min<size_t>(e.byte - 1, text.size());
    size_t line = 1, column = 1;
    for (size_t i = 0; i < at; ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    std::string what = e.what();
    // nlohmann's message starts "[json.exception.parse_error.101] parse error at line L, column
    // C: ..."; keep only the reason.
    if (auto colon = what.find(": ", what.find("parse error")); colon != std::string::npos) {
      what = what.substr(colon + 2);
    }
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": not valid JSON at line ",
                                                   line, ", column ", column, ": ", what));
  } catch (const Json::exception& e) {
    // Not a syntax error but still the parser's: a number such as 1e400 that overflows a double
    // (out_of_range.406) carries no position.
    std::string what = e.what();
    if (auto bracket = what.find("] "); bracket != std::string::npos)
      what = what.substr(bracket + 2);
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source), ": not valid JSON: ", what));
  }
}

absl::StatusOr<Object> Object::Of(const Json& value, std::string source, std::string path) {
  if (!value.is_object()) {
    return absl::InvalidArgumentError(
        path.empty() ? absl::StrCat(source, ": expected a JSON object, found ", Shown(value))
                     : absl::StrCat(Quoted(source, path), " has value ", Shown(value),
                                    "; allowed: a JSON object"));
  }
  return Object(&value, std::move(source), std::move(path));
}

absl::Status Object::OnlyKeys(absl::Span<const std::string_view> allowed) const {
  for (const auto& [key, value] : json_->items()) {
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        source_, ": unknown field '", Excerpt(PathOf(key), 256), "'; allowed",
        path_.empty() ? "" : absl::StrCat(" in '", path_, "'"), ": ",
        absl::StrJoin(allowed, ", ", [](std::string* out, std::string_view allowed_key) {
          out->append(allowed_key);
        })));
  }
  return absl::OkStatus();
}

std::string Object::PathOf(std::string_view key) const {
  return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", std::string(key));
}

absl::Status Object::Missing(std::string_view key) const {
  return absl::InvalidArgumentError(absl::StrCat(source_, ": missing field '", PathOf(key), "'"));
}

absl::Status Object::Invalid(std::string_view key, std::string_view allowed) const {
  auto it = json_->find(key);
  return absl::InvalidArgumentError(absl::StrCat(Quoted(source_, PathOf(key)), " has value ",
                                                 it == json_->end() ? "(none)" : Shown(*it),
                                                 "; allowed: ", std::string(allowed)));
}

#define STOWAGE_JSON_READ(T, ...)                                                            \
  absl::Status Object::Read(std::string_view key, T& out __VA_OPT__(, ) __VA_ARGS__) const { \
    auto it = json_->find(key);                                                              \
    if (it == json_->end()) return Missing(key);                                             \
    return ReadValue(*it, source_, PathOf(key), out __VA_OPT__(, range));                    \
  }

STOWAGE_JSON_READ(int64_t, Range<int64_t> range)
STOWAGE_JSON_READ(uint64_t, Range<uint64_t> range)
STOWAGE_JSON_READ(int, Range<int> range)
STOWAGE_JSON_READ(double, Range<double> range)
STOWAGE_JSON_READ(bool)
STOWAGE_JSON_READ(std::string)
#undef STOWAGE_JSON_READ

absl::StatusOr<Object> Object::Child(std::string_view key) const {
  auto it = json_->find(key);
  if (it == json_->end()) return Missing(key);
  return Of(*it, source_, PathOf(key));
}

absl::StatusOr<const Json*> Object::Array(std::string_view key) const {
  auto it = json_->find(key);
  if (it == json_->end()) return Missing(key);
  if (!it->is_array()) return Invalid(key, "a JSON array");
  return &*it;
}

absl::Status ReadValue(const Json& value, std::string_view source, std::string_view path,
                       int64_t& out, Range<int64_t> range) {
  return ReadInteger(value, source, path, out, range);
}
absl::Status ReadValue(const Json& value, std::string_view source, std::string_view path,
                       uint64_t& out, Range<uint64_t> range) {
  return ReadInteger(value, source, path, out, range);
}
absl::Status ReadValue(const Json& value, std::string_view source, std::string_view path, int& out,
                       Range<int> range) {
  return ReadInteger(value, source, path, out, range);
}

absl::Status ReadValue(const Json& value, std::string_view source, std::string_view path,
                       double& out, Range<double> range) {
  if (!value.is_number()) return Bad(value, source, path, range);
  const double v = value.get<double>();
  if (!std::isfinite(v) || v < range.min || v > range.max) return Bad(value, source, path, range);
  out = v;
  return absl::OkStatus();
}

absl::Status ReadValue(const Json& value, std::string_view source, std::string_view path,
                       bool& out) {
  if (!value.is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat(Quoted(source, path), " has value ",
                                                   Shown(value), "; allowed: true or false"));
  }
  out = value.get<bool>();
  return absl::OkStatus();
}

absl::Status ReadValue(const Json& value, std::string_view source, std::string_view path,
                       std::string& out) {
  if (!value.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Quoted(source, path), " has value ", Shown(value), "; allowed: a string"));
  }
  out = value.get<std::string>();
  return absl::OkStatus();
}

}  // namespace stowage::json
