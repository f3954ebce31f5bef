// Megatron-LM's own launch scripts (tests/data/megatron-scripts, copied from Megatron-LM's
// examples/ at the commit its README names), each read as the job it launches: the GPUs, the
// parallel sizes, the sequence length and batch, and the model its arguments describe with its
// parameter count. Hand-checked counts are worked out beside each case.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bridges/megatron_model.h"
#include "bridges/megatron_read.h"
#include "planner/model/model.h"

namespace stowage::bridges {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Pair;

struct Read {
  TrainerSettings settings;
  std::map<std::string, std::string> flags;
};

Read ReadScript(const std::string& name, std::vector<std::string> args = {},
                std::map<std::string, std::string> env = {}) {
  const std::string path = std::string(STOWAGE_SOURCE_DIR) + "/tests/data/megatron-scripts/" + name;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_TRUE(in.good()) << path;
  auto s =
      ReadMegatronSettings(text.str(), name, ShellEnvironment{std::move(args), std::move(env)});
  EXPECT_TRUE(s.ok()) << s.status();
  Read out;
  if (!s.ok()) return out;
  out.settings = *s;
  for (const auto& [flag, value] : s->flags) out.flags[flag] = value;
  return out;
}

// The planner's parameter count of the model the arguments describe.
uint64_t Parameters(const Read& r, int vocab, std::vector<std::string>* notes = nullptr) {
  std::vector<std::string> own;
  EXPECT_TRUE(r.settings.model_arguments.has_value());
  if (!r.settings.model_arguments.has_value()) return 0;
  const int tp = r.flags.contains("tp") ? std::stoi(r.flags.at("tp")) : 1;
  auto m = MegatronModel(*r.settings.model_arguments, tp, vocab, "script", notes ? *notes : own);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? planner::ModelParameters(*m) : 0;
}

int TokenizerVocab(const Read& r) {
  std::string origin;
  return MegatronTokenizerVocab(*r.settings.model_arguments, origin).value_or(-1);
}

// examples/gpt3/train_gpt3_175b_distributed.sh: 96 layers of width 12288, GeLU, LayerNorm,
// biases, learned positions (2048), tied embeddings. It names no --tokenizer-type (its vocab file
// is $3), so GPT-2's 50,257 tokens come from --vocab-size; padded to 128 x TP 8: 51,200.
TEST(MegatronScripts, Gpt3175B) {
  const Read r = ReadScript("gpt3_175b.sh");
  EXPECT_EQ(r.flags.at("gpus"), "8");
  EXPECT_EQ(r.settings.origins.at("gpus"), "torchrun --nproc_per_node 8 x --nnodes 1, line 77");
  EXPECT_EQ(r.flags.at("tp"), "8");
  EXPECT_EQ(r.flags.at("pp"), "16");
  EXPECT_FALSE(r.flags.contains("cp"));
  EXPECT_EQ(r.flags.at("seq-len"), "2048");
  EXPECT_EQ(r.flags.at("micro-batch"), "1");
  EXPECT_EQ(r.flags.at("global-batch"), "1536");
  EXPECT_EQ(TokenizerVocab(r), -1);
  // Megatron-Core: per layer qkv 3h^2+3h, proj h^2+h, fc1 4h^2+4h, fc2 4h^2+h, two LayerNorms
  // 4h = 1,812,099,072; x96, + embedding 51,200 x h, positions 2,048 x h, final LayerNorm 2h:
  // 174,615,846,912. The planner counts the SwiGLU of equal weight (width 8h/3, its biases
  // 16,384 more a layer) and RMSNorm (2h less a layer, h less at the end): 798,720 fewer.
  std::vector<std::string> notes;
  EXPECT_EQ(Parameters(r, 50257, &notes), 174615846912ull - 798720ull);
  EXPECT_THAT(notes, Contains(HasSubstr("Megatron-Core holds 798720 more parameters")));
  // Its data paths are $3, $4, $5: not given, named, not needed.
  EXPECT_THAT(r.settings.notes, Contains(HasSubstr("gpt3_175b.sh:17: $3 is not given")));
  EXPECT_TRUE(r.settings.needs.empty());
}

// examples/llama/train_llama3_8b_h100_fp8.sh with its defaults (MOCK data: --vocab-size 128256).
TEST(MegatronScripts, Llama3With8BFp8) {
  const Read r = ReadScript("llama3_8b_h100_fp8.sh");
  EXPECT_EQ(r.flags.at("gpus"), "8");
  EXPECT_EQ(r.flags.at("tp"), "1");
  EXPECT_EQ(r.flags.at("cp"), "1");
  EXPECT_FALSE(r.flags.contains("pp"));  // commented out in the script
  EXPECT_EQ(r.flags.at("seq-len"), "8192");
  EXPECT_EQ(r.flags.at("micro-batch"), "1");
  EXPECT_EQ(r.flags.at("global-batch"), "128");
  EXPECT_EQ(r.flags.at("sharding"), "optim");
  EXPECT_EQ(r.flags.at("grad-dtype"), "bf16");
  EXPECT_EQ(TokenizerVocab(r), 128256);
  // Meta-Llama-3-8B's 8,030,261,248: the llama-3-8b preset's count.
  EXPECT_EQ(Parameters(r, 128256), 8030261248ull);
  EXPECT_EQ(Parameters(r, 128256), planner::ModelParameters(*planner::ModelPreset("llama-3-8b")));
  EXPECT_THAT(r.settings.job, Contains(HasSubstr("precision bf16 with fp8 hybrid")));
  // The real-data branch: a tokenizer path as $3.
  const Read real = ReadScript("llama3_8b_h100_fp8.sh", {"/ckpt", "/tb", "/tok", "/data"});
  EXPECT_EQ(Parameters(real, 128256), 8030261248ull);
}

// examples/mixtral/train_mixtral_8x7b_distributed.sh: Mistral's 32,000 tokens (its tokenizer is
// $2, so the vocabulary comes from --vocab-size); 46,702,792,704 parameters.
TEST(MegatronScripts, Mixtral8x7B) {
  const Read r = ReadScript("mixtral_8x7b.sh");
  EXPECT_EQ(r.flags.at("gpus"), "8");
  EXPECT_EQ(r.flags.at("tp"), "1");
  EXPECT_EQ(r.flags.at("pp"), "4");
  EXPECT_EQ(r.flags.at("ep"), "8");
  EXPECT_EQ(r.flags.at("seq-len"), "4096");
  EXPECT_EQ(r.flags.at("micro-batch"), "1");
  EXPECT_EQ(r.flags.at("global-batch"), "256");
  EXPECT_EQ(TokenizerVocab(r), -1);
  EXPECT_EQ(Parameters(r, 32000), 46702792704ull);
  // SLURM_NNODES from the environment: 4 nodes of 8.
  EXPECT_EQ(ReadScript("mixtral_8x7b.sh", {}, {{"SLURM_NNODES", "4"}}).flags.at("gpus"), "32");
}

// examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh: DeepSeek-V3 with one MTP depth under
// Megatron-FSDP, its #SBATCH lines placeholders (so the GPU count must come from --gpus).
TEST(MegatronScripts, DeepSeekV3MegatronFsdp) {
  const Read r = ReadScript("deepseek_v3_mfsdp.sh");
  EXPECT_FALSE(r.flags.contains("gpus"));
  EXPECT_THAT(r.settings.needs,
              Contains(Pair("gpus", HasSubstr("--ntasks-per-node your_own_tasks_per_node"))));
  EXPECT_EQ(r.flags.at("tp"), "1");
  EXPECT_EQ(r.flags.at("ep"), "8");
  EXPECT_EQ(r.flags.at("cp"), "1");
  EXPECT_EQ(r.flags.at("seq-len"), "4096");
  EXPECT_EQ(r.flags.at("micro-batch"), "4");
  EXPECT_EQ(r.flags.at("global-batch"), "2048");
  EXPECT_EQ(r.flags.at("sharding"), "optim_grads_params");
  EXPECT_EQ(r.flags.at("mtp-layers"), "1");
  EXPECT_THAT(r.settings.job, Contains(HasSubstr("Megatron-FSDP optim_grads_params")));
  EXPECT_THAT(r.settings.job, Contains(HasSubstr("--recompute-granularity selective")));
  // The tokenizer's 128,815 tokens padded to a multiple of 3232: 129,280, the checkpoint's.
  EXPECT_EQ(TokenizerVocab(r), 128815);
  planner::ModelConfig v3 = *planner::ModelPreset("deepseek-v3");
  v3.mtp_layers = 1;
  EXPECT_EQ(Parameters(r, 128815), planner::ModelParameters(v3));
  // The script's knobs are environment variables.
  const Read tp2 = ReadScript("deepseek_v3_mfsdp.sh", {}, {{"TP", "2"}, {"MBS", "1"}});
  EXPECT_EQ(tp2.flags.at("tp"), "2");
  EXPECT_EQ(tp2.flags.at("micro-batch"), "1");
}

// examples/gptoss/02_train.sh: a 12-layer gpt-oss of width 512 on PP = WORLD_SIZE = 8.
TEST(MegatronScripts, GptOss) {
  const Read r = ReadScript("gptoss_train.sh");
  EXPECT_EQ(r.flags.at("gpus"), "8");
  EXPECT_EQ(r.settings.origins.at("gpus"),
            "python -m torch.distributed.run --nproc_per_node 8 x --nnodes 1, line 253");
  EXPECT_EQ(r.flags.at("pp"), "8");
  EXPECT_EQ(r.flags.at("tp"), "1");
  EXPECT_EQ(r.flags.at("ep"), "1");
  EXPECT_EQ(r.flags.at("seq-len"), "8192");
  EXPECT_EQ(r.flags.at("micro-batch"), "1");
  EXPECT_EQ(r.flags.at("global-batch"), "128");
  // Embedding and output 2 x 128,256 x 512, final norm 512; a layer: norms 1,024, q 512 x 512,
  // k and v 2 x 512 x 64, o 512 x 512, 64 sinks, router 512 x 4, 4 experts 3 x 512 x 2,048:
  // 13,175,872; 12 layers: 289,445,120.
  EXPECT_EQ(Parameters(r, 128256), 289445120ull);
  EXPECT_THAT(r.settings.job, Contains(HasSubstr("--recompute-activations")));
  // Its own options parser: `--checkpoint-path DIR` among the script's arguments.
  const Read with_args = ReadScript("gptoss_train.sh", {"--checkpoint-path", "/ck", "--data", "x"});
  EXPECT_EQ(with_args.flags.at("pp"), "8");
}

}  // namespace
}  // namespace stowage::bridges
