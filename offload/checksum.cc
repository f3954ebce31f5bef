#include "offload/checksum.h"

#include <cstring>

namespace stowage::offload {
namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4Full;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t Round(uint64_t acc, uint64_t word) {
  return Rotl(acc + word * kPrime2, 31) * kPrime1;
}

}  // namespace

uint64_t Checksum64(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  // Four independent lanes keep the multiply units busy (several GB/s per core).
  uint64_t lane[4] = {kPrime1 + kPrime2, kPrime2, 0, -kPrime1};
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] = Round(lane[k], w);
    }
  }
  uint64_t h = Rotl(lane[0], 1) + Rotl(lane[1], 7) + Rotl(lane[2], 12) + Rotl(lane[3], 18);
  h ^= bytes * kPrime1;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = Rotl(h ^ Round(0, w), 27) * kPrime1 + kPrime2;
  }
  for (; i < bytes; ++i) h = Rotl(h ^ (p[i] * kPrime2), 11) * kPrime1;
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  return h;
}

}  // namespace stowage::offload
