#include "planner/hardware/op_time.h"

namespace stowage::planner {

// Note [Op time]
// A training step on one GPU is a stream of kernels; each op class runs at its own share of a
// datasheet peak (the shares are hardware profile fields, measured by `stowage calibrate`):
//  - dense GEMMs: FLOPs / (dense_bf16_flops * gemm_efficiency); on fp32 operands FLOPs /
//    (dense_fp32_flops * fp32_gemm_efficiency): torch runs a float32 matmul without TF32 unless
//    told otherwise (torch.backends.cuda.matmul.allow_tf32 is False by default since 1.12,
//    torch.get_float32_matmul_precision() "highest"; PyTorch docs, notes/cuda.rst "TensorFloat-32
//    (TF32) on Ampere (and later) devices"), so cuBLAS's SGEMM runs FMAs on the CUDA cores, at
//    the non-tensor FP32 peak (Note [Op rates] in hardware.cc);
//  - fused attention: forward FLOPs at flash_forward_efficiency, backward FLOPs at
//    flash_backward_efficiency (flash backward recomputes the scores and runs five GEMMs per
//    block against the forward's two, with more shared-memory traffic, so it reaches less);
//  - grouped expert GEMMs: an expert with t tokens is a [t, h] x [h, f] problem; below a few
//    hundred rows a tile wave cannot fill the SMs, so the rate saturates as
//    grouped_gemm_efficiency * t / (t + grouped_gemm_half_tokens), half of it at
//    t = grouped_gemm_half_tokens; torch._grouped_mm's the same way with its own pair of fields
//    (another kernel: Note [torch._grouped_mm rate] in hardware.cc);
//  - memory-bound kernels: bytes moved / (hbm_bytes_per_second * elementwise_efficiency);
//  - every kernel: kernel_seconds more — launch, ramp-up and tail, which a kernel pays however
//    little it does (an empty kernel takes about this long back to back), so a module of many
//    small kernels is bound by their count, not by its bytes.
// The classes add: one stream runs them one after another. A zero field costs nothing, so
// OpWork{} is 0 seconds.

OpTime& OpTime::operator+=(const OpTime& o) {
  gemm += o.gemm;
  attention_forward += o.attention_forward;
  attention_backward += o.attention_backward;
  grouped_gemm += o.grouped_gemm;
  elementwise += o.elementwise;
  launch += o.launch;
  return *this;
}

double GroupedGemmFlops(const HardwareProfile& hw, double tokens_per_expert) {
  return hw.dense_bf16_flops * hw.grouped_gemm_efficiency * tokens_per_expert /
         (tokens_per_expert + hw.grouped_gemm_half_tokens);
}

double TorchGroupedMmFlops(const HardwareProfile& hw, double tokens_per_expert) {
  return hw.dense_bf16_flops * hw.torch_grouped_mm_efficiency * tokens_per_expert /
         (tokens_per_expert + hw.torch_grouped_mm_half_tokens);
}

OpTime OpTimeOf(const OpWork& w, const HardwareProfile& hw) {
  OpTime t;
  if (w.gemm_flops > 0) t.gemm = w.gemm_flops / (hw.dense_bf16_flops * hw.gemm_efficiency);
  if (w.fp32_gemm_flops > 0) {
    t.gemm += w.fp32_gemm_flops / (hw.dense_fp32_flops * hw.fp32_gemm_efficiency);
  }
  if (w.attention_forward_flops > 0) {
    t.attention_forward =
        w.attention_forward_flops / (hw.dense_bf16_flops * hw.flash_forward_efficiency);
  }
  if (w.attention_backward_flops > 0) {
    t.attention_backward =
        w.attention_backward_flops / (hw.dense_bf16_flops * hw.flash_backward_efficiency);
  }
  if (w.grouped_gemm_flops >
      0) {  // at 0 tokens per expert: infinite, which the step-cost bounds catch
    t.grouped_gemm = w.grouped_gemm_flops / GroupedGemmFlops(hw, w.tokens_per_expert);
  }
  if (w.torch_grouped_mm_flops > 0) {
    t.grouped_gemm += w.torch_grouped_mm_flops / TorchGroupedMmFlops(hw, w.tokens_per_expert);
  }
  if (w.elementwise_bytes > 0) {
    t.elementwise = w.elementwise_bytes / (hw.hbm_bytes_per_second * hw.elementwise_efficiency);
  }
  if (w.kernels > 0) t.launch = w.kernels * hw.kernel_seconds;
  return t;
}

double OpSeconds(const OpWork& work, const HardwareProfile& hw) {
  return OpTimeOf(work, hw).total();
}

}  // namespace stowage::planner
