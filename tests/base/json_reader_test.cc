#include "base/json_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/checked_math.h"

namespace stowage::json {
namespace {

using ::testing::HasSubstr;

Object Root(const Json& j) { return *Object::Of(j, "test.json"); }

TEST(JsonReader, IntegersAreExactAndRangeChecked) {
  const Json j = Json::parse(
      R"({"ok": 4096, "neg": -1, "frac": 1.5, "flag": true, "huge": 1e30, "big": 4294971392,
          "str": "7", "u64max": 18446744073709551615})");
  auto root = Root(j);
  int v = 0;
  EXPECT_TRUE(root.Read("ok", v, {1, 1 << 20}).ok());
  EXPECT_EQ(v, 4096);
  uint64_t u = 0;
  // Regression (negatives read as 2^64-N; 1.5 as 1; true as 1; 1e30 undefined behaviour; 2^32+4096
  // read as 4096 into an int).
  for (const char* key : {"neg", "frac", "flag", "huge", "str"}) {
    auto status = root.Read(key, u);
    EXPECT_FALSE(status.ok()) << key;
    EXPECT_THAT(std::string(status.message()), HasSubstr(absl::StrCat("field '", key, "'")));
    EXPECT_THAT(std::string(status.message()), HasSubstr("allowed: an integer in"));
  }
  auto status = root.Read("big", v);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("has value 4294971392"));
  EXPECT_TRUE(root.Read("u64max", u).ok());
  EXPECT_EQ(u, UINT64_MAX);
  int64_t s = 0;
  EXPECT_FALSE(root.Read("u64max", s).ok());
  EXPECT_TRUE(root.Read("neg", s).ok());
  EXPECT_EQ(s, -1);
  EXPECT_FALSE(root.Read("neg", s, {0, 10}).ok());
  EXPECT_FALSE(root.Read("ok", u, {1, 100}).ok());
  EXPECT_FALSE(root.Read("ok", u, {5000, 6000}).ok());
}

TEST(JsonReader, RealsMustBeFiniteNumbersInRange) {
  const Json j = Json::parse(R"({"x": 2.5, "i": 3, "s": "2.5", "neg": -1})");
  auto root = Root(j);
  double d = 0;
  EXPECT_TRUE(root.Read("x", d).ok());
  EXPECT_TRUE(root.Read("i", d).ok());
  EXPECT_EQ(d, 3);
  EXPECT_FALSE(root.Read("s", d).ok());
  EXPECT_FALSE(root.Read("neg", d, {0, 1e15}).ok());
}

TEST(JsonReader, MissingAndOptionalFields) {
  const Json j = Json::parse(R"({"a": {"b": 1, "n": null}})");
  auto a = Root(j).Child("a");
  ASSERT_TRUE(a.ok());
  int v = 9;
  EXPECT_TRUE(a->ReadOptional("absent", v).ok());
  EXPECT_TRUE(a->ReadOptional("n", v).ok());
  EXPECT_EQ(v, 9);
  auto status = a->Read("absent", v);
  EXPECT_THAT(std::string(status.message()), HasSubstr("test.json: missing field 'a.absent'"));
  bool flag = false;
  EXPECT_THAT(std::string(a->Read("b", flag).message()), HasSubstr("allowed: true or false"));
}

TEST(JsonReader, SyntaxErrorsNameLineAndColumn) {
  auto parsed = Parse("{\n  \"a\": 1,\n  \"b\": ]\n}", "config.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr("config.json: not valid JSON at line 3, column 8"));
  auto not_object = Parse("[1, 2]", "config.json");
  ASSERT_TRUE(not_object.ok());
  EXPECT_THAT(std::string(Object::Of(*not_object, "config.json").status().message()),
              HasSubstr("expected a JSON object"));
}

TEST(CheckedMath, OverflowIsDetected) {
  EXPECT_EQ(CheckedAdd<uint64_t>(UINT64_MAX, 1), std::nullopt);
  EXPECT_EQ(CheckedMul<uint64_t>(1ull << 33, 1ull << 33), std::nullopt);
  EXPECT_EQ(CheckedMul<int64_t>(3, 4), 12);
  EXPECT_EQ(CeilDiv<uint64_t>(UINT64_MAX, UINT64_MAX), 1u);
  EXPECT_EQ(CeilDiv<uint64_t>(10, 4), 3u);
  EXPECT_FALSE(AddOrError<uint64_t>(UINT64_MAX, 2, "host bytes").ok());
  EXPECT_THAT(std::string(MulOrError<uint64_t>(1ull << 40, 1ull << 40, "bytes").status().message()),
              HasSubstr("bytes overflows"));
}

// Regression (found by the hardware_profile fuzzer): a number literal beyond double's range is
// nlohmann's out_of_range.406, which Parse did not catch; the exception aborted the process.
TEST(JsonParse, NumberBeyondDoubleIsAnErrorNotAnException) {
  auto parsed = Parse(R"({"hbm_bytes_per_second": 1e1232})", "hardware profile h.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(
      parsed.status().message(),
      HasSubstr("hardware profile h.json: not valid JSON: number overflow parsing '1e1232'"));
  EXPECT_FALSE(Parse("[-1e400]", "x").ok());
}

// Nesting is bounded before anything recursive runs: 100,000 brackets crashed the readers.
TEST(JsonParse, DeepNestingIsRefusedNamingWhereAndTheBound) {
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(Parse(ok, "t").ok());
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const auto refused = Parse(deep, "plan p.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "plan p.json: arrays and objects nest more than 100 levels deep at line 1, column "
            "101; at most 100 are allowed");
  const std::string objects = "{\"a\": " + std::string(200, '{') + std::string(200, '}') + "}";
  EXPECT_FALSE(Parse(objects, "t").ok());
  // Brackets inside strings are text, not nesting.
  const std::string text = "[\"" + std::string(500, '[') + "\\\"\"]";
  EXPECT_TRUE(Parse(text, "t").ok()) << Parse(text, "t").status();
}

TEST(JsonObject, OnlyKeysNamesTheUnknownKeyAndTheAllowedOnes) {
  auto json = Parse(R"({"run": {"seq_len": 1, "seqlen": 2}})", "request");
  ASSERT_TRUE(json.ok());
  auto root = Object::Of(*json, "request");
  ASSERT_TRUE(root.ok());
  EXPECT_TRUE(root->OnlyKeys({"run", "model"}).ok());
  auto run = root->Child("run");
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->OnlyKeys({"seq_len", "tp"}).message(),
            "request: unknown field 'run.seqlen'; allowed in 'run': seq_len, tp");
}

TEST(Excerpt, CutsLongTextAndSaysHowMuch) {
  EXPECT_EQ(Excerpt("short"), "short");
  EXPECT_EQ(Excerpt(std::string(100, 'a'), 4), "aaaa... (96 more characters)");
}

// Note [JSON limits while reading]: each limit is checked in the scan before the tree is built,
// names the field and where it was broken, and lets through what is exactly at the limit.
TEST(JsonParse, LimitsAreCheckedWhileReadingNamingTheField) {
  Limits limits;
  limits.max_string_bytes = 4;
  limits.max_elements = 3;
  limits.max_values = 12;
  EXPECT_TRUE(Parse(R"({"abcd": ["wxyz", 1, 2]})", "t", limits).ok());
  EXPECT_EQ(Parse(R"({"a": {"b": [1, "wxyz5"]}})", "t", limits).status().message(),
            "t: field 'a.b[1]' holds a string longer than 4 bytes at line 1, column 22; allowed: "
            "at most 4 bytes");
  EXPECT_EQ(Parse(R"({"abcde": 1})", "t", limits).status().message(),
            "t: the document holds a string longer than 4 bytes at line 1, column 7; allowed: at "
            "most 4 bytes");
  EXPECT_EQ(Parse("{\"a\": [[1,\n2, 3, 4]]}", "t", limits).status().message(),
            "t: field 'a[0]' has more than 3 elements at line 2, column 5; allowed: at most 3");
  EXPECT_EQ(Parse(R"({"a": 1, "b": 2, "c": 3, "d": 4})", "t", limits).status().message(),
            "t: the document has more than 3 members at line 1, column 24; allowed: at most 3");
  // Strings are measured as written: an escape is two bytes, and one that crosses the limit is
  // past it.
  EXPECT_TRUE(Parse(R"(["ab\n"])", "t", limits).ok());
  EXPECT_FALSE(Parse(R"(["abc\n"])", "t", limits).ok());
  // Commas inside strings are text.
  EXPECT_TRUE(Parse(R"([",,,,", 1])", "t", limits).ok());
  // Values: the root, each container's elements and what they hold.
  EXPECT_TRUE(Parse("[[1, 2, 3], [4, 5, 6], [7, 8]]", "t", limits).ok());  // 1 + 3 + 8
  EXPECT_EQ(Parse("[[1, 2, 3], [4, 5, 6], [7, 8, 9]]", "t", limits).status().message(),
            "t: more than 12 values at line 1, column 29; allowed: at most 12");
  limits.max_bytes = 5;
  EXPECT_EQ(Parse("[1, 2]", "t", limits).status().message(), "t: 6 bytes; allowed: at most 5");
}

}  // namespace
}  // namespace stowage::json
