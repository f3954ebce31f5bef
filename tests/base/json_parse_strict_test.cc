// json::Parse refuses what two JSON readers would read differently (duplicate keys) and what
// nlohmann throws outside its parse_error family (a number past a double), with a message, never
// an exception.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/json_reader.h"

namespace stowage::json {
namespace {

using ::testing::HasSubstr;

TEST(JsonParse, DuplicateKeysAreAnError) {
  EXPECT_THAT(Parse(R"({"a": 1, "b": {"c": 1, "c": 2}})", "config.json").status().message(),
              HasSubstr("config.json: duplicate key 'c' in one object"));
  // The same key in two different objects is fine.
  EXPECT_TRUE(Parse(R"({"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 1}, {"x": 2}]})", "t").ok());
}

TEST(JsonParse, NumberOverflowIsAnErrorNotAnException) {
  absl::StatusOr<Json> parsed = Parse(R"({"a": 1e400})", "profile.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("profile.json: not valid JSON"));
  EXPECT_THAT(parsed.status().message(), HasSubstr("1e400"));
}

}  // namespace
}  // namespace stowage::json
