#include "bridges/trainer_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace stowage::tools {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsSupersetOf;
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
                                   Pair("sharding", "optim"), Pair("mtp-layers", "0")));
  ASSERT_EQ(s->notes.size(), 2u);
  EXPECT_THAT(s->notes[0], HasSubstr("--recompute-granularity full"));
  EXPECT_THAT(s->notes[1], HasSubstr("--num-layers"));
  EXPECT_THAT(s->notes[1], HasSubstr("--bf16"));
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

// Megatron's --use-tp-pp-dp-mapping is its rank order tp-cp-ep-pp-dp (initialize.py).
TEST(ReadMegatronSettings, TpPpDpMappingIsTheRankOrder) {
  const auto s =
      ReadMegatronSettings("--pipeline-model-parallel-size 2 --use-tp-pp-dp-mapping", "a");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->flags, UnorderedElementsAre(Pair("pp", "2"), Pair("rank-order", "tp-cp-ep-pp-dp"),
                                             Pair("mtp-layers", "0")));
  const auto yaml = ReadMegatronSettings("use_tp_pp_dp_mapping: true\n", "cfg.yaml");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_THAT(yaml->flags,
              UnorderedElementsAre(Pair("rank-order", "tp-cp-ep-pp-dp"), Pair("mtp-layers", "0")));
}

// Megatron-LM trains MTP only with --mtp-num-layers (default None): without it the plan trains
// none, whatever the checkpoint's num_nextn_predict_layers (Note [MTP layers]).
TEST(ReadMegatronSettings, MtpNumLayersOrNone) {
  const auto given = ReadMegatronSettings("--mtp-num-layers 1 --mtp-loss-scaling-factor 0.1", "a");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_THAT(given->flags, UnorderedElementsAre(Pair("mtp-layers", "1")));
  const auto yaml = ReadMegatronSettings("model:\n  mtp_num_layers: 2\n", "cfg.yaml");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_THAT(yaml->flags, UnorderedElementsAre(Pair("mtp-layers", "2")));
  const auto absent = ReadMegatronSettings("--tensor-model-parallel-size 2", "a");
  ASSERT_TRUE(absent.ok());
  EXPECT_THAT(absent->flags, UnorderedElementsAre(Pair("tp", "2"), Pair("mtp-layers", "0")));
}

TEST(ReadMegatronSettings, AnExplicitShardingStrategyWinsOverTheDistributedOptimizer) {
  const auto s = ReadMegatronSettings(
      "--use-distributed-optimizer --data-parallel-sharding-strategy optim_grads", "a");
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(s->flags,
              UnorderedElementsAre(Pair("sharding", "optim_grads"), Pair("mtp-layers", "0")));
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
  EXPECT_THAT(s->flags, UnorderedElementsAre(Pair("pp", "4"), Pair("mtp-layers", "0"),
                                             Pair("pp-layout", "7,9,9,7")));
  // Eight virtual stages over four ranks: two model chunks each, the interleaved schedule; the
  // MTP depth runs in the last virtual stage, after its decoder layers.
  const auto virtual_stages = ReadMegatronSettings(
      "--pipeline-model-parallel-size 4 --mtp-num-layers 1 "
      "--pipeline-model-parallel-layout \"E|(tt|)*6,t,m,L\"",
      "train.sh");
  ASSERT_TRUE(virtual_stages.ok()) << virtual_stages.status();
  EXPECT_THAT(
      virtual_stages->flags,
      UnorderedElementsAre(Pair("pp", "4"), Pair("mtp-layers", "1"), Pair("vpp", "2"),
                           Pair("schedule", "interleaved"), Pair("pp-layout", "0,2,2,2,2,2,2,1")));
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
  EXPECT_THAT(s->flags, UnorderedElementsAre(Pair("pp", "4"), Pair("mtp-layers", "0"),
                                             Pair("vpp", "2"), Pair("schedule", "interleaved"),
                                             Pair("pp-layout", "3,4,4,5,3,4,4,5")));
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
  EXPECT_THAT(s->flags,
              UnorderedElementsAre(Pair("pp", "4"), Pair("mtp-layers", "0"), Pair("vpp", "4"),
                                   Pair("schedule", "interleaved"),
                                   Pair("account-for-embedding-in-pipeline-split", "true"),
                                   Pair("account-for-loss-in-pipeline-split", "true")));
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

std::string TorchtitanExample(const std::string& name) {
  std::ifstream in(std::string(STOWAGE_SOURCE_DIR) + "/tests/data/torchtitan/" + name);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// torchtitan's own llama3_8b.toml (v0.2.2): FSDP over every GPU left (-1), selective op AC.
TEST(ReadTorchtitanSettings, Llama3EightBillionExample) {
  const auto s = ReadTorchtitanSettings(TorchtitanExample("llama3_8b.toml"), "llama3_8b.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->flags,
              UnorderedElementsAre(Pair("tp", "1"), Pair("cp", "1"), Pair("pp", "1"),
                                   Pair("sharding", "optim_grads_params"), Pair("seq-len", "8192"),
                                   Pair("micro-batch", "1"), Pair("optimizer", "adam"),
                                   Pair("model", "llama-3.1-8b")));
  const std::string notes = Joined(s->notes);
  EXPECT_THAT(notes, HasSubstr("data_parallel_shard_degree = -1"));
  EXPECT_THAT(notes, HasSubstr("give --gpus"));
  EXPECT_THAT(notes, HasSubstr("activation_checkpoint.mode = \"selective\" "
                               "(selective_ac_option = \"op\")"));
  EXPECT_THAT(notes, HasSubstr("not used from llama3_8b.toml"));
  EXPECT_THAT(notes, HasSubstr("checkpoint.enable"));
}

TEST(ReadTorchtitanSettings, SeventyBillionAndDeepSeekExamples) {
  const auto llama = ReadTorchtitanSettings(TorchtitanExample("llama3_70b.toml"), "70b.toml");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_THAT(llama->flags,
              ::testing::IsSupersetOf({Pair("tp", "8"), Pair("seq-len", "8192"),
                                       Pair("micro-batch", "8"), Pair("model", "llama-3.1-70b")}));
  EXPECT_THAT(Joined(llama->notes), HasSubstr("--force recompute"));
  const auto deepseek =
      ReadTorchtitanSettings(TorchtitanExample("deepseek_v3_671b.toml"), "671b.toml");
  ASSERT_TRUE(deepseek.ok()) << deepseek.status();
  EXPECT_THAT(deepseek->flags,
              ::testing::IsSupersetOf({Pair("ep", "1"), Pair("seq-len", "4096"),
                                       Pair("micro-batch", "4"), Pair("model", "deepseek-v3")}));
  EXPECT_THAT(Joined(deepseek->notes), HasSubstr("compile.enable"));
}

TEST(ReadTorchtitanSettings, DegreesGiveTheGpusAndPipelinesTheirMicrobatches) {
  const auto s = ReadTorchtitanSettings(
      "[parallelism]\n"
      "data_parallel_replicate_degree = 2\n"
      "data_parallel_shard_degree = 4\n"
      "tensor_parallel_degree = 2\n"
      "context_parallel_degree = 2\n"
      "pipeline_parallel_degree = 4\n"
      "pipeline_parallel_schedule = \"1F1B\"\n"
      "pipeline_parallel_microbatch_size = 2\n"
      "fsdp_reshard_after_forward = \"never\"\n"
      "[training]\n"
      "seq_len = 131072\n"
      "local_batch_size = 16\n"
      "enable_cpu_offload = true\n"
      "[activation_checkpoint]\n"
      "mode = \"none\"\n",
      "job.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->flags, UnorderedElementsAre(Pair("tp", "2"), Pair("cp", "2"), Pair("pp", "4"),
                                             Pair("gpus", "128"), Pair("sharding", "optim_grads"),
                                             Pair("schedule", "1f1b"), Pair("seq-len", "131072"),
                                             Pair("micro-batch", "2"), Pair("microbatches", "8"),
                                             Pair("optimizer-offload", "true")));
  const std::string notes = Joined(s->notes);
  EXPECT_THAT(notes, HasSubstr("--force keep"));
  EXPECT_THAT(notes, HasSubstr("fsdp_reshard_after_forward"));
  // Plain replicas without CP: data parallel without sharding.
  const auto ddp = ReadTorchtitanSettings(
      "[parallelism]\ndata_parallel_replicate_degree = 8\ndata_parallel_shard_degree = 1\n"
      "[training]\nglobal_batch_size = 64\nlocal_batch_size = 2\n",
      "ddp.toml");
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  EXPECT_THAT(ddp->flags,
              UnorderedElementsAre(Pair("gpus", "8"), Pair("sharding", "no_shard"),
                                   Pair("micro-batch", "2"), Pair("global-batch", "64")));
}

// pipeline_module_split keeps a part's layers by index: the parts are the virtual stages.
TEST(ReadTorchtitanSettings, ModelPartsAreTheVirtualStages) {
  const auto s = ReadTorchtitanSettings(
      "[parallelism]\n"
      "pipeline_parallel_degree = 2\n"
      "pipeline_parallel_schedule = \"Interleaved1F1B\"\n"
      "module_fqns_per_model_part = [[\"tok_embeddings\", \"layers.0\"], [\"layers.1\", "
      "\"layers.2\"], [\"layers.3\"], [\"layers.4\", \"layers.5\", \"norm\", \"output\"]]\n",
      "job.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->flags, IsSupersetOf({Pair("pp", "2"), Pair("schedule", "interleaved"),
                                      Pair("vpp", "2"), Pair("pp-layout", "1,2,1,2")}));
  EXPECT_FALSE(s->torchtitan_split.has_value());
  auto error = [](const std::string& parts, const std::string& schedule = "1F1B") {
    const auto bad = ReadTorchtitanSettings(
        absl::StrCat("[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = \"",
                     schedule, "\"\nmodule_fqns_per_model_part = ", parts, "\n"),
        "job.toml");
    return bad.ok() ? std::string("ok") : std::string(bad.status().message());
  };
  EXPECT_THAT(error("[[\"tok_embeddings\", \"layers.0\"], [\"layers.2\", \"norm\", \"output\"]]"),
              HasSubstr("job.toml:4: parallelism.module_fqns_per_model_part has value"));
  EXPECT_THAT(error("[[\"tok_embeddings\", \"layers.0\"], [\"layers.2\", \"norm\", \"output\"]]"),
              HasSubstr("part 1 has \"layers.2\" where layers.1 is next"));
  EXPECT_THAT(error("[[\"layers.0\"], [\"tok_embeddings\", \"norm\", \"output\"]]"),
              HasSubstr("part 1 has \"tok_embeddings\""));
  EXPECT_THAT(error("[[\"tok_embeddings\"], [\"layers.0\"], [\"layers.1\"], [\"output\"]]"),
              HasSubstr("exactly 1 model parts per rank under the single-stage schedule"));
  EXPECT_THAT(error("[[\"tok_embeddings\", \"layers.0\"], [\"output\"]]", "ZBVZeroBubble"),
              HasSubstr("at least 2 model parts per rank"));
  EXPECT_THAT(error("[[\"tok_embeddings\"], [\"output\"]]", "Looped"),
              HasSubstr("pipeline_parallel_schedule has value 'Looped'; allowed: \"1F1B\""));
}

// Without the parts listed, torchtitan's own split of the model's layers, resolved with them.
TEST(ReadTorchtitanSettings, WithoutThePartsTorchtitanSplitsTheModelsLayers) {
  const auto s = ReadTorchtitanSettings(
      "[parallelism]\npipeline_parallel_degree = 4\npipeline_parallel_layers_per_stage = 3\n"
      "pipeline_parallel_schedule = \"interleaved1f1b\"\n"
      "pipeline_parallel_last_stage_less_layers = 2\n",
      "job.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->flags, Contains(Pair("schedule", "interleaved")));
  ASSERT_TRUE(s->torchtitan_split.has_value());
  EXPECT_EQ(s->torchtitan_split->layers_per_stage, 3);
  EXPECT_EQ(s->torchtitan_split->first_stage_less_layers, 1);
  EXPECT_EQ(s->torchtitan_split->last_stage_less_layers, 2);
  EXPECT_THAT(Joined(s->notes), HasSubstr("torchtitan's own split"));
}

// Hand counts of generate_llm_fqn_per_model_part: (layers + 1 + 1) over the stages, the first
// `extra` stages one more, the embedding's and the output's weight taken from the ends.
TEST(TorchtitanStageLayers, TorchtitansOwnSplit) {
  const TorchtitanSplit split{"job.toml", std::nullopt, 1, 1};
  auto one_f_one_b = TorchtitanStageLayers(split, 32, 4, false, std::nullopt);
  ASSERT_TRUE(one_f_one_b.ok()) << one_f_one_b.status();
  EXPECT_EQ(one_f_one_b->vpp, 1);
  EXPECT_THAT(one_f_one_b->layers, ElementsAre(8, 9, 8, 7));  // 34 = 9 + 9 + 8 + 8
  // A multi-stage schedule: two stages per rank unless told.
  auto interleaved = TorchtitanStageLayers(split, 32, 4, true, std::nullopt);
  ASSERT_TRUE(interleaved.ok());
  EXPECT_EQ(interleaved->vpp, 2);
  EXPECT_THAT(interleaved->layers, ElementsAre(4, 5, 4, 4, 4, 4, 4, 3));  // 34 = 2 x 5 + 6 x 4
  // layers_per_stage 3: ceil(34 / 3) = 12 stages, 3 per rank; 34 = 10 x 3 + 2 x 2.
  auto per_stage = TorchtitanStageLayers({"job.toml", 3, 1, 1}, 32, 4, true, std::nullopt);
  ASSERT_TRUE(per_stage.ok());
  EXPECT_EQ(per_stage->vpp, 3);
  EXPECT_THAT(per_stage->layers, ElementsAre(2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2, 1));
  // The command line's --vpp sets the stages.
  auto given = TorchtitanStageLayers(split, 32, 2, true, 3);
  ASSERT_TRUE(given.ok());
  EXPECT_THAT(given->layers, ElementsAre(5, 6, 6, 6, 5, 4));  // 34 = 4 x 6 + 2 x 5
  EXPECT_TRUE(TorchtitanStageLayers(split, 32, 1, false, std::nullopt)->layers.empty());
  // torchtitan's refusals.
  EXPECT_THAT(
      TorchtitanStageLayers({"job.toml", 5, 1, 1}, 32, 4, true, std::nullopt).status().message(),
      HasSubstr("job.toml: parallelism.pipeline_parallel_layers_per_stage = 5 makes 7 "
                "stages of the model's 32 layers (+ 1 + 1 for the embedding and the "
                "output), not a multiple of the 4 pipeline ranks"));
  EXPECT_THAT(
      TorchtitanStageLayers({"job.toml", 3, 1, 1}, 32, 4, false, std::nullopt).status().message(),
      HasSubstr("3 per rank, where the single-stage schedule runs exactly 1"));
  EXPECT_THAT(TorchtitanStageLayers({"job.toml", std::nullopt, 6, 1}, 16, 4, false, std::nullopt)
                  .status()
                  .message(),
              HasSubstr("a weight above the 5 layers per stage"));
}

TEST(ReadTorchtitanSettings, ErrorsNameTheFileKeyValueAndWhatIsAllowed) {
  auto s = ReadTorchtitanSettings("[parallelism]\ntensor_parallel_degree = \"two\"\n", "a.toml");
  EXPECT_EQ(std::string(s.status().message()),
            "a.toml:2: parallelism.tensor_parallel_degree has value 'two'; allowed: an integer "
            "in [1, 1048576]");
  s = ReadTorchtitanSettings("[parallelism]\ndata_parallel_shard_degree = 0\n", "b.toml");
  EXPECT_THAT(
      s.status().message(),
      HasSubstr("b.toml:2: parallelism.data_parallel_shard_degree has value 0; allowed: -1"));
  s = ReadTorchtitanSettings("[optimizer]\nname = \"Lion\"\n", "c.toml");
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("optimizer.name has value 'Lion'; allowed: "
                        "\"Adam\", \"AdamW\""));
  s = ReadTorchtitanSettings("[activation_checkpoint]\nmode = \"some\"\n", "d.toml");
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("activation_checkpoint.mode has value 'some'"));
  s = ReadTorchtitanSettings("[training]\nseq_len = 8192\n[training]\n", "e.toml");
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("e.toml:3:"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("not TOML"));
  s = ReadTorchtitanSettings(
      "[parallelism]\npipeline_parallel_degree = 2\n"
      "[training]\nlocal_batch_size = 3\n"
      "[parallelism.x]\n",
      "f.toml");
  ASSERT_TRUE(s.ok()) << s.status();  // microbatch size 1 divides 3
}

}  // namespace
}  // namespace stowage::tools
