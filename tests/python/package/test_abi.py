"""The package and the library it loads speak one C ABI: stowage._lib compares its ABI_VERSION
with the loaded libstowage.so's (stowage_get_version) and refuses another with
stowage.AbiMismatchError, which names both versions, the library's path and how to fix it."""

from __future__ import annotations

import os
import re
import unittest

import support
import stowage
from stowage import _lib


class AbiVersionTest(unittest.TestCase):
    def tearDown(self) -> None:
        _lib._reset_for_tests()  # the next test loads the library afresh, with the real version

    def test_the_package_declares_the_headers_abi(self) -> None:
        with open(os.path.join(support.REPO, "include", "stowage", "stowage.h")) as f:
            header = int(re.search(r"#define STOWAGE_ABI_VERSION (\d+)", f.read()).group(1))
        self.assertEqual(_lib.ABI_VERSION, header)
        self.assertEqual(_lib.library_abi(_lib.load())[0], header)

    def test_a_library_of_another_abi_is_refused(self) -> None:
        library = _lib.load()
        path = _lib.loaded_path()
        abi, version = _lib.library_abi(library)
        declared = _lib.ABI_VERSION
        _lib._reset_for_tests()
        _lib.ABI_VERSION = abi + 1  # a package built against a newer header
        try:
            with self.assertRaises(stowage.AbiMismatchError) as caught:
                _lib.load()
        finally:
            _lib.ABI_VERSION = declared
        e = caught.exception
        self.assertIsInstance(e, stowage.LibraryNotFoundError)
        self.assertEqual((e.library_abi, e.package_abi, e.path), (abi, abi + 1, path))
        message = str(e)
        self.assertIn(path, message)
        self.assertIn(f"libstowage {version} with C ABI version {abi}", message)
        self.assertIn(f"declares ABI version {abi + 1}", message)
        self.assertIn("STOWAGE_LIBRARY", message)
        self.assertIn("cmake --build build/dev --target stowage_runtime", message)
        self.assertIsNone(_lib.loaded_path())  # nothing half-loaded is kept
        _lib._reset_for_tests()
        self.assertEqual(_lib.library_abi(_lib.load())[0], declared)


if __name__ == "__main__":
    unittest.main()
