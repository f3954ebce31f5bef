"""The step as Chrome trace-event JSON (Note [Step trace tracks], plan/chrome_trace.h): the
planner's predicted step (`stowage plan --trace`) and the runtime's measured one
(Runtime.trace_json) pass a check of the trace-event format (trace_event_format.py), carry what the
plan says, and use the same tracks and names so the two files overlay."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import unittest

import support

import stowage
import trace_event_format

COPY_TRACKS = ("D2H", "H2D")


def _tracks(doc: dict) -> dict:
    """(pid, tid) -> track name, from the thread_name metadata."""
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def _spans(doc: dict, track: str) -> list:
    """Complete events on the track and its lanes ("D2H", "D2H 2", ...)."""
    names = _tracks(doc)
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and
            names.get((e["pid"], e["tid"]), "").split(" ")[0] == track]


class PredictedTraceTest(unittest.TestCase):
    def test_reference_plan(self) -> None:
        cli = os.environ.get("STOWAGE_CLI")
        if not cli or not os.path.exists(cli):
            self.skipTest("STOWAGE_CLI is not set (CTest sets it to the built `stowage` CLI)")
        with tempfile.TemporaryDirectory() as tmp:
            trace_path, plan_path = os.path.join(tmp, "t.json"), os.path.join(tmp, "p.json")
            out = subprocess.run([cli, "plan", "--trace", trace_path, "--out", plan_path],
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            with open(trace_path) as f:
                doc = json.load(f)
            with open(plan_path) as f:
                plan = json.load(f)
        self.assertEqual(trace_event_format.problems(doc), [])
        compute = _spans(doc, "compute")
        for layer in plan["layers"]:
            i = layer["index"]
            mine = [e for e in compute if e["args"].get("layer") == i]
            names = {e["name"] for e in mine}
            self.assertIn(f"forward {i}", names)
            self.assertIn(f"backward {i}", names)
            self.assertEqual(f"recompute {i}" in names, layer["recompute_seconds"] > 0, i)
            self.assertEqual({e["args"]["policy"] for e in mine}, {layer["policy"]})
        # Every offloaded byte goes down and comes back once.
        host = {l["index"]: l["host_bytes"] for l in plan["layers"] if l["host_bytes"] > 0}
        self.assertTrue(host, "the reference plan offloads")
        for track in COPY_TRACKS:
            got = {}
            for e in _spans(doc, track):
                got[e["args"]["layer"]] = got.get(e["args"]["layer"], 0) + e["args"]["bytes"]
            self.assertEqual(got, host, track)
        # The step ends where the plan says.
        end = max(e["ts"] + e["dur"] for e in compute)
        self.assertAlmostEqual(end / 1e6, plan["predicted"]["step_seconds"], places=6)
        counter = [e for e in doc["traceEvents"] if e["ph"] == "C"]
        self.assertEqual(max(e["args"]["bytes"] for e in counter),
                         plan["predicted"]["peak_device_bytes"])

    def test_checker_catches_broken_traces(self) -> None:
        ok = {"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]}
        self.assertEqual(trace_event_format.problems(ok), [])
        for broken in (
                {"events": []},
                {"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 1, "ts": 0}]},
                {"traceEvents": [{"name": "a", "ph": "Q", "pid": 1, "tid": 1, "ts": 0}]},
                {"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 1, "ts": -1, "dur": 1}]},
                {"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 5},
                                 {"name": "b", "ph": "X", "pid": 1, "tid": 1, "ts": 2, "dur": 5}]},
                {"traceEvents": [{"name": "m", "ph": "C", "pid": 1, "ts": 0, "args": {"x": "y"}}]}):
            self.assertNotEqual(trace_event_format.problems(broken), [], broken)


class MeasuredTraceTest(unittest.TestCase):
    def test_runtime_step(self) -> None:
        import torch
        torch.manual_seed(0)
        layers = torch.nn.ModuleList([support.MLPBlock(32) for _ in range(4)])
        x = torch.randn(16, 32)
        policies = ["offload_input", "offload_saved", "keep", "offload_saved"]
        from stowage.planner import evaluate
        from stowage.measure.profile import profile_layers
        profile = profile_layers(layers, x, loss_fn=support.loss_fn, repeats=1)
        ev = evaluate(profile, policies)
        planned = stowage.PlannedLayers(layers, ev.plan, backend="host", copy_threads=2,
                                        trace_capacity=4096)
        try:
            support.train(layers, x, 1, planned=planned, record=False)
            events = planned.runtime.trace().events
            doc = json.loads(planned.runtime.trace_json())
        finally:
            planned.close()
        self.assertEqual(trace_event_format.problems(doc), [])
        pids = {e["pid"] for e in doc["traceEvents"]}
        self.assertEqual(pids, {os.getpid()})
        # One span per tensor copy, each landed, with the tensor's bytes.
        for track, issued in (("D2H", "save_issued"), ("H2D", "prefetch_issued")):
            want = sorted((e.layer, e.bytes) for e in events if e.kind == issued)
            spans = _spans(doc, track)
            self.assertTrue(want)
            self.assertEqual(sorted((s["args"]["layer"], s["args"]["bytes"]) for s in spans),
                             want, track)
            self.assertTrue(all(s["args"].get("landed", True) for s in spans))
        waits = [e for e in doc["traceEvents"] if e["ph"] == "i"]
        self.assertEqual(len(waits), sum(e.kind in ("save_wait", "restore") for e in events))
        # The tracks are the predicted trace's (same names, so the two files overlay).
        self.assertTrue({"compute", "stall", "waits", "D2H", "H2D"} <=
                        set(_tracks(doc).values()))


if __name__ == "__main__":
    unittest.main()
