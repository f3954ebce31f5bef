"""Microbatches in flight: the wrapper under gradient accumulation and under a pipeline schedule's
order of forwards and backwards (stowage.pipeline_order: 1F1B and interleaved), on the host backend,
against the unwrapped model's loss and gradients bit for bit; and the runtime's misuse statuses as
Python sees them."""

from __future__ import annotations

import collections
import contextlib
import copy
import unittest

import support
import torch
import torch.nn as nn

import plans
import stowage
from stowage import plan as plan_mod

torch.set_num_threads(1)  # deterministic and light on a shared 2-core machine

HIDDEN, TOKENS, LAYERS = 32, 40, 4
POLICIES = ["offload_saved", "offload_input", "offload_input", "offload_saved"]


def inputs(count: int, seed: int) -> list:
    torch.manual_seed(seed)
    return [torch.randn(TOKENS, HIDDEN) for _ in range(count)]


def grads(layers: nn.ModuleList) -> list:
    return [p.grad.detach().clone() for p in layers.parameters()]


def reference_step(layers: nn.ModuleList, xs: list, seed: int) -> tuple:
    """Gradient accumulation without stowage: each microbatch's forward and backward in turn."""
    torch.manual_seed(seed)
    losses, input_grads = [], []
    for x0 in xs:
        x = x0.clone().requires_grad_(True)
        y = x
        for layer in layers:
            y = layer(y)
        loss = support.loss_fn(y)
        loss.backward()
        losses.append(loss.detach())
        input_grads.append(x.grad)
    return losses, input_grads, grads(layers)


def no_dropout(layers: nn.ModuleList) -> nn.ModuleList:
    """A pipeline runs the microbatches' forwards in another order than one after another, so
    dropout would draw other masks: the pipeline test compares layers without it."""
    for m in layers.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    return layers


def pipelined(base: stowage.Plan, schedule: str, pp: int, vpp: int,
              microbatches: int) -> stowage.Plan:
    """`base` (one layer per model chunk: pp x vpp layers) split into pipeline stages: chunk c of
    stage s is virtual stage c x pp + s, i.e. layer c x pp + s. Each layer's in-flight count is
    the most its chunk holds in the stage's order (stowage.pipeline_order, the C++ order the
    plan validator's in_flight_microbatches comes from); with one layer per chunk the protocol
    fields are forced (save wait before the next layer, prefetch when its own backward starts)."""
    plan = copy.deepcopy(base)
    assert len(plan.layers) == pp * vpp
    plan.run.pp, plan.run.vpp, plan.run.schedule = pp, vpp, schedule
    plan.run.microbatches = microbatches
    plan.stages = []
    arena = 0
    for s in range(pp):
        held, most = [0] * vpp, [0] * vpp
        for op in stowage.pipeline_order(schedule, pp, vpp, microbatches, s):
            held[op.chunk] += 1 if op.forward else -1
            most[op.chunk] = max(most[op.chunk], held[op.chunk])
        host = 0
        for c in range(vpp):
            layer = plan.layers[c * pp + s]
            layer.in_flight_microbatches = most[c]
            if layer.host_bytes:
                layer.save_wait_before_layer = layer.index + 1
                layer.prefetch_after_layer = layer.index
            host += layer.host_bytes * most[c]
        plan.stages.append(plan_mod.StagePlan(
            stage=s, chunks=[plan_mod.LayerRange(c * pp + s, 1) for c in range(vpp)],
            embedding=s == 0, lm_head=s == pp - 1, host_bytes_per_gpu=host,
            host_arena_bytes=host))
        arena = max(arena, host)
    plan.runtime.host_arena_bytes = arena
    plan.predicted.host_bytes_per_gpu = arena
    plan.predicted.host_bytes_per_numa_node = 0
    return plan


def pipelined_profile(layers: nn.ModuleList, x: torch.Tensor, pp: int,
                      vpp: int) -> stowage.ModelProfile:
    """The profile every stage of a pipeline of `layers` (one layer per model chunk: pp x vpp
    layers) would measure: the one-stage profile's layers, and its `pipeline`: chunk c of stage s
    is layer c x pp + s, each stage holding its own layers' parameters (what
    stowage.megatron.profile gathers)."""
    from stowage.measure.layer_profile import PipelineProfile, StageProfile
    profile = stowage.profile_layers(layers, x, loss_fn=support.loss_fn, repeats=1)
    stages = []
    for s in range(pp):
        mine = [c * pp + s for c in range(vpp)]
        params = [p for i in mine for p in layers[i].parameters()]
        nbytes = sum(p.numel() * p.element_size() for p in params)
        stages.append(StageProfile(stage=s, chunks=[(i, 1) for i in mine], weights_bytes=nbytes,
                                   gradients_bytes=nbytes, other_bytes=profile.other_bytes))
    profile.pipeline = PipelineProfile(pp=pp, vpp=vpp, stages=stages, gpus=pp)
    return profile


class GradientAccumulationTest(unittest.TestCase):
    """Several microbatches per optimizer step, each offloading layer holding one slot that is
    reused after each microbatch's backward; two optimizer steps."""

    def test_matches_the_unwrapped_model_bit_for_bit(self) -> None:
        microbatches, steps = 4, 2
        reference = support.make_layers("mlp", LAYERS, HIDDEN)
        wrapped = support.clone_layers(reference)
        base = plans.plan_for(wrapped, inputs(1, 0)[0], POLICIES)
        base.run.microbatches = microbatches
        planned = stowage.PlannedLayers(wrapped, base)
        planned.runtime.set_trace_capacity(1 << 14)
        opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
        try:
            for step in range(steps):
                xs = inputs(microbatches, 100 + step)
                opt_ref.zero_grad(set_to_none=True)
                want = reference_step(reference, xs, seed=step)
                opt.zero_grad(set_to_none=True)
                torch.manual_seed(step)
                losses, input_grads = [], []
                with planned.step():
                    for k, x0 in enumerate(xs):
                        with planned.microbatch(k):
                            x = x0.clone().requires_grad_(True)
                            loss = support.loss_fn(planned(x))
                            loss.backward()
                        losses.append(loss.detach())
                        input_grads.append(x.grad)
                got = (losses, input_grads, grads(wrapped))
                for what, a, b in zip(("loss", "input grad", "parameter grad"), want, got):
                    for k, (u, v) in enumerate(zip(a, b)):
                        self.assertTrue(torch.equal(u, v), f"step {step}: {what} {k} differs")
                stats = planned.stats()
                self.assertEqual(stats.saves_total, stats.restores_total)
                # The trace names the microbatch of every event: each microbatch saved and
                # restored the same tensors, through the one slot.
                events = planned.runtime.trace().events
                by_microbatch = collections.Counter((e.microbatch, e.kind) for e in events)
                saves = {k: by_microbatch[k, "save_issued"] for k in range(microbatches)}
                self.assertGreater(saves[0], 0)
                self.assertEqual(set(saves.values()), {saves[0]}, by_microbatch)
                for k in range(microbatches):
                    self.assertEqual(by_microbatch[k, "restore"], saves[0], by_microbatch)
                self.assertEqual({e.microbatch for e in events}, set(range(microbatches)))
                opt_ref.step()
                opt.step()
            # One slot per layer however many microbatches: the arena is the plan's.
            self.assertLess(planned.stats().arena_capacity_bytes,
                            base.runtime.host_arena_bytes + (1 << 20))
        finally:
            planned.close()

    def test_two_forwards_under_one_id_are_refused(self) -> None:
        layers = support.make_layers("mlp", LAYERS, HIDDEN)
        plan = plans.plan_for(layers, inputs(1, 0)[0], POLICIES)
        plan.run.microbatches = 2
        planned = stowage.PlannedLayers(layers, plan)
        try:
            with self.assertRaises(stowage.PlanError) as caught:
                with planned.step():
                    for x in inputs(2, 1):  # no planned.microbatch(k): both are microbatch 0
                        planned(x.requires_grad_(True))
            self.assertIn("two forwards ran under one microbatch id", str(caught.exception))
            # Out of range: refused when the block is entered, before any save (the runtime's
            # own refusal is RuntimeMisuseTest's).
            with self.assertRaises(ValueError) as caught:
                with planned.step():
                    with planned.microbatch(2):
                        planned(inputs(1, 2)[0].requires_grad_(True))
            self.assertIn("microbatch index is 2; allowed: an integer from 0 to "
                          "run.microbatches - 1 (1)", str(caught.exception))
            with self.assertRaises(RuntimeError):
                with planned.microbatch(0):
                    pass  # no step open
        finally:
            planned.close()


class MicrobatchIndexRangeTest(unittest.TestCase):
    """A microbatch index past the C ABI's int32 is refused in the caller's terms, on every path:
    ctypes would wrap it (2**32 + 1 ran as microbatch 1; 2**31 was named -2147483648)."""

    def test_large_indices_are_refused_not_aliased(self) -> None:
        layers = support.make_layers("mlp", LAYERS, HIDDEN)
        plan = plans.plan_for(layers, inputs(1, 0)[0], POLICIES)
        plan.run.microbatches = 2
        planned = stowage.PlannedLayers(layers, plan)
        try:
            for index in (2**32 + 1, 2**31, 2**31 - 1, 2, -1):
                with self.subTest(index=index):
                    with self.assertRaises(ValueError) as caught:
                        with planned.step():
                            with planned.microbatch(index):
                                planned(inputs(1, 3)[0].requires_grad_(True))
                    message = str(caught.exception)
                    self.assertIn(f"PlannedLayers.microbatch(): microbatch index is {index}; "
                                  "allowed: an integer from 0 to run.microbatches - 1 (1), and at "
                                  "most 2147483647", message)
            # The per-tensor calls (bound once per step, no argument checks of their own besides
            # this one) refuse what ctypes would wrap, naming the call and the value.
            with planned.step():
                calls = planned._state.calls
                for call in (lambda: calls.save(0, 2**32 + 1, 0, 0, None),
                             lambda: calls.save_many(0, 2**32 + 1, [], [], None),
                             lambda: calls.prefetch(1, 2**32 + 1, 0, None),
                             lambda: calls.prefetch_many(2**32 + 1, [], [], None),
                             lambda: calls.restore(1, 2**32 + 1, 0, None)):
                    with self.assertRaises(ValueError) as caught:
                        call()
                    self.assertIn("microbatch index is 4294967297; allowed: an integer from 0 to "
                                  "run.microbatches - 1", str(caught.exception))
                    self.assertIn("_microbatch", str(caught.exception))
            # Still usable: the last in-range microbatch runs.
            with planned.step():
                with planned.microbatch(1):
                    planned(inputs(1, 4)[0].requires_grad_(True)).sum().backward()
        finally:
            planned.close()


class PipelineOrderTest(unittest.TestCase):
    """Every stage of a pipeline in one process, each with its own runtime (its `stage`) and
    PlannedLayers over the same layers, stepped through its own stowage.pipeline_order; an op
    runs once the op it depends on has (the previous virtual stage's forward, the next one's
    backward). Each parameter's gradients accumulate in microbatch order, as in the unwrapped
    model's gradient accumulation, so they match bit for bit."""

    def run_schedule(self, schedule: str, pp: int, vpp: int, microbatches: int,
                     planner: bool = False) -> None:
        """planner: the plan is the C++ planner's evaluation of POLICIES on a pipelined profile
        (pipelined_profile), not the hand split of a one-stage plan."""
        reference = no_dropout(support.make_layers("attention", LAYERS, HIDDEN))
        layers = support.clone_layers(reference)
        if planner:
            profile = pipelined_profile(layers, inputs(1, 0)[0], pp, vpp)
            self.assertEqual(stowage.ModelProfile.from_dict(profile.to_dict()).to_dict(),
                             profile.to_dict())
            evaluation = stowage.evaluate(profile, POLICIES, microbatches=microbatches)
            plan = evaluation.plan
            want_split = pipelined(plans.plan_for(layers, inputs(1, 0)[0], POLICIES), schedule,
                                   pp, vpp, microbatches)
            self.assertEqual([l.host_bytes for l in plan.layers],
                             [l.host_bytes for l in want_split.layers])
            self.assertEqual([l.in_flight_microbatches for l in plan.layers],
                             [l.in_flight_microbatches for l in want_split.layers])
            self.assertEqual([(st.stage, [(c.first_layer, c.num_layers) for c in st.chunks])
                              for st in plan.stages],
                             [(st.stage, [(c.first_layer, c.num_layers) for c in st.chunks])
                              for st in want_split.stages])
            self.assertEqual([e["stage"] for e in evaluation.stages], list(range(pp)))
        else:
            base = plans.plan_for(layers, inputs(1, 0)[0], POLICIES)
            plan = pipelined(base, schedule, pp, vpp, microbatches)
        stages = [stowage.PlannedLayers(layers, plan, stage=s) for s in range(pp)]
        xs = inputs(microbatches, 5)
        want = reference_step(reference, xs, seed=0)
        orders = [stowage.pipeline_order(schedule, pp, vpp, microbatches, s) for s in range(pp)]
        last = pp * vpp - 1
        outputs, grads_in, losses, input_grads = {}, {}, [None] * microbatches, {}
        try:
            with contextlib.ExitStack() as steps:
                for st in stages:
                    steps.enter_context(st.step())
                at = [0] * pp
                while any(at[s] < len(orders[s]) for s in range(pp)):
                    ran = False
                    for s in range(pp):
                        if at[s] == len(orders[s]):
                            continue
                        op = orders[s][at[s]]
                        v, k = op.chunk * pp + s, op.microbatch
                        if op.forward and v > 0 and (v - 1, k) not in outputs:
                            continue
                        if not op.forward and v < last and (v + 1, k) not in grads_in:
                            continue
                        with stages[s].microbatch(k):
                            if op.forward:
                                src = xs[k] if v == 0 else outputs[(v - 1, k)][1]
                                x = src.detach().clone().requires_grad_(True)
                                outputs[(v, k)] = (x, stages[s][v](x))
                            else:
                                x, y = outputs[(v, k)]
                                if v == last:
                                    loss = support.loss_fn(y)
                                    loss.backward()
                                    losses[k] = loss.detach()
                                else:
                                    y.backward(grads_in.pop((v + 1, k)))
                                grads_in[(v, k)] = x.grad
                                if v == 0:
                                    input_grads[k] = x.grad
                        at[s] += 1
                        ran = True
                    self.assertTrue(ran, f"{schedule}: the stages' orders deadlock at {at}")
            got = (losses, [input_grads[k] for k in range(microbatches)], grads(layers))
            for what, a, b in zip(("loss", "input grad", "parameter grad"), want, got):
                for k, (u, v) in enumerate(zip(a, b)):
                    self.assertTrue(torch.equal(u, v), f"{schedule}: {what} {k} differs")
            for s, st in enumerate(stages):
                stats = st.stats()
                self.assertEqual(stats.saves_total, stats.restores_total, f"stage {s}")
                self.assertGreater(stats.saves_total, 0, f"stage {s}")
        finally:
            for st in stages:
                st.close()

    def test_one_f_one_b(self) -> None:
        # Stage 0 of 4 holds 4 microbatches of its layer at once, stage 3 one; 6 run per step.
        self.run_schedule("1f1b", 4, 1, 6)

    def test_interleaved(self) -> None:
        # 2 stages x 2 chunks; 4 microbatches run in groups of 2 through the chunks.
        self.run_schedule("interleaved", 2, 2, 4)

    def test_planned_from_a_pipelined_profile(self) -> None:
        # The planner's own plan of every stage (protocol fields, in-flight counts, arenas) runs
        # each stage's runtime through its schedule.
        self.run_schedule("1f1b", 4, 1, 6, planner=True)
        self.run_schedule("interleaved", 2, 2, 4, planner=True)

    def test_order_comes_from_the_library(self) -> None:
        order = stowage.pipeline_order("1f1b", 4, 1, 6, 0)
        self.assertEqual(" ".join(("F" if op.forward else "B") + str(op.microbatch)
                                  for op in order), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5")
        with self.assertRaises(stowage.StowageError) as caught:
            stowage.pipeline_order("interleaved", 2, 2, 3, 0)
        self.assertIn("run.microbatches", str(caught.exception))


class RuntimeMisuseTest(unittest.TestCase):
    """The C ABI's microbatch statuses through stowage.Runtime."""

    def test_each_misuse_is_its_own_error(self) -> None:
        layers = support.make_layers("mlp", 1, HIDDEN)
        base = plans.plan_for(layers, inputs(1, 0)[0], ["offload_input"])
        nbytes = base.layers[0].host_bytes
        src = torch.zeros(nbytes, dtype=torch.uint8)
        dst = torch.empty(nbytes, dtype=torch.uint8)
        base.run.microbatches = 3
        with stowage.Runtime(base, backend="host") as rt:
            rt.begin_step()
            a = rt.save(0, src.data_ptr(), nbytes, microbatch=0)
            cases = [
                (lambda: rt.save(0, src.data_ptr(), nbytes, microbatch=3), "INVALID_ARGUMENT",
                 "microbatch 3 of layer 0 is out of range"),
                (lambda: rt.save(0, src.data_ptr(), nbytes, microbatch=1), "RESOURCE_EXHAUSTED",
                 "one more in flight than planned: microbatch 0 in flight of the 1 the plan "
                 "holds"),
                (lambda: rt.restore(a, dst.data_ptr(), microbatch=2), "NOT_FOUND",
                 "microbatch 2 of layer 0 was never saved in this step"),
            ]
            for call, status, says in cases:
                with self.assertRaises(stowage.StowageError) as caught:
                    call()
                self.assertIn(status, str(caught.exception))
                self.assertIn(says, str(caught.exception))
            rt.restore(a, dst.data_ptr(), microbatch=0)
            b = rt.save(0, src.data_ptr(), nbytes, microbatch=1)  # the slot is free again
            rt.restore(b, dst.data_ptr())
            rt.end_step()


if __name__ == "__main__":
    unittest.main()
