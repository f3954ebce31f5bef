"""The PyTorch integration on CPU with the runtime's host backend (the real libstowage.so, found
through STOWAGE_LIBRARY as CTest sets it): bit-identical training under every policy, memory
released every step, and errors that say what is wrong."""

from __future__ import annotations

import gc
import os
import unittest
import weakref

import support
import torch

import stowage
from stowage import _lib
from stowage import layers as stowage_layers
from stowage import plan as plan_mod
from stowage.planner import BudgetTooSmallError, evaluate
from stowage.measure.profile import profile_layers

torch.set_num_threads(1)  # deterministic and light on a shared 2-core machine

HIDDEN, TOKENS, LAYERS, STEPS = 32, 48, 4, 3
POLICIES = ["keep", "recompute", "offload_input", "offload_saved"]


def assert_same(test: unittest.TestCase, want: list, got: list, what: str) -> None:
    test.assertEqual(len(want), len(got))
    for step, ((l0, g0, x0), (l1, g1, x1)) in enumerate(zip(want, got)):
        test.assertTrue(torch.equal(l0, l1), f"{what}: loss differs at step {step}: {l0} vs {l1}")
        for k, (a, b) in enumerate(zip(g0, g1)):
            test.assertTrue(torch.equal(a, b), f"{what}: grad of parameter {k} differs at step "
                                               f"{step} (max diff {(a - b).abs().max()})")
        test.assertTrue(torch.equal(x0, x1), f"{what}: input grad differs at step {step}")


class Fixture:
    """One model kind: reference layers, their profile and the reference training run."""

    def __init__(self, kind: str):
        self.kind = kind
        self.layers = support.make_layers(kind, LAYERS, HIDDEN)
        torch.manual_seed(7)
        self.x0 = torch.randn(TOKENS, HIDDEN)
        self.profile = profile_layers(self.layers, self.x0, loss_fn=support.loss_fn, repeats=1)
        self.reference = support.train(support.clone_layers(self.layers), self.x0, STEPS)

    def plan(self, policies: list, **kwargs) -> stowage.Plan:
        """The plan of a given assignment, from the C++ planner (stowage_plan_evaluate)."""
        return evaluate(self.profile, policies, **kwargs).plan


_fixtures: dict = {}


def fixture(kind: str) -> Fixture:
    if kind not in _fixtures:
        _fixtures[kind] = Fixture(kind)
    return _fixtures[kind]


class BitIdenticalTest(unittest.TestCase):
    """Loss and every gradient equal, bit for bit, to the unwrapped model's, step after step."""

    def run_policies(self, kind: str, policies: list, **wrap_kwargs) -> stowage.PlannedLayers:
        f = fixture(kind)
        layers = support.clone_layers(f.layers)
        planned = stowage.PlannedLayers(layers, f.plan(policies), **wrap_kwargs)
        got = support.train(layers, f.x0, STEPS, planned=planned)
        assert_same(self, f.reference, got, f"{kind} {policies}")
        return planned

    def test_every_policy_mlp(self) -> None:
        for policy in POLICIES:
            with self.subTest(policy=policy):
                self.run_policies("mlp", [policy] * LAYERS).close()

    def test_every_policy_attention(self) -> None:
        for policy in POLICIES:
            with self.subTest(policy=policy):
                self.run_policies("attention", [policy] * LAYERS).close()

    def test_mixed_plan(self) -> None:
        for kind in ("mlp", "attention"):
            with self.subTest(kind=kind):
                self.run_policies(kind, ["offload_input", "offload_saved", "recompute",
                                         "keep"]).close()
                self.run_policies(kind, ["keep", "offload_saved", "offload_input",
                                         "offload_saved"]).close()

    def test_selective_recompute(self) -> None:
        f = fixture("attention")
        plan = f.plan(["selective_recompute"] + ["keep"] * (LAYERS - 1),
                      recompute_modules={0: ["mlp", "ln1"]})
        self.assertEqual(plan.layers[0].recompute_modules, ["ln1", "mlp"])
        keep = f.plan(["keep"] * LAYERS)
        self.assertLess(plan.layers[0].device_saved_bytes, keep.layers[0].device_saved_bytes)
        layers = support.clone_layers(f.layers)
        got = support.train(layers, f.x0, STEPS, planned=stowage.PlannedLayers(layers, plan))
        assert_same(self, f.reference, got, "selective_recompute")

    def test_verify_checksums(self) -> None:
        # The runtime checks every restored byte against the saved one.
        self.run_policies("mlp", ["offload_saved", "offload_input"] * (LAYERS // 2),
                          verify_checksums=True).close()

    def test_prefetch_distance(self) -> None:
        f = fixture("mlp")
        for distance in (1, 2, LAYERS):
            with self.subTest(distance=distance):
                plan = f.plan(["offload_saved"] * LAYERS, prefetch_distance=distance)
                layers = support.clone_layers(f.layers)
                planned = stowage.PlannedLayers(layers, plan)
                got = support.train(layers, f.x0, STEPS, planned=planned)
                assert_same(self, f.reference, got, f"prefetch distance {distance}")
                planned.close()


class MemoryReleasedTest(unittest.TestCase):
    def test_arena_empty_after_every_step(self) -> None:
        f = fixture("mlp")
        plan = f.plan(["offload_saved", "offload_input"] * (LAYERS // 2))
        layers = support.clone_layers(f.layers)
        planned = stowage.PlannedLayers(layers, plan)
        seen = []

        def after(step: int) -> None:
            s = planned.stats()
            seen.append(s)
            self.assertEqual(s.arena_used_bytes, 0, f"step {step}: arena still in use")
            self.assertEqual(s.copies_in_flight, 0)
            self.assertEqual(s.steps_completed, step + 1)
            self.assertLessEqual(s.arena_peak_bytes, plan.runtime.host_arena_bytes)
            self.assertEqual(s.errors_total, 0)
            # No growth: every step saves and restores the same bytes.
            self.assertEqual(s.saves_total, s.restores_total)
            if step:
                self.assertEqual(s.d2h_bytes_total - seen[-2].d2h_bytes_total,
                                 seen[0].d2h_bytes_total)
            self.assertIsNone(planned._state)

        support.train(layers, f.x0, 4, planned=planned, after_step=after)
        # The host bytes moved per step are exactly what the plan reserved.
        self.assertEqual(seen[0].d2h_bytes_total, plan.runtime.host_arena_bytes)
        self.assertEqual(seen[0].arena_peak_bytes, plan.runtime.host_arena_bytes)
        planned.close()

    def test_restored_tensors_die_with_the_graph(self) -> None:
        f = fixture("mlp")
        layers = support.clone_layers(f.layers)
        planned = stowage.PlannedLayers(layers, f.plan(["offload_saved"] * LAYERS))
        refs = []
        orig_get = stowage_layers._Stowed.get

        def spy(self_):  # type: ignore[no-untyped-def]
            t = orig_get(self_)
            refs.append(weakref.ref(t))
            return t

        stowage_layers._Stowed.get = spy
        try:
            with planned.step():
                support.loss_fn(planned(f.x0.clone().requires_grad_(True))).backward()
        finally:
            stowage_layers._Stowed.get = orig_get
        gc.collect()
        self.assertTrue(refs)
        self.assertEqual([r for r in refs if r() is not None], [],
                         "restored tensors outlived the step")
        planned.close()

    def test_exception_mid_step_leaves_nothing(self) -> None:
        f = fixture("mlp")
        layers = support.clone_layers(f.layers)
        planned = stowage.PlannedLayers(layers, f.plan(["offload_saved"] * LAYERS))
        with self.assertRaises(ValueError):
            with planned.step():
                y = planned(f.x0.clone().requires_grad_(True))
                raise ValueError("trainer failed between forward and backward")
        s = planned.stats()
        self.assertEqual(s.arena_used_bytes, 0)
        self.assertEqual(s.steps_completed, 1)
        # Backward through the abandoned graph fails clearly instead of reading freed memory.
        # (StaleTensorError, which torch 1.x turns into a RuntimeError on its way through C++.)
        with self.assertRaisesRegex(RuntimeError, "offloaded in a step that has ended"):
            support.loss_fn(y).backward()
        del y
        # And training goes on, still bit-identical.
        got = support.train(layers, f.x0, STEPS, planned=planned)
        assert_same(self, f.reference, got, "after an exception")
        planned.close()


class ErrorsTest(unittest.TestCase):
    def test_missing_library(self) -> None:
        saved = os.environ.get("STOWAGE_LIBRARY")
        try:
            _lib._reset_for_tests()
            os.environ["STOWAGE_LIBRARY"] = "/nonexistent/libstowage.so"
            with self.assertRaisesRegex(stowage.LibraryNotFoundError,
                                        r"STOWAGE_LIBRARY is '/nonexistent/libstowage.so'.*"
                                        r"cmake --build"):
                stowage.Runtime(fixture("mlp").plan(["offload_saved"] * LAYERS))
            # Unset, with nothing on the loader's path: says where it looked and how to fix it.
            del os.environ["STOWAGE_LIBRARY"]
            _lib._reset_for_tests()
            orig = _lib._candidates
            _lib._candidates = lambda: [("dynamic loader (LD_LIBRARY_PATH)",
                                         "libstowage-not-here.so")]
            try:
                with self.assertRaisesRegex(stowage.LibraryNotFoundError,
                                            r"not found.*STOWAGE_LIBRARY is not set.*"
                                            r"LD_LIBRARY_PATH"):
                    _lib.load()
            finally:
                _lib._candidates = orig
            # A library that is not stowage.
            os.environ["STOWAGE_LIBRARY"] = torch._C.__file__  # a shared library, not ours
            _lib._reset_for_tests()
            with self.assertRaisesRegex(stowage.LibraryNotFoundError, "not the stowage runtime"):
                _lib.load()
        finally:
            _lib._reset_for_tests()
            if saved is None:
                os.environ.pop("STOWAGE_LIBRARY", None)
            else:
                os.environ["STOWAGE_LIBRARY"] = saved
        self.assertTrue(stowage.version())

    def test_layer_count_mismatch(self) -> None:
        f = fixture("mlp")
        plan = f.plan(["keep"] * LAYERS)
        with self.assertRaisesRegex(stowage.PlanError, r"the plan has 4 layers but the model "
                                                       r"has 3"):
            stowage.PlannedLayers(support.clone_layers(f.layers)[:3], plan)

    def test_layer_size_mismatch(self) -> None:
        # A plan made for half the tokens reserves too little host memory per layer.
        f = fixture("mlp")
        small = profile_layers(f.layers, f.x0[: TOKENS // 2], repeats=1)
        plan = evaluate(small, ["offload_saved"] * LAYERS).plan
        planned = stowage.PlannedLayers(support.clone_layers(f.layers), plan)
        with self.assertRaisesRegex(stowage.PlanError,
                                    r"layer 0 \(MLPBlock, policy offload_saved\) offloads \d+ "
                                    r"bytes.*layers\[0\].host_bytes = \d+.*rebuild it"):
            with planned.step():
                planned(f.x0.clone().requires_grad_(True))
        self.assertEqual(planned.stats().arena_used_bytes, 0)
        planned.close()

    def test_budget_too_small(self) -> None:
        f = fixture("mlp")
        floor = evaluate(f.profile, ["offload_input"] * LAYERS).peak_device_bytes
        # Fixed memory alone exceeds the budget.
        with self.assertRaisesRegex(BudgetTooSmallError,
                                    rf"gpu_budget_bytes is 1000 .*smallest peak any plan "
                                    rf"reaches is {floor} .*what binds: fixed memory"):
            stowage.plan_for_budget(f.layers, f.x0, 1000, profile=f.profile)
        # Fixed memory fits, one layer's working set does not.
        budget = f.profile.fixed_device_bytes + 1
        with self.assertRaisesRegex(BudgetTooSmallError,
                                    rf"gpu_budget_bytes is {budget} .*smallest peak any plan "
                                    rf"reaches is {floor} .*what binds: working set of the ") as e:
            stowage.plan_for_budget(f.layers, f.x0, budget, profile=f.profile)
        # The closest plan comes with it (Note [Plans that do not fit]): every layer planned,
        # "fits" false, over the GPU budget by exactly its peak's excess; not a plan to run.
        closest = e.exception.closest
        self.assertIsNotNone(closest)
        self.assertFalse(closest.fits)
        self.assertEqual(len(closest.layers), LAYERS)
        self.assertEqual(closest.binding.budget, "gpu")
        self.assertEqual(closest.binding.exceeded_by_bytes,
                         closest.predicted.peak_device_bytes - budget)
        with self.assertRaisesRegex(Exception, "fits is false"):
            stowage.PlannedLayers(support.clone_layers(f.layers), closest)

    def test_forward_outside_step(self) -> None:
        f = fixture("mlp")
        planned = stowage.PlannedLayers(support.clone_layers(f.layers),
                                        f.plan(["offload_input"] * LAYERS))
        with self.assertRaisesRegex(RuntimeError, r"inside `with planned.step\(\):`"):
            planned(f.x0.clone().requires_grad_(True))
        with torch.no_grad():  # inference needs no step
            planned(f.x0)
        planned.close()

    def test_bad_plan_fields(self) -> None:
        d = fixture("mlp").plan(["offload_saved"] * LAYERS).to_dict()
        d["layers"][2]["policy"] = "spill"
        with self.assertRaisesRegex(stowage.PlanError, r"'layers\[2\].policy': unknown layer "
                                                       r"policy 'spill'; allowed: keep, recompute"):
            stowage.Plan.from_dict(d)
        d["layers"][2]["policy"] = "offload_saved"
        d["runtime"]["host_arena_bytes"] = 1
        with self.assertRaisesRegex(stowage.PlanError, r"'runtime.host_arena_bytes' is 1 but"):
            stowage.Plan.from_dict(d)
        # The runtime's own parser agrees on what a good plan is, and rejects a bad one.
        d["runtime"]["host_arena_bytes"] = 0
        with self.assertRaisesRegex(stowage.StowageError, r"INVALID_ARGUMENT.*host_arena_bytes"):
            stowage.Runtime(d, backend="host")

    def test_selective_recompute_unknown_module(self) -> None:
        f = fixture("mlp")
        plan = f.plan(["keep"] * LAYERS)
        plan.layers[0].policy = "selective_recompute"
        plan.layers[0].recompute_modules = ["attn"]
        planned = stowage.PlannedLayers(support.clone_layers(f.layers), plan)
        with self.assertRaisesRegex(stowage.PlanError, r"names 'attn'.*it has: ln, fc1"):
            planned(f.x0.clone().requires_grad_(True))


class PlannerTest(unittest.TestCase):
    """Plans and predictions come from the C++ planner through the C ABI."""

    def test_plans_fit_their_budget_and_train_identically(self) -> None:
        f = fixture("attention")
        floor = evaluate(f.profile, ["offload_input"] * LAYERS).peak_device_bytes
        keep = evaluate(f.profile, ["keep"] * LAYERS).peak_device_bytes
        self.assertLess(floor, keep)
        seen = set()
        for budget in (floor, (floor + keep) // 2, keep):
            with self.subTest(budget=budget):
                plan = stowage.plan_for_budget(f.layers, f.x0, budget, profile=f.profile)
                # The whole device: fixed memory is inside the budget.
                self.assertLessEqual(plan.predicted.peak_device_bytes, budget)
                self.assertEqual(plan.predicted.fixed_device_bytes, f.profile.fixed_device_bytes)
                self.assertEqual(plan.run.gpu_budget_bytes, budget)
                self.assertEqual(plan.runtime.host_arena_bytes,
                                 sum(l.host_bytes for l in plan.layers))
                seen.add(tuple(plan.policies()))
                # JSON round trip through the runtime's own parser.
                again = stowage.Plan.from_json(plan.to_json())
                self.assertEqual(again, plan)
                layers = support.clone_layers(f.layers)
                planned = stowage.PlannedLayers(layers, plan.to_json())
                got = support.train(layers, f.x0, STEPS, planned=planned)
                assert_same(self, f.reference, got, f"budget {budget}")
                planned.close()
        self.assertGreater(len(seen), 1, "every budget gave the same plan")

    def test_selective_recompute_is_planned_and_trains_identically(self) -> None:
        # No host memory: the planner must choose among keep, recompute and rerunning named
        # modules. The measured bytes as they are; module times set far below any layer's
        # forward (measured times on a busy machine are noisy), so that any plan with a full
        # recompute is slower than every plan of selective recomputes.
        f = fixture("attention")
        profile = f.profile.to_dict()
        least = min(l["forward_seconds"] for l in profile["layers"])
        for l in profile["layers"]:
            for m in l["modules"]:
                m["seconds"] = least / 1000
        keep = evaluate(profile, ["keep"] * LAYERS)
        selective = evaluate(profile, ["selective_recompute"] * LAYERS,
                             recompute_modules={i: ["mlp"] for i in range(LAYERS)})
        self.assertLess(selective.peak_device_bytes, keep.peak_device_bytes)
        plan = stowage.plan_for_budget(f.layers, f.x0, selective.peak_device_bytes,
                                       profile=stowage.ModelProfile.from_dict(profile),
                                       host_budget_bytes=0)
        self.assertLessEqual(plan.predicted.peak_device_bytes, selective.peak_device_bytes)
        self.assertFalse(plan.offloads)
        chosen = [l for l in plan.layers if l.policy == "selective_recompute"]
        self.assertTrue(chosen, f"no selective_recompute in {plan.policies()}")
        self.assertTrue(all(l.recompute_modules for l in chosen))
        layers = support.clone_layers(f.layers)
        got = support.train(layers, f.x0, STEPS, planned=stowage.PlannedLayers(layers, plan))
        assert_same(self, f.reference, got, "planned selective_recompute")

    def test_prediction_orders_the_policies(self) -> None:
        f = fixture("mlp")
        # Copies far faster than any layer: the ordering does not hang on the measured link.
        profile = f.profile.to_dict()
        profile["link"] = {"d2h_bytes_per_second": 1e13, "h2d_bytes_per_second": 1e13}
        sim = {p: evaluate(profile, [p] * LAYERS) for p in POLICIES}
        peak = {p: s.peak_device_bytes for p, s in sim.items()}
        self.assertGreater(peak["keep"], peak["offload_saved"])
        self.assertGreater(peak["keep"], peak["recompute"])
        self.assertGreaterEqual(peak["recompute"], peak["offload_input"])
        # Recompute reruns every forward; keeping costs no extra compute or copies.
        self.assertGreater(sim["recompute"].step_seconds, sim["keep"].step_seconds)
        self.assertEqual(sim["keep"].host_bytes, 0)
        self.assertEqual(sim["keep"].copies, [])
        self.assertEqual(sim["offload_input"].host_bytes,
                         sum(p.input_bytes for p in f.profile.layers))
        self.assertEqual(sim["offload_saved"].host_bytes,
                         sum(p.saved_bytes for p in f.profile.layers))
        # The recorded step: every layer's forward and backward, and a D2H and an H2D per layer.
        s = sim["offload_saved"]
        forward = [c["layer"] for c in s.compute if c["phase"] == "forward"]
        backward = [c["layer"] for c in s.compute if c["phase"] == "backward"]
        self.assertEqual(forward, list(range(LAYERS)))
        self.assertEqual(backward, list(reversed(range(LAYERS))))
        self.assertEqual(sorted((c["layer"], c["direction"]) for c in s.copies),
                         sorted((i, d) for i in range(LAYERS) for d in ("d2h", "h2d")))
        # Prefetch at distance d: layer i's copy starts when layer min(i + d, last)'s backward does.
        plan = evaluate(f.profile, ["offload_saved"] * LAYERS, prefetch_distance=2).plan
        self.assertEqual([l.prefetch_after_layer for l in plan.layers], [2, 3, 3, 3])

    def test_profile_json_is_what_the_cli_plans(self) -> None:
        import subprocess
        import tempfile
        f = fixture("mlp")
        cli = os.environ.get("STOWAGE_CLI")
        if not cli:
            self.skipTest("STOWAGE_CLI is not set (ctest sets it)")
        # --gpu-mem is in GiB, at least 0.001: these layers fit several times over beside the
        # fixed memory (the cuBLAS workspaces a profile counts: TORCH_CUBLAS_WORKSPACES_BYTES).
        budget = f.profile.fixed_device_bytes + (2 << 20)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "profile.json")
            f.profile.save(path)
            out = subprocess.run([cli, "plan", "--profile", path, "--gpu-mem",
                                  repr(budget / 2**30), "--format", "json"],
                                 check=True, capture_output=True, text=True).stdout
        from_cli = stowage.Plan.from_json(out)
        from_abi = stowage.plan_for_budget(f.layers, f.x0, from_cli.run.gpu_budget_bytes,
                                           profile=f.profile)
        self.assertEqual(from_cli.policies(), from_abi.policies())
        self.assertEqual(from_cli.predicted.peak_device_bytes,
                         from_abi.predicted.peak_device_bytes)

    def test_plan_file_round_trip(self) -> None:
        import tempfile
        f = fixture("mlp")
        plan = f.plan(["offload_input", "offload_saved", "recompute", "keep"])
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "plan.json")
            plan.save(path)
            self.assertEqual(stowage.Plan.load(path), plan)
            planned = stowage.PlannedLayers(support.clone_layers(f.layers), path)
            self.assertEqual(planned.plan, plan)
            planned.close()

    def test_wrap_with_budget_profiles_without_side_effects(self) -> None:
        f = fixture("mlp")
        layers = support.clone_layers(f.layers)
        rng = torch.get_rng_state()
        floor = evaluate(f.profile, ["offload_input"] * LAYERS).peak_device_bytes
        recompute = evaluate(f.profile, ["recompute"] * LAYERS).peak_device_bytes
        budget = (floor + recompute) // 2  # full recompute does not fit: something offloads
        planned = stowage.wrap(layers, gpu_budget_bytes=budget, sample_input=f.x0,
                               loss_fn=support.loss_fn)
        self.assertTrue(torch.equal(rng, torch.get_rng_state()), "profiling moved the RNG")
        self.assertTrue(all(p.grad is None for p in layers.parameters()),
                        "profiling left gradients")
        self.assertTrue(planned.plan.offloads)
        self.assertLessEqual(planned.plan.predicted.peak_device_bytes, budget)
        got = support.train(layers, f.x0, STEPS, planned=planned)
        assert_same(self, f.reference, got, "wrap(gpu_budget_bytes=...)")
        planned.close()

    def test_old_budget_argument_is_a_clear_error(self) -> None:
        f = fixture("mlp")
        with self.assertRaisesRegex(TypeError, r"budget_bytes= is now gpu_budget_bytes=, the "
                                               r"whole device memory"):
            stowage.wrap(support.clone_layers(f.layers), budget_bytes=1 << 20, sample_input=f.x0)

    def test_profile_records_modules_and_saved_tensors(self) -> None:
        f = fixture("attention")
        for p in f.profile.layers:
            self.assertTrue(p.saves_input)
            names = [t.name for t in p.saved]
            self.assertEqual(len(names), len(set(names)))
            self.assertIn("mlp", [m.name for m in p.modules])
            self.assertTrue(all(t.module in {m.name for m in p.modules} | {""} for t in p.saved))
        d = f.profile.to_dict()
        self.assertEqual(d["format"], "stowage-layer-profile")
        self.assertFalse(d["measured_memory"])  # CPU: estimated from sizes
        self.assertEqual(stowage.ModelProfile.from_dict(d).to_dict(), d)


class RuntimeBindingTest(unittest.TestCase):
    def test_save_restore_round_trip(self) -> None:
        plan = stowage.Plan(
            layers=[plan_mod.LayerPlan(index=0, type="raw", policy="offload_saved",
                                       host_bytes=16384, prefetch_after_layer=0,
                                       transfers=[plan_mod.Transfer("a", 16384)])],
            # Four chunks of the smallest allowed size (kMinCopyChunkBytes).
            runtime=plan_mod.RuntimeSettings(host_arena_bytes=16384, copy_chunk_bytes=4096))
        with stowage.Runtime(plan, backend="host") as rt:
            src = torch.arange(4096, dtype=torch.int32)
            dst = torch.zeros_like(src)
            rt.begin_step()
            tid = rt.save(0, src.data_ptr(), 16384)
            rt.save_wait(tid)
            self.assertTrue(rt.save_query(tid))
            with self.assertRaisesRegex(stowage.StowageError, "RESOURCE_EXHAUSTED"):
                rt.save(0, src.data_ptr(), 16384)
            rt.prefetch(tid, dst.data_ptr())
            rt.restore(tid, dst.data_ptr())
            self.assertTrue(torch.equal(src, dst))
            with self.assertRaisesRegex(stowage.StowageError, "FAILED_PRECONDITION"):
                rt.restore(tid, dst.data_ptr())
            rt.end_step()
            s = rt.stats()
            self.assertEqual((s.saves_total, s.restores_total, s.arena_used_bytes), (1, 1, 0))
            self.assertEqual(s.backend, "host")
            with self.assertRaisesRegex(stowage.StowageError, "NOT_FOUND|FAILED_PRECONDITION"):
                rt.restore(tid, dst.data_ptr())
        self.assertTrue(rt.closed)


if __name__ == "__main__":
    unittest.main()
