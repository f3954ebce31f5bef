// libFuzzer harness: the Hugging Face config.json reader (planner/model/model.cc's
// ParseHfConfigJson). Whatever the input: a model or an error, never a crash, UB (UBSan) or a huge
// allocation; a model it accepts validates and, when shallow enough to be quick, costs out without
// overflow.
#include <cstddef>
#include <cstdint>
#include <string>

#include "planner/cost/cost_model.h"
#include "planner/frameworks/step_cost.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "planner/search/simulator.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stowage::planner;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto model = ParseHfConfigJson(text, "fuzz");
  if (!model.ok()) {
    STOWAGE_FUZZ_CHECK(!model.status().message().empty(), "an error without a message");
    return 0;
  }
  STOWAGE_FUZZ_CHECK(ValidateModel(*model).ok(), "accepted but invalid: %s",
                     std::string(ValidateModel(*model).message()).c_str());
  if (model->num_layers() > 256) return 0;
  static const HardwareProfile hardware = *HardwarePreset("h200");
  RunSettings run;
  run.seq_len = 32768;
  run.cp = 1;
  run.ep = 1;
  run.gpus = 1;
  auto step = BuildStepCost(*model, hardware, run);
  if (!step.ok()) return 0;  // e.g. heads not divisible; the error is the answer
  Schedule schedule;
  schedule.options.assign(step->layers.size(),
                          LayerOption{stowage::LayerPolicy::kOffloadInput, 0, 2});
  const SimResult sim = Simulate(*step, schedule, /*record=*/false);
  STOWAGE_FUZZ_CHECK(sim.step_seconds >= 0 && sim.step_seconds == sim.step_seconds, "step time %g",
                     sim.step_seconds);
  return 0;
}
