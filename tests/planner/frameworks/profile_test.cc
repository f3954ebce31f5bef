// Measured layer profiles: the strict reader, the StepCost it becomes (worked out by hand), and
// planning from it (the same plans as from the equivalent StepCost written out directly;
// selective recompute of a named module when that is the cheapest way to fit).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "planner/frameworks/layer_profile.h"
#include "planner/hardware/op_time.h"
#include "planner/search/optimizer.h"
#include "planner/search/simulator.h"
#include "tests/planner/profile_json.h"

namespace stowage::planner {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

// Two layers; numbers small enough to follow by hand.
Json TinyProfile() {
  return Json::parse(R"({
    "format": "stowage-layer-profile", "schema_version": 1, "generator": "test",
    "device": "cuda:0", "measured_memory": true, "tokens": 64,
    "fixed_bytes": {"weights": 1000, "gradients": 1000, "optimizer": 0, "other": 100},
    "loss": {"peak_bytes": 50, "seconds": 0.25},
    "link": {"d2h_bytes_per_second": 1000, "h2d_bytes_per_second": 800,
             "bidir_d2h_bytes_per_second": 600},
    "layers": [
      {"index": 0, "type": "Block", "input_bytes": 100, "output_bytes": 100,
       "forward_peak_bytes": 700, "backward_peak_bytes": 900,
       "forward_seconds": 0.5, "backward_seconds": 1.0,
       "modules": [{"name": "fc1", "seconds": 0.1}, {"name": "idle", "seconds": 0.2}],
       "saved": [{"name": "input", "bytes": 100, "module": ""},
                 {"name": "fc1.0", "bytes": 300, "module": "fc1"},
                 {"name": "act", "bytes": 200}]},
      {"index": 1, "type": "Block", "input_bytes": 100, "output_bytes": 40,
       "forward_peak_bytes": 100, "backward_peak_bytes": 100,
       "forward_seconds": 0.5, "backward_seconds": 1.0,
       "saved": [{"name": "x", "bytes": 300}]}
    ]})");
}

TEST(ProfileReader, ReadsEveryField) {
  const LayerProfileSet p = Parse(TinyProfile());
  EXPECT_EQ(p.device, "cuda:0");
  EXPECT_TRUE(p.measured_memory);
  EXPECT_EQ(p.tokens, 64u);
  EXPECT_EQ(p.fixed.total(), 2100u);
  EXPECT_EQ(p.loss_peak_bytes, 50u);
  EXPECT_DOUBLE_EQ(p.bidir_d2h_bytes_per_second, 600);
  EXPECT_DOUBLE_EQ(p.bidir_h2d_bytes_per_second, 800);  // absent: the one-way rate
  ASSERT_EQ(p.layers.size(), 2u);
  ASSERT_EQ(p.layers[0].saved.size(), 3u);
  EXPECT_EQ(p.layers[0].saved[1].module, "fc1");
  EXPECT_EQ(p.layers[0].saved[2].module, "");
  EXPECT_EQ(p.layers[1].output_bytes, 40u);
  // The writer's text reads back to the same profile.
  const LayerProfileSet again = *ParseProfileJson(ProfileToJson(p), "round trip");
  EXPECT_EQ(ProfileToJson(again), ProfileToJson(p));
}

// Regression: a profile built in code with no measured both-directions rate (0) was written as
// `"bidir_..._bytes_per_second": 0`, which the reader refuses; it is written absent instead.
TEST(ProfileReader, AnUnmeasuredBothDirectionsRateRoundTrips) {
  LayerProfileSet p = Parse(TinyProfile());
  p.bidir_d2h_bytes_per_second = 0;
  p.bidir_h2d_bytes_per_second = 0;
  auto again = ParseProfileJson(ProfileToJson(p), "round trip");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_DOUBLE_EQ(again->bidir_d2h_bytes_per_second, again->d2h_bytes_per_second);
  EXPECT_DOUBLE_EQ(again->bidir_h2d_bytes_per_second, again->h2d_bytes_per_second);
}

TEST(ProfileReader, ErrorsNameThePathTheValueAndTheRule) {
  Json j = TinyProfile();
  j["layers"][1]["saved"][0]["bytes"] = -5;
  EXPECT_THAT(ErrorOf(j), HasSubstr("test profile: field 'layers[1].saved[0].bytes' has value -5; "
                                    "allowed: an integer in [0,"));
  j = TinyProfile();
  j["layers"][0]["forward_seconds"] = "fast";
  EXPECT_THAT(ErrorOf(j), HasSubstr("'layers[0].forward_seconds' has value \"fast\""));
  j = TinyProfile();
  j["layers"][0]["saved"][2]["module"] = "fc2";
  EXPECT_THAT(ErrorOf(j), HasSubstr("'layers[0].saved[2].module'"));
  EXPECT_THAT(ErrorOf(j), HasSubstr("one of the names in layers[0].modules"));
  j = TinyProfile();
  j["layers"][0]["saved"][1]["name"] = "act";
  EXPECT_THAT(ErrorOf(j), HasSubstr("unique within the layer"));
  j = TinyProfile();
  j["layers"][0]["saved"][0]["bytes"] = 99;
  EXPECT_THAT(ErrorOf(j), HasSubstr("the layer's input_bytes (100)"));
  j = TinyProfile();
  j["layers"][1]["index"] = 0;
  EXPECT_THAT(ErrorOf(j),
              HasSubstr("'layers[1].index' has value 0; allowed: an integer in [1, 1]"));
  j = TinyProfile();
  j["layers"][1].erase("backward_peak_bytes");
  EXPECT_THAT(ErrorOf(j), HasSubstr("layers[1].backward_peak_bytes"));
  j = TinyProfile();
  j["link"]["d2h_bytes_per_second"] = 0;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'link.d2h_bytes_per_second' has value 0"));
  j = TinyProfile();
  j["schema_version"] = 4;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'schema_version' has value 4; allowed: an integer in [1, 3]"));
  j = TinyProfile();
  j["format"] = "stowage-plan";
  EXPECT_THAT(ErrorOf(j), HasSubstr("\"stowage-layer-profile\""));
  j = TinyProfile();
  j["layers"] = Json::array();
  EXPECT_THAT(ErrorOf(j), HasSubstr("at least one layer"));
  j = TinyProfile();
  for (int m = 0; m < 9; ++m) {
    j["layers"][1]["modules"].push_back({{"name", absl::StrCat("m", m)}, {"seconds", 0.1}});
  }
  EXPECT_THAT(ErrorOf(j), HasSubstr("at most 8 modules"));
  // Byte figures that together would overflow the simulator's sums.
  j = TinyProfile();
  for (int i = 0; i < 2; ++i) j["layers"][i]["backward_peak_bytes"] = uint64_t{1} << 55;
  j["fixed_bytes"]["weights"] = uint64_t{1} << 55;
  EXPECT_THAT(ErrorOf(j), HasSubstr("sum to at most 2^56"));
  // Syntax errors say where.
  auto bad = ParseProfileJson("{\"format\": \n  nope}", "p.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("p.json"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("line 2"));
}

// A profile measured off the GPU (stowage.hf_profile): op work instead of seconds, gradients
// created in backward, no link.
Json OffGpuProfile() {
  Json j = TinyProfile();
  j.erase("link");
  j["gradients_in_backward"] = true;
  j["fixed_bytes"]["gradients"] = 0;
  j["framework"] = "hf";
  j["optimizer"] = "none";
  j["grad_dtype"] = "bf16";
  j["model_parameters"] = 500;
  j["loss"] = {{"peak_bytes", 50}, {"grad_bytes", 70}, {"work", {{"gemm_flops", 3e12}}}};
  j["embedding"] = {{"grad_bytes", 30}, {"work", {{"elementwise_bytes", 4e9}, {"kernels", 2}}}};
  for (Json& l : j["layers"]) {
    l.erase("forward_seconds");
    l.erase("backward_seconds");
    l["forward_work"] = {{"gemm_flops", 1e12},
                         {"fp32_gemm_flops", 5e10},
                         {"attention_forward_flops", 2e11},
                         {"kernels", 10}};
    l["backward_work"] = {{"gemm_flops", 2e12},         {"attention_backward_flops", 5e11},
                          {"grouped_gemm_flops", 1e12}, {"torch_grouped_mm_flops", 3e11},
                          {"tokens_per_expert", 256},   {"elementwise_bytes", 1e9}};
    l["grad_bytes"] = 40;
  }
  j["layers"][0]["modules"][0].erase("seconds");
  j["layers"][0]["modules"][0]["work"] = {{"elementwise_bytes", 3e9}};
  return j;
}

TEST(ProfileReader, OpWorkGradientsInBackwardAndNoLink) {
  const LayerProfileSet p = Parse(OffGpuProfile());
  EXPECT_TRUE(p.gradients_in_backward);
  EXPECT_FALSE(p.has_link);
  EXPECT_EQ(p.loss_grad_bytes, 70u);
  EXPECT_EQ(p.embedding_grad_bytes, 30u);
  EXPECT_EQ(p.layers[1].grad_bytes, 40u);
  EXPECT_EQ(p.framework, Framework::kHf);
  EXPECT_EQ(p.optimizer, OptimizerKind::kNone);
  EXPECT_EQ(p.grad_bytes, 2);
  EXPECT_EQ(p.model_parameters, 500u);
  ASSERT_TRUE(p.layers[0].backward_work.has_value());
  EXPECT_DOUBLE_EQ(p.layers[0].backward_work->tokens_per_expert, 256);
  EXPECT_DOUBLE_EQ(p.layers[0].backward_work->torch_grouped_mm_flops, 3e11);
  ASSERT_TRUE(p.layers[0].forward_work.has_value());
  EXPECT_DOUBLE_EQ(p.layers[0].forward_work->fp32_gemm_flops, 5e10);
  ASSERT_TRUE(p.layers[0].modules[0].work.has_value());
  EXPECT_FALSE(p.layers[0].modules[1].work.has_value());
  const LayerProfileSet again = *ParseProfileJson(ProfileToJson(p), "round trip");
  EXPECT_EQ(ProfileToJson(again), ProfileToJson(p));
}

TEST(ProfileReader, OpWorkErrors) {
  Json j = OffGpuProfile();
  j["layers"][0]["forward_seconds"] = 0.5;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'layers[0].forward_seconds'"));
  EXPECT_THAT(ErrorOf(j), HasSubstr("absent when 'forward_work' gives the time as op work"));
  j = OffGpuProfile();
  j["layers"][1]["backward_work"].erase("tokens_per_expert");
  EXPECT_THAT(ErrorOf(j), HasSubstr("'layers[1].backward_work.tokens_per_expert'"));
  // torch._grouped_mm FLOPs alone need the rows per group too.
  j["layers"][1]["backward_work"].erase("grouped_gemm_flops");
  EXPECT_THAT(ErrorOf(j), HasSubstr("'layers[1].backward_work.tokens_per_expert'"));
  j = OffGpuProfile();
  j["layers"][0]["forward_work"]["gemm_flops"] = -1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'layers[0].forward_work.gemm_flops' has value -1"));
  j = OffGpuProfile();
  j["gradients_in_backward"] = false;
  j["loss"]["grad_bytes"] = 0;
  j["embedding"]["grad_bytes"] = 0;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'layers[0].grad_bytes'"));
  j = OffGpuProfile();
  j["gradients_in_backward"] = false;
  for (Json& l : j["layers"]) l.erase("grad_bytes");
  EXPECT_THAT(ErrorOf(j), HasSubstr("'gradients_in_backward'"));
}

// Schema version 2: the moment a layer's backward peaks (the gradients made by then, the saved
// bytes released by then) and the logits the caller holds past the loss.
Json Version2Profile() {
  Json j = OffGpuProfile();
  j["schema_version"] = 2;
  j["loss"]["held_logits_bytes"] = 20;
  j["layers"][0]["backward_peak_grad_bytes"] = 15;
  j["layers"][0]["backward_peak_released_bytes"] = 300;
  j["layers"][1]["checkpoint_held_bytes"] = 25;
  j["layers"][1]["checkpoint_held_group"] = 1;
  return j;
}

TEST(ProfileReader, Version2ReadsTheBackwardPeaksMomentAndTheHeldLogits) {
  const LayerProfileSet p = Parse(Version2Profile());
  EXPECT_EQ(p.schema_version, 2);
  EXPECT_EQ(p.held_logits_bytes, 20u);
  EXPECT_EQ(p.layers[0].backward_peak_grad_bytes, 15u);
  EXPECT_EQ(p.layers[0].backward_peak_released_bytes, 300u);
  // Absent in a version-2 layer: what version 1 meant (every gradient at the peak, nothing
  // released).
  EXPECT_EQ(p.layers[1].backward_peak_grad_bytes, 40u);
  EXPECT_EQ(p.layers[1].backward_peak_released_bytes, 0u);
  EXPECT_EQ(p.layers[1].checkpoint_held_bytes, 25u);
  EXPECT_EQ(p.layers[0].checkpoint_held_bytes, 0u);
  EXPECT_EQ(p.layers[1].checkpoint_held_group, 1);
  EXPECT_EQ(p.layers[0].checkpoint_held_group, 0);
  const LayerProfileSet again = *ParseProfileJson(ProfileToJson(p), "round trip");
  EXPECT_EQ(ProfileToJson(again), ProfileToJson(p));
  EXPECT_EQ(again.layers[0].backward_peak_released_bytes, 300u);
  EXPECT_EQ(again.layers[1].checkpoint_held_group, 1);
}

TEST(ProfileReader, AVersion1ProfileKeepsItsMeaning) {
  // Written before version 2 (OffGpuProfile says schema_version 1): every gradient of a layer at
  // its backward peak, nothing released, no held logits; written back as version 2 with those
  // figures stated, it plans the same.
  const LayerProfileSet old = Parse(OffGpuProfile());
  EXPECT_EQ(old.schema_version, 1);
  EXPECT_EQ(old.held_logits_bytes, 0u);
  for (const ProfileLayer& l : old.layers) {
    EXPECT_EQ(l.backward_peak_grad_bytes, l.grad_bytes);
    EXPECT_EQ(l.backward_peak_released_bytes, 0u);
  }
  const std::string text = ProfileToJson(old);
  EXPECT_THAT(text, HasSubstr("\"schema_version\": 3"));
  const LayerProfileSet rewritten = *ParseProfileJson(text, "rewritten");
  const HardwareProfile h200 = *HardwarePreset("h200");
  auto a = BuildStepCostFromProfile(old, h200);
  auto b = BuildStepCostFromProfile(rewritten, h200);
  ASSERT_TRUE(a.ok() && b.ok());
  for (LayerPolicy policy : {LayerPolicy::kKeep, LayerPolicy::kRecompute}) {
    Schedule s;
    s.options.assign(a->layers.size(), {policy, 0, 1});
    EXPECT_EQ(Simulate(*a, s, false).peak_bytes, Simulate(*b, s, false).peak_bytes);
  }
  // The version-1 layer 0 peaks at saved 600 + transient 200 + output 100 + input 100 with all
  // of its 40 gradient bytes.
  EXPECT_EQ(EvaluateOption(a->layers[0], {LayerPolicy::kKeep, 0, 1}).backward_peak, 1040u);
}

TEST(ProfileReader, Version2FieldErrors) {
  Json j = Version2Profile();
  j["layers"][0]["backward_peak_grad_bytes"] = 41;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'layers[0].backward_peak_grad_bytes' has value 41; "
                                    "allowed: at most the layer's grad_bytes (40)"));
  j = Version2Profile();
  j["layers"][0]["backward_peak_grad_bytes"] = -1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'layers[0].backward_peak_grad_bytes' has value -1"));
  j = Version2Profile();
  j["layers"][0]["backward_peak_released_bytes"] = 601;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'layers[0].backward_peak_released_bytes' has value 601; "
                                    "allowed: at most the layer's saved bytes (600)"));
  j = Version2Profile();
  j["loss"]["held_logits_bytes"] = 51;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'loss.held_logits_bytes' has value 51; allowed: at most "
                                    "loss.peak_bytes (50)"));
  j = Version2Profile();
  j["loss"]["held_logits_bytes"] = 2.5;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'loss.held_logits_bytes' has value 2.5"));
  // Gradients made by the peak need gradients made in backward.
  j = Version2Profile();
  j["gradients_in_backward"] = false;
  j["loss"].erase("grad_bytes");
  j["embedding"]["grad_bytes"] = 0;
  for (Json& l : j["layers"]) l.erase("grad_bytes");
  EXPECT_THAT(ErrorOf(j), HasSubstr("'layers[0].backward_peak_grad_bytes' has value 15; allowed: "
                                    "at most the layer's grad_bytes (0)"));
  // A version-1 profile has none of them: its figures mean what they always did.
  for (const char* field : {"backward_peak_grad_bytes", "backward_peak_released_bytes",
                            "checkpoint_held_bytes", "checkpoint_held_group"}) {
    j = OffGpuProfile();
    j["layers"][1][field] = 5;
    EXPECT_THAT(ErrorOf(j), HasSubstr(absl::StrCat("field 'layers[1].", field,
                                                   "' has value 5; "
                                                   "allowed: absent in a schema_version 1 "
                                                   "profile")));
  }
  j = Version2Profile();
  j["layers"][1]["checkpoint_held_bytes"] = -25;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'layers[1].checkpoint_held_bytes' has value -25"));
  j = Version2Profile();
  j["layers"][1]["checkpoint_held_group"] = 1.5;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'layers[1].checkpoint_held_group' has value 1.5"));
  j = OffGpuProfile();
  j["loss"]["held_logits_bytes"] = 20;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'loss.held_logits_bytes' has value 20; allowed: absent in "
                                    "a schema_version 1 profile"));
}

TEST(ProfileStepCost, TheBackwardPeaksMomentWorkedOutByHand) {
  // Layer 0: saved 600 (input 100, fc1.0 300, act 200), output 100, input 100; own backward
  // bytes at the peak: backward_peak_bytes 900 + the saved input 100 = 1000, with 300 of the
  // saved bytes released and 15 of its 40 gradient bytes made.
  const LayerProfileSet p = Parse(Version2Profile());
  auto step = BuildStepCostFromProfile(p, *HardwarePreset("h200"));
  ASSERT_TRUE(step.ok()) << step.status();
  const LayerCost& l0 = step->layers[0];
  EXPECT_EQ(l0.ffn_saved_bytes, 300u);
  EXPECT_EQ(l0.grad_bytes, 40u);
  EXPECT_EQ(l0.attn_peak_grad_bytes, 15u);
  EXPECT_EQ(l0.ffn_peak_grad_bytes, 0u);
  // 1000 = the 300 saved bytes still held + transient + output 100 + input 100.
  EXPECT_EQ(l0.attn_backward_transient, 500u);
  const OptionCost keep = EvaluateOption(l0, {LayerPolicy::kKeep, 0, 1});
  // The larger of the start (all 600 saved + 100 + 100, no gradient: 800) and the peak (300 +
  // 500 + 100 + 100 + 15 gradient bytes: 1015); version 1 charged 1040.
  EXPECT_EQ(keep.backward_peak, 1015u);
  // The forward reads the same measured level whatever the backward released: 800.
  EXPECT_EQ(keep.forward_peak, 800u);
  EXPECT_EQ(EvaluateOption(l0, {LayerPolicy::kRecompute, 0, 1}).forward_peak, 300u);
  // Released before the peak, more than it holds: the start binds.
  LayerCost early = l0;
  early.attn_backward_transient = 0;
  EXPECT_EQ(EvaluateOption(early, {LayerPolicy::kKeep, 0, 1}).backward_peak, 800u);

  // Layer 1's checkpoint holds its input (100: keep does not save it, so its measured backward
  // does not count it) and 25 beyond it through its recomputed backward (the step's masks): its
  // backward moments with them, or its rerun forward (saved 300 and output 40, over its own 200)
  // with the output's gradient 40, whichever is more.
  const LayerCost& l1 = step->layers[1];
  EXPECT_EQ(l1.checkpoint_held_bytes, 25u);
  EXPECT_EQ(l1.checkpoint_held_group, 1);
  EXPECT_FALSE(SavesInput(l1));
  EXPECT_EQ(EvaluateOption(l1, {LayerPolicy::kKeep, 0, 1}).backward_peak, 480u);
  EXPECT_EQ(EvaluateOption(l1, {LayerPolicy::kRecompute, 0, 1}).backward_peak,
            std::max<uint64_t>(480 + 100 + 25, 340 + 40));

  // The held logits: 20 of the loss's bytes through the whole backward and at the end.
  EXPECT_EQ(step->held_logits_bytes, 20u);
  const BackwardHeld held = BackwardHeldBytes(*step);
  // In layer 1's backward: the logits 20 and the LM head's gradients 70; in layer 0's also
  // layer 1's 40; at the end, the embedding's backward, all of them, the embedding's 30 and the
  // gradient it receives (layer 0's input's, 100).
  EXPECT_EQ(held.in_layer[1], 90u);
  EXPECT_EQ(held.in_layer[0], 130u);
  EXPECT_EQ(held.at_end, 20u + 70 + 40 + 40 + 30 + 100);
  // The step under keep, over fixed 1100 (weights 1000, other 100, no gradients): layer 0's
  // backward holds its own 1015 and the 130 around it; layer 1's its own 480 (saved 300, output
  // 40, input 100, all 40 of its gradients: version-1 figures) beside layer 0's resident 600
  // and the 90 around it, the step's peak; the loss 90 beside both layers' resident 900.
  Schedule keep_all;
  keep_all.options.assign(2, {LayerPolicy::kKeep, 0, 1});
  const SimResult r = Simulate(*step, keep_all, true);
  EXPECT_EQ(r.peak_bytes, 1100u + 600 + 90 + 480);
  EXPECT_EQ(r.peak_at, "backward of layer 1");
  auto level_at = [&](double t) {
    uint64_t level = 0;
    for (const MemoryPoint& m : r.timeline) {
      if (m.seconds <= t) level = m.bytes;
    }
    return level;
  };
  for (const ComputeInterval& c : r.compute) {
    if (c.phase == Phase::kBackward && c.layer == 0) {
      EXPECT_EQ(level_at(c.start), 1100u + 130 + 1015);
      // From its end on: the logits and every gradient, the embedding's 30 included, and the
      // gradient the embedding receives (at_end).
      EXPECT_EQ(level_at(c.end), 1100u + 20 + 70 + 40 + 40 + 30 + 100);
    }
    if (c.phase == Phase::kTail) {
      EXPECT_EQ(level_at(c.start), 1100u + 900 + 90);
    }
  }
}

TEST(ProfileStepCost, OpWorkBecomesSecondsOnTheHardwarePlannedFor) {
  const LayerProfileSet p = Parse(OffGpuProfile());
  const HardwareProfile h200 = *HardwarePreset("h200");
  auto step = BuildStepCostFromProfile(p, h200);
  ASSERT_TRUE(step.ok()) << step.status();
  // The one time model: OpSeconds of each pass's work.
  EXPECT_DOUBLE_EQ(step->layers[0].forward_seconds, OpSeconds(*p.layers[0].forward_work, h200));
  EXPECT_DOUBLE_EQ(step->layers[1].backward_seconds, OpSeconds(*p.layers[1].backward_work, h200));
  EXPECT_DOUBLE_EQ(step->tail_seconds, OpSeconds(*p.loss_work, h200));
  EXPECT_DOUBLE_EQ(step->embedding_seconds, OpSeconds(*p.embedding_work, h200));
  ASSERT_EQ(step->layers[0].modules.size(), 1u);  // "idle" regenerates nothing
  EXPECT_DOUBLE_EQ(step->layers[0].modules[0].seconds,
                   OpSeconds(*p.layers[0].modules[0].work, h200));
  EXPECT_GT(step->layers[0].forward_seconds, 0);
  // Gradients made in backward, and the hardware's copy rates (the profile has no link).
  EXPECT_TRUE(step->gradients_in_backward);
  EXPECT_EQ(step->tail_grad_bytes, 70u);
  EXPECT_EQ(step->embedding_grad_bytes, 30u);
  EXPECT_EQ(step->layers[1].grad_bytes, 40u);
  EXPECT_DOUBLE_EQ(step->d2h_bytes_per_second, h200.d2h_bytes_per_second);
  EXPECT_DOUBLE_EQ(step->h2d_bytes_per_second, h200.h2d_bytes_per_second);
  // Without a hardware profile there are neither op rates nor copy rates.
  auto alone = BuildStepCostFromProfile(p, HardwareForProfile(p));
  ASSERT_FALSE(alone.ok());
  EXPECT_THAT(std::string(alone.status().message()), HasSubstr("--hardware"));
}

TEST(ProfileStepCost, WorkedOutByHand) {
  auto step =
      BuildStepCostFromProfile(Parse(TinyProfile()), HardwareForProfile(Parse(TinyProfile())));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->fixed.total(), 2100u);
  EXPECT_EQ(step->tokens_per_rank, 64u);
  // The last layer's output (40) stays for the loss, which adds its own 50.
  EXPECT_EQ(step->tail_bytes, 90u);
  EXPECT_DOUBLE_EQ(step->tail_seconds, 0.25);
  EXPECT_DOUBLE_EQ(step->embedding_seconds, 0);
  EXPECT_DOUBLE_EQ(step->bidir_d2h_bytes_per_second, 600);
  EXPECT_DOUBLE_EQ(step->bidir_h2d_bytes_per_second, 800);
  const LayerCost& l0 = step->layers[0];
  EXPECT_EQ(l0.saved_bytes, 600u);
  EXPECT_EQ(l0.ffn_saved_bytes, 0u);
  // "idle" regenerates nothing, so it is no option.
  ASSERT_EQ(l0.modules.size(), 1u);
  EXPECT_EQ(l0.modules[0].name, "fc1");
  EXPECT_EQ(l0.modules[0].saved_bytes, 300u);
  // Own forward bytes: input 100 + peak 700 = 800 = saved 600 + transient + output 100, the
  // transient on top of every saved tensor (Note [Measured layers]).
  EXPECT_EQ(l0.ffn_forward_transient, 100u);
  EXPECT_EQ(l0.attn_forward_transient, 0u);
  // Own backward bytes: peak 900 + the saved input 100 = 1000 = saved 600 + transient + output
  // gradient 100 + input gradient 100.
  EXPECT_EQ(l0.attn_backward_transient, 200u);
  // Layer 1 saves more than it peaks at (it does not save its input): clamped at 0.
  EXPECT_EQ(step->layers[1].ffn_forward_transient, 0u);
  EXPECT_EQ(step->layers[1].attn_backward_transient, 0u);
  // Version 1: the caller holds nothing past the loss.
  EXPECT_EQ(step->held_logits_bytes, 0u);

  const OptionCost keep = EvaluateOption(l0, {LayerPolicy::kKeep, 0, 1});
  EXPECT_EQ(keep.resident_bytes, 600u);
  EXPECT_EQ(keep.forward_peak, 800u);
  EXPECT_EQ(keep.backward_peak, 1000u);
  const OptionCost selective = EvaluateOption(l0, {LayerPolicy::kSelectiveRecompute, 1, 1});
  EXPECT_EQ(selective.resident_bytes, 300u);
  EXPECT_DOUBLE_EQ(selective.recompute_seconds, 0.1);
  const OptionCost recompute = EvaluateOption(l0, {LayerPolicy::kRecompute, 0, 1});
  EXPECT_EQ(recompute.resident_bytes, 100u);
  EXPECT_EQ(recompute.forward_peak, 100u + 100 + 100);  // input, transient, output
  EXPECT_DOUBLE_EQ(recompute.recompute_seconds, 0.5);
  const OptionCost offload = EvaluateOption(l0, {LayerPolicy::kOffloadSaved, 0, 1});
  EXPECT_EQ(offload.host_bytes, 600u);
  EXPECT_EQ(OptionTransfers(l0, {LayerPolicy::kOffloadSaved, 0, 1}).size(), 3u);
}

// A random profile and the StepCost its numbers mean, written out term by term.
struct Pair {
  LayerProfileSet profile;
  StepCost expected;
};

Pair RandomPair(std::mt19937_64& rng, int layers) {
  auto bytes = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<>(lo, hi)(rng);
  };
  Pair out;
  LayerProfileSet& p = out.profile;
  StepCost& s = out.expected;
  p.tokens = 128;
  p.fixed.weights = bytes(0, 2000);
  p.loss_peak_bytes = bytes(0, 300);
  p.loss_seconds = uniform(0.1, 1);
  p.d2h_bytes_per_second = uniform(100, 2000);
  p.h2d_bytes_per_second = uniform(100, 2000);
  p.bidir_d2h_bytes_per_second = p.d2h_bytes_per_second * 0.9;
  p.bidir_h2d_bytes_per_second = p.h2d_bytes_per_second * 0.9;
  s.tokens_per_rank = 128;
  s.fixed = p.fixed;
  s.tail_seconds = p.loss_seconds;
  s.d2h_bytes_per_second = p.d2h_bytes_per_second;
  s.h2d_bytes_per_second = p.h2d_bytes_per_second;
  s.bidir_d2h_bytes_per_second = p.bidir_d2h_bytes_per_second;
  s.bidir_h2d_bytes_per_second = p.bidir_h2d_bytes_per_second;
  for (int i = 0; i < layers; ++i) {
    ProfileLayer pl;
    LayerCost l;
    pl.index = l.index = i;
    pl.type = l.type = "random";
    pl.input_bytes = l.input_bytes = bytes(50, 300);
    pl.output_bytes = l.output_bytes = bytes(50, 300);
    pl.saved.push_back({"input", pl.input_bytes, ""});
    l.saved.push_back({"input", "", pl.input_bytes});
    const int modules = std::uniform_int_distribution<int>(0, 2)(rng);
    for (int m = 0; m < modules; ++m) {
      const std::string name = absl::StrCat("m", m);
      const uint64_t b = bytes(20, 400);
      const double secs = uniform(0.01, 0.3);
      pl.modules.push_back({name, secs});
      pl.saved.push_back({name + ".out", b, name});
      l.saved.push_back({name + ".out", name, b});
      l.modules.push_back({name, b, secs, false});
    }
    const uint64_t other = bytes(0, 500);
    pl.saved.push_back({"other", other, ""});
    l.saved.push_back({"other", "", other});
    for (const SavedTensor& t : l.saved) l.saved_bytes += t.bytes;
    l.attn_forward_transient = bytes(0, 300);
    l.attn_backward_transient = bytes(0, 400);
    // What the Python side would have measured for those terms.
    pl.forward_peak_bytes =
        l.saved_bytes + l.attn_forward_transient + l.output_bytes - l.input_bytes;
    pl.backward_peak_bytes = l.saved_bytes + l.attn_backward_transient + l.output_bytes;
    pl.forward_seconds = l.forward_seconds = uniform(0.2, 1.5);
    pl.backward_seconds = l.backward_seconds = pl.forward_seconds * uniform(1.5, 2.5);
    p.layers.push_back(pl);
    s.layers.push_back(l);
  }
  s.tail_bytes = p.layers.back().output_bytes + p.loss_peak_bytes;
  return out;
}

TEST(ProfilePlanning, SamePlansAsTheEquivalentStepCost) {
  std::mt19937_64 rng(20261201);
  int feasible = 0, offloading = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const Pair pair = RandomPair(rng, 2 + trial % 3);
    // Through the JSON text, as a file would come.
    auto read = ParseProfileJson(ProfileToJson(pair.profile), "random profile");
    ASSERT_TRUE(read.ok()) << read.status();
    auto from_profile = BuildStepCostFromProfile(*read, HardwareForProfile(*read));
    ASSERT_TRUE(from_profile.ok()) << from_profile.status();
    Schedule keep;
    keep.options.assign(pair.expected.layers.size(), {LayerPolicy::kKeep, 0, 1});
    const uint64_t top = Simulate(pair.expected, keep, false).peak_bytes;
    for (double share : {0.6, 0.8, 1.0}) {
      OptimizerOptions o;
      o.gpu_budget_bytes = static_cast<uint64_t>(share * static_cast<double>(top));
      o.host_budget_bytes = 1500;
      const OptimizeResult a = Optimize(*from_profile, o);
      const OptimizeResult b = Optimize(pair.expected, o);
      ASSERT_EQ(a.feasible, b.feasible) << "trial " << trial;
      if (!a.feasible) {
        EXPECT_EQ(a.min_peak_bytes, b.min_peak_bytes);
        continue;
      }
      ++feasible;
      EXPECT_TRUE(a.schedule.options == b.schedule.options) << "trial " << trial;
      EXPECT_EQ(a.schedule.prefetch_distance, b.schedule.prefetch_distance);
      EXPECT_EQ(a.sim.peak_bytes, b.sim.peak_bytes);
      EXPECT_DOUBLE_EQ(a.sim.step_seconds, b.sim.step_seconds);
      for (const LayerOption& option : a.schedule.options) {
        EXPECT_EQ(option.chunks, 1);  // measured layers are not chunked
        offloading += PolicyOffloads(option.policy);
      }
    }
  }
  EXPECT_GT(feasible, 40);
  EXPECT_GT(offloading, 0);
}

TEST(ProfilePlanning, SelectiveRecomputeOfACheapModuleWhenItFits) {
  // One module saves most of the layer's bytes and reruns in a tenth of the forward; the link is
  // too slow for offloading to hide. Dropping that module is the cheapest way under the budget.
  Json j = TinyProfile();
  j["link"] = {{"d2h_bytes_per_second", 10}, {"h2d_bytes_per_second", 10}};
  j["layers"][1] = j["layers"][0];
  j["layers"][1]["index"] = 1;
  const LayerProfileSet p = Parse(j);
  auto step = BuildStepCostFromProfile(p, HardwareForProfile(p));
  ASSERT_TRUE(step.ok()) << step.status();
  Schedule keep;
  keep.options.assign(2, {LayerPolicy::kKeep, 0, 1});
  const uint64_t keep_peak = Simulate(*step, keep, false).peak_bytes;
  OptimizerOptions o;
  o.gpu_budget_bytes = keep_peak - 300;  // one layer's fc1 output must go
  o.host_budget_bytes = 10000;
  const OptimizeResult r = Optimize(*step, o);
  ASSERT_TRUE(r.feasible) << r.explanation;
  int selective = 0;
  for (const LayerOption& option : r.schedule.options) {
    if (option.policy == LayerPolicy::kSelectiveRecompute) {
      ++selective;
      EXPECT_EQ(option.module_mask, 1u);  // fc1
    } else {
      EXPECT_EQ(option.policy, LayerPolicy::kKeep);
    }
  }
  EXPECT_EQ(selective, 1);
  EXPECT_NEAR(r.sim.step_seconds, 0.25 + 2 * 1.5 + 0.1, 1e-9);
  EXPECT_LE(r.sim.peak_bytes, o.gpu_budget_bytes);
}

}  // namespace
}  // namespace stowage::planner
