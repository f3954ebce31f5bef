// Uses one symbol from each installed library; exits non-zero if any is not what it should be.
#include <cstdio>
#include <cstring>

#include "stowage/plan.h"
#include "stowage/stowage.h"

int main() {
  stowage::Plan plan;
  auto parsed = stowage::ParsePlanJson(stowage::PlanToJson(plan));
  if (!parsed.ok()) {
    std::fprintf(stderr, "plan round trip failed: %s\n", parsed.status().ToString().c_str());
    return 1;
  }
  stowage_options options;
  if (stowage_options_init(&options) != STOWAGE_OK) return 1;
  if (std::strlen(stowage_version()) == 0) return 1;
  std::printf("stowage %s consumer ok\n", stowage_version());
  return 0;
}
