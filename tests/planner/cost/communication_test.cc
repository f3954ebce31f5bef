// The communication model against hand-computed byte counts per collective and the alpha-beta
// times of Note [Communication] (planner/cost/communication.cc).
#include "planner/cost/communication.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "planner/cost/cost_model.h"
#include "planner/cost/reference_jobs.h"
#include "planner/cost/run_settings.h"
#include "planner/frameworks/step_cost.h"
#include "planner/model/model.h"
#include "planner/search/optimizer.h"
#include "planner/search/simulator.h"

namespace stowage::planner {
namespace {

using ::testing::HasSubstr;

StepCost Build(const std::string& model, const std::string& hardware, const RunSettings& run) {
  auto step = BuildStepCost(*ModelPreset(model), *HardwarePreset(hardware), run);
  EXPECT_TRUE(step.ok()) << step.status();
  return *step;
}

// The op named `name` of layer `layer` (or of the step when layer < 0).
const CommOp* Find(const StepCost& step, int layer, const std::string& name) {
  const std::vector<CommOp>& ops = layer < 0 ? step.comm.step_ops : step.comm.layers[layer].ops;
  for (const CommOp& op : ops) {
    if (op.name == name) return &op;
  }
  return nullptr;
}

double Seconds(const StepCost& step, LayerPolicy policy) {
  Schedule s;
  s.options.assign(step.layers.size(), LayerOption{policy, 0, 1});
  return Simulate(step, s, false).step_seconds;
}

TEST(CollectiveSeconds, RingAndAllToAllByHand) {
  const HardwareProfile h200 = *HardwarePreset("h200");
  // All-gather of 1 GB over 8 GPUs of one NVLink domain: 7/8 of it at 450 GB/s, 7 hops.
  EXPECT_DOUBLE_EQ(CollectiveSeconds(h200, Collective::kAllGather, {8, 1}, 1e9),
                   1e9 * 7 / 8 / 450e9 + 7 * 3.4e-6);
  // All-reduce: twice the bytes and the hops.
  EXPECT_DOUBLE_EQ(CollectiveSeconds(h200, Collective::kAllReduce, {8, 1}, 1e9),
                   2 * (1e9 * 7 / 8 / 450e9) + 14 * 3.4e-6);
  // 16 GPUs leave the 8-GPU domain: the ring runs at the NIC's 50 GB/s, 14 us a hop.
  EXPECT_DOUBLE_EQ(CollectiveSeconds(h200, Collective::kReduceScatter, {16, 1}, 1e9),
                   1e9 * 15 / 16 / 50e9 + 15 * 14e-6);
  // All-to-all over 16 = 2 x 8: half the bytes leave the node, 7/16 stay on NVLink.
  EXPECT_DOUBLE_EQ(CollectiveSeconds(h200, Collective::kAllToAll, {16, 1}, 1e9),
                   1e9 * 8 / 16 / 50e9 + 14e-6);
  EXPECT_DOUBLE_EQ(CollectiveSeconds(h200, Collective::kAllToAll, {8, 1}, 1e9),
                   1e9 * 7 / 8 / 450e9 + 3.4e-6);
  EXPECT_EQ(CollectiveSeconds(h200, Collective::kAllGather, {1, 1}, 1e9), 0);
  // A pipeline message: one hop and the bytes at the link's per-GPU rate.
  EXPECT_DOUBLE_EQ(PointToPointSeconds(h200, CommLink::kNetwork, 1e8), 1e8 / 50e9 + 14e-6);
  EXPECT_DOUBLE_EQ(PointToPointSeconds(h200, CommLink::kNvlink, 1e8), 1e8 / 450e9 + 3.4e-6);
  EXPECT_EQ(PointToPointSeconds(h200, CommLink::kNone, 1e8), 0);
  // A measured bus bandwidth replaces NVLink's inside one node, not across nodes.
  HardwareProfile measured = h200;
  measured.all_gather_bytes_per_second = 360e9;
  EXPECT_DOUBLE_EQ(CollectiveSeconds(measured, Collective::kAllGather, {8, 1}, 1e9),
                   1e9 * 7 / 8 / 360e9 + 7 * 3.4e-6);
  EXPECT_DOUBLE_EQ(CollectiveSeconds(measured, Collective::kAllGather, {16, 1}, 1e9),
                   1e9 * 15 / 16 / 50e9 + 15 * 14e-6);
}

TEST(LinksOf, FollowsMegatronRankOrder) {
  const HardwareProfile h200 = *HardwarePreset("h200");
  EXPECT_EQ(LinksOf(h200, {8, 1}).link, CommLink::kNvlink);   // TP 8
  EXPECT_EQ(LinksOf(h200, {2, 4}).link, CommLink::kNvlink);   // CP 2 under TP 4
  EXPECT_EQ(LinksOf(h200, {2, 8}).link, CommLink::kNetwork);  // CP 2 under TP 8
  EXPECT_EQ(LinksOf(h200, {2, 8}).members_per_domain, 1);
  EXPECT_EQ(LinksOf(h200, {16, 1}).members_per_domain, 8);
  EXPECT_EQ(LinksOf(*HardwarePreset("gb200"), {64, 1}).link, CommLink::kNvlink);  // NVL72
  EXPECT_EQ(LinksOf(h200, {1, 1}).link, CommLink::kNone);
}

// Stage s is ranks [s x gpus/pp, (s + 1) x gpus/pp) (PP outermost): neighbours share an 8-GPU
// node only when both stages' ranks fall in it.
TEST(StageLink, FollowsMegatronRankOrder) {
  const HardwareProfile h200 = *HardwarePreset("h200");
  // 16 GPUs, PP 4: stages 0-3, 4-7 | 8-11, 12-15 on two nodes.
  EXPECT_EQ(StageLink(h200, 16, 4, 0, 1), CommLink::kNvlink);
  EXPECT_EQ(StageLink(h200, 16, 4, 1, 2), CommLink::kNetwork);
  EXPECT_EQ(StageLink(h200, 16, 4, 2, 1), CommLink::kNetwork);
  EXPECT_EQ(StageLink(h200, 16, 4, 2, 3), CommLink::kNvlink);
  EXPECT_EQ(StageLink(h200, 16, 4, 3, 0), CommLink::kNetwork);  // interleaving's wrap-around
  // A stage per node or more: every boundary leaves the node.
  EXPECT_EQ(StageLink(h200, 16, 2, 0, 1), CommLink::kNetwork);
  EXPECT_EQ(StageLink(h200, 2048, 16, 0, 1), CommLink::kNetwork);
  EXPECT_EQ(StageLink(h200, 8, 2, 0, 1), CommLink::kNvlink);
  // 6 ranks per stage: stage 0 is 0-5, stage 1 6-11; the pair (2, 8) leaves node 0.
  EXPECT_EQ(StageLink(h200, 24, 4, 0, 1), CommLink::kNetwork);
  // An NVL72 rack holds all 64 ranks, wrap-around included.
  EXPECT_EQ(StageLink(*HardwarePreset("gb200"), 64, 4, 3, 0), CommLink::kNvlink);
  EXPECT_EQ(StageLink(h200, 16, 1, 0, 0), CommLink::kNone);
}

// Megatron's two rank orders (parallel_state.py RankGenerator, innermost first) on
// 64 H200s, 8 per NVLink domain, TP 4, PP 2 (dp 8). tp-cp-ep-dp-pp: a stage is ranks 0-31 /
// 32-63, so rank r pairs with r + 32 (network), the dense DP group of rank 0 is 0, 4, ..., 28
// (span 32, 2 per domain, network) and the embedding pair 0, 32 (network). tp-cp-ep-pp-dp: the
// stages alternate in blocks of tp = 4 ranks, so rank r pairs with r + 4 (NVLink), the DP
// group is 0, 8, ..., 56 (one per domain) and the embedding pair 0, 4 (NVLink).
TEST(GroupsOf, FollowMegatronsRankOrder) {
  const HardwareProfile h200 = *HardwarePreset("h200");
  RunSettings run;
  run.tp = 4;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 64;
  run.pp = 2;
  const ParallelGroups pp_last = GroupsOf(run);
  run.rank_order = RankOrder::kTpCpEpPpDp;
  const ParallelGroups dp_last = GroupsOf(run);
  for (const ParallelGroups& g : {pp_last, dp_last}) {
    EXPECT_EQ(g.tp.size, 4);
    EXPECT_EQ(g.tp.stride, 1);
    EXPECT_EQ(g.dense_dp.size, 8);  // the same members count, placed differently
    EXPECT_EQ(g.dense_dp.block, 0);
  }
  EXPECT_EQ(pp_last.stage_stride, 32);
  EXPECT_EQ(dp_last.stage_stride, 4);
  EXPECT_EQ(StageLink(h200, 64, 2, 0, 1, pp_last.stage_stride), CommLink::kNetwork);
  EXPECT_EQ(StageLink(h200, 64, 2, 0, 1), CommLink::kNetwork);  // 0: gpus / pp
  EXPECT_EQ(StageLink(h200, 64, 2, 1, 0, dp_last.stage_stride), CommLink::kNvlink);
  EXPECT_EQ(pp_last.dense_dp.stride, 4);
  EXPECT_EQ(dp_last.dense_dp.stride, 8);
  const GroupLinks a = LinksOf(h200, pp_last.dense_dp), b = LinksOf(h200, dp_last.dense_dp);
  EXPECT_EQ(a.link, CommLink::kNetwork);
  EXPECT_EQ(a.members_per_domain, 2);
  EXPECT_EQ(b.link, CommLink::kNetwork);
  EXPECT_EQ(b.members_per_domain, 1);
  EXPECT_EQ(pp_last.embedding.stride, 32);
  EXPECT_EQ(dp_last.embedding.stride, 4);
  // The embedding all-reduce of 1 GB between the pair: 2 x 1/2 of it, 2 hops, on the NIC's
  // 50 GB/s at 14 us a hop, or on NVLink's 450 GB/s (a reduce-scatter and an all-gather) at
  // 3.4 us.
  EXPECT_DOUBLE_EQ(CollectiveSeconds(h200, Collective::kAllReduce, pp_last.embedding, 1e9),
                   1e9 / 50e9 + 2 * 14e-6);
  EXPECT_DOUBLE_EQ(CollectiveSeconds(h200, Collective::kAllReduce, dp_last.embedding, 1e9),
                   2 * (1e9 / 2 / 450e9) + 2 * 3.4e-6);
  // With pp 1 the orders are the same grid.
  run.pp = 1;
  const ParallelGroups flat = GroupsOf(run);
  run.rank_order = RankOrder::kTpCpEpDpPp;
  EXPECT_EQ(flat.dense_dp.size, GroupsOf(run).dense_dp.size);
  EXPECT_EQ(flat.dense_dp.stride, GroupsOf(run).dense_dp.stride);
  EXPECT_EQ(flat.expert_dp.stride, GroupsOf(run).expert_dp.stride);
}

// With CP the tp-cp-ep-pp-dp dense data-parallel group (Megatron's dp-cp) has two levels: TP 2,
// CP 2, PP 2 on 64 GPUs (dp 8): cp members 2 apart, dp blocks 2 x 2 x 2 = 8 apart, so rank 0's
// group is {0, 2, 8, 10, ..., 56, 58}; under the default order it is 0, 2, ..., 30.
TEST(LinksOf, TwoLevelDataParallelGroup) {
  RunSettings run;
  run.tp = 2;
  run.cp = 2;
  run.ep = 1;
  run.gpus = 64;
  run.pp = 2;
  const GroupPlacement pp_last = GroupsOf(run).dense_dp;
  run.rank_order = RankOrder::kTpCpEpPpDp;
  const GroupPlacement dp_last = GroupsOf(run).dense_dp;
  EXPECT_EQ(pp_last.size, 16);
  EXPECT_EQ(pp_last.stride, 2);
  EXPECT_EQ(pp_last.block, 0);
  EXPECT_EQ(dp_last.size, 16);
  EXPECT_EQ(dp_last.stride, 2);
  EXPECT_EQ(dp_last.block, 2);
  EXPECT_EQ(dp_last.block_stride, 8);
  EXPECT_EQ(GroupsOf(run).stage_stride, 4);
  EXPECT_EQ(GroupsOf(run).cp.stride, 2);  // TP and CP do not move
  const HardwareProfile h200 = *HardwarePreset("h200");
  // 8-GPU domains: 4 of the default group's members on each (0, 2, 4, 6), 2 of the other's
  // (0, 2: the next block starts at 8).
  EXPECT_EQ(LinksOf(h200, pp_last).link, CommLink::kNetwork);
  EXPECT_EQ(LinksOf(h200, pp_last).members_per_domain, 4);
  EXPECT_EQ(LinksOf(h200, dp_last).link, CommLink::kNetwork);
  EXPECT_EQ(LinksOf(h200, dp_last).members_per_domain, 2);
  // 32-GPU domains: the default group fits one (span 32); the other spans 64, 4 blocks of 2
  // (0, 2, 8, 10, 16, 18, 24, 26) on each domain.
  HardwareProfile wide = h200;
  wide.nvlink_domain_gpus = 32;
  EXPECT_EQ(LinksOf(wide, pp_last).link, CommLink::kNvlink);
  EXPECT_EQ(LinksOf(wide, pp_last).members_per_domain, 16);
  EXPECT_EQ(LinksOf(wide, dp_last).link, CommLink::kNetwork);
  EXPECT_EQ(LinksOf(wide, dp_last).members_per_domain, 8);
  // 64-GPU domains hold both.
  wide.nvlink_domain_gpus = 64;
  EXPECT_EQ(LinksOf(wide, dp_last).link, CommLink::kNvlink);
  EXPECT_EQ(LinksOf(wide, dp_last).members_per_domain, 16);
  // A ring reduce-scatter of 1 GB over the 16 members: 15/16 of it on the NIC, 15 hops.
  EXPECT_DOUBLE_EQ(CollectiveSeconds(h200, Collective::kReduceScatter, dp_last, 1e9),
                   1e9 * 15 / 16 / 50e9 + 15 * 14e-6);
  EXPECT_DOUBLE_EQ(CollectiveSeconds(wide, Collective::kReduceScatter, dp_last, 1e9),
                   1e9 * 15 / 16 / 450e9 + 15 * 3.4e-6);
}

// tp-cp-ep-pp-dp: a stage is blocks of tp x cp adjacent ranks every tp x cp x pp; neighbours
// are tp x cp apart.
TEST(StageLink, TpPpDpOrderPairsRanksTpTimesCpApart) {
  const HardwareProfile h200 = *HardwarePreset("h200");
  // Stride 4, PP 4 on 32 GPUs: stage 0 is 0-3, 16-19; stage 1 4-7, 20-23: each pair in one
  // 8-GPU domain. Stages 1 and 2 (8-11) cross the boundary at 8, 3 and 0 (12-15 to 0-3) too.
  EXPECT_EQ(StageLink(h200, 32, 4, 0, 1, 4), CommLink::kNvlink);
  EXPECT_EQ(StageLink(h200, 32, 4, 2, 3, 4), CommLink::kNvlink);
  EXPECT_EQ(StageLink(h200, 32, 4, 1, 2, 4), CommLink::kNetwork);
  EXPECT_EQ(StageLink(h200, 32, 4, 3, 0, 4), CommLink::kNetwork);
  // Stride 2, PP 4 on 64 GPUs: every block of 8 holds one rank pair of each stage: NVLink.
  EXPECT_EQ(StageLink(h200, 64, 4, 3, 0, 2), CommLink::kNvlink);
  // Stride 3 (TP 3), PP 2 on 24 GPUs: stage 0 is 0-2, 6-8, 12-14, 18-20; 0-2 pair with 3-5 in
  // domain 0, but 6 and 7 pair with 9 and 10 across the boundary at 8.
  EXPECT_EQ(StageLink(h200, 24, 2, 0, 1, 3), CommLink::kNetwork);
  // No NVLink: the network.
  HardwareProfile none = h200;
  none.nvlink_bytes_per_second = 0;
  EXPECT_EQ(StageLink(none, 32, 4, 0, 1, 4), CommLink::kNetwork);
}

// The step's collectives under both orders: Llama 3.1 8B (tied here, so first and last stage
// all-reduce the word embeddings' gradients, 128256 x 4096 / tp x 4 bytes) on 64 H200s, TP 4,
// PP 2, no sharding: the dense DP all-reduce runs over 8 ranks 4 apart (2 a domain) or 8 apart
// (1 a domain), both on the network; the embedding pair leaves the node or stays on NVLink.
TEST(StepComm, RankOrderMovesTheDataParallelAndEmbeddingGroups) {
  ModelConfig llama = *ModelPreset("llama-3.1-8b");
  llama.tied_embeddings = true;
  const HardwareProfile hw = *HardwarePreset("h200");
  RunSettings run;
  run.seq_len = 8192;
  run.tp = 4;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 64;
  run.pp = 2;
  run.microbatches = 2;
  run.sharding = Sharding::kNoShard;
  const double embedding = 128256.0 * 4096 / 4 * 4;
  for (RankOrder order : {RankOrder::kTpCpEpDpPp, RankOrder::kTpCpEpPpDp}) {
    SCOPED_TRACE(RankOrderName(order));
    run.rank_order = order;
    const bool pp_last = order == RankOrder::kTpCpEpDpPp;
    auto step = BuildStepCost(llama, hw, run, 1);
    ASSERT_TRUE(step.ok()) << step.status();
    const CommOp* ar = Find(*step, -1, "DP dense gradient all-reduce");
    ASSERT_NE(ar, nullptr);
    EXPECT_EQ(ar->placement.size, 8);
    EXPECT_EQ(ar->placement.stride, pp_last ? 4 : 8);
    EXPECT_EQ(ar->link, CommLink::kNetwork);
    EXPECT_DOUBLE_EQ(ar->seconds, ar->bytes * 2 * 7 / 8 / 50e9 + 14 * 14e-6);
    const CommOp* ends =
        Find(*step, -1, "PP word embedding gradient all-reduce (first and last stage)");
    ASSERT_NE(ends, nullptr);
    EXPECT_EQ(ends->placement.stride, pp_last ? 32 : 4);
    EXPECT_DOUBLE_EQ(ends->bytes, embedding);
    if (pp_last) {
      EXPECT_EQ(ends->link, CommLink::kNetwork);
      EXPECT_DOUBLE_EQ(ends->seconds, embedding / 50e9 + 2 * 14e-6);
    } else {
      EXPECT_EQ(ends->link, CommLink::kNvlink);
      EXPECT_DOUBLE_EQ(ends->seconds, 2 * (embedding / 2 / 450e9) + 2 * 3.4e-6);
    }
    // TP stays on its 4 adjacent ranks.
    EXPECT_EQ(Find(*step, 0, "TP all-gather")->link, CommLink::kNvlink);
  }
}

// Megatron-Core's pipeline tensor: seq_len / cp / tp (sequence parallel) x micro_batch x hidden,
// here x hc_mult residual streams.
TEST(PipelineMessageBytes, ActivationOfOneMicrobatchShard) {
  RunSettings run;
  run.seq_len = 8192;
  run.tp = 2;
  run.cp = 1;
  run.micro_batch = 2;
  EXPECT_DOUBLE_EQ(PipelineMessageBytes(*ModelPreset("llama-3.1-8b"), run),
                   8192.0 / 2 * 2 * 4096 * 2);
  RunSettings ref;  // GLM-5.3-Flash at 1M tokens on CP 8: 4 streams of 4096, bf16
  EXPECT_DOUBLE_EQ(PipelineMessageBytes(*ModelPreset("glm-5.3-flash"), ref),
                   1048576.0 / 8 * 4 * 4096 * 2);
}

// With pipeline parallelism a stage's data-parallel groups are a pp-th of the world (Megatron's
// rank order puts PP outermost), and it reduces only its own parameters: Llama 3.1 8B on 64 GPUs,
// PP 4 (8 layers a stage), TP 1: 16 ranks per group; the embedding (128256 x 4096) on stage 0, the
// head (128256 x 4096) and final norm (4096) on stage 3.
TEST(StepComm, PipelineStagesReduceOnlyTheirOwnParameters) {
  const ModelConfig llama = *ModelPreset("llama-3.1-8b");
  const HardwareProfile hw = *HardwarePreset("h200");
  RunSettings run;
  run.seq_len = 8192;
  run.tp = 1;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 64;
  run.pp = 4;
  run.microbatches = 8;
  const double layer = static_cast<double>(DenseLayerParams(llama, llama.layers[0]));
  const double embedding = 128256.0 * 4096, head = 128256.0 * 4096 + 4096;
  auto stage = [&](int s) {
    auto step = BuildStepCost(llama, hw, run, s);
    EXPECT_TRUE(step.ok()) << step.status();
    return *step;
  };
  // FSDP: each of the stage's 8 layers gathers its weights (bf16) twice and reduce-scatters its
  // gradients (fp32) once, over 16 ranks.
  for (int s = 0; s < 4; ++s) {
    const StepCost step = stage(s);
    ASSERT_EQ(step.comm.layers.size(), 8u);
    const CommOp* ag = Find(step, 0, "FSDP weight all-gather");
    ASSERT_NE(ag, nullptr);
    EXPECT_EQ(ag->placement.size, 16);
    EXPECT_EQ(ag->placement.stride, 1);
    EXPECT_DOUBLE_EQ(ag->bytes, layer * 2);
    const double ends = (s == 0 ? embedding : 0) + (s == 3 ? head : 0);
    EXPECT_DOUBLE_EQ(StepCommBytes(step.comm, CommGroup::kFsdp),
                     8 * (2 * layer * 2 + layer * 4) + (2 * ends * 2 + ends * 4))
        << "stage " << s;
    EXPECT_EQ(step.comm.gradient_sync_exposed_seconds, 0);  // FSDP reduces layer by layer
  }
  EXPECT_EQ(Find(stage(1), -1, "FSDP dense all-gather"), nullptr);
  EXPECT_DOUBLE_EQ(Find(stage(0), -1, "FSDP dense all-gather")->bytes, embedding * 2);
  EXPECT_DOUBLE_EQ(Find(stage(3), -1, "FSDP dense all-gather")->bytes, head * 2);
  // No sharding: one all-reduce per step of the stage's fp32 gradients; the four stages' add up
  // to the whole model's.
  run.sharding = Sharding::kNoShard;
  double all = 0;
  for (int s = 0; s < 4; ++s) {
    const StepCost step = stage(s);
    const CommOp* ar = Find(step, -1, "DP dense gradient all-reduce");
    ASSERT_NE(ar, nullptr);
    EXPECT_EQ(ar->placement.size, 16);
    EXPECT_DOUBLE_EQ(ar->bytes, (8 * layer + (s == 0 ? embedding : 0) + (s == 3 ? head : 0)) * 4);
    EXPECT_GT(step.comm.gradient_sync_exposed_seconds, 0);
    EXPECT_DOUBLE_EQ(step.comm.gradient_sync_exposed_seconds, step.comm.step_exposed_seconds);
    all += ar->bytes;
  }
  EXPECT_DOUBLE_EQ(all, static_cast<double>(ModelParameters(llama)) * 4);
  // The distributed optimizer: reduce-scatter of the gradients, all-gather of the bf16 weights.
  run.sharding = Sharding::kOptim;
  const StepCost optim = stage(2);
  EXPECT_DOUBLE_EQ(Find(optim, -1, "DP dense gradient reduce-scatter")->bytes, 8 * layer * 4);
  EXPECT_DOUBLE_EQ(Find(optim, -1, "DP dense weight all-gather")->bytes, 8 * layer * 2);
}

// Routed experts shard over the expert-data-parallel group, gpus / (ep x pp): Qwen3-30B-A3B
// (48 layers, 128 experts) on 64 GPUs with EP 8 and PP 4 has 2 such ranks, 8 apart.
TEST(StepComm, ExpertDataParallelGroupUnderPipeline) {
  const ModelConfig qwen = *ModelPreset("qwen3-30b-a3b");
  const HardwareProfile hw = *HardwarePreset("h200");
  RunSettings run;
  run.seq_len = 8192;
  run.tp = 1;
  run.cp = 1;
  run.ep = 8;
  run.gpus = 64;
  run.pp = 4;
  run.microbatches = 4;
  auto step = BuildStepCost(qwen, hw, run, 1);
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_EQ(step->comm.layers.size(), 12u);
  EXPECT_EQ(step->layers[0].index, 12);
  const CommOp* experts = Find(*step, 0, "FSDP expert weight all-gather");
  ASSERT_NE(experts, nullptr);
  EXPECT_EQ(experts->placement.size, 2);
  EXPECT_EQ(experts->placement.stride, 8);
  EXPECT_DOUBLE_EQ(experts->bytes,
                   static_cast<double>(RoutedExpertParams(qwen, qwen.layers[12])) / 8 * 2);
  EXPECT_EQ(Find(*step, 0, "FSDP weight all-gather")->placement.size, 16);
  // Its two ranks, 8 apart, are on different 8-GPU nodes.
  EXPECT_EQ(experts->link, CommLink::kNetwork);
  run.pp = 1;
  run.microbatches = 1;
  auto whole = BuildStepCost(qwen, hw, run);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(Find(*whole, 0, "FSDP expert weight all-gather")->placement.size, 8);
}

// Megatron-Core gives the last stage its own word embeddings when it runs the MTP modules
// (DeepSeek-V3, untied: 129280 x 7168), and all-reduces their fp32 gradients with stage 0's once
// per step over the two ranks 15 x 128 apart.
TEST(StepComm, LastStageWordEmbeddingsAreAllReducedWithTheFirst) {
  const ModelConfig ds = *ModelPreset("deepseek-v3");
  const HardwareProfile hw = *HardwarePreset("h800");
  RunSettings run = DeepSeekV3Pp16Job();
  const double words = 129280.0 * 7168;
  EXPECT_DOUBLE_EQ(StageNonLayerParams(ds, run, 0).dense, words);
  EXPECT_DOUBLE_EQ(StageNonLayerParams(ds, run, 7).dense, 0);
  EXPECT_DOUBLE_EQ(StageNonLayerParams(ds, run, 15).dense,
                   static_cast<double>(EmbeddingParams(ds) + MtpDenseParams(ds)));
  const std::string name = "PP word embedding gradient all-reduce (first and last stage)";
  for (int s : {0, 7, 15}) {
    auto step = BuildStepCost(ds, hw, run, s);
    ASSERT_TRUE(step.ok()) << step.status();
    const CommOp* ar = Find(*step, -1, name);
    if (s == 7) {
      EXPECT_EQ(ar, nullptr);
      continue;
    }
    ASSERT_NE(ar, nullptr) << "stage " << s;
    EXPECT_DOUBLE_EQ(ar->bytes, words * 4);
    EXPECT_EQ(ar->placement.size, 2);
    EXPECT_EQ(ar->placement.stride, 15 * 128);
    EXPECT_EQ(ar->link, CommLink::kNetwork);
    EXPECT_DOUBLE_EQ(ar->seconds, words * 4 * 2 * 1 / 2 / 50e9 + 2 * 14e-6);
    EXPECT_GE(step->comm.gradient_sync_exposed_seconds, ar->seconds);
  }
  // Without pipeline parallelism the one embedding serves both: nothing to keep equal.
  run.pp = 1;
  run.microbatches = 1;
  run.pp_layout.clear();
  run.gpus = 128;
  auto whole = BuildStepCost(ds, hw, run);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(Find(*whole, -1, name), nullptr);
}

// The reference run (GLM-5.3-Flash, 1M tokens, CP 8, EP 8, 64 B200s): each of the 42 MoE layers
// dispatches and combines 131,072 tokens x top-8 x 4096 x 2 bytes = 8 GiB, forward and backward:
// 42 x 4 x 8 GiB = 1.44 TB per step per rank, ~1.6 s over NVLink, ~25 s over the network.
TEST(StepComm, ReferenceExpertAllToAllIs1_4TBPerStepPerRank) {
  RunSettings run;
  const StepCost step = Build("glm-5.3-flash", "b200", run);
  const double per_call = 131072.0 * 8 * 4096 * 2;
  const CommOp* a2a = Find(step, 3, "EP all-to-all (dispatch, combine)");
  ASSERT_NE(a2a, nullptr);
  EXPECT_DOUBLE_EQ(a2a->bytes, per_call);
  EXPECT_EQ(a2a->forward_calls, 2);
  EXPECT_EQ(a2a->backward_calls, 2);
  EXPECT_EQ(a2a->link, CommLink::kNvlink);
  // The 42 MoE decoder layers, and the MoE of the MTP layer after them (Note [MTP layers]).
  ASSERT_EQ(step.layers.back().name, "mtp.0");
  EXPECT_DOUBLE_EQ(Find(step, 45, "EP all-to-all (dispatch, combine)")->bytes, per_call);
  EXPECT_DOUBLE_EQ(StepCommBytes(step.comm, CommGroup::kEp), (42 + 1) * 4 * per_call);
  EXPECT_NEAR(StepCommBytes(step.comm, CommGroup::kEp) / 1e12 * 42 / 43, 1.443, 0.001);
  EXPECT_DOUBLE_EQ(a2a->seconds, per_call * 7 / 8 / 900e9 + 3.4e-6);
  EXPECT_EQ(Find(step, 0, "EP all-to-all (dispatch, combine)"), nullptr);  // dense FFN layer
  // The busiest rank's imbalance scales its time, not what the average rank sends.
  run.moe_imbalance = 2;
  const StepCost skewed = Build("glm-5.3-flash", "b200", run);
  const CommOp* busy = Find(skewed, 3, "EP all-to-all (dispatch, combine)");
  EXPECT_DOUBLE_EQ(busy->bytes, per_call);
  EXPECT_DOUBLE_EQ(busy->seconds, 2 * per_call * 7 / 8 / 900e9 + 3.4e-6);
}

// Note [MTP layers]: under Megatron-FSDP (distributed/fsdp/mcore_fsdp_adapter.py
// fsdp_unit_modules: the TransformerLayers) an MTP depth's transformer layer is its own unit,
// gathered by the MTP layer as a decoder layer of its kind is; only enorm, hnorm, eh_proj and
// final_layernorm (3h + 2h^2) stay with the root's parameters, in the step's gather. The
// regression: the MTP transformer layer's weights, its 288 routed experts included, were
// gathered twice (by the layer and with the root).
TEST(StepComm, FsdpGathersAnMtpTransformerLayerOnce) {
  RunSettings run;  // the reference: FSDP (optim_grads_params), one MTP depth
  const StepCost with = Build("glm-5.3-flash", "b200", run);
  run.mtp_layers = 0;
  const StepCost without = Build("glm-5.3-flash", "b200", run);
  const double h = 4096;
  const CommOp* root_with = Find(with, -1, "FSDP dense all-gather");
  const CommOp* root_without = Find(without, -1, "FSDP dense all-gather");
  ASSERT_NE(root_with, nullptr);
  ASSERT_NE(root_without, nullptr);
  EXPECT_DOUBLE_EQ(root_with->bytes - root_without->bytes, (3 * h + 2 * h * h) * run.weight_bytes);
  EXPECT_EQ(Find(with, -1, "FSDP expert all-gather"), nullptr);
  ASSERT_EQ(with.layers.back().name, "mtp.0");
  for (const char* op : {"FSDP weight all-gather", "FSDP expert weight all-gather"}) {
    EXPECT_DOUBLE_EQ(Find(with, 45, op)->bytes, Find(with, 44, op)->bytes) << op;
  }
}

TEST(StepComm, StepTimeGrowsWhenTheExpertGroupCrossesNodes) {
  RunSettings run;
  run.seq_len = 262144;
  const StepCost ep8 = Build("glm-5.3-flash", "b200", run);
  run.ep = 16;
  const StepCost ep16 = Build("glm-5.3-flash", "b200", run);
  const CommOp* a = Find(ep8, 3, "EP all-to-all (dispatch, combine)");
  const CommOp* b = Find(ep16, 3, "EP all-to-all (dispatch, combine)");
  EXPECT_EQ(a->link, CommLink::kNvlink);
  EXPECT_EQ(b->link, CommLink::kNetwork);
  EXPECT_DOUBLE_EQ(b->bytes, a->bytes);  // the same tokens leave each rank
  // Half of EP 16's bytes leave the 8-GPU node at 50 GB/s instead of 7/8 at 900 GB/s.
  EXPECT_DOUBLE_EQ(b->seconds, a->bytes * 8 / 16 / 50e9 + 14e-6);
  EXPECT_GT(Seconds(ep16, LayerPolicy::kRecompute), Seconds(ep8, LayerPolicy::kRecompute) + 1.0);
  EXPECT_THAT(ep16.comm.warnings,
              testing::Contains(HasSubstr("the EP group of 16 GPUs leaves its NVLink domain")));
}

// At 1,024 and 4,096 GPUs the reference model's step once stayed at 28.3 s. The data-parallel
// rings grow with the world (FSDP gathers over gpus / tp ranks, 14 us a hop).
TEST(StepComm, LargerWorldsNoLongerPlanTheSameStep) {
  RunSettings run;
  run.gpus = 1024;
  const StepCost small = Build("glm-5.3-flash", "b200", run);
  run.gpus = 4096;
  const StepCost large = Build("glm-5.3-flash", "b200", run);
  EXPECT_GT(Seconds(large, LayerPolicy::kRecompute), Seconds(small, LayerPolicy::kRecompute));
}

// Llama 3.1 8B (32 layers, hidden 4096, 8 KV heads of 128), 8,192 tokens on TP 8: each
// attention and FFN all-gathers and reduce-scatters 8192 x 4096 x 2 bytes; backward makes the
// reverse pair and gathers the input again for the weight gradient.
TEST(StepComm, TensorParallelBytesByHand) {
  RunSettings run;
  run.seq_len = 8192;
  run.tp = 8;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 8;
  const StepCost step = Build("llama-3.1-8b", "h200", run);
  const double s = 8192.0 * 4096 * 2;
  const CommOp* ag = Find(step, 0, "TP all-gather");
  const CommOp* rs = Find(step, 0, "TP reduce-scatter");
  ASSERT_NE(ag, nullptr);
  ASSERT_NE(rs, nullptr);
  EXPECT_DOUBLE_EQ(ag->bytes, s);
  EXPECT_EQ(ag->forward_calls, 2);
  EXPECT_EQ(ag->backward_calls, 4);
  EXPECT_EQ(rs->forward_calls, 2);
  EXPECT_EQ(rs->backward_calls, 2);
  EXPECT_DOUBLE_EQ(ag->seconds, s * 7 / 8 / 450e9 + 7 * 3.4e-6);
  // Per layer 10 calls, plus the embedding's and the LM head's 4.
  EXPECT_DOUBLE_EQ(StepCommBytes(step.comm, CommGroup::kTp), (32 * 10 + 4) * s);
  // Exposed: every forward call, and backward all but the re-gathers.
  EXPECT_DOUBLE_EQ(step.layers[0].forward_comm_seconds, 2 * ag->seconds + 2 * rs->seconds);
  EXPECT_DOUBLE_EQ(step.layers[0].backward_comm_seconds, 2 * ag->seconds + 2 * rs->seconds);
  // A recompute makes the forward's collectives again.
  const OptionCost keep = EvaluateOption(step.layers[0], {LayerPolicy::kKeep, 0, 1});
  const OptionCost recompute = EvaluateOption(step.layers[0], {LayerPolicy::kRecompute, 0, 1});
  EXPECT_DOUBLE_EQ(recompute.comm_seconds - keep.comm_seconds, step.layers[0].forward_comm_seconds);
  EXPECT_DOUBLE_EQ(step.layers[0].recompute_comm_seconds, step.layers[0].forward_comm_seconds);
  // TP 16 leaves the 8-GPU board.
  run.tp = 16;
  run.gpus = 16;
  auto wide = BuildStepCost(*ModelPreset("qwen3-32b"), *HardwarePreset("h200"), run);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_THAT(wide->comm.warnings,
              testing::Contains(HasSubstr("the TP group of 16 GPUs leaves its NVLink domain")));
}

// Context parallel, softmax attention: Llama 3.1 8B at 131,072 tokens on CP 4 holds 32,768
// tokens per rank; its K/V block (8 heads x 128 x 2, bf16) goes round the ring 3 times forward,
// K/V and dK/dV 3 times backward.
TEST(StepComm, ContextParallelRingBytesByHand) {
  RunSettings run;
  run.seq_len = 131072;
  run.cp = 4;
  run.ep = 1;
  run.gpus = 4;
  const StepCost step = Build("llama-3.1-8b", "h200", run);
  const double block = 32768.0 * 8 * 128 * 2 * 2;
  const CommOp* fwd = Find(step, 0, "CP ring K/V exchange");
  const CommOp* bwd = Find(step, 0, "CP ring K/V + dK/dV exchange");
  ASSERT_NE(fwd, nullptr);
  ASSERT_NE(bwd, nullptr);
  EXPECT_DOUBLE_EQ(fwd->bytes, block);
  EXPECT_EQ(fwd->forward_calls, 3);
  EXPECT_DOUBLE_EQ(bwd->bytes, 2 * block);
  EXPECT_EQ(bwd->backward_calls, 3);
  EXPECT_DOUBLE_EQ(StepCommBytes(step.comm, CommGroup::kCp), 32 * 9 * block);
  // A 128 MiB block takes 0.3 ms over NVLink, well inside a quarter of the attention core.
  EXPECT_GT(step.layers[0].attention_core_forward_seconds / 4, fwd->seconds);
  EXPECT_GT(step.layers[0].attention_core_backward_seconds / 4, bwd->seconds);
  EXPECT_EQ(step.layers[0].forward_comm_seconds, 0);
  EXPECT_EQ(step.layers[0].backward_comm_seconds, 0);
  // Over the network (CP 2 under TP 8 on 8-GPU nodes would leave the node; here: no NVLink at
  // all) the ring steps outgrow the core's blocks and the excess is exposed, step by step.
  HardwareProfile no_nvlink = *HardwarePreset("h200");
  no_nvlink.nvlink_bytes_per_second = 0;
  no_nvlink.nic_bytes_per_second = 1e9;
  auto slow = BuildStepCost(*ModelPreset("llama-3.1-8b"), no_nvlink, run);
  ASSERT_TRUE(slow.ok()) << slow.status();
  const CommOp* slow_fwd = Find(*slow, 0, "CP ring K/V exchange");
  EXPECT_EQ(slow_fwd->link, CommLink::kNetwork);
  double fsdp = 0;
  for (const CommOp& op : slow->comm.layers[0].ops) {
    if (op.group == CommGroup::kFsdp) fsdp += op.forward_calls * op.seconds;
  }
  EXPECT_DOUBLE_EQ(slow->layers[0].forward_comm_seconds,
                   3 * (slow_fwd->seconds - slow->layers[0].attention_core_forward_seconds / 4) +
                       std::max(0.0, fsdp - slow->layers[0].forward_seconds));
  // 131072 is a multiple of 2 x 4: no zigzag warning; 131076 is not.
  for (const std::string& w : step.comm.warnings) EXPECT_THAT(w, testing::Not(HasSubstr("zigzag")));
  run.seq_len = 131076;
  const StepCost odd = Build("llama-3.1-8b", "h200", run);
  EXPECT_THAT(odd.comm.warnings, testing::Contains(HasSubstr("not divisible by 2 x --cp (8)")));
}

// Linear attention under CP passes each rank's recurrent state on: GLM-5.3-Flash's KDA layers
// hold 64 heads x 128 x 128 fp32 per sequence, passed cp - 1 = 7 times each way.
TEST(StepComm, LinearAttentionPassesItsStateAlongTheCpRanks) {
  RunSettings run;
  const StepCost step = Build("glm-5.3-flash", "b200", run);
  const CommOp* pass = Find(step, 0, "CP recurrent-state pass");
  ASSERT_NE(pass, nullptr);
  EXPECT_DOUBLE_EQ(pass->bytes, 64.0 * 128 * 128 * 4);
  EXPECT_EQ(pass->forward_calls, 7);
  EXPECT_EQ(pass->backward_calls, 7);
  // CP 8 under TP 1 on 8-GPU nodes: neighbours share a node.
  EXPECT_EQ(pass->link, CommLink::kNvlink);
}

// DSA under CP: any query may pick any key, so the latent K/V (kv_lora_rank 512, no rope part)
// and the indexer key (128) of all 8 x 131,072 tokens are gathered, their gradients
// reduce-scattered.
TEST(StepComm, SparseAttentionGathersTheLatentKvOverCp) {
  RunSettings run;
  const StepCost step = Build("glm-5.3-flash", "b200", run);
  const CommOp* ag = Find(step, 3, "CP latent K/V all-gather");
  const CommOp* rs = Find(step, 3, "CP latent K/V gradient reduce-scatter");
  ASSERT_NE(ag, nullptr);
  ASSERT_NE(rs, nullptr);
  EXPECT_DOUBLE_EQ(ag->bytes, 131072.0 * 8 * (512 + 0 + 128) * 2);
  EXPECT_EQ(ag->forward_calls, 1);
  EXPECT_EQ(rs->backward_calls, 1);
  // Exposed forward: the gather, the two all-to-alls, and what of the FSDP gathers the layer's
  // forward does not cover.
  double fsdp = 0;
  for (const CommOp& op : step.comm.layers[3].ops) {
    if (op.group == CommGroup::kFsdp) fsdp += op.forward_calls * op.seconds;
  }
  const double a2a = Find(step, 3, "EP all-to-all (dispatch, combine)")->seconds;
  EXPECT_DOUBLE_EQ(step.layers[3].forward_comm_seconds,
                   ag->seconds + 2 * a2a + std::max(0.0, fsdp - step.layers[3].forward_seconds));
}

// FSDP (optim_grads_params): Llama 3.1 405B on TP 8 gathers its layer weights, 405e9 / 8 x 2
// bytes (~100 GB) per pass per rank; the gradients are reduce-scattered once, in fp32.
TEST(StepComm, FsdpGathersEveryLayersWeightsPerPass) {
  RunSettings run;
  run.seq_len = 8192;
  run.tp = 8;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 1024;
  const ModelConfig model = *ModelPreset("llama-3.1-405b");
  const StepCost step = Build("llama-3.1-405b", "h200", run);
  double gathered = 0, reduced = 0;
  for (size_t i = 0; i < step.layers.size(); ++i) {
    const CommOp* ag = Find(step, static_cast<int>(i), "FSDP weight all-gather");
    const CommOp* rs = Find(step, static_cast<int>(i), "FSDP gradient reduce-scatter");
    ASSERT_NE(ag, nullptr);
    ASSERT_NE(rs, nullptr);
    EXPECT_EQ(ag->forward_calls, 1);
    EXPECT_EQ(ag->backward_calls, 1);
    EXPECT_EQ(ag->placement.size, 128);  // 1024 / TP 8 ranks, 8 apart
    EXPECT_EQ(ag->placement.stride, 8);
    gathered += ag->bytes;
    reduced += rs->bytes;
  }
  double layer_params = 0;
  for (const LayerSpec& l : model.layers) layer_params += DenseLayerParams(model, l);
  EXPECT_DOUBLE_EQ(gathered, layer_params / 8 * 2);
  EXPECT_DOUBLE_EQ(reduced, layer_params / 8 * 4);
  EXPECT_NEAR(gathered / 1e9, 100, 5);
}

// Without sharding the gradients are all-reduced once per step over the DP group; only the
// last bucket's reduction (or what backward cannot cover) is exposed.
TEST(StepComm, DataParallelAllReduceOncePerStep) {
  RunSettings run;
  run.seq_len = 8192;
  run.tp = 1;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 16;
  run.sharding = Sharding::kNoShard;
  const ModelConfig model = *ModelPreset("llama-3.1-8b");
  const StepCost step = Build("llama-3.1-8b", "h200", run);
  const CommOp* ar = Find(step, -1, "DP dense gradient all-reduce");
  ASSERT_NE(ar, nullptr);
  EXPECT_DOUBLE_EQ(ar->bytes, static_cast<double>(ModelParameters(model)) * 4);
  EXPECT_EQ(ar->placement.size, 16);
  EXPECT_EQ(ar->link, CommLink::kNetwork);
  EXPECT_DOUBLE_EQ(ar->seconds, ar->bytes * 2 * 15 / 16 / 50e9 + 2 * 15 * 14e-6);
  const double bucket = ar->seconds * 4e7 / (ar->bytes / 4);
  EXPECT_GE(step.comm.step_exposed_seconds, bucket * (1 - 1e-12));
  EXPECT_LT(step.comm.step_exposed_seconds, ar->seconds);
}

TEST(StepComm, TooFewTokensPerExpertIsAWarning) {
  RunSettings run;
  run.seq_len = 4096;
  run.cp = 1;
  run.ep = 8;
  run.gpus = 8;
  const StepCost step = Build("glm-5.3-flash", "b200", run);
  // 4096 x top-8 x ep 8 / 288 experts = 910 tokens per expert: fine.
  for (const std::string& w : step.comm.warnings) {
    EXPECT_THAT(w, testing::Not(HasSubstr("tokens per expert")));
  }
  run.seq_len = 256;  // 57 tokens per expert
  const StepCost few = Build("glm-5.3-flash", "b200", run);
  EXPECT_THAT(few.comm.warnings, testing::Contains(HasSubstr("57 tokens per expert")));
}

// All ranks of a node run one schedule, so GPUs behind one host link copy at once and share it.
TEST(SharedHostLink, DividesTheCopyRateAndSlowsAnOffloadingStep) {
  RunSettings run;
  run.seq_len = 262144;
  HardwareProfile own = *HardwarePreset("h200");
  HardwareProfile shared = own;
  shared.gpus_per_host_link = 2;
  shared.host_link_bytes_per_second = 64e9;  // one Gen5 x16 uplink for two GPUs
  const ModelConfig model = *ModelPreset("glm-5.3-flash");
  auto a = BuildStepCost(model, own, run);
  auto b = BuildStepCost(model, shared, run);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_DOUBLE_EQ(b->d2h_bytes_per_second, 32e9);
  EXPECT_DOUBLE_EQ(b->h2d_bytes_per_second, 32e9);
  EXPECT_DOUBLE_EQ(a->d2h_bytes_per_second, 55.1e9);  // the 16 MiB chunk rate, unshared
  Schedule s;
  s.options.assign(a->layers.size(), LayerOption{LayerPolicy::kOffloadInput, 0, 1});
  EXPECT_GT(Simulate(*b, s, false).exposed_copy_seconds,
            Simulate(*a, s, false).exposed_copy_seconds);
}

}  // namespace
}  // namespace stowage::planner
