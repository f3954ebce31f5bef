// Reading a launch script without running it (`stowage plan --from-megatron FILE [-- ARG...]`):
// the shell subset launch scripts use, interpreted on the values the script itself gives, so the
// commands it would run can be read with their arguments expanded. Nothing is executed: an
// external command is only recorded (and taken to succeed), a command substitution is left
// unresolved, a file test is a condition whose value is not known.
#ifndef STOWAGE_BRIDGES_SHELL_SCRIPT_H_
#define STOWAGE_BRIDGES_SHELL_SCRIPT_H_

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace stowage::bridges {

// One word of a command after expansion. `unresolved` names what it depends on that the reader
// could not know ("line 14: $(dirname ...) is a command substitution, not run"); empty when the
// text is the word the shell would pass.
struct ShellWord {
  std::string text;
  std::string unresolved;
};

struct ShellCommand {
  int line = 0;  // where the command starts in its file
  std::vector<ShellWord> words;
  // Run only when a condition the reader could not decide holds (e.g. `if [ -f "$X" ]`).
  bool conditional = false;
};

// A `#SBATCH --nodes=4` directive, split at its first '=' or space.
struct SbatchDirective {
  int line = 0;
  std::string name;  // "nodes"
  std::string value;
};

// The variables of a finished script; an unresolved one says why.
struct ShellValue {
  std::vector<std::string> values;  // a scalar is one value
  bool array = false;
  std::string unresolved;                       // the whole value's
  std::vector<std::string> element_unresolved;  // an array's, element by element (or empty)
};

struct ShellScript {
  std::vector<ShellCommand> commands;  // every external command, in the order it would run
  std::vector<SbatchDirective> sbatch;
  std::map<std::string, ShellValue> variables;
  // What could not be resolved, each "FILE:LINE: what": listed for the user, needed or not.
  std::vector<std::string> unresolved;
};

struct ShellEnvironment {
  std::vector<std::string> positional;     // $1, $2, ... (after `--` on the command line)
  std::map<std::string, std::string> env;  // the environment the script would see
};

// Interprets `text`: assignments (NAME=v, NAME+=v, arrays NAME=(a b) and +=, export, declare,
// local, readonly, unset), expansions ($V, ${V}, ${V:-d} ${V-d} ${V:=d} ${V:+a} ${V:?m} ${#V}
// ${V#p} ${V##p} ${V%p} ${V%%p} ${V/p/r} ${V//p/r}, ${A[@]}, ${A[i]}, $1 ${10} $# $@ $*, $((...))
// arithmetic), quoting and field splitting, line continuations, `;` `&&` `||` `|`, if/elif/else,
// case, for, while/until (bounded), { ... } groups, functions, set --, shift, eval, bash -c, and
// here-documents given to sbatch or bash (read as scripts themselves, their #SBATCH lines
// included). Errors only for text that is not shell (an unterminated quote, `fi` without `if`);
// everything the reader cannot evaluate is listed in `unresolved` instead.
absl::StatusOr<ShellScript> ReadShellScript(std::string_view text, std::string_view source,
                                            const ShellEnvironment& environment);

// Evaluates shell arithmetic ($((...)) without the parentheses) over integer variables:
// + - * / % ** << >> & | ^ ~ ! comparisons && || ?: and parentheses. `lookup` gives a
// variable's value or an error.
absl::StatusOr<long long> ShellArithmetic(std::string_view expression,
                                          const std::map<std::string, std::string>& variables);

}  // namespace stowage::bridges

#endif  // STOWAGE_BRIDGES_SHELL_SCRIPT_H_
