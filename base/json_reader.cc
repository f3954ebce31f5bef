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

// One open array or object while scanning: how many elements it has so far, and (an object) the
// key of the member being read.
struct Frame {
  bool array = false;
  size_t elements = 0;
  bool expect_key = false;  // an object, between '{' or ',' and the member's key
  std::string_view key;
};

// The JSON path of the place the first `n` frames reach ("" for the root): the key or [index]
// each of them is at.
std::string PathOf(const std::vector<Frame>& frames, size_t n) {
  std::string path;
  for (size_t f = 0; f < n; ++f) {
    if (frames[f].array) {
      absl::StrAppend(&path, "[", frames[f].elements == 0 ? 0 : frames[f].elements - 1, "]");
    } else {
      absl::StrAppend(&path, path.empty() ? "" : ".", Excerpt(frames[f].key));
    }
  }
  return path;
}

absl::Status TooManyValues(std::string_view source, const Limits& limits,
                           const std::string& where) {
  return absl::InvalidArgumentError(absl::StrCat(Excerpt(source), ": more than ", limits.max_values,
                                                 " values", where, "; allowed: at most ",
                                                 limits.max_values));
}

// Note [JSON limits while reading]
// Parse scans the text once before nlohmann builds its tree, and stops at the first place it
// nests deeper than kMaxJsonDepth or breaks one of the Limits. The scan keeps only a stack of
// open containers (at most kMaxJsonDepth deep) and a few counters, so refusing an input costs the
// bytes up to the place it breaks a rule: a 99 MB plan of 243,853 layers is refused after its
// 100,001st layer, in the time it takes to read that far, not after the seconds it takes to build
// every layer and only then count them. The scan does not check syntax (the parser does, after
// it); it only counts, so malformed text is at worst counted wrongly and then refused by the
// parser. Brackets, commas and colons inside strings are text, not structure.
absl::Status CheckShape(std::string_view text, std::string_view source, const Limits& limits) {
  // Lines and columns are counted only for an error (a vectorised count up to it), not per byte.
  const auto where = [text](size_t at) {
    const size_t line = 1 + std::count(text.begin(), text.begin() + at + 1, '\n');
    const size_t newline = text.rfind('\n', at);
    const size_t column = newline == std::string_view::npos ? at + 1 : at - newline;
    return absl::StrCat(" at line ", line, ", column ", column);
  };
  // " field 'a.b[2]'" for the place the first `n` frames reach.
  const auto field = [](const std::vector<Frame>& frames, size_t n) {
    const std::string path = PathOf(frames, n);
    return path.empty() ? std::string(" the document") : absl::StrCat(" field '", path, "'");
  };
  if (text.size() > limits.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(Excerpt(source), ": ", text.size(),
                                                   " bytes; allowed: at most ", limits.max_bytes));
  }
  std::vector<Frame> frames;
  frames.reserve(kMaxJsonDepth + 1);
  size_t values = 0;
  const size_t n = text.size();
  for (size_t i = 0; i < n; ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == ':') continue;
    if (c == ']' || c == '}') {
      if (!frames.empty()) frames.pop_back();
      continue;
    }
    // Every other character outside a string is a comma or a character of a value; the first
    // one of a container's first element counts that element.
    if (c == ',') {
      if (!frames.empty()) {
        Frame& frame = frames.back();
        if (!frame.array) frame.expect_key = true;
        frame.elements = frame.elements == 0 ? 1 : frame.elements;
        ++frame.elements;  // the element after the comma
        if (frame.elements > limits.max_elements) {
          return absl::InvalidArgumentError(absl::StrCat(
              Excerpt(source), ":", field(frames, frames.size() - 1), " has more than ",
              limits.max_elements, frame.array ? " elements" : " members", where(i),
              "; allowed: at most ", limits.max_elements));
        }
        if (++values > limits.max_values) return TooManyValues(source, limits, where(i));
      }
      continue;
    }
    if (!frames.empty() && frames.back().elements == 0) {
      frames.back().elements = 1;  // its first element
      if (++values > limits.max_values) return TooManyValues(source, limits, where(i));
    }
    if (frames.empty() && values == 0) ++values;  // the root
    if (c == '"') {
      // To the closing quote, an escaped character at a time past a backslash (an escaped
      // newline is not valid JSON; the parser says so). A key is not a value of its own: its
      // member was counted at its first character.
      const size_t start = i + 1;
      const size_t past_limit = start + limits.max_string_bytes;
      size_t j = start;
      while (j < n && text[j] != '"' && j < past_limit) j += text[j] == '\\' ? 2 : 1;
      if (std::min(j, n) - start > limits.max_string_bytes || (j < n && text[j] != '"')) {
        // A value string is named by its own key or index; a key by the object holding it.
        const bool key = !frames.empty() && frames.back().expect_key;
        return absl::InvalidArgumentError(absl::StrCat(
            Excerpt(source), ":", field(frames, key ? frames.size() - 1 : frames.size()),
            " holds a string longer than ", limits.max_string_bytes, " bytes",
            where(std::min(past_limit, n - 1)), "; allowed: at most ", limits.max_string_bytes,
            " bytes"));
      }
      if (!frames.empty() && frames.back().expect_key) {
        frames.back().key = text.substr(start, std::min(j, n) - start);
        frames.back().expect_key = false;
      }
      i = j;  // the closing quote (or the end of a text cut off inside the string)
    } else if (c == '[' || c == '{') {
      if (frames.size() >= static_cast<size_t>(kMaxJsonDepth)) {
        return absl::InvalidArgumentError(
            absl::StrCat(Excerpt(source), ": arrays and objects nest more than ", kMaxJsonDepth,
                         " levels deep", where(i), "; at most ", kMaxJsonDepth, " are allowed"));
      }
      Frame frame;
      frame.array = c == '[';
      frame.expect_key = c == '{';
      frames.push_back(frame);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Json> Parse(std::string_view text, std::string_view source, const Limits& limits) {
  if (absl::Status shape = CheckShape(text, source, limits); !shape.ok()) return shape;
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
