// The hf recipe's FFN part of a layer: its norms, the dense SwiGLU and the routed-expert blocks
// of each router family (grouped_mm experts, Llama 4's bmm experts), with the routing kernels'
// work (Note [Routing kernels]: RadixSortWork, SortKeyBits).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "planner/frameworks/hf.h"
#include "planner/frameworks/hf_layer.h"
#include "planner/hardware/op_time.h"

namespace stowage::planner {
namespace hf_internal {
namespace {

// Note [hf FFN act]
// The ffn_act / moe_act recompute modules are the SwiGLU activation rerun in backward under
// torch.utils.checkpoint: a decoder MLP's `act_fn(gate_proj(x)) * up_proj(x)` (LlamaMLP.forward
// and its copies), the experts' `_apply_gate` (integrations/moe.py _default_apply_gate:
// `act_fn(gate) * up`; GptOssExperts._apply_gate: the clamps, `gate * sigmoid(gate * alpha)`,
// `(up + 1) * glu`), Llama 4's bmm experts' `up * act_fn(gate)` (Llama4TextExperts.forward). As
// with attn_core (Note [hf attn_core]) the checkpoint drops what the activation keeps inside
// (the activation's output, kept by the mul: 2 bytes per element; gpt-oss's clamped, scaled and
// sigmoid tensors and the glu: 8) and holds its inputs (gate and up, or [gate; up]: kept anyway
// by the activation and the mul), and it cannot drop its output, the product, which the down
// projection (nn.Linear, the down grouped_mm, bmm) saves outside it: 2 bytes per element stay.
// Megatron's ffn_act / moe_act free the product too (CheckpointWithoutOutput discards its
// output's storage and refills it before backward, planner/frameworks/megatron.cc); transformers
// has no such mechanism. Shared experts have no module. Checked against autograd with the
// activation checkpointed by tests/python/measure/test_hf_layer_kinds.py (RecomputedActTest: the
// old recipe freed the product too, 2f or 2 fe per routed expert too much, on every family it ran).
// Rerunning a selective module peaks below the backward moment its part already has: the rerun
// regenerates the module's saved tensors (as kept) and its output once more, freed at once, beside
// the output's gradient, while the part's own backward moment (Note [hf FFN backward], the
// attention core's) holds those and the gradients it makes; so EvaluateOption charges a selective
// recompute keep's backward peak.

// Whether the router hands the experts fp32 weights (Ffn: the weighted output is then fp32).
// DeepSeek-V2's router too: its softmax is fp32 and `topk_weights * routed_scaling_factor`
// stays fp32 (DeepseekV2TopkRouter.forward; the weighting mul is bf16 x fp32 -> fp32).
bool HfFp32RoutingWeights(const ModelConfig& m, const HfDialect& d) {
  return m.family == "mixtral" || d.router == HfRouter::kDeepSeekSigmoid ||
         d.router == HfRouter::kDeepSeekSoftmax;
}

// Llama4TextMoe.forward (modeling_llama4.py) runs every expert on every token through torch.bmm
// (Llama4TextExperts): cuBLAS batched GEMMs, timed as dense GEMMs (the measured op work classes
// bmm so), and no sort or gathers. Bytes per token (E experts, k of them chosen): forward the
// router's topk (r 2E w 10k), full_like (w 2E), scatter_ (r 2E + 10k w 2E), sigmoid in fp32 with
// its casts (r 2E w 4E, r 4E w 4E, r 4E w 2E); repeat (r 2h w 2hE); the score mul (r 2hE w 2hE);
// silu over gate and its mul with up (r 2feE w 2feE, r 4feE w 2feE); the sum over experts (r 2hE
// w 2h); the add_ into the shared expert's output (r 4h w 2h): 28E + 20k + 8hE + 10feE + 10h, 15
// kernels with the two bmm. Backward: the sum's expanded gradient made contiguous for the down
// bmm (r 2hE w 2hE); the mul's two gradients and silu's (3 x r 4feE w 2feE), the chunk's cat of
// gate's and up's (r 4feE w 4feE); the score mul's (g * scores r 2hE w 2hE; g * x r 4hE w 2hE,
// summed over h r 2hE); repeat's, a sum over experts (r 2hE w 2h); the router's (casts, sigmoid's,
// gather, zeros, scatter: 30E + 20k); the sums of the normed input's three gradients (router,
// experts, shared expert: 2 x r 4h w 2h): 18hE + 26feE + 14h + 30E + 20k, 21 kernels with the
// four bmm. (The shared expert is a SwiGLU, counted as one.)
void Llama4MoeWork(HfLayer& b) {
  const double h = b.m.hidden, e = b.m.experts, k = b.m.experts_per_token;
  const double fe = b.m.moe_intermediate;
  b.Traffic(28 * e + 20 * k + 8 * h * e + 10 * fe * e + 10 * h,
            18 * h * e + 26 * fe * e + 14 * h + 30 * e + 20 * k, 15, 21);
  b.gemm_flops += 2 * 3 * h * fe * e * b.t;
}

}  // namespace

// Note [hf FFN backward]
// The FFN's backward peaks at the SwiGLU mul's backward: down_proj's node runs first and releases
// the product it saved (2f); the mul's backward then makes its two gradients (4f) while the
// product's gradient (2f), gate, up and silu's output are alive: 6f on top of the FFN's saved
// tensors less the product. The routed experts likewise, less the weighted expert output (2h per
// routed expert) that the weighting mul's node released before. Measured at that moment
// (tests/python/measure/test_hf_measured_agreement.py, live bytes of recompute steps of Mistral and
// Mixtral).
void Ffn(HfLayer& b, const LayerSpec& spec) {
  const ModelConfig& m = b.m;
  const double h = m.hidden;
  const bool post_norms = m.norms_per_layer == 4;  // Gemma 2/3: post-attention norm here
  if (post_norms) b.Norm("attn.post_norm", h, 1, false);
  b.Norm("ffn.norm", h, 1, true);
  // Residual add; backward sums the gradients of the mid state's two uses.
  b.Traffic(6 * h, 6 * h, 1, 1);
  const size_t first = b.cost.saved.size();
  // A SwiGLU of width f (LlamaMLP.forward): silu r 2f w 2f, mul r 4f w 2f; backward the mul's
  // two gradients (2 x r 4f w 2f) and silu's (r 4f w 2f), and the sum of gate's and up's input
  // gradients (r 4h w 2h); 3 GEMMs forward, 6 backward.
  auto swiglu = [&](double f, const char* prefix, const char* module) {
    b.Save(absl::StrCat(prefix, ".gate_up"), "", 4 * f);
    if (*module != '\0') {
      // Note [hf FFN act]: the module frees the activation's output, not the product.
      b.Save(absl::StrCat(prefix, ".act"), module, 2 * f);
      b.Save(absl::StrCat(prefix, ".act_out"), "", 2 * f);
    } else {
      b.Save(absl::StrCat(prefix, ".act"), module, 4 * f);
    }
    b.Traffic(10 * f, 18 * f + 6 * h, 2 + 3, 4 + 6);
  };
  if (spec.ffn == FfnKind::kDense) {
    const double f = m.intermediate;
    swiglu(f, "ffn", "ffn_act");
    AddModule(b, "ffn_act", OpSeconds({.elementwise_bytes = 10 * f * b.t, .kernels = 2}, b.hw),
              true);
    // Forward: down_proj's output. Backward (Note [hf FFN backward]): the product's gradient
    // and the mul's two, 6f, once down_proj's node has released the product it saved (2f).
    b.cost.ffn_forward_transient = static_cast<uint64_t>(2 * h * b.t);
    b.cost.ffn_backward_transient = static_cast<uint64_t>(4 * f * b.t);
    // Note [hf gradient timing]: at up_proj's and gate_proj's backward the mul and silu have
    // released what they saved; alive are the gradients of gate's and up's outputs (2f each)
    // and the two input gradients they make (2h each), one moment's worth of each at most.
    b.cost.ffn_inputs_backward_bytes = static_cast<uint64_t>((4 * f + 4 * h) * b.t);
  } else {
    const double e = m.experts, k = m.experts_per_token, fe = m.moe_intermediate;
    const double offsets = 4 * e;  // grouped_mm's int32 expert offsets, per layer
    double act = 4 * fe * k;
    double per_expert = b.t * k / e;
    // Note [hf transformers versions]: 5.17's EP-sentinel mask, one bool per routed row, saved by
    // its three masked_fills (one storage).
    const bool masks = b.dialect.ep_sentinel_masks && b.dialect.router != HfRouter::kLlama4;
    const double mask = masks ? k : 0;
    switch (b.dialect.router) {
      case HfRouter::kQwen:
        b.Save("moe.router", "", 4 * e + 8 * k + 4 * k + 4);
        b.Save("moe.dispatched", "", 3 * 8 * k + 2 * k + 2 * h * k + mask, offsets);
        b.Save("moe.gate_up", "", 4 * fe * k);
        break;
      case HfRouter::kDeepSeekSoftmax:
      case HfRouter::kDeepSeekSigmoid: {
        const bool renorm = b.dialect.router == HfRouter::kDeepSeekSigmoid;
        b.Save("moe.router", "", 4 * h + 4 * e + 8 * k + (renorm ? 4 + 4 * k : 0), 4 * e * h);
        // The router's F.linear on fp32 copies (Note [Step time]): out of the dense GEMMs that
        // BuildHfLayer counts for every dense parameter, into the fp32 ones, with both its
        // gradients.
        b.gemm_flops -= 2 * h * e * b.t;
        b.fp32_gemm_flops += 2 * h * e * b.t;
        b.fp32_gemm_backward_flops += 4 * h * e * b.t;
        b.Save("moe.dispatched", "", 3 * 8 * k + 4 * k + 2 * h * k + mask, offsets);
        b.Save("moe.gate_up", "", 4 * fe * k);
        break;
      }
      case HfRouter::kGptOss:
        b.Save("moe.router", "", 8 * k + 2 * k);
        b.Save("moe.dispatched", "", (m.expert_bias ? 4 : 3) * 8 * k + 2 * k + 2 * h * k + mask,
               offsets);
        b.Save("moe.gate_up", "", 4 * fe * k);
        act = 10 * fe * k;
        // GptOssExperts (modeling_gpt_oss.py) beyond the SwiGLU counted below, bytes per token.
        // Forward: the two clamps (r2 w2 of fe each), `gate * alpha`, sigmoid, `up + 1` (r2 w2),
        // and the two muls (r4 w2) = 32 fe per routed expert against SwiGLU's 10; the biases
        // gathered by expert id (gate_up r 2 w 2 of 2fe + the ids, down r 2 w 2 of h) and added
        // in place (r4 w2): +42 fe + 10 h + 16 per routed expert; the router is top-k of the
        // biased logits and a softmax over k (2 kernels, not the 6 of softmax over E, top-k,
        // renormalise and cast), and the dispatch casts once less: 4 kernels more. Backward:
        // the five muls' gradients (r4 w2), the alpha mul's (r2 w2), sigmoid's (r4 w2), the
        // clamps' where (r2 + bool r1 w2) and their le/ge/and masks (r2 w1, r1 r1 w1), the sum
        // of gate's two gradients (r4 w2), the interleaved slices' zeros and copies (w4 + r2 w2
        // each) summed (r4 w2 of 2fe) = 96 fe against SwiGLU's 26: +70 fe, 16 kernels; the two
        // biases' gradients are index_put(accumulate) by expert id (each value row read, its
        // expert's row read and rewritten: 3 bytes per value byte; the ids read, their linear
        // index and positions and their sort on log2(E) bits: 8 + 56 + RadixSortWork per key,
        // Note [Routing kernels]; 6 kernels and the sort's each, and a zero fill): +12 fe + 6 h +
        // 2 x (64 + sort) per routed expert.
        if (m.expert_bias) {
          const HfKernelWork bias_sort =
              RadixSortWork(8, SortKeyBits(static_cast<uint64_t>(e) - 1));
          b.Traffic((42 * fe + 10 * h + 16) * k,
                    (70 * fe + 12 * fe + 6 * h + 2 * (64 + bias_sort.bytes)) * k, 4,
                    16 + 2 * (6 + bias_sort.kernels));
        }
        break;
      case HfRouter::kLlama4:
        b.Save("moe.router", "", 8 * k + 4 * e + 2 * e);
        b.Save("moe.dispatched", "", 4 * h * e);
        b.Save("moe.gate_up", "", 4 * fe * e);
        act = 4 * fe * e;
        per_expert = b.t;
        break;
    }
    const double routed = b.dialect.router == HfRouter::kLlama4 ? e : k;
    // Note [hf FFN act]: moe_act frees what the activation keeps inside, not the product the
    // down projection keeps (2 fe per routed expert).
    b.Save("moe.act", "moe_act", act - 2 * fe * routed);
    b.Save("moe.act_out", "", 2 * fe * routed);
    if (b.dialect.router != HfRouter::kLlama4) b.Save("moe.expert_out", "", 2 * h * k);
    // grouped_mm_experts_forward (integrations/moe.py), bytes per token (k routed experts; Llama 4
    // runs all E). Forward: the router GEMM, softmax to fp32 r 2E w 4E, top-k r 4E (its outputs
    // and their in-place sort: 36k and 2 kernels, below), the top-k renormalisation and cast (4
    // kernels, per-row sizes); torch.sort of the t*k int64 expert ids with their positions (Note
    // [Routing kernels]: 272 B per key, 21 kernels); perm // k, the weight gather, histc (3
    // kernels, 2 below 100 experts), cumsum and casts (8 or 7 kernels, per-key sizes); the gather
    // hidden[perm // k] r 2hk w 2hk (vectorized rows, Note [Routing kernels]); the up grouped_mm;
    // silu(gate) * up over the [t*k, 2fe] halves r 2fe w 2fe + r 4fe w 2fe; the down grouped_mm;
    // the routing-weight mul r 2hk w 2hk; inv_perm (arange, index_put); the gather
    // weighted_out[inv_perm] r 2hk w 2hk; the sum over k r 2hk w 2h. Backward: sum's expand is a
    // view, which index_put copies to a contiguous [t*k, h] (r 2hk w 2hk); the inv_perm gather's
    // index_put(accumulate) into zeros (w 2hk; its linear index, positions and sort of the t*k row
    // ids on 16-17 bits: Note [Routing kernels]; values r 2hk, target rows r 2hk w 2hk); the
    // weighting mul's two gradients (g * w: r 2hk w 2hk; g * out: r 4hk w 2hk, summed over h r
    // 2hk); down's two grouped GEMMs; the gate's mul and silu gradients (2 x r 4fe w 2fe per k, r
    // 4fe w 2fe) and the chunk's cat into [t*k, 2fe] (r 4fe w 4fe); up's two grouped GEMMs; the
    // hidden gather's index_put into zeros (w 2h, its sort of the token ids on log2(t) bits, values
    // r 2hk, and the token's row read and rewritten once per routed copy, r 2hk w 2hk:
    // indexing_backward_kernel reloads and stores the destination for every duplicate,
    // stowage/measure/op_work.py Note [Kernel bytes]); the routing weights' gather, top-k's scatter
    // (w 4E), softmax's backward (r 8E w 4E) and cast (r 4E w 2E); the router's two GEMMs; the sum
    // of the normed input's two gradients (router and experts: r 4h w 2h). Each _grouped_mm is
    // two kernels (prepare_grouped_gemm_data and the GEMM: 2 forward, 4 backward beyond the one
    // counted per call).
    const double r = routed;
    // Mixtral, DeepSeek-V2/V3 and GLM keep the routing weights fp32 (their routers never cast
    // them; Qwen's does): the weighting mul promotes the expert output to fp32, so the
    // un-permute gather and the sum over k move fp32 and a cast to bf16 follows. Forward: mul
    // w 4hk (+2hk), gather r 4hk w 4hk (+4hk), sum r 4hk w 4h (+2hk +2h), cast r 4h w 2h (+6h).
    // Backward: the cast's gradient (r 2h w 4h), the index_put's zeros, expanded-gradient copy
    // and accumulation in fp32 (+8hk), the expert output's gradient in fp32 and its cast to bf16
    // (+8hk), the weights' gradient from an fp32 product (+6hk): +22hk + 6h, 2 more kernels.
    if (HfFp32RoutingWeights(b.m, b.dialect)) {
      b.Traffic(8 * h * r + 8 * h, 22 * h * r + 6 * h, 1, 2);
    }
    if (b.dialect.router == HfRouter::kLlama4) {
      Llama4MoeWork(b);
    } else {
      // Note [Routing kernels]: the sort of the expert ids (64 bits, the positions' fill), and
      // each gather's backward: the linear index and positions (56 B per index) and the sort of
      // the destination's row ids on their significant bits.
      const HfKernelWork sort = RadixSortWork(8, 64);
      const HfKernelWork unpermute =
          RadixSortWork(8, SortKeyBits(static_cast<uint64_t>(b.t * r) - 1));
      const HfKernelWork dispatch = RadixSortWork(8, SortKeyBits(static_cast<uint64_t>(b.t) - 1));
      // The routing weights' gather `sample_weights[perm]` (one element per row): its backward
      // sorts the t*k positions the same way (indexing_backward_kernel_stride_1 after it).
      const HfKernelWork weights = unpermute;
      b.Traffic(6 * e + 4 * e + 36 * r + (sort.bytes + 8) * r + 4 * h * r + 10 * fe * r +
                    4 * h * r + 4 * h * r + 2 * h * r + 2 * h,
                4 * h * r + 2 * h * r + (56 + unpermute.bytes) * r + 6 * h * r + 12 * h * r +
                    18 * fe * r + 8 * fe * r + 2 * h + (56 + dispatch.bytes) * r + 2 * h * r +
                    4 * h * r + (56 + weights.bytes) * r + 4 * e + 12 * e + 6 * e + 6 * h,
                1 + 1 + 2 + 4 + (1 + sort.kernels) + (e >= 100 ? 8 : 7) + 1 + 1 + 2 + 1 + 1 + 2 +
                    1 + 1 + 2,
                1 + 1 + (4 + unpermute.kernels) + 2 + 3 + 2 + 4 + 2 + 1 + (4 + dispatch.kernels) +
                    2 + (4 + weights.kernels) + 2 + 2 + 2 + 2 + 1 + 4);
      if (masks) {
        // Note [hf transformers versions], per routed row. Forward: the mask (ge: r 8 w 1), the
        // ids' clamp_ (r 8 w 8), the gathered states' masked_fill_ (r 2h + 1 w 2h), and the two
        // out-of-place masked_fills, each a clone (r w of the tensor) and an in-place fill (r
        // w + the mask): [t*k, 2fe] 16fe + 1, [t*k, h] 8h + 1 (masked_fill in
        // TensorAdvancedIndexing.cpp: `_self->clone(...)` then `masked_fill_`); 7 kernels.
        // Backward: each masked_fill's gradient is `grad.masked_fill(mask, 0)`
        // (derivatives.yaml), again a clone and a fill: 8h + 1, 16fe + 1, 8h + 1; 6 kernels.
        b.Traffic((12 * h + 16 * fe + 28) * r, (16 * h + 16 * fe + 3) * r, 7, 6);
      }
      b.grouped_flops += 2 * 3 * h * fe * routed * b.t;
      b.tokens_per_expert = per_expert;
    }
    if (m.shared_intermediate > 0) swiglu(m.shared_intermediate, "moe.shared", "");
    if (m.shared_expert_gate) {
      // Qwen2Moe / Qwen3Next SparseMoeBlock: `F.sigmoid(self.shared_expert_gate(x)) *
      // shared_expert_output` keeps the sigmoid's output (2) and the shared expert's (2h).
      b.Save("moe.shared_gate", "", 2 + 2 * h);
      b.Traffic(8 * h + 4, 14 * h + 8, 2, 3);
    }
    AddModule(b, "moe_act",
              OpSeconds({.elementwise_bytes = 10 * fe * routed * b.t, .kernels = 2}, b.hw), true);
    // Forward: weighted_out, its permuted copy and the router logits. Backward
    // (Note [hf FFN backward]): at the SwiGLU mul's backward, the product's gradient and the mul's
    // two (6fe per routed expert), with the product (2fe) and the weighted expert output (2h)
    // released by the nodes already run; Llama 4 keeps no expert output and runs all E. A shared
    // expert that runs after the routed ones (DeepseekV3MoE, Glm4MoeMoE, Llama4TextMoe:
    // Note [hf gradient timing]) has run its whole backward by then and freed what it saved (8 fs;
    // the live bytes of Llama 4 at 16384 tokens: its gate/up and activations are gone while its
    // weights' gradients exist), and made its input's gradient (2h), which autograd holds
    // until the block's other uses of that input (the router, the dispatch) add theirs, at the
    // block's end (Note [Gradient timing] in cost_model.cc). The block's input itself (the
    // norm's bf16 output, counted with the norm) was then kept by the shared expert's gate/up
    // only where the router takes an fp32 copy (DeepSeek, GLM, Kimi: `F.linear(x.float(), ...)`;
    // the dispatch's gather keeps indices): released too. Llama 4's router is an nn.Linear on
    // it. (Live bytes at DeepSeek-V3's routed gate_up backward, 4096 tokens: the shared
    // expert's input gradient, 56 MiB, alive, its input gone.) Later moments (the gathered
    // states' gradient, 2h per routed expert) come after gate_up and act are freed.
    const bool shared_after = m.shared_intermediate > 0 && !m.shared_expert_gate;
    const bool fp32_router = b.dialect.router == HfRouter::kDeepSeekSoftmax ||
                             b.dialect.router == HfRouter::kDeepSeekSigmoid;
    // Beyond the saved tensors: the shared expert's input gradient less its input released.
    const double shared_left = shared_after && !fp32_router ? 2 * h : 0;
    const double released = 2 * fe * routed +
                            (b.dialect.router == HfRouter::kLlama4 ? 0 : 2 * h * routed) +
                            (shared_after ? 8.0 * m.shared_intermediate : 0);
    b.cost.ffn_backward_transient =
        static_cast<uint64_t>(std::max(0.0, (6 * fe * routed - released + shared_left) * b.t));
    b.cost.ffn_forward_transient = static_cast<uint64_t>((4 * h * routed + 2 * e) * b.t);
    // Note [hf gradient timing]: at the up projection's backward (gate_up_proj's gradient made)
    // the gate, the product and the weighted output are released; alive are what was saved
    // before the experts (the router's, the dispatch's gathered states and indices, and a shared
    // expert that ran before the router), the gradient of [gate; up] (4fe per routed expert) and
    // of the gathered states (2h per routed expert), and what a shared expert run after them
    // left (shared_left).
    double before_experts = 0;
    for (size_t i = first; i < b.cost.saved.size(); ++i) {
      const std::string& name = b.cost.saved[i].name;
      if (name == "moe.router" || name == "moe.dispatched" ||
          (m.shared_expert_gate && absl::StartsWith(name, "moe.shared."))) {
        before_experts += static_cast<double>(b.cost.saved[i].bytes);
      }
    }
    b.cost.ffn_inputs_backward_bytes =
        static_cast<uint64_t>(before_experts + ((4 * fe + 2 * h) * routed + shared_left) * b.t);
  }
  if (spec.cross_attention) b.Save("ffn.gated_out", "", 2 * h, 2);  // Note [hf cross-attention]
  if (post_norms) b.Norm("ffn.post_norm", h, 1, false);
  for (size_t i = first; i < b.cost.saved.size(); ++i) {
    b.cost.ffn_saved_bytes += b.cost.saved[i].bytes;
  }
}

}  // namespace hf_internal

// Note [Routing kernels]
// The routing and indexing kernels of a routed-expert block (grouped_mm_experts_forward) as torch
// 2.11 runs them on CUDA, from their code; stowage/measure/op_work.py counts the same bytes
// and kernels for the same aten ops (its Note [Kernel bytes]), and tests pin both sides to the
// same numbers.
//  - torch.sort of the t*k int64 expert ids (Sort.cpp sort_cuda_kernel: more than 4096 keys, so
//    not the in-place bitonic sort; SortStable.cu segmented_sort_large_segments, one segment):
//    fill_reverse_indices_kernel writes the int64 positions (w 8 per key), then
//    at::cuda::cub::radix_sort_pairs with its default bits, all 64 of an int64 key: torch does
//    not narrow the expert ids, whose 7 significant bits would take one pass.
//  - CUB's onesweep radix sort (DispatchRadixSort::InvokeOnesweep, sm80+ policies: ONESWEEP for
//    keys of 4 bytes or more, 8 bits a pass): memsets of the pass counters and the bins, one
//    histogram kernel reading every key once for all passes' digits, one exclusive-sum kernel,
//    then per pass a memset of the decoupled look-back and one onesweep kernel that reads and
//    writes every key and value: per key, key_bytes + passes * 2 * (key_bytes + 8) bytes and
//    4 + 2 * passes kernels, passes = ceil(bits / 8). torch.sort of int64: 8 passes, 264 B + the
//    positions' 8, 21 kernels with fill_reverse_indices.
//  - index_put_(accumulate=True), the backward of a row gather (`hidden[perm // k]`,
//    `weighted_out[inv_perm]`; IndexBackward0 calls _index_put_impl_ with unsafe=true: no range
//    check, no host sync): index_put_with_sort_kernel (Indexing.cu) computes the linear index
//    (computeLinearIndex: `index.remainder(size)`, `* stride`; then `divide_(sliceSize,
//    "trunc")`: three int64 kernels, r 8 w 8 each), `at::arange` for the positions (w 8), and
//    sorts the row ids on get_num_bits(largestIndex(self) / sliceSize) bits only (cub.h: the
//    destination's rows - 1: 13 bits for 8192 tokens, 16 for the 65536 routed rows, 2 passes
//    each), then runs indexing_backward_kernel (its bytes: stowage/measure/op_work.py
//    Note [Kernel bytes]): per index 56 + RadixSortWork(8, bits) bytes and 4 + its kernels + 1.
//  - The row gathers themselves (aten::index of `hidden[perm // k]` and `weighted_out[inv_perm]`,
//    one int64 index over dim 0 of a contiguous bf16 matrix) take gpu_index_kernel's fast path
//    (IndexKernel.cu; IndexKernelUtils.h fast_gather_kernel_eligible: a 2-D iterator, whole
//    contiguous rows, 16-byte aligned rows and pointers): vectorized_gather_kernel copies each
//    row with 16-byte loads and stores, so the 2-byte elements stream at the element-wise rate
//    (each row read and written once, the index read once).
//  - topk(probs, k) over E = 128 experts per token (TensorTopK.cu): 8192 rows of 128 take the
//    one-block-per-row radix select (should_use_multiblock is false below 400 per row), one
//    gatherTopK kernel reading each row once (its radix passes re-read the row from L1), writing
//    k values and int64 indices; `sorted=True` then sorts each row's k results in place
//    (sortKeyValueInplace, one kernel): r 4E w 12k, r 12k w 12k, 2 kernels.
//  - histc over 128 bins (SummaryOps.cu CUDA_tensor_histogram): 128 >= 100 bins takes the
//    MULTI_BLOCK kernel, which zeroes a [blocks, bins] partial histogram first: the output's
//    zeros, the partial's zeros and the histogram kernel, 3 kernels (2 below 100 bins: SHARED);
//    the host calls cudaMemGetInfo once per call to choose.
HfKernelWork RadixSortWork(int key_bytes, int key_bits) {
  const int passes = (key_bits + 7) / 8;
  return {static_cast<double>(key_bytes + passes * 2 * (key_bytes + 8)),
          static_cast<double>(4 + 2 * passes)};
}

int SortKeyBits(uint64_t largest_key) {
  int bits = 1;
  while (largest_key > 1) {
    largest_key >>= 1;
    ++bits;
  }
  return bits;
}
}  // namespace stowage::planner
