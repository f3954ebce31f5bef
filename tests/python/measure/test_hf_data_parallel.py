"""What torch's data-parallel engines hold of a transformers model's gradients, on CPU (gloo, two
ranks): the facts Note [hf data parallel] (planner/frameworks/hf_data_parallel.cc) plans from,
checked against torch itself rather than its docs. The planner's arithmetic over them is
tests/planner/cost/cost_model_test.cc (CostModel.HfDataParallelHoldsWhatTorchsEngineHolds).

- FSDP2 (fully_shard per decoder layer, then the root): when a layer's backward begins, every
  later layer's parameter gradients are already sharded DTensors, a world-size-th of the
  parameter each; the root's LM head is still its unsharded parameter with a whole gradient,
  sharded only once the backward is over.
- DDP: the Reducer's allreduce buckets cover every parameter's bytes (gradient_as_bucket_view
  off, the default), beside the gradients autograd makes.

Needs torch 2.x with torch.distributed.fsdp.fully_shard and transformers (skipped on Debian's
torch 1.13).
"""

from __future__ import annotations

import os
import socket
import unittest

import support  # noqa: F401  (puts the package on sys.path)

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM
except (ImportError, ValueError):
    # Debian's torch 1.13: no fully_shard, no transformers; under Python 3.11 its
    # torch.distributed.fsdp does not even import (a dataclass with a mutable default).
    fully_shard = None

WORLD = 2


def _config():
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                       attn_implementation="sdpa")


def _local(t):
    """(is a DTensor, elements on this rank) of a gradient, or None."""
    if t is None:
        return None
    return (hasattr(t, "_local_tensor"), getattr(t, "_local_tensor", t).numel())


def _fsdp(rank: int, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)
        model = LlamaForCausalLM(_config())
        layers = model.model.layers
        for layer in layers:
            fully_shard(layer)
        fully_shard(model)
        seen = {}

        def at_backward_of(j):
            def hook(module, grad_output):
                seen[j] = {
                    "later": [(_local(p.grad), p.numel())
                              for layer in layers[j + 1:] for p in layer.parameters()],
                    "head": (_local(model.lm_head.weight.grad), model.lm_head.weight.numel()),
                }
            return hook

        for j in range(len(layers) - 1):
            layers[j].register_full_backward_pre_hook(at_backward_of(j))
        ids = torch.randint(0, 256, (1, 32))
        model(input_ids=ids, labels=ids).loss.backward()
        seen["end"] = {"head": (_local(model.lm_head.weight.grad),
                                model.lm_head.weight.numel())}
        if rank == 0:
            out.put(seen)
    finally:
        dist.destroy_process_group()


def _ddp(rank: int, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        model = LlamaForCausalLM(_config()).to(torch.bfloat16)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        logged = ddp._get_ddp_logging_data()
        if rank == 0:
            buckets = sum(int(b) for b in str(logged["bucket_sizes"]).split(","))
            params = sum(p.numel() * p.element_size() for p in model.parameters())
            out.put({"buckets": buckets, "params": params,
                     "as_view": int(logged["gradient_as_bucket_view"])})
    finally:
        dist.destroy_process_group()


def _spawn(fn):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.get_context("spawn").SimpleQueue()
    mp.spawn(fn, args=(port, out), nprocs=WORLD)
    return out.get()


@unittest.skipIf(fully_shard is None, "needs torch 2.x (fully_shard) and transformers")
class HfDataParallel(unittest.TestCase):
    def test_fsdp2_shards_each_layers_gradients_as_its_backward_ends(self):
        seen = _spawn(_fsdp)
        for j in (0, 1):
            for grad, numel in seen[j]["later"]:
                self.assertEqual(grad, (True, numel // WORLD), f"a layer after {j}")
            self.assertEqual(seen[j]["head"], ((False, seen[j]["head"][1]), seen[j]["head"][1]),
                             "the root's LM head is whole during the layers' backward")
        head_numel = seen["end"]["head"][1]
        self.assertEqual(seen["end"]["head"][0], (True, head_numel // WORLD))

    def test_ddp_buckets_cover_every_parameter(self):
        ddp = _spawn(_ddp)
        self.assertEqual(ddp["as_view"], 0)
        self.assertEqual(ddp["buckets"], ddp["params"])


if __name__ == "__main__":
    unittest.main()
