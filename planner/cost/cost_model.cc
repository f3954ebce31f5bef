// The cost model's checks and options: the bounds every step cost keeps (CheckStepCostBounds,
// Note [Limits]), the recompute modules the recipes add to a layer (AddModule), and what each
// option for a layer costs (EvaluateOption, Notes [Gradient timing] and [Recompute moment]), the
// tensors it moves and the options there are.
#include "planner/cost/cost_model.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/checked_math.h"

namespace stowage::planner {
namespace {

// Note [Limits]
// Byte counts are products of shapes, dtypes and tokens computed in double (exact up to 2^53,
// and what the formulas need for fractional terms such as moe_imbalance), then converted once
// to uint64 by the megatron recipe's Builder::Bytes (planner/frameworks/megatron.cc), which refuses
// anything negative, not finite or above kMaxTensorBytes instead of converting it (a double beyond
// uint64's range converts to whatever the hardware gives: `--seq-len 9007199254740992` once planned
// "keep ... 0 B"). Sums of converted counts use base/checked_math.h. CheckStepCostBounds then
// bounds the whole step by kMaxStepBytes, which is what lets the simulator and optimizer add any
// subset of a step's bytes in uint64/int64 without checks of their own. The up-front limits on the
// run and the model (ValidateRun) make a refusal here rare; when it happens the error names the
// tensor, its size and the inputs it grows with.

// Largest bytes any option of the layer holds at once (EvaluateOption's terms, all together):
// what CheckStepCostBounds adds up.
absl::StatusOr<uint64_t> LayerCeiling(const LayerCost& l) {
  uint64_t total = 0;
  for (uint64_t part : {l.saved_bytes, l.attn_forward_transient, l.ffn_forward_transient,
                        l.attn_backward_transient, l.ffn_backward_transient,
                        l.ffn_inputs_backward_bytes, l.input_bytes, l.output_bytes, l.grad_bytes,
                        // Note [Recompute moment]: the rerun's output gradient beside its forward.
                        l.output_bytes, l.checkpoint_held_bytes, l.unkept_forward_bytes}) {
    // The message is built only on overflow: this runs for every layer of every plan.
    auto sum = CheckedAdd(total, part);
    if (!sum) {
      return absl::OutOfRangeError(
          absl::StrCat("the bytes of layer ", l.index, " overflow (", total, " + ", part, ")"));
    }
    total = *sum;
  }
  return total;
}

}  // namespace

bool SavesInput(const LayerCost& layer) {
  return std::any_of(layer.saved.begin(), layer.saved.end(),
                     [](const SavedTensor& t) { return t.name == "input"; });
}

absl::Status AddModule(LayerCost& layer, const std::string& name, double seconds, bool in_ffn) {
  uint64_t bytes = 0;
  bool wrapped = false;
  for (const SavedTensor& t : layer.saved) {
    if (t.module != name) continue;
    const std::optional<uint64_t> sum = CheckedAdd(bytes, t.bytes);
    wrapped |= !sum.has_value();
    bytes = wrapped ? std::numeric_limits<uint64_t>::max() : *sum;
  }
  layer.modules.push_back({name, bytes, seconds, in_ffn});
  if (bytes <= kMaxTensorBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the saved tensors of module ", name, " of layer ", layer.index, " add up to ",
                   wrapped ? "more than 2^64" : absl::StrCat(bytes), " bytes, beyond the limit of ",
                   kMaxTensorBytes, " bytes (2^56) per tensor; see README \"Limits\""));
}

absl::Status CheckStepCostBounds(const StepCost& step) {
  if (step.layers.empty() || step.layers.size() > static_cast<size_t>(kMaxLayers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the step has ", step.layers.size(), " layers; allowed: 1 to ", kMaxLayers));
  }
  uint64_t total = 0;
  auto add = [&](uint64_t bytes, const std::string& what) -> absl::Status {
    if (bytes > kMaxTensorBytes) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is ", bytes,
                                                     " bytes; allowed: at most ", kMaxTensorBytes,
                                                     " (2^56, README \"Limits\")"));
    }
    auto sum = AddOrError(total, bytes, "the step's bytes");
    if (!sum.ok()) return sum.status();
    total = *sum;
    return absl::OkStatus();
  };
  for (auto [what, bytes] : {std::pair<const char*, uint64_t>{"fixed weights", step.fixed.weights},
                             {"fixed gradients", step.fixed.gradients},
                             {"fixed optimizer state", step.fixed.optimizer},
                             {"communication buffers", step.fixed.comm_buffers},
                             {"the LM head and loss working set", step.tail_bytes},
                             {"the LM head's gradients", step.tail_grad_bytes},
                             {"the embedding's gradients", step.embedding_grad_bytes}}) {
    if (absl::Status s = add(bytes, what); !s.ok()) return s;
  }
  if (step.held_logits_bytes > step.tail_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the held logits are ", step.held_logits_bytes,
                     " bytes; allowed: at most the LM head and loss working set (", step.tail_bytes,
                     "), of which they are part"));
  }
  auto finite = [](double x) { return x >= 0 && x < 1e300; };  // NaN fails both
  for (const LayerCost& l : step.layers) {
    // Names the layer in an error; built only then (this loop runs for every layer of every plan).
    auto what = [&] { return absl::StrCat("layer ", l.index); };
    for (uint64_t part :
         {l.input_bytes, l.output_bytes, l.saved_bytes, l.attn_forward_transient,
          l.ffn_forward_transient, l.attn_backward_transient, l.ffn_backward_transient,
          l.ffn_inputs_backward_bytes, l.grad_bytes, l.unkept_forward_bytes}) {
      if (part > kMaxTensorBytes) return add(part, absl::StrCat("a byte count of ", what()));
    }
    // Note [Gradient timing]: the gradients made by a peak are some of the layer's.
    if (l.ffn_peak_grad_bytes > l.grad_bytes || l.attn_peak_grad_bytes > l.grad_bytes ||
        l.ffn_inputs_grad_bytes > l.grad_bytes ||
        (!step.gradients_in_backward && l.grad_bytes > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what(), " makes ", l.grad_bytes, " gradient bytes in its backward, ",
          l.ffn_peak_grad_bytes, " by its FFN peak and ", l.attn_peak_grad_bytes,
          " by its attention peak; allowed: at most the layer's, and none unless gradients are "
          "created during backward"));
    }
    // The sums EvaluateOption subtracts from must be what they claim: a wrapped sum (tensors
    // of [2^64-1, 1] "adding up" to 0) would turn into a huge difference there.
    if (l.saved.size() > 64 || l.modules.size() > 16) {
      return absl::InvalidArgumentError(absl::StrCat(what(), " has ", l.saved.size(),
                                                     " saved tensors and ", l.modules.size(),
                                                     " recompute modules; allowed: 64 and 16"));
    }
    uint64_t saved = 0, in_modules = 0;
    for (const SavedTensor& t : l.saved) {
      if (t.bytes > kMaxTensorBytes) return add(t.bytes, absl::StrCat(what(), "'s ", t.name));
      saved += t.bytes;  // at most 64 of at most 2^56 each
    }
    for (const RecomputeModule& mod : l.modules) {
      if (mod.saved_bytes > kMaxTensorBytes)
        return add(mod.saved_bytes, absl::StrCat(what(), "'s ", mod.name));
      in_modules += mod.saved_bytes;
    }
    if (saved != l.saved_bytes || l.ffn_saved_bytes > l.saved_bytes || in_modules > l.saved_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          what(), "'s saved tensors add up to ", saved, " bytes but it claims ", l.saved_bytes,
          " (FFN part ", l.ffn_saved_bytes, ", recompute modules ", in_modules, ")"));
    }
    if (l.in_flight_microbatches < 1 || l.in_flight_microbatches > kMaxInFlightMicrobatches) {
      return absl::InvalidArgumentError(absl::StrCat(what(), " has ", l.in_flight_microbatches,
                                                     " in-flight microbatches; allowed: 1 to ",
                                                     kMaxInFlightMicrobatches));
    }
    auto ceiling = LayerCeiling(l);
    if (!ceiling.ok()) return ceiling.status();
    // Every in-flight microbatch may hold the layer's bytes (Note [In-flight microbatches]).
    auto held = CheckedMul(*ceiling, static_cast<uint64_t>(l.in_flight_microbatches));
    if (!held) {
      return absl::OutOfRangeError(absl::StrCat("the bytes of ", what(), " overflow (", *ceiling,
                                                " x ", l.in_flight_microbatches, ")"));
    }
    if (*held > kMaxTensorBytes || !CheckedAdd(total, *held)) {
      return add(*held, absl::StrCat("the largest option of ", what()));  // the error naming it
    }
    total += *held;
    if (!finite(l.forward_seconds) || !finite(l.backward_seconds) ||
        !finite(l.chunk_overhead_seconds) || !finite(l.forward_comm_seconds) ||
        !finite(l.backward_comm_seconds) || !finite(l.recompute_comm_seconds)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what(), " has a negative or non-finite time (forward ", l.forward_seconds,
                       " s, backward ", l.backward_seconds, " s)"));
    }
    for (const RecomputeModule& mod : l.modules) {
      if (mod.saved_bytes > l.saved_bytes || !finite(mod.seconds)) {
        return absl::InvalidArgumentError(absl::StrCat(what(), "'s module ", mod.name, " has ",
                                                       mod.saved_bytes, " bytes and ", mod.seconds,
                                                       " s"));
      }
    }
  }
  if (total > kMaxStepBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the step's bytes add up to ", total, "; allowed: at most ", kMaxStepBytes,
                     " (2^62, README \"Limits\"): fewer tokens per rank or layers"));
  }
  if (!finite(step.tail_seconds) || !finite(step.embedding_seconds) ||
      !finite(step.comm.step_exposed_seconds) || !(step.d2h_bytes_per_second > 0) ||
      !(step.h2d_bytes_per_second > 0) || !(step.bidir_d2h_bytes_per_second > 0) ||
      !(step.bidir_h2d_bytes_per_second > 0)) {
    return absl::InvalidArgumentError("the step has a negative or non-finite time or link rate");
  }
  return absl::OkStatus();
}

// Note [Gradient timing]
// When a layer's parameter gradients exist. Megatron-Core allocates its contiguous gradient
// buffers before the step (fixed memory; LayerCost::grad_bytes is 0). Eager PyTorch creates each
// weight's gradient when autograd runs the backward node of the op that used the weight (the
// mm or grouped_mm backward computes it with the input's gradient, and AccumulateGrad takes it
// as the parameter's .grad, set_to_none); within a layer the engine runs the nodes in reverse
// order of their creation in forward. So at a moment of a layer's backward the gradients made
// are those of the weights used after that moment's op in forward: at the FFN/MoE part's peak
// (the SwiGLU mul's backward, Note [hf FFN backward]) down_proj's, not gate/up's nor any of the
// attention's; at the attention part's peak (the core's backward) the whole FFN/MoE block's and
// o_proj's, not the q/k/v projections'. The recipe states them per layer kind
// (LayerCost::ffn_peak_grad_bytes, attn_peak_grad_bytes; Note [hf gradient timing] in
// planner/frameworks/hf_build_layer.cc, which adds the FFN's input projections' backward as a third
// moment: Mixtral's gate_up_proj gradient, 1.75 GiB, is made there); the backward peak below is the
// largest of the moments with its gradients, the rest of the layer's gradients exist from its
// backward's end, and what the step holds around the layer is BackwardHeldBytes (simulator.h), the
// one sum the simulator and the optimizer use. The layer input's gradient follows the same order:
// autograd sums the gradients of the input's uses (the residual path and the layer's first ops) in
// the input's buffer, and the residual add's backward hands the output's gradient on as it is
// (AddBackward0: no new tensor), so a new tensor of the input's width exists only once the first
// ops' backward (the input norm's; OLMo's q/k/v projections) has run, after every moment above: the
// hf recipe says so (LayerCost::input_grad_made_last; the olmo3 layers at 4096 tokens peaked 40
// MiB, 2h per token, below the old count). A shared expert's input gradient, made inside the FFN's
// backward, is the FFN recipe's (planner/frameworks/). The megatron recipe keeps counting it at
// every moment: GLM-5.3-Flash's layers are mHC (hc_mult 4), and Megatron-Core applies H_res to the
// n-stream residual after the sublayer (transformer/hyper_connection.py apply_h_res, deferred to
// the fused h_res/h_post bias-dropout-add), so that bmm's backward, which runs first, makes an n x
// hidden-wide part of the input's gradient that lives through the rest of the layer's backward (its
// peak moments included). For hc_mult 1 layers the megatron count stays as it was: an upper bound
// by 2h per token (the fused bias-dropout-add's backward under torch.compile or jit is not checked
// here).
//
// Note [Recompute moment]
// A recomputed layer reruns its forward inside its backward, and the rerun's transients are live
// on top of what the backward holds then. Megatron-Core's CheckpointFunction (tensor_parallel/
// random.py, reentrant; TransformerEngine's te_checkpoint the same) reruns the whole layer
// forward when autograd reaches the checkpoint's node, then runs the layer's backward over its
// outputs with the output gradients passed in. torch.utils.checkpoint without reentrance (the
// one transformers' gradient_checkpointing_enable uses, `use_reentrant=False`; torch 2.11
// checkpoint.py _checkpoint_hook.unpack_hook) reruns the forward at the first unpack of a saved
// tensor, i.e. at the layer's first backward node that needs one (down_proj's, or the MoE
// weighting mul's: the residual add saves nothing), before any of the layer's gradients is
// made, and stops it once the last saved tensor is regenerated (early_stop, default True:
// _recomputation_hook raises _StopRecomputationError), each regenerated tensor then freed at its
// unpack as a kept one is at its node. Either way the rerun's moment holds what the forward held
// at its peak (forward_with: the saved tensors made so far, the transients, the residual stream)
// and the output's gradient (output_bytes) beside it; the forward-only transients (GLM-5's DSA
// indexer: two fp32 [s, H, s] score tensors, 4 GiB a layer at 4096 tokens, Note [hf MLA] in
// planner/frameworks/hf_build_layer.cc) make it the backward's peak. The backward's own moments
// follow, with the layer's input, which the checkpoint holds (offload_input: the restore brought
// back) until its backward ends, and what the checkpoint holds beyond it
// (LayerCost::checkpoint_held_bytes: under hf the step's masks, Note [hf masks]), which the rerun
// counts already as the forward did. Where keep saves the input (Megatron: the first norm's
// input, "input" among the saved tensors) the backward's moments count it already; where keep
// does not (transformers: the first RMSNorm saves its fp32 upcast, not the bf16 input, which
// keep frees after the forward), a recomputed layer's backward holds it beyond them: 2h bytes
// per token (torch 2.11 checkpoint.py: the non-reentrant checkpoint keeps the function's inputs
// in its frame until the frame's last saved tensor is unpacked). A measured layer's rerun is its
// measured forward (own forward bytes) with the output's gradient: the same moment read off the
// measured step (Note [Measured layers] in planner/frameworks/layer_profile.cc).
OptionCost EvaluateOption(const LayerCost& l, const LayerOption& o) {
  OptionCost c;
  const int k = std::max(1, o.chunks);
  const double overhead = (k - 1) * l.chunk_overhead_seconds;
  c.forward_seconds = l.forward_seconds + l.forward_comm_seconds + overhead;
  c.backward_seconds = l.backward_seconds + l.backward_comm_seconds + overhead;
  c.comm_seconds = l.forward_comm_seconds + l.backward_comm_seconds;
  // Attention runs before the FFN/MoE in forward and after it in backward: the FFN part's
  // working set (divided by the chunk count) sits on top of everything the attention part
  // saved, the attention part's on top of its own saved tensors only. The output (forward) or
  // the output and input gradients (backward) are alive throughout.
  const uint64_t attn_saved = l.saved_bytes - l.ffn_saved_bytes;
  const uint64_t ffn_fwd = l.ffn_forward_transient / k;
  const uint64_t ffn_bwd = l.ffn_backward_transient / k;
  auto forward_with = [&](uint64_t attn_part, uint64_t ffn_part) {
    return std::max(attn_part + l.attn_forward_transient, attn_part + ffn_part + ffn_fwd) +
           l.output_bytes;
  };
  // Note [Gradient timing]: each part's peak with the gradients made by then, and the input's
  // gradient where it exists by then.
  const uint64_t input_grad = l.input_grad_made_last ? 0 : l.input_bytes;
  auto backward_with = [&](uint64_t ffn_part) {
    return std::max({attn_saved + ffn_part + ffn_bwd + l.ffn_peak_grad_bytes,
                     attn_saved + l.ffn_inputs_backward_bytes + l.ffn_inputs_grad_bytes,
                     attn_saved + l.attn_backward_transient + l.attn_peak_grad_bytes}) +
           l.output_bytes + input_grad;
  };
  // Note [Recompute moment]: the input the checkpoint holds (or the restore brought back) through
  // the backward's own moments, where the layer's saved tensors do not include it already.
  const uint64_t unsaved_input = SavesInput(l) ? 0 : l.input_bytes;
  const uint64_t keep_forward = forward_with(attn_saved, l.ffn_saved_bytes);
  const uint64_t keep_backward = backward_with(l.ffn_saved_bytes);
  switch (o.policy) {
    case LayerPolicy::kKeep:
      c.resident_bytes = l.saved_bytes;
      c.forward_peak = keep_forward;
      c.backward_peak = keep_backward;
      break;
    case LayerPolicy::kSelectiveRecompute: {
      uint64_t dropped = 0;
      for (size_t m = 0; m < l.modules.size(); ++m) {
        if (o.module_mask & (1u << m)) {
          dropped += l.modules[m].saved_bytes;
          c.recompute_seconds += l.modules[m].seconds + (l.modules[m].in_ffn ? overhead : 0);
          if (l.modules[m].holds_checkpoint_held) c.checkpoint_held_bytes = l.checkpoint_held_bytes;
        }
      }
      c.resident_bytes = l.saved_bytes - dropped;
      c.forward_peak = keep_forward;
      // Note [Recompute moment]: a module's checkpoint holds its share of the step's inputs
      // through the layer's backward moments (the attention core's backward is the last).
      c.backward_peak = keep_backward + c.checkpoint_held_bytes;
      break;
    }
    case LayerPolicy::kRecompute:
    case LayerPolicy::kOffloadInput:
      c.resident_bytes = o.policy == LayerPolicy::kRecompute ? l.input_bytes : 0;
      c.host_bytes = o.policy == LayerPolicy::kOffloadInput ? l.input_bytes : 0;
      c.save_at_forward_start = o.policy == LayerPolicy::kOffloadInput;
      c.recompute_seconds = c.forward_seconds - l.forward_comm_seconds + l.recompute_comm_seconds;
      c.comm_seconds += l.recompute_comm_seconds;  // the recompute's collectives run again
      // Forward saves nothing but the input, and peaks at its transients or where its code
      // holds the most (LayerCost::unkept_forward_bytes); the recompute in backward regenerates
      // the FFN/MoE part chunk by chunk. Note [Recompute moment]: the backward's peak is the
      // larger of its own moments, with what the checkpoint holds through them, and the rerun
      // forward's.
      c.forward_peak =
          std::max(forward_with(l.input_bytes, 0), l.input_bytes + l.unkept_forward_bytes);
      c.checkpoint_held_bytes = l.checkpoint_held_bytes;
      c.backward_peak =
          std::max(backward_with(l.ffn_saved_bytes / k) + l.checkpoint_held_bytes + unsaved_input,
                   forward_with(attn_saved, l.ffn_saved_bytes / k) + l.output_bytes);
      break;
    case LayerPolicy::kOffloadSaved:
      c.host_bytes = l.saved_bytes;
      c.forward_peak = keep_forward;
      c.backward_peak = keep_backward;
      break;
  }
  return c;
}

std::vector<PlannedTransfer> OptionTransfers(const LayerCost& l, const LayerOption& o) {
  std::vector<PlannedTransfer> out;
  if (o.policy == LayerPolicy::kOffloadInput) {
    out.push_back({"input", l.input_bytes});
  } else if (o.policy == LayerPolicy::kOffloadSaved) {
    for (const SavedTensor& t : l.saved) {
      if (t.bytes > 0) out.push_back({t.name, t.bytes});
    }
  }
  return out;
}

std::vector<LayerOption> AllOptions(const LayerCost& l, const std::vector<int>& chunk_counts) {
  std::vector<LayerOption> out;
  for (int k : l.ffn_chunkable ? chunk_counts : std::vector<int>{1}) {
    out.push_back({LayerPolicy::kKeep, 0, k});
    const uint32_t subsets = 1u << l.modules.size();
    for (uint32_t mask = 1; mask < subsets; ++mask) {
      out.push_back({LayerPolicy::kSelectiveRecompute, mask, k});
    }
    out.push_back({LayerPolicy::kRecompute, 0, k});
    out.push_back({LayerPolicy::kOffloadInput, 0, k});
    out.push_back({LayerPolicy::kOffloadSaved, 0, k});
  }
  return out;
}

}  // namespace stowage::planner
