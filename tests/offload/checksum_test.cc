#include "offload/checksum.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

namespace stowage::offload {
namespace {

TEST(Checksum64, DetectsEverySingleBitFlipAndTruncation) {
  std::mt19937_64 rng(7);
  for (size_t size : {0u, 1u, 7u, 8u, 31u, 32u, 33u, 100u, 4096u + 5u}) {
    std::vector<unsigned char> buf(size);
    for (auto& b : buf) b = static_cast<unsigned char>(rng());
    const uint64_t base = Checksum64(buf.data(), buf.size());
    EXPECT_EQ(base, Checksum64(buf.data(), buf.size()));
    for (size_t i = 0; i < size; ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        buf[i] ^= static_cast<unsigned char>(1u << bit);
        EXPECT_NE(Checksum64(buf.data(), buf.size()), base) << "size " << size << " byte " << i;
        buf[i] ^= static_cast<unsigned char>(1u << bit);
      }
    }
    if (size > 0) {
      EXPECT_NE(Checksum64(buf.data(), size - 1), base);
    }
  }
}

TEST(Checksum64, SensitiveToWordOrderAndLength) {
  std::vector<uint64_t> words = {1, 2, 3, 4, 5, 6, 7, 8};
  const uint64_t a = Checksum64(words.data(), words.size() * 8);
  std::swap(words[0], words[1]);
  EXPECT_NE(Checksum64(words.data(), words.size() * 8), a);
  std::vector<unsigned char> zeros(64, 0);
  std::set<uint64_t> seen;
  for (size_t n = 0; n <= 64; ++n) seen.insert(Checksum64(zeros.data(), n));
  EXPECT_EQ(seen.size(), 65u);  // all-zero buffers of different lengths differ
}

TEST(Checksum64, IndependentOfAlignment) {
  std::vector<unsigned char> buf(1000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 31);
  std::vector<unsigned char> shifted(buf.size() + 3);
  std::copy(buf.begin(), buf.end(), shifted.begin() + 3);
  EXPECT_EQ(Checksum64(buf.data(), buf.size()), Checksum64(shifted.data() + 3, buf.size()));
}

}  // namespace
}  // namespace stowage::offload
