// Reading a layer profile written in a test (profile_test.cc, profile_pipeline_test.cc).
#ifndef STOWAGE_TESTS_PLANNER_PROFILE_JSON_H_
#define STOWAGE_TESTS_PLANNER_PROFILE_JSON_H_

#include <gtest/gtest.h>

#include <string>

#include "nlohmann/json.hpp"
#include "planner/frameworks/layer_profile.h"

namespace stowage::planner {

// The profile `j` describes; a failed expectation (and an empty profile) if the reader refuses it.
inline LayerProfileSet Parse(const nlohmann::ordered_json& j) {
  auto p = ParseProfileJson(j.dump(), "test profile");
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : LayerProfileSet{};
}

// The reader's error for `j`, or "accepted".
inline std::string ErrorOf(const nlohmann::ordered_json& j) {
  auto p = ParseProfileJson(j.dump(), "test profile");
  return p.ok() ? "accepted" : std::string(p.status().message());
}

}  // namespace stowage::planner

#endif  // STOWAGE_TESTS_PLANNER_PROFILE_JSON_H_
