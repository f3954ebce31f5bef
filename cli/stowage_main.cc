// `stowage`: one binary, subcommands. With no subcommand it prints the commands.
#include <cstdio>
#include <cstring>
#include <string_view>

#include "cli/commands.h"
#include "stowage/stowage.h"

namespace {

constexpr char kUsage[] =
    "usage: stowage <command> [flags]\n"
    "\n"
    "Memory planner and CPU-offload runtime for long-context training.\n"
    "\n"
    "commands:\n"
    "  plan           choose keep/recompute/offload per layer within the GPU and host budgets\n"
    "                 (no flags: GLM-5.3-Flash, 1M tokens, B200, CP 8, EP 8)\n"
    "  search         rank every parallel layout (TP, CP, EP, PP, VPP, micro-batch) by step time\n"
    "  calibrate      measure this machine's copy bandwidth and pinning rate; write a profile\n"
    "  bench plan     planning time for the reference model and for deep models\n"
    "  bench search   the layout search on three published jobs\n"
    "  bench offload  run the offload engine on a synthetic reference-shaped plan\n"
    "  demo-runtime   run the host backend through a plan with the metrics endpoint up\n"
    "  version        print the version\n"
    "\n"
    "`stowage <command> --help` explains each command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace stowage::tools;
  // Bare `stowage` shows what it can do rather than starting a plan the user did not ask for;
  // `stowage plan` with no flags is the reference run.
  std::string_view command = argc < 2 ? "help" : argv[1];
  if (command == "-h" || command == "--help" || command == "help") {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (command == "version" || command == "--version") {
    std::printf("stowage %s\n", stowage_version());
    return kExitOk;
  }
  if (command == "plan") return RunPlanCommand(argc - 1, argv + 1);
  if (command == "search") return RunSearchCommand(argc - 1, argv + 1);
  if (command == "calibrate") return RunCalibrateCommand(argc - 1, argv + 1);
  if (command == "bench") return RunBenchCommand(argc - 1, argv + 1);
  if (command == "demo-runtime") return RunDemoRuntimeCommand(argc - 1, argv + 1);
  std::fprintf(stderr, "stowage: unknown command '%s'\n\n%s", argv[1], kUsage);
  return kExitUsage;
}
