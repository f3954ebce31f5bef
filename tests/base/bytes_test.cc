#include "base/bytes.h"

#include <gtest/gtest.h>

namespace stowage {
namespace {

// Reports: one decimal in the largest binary unit.
TEST(FormatBytes, Units) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(3 * kMiB), "3.0 MiB");
  EXPECT_EQ(FormatBytes(1445 * kGiB / 10), "144.5 GiB");
}

// Admission and allocation errors: the exact count beside it.
TEST(FormatBytesExact, Units) {
  EXPECT_EQ(FormatBytesExact(512), "512 bytes");
  EXPECT_EQ(FormatBytesExact(3u << 20), "3.00 MiB (3145728 bytes)");
  EXPECT_EQ(FormatBytesExact(5 * kGiB / 2), "2.50 GiB (2684354560 bytes)");
}

}  // namespace
}  // namespace stowage
