"""`pip install python` works offline with pip's default build isolation (the package's
own standard-library backend, build_backend/stowage_build.py, needs nothing downloaded) and gives
an importable package that finds the runtime library: bundled into the package when the build
was told where it is, and through STOWAGE_LIBRARY when it was not. The installed-prefix case
(pkg-config) is tests/install's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import support

SOURCE = os.path.join(support.HERE, "..", "..", "python")

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
    def _install(self, tmp: str, name: str, *settings: str) -> str:
        # Build from a copy so the source tree gets no build/ or egg-info litter. Build isolation
        # stays on, as a user's `pip install` has it; --no-index makes any download an error.
        src = os.path.join(tmp, "src")
        if not os.path.isdir(src):
            shutil.copytree(SOURCE, src, ignore=shutil.ignore_patterns(
                "build", "*.egg-info", "__pycache__", "libstowage.so*"))
        site = os.path.join(tmp, name)
        command = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                   "--disable-pip-version-check", "--target", site, src]
        for setting in settings:
            command += ["--config-settings", setting]
        out = subprocess.run(command, capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return site

    def _probe(self, tmp: str, site: str, library_env: bool) -> str:
        env = dict(os.environ, PYTHONPATH=site)
        env.pop("LD_LIBRARY_PATH", None)
        if not library_env:
            env.pop("STOWAGE_LIBRARY")
        run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                             text=True, cwd=tmp, timeout=120)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("stats 1", run.stdout)
        self.assertIn(f"package {os.path.join(site, 'stowage')}", run.stdout)
        return run.stdout

    def test_offline_install_bundles_the_library(self) -> None:
        library = os.environ.get("STOWAGE_LIBRARY")
        if not library:
            self.skipTest("STOWAGE_LIBRARY is not set (CTest sets it to the built library)")
        with tempfile.TemporaryDirectory() as tmp:
            site = self._install(tmp, "bundled", f"stowage-library={library}")
            bundled = os.path.join(site, "stowage", os.path.basename(os.path.realpath(library)))
            self.assertTrue(os.path.isfile(bundled), os.listdir(os.path.join(site, "stowage")))
            # Found in the package directory with no environment variable at all.
            out = self._probe(tmp, site, library_env=False)
            self.assertIn(f"library {bundled}", out)

    def test_offline_install_without_the_library(self) -> None:
        library = os.environ.get("STOWAGE_LIBRARY")
        if not library:
            self.skipTest("STOWAGE_LIBRARY is not set (CTest sets it to the built library)")
        with tempfile.TemporaryDirectory() as tmp:
            site = self._install(tmp, "pure", "stowage-library=none")
            self.assertEqual([n for n in os.listdir(os.path.join(site, "stowage"))
                              if n.startswith("libstowage")], [])
            out = self._probe(tmp, site, library_env=True)
            self.assertIn(f"library {library}", out)

    def test_bad_library_setting_names_it(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "src")
            shutil.copytree(SOURCE, src, ignore=shutil.ignore_patterns("__pycache__"))
            out = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index",
                 "--disable-pip-version-check", "-w", tmp, src,
                 "--config-settings", "stowage-library=/nonexistent/libstowage.so"],
                capture_output=True, text=True, timeout=300)
            self.assertNotEqual(out.returncode, 0)
            self.assertIn("stowage-library='/nonexistent/libstowage.so' is not a file",
                          out.stdout + out.stderr)


if __name__ == "__main__":
    unittest.main()
