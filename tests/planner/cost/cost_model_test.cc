// The cost model against first-principles arithmetic, including the published GLM-5.3-Flash
// figures (docs/planner.md "The cost model"): 1M tokens / CP 8 offload 180 GiB of layer inputs per
// GPU, and at 256K offloading the layer inputs saves about 45 GiB of peak memory.
#include "planner/cost/cost_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "planner/cost/run_settings.h"
#include "planner/frameworks/hf.h"
#include "planner/frameworks/step_cost.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "planner/search/optimizer.h"
#include "planner/search/simulator.h"

namespace stowage::planner {
namespace {

using ::testing::HasSubstr;

constexpr double kGiB = 1024.0 * 1024 * 1024;

StepCost Reference(uint64_t seq_len) {
  RunSettings run;  // CP 8, EP 8, 64 GPUs, bf16: the reference run
  run.seq_len = seq_len;
  auto step = BuildStepCost(*ModelPreset("glm-5.3-flash"), *HardwarePreset("b200"), run);
  EXPECT_TRUE(step.ok()) << step.status();
  return *step;
}

// One step of 4096 tokens on one GPU, nothing sharded, no optimizer state, the loss unchunked:
// the run the recipes' per-layer tests price (hf's tests set the framework and bf16 gradients).
RunSettings OneGpuRun() {
  RunSettings run;
  run.seq_len = 4096;
  run.micro_batch = 1;
  run.tp = run.cp = run.ep = 1;
  run.gpus = 1;
  run.sharding = Sharding::kNoShard;
  run.optimizer = OptimizerKind::kNone;
  run.loss_chunk_tokens = 0;
  return run;
}

OptimizeResult Forced(const StepCost& step, LayerPolicy policy) {
  OptimizerOptions o;
  o.gpu_budget_bytes = ~0ull;
  o.host_budget_bytes = ~0ull;
  o.force = policy;
  return Optimize(step, o);
}

// Host bytes of the decoder layers (not the MTP layers after them) under `r`'s schedule.
uint64_t DecoderHostBytes(const StepCost& step, const OptimizeResult& r) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < step.layers.size(); ++i) {
    if (step.layers[i].name.empty()) {
      bytes += EvaluateOption(step.layers[i], r.schedule.options[i]).host_bytes;
    }
  }
  return bytes;
}

TEST(ReferenceRun, OffloadedLayerInputsAt1MCome180GiBPerGpu) {
  const StepCost step = Reference(1048576);
  EXPECT_EQ(step.tokens_per_rank, 131072u);
  // One layer input: 131072 tokens x hc_mult 4 x hidden 4096 x 2 bytes = 4 GiB.
  EXPECT_EQ(step.layers[0].input_bytes, 131072ull * 4 * 4096 * 2);
  const OptimizeResult offload = Forced(step, LayerPolicy::kOffloadInput);
  ASSERT_TRUE(offload.feasible);
  // The published figure counts the 45 decoder layers; the one MTP layer after them
  // (Note [MTP layers] in planner/frameworks/megatron.cc) offloads its own two inputs (and the
  // shifted token ids) besides: 131072 x (2 x 4096 x 2 + 8) = 2 GiB + 1 MiB.
  ASSERT_EQ(step.layers.size(), 46u);
  const uint64_t decoder = DecoderHostBytes(step, offload);
  EXPECT_EQ(decoder, 45ull * 131072 * 4 * 4096 * 2);
  EXPECT_NEAR(decoder / kGiB, 180.0, 0.01);
  EXPECT_EQ(step.layers[45].name, "mtp.0");
  EXPECT_EQ(offload.sim.host_bytes, decoder + 131072ull * (2 * 4096 * 2 + 8));
}

TEST(ReferenceRun, OffloadingLayerInputsAt256KSavesAbout45GiB) {
  const StepCost step = Reference(262144);
  const OptimizeResult kept = Forced(step, LayerPolicy::kRecompute);
  const OptimizeResult offloaded = Forced(step, LayerPolicy::kOffloadInput);
  ASSERT_TRUE(kept.feasible && offloaded.feasible);
  EXPECT_NEAR(DecoderHostBytes(step, offloaded) / kGiB, 45.0, 0.01);  // the 45 decoder layers
  const double saved =
      (static_cast<double>(kept.sim.peak_bytes) - static_cast<double>(offloaded.sim.peak_bytes)) /
      kGiB;
  // Published: 142 -> 98 GiB. The saving is the inputs (the MTP layer's 0.5 GiB too) minus what
  // is still in flight.
  EXPECT_GT(saved, 40.0);
  EXPECT_LE(saved, offloaded.sim.host_bytes / kGiB);
}

TEST(CostModel, ParallelismDividesTheRightTerms) {
  const ModelConfig m = *ModelPreset("glm-5.3-flash");
  const HardwareProfile hw = *HardwarePreset("b200");
  RunSettings base;
  base.seq_len = 262144;
  const StepCost s1 = *BuildStepCost(m, hw, base);

  RunSettings tp2 = base;
  tp2.tp = 2;  // sequence parallel: the residual stream splits over TP
  const StepCost s2 = *BuildStepCost(m, hw, tp2);
  EXPECT_EQ(s2.layers[5].input_bytes * 2, s1.layers[5].input_bytes);
  EXPECT_LT(s2.layers[5].saved_bytes, s1.layers[5].saved_bytes);

  RunSettings cp16 = base;
  cp16.cp = 16;  // half the tokens per rank
  const StepCost s3 = *BuildStepCost(m, hw, cp16);
  EXPECT_EQ(s3.tokens_per_rank * 2, s1.tokens_per_rank);
  EXPECT_EQ(s3.layers[5].input_bytes * 2, s1.layers[5].input_bytes);

  RunSettings ep16 = base;
  ep16.ep = 16;  // experts spread further: less expert state per rank
  EXPECT_LT(BuildStepCost(m, hw, ep16)->fixed.total(), s1.fixed.total());

  RunSettings busy = base;
  busy.moe_imbalance = 4;  // the busiest expert-parallel rank holds 4x the routed tokens
  const StepCost s4 = *BuildStepCost(m, hw, busy);
  auto moe_bytes = [](const LayerCost& l, const std::string& name) {
    for (const SavedTensor& t : l.saved) {
      if (t.name == name) return t.bytes;
    }
    return uint64_t{0};
  };
  EXPECT_EQ(moe_bytes(s4.layers[5], "moe.dispatched"),
            4 * moe_bytes(s1.layers[5], "moe.dispatched"));
  EXPECT_EQ(s4.layers[5].input_bytes, s1.layers[5].input_bytes);
  EXPECT_GT(s4.layers[5].forward_seconds, s1.layers[5].forward_seconds);
}

TEST(CostModel, ShardingLevelsShrinkFixedMemory) {
  const ModelConfig m = *ModelPreset("deepseek-v3");
  const HardwareProfile hw = *HardwarePreset("h200");
  RunSettings run;
  run.seq_len = 65536;
  uint64_t previous = ~0ull;
  for (Sharding s :
       {Sharding::kNoShard, Sharding::kOptim, Sharding::kOptimGrads, Sharding::kOptimGradsParams}) {
    run.sharding = s;
    const uint64_t fixed = BuildStepCost(m, hw, run)->fixed.total();
    EXPECT_LT(fixed, previous) << ShardingName(s);
    previous = fixed;
  }
  EXPECT_EQ(*ParseSharding("optim"), Sharding::kOptim);
  EXPECT_THAT(ParseSharding("zero3").status().message(), HasSubstr("allowed: no_shard"));
}

TEST(CostModel, FixedMemoryOfADenseModelFromItsParameterCount) {
  // Llama-3-8B: ~8.03e9 parameters. Unsharded on one GPU: 2 (bf16) + 4 (fp32 grads) + 12 (Adam).
  const ModelConfig m = *ModelPreset("llama-3-8b");
  RunSettings run;
  run.seq_len = 8192;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 1;
  run.sharding = Sharding::kNoShard;
  const StepCost s = *BuildStepCost(m, *HardwarePreset("h200"), run);
  const double params = static_cast<double>(s.fixed.weights) / 2;
  EXPECT_NEAR(params / 1e9, 8.03, 0.05);
  EXPECT_EQ(s.fixed.gradients, 2 * s.fixed.weights);
  EXPECT_EQ(s.fixed.optimizer, 6 * s.fixed.weights);
}

// Note [GEMM workspaces] (planner/frameworks/megatron.cc): TransformerEngine's cuBLAS workspace,
// four more for GroupedLinear where the stage has MoE layers, and PyTorch's two (the output
// layer's and the router's torch GEMMs) are fixed memory of a Megatron step. The regression: none
// of them was counted, 96 MiB (dense) to 224 MiB (MoE) optimistic on every Megatron plan.
TEST(CostModel, MegatronFixedMemoryHoldsTheGemmWorkspaces) {
  constexpr uint64_t kTe = (uint64_t{32} << 20) + 1024;
  RunSettings run;
  run.seq_len = 8192;
  run.cp = run.ep = run.gpus = 1;
  run.sharding = Sharding::kNoShard;
  const StepCost dense = *BuildStepCost(*ModelPreset("llama-3-8b"), *HardwarePreset("h200"), run);
  EXPECT_EQ(dense.fixed.other, kTe + kTorchCublasWorkspacesBytes);
  const StepCost moe = *BuildStepCost(*ModelPreset("glm-5.3-flash"), *HardwarePreset("b200"), run);
  EXPECT_EQ(moe.fixed.other, 5 * kTe + kTorchCublasWorkspacesBytes);
  EXPECT_EQ(kTorchCublasWorkspacesBytes, 64u << 20);
}

TEST(CostModel, LossChunkingShrinksTheTail) {
  const ModelConfig m = *ModelPreset("glm-5.3-flash");
  RunSettings run;
  run.seq_len = 262144;
  const uint64_t chunked = BuildStepCost(m, *HardwarePreset("b200"), run)->tail_bytes;
  run.loss_chunk_tokens = 0;
  const uint64_t whole = BuildStepCost(m, *HardwarePreset("b200"), run)->tail_bytes;
  // Whole logits: 32768 tokens x 154880 vocab x (bf16 + two fp32 buffers).
  EXPECT_GE(whole, 32768ull * 154880 * 10);
  EXPECT_LT(chunked, whole / 3);
}

TEST(CostModel, OptionsTradeMemoryForTime) {
  const StepCost step = Reference(262144);
  const LayerCost& l = step.layers[7];  // dsa+moe
  const OptionCost keep = EvaluateOption(l, {LayerPolicy::kKeep, 0, 1});
  const OptionCost recompute = EvaluateOption(l, {LayerPolicy::kRecompute, 0, 1});
  const OptionCost offload = EvaluateOption(l, {LayerPolicy::kOffloadInput, 0, 1});
  const OptionCost saved = EvaluateOption(l, {LayerPolicy::kOffloadSaved, 0, 1});
  const OptionCost chunked = EvaluateOption(l, {LayerPolicy::kRecompute, 0, 4});
  EXPECT_EQ(keep.resident_bytes, l.saved_bytes);
  EXPECT_EQ(recompute.resident_bytes, l.input_bytes);
  EXPECT_EQ(offload.resident_bytes, 0u);
  EXPECT_EQ(offload.host_bytes, l.input_bytes);
  EXPECT_EQ(saved.host_bytes, l.saved_bytes);
  EXPECT_EQ(keep.recompute_seconds, 0);
  // A recompute reruns the forward and its collectives (Note [Communication]).
  EXPECT_GT(l.forward_comm_seconds, 0);
  EXPECT_DOUBLE_EQ(recompute.recompute_seconds, l.forward_seconds + l.forward_comm_seconds -
                                                    l.forward_comm_seconds +
                                                    l.recompute_comm_seconds);
  EXPECT_GT(l.recompute_comm_seconds, 0);
  EXPECT_EQ(saved.recompute_seconds, 0);
  EXPECT_LT(chunked.backward_peak, recompute.backward_peak);
  EXPECT_GT(chunked.compute_seconds(), recompute.compute_seconds());
  // Selective recompute of every module keeps less than keep, more than recompute.
  const uint32_t all = (1u << l.modules.size()) - 1;
  const OptionCost selective = EvaluateOption(l, {LayerPolicy::kSelectiveRecompute, all, 1});
  EXPECT_LT(selective.resident_bytes, keep.resident_bytes);
  EXPECT_GT(selective.resident_bytes, recompute.resident_bytes);
  EXPECT_LT(selective.recompute_seconds, recompute.recompute_seconds);
}

// Note [Gradient timing]: a backward peak is the largest of the layer's three moments, each
// with the gradients made by then: the FFN part's (saved + its transient + down_proj's), the FFN
// input projections' (what of the FFN is alive then + gate/up's too), the attention part's
// (its transient + the FFN block's and o_proj's).
TEST(CostModel, BackwardPeakCountsTheGradientsMadeByEachMoment) {
  LayerCost l;
  l.saved = {{"attn", "", 100}, {"ffn", "", 200}};
  l.saved_bytes = 300;
  l.ffn_saved_bytes = 200;
  l.input_bytes = l.output_bytes = 10;
  l.ffn_backward_transient = 50;
  l.ffn_inputs_backward_bytes = 120;
  l.attn_backward_transient = 30;
  l.grad_bytes = 1000;
  l.ffn_peak_grad_bytes = 100;
  l.ffn_inputs_grad_bytes = 600;
  l.attn_peak_grad_bytes = 900;
  // Moments: 100 + 200 + 50 + 100 = 450; 100 + 120 + 600 = 820; 100 + 30 + 900 = 1030; + 20.
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kKeep, 0, 1}).backward_peak, 1050u);
  // Recompute: the same moments and the input its checkpoint holds (Note [Recompute moment]:
  // keep does not save it here).
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kRecompute, 0, 1}).backward_peak, 1060u);
  l.attn_peak_grad_bytes = 600;  // the FFN input projections' moment binds: 820 + 20
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kOffloadSaved, 0, 1}).backward_peak, 840u);
  l.ffn_peak_grad_bytes = l.ffn_inputs_grad_bytes = l.attn_peak_grad_bytes = 0;
  l.ffn_inputs_backward_bytes = 0;  // no timing: the working sets alone, 350 + 20
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kKeep, 0, 1}).backward_peak, 370u);
}

// Note [Gradient timing]: eager PyTorch makes a layer input's gradient after every backward
// moment (the residual add hands the output's gradient on as it is; the first ops' backward
// sums the rest in), so the hf recipe's moments hold the output's gradient only. The regression:
// EvaluateOption counted 2h per token more at each (olmo3 at 4096 tokens recompute, +0.73%).
TEST(CostModel, InputGradientMadeLastIsNotAtTheBackwardMoments) {
  LayerCost l;
  l.saved = {{"attn", "", 100}, {"ffn", "", 200}};
  l.saved_bytes = 300;
  l.ffn_saved_bytes = 200;
  l.input_bytes = 10;
  l.output_bytes = 7;
  l.ffn_backward_transient = 50;
  // 100 + 200 + 50 + the output's gradient 7 + (megatron) the input's 10.
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kKeep, 0, 1}).backward_peak, 367u);
  l.input_grad_made_last = true;
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kKeep, 0, 1}).backward_peak, 357u);
  // Recompute: the same moments, with the input the checkpoint holds (not among the saved
  // tensors: Note [Recompute moment]).
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kRecompute, 0, 1}).backward_peak, 367u);
  // The recipes: hf's layers say so; megatron's do not (Note [Gradient timing]: exact for mHC,
  // whose H_res backward makes it first; an upper bound otherwise).
  RunSettings run = OneGpuRun();
  const ModelConfig model = *ModelPreset("llama-3-8b");
  for (Framework f : {Framework::kMegatron, Framework::kHf}) {
    run.framework = f;
    absl::StatusOr<StepCost> step = BuildStepCost(model, *HardwarePreset("h200"), run);
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(step->layers[0].input_grad_made_last, f == Framework::kHf);
  }
}

// Note [hf masks]: a selective attn_core's checkpoint is handed its layer's mask and holds it
// through the layer's backward moments; ffn_act's holds the activation's inputs only. The
// regression: a selective attn_core layer's backward was planned without the masks (gemma2 at
// 16384 tokens, -0.47%).
TEST(CostModel, SelectiveAttnCoreHoldsTheStepsMasks) {
  LayerCost l;
  l.saved = {{"attn.scores", "attn_core", 100}, {"ffn.act", "ffn_act", 200}};
  l.saved_bytes = 300;
  l.ffn_saved_bytes = 200;
  l.input_bytes = l.output_bytes = 10;
  l.input_grad_made_last = true;
  l.ffn_backward_transient = 50;
  l.checkpoint_held_bytes = 64;
  l.modules = {{"attn_core", 100, 1, false, true}, {"ffn_act", 200, 1, true, false}};
  // The keep moments: 100 + 200 + 50 + 10 = 360.
  const OptionCost act = EvaluateOption(l, {LayerPolicy::kSelectiveRecompute, 0b10, 1});
  EXPECT_EQ(act.backward_peak, 360u);
  EXPECT_EQ(act.checkpoint_held_bytes, 0u);
  const OptionCost core = EvaluateOption(l, {LayerPolicy::kSelectiveRecompute, 0b01, 1});
  EXPECT_EQ(core.backward_peak, 360u + 64);
  EXPECT_EQ(core.checkpoint_held_bytes, 64u);
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kSelectiveRecompute, 0b11, 1}).checkpoint_held_bytes,
            64u);
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kRecompute, 0, 1}).checkpoint_held_bytes, 64u);
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kOffloadInput, 0, 1}).checkpoint_held_bytes, 64u);
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kKeep, 0, 1}).checkpoint_held_bytes, 0u);
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kOffloadSaved, 0, 1}).checkpoint_held_bytes, 0u);
}

// The hf recipe: Gemma 2's eager attention is handed its layer type's mask in every layer, so
// the layer's and attn_core's checkpoints hold that one (2 s^2 bytes, one group per layer
// type: Note [hf masks]; the regression: both of the step's masks, 4 s^2, in every layer);
// Mistral's SDPA layers get none (is_causal).
TEST(CostModel, HfAttnCoreHoldsTheMasksWhereItIsHandedOne) {
  RunSettings run = OneGpuRun();
  run.framework = Framework::kHf;
  run.grad_bytes = 2;
  const std::string data = std::string(STOWAGE_SOURCE_DIR) + "/tests/planner/data/hf/";
  for (const auto& [config, masks] :
       {std::pair<const char*, uint64_t>{"gemma-2-9b.json", 2ull * 4096 * 4096},
        {"mistral-7b-v0.3.json", 0}}) {
    absl::StatusOr<ModelConfig> model = ReadHfConfigFile(data + config);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<StepCost> step = BuildStepCost(*model, *HardwarePreset("h200"), run);
    ASSERT_TRUE(step.ok()) << step.status();
    for (int j : {0, 1}) {
      const LayerCost& l = step->layers[j];
      EXPECT_EQ(l.checkpoint_held_bytes, masks) << config;
      EXPECT_EQ(l.checkpoint_held_group, static_cast<int>(model->layers[j].span)) << config;
      for (const RecomputeModule& mod : l.modules) {
        EXPECT_EQ(mod.holds_checkpoint_held, mod.name == "attn_core" && masks > 0)
            << config << " " << mod.name;
      }
    }
    // Gemma 2 alternates sliding and full layers: two groups, each layer type's mask once.
    if (masks > 0) {
      EXPECT_NE(step->layers[0].checkpoint_held_group, step->layers[1].checkpoint_held_group);
    }
  }
}

// Note [hf data parallel]: transformers eager on 8 data-parallel GPUs. DDP (no_shard) keeps
// gradient buckets as large as every gradient; FSDP2 (optim_grads, optim_grads_params) holds a
// dp-th of each layer's gradients once its backward ends, the LM head's whole until the end;
// fully_shard also keeps its root's (embedding, LM head) whole weights. One GPU is the measured
// step, none of it.
TEST(CostModel, HfDataParallelHoldsWhatTorchsEngineHolds) {
  const ModelConfig m = *ModelPreset("qwen3-30b-a3b");
  const HardwareProfile hw = *HardwarePreset("h200");
  RunSettings run = DefaultRunSettings(Framework::kHf, m);
  run.seq_len = 8192;
  run.optimizer = OptimizerKind::kNone;
  auto build = [&](int gpus, Sharding sharding) {
    run.gpus = gpus;
    run.sharding = sharding;
    absl::StatusOr<StepCost> step = BuildStepCost(m, hw, run);
    EXPECT_TRUE(step.ok()) << step.status();
    return *step;
  };
  const StepCost one = build(1, Sharding::kNoShard);
  // One rank runs no data-parallel engine: --sharding changes nothing.
  EXPECT_EQ(build(1, Sharding::kOptimGradsParams).fixed.total(), one.fixed.total());
  EXPECT_EQ(one.fixed.comm_buffers, 0u);
  uint64_t grads = one.tail_grad_bytes + one.embedding_grad_bytes;
  for (const LayerCost& l : one.layers) grads += l.grad_bytes;
  EXPECT_EQ(one.layer_grad_shards, 1);

  const StepCost ddp = build(8, Sharding::kNoShard);
  EXPECT_EQ(ddp.fixed.comm_buffers, one.fixed.comm_buffers + grads);
  EXPECT_EQ(ddp.layer_grad_shards, 1);
  EXPECT_EQ(BackwardHeldBytes(ddp).at_end, BackwardHeldBytes(one).at_end);

  const int n = static_cast<int>(one.layers.size());
  for (Sharding s : {Sharding::kOptimGrads, Sharding::kOptimGradsParams}) {
    const StepCost fsdp = build(8, s);
    EXPECT_EQ(fsdp.layer_grad_shards, 8) << ShardingName(s);
    const BackwardHeld held = BackwardHeldBytes(fsdp);
    // In the last layer's backward only the LM head's gradients (and the logits) are held ...
    EXPECT_EQ(held.in_layer[n - 1], fsdp.held_logits_bytes + fsdp.tail_grad_bytes);
    // ... and in the first layer's, a shard of every later layer's.
    uint64_t sharded = 0;
    for (int j = 1; j < n; ++j) sharded += (fsdp.layers[j].grad_bytes + 7) / 8;
    EXPECT_EQ(held.in_layer[0], held.in_layer[n - 1] + sharded) << ShardingName(s);
    EXPECT_LT(held.at_end, BackwardHeldBytes(one).at_end / 4);
  }
  // fully_shard over reshard_after_forward=False: the two gathered layers of every fully_shard
  // step, and the root's whole weights.
  uint64_t max_layer_grads = 0;
  for (const LayerCost& l : one.layers) max_layer_grads = std::max(max_layer_grads, l.grad_bytes);
  const auto weights_of = [&](uint64_t grad_bytes) {
    return grad_bytes / run.grad_bytes * run.weight_bytes;
  };
  EXPECT_EQ(build(8, Sharding::kOptimGradsParams).fixed.comm_buffers,
            build(8, Sharding::kOptimGrads).fixed.comm_buffers + 2 * weights_of(max_layer_grads) +
                weights_of(one.tail_grad_bytes + one.embedding_grad_bytes));
}

// Note [Step time] in planner/frameworks/hf_layer.h: the matmuls transformers runs on fp32 operands
// take the CUDA cores' rate — the gated DeltaNet fallback's chunk matmuls (LinearAttentionWorkOf's
// FLOPs, exactly), Kimi-K2's and GLM-5.1's routers (`F.linear(x.float(), weight.float())`: 2hE
// per token forward, 4hE backward) and GLM-5.1's DSA indexer scores (forward only) — and
// nothing else: Mistral's layers, the dense FFN layers and Qwen3-Next's bf16 router have none.
// Pinned by pricing each step on two profiles that differ only in the fp32 rate.
TEST(CostModel, HfFp32MatmulsTakeTheFp32Rate) {
  RunSettings run = OneGpuRun();
  run.framework = Framework::kHf;
  run.grad_bytes = 2;
  const HardwareProfile hw = *HardwarePreset("h200");
  HardwareProfile slow = hw;
  slow.dense_fp32_flops = hw.dense_fp32_flops / 2;
  const double rate = hw.dense_fp32_flops * hw.fp32_gemm_efficiency;
  // The fp32 FLOPs of a layer, forward and backward: the extra seconds at half the rate, times
  // the rate (each fp32 FLOP takes 1 / rate more there).
  const auto fp32_flops = [&](const ModelConfig& m, int layer) {
    const LayerCost a = (*BuildStepCost(m, hw, run)).layers[layer];
    const LayerCost b = (*BuildStepCost(m, slow, run)).layers[layer];
    return std::pair<double, double>{(b.forward_seconds - a.forward_seconds) * rate,
                                     (b.backward_seconds - a.backward_seconds) * rate};
  };
  const double t = 4096;
  const std::string data = std::string(STOWAGE_SOURCE_DIR) + "/tests/planner/data/hf/";
  {
    const ModelConfig m = *ReadHfConfigFile(data + "mistral-7b-v0.3.json");
    auto [fwd, bwd] = fp32_flops(m, 0);
    EXPECT_EQ(fwd, 0);
    EXPECT_EQ(bwd, 0);
  }
  {
    // Kimi-K2: layer 1 is MoE (first_k_dense_replace 1), 384 experts over hidden 7168.
    const ModelConfig m = *ReadHfConfigFile(data + "kimi-k2-instruct.json");
    auto [fwd, bwd] = fp32_flops(m, 1);
    EXPECT_NEAR(fwd, 2.0 * 7168 * 384 * t, 1e-6 * fwd);
    EXPECT_NEAR(bwd, 4.0 * 7168 * 384 * t, 1e-6 * bwd);
    auto [dense_fwd, dense_bwd] = fp32_flops(m, 0);
    EXPECT_EQ(dense_fwd, 0);
    EXPECT_EQ(dense_bwd, 0);
  }
  {
    // GLM-5.1's indexer (32 heads of 128, every layer): its scores over the causal square and
    // their weighted sum, 2 Hi di s + 2 Hi s per token, forward; its router as Kimi-K2's.
    const ModelConfig m = *ReadHfConfigFile(data + "glm-5.1.json");
    const double hi = m.index_heads, di = m.index_head_dim, e = m.experts, h = m.hidden;
    const double indexer = (2 * hi * di * t + 2 * hi * t) * t;
    auto [fwd, bwd] = fp32_flops(m, 0);  // dense FFN
    EXPECT_NEAR(fwd, indexer, 1e-6 * fwd);
    EXPECT_EQ(bwd, 0);
    auto [moe_fwd, moe_bwd] = fp32_flops(m, m.layers.size() - 1);
    EXPECT_NEAR(moe_fwd, indexer + 2 * h * e * t, 1e-6 * moe_fwd);
    EXPECT_NEAR(moe_bwd, 4 * h * e * t, 1e-6 * moe_bwd);
  }
  {
    // Qwen3-Next's gated DeltaNet layer (layer 0): the fallback's chunk matmuls.
    const ModelConfig m = *ParseHfConfigJson(R"({"model_type": "qwen3_next",
        "architectures": ["Qwen3NextForCausalLM"], "hidden_size": 2048,
        "intermediate_size": 5120, "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"], "num_attention_heads": 16,
        "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4, "num_experts": 512, "num_experts_per_tok": 10,
        "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
        "decoder_sparse_step": 1, "partial_rotary_factor": 0.25, "vocab_size": 151936,
        "tie_word_embeddings": false})",
                                             "qwen3_next");
    const HfLinearAttentionWork w = LinearAttentionWorkOf(m, AttentionKind::kGdn, t);
    ASSERT_GT(w.fwd_fp32_gemm_flops, 0);
    auto [fwd, bwd] = fp32_flops(m, 0);
    EXPECT_NEAR(fwd, w.fwd_fp32_gemm_flops, 1e-6 * fwd);
    EXPECT_NEAR(bwd, w.bwd_fp32_gemm_flops, 1e-6 * bwd);
    // Its router is bf16 (Qwen3NextSparseMoeBlock's F.linear on the hidden states), and the
    // full-attention layer has no fp32 matmul.
    auto [full_fwd, full_bwd] = fp32_flops(m, 1);
    EXPECT_EQ(full_fwd, 0);
    EXPECT_EQ(full_bwd, 0);
  }
}

// Note [Recompute moment]: a recomputed layer's backward peak holds its rerun forward (the
// forward's peak and the output's gradient: GLM-5's DSA indexer scores under hf), and its own
// backward moments with what its checkpoint holds (hf: the step's masks).
TEST(CostModel, RecomputedBackwardPeakHoldsTheRerunForward) {
  LayerCost l;
  l.saved = {{"attn", "", 100}, {"ffn", "", 200}};
  l.saved_bytes = 300;
  l.ffn_saved_bytes = 200;
  l.input_bytes = l.output_bytes = 10;
  l.attn_forward_transient = 500;
  l.ffn_forward_transient = 40;
  l.attn_backward_transient = 30;
  l.ffn_backward_transient = 50;
  // Backward moments: max(100 + 200 + 50, 100 + 30) + 20 = 370, and under recompute or
  // offload_input 380 with the input the checkpoint holds (or the restore brought back): keep
  // does not save it here. The rerun: max(100 + 500, 100 + 200 + 40) + 10 (the residual
  // stream) + 10 (the output's gradient) = 620.
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kKeep, 0, 1}).backward_peak, 370u);
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kOffloadSaved, 0, 1}).backward_peak, 370u);
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kRecompute, 0, 1}).backward_peak, 620u);
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kOffloadInput, 0, 1}).backward_peak, 620u);
  // Two FFN chunks: the rerun's FFN part 100 + 20, still below the attention's 600.
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kRecompute, 0, 2}).backward_peak, 620u);
  l.attn_forward_transient = 0;  // the rerun's FFN moment, 100 + 200 + 40 + 20, below 380
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kRecompute, 0, 1}).backward_peak, 380u);
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kOffloadInput, 0, 1}).backward_peak, 380u);
  l.ffn_forward_transient = 100;
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kRecompute, 0, 1}).backward_peak, 420u);
  // What the checkpoint holds counts at the backward's own moments only (the rerun's forward
  // transients count it already): 380 + 300 over the rerun's 420.
  l.checkpoint_held_bytes = 300;
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kRecompute, 0, 1}).backward_peak, 680u);
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kKeep, 0, 1}).backward_peak, 370u);
  // Where keep saves the input ("input" among the saved tensors: Megatron's layers) the
  // backward's moments count it already: 370 + 300.
  l.saved.front().name = "input";
  EXPECT_TRUE(SavesInput(l));
  EXPECT_EQ(EvaluateOption(l, {LayerPolicy::kRecompute, 0, 1}).backward_peak, 670u);
}

// The recipes: a transformers layer does not save its input under keep (the first RMSNorm saves
// its fp32 upcast), OLMo's does (q/k/v read it: Note [hf OLMo and Phi-3]), Megatron's does (the
// first norm's input): so only the first's recomputed backward holds it beyond its saved tensors.
// The regression: mistral at 4096 tokens recompute was planned 0.91% below the live bytes of the
// real step (tests/python/measure/test_hf_measured_agreement.py), 2h per token at every backward
// moment of the checkpointed step.
TEST(CostModel, RecomputedBackwardHoldsTheInputKeepDoesNotSave) {
  RunSettings run = OneGpuRun();
  struct Case {
    const char* preset;
    Framework framework;
    bool saves_input;
  };
  for (const Case& c : {Case{"llama-3-8b", Framework::kHf, false},
                        Case{"llama-3-8b", Framework::kMegatron, true}}) {
    run.framework = c.framework;
    absl::StatusOr<StepCost> step =
        BuildStepCost(*ModelPreset(c.preset), *HardwarePreset("h200"), run);
    ASSERT_TRUE(step.ok()) << step.status();
    const LayerCost& l = step->layers[0];
    EXPECT_EQ(SavesInput(l), c.saves_input) << c.preset;
    const OptionCost keep = EvaluateOption(l, {LayerPolicy::kKeep, 0, 1});
    const OptionCost recompute = EvaluateOption(l, {LayerPolicy::kRecompute, 0, 1});
    // Recompute's backward moments are keep's (its rerun regenerates every saved tensor) with
    // the input where keep does not hold it; the rerun's forward moment is below them here.
    const uint64_t moments = keep.backward_peak + (c.saves_input ? 0 : l.input_bytes);
    EXPECT_EQ(recompute.backward_peak, moments) << c.preset;
  }
}

TEST(CostModel, BadRunSettingsNameTheFlag) {
  const ModelConfig m = *ModelPreset("glm-5.3-flash");
  RunSettings run;
  run.cp = 3;
  EXPECT_THAT(ValidateRun(m, run).message(), HasSubstr("--seq-len is 1048576"));
  run = RunSettings();
  run.ep = 7;
  EXPECT_THAT(ValidateRun(m, run).message(), HasSubstr("--gpus is 64"));
  run = RunSettings();
  run.ep = 16;
  run.gpus = 64;
  EXPECT_TRUE(ValidateRun(m, run).ok());
  run.moe_imbalance = 0.5;
  EXPECT_THAT(ValidateRun(m, run).message(), HasSubstr("--moe-imbalance is 0.5"));
  run = RunSettings();
  EXPECT_THAT(ValidateRun(*ModelPreset("llama-3-8b"), run).message(), HasSubstr("--ep is 8"));
}

RunSettings DenseRun(uint64_t seq_len) {
  RunSettings run;
  run.seq_len = seq_len;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 8;
  return run;
}

// Regression: `stowage plan --model llama-3-8b --seq-len 9007199254740992` printed
// every layer "keep ... 0 B" and exit 0; UBSan reported signed overflow in the cost model.
TEST(CostModel, HugeSequenceIsRefusedNamingTheFlagAndLimit) {
  const ModelConfig m = *ModelPreset("llama-3-8b");
  auto step = BuildStepCost(m, *HardwarePreset("b200"), DenseRun(9007199254740992ull));
  ASSERT_FALSE(step.ok());
  EXPECT_THAT(step.status().message(),
              HasSubstr("--seq-len is 9007199254740992; allowed: 1 to 1073741824"));
  RunSettings run = DenseRun(kMaxSeqLen);
  run.micro_batch = 8;
  EXPECT_THAT(ValidateRun(m, run).message(), HasSubstr("--seq-len x --micro-batch may be at most"));
  run = DenseRun(65536);
  run.tp = 1 << 20;
  run.cp = 1 << 20;  // tp x cp once overflowed int
  EXPECT_THAT(ValidateRun(m, run).message(),
              HasSubstr("--seq-len is 65536; it must be a multiple"));
  run.tp = (1 << 20) + 1;
  EXPECT_THAT(ValidateRun(m, run).message(), HasSubstr("--tp is 1048577; allowed: 1 to 1048576"));
}

// Within the run limits a wide enough model still overflows a tensor: the error names the
// tensor, the layer and the inputs it grows with, instead of a wrapped byte count.
TEST(CostModel, TensorBeyondTheLimitNamesTheTensorAndInputs) {
  ModelConfig m = *ModelPreset("llama-3-8b");
  m.hidden = kMaxModelDim;
  m.intermediate = kMaxModelDim;
  m.heads = 8;
  m.kv_heads = 8;
  m.head_dim = kMaxModelDim;
  RunSettings run = DenseRun(kMaxSeqLen);
  run.micro_batch = 4;
  auto step = BuildStepCost(m, *HardwarePreset("b200"), run);
  ASSERT_FALSE(step.ok());
  EXPECT_THAT(step.status().message(), HasSubstr("of layer 0 would be"));
  EXPECT_THAT(step.status().message(),
              HasSubstr("--seq-len 1073741824 x --micro-batch 4 / --cp 1"));
  m = *ModelPreset("llama-3-8b");
  m.hidden = kMaxModelDim + 1;
  EXPECT_THAT(ValidateRun(m, DenseRun(8192)).message(),
              HasSubstr("field 'hidden_size' is 1048577; allowed: 0 to 1048576"));
}

// Regression: 2^31 layers aborted in std::length_error, 100,000 in bad_alloc.
TEST(CostModel, TooManyLayersAreRefusedUpFront) {
  ModelConfig m = *ModelPreset("llama-3-8b");
  m.layers.assign(kMaxLayers + 1, m.layers[0]);
  auto step = BuildStepCost(m, *HardwarePreset("b200"), DenseRun(8192));
  EXPECT_THAT(step.status().message(), HasSubstr("has 10001 layers; allowed: 1 to 10000"));
}

// A step cost not built here (a measured profile, a test) is checked before it is planned.
TEST(CostModel, StepCostBoundsCatchWhatBuildStepCostWouldRefuse) {
  StepCost step =
      *BuildStepCost(*ModelPreset("llama-3-8b"), *HardwarePreset("b200"), DenseRun(8192));
  EXPECT_TRUE(CheckStepCostBounds(step).ok());
  StepCost bad = step;
  bad.layers[3].saved_bytes = ~0ull;  // tensors that do not add up to it
  EXPECT_THAT(CheckStepCostBounds(bad).message(), HasSubstr("layer 3"));
  bad = step;
  for (LayerCost& l : bad.layers) {  // 32 layers x 2^56 > 2^62
    l.saved = {{"input", "", kMaxTensorBytes}};
    l.saved_bytes = kMaxTensorBytes;
    l.ffn_saved_bytes = 0;
    l.modules.clear();
  }
  EXPECT_THAT(CheckStepCostBounds(bad).message(), HasSubstr("allowed: at most"));
  bad = step;
  bad.layers[0].forward_seconds = std::nan("");
  EXPECT_THAT(CheckStepCostBounds(bad).message(), HasSubstr("non-finite time"));
  bad = step;
  bad.layers[1].backward_seconds = -1;
  OptimizerOptions unlimited;
  unlimited.gpu_budget_bytes = ~0ull;
  unlimited.host_budget_bytes = ~0ull;
  const OptimizeResult r = Optimize(bad, unlimited);
  EXPECT_FALSE(r.feasible);
  EXPECT_EQ(r.binding, "input limits");
}

// Regression: --loss-chunk-tokens 0 ("materializes all logits") was rejected; and a
// chunk covering every token was charged a fourth LM-head pass (the logits recomputed in
// backward) although nothing is recomputed then.
TEST(CostModel, OneLossChunkOverAllTokensCostsThreePasses) {
  const ModelConfig m = *ModelPreset("llama-3-8b");
  const HardwareProfile hw = *HardwarePreset("b200");
  RunSettings run = DenseRun(8192);
  run.loss_chunk_tokens = 0;
  const StepCost whole = *BuildStepCost(m, hw, run);
  run.loss_chunk_tokens = 8192;
  const StepCost one_chunk = *BuildStepCost(m, hw, run);
  run.loss_chunk_tokens = 4096;
  const StepCost two_chunks = *BuildStepCost(m, hw, run);
  EXPECT_DOUBLE_EQ(one_chunk.tail_seconds, whole.tail_seconds);
  EXPECT_EQ(one_chunk.tail_bytes, whole.tail_bytes);
  // The fourth pass: one more LM-head GEMM over every token.
  const double head = 2.0 * m.hidden * m.vocab * 8192 / (hw.dense_bf16_flops * hw.gemm_efficiency);
  EXPECT_NEAR(two_chunks.tail_seconds - whole.tail_seconds, head, head * 1e-9);
}

}  // namespace
}  // namespace stowage::planner
