// libFuzzer harness: the hardware profile reader (planner/hardware/hardware.cc). Whatever the
// input, the reader returns a profile or an error; a profile it accepts validates, writes back to
// JSON that reads back to the same profile, and yields a step cost without overflow (UBSan).
#include <cstddef>
#include <cstdint>
#include <string>

#include "planner/cost/cost_model.h"
#include "planner/frameworks/step_cost.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stowage::planner;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto profile = ParseHardwareProfileJson(text, "fuzz");
  if (!profile.ok()) {
    STOWAGE_FUZZ_CHECK(!profile.status().message().empty(), "an error without a message");
    return 0;
  }
  STOWAGE_FUZZ_CHECK(ValidateHardwareProfile(*profile).ok(), "accepted but invalid");
  const std::string json = HardwareProfileToJson(*profile);
  auto again = ParseHardwareProfileJson(json, "fuzz (written back)");
  STOWAGE_FUZZ_CHECK(again.ok(), "written profile does not read back: %s",
                     std::string(again.status().message()).c_str());
  STOWAGE_FUZZ_CHECK(HardwareProfileToJson(*again) == json, "round trip changed the profile");
  // The extreme but accepted rates and sizes must not overflow the cost model.
  static const ModelConfig model = *ModelPreset("llama-3-8b");
  RunSettings run;
  run.seq_len = 8192;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 1;
  auto step = BuildStepCost(model, *profile, run);
  STOWAGE_FUZZ_CHECK(step.ok(), "valid profile, valid run, but: %s",
                     std::string(step.status().message()).c_str());
  return 0;
}
