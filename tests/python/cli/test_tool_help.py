"""Every flag of bench/bench_torch.py says what it does in --help (the C++ CLI's flags cannot lack
help: its parser renders --help from the same table, tests/cli/cli_test.cc)."""

from __future__ import annotations

import importlib.util
import os
import unittest

import support

BENCH = os.path.join(support.HERE, "..", "..", "bench", "bench_torch.py")


class ToolHelpTest(unittest.TestCase):
    def test_every_bench_torch_flag_has_help(self) -> None:
        spec = importlib.util.spec_from_file_location("bench_torch", BENCH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # defines; main() runs only as a script
        parser = module.build_parser()
        missing = [a.option_strings[0] for a in parser._actions
                   if a.option_strings and not a.help]
        self.assertEqual(missing, [])
        self.assertGreater(len(parser._actions), 10)


if __name__ == "__main__":
    unittest.main()
