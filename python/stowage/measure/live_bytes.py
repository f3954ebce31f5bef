"""Live bytes of a step, op by op: LiveBytes, a TorchDispatchMode that logs every allocation, free
and phase change of the ops it sees, and replay(), which reads the log back with other sizes
(Note [Replaying the step] in stowage/measure/hf_fit.py).
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .op_work import (SOFTMAX, SOFTMAX_BACKWARD, OpWork, accumulates, index_put_rows, op_work,
                      tensors_in)


def storage_key(t: torch.Tensor) -> int:
    """A storage's identity: its StorageImpl (data_ptr() is 0 for every fake tensor)."""
    return t.untyped_storage()._cdata


def storage_nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


class LiveBytes(TorchDispatchMode):
    """Follows the bytes of every storage an op creates while the mode is active: a storage
    counts from the op that returns it (an output whose storage is none of the op's inputs')
    until its StorageImpl is freed (weakref.finalize on the storage object, which PyTorch keeps
    alive as long as the StorageImpl is). Storages that existed before (weights, inputs) are not
    counted. Every allocation, free and phase change is logged in order (`events`), so the
    same step can be replayed with other sizes (Note [Replaying the step]); `phase` labels what
    runs now, and every op's work is added to the phase's OpWork and to that of each entry of
    `modules` (the modules running now)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.sizes: list[int] = []       # by allocation id
        self.allocated_in: list[Any] = []  # by allocation id: the phase that made it
        # By allocation id: the op that made it (Note [Loops in the step]).
        self.made_by: list[str] = []
        self.events: list[tuple[str, Any]] = []  # ("a", id), ("f", id), ("p", phase), ("m", x)
        self.live_ids: dict[int, int] = {}  # storage key -> allocation id, while alive
        self.phase: Any = None
        self.work: dict[Any, OpWork] = {}
        self.modules: list[Any] = []
        self.module_work: dict[Any, OpWork] = {}
        # (row length, element size) of every softmax (Note [One side of every threshold]).
        self.softmax_rows: set[tuple[int, int]] = set()
        # The destination rows of every index_put(accumulate=True)
        # (Note [One side of every threshold]: its sort's passes follow their bits).
        self.sort_rows: set[int] = set()

    def set_phase(self, phase: Any) -> None:
        self.phase = phase
        self.events.append(("p", phase))

    def mark(self, what: Any) -> None:
        self.events.append(("m", what))

    def ref(self, t: torch.Tensor) -> int:
        """The allocation id of t's storage; one made before the mode gets an id of its own,
        with its size and no allocation event."""
        key = storage_key(t)
        if key not in self.live_ids:
            self.sizes.append(storage_nbytes(t))
            self.allocated_in.append(None)
            self.made_by.append("")
            return len(self.sizes) - 1
        return self.live_ids[key]

    def _free(self, key: int) -> None:
        i = self.live_ids.pop(key, None)
        if i is not None:
            self.live -= self.sizes[i]
            self.events.append(("f", i))

    def _track(self, t: torch.Tensor, inputs: set, op: str) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in inputs or key in self.live_ids:
            return
        i = len(self.sizes)
        self.sizes.append(storage.nbytes())
        self.allocated_in.append(self.phase)
        self.made_by.append(op)
        self.live_ids[key] = i
        self.events.append(("a", i))
        self.live += self.sizes[i]
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {storage_key(t) for t in tensors_in((args, kwargs)) if t.layout is torch.strided}
        name = func._overloadpacket.__name__
        for t in tensors_in(out):
            if t.layout is torch.strided:
                self._track(t, inputs, name)
        if name in SOFTMAX or name in SOFTMAX_BACKWARD:
            x, dim = args[0], args[1] if name in SOFTMAX else args[2]
            if x.dim() > 0:
                self.softmax_rows.add((int(x.shape[dim]), x.element_size()))
        if accumulates(name, args, kwargs):
            self.sort_rows.add(index_put_rows(args)[0])
        w = op_work(func, args, kwargs, out)
        if w is not None:
            self.work.setdefault(self.phase, OpWork()).add(w)
            for m in self.modules:
                self.module_work.setdefault(m, OpWork()).add(w)
        return out


def replay(events: Sequence[tuple[str, Any]], sizes: Sequence[int]
           ) -> tuple[dict[Any, int], dict[Any, int], dict[Any, int], int]:
    """Note [Replaying the step]: the live bytes of a logged step with allocation sizes `sizes`.
    Returns, per phase, the live bytes when it was first entered and the most it reached; per
    mark, the live bytes there; and the step's peak."""
    live = peak = 0
    phase: Any = None
    entered: dict[Any, int] = {}
    peaks: dict[Any, int] = {}
    marks: dict[Any, int] = {}
    for kind, x in events:
        if kind == "a":
            live += sizes[x]
            peak = max(peak, live)
            peaks[phase] = max(peaks.get(phase, 0), live)
        elif kind == "f":
            live -= sizes[x]
        elif kind == "p":
            phase = x
            entered.setdefault(x, live)
            peaks[x] = max(peaks.get(x, 0), live)
        else:
            marks[x] = live
    return entered, peaks, marks, peak


__all__ = ["LiveBytes", "replay", "storage_key", "storage_nbytes"]
