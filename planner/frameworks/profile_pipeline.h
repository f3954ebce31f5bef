// The `pipeline` section of a layer profile (schema_version 3): where a profile measured on every
// stage of a Megatron-Core pipeline ran, each stage's model chunks and fixed memory, its reader and
// writer, and the run its stages are planned under. The step costs built from it are
// layer_profile.h's BuildStageStepCostFromProfile; docs/profile-format.md documents the format.
#ifndef STOWAGE_PLANNER_FRAMEWORKS_PROFILE_PIPELINE_H_
#define STOWAGE_PLANNER_FRAMEWORKS_PROFILE_PIPELINE_H_

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/json_reader.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/run_settings.h"
#include "stowage/plan.h"

namespace stowage::planner {

// One pipeline stage of a pipelined profile: its model chunks (vpp of them; chunk c is virtual
// stage c x pp + stage, Note [Pipeline stages] in stowage/plan.h), the fixed memory its ranks hold
// and, when stated, its parameter count.
struct ProfileStage {
  int stage = 0;
  std::vector<LayerRange> chunks;
  FixedMemory fixed;
  uint64_t model_parameters = 0;  // 0: not stated
};

// Where a profile measured on a Megatron-Core pipeline ran: pp >= 2 stages of vpp model chunks
// each, gpus ranks in the job (which links the stage boundaries cross: communication.h StageLink).
struct ProfilePipeline {
  int pp = 2;
  int vpp = 1;
  int gpus = 2;  // a multiple of pp; absent in the file: pp
  std::vector<ProfileStage> stages;
};

// A `fixed_bytes` object (weights required; gradients, optimizer, other optional), the profile's
// own and each stage's.
absl::Status ReadProfileFixed(const json::Object& fixed, FixedMemory& out);

// The `pipeline` object of `root` for a profile of `num_layers` layers: every field typed and
// range-checked, each stage's chunks in place and the virtual stages in order covering the layers
// exactly; errors name the JSON path (pipeline.stages[1].chunks[0].first_layer), the value and
// what is allowed.
absl::StatusOr<ProfilePipeline> ReadProfilePipeline(const json::Object& root, size_t num_layers);
// What ReadProfilePipeline reads back exactly.
json::Json ProfilePipelineToJson(const ProfilePipeline& pipeline);

// The run a profile's stages are planned under with `microbatches` per step: the pipeline's pp,
// vpp and gpus, the interleaved schedule when vpp > 1 (else 1F1B, as Megatron-Core picks); without
// a pipeline pp 1 (microbatches > 1: gradient accumulation). tp = cp = ep = 1: a profile measures
// one rank's shards. Only the pipeline fields and gpus are set. Errors name `field` (the caller's
// name: the CLI's --microbatches, the request's microbatches), its value and what is allowed.
absl::StatusOr<RunSettings> ProfileRunSettings(const std::optional<ProfilePipeline>& pipeline,
                                               int microbatches, std::string_view field);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_FRAMEWORKS_PROFILE_PIPELINE_H_
