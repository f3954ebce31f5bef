// The pipeline split: which layers each pipeline stage and virtual stage runs (--pp, --vpp,
// --pp-layout or Megatron-Core's even split, the MTP depths last), and the checks of a run's
// pipeline settings. The split is the first part of Note [Pipeline] in
// planner/search/pipeline.cc; the plan contract for stages is Note [Pipeline stages] in
// include/stowage/plan.h.
#ifndef STOWAGE_PLANNER_COST_PIPELINE_LAYOUT_H_
#define STOWAGE_PLANNER_COST_PIPELINE_LAYOUT_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/cost/run_settings.h"
#include "planner/model/model.h"
#include "stowage/plan.h"

namespace stowage::planner {

// Checks the pipeline settings of `run` against each other and the model (errors name the flag,
// its value and the rule): --pp, --vpp only with --schedule interleaved (which needs --pp >= 2
// and --microbatches a multiple of --pp), --microbatches, and --pp-layout (one count per stage,
// or per virtual stage with --vpp, summing to the model's layers) or, without it, layers (with
// the embedding and loss when counted) dividing evenly over pp x vpp virtual stages.
absl::Status ValidatePipeline(const ModelConfig& model, const RunSettings& run);

// The layers of every virtual stage, in virtual-stage order (virtual stage v = chunk c of stage
// s, v = c x pp + s): --pp-layout, or Megatron-Core's even split, of the decoder layers; the
// last virtual stage also runs the TrainedMtpLayers after them (Note [MTP layers] in
// planner/frameworks/megatron.cc). pp = 1: one range of every layer.
absl::StatusOr<std::vector<LayerRange>> VirtualStageLayers(const ModelConfig& model,
                                                           const RunSettings& run);
// Stage `stage`'s chunks (vpp of them) out of VirtualStageLayers.
std::vector<LayerRange> StageChunks(const std::vector<LayerRange>& virtual_stages, int pp, int vpp,
                                    int stage);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_COST_PIPELINE_LAYOUT_H_
