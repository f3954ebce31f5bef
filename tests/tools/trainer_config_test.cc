#include "tools/trainer_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
                                   Pair("sharding", "optim")));
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
                                             Pair("sharding", "optim_grads_params")));
}

TEST(ReadMegatronSettings, AnExplicitShardingStrategyWinsOverTheDistributedOptimizer) {
  const auto s = ReadMegatronSettings(
      "--use-distributed-optimizer --data-parallel-sharding-strategy optim_grads", "a");
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(s->flags, UnorderedElementsAre(Pair("sharding", "optim_grads")));
}

TEST(ReadMegatronSettings, ErrorsNameTheSourceAndLine) {
  const auto yaml = ReadMegatronSettings("a: 1\nnot a mapping\n", "cfg.yaml");
  EXPECT_THAT(yaml.status().message(), HasSubstr("cfg.yaml:2: expected 'key: value'"));
  const auto args = ReadMegatronSettings("--tensor-model-parallel-size --seq-length 4", "x.sh");
  EXPECT_THAT(args.status().message(),
              HasSubstr("x.sh: --tensor-model-parallel-size has no value"));
}

}  // namespace
}  // namespace stowage::tools
