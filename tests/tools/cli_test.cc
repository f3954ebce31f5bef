#include "tools/cli.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
  parser.Add({"cp", "N", "context parallel size", "8"});
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

TEST(ParseCount, Suffixes) {
  EXPECT_EQ(*ParseCount("2G", "x"), 2ull << 30);
  EXPECT_EQ(*ParseCount("1048576", "x"), 1048576u);
  EXPECT_FALSE(ParseCount("0", "x").ok());
  EXPECT_FALSE(ParseCount("-5", "x").ok());
  EXPECT_FALSE(ParseCount("", "x").ok());
}

}  // namespace
}  // namespace stowage::cli
