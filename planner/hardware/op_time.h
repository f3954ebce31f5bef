// Op time: the one place the planner turns work into seconds. Every compute-time number (the
// megatron and hf analytic recipes, measured profiles, every layer kind) describes what a
// module runs as an OpWork and asks OpSeconds how long it takes on a HardwareProfile, so one
// set of per-op-class rates (hardware.h, measured by `stowage calibrate`) drives them all.
#ifndef STOWAGE_PLANNER_OP_TIME_H_
#define STOWAGE_PLANNER_OP_TIME_H_

#include "planner/hardware/hardware.h"

namespace stowage::planner {

// The work of one module (or a whole pass), by op class. FLOPs count 2 per multiply-add; bytes
// count what the kernels read plus what they write. All fields are totals for the rank, not per
// token, and none may be negative.
struct OpWork {
  // Dense tensor-core GEMMs (projections, dense FFNs, the LM head), forward or backward: bf16
  // (or fp16) operands.
  double gemm_flops = 0;
  // Dense GEMMs on fp32 operands (mm / bmm of float32 tensors: transformers' linear-attention
  // fallbacks' chunk matmuls, fp32 routers, the DSA indexer's scores). Under torch's default
  // float32 matmul precision ("highest", TF32 off) they run on the CUDA cores, not the tensor
  // cores: their own rate (Note [Op time]).
  double fp32_gemm_flops = 0;
  // Fused attention cores (flash / memory-efficient SDPA, TE's fused attention), already
  // halved for a causal mask where the kernel skips masked blocks. Backward kernels run at their
  // own rate, so they are kept apart from forward ones.
  double attention_forward_flops = 0;
  double attention_backward_flops = 0;
  // Grouped (per-expert) GEMMs and the tokens each expert sees in them: small per-expert
  // problems cannot fill the tensor cores, so their rate depends on tokens_per_expert. One field
  // per kernel, each at its own rate: TE's grouped GEMM (megatron) and torch._grouped_mm (hf:
  // transformers' grouped_mm experts, and what a measured hf profile counts as aten._grouped_mm);
  // tokens_per_expert is the rows per group of both.
  double grouped_gemm_flops = 0;
  double torch_grouped_mm_flops = 0;
  double tokens_per_expert = 0;
  // Memory-bound kernels (norms, activations, RoPE, casts, softmax over the vocabulary, ...):
  // the bytes they move.
  double elementwise_bytes = 0;
  // Kernels launched; each costs at least HardwareProfile::kernel_seconds.
  double kernels = 0;
};

// Seconds of each op class of one OpWork; total() is what OpSeconds returns.
struct OpTime {
  double gemm = 0;
  double attention_forward = 0;
  double attention_backward = 0;
  double grouped_gemm = 0;
  double elementwise = 0;
  double launch = 0;
  double total() const {
    return gemm + attention_forward + attention_backward + grouped_gemm + elementwise + launch;
  }
  OpTime& operator+=(const OpTime& o);
};

// The rate grouped expert GEMMs reach at `tokens_per_expert` tokens per expert:
// dense_bf16_flops * grouped_gemm_efficiency * t / (t + grouped_gemm_half_tokens).
double GroupedGemmFlops(const HardwareProfile& hw, double tokens_per_expert);
// The same for torch._grouped_mm, with torch_grouped_mm_efficiency and
// torch_grouped_mm_half_tokens (Note [torch._grouped_mm rate] in hardware.cc).
double TorchGroupedMmFlops(const HardwareProfile& hw, double tokens_per_expert);

// Note [Op time] in op_time.cc: dense GEMMs at dense_bf16_flops * gemm_efficiency (fp32 ones at
// dense_fp32_flops * fp32_gemm_efficiency, both in OpTime::gemm), attention
// forward / backward at flash_forward_efficiency / flash_backward_efficiency of it, grouped
// GEMMs at GroupedGemmFlops or TorchGroupedMmFlops (both in OpTime::grouped_gemm), memory-bound
// bytes at hbm_bytes_per_second * elementwise_efficiency, plus kernel_seconds per kernel.
OpTime OpTimeOf(const OpWork& work, const HardwareProfile& hw);
double OpSeconds(const OpWork& work, const HardwareProfile& hw);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_OP_TIME_H_
