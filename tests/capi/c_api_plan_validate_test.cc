// stowage_plan_validate: the C ABI's face of the one plan reader and validator (what Python's
// stowage.Plan validates through). It must agree with stowage_create on every plan, and never
// throw or crash on hostile input.
#include <gtest/gtest.h>

#include <string>

#include "stowage/plan.h"
#include "stowage/stowage.h"
#include "tests/runtime/test_plans.h"

namespace {

std::string LastError() { return stowage_last_error(); }

TEST(CApiPlanValidate, AcceptsAValidPlan) {
  const std::string json = stowage::PlanToJson(stowage::testing::MakeTestPlan(3, 4096));
  EXPECT_EQ(stowage_plan_validate(json.data(), json.size()), STOWAGE_OK) << LastError();
}

TEST(CApiPlanValidate, RefusesWithTheReadersMessage) {
  std::string json = stowage::PlanToJson(stowage::testing::MakeTestPlan(3, 4096));
  const std::string field = "\"copy_chunk_bytes\": 65536";
  ASSERT_NE(json.find(field), std::string::npos);
  json.replace(json.find(field), field.size(), "\"copy_chunk_bytes\": -1");
  EXPECT_EQ(stowage_plan_validate(json.data(), json.size()), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(LastError(),
            "stowage_plan_validate: plan: field 'runtime.copy_chunk_bytes' has value -1; allowed: "
            "an integer in [4096, 1073741824]");
  // stowage_create reads the plan the same way and refuses it in the same words.
  stowage_options options;
  stowage_options_init(&options);
  options.backend = STOWAGE_BACKEND_HOST;
  options.metrics_address = "";
  stowage_runtime* rt = nullptr;
  EXPECT_EQ(stowage_create(json.data(), json.size(), &options, &rt),
            STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(rt, nullptr);
  EXPECT_NE(LastError().find("plan: field 'runtime.copy_chunk_bytes' has value -1"),
            std::string::npos)
      << LastError();
}

TEST(CApiPlanValidate, LengthIsHonouredAndNullIsAnError) {
  const std::string json = stowage::PlanToJson(stowage::testing::MakeTestPlan(1, 4096));
  // Cut short: the text ends mid-object, whatever follows in memory.
  EXPECT_EQ(stowage_plan_validate(json.data(), json.size() / 2), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("not valid JSON"), std::string::npos) << LastError();
  EXPECT_EQ(stowage_plan_validate(nullptr, 10), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("plan_json is NULL"), std::string::npos);
  EXPECT_EQ(stowage_plan_validate(json.data(), 0), STOWAGE_ERROR_INVALID_ARGUMENT);
}

// Note [Plans that do not fit]: a valid plan, but not one to run: stowage_create refuses it with
// FAILED_PRECONDITION naming the budget, the excess and what binds.
TEST(CApiPlanValidate, APlanThatDoesNotFitIsValidButNotRun) {
  stowage::Plan plan = stowage::testing::MakeTestPlan(3, 4096);
  plan.predicted.peak_device_bytes = 5000;
  plan.gpu_budget_bytes = 4000;
  plan.fits = false;
  plan.binding = {"gpu",
                  1000,
                  0,
                  "backward of layer 2",
                  "working set of the backward of layer 2",
                  "one layer's working set does not fit next to 3.9 KiB of fixed memory"};
  const std::string json = stowage::PlanToJson(plan);
  EXPECT_EQ(stowage_plan_validate(json.data(), json.size()), STOWAGE_OK) << LastError();
  stowage_options options;
  stowage_options_init(&options);
  options.backend = STOWAGE_BACKEND_HOST;
  options.metrics_address = "";
  stowage_runtime* rt = nullptr;
  EXPECT_EQ(stowage_create(json.data(), json.size(), &options, &rt),
            STOWAGE_ERROR_FAILED_PRECONDITION);
  EXPECT_EQ(rt, nullptr);
  EXPECT_NE(LastError().find("stowage_create: plan: fits is false: the plan exceeds its gpu budget "
                             "by 1000 bytes (0.00 GiB) at the backward of layer 2 (working set of "
                             "the backward of layer 2: one layer's working set"),
            std::string::npos)
      << LastError();
  // The same plan with the budget it fits runs.
  plan.fits = true;
  plan.gpu_budget_bytes = 5000;
  const std::string fits = stowage::PlanToJson(plan);
  ASSERT_EQ(stowage_create(fits.data(), fits.size(), &options, &rt), STOWAGE_OK) << LastError();
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
}

TEST(CApiPlanValidate, HostileTextIsAnErrorNotACrash) {
  for (const std::string& text :
       {std::string("\xff\xfe{}", 4), std::string("{\"a\":\"\xc3\x28\"}"), std::string(100000, '['),
        std::string("{\"schema_version\":1e400}"), std::string("\0{}", 3)}) {
    EXPECT_EQ(stowage_plan_validate(text.data(), text.size()), STOWAGE_ERROR_INVALID_ARGUMENT)
        << text.substr(0, 20);
    EXPECT_FALSE(LastError().empty());
  }
}

}  // namespace

namespace {

TEST(CApiVersion, OneVersionFromTheBuild) {
  int32_t major = -1, minor = -1, patch = -1, abi = -1;
  ASSERT_EQ(stowage_get_version(&major, &minor, &patch, &abi), STOWAGE_OK);
  EXPECT_EQ(major, STOWAGE_VERSION_MAJOR);
  EXPECT_EQ(minor, STOWAGE_VERSION_MINOR);
  EXPECT_EQ(patch, STOWAGE_VERSION_PATCH);
  EXPECT_EQ(abi, STOWAGE_ABI_VERSION);
  EXPECT_EQ(std::string(stowage_version()),
            std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch));
  EXPECT_STREQ(stowage_version(), STOWAGE_VERSION_STRING);
  EXPECT_EQ(stowage_get_version(nullptr, nullptr, nullptr, nullptr), STOWAGE_OK);
}

}  // namespace
