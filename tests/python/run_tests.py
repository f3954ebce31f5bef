"""Runs the PyTorch integration tests with unittest; CTest calls this (tests/python/CMakeLists.txt).

    run_tests.py cpu   every test_*.py except the GPU ones
    run_tests.py gpu   test_*_gpu.py; exits 77 (CTest: skipped) when torch sees no CUDA device

Exits non-zero with a clear message when the interpreter has no torch: point STOWAGE_PYTHON at
one that has (cmake -DSTOWAGE_PYTHON=/path/to/python).
"""

from __future__ import annotations

import os
import sys
import unittest

SKIP = 77


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
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    names = sorted(f[:-3] for f in os.listdir(here)
                   if f.startswith("test_") and f.endswith(".py")
                   and f.endswith("_gpu.py") == (which == "gpu"))
    suite = unittest.defaultTestLoader.loadTestsFromNames(names)
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, "
          f"STOWAGE_LIBRARY={os.environ.get('STOWAGE_LIBRARY', '(unset)')}", flush=True)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
