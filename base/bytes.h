// Byte units and the two ways stowage writes a byte count for people: FormatBytes in reports
// (one decimal, the largest binary unit: "1.5 GiB"), FormatBytesExact in admission and
// allocation errors, where the exact count is what a reader compares against a limit
// ("1.50 GiB (1610612736 bytes)").
#ifndef STOWAGE_BASE_BYTES_H_
#define STOWAGE_BASE_BYTES_H_

#include <cstdint>
#include <string>

namespace stowage {

inline constexpr uint64_t kKiB = uint64_t{1} << 10;
inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;

// "512 B", "1.5 KiB", "2.0 MiB", "144.5 GiB".
std::string FormatBytes(uint64_t bytes);

// "812 bytes", "2.00 MiB (2097152 bytes)", "1.50 GiB (1610612736 bytes)".
std::string FormatBytesExact(uint64_t bytes);

}  // namespace stowage

#endif  // STOWAGE_BASE_BYTES_H_
