#include "planner/hardware/op_time.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>

#include "planner/hardware/hardware.h"

namespace stowage::planner {
namespace {

// Round numbers so every expectation below is arithmetic one can do by hand.
HardwareProfile Round() {
  HardwareProfile hw;
  hw.dense_bf16_flops = 1e15;
  hw.hbm_bytes_per_second = 4e12;
  hw.gemm_efficiency = 0.5;
  hw.flash_forward_efficiency = 0.4;
  hw.flash_backward_efficiency = 0.25;
  hw.grouped_gemm_efficiency = 0.8;
  hw.grouped_gemm_half_tokens = 100;
  hw.elementwise_efficiency = 0.5;
  hw.kernel_seconds = 5e-6;
  return hw;
}

TEST(OpTime, NoWorkTakesNoTime) { EXPECT_EQ(OpSeconds(OpWork{}, Round()), 0.0); }

TEST(OpTime, EachClassAtItsOwnRate) {
  const HardwareProfile hw = Round();
  // 1e12 FLOPs at 0.5 x 1e15 FLOP/s: 2 ms.
  EXPECT_DOUBLE_EQ(OpSeconds({.gemm_flops = 1e12}, hw), 2e-3);
  // Attention forward at 0.4 x 1e15: 2.5 ms; backward at 0.25 x 1e15: 4 ms.
  EXPECT_DOUBLE_EQ(OpSeconds({.attention_forward_flops = 1e12}, hw), 2.5e-3);
  EXPECT_DOUBLE_EQ(OpSeconds({.attention_backward_flops = 1e12}, hw), 4e-3);
  // 1e9 bytes at 0.5 x 4e12 B/s: 0.5 ms.
  EXPECT_DOUBLE_EQ(OpSeconds({.elementwise_bytes = 1e9}, hw), 5e-4);
  // 200 kernels x 5 us: 1 ms.
  EXPECT_DOUBLE_EQ(OpSeconds({.kernels = 200}, hw), 1e-3);
}

TEST(OpTime, GroupedGemmSaturatesInTokensPerExpert) {
  const HardwareProfile hw = Round();
  // 100 tokens per expert is the half point: 0.8 x 1e15 x 100 / 200 = 4e14 FLOP/s.
  EXPECT_DOUBLE_EQ(GroupedGemmFlops(hw, 100), 4e14);
  EXPECT_DOUBLE_EQ(OpSeconds({.grouped_gemm_flops = 4e11, .tokens_per_expert = 100}, hw), 1e-3);
  // 900 tokens: 0.8 x 1e15 x 900 / 1000 = 7.2e14.
  EXPECT_DOUBLE_EQ(GroupedGemmFlops(hw, 900), 7.2e14);
  // Monotone and below the many-token rate.
  double previous = 0;
  for (double t : {1.0, 10.0, 100.0, 1e3, 1e4, 1e6}) {
    const double rate = GroupedGemmFlops(hw, t);
    EXPECT_GT(rate, previous) << t;
    EXPECT_LT(rate, 0.8e15) << t;
    previous = rate;
  }
  // No padding loss modelled (half point 0): the many-token rate at any size.
  HardwareProfile flat = hw;
  flat.grouped_gemm_half_tokens = 0;
  EXPECT_DOUBLE_EQ(GroupedGemmFlops(flat, 3), 0.8e15);
  // Grouped FLOPs with no tokens per expert cannot run: infinite, which CheckStepCostBounds
  // refuses, rather than a silent zero.
  EXPECT_EQ(OpSeconds({.grouped_gemm_flops = 1, .tokens_per_expert = 0}, hw),
            std::numeric_limits<double>::infinity());
}

// TE's grouped GEMM (megatron) and torch._grouped_mm (hf) are two kernels: each at its own
// share and half point, both counted as grouped-GEMM time.
TEST(OpTime, TorchGroupedMmAtItsOwnRate) {
  HardwareProfile hw = Round();
  hw.torch_grouped_mm_efficiency = 0.5;
  hw.torch_grouped_mm_half_tokens = 300;
  // 100 rows per group: 0.5 x 1e15 x 100 / 400 = 1.25e14 FLOP/s; TE's stays 4e14.
  EXPECT_DOUBLE_EQ(TorchGroupedMmFlops(hw, 100), 1.25e14);
  EXPECT_DOUBLE_EQ(GroupedGemmFlops(hw, 100), 4e14);
  EXPECT_DOUBLE_EQ(OpSeconds({.torch_grouped_mm_flops = 1.25e11, .tokens_per_expert = 100}, hw),
                   1e-3);
  const OpTime both = OpTimeOf(
      {.grouped_gemm_flops = 4e11, .torch_grouped_mm_flops = 1.25e11, .tokens_per_expert = 100},
      hw);
  EXPECT_DOUBLE_EQ(both.grouped_gemm, 2e-3);
  EXPECT_DOUBLE_EQ(both.total(), 2e-3);
  EXPECT_EQ(OpSeconds({.torch_grouped_mm_flops = 1, .tokens_per_expert = 0}, hw),
            std::numeric_limits<double>::infinity());
}

// fp32 operands run on the CUDA cores (Note [Op time]): dense_fp32_flops x fp32_gemm_efficiency,
// whatever the tensor-core rate, and in the breakdown's gemm seconds.
TEST(OpTime, Fp32GemmsAtTheCudaCoresRate) {
  HardwareProfile hw = Round();
  hw.dense_fp32_flops = 5e13;
  hw.fp32_gemm_efficiency = 0.8;
  // 4e10 FLOPs at 0.8 x 5e13 FLOP/s: 1 ms; the same FLOPs in bf16 take 0.08 ms.
  EXPECT_DOUBLE_EQ(OpSeconds({.fp32_gemm_flops = 4e10}, hw), 1e-3);
  EXPECT_DOUBLE_EQ(OpSeconds({.gemm_flops = 4e10}, hw), 8e-5);
  const OpTime both = OpTimeOf({.gemm_flops = 1e12, .fp32_gemm_flops = 4e10}, hw);
  EXPECT_DOUBLE_EQ(both.gemm, 3e-3);
  EXPECT_DOUBLE_EQ(both.total(), 3e-3);
}

// The presets' fp32 rates are their datasheets' FP32 (non-tensor) peaks with gemm_efficiency's
// default share (Note [Op rates] in hardware.cc): H200 / H800 67, B200 75, GB200 90 TFLOP/s.
TEST(OpTime, PresetFp32RatesAreTheDatasheetPeaksAtTheGemmShare) {
  for (auto [name, peak] : {std::pair<const char*, double>{"h200", 67e12},
                            {"h800", 67e12},
                            {"b200", 75e12},
                            {"gb200", 90e12}}) {
    const HardwareProfile hw = *HardwarePreset(name);
    EXPECT_EQ(hw.dense_fp32_flops, peak) << name;
    EXPECT_EQ(hw.fp32_gemm_efficiency, hw.gemm_efficiency) << name;
    EXPECT_DOUBLE_EQ(OpSeconds({.fp32_gemm_flops = 1e12}, hw), 1e12 / (peak * 746.0 / 989.0))
        << name;
  }
}

// Note [torch._grouped_mm rate]: at 512 rows per expert the H200 preset's torch._grouped_mm
// rate is the 480.5 TFLOP/s derived from the public H100 measurement (routed counts, all three
// passes), well below TE's class there (746 x 512 / 576 = 663).
TEST(OpTime, PresetTorchGroupedMmRateIsTheDerivedOne) {
  const HardwareProfile h200 = *HardwarePreset("h200");
  EXPECT_NEAR(TorchGroupedMmFlops(h200, 512), 480.5e12, 1e9);
  EXPECT_NEAR(GroupedGemmFlops(h200, 512), 746e12 * 512 / 576, 1e9);
}

TEST(OpTime, ClassesAddAndTheBreakdownSumsToTheTotal) {
  const HardwareProfile hw = Round();
  const OpWork work{.gemm_flops = 1e12,
                    .attention_forward_flops = 1e12,
                    .attention_backward_flops = 1e12,
                    .grouped_gemm_flops = 4e11,
                    .tokens_per_expert = 100,
                    .elementwise_bytes = 1e9,
                    .kernels = 200};
  const OpTime t = OpTimeOf(work, hw);
  EXPECT_DOUBLE_EQ(t.gemm, 2e-3);
  EXPECT_DOUBLE_EQ(t.attention_forward, 2.5e-3);
  EXPECT_DOUBLE_EQ(t.attention_backward, 4e-3);
  EXPECT_DOUBLE_EQ(t.grouped_gemm, 1e-3);
  EXPECT_DOUBLE_EQ(t.elementwise, 5e-4);
  EXPECT_DOUBLE_EQ(t.launch, 1e-3);
  EXPECT_DOUBLE_EQ(t.total(), 2e-3 + 2.5e-3 + 4e-3 + 1e-3 + 5e-4 + 1e-3);
  EXPECT_DOUBLE_EQ(OpSeconds(work, hw), t.total());
  OpTime sum = t;
  sum += t;
  EXPECT_DOUBLE_EQ(sum.total(), 2 * t.total());
}

TEST(OpTime, PresetsGiveTheDerivedRates) {
  // A 4096 x 4096 x 4096 GEMM (2 x 4096^3 FLOPs) on H200 at 746 of 989 TFLOP/s (Note [Op rates]):
  // 184.2 us.
  const HardwareProfile h200 = *HardwarePreset("h200");
  EXPECT_NEAR(OpSeconds({.gemm_flops = 2.0 * 4096 * 4096 * 4096}, h200),
              2.0 * 4096 * 4096 * 4096 / 746e12, 1e-9);
  // 1 GB through an element-wise kernel at the probe's 3930 GB/s stream copy.
  EXPECT_NEAR(OpSeconds({.elementwise_bytes = 1e9}, h200), 1e9 / 3930e9, 1e-12);
}

}  // namespace
}  // namespace stowage::planner
