"""`pip install runtime/python` gives an importable package that finds the runtime library,
both through STOWAGE_LIBRARY and as a copy inside the installed package directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import support

SOURCE = os.path.join(support.HERE, "..", "..", "runtime", "python")

PROBE = """
import os, sys, stowage
from stowage import _lib
plan = stowage.Plan(layers=[stowage.LayerPlan(index=0, type="t", policy="keep")])
with stowage.Runtime(plan, backend="host") as rt:
    rt.begin_step(); rt.end_step()
    print("stats", rt.stats().steps_completed)
print("package", os.path.dirname(stowage.__file__))
print("library", _lib.loaded_path())
"""


class PipInstallTest(unittest.TestCase):
    def test_install_and_find_library(self) -> None:
        library = os.environ.get("STOWAGE_LIBRARY")
        if not library:
            self.skipTest("STOWAGE_LIBRARY is not set (CTest sets it to the built library)")
        with tempfile.TemporaryDirectory() as tmp:
            # Build from a copy so the source tree gets no build/ or egg-info litter.
            src = os.path.join(tmp, "src")
            shutil.copytree(SOURCE, src, ignore=shutil.ignore_patterns(
                "build", "*.egg-info", "__pycache__", "libstowage.so*"))
            site = os.path.join(tmp, "site")
            out = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                 "--no-index", "--disable-pip-version-check", "--target", site, src],
                capture_output=True, text=True, timeout=300)
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
            env = dict(os.environ, PYTHONPATH=site)
            # Through STOWAGE_LIBRARY.
            run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                                 text=True, cwd=tmp, timeout=120)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            self.assertIn("stats 1", run.stdout)
            self.assertIn(f"package {os.path.join(site, 'stowage')}", run.stdout)
            # From the package directory, with STOWAGE_LIBRARY unset.
            shutil.copy(library, os.path.join(site, "stowage", "libstowage.so"))
            env.pop("STOWAGE_LIBRARY")
            run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                                 text=True, cwd=tmp, timeout=120)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            self.assertIn(f"library {os.path.join(site, 'stowage', 'libstowage.so')}",
                          run.stdout)


if __name__ == "__main__":
    unittest.main()
