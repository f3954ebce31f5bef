#include "tools/trainer_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace stowage::tools {
namespace {

using ::testing::HasSubstr;
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
