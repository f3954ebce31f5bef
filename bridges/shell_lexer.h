// The tokens of a launch script (bridges/shell_script.h): words kept as written (quotes and
// expansions are the interpreter's), operators, newlines, array assignments and here-documents.
// Redirections other than here-documents are dropped: nothing is written or read.
#ifndef STOWAGE_BRIDGES_SHELL_LEXER_H_
#define STOWAGE_BRIDGES_SHELL_LEXER_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bridges/shell_script.h"

namespace stowage::bridges::shell {

enum class TokenKind {
  kWord,      // text: the word as written, quotes included
  kOperator,  // ; ;; & && | || ( ) and "<<" (a here-document; see heredoc)
  kNewline,
  kArrayAssign,  // NAME=( ... ) or NAME+=( ... ): text NAME, elements the words inside
};

struct Token {
  TokenKind kind = TokenKind::kWord;
  std::string text;
  int line = 0;
  bool append = false;          // kArrayAssign: +=
  std::vector<Token> elements;  // kArrayAssign
  std::string heredoc;          // "<<": the body
  bool heredoc_quoted = false;  // "<<": a quoted delimiter, the body is literal
  int heredoc_line = 0;         // "<<": the body's first line
};

inline Token MakeToken(TokenKind kind, std::string text, int line) {
  Token t;
  t.kind = kind;
  t.text = std::move(text);
  t.line = line;
  return t;
}

// `first_line` numbers the text's first line (a nested script keeps its host's numbers).
// #SBATCH comment lines are appended to `sbatch`. Errors name source:line.
absl::StatusOr<std::vector<Token>> Lex(absl::string_view text, absl::string_view source,
                                       int first_line, std::vector<SbatchDirective>& sbatch);

// True for NAME, a shell identifier.
bool IsName(absl::string_view s);

}  // namespace stowage::bridges::shell

#endif  // STOWAGE_BRIDGES_SHELL_LEXER_H_
