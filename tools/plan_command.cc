#include <cstdio>

#include "tools/commands.h"

namespace stowage::tools {

// Replaced by the issue that builds this command.
int RunPlanCommand(int /*argc*/, char** /*argv*/) {
  std::fprintf(stderr, "stowage: this command is not implemented yet\n");
  return kExitUnmet;
}

}  // namespace stowage::tools
