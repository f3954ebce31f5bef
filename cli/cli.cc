#include "cli/cli.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace stowage::cli {

constexpr size_t kHelpColumn = 28;  // where a flag's help text starts in --help

FlagParser::FlagParser(std::string usage, std::string summary)
    : usage_(std::move(usage)), summary_(std::move(summary)) {}

void FlagParser::Add(Flag flag) { flags_.push_back(std::move(flag)); }

absl::Status FlagParser::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      help_requested_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    auto flag = std::find_if(flags_.begin(), flags_.end(), [&](const Flag& f) {
      return f.name == name ||
             std::find(f.aliases.begin(), f.aliases.end(), name) != f.aliases.end();
    });
    if (flag == flags_.end()) {
      const std::string nearest = NearestFlag(name);
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag '--", name, "'",
                       nearest.empty() ? "" : absl::StrCat(" (did you mean '--", nearest, "'?)"),
                       "; see --help for the flags of ", usage_));
    }
    name = flag->name;  // an alias is the flag itself
    if (!value.has_value()) {
      if (flag->value_name.empty()) {
        value = "true";
      } else if (i + 1 < argc && std::string_view(argv[i + 1]).rfind("--", 0) != 0) {
        value = argv[++i];
      } else if (i + 1 < argc) {
        // `--tp --format json` would otherwise read "--format" as the value of --tp and then
        // report "json" as an unexpected argument, far from the actual mistake.
        return absl::InvalidArgumentError(absl::StrCat("flag '--", name, "' needs a value (",
                                                       flag->value_name, ") but is followed by '",
                                                       argv[i + 1], "'"));
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("flag '--", name, "' needs a value (", flag->value_name, ")"));
      }
    }
    values_[name] = *value;
  }
  return absl::OkStatus();
}

namespace {

// Levenshtein distance, for "did you mean".
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

}  // namespace

std::string FlagParser::NearestFlag(const std::string& name) const {
  // Close enough to be a typo: at most a third of the name's letters wrong (and at least 1).
  const size_t limit = std::max<size_t>(1, name.size() / 3);
  std::string best;
  size_t best_distance = limit + 1;
  for (const Flag& f : flags_) {
    std::vector<std::string> spellings = f.aliases;
    spellings.push_back(f.name);
    for (const std::string& spelling : spellings) {
      size_t d = EditDistance(name, spelling);
      // The start of a flag ("--host" for "--host-mem") counts as close.
      if (name.size() >= 3 && spelling.rfind(name, 0) == 0) d = std::min(d, limit);
      if (d < best_distance) {
        best = spelling;
        best_distance = d;
      }
    }
  }
  return best;
}

bool FlagParser::SetDefault(const std::string& name, std::string value) {
  if (std::none_of(flags_.begin(), flags_.end(), [&](const Flag& f) { return f.name == name; })) {
    return false;
  }
  values_.try_emplace(name, std::move(value));
  return true;
}

bool FlagParser::Has(const std::string& name) const { return values_.contains(name); }

std::optional<std::string> FlagParser::Get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

bool FlagParser::GetBool(const std::string& name) const {
  auto v = Get(name);
  return v.has_value() && *v != "false" && *v != "0";
}

absl::StatusOr<std::string> FlagParser::GetString(const std::string& name,
                                                  std::string fallback) const {
  return Get(name).value_or(std::move(fallback));
}

absl::StatusOr<int64_t> FlagParser::GetInt(const std::string& name, int64_t fallback, int64_t min,
                                           int64_t max) const {
  auto v = Get(name);
  if (!v) return fallback;
  int64_t out = 0;
  if (!absl::SimpleAtoi(*v, &out) || out < min || out > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, "=", *v, ": expected an integer from ", min, " to ", max));
  }
  return out;
}

absl::StatusOr<double> FlagParser::GetDouble(const std::string& name, double fallback, double min,
                                             double max) const {
  auto v = Get(name);
  if (!v) return fallback;
  double out = 0;
  if (!absl::SimpleAtod(*v, &out) || !std::isfinite(out) || out < min || out > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, "=", *v, ": expected a number from ", min, " to ", max));
  }
  return out;
}

absl::StatusOr<uint64_t> FlagParser::GetCount(const std::string& name, uint64_t fallback,
                                              uint64_t min) const {
  auto v = Get(name);
  if (!v) return fallback;
  return ParseCount(*v, "--" + name, min);
}

absl::StatusOr<uint64_t> ParseCount(const std::string& text, const std::string& what,
                                    uint64_t min) {
  std::string digits = text;
  uint64_t multiplier = 1;
  if (!digits.empty()) {
    switch (std::toupper(static_cast<unsigned char>(digits.back()))) {
      case 'K':
        multiplier = 1ull << 10;
        break;
      case 'M':
        multiplier = 1ull << 20;
        break;
      case 'G':
        multiplier = 1ull << 30;
        break;
      default:
        break;
    }
    if (multiplier != 1) digits.pop_back();
  }
  uint64_t value = 0;
  // SimpleAtoi takes a leading '+' and surrounding whitespace; a count is digits only.
  const bool digits_only =
      !digits.empty() && std::all_of(digits.begin(), digits.end(),
                                     [](unsigned char c) { return std::isdigit(c) != 0; });
  if (!digits_only || !absl::SimpleAtoi(digits, &value) ||
      value > std::numeric_limits<uint64_t>::max() / multiplier || value * multiplier < min) {
    return absl::InvalidArgumentError(absl::StrCat(what, "=", text,
                                                   ": expected a count of at least ", min,
                                                   " such as 262144, 256K, 1M or 2G"));
  }
  return value * multiplier;
}

std::string FlagParser::Help() const {
  std::string out = absl::StrCat("usage: ", usage_, "\n\n", summary_, "\n\nflags:\n");
  for (const Flag& f : flags_) {
    std::string lhs = absl::StrCat("  --", f.name, f.value_name.empty() ? "" : "=" + f.value_name);
    // A long flag gets its help on the next line instead of running into it.
    if (lhs.size() >= kHelpColumn) {
      absl::StrAppend(&out, lhs, "\n", std::string(kHelpColumn + 1, ' '), f.help);
    } else {
      absl::StrAppendFormat(&out, "%-*s %s", static_cast<int>(kHelpColumn), lhs, f.help);
    }
    if (!f.default_text.empty()) absl::StrAppend(&out, " (default: ", f.default_text, ")");
    if (!f.aliases.empty()) {
      absl::StrAppend(&out, "; also --", absl::StrJoin(f.aliases, ", --"));
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppendFormat(&out, "%-*s %s\n", static_cast<int>(kHelpColumn), "  -h, --help",
                        "show this help");
  return out;
}

}  // namespace stowage::cli
