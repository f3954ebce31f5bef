// The Megatron-LM reader (bridges/megatron_read.h): launch arguments and YAML configs, and the
// pipeline split as Megatron derives it.
#include "bridges/megatron_read.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace stowage::bridges {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

TEST(ReadMegatronSettings, ArgumentListOfALaunchScript) {
  const auto s = ReadMegatronSettings(
      "# pretrain\n"
      "torchrun --nproc_per_node 8 pretrain_gpt.py \\\n"
      "  --num-layers 32 --tensor-model-parallel-size 4 --context-parallel-size=2 \\\n"
      "  --expert-model-parallel-size '8' --seq-length 131072 --micro-batch-size 1 \\\n"
      "  --use-distributed-optimizer --optimizer sgd --optimizer-cpu-offload \\\n"
      "  --recompute-granularity full --bf16\n",
      "train.sh");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->flags,
              UnorderedElementsAre(Pair("tp", "4"), Pair("cp", "2"), Pair("ep", "8"),
                                   Pair("seq-len", "131072"), Pair("micro-batch", "1"),
                                   Pair("optimizer", "sgd"), Pair("optimizer-offload", "true"),
                                   Pair("sharding", "optim"), Pair("mtp-layers", "0"),
                                   Pair("gpus", "8"), Pair("no-sequence-parallel", "true")));
  ASSERT_EQ(s->notes.size(), 2u);
  EXPECT_THAT(s->notes[0], HasSubstr("--recompute-granularity full"));
  EXPECT_THAT(s->notes[1], HasSubstr("--num-layers"));
  EXPECT_THAT(s->job,
              Contains(HasSubstr("precision bf16; distributed optimizer; TP 4 without sequence "
                                 "parallelism; micro-batch 1")));
}

// Megatron-LM's own arguments the planner does not use, and arguments Megatron-LM does not have
// (a fork's, a typo), are named apart; neither is an error. '_' reads as '-', as in YAML keys.
TEST(ReadMegatronSettings, ArgumentsMegatronLmDoesNotHaveAreNamedApart) {
  const auto s = ReadMegatronSettings(
      "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --seq-length 4096 \\\n"
      "  --rotary-base 500000 --my-fork-fused-router --override-opt-param-scheduler \\\n"
      "  --lr-decay-stlye cosine\n",
      "train.sh");
  ASSERT_TRUE(s.ok()) << s.status();
  std::string unknown, unused;
  for (const std::string& note : s->notes) {
    if (note.rfind("unknown to Megatron-LM", 0) == 0) unknown = note;
    if (note.rfind("not used from", 0) == 0) unused = note;
  }
  EXPECT_THAT(unknown, HasSubstr("train.sh: --my-fork-fused-router, --lr-decay-stlye"));
  EXPECT_THAT(unused, HasSubstr("--rotary-base"));
  EXPECT_THAT(unused, HasSubstr("--override-opt-param-scheduler"));
  EXPECT_THAT(unused, Not(HasSubstr("--my-fork-fused-router")));
  EXPECT_THAT(unknown, Not(HasSubstr("--rotary-base")));
}

TEST(ReadMegatronSettings, YamlConfigAtAnyNesting) {
  const auto s = ReadMegatronSettings(
      "model_parallel:\n"
      "  tensor_model_parallel_size: 2   # TP\n"
      "  sequence_parallel: true\n"
      "seq_length: \"32768\"\n"
      "use_distributed_optimizer: false\n"
      "data_parallel_sharding_strategy: optim_grads_params\n",
      "cfg.yaml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->flags, UnorderedElementsAre(Pair("tp", "2"), Pair("seq-len", "32768"),
                                             Pair("sharding", "optim_grads_params"),
                                             Pair("mtp-layers", "0")));
}

// Megatron-LM's --sequence-parallel is a switch, off unless given (arguments.py): without it the
// job is planned with --no-sequence-parallel (moot with TP 1), with it as the planner's default.
TEST(ReadMegatronSettings, SequenceParallelOnlyWhenTheScriptSaysSo) {
  const auto without = ReadMegatronSettings(
      "torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 8\n", "tp8.sh");
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_THAT(without->flags, Contains(Pair("no-sequence-parallel", "true")));
  EXPECT_THAT(without->origins.at("no-sequence-parallel"),
              HasSubstr("tp8.sh:1: no --sequence-parallel (Megatron-LM's default: off)"));
  const auto with = ReadMegatronSettings(
      "torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 8 \\\n"
      "  --sequence-parallel --seq-length 4096\n",
      "sp.sh");
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_THAT(with->flags, Not(Contains(Pair("no-sequence-parallel", ::testing::_))));
  EXPECT_THAT(with->flags, Contains(Pair("seq-len", "4096")));  // not taken as its value
  EXPECT_THAT(with->job, Contains(HasSubstr("; TP 8 with sequence parallelism;")));
  // Used, so not among the arguments the planner does not use.
  for (const std::string& note : with->notes) {
    EXPECT_THAT(note, Not(HasSubstr("--sequence-parallel"))) << note;
  }
  const auto yaml_off =
      ReadMegatronSettings("tensor_model_parallel_size: 2\nsequence_parallel: false\n", "c.yaml");
  ASSERT_TRUE(yaml_off.ok()) << yaml_off.status();
  EXPECT_THAT(yaml_off->flags, Contains(Pair("no-sequence-parallel", "true")));
  EXPECT_THAT(yaml_off->job, Contains(HasSubstr("; TP 2 without sequence parallelism;")));
}

// Megatron's --use-tp-pp-dp-mapping is its rank order tp-cp-ep-pp-dp (initialize.py).
TEST(ReadMegatronSettings, TpPpDpMappingIsTheRankOrder) {
  const auto s =
      ReadMegatronSettings("--pipeline-model-parallel-size 2 --use-tp-pp-dp-mapping", "a");
  ASSERT_TRUE(s.ok()) << s.status();
  // Without --use-distributed-optimizer: Megatron's no_shard.
  EXPECT_THAT(s->flags, UnorderedElementsAre(Pair("pp", "2"), Pair("rank-order", "tp-cp-ep-pp-dp"),
                                             Pair("mtp-layers", "0"), Pair("sharding", "no_shard"),
                                             Pair("no-sequence-parallel", "true")));
  const auto yaml = ReadMegatronSettings("use_tp_pp_dp_mapping: true\n", "cfg.yaml");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_THAT(yaml->flags, UnorderedElementsAre(
                               Pair("rank-order", "tp-cp-ep-pp-dp"), Pair("mtp-layers", "0"),
                               Pair("sharding", "no_shard"), Pair("no-sequence-parallel", "true")));
}

// Megatron-LM trains MTP only with --mtp-num-layers (default None): without it the plan trains
// none, whatever the checkpoint's num_nextn_predict_layers (Note [MTP layers]).
TEST(ReadMegatronSettings, MtpNumLayersOrNone) {
  const auto given = ReadMegatronSettings("--mtp-num-layers 1 --mtp-loss-scaling-factor 0.1", "a");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_THAT(given->flags, Contains(Pair("mtp-layers", "1")));
  const auto yaml = ReadMegatronSettings("model:\n  mtp_num_layers: 2\n", "cfg.yaml");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_THAT(yaml->flags, Contains(Pair("mtp-layers", "2")));
  const auto absent = ReadMegatronSettings("--tensor-model-parallel-size 2", "a");
  ASSERT_TRUE(absent.ok());
  EXPECT_THAT(absent->flags, Contains(Pair("mtp-layers", "0")));
}

TEST(ReadMegatronSettings, AnExplicitShardingStrategyWinsOverTheDistributedOptimizer) {
  const auto s = ReadMegatronSettings(
      "--use-distributed-optimizer --data-parallel-sharding-strategy optim_grads", "a");
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(s->flags,
              UnorderedElementsAre(Pair("sharding", "optim_grads"), Pair("mtp-layers", "0"),
                                   Pair("no-sequence-parallel", "true")));
}

TEST(ReadMegatronSettings, ErrorsNameTheSourceAndLine) {
  const auto yaml = ReadMegatronSettings("a: 1\nnot a mapping\n", "cfg.yaml");
  EXPECT_THAT(yaml.status().message(), HasSubstr("cfg.yaml:2: expected 'key: value'"));
  const auto args = ReadMegatronSettings("--tensor-model-parallel-size --seq-length 4", "x.sh");
  EXPECT_THAT(args.status().message(),
              HasSubstr("x.sh: --tensor-model-parallel-size has no value"));
}

std::string Joined(const std::vector<std::string>& notes) {
  std::string out;
  for (const std::string& n : notes) out += n + "\n";
  return out;
}

// Megatron's own example (PipelineParallelLayerLayout.parse_str_to_list's docstring).
TEST(MegatronLayoutStages, UnrollsAsMegatronParsesIt) {
  const auto stages = MegatronLayoutStages("Ettt|(tt|)*29,m|L");
  ASSERT_TRUE(stages.ok()) << stages.status();
  std::vector<std::string> want = {"Ettt"};
  for (int i = 0; i < 29; ++i) want.push_back("tt");
  want.push_back("m");
  want.push_back("L");
  EXPECT_EQ(*stages, want);
  EXPECT_THAT(*MegatronLayoutStages("E,t*3|t*2,L"), ElementsAre("Ettt", "ttL"));
  EXPECT_THAT(*MegatronLayoutStages("E|(t|)*2,L"), ElementsAre("E", "t", "t", "L"));
  EXPECT_THAT(*MegatronLayoutStages("E||tL"), ElementsAre("E", "", "tL"));  // an empty stage
  EXPECT_THAT(MegatronLayoutStages("Etx|L").status().message(),
              HasSubstr("--pipeline-model-parallel-layout is 'Etx|L'; 'x' is not a layer"));
  // A repeat beyond any model is an error, not an allocation that aborts.
  EXPECT_THAT(MegatronLayoutStages("E,t*99999999999999999999,L").status().message(),
              HasSubstr("unrolls to more than"));
}

TEST(ReadMegatronSettings, ALayoutGivesEveryVirtualStagesLayers) {
  const auto s = ReadMegatronSettings(
      "--num-layers 32 --pipeline-model-parallel-size 4 \\\n"
      "  --pipeline-model-parallel-layout 'E,t*7|(t*9|)*2,t*7,L'\n",
      "train.sh");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->flags, UnorderedElementsAre(Pair("sharding", "no_shard"), Pair("pp", "4"),
                                             Pair("mtp-layers", "0"), Pair("pp-layout", "7,9,9,7"),
                                             Pair("no-sequence-parallel", "true")));
  // Eight virtual stages over four ranks: two model chunks each, the interleaved schedule; the
  // MTP depth runs in the last virtual stage, after its decoder layers.
  const auto virtual_stages = ReadMegatronSettings(
      "--pipeline-model-parallel-size 4 --mtp-num-layers 1 "
      "--pipeline-model-parallel-layout \"E|(tt|)*6,t,m,L\"",
      "train.sh");
  ASSERT_TRUE(virtual_stages.ok()) << virtual_stages.status();
  EXPECT_THAT(virtual_stages->flags,
              UnorderedElementsAre(
                  Pair("sharding", "no_shard"), Pair("pp", "4"), Pair("mtp-layers", "1"),
                  Pair("vpp", "2"), Pair("schedule", "interleaved"),
                  Pair("pp-layout", "0,2,2,2,2,2,2,1"), Pair("no-sequence-parallel", "true")));
  EXPECT_THAT(Joined(virtual_stages->notes), HasSubstr("planned as --vpp 2 --pp-layout"));
}

// get_num_layers_to_build: the first and last rank their own, the middle ranks the rest evenly,
// each rank's layers split evenly over its model chunks (virtual stage c x pp + rank).
TEST(ReadMegatronSettings, UnevenFirstAndLastStagesAndTheirChunks) {
  const auto s = ReadMegatronSettings(
      "--num-layers 32 --pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 6 "
      "--decoder-last-pipeline-num-layers 10 --num-virtual-stages-per-pipeline-rank 2",
      "train.sh");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->flags, UnorderedElementsAre(Pair("sharding", "no_shard"), Pair("pp", "4"),
                                             Pair("mtp-layers", "0"), Pair("vpp", "2"),
                                             Pair("schedule", "interleaved"),
                                             Pair("pp-layout", "3,4,4,5,3,4,4,5"),
                                             Pair("no-sequence-parallel", "true")));
  // The split read --num-layers, so it is not named as unused.
  EXPECT_THAT(Joined(s->notes), Not(HasSubstr("not used")));
  const auto last_only = ReadMegatronSettings(
      "--num-layers 30 --pipeline-model-parallel-size 4 --decoder-last-pipeline-num-layers 6",
      "train.sh");
  ASSERT_TRUE(last_only.ok()) << last_only.status();
  EXPECT_THAT(last_only->flags, Contains(Pair("pp-layout", "8,8,8,6")));
}

// arguments.py: (layers + the counted embedding and loss) / pp / layers per virtual stage
// chunks; the even split itself is the planner's, from the same two switches.
TEST(ReadMegatronSettings, LayersPerVirtualStageGiveTheChunks) {
  const auto s = ReadMegatronSettings(
      "--num-layers 30 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2 "
      "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
      "train.sh");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->flags, UnorderedElementsAre(
                            Pair("sharding", "no_shard"), Pair("pp", "4"), Pair("mtp-layers", "0"),
                            Pair("vpp", "4"), Pair("schedule", "interleaved"),
                            Pair("account-for-embedding-in-pipeline-split", "true"),
                            Pair("account-for-loss-in-pipeline-split", "true"),
                            Pair("no-sequence-parallel", "true")));
}

TEST(ReadMegatronSettings, SplitsMegatronRefusesAreErrorsNamingTheArgument) {
  auto error = [](const std::string& text) {
    const auto s = ReadMegatronSettings(text, "train.sh");
    return s.ok() ? std::string("ok") : std::string(s.status().message());
  };
  EXPECT_THAT(error("--pipeline-model-parallel-size 4 --pipeline-model-parallel-layout "
                    "'E,t*8|t*8|t*8,L'"),
              HasSubstr("its 3 stages do not divide over --pipeline-model-parallel-size 4"));
  EXPECT_THAT(
      error("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 't*8|E,t*8,L'"),
      HasSubstr("allowed: one E (the embedding) first and one L (the loss) last"));
  EXPECT_THAT(error("--pipeline-model-parallel-size 2 --mtp-num-layers 1 "
                    "--pipeline-model-parallel-layout 'E,t*8,m|t*8,L'"),
              HasSubstr("MTP depths on virtual stage 0; allowed: in the last virtual stage"));
  EXPECT_THAT(error("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "
                    "'E,t*8|t*8,m,L'"),
              HasSubstr("it places 1 MTP depths (m); --mtp-num-layers is 0"));
  EXPECT_THAT(error("--num-layers 16 --pipeline-model-parallel-size 2 "
                    "--pipeline-model-parallel-layout 'E,t*8|t*7,L'"),
              HasSubstr("it places 15 decoder layers (t); --num-layers is 16"));
  EXPECT_THAT(error("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'E|t,L' "
                    "--decoder-first-pipeline-num-layers 1"),
              HasSubstr("Megatron refuses it together with"));
  EXPECT_THAT(error("--num-layers 8 --num-layers-per-virtual-pipeline-stage 2 "
                    "--num-virtual-stages-per-pipeline-rank 2"),
              HasSubstr("sets --num-layers-per-virtual-pipeline-stage and "
                        "--num-virtual-stages-per-pipeline-rank; Megatron takes at most one"));
  EXPECT_THAT(error("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 2"),
              HasSubstr("--decoder-first-pipeline-num-layers splits --num-layers, which the file "
                        "does not set"));
  EXPECT_THAT(error("--num-layers 31 --pipeline-model-parallel-size 4 "
                    "--decoder-first-pipeline-num-layers 6"),
              HasSubstr("leave 25 of --num-layers 31 for 3 middle stages"));
  EXPECT_THAT(
      error("--num-layers 32 --pipeline-model-parallel-size 4 "
            "--decoder-first-pipeline-num-layers 5 --num-virtual-stages-per-pipeline-rank 2"),
      HasSubstr("stage 0's 5 layers do not divide over its 2 model chunks"));
  EXPECT_THAT(error("--num-layers 32 --pipeline-model-parallel-size 4 "
                    "--num-layers-per-virtual-pipeline-stage 3"),
              HasSubstr("--num-layers-per-virtual-pipeline-stage is 3; it must divide the 32 "
                        "layers"));
  EXPECT_THAT(error("--num-layers 32 --decoder-first-pipeline-num-layers 4294967296"),
              HasSubstr("--decoder-first-pipeline-num-layers is '4294967296'; allowed: an "
                        "integer in [0, 10000]"));
  EXPECT_THAT(
      error("--pipeline-model-parallel-size two"),
      HasSubstr(
          "train.sh: --pipeline-model-parallel-size is 'two'; allowed: an integer in [1, 512]"));
}

// Note [No Megatron argument]: a file without one is refused, not planned as the default model.
TEST(ReadMegatronSettings, AFileWithoutAnyMegatronArgumentIsRefused) {
  for (const std::string text : {"hello world\n", "", "[[[]]]", "# only a comment\n",
                                 "torchrun train.py\n", "---\n# an empty YAML document\n"}) {
    auto s = ReadMegatronSettings(text, "f.sh");
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_THAT(s.status().message(), HasSubstr("f.sh: found no Megatron-LM argument in it"))
        << text;
  }
  EXPECT_TRUE(ReadMegatronSettings("--seq-length 4096\n", "f.sh").ok());
}

TEST(ReadMegatronSettings, ALaunchScriptIsReadAsShell) {
  const auto s = ReadMegatronSettings(
      "#!/bin/bash\n"
      "GPUS_PER_NODE=${GPUS_PER_NODE:-4}\n"
      "NNODES=2\n"
      "TP=${1:-2}\n"
      "MBS=${MBS:-4}\n"
      "ARGS=(--tensor-model-parallel-size $TP --micro-batch-size=${MBS})\n"
      "mkdir -p \"$(dirname \"$CKPT\")\"\n"
      "torchrun --nproc-per-node=$GPUS_PER_NODE --nnodes $NNODES \\\n"
      "    pretrain_gpt.py \"${ARGS[@]}\" --save $(date +%s)\n",
      "run.sh", ShellEnvironment{{"4"}, {{"MBS", "2"}}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->flags, Contains(Pair("tp", "4")));
  EXPECT_THAT(s->flags, Contains(Pair("micro-batch", "2")));
  EXPECT_THAT(s->flags, Contains(Pair("gpus", "8")));
  EXPECT_EQ(s->origins.at("gpus"), "torchrun --nproc-per-node=4 x --nnodes 2, line 8");
  EXPECT_EQ(s->origins.at("tp"), "run.sh:8: --tensor-model-parallel-size 4");
  // What is unresolved and not needed is named with its line.
  EXPECT_THAT(s->notes, Contains(HasSubstr("run.sh:7: $(dirname")));
  EXPECT_THAT(s->notes, Contains(HasSubstr("--save")));
}

TEST(ReadMegatronSettings, WhatIsNeededButUnresolvedNamesTheFlagThatSuppliesIt) {
  const auto s = ReadMegatronSettings(
      "TP=$(python -c 'print(8)')\n"
      "LAYERS=$3\n"
      "python pretrain_gpt.py --tensor-model-parallel-size $TP --num-layers $LAYERS \\\n"
      "  --hidden-size 64 --num-attention-heads 4\n",
      "run.sh", ShellEnvironment{});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->needs, Contains(Pair("tp", HasSubstr("run.sh:1: $(python -c 'print(8)') is a "
                                                      "command substitution"))));
  EXPECT_THAT(s->needs, Contains(Pair("model", HasSubstr("run.sh:2: $3 is not given"))));
  EXPECT_THAT(s->needs, Contains(Pair("gpus", HasSubstr("run.sh:3: python starts the training"))));
  EXPECT_FALSE(s->model_arguments.has_value());
}

TEST(ReadMegatronSettings, GpusFromSlurmAndWorldSize) {
  const auto slurm = ReadMegatronSettings(
      "#SBATCH --nodes=4\n#SBATCH --gres=gpu:8\n"
      "srun python pretrain_gpt.py --seq-length 4096\n",
      "job.sbatch", ShellEnvironment{});
  ASSERT_TRUE(slurm.ok()) << slurm.status();
  EXPECT_THAT(slurm->flags, Contains(Pair("gpus", "32")));
  EXPECT_EQ(slurm->origins.at("gpus"), "SLURM --gpus-per-node 8 x --nodes 4");
  const auto world =
      ReadMegatronSettings("WORLD_SIZE=$((2 * 8))\npython pretrain_gpt.py --seq-length 4096\n",
                           "w.sh", ShellEnvironment{});
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_THAT(world->flags, Contains(Pair("gpus", "16")));
}

}  // namespace
}  // namespace stowage::bridges
