#include "base/bytes.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stowage {

std::string FormatBytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= kGiB) return absl::StrFormat("%.1f GiB", b / kGiB);
  if (bytes >= kMiB) return absl::StrFormat("%.1f MiB", b / kMiB);
  if (bytes >= kKiB) return absl::StrFormat("%.1f KiB", b / kKiB);
  return absl::StrCat(bytes, " B");
}

std::string FormatBytesExact(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= kGiB) return absl::StrFormat("%.2f GiB (%d bytes)", b / kGiB, bytes);
  if (bytes >= kMiB) return absl::StrFormat("%.2f MiB (%d bytes)", b / kMiB, bytes);
  return absl::StrFormat("%d bytes", bytes);
}

}  // namespace stowage
