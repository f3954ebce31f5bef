// The emitters (bridges/megatron_emit.h, bridges/torchtitan_emit.h): a plan as Megatron-LM
// arguments and as torchtitan job config sections.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bridges/megatron_emit.h"
#include "bridges/torchtitan_emit.h"

namespace stowage::bridges {
namespace {

using planner::RunSettings;
using planner::Sharding;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

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
std::vector<std::string> ValuesOf(const MegatronArguments& a, const std::string& flag) {
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

bool HasFlag(const MegatronArguments& a, const std::string& flag) {
  return std::find(a.args.begin(), a.args.end(), flag) != a.args.end();
}

// Plans without pipeline parallelism are never refused.
MegatronArguments Megatron(const Plan& plan) {
  absl::StatusOr<MegatronArguments> a = EmitMegatronArguments(plan, RunSettings{});
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *a : MegatronArguments{};
}
TorchtitanJobToml Titan(const Plan& plan, const RunSettings& run) {
  absl::StatusOr<TorchtitanJobToml> c = EmitTorchtitanJob(plan, run);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : TorchtitanJobToml{};
}

constexpr LayerPolicy kKeep = LayerPolicy::kKeep, kFull = LayerPolicy::kRecompute,
                      kSel = LayerPolicy::kSelectiveRecompute, kOffIn = LayerPolicy::kOffloadInput,
                      kOffSaved = LayerPolicy::kOffloadSaved;

TEST(MegatronArguments, ParallelSizesAndSequenceParallelWithTp) {
  const MegatronArguments a = Megatron(PlanOf({kKeep, kKeep}, /*tp=*/4));
  EXPECT_THAT(ValuesOf(a, "--tensor-model-parallel-size"), ElementsAre("4"));
  EXPECT_TRUE(HasFlag(a, "--sequence-parallel"));
  EXPECT_THAT(ValuesOf(a, "--context-parallel-size"), ElementsAre("2"));
  EXPECT_FALSE(HasFlag(a, "--expert-model-parallel-size"));  // EP 1
  EXPECT_THAT(ValuesOf(a, "--seq-length"), ElementsAre("131072"));
  EXPECT_FALSE(HasFlag(a, "--recompute-granularity"));
  EXPECT_TRUE(a.exact());
  EXPECT_FALSE(HasFlag(Megatron(PlanOf({kKeep})), "--sequence-parallel"));
  // A plan without sequence parallelism (run.sequence_parallel false): TP alone, as Megatron-LM
  // runs it by default.
  Plan no_sp = PlanOf({kKeep, kKeep}, /*tp=*/4);
  no_sp.sequence_parallel = false;
  const MegatronArguments b = Megatron(no_sp);
  EXPECT_THAT(ValuesOf(b, "--tensor-model-parallel-size"), ElementsAre("4"));
  EXPECT_FALSE(HasFlag(b, "--sequence-parallel"));
}

TEST(MegatronArguments, FullRecomputeOfEveryLayerIsUniform) {
  const MegatronArguments a = Megatron(PlanOf({kFull, kFull, kFull}));
  EXPECT_THAT(ValuesOf(a, "--recompute-granularity"), ElementsAre("full"));
  EXPECT_THAT(ValuesOf(a, "--recompute-method"), ElementsAre("uniform"));
  EXPECT_THAT(ValuesOf(a, "--recompute-num-layers"), ElementsAre("1"));
  EXPECT_THAT(a.notes, IsEmpty());
}

TEST(MegatronArguments, RecomputeOfTheFirstLayersIsBlockAndOtherSetsAreNearest) {
  const MegatronArguments prefix = Megatron(PlanOf({kFull, kFull, kKeep, kKeep}));
  EXPECT_THAT(ValuesOf(prefix, "--recompute-method"), ElementsAre("block"));
  EXPECT_THAT(ValuesOf(prefix, "--recompute-num-layers"), ElementsAre("2"));
  EXPECT_TRUE(prefix.exact());
  const MegatronArguments later = Megatron(PlanOf({kKeep, kKeep, kFull, kFull}));
  EXPECT_THAT(ValuesOf(later, "--recompute-num-layers"), ElementsAre("2"));
  ASSERT_EQ(later.notes.size(), 1u);
  EXPECT_THAT(later.notes[0], HasSubstr("recomputes layers 2-3"));
  EXPECT_THAT(later.notes[0], HasSubstr("recomputes layers 0-1 instead"));
}

TEST(MegatronArguments, OffloadInputIsRecomputeWithTheInputKeptAndSaysSo) {
  const MegatronArguments a = Megatron(PlanOf({kOffIn, kOffIn, kOffIn}));
  EXPECT_THAT(ValuesOf(a, "--recompute-method"), ElementsAre("uniform"));
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_THAT(a.notes[0], HasSubstr("layers 0-2 offload their input"));
  EXPECT_THAT(a.notes[0], HasSubstr("peak is higher"));
}

TEST(MegatronArguments, SelectiveModulesInMegatronsWords) {
  const MegatronArguments all = Megatron(PlanOf({kSel, kSel}));
  EXPECT_THAT(ValuesOf(all, "--recompute-granularity"), ElementsAre("selective"));
  EXPECT_THAT(ValuesOf(all, "--recompute-modules"), ElementsAre("core_attn"));
  EXPECT_TRUE(all.exact());
  const MegatronArguments some = Megatron(PlanOf({kSel, kKeep, kSel}));
  ASSERT_EQ(some.notes.size(), 1u);
  EXPECT_THAT(some.notes[0], HasSubstr("layers 0 and 2 only"));
  Plan unmapped = PlanOf({kSel});
  unmapped.layers[0].recompute_modules = {"ffn_act"};
  const MegatronArguments none = Megatron(unmapped);
  EXPECT_FALSE(HasFlag(none, "--recompute-granularity"));
  ASSERT_EQ(none.notes.size(), 1u);
  EXPECT_THAT(none.notes[0], HasSubstr("no selective recompute of ffn_act"));
}

TEST(MegatronArguments, MixedGranularityKeepsTheFullRecompute) {
  const MegatronArguments a = Megatron(PlanOf({kFull, kSel}));
  EXPECT_THAT(ValuesOf(a, "--recompute-granularity"), ElementsAre("full"));
  EXPECT_FALSE(HasFlag(a, "--recompute-modules"));
  EXPECT_THAT(a.notes[0], HasSubstr("one recompute granularity per job"));
}

TEST(MegatronArguments, OffloadSavedPrefixIsCpuOffloadingOtherwiseNot) {
  const MegatronArguments prefix = Megatron(PlanOf({kOffSaved, kOffSaved, kKeep}));
  EXPECT_THAT(ValuesOf(prefix, "--cpu-offloading-num-layers"), ElementsAre("2"));
  ASSERT_EQ(prefix.notes.size(), 1u);  // the copy schedule is Megatron's own
  EXPECT_THAT(prefix.notes[0], HasSubstr("own schedule"));
  // Megatron refuses CPU offloading with recompute, and of every layer.
  // The note agrees in number with the layers it names.
  struct Case {
    Plan plan;
    const char* offloads;
    const char* run;
  };
  for (const Case& c : {Case{PlanOf({kOffSaved, kFull}), "layer 0 offloads its", "run it"},
                        Case{PlanOf({kOffSaved, kOffSaved}), "offload their", "run them"},
                        Case{PlanOf({kKeep, kOffSaved}), "layer 1 offloads its", "run it"}}) {
    const MegatronArguments a = Megatron(c.plan);
    EXPECT_FALSE(HasFlag(a, "--cpu-offloading-num-layers"));
    EXPECT_THAT(a.notes.back(), HasSubstr(c.offloads));
    EXPECT_THAT(a.notes.back(), HasSubstr(absl::StrCat(c.run,
                                                       " under the stowage runtime "
                                                       "(stowage.megatron.wrap(model, plan))")));
  }
}

TEST(RenderMegatronArguments, OneFlagPerLineThenTheNotes) {
  const Plan plan = PlanOf({kKeep, kKeep, kFull, kFull});
  const std::string text = RenderMegatronArguments(plan, Megatron(plan));
  EXPECT_THAT(text, HasSubstr("the nearest Megatron can run\n"));
  EXPECT_THAT(text, HasSubstr("--recompute-method block \\\n--recompute-num-layers 2\n"));
  EXPECT_THAT(text, HasSubstr("\n# not expressed: the plan recomputes layers 2-3"));
  // The last line names what runs the plan as it is: the Python module stowage.megatron.
  EXPECT_THAT(text, EndsWith("with the Python module stowage.megatron: "
                             "stowage.megatron.wrap(model, plan) runs each TransformerLayer under "
                             "its own policy (write the plan with --out; leave out the recompute "
                             "and CPU-offloading arguments above)\n"));
  // A plan Megatron expresses exactly has no such line.
  const Plan exact = PlanOf({kFull, kFull, kKeep, kKeep});
  EXPECT_THAT(RenderMegatronArguments(exact, Megatron(exact)),
              ::testing::Not(HasSubstr("stowage.megatron")));
}

// The value of `section.key` in a torchtitan config; empty when absent.
std::string Toml(const TorchtitanJobToml& c, const std::string& section, const std::string& key) {
  for (const TomlEntry& e : c.entries) {
    if (e.section == section && e.key == key) return e.value;
  }
  return "";
}

std::string Notes(const TorchtitanJobToml& c) {
  std::string out;
  for (const std::string& n : c.notes) out += n + "\n";
  return out;
}

// Note [torchtitan expressiveness]: selective_ac_option "N" checkpoints layers N-1, 2N-1, ...
TEST(TorchtitanJobToml, EveryNthLayerIsSelectiveWithThatN) {
  RunSettings run;
  run.gpus = 16;
  const TorchtitanJobToml c = Titan(PlanOf({kKeep, kFull, kKeep, kFull, kKeep, kFull}), run);
  EXPECT_EQ(Toml(c, "activation_checkpoint", "mode"), "\"selective\"");
  EXPECT_EQ(Toml(c, "activation_checkpoint", "selective_ac_option"), "\"2\"");
  EXPECT_THAT(Notes(c), ::testing::Not(HasSubstr("recomputed too")));
  EXPECT_EQ(Toml(c, "parallelism", "data_parallel_shard_degree"), "8");  // 16 / CP 2
  EXPECT_EQ(Toml(c, "parallelism", "context_parallel_degree"), "2");
}

TEST(TorchtitanJobToml, OtherRecomputeSetsTakeTheNearestSupersetAndSaySo) {
  RunSettings run;
  // Layer 3 alone: every 4th block (3 and 7) covers it.
  TorchtitanJobToml c =
      Titan(PlanOf({kKeep, kKeep, kKeep, kFull, kKeep, kKeep, kKeep, kKeep}), run);
  EXPECT_EQ(Toml(c, "activation_checkpoint", "selective_ac_option"), "\"4\"");
  EXPECT_THAT(Notes(c), HasSubstr("so layer 7 is recomputed too"));
  // Layers 0 and 2: no N > 1 divides both 1 and 3, so every block.
  c = Titan(PlanOf({kFull, kKeep, kFull, kKeep}), run);
  EXPECT_EQ(Toml(c, "activation_checkpoint", "mode"), "\"full\"");
  EXPECT_THAT(Notes(c), HasSubstr("so layers 1 and 3 are recomputed too"));
  // Nothing recomputed, every layer recomputed.
  EXPECT_EQ(Toml(Titan(PlanOf({kKeep, kKeep}), run), "activation_checkpoint", "mode"), "\"none\"");
  EXPECT_EQ(Toml(Titan(PlanOf({kFull, kFull}), run), "activation_checkpoint", "mode"), "\"full\"");
}

TEST(TorchtitanJobToml, OffloadAndModulesAreNotExpressed) {
  RunSettings run;
  run.sharding = Sharding::kOptim;
  const TorchtitanJobToml c =
      Titan(PlanOf({LayerPolicy::kOffloadInput, LayerPolicy::kSelectiveRecompute,
                    LayerPolicy::kOffloadSaved, kKeep}),
            run);
  const std::string notes = Notes(c);
  EXPECT_THAT(notes, HasSubstr("layer 0 offloads its input"));
  EXPECT_THAT(notes, HasSubstr("layer 1 recomputes only attn_core"));
  EXPECT_THAT(notes, HasSubstr("layer 2 offloads its saved activations"));
  EXPECT_THAT(notes, HasSubstr("--sharding optim: torchtitan shards with FSDP2"));
  // Layers 0 and 1 are checkpointed: every block (no N > 1 divides 1 and 2).
  EXPECT_EQ(Toml(c, "activation_checkpoint", "mode"), "\"full\"");
  const std::string text = RenderTorchtitanJob(PlanOf({kKeep}), c);
  EXPECT_THAT(text, HasSubstr("[parallelism]\ndata_parallel_replicate_degree = 1\n"));
  EXPECT_THAT(text, HasSubstr("\n\n[training]\nseq_len = 131072\n"));
  EXPECT_THAT(text, HasSubstr("# not expressed: layer 0 offloads"));
}

TEST(TorchtitanJobToml, NoShardReplicatesAndCpStillShards) {
  RunSettings run;
  run.gpus = 8;
  run.sharding = Sharding::kNoShard;
  const TorchtitanJobToml c = Titan(PlanOf({kKeep}), run);
  EXPECT_EQ(Toml(c, "parallelism", "data_parallel_replicate_degree"), "4");
  EXPECT_EQ(Toml(c, "parallelism", "data_parallel_shard_degree"), "1");
  EXPECT_THAT(Notes(c), HasSubstr("applies FSDP over the CP ranks"));
}

// torchtitan's TP plans always split the norms over TP: a plan without it says so.
TEST(TorchtitanJobToml, APlanWithoutSequenceParallelismSaysTorchtitanHasIt) {
  RunSettings run;
  run.gpus = 8;
  Plan plan = PlanOf({kKeep}, /*tp=*/2);
  EXPECT_THAT(Notes(Titan(plan, run)), Not(HasSubstr("sequence parallelism")));
  plan.sequence_parallel = false;
  EXPECT_THAT(Notes(Titan(plan, run)), HasSubstr("TP without sequence parallelism"));
}

// A pipelined plan: `layout` layers per virtual stage (v = chunk x pp + stage), the policies of
// every layer in order; CP 2, TP 1 as PlanOf.
Plan PipelinedPlanOf(const std::vector<LayerPolicy>& policies, int pp, int vpp,
                     const std::vector<int>& layout, int microbatches = 1) {
  Plan plan = PlanOf(policies);
  plan.pp = pp;
  plan.vpp = vpp;
  plan.schedule = vpp > 1 ? PipelineSchedule::kInterleaved : PipelineSchedule::k1F1B;
  plan.microbatches = microbatches;
  plan.stages.resize(pp);
  int first = 0;
  for (size_t v = 0; v < layout.size(); ++v) {
    StagePlan& stage = plan.stages[v % pp];
    stage.stage = static_cast<int>(v % pp);
    stage.chunks.push_back({first, layout[v]});
    first += layout[v];
  }
  plan.stages.front().embedding = true;
  plan.stages.back().lm_head = true;
  return plan;
}

std::string Refusal(const absl::Status& s) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

// Note [Megatron under pipeline parallelism]: block K recomputes the first K layers of each
// stage's chunk; the even split needs only the stage count; the microbatches are the global batch.
TEST(MegatronUnderPipeline, TheSameFirstLayersOfEveryStageAreBlockRecompute) {
  RunSettings run;
  run.gpus = 16;  // TP 1 x CP 2 x PP 2: data parallel 4
  const Plan plan = PipelinedPlanOf({kFull, kFull, kKeep, kKeep, kFull, kFull, kKeep, kKeep}, 2, 1,
                                    {4, 4}, /*microbatches=*/8);
  absl::StatusOr<MegatronArguments> a = EmitMegatronArguments(plan, run);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->args, ElementsAre("--tensor-model-parallel-size", "1", "--context-parallel-size",
                                   "2", "--seq-length", "131072", "--micro-batch-size", "1",
                                   "--pipeline-model-parallel-size", "2", "--global-batch-size",
                                   "32", "--recompute-granularity", "full", "--recompute-method",
                                   "block", "--recompute-num-layers", "2"));
  EXPECT_TRUE(a->exact());
  // A chunk shorter than K recomputes all of its layers under block K.
  const Plan uneven =
      PipelinedPlanOf({kFull, kFull, kFull, kFull, kKeep, kFull, kFull, kFull}, 2, 1, {5, 3});
  a = EmitMegatronArguments(uneven, run);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(ValuesOf(*a, "--recompute-num-layers"), ElementsAre("4"));
  // Not Megatron's even split: the layout, embedding first and loss last.
  EXPECT_THAT(ValuesOf(*a, "--pipeline-model-parallel-layout"), ElementsAre("E,t*5|t*3,L"));
  EXPECT_THAT(RenderMegatronArguments(uneven, *a),
              HasSubstr("--pipeline-model-parallel-layout 'E,t*5|t*3,L' \\\n"));
}

TEST(MegatronUnderPipeline, VirtualStagesAreTheEvenSplitOrTheLayout) {
  RunSettings run;
  const std::vector<LayerPolicy> all(8, kFull);
  absl::StatusOr<MegatronArguments> a =
      EmitMegatronArguments(PipelinedPlanOf(all, 2, 2, {2, 2, 2, 2}, 4), run);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(ValuesOf(*a, "--num-virtual-stages-per-pipeline-rank"), ElementsAre("2"));
  EXPECT_THAT(ValuesOf(*a, "--recompute-method"), ElementsAre("uniform"));
  EXPECT_THAT(ValuesOf(*a, "--global-batch-size"), ElementsAre("64"));  // 1 x 4 x 64/(2 x 2)
  EXPECT_FALSE(HasFlag(*a, "--pipeline-model-parallel-layout"));
  Plan mtp = PipelinedPlanOf(std::vector<LayerPolicy>(9, kFull), 2, 2, {1, 2, 2, 4});
  mtp.mtp_layers = 1;  // the last chunk's last layer is mtp.0
  a = EmitMegatronArguments(mtp, run);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(ValuesOf(*a, "--pipeline-model-parallel-layout"), ElementsAre("E,t|t*2|t*2|t*3,m,L"));
  EXPECT_FALSE(HasFlag(*a, "--num-virtual-stages-per-pipeline-rank"));
}

TEST(MegatronUnderPipeline, SelectiveModulesOnEveryLayerAndOffloadNotes) {
  RunSettings run;
  absl::StatusOr<MegatronArguments> a =
      EmitMegatronArguments(PipelinedPlanOf({kSel, kSel, kSel, kSel}, 2, 1, {2, 2}), run);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(ValuesOf(*a, "--recompute-granularity"), ElementsAre("selective"));
  EXPECT_THAT(ValuesOf(*a, "--recompute-modules"), ElementsAre("core_attn"));
  // offload_input is recomputed with its input kept (noted); offload_saved kept (noted).
  a = EmitMegatronArguments(PipelinedPlanOf({kOffIn, kOffSaved, kOffIn, kOffSaved}, 2, 1, {2, 2}),
                            run);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(ValuesOf(*a, "--recompute-num-layers"), ElementsAre("1"));
  EXPECT_THAT(ValuesOf(*a, "--recompute-method"), ElementsAre("block"));
  ASSERT_EQ(a->notes.size(), 2u);
  EXPECT_THAT(a->notes[0], HasSubstr("layers 0 and 2 offload their input"));
  EXPECT_THAT(a->notes[1], HasSubstr("layers 1 and 3 offload their saved activations"));
  EXPECT_THAT(a->notes[1], HasSubstr("refuses its CPU offloading (--cpu-offloading-num-layers) "
                                     "with pipeline parallelism"));
}

// What no one setting expresses is refused, naming the stage and the layer.
TEST(MegatronUnderPipeline, StagesThatNeedDifferentSettingsAreRefusedNamingTheLayer) {
  RunSettings run;
  // Stage 0 recomputes its first 2 layers, stage 1 only its first.
  std::string why = Refusal(
      EmitMegatronArguments(
          PipelinedPlanOf({kFull, kFull, kKeep, kKeep, kFull, kKeep, kKeep, kKeep}, 2, 1, {4, 4}),
          run)
          .status());
  EXPECT_THAT(why, HasSubstr("--emit megatron cannot express this pipelined plan: stage 1's "
                             "layer 5 (of its layers 4-7) is not recomputed, while stage 0's layer "
                             "0 (of its layers 0-3) starts a chunk whose first 2 layers alone the "
                             "plan recomputes, and --recompute-method block recomputes the same "
                             "first layers of every chunk"));
  EXPECT_THAT(why, HasSubstr("Run this plan under the stowage runtime inside Megatron-Core: "
                             "stowage.megatron.wrap(model, plan) runs each TransformerLayer under "
                             "its own policy (write the plan with --out)"));
  // A recomputed layer after a kept one in its chunk.
  why = Refusal(
      EmitMegatronArguments(PipelinedPlanOf({kKeep, kFull, kKeep, kFull}, 2, 2, {1, 1, 1, 1}), run)
          .status());
  EXPECT_THAT(why, HasSubstr("stage 1's layer 1 (of its chunk 0: layer 1) is recomputed, while "
                             "stage 0's layer 0 (of its chunk 0: layer 0) starts a chunk the plan "
                             "recomputes none of"));
  why = Refusal(
      EmitMegatronArguments(PipelinedPlanOf({kKeep, kFull, kKeep, kKeep}, 2, 1, {2, 2}), run)
          .status());
  EXPECT_THAT(why, HasSubstr("stage 0's layer 1 (of its layers 0-1) is recomputed after layer 0, "
                             "which is not"));
  // Two granularities; selective on some layers only.
  why =
      Refusal(EmitMegatronArguments(PipelinedPlanOf({kFull, kKeep, kSel, kKeep}, 2, 1, {2, 2}), run)
                  .status());
  EXPECT_THAT(why,
              HasSubstr("stage 1's layer 2 (of its layers 2-3) recomputes attn_core "
                        "selectively while stage 0's layer 0 (of its layers 0-1) recomputes in "
                        "full"));
  why = Refusal(EmitMegatronArguments(PipelinedPlanOf({kSel, kSel, kSel, kKeep}, 2, 1, {2, 2}), run)
                    .status());
  EXPECT_THAT(why, HasSubstr("stage 1's layer 3 (of its layers 2-3) is not recomputed "
                             "selectively while stage 0's layer 0 (of its layers 0-1) recomputes "
                             "attn_core selectively"));
}

// Note [torchtitan under pipeline parallelism]: selective_ac_option counts each rank's own
// blocks, so with 3 + 5 layers "2" checkpoints layer 1 of stage 0 and layers 4 and 6 of stage 1.
TEST(TorchtitanUnderPipeline, EveryNthBlockOfEachRankIsSelective) {
  RunSettings run;
  run.gpus = 16;
  absl::StatusOr<TorchtitanJobToml> c = EmitTorchtitanJob(
      PipelinedPlanOf({kKeep, kFull, kKeep, kKeep, kFull, kKeep, kFull, kKeep}, 2, 1, {3, 5}, 8),
      run);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Toml(*c, "activation_checkpoint", "mode"), "\"selective\"");
  EXPECT_EQ(Toml(*c, "activation_checkpoint", "selective_ac_option"), "\"2\"");
  EXPECT_EQ(Toml(*c, "parallelism", "pipeline_parallel_degree"), "2");
  EXPECT_EQ(Toml(*c, "parallelism", "pipeline_parallel_schedule"), "\"1F1B\"");
  EXPECT_EQ(Toml(*c, "parallelism", "pipeline_parallel_microbatch_size"), "1");
  EXPECT_EQ(Toml(*c, "parallelism", "module_fqns_per_model_part"),
            "[[\"tok_embeddings\", \"layers.0\", \"layers.1\", \"layers.2\"], [\"layers.3\", "
            "\"layers.4\", \"layers.5\", \"layers.6\", \"layers.7\", \"norm\", \"output\"]]");
  EXPECT_EQ(Toml(*c, "parallelism", "data_parallel_shard_degree"), "4");  // 16 / (CP 2 x PP 2)
  EXPECT_EQ(Toml(*c, "training", "local_batch_size"), "8");               // 8 microbatches of 1
  EXPECT_EQ(Toml(*c, "training", "global_batch_size"), "");
  EXPECT_THAT(Notes(*c), ::testing::Not(HasSubstr("recomputed too")));
  // Interleaved: a rank counts over its chunks in order (stage 0: layers 0, 1, 4, 5).
  c = EmitTorchtitanJob(PipelinedPlanOf({kKeep, kFull, kKeep, kFull, kKeep, kFull, kKeep, kFull}, 2,
                                        2, {2, 2, 2, 2}, 4),
                        run);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Toml(*c, "parallelism", "pipeline_parallel_schedule"), "\"Interleaved1F1B\"");
  EXPECT_EQ(Toml(*c, "activation_checkpoint", "selective_ac_option"), "\"2\"");
  EXPECT_THAT(Toml(*c, "parallelism", "module_fqns_per_model_part"),
              HasSubstr("[\"tok_embeddings\", \"layers.0\", \"layers.1\"], [\"layers.2\", "
                        "\"layers.3\"], [\"layers.4\", \"layers.5\"], [\"layers.6\", \"layers.7\", "
                        "\"norm\", \"output\"]]"));
}

TEST(TorchtitanUnderPipeline, APatternByLayerIdIsRefusedNamingTheLayer) {
  RunSettings run;
  // Every 2nd layer by model id: stage 1 (layers 3-7) would need its blocks 1, 3, 5.
  const absl::Status s =
      EmitTorchtitanJob(
          PipelinedPlanOf({kKeep, kFull, kKeep, kFull, kKeep, kFull, kKeep, kFull}, 2, 1, {3, 5}),
          run)
          .status();
  EXPECT_THAT(Refusal(s),
              HasSubstr("--emit torchtitan cannot express this pipelined plan: stage 1's layer 3 "
                        "(of its layers 3-7), its rank's block 1, is recomputed, where "
                        "selective_ac_option \"2\" (stage 0 recomputes its block 2 first) does "
                        "not checkpoint it"));
  EXPECT_THAT(Refusal(s), HasSubstr("Run this plan under the stowage runtime"));
}

// Several microbatches without pipeline parallelism are gradient accumulation.
TEST(BothEmitters, GradientAccumulationIsTheGlobalBatch) {
  RunSettings run;
  run.gpus = 8;  // CP 2: data parallel 4
  Plan plan = PlanOf({kKeep, kKeep});
  plan.microbatches = 4;
  absl::StatusOr<MegatronArguments> a = EmitMegatronArguments(plan, run);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(ValuesOf(*a, "--global-batch-size"), ElementsAre("16"));  // 1 x 4 x 4
  EXPECT_FALSE(HasFlag(*a, "--pipeline-model-parallel-size"));
  const TorchtitanJobToml c = Titan(plan, run);
  EXPECT_EQ(Toml(c, "training", "local_batch_size"), "1");
  EXPECT_EQ(Toml(c, "training", "global_batch_size"), "16");
  EXPECT_EQ(Toml(c, "parallelism", "pipeline_parallel_schedule"), "");
}

}  // namespace
}  // namespace stowage::bridges
