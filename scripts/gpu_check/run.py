#!/usr/bin/env python3
"""Runs stowage's GPU check on a GPU machine and writes one Markdown report.

This file is copied by scripts/gpu-check into the folder it packages, as `run`; the steps come from
that folder's steps.json (derived from the build: its `gpu`-labelled tests, then calibrate, the
offload benchmark and the PyTorch benchmark).

    ./run [OUT]             run every step, write OUT/report.md (OUT: the argument, else $OUT)
    ./run --dry-run         print the steps with their time limits and check the folder: every
                            ELF file must find each library it needs inside the folder (through its
                            own $ORIGIN run path) or among the base system's
    ./run --only REGEX      run only the steps whose name matches (a rerun after a timeout)
    ./run --budget SECONDS  total wall-clock budget (default: steps.json's, 8 minutes)

Every step has its own time limit; a step that overruns is killed with its whole process group,
recorded as `timeout`, and the next step runs. When the budget is spent the remaining steps are
recorded as `not run`. The report is rewritten after every step, so it exists whatever happens.
Exit status: 0 when every step passed, 1 otherwise (a skip counts: on a GPU machine a skip means
the GPU was not visible), 2 for bad arguments or a broken folder.

Standard library only (Python 3.8+): the device machine has nothing else we can count on.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

# ---- the base system ----------------------------------------------------------------------------
# Libraries the device machine provides itself: glibc's, GCC's runtime, and the CUDA driver (and
# the toolkit's runtime, though the folder carries its own libcudart so that no CUDA install path
# matters). Everything else an ELF file needs must be inside the folder.
BASE_SYSTEM_LIBRARIES = frozenset([
    "libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libpthread.so.0", "libdl.so.2",
    "librt.so.1", "ld-linux-x86-64.so.2", "libcuda.so.1",
])
BASE_SYSTEM_PATTERNS = (re.compile(r"libcudart\.so\.\d+$"),)

# The oldest base system the folder must run on: Ubuntu 24.04 (glibc 2.39, GCC 14's libstdc++).
# A binary that needs a newer symbol version than these would fail to load there.
TARGET_SYSTEM = "Ubuntu 24.04"
TARGET_VERSIONS = {"GLIBC": (2, 39), "GLIBCXX": (3, 4, 33), "CXXABI": (1, 3, 15)}
VERSION_FAMILY_OF_FILE = {
    "libc.so.6": "GLIBC", "libm.so.6": "GLIBC", "libpthread.so.0": "GLIBC", "libdl.so.2": "GLIBC",
    "librt.so.1": "GLIBC", "ld-linux-x86-64.so.2": "GLIBC", "libstdc++.so.6": None,
}

REPORT_RESERVE_S = 5  # kept back from the budget for writing the report
MIN_STEP_S = 3  # a step with less time than this left is not started
OUTPUT_LINES_IN_REPORT = 200  # per step; the full output is in logs/


def is_base_system_library(name: str) -> bool:
    return name in BASE_SYSTEM_LIBRARIES or any(p.match(name) for p in BASE_SYSTEM_PATTERNS)


# ---- ELF: NEEDED, RPATH, RUNPATH, SONAME and symbol version needs -------------------------------
class ElfError(Exception):
    pass


class ElfInfo:
    def __init__(self) -> None:
        self.needed: List[str] = []
        self.rpath: List[str] = []
        self.runpath: List[str] = []
        self.soname: Optional[str] = None
        self.version_needs: Dict[str, List[str]] = {}  # library file -> versions, e.g. GLIBC_2.34


DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 14, 15, 29
DT_VERNEED, DT_VERNEEDNUM = 0x6FFFFFFE, 0x6FFFFFFF
PT_LOAD, PT_DYNAMIC = 1, 2


def is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def read_elf(path: str) -> ElfInfo:
    """Reads the dynamic section of a 64-bit little-endian ELF file (x86-64 and aarch64)."""
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse_elf(data, path)
    except (struct.error, IndexError, ValueError) as e:
        raise ElfError(f"{path}: malformed ELF file ({e})") from e
    finally:
        data.close()


def _parse_elf(data, path: str) -> ElfInfo:
    if data[:4] != b"\x7fELF":
        raise ElfError(f"{path}: not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ElfError(f"{path}: ELF class {data[4]}, data {data[5]}; only 64-bit little-endian "
                       "(class 2, data 1) is supported")
    (_, _, _, _, phoff, _, _, _, phentsize, phnum, _, _, _) = struct.unpack_from(
        "<HHIQQQIHHHHHH", data, 16)
    loads: List[Tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: Optional[Tuple[int, int]] = None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    info = ElfInfo()
    if dynamic is None:
        return info  # statically linked: needs nothing

    def offset_of(vaddr: int) -> int:
        for v, off, size in loads:
            if v <= vaddr < v + size:
                return off + (vaddr - v)
        raise ValueError(f"address {vaddr:#x} is in no loaded segment")

    entries: List[Tuple[int, int]] = []
    off, end = dynamic[0], dynamic[0] + dynamic[1]
    while off + 16 <= end:
        tag, val = struct.unpack_from("<qQ", data, off)
        off += 16
        if tag == DT_NULL:
            break
        entries.append((tag, val))
    tags = dict(entries)
    if DT_STRTAB not in tags:
        raise ValueError("dynamic section without DT_STRTAB")
    strtab = offset_of(tags[DT_STRTAB])

    def string(index: int) -> str:
        start = strtab + index
        stop = data.find(b"\0", start)
        if stop < 0:
            raise ValueError(f"unterminated string at {start}")
        return data[start:stop].decode("utf-8", "replace")

    for tag, val in entries:
        if tag == DT_NEEDED:
            info.needed.append(string(val))
        elif tag == DT_SONAME:
            info.soname = string(val)
        elif tag == DT_RPATH:
            info.rpath = [p for p in string(val).split(":") if p]
        elif tag == DT_RUNPATH:
            info.runpath = [p for p in string(val).split(":") if p]
    if DT_VERNEED in tags:
        need = offset_of(tags[DT_VERNEED])
        for _ in range(tags.get(DT_VERNEEDNUM, 0)):
            _, vn_cnt, vn_file, vn_aux, vn_next = struct.unpack_from("<HHIII", data, need)
            versions = info.version_needs.setdefault(string(vn_file), [])
            aux = need + vn_aux
            for _ in range(vn_cnt):
                _, _, _, vna_name, vna_next = struct.unpack_from("<IHHII", data, aux)
                versions.append(string(vna_name))
                aux += vna_next
            if vn_next == 0:
                break
            need += vn_next
    return info


def _version_tuple(text: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def _fmt_version(family: str, version: Tuple[int, ...]) -> str:
    return f"{family}_{'.'.join(str(v) for v in version)}"


def check_folder(root: str) -> Tuple[List[str], List[str]]:
    """Checks that every ELF file under `root` loads on the target system without LD_LIBRARY_PATH.

    Returns (problems, notes). A library counts as found when a file of that name lies in a run
    path directory of the file that needs it (RUNPATH, else RPATH; $ORIGIN expanded) inside the
    folder, or when it is a base-system library. Run path entries outside the folder are problems
    too: on the device they would be searched first, or name a path of the build machine.
    """
    root = os.path.realpath(root)
    problems: List[str] = []
    elf_files = 0
    needed_total = 0
    highest: Dict[str, Tuple[int, ...]] = {}
    highest_where: Dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path) or not os.path.isfile(path) or not is_elf(path):
                continue
            try:
                info = read_elf(path)
            except ElfError as e:
                problems.append(str(e))
                continue
            elf_files += 1
            origin = os.path.dirname(path)
            search = info.runpath or info.rpath
            which = "RUNPATH" if info.runpath else "RPATH"
            dirs = []
            for entry in search:
                expanded = entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
                resolved = os.path.realpath(expanded)
                if resolved != root and not resolved.startswith(root + os.sep):
                    problems.append(f"{rel}: {which} entry {entry!r} lies outside the folder")
                    continue
                dirs.append(resolved)
            for lib in info.needed:
                needed_total += 1
                if is_base_system_library(lib):
                    continue
                if any(os.path.isfile(os.path.join(d, lib)) for d in dirs):
                    continue
                shown = ":".join(search) if search else "none"
                problems.append(f"{rel}: needs {lib}, which is not in the folder on its run path "
                                f"({which} {shown}) and is not a base-system library")
            for lib, versions in info.version_needs.items():
                for v in versions:
                    m = re.match(r"(GLIBC|GLIBCXX|CXXABI)_([0-9.]+)$", v)
                    if not m:
                        continue
                    family, number = m.group(1), _version_tuple(m.group(2))
                    if family == "GLIBC" and VERSION_FAMILY_OF_FILE.get(lib, "") != "GLIBC":
                        continue
                    if number > highest.get(family, ()):
                        highest[family] = number
                        highest_where[family] = rel
    notes = [f"{elf_files} ELF files, {needed_total} NEEDED entries"]
    versions = []
    for family, target in TARGET_VERSIONS.items():
        if family not in highest:
            continue
        got = highest[family]
        versions.append(_fmt_version(family, got))
        if got > target:
            problems.append(f"{highest_where[family]}: needs {_fmt_version(family, got)}, newer "
                            f"than {TARGET_SYSTEM}'s {_fmt_version(family, target)}")
    if versions:
        notes.append("highest symbol versions needed: " + ", ".join(versions) + f" ({TARGET_SYSTEM}"
                     " has " + ", ".join(_fmt_version(f, v) for f, v in TARGET_VERSIONS.items())
                     + ")")
    return problems, notes


# ---- steps --------------------------------------------------------------------------------------
class Step:
    def __init__(self, spec: dict):
        self.name: str = spec["name"]
        self.group: str = spec.get("group", "")
        self.argv: List[str] = list(spec["argv"])
        self.cwd: str = spec.get("cwd", "{work}")
        self.env: Dict[str, str] = dict(spec.get("env", {}))
        self.timeout_s: float = float(spec["timeout_s"])
        self.skip_return_code: Optional[int] = spec.get("skip_return_code")
        self.gtest_json: Optional[str] = spec.get("gtest_json")
        self.note: str = spec.get("note", "")
        # Filled in by the run.
        self.status = "not run"
        self.detail = ""
        self.returncode: Optional[int] = None
        self.seconds = 0.0
        self.limit_used = 0.0
        self.log = ""


def expand(text: str, values: Dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def load_steps(root: str) -> Tuple[dict, List[Step]]:
    path = os.path.join(root, "steps.json")
    try:
        with open(path) as f:
            spec = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"run: cannot read {path}: {e}")
    return spec, [Step(s) for s in spec["steps"]]


def find_python() -> Optional[str]:
    return shutil.which("python3") or shutil.which("python")


def check_steps(root: str, steps: List[Step], values: Dict[str, str]) -> List[str]:
    """Every step's program and working directory exist in the folder (or are the PATH python)."""
    problems = []
    for s in steps:
        program = s.argv[0]
        if program == "{python}":
            if not values.get("python"):
                problems.append(f"step {s.name}: needs python3 on PATH; there is none")
            for arg in s.argv[1:]:
                if arg.startswith("{root}/") and arg.endswith(".py"):
                    if not os.path.isfile(expand(arg, values)):
                        problems.append(f"step {s.name}: script {arg} is missing from the folder")
            continue
        path = expand(program, values)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            problems.append(f"step {s.name}: program {program} is missing or not executable")
        if s.cwd.startswith("{root}") and not os.path.isdir(expand(s.cwd, values)):
            problems.append(f"step {s.name}: working directory {s.cwd} is missing")
    return problems


class Interrupted(Exception):
    pass


def _on_signal(signum, _frame):
    raise Interrupted(f"signal {signum}")


def run_step(step: Step, values: Dict[str, str], limit: float, log_path: str) -> None:
    """Runs one step under `limit` seconds; a step that overruns is killed with its group."""
    env = dict(os.environ)
    for key, value in step.env.items():
        value = expand(value, values)
        if key == "PYTHONPATH" and env.get("PYTHONPATH"):
            value = value + os.pathsep + env["PYTHONPATH"]
        env[key] = value
    argv = [expand(a, values) for a in step.argv]
    cwd = expand(step.cwd, values)
    step.limit_used = limit
    step.log = os.path.relpath(log_path, values["out"])
    start = time.monotonic()
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.flush()
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            step.status, step.detail = "fail", f"could not start: {e}"
            return
        try:
            step.returncode = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            step.status = "timeout"
            step.detail = f"killed after its {limit:.0f} s limit"
        except BaseException:
            _kill_group(proc)
            step.seconds = time.monotonic() - start
            step.status, step.detail = "fail", "interrupted"
            raise
        finally:
            step.seconds = time.monotonic() - start
    if step.status == "timeout":
        return
    rc = step.returncode
    if step.skip_return_code is not None and rc == step.skip_return_code:
        step.status, step.detail = "skip", f"exit {rc}: the step skipped itself"
    elif rc == 0:
        step.status = "pass"
    else:
        step.status = "fail"
        step.detail = f"exit {rc}" if rc >= 0 else f"killed by signal {-rc}"
    if step.gtest_json:
        summary = _gtest_summary(expand(step.gtest_json, values))
        if summary is not None:
            passed, failed, skipped = summary
            step.detail = (step.detail + "; " if step.detail else "") + \
                f"{passed} passed, {failed} failed, {skipped} skipped"
            if step.status == "pass" and skipped and not passed:
                step.status = "skip"


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _gtest_summary(path: str) -> Optional[Tuple[int, int, int]]:
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    passed = failed = skipped = 0
    for suite in doc.get("testsuites", []):
        for case in suite.get("testsuite", []):
            if case.get("result") == "SKIPPED":
                skipped += 1
            elif case.get("failures"):
                failed += 1
            else:
                passed += 1
    return passed, failed, skipped


# ---- environment --------------------------------------------------------------------------------
def _probe(argv: List[str], timeout: float) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({argv[0]}: {e})"
    text = (out.stdout or "").strip() or (out.stderr or "").strip()
    return text if out.returncode == 0 else f"({argv[0]} exit {out.returncode}: {text[-300:]})"


TORCH_PROBE = (
    "import json, torch\n"
    "d = {'torch': torch.__version__, 'torch CUDA': str(torch.version.cuda),\n"
    "     'torch sees CUDA': torch.cuda.is_available()}\n"
    "if torch.cuda.is_available():\n"
    "    d['torch device'] = torch.cuda.get_device_name(0)\n"
    "    d['torch device count'] = torch.cuda.device_count()\n"
    "print(json.dumps(d))\n")


def environment(values: Dict[str, str], manifest: dict,
                deadline: float) -> List[Tuple[str, str]]:
    """The machine, driver, CUDA, torch and package versions; each probe within the budget."""
    def probe(argv: List[str], timeout: float = 15) -> str:
        return _probe(argv, max(1.0, min(timeout, deadline - time.monotonic() - REPORT_RESERVE_S)))

    rows: List[Tuple[str, str]] = []
    pretty = ""
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    pretty = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    rows.append(("OS", f"{pretty} (kernel {os.uname().release})"))
    rows.append(("glibc", os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else "?"))
    smi = shutil.which("nvidia-smi")
    if smi:
        rows.append(("GPU (nvidia-smi)", probe([smi, "--query-gpu=index,name,memory.total,"
                                                "pci.bus_id", "--format=csv,noheader"])))
        rows.append(("driver", probe([smi, "--query-gpu=driver_version",
                                      "--format=csv,noheader"]).splitlines()[0]))
        header = probe([smi])
        m = re.search(r"CUDA Version:\s*([0-9.]+)", header)
        rows.append(("CUDA (driver supports)", m.group(1) if m else "(not in nvidia-smi output)"))
    else:
        rows.append(("GPU (nvidia-smi)", "(nvidia-smi not on PATH)"))
        try:
            with open("/proc/driver/nvidia/version") as f:
                rows.append(("driver", f.readline().strip()))
        except OSError:
            rows.append(("driver", "(no /proc/driver/nvidia/version)"))
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                    if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    rows.append(("CUDA toolkit here (nvcc)",
                 probe([nvcc, "--version"]).splitlines()[-1] if nvcc else "(no nvcc)"))
    rows.append(("CUDA toolkit of the build", manifest.get("cuda_toolkit", "?")))
    rows.append(("libcudart in the folder", manifest.get("cudart", "?")))
    python = values.get("python")
    if python:
        version = probe([python, "-c", "import sys; print(sys.version.split()[0])"])
        rows.append(("python", f"{python}: " + version))
        text = probe([python, "-c", TORCH_PROBE], timeout=45)
        try:
            for key, value in json.loads(text.splitlines()[-1]).items():
                rows.append((key, str(value)))
        except (ValueError, IndexError):
            rows.append(("torch", text))
    else:
        rows.append(("python", "(no python3 on PATH)"))
    rows.append(("stowage", probe([os.path.join(values["root"], "bin", "stowage"), "version"])))
    rows.append(("packaged from", f"{manifest.get('commit', '?')} ({manifest.get('build', '?')}"
                 f" build, {manifest.get('packaged_utc', '?')})"))
    return rows


# ---- report -------------------------------------------------------------------------------------
def _tail(path: str, lines: int) -> Tuple[str, int]:
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "", 0
    all_lines = text.splitlines()
    return "\n".join(all_lines[-lines:]), max(0, len(all_lines) - lines)


def write_report(out: str, env_rows: List[Tuple[str, str]], steps: List[Step], budget: float,
                 elapsed: float, finished: bool, extra: List[str]) -> str:
    lines = ["# stowage GPU check", ""]
    state = "finished" if finished else "in progress (or interrupted)"
    lines.append(f"Run {state}: {elapsed:.0f} s of a {budget:.0f} s budget. Full logs in `logs/`.")
    lines.append("")
    lines += ["| | |", "| --- | --- |"]
    lines += [f"| {k} | {v.replace('|', '/').replace(chr(10), '; ')} |" for k, v in env_rows]
    lines += ["", "## Steps", "", "| # | step | status | seconds | limit | detail |",
              "| --- | --- | --- | --- | --- | --- |"]
    for i, s in enumerate(steps, 1):
        lines.append(f"| {i} | {s.name} | **{s.status}** | {s.seconds:.1f} | {s.timeout_s:.0f} | "
                     f"{s.detail} |")
    for line in extra:
        lines += ["", line]
    for i, s in enumerate(steps, 1):
        lines += ["", f"### {i}. {s.name}: {s.status}", ""]
        if s.note:
            lines += [s.note, ""]
        lines.append("`" + " ".join(s.argv) + "`")
        if s.log:
            tail, cut = _tail(os.path.join(out, s.log), OUTPUT_LINES_IN_REPORT)
            lines += ["", f"Output (`{s.log}`" + (f", first {cut} lines left out" if cut else "")
                      + "):", "", "```", tail, "```"]
    text = "\n".join(lines) + "\n"
    tmp = os.path.join(out, "report.md.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(out, "report.md"))
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"environment": dict(env_rows), "finished": finished, "steps": [
            {"name": s.name, "status": s.status, "seconds": round(s.seconds, 2),
             "timeout_s": s.timeout_s, "returncode": s.returncode, "detail": s.detail}
            for s in steps]}, f, indent=2)
    return os.path.join(out, "report.md")


# ---- main ---------------------------------------------------------------------------------------
def dry_run(root: str, spec: dict, steps: List[Step], budget: float,
            values: Dict[str, str]) -> int:
    manifest = spec.get("manifest", {})
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
    print(f"stowage GPU check folder {root}: {total / 2**20:.1f} MiB, packaged from "
          f"{manifest.get('commit', '?')} ({manifest.get('build', '?')} build)")
    print(f"steps, in order (total budget {budget:.0f} s):")
    for i, s in enumerate(steps, 1):
        print(f"  {i:2d}. [{s.timeout_s:4.0f} s] {s.group:<10} {s.name}")
        print(f"      {' '.join(s.argv)}")
    limits = sum(s.timeout_s for s in steps)
    print(f"sum of step limits {limits:.0f} s; budget {budget:.0f} s"
          + ("" if limits <= budget else " (the last steps get what is left)"))
    problems, notes = check_folder(root)
    problems += check_steps(root, steps, values)
    for n in notes:
        print("dependency check: " + n)
    if problems:
        print(f"dry run FAILED: {len(problems)} problem(s):")
        for p in problems:
            print("  " + p)
        return 1
    print("dependency check: every ELF file resolves each library it needs inside the folder "
          "or among the base system's")
    print("dry run OK")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", help="report folder (default: $OUT)")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--budget", type=float, help="total seconds (default: steps.json's)")
    ap.add_argument("--only", help="run only steps whose name matches this regular expression")
    ap.add_argument("--root", help=argparse.SUPPRESS)  # the folder; default: this file's
    args = ap.parse_args(argv)
    root = os.path.realpath(args.root or os.path.dirname(os.path.abspath(__file__)))
    spec, steps = load_steps(root)
    if args.only:
        try:
            pattern = re.compile(args.only)
        except re.error as e:
            print(f"run: --only {args.only!r} is not a regular expression: {e}", file=sys.stderr)
            return 2
        steps = [s for s in steps if pattern.search(s.name)]
        if not steps:
            print(f"run: --only {args.only!r} matches no step", file=sys.stderr)
            return 2
    budget = args.budget if args.budget is not None else float(spec.get("budget_s", 480))
    if budget <= 0:
        print(f"run: --budget {budget}: must be > 0 seconds", file=sys.stderr)
        return 2
    values = {"root": root, "python": find_python() or ""}
    if args.dry_run:
        values.update(out="{out}", work="{work}")
        return dry_run(root, spec, steps, budget, values)

    out = args.out or os.environ.get("OUT")
    if not out:
        print("run: give the report folder as the argument or in $OUT", file=sys.stderr)
        return 2
    out = os.path.abspath(out)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    work = tempfile.mkdtemp(prefix="stowage-gpu-check-")
    values.update(out=out, work=work)
    start = time.monotonic()
    deadline = start + budget
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    env_rows: List[Tuple[str, str]] = []
    extra: List[str] = []
    finished = False
    report = os.path.join(out, "report.md")
    try:
        problems, notes = check_folder(root)
        problems += check_steps(root, steps, values)
        extra.append("Dependency check: " + "; ".join(notes) + (
            ". Problems: " + "; ".join(problems) if problems else
            "; every ELF file resolves each library it needs inside the folder or the base "
            "system."))
        env_rows = environment(values, spec.get("manifest", {}), deadline)
        report = write_report(out, env_rows, steps, budget, time.monotonic() - start, False, extra)
        for step in steps:
            left = deadline - time.monotonic() - REPORT_RESERVE_S
            if left < MIN_STEP_S:
                step.status, step.detail = "not run", "the total budget was spent"
                continue
            limit = min(step.timeout_s, left)
            log_path = os.path.join(out, "logs", re.sub(r"[^A-Za-z0-9_.-]", "_", step.name)
                                    + ".log")
            print(f"[{time.monotonic() - start:5.0f} s] {step.name} (limit {limit:.0f} s) ...",
                  flush=True)
            run_step(step, values, limit, log_path)
            if limit < step.timeout_s and step.status == "timeout":
                step.detail += f" (cut from {step.timeout_s:.0f} s: budget)"
            print(f"        {step.status} {step.detail}", flush=True)
            report = write_report(out, env_rows, steps, budget, time.monotonic() - start, False,
                                  extra)
        finished = True
    except Interrupted as e:
        extra.append(f"Interrupted by {e}.")
    finally:
        report = write_report(out, env_rows, steps, budget, time.monotonic() - start, finished,
                              extra)
        shutil.rmtree(work, ignore_errors=True)
    print(f"report: {report}")
    counts: Dict[str, int] = {}
    for s in steps:
        counts[s.status] = counts.get(s.status, 0) + 1
    print("summary: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return 0 if finished and all(s.status == "pass" for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
