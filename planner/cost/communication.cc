#include "planner/cost/communication.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/bytes.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/run_settings.h"
#include "planner/model/model.h"

namespace stowage::planner {

// Note [Communication]
// Per rank and per step, for the run's TP (with or without sequence parallelism), CP, EP,
// data-parallel sharding and world size. Groups follow Megatron-Core's rank order (GroupsOf;
// parallel_state.py RankGenerator numbers the grid innermost first, a dense grid tp-cp-dp-pp and
// an expert grid tp-ep-dp-pp with expert tensor parallelism 1, as the cost model assumes). Under
// the default order "tp-cp-ep-dp-pp" (megatron/training/initialize.py): TP members are adjacent
// ranks, CP members tp apart, the EP group is ep adjacent ranks, the dense data-parallel group
// (with CP, Megatron's dp-cp group) dp x cp = gpus/(tp x pp) members tp apart, the expert
// data-parallel group gpus/(ep x pp) members ep apart, and pipeline stage s the s-th block of
// gpus/pp ranks (PP outermost: a stage's data-parallel groups are its own; the word-embedding
// pair of first and last stage (pp-1) x gpus/pp apart). Under "tp-cp-ep-pp-dp"
// (--use-tp-pp-dp-mapping; dense grid tp-cp-pp-dp, expert grid tp-ep-pp-dp) PP sits inside DP:
// pipeline neighbours are tp x cp ranks apart (a stage is the blocks of tp x cp adjacent ranks
// every tp x cp x pp), the dense data-parallel group is cp members tp apart times dp members
// tp x cp x pp apart (two levels, GroupPlacement::block), the expert data-parallel group
// gpus/(ep x pp) members ep x pp apart, the embedding pair (pp-1) x tp x cp apart; TP, CP and EP
// do not move. With pp 1 the two orders are the same. A group stays on NVLink when its span
// (size x stride, or blocks x block_stride) fits one NVLink domain (groups are aligned to it:
// sizes and domains are powers of two in practice); otherwise the network limits it, with
// `members_per_domain` of it on each domain.
//
// Time of one collective (CollectiveSeconds), alpha-beta with NCCL's bus-bandwidth factors
// (nccl-tests doc/PERFORMANCE.md: busBw = algBw x (n-1)/n for all-gather, reduce-scatter and
// all-to-all, 2(n-1)/n for all-reduce): bytes x factor / bus rate + hops x latency, with n-1
// ring hops (all-reduce 2(n-1)) and one for an all-to-all or send/recv (every peer's message is
// posted at once). The bus rate is the NVLink rate inside a domain (the measured
// all_to_all/all_gather/reduce_scatter busBw when the group is inside one node and `stowage
// calibrate` wrote them), the per-GPU network rate outside it (each GPU's ring channel leaves
// through its own NIC). An all-to-all that leaves the domain sends (n - g)/n of its bytes over
// the network and (g - 1)/n over NVLink at once (g members per domain); the slower part binds.
//
// What each collective moves, t = tokens per rank (seq_len x micro_batch / cp), h = hidden:
//  - TP with sequence parallelism (Megatron-Core ColumnParallelLinear / RowParallelLinear with
//    sequence_parallel): before attention and before the FFN (a MoE layer's shared experts;
//    routed experts have no TP) an all-gather of t x h x dtype, after each a reduce-scatter of
//    the same; backward the reverse pair plus the input all-gathered again for the weight
//    gradient (SP keeps only its shard), which Megatron issues before the data-gradient GEMM and
//    so hides. Forward and backward pairs are on the critical path (no --tp-comm-overlap
//    modelled).
//  - TP without sequence parallelism (RunSettings::sequence_parallel false; Megatron-Core 0.16.1
//    tensor_parallel/layers.py): each row-parallel linear's output is all-reduced whole, t x h
//    x dtype (reduce_from_tensor_model_parallel_region), and in backward each column-parallel
//    linear's input gradient is (LinearWithGradAccumulationAndAsyncCommunication.backward,
//    allreduce_dgrad); the column input needs no gather and the row output's gradient no
//    collective. One all-reduce per sublayer each way, on the critical path like the pairs
//    above (an all-reduce is a reduce-scatter then an all-gather: the same exposed time, less
//    the hidden weight-gradient gather).
//  - CP, softmax attention and MLA (TransformerEngine's ring attention, P2P): the local K/V
//    block (t x K/V width) goes round the ring, cp-1 steps (fewer when a sliding window or
//    attention chunk reaches fewer blocks); backward sends K/V and dK/dV, twice the bytes.
//    Each step overlaps the attention of the block in hand (1/cp of the core): only the excess
//    is exposed.
//  - CP, DSA: every query may pick any key, so the latent KV (kv_lora_rank + qk_rope_head_dim)
//    and the indexer keys are all-gathered over CP (t x cp gathered) and their gradients
//    reduce-scattered in backward; exposed.
//  - CP, linear attention (KDA, gated DeltaNet): each rank's final recurrent state (heads x
//    dk x dv, fp32, per sequence) is passed to the next rank, cp-1 hops one after another,
//    forward and (its gradient) backward; a chain, so exposed.
//  - EP (Megatron-Core MoEAlltoAllTokenDispatcher): dispatch and combine, each t/tp x top_k
//    x h x dtype per rank, forward and backward (four per layer, two more under recompute).
//    The busiest rank receives moe_imbalance x the average, so its time scales by it. Exposed
//    (no shared-expert or DualPipe overlap modelled).
//  - FSDP (optim_grads_params): each layer's weights are all-gathered before its forward and
//    again before its backward (a recompute runs inside the layer's backward, on the weights
//    that gather brought: FSDP2's and Megatron-FSDP's unshard at the backward pre-hook; the
//    recompute repeats every other collective); its gradients reduce-scattered
//    after its backward (dense parts over the dense DP group, experts over the expert DP
//    group). Prefetch overlaps them with a layer's compute: exposed is what exceeds the
//    layer's own pass time.
//  - DP gradient reduction, once per step (after the last microbatch: Megatron turns gradient
//    sync off for the others, schedules.py no_sync_func): all-reduce (no_shard) or
//    reduce-scatter then an all-gather of the updated weights (optim, optim_grads: Megatron's
//    distributed optimizer) of every parameter this rank holds: its stage's layers, the
//    embedding on the first stage, the head (and MTP) on the last. Overlapped with backward (and
//    the weight gather with the next forward) bucket by bucket except the last (first) bucket:
//    exposed = max(one bucket, total - the pass's compute). Megatron's bucket is max(4e7, 1e6 x dp)
//    parameters (core/distributed/distributed_data_parallel.py); PyTorch DDP's (hf) 25 MiB.
//  - Word embeddings on the first and the last stage (tied to the head, or the MTP modules'
//    input): their gradients all-reduced between the two stages once per step; exposed.
//  - Embedding and LM head under TP/SP: a reduce-scatter after the embedding and an
//    all-gather before the head, forward, and the reverse in backward; exposed. Without SP the
//    embedding's partial lookups are all-reduced in forward (VocabParallelEmbedding.forward,
//    reduce_scatter_embeddings off) and the head's input gradient in backward; exposed. With
//    pipeline parallelism the first stage makes the embedding's, the last the head's.
//  - PP point-to-point (StageLink, PointToPointSeconds, PipelineMessageBytes): charged by the
//    pipeline, per microbatch, with the overlap rule of Note [Pipeline] (pipeline.cc).
// The exposed parts of a layer's collectives add to that layer's forward (and recompute) and
// backward times; the once-per-step ones to the step (StepComm::step_exposed_seconds).

namespace {

struct Cost {
  double latency = 0;
  double transfer = 0;
};

bool TwoLevel(GroupPlacement g) { return g.block > 0 && g.block < g.size && g.block_stride > 0; }

int64_t Blocks(GroupPlacement g) { return (int64_t{g.size} + g.block - 1) / g.block; }

// The ranks from the group's first to one past its last block (its extent when aligned).
int64_t Span(GroupPlacement g) {
  return TwoLevel(g) ? Blocks(g) * g.block_stride : int64_t{g.size} * std::max(1, g.stride);
}

double Factor(Collective c, int n) {
  const double f = static_cast<double>(n - 1) / n;
  switch (c) {
    case Collective::kAllReduce:
      return 2 * f;
    case Collective::kSendRecv:
      return 1;
    default:
      return f;
  }
}

double MeasuredBusRate(const HardwareProfile& hw, Collective c) {
  switch (c) {
    case Collective::kAllToAll:
      return hw.all_to_all_bytes_per_second;
    case Collective::kAllGather:
      return hw.all_gather_bytes_per_second;
    case Collective::kReduceScatter:
      return hw.reduce_scatter_bytes_per_second;
    default:
      return 0;
  }
}

// Seconds of moving `bytes` x `factor` at `rate`; 0 when the rate is absent.
double Transfer(double bytes, double rate) { return rate > 0 ? bytes / rate : 0; }

// One message between two ranks on `link`: one hop, the bytes at the link's per-GPU rate.
Cost SendRecvCost(const HardwareProfile& hw, CommLink link, double bytes) {
  Cost cost;
  if (link == CommLink::kNone || !(bytes > 0)) return cost;
  const bool network = link == CommLink::kNetwork;
  cost.latency = network ? hw.network_latency_seconds : hw.nvlink_latency_seconds;
  cost.transfer =
      Transfer(bytes, network ? hw.NetworkBytesPerSecond() : hw.nvlink_bytes_per_second);
  return cost;
}

Cost CostOf(const HardwareProfile& hw, Collective c, GroupPlacement g, double bytes) {
  Cost cost;
  if (g.size <= 1 || !(bytes > 0)) return cost;
  const int n = g.size;
  const GroupLinks links = LinksOf(hw, g);
  const bool network = links.link == CommLink::kNetwork;
  const bool in_node = Span(g) <= hw.gpus_per_node;
  auto nvlink_rate = [&](Collective kind) {
    const double measured = in_node ? MeasuredBusRate(hw, kind) : 0;
    return measured > 0 ? measured : hw.nvlink_bytes_per_second;
  };
  const double net = hw.NetworkBytesPerSecond();
  const double hop = network ? hw.network_latency_seconds : hw.nvlink_latency_seconds;
  switch (c) {
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      cost.latency = (n - 1) * hop;
      cost.transfer = Transfer(bytes * Factor(c, n), network ? net : nvlink_rate(c));
      break;
    case Collective::kAllReduce:
      // A reduce-scatter then an all-gather (NCCL's ring all-reduce).
      cost.latency = 2 * (n - 1) * hop;
      cost.transfer = network ? Transfer(bytes * Factor(c, n), net)
                              : Transfer(bytes * Factor(Collective::kReduceScatter, n),
                                         nvlink_rate(Collective::kReduceScatter)) +
                                    Transfer(bytes * Factor(Collective::kAllGather, n),
                                             nvlink_rate(Collective::kAllGather));
      break;
    case Collective::kAllToAll: {
      cost.latency = hop;
      if (!network) {
        cost.transfer = Transfer(bytes * Factor(c, n), nvlink_rate(c));
      } else {
        const int per = links.members_per_domain;
        const double off = bytes * (n - per) / n, on = bytes * (per - 1) / n;
        cost.transfer = std::max(Transfer(off, net), Transfer(on, hw.nvlink_bytes_per_second));
      }
      break;
    }
    case Collective::kSendRecv:
      cost = SendRecvCost(hw, links.link, bytes);
      break;
  }
  return cost;
}

// Whether the rate the group's link needs is in the profile.
bool Costed(const HardwareProfile& hw, CommLink link) {
  if (link == CommLink::kNetwork) return hw.NetworkBytesPerSecond() > 0;
  if (link == CommLink::kNvlink) return hw.nvlink_bytes_per_second > 0;
  return true;
}

struct Builder {
  const ModelConfig& m;
  const HardwareProfile& hw;
  const RunSettings& run;
  StepComm out;
  std::vector<std::string> latency_bound_seen;

  CommOp Op(std::string name, CommGroup group, Collective c, GroupPlacement g, double bytes,
            int forward_calls, int backward_calls, double imbalance = 1) {
    CommOp op;
    op.name = std::move(name);
    op.group = group;
    op.collective = c;
    op.placement = g;
    op.link = LinksOf(hw, g).link;
    op.bytes = bytes;
    const Cost cost = CostOf(hw, c, g, bytes * imbalance);
    op.seconds = cost.latency + cost.transfer;
    op.latency_bound = op.link != CommLink::kNone && cost.latency > cost.transfer;
    // Only collectives whose bytes grow with the tokens say "too few tokens".
    const bool per_token =
        group == CommGroup::kTp || group == CommGroup::kEp || op.name.rfind("CP ring", 0) == 0;
    op.forward_calls = forward_calls;
    op.backward_calls = backward_calls;
    if (op.latency_bound && per_token &&
        std::find(latency_bound_seen.begin(), latency_bound_seen.end(), op.name) ==
            latency_bound_seen.end()) {
      latency_bound_seen.push_back(op.name);
      out.warnings.push_back(absl::StrFormat(
          "WARNING: %s moves %s per call, too little to fill its link: its latency "
          "(%.1f us) exceeds its transfer time (%.1f us); too few tokens per rank (%d)",
          op.name, FormatBytes(static_cast<uint64_t>(std::min(bytes, 1.8e19))), cost.latency * 1e6,
          cost.transfer * 1e6, static_cast<uint64_t>(Tokens())));
    }
    return op;
  }

  double Tokens() const {
    return static_cast<double>(run.seq_len) * run.micro_batch / std::max(1, run.cp);
  }
};

}  // namespace

const char* CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllGather:
      return "all-gather";
    case Collective::kReduceScatter:
      return "reduce-scatter";
    case Collective::kAllReduce:
      return "all-reduce";
    case Collective::kAllToAll:
      return "all-to-all";
    case Collective::kSendRecv:
      return "send/recv";
  }
  return "unknown";
}

const char* CommLinkName(CommLink link) {
  switch (link) {
    case CommLink::kNone:
      return "none";
    case CommLink::kNvlink:
      return "NVLink";
    case CommLink::kNetwork:
      return "network";
  }
  return "unknown";
}

const char* CommGroupName(CommGroup group) {
  switch (group) {
    case CommGroup::kTp:
      return "TP";
    case CommGroup::kCp:
      return "CP";
    case CommGroup::kEp:
      return "EP";
    case CommGroup::kFsdp:
      return "FSDP";
    case CommGroup::kDp:
      return "DP";
  }
  return "unknown";
}

GroupLinks LinksOf(const HardwareProfile& hw, GroupPlacement g) {
  if (g.size <= 1) return {CommLink::kNone, 1};
  const int domain = std::max(1, hw.nvlink_domain_gpus);
  const bool nvlink = hw.nvlink_bytes_per_second > 0;
  if (nvlink && Span(g) <= domain) return {CommLink::kNvlink, g.size};
  if (!TwoLevel(g)) {
    const int per =
        nvlink && g.stride < domain ? std::min(g.size, domain / std::max(1, g.stride)) : 1;
    return {CommLink::kNetwork, per};
  }
  // Blocks closer than a domain share it whole (a block spans block x stride <= block_stride
  // ranks); blocks a domain or more apart leave each domain the part of one block it holds.
  int64_t per = 1;  // without NVLink every member is on its own
  if (nvlink && g.block_stride < domain) {
    per = std::min<int64_t>(Blocks(g), domain / g.block_stride) * g.block;
  } else if (nvlink && g.stride < domain) {
    per = std::min(g.block, domain / std::max(1, g.stride));
  }
  return {CommLink::kNetwork, static_cast<int>(std::min<int64_t>(per, g.size))};
}

ParallelGroups GroupsOf(const RunSettings& run) {
  const int tp = std::max(1, run.tp), cp = std::max(1, run.cp), ep = std::max(1, run.ep);
  const int gpus = run.gpus, pp = std::max(1, run.pp);
  ParallelGroups g;
  g.tp = {tp, 1};
  g.cp = {cp, tp};
  g.ep = {ep, 1};
  if (run.rank_order == RankOrder::kTpCpEpPpDp && pp > 1) {
    // Dense grid tp-cp-pp-dp: dp strides over tp x cp x pp; expert grid tp(1)-ep-pp-dp.
    const int dp = std::max(1, gpus / (tp * cp * pp));
    g.stage_stride = tp * cp;
    if (cp == 1 || dp == 1) {
      g.dense_dp = cp == 1 ? GroupPlacement{dp, tp * pp} : GroupPlacement{cp, tp};
    } else {
      g.dense_dp = {cp * dp, tp, cp, tp * cp * pp};
    }
    g.expert_dp = {std::max(1, gpus / (ep * pp)), ep * pp};
  } else {
    // tp-cp-dp-pp and tp-ep-dp-pp: a stage is gpus / pp adjacent ranks, its DP groups its own.
    g.stage_stride = std::max(1, gpus / pp);
    g.dense_dp = {std::max(1, gpus / (tp * pp)), tp};
    g.expert_dp = {std::max(1, gpus / (ep * pp)), ep};
  }
  // default_embedding_ranks (parallel_state.py): the first and the last rank of each PP group.
  g.embedding = {2, (pp - 1) * g.stage_stride};
  return g;
}

double CollectiveSeconds(const HardwareProfile& hw, Collective c, GroupPlacement g, double bytes) {
  const Cost cost = CostOf(hw, c, g, bytes);
  return cost.latency + cost.transfer;
}

CommLink StageLink(const HardwareProfile& hw, int gpus, int pp, int from, int to,
                   int stage_stride) {
  if (pp <= 1 || from == to) return CommLink::kNone;
  if (!(hw.nvlink_bytes_per_second > 0)) return CommLink::kNetwork;
  // A stage is `blocks` blocks of `block` adjacent ranks, `period` apart (one block of gpus / pp
  // under the default order).
  const int64_t block = stage_stride > 0 ? stage_stride : std::max<int64_t>(1, gpus / pp);
  const int64_t period = block * pp;
  const int64_t blocks = std::max<int64_t>(1, gpus / period);
  const int64_t lower = int64_t{std::min(from, to)} * block;  // the lower stage's first rank
  const int64_t distance = int64_t{std::abs(to - from)} * block;
  const int64_t domain = std::max(1, hw.nvlink_domain_gpus);
  // Pairs (a, a + distance) for a in a block starting at `first`: some pair leaves its domain
  // exactly when a domain boundary lies in (first, first + block - 1 + distance]. That depends
  // on first mod domain only, which repeats after domain / gcd(period, domain) blocks.
  const int64_t distinct = std::min(blocks, domain / std::gcd(period, domain));
  for (int64_t k = 0; k < distinct; ++k) {
    const int64_t first = lower + k * period;
    if (first / domain != (first + block - 1 + distance) / domain) return CommLink::kNetwork;
  }
  return CommLink::kNvlink;
}

double PointToPointSeconds(const HardwareProfile& hw, CommLink link, double bytes) {
  const Cost cost = SendRecvCost(hw, link, bytes);
  return cost.latency + cost.transfer;
}

double PipelineMessageBytes(const ModelConfig& m, const RunSettings& run) {
  // The sequence-parallel shard: the whole sequence without SP (Note [Sequence parallelism] in
  // planner/frameworks/megatron.cc).
  const double tokens = static_cast<double>(run.seq_len) * run.micro_batch / std::max(1, run.cp) /
                        SequenceShards(run);
  return tokens * static_cast<double>(m.hidden) * std::max(1, m.hc_mult) * run.activation_bytes;
}

StepComm BuildStepComm(const ModelConfig& m, const HardwareProfile& hw, const RunSettings& run,
                       const std::vector<LayerCost>& layers, int stage) {
  Builder b{m, hw, run, {}, {}};
  const int tp = run.tp, cp = run.cp, ep = run.ep, pp = std::max(1, run.pp);
  const bool first_stage = stage == 0, last_stage = stage == pp - 1;
  // Where each group's members sit for the run's rank order (Note [Communication]): the
  // data-parallel groups are a stage's gpus / pp ranks over tp (dense, CP included) or over ep
  // (routed experts).
  const ParallelGroups groups = GroupsOf(run);
  const GroupPlacement tp_g = groups.tp, cp_g = groups.cp, ep_g = groups.ep;
  const GroupPlacement dense_dp = groups.dense_dp, expert_dp = groups.expert_dp;
  const double dt = run.activation_bytes, h = m.hidden, t = b.Tokens();
  const double wb = run.weight_bytes, gb = run.grad_bytes;
  const double tp_bytes = t * h * dt;  // one sequence-parallel gather or all-reduce: t x h
  const bool sequence_parallel = SequenceShards(run) > 1;
  const bool fsdp = run.sharding == Sharding::kOptimGradsParams;

  double forward_compute = 0, backward_compute = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerCost& cost = layers[i];
    const size_t index = static_cast<size_t>(std::max(0, cost.index));
    if (m.layers.empty()) break;
    // An MTP depth (index past the decoder layers, Note [MTP layers] in
    // planner/frameworks/megatron.cc) runs a transformer layer of the last layer's kind: its
    // collectives are that layer's.
    const LayerSpec& spec = m.layers[std::min(index, m.layers.size() - 1)];
    forward_compute += cost.forward_seconds;
    backward_compute += cost.backward_seconds;
    LayerComm lc;
    double fwd_exposed = 0, bwd_exposed = 0;
    bool fsdp_in_forward = false;
    // Adds op's time to the layer's link totals; `*_exposed_calls` of its calls are on the
    // critical path (the rest are hidden, or their exposed part is added by the caller).
    auto add = [&](CommOp op, int fwd_exposed_calls, int bwd_exposed_calls) {
      lc.forward_seconds += op.forward_calls * op.seconds;
      lc.backward_seconds += op.backward_calls * op.seconds;
      fwd_exposed += fwd_exposed_calls * op.seconds;
      bwd_exposed += bwd_exposed_calls * op.seconds;
      lc.ops.push_back(std::move(op));
    };
    if (tp > 1) {
      // Attention, then the dense FFN or the MoE layer's shared experts.
      const int sublayers = spec.ffn == FfnKind::kDense || m.shared_intermediate > 0 ? 2 : 1;
      if (sequence_parallel) {
        add(b.Op("TP all-gather", CommGroup::kTp, Collective::kAllGather, tp_g, tp_bytes, sublayers,
                 2 * sublayers),
            sublayers, sublayers);
        add(b.Op("TP reduce-scatter", CommGroup::kTp, Collective::kReduceScatter, tp_g, tp_bytes,
                 sublayers, sublayers),
            sublayers, sublayers);
      } else {
        // Without SP: the row-parallel outputs forward, the column-parallel input gradients
        // backward (Note [Communication]).
        add(b.Op("TP all-reduce", CommGroup::kTp, Collective::kAllReduce, tp_g, tp_bytes, sublayers,
                 sublayers),
            sublayers, sublayers);
      }
    }
    if (cp > 1) {
      switch (spec.attention) {
        case AttentionKind::kAttention:
        case AttentionKind::kMla: {
          double kv_per_token = 0;
          if (spec.attention == AttentionKind::kAttention) {
            kv_per_token = 2.0 * std::max(1.0, static_cast<double>(m.kv_heads) / tp) * m.head_dim;
          } else {
            kv_per_token = static_cast<double>(m.heads) / tp *
                           (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim);
          }
          double reach = cp - 1;  // blocks of t tokens a query's keys reach back over
          if (spec.span == AttentionSpan::kSliding && m.sliding_window > 0) {
            reach = std::min(reach, std::ceil(m.sliding_window / t));
          } else if (spec.span == AttentionSpan::kChunked && m.attention_chunk > 0) {
            reach = std::min(reach, std::ceil(m.attention_chunk / t));
          }
          const int steps = static_cast<int>(reach);
          const double block = t * kv_per_token * dt;
          CommOp fwd = b.Op("CP ring K/V exchange", CommGroup::kCp, Collective::kSendRecv, cp_g,
                            block, steps, 0);
          CommOp bwd = b.Op("CP ring K/V + dK/dV exchange", CommGroup::kCp, Collective::kSendRecv,
                            cp_g, 2 * block, 0, steps);
          // Each step hides behind one block of the core (1/cp of it).
          const double fwd_step =
              std::max(0.0, fwd.seconds - cost.attention_core_forward_seconds / cp);
          const double bwd_step =
              std::max(0.0, bwd.seconds - cost.attention_core_backward_seconds / cp);
          fwd_exposed += steps * fwd_step;
          bwd_exposed += steps * bwd_step;
          add(std::move(fwd), 0, 0);
          add(std::move(bwd), 0, 0);
          break;
        }
        case AttentionKind::kDsa: {
          const double gathered =
              t * cp * (m.kv_lora_rank + m.qk_rope_head_dim + m.index_head_dim) * dt;
          add(b.Op("CP latent K/V all-gather", CommGroup::kCp, Collective::kAllGather, cp_g,
                   gathered, 1, 0),
              1, 0);
          add(b.Op("CP latent K/V gradient reduce-scatter", CommGroup::kCp,
                   Collective::kReduceScatter, cp_g, gathered, 0, 1),
              0, 1);
          break;
        }
        case AttentionKind::kKda:
        case AttentionKind::kGdn: {
          const double state =
              spec.attention == AttentionKind::kKda
                  ? static_cast<double>(m.linear_heads) / tp * m.linear_head_dim * m.linear_head_dim
                  : static_cast<double>(m.gdn_value_heads) / tp * m.gdn_key_head_dim *
                        m.gdn_value_head_dim;
          const double bytes = state * 4 * run.micro_batch;  // fp32 state per sequence
          add(b.Op("CP recurrent-state pass", CommGroup::kCp, Collective::kSendRecv, cp_g, bytes,
                   cp - 1, cp - 1),
              cp - 1, cp - 1);
          break;
        }
      }
    }
    if (spec.ffn == FfnKind::kMoe && ep > 1) {
      const double routed = t / tp * m.experts_per_token * h * dt;
      add(b.Op("EP all-to-all (dispatch, combine)", CommGroup::kEp, Collective::kAllToAll, ep_g,
               routed, 2, 2, run.moe_imbalance),
          2, 2);
    }
    if (fsdp) {
      const double dense = static_cast<double>(DenseLayerParams(m, spec)) / tp;
      const double experts = static_cast<double>(RoutedExpertParams(m, spec)) / std::max(1, ep);
      double fwd_fsdp = 0, bwd_fsdp = 0;
      auto fsdp_op = [&](CommOp op) {
        fwd_fsdp += op.forward_calls * op.seconds;
        bwd_fsdp += op.backward_calls * op.seconds;
        add(std::move(op), 0, 0);
      };
      fsdp_op(b.Op("FSDP weight all-gather", CommGroup::kFsdp, Collective::kAllGather, dense_dp,
                   dense * wb, 1, 1));
      fsdp_op(b.Op("FSDP gradient reduce-scatter", CommGroup::kFsdp, Collective::kReduceScatter,
                   dense_dp, dense * gb, 0, 1));
      if (experts > 0) {
        fsdp_op(b.Op("FSDP expert weight all-gather", CommGroup::kFsdp, Collective::kAllGather,
                     expert_dp, experts * wb, 1, 1));
        fsdp_op(b.Op("FSDP expert gradient reduce-scatter", CommGroup::kFsdp,
                     Collective::kReduceScatter, expert_dp, experts * gb, 0, 1));
      }
      // Prefetched during the neighbouring layer's pass, about as long as this one's.
      lc.recompute_exposed_seconds = fwd_exposed;  // the gathers so far are not FSDP's
      fsdp_in_forward = true;
      fwd_exposed += std::max(0.0, fwd_fsdp - cost.forward_seconds);
      bwd_exposed += std::max(0.0, bwd_fsdp - cost.backward_seconds);
    }
    lc.forward_exposed_seconds = fwd_exposed;
    if (!fsdp_in_forward) lc.recompute_exposed_seconds = fwd_exposed;
    lc.backward_exposed_seconds = bwd_exposed;
    b.out.layers.push_back(std::move(lc));
  }

  // Once per step.
  auto step_op = [&](CommOp op, double exposed) {
    b.out.step_seconds += (op.forward_calls + op.backward_calls) * op.seconds;
    b.out.step_exposed_seconds += exposed;
    b.out.step_ops.push_back(std::move(op));
  };
  // The embedding's collectives on the first stage, the LM head's on the last.
  const int ends = (first_stage ? 1 : 0) + (last_stage ? 1 : 0);
  if (tp > 1 && ends > 0 && sequence_parallel) {
    CommOp emb = b.Op(ends == 2     ? "TP embedding reduce-scatter / LM head all-gather"
                      : first_stage ? "TP embedding reduce-scatter"
                                    : "TP LM head all-gather",
                      CommGroup::kTp, Collective::kAllGather, tp_g, tp_bytes, ends, ends);
    const double all = 2 * ends * emb.seconds;
    step_op(std::move(emb), all);
  } else if (tp > 1 && ends > 0) {
    // Without SP: the embedding's all-reduce in forward, the head's input gradient's in backward.
    CommOp emb = b.Op(ends == 2     ? "TP embedding all-reduce / LM head gradient all-reduce"
                      : first_stage ? "TP embedding all-reduce"
                                    : "TP LM head gradient all-reduce",
                      CommGroup::kTp, Collective::kAllReduce, tp_g, tp_bytes, first_stage ? 1 : 0,
                      last_stage ? 1 : 0);
    const double all = ends * emb.seconds;
    step_op(std::move(emb), all);
  }
  // Parameters this rank holds (as the cost model's fixed memory counts them): the stage's
  // embedding / head, and without FSDP (whose layers reduce their own) the stage's layers.
  const NonLayerParams outside = StageNonLayerParams(m, run, stage);
  double dense = outside.dense;
  double experts = outside.experts;
  if (fsdp && last_stage) {
    // Note [MTP layers] (planner/frameworks/megatron.cc): Megatron-FSDP's units are the
    // TransformerLayers (distributed/fsdp/mcore_fsdp_adapter.py fsdp_unit_modules, for
    // optim_grads_params), the MTP depths' own included, which each MTP layer gathers above; the
    // rest of an MTP module (enorm, hnorm, eh_proj, final_layernorm: 3h + 2h^2) stays with the
    // root's parameters.
    const int mtp = TrainedMtpLayers(m, run);
    if (mtp > 0 && !m.layers.empty()) {
      dense -= mtp * static_cast<double>(DenseLayerParams(m, m.layers.back())) / tp;
      experts -= static_cast<double>(MtpRoutedExpertParams(m, mtp)) / std::max(1, ep);
    }
  }
  for (const LayerCost& l : layers) {
    if (fsdp || l.index < 0 || static_cast<size_t>(l.index) >= m.layers.size()) continue;
    dense += static_cast<double>(DenseLayerParams(m, m.layers[l.index])) / tp;
    experts += static_cast<double>(RoutedExpertParams(m, m.layers[l.index])) / std::max(1, ep);
  }
  const bool hf = run.framework == Framework::kHf;
  auto bucket_params = [&](GroupPlacement g) {
    return hf ? 25.0 * (1 << 20) / gb : std::max(4e7, 1e6 * g.size);
  };
  auto reduce = [&](const char* what, GroupPlacement g, double params) {
    if (params <= 0 || g.size <= 1) return;
    const double bucket = std::min(params, bucket_params(g));
    auto exposed = [&](const CommOp& op, double window) {
      const double one = op.seconds * bucket / params;
      return std::max(one, op.seconds - window);
    };
    if (fsdp) {
      // Embedding and head: gathered for forward and backward, gradients reduce-scattered.
      CommOp ag = b.Op(absl::StrCat("FSDP ", what, " all-gather"), CommGroup::kFsdp,
                       Collective::kAllGather, g, params * wb, 0, 2);
      CommOp rs = b.Op(absl::StrCat("FSDP ", what, " reduce-scatter"), CommGroup::kFsdp,
                       Collective::kReduceScatter, g, params * gb, 0, 1);
      const double e = 2 * ag.seconds + rs.seconds;
      step_op(std::move(ag), e);
      step_op(std::move(rs), 0);
    } else if (run.sharding == Sharding::kNoShard) {
      CommOp ar = b.Op(absl::StrCat("DP ", what, " gradient all-reduce"), CommGroup::kDp,
                       Collective::kAllReduce, g, params * gb, 0, 1);
      const double e = exposed(ar, backward_compute);
      b.out.gradient_sync_exposed_seconds += e;
      step_op(std::move(ar), e);
    } else {
      CommOp rs = b.Op(absl::StrCat("DP ", what, " gradient reduce-scatter"), CommGroup::kDp,
                       Collective::kReduceScatter, g, params * gb, 0, 1);
      CommOp ag = b.Op(absl::StrCat("DP ", what, " weight all-gather"), CommGroup::kDp,
                       Collective::kAllGather, g, params * wb, 0, 1);
      const double e = exposed(rs, backward_compute) + exposed(ag, forward_compute);
      b.out.gradient_sync_exposed_seconds += e;
      step_op(std::move(rs), e);
      step_op(std::move(ag), 0);
    }
  };
  reduce("dense", dense_dp, dense);
  reduce("expert", expert_dp, experts);
  // Word embeddings held by the first and the last stage (tied, or the MTP modules' input):
  // their gradients are all-reduced between the two once per step, after the backward and
  // before the optimizer (Megatron-Core finalize_model_grads.py, _allreduce_word_embedding_grads
  // over the embedding group of first and last stage ranks, (pp - 1) stage strides apart:
  // gpus x (pp - 1) / pp under the default order, (pp - 1) x tp x cp under tp-cp-ep-pp-dp);
  // exposed.
  if (LastStageHoldsWordEmbeddings(m, run) && (first_stage || last_stage)) {
    const GroupPlacement ends_g = groups.embedding;
    CommOp ar = b.Op("PP word embedding gradient all-reduce (first and last stage)", CommGroup::kDp,
                     Collective::kAllReduce, ends_g,
                     static_cast<double>(m.vocab) * m.hidden / tp * gb, 0, 1);
    const double e = ar.seconds;
    b.out.gradient_sync_exposed_seconds += e;
    step_op(std::move(ar), e);
  }

  // Warnings.
  for (auto [name, g] : {std::pair<const char*, GroupPlacement>{"TP", tp_g}, {"EP", ep_g}}) {
    if (g.size > 1 && LinksOf(hw, g).link == CommLink::kNetwork) {
      b.out.warnings.push_back(absl::StrFormat(
          "WARNING: the %s group of %d GPUs leaves its NVLink domain of %d: its collectives run "
          "over the network at %.0f GB/s per GPU instead of NVLink's %.0f GB/s",
          name, g.size, hw.nvlink_domain_gpus, hw.NetworkBytesPerSecond() / 1e9,
          hw.nvlink_bytes_per_second / 1e9));
    }
  }
  if (cp > 1 && run.seq_len % (2 * static_cast<uint64_t>(cp)) != 0) {
    b.out.warnings.push_back(absl::StrFormat(
        "WARNING: --seq-len %d is not divisible by 2 x --cp (%d): the load-balanced (zigzag) "
        "split of each sequence into 2 x cp chunks does not apply and causal attention work is "
        "uneven over the CP ranks",
        run.seq_len, 2 * cp));
  }
  bool has_moe = false;
  for (const LayerSpec& l : m.layers) has_moe |= l.ffn == FfnKind::kMoe;
  if (has_moe && m.experts > 0) {
    const double per_expert = t / tp * m.experts_per_token * ep / m.experts;
    if (per_expert < hw.grouped_gemm_half_tokens) {
      b.out.warnings.push_back(absl::StrFormat(
          "WARNING: %.0f tokens per expert per micro-batch (tokens per rank %.0f / tp %d x "
          "top-%d x ep %d / %d experts), below the %.0f at which grouped GEMMs reach half their "
          "rate: too few tokens per rank",
          per_expert, t, tp, m.experts_per_token, ep, m.experts, hw.grouped_gemm_half_tokens));
    }
  }
  for (CommLink link : {CommLink::kNvlink, CommLink::kNetwork}) {
    bool used = false;
    for (const LayerComm& l : b.out.layers) {
      for (const CommOp& op : l.ops) used |= op.link == link;
    }
    for (const CommOp& op : b.out.step_ops) used |= op.link == link;
    if (used && !Costed(hw, link)) {
      b.out.warnings.push_back(absl::StrCat(
          "WARNING: communication over ", CommLinkName(link),
          " is not costed: the hardware profile has no ",
          link == CommLink::kNetwork ? "nic_bytes_per_second" : "nvlink_bytes_per_second",
          " (README \"Hardware profiles\")"));
    }
  }
  return std::move(b.out);
}

double StepCommBytes(const StepComm& comm, CommGroup group) {
  double bytes = 0;
  for (const LayerComm& l : comm.layers) {
    for (const CommOp& op : l.ops) {
      if (op.group == group) bytes += (op.forward_calls + op.backward_calls) * op.bytes;
    }
  }
  for (const CommOp& op : comm.step_ops) {
    if (op.group == group) bytes += (op.forward_calls + op.backward_calls) * op.bytes;
  }
  return bytes;
}

}  // namespace stowage::planner
