// `stowage plan --from-megatron FILE [-- ARG...]` end to end: Megatron-LM's own launch scripts
// (tests/data/megatron-scripts) planned as the jobs they launch, the checks that name where each
// number came from, and files that are not a Megatron job.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/test_util.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using Result = stowage::testing::CommandResult;  // out: stdout and stderr

using stowage::testing::RunStowage;

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
    const Result run = RunStowage("plan --from-megatron " + Write(name, text));
    EXPECT_EQ(run.code, 2) << run.out;
    EXPECT_THAT(run.out, HasSubstr(name + ": found no Megatron-LM argument in it")) << run.out;
    EXPECT_THAT(run.out, Not(HasSubstr("peak device memory")));
  }
}

// The GPT-3 example launches 8 GPUs but asks for TP 8 x PP 16.
TEST_F(PlanFromMegatron, Gpt3NamesTheGpusAndWhereEachNumberCameFrom) {
  const Result run = RunStowage("plan --hardware h800 --vocab-size 50257 --from-megatron " +
                                Script("gpt3_175b.sh"));
  EXPECT_EQ(run.code, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr("the job runs 8 GPUs (torchrun --nproc_per_node 8 x --nnodes 1, "
                                 "line 77) but asks for TP 8 ("));
  EXPECT_THAT(run.out, HasSubstr("gpt3_175b.sh:77: --pipeline-model-parallel-size 16) = 128"));
  // Without --vocab-size: which flag supplies the vocabulary.
  const Result no_vocab =
      RunStowage("plan --hardware h800 --gpus 128 --from-megatron " + Script("gpt3_175b.sh"));
  EXPECT_EQ(no_vocab.code, 2) << no_vocab.out;
  EXPECT_THAT(no_vocab.out, HasSubstr("give --vocab-size N"));
}

// The first "peak_device_bytes" of a plan's JSON (the step's predicted peak); 0 if none.
uint64_t PeakOf(const std::string& out) {
  const std::string key = "\"peak_device_bytes\": ";
  const size_t at = out.find(key);
  return at == std::string::npos ? 0 : std::stoull(out.substr(at + key.size()));
}

// Megatron-LM's --sequence-parallel is off unless given (arguments.py): the GPT-3 example runs
// TP 8 without it, so every TP rank holds the layer inputs, norms and residual for the whole
// sequence (Note [Sequence parallelism] in planner/frameworks/megatron.cc) and the plan's peak
// is above the same job's with --sequence-parallel.
TEST_F(PlanFromMegatron, Gpt3WithoutSequenceParallelIsPlannedWithout) {
  const std::string base = "plan --hardware h800 --gpus 128 --vocab-size 50257 --format json ";
  const Result as_is = RunStowage(base + "--from-megatron " + Script("gpt3_175b.sh"));
  ASSERT_EQ(as_is.code, 0) << as_is.out;
  EXPECT_THAT(as_is.out, HasSubstr("\"sequence_parallel\": false"));
  std::ifstream in(Script("gpt3_175b.sh"));
  std::stringstream text;
  text << in.rdbuf();
  std::string with = text.str();
  const std::string tp = "--tensor-model-parallel-size 8";
  ASSERT_NE(with.find(tp), std::string::npos);
  with.replace(with.find(tp), tp.size(), tp + " --sequence-parallel");
  const Result sp = RunStowage(base + "--from-megatron " + Write("gpt3_sp.sh", with));
  ASSERT_EQ(sp.code, 0) << sp.out;
  EXPECT_THAT(sp.out, Not(HasSubstr("sequence_parallel")));
  EXPECT_GT(PeakOf(as_is.out), PeakOf(sp.out));
  EXPECT_GT(PeakOf(sp.out), 0u);
  // The summary says so; --emit megatron passes --sequence-parallel only for the plan with it.
  const std::string text_base = "plan --hardware h800 --gpus 128 --vocab-size 50257 ";
  const Result table = RunStowage(text_base + "--from-megatron " + Script("gpt3_175b.sh"));
  EXPECT_THAT(table.out, HasSubstr("TP 8 without sequence parallelism")) << table.out;
  const Result emit_as_is =
      RunStowage(text_base + "--emit megatron --from-megatron " + Script("gpt3_175b.sh"));
  ASSERT_EQ(emit_as_is.code, 0) << emit_as_is.out;
  EXPECT_THAT(emit_as_is.out, Not(HasSubstr("--sequence-parallel")));
  const Result emit_sp =
      RunStowage(text_base + "--emit megatron --from-megatron " + Write("gpt3_sp2.sh", with));
  ASSERT_EQ(emit_sp.code, 0) << emit_sp.out;
  EXPECT_THAT(emit_sp.out, HasSubstr("--sequence-parallel"));
  // The command line wins: --no-sequence-parallel=false plans the script with it.
  const Result forced =
      RunStowage(base + "--no-sequence-parallel=false --from-megatron " + Script("gpt3_175b.sh"));
  ASSERT_EQ(forced.code, 0) << forced.out;
  EXPECT_EQ(PeakOf(forced.out), PeakOf(sp.out));
}

// Megatron-LM refuses MoE under TP without --sequence-parallel (yaml_arguments.py, moe_layer.py
// MoELayer.forward); so does the reader, naming the flag.
TEST_F(PlanFromMegatron, MoeUnderTpWithoutSequenceParallelIsRefused) {
  const std::string model =
      "  --num-layers 4 --hidden-size 256 --num-attention-heads 4 --swiglu \\\n"
      "  --normalization RMSNorm --position-embedding-type rope --vocab-size 1000 \\\n"
      "  --num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 2 \\\n"
      "  --seq-length 4096 --disable-bias-linear";
  const std::string without = Write("moe.sh", "torchrun --nproc_per_node 4 pretrain_gpt.py \\\n" +
                                                  model + " --tensor-model-parallel-size 2\n");
  const Result run = RunStowage("plan --hardware h800 --from-megatron " + without);
  EXPECT_EQ(run.code, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr("MoE model (--num-experts 8) under TP 2"));
  EXPECT_THAT(run.out, HasSubstr("add --sequence-parallel to the script"));
  EXPECT_THAT(run.out, Not(HasSubstr("peak device memory")));
  const std::string with =
      Write("moe_sp.sh", "torchrun --nproc_per_node 4 pretrain_gpt.py \\\n" + model +
                             " --tensor-model-parallel-size 2 --sequence-parallel\n");
  const Result ok = RunStowage("plan --hardware h800 --from-megatron " + with);
  EXPECT_EQ(ok.code, 0) << ok.out;
  // TP 1: the setting is moot, no refusal.
  const std::string tp1 =
      Write("moe_tp1.sh", "torchrun --nproc_per_node 4 pretrain_gpt.py \\\n" + model + "\n");
  EXPECT_EQ(RunStowage("plan --hardware h800 --from-megatron " + tp1).code, 0);
}

TEST_F(PlanFromMegatron, Llama3PlansTheModelItsArgumentsDescribe) {
  const Result run = RunStowage("plan --hardware h800 --format json --from-megatron " +
                                Script("llama3_8b_h100_fp8.sh"));
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("\"model_parameters\": 8030261248"));
  EXPECT_THAT(run.out, HasSubstr("\"seq_len\": 8192"));
  EXPECT_THAT(run.out, HasSubstr("\"cp\": 1"));
  EXPECT_THAT(run.out, HasSubstr("job: launcher: torchrun"));
  EXPECT_THAT(run.out, HasSubstr("8 GPUs (torchrun --nproc_per_node 8 x --nnodes 1, line 187)"));
  // --model on the command line wins over the script's model.
  const Result model = RunStowage(
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
      RunStowage("plan --hardware h800 --format json --from-megatron " + script + " -- 2 4");
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("\"tp\": 2"));
  // The plan states the job it assumed: 4 GPUs, TP 2: data parallel 2 x micro-batch 1.
  EXPECT_THAT(run.out, HasSubstr("\"gpus\": 4"));
  EXPECT_THAT(run.out, HasSubstr("\"global_batch\": 2"));
  EXPECT_THAT(run.out, HasSubstr("4 GPUs (torchrun --nproc_per_node 4 x (one node), line 3)"));
  // Without $2 the GPU count is unresolved, and needed.
  const Result missing = RunStowage("plan --hardware h800 --from-megatron " + script);
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_THAT(missing.out, HasSubstr("run.sh:2: ${2} is not set (the GPU count)"));
  EXPECT_THAT(missing.out, HasSubstr("give --gpus on the command line"));
  // Words after `--` without --from-megatron are a mistake.
  EXPECT_EQ(RunStowage("plan -- 1 2").code, 2);
}

// What the script recomputes today is evaluated as `--force` evaluates it, beside the plan
// (Note [The script's own setting] in cli/plan_command.cc).
TEST_F(PlanFromMegatron, TheScriptsOwnRecomputeIsEvaluatedBesideThePlan) {
  const std::string model =
      "  --num-layers 4 --hidden-size 256 --num-attention-heads 4 --swiglu \\\n"
      "  --normalization RMSNorm --position-embedding-type rope --vocab-size 1000 \\\n"
      "  --seq-length 4096 --disable-bias-linear";
  const std::string full =
      Write("full.sh",
            "torchrun --nproc_per_node 4 pretrain_gpt.py --recompute-granularity full \\\n"
            "  --recompute-method uniform --recompute-num-layers 1 \\\n" +
                model + "\n");
  const Result run = RunStowage("plan --hardware h800 --from-megatron " + full);
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("(evaluated beside the plan as --force recompute)"));
  EXPECT_THAT(run.out, HasSubstr("job: the script's own setting (--recompute-granularity full, "
                                 "--recompute-method uniform, --recompute-num-layers 1) as --force "
                                 "recompute: step "));
  EXPECT_THAT(run.out, HasSubstr(" (fits); the plan: step "));
  // Under a budget the forced policy misses, it is still evaluated, with its own peak.
  const Result tight = RunStowage("plan --hardware h800 --gpu-mem 0.05 --from-megatron " + full);
  EXPECT_THAT(tight.out, HasSubstr(" (does not fit); the plan: step ")) << tight.out;
  // Selective recompute, through the pipeline path (several microbatches).
  const std::string selective =
      Write("selective.sh",
            "torchrun --nproc_per_node 4 pretrain_gpt.py --recompute-activations \\\n"
            "  --micro-batch-size 1 --global-batch-size 16 \\\n" +
                model + "\n");
  const Result pipelined = RunStowage("plan --hardware h800 --from-megatron " + selective);
  ASSERT_EQ(pipelined.code, 0) << pipelined.out;
  EXPECT_THAT(pipelined.out, HasSubstr("4 microbatches"));
  const Result json = RunStowage("plan --hardware h800 --format json --from-megatron " + selective);
  ASSERT_EQ(json.code, 0) << json.out;
  EXPECT_THAT(json.out, HasSubstr("\"gpus\": 4"));
  EXPECT_THAT(json.out, HasSubstr("\"global_batch\": 16"));
  EXPECT_THAT(pipelined.out, HasSubstr("job: the script's own setting (--recompute-activations) as "
                                       "--force selective_recompute: step "));
  // A script that recomputes nothing has no such line.
  const std::string none =
      Write("none.sh", "torchrun --nproc_per_node 4 pretrain_gpt.py \\\n" + model + "\n");
  const Result plain = RunStowage("plan --hardware h800 --from-megatron " + none);
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_THAT(plain.out, HasSubstr("the script recomputes / offloads: nothing"));
  EXPECT_THAT(plain.out, Not(HasSubstr("the script's own setting")));
}

}  // namespace
