#include <cstdio>

#include "tools/commands.h"

namespace stowage::tools {

// Replaced by the issue that builds this benchmark.
int RunBenchPlan(int /*argc*/, char** /*argv*/) {
  std::fprintf(stderr, "stowage: this benchmark is not implemented yet\n");
  return kExitUnmet;
}

}  // namespace stowage::tools
