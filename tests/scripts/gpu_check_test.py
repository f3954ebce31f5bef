"""scripts/gpu-check: the packaged folder, its dependency check and its step runner (no GPU needed).

Packages from the build tree ctest runs in (STOWAGE_BUILD_DIR) instead of building a release tree,
so the test costs seconds. Run by ctest as scripts_gpu_check (tests/scripts/CMakeLists.txt).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Optional

SOURCE_DIR = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
GPU_CHECK = os.path.join(SOURCE_DIR, "scripts", "gpu-check")
RUNNER = os.path.join(SOURCE_DIR, "scripts", "gpu_check", "run.py")
BUILD_DIR = os.environ.get("STOWAGE_BUILD_DIR", os.path.join(SOURCE_DIR, "build", "dev"))


def load(name: str, path: str):
    loader = importlib.machinery.SourceFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


run = load("gpu_check_run", RUNNER)


def packageable() -> str:
    """Why BUILD_DIR is not a tree to package, or "" when it is."""
    cli = os.path.join(BUILD_DIR, "cli", "stowage")
    if not os.path.isfile(cli):
        return f"{cli} is not built"
    needed = run.read_elf(cli).needed
    if not any(n.startswith("libcudart") for n in needed):
        return f"{BUILD_DIR} has no CUDA backend to package"
    # A sanitizer tree is not what goes to a GPU machine: its binaries are several times larger
    # and its libstowage.so cannot be dlopen()ed without preloading the sanitizer runtime.
    if any(re.match(r"lib(a|ub|t)san\.so", n) for n in needed):
        return f"{BUILD_DIR} is a sanitizer build"
    return ""


def gpu_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, GPU_CHECK, *args], capture_output=True, text=True,
                          timeout=600)


def runner(root: str, *args: str, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(root, "run"), *args], capture_output=True,
                          text=True, timeout=300, env=env)


def without_site_packages(tmp: str) -> dict:
    """An environment whose `python3` is this interpreter without site-packages (`-S`).

    The runner probes the environment before the first step (torch's import among them) and
    counts that against the budget; on a loaded machine importing torch took more than a
    small test budget, so a test of the runner's own timing gave a different answer under
    load. Without site-packages the torch probe fails at once and the steps still run."""
    bin_dir = os.path.join(tmp, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    shim = os.path.join(bin_dir, "python3")
    with open(shim, "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    os.chmod(shim, 0o755)
    return dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))


@unittest.skipIf(packageable(), packageable())
class PackagedFolderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="gpu-check-test-")
        cls.root = os.path.join(cls.tmp, "gpu-check")
        cls.packaging = gpu_check("--build-dir", BUILD_DIR, "--out", cls.root, "--dry-run")

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def copy(self) -> str:
        """A copy of the packaged folder that a test may break."""
        dest = tempfile.mkdtemp(prefix="gpu-check-copy-", dir=self.tmp)
        shutil.rmtree(dest)
        shutil.copytree(self.root, dest)
        return dest

    def test_packaging_and_dry_run_pass(self) -> None:
        out = self.packaging
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("dry run OK", out.stdout)
        self.assertIn("highest symbol versions needed: GLIBC_2.", out.stdout)

    def test_every_gpu_test_of_the_build_is_a_step(self) -> None:
        listed = json.loads(subprocess.run(
            ["ctest", "--test-dir", BUILD_DIR, "--show-only=json-v1", "-L", "gpu"],
            capture_output=True, text=True, check=True).stdout)["tests"]
        with open(os.path.join(self.root, "steps.json")) as f:
            steps = json.load(f)["steps"]
        names = [s["name"] for s in steps]
        argv = " ".join(" ".join(s["argv"]) for s in steps)
        for t in listed:
            cmd = t["command"]
            gtest = [a for a in cmd if a.startswith("--gtest_filter=")]
            if gtest:
                self.assertIn(os.path.basename(cmd[0]), names)
                self.assertIn(gtest[0].split("=", 1)[1], argv)  # its filter is in the step's
            else:
                self.assertIn(t["name"], names)
        # Then the fixed steps, in the order docs/gpu-check.md gives, and each listed by --dry-run.
        self.assertEqual(names[-8:], ["bench_grouped_mm (torch._grouped_mm)", "calibrate",
                                      "plan with the calibrated profile",
                                      "bench_moe_block (Qwen3-MoE block)",
                                      "bench_sdpa (attention rates)",
                                      "bench_hf_step (measured steps by op class)",
                                      "bench offload (cuda)", "bench_torch (anchor size)"])
        # calibrate folds in the file the torch._grouped_mm benchmark writes.
        by_name = {s["name"]: s for s in steps}
        written = by_name["bench_grouped_mm (torch._grouped_mm)"]["argv"]
        read = by_name["calibrate"]["argv"]
        self.assertEqual(written[written.index("--out") + 1],
                         read[read.index("--torch-grouped-mm") + 1])
        for s in steps:
            self.assertRegex(self.packaging.stdout,
                             r"\[\s*%d s\] .*%s" % (s["timeout_s"], re.escape(s["name"])))
        self.assertIn("--tokens 32768", argv)
        self.assertIn("--backend=cuda", argv)

    def test_the_folder_carries_its_libraries(self) -> None:
        libs = set(os.listdir(os.path.join(self.root, "lib")))
        for needed in run.read_elf(os.path.join(self.root, "bin", "stowage")).needed:
            if not run.is_base_system_library(needed):
                self.assertIn(needed, libs)
        self.assertIn("libstowage.so", libs)
        for rel in ("run", "steps.json", "bench/bench_torch.py", "bench/bench_grouped_mm.py",
                    "bench/bench_moe_block.py", "bench/bench_sdpa.py", "bench/bench_hf_step.py",
                    "tests/planner/data/measured/hf-h200.jsonl",
                    "tests/planner/data/measured/llama-8layer.config.json",
                    "tests/python/run_tests.py",
                    "tests/python/package/test_torch_gpu.py", "python/stowage/__init__.py"):
            self.assertTrue(os.path.isfile(os.path.join(self.root, rel)), rel)
        info = run.read_elf(os.path.join(self.root, "bin", "stowage"))
        self.assertEqual(info.runpath, ["$ORIGIN/../lib"])
        # No path of the build machine in what the device reads.
        with open(os.path.join(self.root, "steps.json")) as f:
            self.assertNotIn(SOURCE_DIR, f.read())

    def test_elf_reader_agrees_with_readelf(self) -> None:
        if shutil.which("readelf") is None:
            self.skipTest("no readelf")
        for rel in ("bin/stowage", "lib/libstowage.so", "lib/libprometheus-cpp-core.so.1.0"):
            path = os.path.join(self.root, rel)
            text = subprocess.run(["readelf", "-dW", path], capture_output=True, text=True,
                                  check=True).stdout
            info = run.read_elf(path)
            self.assertEqual(info.needed, re.findall(r"\(NEEDED\).*\[(.*)\]", text), rel)
            runpath = re.findall(r"\(RUNPATH\).*\[(.*)\]", text)
            self.assertEqual(info.runpath, runpath[0].split(":") if runpath else [], rel)
            versions = subprocess.run(["readelf", "-VW", path], capture_output=True, text=True,
                                      check=True).stdout
            self.assertEqual(sorted({v for vs in info.version_needs.values() for v in vs}),
                             sorted(set(re.findall(r"Name: (\S+)\s+Flags", versions))), rel)

    def test_loads_where_only_the_base_system_libraries_exist(self) -> None:
        """The device in miniature: a mount namespace whose system library folder holds only the
        base-system libraries. Every packaged binary must start and libstowage.so must load."""
        if os.geteuid() != 0 or shutil.which("unshare") is None or subprocess.run(
                ["unshare", "-m", "true"], capture_output=True).returncode != 0:
            self.skipTest("needs root and mount namespaces (unshare -m)")
        if shutil.which("cc") is None:
            self.skipTest("no C compiler for the dlopen probe")
        ldd = subprocess.run(["ldd", os.path.join(self.root, "bin", "stowage")],
                             capture_output=True, text=True, check=True).stdout
        libc = re.search(r"libc\.so\.6 => (\S+)", ldd).group(1)
        system_dir = os.path.dirname(os.path.realpath(libc))
        base = os.path.join(self.tmp, "base-system")
        os.makedirs(base, exist_ok=True)
        for name in sorted(run.BASE_SYSTEM_LIBRARIES - {"libcuda.so.1"}):
            src = os.path.join(system_dir, name)
            if os.path.exists(src):
                shutil.copy(os.path.realpath(src), os.path.join(base, name))
        probe = os.path.join(self.tmp, "dlopen_probe")
        with open(probe + ".c", "w") as f:
            f.write('#include <dlfcn.h>\n#include <stdio.h>\n'
                    'int main(int argc, char** argv) {\n'
                    '  void* h = dlopen(argv[1], RTLD_NOW);\n'
                    '  if (!h) { printf("dlopen: %s\\n", dlerror()); return 1; }\n'
                    '  const char* (*v)(void) =\n'
                    '      (const char* (*)(void))dlsym(h, "stowage_version");\n'
                    '  printf("libstowage %s\\n", v ? v() : "?");\n  return v ? 0 : 1;\n}\n')
        subprocess.run(["cc", "-o", probe, probe + ".c", "-ldl"], check=True)
        commands = [f"{self.root}/bin/stowage version",
                    f"{probe} {self.root}/lib/libstowage.so"]
        for name in sorted(os.listdir(os.path.join(self.root, "bin"))):
            if name != "stowage":
                commands.append(f"{self.root}/bin/{name} --gtest_list_tests >/dev/null")
        script = f"mount --bind {base} {system_dir} && " + " && ".join(commands)
        out = subprocess.run(["unshare", "-m", "--", "/bin/sh", "-c", script],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("libstowage ", out.stdout)
        # And the namespace did hide the rest: a Debian library outside the base set is gone.
        hidden = subprocess.run(["unshare", "-m", "--", "/bin/sh", "-c", f"mount --bind {base} "
                                 f"{system_dir} && test ! -e {system_dir}/libhwloc.so.15"])
        self.assertEqual(hidden.returncode, 0)

    def test_the_runner_runs_a_packaged_gtest_binary(self) -> None:
        out_dir = os.path.join(self.tmp, "report-gtest")
        out = runner(self.root, "--only", "^offload_calibrate_gpu_test$", out_dir)
        with open(os.path.join(out_dir, "results.json")) as f:
            (step,) = json.load(f)["steps"]
        # Without a GPU its two tests (the host link, the compute rates) skip themselves; with
        # one they pass. Either way each ran, once.
        m = re.search(r"(\d+) passed, (\d+) failed, (\d+) skipped", step["detail"])
        self.assertIsNotNone(m, step)
        passed, failed, skipped = (int(g) for g in m.groups())
        self.assertEqual((passed + skipped, failed), (2, 0), step)
        self.assertEqual(step["status"], "pass" if passed else "skip")
        self.assertEqual(out.returncode, 0 if passed else 1)
        with open(os.path.join(out_dir, "report.md")) as f:
            report = f.read()
        self.assertIn("CalibrateGpu.WritesAMeasuredProfile", report)
        self.assertIn("every ELF file resolves each library it needs", report)

    def test_a_removed_library_is_named(self) -> None:
        root = self.copy()
        os.remove(os.path.join(root, "lib", "libhwloc.so.15"))
        out = runner(root, "--dry-run")
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertIn("dry run FAILED", out.stdout)
        self.assertRegex(out.stdout, r"bin/stowage: needs libhwloc\.so\.15, which is not in the "
                                     r"folder on its run path \(RUNPATH \$ORIGIN/\.\./lib\)")

    def test_a_run_path_outside_the_folder_is_a_problem(self) -> None:
        root = self.copy()
        target = os.path.join(root, "bin", "stowage")
        subprocess.run(["patchelf", "--set-rpath", "/usr/local/cuda/lib64", target], check=True)
        out = runner(root, "--dry-run")
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertIn("bin/stowage: RUNPATH entry '/usr/local/cuda/lib64' lies outside the folder",
                      out.stdout)
        self.assertIn("bin/stowage: needs libhwloc.so.15", out.stdout)

    def test_a_folder_over_the_size_limit_fails_and_leaves_nothing(self) -> None:
        packager = load("gpu_check_packager", GPU_CHECK)
        packager.MAX_FOLDER_BYTES = 2**20
        root = os.path.join(self.tmp, "too-big")
        with self.assertRaisesRegex(packager.PackagingError,
                                    r"MiB, over the 1 MiB a device call can carry; largest: "
                                    r"(bin|lib)/\S+ [0-9.]+ MiB"):
            packager.package(BUILD_DIR, root)
        self.assertFalse(os.path.exists(root))
        self.assertFalse(os.path.exists(root + ".partial"))

    def test_refuses_to_replace_a_folder_that_is_not_its_own(self) -> None:
        other = tempfile.mkdtemp(dir=self.tmp)
        with open(os.path.join(other, "precious.txt"), "w") as f:
            f.write("keep me")
        out = gpu_check("--build-dir", BUILD_DIR, "--out", other)
        self.assertEqual(out.returncode, 1)
        self.assertIn("is not a gpu-check folder", out.stderr)
        self.assertTrue(os.path.isfile(os.path.join(other, "precious.txt")))


class StepRunnerTest(unittest.TestCase):
    """The runner on a folder of fake steps (plain Python programs)."""

    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="gpu-check-runner-")
        self.root = os.path.join(self.tmp, "folder")
        self.out = os.path.join(self.tmp, "out")
        os.makedirs(self.root)
        shutil.copy(RUNNER, os.path.join(self.root, "run"))
        self.env = without_site_packages(self.tmp)

    def tearDown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write_steps(self, steps: list, budget: float = 60) -> None:
        with open(os.path.join(self.root, "steps.json"), "w") as f:
            json.dump({"budget_s": budget, "manifest": {}, "steps": steps}, f)

    def results(self) -> dict:
        with open(os.path.join(self.out, "results.json")) as f:
            return {s["name"]: s for s in json.load(f)["steps"]}

    def test_an_overrunning_step_is_killed_and_recorded(self) -> None:
        pid_file = os.path.join(self.tmp, "grandchild.pid")
        # The step starts a grandchild and sleeps: both must go when its limit passes.
        hang = ("import subprocess, sys, time\n"
                "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
                f"open({pid_file!r}, 'w').write(str(p.pid))\n"
                "print('hanging', flush=True)\n"
                "time.sleep(300)\n")
        self.write_steps([
            {"name": "hangs", "argv": ["{python}", "-c", hang], "timeout_s": 2},
            {"name": "after", "argv": ["{python}", "-c", "print('table row 1')"], "timeout_s": 30},
            {"name": "fails", "argv": ["{python}", "-c", "raise SystemExit(4)"], "timeout_s": 30},
            {"name": "skips", "argv": ["{python}", "-c", "raise SystemExit(77)"], "timeout_s": 30,
             "skip_return_code": 77},
        ])
        out = runner(self.root, self.out, env=self.env)
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        got = self.results()
        self.assertEqual(got["hangs"]["status"], "timeout")
        self.assertEqual(got["after"]["status"], "pass")
        self.assertEqual(got["fails"]["status"], "fail")
        self.assertEqual(got["skips"]["status"], "skip")
        with open(pid_file) as f:
            grandchild = int(f.read())
        self.assertFalse(alive(grandchild), "the timed-out step's grandchild survived")
        with open(os.path.join(self.out, "report.md")) as f:
            report = f.read()
        self.assertIn("| 1 | hangs | **timeout** |", report)
        self.assertIn("table row 1", report)  # a step's output is in the report
        self.assertIn("hanging", report)  # and so is what a killed step printed

    def test_the_budget_cuts_and_skips_steps(self) -> None:
        # The budget counts from the start, the environment probes included; without
        # site-packages they take well under a second, so 25 s leave the first step its cut.
        self.write_steps([
            {"name": "long", "argv": ["{python}", "-c", "import time; time.sleep(300)"],
             "timeout_s": 200},
            {"name": "never", "argv": ["{python}", "-c", "pass"], "timeout_s": 10},
        ], budget=25)
        out = runner(self.root, self.out, env=self.env)
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        got = self.results()
        self.assertEqual(got["long"]["status"], "timeout")
        self.assertIn("cut from 200 s: budget", got["long"]["detail"])
        self.assertEqual(got["never"]["status"], "not run")

    def test_the_report_goes_to_OUT_and_bad_arguments_fail_clearly(self) -> None:
        self.write_steps([{"name": "ok", "argv": ["{python}", "-c", "pass"], "timeout_s": 30}])
        env = dict(self.env, OUT=self.out)
        out = subprocess.run([sys.executable, os.path.join(self.root, "run")], env=env,
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertTrue(os.path.isfile(os.path.join(self.out, "report.md")))
        env.pop("OUT")
        out = subprocess.run([sys.executable, os.path.join(self.root, "run")], env=env,
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 2)
        self.assertIn("give the report folder", out.stderr)
        out = runner(self.root, "--only", "nothing-matches", self.out, env=self.env)
        self.assertEqual(out.returncode, 2)
        self.assertIn("matches no step", out.stderr)


def alive(pid: int) -> bool:
    """True when `pid` still runs after its signal had time to land (a zombie counts as gone)."""
    for _ in range(100):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return False
        except OSError:
            return False
        time.sleep(0.1)
    return True


if __name__ == "__main__":
    unittest.main(verbosity=2)
