// The tokens of a launch script: see bridges/shell_lexer.h.
#include "bridges/shell_lexer.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace stowage::bridges::shell {

bool IsName(absl::string_view s) {
  if (s.empty() || absl::ascii_isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

namespace {

bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\r'; }
bool EndsWord(char c) {
  return IsBlank(c) || c == '\n' || c == ';' || c == '&' || c == '|' || c == '(' || c == ')' ||
         c == '<' || c == '>';
}

class Lexer {
 public:
  Lexer(absl::string_view text, absl::string_view source, int first_line,
        std::vector<SbatchDirective>& sbatch)
      : text_(text), source_(source), line_(first_line), sbatch_(sbatch) {}

  absl::StatusOr<std::vector<Token>> Run() {
    std::vector<Token> out;
    if (absl::Status s = Tokens(out, /*in_array=*/false); !s.ok()) return s;
    if (!pending_.empty()) {
      return Error(absl::StrCat("the here-document ending in '", pending_.front().delimiter,
                                "' has no end"));
    }
    return out;
  }

 private:
  struct Pending {
    size_t token;  // index in the top-level output
    std::string delimiter;
    bool strip_tabs;
  };

  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ":", line_, ": ", what));
  }
  char Peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }

  // The tokens up to the end (or, in an array, up to its closing parenthesis).
  absl::Status Tokens(std::vector<Token>& out, bool in_array) {
    bool word_start = true;  // a '#' here starts a comment
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '\\' && Peek(1) == '\n') {  // a line continuation
        pos_ += 2;
        ++line_;
        continue;
      }
      if (IsBlank(c)) {
        ++pos_;
        word_start = true;
        continue;
      }
      if (c == '#' && word_start) {
        const size_t end = text_.find('\n', pos_);
        const absl::string_view comment = text_.substr(
            pos_, end == absl::string_view::npos ? absl::string_view::npos : end - pos_);
        if (!in_array && absl::StartsWith(comment, "#SBATCH")) SbatchLine(comment);
        pos_ = end == absl::string_view::npos ? text_.size() : end;
        continue;
      }
      if (c == '\n') {
        ++pos_;
        if (!in_array) {
          out.push_back(MakeToken(TokenKind::kNewline, "\n", line_));
          ++line_;
          if (absl::Status s = HereDocuments(out); !s.ok()) return s;
        } else {
          ++line_;
        }
        word_start = true;
        continue;
      }
      if (in_array && c == ')') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c == '<' || c == '>' || (c == '&' && Peek(1) == '>')) {
        if (absl::Status s = Redirection(out); !s.ok()) return s;
        word_start = true;
        continue;
      }
      if (!in_array && (c == ';' || c == '&' || c == '|' || c == '(' || c == ')')) {
        std::string op(1, c);
        if ((c == ';' || c == '&' || c == '|') && Peek(1) == c) op.push_back(c);
        pos_ += op.size();
        out.push_back(MakeToken(TokenKind::kOperator, op, line_));
        word_start = true;
        continue;
      }
      const int line = line_;
      std::string word;
      if (absl::Status s = Word(word); !s.ok()) return s;
      // NAME=( ... ): an array; its words are lexed as words, across lines and comments.
      if (!in_array && Peek() == '(' && !word.empty() && word.back() == '=') {
        absl::string_view name(word);
        name.remove_suffix(1);
        const bool append = absl::ConsumeSuffix(&name, "+");
        if (IsName(name)) {
          ++pos_;
          Token t = MakeToken(TokenKind::kArrayAssign, std::string(name), line);
          t.append = append;
          if (absl::Status s = Tokens(t.elements, /*in_array=*/true); !s.ok()) return s;
          out.push_back(std::move(t));
          word_start = false;
          continue;
        }
      }
      if (word.empty()) return Error(absl::StrCat("unexpected '", std::string(1, c), "'"));
      out.push_back(MakeToken(TokenKind::kWord, std::move(word), line));
      word_start = false;
    }
    if (in_array) return Error("an array's '(' has no ')'");
    return absl::OkStatus();
  }

  // Reads up to the matching `close`, honouring quotes and nesting; appends what it read.
  absl::Status Balanced(char open, char close, std::string& word) {
    int depth = 0;
    const int start = line_;
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '\n') ++line_;
      if (c == '\\' && pos_ + 1 < text_.size()) {
        absl::StrAppend(&word, text_.substr(pos_, 2));
        if (text_[pos_ + 1] == '\n') ++line_;
        pos_ += 2;
        continue;
      }
      if (c == '\'' || c == '"' || c == '`') {
        if (absl::Status s = Quoted(c, word); !s.ok()) return s;
        continue;
      }
      word.push_back(c);
      ++pos_;
      if (c == open) ++depth;
      if (c == close && --depth == 0) return absl::OkStatus();
    }
    line_ = start;
    return Error(
        absl::StrCat("'", std::string(1, open), "' has no matching '", std::string(1, close), "'"));
  }

  // A quoted stretch starting at pos_ ('...', "...", `...`), appended with its quotes.
  absl::Status Quoted(char quote, std::string& word) {
    const int start = line_;
    word.push_back(quote);
    ++pos_;
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == quote) {
        word.push_back(c);
        ++pos_;
        return absl::OkStatus();
      }
      if (c == '\n') ++line_;
      if (quote != '\'' && c == '\\' && pos_ + 1 < text_.size()) {
        if (text_[pos_ + 1] == '\n') ++line_;
        absl::StrAppend(&word, text_.substr(pos_, 2));
        pos_ += 2;
        continue;
      }
      if (quote == '"' && c == '$' && (Peek(1) == '(' || Peek(1) == '{')) {
        word.push_back('$');
        ++pos_;
        const char open = text_[pos_];
        if (absl::Status s = Balanced(open, open == '(' ? ')' : '}', word); !s.ok()) return s;
        continue;
      }
      if (quote == '"' && c == '`') {
        if (absl::Status s = Quoted('`', word); !s.ok()) return s;
        continue;
      }
      word.push_back(c);
      ++pos_;
    }
    line_ = start;
    return Error(absl::StrCat("the quote ", std::string(1, quote), " opened here has no end"));
  }

  absl::Status Word(std::string& word) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '\\' && Peek(1) == '\n') {
        pos_ += 2;
        ++line_;
        continue;
      }
      if (c == '\\' && pos_ + 1 < text_.size()) {
        absl::StrAppend(&word, text_.substr(pos_, 2));
        pos_ += 2;
        continue;
      }
      if (c == '\'' || c == '"' || c == '`') {
        if (absl::Status s = Quoted(c, word); !s.ok()) return s;
        continue;
      }
      if (c == '$' && (Peek(1) == '(' || Peek(1) == '{')) {
        word.push_back('$');
        ++pos_;
        const char open = text_[pos_];
        if (absl::Status s = Balanced(open, open == '(' ? ')' : '}', word); !s.ok()) return s;
        continue;
      }
      if (EndsWord(c)) break;
      word.push_back(c);
      ++pos_;
    }
    return absl::OkStatus();
  }

  // `> file`, `2>&1`, `< in`, `&> log`: dropped with their target. `<<DELIM`: a here-document.
  absl::Status Redirection(std::vector<Token>& out) {
    if (text_.substr(pos_, 2) == "<<" && Peek(2) != '<') {
      pos_ += 2;
      const bool strip_tabs = Peek() == '-';
      if (strip_tabs) ++pos_;
      while (IsBlank(Peek())) ++pos_;
      std::string raw;
      if (absl::Status s = Word(raw); !s.ok()) return s;
      std::string delimiter;
      bool quoted = false;
      for (char c : raw) {
        if (c == '\'' || c == '"' || c == '\\') {
          quoted = true;
        } else {
          delimiter.push_back(c);
        }
      }
      if (delimiter.empty()) return Error("a here-document (<<) without its delimiter");
      Token t = MakeToken(TokenKind::kOperator, "<<", line_);
      t.heredoc_quoted = quoted;
      pending_.push_back({out.size(), delimiter, strip_tabs});
      out.push_back(std::move(t));
      return absl::OkStatus();
    }
    // A file descriptor written before the operator (2>) belongs to it.
    if (!out.empty() && out.back().kind == TokenKind::kWord && pos_ > 0 &&
        !IsBlank(text_[pos_ - 1]) && !out.back().text.empty() &&
        out.back().text.find_first_not_of("0123456789") == std::string::npos) {
      out.pop_back();
    }
    while (pos_ < text_.size() &&
           (text_[pos_] == '<' || text_[pos_] == '>' || text_[pos_] == '&' || text_[pos_] == '|')) {
      ++pos_;
    }
    while (IsBlank(Peek())) ++pos_;
    std::string target;
    return Word(target);
  }

  // At a newline: the bodies of the here-documents opened on the line just ended.
  absl::Status HereDocuments(std::vector<Token>& out) {
    for (const Pending& p : pending_) {
      Token& t = out[p.token];
      t.heredoc_line = line_;
      bool closed = false;
      while (pos_ < text_.size()) {
        size_t end = text_.find('\n', pos_);
        if (end == absl::string_view::npos) end = text_.size();
        absl::string_view body_line = text_.substr(pos_, end - pos_);
        pos_ = std::min(end + 1, text_.size());
        ++line_;
        if (p.strip_tabs) {
          while (!body_line.empty() && body_line.front() == '\t') body_line.remove_prefix(1);
        }
        if (absl::StripTrailingAsciiWhitespace(body_line) == p.delimiter) {
          closed = true;
          break;
        }
        absl::StrAppend(&t.heredoc, body_line, "\n");
      }
      if (!closed) {
        return Error(absl::StrCat("the here-document ending in '", p.delimiter, "' has no end"));
      }
    }
    pending_.clear();
    return absl::OkStatus();
  }

  void SbatchLine(absl::string_view comment) {
    absl::string_view rest = absl::StripAsciiWhitespace(comment.substr(7));
    if (!absl::ConsumePrefix(&rest, "--")) return;
    size_t cut = rest.find_first_of("= \t");
    SbatchDirective d{line_, std::string(rest.substr(0, cut)), ""};
    if (cut != absl::string_view::npos) {
      d.value = std::string(absl::StripAsciiWhitespace(rest.substr(cut + 1)));
    }
    sbatch_.push_back(std::move(d));
  }

  absl::string_view text_;
  absl::string_view source_;
  int line_;
  std::vector<SbatchDirective>& sbatch_;
  size_t pos_ = 0;
  std::vector<Pending> pending_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Lex(absl::string_view text, absl::string_view source,
                                       int first_line, std::vector<SbatchDirective>& sbatch) {
  return Lexer(text, source, first_line, sbatch).Run();
}

}  // namespace stowage::bridges::shell
