// The hf recipe's linear attention: gated DeltaNet and KDA token mixers as transformers' torch
// fallbacks run them (Note [hf linear attention]), their op-by-op work
// (Note [hf linear attention work]: LinearAttentionWorkOf) and the plan summary's line that says
// which path.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "planner/frameworks/hf.h"
#include "planner/frameworks/hf_layer.h"

namespace stowage::planner {
namespace {

// Note [hf linear attention]
// Gated DeltaNet (Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet) and Kimi Delta Attention
// (KimiLinearDeltaAttention) as transformers runs them without flash-linear-attention and
// causal-conv1d installed (use_kernel_func_from_hub_with_fallback falls back to the torch
// functions, warning so): causal_conv1d_fn, then torch_chunk_gated_delta_rule /
// chunk_kimi_delta_attention, pure PyTorch in fp32 over chunks of C = 64 tokens (the sequence
// padded to T, a multiple of C, in n = T / C chunks). Sizes per token unless stated; hk/hv key
// and value heads, dk/dv their dims (KDA: H heads of d for both), conv = 2 hk dk + hv dv (KDA:
// 3 H d), K the conv kernel. Checked against autograd's saved tensors by
// tests/python/measure/test_hf_layer_kinds.py (two sequence lengths, exact).
//  Both: the conv's input, the cat of q, k, v (qwen3_next, KDA) or in_proj_qkv's output
//    (Qwen3.5), is kept by conv1d (2 conv); its output, padded by K - 1 positions, by silu
//    (2 conv per token + 2 conv (K - 1) per sequence).
//  GDN gates: sigmoid(b) keeps its bf16 output (2 hv); softplus(a.float() + dt_bias) keeps its
//    input and the mul with -A_log.exp() its output (8 hv), A_log.exp() and its negation are
//    kept per layer (8 hv bytes).
//  GDN core (torch_chunk_gated_delta_rule), fp32: before the padding q and k (repeated to hv
//    heads) and their l2norm rsqrt (8 hv dk + 8 hv per token of the sequence); after it, per
//    padded token, beta, value and key (4 hv + 4 hv dv + 4 hv dk), k_beta (4 hv dk), the scaled
//    query (4 hv dk), the three exps of the cumulative decay (12 hv), the C x C pairwise decay,
//    the two products (k_beta kᵀ, q kᵀ) kept by the muls with it, ut_system kept by
//    solve_triangular and intra_chunk_attn kept by the scan (5 x 4 hv C), new_values and
//    k_cumdecay kept as solve_triangular's outputs (4 hv dv + 4 hv dk), the decayed query and
//    key (8 hv dk), each chunk's v_new (4 hv dv); per chunk the recurrent state it reads
//    (4 hv dk dv) and the chunk decay (4 hv); the bool C x C mask once. With one chunk the
//    decayed query and key and the key decay are kept by nothing (the zero initial state needs
//    no gradient, and the final state is dropped).
//  GDN gated norm (Qwen3NextRMSNormGated over dv): fp32 x, rsqrt per head, bf16 normalised x,
//    fp32 z, silu(z), the bf16 weighted x, and its output kept by out_proj: 18 hv dv + 4 hv.
//  KDA gates (KimiLinearForgetGate): f_a_proj's output (2d) kept by f_b_proj; exp(g), 1 +
//    exp(g) kept by log, the bool `g > 20` kept by where, and the softplus kept by the mul
//    (13 H d); exp(A_log) and its negation per layer (8 H bytes); sigmoid(b_proj) (2 H).
//  KDA core (chunk_kimi_delta_attention), fp32: as GDN's before the padding, then beta, value,
//    key (4 H + 8 H d); the per-channel decay mask [C, C, d] kept by exp and k_beta kᵀ's
//    [C, C, d] product kept by the mul with it (2 x 4 H C d), k_beta (4 H d); the forward
//    substitution `for i in range(1, chunk_size)` keeps each step's clone of row i (i values)
//    and of the i x i block above it: 4 (C² - 1) / 3 bytes per head and token; the matmuls'
//    attn and v_beta (4 H C + 4 H d), g.exp() and k_beta g.exp() (8 H d), the scaled query
//    (4 H d), k_cumdecay (4 H d, kept when there is a second chunk); per chunk the decay exp,
//    q kᵀ's [C, C, d] product and v_new (4 H C d + 4 H C² d + 4 H C d), the intra-chunk
//    attention (4 H C²) and the state (4 H d²); for every chunk but the last (whose state update
//    is dropped) the decayed query, the key-decay exp and the decayed key (3 x 4 H C d) and the
//    chunk's last decay (4 H d); the three bool masks (3 C²) once.
//  KDA gated norm (KimiLinearRMSNormGated, strict fp32 over d): fp32 x, rsqrt per head, the
//    normalised x, the fp32 weight (4d per layer), the weighted x, sigmoid(gate) and the bf16
//    output kept by o_proj: 18 H d + 4 H; g_a_proj's output (2d) kept by g_b_proj.
// Time: projections are dense GEMMs (the layer's parameters); everything else the mixer runs is
// counted op by op (Note [hf linear attention work]): the chunks' small fp32 matmuls as fp32
// GEMMs (bmm, as the measured profile counts them; fp32 without TF32 runs on the CUDA cores, at
// dense_fp32_flops * fp32_gemm_efficiency: Note [Step time]), and every element-wise op's bytes
// and kernels, among them
// each chunk's backward `x[:, :, i]` of six whole-sequence tensors (KDA: seven), where
// SelectBackward0 writes a zero tensor of the whole base and copies the chunk's gradient into
// it, which the base's gradient then accumulates (add): traffic that grows with chunks x length,
// quadratic in the length, as the fallback really runs.
// The path: transformers 5.x resolves each of these functions once, at import
// (integrations/hub_kernels.py use_kernel_func_from_hub_with_fallback: a kernel from the Hub
// only when the `kernels` package is installed and enabled, else `import fla` /
// `import causal_conv1d`, else the torch function). The H200 machines' image (torch 2.11,
// transformers, Triton) has neither package and reaches no Hub, so the torch path is what a
// user there runs, and what the public measured steps (tests/planner/data/measured/hf-h200.jsonl)
// ran.
// With flash-linear-attention installed the chunk kernels keep other tensors (bf16 chunk
// matrices, states recomputed in backward: Note [megatron linear attention] in
// planner/frameworks/megatron.cc), which this recipe does not model; the plan summary says so.
constexpr double kDeltaChunk = 64;  // chunk_size of both torch chunk functions

}  // namespace

std::string HfLinearAttentionPath(const StepCost& step) {
  if (step.run.framework != Framework::kHf || step.profile.has_value()) return "";
  for (const LayerCost& l : step.layers) {
    if (absl::StrContains(l.type, "gdn") || absl::StrContains(l.type, "kda")) {
      return "linear attention       transformers' torch fallbacks (torch_chunk_gated_delta_rule "
             "/ chunk_kimi_delta_attention over 64-token chunks, causal_conv1d_fn): the path "
             "without flash-linear-attention and causal-conv1d installed, as on the H200 image; "
             "with fla installed its chunk kernels hold other bytes, not modelled here\n";
    }
  }
  return "";
}

// Note [hf linear attention work]
// What a gated DeltaNet or KDA token mixer runs in transformers' torch fallbacks
// (Note [hf linear attention]), op by op, as stowage.measure.op_work's op work counts each aten op
// (every input read once and every output written once, Note [Kernel bytes] for the fills and slice
// gradients; each bmm / mm at its FLOPs). Per sequence of s tokens padded to T = nC (C = 64,
// n chunks), hk / hv key and value heads (KDA: H of both), dk / dv their dims (KDA: d), h hidden,
// K the conv kernel, rep = 1 when hk < hv (repeat_interleave runs), pad = 1 when T > s. The
// coefficients are the captured ops' bytes grouped by how they scale; every group is listed
// with the ops that make it.
//  torch_chunk_gated_delta_rule (modeling_qwen3_next.py, the same in modeling_qwen3_5.py):
//   forward, before the loop (once): repeat_interleave of q and k (rep: r 2 hk dk w 2 hv dk
//    each), the five `.transpose(1, 2).to(float32)` copies, l2norm's mul, sum, add, rsqrt and
//    mul on q and k, the scaling mul, F.pad of q, k, v, beta and decay (constant_pad_nd, a copy
//    even when pad = 0), v_beta and k_beta, decay.cumsum, the C x C pairwise decay (sub,
//    masked_fill with the bool triu mask, exp), the two C x C products (bmm) and their muls with
//    it, cum_decay.exp() and decayed_k_beta, the two solve_triangular (r the C x C system and
//    the right side, w the solution: bytes only, not a GEMM in the op work), zeros state,
//    zeros_like output, the decayed query and key (sub, exp, mul), the chunk decay exp: 46
//    kernels (+2 with rep); then per chunk (the scan): k_cumdecay[i] @ state, sub, q[i] @ state,
//    intra[i] @ v_new, add, the copy_ into core_attn_out[:, :, i], state * chunk_decay[i], key[i]ᵀ
//    @ v_new, add: 9 kernels, 4 of them bmm. Bytes 76 s hv dk + 16 s hv dv + 62 s hv
//    + rep (4 s hv dk + 8 s hk dk) + 48 T hv dk + 68 T hv dv + 3404.25 T hv (the C x C tensors:
//    53.2 C bytes per token and head) + 20 n hv dk dv (each chunk's state read, its decayed
//    copy, the update's add) + 4 hv dk dv + 16384 (the C x C mask and eye). GEMMs: 4 C² dk + 2 C²
//    dv + 6 C dk dv per chunk and head (the two C x C products; the three state matmuls and the
//    intra-chunk one).
//   backward: 76 kernels once (+2 for the output slice's zeros and copy when pad) and 31 per
//    chunk: the four bmm's eight gradients, six SelectBackward0 (each `x[:, :, i]` of new_values,
//    k_cumdecay, query, intra_chunk_attn, key and chunk_decay: a zero tensor of the whole base
//    with the chunk's gradient copied in, and the add that accumulates it into the base's
//    gradient), CopySlices' clone and zeroing of the output's gradient, the state's mul and
//    add. Bytes 184 s hv dk + 30 s hv dv + 104 s hv - rep (3 s hv dk + 6 s hk dk) + 140 T hv dk
//    + 72 T hv dv + 9180.19 T hv + 12 pad T hv dv + 48 n hv dk dv - 68 hv dk dv - 256 hv dk
//    - 1792 hv dv - 16 hv + 4096, and what the selects make quadratic in the length: per chunk,
//    the whole bases again, 48 T hv dk + 28 T hv dv + 512.125 T hv + 32776 n hv (chunk_decay's
//    base). GEMMs: 10 C² dk + 6 C² dv + 12 C dk dv per chunk and head, less 8 C dk dv (the
//    first chunk's state, zeros, needs no gradient).
//  chunk_kimi_delta_attention (modeling_kimi_linear.py):
//   forward, 430 kernels once: the casts, l2norm (sqrt and div), pads, k_beta / v_beta, g's
//    cumsum, the [C, C, d] decay mask (sub, masked_fill, exp) and k_beta kᵀ's [C, C, d] product
//    (two muls, the sum over d, masked_fill), the forward substitution `for i in range(1, C)`
//    (each of the 63 steps: the row's and the block's clones, mul, sum, add, the copy_ into
//    attn: 6 kernels), eye, the two matmuls, g.exp() and k_beta's mul, the state zeros; per
//    chunk 19 kernels: q_i * g_i.exp() @ state, the [C, C, d] intra-chunk product (two muls, the
//    sum, masked_fill), k_cumdecay[i] @ state, the sub, intra @ v_new, add, the copy_ into the
//    output, the state's decay (exp, mul) and update (sub, exp, mul, transpose @ v_new, add).
//    Bytes 116 s H d + 62 s H + 4020.25 T H d (the [C, C, d] tensors: 62.8 C bytes per token and
//    channel) + 30502 T H (the substitution's clones) + 20 n H d² + 4 H d² + 4096 n + 77824.
//    GEMMs: 6 C² d + 6 C d² per chunk and head.
//   backward: 1115 kernels once (+2 with pad; the substitution's 63 steps: clones' and
//    CopySlices' gradients, 380 slice_backward zeros-and-copies) and 55 per chunk (seven
//    SelectBackward0 of whole bases: q, k, v, g, decay_mask, k_cumdecay and g's last column).
//    Bytes 270 s H d + 88 s H + 9096.56 T H d + 248749.9 T H + 12 pad T H d + 48 n H d²
//    - 68 H d² - 8488 H d + 4096 n + 8192, and per chunk the bases again: 558 T H d + 35712 n H d
//    (decay_mask's [C, C, d] base: 4 C² d bytes a chunk, zeroed, copied and accumulated).
//    GEMMs: 12 C² d + 12 C d² per chunk and head, less 8 C d² (the first chunk's state).
//  Outside the cores (the mixer's own forward, modeling_qwen3_next.py Qwen3NextGatedDeltaNet /
//   modeling_qwen3_5.py Qwen3_5GatedDeltaNet / modeling_kimi_linear.py KimiLinearDeltaAttention;
//   conv = 2 hk dk + hv dv, KDA 3 H d): causal_conv1d_fn (conv1d over s + K - 1 positions, the
//   weight read, the slice's silu, the cast), the gates (GDN: sigmoid(b), A_log.exp(), softplus,
//   the mul; KDA KimiLinearForgetGate's fp32 add, exp, log, where and mul), the gated RMSNorm
//   (Qwen3NextRMSNormGated / KimiLinearRMSNormGated), the cat / split / reshape copies, and
//   backward the same ops' gradients and the sums of the mixer input's gradients (one add per
//   further projection reading it: 6 s h for Qwen3-Next's two, 18 s h for Qwen3.5's four, 30
//   s h for KDA's six). Qwen3-Next (cat of q, k, v; fix_query_key_value_ordering's copies):
//   29 + 3 rep kernels forward, 45 backward; Qwen3.5 (in_proj_qkv already one tensor): 27 and
//   49; KDA: 37 and 66.
// One chunk (s <= 64) runs a few ops fewer or more (LinearAttentionWorkOf's n == 1 terms: the
// cores' exactly; GDN's mixer around it then runs one or two backward kernels and under 0.5%
// of its backward bytes fewer, which is not counted). Checked, every group, against the real
// fallbacks' ops at small widths, two to four chunks (KDA: one too)
// (tests/python/measure/test_hf_linear_attention_work.py;
// tests/planner/data/hf_linear_attention_work.json pins both sides), and at the AgreementTest
// widths (tests/python/measure/test_hf_measured_agreement.py) from 2 to 16 chunks.
HfLinearAttentionWork LinearAttentionWorkOf(const ModelConfig& m, AttentionKind kind,
                                            double seq_len) {
  const double s = seq_len, c = kDeltaChunk, k = m.short_conv_kernel;
  const double padded = std::ceil(s / c) * c, n = padded / c, t = padded;
  const double pad = padded > s ? 1 : 0;
  HfLinearAttentionWork w;
  if (kind == AttentionKind::kGdn) {
    const double hk = m.gdn_key_heads, hv = m.gdn_value_heads;
    const double dk = m.gdn_key_head_dim, dv = m.gdn_value_head_dim;
    const double rep = hk < hv ? 1 : 0;
    // torch_chunk_gated_delta_rule.
    w.fwd_kernels = 46 + 2 * rep + 9 * n;
    w.bwd_kernels = 76 + 2 * pad + 31 * n;
    w.fwd_bytes = 76 * s * hv * dk + 16 * s * hv * dv + 62 * s * hv +
                  rep * (4 * s * hv * dk + 8 * s * hk * dk) + 48 * t * hv * dk + 68 * t * hv * dv +
                  3404.25 * t * hv + 20 * n * hv * dk * dv + 4 * hv * dk * dv + 16384;
    w.bwd_bytes = 184 * s * hv * dk + 30 * s * hv * dv + 104 * s * hv -
                  rep * (3 * s * hv * dk + 6 * s * hk * dk) + 140 * t * hv * dk + 72 * t * hv * dv +
                  9180.1875 * t * hv + 12 * pad * t * hv * dv + 48 * n * hv * dk * dv -
                  68 * hv * dk * dv - 256 * hv * dk - 1792 * hv * dv - 16 * hv + 4096 +
                  n * (48 * t * hv * dk + 28 * t * hv * dv + 512.125 * t * hv + 32776 * n * hv);
    w.fwd_fp32_gemm_flops = n * hv * (4 * c * c * dk + 2 * c * c * dv + 6 * c * dk * dv);
    w.bwd_fp32_gemm_flops =
        n * hv * (10 * c * c * dk + 6 * c * c * dv + 12 * c * dk * dv) - 8 * c * hv * dk * dv;
    if (n == 1) {
      // One chunk: the scan's state update feeds nothing, so neither it nor the zero state's
      // decay runs backward, and the output is written whole.
      w.fwd_kernels -= 1;
      w.bwd_kernels -= 12;
      w.fwd_bytes -= 512 * hv * dv;
      w.bwd_bytes += 20 * hv * dk * dv - 2048 * hv * dk - 512 * hv * dv - 4876 * hv;
    }
    // The mixer around it: causal_conv1d_fn, the gates, the gated norm, the copies.
    const double both = 8 * k * hk * dk + 4 * k * hv * dv - 4 * hk * dk - 2 * hv * dv + 28 * hv +
                        2 * dv;  // the conv's weight and padding, the per-head gate parameters
    if (m.family == "qwen3_next") {
      w.fwd_kernels += 29 + 3 * rep;
      w.bwd_kernels += 45;
      w.fwd_bytes += 32 * s * hk * dk + 82 * s * hv * dv + 58 * s * hv +
                     rep * (4 * s * hv * dv + 8 * s * hv) + both;
      w.bwd_bytes += 6 * s * m.hidden + 48 * s * hk * dk + 176 * s * hv * dv + 78 * s * hv +
                     rep * 4 * s * hk * dk + 2 * both - 12 * hv;
    } else {
      w.fwd_kernels += 27;
      w.bwd_kernels += 49;
      w.fwd_bytes += 16 * s * hk * dk + 74 * s * hv * dv + 58 * s * hv + both;
      w.bwd_bytes += 18 * s * m.hidden + 40 * s * hk * dk + 168 * s * hv * dv + 70 * s * hv +
                     rep * 4 * s * hk * dk + 2 * both - 12 * hv;
    }
  } else {
    const double heads = m.linear_heads, d = m.linear_head_dim;
    // chunk_kimi_delta_attention.
    w.fwd_kernels = 430 + 19 * n;
    w.bwd_kernels = 1115 + 2 * pad + 55 * n;
    w.fwd_bytes = 116 * s * heads * d + 62 * s * heads + 4020.25 * t * heads * d +
                  30502 * t * heads + 20 * n * heads * d * d + 4 * heads * d * d + 4096 * n + 77824;
    w.bwd_bytes = 270 * s * heads * d + 88 * s * heads + 9096.5625 * t * heads * d +
                  248749.875 * t * heads + 12 * pad * t * heads * d + 48 * n * heads * d * d -
                  68 * heads * d * d - 8488 * heads * d + 4096 * n + 8192 +
                  n * (558 * t * heads * d + 35712 * n * heads * d);
    w.fwd_fp32_gemm_flops = n * heads * (6 * c * c * d + 6 * c * d * d);
    w.bwd_fp32_gemm_flops = n * heads * (12 * c * c * d + 12 * c * d * d) - 8 * c * heads * d * d;
    if (n == 1) {  // one chunk: its state's gradient is not accumulated from a later chunk
      w.bwd_kernels += 2;
      w.bwd_bytes += 20 * heads * d * d + 4 * heads * d;
    }
    // KimiLinearDeltaAttention around it.
    w.fwd_kernels += 37;
    w.bwd_kernels += 66;
    w.fwd_bytes += 166 * s * heads * d + 28 * s * heads + 12 * k * heads * d + 4 * heads * d +
                   26 * heads + 10 * d;
    w.bwd_bytes += 30 * s * m.hidden + 304 * s * heads * d + 36 * s * heads + 24 * k * heads * d -
                   2 * heads * d + 34 * heads + 14 * d + 16;
  }
  return w;
}

namespace hf_internal {
namespace {

// A saved tensor given as its bytes for the whole micro-batch (per-sequence and per-layer terms).
void SaveTotal(HfLayer& b, const std::string& name, double bytes) {
  b.cost.saved.push_back({name, "", static_cast<uint64_t>(std::llround(bytes))});
}

// The short conv of both (causal_conv1d_fn): its input and padded output.
void ShortConv(HfLayer& b, double conv) {
  const double k = b.m.short_conv_kernel;
  b.Save("attn.conv_in", "", 2 * conv);
  b.Save("attn.conv_out", "", 2 * conv, 2 * conv * (k - 1) * b.sequences);
}

}  // namespace

void LinearAttention(HfLayer& b, const LayerSpec& spec) {
  const ModelConfig& m = b.m;
  const double h = m.hidden, c = kDeltaChunk, seq = b.s, mb = b.sequences;
  const double padded = std::ceil(seq / c) * c, chunks = padded / c;
  b.Norm("attn.norm", h, 1, true);
  double core = 0, conv = 0;
  if (spec.attention == AttentionKind::kGdn) {
    const double hv = m.gdn_value_heads, dk = m.gdn_key_head_dim, dv = m.gdn_value_head_dim;
    conv = 2 * m.gdn_key_heads * dk + hv * dv;
    ShortConv(b, conv);
    b.Save("attn.gates", "", 2 * hv + 8 * hv, 8 * hv);
    core = seq * (8 * hv * dk + 8 * hv) +
           padded * (24 * hv * dk + 12 * hv * dv + 20 * hv * c + 16 * hv) +
           chunks * (4 * hv + 4 * hv * dk * dv);
    if (chunks == 1) core -= padded * (8 * hv * dk + 4 * hv) + 4 * hv;
    SaveTotal(b, "attn.core", core * mb + c * c);
    b.Save("attn.out_norm", "", 18 * hv * dv + 4 * hv);
  } else {
    const double heads = m.linear_heads, d = m.linear_head_dim, inner = heads * d;
    conv = 3 * inner;
    ShortConv(b, conv);
    b.Save("attn.gates", "", 2 * d + 13 * inner + 2 * heads, 8 * heads);
    core = seq * (8 * inner + 8 * heads) + padded * (4 * heads + 8 * inner) +
           padded * (8 * inner * c + 4 * inner) + padded * heads * 4 * (c * c - 1) / 3 +
           padded * (4 * inner + 4 * heads * c) + padded * 8 * inner + padded * 4 * inner +
           chunks * (4 * inner * c + 4 * inner * d + 4 * inner * c * c + 4 * inner * c +
                     4 * heads * c * c) +
           (chunks - 1) * (12 * inner * c + 4 * inner);
    if (chunks >= 2) core += padded * 4 * inner;
    SaveTotal(b, "attn.core", core * mb + 3 * c * c);
    b.Save("attn.out_norm", "", 2 * d + 18 * inner + 4 * heads, 4 * d);
  }
  // The mixer's ops, op by op (Note [hf linear attention work]), per sequence; its kernels run
  // once per layer whatever the micro-batch.
  const HfLinearAttentionWork w = LinearAttentionWorkOf(m, spec.attention, seq);
  b.Traffic(w.fwd_bytes * mb / b.t, w.bwd_bytes * mb / b.t, w.fwd_kernels, w.bwd_kernels);
  b.fp32_gemm_flops += w.fwd_fp32_gemm_flops * mb;  // fp32 bmm / mm (Note [Step time])
  b.fp32_gemm_backward_flops += w.bwd_fp32_gemm_flops * mb;
  // BuildHfLayer times every dense parameter as a GEMM over the tokens; the conv weight, the
  // gates' dt_bias and A_log and the gated norm's weight are element-wise operands, counted
  // above.
  const double not_gemm =
      spec.attention == AttentionKind::kGdn
          ? conv * m.short_conv_kernel + 2.0 * m.gdn_value_heads + m.gdn_value_head_dim
          : conv * m.short_conv_kernel + 1.0 * m.linear_heads * m.linear_head_dim + m.linear_heads +
                m.linear_head_dim;
  b.gemm_flops -= 2 * not_gemm * b.t;
  // Residual add (r 4h w 2h); backward sums the gradients of the layer input's two uses (the
  // norm and the add: r 4h w 2h); the mixer's input gradients are summed inside it.
  b.Traffic(6 * h, 6 * h, 1, 1);
  // Forward: the fp32 copies of q, k, v and the gates before the core keeps them (about the
  // bytes one chunk-length of the core holds per token).
  b.cost.attn_forward_transient = static_cast<uint64_t>(4 * conv * b.t);
  b.cost.attn_backward_transient = static_cast<uint64_t>(core * mb);
  if (spec.attention == AttentionKind::kGdn && chunks >= 2) {
    // GDN's backward peaks in the scan's second chunk to run backward (i = n - 2), at the first
    // SelectBackward0 after intra_chunk_attn's, query's (torch_chunk_gated_delta_rule: `out[i] =
    // query[i] @ state + intra[i] @ v_new` backward; the accumulated gradient, the zero base the
    // select writes the chunk's gradient into, and their sum). Alive then, per padded token and
    // value head: the gradients of the whole bases accumulated since the last chunk — new_values
    // (4 dv), k_cumdecay, query and key (3 x 4 dk; key's from chunk n - 2's state update, whose
    // gradient the last chunk's reads of the state give), intra_chunk_attn (4 C) — query's zero
    // base and the sum (2 x 4 dk), and CopySlices' clone
    // of core_attn_out's gradient (4 dv); per token of the sequence the core output's bf16
    // gradient (2 hv dv); per sequence the state's gradient (4 hv dk dv), one chunk's v_new
    // gradient (4 hv C dv) and chunk_decay's base (4 hv n). Freed by then: the gated norm's
    // tensors (18 dv + 4 per value head and token, attn.out_norm), the last two chunks' v_new and
    // the state the last chunk read (2 x 4 hv C dv + 4 hv dk dv per sequence; the three cancel
    // the state's and the chunk's gradients above), and the FFN's input norm (BuildHfLayer
    // takes it off). The live bytes of the real Qwen3-Next / Qwen3.5 layers at 512 to 1024
    // tokens (tests/python/measure/test_hf_measured_peaks.py LinearAttentionBackwardTest) hold
    // these and the gradients the layer's counts make by then (attn_peak_grad_bytes: out_proj's,
    // the norm's weight, the FFN's). With one chunk there is no earlier chunk to accumulate into:
    // everything the core keeps stays the bound.
    // The moment before it, the gated norm's backward (Qwen3NextRMSNormGated over dv), binds
    // instead where the keys are narrower than the values (dk 64, dv 128 at 768 tokens: 5.7% of
    // the layer's level): every saved tensor alive but the norm's output (2 hv dv, out_proj's
    // input, released), with its fp32 temporaries — the input's gradient through the cast, the
    // gradients of the normalised x and of the gate (3 x 4 hv dv) — and the core output's bf16
    // gradient (2 hv dv), per token of the sequence.
    const double hv = m.gdn_value_heads, dk = m.gdn_key_head_dim, dv = m.gdn_value_head_dim;
    const double bases = 4 * hv * (dv + 3 * dk + c) + 2 * 4 * hv * dk + 4 * hv * dv;
    const double loop = padded * bases + seq * (2 * hv * dv - 18 * hv * dv - 4 * hv) +
                        4 * hv * chunks - 4 * hv * c * dv;
    const double gated_norm = seq * 12 * hv * dv;
    b.cost.attn_backward_transient = static_cast<uint64_t>(std::max({0.0, loop, gated_norm}) * mb);
  }
  if (spec.attention == AttentionKind::kKda) {
    // KDA's backward peaks in the scan's last chunk's backward (the first it runs), at
    // `decay_mask[:, :, i]`'s SelectBackward0 (chunk_kimi_delta_attention): the gradient of the
    // whole [C, C, d] decay mask accumulated so far, the zero base the select writes the chunk's
    // gradient into, and their sum (3 x 4 C d per padded token and head); the intra-chunk
    // product's gradient for that chunk (4 C^2 d per head), while the chunk has released the two
    // products it saved (2 x 4 C^2 d); SelectBackward0's whole-sequence bases of q, k, v and g,
    // their accumulated sum and the next select's empty base (6 x 4 d); the mixer input's
    // partial gradient (2h, from the gates' projections). Freed by then: the gated norm's
    // tensors (18 d + 4 per head and token, attn.out_norm) and g_a_proj's output (2d); the last
    // chunk's own small tensors (its two decayed [C, d] pairs, q_i and k_i's decayed copies, two
    // C x C intra-chunk matrices, the decay's last column: 6 x 4 C d + 2 x 4 C^2 + 4 d per head,
    // of which the gradients made by then give back 4 x 4 C d); and the FFN's input norm
    // (BuildHfLayer takes it off). The live bytes of the real layer at 512 and 768 tokens
    // (tests/python/measure/test_hf_measured_agreement.py AgreementTest) hold these, and o_proj's
    // and the output gate's weight gradients, which the layer's gradients count
    // (attn_peak_grad_bytes).
    const double heads = m.linear_heads, d = m.linear_head_dim;
    b.cost.attn_backward_transient = static_cast<uint64_t>(
        std::max(0.0, (padded * heads * (12 * c * d + 24 * d) - 4 * heads * c * c * d -
                       seq * (18 * heads * d + 4 * heads + 2 * d) + 2 * h * seq -
                       heads * (8 * c * d + 8 * c * c + 4 * d)) *
                          mb));
  }
}

}  // namespace hf_internal
}  // namespace stowage::planner
