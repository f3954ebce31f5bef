// `stowage bench plan`: how long planning takes (cost model + optimizer + plan) and whether the
// plan is proven optimal — the reference model at 128K..2M tokens, DeepSeek-V3 with PP 16, then
// deep models of 100 to 10,000 layers over 1, 4 and 16 pipeline stages. A program that prints
// tables, not a timed test. Wall time is what a user waits; CPU time is the planner's own work (the
// two differ when the machine is shared).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/reference_jobs.h"
#include "planner/frameworks/step_cost.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "planner/report/report.h"
#include "planner/search/baseline.h"
#include "planner/search/optimizer.h"

namespace stowage::tools {
namespace {

struct Timing {
  double wall_ms = 0, cpu_ms = 0;
};

// Median wall and CPU milliseconds (each its own median).
Timing Median(const std::vector<Timing>& runs) {
  std::vector<double> wall, cpu;
  for (const Timing& t : runs) {
    wall.push_back(t.wall_ms);
    cpu.push_back(t.cpu_ms);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

template <typename F>
Timing Time(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t cpu = std::clock();
  f();
  Timing t;
  t.wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  t.cpu_ms = 1000.0 * static_cast<double>(std::clock() - cpu) / CLOCKS_PER_SEC;
  return t;
}

// The plan's distance from the search's bound (0 when proven).
double GapPercent(const planner::OptimizeResult& r) { return 100 * planner::OptimalityGap(r); }

constexpr const char* kHeader = "%10s  %9s  %9s  %10s  %8s  %10s  %8s  %12s  %12s  %9s\n";

void PrintHeader(const char* first) {
  std::printf(kHeader, first, "wall ms", "cpu ms", "process ms", "nodes", "optimality", "gap",
              "peak", "host/GPU", "step s");
}

void PrintRow(const std::string& first, const Timing& t, double process_ms,
              const planner::OptimizeResult& r) {
  const std::string process = process_ms >= 0 ? absl::StrFormat("%.1f", process_ms) : "-";
  if (!r.feasible) {
    std::printf("%10s  %9.1f  %9.1f  %10s  %8lld  %10s  %8s  %12s  %12s  %9s\n", first.c_str(),
                t.wall_ms, t.cpu_ms, process.c_str(), static_cast<long long>(r.nodes), "-", "-",
                "does not fit", ("(" + r.binding + ")").c_str(), "-");
    return;
  }
  std::printf("%10s  %9.1f  %9.1f  %10s  %8lld  %10s  %7.3f%%  %12s  %12s  %9.3f\n", first.c_str(),
              t.wall_ms, t.cpu_ms, process.c_str(), static_cast<long long>(r.nodes),
              planner::OptimalityName(r), GapPercent(r), FormatBytes(r.sim.peak_bytes).c_str(),
              FormatBytes(r.sim.host_bytes).c_str(), r.sim.step_seconds);
}

// Whole-process planning time, what a user waits for at the prompt: this same binary run as
// `stowage plan --hardware H --seq-len N --optimality-gap G --format json` (its output discarded),
// `repeats` times;
// the median wall milliseconds, or -1 when it cannot be run. The process loads its libraries,
// builds the cost model, searches and writes the plan JSON.
double ProcessMs(const std::string& hardware, uint64_t seq_len, double gap, int64_t repeats) {
  const std::string seq = std::to_string(seq_len);
  const std::string gap_text = absl::StrFormat("%.17g", gap);
  std::vector<double> runs;
  for (int64_t r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const pid_t child = ::fork();
    if (child < 0) return -1;
    if (child == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      if (null >= 0) {
        ::dup2(null, STDOUT_FILENO);
        ::dup2(null, STDERR_FILENO);
      }
      const char* argv[] = {"stowage",
                            "plan",
                            "--hardware",
                            hardware.c_str(),
                            "--seq-len",
                            seq.c_str(),
                            "--optimality-gap",
                            gap_text.c_str(),
                            "--format",
                            "json",
                            nullptr};
      ::execv("/proc/self/exe", const_cast<char* const*>(argv));
      ::_exit(127);
    }
    int status = 0;
    if (::waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) == 127) {
      return -1;
    }
    runs.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// Parses "N,N,..." of positive integers for --name.
bool ParseCounts(const std::string& list, const char* name, std::vector<int>& out) {
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      std::fprintf(stderr, "stowage bench plan: --%s=%s: expected positive counts such as 1,4,16\n",
                   name, list.c_str());
      return false;
    }
    out.push_back(n);
  }
  return true;
}

// What planning every stage of a pipeline found: nodes and proofs summed, the worst stage's gap,
// the slowest stage's simulated step, the highest peak and host bytes.
struct StagesPlanned {
  int64_t nodes = 0;
  int proven = 0;
  int within_gap = 0;  // proven included
  bool fits = true;
  double worst_gap = 0, slowest = 0;
  uint64_t peak = 0, host = 0;
};

// Plans every stage of `run` `repeats` times, one Timing per repeat appended to `times`; what
// the last repeat found. nullopt (after saying why) when a stage's cost cannot be built.
std::optional<StagesPlanned> PlanEveryStage(const planner::ModelConfig& model,
                                            const planner::RunSettings& run,
                                            const planner::HardwareProfile& hardware,
                                            const planner::OptimizerOptions& options,
                                            int64_t repeats, std::vector<Timing>& times) {
  StagesPlanned found;
  for (int64_t r = 0; r < repeats; ++r) {
    found = StagesPlanned();
    bool ok = true;
    times.push_back(Time([&] {
      for (int stage = 0; stage < run.pp && ok; ++stage) {
        auto step = planner::BuildStepCost(model, hardware, run, stage);
        if (!step.ok()) {
          std::fprintf(stderr, "stowage bench plan: %s\n",
                       std::string(step.status().message()).c_str());
          ok = false;
          return;
        }
        const planner::OptimizeResult result = planner::Optimize(*step, options);
        found.fits &= result.feasible;
        found.nodes += result.nodes;
        found.proven += result.proven_optimal;
        found.within_gap += result.within_gap;
        found.worst_gap = std::max(found.worst_gap, GapPercent(result));
        found.slowest = std::max(found.slowest, result.sim.step_seconds);
        found.peak = std::max(found.peak, result.sim.peak_bytes);
        found.host = std::max(found.host, result.sim.host_bytes);
      }
    }));
    if (!ok) return std::nullopt;
  }
  return found;
}

// Deep models: Llama-3-8B's layer repeated N times, split over P pipeline stages (1F1B, P
// microbatches: stage s holds P - s in flight), every stage planned. The layers x stages
// curve of Note [Bounded work] in planner/search/optimizer.cc: a stage has about N/P layers and P
// stages are planned, so the work grows with N, and the cpu time per layer (us/layer) stays flat
// when it grows no worse than linearly. gap and proven are the worst stage's; peak and host the
// highest; stage s the slowest stage's simulated step.
int BenchDepth(const std::string& list, const std::string& stage_list,
               const planner::HardwareProfile& hardware, int64_t repeats, double gap) {
  std::vector<int> depths, stages;
  if (!ParseCounts(list, "layers", depths) || !ParseCounts(stage_list, "stages", stages)) {
    return kExitUsage;
  }
  planner::OptimizerOptions options;
  options.gpu_budget_bytes = hardware.UsableBytes();
  options.host_budget_bytes = hardware.DefaultHostBudgetPerGpu();
  options.optimality_gap = gap;
  std::printf(
      "llama-3-8b layers x N over P stages (1f1b, P microbatches) on %s, 4096 tokens, CP 1, 4096 "
      "GPUs; %lld runs per row\n"
      "us/layer = cpu ms / N: the P stages of N/P layers each plan N layers in all (layers per "
      "stage x stages), so a flat column is planning time linear in layers x stages\n\n",
      hardware.name.c_str(), static_cast<long long>(repeats));
  std::printf("%7s  %6s  %9s  %9s  %8s  %8s  %7s  %7s  %8s  %12s  %12s  %9s\n", "layers", "stages",
              "wall ms", "cpu ms", "us/layer", "nodes", "proven", "in gap", "gap", "peak",
              "host/GPU", "stage s");
  for (int n : depths) {
    for (int p : stages) {
      if (p > n) continue;
      planner::ModelConfig model = *planner::ModelPreset("llama-3-8b");
      model.layers.assign(n, model.layers[0]);
      planner::RunSettings run;
      run.seq_len = 4096;
      run.cp = 1;
      run.ep = 1;
      run.gpus = 4096;
      run.pp = p;
      run.microbatches = p;
      // As even as the layers allow, the extra ones on the last stages (what `stowage plan`
      // suggests when the default split does not divide).
      run.pp_layout.assign(p, n / p);
      for (int s = 0; s < n % p; ++s) ++run.pp_layout[p - 1 - s];
      std::vector<Timing> times;
      const std::optional<StagesPlanned> found =
          PlanEveryStage(model, run, hardware, options, repeats, times);
      if (!found.has_value()) return kExitUnmet;
      const auto& [nodes, proven, within_gap, fits, worst_gap, slowest, peak, host] = *found;
      const Timing t = Median(times);
      if (!fits) {
        std::printf("%7d  %6d  %9.1f  %9.1f  %8.1f  %8lld  %7s  %7s  %8s  %12s\n", n, p, t.wall_ms,
                    t.cpu_ms, 1000 * t.cpu_ms / n, static_cast<long long>(nodes), "-", "-", "-",
                    "does not fit");
      } else {
        std::printf("%7d  %6d  %9.1f  %9.1f  %8.1f  %8lld  %7s  %7s  %7.3f%%  %12s  %12s  %9.3f\n",
                    n, p, t.wall_ms, t.cpu_ms, 1000 * t.cpu_ms / n, static_cast<long long>(nodes),
                    absl::StrFormat("%d/%d", proven, p).c_str(),
                    absl::StrFormat("%d/%d", within_gap, p).c_str(), worst_gap,
                    FormatBytes(peak).c_str(), FormatBytes(host).c_str(), slowest);
      }
      std::fflush(stdout);
    }
  }
  return kExitOk;
}

// One row of BenchPipeline: every stage of `run` on `hardware`; the highest peak and host bytes
// and the slowest stage's simulated step.
int BenchPipelineRow(const planner::ModelConfig& model, const planner::RunSettings& run,
                     const planner::HardwareProfile& hardware, int64_t repeats, double gap) {
  planner::OptimizerOptions options;
  options.gpu_budget_bytes = hardware.UsableBytes();
  options.host_budget_bytes = hardware.DefaultHostBudgetPerGpu();
  options.optimality_gap = gap;
  std::vector<Timing> times;
  const std::optional<StagesPlanned> found =
      PlanEveryStage(model, run, hardware, options, repeats, times);
  if (!found.has_value() || !found->fits) return kExitUnmet;
  const auto& [nodes, proven, within_gap, fits, worst_gap, slowest, peak, host] = *found;
  const Timing t = Median(times);
  std::printf("%10s  %9.1f  %9.1f  %8lld  %7s  %7s  %7.3f%%  %12s  %12s  %9.6f\n",
              hardware.name.c_str(), t.wall_ms, t.cpu_ms, static_cast<long long>(nodes),
              absl::StrFormat("%d/%d", proven, run.pp).c_str(),
              absl::StrFormat("%d/%d", within_gap, run.pp).c_str(), worst_gap,
              FormatBytes(peak).c_str(), FormatBytes(host).c_str(), slowest);
  return kExitOk;
}

// A large pipeline job: DeepSeek-V3 on 2,048 GPUs, PP 16 (planner::DeepSeekV3Pp16Job). Planning it
// is one cost model and one search per stage; a row is all 16 (the slowest stage's search and the
// binding stage's peak are what a user would look at). One row per hardware: the chosen one and
// h800, whose smaller memory makes stages offload and wait for their copies, which the search
// must still prove (Note [Forward waits] in planner/search/bound_model.cc).
int BenchPipeline(const std::vector<planner::HardwareProfile>& hardware, int64_t repeats,
                  double gap) {
  const planner::ModelConfig model = *planner::ModelPreset(planner::kDeepSeekV3Pp16Model);
  planner::RunSettings run = planner::DeepSeekV3Pp16Job();
  std::printf(
      "\ndeepseek-v3, 2048 GPUs, PP 16 (1f1b, 16 microbatches), EP 64, 4096 tokens; every stage; "
      "%lld runs\n\n",
      static_cast<long long>(repeats));
  std::printf("%10s  %9s  %9s  %8s  %7s  %7s  %8s  %12s  %12s  %9s\n", "hardware", "wall ms",
              "cpu ms", "nodes", "proven", "in gap", "gap", "peak", "host/GPU", "stage s");
  for (const planner::HardwareProfile& h : hardware) {
    if (const int code = BenchPipelineRow(model, run, h, repeats, gap); code != kExitOk) {
      return code;
    }
  }
  return kExitOk;
}

}  // namespace

int RunBenchPlan(int argc, char** argv) {
  cli::FlagParser flags("stowage bench plan [flags]",
                        "Times planning GLM-5.3-Flash (CP 8, EP 8) at 128K, 256K, 512K, 1M and 2M "
                        "tokens (median wall and CPU time of the cost model, the optimizer and the "
                        "plan; whether the plan is proven optimal, else its gap to the search's "
                        "bound), DeepSeek-V3 on 2,048 GPUs with PP 16 (every stage), then deep "
                        "models (--layers).");
  flags.Add({"hardware", "NAME", "hardware preset", planner::kDefaultHardware});
  flags.Add({"repeats", "N", "runs per length (the median is reported)", "5"});
  flags.Add(
      {"layers", "N,N,...",
       "deep models, Llama-3-8B's layer repeated N times (4K tokens, CP 1, 4096 GPUs): "
       "planning time against depth (Note [Bounded work] in planner/search/optimizer.cc); given "
       "alone, only this table",
       "100,200,300,500,700,1000,10000"});
  flags.Add({"stages", "P,P,...",
             "pipeline stages each deep model is split over (1f1b, P microbatches; every stage "
             "planned): the layers x stages curve",
             "1,4,16"});
  flags.Add({"optimality-gap", "G",
             "the search's relative gap (as `stowage plan --optimality-gap`; 0 proves every plan)",
             "0.0001"});
  if (absl::Status s = flags.Parse(argc, argv, 1); !s.ok()) {
    std::fprintf(stderr, "stowage bench plan: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  auto repeats = flags.GetInt("repeats", 5, 1, 1000);
  auto hardware_name = flags.GetString("hardware", planner::kDefaultHardware);
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
  auto gap = flags.GetDouble("optimality-gap", planner::OptimizerOptions::kDefaultOptimalityGap, 0,
                             planner::OptimizerOptions::kMaxOptimalityGap);
  if (!gap.ok()) {
    std::fprintf(stderr, "stowage bench plan: %s\n", std::string(gap.status().message()).c_str());
    return kExitUsage;
  }
  const std::string depths =
      flags.GetString("layers", "100,200,300,500,700,1000,10000").value_or("");
  const std::string stage_list = flags.GetString("stages", "1,4,16").value_or("");
  if (flags.Has("layers")) return BenchDepth(depths, stage_list, *hardware, *repeats, *gap);
  const planner::ModelConfig model = *planner::ModelPreset(planner::kDefaultModel);
  planner::OptimizerOptions options;
  options.gpu_budget_bytes = hardware->UsableBytes();
  options.host_budget_bytes = hardware->DefaultHostBudgetPerGpu();
  options.optimality_gap = *gap;

  std::printf(
      "glm-5.3-flash on %s, CP 8, EP 8, 64 GPUs; %lld runs per length; optimality gap %g\n"
      "process ms: this binary run as `stowage plan --hardware %s --seq-len N --format json` (the "
      "same gap), median wall time of the whole process\n"
      "optimality (as the plan JSON's): proven, within_gap (of the search's bound), unproven (its "
      "work budget ran out); proven / in gap: stages proven / within the gap (proven included)\n\n",
      hardware_name->c_str(), static_cast<long long>(*repeats), *gap, hardware_name->c_str());
  PrintHeader("tokens");
  for (uint64_t seq : {131072ull, 262144ull, 524288ull, 1048576ull, 2097152ull}) {
    planner::RunSettings run;
    run.seq_len = seq;
    std::vector<Timing> times;
    planner::OptimizeResult result;
    bool planned = true;
    for (int64_t r = 0; r < *repeats && planned; ++r) {
      times.push_back(Time([&] {
        auto step = planner::BuildStepCost(model, *hardware, run);
        if (!step.ok()) {
          std::fprintf(stderr, "stowage bench plan: %s\n",
                       std::string(step.status().message()).c_str());
          planned = false;
          return;
        }
        result = planner::Optimize(*step, options);
        if (result.feasible) {
          const planner::Baseline baseline =
              planner::ComputeBaseline(*step, options.gpu_budget_bytes);
          planned = !planner::MakePlan(*step, result, baseline, {}).layers.empty();
        }
      }));
    }
    if (!planned) return kExitUnmet;
    PrintRow(std::to_string(seq), Median(times), ProcessMs(*hardware_name, seq, *gap, *repeats),
             result);
    std::fflush(stdout);
  }
  std::vector<planner::HardwareProfile> pipeline_hardware = {*hardware};
  if (hardware->name != "h800") pipeline_hardware.push_back(*planner::HardwarePreset("h800"));
  if (const int code = BenchPipeline(pipeline_hardware, *repeats, *gap); code != kExitOk) {
    return code;
  }
  std::printf("\n");
  return BenchDepth(depths, stage_list, *hardware, *repeats, *gap);
}

}  // namespace stowage::tools
