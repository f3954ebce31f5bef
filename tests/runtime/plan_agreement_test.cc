// Plan agreement (runtime/plan_agreement.h): the canonical plan hash through the C ABI and the rule
// every rank applies to the gathered hashes.
#include "runtime/plan_agreement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "stowage/plan.h"
#include "stowage/stowage.h"
#include "tests/runtime/test_plans.h"

namespace stowage::runtime {
namespace {

using ::testing::HasSubstr;

uint64_t HashOf(const std::string& json) {
  uint64_t hash = 0;
  EXPECT_EQ(stowage_plan_hash(json.data(), json.size(), &hash), STOWAGE_OK) << stowage_last_error();
  return hash;
}

TEST(PlanHashTest, SamePlanSameHashWhateverItsSpelling) {
  const Plan plan = testing::MakeTestPlan(3, 4096);
  const std::string canonical = PlanToJson(plan);
  EXPECT_EQ(HashOf(canonical), CanonicalPlanHash(plan));
  EXPECT_NE(CanonicalPlanHash(plan), kNoPlanHash);
  // Other whitespace and key order (nlohmann sorts keys), and a field the reader ignores.
  nlohmann::json other = nlohmann::json::parse(canonical);
  other["comment"] = "written by hand";
  EXPECT_EQ(HashOf(other.dump()), HashOf(canonical));
  EXPECT_EQ(HashOf(other.dump(1)), HashOf(canonical));
}

TEST(PlanHashTest, AnyFieldTheRuntimeReadsChangesIt) {
  const Plan plan = testing::MakeTestPlan(3, 4096);
  Plan other = plan;
  other.runtime.prefetch_distance = 2;
  EXPECT_NE(CanonicalPlanHash(other), CanonicalPlanHash(plan));
  other = plan;
  other.layers[1].type = "attention+swiglu";
  EXPECT_NE(CanonicalPlanHash(other), CanonicalPlanHash(plan));
}

TEST(PlanHashTest, CApiChecksItsArgumentsAndThePlan) {
  uint64_t hash = 7;
  EXPECT_EQ(stowage_plan_hash(nullptr, 0, &hash), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_plan_hash("{}", 2, nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_plan_hash("{\"layers\": 3}", 13, &hash), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(stowage_last_error(), HasSubstr("stowage_plan_hash: "));
  EXPECT_EQ(hash, 7u);  // untouched on failure
}

TEST(PlanHashTest, RuntimeReportsTheHashOfItsPlan) {
  const std::string json = PlanToJson(testing::MakeTestPlan(2, 4096));
  stowage_options options;
  stowage_options_init(&options);
  options.backend = STOWAGE_BACKEND_HOST;
  options.copy_threads = 1;
  options.metrics_address = "";
  stowage_runtime* rt = nullptr;
  ASSERT_EQ(stowage_create(json.data(), json.size(), &options, &rt), STOWAGE_OK)
      << stowage_last_error();
  uint64_t hash = 0;
  EXPECT_EQ(stowage_get_plan_hash(rt, &hash), STOWAGE_OK);
  EXPECT_EQ(hash, HashOf(json));
  EXPECT_EQ(stowage_get_plan_hash(rt, nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_agree_nccl(rt, nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
  EXPECT_EQ(stowage_get_plan_hash(rt, &hash), STOWAGE_ERROR_INVALID_ARGUMENT);
}

TEST(PlanAgreementTest, OneValidPlanEverywhereAgrees) {
  EXPECT_TRUE(CheckPlanAgreement({5}).ok());
  EXPECT_TRUE(CheckPlanAgreement({5, 5, 5, 5}).ok());
  const uint64_t hashes[] = {9, 9};
  EXPECT_EQ(stowage_check_plan_agreement(hashes, 2), STOWAGE_OK);
  EXPECT_EQ(stowage_check_plan_agreement(nullptr, 2), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(CheckPlanAgreement({}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlanAgreementTest, MismatchNamesTheRanksThatDifferAndEveryHash) {
  const absl::Status status = CheckPlanAgreement({0xaa, 0xaa, 0xbb, 0xaa});
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "plan agreement failed over 4 ranks: rank 2 differs. Canonical plan hashes "
            "(stowage_plan_hash): ranks 0-1, 3: 0x00000000000000aa; rank 2: 0x00000000000000bb");
  // Through the C ABI: the same text, with the call's name.
  const uint64_t hashes[] = {0xaa, 0xaa, 0xbb, 0xaa};
  EXPECT_EQ(stowage_check_plan_agreement(hashes, 4), STOWAGE_ERROR_FAILED_PRECONDITION);
  EXPECT_EQ(std::string(stowage_last_error()),
            absl::StrCat("stowage_check_plan_agreement: ", status.message()));
}

TEST(PlanAgreementTest, ARankWithoutAValidPlanDiffers) {
  absl::Status status = CheckPlanAgreement({7, kNoPlanHash, 7});
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("rank 1 differs"));
  EXPECT_THAT(status.message(), HasSubstr("rank 1: no valid plan"));
  status = CheckPlanAgreement({kNoPlanHash, kNoPlanHash});
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("no rank holds a valid plan"));
  // A tie: the side rank 0 is on is the reference.
  status = CheckPlanAgreement({1, 2, 1, 2});
  EXPECT_THAT(status.message(), HasSubstr("ranks 1, 3 differ"));
}

TEST(PlanAgreementTest, RankListsAreCompact) {
  EXPECT_EQ(FormatRankList({0, 1, 2, 3, 5, 7, 8}), "0-3, 5, 7-8");
  EXPECT_EQ(FormatRankList({4}), "4");
  EXPECT_EQ(FormatRankList({}), "");
}

}  // namespace
}  // namespace stowage::runtime
