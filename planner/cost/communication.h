// Communication time: the bytes each collective of a training step moves on one rank, the link
// it crosses, its time on that link and how much of it compute hides. Note [Communication] in
// communication.cc states the collectives, their byte counts, the cost model and the overlap
// rules; the step's assembly (planner/frameworks/step_cost.cc) adds each layer's exposed part to
// the layer's times and the simulator adds the once-per-step part to the step.
#ifndef STOWAGE_PLANNER_COMMUNICATION_H_
#define STOWAGE_PLANNER_COMMUNICATION_H_

#include <string>
#include <vector>

#include "planner/hardware/hardware.h"

namespace stowage::planner {

struct LayerCost;
struct ModelConfig;
struct RunSettings;

enum class Collective { kAllGather, kReduceScatter, kAllReduce, kAllToAll, kSendRecv };
const char* CollectiveName(Collective collective);  // "all-gather", ..., "send/recv"

// The link a group's traffic is limited by: none (a group of one), the NVLink fabric (every
// member in one NVLink domain), or the network (the group leaves its NVLink domain).
enum class CommLink { kNone, kNvlink, kNetwork };
const char* CommLinkName(CommLink link);  // "none", "NVLink", "network"

// A process group as Megatron lays it out (GroupsOf below): `size` members whose global ranks are
// `stride` apart, or, when `block` > 0, `size` / `block` blocks `block_stride` apart of `block`
// members `stride` apart each (a group over two dimensions the rank order does not keep
// adjacent: under tp-cp-ep-pp-dp the dense data-parallel group is cp members tp apart times dp
// members tp x cp x pp apart). block_stride >= block x stride.
struct GroupPlacement {
  int size = 1;
  int stride = 1;
  int block = 0;  // 0: one level
  int block_stride = 0;
};

struct GroupLinks {
  CommLink link = CommLink::kNone;
  int members_per_domain = 1;  // members of the group inside one NVLink domain
};
GroupLinks LinksOf(const HardwareProfile& hw, GroupPlacement group);

// Every group a rank of `run` belongs to, from its parallel sizes and Megatron's rank order
// (RunSettings::rank_order; Note [Communication]).
struct ParallelGroups {
  GroupPlacement tp, cp, ep;
  GroupPlacement dense_dp;   // data parallel with CP folded in (Megatron's dp-cp group)
  GroupPlacement expert_dp;  // routed experts' data parallel
  GroupPlacement embedding;  // the first and the last stage's word embeddings (2 members)
  int stage_stride = 1;      // ranks between a rank and its neighbour in the next stage
};
ParallelGroups GroupsOf(const RunSettings& run);

// Seconds of one collective on `group`, by the alpha-beta ring model with NCCL's bus-bandwidth
// factors (Note [Communication]). `bytes` is what nccl-tests calls the size: the gathered output
// of an all-gather, the input of a reduce-scatter, the buffer of an all-reduce, everything one
// rank sends (its own share included) in an all-to-all, the message of a send/recv. 0 when the
// link's rate is absent from the profile (the summary says so).
double CollectiveSeconds(const HardwareProfile& hw, Collective collective, GroupPlacement group,
                         double bytes);

// The link pipeline stages `from` and `to` (0 <= both < pp) exchange over in a world of `gpus`
// ranks whose stages are `stage_stride` ranks apart (ParallelGroups::stage_stride; 0: gpus / pp,
// Megatron's default order with PP outermost): rank r of stage `from` pairs with rank
// r + (to - from) x stage_stride, and a stage is the blocks of stage_stride adjacent ranks every
// stage_stride x pp. Every pair of the two stages exchanges at once and the slowest binds: NVLink
// when every pair shares an NVLink domain (ranks fill domains in order), the network when any
// pair leaves it, none when from == to.
CommLink StageLink(const HardwareProfile& hw, int gpus, int pp, int from, int to,
                   int stage_stride = 0);

// One message of `bytes` from one rank to one other over `link` (each direction of a link runs
// at its rate, so a message each way at once takes as long as one): one hop's latency plus the
// bytes at the link's per-GPU rate. 0 on kNone, or when the profile lacks the link's rate.
double PointToPointSeconds(const HardwareProfile& hw, CommLink link, double bytes);

// What a pipeline stage sends its neighbour per microbatch and model chunk, one way: its output
// activation (forward) or its input gradient (backward), Megatron-Core's tensor of (seq_len / cp
// / tp under sequence parallelism, seq_len / cp without) x micro_batch x hidden (schedules.py
// get_tensor_shapes), times the residual streams a hyper-connected model carries (hc_mult), in
// the activation dtype.
double PipelineMessageBytes(const ModelConfig& model, const RunSettings& run);

// The parallel dimension a collective runs over.
enum class CommGroup { kTp, kCp, kEp, kFsdp, kDp };
const char* CommGroupName(CommGroup group);  // "TP", "CP", "EP", "FSDP", "DP"

// One collective of a layer (or of the whole step), as it runs once.
struct CommOp {
  std::string name;  // e.g. "TP all-gather (attention input)"
  CommGroup group = CommGroup::kTp;
  Collective collective = Collective::kAllGather;
  GroupPlacement placement;
  CommLink link = CommLink::kNone;
  double bytes = 0;    // per call, CollectiveSeconds' `bytes`
  double seconds = 0;  // per call on the link
  // Calls per layer forward (also made again by a recompute) and per layer backward; for a
  // once-per-step op, `backward_calls` is its count per step.
  int forward_calls = 0;
  int backward_calls = 0;
  bool latency_bound = false;  // its latency term exceeds its bandwidth term
};

// A layer's collectives and the part of their time no compute hides, per pass.
struct LayerComm {
  std::vector<CommOp> ops;
  double forward_seconds = 0;  // on the links
  double backward_seconds = 0;
  double forward_exposed_seconds = 0;  // what the layer's forward waits
  double backward_exposed_seconds = 0;
  // What its recompute waits: the forward's collectives but FSDP's gather, whose weights the
  // backward's gather has just brought (the recompute runs inside the layer's backward).
  double recompute_exposed_seconds = 0;
};

struct StepComm {
  std::vector<LayerComm> layers;  // one per layer BuildStepComm was given, in its order
  // Outside the layers: the embedding's and LM head's collectives (once per microbatch) and the
  // DP gradient reduction (once per step, however many microbatches).
  std::vector<CommOp> step_ops;
  double step_seconds = 0;
  double step_exposed_seconds = 0;
  // The part of step_exposed_seconds the DP gradient reduction (and the distributed optimizer's
  // weight gather) exposes: a pipeline or gradient accumulation pays it once per step, not once
  // per microbatch (Megatron syncs gradients on the last microbatch only).
  double gradient_sync_exposed_seconds = 0;
  // "WARNING: ..." lines for the summary: groups leaving the NVLink domain, too few tokens per
  // rank, a sequence length CP cannot split for load balance, links the profile lacks.
  std::vector<std::string> warnings;
};

// The communication of pipeline stage `stage` (0 without pipeline parallelism) for its
// `layers` (built by the cost model from the same model and run; LayerCost::index names each
// one's model layer, and their compute times are what hides the overlapped collectives). The
// data-parallel groups are the stage's (gpus / (tp x pp) ranks for dense parameters, gpus /
// (ep x pp) for routed experts); the embedding's collectives run on stage 0, the LM head's (and
// the multi-token-prediction modules') on the last stage.
StepComm BuildStepComm(const ModelConfig& model, const HardwareProfile& hw, const RunSettings& run,
                       const std::vector<LayerCost>& layers, int stage = 0);

// Bytes one rank sends or gathers per step in `group` when every layer runs forward and
// backward once (no recompute): the sum of calls x bytes.
double StepCommBytes(const StepComm& comm, CommGroup group);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_COMMUNICATION_H_
