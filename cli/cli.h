// Command-line plumbing shared by every `stowage` subcommand: a small flag parser that accepts
// `--name=value` and `--name value` (a value never starts with "--": `--tp --format json` is "--tp
// needs a value"), rejects unknown flags with a message naming them and the nearest known
// spelling, takes declared aliases (other tools' names for the same flag), and renders --help from
// the same table, so a flag cannot be documented but not parsed (or the reverse).
#ifndef STOWAGE_CLI_CLI_H_
#define STOWAGE_CLI_CLI_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stowage::cli {

struct Flag {
  std::string name;        // without the leading "--"
  std::string value_name;  // e.g. "N", "PATH"; empty for a boolean switch
  std::string help;
  std::string default_text;  // shown in --help; empty: no default shown
  // Other spellings that mean exactly this flag, e.g. Megatron-LM's "tensor-model-parallel-size"
  // for "tp". Parsed as the flag itself (Get/Has use `name`); listed in --help.
  std::vector<std::string> aliases = {};
};

class FlagParser {
 public:
  // `usage` is the first line of --help, e.g. "stowage plan [flags]"; `summary` follows it.
  FlagParser(std::string usage, std::string summary);

  void Add(Flag flag);
  // Parses argv[first..argc). Positional arguments are collected in positional().
  absl::Status Parse(int argc, char** argv, int first);

  // A value for `name` unless one was given on the command line (settings read from a file
  // yield to flags). False when no flag has that name.
  bool SetDefault(const std::string& name, std::string value);

  bool Has(const std::string& name) const;
  std::optional<std::string> Get(const std::string& name) const;
  bool GetBool(const std::string& name) const;  // a switch given without value
  // Typed getters: `fallback` when absent; a clear error naming the flag and value otherwise.
  absl::StatusOr<std::string> GetString(const std::string& name, std::string fallback) const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback, int64_t min,
                                 int64_t max) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback, double min,
                                   double max) const;
  // Accepts plain integers and K/M/G suffixes (binary: 256K = 262144), e.g. "1M", "1048576",
  // of at least `min`.
  absl::StatusOr<uint64_t> GetCount(const std::string& name, uint64_t fallback,
                                    uint64_t min = 1) const;

  const std::vector<std::string>& positional() const { return positional_; }
  bool help_requested() const { return help_requested_; }
  std::string Help() const;
  // The known spelling closest to `name` (a typo's correction), or "" when none is close.
  std::string NearestFlag(const std::string& name) const;

 private:
  std::string usage_;
  std::string summary_;
  std::vector<Flag> flags_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
  bool help_requested_ = false;
};

// Parses "256K", "1M", "2G", "1048576" (binary multiples), at least `min`. Errors name `what`.
absl::StatusOr<uint64_t> ParseCount(const std::string& text, const std::string& what,
                                    uint64_t min = 1);

}  // namespace stowage::cli

#endif  // STOWAGE_CLI_CLI_H_
