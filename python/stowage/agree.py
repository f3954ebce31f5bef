"""Plan agreement over the trainer's torch.distributed process group (README "Plan agreement").

    stowage.agree(plan)                  # every rank, before step 0; group=None: the world
    runtime = stowage.Runtime(plan)

Each rank hashes its canonical plan (stowage_plan_hash, the C++ reader and writer), the hashes
are all-gathered over `group`, and every rank applies the one rule of the C ABI
(stowage_check_plan_agreement) to the same list: a mismatch raises PlanAgreementError on every rank
with the same message, naming the ranks that differ and the hash each holds. A rank whose plan
is not even valid still takes part in the all-gather (contributing "no valid plan"), so the
others fail with the message instead of waiting for it.
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Union

from ._lib import load as load_library
from .plan import PlanError
from .runtime import PlanLike, Runtime, plan_hash

_NO_PLAN = 0  # runtime/plan_agreement.h kNoPlanHash
_MASK = (1 << 64) - 1


class PlanAgreementError(RuntimeError):
    """The ranks of a process group do not hold the same plan. The message is the same on every
    rank; `hashes[r]` is what group rank r holds (0: no valid plan)."""

    def __init__(self, message: str, hashes: list):
        super().__init__(message)
        self.hashes = hashes


def agree(plan: Union[PlanLike, Runtime], group: Optional[Any] = None) -> int:
    """Checks that every rank of `group` (a torch.distributed process group; None: the default
    group) holds the same plan -- a Plan, dict, JSON text, path, or the Runtime made from it.
    Collective: every rank of the group must call it. Returns the agreed hash; raises
    PlanAgreementError (every rank, same message) on a mismatch, and on the rank whose plan is not
    valid the same PlanAgreementError, its __cause__ that plan's own PlanError."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("stowage.agree: torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first (or pass group=)")
    local_error: Optional[PlanError] = None
    try:
        mine = plan.plan_hash() if isinstance(plan, Runtime) else plan_hash(plan)
    except PlanError as e:
        mine, local_error = _NO_PLAN, e
    world = dist.get_world_size(group)
    # NCCL groups gather CUDA tensors; gloo (and the rest) CPU ones.
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    signed = mine - (1 << 64) if mine >= (1 << 63) else mine  # int64 carries the 64 bits
    contribution = torch.tensor([signed], dtype=torch.int64, device=device)
    gathered = [torch.zeros_like(contribution) for _ in range(world)]
    dist.all_gather(gathered, contribution, group=group)
    hashes = [int(t.item()) & _MASK for t in gathered]
    lib = load_library()
    array = (ctypes.c_uint64 * world)(*hashes)
    if lib.stowage_check_plan_agreement(array, world) != 0:
        message = lib.stowage_last_error().decode("utf-8", "replace")
        # The same message on every rank; the invalid plan's own error is chained on its rank.
        raise PlanAgreementError(message, hashes) from local_error
    return mine
