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
  unmapped.layers[0].recompute_modules = {"ffn_act"};
  const TrainerArguments none = MegatronArguments(unmapped);
  EXPECT_FALSE(HasFlag(none, "--recompute-granularity"));
  ASSERT_EQ(none.notes.size(), 1u);
  EXPECT_THAT(none.notes[0], HasSubstr("no selective recompute of ffn_act"));
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

// The value of `section.key` in a torchtitan config; empty when absent.
std::string Toml(const TrainerConfig& c, const std::string& section, const std::string& key) {
  for (const TomlEntry& e : c.entries) {
    if (e.section == section && e.key == key) return e.value;
  }
  return "";
}

std::string Notes(const TrainerConfig& c) {
  std::string out;
  for (const std::string& n : c.notes) out += n + "\n";
  return out;
}

// Note [torchtitan expressiveness]: selective_ac_option "N" checkpoints layers N-1, 2N-1, ...
TEST(TorchtitanConfig, EveryNthLayerIsSelectiveWithThatN) {
  RunSettings run;
  run.gpus = 16;
  const TrainerConfig c = TorchtitanConfig(PlanOf({kKeep, kFull, kKeep, kFull, kKeep, kFull}), run);
  EXPECT_EQ(Toml(c, "activation_checkpoint", "mode"), "\"selective\"");
  EXPECT_EQ(Toml(c, "activation_checkpoint", "selective_ac_option"), "\"2\"");
  EXPECT_THAT(Notes(c), ::testing::Not(HasSubstr("recomputed too")));
  EXPECT_EQ(Toml(c, "parallelism", "data_parallel_shard_degree"), "8");  // 16 / CP 2
  EXPECT_EQ(Toml(c, "parallelism", "context_parallel_degree"), "2");
}

TEST(TorchtitanConfig, OtherRecomputeSetsTakeTheNearestSupersetAndSaySo) {
  RunSettings run;
  // Layer 3 alone: every 4th block (3 and 7) covers it.
  TrainerConfig c =
      TorchtitanConfig(PlanOf({kKeep, kKeep, kKeep, kFull, kKeep, kKeep, kKeep, kKeep}), run);
  EXPECT_EQ(Toml(c, "activation_checkpoint", "selective_ac_option"), "\"4\"");
  EXPECT_THAT(Notes(c), HasSubstr("so layer 7 is recomputed too"));
  // Layers 0 and 2: no N > 1 divides both 1 and 3, so every block.
  c = TorchtitanConfig(PlanOf({kFull, kKeep, kFull, kKeep}), run);
  EXPECT_EQ(Toml(c, "activation_checkpoint", "mode"), "\"full\"");
  EXPECT_THAT(Notes(c), HasSubstr("so layers 1 and 3 are recomputed too"));
  // Nothing recomputed, every layer recomputed.
  EXPECT_EQ(Toml(TorchtitanConfig(PlanOf({kKeep, kKeep}), run), "activation_checkpoint", "mode"),
            "\"none\"");
  EXPECT_EQ(Toml(TorchtitanConfig(PlanOf({kFull, kFull}), run), "activation_checkpoint", "mode"),
            "\"full\"");
}

TEST(TorchtitanConfig, OffloadAndModulesAreNotExpressed) {
  RunSettings run;
  run.sharding = Sharding::kOptim;
  const TrainerConfig c =
      TorchtitanConfig(PlanOf({LayerPolicy::kOffloadInput, LayerPolicy::kSelectiveRecompute,
                               LayerPolicy::kOffloadSaved, kKeep}),
                       run);
  const std::string notes = Notes(c);
  EXPECT_THAT(notes, HasSubstr("layer 0 offloads its input"));
  EXPECT_THAT(notes, HasSubstr("layer 1 recomputes only attn_core"));
  EXPECT_THAT(notes, HasSubstr("layer 2 offloads its saved activations"));
  EXPECT_THAT(notes, HasSubstr("--sharding optim: torchtitan shards with FSDP2"));
  // Layers 0 and 1 are checkpointed: every block (no N > 1 divides 1 and 2).
  EXPECT_EQ(Toml(c, "activation_checkpoint", "mode"), "\"full\"");
  const std::string text = RenderTorchtitanConfig(PlanOf({kKeep}), c);
  EXPECT_THAT(text, HasSubstr("[parallelism]\ndata_parallel_replicate_degree = 1\n"));
  EXPECT_THAT(text, HasSubstr("\n\n[training]\nseq_len = 131072\n"));
  EXPECT_THAT(text, HasSubstr("# not expressed: layer 0 offloads"));
}

TEST(TorchtitanConfig, NoShardReplicatesAndCpStillShards) {
  RunSettings run;
  run.gpus = 8;
  run.sharding = Sharding::kNoShard;
  const TrainerConfig c = TorchtitanConfig(PlanOf({kKeep}), run);
  EXPECT_EQ(Toml(c, "parallelism", "data_parallel_replicate_degree"), "4");
  EXPECT_EQ(Toml(c, "parallelism", "data_parallel_shard_degree"), "1");
  EXPECT_THAT(Notes(c), HasSubstr("applies FSDP over the CP ranks"));
}

}  // namespace
}  // namespace stowage::planner
