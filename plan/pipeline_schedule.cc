// The pipeline schedule's arithmetic (Note [Pipeline stages]): the order in which a stage runs
// its forwards and backwards (PipelineOrder) and how many microbatches of each chunk it holds at
// once (InFlightMicrobatches), as Megatron-Core's schedules run them.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "plan/plan_checks.h"
#include "stowage/plan.h"

namespace stowage {
namespace {

// The interleaved schedule's table (Megatron-Core get_schedule_table): the forwards go through
// groups of `group` microbatches (the last one possibly shorter), each group through chunk 0, 1,
// ..., vpp - 1 in turn, chunk-major; the backwards visit the chunks in reverse.
struct InterleavedTable {
  int64_t group = 1;  // microbatch_group_size_per_vp_stage (its default: pp)
  int64_t m = 1;      // microbatches
  int64_t v = 1;      // vpp
  PipelineOp Unit(int64_t unit, bool forward) const {
    const int64_t last_group = (m - 1) / group;
    const int64_t g = std::min(unit / (group * v), last_group);
    const int64_t size = std::min(group, m - g * group);
    const int64_t within = unit - g * group * v;
    const int64_t c = within / size;
    return {forward, static_cast<int>(forward ? c : v - 1 - c),
            static_cast<int>(g * group + within % size)};
  }
};

// Forwards 1F1B runs before its first backward: get_pp_rank_microbatches.
int64_t Warmup1F1B(int pp, int stage, int64_t microbatches) {
  return std::min<int64_t>(pp - stage - 1, microbatches);
}
// ... and the interleaved schedule (forward_backward_pipelining_with_interleaving), of `total`
// units.
int64_t WarmupInterleaved(int pp, int stage, int64_t v, int64_t total) {
  return std::min<int64_t>(2 * (pp - stage - 1) + (v - 1) * pp, total);
}

// Note [Pipeline stages]: the most microbatches of each chunk that `stage` holds at once, walking
// Megatron-Core's order for the stage (PipelineOrder, without building it: microbatches may be
// 2^20). Arguments within ValidatePlan's limits.
std::vector<int> InFlightPerChunk(PipelineSchedule schedule, int pp, int vpp, int microbatches,
                                  int stage) {
  if (pp == 1) return std::vector<int>(vpp, 1);
  if (schedule == PipelineSchedule::k1F1B || vpp == 1) {
    // The warmup forwards, then a forward before each backward: one more is held.
    return std::vector<int>(vpp, static_cast<int>(std::min<int64_t>(
                                     Warmup1F1B(pp, stage, microbatches) + 1, microbatches)));
  }
  const InterleavedTable table{pp, microbatches, vpp};
  const int64_t total = table.m * table.v;
  const int64_t warmup = WarmupInterleaved(pp, stage, table.v, total);
  std::vector<int> held(vpp, 0), most(vpp, 0);
  auto forward = [&](int64_t unit) {
    const int c = table.Unit(unit, true).chunk;
    most[c] = std::max(most[c], ++held[c]);
  };
  for (int64_t u = 0; u < warmup; ++u) forward(u);
  // Steady state: forward warmup + k, then backward k. With every group full the counts repeat
  // every group x vpp steps (both orders advance by one group of each chunk), so one period shows
  // the most; the cooldown only releases.
  const int64_t steady = total - warmup;
  const int64_t walk =
      table.m % table.group == 0 ? std::min(steady, table.group * table.v) : steady;
  for (int64_t k = 0; k < walk; ++k) {
    forward(warmup + k);
    --held[table.Unit(k, false).chunk];
  }
  for (int& c : most) c = std::max(c, 1);
  return most;
}

bool PipelineArgsInRange(int pp, int vpp, int microbatches) {
  return pp >= 1 && pp <= kPlanMaxPipelineStages && vpp >= 1 && vpp <= kPlanMaxVirtualStages &&
         microbatches >= 1 && microbatches <= kPlanMaxMicrobatches;
}

}  // namespace

namespace plan_internal {

// InFlightMicrobatches of every stage's chunks, each stage's schedule walked once (the stages
// passed CheckStages): [stage][chunk].
std::vector<std::vector<int>> InFlightOfStages(const Plan& plan) {
  std::vector<std::vector<int>> out;
  for (int s = 0; s < plan.pp; ++s) {
    out.push_back(InFlightPerChunk(plan.schedule, plan.pp, plan.vpp, plan.microbatches, s));
  }
  return out;
}

}  // namespace plan_internal

int InFlightMicrobatches(PipelineSchedule schedule, int pp, int vpp, int microbatches, int stage,
                         int chunk) {
  if (!PipelineArgsInRange(pp, vpp, microbatches) || stage < 0 || stage >= pp || chunk < 0 ||
      chunk >= vpp) {
    return 1;
  }
  return InFlightPerChunk(schedule, pp, vpp, microbatches, stage)[chunk];
}

std::vector<PipelineOp> PipelineOrder(PipelineSchedule schedule, int pp, int vpp, int microbatches,
                                      int stage) {
  std::vector<PipelineOp> order;
  if (!PipelineArgsInRange(pp, vpp, microbatches) || stage < 0 || stage >= pp) return order;
  order.reserve(2 * static_cast<size_t>(microbatches) * static_cast<size_t>(vpp));
  if (pp == 1) {
    // Gradient accumulation: each microbatch through every chunk and back before the next.
    for (int k = 0; k < microbatches; ++k) {
      for (int c = 0; c < vpp; ++c) order.push_back({true, c, k});
      for (int c = vpp - 1; c >= 0; --c) order.push_back({false, c, k});
    }
    return order;
  }
  if (schedule == PipelineSchedule::k1F1B || vpp == 1) {
    const int warmup = static_cast<int>(Warmup1F1B(pp, stage, microbatches));
    for (int k = 0; k < warmup; ++k) order.push_back({true, 0, k});
    for (int k = 0; k < microbatches - warmup; ++k) {
      order.push_back({true, 0, warmup + k});
      order.push_back({false, 0, k});
    }
    for (int k = microbatches - warmup; k < microbatches; ++k) order.push_back({false, 0, k});
    return order;
  }
  const InterleavedTable table{pp, microbatches, vpp};
  const int64_t total = table.m * table.v;
  const int64_t warmup = WarmupInterleaved(pp, stage, table.v, total);
  for (int64_t u = 0; u < warmup; ++u) order.push_back(table.Unit(u, true));
  for (int64_t k = 0; k < total - warmup; ++k) {
    order.push_back(table.Unit(warmup + k, true));
    order.push_back(table.Unit(k, false));
  }
  for (int64_t k = total - warmup; k < total; ++k) order.push_back(table.Unit(k, false));
  return order;
}

}  // namespace stowage
