// NCCL's entry points, taken at run time rather than linked: the table of the functions stowage
// calls, where they are found, and RAII for the library and for communicators stowage makes.
// Built only with NCCL (STOWAGE_HAVE_NCCL, nccl.h on the include path: stowage::nccl;
// cmake/StowageCuda.cmake says why the library is not linked). Include only from code guarded
// by STOWAGE_HAVE_NCCL.
//
// Note [NCCL from the process]. The communicator belongs to the NCCL library the trainer loaded
// (PyTorch wheels ship their own libnccl.so.2, C++ trainers link theirs), and a communicator must
// only be used by the library that created it. So stowage does not link NCCL: it compiles against
// nccl.h for the types and takes the functions from the process at call time (dlsym of
// RTLD_DEFAULT), falling back to dlopen("libnccl.so.2") only when none is loaded. libstowage.so
// thus loads on machines without NCCL, and only stowage_agree_nccl needs it.
#ifndef STOWAGE_OFFLOAD_CUDA_NCCL_API_H_
#define STOWAGE_OFFLOAD_CUDA_NCCL_API_H_

#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stowage::offload {

// The NCCL functions stowage calls, all from one library. A library dlopen loaded for the table is
// closed with it.
class NcclApi {
 public:
  // For a communicator the caller made (Note [NCCL from the process]): the functions of the NCCL
  // already in this process, else those of libnccl.so.2. UNAVAILABLE when neither has them all.
  static absl::StatusOr<std::unique_ptr<NcclApi>> FromProcess();
  // For communicators stowage makes itself, where any NCCL will do: libnccl.so.2, else the
  // library found at configure (STOWAGE_NCCL_LIBRARY). UNAVAILABLE when none loads or the one
  // that does lacks an entry point.
  static absl::StatusOr<std::unique_ptr<NcclApi>> Open();

  NcclApi(const NcclApi&) = delete;
  NcclApi& operator=(const NcclApi&) = delete;
  ~NcclApi();

  // OK for ncclSuccess, else INTERNAL "<what>: <NCCL's error string>".
  absl::Status Ok(ncclResult_t result, const std::string& what) const;

  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommCount) comm_count = nullptr;
  decltype(&ncclCommUserRank) user_rank = nullptr;
  decltype(&ncclCommCuDevice) cu_device = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;

 private:
  NcclApi() = default;
  // Every entry point above from `handle` (RTLD_DEFAULT or a dlopen handle); false when one is
  // missing.
  bool Resolve(void* handle);

  void* library_ = nullptr;  // dlopen's handle; null for the process's own NCCL
};

// One communicator per local GPU (ncclCommInitAll), destroyed with it.
class NcclClique {
 public:
  explicit NcclClique(const NcclApi& api) : api_(api) {}
  NcclClique(const NcclClique&) = delete;
  NcclClique& operator=(const NcclClique&) = delete;
  ~NcclClique();
  absl::Status Init(int gpus);
  ncclComm_t operator[](int i) const { return comms_[i]; }

 private:
  const NcclApi& api_;
  std::vector<ncclComm_t> comms_;
};

}  // namespace stowage::offload

#endif  // STOWAGE_OFFLOAD_CUDA_NCCL_API_H_
