// The `hf` framework profile: what a Hugging Face transformers decoder holds and spends when it
// trains in eager PyTorch (SDPA attention, the model's default loss). See Note [hf profile] in
// hf_layer.h for the recipe of each module kind and the code each term comes from.
#ifndef STOWAGE_PLANNER_FRAMEWORK_HF_H_
#define STOWAGE_PLANNER_FRAMEWORK_HF_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/cost/cost_model.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"

namespace stowage::planner {

// transformers eager runs one model replica per GPU: --tp, --cp and --ep must be 1, and the loss
// is computed over every token at once (--loss-chunk-tokens 0). Every layer kind the config
// reader knows has a recipe. Errors name the flag and what is allowed.
absl::Status ValidateHfRun(const ModelConfig& model, const RunSettings& run);

// One decoder layer's bytes and seconds under the hf profile (tokens: per rank).
LayerCost BuildHfLayer(const ModelConfig& model, const HardwareProfile& hardware,
                       const RunSettings& run, int index, double tokens);

// An RMSNorm's element-wise work in the model family's code, per element of its width: bytes read
// + written forward and backward, and kernels (NormWorkOf in hf_layer.cc says how each is
// counted). Pinned against the real transformers norms by tests/planner/data/hf_norm_work.json
// (tests/planner/frameworks/layer_kinds_test.cc, tests/python/measure/test_hf_norm_work.py).
struct HfNormWork {
  double fwd, bwd, fwd_kernels, bwd_kernels;
};
HfNormWork NormWorkOf(const ModelConfig& model);

// A gated DeltaNet or KDA token mixer's work in transformers' torch fallbacks
// (Note [hf linear attention work] in hf_linear_attention.cc), for one sequence of `seq_len`
// tokens: element-wise bytes read + written, kernels and the chunk loops' GEMM FLOPs (on fp32
// operands: OpWork::fp32_gemm_flops), forward and backward; everything the
// mixer module runs except its projections' GEMMs (counted from the layer's parameters). Pinned
// against the real fallbacks' captured ops by tests/planner/data/hf_linear_attention_work.json
// (tests/planner/frameworks/hf_norm_work_test.cc,
// tests/python/measure/test_hf_linear_attention_work.py).
struct HfLinearAttentionWork {
  double fwd_bytes = 0, bwd_bytes = 0, fwd_kernels = 0, bwd_kernels = 0;
  double fwd_fp32_gemm_flops = 0, bwd_fp32_gemm_flops = 0;
};
HfLinearAttentionWork LinearAttentionWorkOf(const ModelConfig& model, AttentionKind kind,
                                            double seq_len);

// The transformers release `version` names ("5.N" or "5.N.P"), as RunSettings::transformers_minor
// (N); the recipe follows 5.17's code and that of the releases after it, so N >= 17
// (Note [hf transformers versions] in hf_versions.cc). Errors name --transformers, the value and
// the rule.
absl::StatusOr<int> ParseTransformersVersion(const std::string& version);

// One CUDA routine's work per element it is called on: bytes read + written and kernels
// (memsets included).
struct HfKernelWork {
  double bytes = 0, kernels = 0;
};
// CUB's onesweep radix sort of keys `key_bytes` wide with int64 values over the low `key_bits`
// bits, as torch 2.11 calls it (at::cuda::cub::radix_sort_pairs), per key:
// Note [Routing kernels] in hf_ffn.cc. Pinned with stowage/measure/op_work.py's radix_sort_work by
// the same numbers (tests/planner/frameworks/layer_kinds_test.cc,
// tests/python/measure/test_hf_kernel_bytes.py).
HfKernelWork RadixSortWork(int key_bytes, int key_bits);
// The bits torch sorts a non-negative key below `largest_key` + 1 on (at::cuda::cub::get_num_bits,
// cub.h): 1 + floor(log2(largest_key)), at least 1.
int SortKeyBits(uint64_t largest_key);

// The step-level parts of the hf profile: the final norm, LM head and loss (the tail), the
// embedding, parameter gradients created during backward, the cuBLAS workspaces and the RoPE
// tables. Fixed memory's weights and optimizer state are already counted in `step`.
void ApplyHfStep(const ModelConfig& model, const HardwareProfile& hardware, const RunSettings& run,
                 StepCost& step);

// What torch's data-parallel engine holds beyond the one-GPU step when a stage has more than one
// data-parallel rank, by --sharding (Note [hf data parallel]): DDP's gradient buckets, FSDP2's
// reduce-scattered layer gradients and its root module's unsharded parameters. Runs on the
// stage's step (its layers, tail and embedding) after ApplyHfStep.
void ApplyHfDataParallel(const RunSettings& run, StepCost& step);
// The torch engine a --framework hf run's --sharding names (Note [hf data parallel]), as the
// plan summary says it: "DDP", "FSDP2 fully_shard", ...; "no data-parallel engine" on one rank.
std::string HfDataParallelEngine(const RunSettings& run);

// Note [hf linear attention]: the line the plan summary prints under --framework hf when the
// step has gated DeltaNet or KDA layers: which code path their recipe models (transformers'
// torch fallbacks, what runs without flash-linear-attention and causal-conv1d installed), or ""
// when it has none.
std::string HfLinearAttentionPath(const StepCost& step);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_FRAMEWORK_HF_H_
