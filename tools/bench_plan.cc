// `stowage bench plan`: how long planning the reference model takes (cost model + optimizer +
// plan) at 128K..2M tokens. A program that prints a table, not a timed test.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "planner/cost_model.h"
#include "planner/hardware.h"
#include "planner/model.h"
#include "planner/optimizer.h"
#include "planner/report.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace stowage::tools {

int RunBenchPlan(int argc, char** argv) {
  cli::FlagParser flags("stowage bench plan [flags]",
                        "Times planning GLM-5.3-Flash (CP 8, EP 8) at 128K, 256K, 512K, 1M and 2M "
                        "tokens: median wall time of the cost model, the optimizer and the plan.");
  flags.Add({"hardware", "NAME", "hardware preset", "b200"});
  flags.Add({"repeats", "N", "runs per length (the median is reported)", "5"});
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
