// AgreeOverNccl (runtime/plan_agreement.h). NCCL's functions are those of the communicator's
// library, taken from the process (offload/cuda/nccl_api.h, Note [NCCL from the process]).
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "runtime/plan_agreement.h"

#ifdef STOWAGE_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <vector>

#include "offload/cuda/nccl_api.h"
#endif

namespace stowage::runtime {

#ifndef STOWAGE_HAVE_NCCL

absl::Status AgreeOverNccl(uint64_t /*hash*/, void* /*nccl_comm*/) {
  return absl::UnavailableError(
      "stowage_agree_nccl: this build of stowage has no NCCL support (nccl.h was not found when "
      "it was configured); use stowage.agree over torch.distributed, or rebuild with NCCL");
}

#else

namespace {

// The device buffer and stream of one agreement, freed on every path.
class DeviceScratch {
 public:
  ~DeviceScratch() {
    if (buffer != nullptr) cudaFree(buffer);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  uint64_t* buffer = nullptr;
  cudaStream_t stream = nullptr;
};

absl::Status Cuda(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("stowage_agree_nccl: ", call, ": ", cudaGetErrorString(error)));
}

}  // namespace

absl::Status AgreeOverNccl(uint64_t hash, void* nccl_comm) {
  auto api = offload::NcclApi::FromProcess();
  if (!api.ok()) {
    return absl::UnavailableError(absl::StrCat("stowage_agree_nccl: ", api.status().message()));
  }
  const offload::NcclApi& nccl = **api;
  ncclComm_t comm = static_cast<ncclComm_t>(nccl_comm);
  auto check = [&](ncclResult_t result, const char* call) -> absl::Status {
    return nccl.Ok(result, absl::StrCat("stowage_agree_nccl: ", call));
  };
  int count = 0, rank = 0, device = 0;
  if (absl::Status s = check(nccl.comm_count(comm, &count), "ncclCommCount"); !s.ok()) return s;
  if (absl::Status s = check(nccl.user_rank(comm, &rank), "ncclCommUserRank"); !s.ok()) return s;
  if (absl::Status s = check(nccl.cu_device(comm, &device), "ncclCommCuDevice"); !s.ok()) return s;
  int previous = 0;
  if (absl::Status s = Cuda(cudaGetDevice(&previous), "cudaGetDevice"); !s.ok()) return s;
  if (absl::Status s = Cuda(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  std::vector<uint64_t> hashes(static_cast<size_t>(count), 0);
  absl::Status status = [&]() -> absl::Status {
    DeviceScratch scratch;
    if (absl::Status s = Cuda(cudaStreamCreateWithFlags(&scratch.stream, cudaStreamNonBlocking),
                              "cudaStreamCreateWithFlags");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Cuda(
            cudaMalloc(reinterpret_cast<void**>(&scratch.buffer), hashes.size() * sizeof(uint64_t)),
            "cudaMalloc");
        !s.ok()) {
      return s;
    }
    uint64_t* mine = scratch.buffer + rank;
    if (absl::Status s =
            Cuda(cudaMemcpyAsync(mine, &hash, sizeof(hash), cudaMemcpyHostToDevice, scratch.stream),
                 "cudaMemcpyAsync");
        !s.ok()) {
      return s;
    }
    // In place: rank r's contribution already sits at r in the output.
    if (absl::Status s =
            check(nccl.all_gather(mine, scratch.buffer, 1, ncclUint64, comm, scratch.stream),
                  "ncclAllGather");
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            Cuda(cudaMemcpyAsync(hashes.data(), scratch.buffer, hashes.size() * sizeof(uint64_t),
                                 cudaMemcpyDeviceToHost, scratch.stream),
                 "cudaMemcpyAsync");
        !s.ok()) {
      return s;
    }
    return Cuda(cudaStreamSynchronize(scratch.stream), "cudaStreamSynchronize");
  }();
  cudaSetDevice(previous);
  if (!status.ok()) return status;
  return CheckPlanAgreement(hashes);
}

#endif  // STOWAGE_HAVE_NCCL

}  // namespace stowage::runtime
