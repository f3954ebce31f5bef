// NcclApi and NcclClique (offload/cuda/nccl_api.h): NCCL's functions found at run time with
// dlsym, and the communicators stowage makes.
#include "offload/cuda/nccl_api.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace stowage::offload {

NcclApi::~NcclApi() {
  if (library_ != nullptr) dlclose(library_);
}

bool NcclApi::Resolve(void* handle) {
  auto get = [handle](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, symbol));
    return fn != nullptr;
  };
  return get(comm_count, "ncclCommCount") && get(user_rank, "ncclCommUserRank") &&
         get(cu_device, "ncclCommCuDevice") && get(all_gather, "ncclAllGather") &&
         get(get_error_string, "ncclGetErrorString") && get(comm_init_all, "ncclCommInitAll") &&
         get(comm_destroy, "ncclCommDestroy") && get(group_start, "ncclGroupStart") &&
         get(group_end, "ncclGroupEnd") && get(send, "ncclSend") && get(recv, "ncclRecv") &&
         get(reduce_scatter, "ncclReduceScatter");
}

// Note [NCCL from the process].
absl::StatusOr<std::unique_ptr<NcclApi>> NcclApi::FromProcess() {
  std::unique_ptr<NcclApi> api(new NcclApi());
  if (api->Resolve(RTLD_DEFAULT)) return api;
  api.reset(new NcclApi());
  api->library_ = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (api->library_ != nullptr && api->Resolve(api->library_)) return api;
  const char* error = dlerror();  // read before the library (if any) is closed
  return absl::UnavailableError(
      absl::StrCat("no NCCL in this process and libnccl.so.2 cannot be loaded",
                   error != nullptr ? absl::StrCat(" (", error, ")") : std::string()));
}

absl::StatusOr<std::unique_ptr<NcclApi>> NcclApi::Open() {
  std::unique_ptr<NcclApi> api(new NcclApi());
  std::vector<std::string> tried = {"libnccl.so.2"};
#ifdef STOWAGE_NCCL_LIBRARY
  tried.push_back(STOWAGE_NCCL_LIBRARY);
#endif
  std::string errors;
  for (const std::string& name : tried) {
    api->library_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (api->library_ != nullptr) break;
    const char* e = dlerror();
    absl::StrAppend(&errors, errors.empty() ? "" : "; ", e != nullptr ? e : name);
  }
  if (api->library_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("NCCL not found at run time (", errors, ")"));
  }
  if (!api->Resolve(api->library_)) {
    const char* error = dlerror();
    return absl::UnavailableError(
        absl::StrCat("the NCCL library lacks an entry point stowage uses",
                     error != nullptr ? absl::StrCat(" (", error, ")") : std::string()));
  }
  return api;
}

absl::Status NcclApi::Ok(ncclResult_t result, const std::string& what) const {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", get_error_string(result)));
}

NcclClique::~NcclClique() {
  for (ncclComm_t c : comms_) api_.comm_destroy(c);
}

absl::Status NcclClique::Init(int gpus) {
  comms_.assign(gpus, nullptr);
  absl::Status s = api_.Ok(api_.comm_init_all(comms_.data(), gpus, nullptr), "ncclCommInitAll");
  if (!s.ok()) comms_.clear();
  return s;
}

}  // namespace stowage::offload
