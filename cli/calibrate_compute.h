// `stowage calibrate`'s compute rates: the GPU's per-op-class rates (cli/calibrate_compute.cc,
// Note [Calibrated op rates]). CUDA only: included from calibrate sources built with the CUDA
// backend.
#ifndef STOWAGE_CLI_CALIBRATE_COMPUTE_H_
#define STOWAGE_CLI_CALIBRATE_COMPUTE_H_

#include <cuda_runtime_api.h>

#include <cstdio>

#include "absl/status/status.h"
#include "planner/hardware/hardware.h"

namespace stowage::tools::calibrate {

// Times GEMMs (cuBLAS, when it loads), a stream copy and empty kernels on `device` and writes
// their shares of the --base preset's peaks into `p`; `report` receives the table lines.
absl::Status MeasureCompute(int device, const cudaDeviceProp& prop, planner::HardwareProfile& p,
                            std::FILE* report);

}  // namespace stowage::tools::calibrate

#endif  // STOWAGE_CLI_CALIBRATE_COMPUTE_H_
