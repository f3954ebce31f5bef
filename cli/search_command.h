// `stowage search`'s inputs: the job (read by `stowage plan`'s own flag reader, cli/plan_flags.h)
// and the search request (planner/layout/layout_search.h).
#ifndef STOWAGE_CLI_SEARCH_COMMAND_H_
#define STOWAGE_CLI_SEARCH_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/cli.h"
#include "cli/plan_flags.h"
#include "planner/layout/layout_search.h"

namespace stowage::tools {

struct SearchInputs {
  Inputs inputs;
  planner::LayoutSearchRequest request;
  // The `stowage plan` flags of the job without its layout, as arguments and as one line.
  std::vector<std::string> base_args;
  std::string base_flags;
};

// The search's flags (see `stowage search --help`) read into the job and the request.
absl::StatusOr<SearchInputs> ReadSearchInputs(const cli::FlagParser& flags);

}  // namespace stowage::tools

#endif  // STOWAGE_CLI_SEARCH_COMMAND_H_
