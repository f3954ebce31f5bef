// What one `stowage calibrate` run is asked to measure (its flags, parsed by
// calibrate_command.cc) and the run of measurements that fills the hardware profile
// (calibrate_measure.cc).
#ifndef STOWAGE_CLI_CALIBRATE_H_
#define STOWAGE_CLI_CALIBRATE_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "base/bytes.h"
#include "planner/hardware/hardware.h"

namespace stowage::tools::calibrate {

struct CalibrateSettings {
  int device = 0;
  std::string base = "h200";
  std::string out;
  uint64_t min_chunk = 256 * 1024;
  uint64_t max_chunk = 256 * kMiB;
  uint64_t setup_bytes = 4 * kGiB;
  bool skip_malloc_host = false;
  bool compute_only = false;
  // bench/bench_grouped_mm.py's measurement of torch._grouped_mm (its JSON), folded into the
  // profile; empty: the --base preset's torch._grouped_mm rate is kept.
  std::string torch_grouped_mm;
  std::string torch_grouped_mm_json;
};

// The measurements on device s.device, starting from the --base preset's `profile`; `report`
// receives the table lines. Returns the profile. Defined only with the CUDA backend
// (STOWAGE_HAVE_CUDA).
absl::StatusOr<planner::HardwareProfile> Measure(const CalibrateSettings& s,
                                                 planner::HardwareProfile profile,
                                                 std::FILE* report);

}  // namespace stowage::tools::calibrate

#endif  // STOWAGE_CLI_CALIBRATE_H_
