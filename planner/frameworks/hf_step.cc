// ApplyHfStep: the step-level parts of the hf recipe beyond its layers: gradients made in
// backward, the cuBLAS workspaces and RoPE tables, the final norm, LM head and loss (the tail),
// and the embedding; and why the recipe times the device only (Note [hf host time]).
#include <cmath>
#include <cstdint>

#include "planner/frameworks/hf.h"
#include "planner/frameworks/hf_layer.h"
#include "planner/hardware/op_time.h"

namespace stowage::planner {

using hf_internal::DialectFor;
using hf_internal::HfDialect;
using hf_internal::HfNorm;
using hf_internal::NormWork;
using hf_internal::NormWorkOf;

// Note [hf host time]
// The recipe times the device only: an eager step is host-bound only where the GPU runs out of
// queued kernels, and in these steps it does not. Python's dispatch of an aten op to a launched
// CUDA kernel costs 5-25 us on a modern host (a CUDA torch.add issued back to back from Python:
// 8 us per op on an A100 host, flagos-ai/Torch-FL PR #27, 2026; the dispatcher alone about 1 us,
// pytorch/pytorch#41383), against a step of one launch per 116 us of device time on average
// (the public Qwen3-MoE case: 1,315 aten ops in 152 ms). Nothing in it synchronizes the host
// with the stream (grouped_mm's no-sync path, index_put's unsafe backward, histc with given
// bounds), so the host's lead only grows: each layer's attention issues ~2 ms of GEMMs in ~30
// ops. The MoE block's routing before its first grouped GEMM (17 aten ops in 5.23, 21 in 5.17:
// softmax, top-k, renormalisation, the sort's 21 kernels, the gathers, histc, cumsum) takes the
// host about what it takes the device (~0.2 ms each), so even there the queue does not drain.
// One call is unsettled: histc asks cudaMemGetInfo for free memory on every call (SummaryOps.cu)
// and whether that waits for the stream is not documented (4.85 us on an idle device,
// pytorch/pytorch#174625; sglang PR #25299 calls it host-syncing); if it does, each MoE layer
// exposes the host's issue of the ops from histc to the up grouped GEMM (cumsum, 5.17's four
// mask ops: ~50 us, 0.3 ms a step of 6 layers). The backward runs in autograd's C++ engine,
// cheaper per op. The host time before the step's first kernel (the model's Python preamble) is
// not modelled.

void ApplyHfStep(const ModelConfig& m, const HardwareProfile& hw, const RunSettings& run,
                 StepCost& c) {
  const double t = static_cast<double>(c.tokens_per_rank);
  const double h = m.hidden, v = m.vocab, d = m.head_dim;
  // Gradients are created in backward, not allocated before the step.
  c.gradients_in_backward = true;
  c.fixed.gradients = 0;
  // The LM head's (the embedding's too when tied) and the final norm's at the end of the tail.
  c.tail_grad_bytes = static_cast<uint64_t>((v * h + h) * run.grad_bytes);
  c.embedding_grad_bytes =
      m.tied_embeddings ? 0 : static_cast<uint64_t>(v * h * static_cast<double>(run.grad_bytes));
  // Held throughout the step: the two cuBLAS workspaces and RoPE's cos/sin (2 x 2d per token;
  // OLMo: fp32, one pair per layer type, Note [hf OLMo and Phi-3]). Gemma 3 computes one bf16
  // pair per layer type present too (Gemma3TextModel.forward: the local and the global rotary
  // tables, position_embeddings[layer_type]), each kept by RoPE's muls.
  const HfDialect dialect = DialectFor(m);
  bool sliding = false, full = false;
  for (const LayerSpec& l : m.layers) (l.span == AttentionSpan::kSliding ? sliding : full) = true;
  double rope_bytes = 4 * (m.rotary_dim > 0 ? m.rotary_dim : d);  // Note [hf partial rotary]
  if (dialect.fp32_rope) {
    rope_bytes = 8 * d * (sliding && full ? 2 : 1);
  } else if (m.family == "gemma3_text") {
    rope_bytes = 4 * d * ((sliding ? 1 : 0) + (full ? 1 : 0));
  }
  c.fixed.other += kTorchCublasWorkspacesBytes + static_cast<uint64_t>(rope_bytes * t);
  // Cross-attention layers' shared inputs (Note [hf cross-attention]): the projected vision
  // states (2h per vision token), the additive mask [b, 1, s, V] and the row mask [b, 1, s, 1]
  // in bf16. The vision tower that produced them is not planned.
  bool cross = false;
  for (const LayerSpec& l : m.layers) cross |= l.cross_attention;
  if (cross && m.vision_tokens > 0) {
    const double vision = static_cast<double>(m.vision_tokens) * run.micro_batch;
    c.fixed.other += static_cast<uint64_t>(2 * h * vision + 2 * t * m.vision_tokens + 2 * t);
  }
  // The tail: final norm (8h + 4; the fp32 weight mul keeps its fp32 input: 10h + 4,
  // Note [hf dialects]) + the loss's 14V + labels (16) per token (Note [hf profile]). Final-logit
  // soft-capping (Gemma2ForCausalLM / Gemma3ForCausalLM.forward: logits / cap, tanh, * cap)
  // keeps tanh's bf16 output through the loss's backward: 2V more at its peak (the model output
  // holds the capped logits, the 2V already counted). fp32 logits (MllamaForCausalLM): the
  // output holds them (4V) and the loss's `logits.float()` is that tensor: 16V.
  const bool softcap = m.final_logit_softcap > 0;
  const double final_norm = (dialect.norm == HfNorm::kLlama ? 8 : 10) * h + 4;
  const double loss = m.fp32_logits ? 16 : 14;
  c.tail_bytes =
      static_cast<uint64_t>(std::llround((final_norm + loss * v + (softcap ? 2 * v : 0) + 16) * t));
  const NormWork norm = NormWorkOf(dialect.norm);
  // Of them the logits (bf16, 2V; MllamaForCausalLM's fp32, 4V) outlive the loss:
  // LlamaForCausalLM.forward (and every *ForCausalLM) returns CausalLMOutputWithPast(loss=loss,
  // logits=logits), and the training loop holds that output while it runs
  // `out.loss.backward()` (as the measured runs did and python/stowage/measure/hf_trace.py does:
  // `out = model(...); out.loss.backward()`, `del out` after it).
  c.held_logits_bytes = static_cast<uint64_t>(std::llround((m.fp32_logits ? 4 : 2) * v * t));
  // LM head: one GEMM forward, two backward (one chunk covers every token, so the logits are
  // not recomputed). The loss (ForCausalLMLoss, loss/loss_utils.py), bytes per token: float()
  // r 2V w 4V; log_softmax over V = 1e5+ columns (cunn_SoftMaxForward: a row does not fit in
  // shared memory, so max, sum and write each read it) r 12V w 4V; nll_loss; backward
  // nll_loss's zeros w 4V and scatter; log_softmax's (the row sum of the gradient, then
  // r 8V w 4V) r 12V w 4V; float()'s r 4V w 2V: 48V, ~12 kernels with the label pad and shift.
  // The final norm (NormWorkOf): Llama's 36h forward, 96h backward, 8 + 16 kernels.
  // Soft-capping: div, tanh and mul r2 w2 each forward; backward the mul's r2 w2, tanh_backward
  // r4 w2, the div's r2 w2: 26V, 6 kernels.
  c.tail_time = OpTimeOf(
      {.gemm_flops = 3 * 2 * h * v * t,
       .elementwise_bytes = (48 * v + (softcap ? 26 * v : 0) + (norm.fwd + norm.bwd) * h) * t,
       .kernels = 3 + 12 + norm.fwd_kernels + norm.bwd_kernels + (softcap ? 6 : 0)},
      hw);
  c.tail_seconds = c.tail_time.total();
  // Embedding: the gather forward (r 2h w 2h); backward (embedding_dense_backward) zeroes the
  // V x h gradient, sorts the ids and sums each id's rows in fp32 (r 2h, w+r 8h, w 2h). A tied
  // weight's second gradient is added into the LM head's by AccumulateGrad (`grad += new`:
  // r 4Vh w 2Vh).
  const double tied_accumulate = m.tied_embeddings ? 6 * v * h : 0;
  // Gemma's embeddings are scaled by sqrt(h) (Gemma2TextScaledWordEmbedding / Gemma3's: `*
  // embed_scale`): r2 w2 forward and in its gradient.
  const double scaled = m.family == "gemma2" || m.family == "gemma3_text" ? 1 : 0;
  c.embedding_time = OpTimeOf({.elementwise_bytes = 4 * h * t + 2 * v * h + 12 * h * t +
                                                    tied_accumulate + scaled * 8 * h * t,
                               .kernels = 8.0 + (m.tied_embeddings ? 1 : 0) + 2 * scaled},
                              hw);
  c.embedding_seconds = c.embedding_time.total();
}

}  // namespace stowage::planner
