// The cost model's types: what one layer (LayerCost) and one step (StepCost) on one rank hold and
// spend, as the framework recipes (planner/frameworks/: megatron.h, hf.h, layer_profile.h) count
// them and planner/frameworks/step_cost.h assembles them, and what each option for a layer
// (LayerOption: keep, recompute, offload ...) costs (EvaluateOption), which the simulator and
// optimizer consume. Note [Cost model] in planner/frameworks/megatron.cc says what is counted and
// why.
#ifndef STOWAGE_PLANNER_COST_COST_MODEL_H_
#define STOWAGE_PLANNER_COST_COST_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "planner/cost/communication.h"
#include "planner/cost/run_settings.h"
#include "planner/hardware/hardware.h"
#include "planner/hardware/op_time.h"
#include "stowage/plan.h"

namespace stowage::planner {

// One tensor a layer keeps for its backward when nothing is recomputed.
struct SavedTensor {
  std::string name;    // e.g. "input", "attn.qkv", "moe.act"
  std::string module;  // recompute module that can regenerate it ("" if none but full recompute)
  uint64_t bytes = 0;  // on this rank
};

// A module selective recompute can rerun in backward instead of keeping its outputs.
struct RecomputeModule {
  std::string name;  // "attn_core", "mla_up_proj", "ffn_act", "moe_act"
  uint64_t saved_bytes = 0;
  double seconds = 0;
  bool in_ffn = false;  // part of the FFN/MoE (its rerun is chunked with it)
  // Its checkpoint holds LayerCost::checkpoint_held_bytes until its backward ends (hf
  // attn_core: the step's attention mask is an argument of the call it reruns).
  bool holds_checkpoint_held = false;
};

struct LayerCost {
  int index = 0;     // the model's layer index; MTP depth k: the model's layers + k
  std::string type;  // LayerSpec::TypeName(); an MTP layer's is "mtp+" and its layer's kind
  std::string name;  // "mtp.K" for MTP depth K (stowage/plan.h MtpLayerName), else ""
  uint64_t input_bytes = 0;
  uint64_t output_bytes = 0;  // alive through the forward; its gradient through the backward
  // Whether the input's gradient is made after every moment of the backward EvaluateOption
  // counts (Note [Gradient timing] in cost_model.cc: eager PyTorch, the hf recipe), so that
  // none of them holds it; else each counts it beside the output's gradient (megatron).
  bool input_grad_made_last = false;
  std::vector<SavedTensor> saved;  // includes "input"
  uint64_t saved_bytes = 0;        // sum of saved
  uint64_t ffn_saved_bytes = 0;    // the FFN/MoE part of saved (recomputed chunk by chunk)
  std::vector<RecomputeModule> modules;
  // Transient working sets beyond the saved tensors, attention and FFN/MoE parts (the FFN/MoE
  // part divides by the chunk count).
  uint64_t attn_forward_transient = 0;
  uint64_t ffn_forward_transient = 0;
  uint64_t attn_backward_transient = 0;
  uint64_t ffn_backward_transient = 0;
  double forward_seconds = 0;
  double backward_seconds = 0;
  // forward_seconds and backward_seconds by op class, where the analytic recipes built them
  // (a measured profile's are empty): what `--explain`-style tables and tests print.
  OpTime forward_time;
  OpTime backward_time;
  double chunk_overhead_seconds = 0;  // per extra FFN/MoE chunk, per pass
  double forward_flops = 0;
  // Parameter gradients this layer's backward creates (StepCost::gradients_in_backward): they
  // exist from its backward to the end of the step. Of them, those made by the moment its FFN/MoE
  // part's backward peaks and by the moment its attention part's backward peaks (eager PyTorch
  // makes a weight's gradient when autograd runs its module's backward: Note [Gradient timing]
  // in cost_model.cc); EvaluateOption counts them in the backward peak, the rest exist from the
  // backward's end. Both are 0 when gradients exist before the step.
  uint64_t grad_bytes = 0;
  uint64_t ffn_peak_grad_bytes = 0;
  uint64_t attn_peak_grad_bytes = 0;
  // A third moment of the backward, between those two: the FFN/MoE input projections' backward
  // (gate/up), when their weight gradients are made (ffn_inputs_grad_bytes, the FFN block's
  // gradients made by then) beside what of the FFN is still alive (ffn_inputs_backward_bytes:
  // its saved tensors not yet released, the gradients of the projections' output and input).
  // 0 where the recipe has no such moment (Megatron: gradients exist before the step).
  uint64_t ffn_inputs_backward_bytes = 0;
  uint64_t ffn_inputs_grad_bytes = 0;
  // What the layer's checkpoint holds beyond its input from its forward until its backward ends
  // when the layer is recomputed, that its forward transients count while the forward runs
  // (transformers: the step's attention masks, passed to every checkpointed layer;
  // Note [Recompute moment] in cost_model.cc). 0 where the checkpoint holds its input only.
  uint64_t checkpoint_held_bytes = 0;
  // Which tensors those are: layers of one group hold the same ones (one copy however many
  // hold them), layers of different groups different ones (transformers: each layer type's
  // mask, Note [hf masks]); the simulator counts each group's once
  // (Note [Checkpoint-held inputs] in planner/search/simulator.cc).
  int checkpoint_held_group = 0;
  // The layer's own bytes at its forward's peak beyond its input when its checkpoint keeps none
  // of its saved tensors (recompute, offload_input: each is freed once the forward's own
  // references to it are gone), where the recipe states it (hf: Llama 4,
  // Note [hf recompute forward] in planner/frameworks/hf_build_layer.cc); 0: the forward transients
  // alone count there.
  uint64_t unkept_forward_bytes = 0;
  // Microbatches of this layer a pipeline stage holds at once (1F1B: stage s of p holds
  // min(p - s, M)); the simulator keeps the other m - 1 microbatches' resident bytes on the GPU
  // throughout and m copies of its host bytes in host memory. 1 without pipelining.
  int in_flight_microbatches = 1;
  // Whether the trainer can run this layer's FFN/MoE in token chunks (LayerOption::chunks > 1).
  // Megatron's recipe can; transformers' eager MLP and expert loop take every token at once
  // (planner/frameworks/), and a measured layer ran as it was measured.
  bool ffn_chunkable = true;
  // Exposed communication of one forward (made again by a recompute) and one backward
  // (StepComm::layers; planner/cost/communication.h), added to the pass times by EvaluateOption.
  double forward_comm_seconds = 0;
  double backward_comm_seconds = 0;
  double recompute_comm_seconds = 0;  // a recompute's (StepComm: no FSDP gather again)
  // The softmax/MLA attention core's share of forward_seconds / backward_seconds (what a CP ring
  // step overlaps); 0 for other attention kinds and measured profiles.
  double attention_core_forward_seconds = 0;
  double attention_core_backward_seconds = 0;
};
inline constexpr int kMaxInFlightMicrobatches = 1024;

// Whether keep saves the layer's input: one of its saved tensors is "input" (what offload_input
// moves). Megatron's layers do (the first norm's input); transformers' do not (the first RMSNorm
// saves its fp32 upcast), so a recomputed layer holds its input beside them in its backward.
bool SavesInput(const LayerCost& layer);

// Appends recompute module `name` to `layer` (rerun in `seconds`; `in_ffn`: RecomputeModule::
// in_ffn), its saved_bytes the sum of the layer's saved tensors that name it (SavedTensor::module):
// the recipes call it once the module's tensors are saved. An error when that sum is beyond
// kMaxTensorBytes (Note [Limits] in cost_model.cc); the module is appended then too, with the sum
// (the largest uint64_t where it overflows uint64), which CheckStepCostBounds refuses.
absl::Status AddModule(LayerCost& layer, const std::string& name, double seconds, bool in_ffn);

struct FixedMemory {
  uint64_t weights = 0;
  uint64_t gradients = 0;
  uint64_t optimizer = 0;
  uint64_t comm_buffers = 0;
  uint64_t other = 0;  // held by the trainer throughout (a measured profile's sample input)
  uint64_t total() const { return weights + gradients + optimizer + comm_buffers + other; }
};

// Everything the simulator and optimizer need about one step on one rank.
struct StepCost {
  std::string model;
  // The pipeline stage this step is (0 without pipeline parallelism) and its model chunks.
  int stage = 0;
  std::vector<LayerRange> chunks;
  uint64_t model_parameters = 0;  // ModelParameters(model)
  RunSettings run;
  // MTP depths the run trains (TrainedMtpLayers; the last stage's last layers are they) and the
  // model's own count (num_nextn_predict_layers), for what the summary says about them.
  int mtp_layers = 0;
  int model_mtp_layers = 0;
  HardwareProfile hardware;
  uint64_t tokens_per_rank = 0;
  FixedMemory fixed;
  std::vector<LayerCost> layers;
  double embedding_seconds = 0;  // forward + backward
  double tail_seconds = 0;       // final norm, LM head and loss, forward + backward
  OpTime embedding_time;         // embedding_seconds and tail_seconds by op class (analytic)
  OpTime tail_time;
  uint64_t tail_bytes = 0;  // working set of the LM head and loss
  double d2h_bytes_per_second = 0;
  double h2d_bytes_per_second = 0;
  double bidir_d2h_bytes_per_second = 0;
  double bidir_h2d_bytes_per_second = 0;
  uint64_t copy_chunk_bytes = 16ull << 20;
  // Eager PyTorch creates each parameter's gradient when backward reaches it (fixed.gradients
  // is then 0): the LM head's at the end of the tail, each layer's at the end of its backward,
  // the embedding's last.
  bool gradients_in_backward = false;
  uint64_t tail_grad_bytes = 0;
  uint64_t embedding_grad_bytes = 0;
  // Once a layer's backward has ended it holds a layer_grad_shards-th of its gradients
  // (LayerCost::grad_bytes, rounded up): 1 unless the data-parallel engine reduce-scatters each
  // layer's gradients as its backward ends and frees the unsharded ones (torch FSDP2 under hf,
  // Note [hf data parallel] in planner/frameworks/hf_data_parallel.cc).
  int layer_grad_shards = 1;
  // Of tail_bytes, what the caller holds from the LM head's forward to the end of the step: the
  // model output's logits (transformers returns them and the training loop keeps the output
  // while it runs the backward). 0 where nothing outlives the loss (Megatron's vocab-parallel
  // loss returns the loss only).
  uint64_t held_logits_bytes = 0;
  // --optimizer-offload: the optimizer state in host memory and the once-per-step copies
  // (gradients D2H, weights H2D) that do not overlap the forward and backward.
  uint64_t optimizer_host_bytes = 0;
  double optimizer_copy_seconds = 0;
  // The step's collectives (planner/cost/communication.h); comm.step_exposed_seconds is added to
  // the step by the simulator, each layer's exposed part is in its LayerCost.
  StepComm comm;
  // A step built from a measured layer profile (BuildStepCostFromProfile): which of `run`'s
  // framework, optimizer and grad_bytes, and of model_parameters, the profile stated (the
  // others are unknown, and the summary says so instead of printing a default).
  struct ProfileStated {
    bool framework = false, optimizer = false, grad_dtype = false, parameters = false;
  };
  std::optional<ProfileStated> profile;
};

// Whether a step cost (built here, or from a measured profile) keeps within kMaxLayers,
// kMaxTensorBytes and kMaxStepBytes, and has finite, non-negative seconds: what the simulator
// and optimizer assume. BuildStepCost (planner/frameworks/step_cost.h) checks it before returning;
// Optimize checks it too.
absl::Status CheckStepCostBounds(const StepCost& step);

// One choice for one layer.
struct LayerOption {
  LayerPolicy policy = LayerPolicy::kKeep;
  uint32_t module_mask = 0;  // kSelectiveRecompute: bit k = LayerCost::modules[k] is rerun
  int chunks = 1;            // FFN/MoE chunk count
  friend bool operator==(const LayerOption&, const LayerOption&) = default;
};

// What one option costs: what the simulator consumes.
struct OptionCost {
  uint64_t resident_bytes = 0;  // on the GPU from forward end to backward start (after D2H)
  uint64_t host_bytes = 0;      // copied D2H after forward and H2D before backward
  // The save is issued when the forward starts (offload_input: the input exists already), not
  // when it ends (offload_saved: tensors are saved as the forward makes them).
  bool save_at_forward_start = false;
  uint64_t forward_peak = 0;  // the layer's own bytes during its forward (input included)
  // The layer's own bytes at the peak of its recompute + backward: its working set and the
  // parameter gradients its backward has made by then (LayerCost::ffn_peak_grad_bytes).
  uint64_t backward_peak = 0;
  // What of the step's shared inputs (LayerCost::checkpoint_held_bytes) the option's checkpoint
  // holds from its forward to its backward's end; backward_peak counts them, the simulator
  // counts them in the loss and above (Note [Checkpoint-held inputs] in simulator.cc).
  uint64_t checkpoint_held_bytes = 0;
  double forward_seconds = 0;
  double recompute_seconds = 0;
  double backward_seconds = 0;
  double comm_seconds = 0;  // the exposed communication included in the three above
  double compute_seconds() const { return forward_seconds + recompute_seconds + backward_seconds; }
};

OptionCost EvaluateOption(const LayerCost& layer, const LayerOption& option);
// Tensors the option moves to the host, in copy order (names as in LayerCost::saved).
std::vector<PlannedTransfer> OptionTransfers(const LayerCost& layer, const LayerOption& option);
// Every option for a layer: keep, each non-empty subset of its modules, recompute,
// offload_input, offload_saved, each with chunk counts 1, 2, 4, 8 (FFN/MoE layers).
// Every option of `layer`, with each of `chunk_counts` where the layer is ffn_chunkable (else
// chunk count 1 only).
std::vector<LayerOption> AllOptions(const LayerCost& layer, const std::vector<int>& chunk_counts);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_COST_COST_MODEL_H_
