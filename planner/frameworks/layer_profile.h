// Measured layer profiles: the second cost source of the planner. The Python layer runs each of
// the user's layers once and writes what it measured (stowage.profile.ModelProfile.to_json); the
// planner reads it here and builds the same StepCost it builds from a model config, so one
// simulator and one optimizer plan both. The format is documented in the README ("Layer profile
// format"); see Note [Measured layers] in profile.cc for how each field becomes a cost.
#ifndef STOWAGE_PLANNER_PROFILE_H_
#define STOWAGE_PLANNER_PROFILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/run_settings.h"
#include "planner/frameworks/profile_pipeline.h"
#include "planner/hardware/hardware.h"
#include "planner/hardware/op_time.h"
#include "stowage/plan.h"

namespace stowage::planner {

// 2 added what a layer's backward peak holds of its gradients and saved tensors
// (ProfileLayer::backward_peak_grad_bytes, backward_peak_released_bytes) and the logits the caller
// holds (LayerProfileSet::held_logits_bytes); a version-1 profile is read as it always meant. 3
// added `pipeline` (LayerProfileSet::pipeline): a profile measured on every stage of a pipelined
// job.
inline constexpr int kProfileSchemaVersion = 3;
inline constexpr int kOldestProfileSchemaVersion = 1;
inline constexpr char kProfileFormat[] = "stowage-layer-profile";
// Selective recompute searches every subset of a layer's modules: a bound keeps that small.
inline constexpr int kMaxProfileModules = 8;

struct ProfileSavedTensor {
  std::string name;    // unique within the layer; "input" for the layer's own input
  uint64_t bytes = 0;  // as the offload_saved rule counts it (distinct, non-parameter)
  std::string module;  // child module whose rerun regenerates it ("" : only full recompute)
};

// A time is given either as measured seconds or as op work (a profile measured off the GPU,
// stowage.hf_profile), which BuildStepCostFromProfile turns into seconds with OpSeconds on the
// hardware it plans for.
struct ProfileModule {
  std::string name;    // a child module of the layer (Python: layer.get_submodule(name))
  double seconds = 0;  // its forward time: what rerunning it in backward costs
  std::optional<OpWork> work = std::nullopt;
};

struct ProfileLayer {
  int index = 0;
  std::string type;  // e.g. the Python class name
  uint64_t input_bytes = 0;
  uint64_t output_bytes = 0;
  std::vector<ProfileSavedTensor> saved;
  std::vector<ProfileModule> modules;
  // Device bytes over what was allocated before the forward (the input already was): the most
  // during the forward, and the most during the backward.
  uint64_t forward_peak_bytes = 0;
  uint64_t backward_peak_bytes = 0;
  double forward_seconds = 0;
  double backward_seconds = 0;
  std::optional<OpWork> forward_work = std::nullopt;
  std::optional<OpWork> backward_work = std::nullopt;
  // Parameter gradients this layer's backward creates (LayerProfileSet::gradients_in_backward).
  uint64_t grad_bytes = 0;
  // The moment the backward peaks (Note [Measured layers] in profile.cc): of grad_bytes, those
  // made by then (backward_peak_bytes is net of them; absent in the file: all of them), and of
  // the saved tensors' bytes, those the backward has released by then (absent: none).
  uint64_t backward_peak_grad_bytes = 0;
  uint64_t backward_peak_released_bytes = 0;
  // What the layer's checkpoint holds beyond its input from its forward until its backward ends
  // when it is recomputed, counted in forward_peak_bytes while its forward runs (LayerCost::
  // checkpoint_held_bytes; transformers: its layer type's mask). Absent: 0.
  uint64_t checkpoint_held_bytes = 0;
  // Layers of one group hold the same tensors, counted once (LayerCost::checkpoint_held_group;
  // transformers: one group per layer type's mask). Absent: 0.
  int checkpoint_held_group = 0;
};

struct LayerProfileSet {
  int schema_version = kProfileSchemaVersion;
  std::string generator;
  std::string device;            // e.g. "cuda:0", "cpu"
  bool measured_memory = false;  // peaks from the CUDA allocator; false: estimated from sizes
  uint64_t tokens = 0;           // tokens of the sample input
  // What ran (optional; the plan summary reports what the profile says): whose code the layers
  // are (stowage.hf_profile: "hf"), the optimizer whose state fixed.optimizer holds, the
  // gradients' bytes per element, and the model's parameter count. Absent: not stated.
  std::optional<Framework> framework;
  std::optional<OptimizerKind> optimizer;
  int grad_bytes = 0;  // 2 (bf16) or 4 (fp32); 0: not stated
  uint64_t model_parameters = 0;
  // Fixed device memory: weights, their gradients, optimizer state, and the rest the trainer
  // holds throughout (the sample input).
  FixedMemory fixed;
  // LM head and loss (the tail): device bytes over what was allocated before (the last layer's
  // output), and seconds for forward + backward.
  uint64_t loss_peak_bytes = 0;
  double loss_seconds = 0;
  // Of loss_peak_bytes, what the caller holds from the loss to the step's end (the model
  // output's logits: StepCost::held_logits_bytes); the layers' backward_peak_bytes are net of
  // it. Absent: 0 (what the loss leaves alive counts in the layers' own bytes, if at all).
  uint64_t held_logits_bytes = 0;
  std::optional<OpWork> loss_work = std::nullopt;
  // Eager PyTorch creates each parameter's gradient when backward reaches it (StepCost::
  // gradients_in_backward): the LM head's at the end of the loss (loss_grad_bytes), each layer's
  // in its backward (ProfileLayer::grad_bytes), the embedding's last (embedding_grad_bytes).
  bool gradients_in_backward = false;
  uint64_t loss_grad_bytes = 0;
  uint64_t embedding_grad_bytes = 0;
  double embedding_seconds = 0;  // the embedding's forward + backward
  std::optional<OpWork> embedding_work = std::nullopt;
  // false: the profile was measured off the GPU and has no "link"; the copy rates are the
  // hardware profile's (BuildStepCostFromProfile).
  bool has_link = true;
  double d2h_bytes_per_second = 0;
  double h2d_bytes_per_second = 0;
  double bidir_d2h_bytes_per_second = 0;  // absent in the file (0 here: written absent): one-way
  double bidir_h2d_bytes_per_second = 0;
  uint64_t copy_chunk_bytes = 16ull << 20;
  std::vector<ProfileLayer> layers;
  // Absent: one stage ran every layer. Present: `layers` are still the whole model in global
  // order, `fixed` is the whole model's (informational), the embedding fields belong to stage 0
  // and the loss fields to the last stage.
  std::optional<ProfilePipeline> pipeline;
};

// Strict reader (base/json_reader.h): every field typed and range-checked; errors name `source`,
// the JSON path, the value and what is allowed.
absl::StatusOr<LayerProfileSet> ParseProfileJson(std::string_view text, std::string_view source);
absl::StatusOr<LayerProfileSet> ReadProfileFile(const std::string& path);
// Pretty-printed JSON, stable field order; ParseProfileJson reads it back exactly.
std::string ProfileToJson(const LayerProfileSet& profile);

// The step cost of a measured profile. `hardware` supplies what a profile does not measure
// (host RAM per NUMA node, GPUs per node, pin rate; the copy rates when the profile has no
// link; the op rates that turn op work into seconds); the link rates are the profile's. Measured
// layers are not ffn_chunkable. One stage of every layer and one microbatch, a pipelined
// profile's `pipeline` aside (BuildStageStepCostFromProfile plans its stages).
absl::StatusOr<StepCost> BuildStepCostFromProfile(const LayerProfileSet& profile,
                                                  const HardwareProfile& hardware);
// The step cost of stage `stage` of `run` (profile_pipeline.h ProfileRunSettings: its pipeline
// fields and gpus are read) from a profile, as BuildStepCost
// builds one for a model (Note [Pipelined profiles] in layer_profile.cc): the stage's layers in
// chunk order (LayerCost::index the global layer index, each with its chunk's
// InFlightMicrobatches), the stage's fixed memory, the embedding on stage 0 and the loss on the
// last stage. pp 1 and one microbatch: exactly BuildStepCostFromProfile's step.
absl::StatusOr<StepCost> BuildStageStepCostFromProfile(const LayerProfileSet& profile,
                                                       const HardwareProfile& hardware,
                                                       const RunSettings& run, int stage);
// Every stage's, in stage order.
absl::StatusOr<std::vector<StepCost>> BuildStageStepCostsFromProfile(
    const LayerProfileSet& profile, const HardwareProfile& hardware, const RunSettings& run);

// One point-to-point message of a pipelined profile: the hidden state crossing a stage boundary,
// the largest input_bytes of the first layer of any virtual stage after the first (exactly the
// activations a stage receives); 0 without `pipeline`.
double ProfileMessageBytes(const LayerProfileSet& profile);

// A hardware profile for a profile planned without one: the device the profile names, link rates
// from the profile, host RAM unknown (0).
HardwareProfile HardwareForProfile(const LayerProfileSet& profile);

// The host budget of a profile planned without one: what `hardware` says one GPU may use when
// it is given (HostBytesPerGpu), else every saved byte of the step, each layer's times its
// in-flight microbatches (no limit in effect).
uint64_t DefaultProfileHostBudget(const StepCost& step, const HardwareProfile* hardware);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_PROFILE_H_
