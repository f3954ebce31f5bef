#include <gtest/gtest.h>

#include <string>

#include "stowage/stowage.h"

namespace {

TEST(CApi, StatusStringsAndOptionsDefaults) {
  EXPECT_STREQ(stowage_status_string(STOWAGE_OK), "OK");
  EXPECT_STREQ(stowage_status_string(STOWAGE_ERROR_DATA_LOSS), "DATA_LOSS");
  stowage_options options;
  ASSERT_EQ(stowage_options_init(&options), STOWAGE_OK);
  EXPECT_EQ(options.struct_size, sizeof(stowage_options));
  EXPECT_EQ(options.backend, STOWAGE_BACKEND_AUTO);
  EXPECT_EQ(options.numa_node, -1);
  EXPECT_EQ(stowage_options_init(nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stowage_last_error()).find("options"), std::string::npos);
}

}  // namespace
