// torch's data-parallel engines under the hf recipe (Note [hf data parallel]): what DDP and FSDP2
// hold beyond the one-GPU step (ApplyHfDataParallel), and the engine the plan summary names
// (HfDataParallelEngine).
#include <algorithm>
#include <cstdint>
#include <string>

#include "planner/frameworks/hf.h"

namespace stowage::planner {

// Note [hf data parallel]
// transformers eager across GPUs is torch's data parallelism (TP, CP and EP are 1: ValidateHfRun),
// over the dp = gpus / pp ranks of a stage; --sharding names the engine as torchtitan's configs
// do (bridges/torchtitan_read.cc): no_shard is DDP, optim DDP with torch's ZeroRedundancyOptimizer
// (only the optimizer state sharded), optim_grads FSDP2 with reshard_after_forward=False,
// optim_grads_params FSDP2's fully_shard. Fixed memory's weights and optimizer state shard as
// under megatron (BuildStepCost), and the all-gather and reduce-scatter buffers are its
// communication buffers; what differs is where eager gradients go (torch 2.11):
//  - DDP (no_shard, optim): autograd makes each .grad during backward as on one GPU, and the
//    Reducer copies it into its allreduce bucket, buckets that cover every parameter and are
//    allocated when DistributedDataParallel is built (gradient_as_bucket_view=False, the
//    default; distributed.py's docstring: True saves "the total gradients size"). So a full
//    gradient-sized set of buckets is fixed memory beside the gradients made in backward.
//  - FSDP2 (optim_grads, optim_grads_params; checked on CPU by
//    tests/python/measure/test_hf_data_parallel.py, as DDP's buckets are): each layer is its own
//    fully_shard unit; its post_backward (_fsdp_param_group.py) takes the layer's unsharded .grad
//    tensors, sets them to None and foreach_reduce (_fsdp_collectives.py) copies them into one
//    reduce-scatter input and assigns each parameter a view of the reduce-scatter output as its
//    sharded grad: from the end of its backward a layer holds a dp-th of its gradients (StepCost::
//    layer_grad_shards), the reduce-scatter input being the communication buffer counted for
//    one layer. The root unit (embedding, final norm, LM head) reduce-scatters only after the
//    whole backward, so the LM head's gradients stay whole through it.
//  - FSDP2's root keeps its parameters unsharded from its forward to the end of the step
//    (fully_shard's reshard_after_forward=None: False for the root module), so fully_shard
//    (optim_grads_params) also holds the root's whole weights, embedding and LM head, as an
//    all-gather output beside their shards.
// One rank (dp 1) runs no data-parallel engine at all, whatever --sharding says: the step is the
// measured one-GPU step, with no gathered or reduce-scattered buffers.
std::string HfDataParallelEngine(const RunSettings& run) {
  if (run.gpus / std::max(1, run.pp) <= 1) return "no data-parallel engine: one rank";
  switch (run.sharding) {
    case Sharding::kNoShard:
      return "torch DDP";
    case Sharding::kOptim:
      return "torch DDP + ZeroRedundancyOptimizer";
    case Sharding::kOptimGrads:
      return "torch FSDP2, reshard_after_forward=False";
    case Sharding::kOptimGradsParams:
      return "torch FSDP2 fully_shard";
  }
  return "";
}

void ApplyHfDataParallel(const RunSettings& run, StepCost& c) {
  const int dp = run.gpus / std::max(1, run.pp);
  if (dp <= 1) {
    c.fixed.comm_buffers = 0;  // under hf they are the sharding's alone (TP, CP, EP are 1)
    return;
  }
  if (run.sharding <= Sharding::kOptim) {
    uint64_t buckets = c.tail_grad_bytes + c.embedding_grad_bytes;
    for (const LayerCost& l : c.layers) buckets += l.grad_bytes;
    c.fixed.comm_buffers += buckets;
    return;
  }
  c.layer_grad_shards = dp;
  if (run.sharding == Sharding::kOptimGradsParams) {
    const uint64_t root_grads = c.tail_grad_bytes + c.embedding_grad_bytes;
    c.fixed.comm_buffers += root_grads / static_cast<uint64_t>(run.grad_bytes) *
                            static_cast<uint64_t>(run.weight_bytes);
  }
}

}  // namespace stowage::planner
