// `stowage bench search`: the layout search (planner/layout/layout_search.h) on three published
// jobs, timed, each with the published layout ranked: GLM-5.3-Flash on 64 B200 at 1M tokens (the
// reference run's CP 8 / EP 8), DeepSeek-V3 on 2,048 H800 at 4K tokens (PP 16 / EP 64,
// planner/cost/reference_jobs.h) and Llama-3.1-405B on 16,384 H100 at 8K and 128K tokens (TP 8 /
// PP 16 and TP 8 / CP 16 / PP 16). A program that prints tables, not a timed test: wall time is
// what a user waits, CPU time the search's own work (they differ on a shared machine).
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "planner/cost/reference_jobs.h"
#include "planner/hardware/hardware.h"
#include "planner/layout/layout_report.h"
#include "planner/layout/layout_search.h"
#include "planner/model/model.h"

namespace stowage::tools {
namespace {

struct Case {
  std::string title;
  std::string model, hardware;
  int gpus = 0;
  uint64_t seq_len = 0;
  uint64_t global_batch = 0;  // sequences
  planner::Sharding sharding = planner::Sharding::kOptimGradsParams;
  std::string published;  // a LayoutPattern
};

std::vector<Case> Cases() {
  const planner::RunSettings deepseek = planner::DeepSeekV3Pp16Job();
  return {
      // The reference run: CP 8 x EP 8 on 64 GPUs is 8 data-parallel ranks of one sequence each.
      {"GLM-5.3-Flash, 64 B200, 1M tokens (reference run: CP 8 / EP 8)", planner::kDefaultModel,
       planner::kDefaultHardware, 64, 1 << 20, 8, planner::Sharding::kOptimGradsParams,
       "tp=1,cp=8,ep=8,pp=1"},
      // The reference job's batch: 128 data-parallel ranks x 16 microbatches of one sequence.
      {"DeepSeek-V3, 2,048 H800, 4K tokens (published: PP 16 / EP 64)",
       planner::kDeepSeekV3Pp16Model, "h800", deepseek.gpus, deepseek.seq_len,
       static_cast<uint64_t>(deepseek.gpus / deepseek.pp) * deepseek.microbatches,
       deepseek.sharding, "tp=1,cp=1,ep=64,pp=16,vpp=1,mb=1"},
      // Llama 3 (arXiv 2407.21783, section 3.3.2 and table 4): 16M tokens per step, 2,048
      // sequences of 8K and 128 of 128K.
      {"Llama-3.1-405B, 16,384 H100, 8K tokens (published: TP 8 / PP 16)", "llama-3.1-405b", "h100",
       16384, 8192, 2048, planner::Sharding::kOptimGradsParams, "tp=8,cp=1,pp=16"},
      {"Llama-3.1-405B, 16,384 H100, 128K tokens (published: TP 8 / CP 16 / PP 16)",
       "llama-3.1-405b", "h100", 16384, 128 * 1024, 128, planner::Sharding::kOptimGradsParams,
       "tp=8,cp=16,pp=16"},
  };
}

}  // namespace

int RunBenchSearch(int argc, char** argv) {
  cli::FlagParser flags("stowage bench search [flags]",
                        "Times the layout search (`stowage search`) on GLM-5.3-Flash (64 B200, "
                        "1M tokens), DeepSeek-V3 (2,048 H800, 4K) and Llama-3.1-405B (16,384 "
                        "H100, 8K and 128K), each with its published layout ranked, and prints "
                        "each search's table.");
  flags.Add({"top", "N", "layouts ranked exactly and shown", "10"});
  flags.Add({"case", "K", "run only case K (1 to 4)", "all"});
  flags.Add({"exact-rank", "",
             "plan every layout that might rank above the published one (as `stowage search "
             "--exact-rank`): its exact rank, at the cost of planning them",
             ""});
  if (absl::Status s = flags.Parse(argc, argv, 1); !s.ok()) {
    std::fprintf(stderr, "stowage bench search: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  auto top = flags.GetInt("top", 10, 1, 1000);
  auto only = flags.GetInt("case", 0, 1, 4);
  if (!top.ok() || !only.ok()) {
    std::fprintf(stderr, "stowage bench search: %s\n",
                 std::string((!top.ok() ? top.status() : only.status()).message()).c_str());
    return kExitUsage;
  }
  int k = 0;
  for (const Case& c : Cases()) {
    if (*only > 0 && ++k != *only) continue;
    if (*only == 0) ++k;
    auto model = planner::ModelPreset(c.model);
    auto hardware = planner::HardwarePreset(c.hardware);
    if (!model.ok() || !hardware.ok()) {
      std::fprintf(
          stderr, "stowage bench search: %s\n",
          std::string((!model.ok() ? model.status() : hardware.status()).message()).c_str());
      return kExitUsage;
    }
    planner::LayoutSearchRequest q;
    q.model = *model;
    q.hardware = *hardware;
    q.base = planner::DefaultRunSettings(planner::Framework::kMegatron, q.model);
    q.base.seq_len = c.seq_len;
    q.base.sharding = c.sharding;
    q.gpu_counts = {c.gpus};
    q.global_batch = c.global_batch;
    q.options.gpu_budget_bytes = hardware->UsableBytes();
    q.options.host_budget_bytes = hardware->DefaultHostBudgetPerGpu();
    q.top = static_cast<int>(*top);
    auto pattern = planner::ParseLayoutPattern(c.published);
    if (!pattern.ok()) return kExitUsage;
    pattern->text = absl::StrCat("published ", c.published);
    q.rank_also = {*pattern};
    q.exact_rank = flags.GetBool("exact-rank");
    const auto start = std::chrono::steady_clock::now();
    const std::clock_t cpu = std::clock();
    auto result = planner::SearchLayouts(q);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu_s = static_cast<double>(std::clock() - cpu) / CLOCKS_PER_SEC;
    if (!result.ok()) {
      std::fprintf(stderr, "stowage bench search: %s: %s\n", c.title.c_str(),
                   std::string(result.status().message()).c_str());
      return kExitUsage;
    }
    std::printf("== %d. %s\nsearch: %.3f s wall, %.3f s CPU; global batch %llu sequences\n", k,
                c.title.c_str(), wall, cpu_s, static_cast<unsigned long long>(c.global_batch));
    planner::LayoutReportOptions report;
    report.base_flags =
        absl::StrCat("--model ", c.model, " --hardware ", c.hardware, " --seq-len ", c.seq_len,
                     c.sharding == planner::Sharding::kOptimGradsParams
                         ? ""
                         : absl::StrCat(" --sharding ", planner::ShardingName(c.sharding)));
    report.global_batch = c.global_batch;
    report.max_pruned_lines = 8;
    report.flags_per_row = false;
    std::fputs(planner::RenderLayoutSearch(q, *result, report).c_str(), stdout);
    std::fputs("\n", stdout);
  }
  return kExitOk;
}

}  // namespace stowage::tools
