// Word expansion for the launch-script reader: see bridges/shell_expand.h.
#include "bridges/shell_expand.h"

#include <fnmatch.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bridges/shell_lexer.h"

namespace stowage::bridges::shell {
namespace {

std::string Shorten(absl::string_view s) {
  std::string out(s.substr(0, 60));
  for (char& c : out) {
    if (c == '\n') c = ' ';
  }
  return s.size() > 60 ? out + "..." : out;
}

std::string Where(const Scope& scope) { return absl::StrCat(scope.source, ":", scope.line); }

// A parameter's value: one string, or a list ($@, ${A[@]}).
struct Value {
  Value() = default;
  Value(std::vector<std::string> v, bool l, bool s, std::string u, std::vector<std::string> e = {})
      : values(std::move(v)),
        list(l),
        set(s),
        unresolved(std::move(u)),
        element_unresolved(std::move(e)) {}
  std::vector<std::string> values;
  bool list = false;
  bool set = false;
  std::string unresolved;
  std::vector<std::string> element_unresolved;  // per value, or empty
  std::string Joined() const { return absl::StrJoin(values, " "); }
};

// The end of a ${...}, $(...) or `...` starting at `at` (the index just past its closing char).
size_t Matching(absl::string_view s, size_t at, char open, char close) {
  int depth = 0;
  for (size_t i = at; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\\') {
      ++i;
      continue;
    }
    if (c == '\'' && open != '`') {
      const size_t end = s.find('\'', i + 1);
      if (end == absl::string_view::npos) return s.size();
      i = end;
      continue;
    }
    if (c == open && open != close) ++depth;
    if (c == close) {
      if (open == close || --depth == 0) return i + 1;
    }
  }
  return s.size();
}

class Expander {
 public:
  explicit Expander(Scope& scope) : scope_(scope) {}

  Value Lookup(absl::string_view name) {
    Value v;
    if (name == "@" || name == "*") {
      v.values = *scope_.positional;
      v.list = name == "@";
      v.set = true;
      return v;
    }
    if (name == "#") return Scalar(absl::StrCat(scope_.positional->size()));
    if (name == "?") return Scalar("0");
    if (name == "$" || name == "!") {
      v.unresolved =
          absl::StrCat(Where(scope_), ": $", name, " is known only when the script runs");
      return v;
    }
    int index = 0;
    if (absl::SimpleAtoi(name, &index)) {
      if (index == 0) return Scalar(scope_.source);
      if (index > 0 && static_cast<size_t>(index) <= scope_.positional->size()) {
        return Scalar((*scope_.positional)[index - 1]);
      }
      v.unresolved = absl::StrCat(Where(scope_), ": $", index,
                                  " is not given (the script's arguments follow `--` after "
                                  "--from-megatron FILE)");
      return v;
    }
    std::string base(name), subscript;
    if (const size_t open = base.find('['); open != std::string::npos && base.back() == ']') {
      subscript = base.substr(open + 1, base.size() - open - 2);
      base = base.substr(0, open);
    }
    if (auto it = scope_.variables->find(base); it != scope_.variables->end()) {
      v.values = it->second.values;
      v.unresolved = it->second.unresolved;
      v.element_unresolved = it->second.element_unresolved;
      v.set = true;
    } else if (auto env = scope_.env->find(base); env != scope_.env->end()) {
      v.values = {env->second};
      v.set = true;
    }
    if (subscript == "@" || subscript == "*") {
      v.list = subscript == "@";
      return v;
    }
    long long element = 0;
    if (!subscript.empty()) {
      auto i = ShellArithmetic(ExpandString(subscript, scope_, false).text, Flat());
      if (!i.ok() || *i < 0) {
        v.unresolved = absl::StrCat(Where(scope_), ": the subscript of ${", name, "}");
        return v;
      }
      element = *i;
    }
    std::string why = v.unresolved;
    if (static_cast<size_t>(element) < v.element_unresolved.size() &&
        !v.element_unresolved[element].empty()) {
      why = v.element_unresolved[element];
    }
    if (static_cast<size_t>(element) < v.values.size()) {
      return Value{{v.values[element]}, false, true, why, {}};
    }
    return Value{{}, false, false, why, {}};
  }

  // The variables as arithmetic sees them (unresolved ones left out: see Arithmetic below).
  std::map<std::string, std::string> Flat() const {
    std::map<std::string, std::string> out(scope_.env->begin(), scope_.env->end());
    for (const auto& [name, value] : *scope_.variables) {
      if (value.unresolved.empty()) out[name] = value.values.empty() ? "" : value.values[0];
    }
    return out;
  }

  Value Arithmetic(absl::string_view expression) {
    ShellWord text = ExpandString(expression, scope_, false);
    if (!text.unresolved.empty()) return Value{{}, false, true, text.unresolved};
    for (size_t i = 0; i < text.text.size();) {  // a name whose value is not known
      size_t j = i;
      while (
          j < text.text.size() &&
          (absl::ascii_isalnum(static_cast<unsigned char>(text.text[j])) || text.text[j] == '_')) {
        ++j;
      }
      const std::string word = text.text.substr(i, j - i);
      if (IsName(word)) {
        auto it = scope_.variables->find(word);
        if (it != scope_.variables->end() && !it->second.unresolved.empty()) {
          return Value{{}, false, true, it->second.unresolved};
        }
      }
      i = j == i ? i + 1 : j;
    }
    auto v = ShellArithmetic(text.text, Flat());
    if (!v.ok()) {
      return Value{{}, false, true, absl::StrCat(Where(scope_), ": ", v.status().message())};
    }
    return Scalar(absl::StrCat(*v));
  }

  // The inside of ${...}.
  Value Braced(absl::string_view inner) {
    if (inner.size() > 1 && inner[0] == '#') {
      Value v = Lookup(inner.substr(1));
      if (v.list) return Scalar(absl::StrCat(v.values.size()));
      return WithUnresolved(Scalar(absl::StrCat(v.values.empty() ? 0 : v.values[0].size())), v);
    }
    size_t n = 0;
    if (n < inner.size() && absl::string_view("@*#?$!").find(inner[0]) != absl::string_view::npos) {
      n = 1;
    } else {
      while (n < inner.size() &&
             (absl::ascii_isalnum(static_cast<unsigned char>(inner[n])) || inner[n] == '_')) {
        ++n;
      }
      if (n < inner.size() && inner[n] == '[') {
        const size_t close = inner.find(']', n);
        n = close == absl::string_view::npos ? inner.size() : close + 1;
      }
    }
    const absl::string_view name = inner.substr(0, n), op = inner.substr(n);
    Value v = Lookup(name);
    const bool missing_positional =
        !v.set && absl::ascii_isdigit(static_cast<unsigned char>(name[0]));
    if (op.empty()) return v;
    const bool colon = op[0] == ':' && op.size() > 1 &&
                       absl::string_view("-=+?").find(op[1]) != absl::string_view::npos;
    const char kind = colon ? op[1] : op[0];
    const absl::string_view word = op.substr(colon ? 2 : 1);
    const bool empty = v.values.empty() || (v.values.size() == 1 && v.values[0].empty());
    const bool use_default = !v.set || (colon && empty);
    auto expanded_word = [&] { return ExpandString(word, scope_, false); };
    switch (kind) {
      case '-':
      case '=': {
        // A parameter the script's caller leaves out takes its default, as when it runs.
        if (!use_default && !(missing_positional && v.values.empty())) return v;
        ShellWord d = expanded_word();
        if (kind == '=' && IsName(name)) {
          (*scope_.variables)[std::string(name)] = ShellValue{{d.text}, false, d.unresolved, {}};
        }
        return Value{{d.text}, false, true, d.unresolved};
      }
      case '+': {
        if (use_default) return Scalar("");
        ShellWord d = expanded_word();
        return Value{{d.text}, false, true, d.unresolved};
      }
      case '?':
        if (!use_default) return v;
        return Value{{},
                     false,
                     false,
                     absl::StrCat(Where(scope_), ": ${", name, "} is not set (", word, ")")};
      default:
        break;
    }
    if (!v.unresolved.empty()) return v;
    const std::string text = v.Joined();
    if (op[0] == '#' || op[0] == '%') {
      const bool longest = op.size() > 1 && op[1] == op[0];
      const std::string pattern = ExpandString(op.substr(longest ? 2 : 1), scope_, false).text;
      const bool prefix = op[0] == '#';
      std::string best = text;
      for (size_t k = 0; k <= text.size(); ++k) {
        const size_t len = longest ? text.size() - k : k;
        const std::string part = prefix ? text.substr(0, len) : text.substr(text.size() - len);
        if (fnmatch(pattern.c_str(), part.c_str(), 0) == 0) {
          best = prefix ? text.substr(len) : text.substr(0, text.size() - len);
          break;
        }
      }
      return Scalar(best);
    }
    if (op[0] == '/') {
      const bool all = op.size() > 1 && op[1] == '/';
      absl::string_view rest = op.substr(all ? 2 : 1);
      const size_t slash = rest.find('/');
      const std::string pattern = ExpandString(rest.substr(0, slash), scope_, false).text;
      const std::string replacement =
          slash == absl::string_view::npos
              ? ""
              : ExpandString(rest.substr(slash + 1), scope_, false).text;
      std::string out;
      size_t i = 0;
      bool replaced = false;
      while (i < text.size()) {
        size_t match = 0;
        if (!pattern.empty() && (all || !replaced)) {
          for (size_t len = text.size() - i; len > 0; --len) {
            if (fnmatch(pattern.c_str(), text.substr(i, len).c_str(), 0) == 0) {
              match = len;
              break;
            }
          }
        }
        if (match > 0) {
          out += replacement;
          i += match;
          replaced = true;
        } else {
          out.push_back(text[i++]);
        }
      }
      return Scalar(out);
    }
    if (op == "^^" || op == ",,") {
      return Scalar(op == "^^" ? absl::AsciiStrToUpper(text) : absl::AsciiStrToLower(text));
    }
    if (op[0] == ':') {
      auto parts = absl::StrSplit(op.substr(1), ':');
      std::vector<std::string> numbers(parts.begin(), parts.end());
      auto offset = ShellArithmetic(numbers[0], Flat());
      auto length = numbers.size() > 1 ? ShellArithmetic(numbers[1], Flat())
                                       : absl::StatusOr<long long>(text.size());
      if (offset.ok() && length.ok() && *offset >= 0 && *length >= 0) {
        const size_t at = std::min<size_t>(*offset, text.size());
        return Scalar(text.substr(at, *length));
      }
    }
    return Value{{},
                 false,
                 true,
                 absl::StrCat(Where(scope_), ": ${", inner, "} is not a form this reader knows")};
  }

  // The expansion starting at raw[i] == '$'; advances i past it.
  Value Dollar(absl::string_view raw, size_t& i) {
    const size_t start = i++;
    if (i >= raw.size()) return Scalar("$");
    if (raw.substr(i, 2) == "((") {
      const size_t end = Matching(raw, i, '(', ')');
      i = end;
      return Arithmetic(raw.substr(start + 3, end - start - 5));
    }
    if (raw[i] == '(') {
      i = Matching(raw, i, '(', ')');
      return Unrun(raw.substr(start, i - start));
    }
    if (raw[i] == '{') {
      const size_t end = Matching(raw, i, '{', '}');
      i = end;
      return Braced(raw.substr(start + 2, end - start - 3));
    }
    if (absl::string_view("@*#?$!").find(raw[i]) != absl::string_view::npos ||
        absl::ascii_isdigit(static_cast<unsigned char>(raw[i]))) {
      return Lookup(raw.substr(i++, 1));
    }
    size_t end = i;
    while (end < raw.size() &&
           (absl::ascii_isalnum(static_cast<unsigned char>(raw[end])) || raw[end] == '_')) {
      ++end;
    }
    if (end == i) return Scalar("$");
    const absl::string_view name = raw.substr(i, end - i);
    i = end;
    return Lookup(name);
  }

  Value Unrun(absl::string_view command) {
    return Value{{},
                 false,
                 true,
                 absl::StrCat(Where(scope_), ": ", Shorten(command),
                              " is a command substitution; stowage does not run it")};
  }

 private:
  static Value Scalar(std::string s) { return Value{{std::move(s)}, false, true, ""}; }
  static Value WithUnresolved(Value v, const Value& from) {
    v.unresolved = from.unresolved;
    return v;
  }
  Scope& scope_;
};

// Fields under construction.
struct Fields {
  std::vector<ShellWord> out;
  ShellWord current;
  bool started = false;
  void Add(absl::string_view text) {
    absl::StrAppend(&current.text, text);
    started = true;
  }
  void Mark(const std::string& why) {
    if (why.empty() || current.unresolved.find(why) != std::string::npos) return;
    if (!current.unresolved.empty()) current.unresolved += "; ";
    current.unresolved += why;
    started = true;
  }
  void Break() {
    if (started) out.push_back(std::move(current));
    current = ShellWord{};
    started = false;
  }
  // Splits at blanks; every field it touches is marked with `why`.
  void Split(absl::string_view text, const std::string& why = "") {
    Mark(why);
    for (char c : text) {
      if (c == ' ' || c == '\t' || c == '\n') {
        Break();
      } else {
        current.text.push_back(c);
        started = true;
        if (current.unresolved.empty()) Mark(why);
      }
    }
  }
};

// Walks `raw`; unquoted expansions are split unless `no_split`; quotes are text when
// `quotes_are_text` (a here-document).
std::vector<ShellWord> Walk(absl::string_view raw, Scope& scope, bool no_split,
                            bool quotes_are_text) {
  constexpr int kMaxDepth = 64;
  if (scope.depth >= kMaxDepth) {
    return {
        ShellWord{"", absl::StrCat(scope.source, ":", scope.line, ": expansions nested more than ",
                                   kMaxDepth, " deep are not read")}};
  }
  struct Deeper {
    explicit Deeper(int& d) : d_(d) { ++d_; }
    ~Deeper() { --d_; }
    int& d_;
  } deeper(scope.depth);
  Expander expand(scope);
  Fields f;
  bool in_double = false;
  auto put = [&](const Value& v, bool quoted) {
    f.Mark(v.unresolved);
    auto element_why = [&](size_t k) {
      return k < v.element_unresolved.size() ? v.element_unresolved[k] : std::string();
    };
    if (v.list && quoted) {  // "${A[@]}", "$@": one field per element
      for (size_t k = 0; k < v.values.size(); ++k) {
        if (k > 0) f.Break();
        f.Add(v.values[k]);
        f.Mark(element_why(k));
      }
      return;
    }
    if (v.list && !no_split && !v.element_unresolved.empty()) {  // ${A[@]}: split per element
      for (size_t k = 0; k < v.values.size(); ++k) {
        if (k > 0) f.Break();
        f.Split(v.values[k], element_why(k));
      }
      return;
    }
    if (quoted || no_split) {
      f.Add(v.Joined());
    } else {
      f.Split(v.Joined());
    }
  };
  for (size_t i = 0; i < raw.size();) {
    const char c = raw[i];
    if (c == '\\' && i + 1 < raw.size()) {
      const char next = raw[i + 1];
      const bool escapes = !(in_double || quotes_are_text) ||
                           absl::string_view("$`\"\\\n").find(next) != absl::string_view::npos;
      if (quotes_are_text && next == '"') {
        f.Add("\\\"");
      } else if (escapes) {
        if (next != '\n') f.Add(std::string(1, next));
      } else {
        f.Add(raw.substr(i, 2));
      }
      i += 2;
      continue;
    }
    if (c == '\'' && !in_double && !quotes_are_text) {
      const size_t end = raw.find('\'', i + 1);
      f.Add(raw.substr(i + 1, (end == absl::string_view::npos ? raw.size() : end) - i - 1));
      i = end == absl::string_view::npos ? raw.size() : end + 1;
      continue;
    }
    if (c == '"' && !quotes_are_text) {
      in_double = !in_double;
      f.started = true;  // "" is an empty field
      ++i;
      continue;
    }
    if (c == '`') {
      const size_t end = Matching(raw, i + 1, '`', '`');
      put(expand.Unrun(raw.substr(i, end - i)), true);
      i = end;
      continue;
    }
    if (c == '$') {
      put(expand.Dollar(raw, i), in_double || quotes_are_text);
      continue;
    }
    f.Add(std::string(1, c));
    ++i;
  }
  f.Break();
  return f.out;
}

}  // namespace

std::vector<ShellWord> ExpandWord(absl::string_view raw, Scope& scope) {
  return Walk(raw, scope, /*no_split=*/false, /*quotes_are_text=*/false);
}

ShellWord ExpandString(absl::string_view raw, Scope& scope, bool quotes_are_text) {
  ShellWord out;
  for (ShellWord& w : Walk(raw, scope, /*no_split=*/true, quotes_are_text)) {
    if (!out.text.empty() && !w.text.empty()) out.text += " ";
    out.text += w.text;
    if (!w.unresolved.empty()) {
      out.unresolved += out.unresolved.empty() ? w.unresolved : "; " + w.unresolved;
    }
  }
  return out;
}

}  // namespace stowage::bridges::shell
