#include "planner/hardware/hardware.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/bytes.h"
#include "base/json_reader.h"
#include "base/status_macros.h"

namespace stowage::planner {
namespace {

using ordered_json = json::Json;

// Note [Op rates]
// Where the per-op-class rates of hardware.h's defaults and the presets
// (planner/hardware/op_time.h) come from. None is fitted to measured training steps (the public
// ones are in tests/planner/data/measured/); `stowage calibrate` replaces them all with
// measurements on the user's GPU.
//  - gemm_efficiency 0.755: the torch anchor of a probe run on one H200 (a torch script of 12
//    blocks of LayerNorm, [32768 x 4096] x [4096 x 16384] GEMM, GELU, GEMM, residual; bf16).
//    Its recompute run (609.0 ms) is 4 forward-GEMM passes of 1.055e14 FLOPs plus element-wise
//    traffic of 102 bytes per hidden element per token (forward 26: LayerNorm r2 w2, GELU over
//    4x width r8 w8, residual add r4 w2 — twice; backward 50: bias-gradient sums r2 + r8, GELU
//    backward r16 w8, LayerNorm backward r4 w2 + weight gradients r4, residual sum r4 w2), which
//    at the probe's 3930 GB/s is 41.8 ms, and ~1 ms of launches: 4.221e14 / 0.566 s = 746
//    TFLOP/s = 0.755 of 989. (Its keep run, 521.9 ms for 3 passes, implies 0.654, but it is
//    only 87 ms faster than the recompute run, which reran a whole forward of >= 140 ms of GEMMs:
//    the keep run, holding 32 GiB, lost time outside its kernels, so the recompute run is the
//    cleaner measure of the GEMM rate.)
//  - dense_fp32_flops, fp32_gemm_efficiency: an fp32 matmul (OpWork::fp32_gemm_flops) runs
//    without tensor cores under torch's defaults (Note [Op time] in op_time.cc): aten's bmm /
//    mm on float32 call cublasSgemm(StridedBatched) with CUBLAS_DEFAULT_MATH when allow_tf32 is
//    off, FMAs on the CUDA cores. Their peak is the datasheets' FP32 (non-tensor) figure: H100
//    SXM and H200 SXM 67 TFLOP/s (NVIDIA H100 and H200 Tensor Core GPU datasheets, SXM
//    columns), HGX B200 600 TFLOP/s per 8 GPUs = 75 (NVIDIA HGX B200 datasheet), GB200 NVL72
//    6,480 TFLOP/s per 72 GPUs = 90 (GB200 NVL72 datasheet): 14.8x, 30x and 27.8x below the
//    presets' dense bf16 rates. No public measurement of cuBLAS SGEMM on these GPUs at the
//    shapes the hf recipes run (64 x 128 chunk blocks batched over heads and chunks; routers'
//    [tokens x hidden] x [hidden x experts]) is at hand, so the share is gemm_efficiency's,
//    applied: the same library's tiled GEMM against its own pipe's peak. `stowage calibrate`
//    times SGEMMs at both kinds of shape and writes the share it measures.
//  - flash_forward/backward_efficiency (Note [SDPA on sm90]): the presets of the H100 die (H200,
//    H800) carry cuDNN 9.19's fused attention measured on an H200, 673/989 and 579/989; the
//    defaults (B200, GB200, a profile that omits the fields) keep cuDNN's figures on H100 SXM5
//    from the FlashAttention-3 paper (Shah et al. 2024, arXiv 2407.08608, figs. 5-6: 539 and 516
//    TFLOP/s at head dim 128, 16K tokens, causal), an older cuDNN 9 at the same length.
//  - grouped_gemm_efficiency = gemm_efficiency: TE's GroupedLinear under megatron
//    (general_grouped_gemm -> nvte_multi_tensor_gemm, transformer_engine/common/gemm/
//    cublaslt_gemm.cu) runs one cuBLAS GEMM per expert on several streams, the dense GEMMs'
//    kernels, unless NVTE_USE_CUTLASS_GROUPED_GEMM=1 (default off); grouped_gemm_half_tokens 64:
//    with 128-row tiles each expert pads its last tile by half a tile on average, so t tokens
//    cost t + 64 rows. torch._grouped_mm (hf) is another kernel, with its own rate: Note
//    [torch._grouped_mm rate].
//  - elementwise_efficiency: 1.0 of the H200's measured stream copy (the probe's 3930 GB/s is
//    what an element-wise copy kernel reaches); for datasheet HBM rates, H200's measured share of
//    its datasheet 4.8 TB/s, 3930 / 4800 = 0.82.
//  - kernel_seconds 3 us: the launch-to-launch time of a null kernel on recent GPUs and drivers
//    (NVIDIA developer forums, "Too much time for kernel launch latency", 2022).

// Note [SDPA on sm90]
// Which kernel transformers' attention runs on an H200 under torch 2.11 (the measured runs:
// torch 2.11.0+cu130, transformers 5.17), and its rate.
//  - The call. sdpa_attention_forward (integrations/sdpa_attention.py, 5.17 and 5.23): with no
//    padding mask use_gqa_in_sdpa() is true, so k and v keep their hkv heads and SDPA gets
//    enable_gqa=True, attn_mask None, is_causal=True, bf16 q/k/v of head dim 128 that are
//    [b, h, s, d] views of [b, s, h, d] tensors.
//  - The kernel is cuDNN's. Read from the 2.11.0+cu130 wheel itself (torch.version.git_version
//    70d99e99; libtorch_cuda.so's symbols and disassembly): select_sdp_backend's priority
//    is cuDNN, flash, memory-efficient, math when check_prefer_cudnn_attention holds, i.e. cuDNN
//    runtime > 9.15.0 (91500) and compute capability 9.0, 9.3, 10.0 or 10.3; the wheel pins
//    nvidia-cudnn-cu13 9.19.0.56. can_use_cudnn_attention's dense checks are
//    check_nonzero_sequence_lengths_dense, check_last_dim_stride_equals_1_dense<true>,
//    check_batch_size_and_num_heads_dense<true, false> and check_cudnn_tensor_shapes: GQA is
//    accepted with enable_gqa (check_grouped_query_attention: hq a multiple of hkv; sdp_utils_cpp.h
//    of the wheel), head dims up to 128. Flash would take it too (<true, true>); the
//    memory-efficient kernel would not (<false, true>). attention.cpp's
//    scaled_dot_product_attention hands k and v to _scaled_dot_product_cudnn_attention unrepeated
//    (no repeat_interleave outside the math path), and _cudnn_attention_backward allocates dq, dk
//    and dv as empty_like(q, k, v): dk and dv have hkv heads. cudnn-frontend 1.18 (the tag whose
//    error messages the wheel's strings match) expresses GQA's dK/dV as the hq-head products
//    reduced over each group inside the graph (dV_fullhead, red_dV_head: virtual tensors, nothing
//    materialized), and its backward workspace is the fp32 dQ accumulator [b, hq, s, d] and
//    softmax_sum [b, hq, s, 1] (SDPABackwardNode::get_fe_workspace_size_node), which
//    run_cudnn_SDP_bprop takes from the caching allocator. So there is no FA2-style dk_expanded /
//    dv_expanded [b, s, hq, d] transient and no sum over the group outside the kernel.
//  - The rate: cudnn-frontend's benchmark of exactly that kernel on an H200 with cuDNN 9.19.1
//    (benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/llama3.1_20260227_034703.csv,
//    cudnn-frontend v1.19.0: bf16, top-left causal, batch 1, 64 query heads over 8 kv heads (GQA
//    group 8), head dim 128, q/k/v the [b, s, h, d] transposes transformers passes; profiler
//    device time of every cuDNN kernel of the pass, L2 flushed; FLOPs counted as here, causal
//    halved, backward 2.5x forward), TFLOP/s forward / backward:
//        tokens   2048    4096    8192    16384   32768
//        fwd       484     591     644      673     688
//        bwd       370     474     541      579     581
//    The presets take the 16K column, the length of the figures they replace. One share per
//    profile cannot follow the length: at 8K cuDNN is 4% / 7% slower than that, at 4K 12% / 18%.
//    The group sizes here (Llama 4, Qwen2 7, Qwen3-MoE 8) and 28-32 query heads are not in the
//    table; nothing public measures cuDNN's GQA backward against its MHA one at these shapes
//    (pytorch/pytorch#139586: cuDNN takes hq != hkv as valid factors; huggingface/transformers
//    #48163: on Hopper cuDNN is 1.7-2.3x torch's FA2 for training shapes). These are rates of
//    the kernel alone; whether a training step runs it as fast is unmeasured (the dense cases'
//    gaps, tests/planner/frameworks/hf_measured_test.cc). bench/bench_sdpa.py (gpu-check) measures
//    the three cases' own shapes, kernel column included.

// Note [torch._grouped_mm rate]
// What transformers' grouped_mm experts (integrations/moe.py grouped_mm_experts_forward: the
// default experts implementation, 5.17 and 5.23) run on an H200 under torch 2.11, and at what rate.
//  - The kernel. torch._grouped_mm on bf16 inputs and output on sm90 takes the "fast path, no
//    d2h sync" (aten/src/ATen/native/cuda/GroupedBlas.cpp _grouped_mm_cuda) into
//    bf16bf16_grouped_mm (native/cuda/GroupMM.cu): one prepare_grouped_gemm_data kernel (one
//    block writes each group's pointers, strides and problem size from `offs`), then a CUTLASS
//    3.x ptr-array grouped GEMM (GemmUniversal over GroupProblemShape, TMA, warp-specialized,
//    persistent). dispatch_bf16_grouped_kernel_on_tile_size takes the rows per group M (total /
//    groups), N and K: if M <= 128 or N <= 128, the pingpong schedule with 64x128x128 tiles;
//    otherwise the cooperative schedule, 128x256x64 tiles, 2x1x1 clusters. The torch 2.11 cu130
//    wheel carries exactly these two bf16 sm90 kernels (its libtorch_cuda.so symbols:
//    MainloopSm90ArrayTmaGmmaWarpSpecialized<4 stages, 2x1x1, Pingpong> at 64x128x128 and
//    <4, 2x1x1, Cooperative> at 128x256x64), and no cuBLASLt grouped path (newer sources
//    try one first when built with CUDA >= 13.3). The backward (tools/autograd/derivatives.yaml:
//    _grouped_mm_mat1_backward, _grouped_mm_mat2_backward) is two more _grouped_mm calls, not a
//    loop of mm: the input gradient grad [S, N] x W [E, N, K] (2-D x 3-D) and the weight gradient,
//    K-grouped 2-D x 2-D (grad^T [N, S] x x [S, K] -> [E, N, K], each group's reduction over its
//    own rows), the same CUTLASS kernels. Seen on CPU in this torch's autograd of a Qwen3-MoE
//    block: forward 2 _grouped_mm, backward 4. At the measured Qwen3-MoE case (8192 tokens, top-8,
//    128 experts: 512 rows per expert; h 2048, fe 768) every one of the six calls per layer has M =
//    512 or 2048 rows and N >= 768: all run the cooperative 128x256x64 kernel.
//  - The rate. The one public measurement of that kernel at these shapes: tgale96/grouped_gemm
//    PR #37 (Knarf04/grouped_gemm run.log, H100 SXM, CUTLASS 4 sm90 ptr-array cooperative,
//    128x256x64 tiles, 1x2x1 clusters), Qwen3-30B-A3B's gate/up projection: 128 experts, K 2048,
//    N 1536, 65,536 rows, forward + input gradient + weight gradient timed together (profiler
//    device time per step). Its "Forward TFLOPs" column divides forward FLOPs by that whole
//    step, so the kernel rate is its "Fwd+Bwd" column: 481.6 TFLOP/s with 512 rows per expert
//    ("uniform"), 454.6 with counts from 69 to 1892 at the same mean ("mild skew"), 462.9 from
//    117 to 3277. Each step also runs out.sum() (reads the [65536, 1536] bf16 output, 201 MB) and
//    grad.contiguous() (writes 201 MB): 402.7 MB at H100's element-wise rate (3.35 TB/s x 0.82,
//    Note [Op rates]) is 0.147 ms, taken out. The hf case's counts are routed (not multiples of
//    the 128-row tile), as in the skewed rows: 1.2369e12 FLOPs in 2.721 - 0.147 ms = 480.5
//    TFLOP/s at 512 rows per expert. With the half-tile padding of the rate model (t / (t + 64)
//    at 512: 0.889): torch_grouped_mm_efficiency = 480.5 / 989 / 0.889 = 0.547, half 64. (The
//    uniform row, 2.421 ms = 510.8 TFLOP/s with no padding at all, is 6% faster than the skewed
//    one where the model's padding says 11%: the model is anchored where the hf case sits,
//    routed counts at 512 rows, not extrapolated from aligned ones.) H100 SXM and H200 share
//    the SMs and clocks; at 480 TFLOP/s the gate/up forward moves ~1.3 GB in 0.86 ms, 44% of
//    H100's HBM rate, so the H200's faster HBM is not expected to move it (scripts/gpu-check's
//    bench_grouped_mm.py measures it on the H200). Cross-checks: ByteDance-Seed/VeOmni PR #460
//    (H100, a torch._grouped_mm MoE forward at h 2048, ffn 768, 128 experts, top-8, 32K tokens:
//    242 TFLOP/s counting the whole forward, routing and gathers included: a lower bound);
//    pytorch/ao PR #2490 (H100, 512 rows per expert but K 5120 / N 8192, forward only: 6.87e11
//    FLOPs in 1.31 ms = 524 TFLOP/s; its printed tops count every group's FLOPs E times).
//    The forward, input-gradient and weight-gradient passes are not measured apart at these
//    shapes (down's forward has K 768, a third of the k-loop per tile); one share covers all
//    three until bench_grouped_mm.py's per-pass table says otherwise. B200/GB200 run another
//    kernel (sm100, 64x128x128 1-SM MMA), unmeasured at these shapes: they keep the default.

// Note [Topology]
// What the communication model (planner/cost/communication.h) needs: how many GPUs one NVLink
// fabric joins (an HGX board: 8; an NVL72 rack: 72) and its per-GPU rate, the per-GPU network
// rate (NIC line rate / GPUs sharing the NIC) and the per-hop latencies. The latencies are
// NCCL's own model of a Simple-protocol ring hop (src/graph/tuning.cc, hwLat: 3.4 us over
// NVLink, 14 us over the network). Rates are datasheet peaks per direction, an upper bound on
// what NCCL reaches; `stowage calibrate` writes the measured all_to_all/all_gather/
// reduce_scatter bus bandwidths among a node's GPUs, which the model then uses instead.
// The shared host link (gpus_per_host_link, host_link_bytes_per_second) is what several GPUs
// copying to host memory at once divide among themselves; an HGX board gives each GPU its own
// PCIe Gen5 x16 link, so its presets share nothing there.

// An HGX/DGX 8-GPU node: one NVSwitch domain of 8 GPUs, and one ConnectX-7 NDR 400 Gb/s
// (50 GB/s) compute-fabric NIC per GPU (DGX H100/H200/B200 user guides: eight OSFP ports, each
// with its GPU).
void HgxTopology(HardwareProfile& p, double nvlink_bytes_per_second) {
  p.nvlink_domain_gpus = 8;
  p.gpus_per_node = 8;
  p.nvlink_bytes_per_second = nvlink_bytes_per_second;
  p.nic_bytes_per_second = 50e9;
  p.gpus_per_nic = 1;
  p.gpus_per_host_link = 1;
  p.host_link_bytes_per_second = 0;
}

// cuDNN 9.19's fused attention on the H100 die (Note [SDPA on sm90]): 673 and 579 TFLOP/s at 16K
// causal tokens of head dim 128, as shares of the 989 TFLOP/s dense bf16 peak.
void CudnnSm90Attention(HardwareProfile& p) {
  p.flash_forward_efficiency = 673.0 / 989.0;
  p.flash_backward_efficiency = 579.0 / 989.0;
}

// H200, PCIe Gen5 x16: figures a probe measured on one H200 (docs/hardware.md "Presets").
// The host side (2 sockets, 1 TiB and 4 GPUs per NUMA node) is the HGX H200 reference layout,
// since the probe VM's single node is not what training nodes look like.
HardwareProfile H200() {
  HardwareProfile p;
  p.name = "h200";
  p.source = "measured";
  p.hbm_bytes = 143771ull * kMiB;  // nvidia-smi memory.total
  p.usable_fraction = 0.92;
  p.hbm_bytes_per_second = 3930e9;  // stream copy, read + write
  p.dense_bf16_flops = 989e12;
  p.dense_fp32_flops = 67e12;  // H200 datasheet, SXM: FP32 (Note [Op rates])
  // The op rates are the defaults of hardware.h (Note [Op rates]) but for attention, and
  // hbm_bytes_per_second is the probe's stream copy, which element-wise kernels reach.
  p.elementwise_efficiency = 1.0;
  CudnnSm90Attention(p);
  p.d2h_bytes_per_second = 55.3e9;
  p.h2d_bytes_per_second = 55.5e9;
  p.bidir_d2h_bytes_per_second = 50.7e9;
  p.bidir_h2d_bytes_per_second = 51.9e9;
  p.chunk_bandwidth = {{256ull << 10, 41.9e9, 35.5e9}, {1ull << 20, 50.4e9, 48.2e9},
                       {4ull << 20, 54.1e9, 53.4e9},   {16ull << 20, 55.1e9, 55.0e9},
                       {64ull << 20, 55.3e9, 55.4e9},  {256ull << 20, 55.3e9, 55.5e9}};
  p.pin_seconds_per_gib = 0.038;
  p.host_bytes_per_numa_node = 1024 * kGiB;
  p.gpus_per_numa_node = 4;
  HgxTopology(p, 450e9);  // NVLink 4: 18 links x 25 GB/s per direction
  return p;
}

// H800 SXM5, datasheet values: the H100 SXM5 die and memory (80 GB HBM3 at 3.35 TB/s, 989 TFLOP/s
// dense BF16: NVIDIA H100 datasheet, SXM column) with NVLink cut to 8 links, 400 GB/s both
// directions together (NVIDIA H800 product brief), so 200 GB/s per direction against the
// H100's 450. The node is the one DeepSeek-V3 trained on (DeepSeek-V3 technical report, arXiv
// 2412.19437, section 3.1: 8 GPUs per node on NVLink/NVSwitch, InfiniBand across nodes; "Insights
// into DeepSeek-V3", arXiv 2505.09343, section 2: eight 400 Gb/s ConnectX-7 InfiniBand NICs per
// node, one per GPU), which is the HGX layout of HgxTopology. DeepSeek reports 160 GB/s of NVLink
// and 50 GB/s of InfiniBand reached in practice; the profile keeps the datasheet peaks like the
// other presets (Note [Topology]). The host side is the HGX H100/H800 reference system's (DGX
// H100: 2 TiB, 2 sockets, 4 GPUs each); the host link is PCIe Gen5 x16 with H200's measured rates
// (the same link), and the pinning rate is H200's measured one. The op rates are hardware.h's
// defaults but for attention, which is H200's (the same SMs and clocks: CudnnSm90Attention), and
// elementwise_efficiency scales the datasheet HBM rate by H200's measured share.
HardwareProfile H800() {
  HardwareProfile p;
  p.name = "h800";
  p.source = "datasheet";
  p.hbm_bytes = 81559ull * kMiB;  // 80 GB HBM3 as nvidia-smi reports an H100/H800 SXM5
  p.usable_fraction = 0.92;
  p.hbm_bytes_per_second = 3.35e12;
  p.dense_bf16_flops = 989e12;
  p.dense_fp32_flops = 67e12;  // H100 datasheet, SXM: FP32
  CudnnSm90Attention(p);
  p.d2h_bytes_per_second = 55.3e9;
  p.h2d_bytes_per_second = 55.5e9;
  p.bidir_d2h_bytes_per_second = 50.7e9;
  p.bidir_h2d_bytes_per_second = 51.9e9;
  p.pin_seconds_per_gib = 0.038;
  p.host_bytes_per_numa_node = 1024 * kGiB;
  p.gpus_per_numa_node = 4;
  HgxTopology(p, 200e9);  // NVLink 4, 8 links x 25 GB/s per direction
  return p;
}

// H100 SXM5, datasheet values (NVIDIA H100 Tensor Core GPU datasheet, SXM column: 80 GB HBM3 at
// 3.35 TB/s, 989 TFLOP/s dense BF16 (1,979 with sparsity), 67 TFLOP/s FP32, NVLink 900 GB/s both
// directions together: 18 links x 25 GB/s per direction). The node is the HGX H100 8-GPU board
// (NVSwitch, one 400 Gb/s ConnectX-7 NIC per GPU: HgxTopology), as Llama 3 trained on (Llama 3
// paper, arXiv 2407.21783, section 3.3.1: 8 GPUs per server on NVLink, 400 Gbps per GPU across
// servers). The host side is the DGX H100's (2 TiB, 2 sockets, 4 GPUs each); the host link is
// PCIe Gen5 x16 with H200's measured rates (the same link), the pinning rate H200's measured one;
// the op rates are hardware.h's defaults but for attention, H200's (the same SMs and clocks:
// CudnnSm90Attention). The H800 below is this GPU with NVLink cut to 8 links.
HardwareProfile H100() {
  HardwareProfile p;
  p.name = "h100";
  p.source = "datasheet";
  p.hbm_bytes = 81559ull * kMiB;  // 80 GB HBM3 as nvidia-smi reports an H100 SXM5
  p.usable_fraction = 0.92;
  p.hbm_bytes_per_second = 3.35e12;
  p.dense_bf16_flops = 989e12;
  p.dense_fp32_flops = 67e12;
  CudnnSm90Attention(p);
  p.d2h_bytes_per_second = 55.3e9;
  p.h2d_bytes_per_second = 55.5e9;
  p.bidir_d2h_bytes_per_second = 50.7e9;
  p.bidir_h2d_bytes_per_second = 51.9e9;
  p.pin_seconds_per_gib = 0.038;
  p.host_bytes_per_numa_node = 1024 * kGiB;
  p.gpus_per_numa_node = 4;
  HgxTopology(p, 450e9);  // NVLink 4: 18 links x 25 GB/s per direction
  return p;
}

// Datasheet values. The host link is PCIe Gen5 x16 (64 GB/s nominal per direction) derated by
// the efficiency measured on H200 (55.4 / 64); the pinning rate is H200's measured one.
HardwareProfile B200() {
  HardwareProfile p;
  p.name = "b200";
  p.source = "datasheet";
  p.hbm_bytes = 183359ull * kMiB;  // 180 GB HBM3e as the driver reports it
  p.usable_fraction = 0.92;
  p.hbm_bytes_per_second = 8e12;
  p.dense_bf16_flops = 2.25e15;
  p.dense_fp32_flops = 75e12;  // HGX B200 datasheet: FP32 600 TFLOP/s per 8 GPUs
  p.d2h_bytes_per_second = 55.3e9;
  p.h2d_bytes_per_second = 55.5e9;
  p.bidir_d2h_bytes_per_second = 50.7e9;
  p.bidir_h2d_bytes_per_second = 51.9e9;
  p.pin_seconds_per_gib = 0.038;
  p.host_bytes_per_numa_node = 1024 * kGiB;  // DGX B200: 2 TiB, 2 sockets, 4 GPUs each
  p.gpus_per_numa_node = 4;
  HgxTopology(p, 900e9);  // NVLink 5: 18 links x 50 GB/s per direction
  return p;
}

// Datasheet values. Grace-Blackwell: the host link is NVLink-C2C (900 GB/s both directions);
// one Grace (480 GB LPDDR5X, one NUMA node) serves two GPUs.
HardwareProfile GB200() {
  HardwareProfile p;
  p.name = "gb200";
  p.source = "datasheet";
  p.hbm_bytes = 186ull * 1000 * 1000 * 1000;
  p.usable_fraction = 0.92;
  p.hbm_bytes_per_second = 8e12;
  p.dense_bf16_flops = 2.5e15;
  p.dense_fp32_flops = 90e12;  // GB200 NVL72 datasheet: FP32 6,480 TFLOP/s per 72 GPUs
  p.d2h_bytes_per_second = 450e9;
  p.h2d_bytes_per_second = 450e9;
  p.bidir_d2h_bytes_per_second = 450e9;
  p.bidir_h2d_bytes_per_second = 450e9;
  p.pin_seconds_per_gib = 0.038;
  p.host_bytes_per_numa_node = 480ull * 1000 * 1000 * 1000;
  p.gpus_per_numa_node = 2;
  // GB200 NVL72: one NVLink 5 domain of 72 GPUs (18 links x 50 GB/s per direction each) over 18
  // compute trays of 4 GPUs (2 superchips); one ConnectX-7 400 Gb/s NIC per GPU. Both GPUs of a
  // superchip copy into the one Grace's LPDDR5X, 512 GB/s at most (GB200 datasheet): two GPUs
  // copying at once get 256 GB/s each, below their 450 GB/s C2C links.
  p.nvlink_domain_gpus = 72;
  p.gpus_per_node = 4;
  p.nvlink_bytes_per_second = 900e9;
  p.nic_bytes_per_second = 50e9;
  p.gpus_per_nic = 1;
  p.gpus_per_host_link = 2;
  p.host_link_bytes_per_second = 512e9;
  return p;
}

// Note [Hardware limits]
// The range every hardware field must lie in, read or built: wide enough for any GPU and host
// of the next decade (1 PiB of HBM, 1 PB/s of bandwidth, 1e18 FLOP/s), narrow enough that the
// cost model's products of bytes, tokens and rates stay far from overflowing (docs/limits.md).
// One table serves the JSON reader (which names the field, its JSON path and the range) and
// ValidateHardwareProfile (presets and profiles built in code).
constexpr json::Range<uint64_t> kHbmBytes{1ull << 20, 1ull << 50};
constexpr json::Range<double> kFraction{1e-6, 1.0};
constexpr json::Range<double> kBytesPerSecond{1e3, 1e15};
constexpr json::Range<double> kFlops{1e6, 1e18};
constexpr json::Range<uint64_t> kChunkBytes{1, 1ull << 40};
constexpr json::Range<double> kPinSecondsPerGib{0, 1e3};
constexpr json::Range<uint64_t> kHostBytes{0, 1ull << 50};
constexpr json::Range<int> kGpusPerNumaNode{1, 1024};
// Tokens per expert at half the grouped-GEMM rate: 0 (no padding loss) to a million.
constexpr json::Range<double> kHalfTokens{0, 1e6};
// One kernel's fixed cost: 0 to 10 ms (a launch slower than that is a broken measurement).
constexpr json::Range<double> kKernelSeconds{0, 1e-2};
// Topology: a group of GPUs in one node, NIC or host link is at most 1024; an NVLink domain at
// most the largest world size (kMaxParallel, 2^20). Optional rates are 0 (absent) or a rate in
// kBytesPerSecond; latencies up to a second.
constexpr json::Range<int> kGpusPerGroup{1, 1024};
constexpr json::Range<int> kNvlinkDomainGpus{1, 1 << 20};
constexpr json::Range<double> kOptionalBytesPerSecond{0, 1e15};
constexpr json::Range<double> kLatencySeconds{0, 1};

template <typename T>
absl::Status InRange(const std::string& field, T value, json::Range<T> range) {
  if (value >= range.min && value <= range.max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("hardware profile: field '", field, "' is ", value,
                                                 "; allowed: [", range.min, ", ", range.max, "]"));
}

// The rates that may be 0 (absent): each 0 or within kBytesPerSecond.
std::vector<std::pair<const char*, double>> OptionalRates(const HardwareProfile& p) {
  return {{"nvlink_bytes_per_second", p.nvlink_bytes_per_second},
          {"nic_bytes_per_second", p.nic_bytes_per_second},
          {"all_to_all_bytes_per_second", p.all_to_all_bytes_per_second},
          {"all_gather_bytes_per_second", p.all_gather_bytes_per_second},
          {"reduce_scatter_bytes_per_second", p.reduce_scatter_bytes_per_second},
          {"host_link_bytes_per_second", p.host_link_bytes_per_second}};
}

absl::Status OptionalRate(const std::string& field, double value) {
  if (value == 0 || (value >= kBytesPerSecond.min && value <= kBytesPerSecond.max)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("hardware profile: field '", field, "' is ", value,
                                                 "; allowed: 0 (absent) or [", kBytesPerSecond.min,
                                                 ", ", kBytesPerSecond.max, "]"));
}

}  // namespace

uint64_t HardwareProfile::UsableBytes() const {
  return static_cast<uint64_t>(static_cast<double>(hbm_bytes) * usable_fraction);
}

uint64_t HardwareProfile::HostBytesPerGpu() const {
  return host_bytes_per_numa_node / static_cast<uint64_t>(std::max(1, gpus_per_numa_node));
}

uint64_t HardwareProfile::DefaultHostBudgetPerGpu() const {
  return static_cast<uint64_t>(static_cast<double>(HostBytesPerGpu()) * kDefaultHostPinnedShare);
}

double HardwareProfile::NetworkBytesPerSecond() const {
  return nic_bytes_per_second / std::max(1, gpus_per_nic);
}

double HardwareProfile::SharedHostLinkRate(double one_gpu_rate) const {
  if (host_link_bytes_per_second <= 0 || gpus_per_host_link <= 1) {
    return host_link_bytes_per_second > 0 ? std::min(one_gpu_rate, host_link_bytes_per_second)
                                          : one_gpu_rate;
  }
  return std::min(one_gpu_rate, host_link_bytes_per_second / gpus_per_host_link);
}

std::vector<std::string> HardwarePresetNames() { return {"h200", "h800", "b200", "gb200", "h100"}; }

absl::StatusOr<HardwareProfile> HardwarePreset(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (name == "h200") return H200();
  if (name == "h800") return H800();
  if (name == "h100") return H100();
  if (name == "b200") return B200();
  if (name == "gb200") return GB200();
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown hardware preset '", name, "'; allowed: ", absl::StrJoin(HardwarePresetNames(), ", "),
      ", or a profile .json file"));
}

absl::Status ValidateHardwareProfile(const HardwareProfile& p) {
  if (p.source != "measured" && p.source != "datasheet") {
    return absl::InvalidArgumentError(absl::StrCat("hardware profile: field 'source' is '",
                                                   p.source, "'; allowed: measured, datasheet"));
  }
  STOWAGE_RETURN_IF_ERROR(InRange("hbm_bytes", p.hbm_bytes, kHbmBytes));
  STOWAGE_RETURN_IF_ERROR(InRange("usable_fraction", p.usable_fraction, kFraction));
  STOWAGE_RETURN_IF_ERROR(InRange("gemm_efficiency", p.gemm_efficiency, kFraction));
  STOWAGE_RETURN_IF_ERROR(InRange("dense_fp32_flops", p.dense_fp32_flops, kFlops));
  STOWAGE_RETURN_IF_ERROR(InRange("fp32_gemm_efficiency", p.fp32_gemm_efficiency, kFraction));
  STOWAGE_RETURN_IF_ERROR(
      InRange("flash_forward_efficiency", p.flash_forward_efficiency, kFraction));
  STOWAGE_RETURN_IF_ERROR(
      InRange("flash_backward_efficiency", p.flash_backward_efficiency, kFraction));
  STOWAGE_RETURN_IF_ERROR(InRange("grouped_gemm_efficiency", p.grouped_gemm_efficiency, kFraction));
  STOWAGE_RETURN_IF_ERROR(
      InRange("grouped_gemm_half_tokens", p.grouped_gemm_half_tokens, kHalfTokens));
  STOWAGE_RETURN_IF_ERROR(
      InRange("torch_grouped_mm_efficiency", p.torch_grouped_mm_efficiency, kFraction));
  STOWAGE_RETURN_IF_ERROR(
      InRange("torch_grouped_mm_half_tokens", p.torch_grouped_mm_half_tokens, kHalfTokens));
  STOWAGE_RETURN_IF_ERROR(InRange("elementwise_efficiency", p.elementwise_efficiency, kFraction));
  STOWAGE_RETURN_IF_ERROR(InRange("kernel_seconds", p.kernel_seconds, kKernelSeconds));
  STOWAGE_RETURN_IF_ERROR(InRange("hbm_bytes_per_second", p.hbm_bytes_per_second, kBytesPerSecond));
  STOWAGE_RETURN_IF_ERROR(InRange("dense_bf16_flops", p.dense_bf16_flops, kFlops));
  STOWAGE_RETURN_IF_ERROR(InRange("d2h_bytes_per_second", p.d2h_bytes_per_second, kBytesPerSecond));
  STOWAGE_RETURN_IF_ERROR(InRange("h2d_bytes_per_second", p.h2d_bytes_per_second, kBytesPerSecond));
  STOWAGE_RETURN_IF_ERROR(
      InRange("bidir_d2h_bytes_per_second", p.bidir_d2h_bytes_per_second, kBytesPerSecond));
  STOWAGE_RETURN_IF_ERROR(
      InRange("bidir_h2d_bytes_per_second", p.bidir_h2d_bytes_per_second, kBytesPerSecond));
  STOWAGE_RETURN_IF_ERROR(InRange("pin_seconds_per_gib", p.pin_seconds_per_gib, kPinSecondsPerGib));
  STOWAGE_RETURN_IF_ERROR(
      InRange("host_bytes_per_numa_node", p.host_bytes_per_numa_node, kHostBytes));
  STOWAGE_RETURN_IF_ERROR(InRange("gpus_per_numa_node", p.gpus_per_numa_node, kGpusPerNumaNode));
  STOWAGE_RETURN_IF_ERROR(InRange("nvlink_domain_gpus", p.nvlink_domain_gpus, kNvlinkDomainGpus));
  STOWAGE_RETURN_IF_ERROR(InRange("gpus_per_node", p.gpus_per_node, kGpusPerGroup));
  STOWAGE_RETURN_IF_ERROR(InRange("gpus_per_nic", p.gpus_per_nic, kGpusPerGroup));
  STOWAGE_RETURN_IF_ERROR(InRange("gpus_per_host_link", p.gpus_per_host_link, kGpusPerGroup));
  for (auto [field, rate] : OptionalRates(p)) {
    STOWAGE_RETURN_IF_ERROR(OptionalRate(field, rate));
  }
  STOWAGE_RETURN_IF_ERROR(
      InRange("nvlink_latency_seconds", p.nvlink_latency_seconds, kLatencySeconds));
  STOWAGE_RETURN_IF_ERROR(
      InRange("network_latency_seconds", p.network_latency_seconds, kLatencySeconds));
  for (size_t i = 0; i < p.chunk_bandwidth.size(); ++i) {
    const ChunkBandwidth& c = p.chunk_bandwidth[i];
    const std::string at = absl::StrCat("chunk_bandwidth[", i, "].");
    STOWAGE_RETURN_IF_ERROR(InRange(at + "chunk_bytes", c.chunk_bytes, kChunkBytes));
    STOWAGE_RETURN_IF_ERROR(
        InRange(at + "d2h_bytes_per_second", c.d2h_bytes_per_second, kBytesPerSecond));
    STOWAGE_RETURN_IF_ERROR(
        InRange(at + "h2d_bytes_per_second", c.h2d_bytes_per_second, kBytesPerSecond));
    if (i > 0 && c.chunk_bytes <= p.chunk_bandwidth[i - 1].chunk_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("hardware profile: chunk_bandwidth[", i,
                                                     "].chunk_bytes is ", c.chunk_bytes,
                                                     "; entries must be in ascending chunk_bytes"));
    }
  }
  return absl::OkStatus();
}

std::string HardwareProfileToJson(const HardwareProfile& p) {
  ordered_json j;
  j["name"] = p.name;
  j["source"] = p.source;
  j["hbm_bytes"] = p.hbm_bytes;
  j["usable_fraction"] = p.usable_fraction;
  j["hbm_bytes_per_second"] = p.hbm_bytes_per_second;
  j["dense_bf16_flops"] = p.dense_bf16_flops;
  j["gemm_efficiency"] = p.gemm_efficiency;
  j["dense_fp32_flops"] = p.dense_fp32_flops;
  j["fp32_gemm_efficiency"] = p.fp32_gemm_efficiency;
  j["flash_forward_efficiency"] = p.flash_forward_efficiency;
  j["flash_backward_efficiency"] = p.flash_backward_efficiency;
  j["grouped_gemm_efficiency"] = p.grouped_gemm_efficiency;
  j["grouped_gemm_half_tokens"] = p.grouped_gemm_half_tokens;
  j["torch_grouped_mm_efficiency"] = p.torch_grouped_mm_efficiency;
  j["torch_grouped_mm_half_tokens"] = p.torch_grouped_mm_half_tokens;
  j["elementwise_efficiency"] = p.elementwise_efficiency;
  j["kernel_seconds"] = p.kernel_seconds;
  j["d2h_bytes_per_second"] = p.d2h_bytes_per_second;
  j["h2d_bytes_per_second"] = p.h2d_bytes_per_second;
  j["bidir_d2h_bytes_per_second"] = p.bidir_d2h_bytes_per_second;
  j["bidir_h2d_bytes_per_second"] = p.bidir_h2d_bytes_per_second;
  ordered_json chunks = ordered_json::array();
  for (const ChunkBandwidth& c : p.chunk_bandwidth) {
    chunks.push_back({{"chunk_bytes", c.chunk_bytes},
                      {"d2h_bytes_per_second", c.d2h_bytes_per_second},
                      {"h2d_bytes_per_second", c.h2d_bytes_per_second}});
  }
  j["chunk_bandwidth"] = std::move(chunks);
  j["pin_seconds_per_gib"] = p.pin_seconds_per_gib;
  j["host_bytes_per_numa_node"] = p.host_bytes_per_numa_node;
  j["gpus_per_numa_node"] = p.gpus_per_numa_node;
  j["nvlink_domain_gpus"] = p.nvlink_domain_gpus;
  j["gpus_per_node"] = p.gpus_per_node;
  j["nvlink_bytes_per_second"] = p.nvlink_bytes_per_second;
  j["nvlink_latency_seconds"] = p.nvlink_latency_seconds;
  j["nic_bytes_per_second"] = p.nic_bytes_per_second;
  j["gpus_per_nic"] = p.gpus_per_nic;
  j["network_latency_seconds"] = p.network_latency_seconds;
  j["all_to_all_bytes_per_second"] = p.all_to_all_bytes_per_second;
  j["all_gather_bytes_per_second"] = p.all_gather_bytes_per_second;
  j["reduce_scatter_bytes_per_second"] = p.reduce_scatter_bytes_per_second;
  j["gpus_per_host_link"] = p.gpus_per_host_link;
  j["host_link_bytes_per_second"] = p.host_link_bytes_per_second;
  return j.dump(2) + "\n";
}

absl::StatusOr<HardwareProfile> ParseHardwareProfileJson(const std::string& text,
                                                         const std::string& source) {
  absl::StatusOr<json::Json> parsed = json::Parse(text, source);
  if (!parsed.ok()) return parsed.status();
  absl::StatusOr<json::Object> root = json::Object::Of(*parsed, source);
  if (!root.ok()) return root.status();
  const json::Object& j = *root;
  HardwareProfile p;
  p.source = "measured";
  STOWAGE_RETURN_IF_ERROR(j.ReadOptional("name", p.name));
  STOWAGE_RETURN_IF_ERROR(j.ReadOptional("source", p.source));
  if (p.source != "measured" && p.source != "datasheet") {
    return j.Invalid("source", "measured, datasheet");
  }
  STOWAGE_RETURN_IF_ERROR(j.Read("hbm_bytes", p.hbm_bytes, kHbmBytes));
  STOWAGE_RETURN_IF_ERROR(j.ReadOptional("usable_fraction", p.usable_fraction, kFraction));
  STOWAGE_RETURN_IF_ERROR(j.Read("hbm_bytes_per_second", p.hbm_bytes_per_second, kBytesPerSecond));
  STOWAGE_RETURN_IF_ERROR(j.Read("dense_bf16_flops", p.dense_bf16_flops, kFlops));
  // One name per rate: a profile written before the per-op-class rates says which field to use.
  if (j.Has("matmul_efficiency")) {
    return j.Invalid("matmul_efficiency",
                     "absent: it is now gemm_efficiency (planner/hardware/op_time.h)");
  }
  STOWAGE_RETURN_IF_ERROR(j.ReadOptional("gemm_efficiency", p.gemm_efficiency, kFraction));
  STOWAGE_RETURN_IF_ERROR(j.ReadOptional("dense_fp32_flops", p.dense_fp32_flops, kFlops));
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("fp32_gemm_efficiency", p.fp32_gemm_efficiency, kFraction));
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("flash_forward_efficiency", p.flash_forward_efficiency, kFraction));
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("flash_backward_efficiency", p.flash_backward_efficiency, kFraction));
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("grouped_gemm_efficiency", p.grouped_gemm_efficiency, kFraction));
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("grouped_gemm_half_tokens", p.grouped_gemm_half_tokens, kHalfTokens));
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("torch_grouped_mm_efficiency", p.torch_grouped_mm_efficiency, kFraction));
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("torch_grouped_mm_half_tokens", p.torch_grouped_mm_half_tokens, kHalfTokens));
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("elementwise_efficiency", p.elementwise_efficiency, kFraction));
  STOWAGE_RETURN_IF_ERROR(j.ReadOptional("kernel_seconds", p.kernel_seconds, kKernelSeconds));
  STOWAGE_RETURN_IF_ERROR(j.Read("d2h_bytes_per_second", p.d2h_bytes_per_second, kBytesPerSecond));
  STOWAGE_RETURN_IF_ERROR(j.Read("h2d_bytes_per_second", p.h2d_bytes_per_second, kBytesPerSecond));
  p.bidir_d2h_bytes_per_second = p.d2h_bytes_per_second;
  p.bidir_h2d_bytes_per_second = p.h2d_bytes_per_second;
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("bidir_d2h_bytes_per_second", p.bidir_d2h_bytes_per_second, kBytesPerSecond));
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("bidir_h2d_bytes_per_second", p.bidir_h2d_bytes_per_second, kBytesPerSecond));
  if (j.Has("chunk_bandwidth") && !j.json().at("chunk_bandwidth").is_null()) {
    absl::StatusOr<const json::Json*> chunks = j.Array("chunk_bandwidth");
    if (!chunks.ok()) return chunks.status();
    // A table longer than any real sweep (each entry a chunk size) is a broken file.
    if ((*chunks)->size() > 64)
      return j.Invalid("chunk_bandwidth", "an array of at most 64 entries");
    for (size_t i = 0; i < (*chunks)->size(); ++i) {
      absl::StatusOr<json::Object> e = json::Object::Of(
          (**chunks)[i], source, absl::StrCat(j.PathOf("chunk_bandwidth"), "[", i, "]"));
      if (!e.ok()) return e.status();
      ChunkBandwidth c;
      STOWAGE_RETURN_IF_ERROR(e->Read("chunk_bytes", c.chunk_bytes, kChunkBytes));
      STOWAGE_RETURN_IF_ERROR(
          e->Read("d2h_bytes_per_second", c.d2h_bytes_per_second, kBytesPerSecond));
      STOWAGE_RETURN_IF_ERROR(
          e->Read("h2d_bytes_per_second", c.h2d_bytes_per_second, kBytesPerSecond));
      if (i > 0 && c.chunk_bytes <= p.chunk_bandwidth.back().chunk_bytes) {
        return e->Invalid("chunk_bytes", absl::StrCat("more than the previous entry's ",
                                                      p.chunk_bandwidth.back().chunk_bytes,
                                                      " (entries ascend by chunk_bytes)"));
      }
      p.chunk_bandwidth.push_back(c);
    }
  }
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("pin_seconds_per_gib", p.pin_seconds_per_gib, kPinSecondsPerGib));
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("host_bytes_per_numa_node", p.host_bytes_per_numa_node, kHostBytes));
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("gpus_per_numa_node", p.gpus_per_numa_node, kGpusPerNumaNode));
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("nvlink_domain_gpus", p.nvlink_domain_gpus, kNvlinkDomainGpus));
  STOWAGE_RETURN_IF_ERROR(j.ReadOptional("gpus_per_node", p.gpus_per_node, kGpusPerGroup));
  STOWAGE_RETURN_IF_ERROR(j.ReadOptional("gpus_per_nic", p.gpus_per_nic, kGpusPerGroup));
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("gpus_per_host_link", p.gpus_per_host_link, kGpusPerGroup));
  for (auto [field, rate] :
       {std::pair<const char*, double*>{"nvlink_bytes_per_second", &p.nvlink_bytes_per_second},
        {"nic_bytes_per_second", &p.nic_bytes_per_second},
        {"all_to_all_bytes_per_second", &p.all_to_all_bytes_per_second},
        {"all_gather_bytes_per_second", &p.all_gather_bytes_per_second},
        {"reduce_scatter_bytes_per_second", &p.reduce_scatter_bytes_per_second},
        {"host_link_bytes_per_second", &p.host_link_bytes_per_second}}) {
    STOWAGE_RETURN_IF_ERROR(j.ReadOptional(field, *rate, kOptionalBytesPerSecond));
    if (*rate != 0 && *rate < kBytesPerSecond.min) {
      return j.Invalid(field, absl::StrCat("0 (absent) or [", kBytesPerSecond.min, ", ",
                                           kBytesPerSecond.max, "]"));
    }
  }
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("nvlink_latency_seconds", p.nvlink_latency_seconds, kLatencySeconds));
  STOWAGE_RETURN_IF_ERROR(
      j.ReadOptional("network_latency_seconds", p.network_latency_seconds, kLatencySeconds));
  STOWAGE_RETURN_IF_ERROR(ValidateHardwareProfile(p));
  return p;
}

absl::StatusOr<HardwareProfile> ReadHardwareProfileFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open hardware profile '", path, "'"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto profile = ParseHardwareProfileJson(buffer.str(), absl::StrCat("hardware profile ", path));
  if (!profile.ok()) return profile.status();
  if (profile->name.empty()) profile->name = path;
  return profile;
}

absl::StatusOr<SaturatingRate> FitSaturatingRate(
    const std::vector<std::pair<double, double>>& points) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [t, rate] : points) {
    if (!(t > 0) || !(rate > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("saturating fit: point (", t, ", ", rate,
                                                     "): tokens per expert and rate must be > 0"));
    }
    const double x = 1.0 / t, y = 1.0 / rate;
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double n = static_cast<double>(points.size());
  const double spread = n * sxx - sx * sx;
  if (points.size() < 2 || !(spread > 1e-12 * n * sxx)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "saturating fit: ", points.size(), " point(s); needs two distinct tokens per expert"));
  }
  const double slope = (n * sxy - sx * sy) / spread;
  const double intercept = (sy - slope * sx) / n;
  if (!(intercept > 0) || slope < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("saturating fit: the rate does not rise to a limit with tokens per expert "
                     "(1/R = ",
                     intercept, ", half/R = ", slope, ")"));
  }
  return SaturatingRate{.flops_per_second = 1.0 / intercept, .half_tokens = slope / intercept};
}

absl::StatusOr<std::string> ApplyTorchGroupedMmRates(const std::string& text,
                                                     const std::string& source,
                                                     HardwareProfile& profile) {
  absl::StatusOr<json::Json> parsed = json::Parse(text, source);
  if (!parsed.ok()) return parsed.status();
  absl::StatusOr<json::Object> root = json::Object::Of(*parsed, source);
  if (!root.ok()) return root.status();
  std::string kernel;
  STOWAGE_RETURN_IF_ERROR(root->Read("kernel", kernel));
  if (kernel != "torch._grouped_mm") return root->Invalid("kernel", "\"torch._grouped_mm\"");
  absl::StatusOr<const json::Json*> array = root->Array("points");
  if (!array.ok()) return array.status();
  if ((*array)->size() > 64) return root->Invalid("points", "an array of at most 64 entries");
  std::vector<std::pair<double, double>> routed;
  for (size_t i = 0; i < (*array)->size(); ++i) {
    absl::StatusOr<json::Object> e =
        json::Object::Of((**array)[i], source, absl::StrCat(root->PathOf("points"), "[", i, "]"));
    if (!e.ok()) return e.status();
    std::string routing;
    double rows = 0, rate = 0;
    STOWAGE_RETURN_IF_ERROR(e->Read("routing", routing));
    if (routing != "routed" && routing != "aligned") {
      return e->Invalid("routing", "\"routed\" or \"aligned\"");
    }
    STOWAGE_RETURN_IF_ERROR(e->Read("rows_per_expert", rows, json::Range<double>{1, 1e6}));
    STOWAGE_RETURN_IF_ERROR(e->Read("flops_per_second", rate, kFlops));
    // Routed counts are what a training step has (Note [torch._grouped_mm rate]); aligned ones
    // are the public benchmark's "uniform" case, shown but not fitted.
    if (routing == "routed") routed.emplace_back(rows, rate);
  }
  if (routed.empty()) {
    return root->Invalid("points", "at least one entry with \"routing\": \"routed\"");
  }
  double share = 0, half = profile.torch_grouped_mm_half_tokens;
  if (routed.size() == 1) {
    const auto [t, rate] = routed[0];
    share = rate / profile.dense_bf16_flops * (t + half) / t;
  } else {
    absl::StatusOr<SaturatingRate> fit = FitSaturatingRate(routed);
    if (!fit.ok()) {
      return absl::Status(fit.status().code(), absl::StrCat(source, ": ", fit.status().message()));
    }
    share = fit->flops_per_second / profile.dense_bf16_flops;
    half = std::min(kHalfTokens.max, fit->half_tokens);
  }
  profile.torch_grouped_mm_efficiency = std::clamp(share, kFraction.min, kFraction.max);
  profile.torch_grouped_mm_half_tokens = half;
  return absl::StrFormat(
      "torch._grouped_mm: %.3f share, half of it at %.0f rows/expert (%zu routed point%s; %.0f "
      "TFLOP/s at 512)",
      profile.torch_grouped_mm_efficiency, half, routed.size(), routed.size() == 1 ? "" : "s",
      profile.dense_bf16_flops * profile.torch_grouped_mm_efficiency * 512 / (512 + half) / 1e12);
}

}  // namespace stowage::planner
