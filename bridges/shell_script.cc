// Reading a launch script without running it: see bridges/shell_script.h.
//
// Note [Launch script reading]
// The interpreter walks the tokens once per run of each part (a loop's body as often as it
// loops, a function's body at each call), in one of three modes: run (effects happen), skip (a
// branch not taken: parsed only), or unknown (a branch whose condition the reader cannot
// decide: its commands are recorded as conditional, and a variable it changes becomes
// unresolved, naming the condition's line). External commands are recorded, never run, and
// taken to succeed (`mkdir -p X || exit 1` goes on); `exit` ends the script. A loop stops after
// kMaxIterations with a note. `bash -c STRING`, `eval WORDS` and a here-document given to
// sbatch, srun or a shell are read as scripts themselves at the line they appear on.
#include "bridges/shell_script.h"

#include <fnmatch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "bridges/shell_expand.h"
#include "bridges/shell_lexer.h"

namespace stowage::bridges {
namespace {

using shell::Token;
using shell::TokenKind;

constexpr int kMaxIterations = 1000;
constexpr int kMaxDepth = 32;               // nested eval / bash -c / function calls
constexpr int kMaxNesting = 200;            // compound commands within compound commands
constexpr int kMaxTotalIterations = 20000;  // all loops' bodies together (nested loops)

enum class Mode { kRun, kSkip, kUnknown };
enum class Truth { kTrue, kFalse, kUnknown };

Truth Not(Truth t) {
  return t == Truth::kUnknown ? t : (t == Truth::kTrue ? Truth::kFalse : Truth::kTrue);
}

class Interpreter {
 public:
  Interpreter(std::string source, const ShellEnvironment& environment, ShellScript& out)
      : source_(std::move(source)),
        env_(environment.env),
        positional_(environment.positional),
        out_(out) {}

  absl::Status RunText(absl::string_view text, int first_line, Mode mode) {
    if (++depth_ > kMaxDepth) {
      --depth_;
      Unresolved(first_line, "scripts nested more than 32 deep (eval, bash -c) are not read");
      return absl::OkStatus();
    }
    auto tokens = shell::Lex(text, source_, first_line, out_.sbatch);
    if (!tokens.ok()) {
      --depth_;
      return tokens.status();
    }
    // A nested script runs on its own tokens; functions it defines keep theirs alive.
    programs_.push_back(std::make_unique<std::vector<Token>>(*std::move(tokens)));
    std::vector<Token>* saved = tokens_;
    const size_t saved_pos = pos_;
    tokens_ = programs_.back().get();
    pos_ = 0;
    absl::Status s = List({}, mode).status();
    if (s.ok() && pos_ < tokens_->size()) s = Unexpected();
    tokens_ = saved;
    pos_ = saved_pos;
    --depth_;
    return s;
  }

 private:
  struct Function {
    std::vector<Token>* tokens;
    size_t start;
  };

  const Token* Peek() const { return pos_ < tokens_->size() ? &(*tokens_)[pos_] : nullptr; }
  // The current token when it is a word, else nullptr.
  const Token* Word() const {
    const Token* t = Peek();
    return t != nullptr && t->kind == TokenKind::kWord ? t : nullptr;
  }
  bool IsWord(const Token* t, absl::string_view word) const {
    return t != nullptr && t->kind == TokenKind::kWord && t->text == word;
  }
  bool IsOp(const Token* t, absl::string_view op) const {
    return t != nullptr && t->kind == TokenKind::kOperator && t->text == op;
  }
  int Line() const {
    if (const Token* t = Peek()) return t->line;
    return tokens_->empty() ? 0 : tokens_->back().line;
  }
  absl::Status Unexpected() const {
    const Token* t = Peek();
    return absl::InvalidArgumentError(absl::StrCat(
        source_, ":", Line(), ": unexpected ",
        t == nullptr ? "end of file"
                     : (t->kind == TokenKind::kNewline ? "end of line" : "'" + t->text + "'")));
  }
  absl::Status Expect(absl::string_view word) {
    if (IsWord(Peek(), word) || IsOp(Peek(), word)) {
      ++pos_;
      return absl::OkStatus();
    }
    const Token* t = Peek();
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ":", Line(), ": expected '", word, "'",
                     t == nullptr ? " before the end of the file" : ""));
  }
  void SkipNewlines() {
    for (const Token* t = Peek(); t != nullptr && t->kind == TokenKind::kNewline; t = Peek()) {
      ++pos_;
    }
  }
  void Unresolved(int line, const std::string& what) {
    out_.unresolved.push_back(absl::StrCat(source_, ":", line, ": ", what));
  }
  Mode Effective(Mode mode) const { return stopped_ || returning_ ? Mode::kSkip : mode; }
  shell::Scope Scope(int line) {
    return shell::Scope{&out_.variables, &env_, &positional_, source_, line};
  }

  // A list of and-or lists up to one of `ends` (a reserved word), `)`, `;;` or the end.
  absl::StatusOr<Truth> List(const std::set<absl::string_view>& ends, Mode mode) {
    Truth last = Truth::kTrue;
    while (true) {
      SkipNewlines();
      const Token* t = Peek();
      if (t == nullptr || IsOp(t, ")") || IsOp(t, ";;")) return last;
      if (t->kind == TokenKind::kWord && ends.contains(t->text)) return last;
      auto r = AndOr(mode);
      if (!r.ok()) return r;
      last = *r;
      if (IsOp(Peek(), ";") || IsOp(Peek(), "&")) ++pos_;
    }
  }

  absl::StatusOr<Truth> AndOr(Mode mode) {
    auto first = Pipeline(mode);
    if (!first.ok()) return first;
    Truth truth = *first;
    while (IsOp(Peek(), "&&") || IsOp(Peek(), "||")) {
      const bool is_and = IsOp(Peek(), "&&");
      ++pos_;
      SkipNewlines();
      Mode next = mode;
      if (mode != Mode::kSkip) {
        if (truth == Truth::kUnknown) next = Mode::kUnknown;
        if ((is_and && truth == Truth::kFalse) || (!is_and && truth == Truth::kTrue)) {
          next = Mode::kSkip;
        }
      }
      auto r = Pipeline(next);
      if (!r.ok()) return r;
      if (next != Mode::kSkip) truth = next == Mode::kUnknown ? Truth::kUnknown : *r;
    }
    return truth;
  }

  absl::StatusOr<Truth> Pipeline(Mode mode) {
    bool negate = false;
    if (IsWord(Peek(), "!")) {
      negate = true;
      ++pos_;
    }
    auto r = Command(mode);
    if (!r.ok()) return r;
    Truth truth = *r;
    while (IsOp(Peek(), "|")) {
      ++pos_;
      SkipNewlines();
      auto next = Command(mode);
      if (!next.ok()) return next;
      truth = *next;
    }
    return negate ? Not(truth) : truth;
  }

  absl::StatusOr<Truth> Command(Mode mode) {
    // Compound commands within compound commands ({ { ... } }, if in if): bounded, so the
    // recursion below stays shallow whatever the file.
    struct Deeper {
      explicit Deeper(int& d) : d_(d) { ++d_; }
      ~Deeper() { --d_; }
      int& d_;
    } deeper(nesting_);
    if (nesting_ > kMaxNesting) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_, ":", Line(), ": commands nested more than ", kMaxNesting, " deep"));
    }
    const Token* t = Peek();
    if (t == nullptr) return Unexpected();
    static const std::set<absl::string_view> kOutOfPlace = {"then", "elif", "else", "fi", "do",
                                                            "done", "esac", "}",    "in"};
    if (t->kind == TokenKind::kWord && kOutOfPlace.contains(t->text)) return Unexpected();
    if (IsWord(t, "if")) return If(mode);
    if (IsWord(t, "case")) return Case(mode);
    if (IsWord(t, "for")) return For(mode);
    if (IsWord(t, "while") || IsWord(t, "until")) return While(mode);
    if (IsWord(t, "{") || IsOp(t, "(")) {
      const bool brace = t->kind == TokenKind::kWord;
      ++pos_;
      auto r = List({"}"}, mode);
      if (!r.ok()) return r;
      if (absl::Status s = Expect(brace ? "}" : ")"); !s.ok()) return s;
      return r;
    }
    if (IsWord(t, "function") ||
        (t->kind == TokenKind::kWord && shell::IsName(t->text) && pos_ + 2 < tokens_->size() &&
         IsOp(&(*tokens_)[pos_ + 1], "(") && IsOp(&(*tokens_)[pos_ + 2], ")"))) {
      return Define(mode);
    }
    return Simple(mode);
  }

  absl::StatusOr<Truth> Define(Mode mode) {
    if (IsWord(Peek(), "function")) ++pos_;
    const Token* name_token = Peek();
    if (name_token == nullptr || name_token->kind != TokenKind::kWord) return Unexpected();
    const std::string name = name_token->text;
    ++pos_;
    if (IsOp(Peek(), "(")) pos_ += 2;
    SkipNewlines();
    if (Effective(mode) != Mode::kSkip) functions_[name] = Function{tokens_, pos_};
    auto r = Command(Mode::kSkip);
    if (!r.ok()) return r.status();
    return Truth::kTrue;
  }

  // The condition of if/while: a list up to `then` / `do`.
  absl::StatusOr<Truth> Condition(absl::string_view end, Mode mode) {
    auto r = List({end}, mode);
    if (!r.ok()) return r;
    if (absl::Status s = Expect(end); !s.ok()) return s;
    return r;
  }

  absl::StatusOr<Truth> If(Mode mode) {
    ++pos_;  // if / elif
    const int line = Line();
    auto c = Condition("then", mode);
    if (!c.ok()) return c;
    Mode branch = Branch(mode, *c, line);
    auto body = List({"elif", "else", "fi"}, branch);
    if (!body.ok()) return body;
    // The rest runs when this condition is false (or unknown).
    Mode rest = mode;
    if (mode != Mode::kSkip) {
      rest = *c == Truth::kTrue ? Mode::kSkip : (*c == Truth::kUnknown ? Mode::kUnknown : mode);
    }
    if (IsWord(Peek(), "elif")) return If(rest);
    if (IsWord(Peek(), "else")) {
      ++pos_;
      auto e = List({"fi"}, rest);
      if (!e.ok()) return e;
    }
    if (absl::Status s = Expect("fi"); !s.ok()) return s;
    return Truth::kTrue;
  }

  Mode Branch(Mode mode, Truth c, int line) {
    if (Effective(mode) == Mode::kSkip) return Mode::kSkip;
    if (c == Truth::kFalse) return Mode::kSkip;
    if (c == Truth::kUnknown) {
      unknown_lines_.push_back(line);
      return Mode::kUnknown;
    }
    return mode;
  }

  absl::StatusOr<Truth> Case(Mode mode) {
    const int line = Line();
    ++pos_;
    const Token* word = Word();
    if (word == nullptr) return Unexpected();
    shell::Scope scope = Scope(line);
    const ShellWord subject = shell::ExpandString(word->text, scope, false);
    ++pos_;
    SkipNewlines();
    if (absl::Status s = Expect("in"); !s.ok()) return s;
    bool matched = false;
    while (true) {
      SkipNewlines();
      if (IsWord(Peek(), "esac")) break;
      if (IsOp(Peek(), "(")) ++pos_;
      Truth hit = Truth::kFalse;
      for (const Token* p = Word(); p != nullptr; p = Word()) {
        const ShellWord pattern = shell::ExpandString(p->text, scope, false);
        ++pos_;
        if (!subject.unresolved.empty() || !pattern.unresolved.empty()) {
          if (hit == Truth::kFalse) hit = Truth::kUnknown;
        } else if (fnmatch(pattern.text.c_str(), subject.text.c_str(), 0) == 0) {
          hit = Truth::kTrue;
        }
        if (!IsOp(Peek(), "|")) break;
        ++pos_;
      }
      if (absl::Status s = Expect(")"); !s.ok()) return s;
      if (matched && hit != Truth::kFalse) hit = Truth::kFalse;
      auto body = List({"esac"}, Branch(mode, hit, line));
      if (!body.ok()) return body;
      matched |= hit == Truth::kTrue;
      if (IsOp(Peek(), ";;")) ++pos_;
    }
    ++pos_;
    return Truth::kTrue;
  }

  absl::StatusOr<Truth> For(Mode mode) {
    const int line = Line();
    ++pos_;
    const Token* variable = Word();
    if (variable == nullptr || !shell::IsName(variable->text)) return Unexpected();
    const std::string name = variable->text;
    ++pos_;
    std::vector<ShellWord> items;
    bool all_known = true;
    if (IsWord(Peek(), "in")) {
      ++pos_;
      shell::Scope scope = Scope(line);
      for (const Token* item = Word(); item != nullptr; item = Word()) {
        for (ShellWord& w : shell::ExpandWord(item->text, scope)) {
          all_known &= w.unresolved.empty();
          items.push_back(std::move(w));
        }
        ++pos_;
      }
    } else {
      for (const std::string& p : positional_) items.push_back({p, ""});
    }
    if (IsOp(Peek(), ";")) ++pos_;
    SkipNewlines();
    if (absl::Status s = Expect("do"); !s.ok()) return s;
    const size_t body = pos_;
    Mode each = Effective(mode);
    if (!all_known && each != Mode::kSkip) {
      Unresolved(line, "the list of this `for` loop is not known");
      each = Mode::kUnknown;
    }
    if (items.empty() || each == Mode::kSkip) items.assign(1, ShellWord{});
    for (size_t k = 0; k < items.size() && k < kMaxIterations; ++k) {
      if (each != Mode::kSkip && ++iterations_ > kMaxTotalIterations) {
        Unresolved(line, absl::StrCat("loops were read ", kMaxTotalIterations,
                                      " times in all and no more"));
        break;
      }
      pos_ = body;
      if (each != Mode::kSkip) {
        out_.variables[name] = ShellValue{{items[k].text}, false, items[k].unresolved, {}};
      }
      auto r = List({"done"}, items.empty() ? Mode::kSkip : each);
      if (!r.ok()) return r;
    }
    return Expect("done").ok() ? absl::StatusOr<Truth>(Truth::kTrue) : Unexpected();
  }

  absl::StatusOr<Truth> While(Mode mode) {
    const bool until = IsWord(Peek(), "until");
    const int line = Line();
    ++pos_;
    const size_t condition = pos_;
    for (int k = 0;; ++k) {
      pos_ = condition;
      auto c = Condition("do", mode);
      if (!c.ok()) return c;
      Truth go = until ? Not(*c) : *c;
      if ((k >= kMaxIterations || ++iterations_ > kMaxTotalIterations) &&
          Effective(mode) != Mode::kSkip) {
        Unresolved(line,
                   absl::StrCat("this loop was read ", k, " times and no more (at most ",
                                kMaxIterations, " a loop, ", kMaxTotalIterations, " in all)"));
        go = Truth::kFalse;
      }
      Mode body = Branch(mode, go, line);
      auto r = List({"done"}, body);
      if (!r.ok()) return r;
      if (absl::Status s = Expect("done"); !s.ok()) return s;
      if (body != Mode::kRun || Effective(mode) != Mode::kRun || go != Truth::kTrue) break;
    }
    return Truth::kTrue;
  }

  absl::StatusOr<Truth> Simple(Mode mode);
  Truth Test(const std::vector<ShellWord>& words, int line);
  void Assign(const Token& t, Mode mode, bool export_only);
  void SetVariable(const std::string& name, ShellValue value, bool append, Mode mode);
  absl::Status Nested(absl::string_view text, int line, Mode mode);

  std::string source_;
  std::map<std::string, std::string> env_;
  std::vector<std::string> positional_;
  ShellScript& out_;
  std::vector<std::unique_ptr<std::vector<Token>>> programs_;
  std::vector<Token>* tokens_ = nullptr;
  size_t pos_ = 0;
  int depth_ = 0;
  bool stopped_ = false;  // after `exit`
  std::map<std::string, Function> functions_;
  std::vector<int> unknown_lines_;  // conditions not decided, innermost last

  bool returning_ = false;  // after `return` in a function
  int nesting_ = 0;         // compound commands being read
  int iterations_ = 0;      // loop bodies read so far
};

// NAME=..., NAME+=..., NAME[i]=...: the name, the subscript, whether it appends, the value as
// written; false for another word.
bool SplitAssignment(absl::string_view word, std::string& name, std::string& subscript,
                     bool& append, absl::string_view& value) {
  const size_t eq = word.find('=');
  if (eq == absl::string_view::npos || eq == 0) return false;
  absl::string_view left = word.substr(0, eq);
  append = absl::ConsumeSuffix(&left, "+");
  subscript.clear();
  if (const size_t open = left.find('['); open != absl::string_view::npos && left.back() == ']') {
    subscript = std::string(left.substr(open + 1, left.size() - open - 2));
    left = left.substr(0, open);
  }
  if (!shell::IsName(left)) return false;
  name = std::string(left);
  value = word.substr(eq + 1);
  return true;
}

bool IsAssignment(const Token& t) {
  std::string name, subscript;
  bool append = false;
  absl::string_view value;
  return t.kind == TokenKind::kArrayAssign ||
         (t.kind == TokenKind::kWord && SplitAssignment(t.text, name, subscript, append, value));
}

void Interpreter::SetVariable(const std::string& name, ShellValue value, bool append, Mode mode) {
  ShellValue& v = out_.variables[name];
  const ShellValue before = v;
  if (append) {
    if (value.array || v.array) {
      if (!value.element_unresolved.empty() || !v.element_unresolved.empty()) {
        v.element_unresolved.resize(v.values.size());
        value.element_unresolved.resize(value.values.size());
        v.element_unresolved.insert(v.element_unresolved.end(), value.element_unresolved.begin(),
                                    value.element_unresolved.end());
      }
      v.values.insert(v.values.end(), value.values.begin(), value.values.end());
      v.array = true;
    } else {
      if (v.values.empty()) v.values.push_back("");
      v.values[0] += value.values.empty() ? "" : value.values[0];
    }
    if (v.unresolved.empty() && !value.array) v.unresolved = value.unresolved;
  } else {
    v = std::move(value);
  }
  if (mode == Mode::kUnknown && (v.values != before.values || v.array != before.array)) {
    const int line = unknown_lines_.empty() ? 0 : unknown_lines_.back();
    v.unresolved = absl::StrCat(source_, ":", line, ": ", name,
                                " is set in a branch whose condition stowage cannot decide");
  }
}

void Interpreter::Assign(const Token& t, Mode mode, bool /*export_only*/) {
  shell::Scope scope = Scope(t.line);
  if (t.kind == TokenKind::kArrayAssign) {
    ShellValue value{{}, true, "", {}};
    bool any = false;
    for (const Token& element : t.elements) {
      for (ShellWord& w : shell::ExpandWord(element.text, scope)) {
        value.values.push_back(std::move(w.text));
        value.element_unresolved.push_back(w.unresolved);
        any |= !w.unresolved.empty();
      }
    }
    if (!any) value.element_unresolved.clear();
    SetVariable(t.text, std::move(value), t.append, mode);
    return;
  }
  std::string name, subscript;
  bool append = false;
  absl::string_view raw;
  if (!SplitAssignment(t.text, name, subscript, append, raw)) return;
  ShellWord w = shell::ExpandString(raw, scope, false);
  if (!subscript.empty()) {
    auto index = ShellArithmetic(shell::ExpandString(subscript, scope, false).text, {});
    ShellValue& v = out_.variables[name];
    if (!index.ok() || *index < 0 || *index > kMaxIterations) {
      v.unresolved =
          absl::StrCat(source_, ":", t.line, ": the subscript of ", name, "[", subscript, "]");
      return;
    }
    if (v.values.size() <= static_cast<size_t>(*index)) v.values.resize(*index + 1);
    v.values[*index] = append ? v.values[*index] + w.text : w.text;
    v.array = true;
    return;
  }
  SetVariable(name, ShellValue{{w.text}, false, w.unresolved, {}}, append, mode);
}

absl::Status Interpreter::Nested(absl::string_view text, int line, Mode mode) {
  return RunText(text, line, mode);
}

// [ ... ], [[ ... ]], test ...: true, false, or unknown (a file test, an unresolved operand).
Truth Interpreter::Test(const std::vector<ShellWord>& all, int line) {
  std::vector<ShellWord> w(all.begin() + 1, all.end());
  if (!w.empty() && (w.back().text == "]" || w.back().text == "]]")) w.pop_back();
  size_t i = 0;
  std::function<Truth()> or_expr, and_expr, primary;
  auto known = [&](const ShellWord& x) { return x.unresolved.empty(); };
  primary = [&]() -> Truth {
    if (i >= w.size()) return Truth::kFalse;
    if (w[i].text == "!") {
      ++i;
      return Not(primary());
    }
    if (w[i].text == "(" && known(w[i])) {
      ++i;
      Truth t = or_expr();
      if (i < w.size() && w[i].text == ")") ++i;
      return t;
    }
    static const std::set<absl::string_view> kBinary = {"=",   "==",  "!=",  "<",   ">",   "-eq",
                                                        "-ne", "-lt", "-le", "-gt", "-ge", "=~"};
    if (i + 2 < w.size() + 0 && i + 1 < w.size() && kBinary.contains(w[i + 1].text)) {
      const ShellWord& a = w[i];
      const std::string op = w[i + 1].text;
      const ShellWord& b = i + 2 < w.size() ? w[i + 2] : w[i + 1];
      i += 3;
      if (!known(a) || !known(b) || op == "=~") return Truth::kUnknown;
      if (op == "=" || op == "==") {
        return fnmatch(b.text.c_str(), a.text.c_str(), 0) == 0 ? Truth::kTrue : Truth::kFalse;
      }
      if (op == "!=") {
        return fnmatch(b.text.c_str(), a.text.c_str(), 0) != 0 ? Truth::kTrue : Truth::kFalse;
      }
      if (op == "<" || op == ">") {
        return (op == "<" ? a.text < b.text : a.text > b.text) ? Truth::kTrue : Truth::kFalse;
      }
      long long x = 0, y = 0;
      if (!absl::SimpleAtoi(a.text, &x) || !absl::SimpleAtoi(b.text, &y)) return Truth::kUnknown;
      bool r = false;
      if (op == "-eq") r = x == y;
      if (op == "-ne") r = x != y;
      if (op == "-lt") r = x < y;
      if (op == "-le") r = x <= y;
      if (op == "-gt") r = x > y;
      if (op == "-ge") r = x >= y;
      return r ? Truth::kTrue : Truth::kFalse;
    }
    if (w[i].text.size() == 2 && w[i].text[0] == '-' && i + 1 < w.size()) {
      const char op = w[i].text[1];
      const ShellWord& a = w[i + 1];
      i += 2;
      if (op == 'v') {
        return out_.variables.contains(a.text) || env_.contains(a.text) ? Truth::kTrue
                                                                        : Truth::kFalse;
      }
      if (!known(a)) return Truth::kUnknown;
      if (op == 'z') return a.text.empty() ? Truth::kTrue : Truth::kFalse;
      if (op == 'n') return a.text.empty() ? Truth::kFalse : Truth::kTrue;
      Unresolved(line, absl::StrCat("the test -", std::string(1, op), " ", a.text,
                                    " asks about this machine; stowage reads both branches"));
      return Truth::kUnknown;  // -f, -d, -e ...: the file system when the script runs
    }
    const ShellWord& a = w[i++];
    if (!known(a)) return Truth::kUnknown;
    return a.text.empty() ? Truth::kFalse : Truth::kTrue;
  };
  auto combine = [](Truth a, Truth b, bool is_and) {
    if (is_and) {
      if (a == Truth::kFalse || b == Truth::kFalse) return Truth::kFalse;
      return a == Truth::kTrue && b == Truth::kTrue ? Truth::kTrue : Truth::kUnknown;
    }
    if (a == Truth::kTrue || b == Truth::kTrue) return Truth::kTrue;
    return a == Truth::kFalse && b == Truth::kFalse ? Truth::kFalse : Truth::kUnknown;
  };
  and_expr = [&]() -> Truth {
    Truth t = primary();
    while (i < w.size() && (w[i].text == "-a" || w[i].text == "&&")) {
      ++i;
      t = combine(t, primary(), true);
    }
    return t;
  };
  or_expr = [&]() -> Truth {
    Truth t = and_expr();
    while (i < w.size() && (w[i].text == "-o" || w[i].text == "||")) {
      ++i;
      t = combine(t, and_expr(), false);
    }
    return t;
  };
  return or_expr();
}

absl::StatusOr<Truth> Interpreter::Simple(Mode mode) {
  const int line = Line();
  std::vector<const Token*> assignments, words;
  const Token* heredoc = nullptr;
  while (const Token* t = Peek()) {
    if (IsOp(t, "<<")) {
      heredoc = t;
    } else if (t->kind == TokenKind::kWord || t->kind == TokenKind::kArrayAssign) {
      if (words.empty() && IsAssignment(*t)) {
        assignments.push_back(t);
      } else {
        words.push_back(t);
      }
    } else {
      break;
    }
    ++pos_;
  }
  if (words.empty() && assignments.empty() && heredoc == nullptr) return Unexpected();
  const Mode m = Effective(mode);
  if (m == Mode::kSkip) return Truth::kTrue;
  if (words.empty()) {
    for (const Token* a : assignments) Assign(*a, m, false);
    return Truth::kTrue;
  }
  const std::string& name = words[0]->text;
  static const std::set<absl::string_view> kDeclare = {"export", "declare", "typeset", "local",
                                                       "readonly"};
  if (kDeclare.contains(name)) {
    for (size_t k = 1; k < words.size(); ++k) {
      if (IsAssignment(*words[k])) Assign(*words[k], m, name == "export");
    }
    return Truth::kTrue;
  }
  shell::Scope scope = Scope(line);
  std::vector<ShellWord> w;
  for (const Token* t : words) {
    for (ShellWord& x : shell::ExpandWord(t->text, scope)) w.push_back(std::move(x));
  }
  if (w.empty()) return Truth::kTrue;
  for (const ShellWord& x : w) {
    if (!x.unresolved.empty() && std::find(out_.unresolved.begin(), out_.unresolved.end(),
                                           x.unresolved) == out_.unresolved.end()) {
      out_.unresolved.push_back(x.unresolved);
    }
  }
  const std::string command = w[0].text;
  auto rest_text = [&](size_t from) {
    std::vector<std::string> texts;
    for (size_t k = from; k < w.size(); ++k) texts.push_back(w[k].text);
    return absl::StrJoin(texts, " ");
  };
  if (command == "[" || command == "[[" || command == "test") return Test(w, line);
  if (command == "true" || command == ":") return Truth::kTrue;
  if (command == "false") return Truth::kFalse;
  if (command == "unset") {
    for (size_t k = 1; k < w.size(); ++k) out_.variables.erase(w[k].text);
    return Truth::kTrue;
  }
  if (command == "set") {
    for (size_t k = 1; k < w.size(); ++k) {
      if (w[k].text == "--") {
        positional_.clear();
        for (size_t j = k + 1; j < w.size(); ++j) positional_.push_back(w[j].text);
        break;
      }
    }
    return Truth::kTrue;
  }
  if (command == "shift") {
    size_t n = 1;
    if (w.size() > 1 && !absl::SimpleAtoi(w[1].text, &n)) n = 1;
    if (n > positional_.size()) return Truth::kFalse;
    positional_.erase(positional_.begin(), positional_.begin() + n);
    return Truth::kTrue;
  }
  if (command == "exit" || command == "return") {
    if (m == Mode::kRun) (command == "exit" ? stopped_ : returning_) = true;
    return Truth::kTrue;
  }
  if (command == "echo" || command == "printf" || command == "cd" || command == "sleep") {
    return Truth::kTrue;
  }
  if (command == "source" || command == ".") {
    Unresolved(line, absl::StrCat("`", command, " ", rest_text(1),
                                  "` reads another file; stowage does not (set what it sets in "
                                  "the environment instead)"));
    return Truth::kUnknown;
  }
  if (command == "eval") {
    for (size_t k = 1; k < w.size(); ++k) {
      if (!w[k].unresolved.empty()) Unresolved(line, w[k].unresolved);
    }
    if (absl::Status s = Nested(rest_text(1), line, m); !s.ok()) return s;
    return Truth::kTrue;
  }
  if (auto f = functions_.find(command); f != functions_.end()) {
    if (depth_ >= kMaxDepth) {
      Unresolved(line, absl::StrCat("calls nested more than ", kMaxDepth, " deep (the function ",
                                    command, ") are not read"));
      return Truth::kUnknown;
    }
    std::vector<std::string> saved_positional = positional_;
    positional_.clear();
    for (size_t k = 1; k < w.size(); ++k) positional_.push_back(w[k].text);
    std::vector<Token>* saved_tokens = tokens_;
    const size_t saved_pos = pos_;
    tokens_ = f->second.tokens;
    pos_ = f->second.start;
    ++depth_;
    auto r = Command(m);
    --depth_;
    tokens_ = saved_tokens;
    pos_ = saved_pos;
    positional_ = std::move(saved_positional);
    returning_ = false;
    if (!r.ok()) return r;
    return Truth::kTrue;
  }
  // `bash -c STRING` (also behind srun, docker run, ...): the string is a script.
  for (size_t k = 0; k + 2 < w.size(); ++k) {
    const std::string& shell_name = w[k].text;
    if (shell_name != "bash" && shell_name != "sh" && !shell_name.ends_with("/bash") &&
        !shell_name.ends_with("/sh")) {
      continue;
    }
    for (size_t j = k + 1; j + 1 < w.size() && w[j].text.starts_with("-"); ++j) {
      if (w[j].text.find('c') == std::string::npos || w[j].text.starts_with("--")) continue;
      ShellCommand launcher{
          line, {w.begin(), w.begin() + static_cast<long>(k)}, m == Mode::kUnknown};
      if (!launcher.words.empty()) out_.commands.push_back(std::move(launcher));
      if (!w[j + 1].unresolved.empty()) Unresolved(line, w[j + 1].unresolved);
      if (absl::Status s = Nested(w[j + 1].text, line, m); !s.ok()) return s;
      return Truth::kTrue;
    }
  }
  out_.commands.push_back(ShellCommand{line, w, m == Mode::kUnknown});
  static const std::set<absl::string_view> kScriptReaders = {"sbatch", "bash", "sh", "srun",
                                                             "salloc"};
  if (heredoc != nullptr && kScriptReaders.contains(command)) {
    const std::string body = heredoc->heredoc_quoted
                                 ? heredoc->heredoc
                                 : shell::ExpandString(heredoc->heredoc, scope, true).text;
    if (absl::Status s = Nested(body, heredoc->heredoc_line, m); !s.ok()) return s;
  }
  return Truth::kTrue;
}

}  // namespace

absl::StatusOr<ShellScript> ReadShellScript(std::string_view text, std::string_view source,
                                            const ShellEnvironment& environment) {
  ShellScript out;
  Interpreter interpreter(std::string(source), environment, out);
  if (absl::Status s =
          interpreter.RunText(absl::string_view(text.data(), text.size()), 1, Mode::kRun);
      !s.ok()) {
    return s;
  }
  return out;
}

}  // namespace stowage::bridges
