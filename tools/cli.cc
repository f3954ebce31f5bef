#include "tools/cli.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stowage::cli {

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
    auto flag =
        std::find_if(flags_.begin(), flags_.end(), [&](const Flag& f) { return f.name == name; });
    if (flag == flags_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag '--", name, "' (see --help for the flags of ", usage_, ")"));
    }
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
    absl::StrAppendFormat(&out, "%-28s %s", lhs, f.help);
    if (!f.default_text.empty()) absl::StrAppend(&out, " (default: ", f.default_text, ")");
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppendFormat(&out, "%-28s %s\n", "  -h, --help", "show this help");
  return out;
}

}  // namespace stowage::cli
