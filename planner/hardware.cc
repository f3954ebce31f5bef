#include "planner/hardware.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace stowage::planner {
namespace {

using nlohmann::ordered_json;

constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kMiB = 1ull << 20;

// H200, PCIe Gen5 x16, figures from reference/h200-probe.log (DESIGN.md "Measured ceilings").
// The host side (2 sockets, 1 TiB and 4 GPUs per NUMA node) is the HGX H200 reference layout,
// since the probe VM's single node is not what training nodes look like.
HardwareProfile H200() {
  HardwareProfile p;
  p.name = "h200";
  p.source = "measured";
  p.hbm_bytes = 143771ull * kMiB;  // nvidia-smi memory.total
  p.usable_fraction = 0.92;
  p.hbm_bytes_per_second = 3930e9;  // stream copy, read + write
  p.dense_bf16_flops = 989e12;
  p.matmul_efficiency = 607.0 / 989.0;  // torch anchor, keep-everything MLP stack
  p.d2h_bytes_per_second = 55.3e9;
  p.h2d_bytes_per_second = 55.5e9;
  p.bidir_d2h_bytes_per_second = 50.7e9;
  p.bidir_h2d_bytes_per_second = 51.9e9;
  p.chunk_bandwidth = {{256ull << 10, 41.9e9, 35.5e9}, {1ull << 20, 50.4e9, 48.2e9},
                       {4ull << 20, 54.1e9, 53.4e9},   {16ull << 20, 55.1e9, 55.0e9},
                       {64ull << 20, 55.3e9, 55.4e9},  {256ull << 20, 55.3e9, 55.5e9}};
  p.pin_seconds_per_gib = 0.038;
  p.host_bytes_per_numa_node = 1024 * kGiB;
  p.gpus_per_numa_node = 4;
  return p;
}

// Datasheet values. The host link is PCIe Gen5 x16 (64 GB/s nominal per direction) derated by
// the efficiency measured on H200 (55.4 / 64); the pinning rate is H200's measured one.
HardwareProfile B200() {
  HardwareProfile p;
  p.name = "b200";
  p.source = "datasheet";
  p.hbm_bytes = 183359ull * kMiB;  // 180 GB HBM3e as the driver reports it
  p.usable_fraction = 0.92;
  p.hbm_bytes_per_second = 8e12;
  p.dense_bf16_flops = 2.25e15;
  p.matmul_efficiency = 0.6;
  p.d2h_bytes_per_second = 55.3e9;
  p.h2d_bytes_per_second = 55.5e9;
  p.bidir_d2h_bytes_per_second = 50.7e9;
  p.bidir_h2d_bytes_per_second = 51.9e9;
  p.pin_seconds_per_gib = 0.038;
  p.host_bytes_per_numa_node = 1024 * kGiB;  // DGX B200: 2 TiB, 2 sockets, 4 GPUs each
  p.gpus_per_numa_node = 4;
  return p;
}

// Datasheet values. Grace-Blackwell: the host link is NVLink-C2C (900 GB/s both directions);
// one Grace (480 GB LPDDR5X, one NUMA node) serves two GPUs.
HardwareProfile GB200() {
  HardwareProfile p;
  p.name = "gb200";
  p.source = "datasheet";
  p.hbm_bytes = 186ull * 1000 * 1000 * 1000;
  p.usable_fraction = 0.92;
  p.hbm_bytes_per_second = 8e12;
  p.dense_bf16_flops = 2.5e15;
  p.matmul_efficiency = 0.6;
  p.d2h_bytes_per_second = 450e9;
  p.h2d_bytes_per_second = 450e9;
  p.bidir_d2h_bytes_per_second = 450e9;
  p.bidir_h2d_bytes_per_second = 450e9;
  p.pin_seconds_per_gib = 0.038;
  p.host_bytes_per_numa_node = 480ull * 1000 * 1000 * 1000;
  p.gpus_per_numa_node = 2;
  return p;
}

template <typename T>
absl::Status Read(const ordered_json& j, const char* key, bool required, T& out) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (!required) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("hardware profile: missing field '", key, "'"));
  }
  try {
    out = it->template get<T>();
  } catch (const nlohmann::json::exception&) {
    return absl::InvalidArgumentError(absl::StrCat("hardware profile: field '", key, "' has value ",
                                                   it->dump(), " of the wrong type"));
  }
  return absl::OkStatus();
}

#define STOWAGE_HW_RETURN_IF_ERROR(expr) \
  do {                                   \
    absl::Status status_ = (expr);       \
    if (!status_.ok()) return status_;   \
  } while (0)

absl::Status Positive(const char* field, double value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("hardware profile: field '", field, "' is ", value, "; it must be positive"));
}

}  // namespace

uint64_t HardwareProfile::UsableBytes() const {
  return static_cast<uint64_t>(static_cast<double>(hbm_bytes) * usable_fraction);
}

uint64_t HardwareProfile::HostBytesPerGpu() const {
  return host_bytes_per_numa_node / static_cast<uint64_t>(std::max(1, gpus_per_numa_node));
}

double HardwareProfile::EffectiveFlops() const { return dense_bf16_flops * matmul_efficiency; }

std::vector<std::string> HardwarePresetNames() { return {"h200", "b200", "gb200"}; }

absl::StatusOr<HardwareProfile> HardwarePreset(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (name == "h200") return H200();
  if (name == "b200") return B200();
  if (name == "gb200") return GB200();
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown hardware preset '", name, "'; allowed: ", absl::StrJoin(HardwarePresetNames(), ", "),
      ", or a profile .json file"));
}

absl::Status ValidateHardwareProfile(const HardwareProfile& p) {
  if (p.source != "measured" && p.source != "datasheet") {
    return absl::InvalidArgumentError(absl::StrCat("hardware profile: field 'source' is '",
                                                   p.source, "'; allowed: measured, datasheet"));
  }
  STOWAGE_HW_RETURN_IF_ERROR(Positive("hbm_bytes", static_cast<double>(p.hbm_bytes)));
  if (!(p.usable_fraction > 0 && p.usable_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("hardware profile: field 'usable_fraction' is ",
                                                   p.usable_fraction, "; it must be in (0, 1]"));
  }
  if (!(p.matmul_efficiency > 0 && p.matmul_efficiency <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("hardware profile: field 'matmul_efficiency' is ", p.matmul_efficiency,
                     "; it must be in (0, 1]"));
  }
  STOWAGE_HW_RETURN_IF_ERROR(Positive("hbm_bytes_per_second", p.hbm_bytes_per_second));
  STOWAGE_HW_RETURN_IF_ERROR(Positive("dense_bf16_flops", p.dense_bf16_flops));
  STOWAGE_HW_RETURN_IF_ERROR(Positive("d2h_bytes_per_second", p.d2h_bytes_per_second));
  STOWAGE_HW_RETURN_IF_ERROR(Positive("h2d_bytes_per_second", p.h2d_bytes_per_second));
  STOWAGE_HW_RETURN_IF_ERROR(Positive("bidir_d2h_bytes_per_second", p.bidir_d2h_bytes_per_second));
  STOWAGE_HW_RETURN_IF_ERROR(Positive("bidir_h2d_bytes_per_second", p.bidir_h2d_bytes_per_second));
  if (p.pin_seconds_per_gib < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("hardware profile: field 'pin_seconds_per_gib' is ", p.pin_seconds_per_gib,
                     "; it must not be negative"));
  }
  if (p.gpus_per_numa_node < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("hardware profile: field 'gpus_per_numa_node' is ", p.gpus_per_numa_node,
                     "; it must be at least 1"));
  }
  for (size_t i = 0; i < p.chunk_bandwidth.size(); ++i) {
    const ChunkBandwidth& c = p.chunk_bandwidth[i];
    if (c.chunk_bytes == 0 || c.d2h_bytes_per_second <= 0 || c.h2d_bytes_per_second <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "hardware profile: chunk_bandwidth[", i,
          "] needs a positive chunk_bytes, d2h_bytes_per_second and h2d_bytes_per_second"));
    }
    if (i > 0 && c.chunk_bytes <= p.chunk_bandwidth[i - 1].chunk_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("hardware profile: chunk_bandwidth[", i,
                                                     "].chunk_bytes is ", c.chunk_bytes,
                                                     "; entries must be in ascending chunk_bytes"));
    }
  }
  return absl::OkStatus();
}

std::string HardwareProfileToJson(const HardwareProfile& p) {
  ordered_json j;
  j["name"] = p.name;
  j["source"] = p.source;
  j["hbm_bytes"] = p.hbm_bytes;
  j["usable_fraction"] = p.usable_fraction;
  j["hbm_bytes_per_second"] = p.hbm_bytes_per_second;
  j["dense_bf16_flops"] = p.dense_bf16_flops;
  j["matmul_efficiency"] = p.matmul_efficiency;
  j["d2h_bytes_per_second"] = p.d2h_bytes_per_second;
  j["h2d_bytes_per_second"] = p.h2d_bytes_per_second;
  j["bidir_d2h_bytes_per_second"] = p.bidir_d2h_bytes_per_second;
  j["bidir_h2d_bytes_per_second"] = p.bidir_h2d_bytes_per_second;
  ordered_json chunks = ordered_json::array();
  for (const ChunkBandwidth& c : p.chunk_bandwidth) {
    chunks.push_back({{"chunk_bytes", c.chunk_bytes},
                      {"d2h_bytes_per_second", c.d2h_bytes_per_second},
                      {"h2d_bytes_per_second", c.h2d_bytes_per_second}});
  }
  j["chunk_bandwidth"] = std::move(chunks);
  j["pin_seconds_per_gib"] = p.pin_seconds_per_gib;
  j["host_bytes_per_numa_node"] = p.host_bytes_per_numa_node;
  j["gpus_per_numa_node"] = p.gpus_per_numa_node;
  return j.dump(2) + "\n";
}

absl::StatusOr<HardwareProfile> ParseHardwareProfileJson(const std::string& text) {
  ordered_json j = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("hardware profile: not valid JSON");
  if (!j.is_object()) {
    return absl::InvalidArgumentError("hardware profile: the top level is not an object");
  }
  HardwareProfile p;
  p.source = "measured";
  STOWAGE_HW_RETURN_IF_ERROR(Read(j, "name", false, p.name));
  STOWAGE_HW_RETURN_IF_ERROR(Read(j, "source", false, p.source));
  STOWAGE_HW_RETURN_IF_ERROR(Read(j, "hbm_bytes", true, p.hbm_bytes));
  STOWAGE_HW_RETURN_IF_ERROR(Read(j, "usable_fraction", false, p.usable_fraction));
  STOWAGE_HW_RETURN_IF_ERROR(Read(j, "hbm_bytes_per_second", true, p.hbm_bytes_per_second));
  STOWAGE_HW_RETURN_IF_ERROR(Read(j, "dense_bf16_flops", true, p.dense_bf16_flops));
  STOWAGE_HW_RETURN_IF_ERROR(Read(j, "matmul_efficiency", false, p.matmul_efficiency));
  STOWAGE_HW_RETURN_IF_ERROR(Read(j, "d2h_bytes_per_second", true, p.d2h_bytes_per_second));
  STOWAGE_HW_RETURN_IF_ERROR(Read(j, "h2d_bytes_per_second", true, p.h2d_bytes_per_second));
  p.bidir_d2h_bytes_per_second = p.d2h_bytes_per_second;
  p.bidir_h2d_bytes_per_second = p.h2d_bytes_per_second;
  STOWAGE_HW_RETURN_IF_ERROR(
      Read(j, "bidir_d2h_bytes_per_second", false, p.bidir_d2h_bytes_per_second));
  STOWAGE_HW_RETURN_IF_ERROR(
      Read(j, "bidir_h2d_bytes_per_second", false, p.bidir_h2d_bytes_per_second));
  if (auto it = j.find("chunk_bandwidth"); it != j.end()) {
    if (!it->is_array()) {
      return absl::InvalidArgumentError(
          "hardware profile: field 'chunk_bandwidth' is not an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      const ordered_json& e = (*it)[i];
      if (!e.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat("hardware profile: chunk_bandwidth[", i, "] is not an object"));
      }
      ChunkBandwidth c;
      STOWAGE_HW_RETURN_IF_ERROR(Read(e, "chunk_bytes", true, c.chunk_bytes));
      STOWAGE_HW_RETURN_IF_ERROR(Read(e, "d2h_bytes_per_second", true, c.d2h_bytes_per_second));
      STOWAGE_HW_RETURN_IF_ERROR(Read(e, "h2d_bytes_per_second", true, c.h2d_bytes_per_second));
      p.chunk_bandwidth.push_back(c);
    }
  }
  STOWAGE_HW_RETURN_IF_ERROR(Read(j, "pin_seconds_per_gib", false, p.pin_seconds_per_gib));
  STOWAGE_HW_RETURN_IF_ERROR(
      Read(j, "host_bytes_per_numa_node", false, p.host_bytes_per_numa_node));
  STOWAGE_HW_RETURN_IF_ERROR(Read(j, "gpus_per_numa_node", false, p.gpus_per_numa_node));
  STOWAGE_HW_RETURN_IF_ERROR(ValidateHardwareProfile(p));
  return p;
}

absl::StatusOr<HardwareProfile> ReadHardwareProfileFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open hardware profile '", path, "'"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto profile = ParseHardwareProfileJson(buffer.str());
  if (!profile.ok()) {
    return absl::Status(profile.status().code(),
                        absl::StrCat(path, ": ", profile.status().message()));
  }
  if (profile->name.empty()) profile->name = path;
  return profile;
}

}  // namespace stowage::planner
