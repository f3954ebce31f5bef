// AgreeOverNccl (runtime/plan_agreement.h).
//
// Note [NCCL from the process]. The communicator belongs to the NCCL library the trainer loaded
// (PyTorch wheels ship their own libnccl.so.2, C++ trainers link theirs), and a communicator must
// only be used by the library that created it. So stowage does not link NCCL: it compiles against
// nccl.h for the types and takes the functions from the process at call time (dlsym of
// RTLD_DEFAULT), falling back to dlopen("libnccl.so.2") only when none is loaded. libstowage.so
// thus loads on machines without NCCL, and only stowage_agree_nccl needs it.
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "runtime/plan_agreement.h"

#ifdef STOWAGE_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <vector>
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

struct NcclApi {
  decltype(&ncclCommCount) comm_count = nullptr;
  decltype(&ncclCommUserRank) user_rank = nullptr;
  decltype(&ncclCommCuDevice) cu_device = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

template <typename Fn>
bool Resolve(void* handle, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(handle, name));
  return *out != nullptr;
}

// Note [NCCL from the process].
absl::StatusOr<NcclApi> LoadNccl() {
  for (void* handle : {RTLD_DEFAULT, static_cast<void*>(nullptr)}) {
    if (handle == nullptr) handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) break;
    NcclApi api;
    if (Resolve(handle, "ncclCommCount", &api.comm_count) &&
        Resolve(handle, "ncclCommUserRank", &api.user_rank) &&
        Resolve(handle, "ncclCommCuDevice", &api.cu_device) &&
        Resolve(handle, "ncclAllGather", &api.all_gather) &&
        Resolve(handle, "ncclGetErrorString", &api.error_string)) {
      return api;
    }
  }
  const char* error = dlerror();
  return absl::UnavailableError(
      absl::StrCat("stowage_agree_nccl: no NCCL in this process and libnccl.so.2 cannot be loaded",
                   error != nullptr ? absl::StrCat(" (", error, ")") : std::string()));
}

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
  absl::StatusOr<NcclApi> api = LoadNccl();
  if (!api.ok()) return api.status();
  ncclComm_t comm = static_cast<ncclComm_t>(nccl_comm);
  auto nccl = [&](ncclResult_t result, const char* call) -> absl::Status {
    if (result == ncclSuccess) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("stowage_agree_nccl: ", call, ": ", api->error_string(result)));
  };
  int count = 0, rank = 0, device = 0;
  if (absl::Status s = nccl(api->comm_count(comm, &count), "ncclCommCount"); !s.ok()) return s;
  if (absl::Status s = nccl(api->user_rank(comm, &rank), "ncclCommUserRank"); !s.ok()) return s;
  if (absl::Status s = nccl(api->cu_device(comm, &device), "ncclCommCuDevice"); !s.ok()) return s;
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
            nccl(api->all_gather(mine, scratch.buffer, 1, ncclUint64, comm, scratch.stream),
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
