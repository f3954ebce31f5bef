"""`python -m stowage.measure.profile --hf CONFIG` writes the profile `stowage plan --profile`
reads, with what ran (framework, optimizer, gradients' dtype, parameters) and the moments of
each layer's backward peak; a config it cannot read exits 2 naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest

import support
from measure.hf_cases import HAVE, TINY, cli, needs_hf, plan

if HAVE:
    from stowage.measure.hf_model import build_hf_model


@needs_hf
class CommandTest(unittest.TestCase):
    def test_python_m_stowage_measure_profile_writes_what_the_planner_reads(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            cfg, prof = os.path.join(tmp, "config.json"), os.path.join(tmp, "profile.json")
            with open(cfg, "w") as f:
                json.dump(TINY["llama"], f)
            env = dict(os.environ)
            env["PYTHONPATH"] = os.path.join(support.REPO, "python")
            out = subprocess.run([sys.executable, "-m", "stowage.measure.profile", "--hf", cfg,
                                  "--seq-len", "4096", "--out", prof], env=env,
                                 capture_output=True, text=True, timeout=300)
            self.assertEqual(out.returncode, 0, out.stderr)
            with open(prof) as f:
                d = json.load(f)
            self.assertEqual(d["tokens"], 4096)
            self.assertTrue(d["gradients_in_backward"])
            # Note [The backward peak's moment]: what the caller holds past the loss is the
            # output's bf16 logits (2V per token) and its fp32 loss; each layer's peak has some
            # of its gradients made and some of its saved tensors released.
            self.assertEqual(d["schema_version"], 3)
            self.assertEqual(d["loss"]["held_logits_bytes"], 2 * 512 * 4096 + 4)
            for layer in d["layers"]:
                self.assertLess(0, layer["backward_peak_grad_bytes"])
                self.assertLess(layer["backward_peak_grad_bytes"], layer["grad_bytes"])
                self.assertLess(0, layer["backward_peak_released_bytes"])
            self.assertEqual(len(d["layers"]), 2)
            self.assertIn("forward_work", d["layers"][0])
            p = plan(["--profile", prof, "--hardware", "h200", "--force", "keep"])
            self.assertGreater(p["predicted"]["step_seconds"], 0)
            # What ran, as the profile states it, is what the plan reports (it said megatron,
            # adam and 0 parameters before).
            self.assertEqual((d["framework"], d["optimizer"], d["grad_dtype"]),
                             ("hf", "none", "bf16"))
            params = build_hf_model(TINY["llama"], one_per_kind=False).parameters
            self.assertEqual(d["model_parameters"], params)
            self.assertEqual(p["run"]["framework"], "hf")
            self.assertEqual(p["model_parameters"], params)
            table = subprocess.run([cli(), "plan", "--profile", prof, "--hardware", "h200",
                                    "--force", "keep"], capture_output=True, text=True,
                                   timeout=120)
            self.assertIn("framework              hf, optimizer none, gradients bf16 (created "
                          "during backward); from the layer profile", table.stdout)
            bad = subprocess.run([sys.executable, "-m", "stowage.measure.profile", "--hf",
                                  os.path.join(tmp, "missing.json")], env=env,
                                 capture_output=True, text=True, timeout=60)
            self.assertEqual(bad.returncode, 2)
            self.assertIn("missing.json", bad.stderr)


if __name__ == "__main__":
    unittest.main()
