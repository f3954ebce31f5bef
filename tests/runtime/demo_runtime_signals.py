"""Regressions for `stowage demo-runtime`, which once hung forever.

1. A plan with "copy_chunk_bytes": 2^64-1 made the first copy wrap to zero chunks, so the demo
   never finished and ignored SIGTERM. It is now refused up front: exit 2, the field named.
2. SIGTERM stops the demo inside the step it is in (the step is ended and released), and the
   demo exits 0 -- it used to look at the signal only between steps.
3. `--metrics-address=:PORT` (the host left out: 127.0.0.1) printed "http://:PORT/metrics", a URL
   nothing can open; the demo now prints the address it binds, and the URL answers.

Usage: demo_runtime_signals.py STOWAGE_BINARY
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

STOWAGE = ""


def run(args, **kwargs):
    return subprocess.run([STOWAGE, *args], capture_output=True, text=True, timeout=60, **kwargs)


class DemoRuntimeTest(unittest.TestCase):
    @staticmethod
    def saves(url: str) -> float:
        with urllib.request.urlopen(url, timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("stowage_offload_saves_total{"):
                    return float(line.split()[-1])
        return 0.0

    def test_a_wrapping_copy_chunk_is_refused_not_a_hang(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "plan.json")
            planned = run(["plan", "--model", "llama-3-8b", "--seq-len", "8192", "--out", path])
            self.assertEqual(planned.returncode, 0, planned.stderr)
            with open(path, encoding="utf-8") as f:
                plan = json.load(f)
            plan["runtime"]["copy_chunk_bytes"] = 2**64 - 1
            with open(path, "w", encoding="utf-8") as f:
                json.dump(plan, f)
            demo = run(["demo-runtime", "--plan", path, "--steps", "1",
                        "--metrics-address", "127.0.0.1:0"])
            self.assertEqual(demo.returncode, 2, demo.stdout + demo.stderr)
            self.assertIn("copy_chunk_bytes", demo.stderr)

    def test_sigterm_ends_the_step_it_interrupts(self) -> None:
        # One step takes about 45 layers x (0.5 s forward + 0.5 s backward): far longer than the
        # test waits before signalling, so the signal lands inside step 1.
        demo = subprocess.Popen(
            [STOWAGE, "demo-runtime", "--steps", "0", "--tokens", "1", "--layer-compute", "0.5",
             "--metrics-address", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            lines = []
            for line in demo.stdout:
                lines.append(line)
                if "Ctrl-C stops" in line:
                    break
            self.assertTrue(lines and "Ctrl-C stops" in lines[-1], "".join(lines))
            url = next(l.split()[-1] for l in lines if l.startswith("metrics endpoint:"))
            # Signal once step 1 is under way: its first saves are counted.
            deadline = time.monotonic() + 60
            while not self.saves(url) and time.monotonic() < deadline:
                time.sleep(0.05)
            demo.send_signal(signal.SIGTERM)
            out, err = demo.communicate(timeout=60)
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.wait()
        out = "".join(lines) + out
        self.assertEqual(demo.returncode, 0, out + err)
        self.assertIn("interrupted during step 1", out)
        self.assertNotIn("step 1:", out)  # the step did not run to its end
        self.assertIn("done: 1 steps", out)  # ...but was ended (and released)

    def test_a_port_without_a_host_prints_a_url_that_answers(self) -> None:
        demo = subprocess.Popen(
            [STOWAGE, "demo-runtime", "--steps", "1", "--step-interval", "0", "--hold", "60",
             "--metrics-address=:0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            url = ""
            for line in demo.stdout:
                if line.startswith("metrics endpoint:"):
                    url = line.split()[-1]
                    break
            self.assertRegex(url, r"^http://127\.0\.0\.1:[1-9][0-9]*/metrics$")
            with urllib.request.urlopen(url, timeout=10) as response:
                self.assertEqual(response.status, 200)
                self.assertIn("stowage_", response.read().decode())
        finally:
            demo.kill()
            demo.wait()


if __name__ == "__main__":
    STOWAGE = sys.argv.pop(1)
    unittest.main()
