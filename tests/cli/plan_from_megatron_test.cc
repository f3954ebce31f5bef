// `stowage plan --from-megatron FILE [-- ARG...]` end to end: Megatron-LM's own launch scripts
// (tests/data/megatron-scripts) planned as the jobs they launch, the checks that name where each
// number came from, and files that are not a Megatron job.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/test_util.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using Result = stowage::testing::CommandResult;  // out: stdout and stderr

Result Stowage(const std::string& args) {
  const std::string command = std::string(STOWAGE_BINARY_DIR) + "/cli/stowage " + args + " 2>&1";
  return stowage::testing::RunCommand(command);
}

std::string Script(const std::string& name) {
  return std::string(STOWAGE_SOURCE_DIR) + "/tests/data/megatron-scripts/" + name;
}

class PlanFromMegatron : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("stowage_from_megatron_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

// Issue: `hello world`, an empty file and `[[[]]]` planned the default model with exit 0.
TEST_F(PlanFromMegatron, AFileWithNoMegatronArgumentIsRefused) {
  for (const auto& [name, text] : {std::pair<std::string, std::string>{"hello.sh", "hello world\n"},
                                   {"empty.sh", ""},
                                   {"brackets.sh", "[[[]]]"}}) {
    const Result run = Stowage("plan --from-megatron " + Write(name, text));
    EXPECT_EQ(run.code, 2) << run.out;
    EXPECT_THAT(run.out, HasSubstr(name + ": found no Megatron-LM argument in it")) << run.out;
    EXPECT_THAT(run.out, Not(HasSubstr("peak device memory")));
  }
}

// The GPT-3 example launches 8 GPUs but asks for TP 8 x PP 16.
TEST_F(PlanFromMegatron, Gpt3NamesTheGpusAndWhereEachNumberCameFrom) {
  const Result run =
      Stowage("plan --hardware h800 --vocab-size 50257 --from-megatron " + Script("gpt3_175b.sh"));
  EXPECT_EQ(run.code, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr("the job runs 8 GPUs (torchrun --nproc_per_node 8 x --nnodes 1, "
                                 "line 77) but asks for TP 8 ("));
  EXPECT_THAT(run.out, HasSubstr("gpt3_175b.sh:77: --pipeline-model-parallel-size 16) = 128"));
  // Without --vocab-size: which flag supplies the vocabulary.
  const Result no_vocab =
      Stowage("plan --hardware h800 --gpus 128 --from-megatron " + Script("gpt3_175b.sh"));
  EXPECT_EQ(no_vocab.code, 2) << no_vocab.out;
  EXPECT_THAT(no_vocab.out, HasSubstr("give --vocab-size N"));
}

TEST_F(PlanFromMegatron, Llama3PlansTheModelItsArgumentsDescribe) {
  const Result run = Stowage("plan --hardware h800 --format json --from-megatron " +
                             Script("llama3_8b_h100_fp8.sh"));
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("\"model_parameters\": 8030261248"));
  EXPECT_THAT(run.out, HasSubstr("\"seq_len\": 8192"));
  EXPECT_THAT(run.out, HasSubstr("\"cp\": 1"));
  EXPECT_THAT(run.out, HasSubstr("job: launcher: torchrun"));
  EXPECT_THAT(run.out, HasSubstr("8 GPUs (torchrun --nproc_per_node 8 x --nnodes 1, line 187)"));
  // --model on the command line wins over the script's model.
  const Result model = Stowage(
      "plan --hardware h800 --format json --model qwen3-8b "
      "--from-megatron " +
      Script("llama3_8b_h100_fp8.sh"));
  ASSERT_EQ(model.code, 0) << model.out;
  EXPECT_THAT(model.out, Not(HasSubstr("\"model_parameters\": 8030261248")));
}

TEST_F(PlanFromMegatron, ScriptArgumentsFollowTheDoubleDash) {
  const std::string script =
      Write("run.sh",
            "TP=${1:-1}\nGPUS=${2:?the GPU count}\n"
            "torchrun --nproc_per_node $GPUS pretrain_gpt.py --tensor-model-parallel-size $TP \\\n"
            "  --num-layers 4 --hidden-size 256 --num-attention-heads 4 --swiglu \\\n"
            "  --normalization RMSNorm --position-embedding-type rope --vocab-size 1000 \\\n"
            "  --seq-length 4096 --disable-bias-linear\n");
  const Result run =
      Stowage("plan --hardware h800 --format json --from-megatron " + script + " -- 2 4");
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("\"tp\": 2"));
  EXPECT_THAT(run.out, HasSubstr("4 GPUs (torchrun --nproc_per_node 4 x (one node), line 3)"));
  // Without $2 the GPU count is unresolved, and needed.
  const Result missing = Stowage("plan --hardware h800 --from-megatron " + script);
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_THAT(missing.out, HasSubstr("run.sh:2: ${2} is not set (the GPU count)"));
  EXPECT_THAT(missing.out, HasSubstr("give --gpus on the command line"));
  // Words after `--` without --from-megatron are a mistake.
  EXPECT_EQ(Stowage("plan -- 1 2").code, 2);
}

}  // namespace
