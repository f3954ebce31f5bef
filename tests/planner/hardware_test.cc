#include "planner/hardware.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stowage::planner {
namespace {

using ::testing::HasSubstr;

TEST(HardwarePreset, H200CarriesTheMeasuredFigures) {
  auto h200 = HardwarePreset("H200");
  ASSERT_TRUE(h200.ok()) << h200.status();
  EXPECT_EQ(h200->source, "measured");
  EXPECT_DOUBLE_EQ(h200->d2h_bytes_per_second, 55.3e9);
  EXPECT_DOUBLE_EQ(h200->bidir_h2d_bytes_per_second, 51.9e9);
  EXPECT_DOUBLE_EQ(h200->pin_seconds_per_gib, 0.038);
  EXPECT_TRUE(ValidateHardwareProfile(*h200).ok());
}

TEST(HardwarePreset, OthersAreMarkedDatasheetAndValid) {
  for (const std::string& name : HardwarePresetNames()) {
    auto p = HardwarePreset(name);
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_TRUE(ValidateHardwareProfile(*p).ok()) << name;
    if (name != "h200") {
      EXPECT_EQ(p->source, "datasheet") << name;
    }
    EXPECT_GT(p->UsableBytes(), 0u);
    EXPECT_GT(p->HostBytesPerGpu(), 0u);
  }
  auto bad = HardwarePreset("a100");
  EXPECT_THAT(bad.status().message(), HasSubstr("'a100'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("allowed: h200, b200, gb200"));
}

TEST(HardwareProfileJson, RoundTripsExactly) {
  for (const std::string& name : HardwarePresetNames()) {
    const HardwareProfile p = *HardwarePreset(name);
    const std::string json = HardwareProfileToJson(p);
    auto parsed = ParseHardwareProfileJson(json);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(HardwareProfileToJson(*parsed), json);
    EXPECT_EQ(parsed->chunk_bandwidth.size(), p.chunk_bandwidth.size());
  }
}

TEST(HardwareProfileJson, MinimalProfileGetsDefaults) {
  auto p = ParseHardwareProfileJson(R"({"hbm_bytes": 1000, "hbm_bytes_per_second": 1e12,
      "dense_bf16_flops": 1e15, "d2h_bytes_per_second": 5e10, "h2d_bytes_per_second": 4e10})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->source, "measured");
  EXPECT_DOUBLE_EQ(p->bidir_d2h_bytes_per_second, 5e10);
  EXPECT_DOUBLE_EQ(p->bidir_h2d_bytes_per_second, 4e10);
}

TEST(HardwareProfileJson, ErrorsNameTheField) {
  EXPECT_THAT(ParseHardwareProfileJson("[").status().message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseHardwareProfileJson(R"({"hbm_bytes": 1})").status().message(),
              HasSubstr("missing field 'hbm_bytes_per_second'"));
  std::string json = HardwareProfileToJson(*HardwarePreset("h200"));
  std::string bad = json;
  bad.replace(bad.find("\"usable_fraction\": 0.92"), 23, "\"usable_fraction\": 1.5");
  EXPECT_THAT(ParseHardwareProfileJson(bad).status().message(),
              HasSubstr("'usable_fraction' is 1.5"));
  bad = json;
  bad.replace(bad.find("\"source\": \"measured\""), 20, "\"source\": \"guess\"");
  EXPECT_THAT(ParseHardwareProfileJson(bad).status().message(), HasSubstr("allowed: measured"));
  EXPECT_FALSE(ReadHardwareProfileFile("no/such/profile.json").ok());
}

}  // namespace
}  // namespace stowage::planner
