// `stowage calibrate`: measures this machine's host link and pinning cost for one GPU and the
// GPU's per-op-class rates (planner/hardware/op_time.h), and writes the hardware profile the
// planner reads (planner/hardware/hardware.h). What it cannot measure (peak FLOP/s, the fused
// attention rates) comes from the --base preset.
//
// Compute (calibrate_compute.cc, Note [Calibrated op rates]): cuBLAS bf16 GEMMs at training
// shapes (gemm_efficiency of the preset's dense_bf16_flops), fp32 GEMMs without TF32
// (fp32_gemm_efficiency of its dense_fp32_flops), strided-batched GEMMs over 64 experts at several
// tokens per expert (grouped_gemm_efficiency and grouped_gemm_half_tokens, fitted to
// rate = R * t / (t + half)), a 16-byte stream copy (elementwise_efficiency), and empty kernels
// back to back (kernel_seconds). torch._grouped_mm, the hf experts' kernel, is another
// kernel than the cuBLAS GEMMs timed here: --torch-grouped-mm folds in what
// bench/bench_grouped_mm.py measured of it (torch_grouped_mm_efficiency, _half_tokens).
//
// Measured: pinned D2H / H2D bandwidth by chunk size (into the pinned NUMA-local arena, the
// memory the runtime copies into), both directions at once, pageable bandwidth, arena setup
// (mmap + THP + parallel touch + cudaHostRegister) against cudaMallocHost of the same size, and
// the NUMA placement: the GPU's node, the arena's binding and, on machines with several nodes,
// the bandwidth to memory on another node. With several local GPUs: the host link with every
// GPU copying at once (what each gets when all ranks of a node run one schedule), and NCCL's
// all-to-all, all-gather and reduce-scatter bus bandwidth among them (when built with NCCL),
// written into the topology fields the communication model reads (planner/cost/communication.h).
// All GB/s are 1e9 bytes per second.
//
// This file holds the command: its flags, the --base preset and --torch-grouped-mm, the exit
// codes and where the profile goes. The measurements: calibrate_measure.cc (the run, the pinning
// rate and the copy bandwidth), calibrate_compute.cc (the op rates), calibrate_node.cc (the
// node's GPUs together: the shared host link and NCCL), calibrate_copies.cc (timed copies).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/bytes.h"
#include "cli/calibrate.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "planner/hardware/hardware.h"

#ifdef STOWAGE_HAVE_CUDA
#include "offload/cuda/cuda_host.h"
#endif

namespace stowage::tools {
namespace {

using calibrate::CalibrateSettings;

cli::FlagParser MakeParser() {
  cli::FlagParser parser(
      "stowage calibrate [flags]",
      "Measures this machine: pinned D2H/H2D/bidirectional bandwidth by chunk size, pageable\n"
      "bandwidth, pinning rate (arena setup vs cudaMallocHost) and NUMA placement, then\n"
      "writes the hardware profile the planner reads. Fields it cannot measure (FLOP/s, HBM\n"
      "bandwidth) come from --base. With --out the table goes to stdout; without, the table\n"
      "goes to stderr and the profile JSON to stdout. Exits 3 without a GPU.");
  parser.Add({"device", "N", "CUDA device to measure", "0"});
  parser.Add({"base", "PRESET", "preset for the fields calibrate cannot measure", "h200"});
  parser.Add({"out", "PATH", "write the profile JSON here", ""});
  parser.Add({"min-chunk", "SIZE", "smallest copy chunk measured (K/M/G suffixes)", "256K"});
  parser.Add({"max-chunk", "SIZE", "largest copy chunk measured", "256M"});
  parser.Add({"setup-bytes", "SIZE", "arena size for the setup and pinning-rate comparison", "4G"});
  parser.Add({"skip-malloc-host", "", "do not time cudaMallocHost (it is slow: ~0.4 s/GiB)", ""});
  parser.Add(
      {"compute-only", "", "measure only the compute rates; host-link fields from --base", ""});
  parser.Add({"torch-grouped-mm", "PATH",
              "torch._grouped_mm rates bench/bench_grouped_mm.py measured (its --out JSON), "
              "written into torch_grouped_mm_efficiency / _half_tokens",
              ""});
  return parser;
}

absl::StatusOr<CalibrateSettings> ParseSettings(const cli::FlagParser& parser) {
  CalibrateSettings s;
  absl::StatusOr<int64_t> device = parser.GetInt("device", 0, 0, 1023);
  if (!device.ok()) return device.status();
  s.device = static_cast<int>(*device);
  absl::StatusOr<std::string> base = parser.GetString("base", s.base);
  if (!base.ok()) return base.status();
  s.base = *base;
  absl::StatusOr<std::string> out = parser.GetString("out", "");
  if (!out.ok()) return out.status();
  s.out = *out;
  absl::StatusOr<uint64_t> min_chunk = parser.GetCount("min-chunk", s.min_chunk);
  if (!min_chunk.ok()) return min_chunk.status();
  absl::StatusOr<uint64_t> max_chunk = parser.GetCount("max-chunk", s.max_chunk);
  if (!max_chunk.ok()) return max_chunk.status();
  absl::StatusOr<uint64_t> setup = parser.GetCount("setup-bytes", s.setup_bytes);
  if (!setup.ok()) return setup.status();
  s.min_chunk = *min_chunk;
  s.max_chunk = *max_chunk;
  s.setup_bytes = *setup;
  if (s.min_chunk < 4096 || s.max_chunk < s.min_chunk || s.max_chunk > 4 * kGiB) {
    return absl::InvalidArgumentError(absl::StrCat("--min-chunk ", s.min_chunk, " and --max-chunk ",
                                                   s.max_chunk,
                                                   ": need 4096 <= min-chunk <= max-chunk <= 4G"));
  }
  if (s.setup_bytes < 2 * s.max_chunk) {
    return absl::InvalidArgumentError(absl::StrCat("--setup-bytes ", s.setup_bytes,
                                                   " must hold two max chunks (", 2 * s.max_chunk,
                                                   " bytes)"));
  }
  s.skip_malloc_host = parser.GetBool("skip-malloc-host");
  s.compute_only = parser.GetBool("compute-only");
  absl::StatusOr<std::string> torch_grouped_mm = parser.GetString("torch-grouped-mm", "");
  if (!torch_grouped_mm.ok()) return torch_grouped_mm.status();
  s.torch_grouped_mm = *torch_grouped_mm;
  if (!s.torch_grouped_mm.empty()) {
    // Read (and checked below) before any measuring, so a bad file costs no GPU time.
    std::ifstream in(s.torch_grouped_mm, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("--torch-grouped-mm: cannot open '", s.torch_grouped_mm, "'"));
    }
    std::stringstream text;
    text << in.rdbuf();
    s.torch_grouped_mm_json = text.str();
  }
  return s;
}

#ifdef STOWAGE_HAVE_CUDA

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

#endif  // STOWAGE_HAVE_CUDA

}  // namespace

int RunCalibrateCommand(int argc, char** argv) {
  cli::FlagParser parser = MakeParser();
  if (absl::Status status = parser.Parse(argc, argv, 1); !status.ok()) {
    std::fprintf(stderr, "stowage calibrate: %s\n", std::string(status.message()).c_str());
    return kExitUsage;
  }
  if (parser.help_requested()) {
    std::fputs(parser.Help().c_str(), stdout);
    return kExitOk;
  }
  absl::StatusOr<CalibrateSettings> settings = ParseSettings(parser);
  if (!settings.ok()) {
    std::fprintf(stderr, "stowage calibrate: %s\n",
                 std::string(settings.status().message()).c_str());
    return kExitUsage;
  }
  absl::StatusOr<planner::HardwareProfile> base = planner::HardwarePreset(settings->base);
  if (!base.ok()) {
    std::fprintf(stderr, "stowage calibrate: --base: %s\n",
                 std::string(base.status().message()).c_str());
    return kExitUsage;
  }
  std::string torch_grouped_mm_line;
  if (!settings->torch_grouped_mm.empty()) {
    absl::StatusOr<std::string> line = planner::ApplyTorchGroupedMmRates(
        settings->torch_grouped_mm_json,
        absl::StrCat("--torch-grouped-mm ", settings->torch_grouped_mm), *base);
    if (!line.ok()) {
      std::fprintf(stderr, "stowage calibrate: %s\n", std::string(line.status().message()).c_str());
      return kExitUsage;
    }
    torch_grouped_mm_line = *line;
  }
#ifndef STOWAGE_HAVE_CUDA
  std::fprintf(
      stderr,
      "stowage calibrate: no GPU: this stowage was built without the CUDA backend, and "
      "calibrate measures a GPU's host link and compute rates. Plan with a hardware "
      "preset instead (e.g. %s), whose compute rates are derived from datasheets and "
      "the H200 probe (hardware.cc Note [Op rates]) and whose link and communication fields are "
      "datasheet values.\n",
      settings->base.c_str());
  return kExitUnavailable;
#else
  if (absl::Status status = offload::CudaCheckDevice(settings->device); !status.ok()) {
    std::fprintf(
        stderr,
        "stowage calibrate: no GPU: CUDA device %d is not usable (%s). calibrate "
        "measures a GPU's host link and compute rates; plan with a hardware preset "
        "instead (e.g. %s), whose compute rates are derived from datasheets and the "
        "H200 probe (hardware.cc Note [Op rates]) and whose link and communication fields are "
        "datasheet values.\n",
        settings->device, std::string(status.message()).c_str(), settings->base.c_str());
    return status.code() == absl::StatusCode::kUnavailable ? kExitUnavailable : kExitUnmet;
  }
  std::FILE* report = settings->out.empty() ? stderr : stdout;
  absl::StatusOr<planner::HardwareProfile> profile = calibrate::Measure(*settings, *base, report);
  if (!profile.ok()) {
    std::fprintf(stderr, "stowage calibrate: %s\n", profile.status().ToString().c_str());
    return profile.status().code() == absl::StatusCode::kUnavailable ? kExitUnavailable
                                                                     : kExitUnmet;
  }
  if (!torch_grouped_mm_line.empty()) {
    std::fprintf(report, "%s (from %s)\n", torch_grouped_mm_line.c_str(),
                 settings->torch_grouped_mm.c_str());
  }
  if (absl::Status valid = planner::ValidateHardwareProfile(*profile); !valid.ok()) {
    std::fprintf(stderr, "stowage calibrate: measured profile is not valid: %s\n",
                 valid.ToString().c_str());
    return kExitUnmet;
  }
  const std::string json = planner::HardwareProfileToJson(*profile);
  if (settings->out.empty()) {
    std::fputs(json.c_str(), stdout);
    return kExitOk;
  }
  if (absl::Status written = WriteFile(settings->out, json); !written.ok()) {
    std::fprintf(stderr, "stowage calibrate: %s\n", std::string(written.message()).c_str());
    return kExitUnmet;
  }
  std::fprintf(report, "profile written to %s\n", settings->out.c_str());
  return kExitOk;
#endif
}

}  // namespace stowage::tools
