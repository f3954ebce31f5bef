"""The launcher's ranks reach the runtime (README "Ranks sharing a machine admit together"): the C
library reads LOCAL_WORLD_SIZE (torchrun's ranks on this machine) and checks it against the world
size and the local rank, naming the variable and its value; stowage.Runtime passes its rank
arguments, and torch.distributed's rank and world size where the trainer has initialised a process
group (Note [Local world size] in offload/node_ledger.h)."""

from __future__ import annotations

import os
import tempfile
import unittest

import support

import torch
import torch.distributed as dist

import plans
import stowage

VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_PROCID",
             "SLURM_LOCALID", "SLURM_NTASKS")


def _plan() -> stowage.Plan:
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(support.MLPBlock(32, dropout=0.0) for _ in range(2))
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))
    return plans.plan_for(layers, x, ["offload_input", "keep"])


class LocalWorldSizeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.plan = _plan()

    def setUp(self) -> None:
        self.saved = {name: os.environ.pop(name) for name in VARIABLES if name in os.environ}
        self.ledger = tempfile.TemporaryDirectory()
        os.environ["STOWAGE_LEDGER_DIR"] = self.ledger.name

    def tearDown(self) -> None:
        for name in VARIABLES:
            os.environ.pop(name, None)
        os.environ.update(self.saved)
        os.environ.pop("STOWAGE_LEDGER_DIR", None)
        self.ledger.cleanup()

    def create(self, **kwargs) -> None:
        with stowage.Runtime(self.plan, backend="host", copy_threads=1, **kwargs):
            pass

    def refused(self, **kwargs) -> str:
        with self.assertRaises(stowage.StowageError) as caught:
            self.create(**kwargs)
        self.assertEqual(caught.exception.status, "INVALID_ARGUMENT")
        return caught.exception.message

    def test_unset_falls_back_to_the_ledger(self) -> None:
        self.create()

    def test_set_values_are_taken(self) -> None:
        os.environ.update(LOCAL_WORLD_SIZE="2", WORLD_SIZE="4", LOCAL_RANK="1", RANK="3")
        self.create()
        self.create(local_world_size=4, world_size=4)

    def test_bad_environment_names_the_variable_and_value(self) -> None:
        for value in ("0", "-3", "two", "1.5"):
            with self.subTest(value=value):
                os.environ["LOCAL_WORLD_SIZE"] = value
                self.assertIn(f"environment variable LOCAL_WORLD_SIZE is '{value}'; allowed: a "
                              "positive integer", self.refused())
        os.environ.update(LOCAL_WORLD_SIZE="8", WORLD_SIZE="4")
        self.assertIn("environment variable LOCAL_WORLD_SIZE is 8; allowed: a positive integer no "
                      "larger than the world size (environment variable WORLD_SIZE is 4)",
                      self.refused())
        os.environ.update(LOCAL_WORLD_SIZE="2", WORLD_SIZE="4", LOCAL_RANK="2")
        self.assertIn("environment variable LOCAL_WORLD_SIZE is 2 but environment variable "
                      "LOCAL_RANK is 2", self.refused())

    def test_arguments_win_over_the_environment_and_are_checked(self) -> None:
        os.environ["LOCAL_WORLD_SIZE"] = "junk"
        self.create(local_world_size=1)
        del os.environ["LOCAL_WORLD_SIZE"]
        self.assertIn("local_world_size is 0; allowed: -1 (from LOCAL_WORLD_SIZE) or a positive "
                      "integer", self.refused(local_world_size=0))
        self.assertIn("local_world_size is 3; allowed: a positive integer no larger than the "
                      "world size (world_size is 2)",
                      self.refused(local_world_size=3, world_size=2))
        with self.assertRaises(ValueError):  # checked in Python: ctypes would wrap it
            self.create(local_world_size=-2)

    @unittest.skipUnless(dist.is_available() and dist.is_gloo_available(), "no gloo in this torch")
    def test_torch_distributed_gives_the_world_size(self) -> None:
        """A world of one, its process group initialised here with no WORLD_SIZE set: the runtime
        checks the local world size against torch.distributed's world size. In this process, not a
        forked one: torch's thread pools, started by the suites before, do not survive a fork."""
        self.assertFalse(dist.is_initialized())
        with tempfile.TemporaryDirectory() as tmp:
            dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "rendezvous"),
                                    rank=0, world_size=1)
            try:
                message = self.refused(local_world_size=2)
                self.create(local_world_size=1)
            finally:
                dist.destroy_process_group()
        self.assertIn("local_world_size is 2; allowed: a positive integer no larger than the "
                      "world size (world_size is 1)", message)


if __name__ == "__main__":
    unittest.main()
