"""stowage.agree over torch.distributed: four ranks in four processes with the gloo backend. The
same plan on every rank: they agree and each trains a step under it. One rank with another plan: all
four fail, with the same message naming that rank."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import traceback
import unittest

import support

import torch
import torch.distributed as dist

import plans
import stowage

WORLD = 4
HIDDEN = 32


def _model() -> torch.nn.ModuleList:
    torch.manual_seed(0)
    return torch.nn.ModuleList(support.MLPBlock(HIDDEN, dropout=0.0) for _ in range(3))


def _rank_main(rank: int, init: str, odd_rank: int, results: "multiprocessing.Queue") -> None:
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(rank)
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
        try:
            layers = _model()
            x = torch.randn(2, 8, HIDDEN, generator=torch.Generator().manual_seed(1))
            # The odd rank prefetches one layer further ahead: a plan that runs differently.
            distance = 2 if rank == odd_rank else 1
            plan = plans.plan_for(layers, x, ["offload_input", "offload_input", "keep"],
                                  prefetch_distance=distance)
            agreed = stowage.agree(plan)
            planned = stowage.wrap(layers, plan=plan, backend="host", copy_threads=1)
            with planned.step():
                loss = planned(x).square().mean()
                loss.backward()
            steps = planned.runtime.stats().steps_completed if planned.runtime else 0
            planned.close()
            results.put((rank, "ok", agreed, steps))
        finally:
            dist.destroy_process_group()
    except stowage.PlanAgreementError as e:
        results.put((rank, "mismatch", str(e), e.hashes))
    except Exception:  # noqa: BLE001 — reported to the parent, which fails the test
        results.put((rank, "error", traceback.format_exc(), None))


def _run(odd_rank: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        # fork: the ranks inherit the imported torch instead of importing it again (seconds
        # each on a loaded machine); the parent never initialises a process group itself.
        context = multiprocessing.get_context("fork")
        results = context.Queue()
        procs = [context.Process(target=_rank_main, args=(r, init, odd_rank, results))
                 for r in range(WORLD)]
        for p in procs:
            p.start()
        out = {}
        for _ in range(WORLD):
            rank, *rest = results.get(timeout=120)
            out[rank] = rest
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        return out


@unittest.skipUnless(dist.is_available() and dist.is_gloo_available(), "no gloo in this torch")
class AgreeTest(unittest.TestCase):
    def test_same_plan_agrees_and_steps_run(self) -> None:
        out = _run(odd_rank=-1)
        self.assertEqual(sorted(out), list(range(WORLD)))
        for rank, (kind, agreed, steps) in out.items():
            self.assertEqual(kind, "ok", f"rank {rank}: {agreed}")
            self.assertEqual(steps, 1)
        self.assertEqual(len({agreed for _, agreed, _ in out.values()}), 1)

    def test_one_rank_with_another_plan_fails_every_rank_alike(self) -> None:
        out = _run(odd_rank=2)
        self.assertEqual(sorted(out), list(range(WORLD)))
        for rank, (kind, message, _) in out.items():
            self.assertEqual(kind, "mismatch", f"rank {rank}: {message}")
        messages = {message for _, message, _ in out.values()}
        self.assertEqual(len(messages), 1, messages)
        message = messages.pop()
        self.assertIn("plan agreement failed over 4 ranks: rank 2 differs", message)
        hashes = out[0][2]
        self.assertEqual(hashes[0], hashes[1])
        self.assertNotEqual(hashes[0], hashes[2])
        self.assertIn(f"rank 2: 0x{hashes[2]:016x}", message)
        self.assertIn(f"ranks 0-1, 3: 0x{hashes[0]:016x}", message)


class PlanHashTest(unittest.TestCase):
    def test_hash_is_the_runtimes_and_ignores_spelling(self) -> None:
        layers = _model()
        x = torch.randn(2, 8, HIDDEN)
        plan = plans.plan_for(layers, x, ["offload_input", "keep", "keep"])
        text = plan.to_json()
        import json
        respelled = json.dumps(json.loads(text), indent=None, sort_keys=True)
        self.assertEqual(stowage.plan_hash(text), stowage.plan_hash(respelled))
        with stowage.Runtime(plan, backend="host", copy_threads=1) as rt:
            self.assertEqual(rt.plan_hash(), stowage.plan_hash(plan))
        with self.assertRaises(stowage.PlanError):
            stowage.plan_hash('{"layers": 3}')

    def test_agree_needs_a_process_group(self) -> None:
        if dist.is_available() and dist.is_initialized():
            self.skipTest("a process group is already initialised")
        with self.assertRaisesRegex(RuntimeError, "init_process_group"):
            stowage.agree({"layers": []})


if __name__ == "__main__":
    unittest.main()
