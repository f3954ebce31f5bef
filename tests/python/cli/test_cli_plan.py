"""Plans written by the C++ planner (`stowage plan`) read in Python, field for field: the plan
JSON is one contract on both sides. CTest passes the CLI as STOWAGE_CLI."""

from __future__ import annotations

import json
import os
import subprocess
import unittest

import support  # noqa: F401  (puts the package on sys.path)

import stowage


class CliPlanTest(unittest.TestCase):
    def test_cli_plan_loads(self) -> None:
        cli = os.environ.get("STOWAGE_CLI")
        if not cli:
            self.skipTest("STOWAGE_CLI is not set (CTest sets it to the built `stowage` CLI)")
        if not os.path.exists(cli):
            self.skipTest(f"STOWAGE_CLI is {cli}, which is not built yet")
        out = subprocess.run(
            [cli, "plan", "--model", "llama-3-8b", "--seq-len", "32K", "--hardware", "h200",
             "--cp", "1", "--gpus", "8", "--format", "json"],
            capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        plan = stowage.Plan.from_json(out.stdout)
        raw = json.loads(out.stdout)
        self.assertEqual(len(plan.layers), len(raw["layers"]))
        self.assertEqual(plan.policies(), [l["policy"] for l in raw["layers"]])
        self.assertEqual(plan.runtime.host_arena_bytes, raw["runtime"]["host_arena_bytes"])
        self.assertEqual(plan.predicted.peak_device_bytes, raw["predicted"]["peak_device_bytes"])
        # Written back, it is the same plan.
        self.assertEqual(stowage.Plan.from_json(plan.to_json()), plan)


if __name__ == "__main__":
    unittest.main()
