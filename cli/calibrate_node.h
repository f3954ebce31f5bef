// `stowage calibrate`'s measurements of the node's GPUs together: the host link with every GPU
// copying at once, and NCCL's collectives among them. CUDA only: included from calibrate sources
// built with the CUDA backend.
#ifndef STOWAGE_CLI_CALIBRATE_NODE_H_
#define STOWAGE_CLI_CALIBRATE_NODE_H_

#include <cstdio>

#include "absl/status/status.h"
#include "cli/calibrate.h"
#include "planner/hardware/hardware.h"

namespace stowage::tools::calibrate {

// The node's GPUs together: the shared host link, then NCCL among them.
absl::Status MeasureNode(const CalibrateSettings& s, planner::HardwareProfile& profile,
                         std::FILE* report);

}  // namespace stowage::tools::calibrate

#endif  // STOWAGE_CLI_CALIBRATE_NODE_H_
