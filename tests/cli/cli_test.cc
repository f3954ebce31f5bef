#include "cli/cli.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace stowage::cli {
namespace {

using ::testing::HasSubstr;

absl::Status ParseArgs(FlagParser& parser, std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return parser.Parse(static_cast<int>(argv.size()), argv.data(), 1);
}

FlagParser MakeParser() {
  FlagParser parser("stowage plan [flags]", "Plans.");
  parser.Add({"seq-len", "N", "tokens per sequence", "1M"});
  parser.Add({"cp", "N", "context parallel size", "8", {"context-parallel-size"}});
  parser.Add({"verbose", "", "print more", ""});
  return parser;
}

TEST(FlagParser, ParsesBothSpellingsAndSwitches) {
  FlagParser parser = MakeParser();
  ASSERT_TRUE(ParseArgs(parser, {"plan", "--seq-len=256K", "--cp", "4", "--verbose", "x"}).ok());
  EXPECT_EQ(*parser.GetCount("seq-len", 1), 262144u);
  EXPECT_EQ(*parser.GetInt("cp", 8, 1, 1024), 4);
  EXPECT_TRUE(parser.GetBool("verbose"));
  EXPECT_EQ(parser.positional(), std::vector<std::string>{"x"});
  EXPECT_EQ(*parser.GetInt("tp", 1, 1, 64), 1);  // absent: fallback
}

TEST(FlagParser, ErrorsNameFlagValueAndAllowedRange) {
  FlagParser parser = MakeParser();
  EXPECT_THAT(ParseArgs(parser, {"plan", "--seqlen=1"}).message(), HasSubstr("--seqlen"));
  FlagParser p2 = MakeParser();
  ASSERT_TRUE(ParseArgs(p2, {"plan", "--cp=0", "--seq-len=12Q"}).ok());
  EXPECT_THAT(p2.GetInt("cp", 8, 1, 1024).status().message(),
              HasSubstr("--cp=0: expected an integer from 1 to 1024"));
  EXPECT_THAT(p2.GetCount("seq-len", 1).status().message(), HasSubstr("--seq-len=12Q"));
  FlagParser p3 = MakeParser();
  EXPECT_THAT(ParseArgs(p3, {"plan", "--cp"}).message(), HasSubstr("needs a value"));
}

TEST(FlagParser, HelpListsEveryFlagWithDefault) {
  FlagParser parser = MakeParser();
  ASSERT_TRUE(ParseArgs(parser, {"plan", "--help"}).ok());
  EXPECT_TRUE(parser.help_requested());
  const std::string help = parser.Help();
  EXPECT_THAT(help, HasSubstr("--seq-len=N"));
  EXPECT_THAT(help, HasSubstr("(default: 1M)"));
  EXPECT_THAT(help, HasSubstr("--verbose"));
}

TEST(FlagParser, UnknownFlagSuggestsTheNearestSpelling) {
  for (const auto& [typed, meant] : std::vector<std::pair<std::string, std::string>>{
           {"--seq-lenn=1", "--seq-len"},                           // a typo
           {"--sq-len=1", "--seq-len"},                             // a letter missing
           {"--verb", "--verbose"},                                 // the start of a flag
           {"--context-parallel=2", "--context-parallel-size"}}) {  // of an alias
    FlagParser parser = MakeParser();
    const std::string message(ParseArgs(parser, {"plan", typed}).message());
    EXPECT_THAT(message, HasSubstr("did you mean '" + meant + "'?")) << typed;
  }
  // Nothing close: no guess.
  FlagParser parser = MakeParser();
  const std::string message(ParseArgs(parser, {"plan", "--frobnicate=1"}).message());
  EXPECT_THAT(message, HasSubstr("unknown flag '--frobnicate'"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("did you mean")));
}

TEST(FlagParser, AliasesAreTheFlagItself) {
  FlagParser parser = MakeParser();
  ASSERT_TRUE(ParseArgs(parser, {"plan", "--context-parallel-size", "4"}).ok());
  EXPECT_TRUE(parser.Has("cp"));
  EXPECT_EQ(*parser.GetInt("cp", 8, 1, 1024), 4);
  EXPECT_THAT(parser.Help(), HasSubstr("also --context-parallel-size"));
}

TEST(FlagParser, LongFlagsGetTheirHelpOnTheNextLine) {
  FlagParser parser("stowage demo-runtime [flags]", "Runs.");
  parser.Add({"metrics-address", "HOST:PORT", "Prometheus endpoint", ""});
  parser.Add({"cp", "N", "context parallel size", ""});
  const std::string help = parser.Help();
  EXPECT_THAT(help, HasSubstr("  --metrics-address=HOST:PORT\n" + std::string(29, ' ') +
                              "Prometheus endpoint\n"));
  EXPECT_THAT(help, HasSubstr("  --cp=N" + std::string(21, ' ') + "context parallel size\n"));
}

TEST(ParseCount, Suffixes) {
  EXPECT_EQ(*ParseCount("2G", "x"), 2ull << 30);
  EXPECT_EQ(*ParseCount("1048576", "x"), 1048576u);
  EXPECT_FALSE(ParseCount("0", "x").ok());
  EXPECT_FALSE(ParseCount("-5", "x").ok());
  EXPECT_FALSE(ParseCount("", "x").ok());
}

// Regression: `--tp --format json` took "--format" as the value of --tp and then
// reported "unexpected argument 'json'".
TEST(FlagParser, FlagFollowedByAnotherFlagSaysItNeedsAValue) {
  FlagParser parser = MakeParser();
  parser.Add({"format", "table|json", "stdout format", "table"});
  const absl::Status s = ParseArgs(parser, {"plan", "--cp", "--format", "json"});
  EXPECT_THAT(s.message(),
              HasSubstr("flag '--cp' needs a value (N) but is followed by '--format'"));
  // A negative number is still a value (and then fails its own range check).
  FlagParser p2 = MakeParser();
  ASSERT_TRUE(ParseArgs(p2, {"plan", "--cp", "-3"}).ok());
  EXPECT_THAT(p2.GetInt("cp", 8, 1, 1024).status().message(), HasSubstr("--cp=-3"));
}

TEST(ParseCount, ZeroWhereAllowedAndNothingButDigits) {
  EXPECT_EQ(*ParseCount("0", "--loss-chunk-tokens", 0), 0u);
  EXPECT_THAT(ParseCount("0", "--seq-len").status().message(),
              HasSubstr("--seq-len=0: expected a count of at least 1"));
  EXPECT_FALSE(ParseCount("+5", "x").ok());
  EXPECT_FALSE(ParseCount(" 5", "x").ok());
  EXPECT_FALSE(ParseCount("17179869184G", "x").ok());  // 2^64: overflows
  EXPECT_EQ(*ParseCount("17179869183G", "x"), 17179869183ull << 30);
}

}  // namespace
}  // namespace stowage::cli
