// TP without sequence parallelism (RunSettings::sequence_parallel false, Megatron-LM's default)
// against first-principles arithmetic: Note [Sequence parallelism] in
// planner/frameworks/megatron.cc and the TP collectives of Note [Communication] in
// planner/cost/communication.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "planner/cost/communication.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/run_settings.h"
#include "planner/frameworks/step_cost.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"

namespace stowage::planner {
namespace {

using ::testing::HasSubstr;

// Llama 3.1 8B (dense, 32 heads, 8 KV heads) at 8K tokens, no CP or EP, on 8 GPUs.
RunSettings DenseRun(int tp, bool sequence_parallel) {
  RunSettings run;
  run.seq_len = 8192;
  run.tp = tp;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 8;
  run.sequence_parallel = sequence_parallel;
  return run;
}

StepCost Build(const ModelConfig& m, const RunSettings& run) {
  absl::StatusOr<StepCost> step = BuildStepCost(m, *HardwarePreset("h100"), run);
  EXPECT_TRUE(step.ok()) << step.status();
  return step.ok() ? *std::move(step) : StepCost{};
}

uint64_t Saved(const LayerCost& layer, const std::string& name) {
  for (const SavedTensor& t : layer.saved) {
    if (t.name == name) return t.bytes;
  }
  ADD_FAILURE() << "no saved tensor " << name << " in layer " << layer.index;
  return 0;
}

const CommOp* FindOp(const std::vector<CommOp>& ops, const std::string& name) {
  for (const CommOp& op : ops) {
    if (op.name == name) return &op;
  }
  return nullptr;
}

TEST(SequenceParallel, ShardsOnlyTheSequenceParallelRegion) {
  const ModelConfig m = *ModelPreset("llama-3.1-8b");
  const StepCost tp1 = Build(m, DenseRun(1, true));
  const StepCost sp = Build(m, DenseRun(2, true));
  const StepCost no_sp = Build(m, DenseRun(2, false));
  const LayerCost &a = tp1.layers[3], &b = sp.layers[3], &c = no_sp.layers[3];
  const uint64_t t = 8192, h = 4096, dt = 2;
  // The layer input, the residual and the norms (ln_out + one fp32 rsigma per row): whole on
  // every TP rank without SP, as with TP 1; split over the two ranks with it.
  for (const char* name : {"input", "mid"}) {
    EXPECT_EQ(Saved(a, name), t * h * dt) << name;
    EXPECT_EQ(Saved(c, name), Saved(a, name)) << name;
    EXPECT_EQ(Saved(b, name) * 2, Saved(a, name)) << name;
  }
  for (const char* name : {"attn.norm", "ffn.norm"}) {
    EXPECT_EQ(Saved(a, name), t * (h * dt + 4)) << name;
    EXPECT_EQ(Saved(c, name), Saved(a, name)) << name;
    EXPECT_EQ(Saved(b, name) * 2, Saved(a, name)) << name;
  }
  EXPECT_EQ(c.input_bytes, a.input_bytes);
  EXPECT_EQ(b.input_bytes * 2, a.input_bytes);
  // Split by heads or by the FFN's intermediate: halved by TP 2 either way.
  for (const char* name : {"attn.qkv", "attn.core_out", "ffn.gate_up", "ffn.act"}) {
    EXPECT_EQ(Saved(c, name) * 2, Saved(a, name)) << name;
    EXPECT_EQ(Saved(c, name), Saved(b, name)) << name;
  }
  // The whole layer: SP saves the difference of the four tensors, a half of each.
  const uint64_t region = 2 * t * h * dt + 2 * t * (h * dt + 4);
  EXPECT_LT(b.saved_bytes, c.saved_bytes);
  EXPECT_EQ(c.saved_bytes - b.saved_bytes, region / 2);
  EXPECT_LT(c.saved_bytes, a.saved_bytes);
  // The LM head's input and the final norm: whole without SP.
  EXPECT_GT(no_sp.tail_bytes, sp.tail_bytes);
  // The same FLOPs either way.
  EXPECT_EQ(c.forward_flops, b.forward_flops);
}

TEST(SequenceParallel, MootWithTp1) {
  const ModelConfig m = *ModelPreset("llama-3.1-8b");
  const StepCost on = Build(m, DenseRun(1, true));
  const StepCost off = Build(m, DenseRun(1, false));
  ASSERT_EQ(on.layers.size(), off.layers.size());
  for (size_t i = 0; i < on.layers.size(); ++i) {
    EXPECT_EQ(on.layers[i].saved_bytes, off.layers[i].saved_bytes);
  }
  EXPECT_EQ(on.tail_bytes, off.tail_bytes);
  // transformers eager (--framework hf) runs no TP: the setting changes nothing there either.
  RunSettings hf_on = DefaultRunSettings(Framework::kHf, m), hf_off = hf_on;
  hf_on.seq_len = hf_off.seq_len = 4096;
  hf_on.gpus = hf_off.gpus = 1;
  hf_off.sequence_parallel = false;
  const StepCost a = Build(m, hf_on), b = Build(m, hf_off);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  EXPECT_EQ(a.layers[0].saved_bytes, b.layers[0].saved_bytes);
  EXPECT_EQ(a.tail_bytes, b.tail_bytes);
  hf_off.tp = hf_off.gpus = 2;  // and refuses TP, with or without sequence parallelism
  EXPECT_THAT(BuildStepCost(m, *HardwarePreset("h100"), hf_off).status().message(),
              HasSubstr("--tp is 2 with --framework hf; transformers eager runs no tensor"));
  EXPECT_EQ(SequenceShards(DenseRun(1, true)), 1);
  EXPECT_EQ(SequenceShards(DenseRun(4, true)), 4);
  EXPECT_EQ(SequenceShards(DenseRun(4, false)), 1);
}

TEST(SequenceParallel, TpCollectivesAreAllReducesOfTheWholeSequence) {
  const ModelConfig m = *ModelPreset("llama-3.1-8b");
  const HardwareProfile h100 = *HardwarePreset("h100");
  const StepCost sp = Build(m, DenseRun(8, true));
  const StepCost no_sp = Build(m, DenseRun(8, false));
  const double bytes = 8192.0 * 4096 * 2;  // t x h x dtype
  const std::vector<CommOp>& with = sp.comm.layers[3].ops;
  const std::vector<CommOp>& without = no_sp.comm.layers[3].ops;
  ASSERT_NE(FindOp(with, "TP all-gather"), nullptr);
  ASSERT_NE(FindOp(with, "TP reduce-scatter"), nullptr);
  EXPECT_EQ(FindOp(without, "TP all-gather"), nullptr);
  EXPECT_EQ(FindOp(without, "TP reduce-scatter"), nullptr);
  const CommOp* ar = FindOp(without, "TP all-reduce");
  ASSERT_NE(ar, nullptr);
  EXPECT_EQ(ar->collective, Collective::kAllReduce);
  EXPECT_EQ(ar->bytes, bytes);
  // After attention's and the MLP's row-parallel linears (forward); their column-parallel
  // inputs' gradients (backward).
  EXPECT_EQ(ar->forward_calls, 2);
  EXPECT_EQ(ar->backward_calls, 2);
  // Ring all-reduce over 8 GPUs of one NVLink domain: 2 x 7/8 of the bytes, 14 hops.
  EXPECT_DOUBLE_EQ(ar->seconds, CollectiveSeconds(h100, Collective::kAllReduce, {8, 1}, bytes));
  EXPECT_DOUBLE_EQ(ar->seconds, 2 * bytes * 7 / 8 / h100.nvlink_bytes_per_second +
                                    14 * h100.nvlink_latency_seconds);
  // An all-reduce is a reduce-scatter and an all-gather: the same time on the critical path.
  const double pair =
      FindOp(with, "TP all-gather")->seconds + FindOp(with, "TP reduce-scatter")->seconds;
  EXPECT_NEAR(no_sp.comm.layers[3].forward_exposed_seconds,
              sp.comm.layers[3].forward_exposed_seconds, 1e-9 * pair);
  // The embedding's output all-reduced forward, the LM head's input gradient backward.
  const CommOp* ends =
      FindOp(no_sp.comm.step_ops, "TP embedding all-reduce / LM head gradient all-reduce");
  ASSERT_NE(ends, nullptr);
  EXPECT_EQ(ends->collective, Collective::kAllReduce);
  EXPECT_EQ(ends->forward_calls, 1);
  EXPECT_EQ(ends->backward_calls, 1);
  EXPECT_EQ(FindOp(no_sp.comm.step_ops, "TP embedding reduce-scatter / LM head all-gather"),
            nullptr);
}

TEST(SequenceParallel, PipelineMessagesAreTheWholeSequence) {
  const ModelConfig m = *ModelPreset("llama-3.1-8b");
  // schedules.py get_tensor_shapes: seq_length // tp only under sequence parallelism.
  EXPECT_EQ(PipelineMessageBytes(m, DenseRun(4, false)), 8192.0 * 4096 * 2);
  EXPECT_EQ(PipelineMessageBytes(m, DenseRun(4, true)), 8192.0 * 4096 * 2 / 4);
  EXPECT_EQ(PipelineMessageBytes(m, DenseRun(1, false)),
            PipelineMessageBytes(m, DenseRun(1, true)));
}

TEST(SequenceParallel, MtpModuleOutsideItsLayerIsWholeWithoutIt) {
  ModelConfig m = *ModelPreset("llama-3.1-8b");
  m.mtp_layers = 1;  // one MTP depth after the decoder layers (Note [MTP layers])
  RunSettings sp = DenseRun(2, true), no_sp = DenseRun(2, false);
  sp.mtp_layers = no_sp.mtp_layers = 1;
  const StepCost a = Build(m, sp), b = Build(m, no_sp);
  ASSERT_EQ(a.layers.back().name, "mtp.0");
  ASSERT_EQ(b.layers.back().name, "mtp.0");
  const double t = 8192, h = 4096, dt = 2;
  const LayerCost &with = a.layers.back(), &without = b.layers.back();
  EXPECT_EQ(Saved(without, "input"), 2 * h * dt * t + 8 * t);
  EXPECT_EQ(Saved(with, "input"), 2 * h * dt * t / 2 + 8 * t);
  EXPECT_EQ(Saved(without, "mtp.eh_proj_in"), 2 * Saved(with, "mtp.eh_proj_in"));
  EXPECT_EQ(Saved(without, "mtp.final_norm"), (h * dt + 4) * t);
  EXPECT_EQ(without.output_bytes, h * dt * t);
  EXPECT_EQ(with.output_bytes, h * dt * t / 2);
}

TEST(SequenceParallel, MoeUnderTpNeedsIt) {
  const ModelConfig m = *ModelPreset("qwen3-30b-a3b");
  RunSettings run;
  run.seq_len = 8192;
  run.tp = 2;
  run.cp = 1;
  run.ep = 8;
  run.gpus = 16;
  run.sequence_parallel = false;
  const absl::Status s = ValidateRun(m, run);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--tp is 2"));
  EXPECT_THAT(s.message(), HasSubstr("--sequence-parallel"));
  EXPECT_THAT(s.message(), HasSubstr("moe_layer.py"));
  run.sequence_parallel = true;
  EXPECT_TRUE(ValidateRun(m, run).ok()) << ValidateRun(m, run);
  run.tp = 1;  // moot: no TP
  run.gpus = 8;
  run.sequence_parallel = false;
  EXPECT_TRUE(ValidateRun(m, run).ok()) << ValidateRun(m, run);
}

}  // namespace
}  // namespace stowage::planner
