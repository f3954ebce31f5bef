"""The package's imports form a DAG, no function imports the package, and no module reaches into
another's private names: scripts/check-imports, which reads the source and imports nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import unittest

import support

CHECK = os.path.join(support.REPO, "scripts", "check-imports")


class ImportGraphTest(unittest.TestCase):
    def test_the_package_imports_form_a_dag(self) -> None:
        out = subprocess.run([sys.executable, CHECK], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("no cycle", out.stdout)

    def test_a_cycle_and_a_hidden_one_are_found(self) -> None:
        # A two-module package importing each other, and a pair whose cycle a function hides.
        with tempfile.TemporaryDirectory() as tmp:
            pkg = os.path.join(tmp, "pkg")
            os.makedirs(pkg)
            for name, text in {"__init__.py": "",
                               "a.py": "from . import b\n",
                               "b.py": "from .a import x\n",
                               "c.py": "from . import d\n",
                               "d.py": "def f():\n    from . import c\n",
                               "e.py": "from . import a\nprint(a._private)\n"}.items():
                with open(os.path.join(pkg, name), "w") as f:
                    f.write(text)
            out = subprocess.run([sys.executable, CHECK, pkg], capture_output=True, text=True,
                                 timeout=60)
        self.assertEqual(out.returncode, 1)
        self.assertIn("import cycle among pkg.a, pkg.b", out.stderr)
        self.assertIn("imports pkg.c inside a function", out.stderr)
        self.assertIn("import cycle hidden by function-level imports among pkg.c, pkg.d",
                      out.stderr)
        self.assertIn("uses pkg.a._private, private to its module", out.stderr)


if __name__ == "__main__":
    unittest.main()
