"""stowage.Plan is a thin typed view: its validation is the C ABI's (stowage_plan_validate), so
it refuses what the C++ reader refuses, in the C++ reader's words. Also the regressions of plan
text vs path, non-UTF-8 files and ctypes truncating out-of-range integers."""

from __future__ import annotations

import ctypes
import json
import os
import re
import socket
import tempfile
import unittest
import urllib.request

import support  # noqa: F401  (puts the package on sys.path)

import stowage
from stowage import plan as plan_mod


def small_plan() -> stowage.Plan:
    return stowage.Plan(
        layers=[plan_mod.LayerPlan(index=0, type="t", policy="keep", device_saved_bytes=10),
                plan_mod.LayerPlan(index=1, type="t", policy="offload_input", host_bytes=4096,
                                   transfers=[plan_mod.Transfer("input", 4096)],
                                   prefetch_after_layer=1)],
        runtime=plan_mod.RuntimeSettings(host_arena_bytes=4096))


def two_stage_plan() -> stowage.Plan:
    """Two 1F1B stages of one offloading layer each, 4 microbatches: stage 0 holds 2 of its
    layer at once, stage 1 one (Note [Pipeline stages] in include/stowage/plan.h)."""
    layers = [plan_mod.LayerPlan(index=i, type="t", policy="offload_input", host_bytes=4096,
                                 transfers=[plan_mod.Transfer("input", 4096)],
                                 save_wait_before_layer=i + 1, prefetch_after_layer=i,
                                 in_flight_microbatches=2 - i) for i in range(2)]
    stages = [plan_mod.StagePlan(stage=s, chunks=[plan_mod.LayerRange(s, 1)], embedding=s == 0,
                                 lm_head=s == 1, host_arena_bytes=4096 * (2 - s))
              for s in range(2)]
    return stowage.Plan(layers=layers, stages=stages,
                        run=plan_mod.RunSettings(pp=2, microbatches=4),
                        runtime=plan_mod.RuntimeSettings(host_arena_bytes=8192))


def mtp_plan() -> stowage.Plan:
    """Two decoder layers and one MTP layer (Note [MTP layers] in include/stowage/plan.h): the
    last run.mtp_layers layers are named mtp.0, ... and run at the end of the last chunk; here
    the MTP layer offloads its two inputs like any other offloading layer."""
    layers = [plan_mod.LayerPlan(index=0, type="mla+moe", device_saved_bytes=10),
              plan_mod.LayerPlan(index=1, type="mla+moe", device_saved_bytes=10),
              plan_mod.LayerPlan(index=2, type="mtp+mla+moe", name="mtp.0",
                                 policy="offload_input", host_bytes=8192,
                                 transfers=[plan_mod.Transfer("input", 8192)],
                                 save_wait_before_layer=3, prefetch_after_layer=2)]
    return stowage.Plan(layers=layers, run=plan_mod.RunSettings(mtp_layers=1),
                        runtime=plan_mod.RuntimeSettings(host_arena_bytes=8192))


class PlanViewTest(unittest.TestCase):
    def test_the_jobs_gpus_and_global_batch_round_trip(self) -> None:
        # run.gpus and run.global_batch: the job the plan assumed; 0 where a plan does not say.
        plan = mtp_plan()
        self.assertEqual((plan.run.gpus, plan.run.global_batch), (0, 0))
        plan.run.gpus, plan.run.global_batch = 64, 8
        again = stowage.Plan.from_json(plan.to_json())
        self.assertEqual((again.run.gpus, again.run.global_batch), (64, 8))
        d = plan.to_dict()
        del d["run"]["gpus"], d["run"]["global_batch"]  # a plan written before them
        self.assertEqual(stowage.Plan.from_dict(d).run.gpus, 0)
        d["run"]["global_batch"] = 1 << 41
        with self.assertRaisesRegex(stowage.PlanError, r"'run.global_batch' has value"):
            stowage.Plan.from_dict(d)

    def test_sequence_parallel_round_trips_written_only_when_false(self) -> None:
        # run.sequence_parallel (plan.h Plan::sequence_parallel): absent means True, and a plan
        # with it is written without the key, as PlanToJson writes it (its bytes and hash kept).
        plan = small_plan()
        self.assertIs(plan.run.sequence_parallel, True)
        self.assertNotIn("sequence_parallel", plan.to_dict()["run"])
        plan.run.tp = 8
        plan.run.sequence_parallel = False
        text = plan.to_json()
        self.assertIs(json.loads(text)["run"]["sequence_parallel"], False)
        again = stowage.Plan.from_json(text)
        self.assertIs(again.run.sequence_parallel, False)
        self.assertEqual(again, plan)
        d = plan.to_dict()
        del d["run"]["sequence_parallel"]
        self.assertIs(stowage.Plan.from_dict(d).run.sequence_parallel, True)
        d["run"]["sequence_parallel"] = "no"  # the C++ reader takes a JSON bool only
        with self.assertRaisesRegex(stowage.PlanError, r"run.sequence_parallel"):
            stowage.Plan.from_dict(d)

    def test_mtp_layer_round_trips_and_runs(self) -> None:
        plan = mtp_plan()
        plan.validate()
        again = stowage.Plan.from_json(plan.to_json())
        self.assertEqual(again, plan)
        self.assertEqual(again.layers[2].name, "mtp.0")
        self.assertEqual(again.run.mtp_layers, 1)
        self.assertIn("mtp.0", plan.table())
        d = plan.to_dict()
        d["run"]["mtp_layers"] = 0
        with self.assertRaisesRegex(stowage.PlanError,
                                    r"'layers\[2\].name' is 'mtp.0'; allowed: none"):
            stowage.Plan.from_dict(d)
        # The runtime takes the MTP layer as one more layer: its bytes go out and come back.
        with stowage.Runtime(plan, backend="host", copy_threads=1, metrics_address="") as rt:
            src = ctypes.create_string_buffer(bytes(range(256)) * 32, 8192)
            dst = ctypes.create_string_buffer(8192)
            rt.begin_step()
            tid = rt.save(2, ctypes.addressof(src), 8192)
            rt.save_wait(tid)
            rt.restore(tid, ctypes.addressof(dst))
            rt.end_step()
            self.assertEqual(dst.raw, src.raw)

    def test_pipeline_stages_round_trip(self) -> None:
        plan = two_stage_plan()
        plan.validate()
        self.assertEqual(stowage.Plan.from_json(plan.to_json()), plan)
        self.assertEqual(plan.stages[1].layer_indices(), [1])
        d = plan.to_dict()
        d["layers"][0]["in_flight_microbatches"] = 1
        with self.assertRaisesRegex(stowage.PlanError,
                                    r"'layers\[0\].in_flight_microbatches' has value 1; "
                                    r"allowed: 2"):
            stowage.Plan.from_dict(d)

    def test_runtime_loads_its_stage(self) -> None:
        plan = two_stage_plan()
        with stowage.Runtime(plan, backend="host", copy_threads=1, metrics_address="",
                             stage=1) as rt:
            buf = ctypes.create_string_buffer(4096)
            rt.begin_step()
            with self.assertRaisesRegex(stowage.StowageError,
                                        r"layer 0 runs on pipeline stage 0; this runtime runs "
                                        r"stage 1"):
                rt.save(0, ctypes.addressof(buf), 4096)
            rt.save_wait(rt.save(1, ctypes.addressof(buf), 4096))
            rt.end_step()
        with self.assertRaisesRegex(stowage.StowageError, r"options->stage is 2; allowed: 0 to 1"):
            stowage.Runtime(plan, backend="host", copy_threads=1, metrics_address="", stage=2)

    def test_runtime_step_buckets_option(self) -> None:
        # The histogram bounds reach the C library as one option; a list of numbers is joined.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{probe.getsockname()[1]}"
        with stowage.Runtime(small_plan(), backend="host", copy_threads=1,
                             metrics_address=address, metrics_step_buckets=[0.5, 2.5]):
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
                text = response.read().decode()
        self.assertEqual(re.findall(r'stowage_step_duration_seconds_bucket\{.*le="([^"]+)"', text),
                         ["0.5", "2.5", "+Inf"])
        with self.assertRaisesRegex(stowage.StowageError,
                                    r"options->metrics_step_buckets '2,1': bound 2 \(1\) is not "
                                    r"above bound 1 \(2\); allowed: upper bounds in seconds"):
            stowage.Runtime(small_plan(), backend="host", copy_threads=1, metrics_address="",
                            metrics_step_buckets="2,1")

    def test_a_plan_that_does_not_fit_keeps_its_binding_and_is_not_run(self) -> None:
        # Note [Plans that do not fit] in include/stowage/plan.h: a view that dropped `fits`
        # would turn the closest plan into one the runtime runs.
        plan = small_plan()
        plan.predicted.peak_device_bytes = 5000
        plan.run.gpu_budget_bytes = 4000
        plan.fits = False
        plan.binding = plan_mod.Binding(budget="gpu", exceeded_by_bytes=1000, at="backward of "
                                        "layer 1", what="fixed memory", explanation="test")
        plan.validate()
        again = stowage.Plan.from_json(plan.to_json())
        self.assertEqual(again, plan)
        self.assertFalse(again.fits)
        self.assertEqual(again.binding.exceeded_by_bytes, 1000)
        with self.assertRaisesRegex(stowage.StowageError, r"fits is false: the plan exceeds its "
                                                          r"gpu budget by 1000 bytes") as e:
            stowage.Runtime(again, backend="host", copy_threads=1, metrics_address="")
        self.assertEqual(e.exception.status, "FAILED_PRECONDITION")
        plan.binding.exceeded_by_bytes = 999
        with self.assertRaisesRegex(stowage.PlanError, r"binding.exceeded_by_bytes' has value "
                                                       r"999; allowed: 1000"):
            plan.validate()

    def test_round_trip(self) -> None:
        plan = small_plan()
        plan.validate()
        self.assertEqual(stowage.Plan.from_json(plan.to_json()), plan)
        self.assertEqual(stowage.Plan.from_dict(plan.to_dict()), plan)
        self.assertEqual(stowage.Plan.from_json(plan.to_json().encode()), plan)

    def test_messages_are_the_cpp_readers(self) -> None:
        d = small_plan().to_dict()
        d["layers"][1]["host_bytes"] = 1.5
        with self.assertRaisesRegex(stowage.PlanError,
                                    r"^plan: field 'layers\[1\].host_bytes' has value 1.5; "
                                    r"allowed: an integer in \[0, 1152921504606846976\]$"):
            stowage.Plan.from_dict(d)

    def test_regressions_of_loose_numbers(self) -> None:
        # Each was accepted (and read as something else) by the old Python reader.
        cases = [
            (("layers", 1, "host_bytes"), -4096, r"'layers\[1\].host_bytes' has value -4096"),
            (("layers", 0, "index"), True, r"'layers\[0\].index' has value true"),
            (("schema_version",), 1.9, r"'schema_version' has value 1.9"),
            (("schema_version",), 2**32 + 1, r"'schema_version' has value 4294967297"),
            (("runtime", "copy_chunk_bytes"), 1, r"'runtime.copy_chunk_bytes' has value 1; "
                                                 r"allowed: an integer in \[4096, 1073741824\]"),
            (("runtime", "copy_chunk_bytes"), 2**64 - 1, r"'runtime.copy_chunk_bytes' has value"),
            (("layers", 1, "d2h_seconds"), float("nan"), r"not valid JSON"),
        ]
        for path, value, message in cases:
            with self.subTest(path=path, value=value):
                d = small_plan().to_dict()
                target = d
                for key in path[:-1]:
                    target = target[key]
                target[path[-1]] = value
                with self.assertRaisesRegex(stowage.PlanError, message):
                    stowage.Plan.from_dict(d)

    def test_wrapped_transfer_sum(self) -> None:
        d = small_plan().to_dict()
        d["layers"][0]["transfers"] = [{"name": "a", "bytes": 2**64 - 1}, {"name": "b", "bytes": 1}]
        with self.assertRaisesRegex(stowage.PlanError, r"transfers\[0\].bytes' has value "
                                                       r"18446744073709551615"):
            stowage.Plan.from_dict(d)

    def test_validate_checks_a_plan_built_in_python(self) -> None:
        plan = small_plan()
        plan.layers[1].host_bytes = 4097  # transfers no longer sum to it
        with self.assertRaisesRegex(stowage.PlanError, r"'layers\[1\].transfers' sum to 4096 "
                                                       r"bytes but host_bytes is 4097"):
            plan.validate()
        plan = small_plan()
        plan.layers[1].host_bytes = 4096.0  # a float where an integer is meant is not rounded
        with self.assertRaisesRegex(stowage.PlanError,
                                    r"'layers\[1\].host_bytes' has value 4096.0"):
            plan.validate()

    def test_view_fills_defaults_like_the_cpp_reader(self) -> None:
        d = small_plan().to_dict()
        del d["layers"][1]["transfers"]  # one "input" transfer of host_bytes
        d["runtime"] = {"host_arena_bytes": 4096}
        d["unknown_future_field"] = [1, 2]
        plan = stowage.Plan.from_dict(d)
        self.assertEqual(plan.layers[1].transfers, [plan_mod.Transfer("input", 4096)])
        self.assertEqual(plan.runtime.copy_chunk_bytes, 16 << 20)
        self.assertIsInstance(plan.predicted.step_seconds, float)

    def test_duplicate_keys(self) -> None:
        text = small_plan().to_json().replace('"schema_version": 1,',
                                              '"schema_version": 1, "schema_version": 2,')
        with self.assertRaisesRegex(stowage.PlanError, r"duplicate key 'schema_version'"):
            stowage.Plan.from_json(text)

    def test_from_json_takes_text_not_paths(self) -> None:
        with self.assertRaisesRegex(stowage.PlanError, r"not valid JSON at line 1, column 1"):
            stowage.Plan.from_json("plan.json")
        with self.assertRaises(TypeError):
            stowage.Plan.from_json(None)  # type: ignore[arg-type]


class PlanFileTest(unittest.TestCase):
    def test_load_non_utf8_file_is_a_plan_error_naming_it(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "latin1.json")
            with open(path, "wb") as f:
                f.write(small_plan().to_json().replace('"t"', '"\xe9"').encode("latin-1"))
            with self.assertRaisesRegex(stowage.PlanError, rf"^{path}: plan: not UTF-8 text"):
                stowage.Plan.load(path)

    def test_load_with_bom(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "bom.json")
            with open(path, "wb") as f:
                f.write(b"\xef\xbb\xbf" + small_plan().to_json().encode())
            self.assertEqual(stowage.Plan.load(path), small_plan())

    def test_plan_like_text_or_path(self) -> None:
        from stowage.runtime import plan_json_text
        text = small_plan().to_json()
        # A JSON array, or text behind a BOM, is text (and then refused or read), never a path:
        # both used to be opened as file names ("File name too long").
        self.assertEqual(plan_json_text("\ufeff" + text), "\ufeff" + text)
        array = json.dumps([small_plan().to_dict()] * 50)
        self.assertEqual(plan_json_text(array), array)
        with self.assertRaisesRegex(stowage.StowageError, r"expected a JSON object, found \["):
            stowage.Runtime(array, backend="host")
        with self.assertRaisesRegex(stowage.PlanError, r"plan 'no-such-plan.json' is neither plan "
                                                       r"JSON text .* nor a readable plan file"):
            plan_json_text("no-such-plan.json")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "plan.json")
            small_plan().save(path)
            self.assertEqual(plan_json_text(path), text)
            with open(path, "wb") as f:
                f.write(b"\xff\xfe{")
            with self.assertRaisesRegex(stowage.PlanError, r"not UTF-8 text"):
                plan_json_text(path)


class RuntimeArgumentRangeTest(unittest.TestCase):
    def test_out_of_range_integers_are_refused_before_ctypes(self) -> None:
        # ctypes wraps silently: nbytes=2**64 reached the C ABI as 0.
        with stowage.Runtime(small_plan(), backend="host") as rt:
            rt.begin_step()
            buf = bytearray(4096)
            import ctypes
            ptr = ctypes.addressof((ctypes.c_char * 4096).from_buffer(buf))
            for kwargs, message in [
                ({"nbytes": 2**64}, r"nbytes is 18446744073709551616; allowed: an integer in "
                                    r"\[0, 18446744073709551615\]"),
                ({"nbytes": -1}, r"nbytes is -1"),
                ({"layer": 2**31}, r"layer is 2147483648"),
            ]:
                with self.subTest(**kwargs):
                    args = {"layer": 1, "src": ptr, "nbytes": 16, **kwargs}
                    with self.assertRaisesRegex(ValueError, message):
                        rt.save(**args)
            with self.assertRaisesRegex(TypeError, r"nbytes is 1.5"):
                rt.save(1, ptr, 1.5)  # type: ignore[arg-type]
            with self.assertRaisesRegex(ValueError, r"tensor_id is -1"):
                rt.save_wait(-1)
            with self.assertRaisesRegex(ValueError, r"nbytes is 18446744073709551616"):
                rt.report_device_peak(2**64)
            tid = rt.save(1, ptr, 16)
            rt.save_wait(tid)
            rt.end_step()
        with self.assertRaisesRegex(ValueError, r"copy_chunk_bytes is 18446744073709551616"):
            stowage.Runtime(small_plan(), backend="host", copy_chunk_bytes=2**64)


if __name__ == "__main__":
    unittest.main()
