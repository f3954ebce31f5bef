// The pipeline split (planner/cost/pipeline_layout.h, Note [Pipeline] in
// planner/search/pipeline.cc): Megatron's even split of the layers over stages and virtual
// stages, with and without the embedding and loss counted, --pp-layout, and the checks of the
// pipeline settings against each other and the model.
#include "planner/cost/pipeline_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "planner/cost/run_settings.h"
#include "planner/model/model.h"
#include "stowage/plan.h"
#include "tests/planner/pipeline_runs.h"

namespace stowage::planner {
namespace {

using ::testing::HasSubstr;

std::vector<int> Counts(const std::vector<LayerRange>& ranges) {
  std::vector<int> out;
  for (const LayerRange& r : ranges) out.push_back(r.num_layers);
  return out;
}

TEST(PipelineSplit, MegatronEvenSplitAndAccounting) {
  const ModelConfig llama = *ModelPreset("llama-3.1-8b");  // 32 layers
  RunSettings run = PpRun(4, 4);
  EXPECT_EQ(Counts(*VirtualStageLayers(llama, run)), (std::vector<int>{8, 8, 8, 8}));
  // Counting the embedding and the loss as layers: 34 do not divide by 4 ...
  run.account_for_embedding_in_pipeline_split = true;
  run.account_for_loss_in_pipeline_split = true;
  EXPECT_THAT(VirtualStageLayers(llama, run).status().message(),
              HasSubstr("(34 with the embedding / loss counted) do not divide evenly over 4"));
  // ... but by 2: 17 per stage, the first and the last one fewer.
  run.pp = 2;
  run.gpus = 64;
  EXPECT_EQ(Counts(*VirtualStageLayers(llama, run)), (std::vector<int>{16, 16}));
  run.account_for_loss_in_pipeline_split = false;  // 33: not divisible by 2
  EXPECT_FALSE(VirtualStageLayers(llama, run).ok());
}

TEST(PipelineSplit, VirtualStagesAreChunksOfEachStage) {
  const ModelConfig llama = *ModelPreset("llama-3.1-8b");
  RunSettings run = PpRun(2, 4);
  run.vpp = 4;
  run.schedule = PipelineSchedule::kInterleaved;
  auto split = VirtualStageLayers(llama, run);
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ(split->size(), 8u);
  // Virtual stage c x 2 + s is chunk c of stage s: stage 1 runs layers 4-7, 12-15, 20-23, 28-31.
  const std::vector<LayerRange> chunks = StageChunks(*split, 2, 4, 1);
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[0].first_layer, 4);
  EXPECT_EQ(chunks[1].first_layer, 12);
  EXPECT_EQ(chunks[3].first_layer, 28);
  EXPECT_EQ(chunks[3].num_layers, 4);
}

TEST(PipelineSplit, Errors) {
  const ModelConfig llama = *ModelPreset("llama-3.1-8b");
  RunSettings run = PpRun(3, 3);
  run.gpus = 63;
  EXPECT_THAT(ValidatePipeline(llama, run).message(),
              HasSubstr("--pp is 3; the model's 32 layers do not divide evenly over 3 stages; "
                        "give the layers of each with --pp-layout, e.g. --pp-layout 10,11,11"));
  run.pp_layout = {10, 11, 10};
  EXPECT_THAT(ValidatePipeline(llama, run).message(),
              HasSubstr("--pp-layout is 10,11,10; it places 31 layers; the model has 32"));
  run.pp_layout = {10, 11, 11};
  EXPECT_TRUE(ValidatePipeline(llama, run).ok());
  run.pp_layout = {10, 22};
  EXPECT_THAT(ValidatePipeline(llama, run).message(),
              HasSubstr("allowed: one per stage (--pp = 3)"));
  run = PpRun(4, 8);
  run.vpp = 2;
  EXPECT_THAT(ValidatePipeline(llama, run).message(),
              HasSubstr("--vpp is 2; virtual stages run only under --schedule interleaved"));
  run.schedule = PipelineSchedule::kInterleaved;
  run.microbatches = 2;
  EXPECT_THAT(ValidatePipeline(llama, run).message(),
              HasSubstr("--microbatches is 2; the interleaved schedule needs at least --pp (4)"));
  run.microbatches = 6;
  EXPECT_THAT(ValidatePipeline(llama, run).message(), HasSubstr("use a multiple of 4"));
  run = PpRun(4, 4);
  run.gpus = 6;
  EXPECT_THAT(ValidatePipeline(llama, run).message(),
              HasSubstr("--gpus is 6; it must be a multiple of --tp x --cp x --pp (4)"));
}

// Megatron-Core refuses tp-cp-ep-pp-dp under PP unless the expert grid's data-parallel size is
// the dense grid's (parallel_state.py initialize_model_parallel): expert tp x ep = tp x cp, with
// expert tp 1 in MoE layers here and Megatron's default, --tp, for a dense model.
TEST(ValidatePipeline, TpPpDpOrderNeedsMatchingExpertGrid) {
  RunSettings run;
  run.seq_len = 8192;
  run.gpus = 64;
  run.pp = 2;
  run.microbatches = 2;
  run.rank_order = RankOrder::kTpCpEpPpDp;
  const ModelConfig qwen = *ModelPreset("qwen3-30b-a3b");
  run.tp = 2;
  run.cp = 2;
  run.ep = 8;
  EXPECT_THAT(ValidatePipeline(qwen, run).message(),
              HasSubstr("--rank-order is tp-cp-ep-pp-dp; with --pp 2 Megatron-Core needs the "
                        "expert grid's pipeline groups to be the dense grid's"));
  EXPECT_THAT(ValidatePipeline(qwen, run).message(),
              HasSubstr("expert tp x --ep (1 x 8) must equal --tp x --cp (2 x 2)"));
  run.ep = 4;
  EXPECT_TRUE(ValidatePipeline(qwen, run).ok()) << ValidatePipeline(qwen, run);
  run.rank_order = RankOrder::kTpCpEpDpPp;
  run.ep = 8;
  EXPECT_TRUE(ValidatePipeline(qwen, run).ok()) << ValidatePipeline(qwen, run);
  const ModelConfig llama = *ModelPreset("llama-3.1-8b");
  run.rank_order = RankOrder::kTpCpEpPpDp;
  run.ep = 1;
  EXPECT_THAT(ValidatePipeline(llama, run).message(), HasSubstr("--cp 1"));
  run.cp = 1;
  EXPECT_TRUE(ValidatePipeline(llama, run).ok()) << ValidatePipeline(llama, run);
}

}  // namespace
}  // namespace stowage::planner
