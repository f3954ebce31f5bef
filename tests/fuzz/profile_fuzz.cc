// libFuzzer harness: the measured layer-profile reader (planner/frameworks/layer_profile.cc's
// ParseProfileJson). A profile it accepts writes back to JSON that reads back unchanged, and its
// step cost is either refused with an error or planned (optimizer and simulator) without UB or a
// wrapped peak; a pipelined profile's stages likewise (PlanPipeline, its pp microbatches).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "planner/frameworks/layer_profile.h"
#include "planner/search/optimizer.h"
#include "planner/search/pipeline.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stowage::planner;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto profile = ParseProfileJson(text, "fuzz");
  if (!profile.ok()) {
    STOWAGE_FUZZ_CHECK(!profile.status().message().empty(), "an error without a message");
    return 0;
  }
  const std::string json = ProfileToJson(*profile);
  auto again = ParseProfileJson(json, "fuzz (written back)");
  STOWAGE_FUZZ_CHECK(again.ok(), "written profile does not read back: %s",
                     std::string(again.status().message()).c_str());
  STOWAGE_FUZZ_CHECK(ProfileToJson(*again) == json, "round trip changed the profile");
  auto step = BuildStepCostFromProfile(*profile, HardwareForProfile(*profile));
  if (!step.ok() || step->layers.size() > 64) return 0;
  OptimizerOptions options;
  options.gpu_budget_bytes = 1ull << 40;
  options.host_budget_bytes = 1ull << 40;
  options.node_limit = 200;
  const OptimizeResult r = Optimize(*step, options);
  if (r.feasible) {
    STOWAGE_FUZZ_CHECK(r.sim.peak_bytes <= options.gpu_budget_bytes, "a feasible plan over budget");
    STOWAGE_FUZZ_CHECK(r.sim.step_seconds >= 0, "negative step time");
  }
  if (!profile->pipeline.has_value() || profile->pipeline->pp > 8) return 0;
  auto pipeline =
      PlanPipeline(*profile, HardwareForProfile(*profile), profile->pipeline->pp, options);
  if (!pipeline.ok()) {
    STOWAGE_FUZZ_CHECK(!pipeline.status().message().empty(), "an error without a message");
    return 0;
  }
  STOWAGE_FUZZ_CHECK(pipeline->stages.size() == static_cast<size_t>(profile->pipeline->pp),
                     "%zu stages planned of %d", pipeline->stages.size(), profile->pipeline->pp);
  for (const StageResult& stage : pipeline->stages) {
    if (!stage.result.feasible) continue;
    STOWAGE_FUZZ_CHECK(stage.result.sim.peak_bytes <= options.gpu_budget_bytes,
                       "a feasible stage over budget");
  }
  STOWAGE_FUZZ_CHECK(pipeline->step_seconds >= 0, "negative pipeline step time");
  return 0;
}
