// `stowage bench <what>`: benchmark programs that print a table.
#include <cstdio>
#include <string_view>

#include "cli/commands.h"

namespace stowage::tools {

int RunBenchPlan(int argc, char** argv);     // bench_plan.cc
int RunBenchOffload(int argc, char** argv);  // bench_offload.cc
int RunBenchSearch(int argc, char** argv);   // bench_search.cc

int RunBenchCommand(int argc, char** argv) {
  constexpr char kUsage[] =
      "usage: stowage bench <plan|search|offload> [flags]\n"
      "  plan     planning time for the reference model at 128K..2M tokens\n"
      "  search   the layout search on three published jobs: its time and where they rank\n"
      "  offload  the offload engine on a synthetic reference-shaped plan against raw copies\n";
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return kExitUsage;
  }
  std::string_view what = argv[1];
  if (what == "plan") return RunBenchPlan(argc - 1, argv + 1);
  if (what == "search") return RunBenchSearch(argc - 1, argv + 1);
  if (what == "offload") return RunBenchOffload(argc - 1, argv + 1);
  if (what == "-h" || what == "--help") {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  std::fprintf(stderr, "stowage bench: unknown benchmark '%s'\n%s", argv[1], kUsage);
  return kExitUsage;
}

}  // namespace stowage::tools
