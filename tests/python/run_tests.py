"""Runs the PyTorch integration tests with unittest; CTest calls this (tests/python/CMakeLists.txt).

    run_tests.py cpu [SUITE...]   every test_*.py except the GPU ones
    run_tests.py gpu [SUITE...]   test_*_gpu.py; exits 77 (CTest: skipped) when torch sees no CUDA
                                  device
The suites in ALONE (several ranks each) run only when SUITE names them: CTest runs them as
tests of their own.

The suites live in folders by what they test (package/, measure/, cli/, bench/; mcore/:
stowage.megatron on Megatron-Core); the helpers they
share (support.py, plans.py, trace_event_format.py) are beside this file, which is on sys.path, so
every suite imports them by name. SUITE picks some: a folder (`measure`), a file
(`measure/test_hf_fit.py`) or a module name (`measure.test_hf_fit`). One suite also runs alone
from this folder: `python3 -m measure.test_hf_fit`.

Exits non-zero with a clear message when the interpreter has no torch: point STOWAGE_PYTHON at
one that has (cmake -DSTOWAGE_PYTHON=/path/to/python).
"""

from __future__ import annotations

import os
import sys
import unittest

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
# Suites CMakeLists.txt registers as tests of their own (several ranks each, with their own time
# limit): run only when picked by name, not with the rest of their folder.
ALONE = {"package.test_ddp", "package.test_fsdp2", "package.test_fsdp2_gpu",
         "mcore.test_megatron_wrap", "mcore.test_megatron_parallel", "mcore.test_megatron_gpu"}


def suites(which: str, picked: list[str]) -> list[str]:
    """The module names of the test files under this folder (`package.test_torch_cpu`), sorted:
    the GPU ones or the others, of the folders, files or modules `picked` (all when empty)."""
    names = []
    for root, dirs, files in os.walk(HERE):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        for f in files:
            if f.startswith("test_") and f.endswith(".py") and f.endswith("_gpu.py") == (
                    which == "gpu"):
                rel = os.path.relpath(os.path.join(root, f[:-3]), HERE)
                names.append(rel.replace(os.sep, "."))
    if not picked:
        return sorted(n for n in names if n not in ALONE)
    wanted = [p[:-3] if p.endswith(".py") else p for p in picked]
    wanted = [w.strip("/").replace("/", ".") for w in wanted]
    unknown = [p for p, w in zip(picked, wanted)
               if not any(n == w or n.startswith(w + ".") for n in names)]
    if unknown:
        raise SystemExit(f"run_tests.py: no {which} suite matches {', '.join(unknown)}")
    return sorted(n for n in names if n in wanted or (
        n not in ALONE and any(n.startswith(w + ".") for w in wanted)))


def main() -> int:
    which = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    if which not in ("cpu", "gpu"):
        print(f"run_tests.py: argument is {which!r}; allowed: cpu, gpu", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError as e:
        print(f"{sys.executable} cannot import torch ({e}); the PyTorch integration tests need "
              "it: install python3-torch (scripts/setup-deps) or configure with "
              "-DSTOWAGE_PYTHON=<a python that has torch>", file=sys.stderr)
        return 1
    if which == "gpu" and not torch.cuda.is_available():
        print(f"no CUDA device visible to torch {torch.__version__}: GPU tests skipped")
        return SKIP
    sys.path.insert(0, HERE)
    names = suites(which, sys.argv[2:])
    suite = unittest.defaultTestLoader.loadTestsFromNames(names)
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, "
          f"STOWAGE_LIBRARY={os.environ.get('STOWAGE_LIBRARY', '(unset)')}, "
          f"{suite.countTestCases()} tests in {len(names)} suites", flush=True)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
