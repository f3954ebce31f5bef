// libFuzzer harness: the plan reader and validator (ParsePlanJson + ValidatePlan, the contract
// the runtime trusts). A plan that reads and validates writes back to JSON that reads and
// validates again, unchanged.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "stowage/plan.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto plan = stowage::ParsePlanJson(text);
  if (!plan.ok()) {
    STOWAGE_FUZZ_CHECK(!plan.status().message().empty(), "an error without a message");
    return 0;
  }
  if (!stowage::ValidatePlan(*plan).ok()) return 0;
  const std::string json = stowage::PlanToJson(*plan);
  auto again = stowage::ParsePlanJson(json);
  STOWAGE_FUZZ_CHECK(again.ok(), "a valid plan written back does not read: %s",
                     std::string(again.status().message()).c_str());
  STOWAGE_FUZZ_CHECK(stowage::ValidatePlan(*again).ok(), "a valid plan read back is invalid: %s",
                     std::string(stowage::ValidatePlan(*again).message()).c_str());
  STOWAGE_FUZZ_CHECK(stowage::PlanToJson(*again) == json, "round trip changed the plan");
  return 0;
}
