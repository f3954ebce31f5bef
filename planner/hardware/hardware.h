// Hardware profiles: what the planner needs to know about one GPU and the host it hangs off.
// Presets for H200 (measured, see docs/hardware.md), H100, H800, B200 and GB200 (datasheet values),
// or a JSON profile file — the format `stowage calibrate` writes with HardwareProfileToJson.
#ifndef STOWAGE_PLANNER_HARDWARE_H_
#define STOWAGE_PLANNER_HARDWARE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace stowage::planner {

// Host-link bandwidth measured at one copy size (pinned memory). Small chunks run slower; the
// copy engine's chunk size is picked from this table.
struct ChunkBandwidth {
  uint64_t chunk_bytes = 0;
  double d2h_bytes_per_second = 0;
  double h2d_bytes_per_second = 0;
};

// Share of each GPU's host RAM a plan may pin by default. Pinned pages cannot be swapped or
// reclaimed, and the node also runs the OS and page cache, the data-loader workers, the trainer's
// own CPU memory (Python, the NCCL and gloo buffers, checkpoint staging): a fifth stays free for
// them. `--host-mem` (or the request's host_budget_bytes) sets any other budget; the runtime's
// admission then checks what is really free (offload/host_memory.h).
inline constexpr double kDefaultHostPinnedShare = 0.8;

struct HardwareProfile {
  std::string name;                  // e.g. "h200"
  std::string source = "datasheet";  // "measured" (probe or `stowage calibrate`) or "datasheet"
  uint64_t hbm_bytes = 0;            // device memory the driver reports
  double usable_fraction = 0.92;     // share of hbm_bytes a training process can plan with
  double hbm_bytes_per_second = 0;
  double dense_bf16_flops = 0;  // peak dense bf16 tensor-core rate, FLOP/s
  // Peak FP32 rate of the CUDA cores (non-tensor FMAs), FLOP/s: where an fp32 matmul runs under
  // torch's default precision (no TF32). Default: H100/H200 SXM's datasheet 67 TFLOP/s (Note
  // [Op rates] in hardware.cc); each preset states its own.
  double dense_fp32_flops = 67e12;
  // Per-op-class rates, the ones planner/hardware/op_time.h turns work into seconds with
  // (Note [Op time] in op_time.cc; each preset says where its figures come from;
  // `stowage calibrate` measures them): the share of dense_bf16_flops large dense GEMMs reach; the
  // shares a fused causal attention kernel reaches forward and backward; the share grouped expert
  // GEMMs (TE's, under megatron) reach with many tokens per expert and the tokens per expert at
  // which they reach half of it; the share of hbm_bytes_per_second memory-bound kernels reach; and
  // the time one kernel costs however little it does.
  // Defaults (the presets', and a JSON profile's that omits a field): derived for H200 in
  // Note [Op rates] (hardware.cc), with elementwise_efficiency relative to a datasheet HBM rate;
  // the flash shares are cuDNN's on H100 from the FlashAttention-3 paper, which the H200, H100 and
  // H800 presets replace with cuDNN 9.19's on H200 (Note [SDPA on sm90]).
  double gemm_efficiency = 746.0 / 989.0;
  // The share of dense_fp32_flops fp32 GEMMs reach (OpWork::fp32_gemm_flops): gemm_efficiency's
  // default applied, unmeasured on these GPUs (Note [Op rates]); `stowage calibrate` times it.
  double fp32_gemm_efficiency = 746.0 / 989.0;
  double flash_forward_efficiency = 539.0 / 989.0;
  double flash_backward_efficiency = 516.0 / 989.0;
  double grouped_gemm_efficiency = 746.0 / 989.0;
  double grouped_gemm_half_tokens = 64;
  // torch._grouped_mm, which transformers' grouped_mm experts run under --framework hf, is its
  // own kernel (CUTLASS sm90 ptr-array, not TE's cuBLAS grouped GEMM), so it has its own share
  // and half-rate point, same saturating form; the default is derived from a public H100
  // measurement in Note [torch._grouped_mm rate] (hardware.cc).
  double torch_grouped_mm_efficiency = 480.5 / 989.0 / (512.0 / (512.0 + 64.0));
  double torch_grouped_mm_half_tokens = 64;
  double elementwise_efficiency = 3930.0 / 4800.0;
  double kernel_seconds = 3e-6;
  // Pinned host link, large chunks, one direction at a time.
  double d2h_bytes_per_second = 0;
  double h2d_bytes_per_second = 0;
  // Per direction when both directions run at once.
  double bidir_d2h_bytes_per_second = 0;
  double bidir_h2d_bytes_per_second = 0;
  std::vector<ChunkBandwidth> chunk_bandwidth;  // optional, ascending chunk_bytes
  double pin_seconds_per_gib = 0;               // cudaHostRegister of pre-touched memory
  uint64_t host_bytes_per_numa_node = 0;
  int gpus_per_numa_node = 1;

  // Topology (Note [Topology] in hardware.cc; planner/cost/communication.h reads it). Rates are per
  // GPU and per direction; latencies are NCCL's per-hop figures.
  int nvlink_domain_gpus = 1;          // GPUs one NVLink/NVSwitch fabric joins (an NVL72 rack: 72)
  int gpus_per_node = 1;               // GPUs in one host (one OS, one host RAM)
  double nvlink_bytes_per_second = 0;  // per GPU into the NVLink fabric; 0: no NVLink
  double nvlink_latency_seconds = 3.4e-6;
  double nic_bytes_per_second = 0;  // one NIC's line rate, shared by gpus_per_nic GPUs
  int gpus_per_nic = 1;
  double network_latency_seconds = 14e-6;
  // Bus bandwidth NCCL reaches among one node's GPUs (nccl-tests' busBw), written by `stowage
  // calibrate`; 0: not measured, nvlink_bytes_per_second is used.
  double all_to_all_bytes_per_second = 0;
  double all_gather_bytes_per_second = 0;
  double reduce_scatter_bytes_per_second = 0;
  // The host link several GPUs share (a PCIe switch's uplink, or the memory of the CPU a
  // Grace-Blackwell pair hangs off): its capacity per direction and how many GPUs share it.
  // 0: no shared limit beyond each GPU's own link.
  int gpus_per_host_link = 1;
  double host_link_bytes_per_second = 0;

  // hbm_bytes * usable_fraction: the default GPU memory budget.
  uint64_t UsableBytes() const;
  // Host RAM one GPU may use when the GPUs of a NUMA node share it evenly.
  uint64_t HostBytesPerGpu() const;
  // The pinned host budget a plan gets when none is given: kDefaultHostPinnedShare of
  // HostBytesPerGpu(), so the rest of the node's RAM stays for what else runs there.
  uint64_t DefaultHostBudgetPerGpu() const;
  // Per-GPU network rate: nic_bytes_per_second / gpus_per_nic.
  double NetworkBytesPerSecond() const;
  // The host-link rate one GPU gets when every GPU of its node copies at once (all ranks of a
  // node run the same schedule): `one_gpu_rate` capped by host_link_bytes_per_second /
  // gpus_per_host_link.
  double SharedHostLinkRate(double one_gpu_rate) const;
};

// Names accepted by HardwarePreset, in the order --help lists them.
std::vector<std::string> HardwarePresetNames();
// "h200", "h800", "b200", "gb200" (case-insensitive). Unknown names list the allowed ones.
absl::StatusOr<HardwareProfile> HardwarePreset(std::string name);

// Checks ranges (positive rates, fraction in (0, 1], ...); errors name the field and the value.
absl::Status ValidateHardwareProfile(const HardwareProfile& profile);

// Pretty-printed JSON, stable field order; ParseHardwareProfileJson reads it back exactly.
std::string HardwareProfileToJson(const HardwareProfile& profile);
// Required: hbm_bytes, hbm_bytes_per_second, dense_bf16_flops, d2h_bytes_per_second,
// h2d_bytes_per_second. The bidirectional rates default to the one-way rates, the rest to the
// defaults above. Read with base/json_reader.h: integers only where integers are meant, every
// field range-checked (Note [Hardware limits] in hardware.cc; docs/limits.md). Errors name
// `source`, the JSON path, the value and the allowed range.
absl::StatusOr<HardwareProfile> ParseHardwareProfileJson(
    const std::string& json, const std::string& source = "hardware profile");
absl::StatusOr<HardwareProfile> ReadHardwareProfileFile(const std::string& path);

// A saturating rate R * t / (t + half) (Note [Op time]) through measured (tokens per expert,
// FLOP/s) points: least squares of 1 / rate = 1 / R + (half / R) / t. `stowage calibrate` fits
// both grouped-GEMM classes with it. Needs two distinct t and points that rise with t (R > 0,
// half >= 0); the error says which.
struct SaturatingRate {
  double flops_per_second = 0;  // R
  double half_tokens = 0;
};
absl::StatusOr<SaturatingRate> FitSaturatingRate(
    const std::vector<std::pair<double, double>>& points);

// Folds what bench/bench_grouped_mm.py measured (its --out JSON: torch._grouped_mm over the six
// passes of an MoE layer at several rows per expert) into `profile`: its routed points, fitted
// by FitSaturatingRate, give torch_grouped_mm_efficiency (a share of profile.dense_bf16_flops,
// at most 1) and torch_grouped_mm_half_tokens; one routed point gives the efficiency at the
// profile's half. Read with base/json_reader.h: errors name `source`, the JSON path, the value
// and the allowed range. Returns a line for calibrate's table.
absl::StatusOr<std::string> ApplyTorchGroupedMmRates(const std::string& json,
                                                     const std::string& source,
                                                     HardwareProfile& profile);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_HARDWARE_H_
