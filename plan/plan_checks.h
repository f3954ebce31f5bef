// What the plan library's files share (none of it public): each field's range, which the reader
// refuses a JSON value outside of and ValidatePlan holds a plan built in code to, and the stage
// checks and per-layer facts the reader runs before it fills in the fields an older plan leaves
// out.
#ifndef STOWAGE_PLAN_PLAN_CHECKS_H_
#define STOWAGE_PLAN_PLAN_CHECKS_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "base/json_reader.h"
#include "stowage/plan.h"

namespace stowage::plan_internal {

// Each field's range, used by the reader (so a value read from JSON is refused naming its limit)
// and by ValidatePlan (so a plan built in code obeys the same limit).
inline constexpr json::Range<uint64_t> kBytes{0, kPlanMaxBytes};
inline constexpr json::Range<double> kSeconds{0, kPlanMaxSeconds};
// A ratio of predicted durations less 1 (PlanPrediction::optimality_gap).
inline constexpr json::Range<double> kOptimalityGap{0, kPlanMaxSeconds};
inline constexpr json::Range<int> kParallel{1, kPlanMaxParallelSize};
inline constexpr json::Range<uint64_t> kSeqLen{0, kPlanMaxSeqLen};
inline constexpr json::Range<uint64_t> kCopyChunk{kPlanMinCopyChunkBytes, kPlanMaxCopyChunkBytes};
inline constexpr json::Range<int> kGpusPerNumaNode{1, kPlanMaxGpusPerNumaNode};
inline constexpr json::Range<double> kLinkRate{0, kPlanMaxLinkBytesPerSecond};
inline constexpr json::Range<int> kPrefetchDistance{1, kPlanMaxLayers};
inline constexpr json::Range<int> kFfnChunks{1, kPlanMaxFfnChunks};
inline constexpr json::Range<int> kLayerIndex{0, kPlanMaxLayers - 1};
inline constexpr json::Range<int> kPrefetchAfterLayer{-1, kPlanMaxLayers - 1};
inline constexpr json::Range<int> kSaveLag{1, kPlanMaxLayers};
inline constexpr json::Range<int> kSaveWaitBeforeLayer{-1, kPlanMaxLayers};
inline constexpr json::Range<int> kSchemaVersion{0, std::numeric_limits<int>::max()};
inline constexpr json::Range<int> kPipelineStages{1, kPlanMaxPipelineStages};
inline constexpr json::Range<int> kVirtualStages{1, kPlanMaxVirtualStages};
inline constexpr json::Range<int> kMicrobatches{1, kPlanMaxMicrobatches};
inline constexpr json::Range<int> kInFlight{1, kPlanMaxMicrobatches};
inline constexpr json::Range<int> kStageIndex{0, kPlanMaxPipelineStages - 1};
inline constexpr json::Range<int> kChunkLayers{0, kPlanMaxLayers};
inline constexpr json::Range<int> kMtpLayers{0, kPlanMaxMtpLayers};
inline constexpr json::Range<int> kGpus{0, kPlanMaxParallelSize};  // 0: not stated
inline constexpr json::Range<uint64_t> kGlobalBatch{0, kPlanMaxGlobalBatch};

// Note [Pipeline stages]: the run's pipeline fields agree with each other, and the stages' chunks
// cover the layers in virtual-stage order (chunk c of stage s is virtual stage c x pp + s).
// O(pp x vpp): the reader runs it before walking the layers. (validate.cc)
absl::Status CheckStages(const Plan& plan);

// Where each layer runs; the stages passed CheckStages. (stages.cc)
std::vector<LayerPlace> PlacesOfLayers(const Plan& plan);

// InFlightMicrobatches of every stage's chunks, each stage's schedule walked once (the stages
// passed CheckStages): [stage][chunk]. (pipeline_schedule.cc)
std::vector<std::vector<int>> InFlightOfStages(const Plan& plan);

}  // namespace stowage::plan_internal

#endif  // STOWAGE_PLAN_PLAN_CHECKS_H_
