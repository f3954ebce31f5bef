#include "planner/hardware/hardware.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "planner/hardware/op_time.h"

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

// Note [SDPA on sm90]: the H100-die presets time attention as cuDNN 9.19 ran it on an H200 in
// cudnn-frontend's benchmark (llama3.1_20260227_034703.csv, 16384 tokens, 64 query heads over 8,
// head dim 128, causal, bf16): forward 6.531 ms, backward 19.002 ms of device time. The FLOPs are
// counted as the recipes count them (the hf recipe's AttentionCore, megatron.cc): 2 heads
// (dqk + dv) per key, s / 2 keys per query under the causal mask, backward 2.5x the forward.
TEST(HardwarePreset, H100DieAttentionIsCudnnOnH200) {
  const double s = 16384, heads = 64, d = 128;
  const double forward = 2 * heads * (d + d) * (s / 2) * s;
  for (const std::string name : {"h200", "h800"}) {
    const HardwareProfile hw = *HardwarePreset(name);
    EXPECT_NEAR(OpSeconds({.attention_forward_flops = forward}, hw), 6.531e-3, 0.01e-3) << name;
    EXPECT_NEAR(OpSeconds({.attention_backward_flops = 2.5 * forward}, hw), 19.002e-3, 0.03e-3)
        << name;
  }
  // The presets that were not measured keep the FlashAttention-3 paper's cuDNN figures on H100
  // (539 and 516 TFLOP/s, Note [Op rates]).
  const HardwareProfile b200 = *HardwarePreset("b200");
  EXPECT_DOUBLE_EQ(b200.flash_forward_efficiency, 539.0 / 989.0);
  EXPECT_DOUBLE_EQ(b200.flash_backward_efficiency, 516.0 / 989.0);
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
  EXPECT_THAT(bad.status().message(), HasSubstr("allowed: h200, h800, b200, gb200"));
}

// Note [Topology]: an HGX board is one NVLink domain of 8 with a NIC per GPU; an NVL72 rack is
// one domain of 72, and the two GPUs of a superchip share the Grace's 512 GB/s.
TEST(HardwarePreset, TopologyFromTheDatasheets) {
  const HardwareProfile h200 = *HardwarePreset("h200");
  EXPECT_EQ(h200.nvlink_domain_gpus, 8);
  EXPECT_EQ(h200.gpus_per_node, 8);
  EXPECT_DOUBLE_EQ(h200.nvlink_bytes_per_second, 450e9);
  EXPECT_DOUBLE_EQ(h200.NetworkBytesPerSecond(), 50e9);
  EXPECT_DOUBLE_EQ(h200.SharedHostLinkRate(55.3e9), 55.3e9);  // own PCIe link per GPU
  const HardwareProfile gb200 = *HardwarePreset("gb200");
  EXPECT_EQ(gb200.nvlink_domain_gpus, 72);
  EXPECT_EQ(gb200.gpus_per_node, 4);
  EXPECT_DOUBLE_EQ(gb200.SharedHostLinkRate(450e9), 256e9);
  HardwareProfile shared = h200;
  shared.gpus_per_nic = 2;
  shared.gpus_per_host_link = 4;
  shared.host_link_bytes_per_second = 110.6e9;  // one x16 uplink behind a switch of four
  EXPECT_DOUBLE_EQ(shared.NetworkBytesPerSecond(), 25e9);
  EXPECT_DOUBLE_EQ(shared.SharedHostLinkRate(55.3e9), 27.65e9);
  EXPECT_TRUE(ValidateHardwareProfile(shared).ok());
}

TEST(HardwareProfileJson, OldProfilesWithoutTopologyReadAsOneGpu) {
  auto p = ParseHardwareProfileJson(R"({"hbm_bytes": 1073741824, "hbm_bytes_per_second": 1e12,
      "dense_bf16_flops": 1e15, "d2h_bytes_per_second": 5e10, "h2d_bytes_per_second": 4e10})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->nvlink_domain_gpus, 1);
  EXPECT_EQ(p->gpus_per_node, 1);
  EXPECT_EQ(p->nvlink_bytes_per_second, 0);
  EXPECT_EQ(p->nic_bytes_per_second, 0);
  EXPECT_DOUBLE_EQ(p->SharedHostLinkRate(5e10), 5e10);
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
  auto p = ParseHardwareProfileJson(R"({"hbm_bytes": 1073741824, "hbm_bytes_per_second": 1e12,
      "dense_bf16_flops": 1e15, "d2h_bytes_per_second": 5e10, "h2d_bytes_per_second": 4e10})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->source, "measured");
  EXPECT_DOUBLE_EQ(p->bidir_d2h_bytes_per_second, 5e10);
  EXPECT_DOUBLE_EQ(p->bidir_h2d_bytes_per_second, 4e10);
}

TEST(HardwareProfileJson, ErrorsNameTheField) {
  EXPECT_THAT(ParseHardwareProfileJson("[").status().message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseHardwareProfileJson(R"({"hbm_bytes": 1073741824})").status().message(),
              HasSubstr("missing field 'hbm_bytes_per_second'"));
  std::string json = HardwareProfileToJson(*HardwarePreset("h200"));
  std::string bad = json;
  bad.replace(bad.find("\"usable_fraction\": 0.92"), 23, "\"usable_fraction\": 1.5");
  EXPECT_THAT(ParseHardwareProfileJson(bad).status().message(),
              HasSubstr("field 'usable_fraction' has value 1.5; allowed: a finite number in"));
  bad = json;
  bad.replace(bad.find("\"source\": \"measured\""), 20, "\"source\": \"guess\"");
  EXPECT_THAT(ParseHardwareProfileJson(bad).status().message(), HasSubstr("allowed: measured"));
  EXPECT_FALSE(ReadHardwareProfileFile("no/such/profile.json").ok());
}

// A profile with one field replaced by `value` (JSON text).
std::string WithField(const std::string& field, const std::string& value) {
  nlohmann::ordered_json j =
      nlohmann::ordered_json::parse(HardwareProfileToJson(*HardwarePreset("h200")));
  j[field] = nlohmann::ordered_json::parse(value);
  return j.dump();
}

// Regression: the old reader took `hbm_bytes: -1` as 2^64-1 and planned against a
// 16 EiB budget; 1.5 became 1, true became 1, and 1e30 for a uint64 field was undefined
// behaviour inside nlohmann's conversion.
TEST(HardwareProfileJson, LooseNumbersAreErrorsNamingFieldValueAndRange) {
  struct Case {
    std::string field, value, shown;
  };
  for (const Case& c : std::vector<Case>{
           {"hbm_bytes", "-1", "-1"},
           {"hbm_bytes", "1.5", "1.5"},
           {"hbm_bytes", "true", "true"},
           {"hbm_bytes", "1e30", "1e+30"},
           {"hbm_bytes", "\"80G\"", "\"80G\""},
           {"hbm_bytes", "18446744073709551615", "18446744073709551615"},
           {"gpus_per_numa_node", "4294967297", "4294967297"},
           {"gpus_per_numa_node", "0", "0"},
           {"host_bytes_per_numa_node", "-5", "-5"},
           {"d2h_bytes_per_second", "-1", "-1"},
           {"d2h_bytes_per_second", "0", "0"},
           {"dense_bf16_flops", "1e300", "1e+300"},
           {"usable_fraction", "0", "0"},
           {"gemm_efficiency", "false", "false"},
           {"gemm_efficiency", "0", "0"},
           {"dense_fp32_flops", "0", "0"},
           {"dense_fp32_flops", "\"67T\"", "\"67T\""},
           {"fp32_gemm_efficiency", "1.5", "1.5"},
           {"fp32_gemm_efficiency", "0", "0"},
           {"flash_forward_efficiency", "1.5", "1.5"},
           {"flash_backward_efficiency", "-0.5", "-0.5"},
           {"grouped_gemm_efficiency", "2", "2"},
           {"grouped_gemm_half_tokens", "-1", "-1"},
           {"grouped_gemm_half_tokens", "1e9", "1000000000"},
           {"torch_grouped_mm_efficiency", "0", "0"},
           {"torch_grouped_mm_efficiency", "1.5", "1.5"},
           {"torch_grouped_mm_half_tokens", "-64", "-64"},
           {"elementwise_efficiency", "0", "0"},
           {"kernel_seconds", "1", "1"},
           {"kernel_seconds", "-1e-6", "-1e-06"},
           {"name", "7", "7"},
           {"nvlink_domain_gpus", "0", "0"},
           {"gpus_per_nic", "1.5", "1.5"},
           {"gpus_per_host_link", "2000", "2000"},
           {"nic_bytes_per_second", "5", "5"},
           {"nvlink_bytes_per_second", "-1", "-1"},
           {"all_to_all_bytes_per_second", "1e16", "1e+16"},
           {"network_latency_seconds", "-1e-6", "-1e-06"},
       }) {
    auto p = ParseHardwareProfileJson(WithField(c.field, c.value), "hardware profile x.json");
    ASSERT_FALSE(p.ok()) << c.field << " = " << c.value;
    EXPECT_THAT(p.status().message(),
                HasSubstr("hardware profile x.json: field '" + c.field + "' has value " + c.shown))
        << c.value;
    EXPECT_THAT(p.status().message(), HasSubstr("allowed: ")) << c.value;
  }
}

TEST(HardwareProfileJson, ChunkTableErrorsNameTheElementPath) {
  auto p = ParseHardwareProfileJson(
      WithField("chunk_bandwidth",
                R"([{"chunk_bytes": 1024, "d2h_bytes_per_second": 1e9, "h2d_bytes_per_second": 1e9},
                    {"chunk_bytes": -1, "d2h_bytes_per_second": 1e9, "h2d_bytes_per_second": 1e9}])"));
  EXPECT_THAT(p.status().message(),
              HasSubstr("field 'chunk_bandwidth[1].chunk_bytes' has value -1"));
  p = ParseHardwareProfileJson(WithField("chunk_bandwidth", "[3]"));
  EXPECT_THAT(p.status().message(), HasSubstr("field 'chunk_bandwidth[0]' has value 3"));
  p = ParseHardwareProfileJson(WithField("chunk_bandwidth", "{}"));
  EXPECT_THAT(p.status().message(), HasSubstr("allowed: a JSON array"));
}

TEST(HardwareProfileJson, SyntaxErrorsGiveLineAndColumn) {
  auto p = ParseHardwareProfileJson("{\n  \"hbm_bytes\": 1,\n  oops\n}", "hardware profile y.json");
  EXPECT_THAT(p.status().message(), HasSubstr("hardware profile y.json: not valid JSON at line 3"));
}

TEST(HardwareProfile, ValidateUsesTheReadersRanges) {
  HardwareProfile p = *HardwarePreset("h200");
  p.hbm_bytes = ~0ull;
  EXPECT_THAT(ValidateHardwareProfile(p).message(),
              HasSubstr("'hbm_bytes' is 18446744073709551615"));
  p = *HardwarePreset("h200");
  p.gpus_per_numa_node = 0;
  EXPECT_THAT(ValidateHardwareProfile(p).message(), HasSubstr("'gpus_per_numa_node' is 0"));
}

// Points on R * t / (t + half) give back R and half; fewer than two distinct t, or rates that
// fall with t, are errors saying so.
TEST(FitSaturatingRate, RecoversTheCurveAndRefusesWhatIsNotOne) {
  const double r = 5e14, half = 100;
  std::vector<std::pair<double, double>> points;
  for (double t : {50.0, 200.0, 800.0}) points.emplace_back(t, r * t / (t + half));
  absl::StatusOr<SaturatingRate> fit = FitSaturatingRate(points);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->flops_per_second, r, 1e-9 * r);
  EXPECT_NEAR(fit->half_tokens, half, 1e-9 * half);
  EXPECT_THAT(FitSaturatingRate({{512, 4e14}}).status().message(), HasSubstr("two distinct"));
  EXPECT_THAT(FitSaturatingRate({{512, 4e14}, {512, 5e14}}).status().message(),
              HasSubstr("two distinct"));
  EXPECT_THAT(FitSaturatingRate({{100, 5e14}, {1000, 2e14}}).status().message(),
              HasSubstr("does not rise"));
  EXPECT_THAT(FitSaturatingRate({{0, 5e14}, {1000, 2e14}}).status().message(),
              HasSubstr("must be > 0"));
}

// bench/bench_grouped_mm.py's JSON, shaped as it writes it (fields the reader does not use
// included): the routed points give the share and half; the aligned one is not fitted.
std::string BenchJson(const std::vector<std::pair<double, double>>& routed) {
  nlohmann::ordered_json j = {{"kernel", "torch._grouped_mm"},
                              {"device", "NVIDIA H200"},
                              {"torch", "2.11.0+cu130"},
                              {"experts", 128},
                              {"dense_mm_flops_per_second", 7e14}};
  j["points"] = nlohmann::ordered_json::array();
  for (auto [t, rate] : routed) {
    j["points"].push_back({{"rows_per_expert", t},
                           {"routing", "routed"},
                           {"flops", 1e12},
                           {"seconds", {{"gate_up.forward", 1e-3}}},
                           {"flops_per_second", rate}});
  }
  j["points"].push_back(
      {{"rows_per_expert", 512}, {"routing", "aligned"}, {"flops_per_second", 9e14}});
  return j.dump(2);
}

TEST(TorchGroupedMmRates, RoutedPointsGiveTheShareAndHalf) {
  HardwareProfile p = *HardwarePreset("h200");
  const double r = 0.6 * p.dense_bf16_flops, half = 80;
  std::vector<std::pair<double, double>> routed;
  for (double t : {256.0, 512.0, 1024.0, 2048.0}) routed.emplace_back(t, r * t / (t + half));
  absl::StatusOr<std::string> line = ApplyTorchGroupedMmRates(BenchJson(routed), "rates.json", p);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_NEAR(p.torch_grouped_mm_efficiency, 0.6, 1e-9);
  EXPECT_NEAR(p.torch_grouped_mm_half_tokens, 80, 1e-6);
  EXPECT_THAT(*line, HasSubstr("torch._grouped_mm: 0.600 share, half of it at 80 rows/expert"));
  // TE's class is untouched, and the profile stays one the reader takes back.
  EXPECT_DOUBLE_EQ(p.grouped_gemm_efficiency, HardwarePreset("h200")->grouped_gemm_efficiency);
  absl::StatusOr<HardwareProfile> again = ParseHardwareProfileJson(HardwareProfileToJson(p));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_DOUBLE_EQ(again->torch_grouped_mm_efficiency, p.torch_grouped_mm_efficiency);

  // One routed point: the share at the profile's half point (64): rate x (t + 64) / t.
  HardwareProfile one = *HardwarePreset("h200");
  ASSERT_TRUE(ApplyTorchGroupedMmRates(BenchJson({{512, 480.5e12}}), "one.json", one).ok());
  EXPECT_NEAR(one.torch_grouped_mm_efficiency, 480.5e12 / one.dense_bf16_flops * 576 / 512, 1e-12);
  EXPECT_DOUBLE_EQ(one.torch_grouped_mm_half_tokens, 64);
}

TEST(TorchGroupedMmRates, ErrorsNameTheFieldValueAndRange) {
  HardwareProfile p = *HardwarePreset("h200");
  const HardwareProfile before = p;
  auto error = [&](const std::string& json) {
    absl::StatusOr<std::string> line = ApplyTorchGroupedMmRates(json, "rates.json", p);
    return line.ok() ? std::string("ok") : std::string(line.status().message());
  };
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(BenchJson({{512, 4.8e14}}));
  j["kernel"] = "cublas";
  EXPECT_THAT(error(j.dump()), HasSubstr("rates.json: field 'kernel' has value \"cublas\""));
  j = nlohmann::ordered_json::parse(BenchJson({{512, 4.8e14}}));
  j["points"][0]["routing"] = "random";
  EXPECT_THAT(error(j.dump()), HasSubstr("field 'points[0].routing' has value \"random\""));
  j = nlohmann::ordered_json::parse(BenchJson({{512, 4.8e14}}));
  j["points"][0]["flops_per_second"] = -1;
  EXPECT_THAT(error(j.dump()), HasSubstr("field 'points[0].flops_per_second' has value -1"));
  j = nlohmann::ordered_json::parse(BenchJson({{512, 4.8e14}}));
  j["points"].erase(0);
  EXPECT_THAT(error(j.dump()), HasSubstr("\"routing\": \"routed\""));
  EXPECT_THAT(error(BenchJson({{256, 5e14}, {2048, 2e14}})), HasSubstr("does not rise"));
  EXPECT_THAT(error("{"), HasSubstr("not valid JSON"));
  // A failed read leaves the profile as it was.
  EXPECT_DOUBLE_EQ(p.torch_grouped_mm_efficiency, before.torch_grouped_mm_efficiency);
}

}  // namespace
}  // namespace stowage::planner
