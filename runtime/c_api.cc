// The C ABI (include/stowage/stowage.h): argument checks, status codes, the per-thread last
// error. No exception crosses this boundary.
#include <string>

#include "stowage/stowage.h"

namespace {
thread_local std::string last_error;

stowage_status Fail(stowage_status status, std::string message) {
  last_error = std::move(message);
  return status;
}
}  // namespace

extern "C" {

const char* stowage_version(void) { return "0.1.0"; }

const char* stowage_status_string(stowage_status status) {
  switch (status) {
    case STOWAGE_OK: return "OK";
    case STOWAGE_ERROR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case STOWAGE_ERROR_NOT_FOUND: return "NOT_FOUND";
    case STOWAGE_ERROR_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case STOWAGE_ERROR_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case STOWAGE_ERROR_UNAVAILABLE: return "UNAVAILABLE";
    case STOWAGE_ERROR_DATA_LOSS: return "DATA_LOSS";
    case STOWAGE_ERROR_INTERNAL: return "INTERNAL";
  }
  return "UNKNOWN";
}

const char* stowage_last_error(void) { return last_error.c_str(); }

stowage_status stowage_options_init(stowage_options* options) {
  if (options == nullptr) return Fail(STOWAGE_ERROR_INVALID_ARGUMENT, "options is NULL");
  *options = stowage_options{};
  options->struct_size = sizeof(stowage_options);
  options->backend = STOWAGE_BACKEND_AUTO;
  options->numa_node = -1;
  return STOWAGE_OK;
}

stowage_status stowage_create(const char*, size_t, const stowage_options*, stowage_runtime**) {
  return Fail(STOWAGE_ERROR_UNAVAILABLE, "the runtime is not implemented yet");
}

}  // extern "C"
