// `stowage plan` end to end: the binary's exit codes, table, JSON and files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "stowage/plan.h"
#include "tests/test_util.h"

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

using Result = stowage::testing::CommandResult;  // out: stdout and stderr

using stowage::testing::RunStowage;

class PlanCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("stowage_plan_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

TEST_F(PlanCommand, BareStowagePrintsTheCommandsAndPlansNothing) {
  const Result run = RunStowage("");
  EXPECT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("usage: stowage <command>"));
  EXPECT_THAT(run.out, HasSubstr("bench plan"));
  EXPECT_THAT(run.out, ::testing::Not(HasSubstr("peak")));
  EXPECT_EQ(RunStowage("--help").out, run.out);
}

TEST_F(PlanCommand, TakesMegatronSpellingsOfTheParallelSizes) {
  const Result megatron = RunStowage(
      "plan --seq-length 128K --tensor-model-parallel-size 2 --context-parallel-size 4 "
      "--expert-model-parallel-size 4 --micro-batch-size 1 --format json");
  const Result ours =
      RunStowage("plan --seq-len 128K --tp 2 --cp 4 --ep 4 --micro-batch 1 --format json");
  ASSERT_EQ(megatron.code, ours.code) << megatron.out;
  EXPECT_EQ(megatron.out, ours.out);
  EXPECT_THAT(megatron.out, HasSubstr("\"tp\": 2"));
}

TEST_F(PlanCommand, FromMegatronTakesTheRunSettingsAndFlagsWin) {
  {
    std::ofstream(Path("train.sh")) << "python pretrain_gpt.py --tensor-model-parallel-size 2 \\\n"
                                       "  --context-parallel-size 4 --seq-length 131072 \\\n"
                                       "  --use-distributed-optimizer --num-layers 45\n";
  }
  const std::string job = "plan --model llama-3-8b --hardware h200 --gpus 8 --format json ";
  const Result from = RunStowage(job + "--from-megatron " + Path("train.sh"));
  // The parallel sizes the file leaves out are Megatron's defaults (EP 1, PP 1), and so is its
  // sequence parallelism (off without --sequence-parallel).
  const Result flags = RunStowage(
      job + "--tp 2 --cp 4 --ep 1 --pp 1 --seq-len 128K --sharding optim --no-sequence-parallel");
  ASSERT_EQ(flags.code, 0) << flags.out;
  ASSERT_EQ(from.code, 0) << from.out;
  // Same plan; only the notes (on stderr, merged here) differ.
  EXPECT_THAT(from.out, HasSubstr(flags.out.substr(flags.out.find('{'))));
  EXPECT_THAT(from.out, HasSubstr("not used from"));
  const Result override_tp = RunStowage(job + "--from-megatron " + Path("train.sh") + " --tp 1");
  EXPECT_THAT(override_tp.out, HasSubstr("\"tp\": 1"));
  EXPECT_EQ(RunStowage("plan --from-megatron " + Path("missing.sh")).code, 2);
}

// --no-sequence-parallel: TP as Megatron-LM runs it by default. The plan says so (JSON, summary),
// holds more (the layer inputs whole on every TP rank) and emits no --sequence-parallel; a MoE
// model under TP refuses it naming the flags; --help describes it.
TEST_F(PlanCommand, NoSequenceParallelPlansMoreAndSaysSo) {
  const std::string job =
      "plan --model llama-3.1-8b --hardware h200 --tp 4 --cp 1 --ep 1 --gpus 8 --seq-len 32K ";
  const Result sp = RunStowage(job + "--format json");
  const Result no_sp = RunStowage(job + "--no-sequence-parallel --format json");
  ASSERT_EQ(sp.code, 0) << sp.out;
  ASSERT_EQ(no_sp.code, 0) << no_sp.out;
  EXPECT_THAT(sp.out, Not(HasSubstr("sequence_parallel")));
  EXPECT_THAT(no_sp.out, HasSubstr("\"sequence_parallel\": false"));
  const auto peak = [](const std::string& out) {
    const std::string key = "\"peak_device_bytes\": ";
    return std::stoull(out.substr(out.find(key) + key.size()));
  };
  EXPECT_GT(peak(no_sp.out), peak(sp.out));
  EXPECT_THAT(RunStowage(job + "--no-sequence-parallel").out,
              HasSubstr("TP 4 without sequence parallelism"));
  EXPECT_THAT(RunStowage(job).out, Not(HasSubstr("without sequence parallelism")));
  EXPECT_THAT(RunStowage(job + "--no-sequence-parallel --emit megatron").out,
              Not(HasSubstr("--sequence-parallel")));
  EXPECT_THAT(RunStowage(job + "--emit megatron").out, HasSubstr("--sequence-parallel"));
  // Moot with TP 1: the same plan, byte for byte.
  const std::string tp1 =
      "plan --model llama-3.1-8b --hardware h200 --cp 1 --ep 1 --gpus 8 --seq-len 32K --format "
      "json";
  EXPECT_EQ(RunStowage(tp1 + " --no-sequence-parallel").out, RunStowage(tp1).out);
  const Result moe = RunStowage(
      "plan --model qwen3-30b-a3b --hardware h200 --tp 2 --cp 1 --ep 4 --gpus 8 --seq-len 8K "
      "--no-sequence-parallel");
  EXPECT_EQ(moe.code, 2) << moe.out;
  EXPECT_THAT(moe.out, HasSubstr("--tp is 2; a MoE model under tensor parallelism needs sequence "
                                 "parallelism"));
  EXPECT_THAT(moe.out, HasSubstr("drop --no-sequence-parallel or use --tp 1"));
  EXPECT_THAT(RunStowage("plan --help").out, HasSubstr("--no-sequence-parallel"));
}

// torchtitan's own llama3_8b.toml (tests/data/torchtitan, v0.2.2): its run settings plan the
// same as the flags they stand for, and flags given on the command line win.
TEST_F(PlanCommand, FromTorchtitanTakesTheRunSettingsAndFlagsWin) {
  const std::string toml =
      std::string(STOWAGE_SOURCE_DIR) + "/tests/data/torchtitan/llama3_8b.toml";
  const std::string job = "plan --hardware h200 --gpus 8 --format json ";
  const Result from = RunStowage(job + "--from-torchtitan " + toml);
  const Result flags = RunStowage(job +
                                  "--model llama-3.1-8b --tp 1 --cp 1 --pp 1 --seq-len 8192 "
                                  "--micro-batch 1 --sharding optim_grads_params --optimizer adam");
  ASSERT_EQ(flags.code, 0) << flags.out;
  ASSERT_EQ(from.code, 0) << from.out;
  EXPECT_THAT(from.out, HasSubstr(flags.out.substr(flags.out.find('{'))));
  EXPECT_THAT(from.out, HasSubstr("not used from"));
  EXPECT_THAT(from.out, HasSubstr("activation_checkpoint.mode = \"selective\""));
  const Result seq = RunStowage(job + "--from-torchtitan " + toml + " --seq-len 4096");
  EXPECT_THAT(seq.out, HasSubstr("\"seq_len\": 4096"));
  EXPECT_THAT(seq.out, HasSubstr("the command line's --seq-len wins"));
  const Result bad = RunStowage("plan --from-torchtitan " + Path("missing.toml"));
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.out, HasSubstr("--from-torchtitan=" + Path("missing.toml")));
}

// A pipelined job plans the trainer's own split: torchtitan's of the model's 32 layers
// (generate_llm_fqn_per_model_part: 34 = 9 + 9 + 8 + 8, less the embedding's and the output's
// one each), Megatron's layout as written; the command line's --pp-layout wins.
TEST_F(PlanCommand, FromATrainerConfigPlansItsPipelineSplit) {
  {
    std::ofstream(Path("pp.toml")) << "[parallelism]\npipeline_parallel_degree = 4\n"
                                      "[training]\nlocal_batch_size = 8\n";
    std::ofstream(Path("pp.sh")) << "--pipeline-model-parallel-size 4 \\\n"
                                    "  --pipeline-model-parallel-layout 'E,t*7|(t*9|)*2,t*7,L'\n";
  }
  const std::string job =
      "plan --model llama-3.1-8b --hardware h200 --cp 1 --gpus 64 --seq-len 8K --format json ";
  // Each stage's chunk, in stage order, as the plan JSON lists them.
  auto stage_layers = [](const std::string& out) {
    std::vector<int> counts;
    const std::string key = "\"num_layers\": ";
    for (size_t at = out.find(key); at != std::string::npos; at = out.find(key, at)) {
      at += key.size();
      counts.push_back(std::atoi(out.c_str() + at));
    }
    return counts;
  };
  const Result torchtitan = RunStowage(job + "--from-torchtitan " + Path("pp.toml"));
  ASSERT_EQ(torchtitan.code, 0) << torchtitan.out;
  EXPECT_THAT(stage_layers(torchtitan.out), ElementsAre(8, 9, 8, 7));
  const Result megatron = RunStowage(job + "--from-megatron " + Path("pp.sh"));
  ASSERT_EQ(megatron.code, 0) << megatron.out;
  EXPECT_THAT(stage_layers(megatron.out), ElementsAre(7, 9, 9, 7));
  for (const std::string& from :
       {"--from-torchtitan " + Path("pp.toml"), "--from-megatron " + Path("pp.sh")}) {
    const Result given = RunStowage(job + from + " --pp-layout 5,9,9,9");
    ASSERT_EQ(given.code, 0) << given.out;
    EXPECT_THAT(stage_layers(given.out), ElementsAre(5, 9, 9, 9)) << from;
  }
}

// Note [torchtitan expressiveness]: the reference run offloads every layer input but the last
// (which the GPU holds at no cost in step time: Note [Least pinned memory]); torchtitan can only
// checkpoint them, and says so.
TEST_F(PlanCommand, EmitTorchtitanPrintsTheJobSectionsAndWhatItCannotExpress) {
  const Result run = RunStowage("plan --emit torchtitan");
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("[parallelism]\ndata_parallel_replicate_degree = 1\n"
                                 "data_parallel_shard_degree = 8\ntensor_parallel_degree = 1\n"
                                 "context_parallel_degree = 8\n"));
  EXPECT_THAT(run.out, HasSubstr("[training]\nseq_len = 1048576\nlocal_batch_size = 1\n"));
  EXPECT_THAT(run.out, HasSubstr("[activation_checkpoint]\nmode = \"full\"\n"));
  // The decoder layers; the MTP layer after them (Note [MTP layers]) has no torchtitan module.
  EXPECT_THAT(run.out, HasSubstr("# not expressed: layers 0-43 offload their input"));
  EXPECT_THAT(run.out, HasSubstr("# not expressed: the plan trains 1 MTP layer(s); torchtitan's "
                                 "models have no MTP module"));
  const Result keep = RunStowage("plan --emit torchtitan --seq-len 16K --force keep");
  EXPECT_THAT(keep.out, HasSubstr("mode = \"none\""));
  EXPECT_EQ(RunStowage("plan --emit deepspeed").code, 2);
}

// Note [Megatron under pipeline parallelism], Note [torchtitan under pipeline parallelism]: a
// pipelined plan is emitted with its stages and microbatches when one setting expresses it, else
// refused naming a stage and layer (the plan is still written where asked).
TEST_F(PlanCommand, EmitExpressesAPipelineOrRefusesNamingTheStageAndLayer) {
  const std::string base =
      "plan --model llama-3.1-8b --hardware h200 --cp 1 --gpus 64 --pp 4 --microbatches 8 ";
  const Result megatron = RunStowage(base + "--seq-len 8K --pp-layout 7,9,9,7 --emit megatron");
  ASSERT_EQ(megatron.code, 0) << megatron.out;
  EXPECT_THAT(megatron.out, HasSubstr("--pipeline-model-parallel-size 4 \\\n"
                                      "--pipeline-model-parallel-layout 'E,t*7|t*9|t*9|t*7,L' \\\n"
                                      "--global-batch-size 128\n"));  // 8 x 1 x 64 / 4
  const Result titan =
      RunStowage(base + "--seq-len 8K --vpp 2 --schedule interleaved --emit torchtitan");
  ASSERT_EQ(titan.code, 0) << titan.out;
  EXPECT_THAT(titan.out, HasSubstr("pipeline_parallel_degree = 4\n"));
  EXPECT_THAT(titan.out,
              HasSubstr("pipeline_parallel_schedule = \"Interleaved1F1B\"\n"
                        "pipeline_parallel_microbatch_size = 1\n"
                        "module_fqns_per_model_part = [[\"tok_embeddings\", \"layers.0\", "
                        "\"layers.1\", \"layers.2\", \"layers.3\"], [\"layers.4\", "));
  EXPECT_THAT(titan.out, HasSubstr("\"layers.31\", \"norm\", \"output\"]]\n"));
  EXPECT_THAT(titan.out, HasSubstr("local_batch_size = 8\n"));
  EXPECT_THAT(titan.out, HasSubstr("mode = \"none\"\n"));
  // Tight memory: the stages recompute different layers, which neither trainer can say.
  for (const char* emit : {"megatron", "torchtitan"}) {
    const Result refused = RunStowage(base + "--seq-len 64K --gpu-mem 22 --emit " + emit +
                                      " --out " + Path("plan.json"));
    EXPECT_EQ(refused.code, 2) << refused.out;
    EXPECT_THAT(refused.out, HasSubstr(std::string("stowage plan: --emit ") + emit +
                                       " cannot express this pipelined plan: stage "));
    EXPECT_THAT(refused.out, HasSubstr("Run this plan under the stowage runtime"));
    EXPECT_TRUE(std::filesystem::exists(Path("plan.json")));
    std::filesystem::remove(Path("plan.json"));
  }
}

TEST_F(PlanCommand, MaxSeqLenStatesTheJobItAssumedTheStepAndWhatBinds) {
  const Result run = RunStowage("plan --max-seq-len");
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("job: glm-5.3-flash on b200, 64 GPUs, TP 1, CP 8, EP 8"));
  EXPECT_THAT(run.out, HasSubstr("host 204.8 GiB per GPU"));  // 80% of 256 GiB stays pinnable
  EXPECT_THAT(run.out, HasSubstr("longest sequence that fits:"));
  EXPECT_THAT(run.out, HasSubstr(": step "));
  EXPECT_THAT(run.out, HasSubstr("it binds: "));
  // A step-time limit shortens the answer and is what binds (15 s: the step includes its
  // exposed communication, ~6.5 s of FSDP gathers over the network even at 8K tokens).
  const Result timed = RunStowage("plan --max-seq-len --max-step-seconds 15");
  ASSERT_EQ(timed.code, 0) << timed.out;
  EXPECT_THAT(timed.out, HasSubstr("step at most 15 s"));
  EXPECT_THAT(timed.out, HasSubstr("it binds: the step time limit (--max-step-seconds)"));
  auto tokens = [](const std::string& out) {
    const std::string marker = "longest sequence that fits: ";
    return std::stoull(out.substr(out.find(marker) + marker.size()));
  };
  EXPECT_LT(tokens(timed.out), tokens(run.out));
  // Nothing fits one H200 with this model: the answer says fixed memory is why.
  const Result none = RunStowage("plan --max-seq-len --hardware h200 --gpus 8 --cp 1");
  EXPECT_EQ(none.code, 1);
  EXPECT_THAT(none.out, HasSubstr("no sequence length fits"));
  EXPECT_THAT(none.out, HasSubstr("binding: fixed memory"));
  // Asked for a plan file, it still gets one: the closest plan at the shortest length searched.
  const Result none_out =
      RunStowage("plan --max-seq-len --hardware h200 --gpus 8 --cp 1 --out " + Path("none.json"));
  EXPECT_EQ(none_out.code, 1) << none_out.out;
  auto closest = stowage::ReadPlanFile(Path("none.json"));
  ASSERT_TRUE(closest.ok()) << closest.status();
  EXPECT_FALSE(closest->fits);
  EXPECT_EQ(closest->binding.what, "fixed memory");
  EXPECT_EQ(closest->seq_len, 1024u);
}

TEST_F(PlanCommand, DefaultHostBudgetLeavesAFifthOfRamUnpinned) {
  const Result run = RunStowage("plan --seq-len 64K --format json");
  ASSERT_EQ(run.code, 0) << run.out;
  auto plan = stowage::ParsePlanJson(run.out);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // b200: 1 TiB per NUMA node, 4 GPUs each -> 256 GiB per GPU, 80% of it.
  EXPECT_EQ(plan->host_budget_bytes, static_cast<uint64_t>(256.0 * 0.8 * (1ull << 30)));
}

TEST_F(PlanCommand, DefaultPlansTheReferenceRun) {
  const Result run = RunStowage("plan");
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("glm-5.3-flash on b200"));
  EXPECT_THAT(run.out, HasSubstr("1048576 tokens"));
  EXPECT_THAT(run.out, HasSubstr("131072 (1048576 x 1 / CP 8), TP 1, EP 8"));
  EXPECT_THAT(run.out, HasSubstr("(fits)"));
  EXPECT_THAT(run.out, HasSubstr("offload_input"));
  EXPECT_THAT(run.out, HasSubstr("per NUMA node"));
}

TEST_F(PlanCommand, JsonOutAndTimeline) {
  const Result run = RunStowage("plan --seq-len 256K --format json --out " + Path("plan.json") +
                                " --timeline " + Path("t.svg"));
  ASSERT_EQ(run.code, 0) << run.out;
  auto from_stdout = stowage::ParsePlanJson(run.out);
  ASSERT_TRUE(from_stdout.ok()) << from_stdout.status();
  auto from_file = stowage::ReadPlanFile(Path("plan.json"));
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(stowage::PlanToJson(*from_file), run.out);
  EXPECT_EQ(from_file->seq_len, 262144u);
  EXPECT_EQ(from_file->cp, 8);
  EXPECT_TRUE(stowage::ValidatePlan(*from_file).ok());
  std::ifstream svg(Path("t.svg"));
  std::stringstream text;
  text << svg.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("<svg"));
}

TEST_F(PlanCommand, ForcedPoliciesCompare) {
  const Result keep = RunStowage("plan --seq-len 256K --force keep");
  EXPECT_EQ(keep.code, 1) << keep.out;  // keeping everything does not fit a B200
  EXPECT_THAT(keep.out, HasSubstr("DOES NOT FIT"));
  const Result offload = RunStowage("plan --seq-len 256K --force offload_input --format json");
  ASSERT_EQ(offload.code, 0) << offload.out;
  auto plan = stowage::ParsePlanJson(offload.out);
  ASSERT_TRUE(plan.ok()) << plan.status();
  uint64_t decoder = 0;
  for (const stowage::LayerPlan& l : plan->layers) {
    EXPECT_EQ(l.policy, stowage::LayerPolicy::kOffloadInput);
    if (l.name.empty()) decoder += l.host_bytes;
  }
  // The published 45 GiB are the 45 decoder layers' inputs; mtp.0 offloads its own two inputs
  // and the shifted ids: 32768 x (2 x 4096 x 2 + 8) bytes (Note [MTP layers]).
  EXPECT_EQ(decoder, 45ull << 30);
  ASSERT_EQ(plan->layers.back().name, "mtp.0");
  EXPECT_EQ(plan->layers.back().host_bytes, 32768ull * (2 * 4096 * 2 + 8));
  EXPECT_EQ(plan->predicted.host_bytes_per_gpu, decoder + plan->layers.back().host_bytes);
}

TEST_F(PlanCommand, InfeasibleRequestsSayWhatBinds) {
  const Result run = RunStowage("plan --gpu-mem 60");
  EXPECT_EQ(run.code, 1) << run.out;
  EXPECT_THAT(run.out, HasSubstr("does not fit"));
  EXPECT_THAT(run.out, HasSubstr("binding: fixed memory"));
  const Result host = RunStowage("plan --seq-len 2M");
  EXPECT_EQ(host.code, 1) << host.out;
  EXPECT_THAT(host.out, HasSubstr("binding: host memory"));
}

// Note [Plans that do not fit]: nothing fits, yet every output path answers with the closest plan
// (fits: false, what binds in the table's words), and the exit status stays 1.
TEST_F(PlanCommand, NothingFitsStillWritesTheClosestPlanJsonOutAndTimeline) {
  const std::string out = Path("closest.json"), svg = Path("closest.svg");
  const Result json =
      stowage::testing::RunCommand(std::string(STOWAGE_BINARY_DIR) + "/cli/stowage plan " +
                                   "--seq-len 256K --gpu-mem 100 --format json --out " + out +
                                   " --timeline " + svg + " 2>" + Path("err.txt"));
  EXPECT_EQ(json.code, 1) << json.out;
  auto printed = stowage::ParsePlanJson(json.out);  // stdout is the plan alone
  ASSERT_TRUE(printed.ok()) << printed.status() << json.out;
  EXPECT_FALSE(printed->fits);
  EXPECT_EQ(printed->binding.budget, "gpu");
  EXPECT_EQ(printed->binding.exceeded_by_bytes,
            printed->predicted.peak_device_bytes - printed->gpu_budget_bytes);
  EXPECT_GT(printed->binding.exceeded_by_bytes, 0u);
  // The words the table prints on stderr, "binding: <what>", are the plan's.
  std::ifstream err_file(Path("err.txt"));
  std::stringstream err;
  err << err_file.rdbuf();
  EXPECT_THAT(err.str(), HasSubstr("does not fit"));
  EXPECT_THAT(err.str(),
              HasSubstr("binding: " + printed->binding.what + "\n" + printed->binding.explanation));
  auto file = stowage::ReadPlanFile(out);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(stowage::PlanToJson(*file), json.out);
  std::ifstream svg_file(svg);
  std::stringstream picture;
  picture << svg_file.rdbuf();
  EXPECT_THAT(picture.str(), HasSubstr("DOES NOT FIT"));
  EXPECT_THAT(picture.str(), HasSubstr("class=\"exceeded\""));
  EXPECT_THAT(picture.str(), HasSubstr("exceeded by"));
  // The table says it too, then shows the closest plan.
  const Result table = RunStowage("plan --seq-len 256K --gpu-mem 100");
  EXPECT_EQ(table.code, 1);
  EXPECT_THAT(table.out, HasSubstr("the closest plan (it does not fit):"));
  EXPECT_THAT(table.out, HasSubstr("DOES NOT FIT"));
  // Fixed memory over the budget: still a plan, binding "fixed memory".
  const Result fixed = RunStowage("plan --gpu-mem 60 --out " + Path("fixed.json"));
  EXPECT_EQ(fixed.code, 1) << fixed.out;
  auto fixed_plan = stowage::ReadPlanFile(Path("fixed.json"));
  ASSERT_TRUE(fixed_plan.ok()) << fixed_plan.status();
  EXPECT_EQ(fixed_plan->binding.what, "fixed memory");
}

TEST_F(PlanCommand, NothingFitsInAPipelineNamesTheBindingStage) {
  const std::string out = Path("pp.json");
  const Result run = RunStowage(
      "plan --model llama-3.1-8b --hardware h200 --seq-len 64K --cp 1 --gpus 64 --pp 4 "
      "--microbatches 8 --gpu-mem 12 --out " +
      out);
  EXPECT_EQ(run.code, 1) << run.out;
  EXPECT_THAT(run.out, HasSubstr("does not fit"));
  auto plan = stowage::ReadPlanFile(out);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->fits);
  // The last stage runs the LM head and loss over the whole vocabulary.
  EXPECT_EQ(plan->binding.stage, 3);
  EXPECT_EQ(plan->binding.what, "LM head and loss");
  EXPECT_EQ(plan->binding.exceeded_by_bytes,
            plan->stages[3].peak_device_bytes - plan->gpu_budget_bytes);
}

TEST_F(PlanCommand, MaxSeqLen) {
  const Result run = RunStowage("plan --max-seq-len --hardware h200 --cp 16 --gpus 128");
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("longest sequence that fits:"));
}

// Regression: under --framework hf, where the loss binds, the answer advised "a smaller
// --loss-chunk-tokens", which --framework hf refuses (transformers' loss takes every token).
TEST_F(PlanCommand, MaxSeqLenUnderHfAdvisesWhatHfRuns) {
  const Result run =
      RunStowage("plan --framework hf --model llama-3-8b --max-seq-len --hardware h200 --gpus 8");
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("it binds: LM head and loss"));
  EXPECT_THAT(run.out, ::testing::Not(HasSubstr("try a smaller --loss-chunk-tokens")));
  EXPECT_THAT(run.out, HasSubstr("with --framework hf the loss covers every token at once"));
}

// The families, their aliases and the presets; a real config's notes and count.
TEST_F(PlanCommand, ListModelsAndConfigNotes) {
  const Result list = RunStowage("plan --list-models");
  EXPECT_EQ(list.code, 0) << list.out;
  EXPECT_THAT(list.out, HasSubstr("deepseek_v3: DeepseekV3ForCausalLM, kimi_k2"));
  EXPECT_THAT(list.out, HasSubstr("llama-3.1-405b (llama): 405.85B"));
  const Result oss = RunStowage("plan --model " + std::string(STOWAGE_SOURCE_DIR) +
                                "/tests/planner/data/hf/gpt-oss-20b.json --seq-len 32K --cp 1 "
                                "--gpus 8 --ep 8 --hardware h200");
  EXPECT_EQ(oss.code, 0) << oss.out;
  EXPECT_THAT(oss.out, HasSubstr("from architectures[0] 'GptOssForCausalLM'"));
  EXPECT_THAT(oss.out, HasSubstr("quantization_config (mxfp4) is not used for training"));
  EXPECT_THAT(oss.out, HasSubstr("model parameters       20914757184 (20.91B)"));
  EXPECT_THAT(oss.out, HasSubstr("sliding_attention+moe"));
  const Result bad = RunStowage("plan --model " + Path("falcon.json"));
  EXPECT_EQ(bad.code, 2);
  std::ofstream(Path("falcon.json")) << R"({"architectures": ["FalconForCausalLM"]})";
  const Result falcon = RunStowage("plan --model " + Path("falcon.json"));
  EXPECT_EQ(falcon.code, 2);
  EXPECT_THAT(falcon.out,
              HasSubstr("unsupported model: architecture 'FalconForCausalLM' (architectures[0])"));
}

TEST_F(PlanCommand, OtherModelsAndProfiles) {
  const Result llama =
      RunStowage("plan --model llama-3-8b --seq-len 128K --cp 2 --gpus 8 --hardware h200");
  EXPECT_EQ(llama.code, 0) << llama.out;
  EXPECT_THAT(llama.out, HasSubstr("attention+dense_ffn"));
  const Result hf = RunStowage("plan --model " + std::string(STOWAGE_SOURCE_DIR) +
                               "/tests/planner/data/glm-5.3-flash.config.json --seq-len 256K");
  EXPECT_EQ(hf.code, 0) << hf.out;
  std::ofstream(Path("hw.json")) << R"({"name": "lab", "hbm_bytes": 150000000000,
      "hbm_bytes_per_second": 4e12, "dense_bf16_flops": 1e15, "d2h_bytes_per_second": 5e10,
      "h2d_bytes_per_second": 5e10, "host_bytes_per_numa_node": 1000000000000,
      "gpus_per_numa_node": 4})";
  const Result profile = RunStowage("plan --seq-len 256K --hardware " + Path("hw.json"));
  EXPECT_EQ(profile.code, 0) << profile.out;
  EXPECT_THAT(profile.out, HasSubstr("(measured figures)"));
}

TEST_F(PlanCommand, BadInputIsAUsageError) {
  Result run = RunStowage("plan --seq-len banana");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("seq-len"));
  run = RunStowage("plan --force sometimes");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("--force is 'sometimes'; allowed: keep, recompute, "
                                 "selective_recompute, offload_input, offload_saved"));
  // The old spelling names the policy it meant.
  run = RunStowage("plan --force offload");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("--force offload is now --force offload_input"));
  // Note [Optimality gap]: the flag, the value and the range.
  for (const char* bad : {"-0.1", "0.5", "nan", "tight"}) {
    run = RunStowage(std::string("plan --optimality-gap ") + bad);
    EXPECT_EQ(run.code, 2) << bad;
    EXPECT_THAT(run.out, HasSubstr(std::string("--optimality-gap is ")));
    EXPECT_THAT(run.out, HasSubstr("0 (prove the plan optimal) to 0.01")) << run.out;
  }
  run = RunStowage("plan --seq-len 256K --optimality-gap 0 --format json");
  EXPECT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("\"optimality\": \"proven\""));
  // Note [hf transformers versions]: the flag, the value and the rule; hf only.
  run = RunStowage("plan --framework hf --tp 1 --cp 1 --ep 1 --gpus 1 --transformers 5.16");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("--transformers is '5.16'; allowed: a transformers release 5.N "
                                 "or 5.N.P with N >= 17"));
  run = RunStowage("plan --transformers 5.23");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("--transformers applies to --framework hf only"));
  run = RunStowage("plan --model nope");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("unknown model preset 'nope'"));
  run = RunStowage("plan --cp 3");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("--seq-len is 1048576; it must be a multiple of --cp (3)"));
  run = RunStowage("plan --frobnicate");
  EXPECT_EQ(run.code, 2);
  run = RunStowage("plan --help");
  EXPECT_EQ(run.code, 0);
  EXPECT_THAT(run.out, HasSubstr("--moe-imbalance"));
}

// The parallel sizes' defaults follow --framework: transformers eager runs no CP or EP, so an
// MoE model under hf plans at CP 1, EP 1 without being told (the reference run's 8 and 8 were
// refused as though the user had asked for them); a size the user does give is still checked.
TEST_F(PlanCommand, HfDefaultsToNoContextOrExpertParallelism) {
  const std::string moe = "plan --model " + std::string(STOWAGE_SOURCE_DIR) +
                          "/tests/planner/data/measured/qwen3moe-6layer.config.json --seq-len 8K";
  const Result run = RunStowage(moe + " --framework hf --format json");
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("\"cp\": 1,"));
  EXPECT_THAT(run.out, HasSubstr("\"ep\": 1,"));
  const Result megatron = RunStowage(moe + " --format json");
  EXPECT_THAT(megatron.out, HasSubstr("\"cp\": 8,"));
  EXPECT_THAT(megatron.out, HasSubstr("\"ep\": 8,"));
  for (const std::string flag : {"cp", "ep"}) {
    const Result given = RunStowage(moe + " --framework hf --" + flag + " 2");
    EXPECT_EQ(given.code, 2) << given.out;
    EXPECT_THAT(given.out, HasSubstr("--" + flag + " is 2 with --framework hf"));
  }
  EXPECT_THAT(RunStowage("plan --help").out, HasSubstr("(default: 8 (1 with --framework hf))"));
  // Note [hf data parallel]: the summary names torch's engine the sharding stands for.
  EXPECT_THAT(RunStowage(moe + " --framework hf --gpus 8").out,
              HasSubstr("8 GPUs, sharding optim_grads_params (torch FSDP2 fully_shard)\n"));
  EXPECT_THAT(RunStowage(moe + " --framework hf --gpus 8 --sharding no_shard").out,
              HasSubstr("sharding no_shard (torch DDP)\n"));
  EXPECT_THAT(RunStowage(moe + " --framework hf --gpus 1").out,
              HasSubstr("1 GPUs, sharding optim_grads_params (no data-parallel engine: one rank)"));
}

// Regressions: wrapped numbers planned "fits" with exit 0; --loss-chunk-tokens 0 was
// documented but rejected; `--tp --format json` blamed "json".
TEST_F(PlanCommand, HostileNumbersAreClearUsageErrors) {
  Result run = RunStowage("plan --model llama-3-8b --seq-len 9007199254740992");
  EXPECT_EQ(run.code, 2) << run.out;
  EXPECT_THAT(run.out, HasSubstr("--seq-len is 9007199254740992; allowed: 1 to 1073741824"));
  run = RunStowage("plan --model llama-3-8b --tp --format json");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("flag '--tp' needs a value (N) but is followed by '--format'"));
  run = RunStowage("plan --model llama-3-8b --seq-len 32K --cp 1 --gpus 8 --loss-chunk-tokens 0");
  EXPECT_EQ(run.code, 0) << run.out;
  std::ofstream(Path("neg.json")) << R"({"hbm_bytes": -1, "hbm_bytes_per_second": 4e12,
      "dense_bf16_flops": 1e15, "d2h_bytes_per_second": 5e10, "h2d_bytes_per_second": 5e10})";
  run = RunStowage("plan --hardware " + Path("neg.json"));
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("field 'hbm_bytes' has value -1; allowed: an integer in"));
}

}  // namespace

namespace {

// Every stage planned, the binding one named, the plan carrying one section per stage.
TEST_F(PlanCommand, PipelinePlansEveryStage) {
  const std::string out = Path("pp.json");
  const Result run = RunStowage(
      "plan --model llama-3.1-8b --hardware h200 --seq-len 8K --cp 1 --gpus 64 "
      "--pipeline-model-parallel-size 4 --microbatches 8 --out " +
      out);
  ASSERT_EQ(run.code, 0) << run.out;
  for (int stage = 0; stage < 4; ++stage) {
    EXPECT_THAT(run.out, HasSubstr("\nstage " + std::to_string(stage) + "\n"));
  }
  EXPECT_THAT(run.out, HasSubstr("<- binding"));
  EXPECT_THAT(run.out, HasSubstr("PP 4, 1f1b, 8 microbatches: step = (8 + 3/1) x"));
  auto plan = stowage::ReadPlanFile(out);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->pp, 4);
  ASSERT_EQ(plan->stages.size(), 4u);
  EXPECT_EQ(plan->layers[0].in_flight_microbatches, 4);
  EXPECT_EQ(plan->layers[31].in_flight_microbatches, 1);
}

// --rank-order tp-cp-ep-pp-dp (Megatron's --use-tp-pp-dp-mapping) puts the two
// stages of TP 4 x PP 2 on 64 H200s 4 ranks apart, inside an 8-GPU NVLink domain, instead of 32
// apart across the network: the exposed point-to-point time of the step drops (5 waited
// exchanges of 8192 / 4 x 4096 x 2 bytes: 5 x (16 MiB / 450 GB/s + 3.4 us) against
// 5 x (16 MiB / 50 GB/s + 14 us)); Megatron gets the flag, torchtitan (PP outermost) refuses;
// an unknown order names the flag, the value and the allowed values.
TEST_F(PlanCommand, RankOrderMovesPipelineNeighboursOntoNvlink) {
  const std::string base =
      "plan --model llama-3.1-8b --hardware h200 --seq-len 8K --tp 4 --cp 1 --gpus 64 --pp 2 "
      "--microbatches 4 ";
  const Result pp_last = RunStowage(base + "--out " + Path("pp_last.json"));
  ASSERT_EQ(pp_last.code, 0) << pp_last.out;
  EXPECT_THAT(pp_last.out, HasSubstr("over network (rank order tp-cp-ep-dp-pp: stages 32 ranks"));
  const Result dp_last =
      RunStowage(base + "--rank-order tp-cp-ep-pp-dp --out " + Path("dp_last.json"));
  ASSERT_EQ(dp_last.code, 0) << dp_last.out;
  EXPECT_THAT(dp_last.out, HasSubstr("over NVLink (rank order tp-cp-ep-pp-dp: stages 4 ranks"));
  auto a = stowage::ReadPlanFile(Path("pp_last.json"));
  auto b = stowage::ReadPlanFile(Path("dp_last.json"));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  const double message = 8192.0 / 4 * 4096 * 2;
  EXPECT_NEAR(a->predicted.exposed_point_to_point_seconds, 5 * (message / 50e9 + 14e-6), 1e-9);
  EXPECT_NEAR(b->predicted.exposed_point_to_point_seconds, 5 * (message / 450e9 + 3.4e-6), 1e-9);
  EXPECT_LT(b->predicted.exposed_point_to_point_seconds,
            a->predicted.exposed_point_to_point_seconds);
  EXPECT_EQ(RunStowage(base + "--rank-order tp-cp-ep-dp-pp --out " + Path("default.json")).code, 0);
  auto same = stowage::ReadPlanFile(Path("default.json"));
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->predicted.exposed_point_to_point_seconds,
            a->predicted.exposed_point_to_point_seconds);
  const Result megatron = RunStowage(base + "--rank-order tp-cp-ep-pp-dp --emit megatron");
  ASSERT_EQ(megatron.code, 0) << megatron.out;
  EXPECT_THAT(megatron.out, HasSubstr("--pipeline-model-parallel-size 2 \\\n"
                                      "--use-tp-pp-dp-mapping \\\n"));
  EXPECT_THAT(RunStowage(base + "--emit megatron").out,
              ::testing::Not(HasSubstr("--use-tp-pp-dp-mapping")));
  const Result titan = RunStowage(base + "--rank-order tp-cp-ep-pp-dp --emit torchtitan");
  EXPECT_NE(titan.code, 0);
  EXPECT_THAT(titan.out, HasSubstr("--rank-order is tp-cp-ep-pp-dp; torchtitan's device mesh "
                                   "puts the pipeline outermost"));
  const Result bad = RunStowage(base + "--rank-order pp-dp");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("--rank-order is 'pp-dp'; allowed: tp-cp-ep-dp-pp (Megatron's "
                                 "default, pipeline outermost), tp-cp-ep-pp-dp"));
}

TEST_F(PlanCommand, PipelineFlagErrors) {
  const std::string base = "plan --model llama-3.1-8b --hardware h200 --seq-len 8K --cp 1 ";
  Result run = RunStowage(base + "--pp 4 --vpp 2");
  EXPECT_NE(run.code, 0);
  EXPECT_THAT(run.out,
              HasSubstr("--vpp is 2; virtual stages run only under --schedule interleaved"));
  run = RunStowage(base + "--pp 3 --gpus 63");
  EXPECT_THAT(run.out, HasSubstr("give the layers of each with --pp-layout, e.g. --pp-layout"));
  run = RunStowage(base + "--pp 4 --pp-layout 8,8,8,x");
  EXPECT_THAT(run.out, HasSubstr("--pp-layout is '8,8,8,x'; allowed: layer counts"));
  run = RunStowage(base + "--pp 4 --schedule interleaved --vpp 2 --microbatches 2");
  EXPECT_THAT(run.out, HasSubstr("the interleaved schedule needs at least --pp (4) microbatches"));
  run = RunStowage(base + "--pp 4 --microbatches 4 --global-batch 64");
  EXPECT_THAT(run.out, HasSubstr("give one"));
}

}  // namespace

namespace {

// Note [MTP layers]: the default plan trains GLM-5.3-Flash's MTP layer and still fits;
// --mtp-layers 0 trains none; --framework hf refuses --mtp-layers > 0; --emit megatron says it.
TEST_F(PlanCommand, MtpLayersAreTrainedUnderMegatronAndRefusedUnderHf) {
  const Result plan = RunStowage("plan");
  ASSERT_EQ(plan.code, 0) << plan.out;
  EXPECT_THAT(plan.out, HasSubstr("\n    mtp.0  mtp+kda+moe"));
  EXPECT_THAT(plan.out, HasSubstr("multi-token prediction 1 MTP layer trained"));
  const Result json = RunStowage("plan --format json");
  EXPECT_THAT(json.out, HasSubstr("\"mtp_layers\": 1"));
  EXPECT_THAT(json.out, HasSubstr("\"name\": \"mtp.0\""));
  const Result none = RunStowage("plan --mtp-layers 0 --format json");
  ASSERT_EQ(none.code, 0) << none.out;
  EXPECT_THAT(none.out, ::testing::Not(HasSubstr("mtp_layers")));
  EXPECT_THAT(none.out, ::testing::Not(HasSubstr("mtp.0")));
  EXPECT_THAT(RunStowage("plan --mtp-layers 0").out,
              HasSubstr("multi-token prediction not trained (--mtp-layers 0)"));
  const Result hf = RunStowage("plan --model deepseek-v3 --framework hf --mtp-layers 1");
  EXPECT_EQ(hf.code, 2) << hf.out;
  EXPECT_THAT(hf.out, HasSubstr("--mtp-layers is 1; --framework hf plans transformers models, "
                                "which drop the MTP weights on load"));
  EXPECT_THAT(RunStowage("plan --emit megatron").out, HasSubstr("--mtp-num-layers 1"));
  EXPECT_THAT(RunStowage("plan --mtp-layers 0 --emit megatron").out,
              ::testing::Not(HasSubstr("--mtp-num-layers")));
}

}  // namespace
