#include "planner/trainer_arguments.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace stowage::planner {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

Plan PlanOf(const std::vector<LayerPolicy>& policies, int tp = 1) {
  Plan plan;
  plan.model = "test";
  plan.seq_len = 131072;
  plan.tp = tp;
  plan.cp = 2;
  for (size_t i = 0; i < policies.size(); ++i) {
    LayerPlan l;
    l.index = static_cast<int>(i);
    l.policy = policies[i];
    if (l.policy == LayerPolicy::kSelectiveRecompute) l.recompute_modules = {"attn_core"};
    plan.layers.push_back(l);
  }
  return plan;
}

// The tokens after `flag` up to the next flag; empty when the flag is absent.
std::vector<std::string> ValuesOf(const TrainerArguments& a, const std::string& flag) {
  for (size_t i = 0; i < a.args.size(); ++i) {
    if (a.args[i] != flag) continue;
    std::vector<std::string> out;
    for (size_t j = i + 1; j < a.args.size() && a.args[j].rfind("--", 0) != 0; ++j) {
      out.push_back(a.args[j]);
    }
    return out;
  }
  return {};
}

bool HasFlag(const TrainerArguments& a, const std::string& flag) {
  return std::find(a.args.begin(), a.args.end(), flag) != a.args.end();
}

constexpr LayerPolicy kKeep = LayerPolicy::kKeep, kFull = LayerPolicy::kRecompute,
                      kSel = LayerPolicy::kSelectiveRecompute, kOffIn = LayerPolicy::kOffloadInput,
                      kOffSaved = LayerPolicy::kOffloadSaved;

TEST(MegatronArguments, ParallelSizesAndSequenceParallelWithTp) {
  const TrainerArguments a = MegatronArguments(PlanOf({kKeep, kKeep}, /*tp=*/4));
  EXPECT_THAT(ValuesOf(a, "--tensor-model-parallel-size"), ElementsAre("4"));
  EXPECT_TRUE(HasFlag(a, "--sequence-parallel"));
  EXPECT_THAT(ValuesOf(a, "--context-parallel-size"), ElementsAre("2"));
  EXPECT_FALSE(HasFlag(a, "--expert-model-parallel-size"));  // EP 1
  EXPECT_THAT(ValuesOf(a, "--seq-length"), ElementsAre("131072"));
  EXPECT_FALSE(HasFlag(a, "--recompute-granularity"));
  EXPECT_TRUE(a.exact());
  EXPECT_FALSE(HasFlag(MegatronArguments(PlanOf({kKeep})), "--sequence-parallel"));
}

TEST(MegatronArguments, FullRecomputeOfEveryLayerIsUniform) {
  const TrainerArguments a = MegatronArguments(PlanOf({kFull, kFull, kFull}));
  EXPECT_THAT(ValuesOf(a, "--recompute-granularity"), ElementsAre("full"));
  EXPECT_THAT(ValuesOf(a, "--recompute-method"), ElementsAre("uniform"));
  EXPECT_THAT(ValuesOf(a, "--recompute-num-layers"), ElementsAre("1"));
  EXPECT_THAT(a.notes, IsEmpty());
}

TEST(MegatronArguments, RecomputeOfTheFirstLayersIsBlockAndOtherSetsAreNearest) {
  const TrainerArguments prefix = MegatronArguments(PlanOf({kFull, kFull, kKeep, kKeep}));
  EXPECT_THAT(ValuesOf(prefix, "--recompute-method"), ElementsAre("block"));
  EXPECT_THAT(ValuesOf(prefix, "--recompute-num-layers"), ElementsAre("2"));
  EXPECT_TRUE(prefix.exact());
  const TrainerArguments later = MegatronArguments(PlanOf({kKeep, kKeep, kFull, kFull}));
  EXPECT_THAT(ValuesOf(later, "--recompute-num-layers"), ElementsAre("2"));
  ASSERT_EQ(later.notes.size(), 1u);
  EXPECT_THAT(later.notes[0], HasSubstr("recomputes layers 2-3"));
  EXPECT_THAT(later.notes[0], HasSubstr("recomputes layers 0-1 instead"));
}

TEST(MegatronArguments, OffloadInputIsRecomputeWithTheInputKeptAndSaysSo) {
  const TrainerArguments a = MegatronArguments(PlanOf({kOffIn, kOffIn, kOffIn}));
  EXPECT_THAT(ValuesOf(a, "--recompute-method"), ElementsAre("uniform"));
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_THAT(a.notes[0], HasSubstr("layers 0-2 offload their input"));
  EXPECT_THAT(a.notes[0], HasSubstr("peak is higher"));
}

TEST(MegatronArguments, SelectiveModulesInMegatronsWords) {
  const TrainerArguments all = MegatronArguments(PlanOf({kSel, kSel}));
  EXPECT_THAT(ValuesOf(all, "--recompute-granularity"), ElementsAre("selective"));
  EXPECT_THAT(ValuesOf(all, "--recompute-modules"), ElementsAre("core_attn"));
  EXPECT_TRUE(all.exact());
  const TrainerArguments some = MegatronArguments(PlanOf({kSel, kKeep, kSel}));
  ASSERT_EQ(some.notes.size(), 1u);
  EXPECT_THAT(some.notes[0], HasSubstr("layers 0 and 2 only"));
  Plan unmapped = PlanOf({kSel});
  unmapped.layers[0].recompute_modules = {"kda_conv"};
  const TrainerArguments none = MegatronArguments(unmapped);
  EXPECT_FALSE(HasFlag(none, "--recompute-granularity"));
  ASSERT_EQ(none.notes.size(), 1u);
  EXPECT_THAT(none.notes[0], HasSubstr("no selective recompute of kda_conv"));
}

TEST(MegatronArguments, MixedGranularityKeepsTheFullRecompute) {
  const TrainerArguments a = MegatronArguments(PlanOf({kFull, kSel}));
  EXPECT_THAT(ValuesOf(a, "--recompute-granularity"), ElementsAre("full"));
  EXPECT_FALSE(HasFlag(a, "--recompute-modules"));
  EXPECT_THAT(a.notes[0], HasSubstr("one recompute granularity per job"));
}

TEST(MegatronArguments, OffloadSavedPrefixIsCpuOffloadingOtherwiseNot) {
  const TrainerArguments prefix = MegatronArguments(PlanOf({kOffSaved, kOffSaved, kKeep}));
  EXPECT_THAT(ValuesOf(prefix, "--cpu-offloading-num-layers"), ElementsAre("2"));
  ASSERT_EQ(prefix.notes.size(), 1u);  // the copy schedule is Megatron's own
  EXPECT_THAT(prefix.notes[0], HasSubstr("own schedule"));
  // Megatron refuses CPU offloading with recompute, and of every layer.
  for (const Plan& plan :
       {PlanOf({kOffSaved, kFull}), PlanOf({kOffSaved, kOffSaved}), PlanOf({kKeep, kOffSaved})}) {
    const TrainerArguments a = MegatronArguments(plan);
    EXPECT_FALSE(HasFlag(a, "--cpu-offloading-num-layers"));
    EXPECT_THAT(a.notes.back(), HasSubstr("run them under the stowage runtime"));
  }
}

TEST(RenderMegatronArguments, OneFlagPerLineThenTheNotes) {
  const Plan plan = PlanOf({kKeep, kKeep, kFull, kFull});
  const std::string text = RenderMegatronArguments(plan, MegatronArguments(plan));
  EXPECT_THAT(text, HasSubstr("the nearest Megatron can run\n"));
  EXPECT_THAT(text, HasSubstr("--recompute-method block \\\n--recompute-num-layers 2\n"));
  EXPECT_THAT(text, HasSubstr("\n# not expressed: the plan recomputes layers 2-3"));
}

}  // namespace
}  // namespace stowage::planner
