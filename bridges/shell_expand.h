// Word expansion for the launch-script reader (bridges/shell_script.h): parameters, arithmetic,
// quote removal and field splitting, on the interpreter's variables. Internal to bridges/.
#ifndef STOWAGE_BRIDGES_SHELL_EXPAND_H_
#define STOWAGE_BRIDGES_SHELL_EXPAND_H_

#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "bridges/shell_script.h"

namespace stowage::bridges::shell {

// What expansion reads: the script's variables, the environment under them, the positional
// parameters.
struct Scope {
  std::map<std::string, ShellValue>* variables = nullptr;
  const std::map<std::string, std::string>* env = nullptr;
  std::vector<std::string>* positional = nullptr;
  std::string source;  // for $0 and for what is unresolved
  int line = 0;
  int depth = 0;  // expansions within expansions (${A:-${B:-...}}), bounded
};

// A word as the shell passes it on: `"${A[@]}"` gives one field per element, an unquoted
// expansion is split at blanks, quotes are removed. Fields that depend on something unresolved
// say so (ShellWord::unresolved). ${V:=d} assigns.
std::vector<ShellWord> ExpandWord(absl::string_view raw, Scope& scope);

// One string, without field splitting: quotes are text when `quotes_are_text` (a here-document's
// body, where a backslash escapes only $, ` and itself), else removed (an assignment's value).
ShellWord ExpandString(absl::string_view raw, Scope& scope, bool quotes_are_text);

}  // namespace stowage::bridges::shell

#endif  // STOWAGE_BRIDGES_SHELL_EXPAND_H_
