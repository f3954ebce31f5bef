// The planning service behind the C ABI's stowage_plan_request and stowage_plan_evaluate: a JSON
// request in (a cost source — a measured layer profile, or a model config with hardware and run
// settings — plus budgets and options), a plan or a prediction out. Every language binding plans
// through here, so there is one planner. The request format is in docs/runtime-api.md ("Planning
// through the C ABI").
#ifndef STOWAGE_PLANNER_PLAN_REQUEST_H_
#define STOWAGE_PLANNER_PLAN_REQUEST_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace stowage::planner {

// The plan JSON (PlanToJson) of the fastest plan within the request's budgets. Errors:
// InvalidArgument for a bad request (naming the field, its value and what is allowed);
// ResourceExhausted when no plan fits, its message naming the smallest peak any plan reaches and
// what binds — and then, when `closest_plan` is given, the closest plan's JSON in it ("fits":
// false, `binding`: Note [Plans that do not fit]; left empty only when some layer has no option
// at all), the answer `stowage plan` prints in that case. `generator` goes into the plan
// ("stowage <version>").
absl::StatusOr<std::string> PlanFromRequestJson(std::string_view request,
                                                const std::string& generator,
                                                std::string* closest_plan = nullptr);

// The simulator's prediction for the request's per-layer assignment ("layers": policies,
// recompute modules; "prefetch_distance"): peak, step time, exposed copy time, host bytes, the
// recorded compute and copy intervals and the memory timeline, and the plan of that assignment.
absl::StatusOr<std::string> EvaluateRequestJson(std::string_view request,
                                                const std::string& generator);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_PLAN_REQUEST_H_
