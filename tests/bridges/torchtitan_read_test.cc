// The torchtitan reader (bridges/torchtitan_read.h): job configs, torchtitan's own examples among
// them, and torchtitan's own split of the layers over the pipeline stages.
#include "bridges/torchtitan_read.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace stowage::bridges {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsSupersetOf;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

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
}  // namespace stowage::bridges
