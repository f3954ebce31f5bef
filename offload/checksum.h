// Checksums for the integrity (verify) mode: every saved buffer is summed after its D2H lands
// and re-summed before its H2D, so host-side corruption is caught before it reaches gradients.
#ifndef STOWAGE_OFFLOAD_CHECKSUM_H_
#define STOWAGE_OFFLOAD_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

namespace stowage::offload {

// A fast 64-bit non-cryptographic checksum over `bytes` at `data` (any alignment, any size).
// Order-sensitive: swapped words, flipped bits and truncation all change it.
uint64_t Checksum64(const void* data, size_t bytes);

}  // namespace stowage::offload

#endif  // STOWAGE_OFFLOAD_CHECKSUM_H_
