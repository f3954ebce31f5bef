// `stowage bench plan`: how long planning the reference model takes (cost model + optimizer +
// plan) at 128K..2M tokens. A program that prints a table, not a timed test.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "planner/cost_model.h"
#include "planner/hardware.h"
#include "planner/model.h"
#include "planner/optimizer.h"
#include "planner/report.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace stowage::tools {
namespace {

int BenchDepth(const std::string& list, const planner::HardwareProfile& hardware, int64_t repeats) {
  std::vector<int> depths;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      std::fprintf(stderr,
                   "stowage bench plan: --layers=%s: expected layer counts such as 1000,10000\n",
                   list.c_str());
      return kExitUsage;
    }
    depths.push_back(n);
  }
  planner::OptimizerOptions options;
  options.gpu_budget_bytes = hardware.UsableBytes();
  options.host_budget_bytes = hardware.HostBytesPerGpu();
  std::printf("llama-3-8b layers x N on %s, 4096 tokens, CP 1, 4096 GPUs; %lld runs per depth\n\n",
              hardware.name.c_str(), static_cast<long long>(repeats));
  std::printf("%8s  %10s  %8s  %7s  %8s  %12s  %12s  %10s\n", "layers", "plan ms", "nodes",
              "proven", "gap", "peak", "host/GPU", "step s");
  for (int n : depths) {
    planner::ModelConfig model = *planner::ModelPreset("llama-3-8b");
    model.layers.assign(n, model.layers[0]);
    planner::RunSettings run;
    run.seq_len = 4096;
    run.cp = 1;
    run.ep = 1;
    run.gpus = 4096;
    std::vector<double> ms;
    planner::OptimizeResult result;
    for (int64_t r = 0; r < repeats; ++r) {
      const auto start = std::chrono::steady_clock::now();
      auto step = planner::BuildStepCost(model, hardware, run);
      if (!step.ok()) {
        std::printf("%8d  %s\n", n, std::string(step.status().message()).c_str());
        break;
      }
      result = planner::Optimize(*step, options);
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }
    if (ms.empty()) continue;
    std::sort(ms.begin(), ms.end());
    if (!result.feasible) {
      std::printf("%8d  %10.1f  %8lld  %7s  %8s  %12s  %12s  %10s\n", n, ms[ms.size() / 2],
                  static_cast<long long>(result.nodes), "-", "-", "does not fit",
                  ("(" + result.binding + ")").c_str(), "-");
      continue;
    }
    const double gap = result.sim.step_seconds / result.lower_bound_seconds - 1;
    std::printf("%8d  %10.1f  %8lld  %7s  %7.1f%%  %12s  %12s  %10.2f\n", n, ms[ms.size() / 2],
                static_cast<long long>(result.nodes), result.proven_optimal ? "yes" : "no",
                100 * gap, planner::FormatBytes(result.sim.peak_bytes).c_str(),
                planner::FormatBytes(result.sim.host_bytes).c_str(), result.sim.step_seconds);
  }
  return kExitOk;
}

}  // namespace

int RunBenchPlan(int argc, char** argv) {
  cli::FlagParser flags("stowage bench plan [flags]",
                        "Times planning GLM-5.3-Flash (CP 8, EP 8) at 128K, 256K, 512K, 1M and 2M "
                        "tokens: median wall time of the cost model, the optimizer and the plan.");
  flags.Add({"hardware", "NAME", "hardware preset", "b200"});
  flags.Add({"repeats", "N", "runs per length (the median is reported)", "5"});
  flags.Add({"layers", "N,N,...",
             "instead: deep models, Llama-3-8B's layer repeated N times (4K tokens, CP 1, 4096 "
             "GPUs): planning time against depth (Note [Bounded work] in planner/optimizer.cc)",
             ""});
  if (absl::Status s = flags.Parse(argc, argv, 1); !s.ok()) {
    std::fprintf(stderr, "stowage bench plan: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  auto repeats = flags.GetInt("repeats", 5, 1, 1000);
  auto hardware_name = flags.GetString("hardware", "b200");
  if (!repeats.ok() || !hardware_name.ok()) {
    std::fprintf(
        stderr, "stowage bench plan: %s\n",
        std::string((!repeats.ok() ? repeats.status() : hardware_name.status()).message()).c_str());
    return kExitUsage;
  }
  auto hardware = planner::HardwarePreset(*hardware_name);
  if (!hardware.ok()) {
    std::fprintf(stderr, "stowage bench plan: %s\n",
                 std::string(hardware.status().message()).c_str());
    return kExitUsage;
  }
  if (flags.Has("layers")) return BenchDepth(*flags.Get("layers"), *hardware, *repeats);
  const planner::ModelConfig model = *planner::ModelPreset("glm-5.3-flash");
  planner::OptimizerOptions options;
  options.gpu_budget_bytes = hardware->UsableBytes();
  options.host_budget_bytes = hardware->HostBytesPerGpu();

  std::printf("glm-5.3-flash on %s, CP 8, EP 8, 64 GPUs; %lld runs per length\n\n",
              hardware_name->c_str(), static_cast<long long>(*repeats));
  std::printf("%10s  %12s  %10s  %9s  %12s  %12s  %10s\n", "tokens", "plan ms", "nodes", "proven",
              "peak", "host/GPU", "step s");
  for (uint64_t seq : {131072ull, 262144ull, 524288ull, 1048576ull, 2097152ull}) {
    planner::RunSettings run;
    run.seq_len = seq;
    std::vector<double> ms;
    planner::OptimizeResult result;
    for (int64_t r = 0; r < *repeats; ++r) {
      const auto start = std::chrono::steady_clock::now();
      auto step = planner::BuildStepCost(model, *hardware, run);
      if (!step.ok()) {
        std::fprintf(stderr, "stowage bench plan: %s\n",
                     std::string(step.status().message()).c_str());
        return kExitUsage;
      }
      result = planner::Optimize(*step, options);
      if (result.feasible) {
        const planner::Baseline baseline =
            planner::ComputeBaseline(*step, options.gpu_budget_bytes);
        const Plan plan = planner::MakePlan(*step, result, baseline, {});
        if (plan.layers.empty()) return kExitUnmet;
      }
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    if (result.feasible) {
      std::printf("%10llu  %12.1f  %10lld  %9s  %12s  %12s  %10.2f\n",
                  static_cast<unsigned long long>(seq), median,
                  static_cast<long long>(result.nodes), result.proven_optimal ? "yes" : "no",
                  planner::FormatBytes(result.sim.peak_bytes).c_str(),
                  planner::FormatBytes(result.sim.host_bytes).c_str(), result.sim.step_seconds);
    } else {
      std::printf("%10llu  %12.1f  %10lld  %9s  %12s  %12s  %10s\n",
                  static_cast<unsigned long long>(seq), median,
                  static_cast<long long>(result.nodes), "-", "does not fit",
                  ("(" + result.binding + ")").c_str(), "-");
    }
  }
  return kExitOk;
}

}  // namespace stowage::tools
