"""The planner's MTP layer under megatron (Note [MTP layers] in planner/cost/cost_model.cc) against
Megatron-Core's own MultiTokenPredictionLayer: megatron_layers.py builds one on CPU around the
local spec's dense layer (test_megatron_profile.py's shape) and reports what autograd keeps per
submodule; this test compares each group, at two sequence lengths, with the MTP row
(`mtp.0`) of `stowage plan --framework megatron --mtp-layers 1 --force offload_saved` for the same
shape, with the local spec's documented norm differences (test_megatron_profile.local_norm_delta):
  the shifted token ids the embedding keeps, enorm and hnorm (their inputs and statistics)
                                                   == "input" + "mtp.norms" (+ 2 local norms)
  eh_proj's input, torch.cat of the two normed halves == "mtp.eh_proj_in"
  the transformer layer, group by group             == test_megatron_profile.predicted() with its
                                                       "input" the row's "mtp.layer_input"
  final_layernorm                                   == "mtp.final_norm" (+ 1 local norm)
Needs torch 2.x and megatron-core; skipped otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest

import support  # noqa: F401  (puts the package on sys.path)

from measure import test_megatron_profile as profile  # its shape, groups and local deltas

HERE = os.path.dirname(os.path.abspath(__file__))

CASE = dict(profile.CASES["dense"], mtp=True)
SEQS = profile.SEQS


def measured() -> dict:
    arg = json.dumps({"mtp": {k: CASE[k] for k in ("moe", "qk_layernorm", "selective", "mtp")}})
    env = dict(os.environ, TORCHDYNAMO_DISABLE="1")  # as test_megatron_profile.measured()
    out = subprocess.run([sys.executable, os.path.join(HERE, "megatron_layers.py"), arg]
                         + [str(s) for s in SEQS], capture_output=True, text=True, timeout=600,
                         env=env)
    if out.returncode != 0:
        raise AssertionError(out.stdout + out.stderr[-4000:])
    result = {}
    for seq, modules in json.loads(out.stdout.strip().splitlines()[-1])["mtp"].items():
        groups: dict[str, float] = {}
        for module, nbytes in modules.items():
            if module.startswith("transformer_layer."):
                group = "layer: " + profile.group_of(module[len("transformer_layer."):])
            elif module in ("shifted_ids", "enorm", "hnorm"):
                group = "inputs: ids, enorm, hnorm"
            else:
                group = module
            groups[group] = groups.get(group, 0) + nbytes / int(seq)
        result[int(seq)] = groups
    return result


def planned(cli: str, seq: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(profile.hf_config(CASE), f)
        out = subprocess.run(
            [cli, "plan", "--model", path, "--hardware", "h200", "--seq-len", str(seq),
             "--micro-batch", "1", "--gpus", "1", "--cp", "1", "--ep", "1", "--tp", "1",
             "--sharding", "no_shard", "--framework", "megatron", "--optimizer", "none",
             "--mtp-layers", "1", "--force", "offload_saved", "--format", "json"],
            capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(out.stdout + out.stderr)
    plan = json.loads(out.stdout)
    assert plan["run"]["mtp_layers"] == 1 and len(plan["layers"]) == 2
    row = plan["layers"][1]
    assert row["name"] == "mtp.0" and row["type"].startswith("mtp+"), row
    return {x["name"]: x["bytes"] / seq for x in row["transfers"]}


def predicted(seq: int, t: dict) -> dict:
    layer = dict(t, input=t["mtp.layer_input"])
    want = {"layer: " + g: b for g, b in profile.predicted(CASE, seq, layer).items()}
    want["inputs: ids, enorm, hnorm"] = (t["input"] + t["mtp.norms"]
                                         + 2 * profile.local_norm_delta(profile.H))
    want["eh_proj"] = t["mtp.eh_proj_in"]
    want["final_layernorm"] = t["mtp.final_norm"] + profile.local_norm_delta(profile.H)
    return want


@unittest.skipUnless(profile.HAVE, "needs torch 2.x and megatron-core (the PATH python of "
                                   "scripts/setup-deps)")
class MegatronMtpLayerTest(unittest.TestCase):
    def test_saved_bytes_per_module_match_megatron_core(self) -> None:
        cli = os.environ.get("STOWAGE_CLI")
        if not cli or not os.path.exists(cli):
            self.skipTest("STOWAGE_CLI is not set to a built `stowage` CLI")
        got_all = measured()
        rows = []
        for seq in SEQS:
            tensors = planned(cli, seq)
            want, got = predicted(seq, tensors), got_all[seq]
            with self.subTest(seq=seq):
                self.assertEqual(sorted(got), sorted(want), msg="module groups")
                for group, w in want.items():
                    rows.append((seq, group, w, got[group]))
                    self.assertAlmostEqual(got[group], w, delta=0.05,
                                           msg=f"seq {seq} {group}: predicted {w:.2f} B/token, "
                                               f"Megatron-Core kept {got[group]:.2f}")
        if os.environ.get("STOWAGE_VERBOSE"):
            print(f"\n{'seq':>4} {'module group':44} {'predicted':>10} {'megatron':>10}  B/token")
            for seq, group, w, m in rows:
                print(f"{seq:4} {group:44} {w:10.2f} {m:10.2f}")


if __name__ == "__main__":
    unittest.main()
