// Shell arithmetic ($((...))) for the launch-script reader: see bridges/shell_script.h.
#include <climits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bridges/shell_lexer.h"
#include "bridges/shell_script.h"

namespace stowage::bridges {
namespace {

// Precedence climbing over the expression's characters. Integers are 64-bit; overflow, division
// by zero and a variable that is not a number are errors.
class Arithmetic {
 public:
  Arithmetic(absl::string_view text, const std::map<std::string, std::string>& variables, int depth)
      : text_(text), variables_(variables), depth_(depth) {}

  absl::StatusOr<long long> Run() {
    auto v = Ternary();
    if (!v.ok()) return v;
    Skip();
    if (pos_ != text_.size()) return Bad(absl::StrCat("unexpected '", text_.substr(pos_), "'"));
    return v;
  }

 private:
  absl::Status Bad(const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat("$((", std::string(text_), ")): ", why));
  }
  void Skip() {
    while (pos_ < text_.size() && absl::ascii_isspace(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
  }
  bool Take(absl::string_view op) {
    Skip();
    if (text_.substr(pos_, op.size()) != op) return false;
    // "<" is not the start of "<<" or "<=", "&" not of "&&", "*" not of "**", "!" not of "!=".
    const char next = pos_ + op.size() < text_.size() ? text_[pos_ + op.size()] : '\0';
    if (op.size() == 1) {
      const absl::string_view doubled = "<>&|*", before_equals = "<>!";
      if ((next == op[0] && doubled.find(op[0]) != absl::string_view::npos) ||
          (next == '=' && before_equals.find(op[0]) != absl::string_view::npos)) {
        return false;
      }
    }
    pos_ += op.size();
    return true;
  }

  // Nesting ("((((1))))", "- - - 1") is bounded: the recursion below is never deeper than this.
  static constexpr int kMaxNesting = 256;
  struct Nest {
    explicit Nest(int& n) : n_(n) { ++n_; }
    ~Nest() { --n_; }
    int& n_;
  };

  absl::StatusOr<long long> Ternary() {
    Nest nest(nesting_);
    if (nesting_ > kMaxNesting) return Bad(absl::StrCat("nested more than ", kMaxNesting, " deep"));
    auto c = Binary(0);
    if (!c.ok() || !Take("?")) return c;
    auto a = Ternary();
    if (!a.ok()) return a;
    if (!Take(":")) return Bad("'?' without ':'");
    auto b = Ternary();
    if (!b.ok()) return b;
    return *c != 0 ? *a : *b;
  }

  // Binary operators by level, lowest first.
  absl::StatusOr<long long> Binary(int level) {
    static const std::vector<std::vector<absl::string_view>> kLevels = {{"||"},
                                                                        {"&&"},
                                                                        {"|"},
                                                                        {"^"},
                                                                        {"&"},
                                                                        {"==", "!="},
                                                                        {"<=", ">=", "<", ">"},
                                                                        {"<<", ">>"},
                                                                        {"+", "-"},
                                                                        {"*", "/", "%"}};
    if (level == static_cast<int>(kLevels.size())) return Power();
    auto left = Binary(level + 1);
    if (!left.ok()) return left;
    long long v = *left;
    while (true) {
      absl::string_view op;
      for (absl::string_view candidate : kLevels[level]) {
        if (Take(candidate)) {
          op = candidate;
          break;
        }
      }
      if (op.empty()) return v;
      auto right = Binary(level + 1);
      if (!right.ok()) return right;
      const long long r = *right;
      long long out = 0;
      bool overflow = false;
      if (op == "||") out = (v != 0 || r != 0);
      if (op == "&&") out = (v != 0 && r != 0);
      if (op == "|") out = v | r;
      if (op == "^") out = v ^ r;
      if (op == "&") out = v & r;
      if (op == "==") out = v == r;
      if (op == "!=") out = v != r;
      if (op == "<=") out = v <= r;
      if (op == ">=") out = v >= r;
      if (op == "<") out = v < r;
      if (op == ">") out = v > r;
      if (op == "<<" || op == ">>") {
        if (r < 0 || r > 62) return Bad(absl::StrCat("a shift by ", r));
        out = op == "<<" ? static_cast<long long>(static_cast<unsigned long long>(v) << r) : v >> r;
      }
      if (op == "+") overflow = __builtin_add_overflow(v, r, &out);
      if (op == "-") overflow = __builtin_sub_overflow(v, r, &out);
      if (op == "*") overflow = __builtin_mul_overflow(v, r, &out);
      if (op == "/" || op == "%") {
        if (r == 0) return Bad("division by 0");
        if (v == LLONG_MIN && r == -1) return Bad("overflow");
        out = op == "/" ? v / r : v % r;
      }
      if (overflow) return Bad("overflow");
      v = out;
    }
  }

  absl::StatusOr<long long> Power() {
    Nest nest(nesting_);
    if (nesting_ > kMaxNesting) return Bad(absl::StrCat("nested more than ", kMaxNesting, " deep"));
    auto base = Unary();
    if (!base.ok() || !Take("**")) return base;
    auto exponent = Power();
    if (!exponent.ok()) return exponent;
    if (*exponent < 0) return Bad("a negative exponent");
    long long out = 1;
    for (long long i = 0; i < *exponent; ++i) {
      if (__builtin_mul_overflow(out, *base, &out)) return Bad("overflow");
    }
    return out;
  }

  absl::StatusOr<long long> Unary() {
    Nest nest(nesting_);
    if (nesting_ > kMaxNesting) return Bad(absl::StrCat("nested more than ", kMaxNesting, " deep"));
    if (Take("-")) {
      auto v = Unary();
      if (!v.ok() || *v == LLONG_MIN) return v.ok() ? Bad("overflow") : v;
      return -*v;
    }
    if (Take("+")) return Unary();
    if (Take("!")) {
      auto v = Unary();
      if (!v.ok()) return v;
      return static_cast<long long>(*v == 0);
    }
    if (Take("~")) {
      auto v = Unary();
      if (!v.ok()) return v;
      return ~*v;
    }
    return Primary();
  }

  absl::StatusOr<long long> Primary() {
    Skip();
    if (Take("(")) {
      auto v = Ternary();
      if (!v.ok()) return v;
      if (!Take(")")) return Bad("'(' without ')'");
      return v;
    }
    const size_t start = pos_;
    while (pos_ < text_.size() &&
           (absl::ascii_isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) {
      ++pos_;
    }
    const absl::string_view word = text_.substr(start, pos_ - start);
    if (word.empty()) return Bad(absl::StrCat("expected a number at '", text_.substr(start), "'"));
    if (shell::IsName(word)) {
      auto it = variables_.find(std::string(word));
      if (it == variables_.end() || absl::StripAsciiWhitespace(it->second).empty()) return 0;
      if (depth_ > 16) return Bad(absl::StrCat(word, " refers to itself"));
      auto v = Arithmetic(it->second, variables_, depth_ + 1).Run();
      if (!v.ok()) {
        return Bad(absl::StrCat(word, " is '", it->second, "', not a number"));
      }
      return v;
    }
    long long v = 0;
    if (word.size() > 2 && word[0] == '0' && (word[1] == 'x' || word[1] == 'X')) {
      if (!absl::SimpleHexAtoi(word.substr(2), &v)) return Bad(absl::StrCat("'", word, "'"));
      return v;
    }
    if (!absl::SimpleAtoi(word, &v)) return Bad(absl::StrCat("'", word, "' is not a number"));
    return v;
  }

  absl::string_view text_;
  const std::map<std::string, std::string>& variables_;
  int depth_;
  size_t pos_ = 0;
  int nesting_ = 0;
};

}  // namespace

absl::StatusOr<long long> ShellArithmetic(std::string_view expression,
                                          const std::map<std::string, std::string>& variables) {
  return Arithmetic(absl::string_view(expression.data(), expression.size()), variables, 0).Run();
}

}  // namespace stowage::bridges
