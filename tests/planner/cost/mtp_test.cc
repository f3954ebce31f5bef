// Multi-token prediction as plannable layers of the last stage under megatron (Note [MTP layers]
// in planner/frameworks/megatron.cc, Note [MTP layers] in include/stowage/plan.h): the saved bytes
// of an MTP layer counted by hand from Megatron-Core's multi_token_prediction.py, its place after
// the decoder layers on the last pipeline stage, --mtp-layers 0, the hf refusal, the emitted
// --mtp-num-layers and the plan JSON round trip.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "bridges/megatron_emit.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/pipeline_layout.h"
#include "planner/cost/reference_jobs.h"
#include "planner/cost/run_settings.h"
#include "planner/frameworks/step_cost.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "planner/report/pipeline_report.h"
#include "planner/report/report.h"
#include "planner/search/baseline.h"
#include "planner/search/optimizer.h"
#include "planner/search/pipeline.h"
#include "stowage/plan.h"

namespace stowage::planner {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

const SavedTensor* Find(const LayerCost& l, const std::string& name) {
  for (const SavedTensor& t : l.saved) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

RunSettings DeepSeekSmallRun(int tp) {
  RunSettings run;
  run.seq_len = 4096;
  run.tp = tp;
  run.cp = 1;
  run.ep = 8;
  run.gpus = 1024 * tp;
  return run;
}

// Per token, on top of the transformer layer it wraps (multi_token_prediction.py
// MultiTokenPredictionLayer, TE spec, SP: every term over tp):
//   the two checkpoint inputs, hidden states and the shifted tokens' embedding: 2 h dt
//   the shifted token ids the embedding's backward keeps (int64, not split):     8 (x tp)
//   enorm's and hnorm's fp32 rstdevs:                                            2 x 4
//   torch.cat(...) = eh_proj's saved input:                                      2 h dt
//   final_layernorm's input and rstdev:                                          h dt + 4
TEST(MtpLayer, SavedBytesPerTokenByHand) {
  const ModelConfig ds = *ModelPreset("deepseek-v3");  // hidden 7168, 61 layers, 1 MTP module
  ASSERT_EQ(ds.mtp_layers, 1);
  const HardwareProfile hw = *HardwarePreset("h200");
  for (int tp : {1, 2}) {
    SCOPED_TRACE(tp);
    const StepCost step = *BuildStepCost(ds, hw, DeepSeekSmallRun(tp));
    ASSERT_EQ(step.layers.size(), 62u);
    const LayerCost& last = step.layers[60];
    const LayerCost& mtp = step.layers[61];
    EXPECT_EQ(mtp.index, 61);
    EXPECT_EQ(mtp.name, "mtp.0");
    EXPECT_EQ(mtp.type, "mtp+mla+moe");
    EXPECT_TRUE(last.name.empty());
    const uint64_t t = 4096, h = 7168, dt = 2;
    EXPECT_EQ(mtp.input_bytes, 2 * h * dt * t / tp + 8 * t);
    EXPECT_EQ(Find(mtp, "input")->bytes, 2 * h * dt * t / tp + 8 * t);
    EXPECT_EQ(Find(mtp, "mtp.norms")->bytes, 8 * t / tp);
    EXPECT_EQ(Find(mtp, "mtp.eh_proj_in")->bytes, 2 * h * dt * t / tp);
    EXPECT_EQ(Find(mtp, "mtp.final_norm")->bytes, (h * dt + 4) * t / tp);
    // The transformer layer inside is a decoder layer of the last kind, byte for byte.
    EXPECT_EQ(Find(mtp, "mtp.layer_input")->bytes, last.input_bytes);
    const uint64_t own = (2 * h * dt + 8 + 2 * h * dt + h * dt + 4) * t / tp + 8 * t;
    EXPECT_EQ(mtp.saved_bytes, last.saved_bytes + own);
    EXPECT_EQ(mtp.ffn_saved_bytes, last.ffn_saved_bytes);
    ASSERT_EQ(mtp.modules.size(), last.modules.size());
    for (size_t k = 0; k < mtp.modules.size(); ++k) {
      EXPECT_EQ(mtp.modules[k].name, last.modules[k].name);
      EXPECT_EQ(mtp.modules[k].saved_bytes, last.modules[k].saved_bytes);
    }
    // Its output is final_layernorm's (h wide), what the second LM head reads.
    EXPECT_EQ(mtp.output_bytes, h * dt * t / tp);
    // eh_proj: 2h -> h, 2 FLOPs per multiply-add, its weight split over TP.
    EXPECT_DOUBLE_EQ(mtp.forward_flops,
                     last.forward_flops + 2.0 * (2.0 * h * h) / tp * static_cast<double>(t));
    EXPECT_GT(mtp.forward_seconds, last.forward_seconds);
    EXPECT_GT(mtp.backward_seconds, last.backward_seconds);
    // Megatron recomputes it like any other layer (_checkpointed_forward): every option exists.
    const OptionCost recompute = EvaluateOption(mtp, {LayerPolicy::kRecompute, 0, 1});
    EXPECT_EQ(recompute.resident_bytes, mtp.input_bytes);
    const OptionCost offload = EvaluateOption(mtp, {LayerPolicy::kOffloadInput, 0, 1});
    EXPECT_EQ(offload.host_bytes, mtp.input_bytes);
  }
}

// The second LM head and loss: each depth's output and its gradient are held in the tail, one
// loss chunk's logits reused by both heads; unchunked, both heads' logits are saved at once.
TEST(MtpLayer, SecondHeadAndLossInTheTail) {
  const ModelConfig ds = *ModelPreset("deepseek-v3");
  const HardwareProfile hw = *HardwarePreset("h200");
  RunSettings with = DeepSeekSmallRun(1);
  with.seq_len = 16384;  // two loss chunks of 8192 tokens
  RunSettings without = with;
  without.mtp_layers = 0;
  const uint64_t t = 16384, h = 7168, dt = 2, v = 129280;
  const StepCost a = *BuildStepCost(ds, hw, with);
  const StepCost b = *BuildStepCost(ds, hw, without);
  EXPECT_EQ(a.tail_bytes - b.tail_bytes, 2 * h * dt * t);
  EXPECT_NEAR(a.tail_seconds, 2 * b.tail_seconds, 1e-12);  // the head GEMMs and the loss twice
  with.loss_chunk_tokens = without.loss_chunk_tokens = 0;
  const StepCost c = *BuildStepCost(ds, hw, with);
  const StepCost d = *BuildStepCost(ds, hw, without);
  EXPECT_EQ(c.tail_bytes - d.tail_bytes, 2 * h * dt * t + t * v * (dt + 4 + 4));
}

// The published arithmetic counts GLM-5.3-Flash's 45 decoder layers; its one MTP layer is a row
// of its own after them.
TEST(MtpLayer, ReferenceRunHasOneMtpRowAfterTheDecoderLayers) {
  const ModelConfig glm = *ModelPreset("glm-5.3-flash");
  ASSERT_EQ(glm.mtp_layers, 1);
  const StepCost step = *BuildStepCost(glm, *HardwarePreset("b200"), RunSettings{});
  ASSERT_EQ(step.layers.size(), 46u);
  EXPECT_EQ(step.mtp_layers, 1);
  uint64_t decoder_inputs = 0;
  for (int i = 0; i < 45; ++i) decoder_inputs += step.layers[i].input_bytes;
  EXPECT_EQ(decoder_inputs, 45ull * 131072 * 4 * 4096 * 2);  // 180 GiB
  EXPECT_EQ(step.layers[45].name, "mtp.0");
  EXPECT_EQ(step.layers[45].type, "mtp+kda+moe");                          // layer 44 is KDA + MoE
  EXPECT_EQ(step.layers[45].input_bytes, 131072ull * (2 * 4096 * 2 + 8));  // 2 GiB + 1 MiB

  OptimizerOptions o;
  o.gpu_budget_bytes = HardwarePreset("b200")->UsableBytes();
  o.host_budget_bytes = HardwarePreset("b200")->DefaultHostBudgetPerGpu();
  const OptimizeResult r = Optimize(step, o);
  ASSERT_TRUE(r.feasible);
  const Plan plan =
      MakePlan(step, r, ComputeBaseline(step, o.gpu_budget_bytes),
               {"stowage test", "glm-5.3-flash", "b200", o.gpu_budget_bytes, o.host_budget_bytes});
  ASSERT_TRUE(ValidatePlan(plan).ok()) << ValidatePlan(plan);
  EXPECT_EQ(plan.mtp_layers, 1);
  EXPECT_EQ(plan.layers.back().name, "mtp.0");
  const std::string table = RenderTable(step, plan, r);
  EXPECT_THAT(table, HasSubstr("\n    mtp.0  mtp+kda+moe"));
  EXPECT_THAT(RenderSummary(step, plan, r),
              HasSubstr("multi-token prediction 1 MTP layer trained"));
}

// Megatron-Core places every MTP layer on the last pipeline stage, after its decoder layers
// (mtp_on_this_rank without a custom layout); --pp-layout counts decoder layers only.
TEST(MtpLayer, LastStageRunsItAfterItsDecoderLayers) {
  const ModelConfig ds = *ModelPreset("deepseek-v3");
  const HardwareProfile hw = *HardwarePreset("h200");
  const RunSettings run = DeepSeekV3Pp16Job();
  const std::vector<LayerRange> split = *VirtualStageLayers(ds, run);
  ASSERT_EQ(split.size(), 16u);
  EXPECT_EQ(split[14].first_layer, 55);
  EXPECT_EQ(split[14].num_layers, 4);
  EXPECT_EQ(split[15].first_layer, 59);
  EXPECT_EQ(split[15].num_layers, 3);  // layers 59, 60 and mtp.0
  const StepCost last = *BuildStepCost(ds, hw, run, 15);
  ASSERT_EQ(last.layers.size(), 3u);
  EXPECT_EQ(last.layers[2].name, "mtp.0");
  EXPECT_EQ(last.layers[2].in_flight_microbatches, 1);
  const StepCost before = *BuildStepCost(ds, hw, run, 14);
  for (const LayerCost& l : before.layers) EXPECT_TRUE(l.name.empty()) << l.index;

  OptimizerOptions o;
  o.gpu_budget_bytes = hw.UsableBytes();
  o.host_budget_bytes = hw.HostBytesPerGpu();
  auto p = PlanPipeline(ds, hw, run, o);
  ASSERT_TRUE(p.ok()) << p.status();
  const Plan plan = MakePipelinePlan(
      *p, {"stowage test", "deepseek-v3", "h200", o.gpu_budget_bytes, o.host_budget_bytes});
  ASSERT_TRUE(ValidatePlan(plan).ok()) << ValidatePlan(plan);
  ASSERT_EQ(plan.layers.size(), 62u);
  EXPECT_EQ(plan.mtp_layers, 1);
  EXPECT_EQ(plan.layers[61].name, "mtp.0");
  EXPECT_EQ(plan.layers[60].name, "");
  EXPECT_EQ(plan.stages[15].chunks[0].first_layer, 59);
  EXPECT_EQ(plan.stages[15].chunks[0].num_layers, 3);
  EXPECT_EQ(PlaceOfLayer(plan, 61).stage, 15);
  EXPECT_THAT(RenderStageTable(*p, plan), HasSubstr("59-60+mtp.0+head"));
  // The contract round trip: the name and run.mtp_layers are written and read back.
  const std::string json = PlanToJson(plan);
  EXPECT_THAT(json, HasSubstr("\"mtp_layers\": 1"));
  EXPECT_THAT(json, HasSubstr("\"name\": \"mtp.0\""));
  auto parsed = ParsePlanJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->mtp_layers, 1);
  EXPECT_EQ(parsed->layers[61].name, "mtp.0");
  EXPECT_EQ(PlanToJson(*parsed), json);
}

// --mtp-layers 0 (a run that does not train MTP, e.g. RL post-training): no MTP layer, none of
// its weights, gradients or optimizer state, no second head; model_parameters stays the
// architecture's.
TEST(MtpLayer, ZeroLayersTrainsNone) {
  const ModelConfig ds = *ModelPreset("deepseek-v3");
  const HardwareProfile hw = *HardwarePreset("h200");
  RunSettings run = DeepSeekV3Pp16Job();
  const StepCost with = *BuildStepCost(ds, hw, run, 15);
  run.mtp_layers = 0;
  const StepCost without = *BuildStepCost(ds, hw, run, 15);
  EXPECT_EQ(without.layers.size(), 2u);
  EXPECT_EQ(without.mtp_layers, 0);
  EXPECT_EQ(without.model_parameters, with.model_parameters);
  EXPECT_EQ(without.model_parameters, ModelParameters(ds));
  // The MTP module's weights (bf16) on this stage: dense over tp (1), experts over ep (64); its
  // word-embedding copy is gone too (untied DeepSeek-V3 keeps one only to feed MTP).
  EXPECT_FALSE(LastStageHoldsWordEmbeddings(ds, run));
  const double params = static_cast<double>(MtpDenseParams(ds)) +
                        static_cast<double>(MtpRoutedExpertParams(ds)) / 64 +
                        static_cast<double>(ds.vocab) * ds.hidden;
  const double weights = static_cast<double>(with.fixed.weights - without.fixed.weights);
  EXPECT_NEAR(weights, 2 * params, 8.0);
  OptimizerOptions o;
  o.gpu_budget_bytes = hw.UsableBytes();
  o.host_budget_bytes = hw.HostBytesPerGpu();
  const OptimizeResult r = Optimize(without, o);
  const Plan plan = MakePlan(without, r, ComputeBaseline(without, o.gpu_budget_bytes),
                             {"stowage test", "deepseek-v3", "h200", 0, 0});
  EXPECT_EQ(plan.mtp_layers, 0);
  EXPECT_THAT(PlanToJson(plan), Not(HasSubstr("mtp_layers")));
  EXPECT_THAT(RenderSummary(without, plan, r),
              HasSubstr("multi-token prediction not trained (--mtp-layers 0)"));
  EXPECT_THAT(bridges::EmitMegatronArguments(plan, RunSettings{})->args,
              Not(::testing::Contains("--mtp-num-layers")));
}

// transformers drops the MTP weights on load and never runs them.
TEST(MtpLayer, HfTrainsNoneAndRefusesMtpLayers) {
  const ModelConfig ds = *ModelPreset("deepseek-v3");
  RunSettings run = DeepSeekSmallRun(1);
  run.framework = Framework::kHf;
  run.loss_chunk_tokens = 0;
  EXPECT_EQ(TrainedMtpLayers(ds, run), 0);
  run.mtp_layers = 1;
  const absl::Status s = ValidateRun(ds, run);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--mtp-layers is 1"));
  EXPECT_THAT(s.message(), HasSubstr("transformers"));
  run.framework = Framework::kMegatron;
  run.mtp_layers = 65;
  EXPECT_THAT(ValidateRun(ds, run).message(), HasSubstr("--mtp-layers is 65; allowed: 0 to 64"));
  run.mtp_layers = 2;  // Megatron builds any count of the model's kind
  EXPECT_TRUE(ValidateRun(ds, run).ok());
  EXPECT_EQ(TrainedMtpLayers(ds, run), 2);
}

TEST(MtpLayer, EmitMegatronSaysMtpNumLayers) {
  const ModelConfig ds = *ModelPreset("deepseek-v3");
  const HardwareProfile hw = *HardwarePreset("h200");
  const StepCost step = *BuildStepCost(ds, hw, DeepSeekSmallRun(1));
  OptimizerOptions o;
  o.gpu_budget_bytes = hw.UsableBytes();
  o.host_budget_bytes = hw.HostBytesPerGpu();
  o.force = LayerPolicy::kRecompute;
  const OptimizeResult r = Optimize(step, o);
  const Plan plan = MakePlan(step, r, ComputeBaseline(step, o.gpu_budget_bytes),
                             {"stowage test", "deepseek-v3", "h200", 0, 0});
  const bridges::MegatronArguments args = *bridges::EmitMegatronArguments(plan, RunSettings{});
  auto at = std::find(args.args.begin(), args.args.end(), "--mtp-num-layers");
  ASSERT_NE(at, args.args.end());
  EXPECT_EQ(*(at + 1), "1");
  // Every decoder layer and mtp.0 recomputed: uniform full recompute, which Megatron applies to
  // the MTP layer too (its _checkpointed_forward); the counts are the decoder's.
  at = std::find(args.args.begin(), args.args.end(), "--recompute-method");
  ASSERT_NE(at, args.args.end());
  EXPECT_EQ(*(at + 1), "uniform");
  EXPECT_TRUE(args.notes.empty()) << args.notes.front();
}

// The plan contract (stowage/plan.h Note [MTP layers]): the last run.mtp_layers layers are
// mtp.0, mtp.1, ... of an "mtp+" type in the last chunk of the last stage; nothing else is named.
TEST(MtpPlan, ValidatorHoldsNamesAndPlacement) {
  Plan plan;
  plan.seq_len = 4096;
  for (int i = 0; i < 4; ++i) {
    LayerPlan l;
    l.index = i;
    l.type = "mla+moe";
    plan.layers.push_back(l);
  }
  plan.layers[3].type = "mtp+mla+moe";
  plan.layers[3].name = MtpLayerName(0);
  plan.mtp_layers = 1;
  ASSERT_TRUE(ValidatePlan(plan).ok()) << ValidatePlan(plan);
  {
    Plan bad = plan;
    bad.layers[3].name = "mtp.1";
    EXPECT_THAT(ValidatePlan(bad).message(),
                HasSubstr("'layers[3].name' is 'mtp.1'; allowed: 'mtp.0'"));
  }
  {
    Plan bad = plan;
    bad.layers[2].name = "mtp.0";
    EXPECT_THAT(ValidatePlan(bad).message(), HasSubstr("'layers[2].name' is 'mtp.0'"));
  }
  {
    Plan bad = plan;
    bad.layers[3].type = "mla+moe";
    EXPECT_THAT(ValidatePlan(bad).message(), HasSubstr("an MTP layer's type starts with 'mtp+'"));
  }
  {
    Plan bad = plan;
    bad.mtp_layers = 4;
    EXPECT_THAT(ValidatePlan(bad).message(), HasSubstr("run.mtp_layers' is 4"));
  }
  {
    Plan bad = plan;
    bad.mtp_layers = 0;  // named, but the run trains none
    EXPECT_FALSE(ValidatePlan(bad).ok());
  }
  // Two stages: the MTP layer must be in the last stage's last chunk.
  Plan staged = plan;
  staged.pp = 2;
  staged.microbatches = 2;
  staged.stages.resize(2);
  for (int st = 0; st < 2; ++st) {
    staged.stages[st].stage = st;
    staged.stages[st].chunks = {{2 * st, 2}};
    staged.stages[st].embedding = st == 0;
    staged.stages[st].lm_head = st == 1;
  }
  for (LayerPlan& l : staged.layers) l.in_flight_microbatches = l.index < 2 ? 2 : 1;
  ASSERT_TRUE(ValidatePlan(staged).ok()) << ValidatePlan(staged);
  auto parsed = ParsePlanJson(PlanToJson(staged));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->layers[3].name, "mtp.0");
  // A reader refuses a name that disagrees with run.mtp_layers.
  std::string json = PlanToJson(staged);
  json.replace(json.find("\"mtp_layers\": 1"), 15, "\"mtp_layers\": 0");
  EXPECT_THAT(ParsePlanJson(json).status().message(), HasSubstr("layers[3].name"));
}

}  // namespace
}  // namespace stowage::planner
