// The layout search against full enumeration on small instances: the bounds hold for every
// layout (Note [Layout bounds]), pruning never removes a layout of the table, and every ranked
// layout planned alone gives the same numbers.
#include "planner/layout/layout_search.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "planner/cost/pipeline_layout.h"
#include "planner/hardware/hardware.h"
#include "planner/layout/layout_bounds.h"
#include "planner/layout/layout_report.h"
#include "planner/model/model.h"
#include "planner/search/pipeline.h"

namespace stowage::planner {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A model cut to its first `layers` layers (the search's cost grows with the layers planned).
ModelConfig Cut(const std::string& preset, int layers) {
  ModelConfig m = *ModelPreset(preset);
  m.layers.resize(layers);
  m.mtp_layers = 0;
  return m;
}

LayoutSearchRequest SmallMoe(uint64_t gpu_budget) {
  LayoutSearchRequest q;
  q.model = Cut("qwen3-30b-a3b", 6);
  q.hardware = *HardwarePreset("h100");
  q.base = DefaultRunSettings(Framework::kMegatron, q.model);
  q.base.seq_len = 4096;
  q.base.sharding = Sharding::kNoShard;
  q.gpu_counts = {16};
  q.global_batch = 32;
  q.options.gpu_budget_bytes = gpu_budget;
  q.options.host_budget_bytes = q.hardware.DefaultHostBudgetPerGpu();
  q.max_vpp = 2;
  q.max_micro_batch = 2;
  q.top = 5;
  return q;
}

LayoutSearchRequest SmallDense() {
  LayoutSearchRequest q;
  q.model = Cut("llama-3.1-8b", 4);
  q.hardware = *HardwarePreset("h100");
  q.base = DefaultRunSettings(Framework::kMegatron, q.model);
  q.base.seq_len = 32768;
  q.gpu_counts = {8, 16};
  q.global_batch = 16;
  q.options.gpu_budget_bytes = 24 * kGiB;  // tight: long sequences need recompute or offload
  q.options.host_budget_bytes = q.hardware.DefaultHostBudgetPerGpu();
  q.max_vpp = 2;
  q.max_micro_batch = 2;
  q.top = 4;
  return q;
}

TEST(DerivedPpLayout, SplitsLikeThePublishedDeepSeekV3Job) {
  EXPECT_THAT(DerivedPpLayout(61, 16), ElementsAre(3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2));
  EXPECT_TRUE(DerivedPpLayout(64, 16).empty());  // Megatron's even split
  EXPECT_TRUE(DerivedPpLayout(7, 1).empty());
  for (int layers : {5, 7, 13, 61, 126}) {
    for (int stages = 2; stages <= layers; ++stages) {
      std::vector<int> counts = DerivedPpLayout(layers, stages);
      if (layers % stages == 0) {
        EXPECT_TRUE(counts.empty());
        continue;
      }
      ASSERT_EQ(counts.size(), static_cast<size_t>(stages));
      EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0), layers);
      for (int c : counts) EXPECT_GE(c, 1) << layers << " over " << stages;
    }
  }
}

TEST(LayoutPattern, ParsesAndNamesBadKeys) {
  auto p = ParseLayoutPattern("tp=8,cp=16,pp=16");
  ASSERT_TRUE(p.ok());
  Layout l;
  l.tp = 8;
  l.cp = 16;
  l.pp = 16;
  l.ep = 1;
  EXPECT_TRUE(p->Matches(l));
  l.cp = 8;
  EXPECT_FALSE(p->Matches(l));
  EXPECT_THAT(ParseLayoutPattern("tq=8").status().message(), HasSubstr("unknown key 'tq'"));
  EXPECT_THAT(ParseLayoutPattern("tp=0").status().message(), HasSubstr("no positive size"));
}

// Every valid layout planned (exhaustive) against the search: the same table.
void ExpectSearchEqualsEnumeration(LayoutSearchRequest q) {
  auto searched = SearchLayouts(q);
  ASSERT_TRUE(searched.ok()) << searched.status();
  q.exhaustive = true;
  auto all = SearchLayouts(q);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_GT(all->ranked.size(), static_cast<size_t>(q.top));
  EXPECT_EQ(searched->valid, all->valid);
  // The bounds spared planning most layouts.
  EXPECT_LT(searched->planned, all->planned);
  ASSERT_EQ(searched->top, q.top);
  for (int i = 0; i < q.top; ++i) {
    EXPECT_EQ(LayoutName(searched->ranked[i].layout), LayoutName(all->ranked[i].layout)) << i;
    EXPECT_EQ(searched->ranked[i].layout, all->ranked[i].layout) << i;
    EXPECT_EQ(searched->ranked[i].step_seconds, all->ranked[i].step_seconds) << i;
  }
  // The bound is below every plan's step.
  for (const LayoutOutcome& o : all->ranked) {
    EXPECT_LE(o.bound_seconds, o.step_seconds * (1 + 1e-12)) << LayoutName(o.layout);
  }
}

TEST(SearchLayouts, EqualsFullEnumerationOnASmallMoeJob) {
  ExpectSearchEqualsEnumeration(SmallMoe(70 * kGiB));
}

TEST(SearchLayouts, EqualsFullEnumerationWhereMemoryBinds) {
  ExpectSearchEqualsEnumeration(SmallDense());
}

// Fixed memory alone rules a layout out only where full planning finds no fit.
TEST(SearchLayouts, FixedMemoryPruningOnlyRemovesLayoutsThatDoNotFit) {
  LayoutSearchRequest q = SmallMoe(20 * kGiB);
  q.exhaustive = true;
  auto all = SearchLayouts(q);
  ASSERT_TRUE(all.ok()) << all.status();
  int unfit = 0;
  for (const LayoutOutcome& o : all->ranked) {
    auto bound = BoundLayout(q.model, q.hardware, ApplyLayout(q.base, o.layout), q.options);
    ASSERT_TRUE(bound.ok());
    EXPECT_EQ(bound->unfit, "") << LayoutName(o.layout) << " fits when planned";
  }
  // And some layouts were pruned that way, with the reason said.
  q.exhaustive = false;
  auto searched = SearchLayouts(q);
  ASSERT_TRUE(searched.ok());
  for (const PrunedFamily& f : searched->pruned) {
    if (f.reason.find("fixed memory alone") != std::string::npos) unfit += f.layouts;
  }
  EXPECT_GT(unfit, 0);
  ASSERT_FALSE(searched->ranked.empty());
  EXPECT_EQ(searched->ranked[0].layout, all->ranked[0].layout);
}

// Each ranked layout, planned alone with PlanPipeline, gives the numbers the table shows.
TEST(SearchLayouts, EveryRankedLayoutReplannedAloneGivesTheSameNumbers) {
  LayoutSearchRequest q = SmallDense();
  auto searched = SearchLayouts(q);
  ASSERT_TRUE(searched.ok());
  ASSERT_GE(searched->ranked.size(), 2u);
  for (const LayoutOutcome& o : searched->ranked) {
    auto alone = PlanPipeline(q.model, q.hardware, ApplyLayout(q.base, o.layout), q.options);
    ASSERT_TRUE(alone.ok());
    const LayoutOutcome again = SummarizeLayout(o.layout, *alone, q.global_batch, q.base.seq_len);
    EXPECT_EQ(again.step_seconds, o.step_seconds) << LayoutName(o.layout);
    EXPECT_EQ(again.peak_bytes, o.peak_bytes);
    EXPECT_EQ(again.host_bytes, o.host_bytes);
    EXPECT_EQ(again.comm_seconds, o.comm_seconds);
    EXPECT_EQ(again.bubble_seconds, o.bubble_seconds);
    EXPECT_NEAR(o.compute_seconds + o.memory_seconds + o.comm_seconds + o.bubble_seconds,
                o.step_seconds, 1e-9 * o.step_seconds);
  }
}

TEST(SearchLayouts, RanksAPatternWhereverItFalls) {
  LayoutSearchRequest q = SmallMoe(70 * kGiB);
  q.top = 1;
  q.rank_also = {*ParseLayoutPattern("tp=1,cp=1,ep=16,pp=1,mb=1")};
  auto ranged = SearchLayouts(q);
  ASSERT_TRUE(ranged.ok());
  q.exact_rank = true;
  auto searched = SearchLayouts(q);
  ASSERT_TRUE(searched.ok());
  q.exhaustive = true;
  auto all = SearchLayouts(q);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(searched->rank_also_rank.size(), 1u);
  EXPECT_EQ(searched->rank_also_rank[0], all->rank_also_rank[0]);
  EXPECT_EQ(searched->rank_also_rank_max[0], searched->rank_also_rank[0]);
  ASSERT_GT(searched->rank_also_rank[0], 1);
  // Without exact_rank: the same layout and step, its rank a range around the exact one, from
  // fewer plans.
  EXPECT_EQ(ranged->rank_also_outcome[0].layout, searched->rank_also_outcome[0].layout);
  EXPECT_EQ(ranged->rank_also_outcome[0].step_seconds, searched->rank_also_outcome[0].step_seconds);
  EXPECT_LE(ranged->rank_also_rank[0], searched->rank_also_rank[0]);
  EXPECT_GE(ranged->rank_also_rank_max[0], searched->rank_also_rank[0]);
  EXPECT_LT(ranged->planned, searched->planned);
  const std::string text = RenderLayoutSearch(q, *searched, {});
  EXPECT_THAT(text, HasSubstr("gap to the best"));
  EXPECT_THAT(text, HasSubstr("decides:"));
}

// Under hf the layouts are torch's data-parallel engines (DDP, ZeRO, FSDP2), each planned.
TEST(SearchLayouts, ChoosesTheShardingUnderHf) {
  LayoutSearchRequest q;
  q.model = Cut("llama-3.1-8b", 4);
  q.hardware = *HardwarePreset("h100");
  q.base = DefaultRunSettings(Framework::kHf, q.model);
  q.base.seq_len = 8192;
  q.gpu_counts = {8};
  q.global_batch = 8;
  q.options.gpu_budget_bytes = 40 * kGiB;
  q.options.host_budget_bytes = q.hardware.DefaultHostBudgetPerGpu();
  q.shardings = {Sharding::kNoShard, Sharding::kOptim, Sharding::kOptimGrads,
                 Sharding::kOptimGradsParams};
  q.top = 2;
  ExpectSearchEqualsEnumeration(q);
  auto searched = SearchLayouts(q);
  ASSERT_TRUE(searched.ok());
  ASSERT_FALSE(searched->ranked.empty());
  const Layout& best = searched->ranked[0].layout;
  ASSERT_TRUE(best.sharding.has_value());
  EXPECT_EQ(best.tp, 1);  // transformers eager: no tensor or context parallelism
  EXPECT_EQ(best.cp, 1);
  EXPECT_THAT(LayoutFlags(best, q.global_batch),
              HasSubstr(absl::StrCat("--sharding ", ShardingName(*best.sharding))));
}

TEST(SearchLayouts, SaysWhyFamiliesArePruned) {
  LayoutSearchRequest q = SmallMoe(70 * kGiB);
  q.gpu_counts = {32};
  auto searched = SearchLayouts(q);
  ASSERT_TRUE(searched.ok());
  std::string reasons;
  for (const PrunedFamily& f : searched->pruned) reasons += f.reason + "\n";
  EXPECT_THAT(reasons, HasSubstr("crosses the NVLink domain"));  // TP 16, TP 32
  EXPECT_THAT(reasons, HasSubstr("global batch 32 is not a multiple"));
  EXPECT_THAT(reasons, HasSubstr("fixed memory alone"));
  // ValidatePipeline's own words, once per family however many layouts it rules out.
  EXPECT_THAT(reasons, HasSubstr("--rank-order is tp-cp-ep-pp-dp"));
  for (const PrunedFamily& f : searched->pruned) {
    for (const PrunedFamily& g : searched->pruned) {
      if (&f != &g && f.kind == g.kind && f.kind != "divisibility") {
        EXPECT_NE(f.example, g.example) << f.reason;
      }
    }
  }
  // And ValidateRun's, where TP may leave the NVLink domain: 64 does not divide 32 heads.
  q.allow_tp_outside_nvlink = true;
  q.gpu_counts = {64};
  q.global_batch = 64;
  auto wide = SearchLayouts(q);
  ASSERT_TRUE(wide.ok());
  reasons.clear();
  for (const PrunedFamily& f : wide->pruned) reasons += f.reason + "\n";
  EXPECT_THAT(reasons, HasSubstr("heads must divide evenly"));
  EXPECT_THAT(reasons, ::testing::Not(HasSubstr("crosses the NVLink domain")));
}

}  // namespace
}  // namespace stowage::planner
