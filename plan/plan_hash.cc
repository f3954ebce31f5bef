// CanonicalPlanHash (include/stowage/plan.h).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <string>

#include "stowage/plan.h"

namespace stowage {

uint64_t CanonicalPlanHash(const Plan& plan) {
  const std::string canonical = PlanToJson(plan);
  return static_cast<uint64_t>(XXH3_64bits(canonical.data(), canonical.size()));
}

}  // namespace stowage
