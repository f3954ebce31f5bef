"""Parameter counts of real Hugging Face configs: the planner's `model_parameters` (stowage plan
--format json) against the real transformers model built from the same config on the meta
device (no weights, no memory). Needs transformers (pinned in scripts/setup-deps); skipped without
it (Debian's torch 1.13 run). CTest passes the CLI as STOWAGE_CLI.

The configs are tests/planner/data/hf/*.json (published configs, provenance in SOURCES.json)
and tests/planner/data/hf/synthetic/*.json (small configs of families with no published config
copied here, several sparse so that transformers' defaults apply).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import unittest
import warnings

import support

try:
    import torch
    import transformers
    from transformers import AutoModel, CONFIG_MAPPING
except ImportError:  # the Debian torch 1.13 interpreter has no transformers
    transformers = None

DATA = os.path.join(support.REPO, "tests", "planner", "data", "hf")
TOLERANCE = 1e-4  # 0.01%

# Families the planner reads as one graph under another transformers class (Note [Family resolution]
# in planner/model/hf_config.cc); the test builds what transformers builds.
WRAPPER_TEXT_TYPES = {"llama4": "llama4_text", "qwen3_vl": "qwen3_vl_text",
                      "qwen3_vl_moe": "qwen3_vl_moe_text", "qwen2_5_vl": "qwen2_5_vl_text",
                      "gemma3": "gemma3_text", "mllama": "mllama_text_model",
                      "mistral3": "ministral3", "qwen3_5": "qwen3_5_text",
                      "qwen3_5_moe": "qwen3_5_moe_text"}
# Text decoders AutoModel does not map.
NO_AUTO_MODEL = {"mllama_text_model": "MllamaTextModel"}
DROP = {"quantization_config", "auto_map", "architectures", "model_type", "transformers_version",
        "vision_config", "text_config", "_comment", "torch_dtype", "dtype"}


def configs() -> list[str]:
    paths = glob.glob(os.path.join(DATA, "*.json")) + glob.glob(os.path.join(DATA, "synthetic",
                                                                             "*.json"))
    return sorted(p for p in paths if os.path.basename(p) != "SOURCES.json")


def text_config(raw: dict):
    """The transformers configuration of the text decoder the planner plans."""
    if isinstance(raw.get("text_config"), dict):
        body = raw["text_config"]
        model_type = body.get("model_type") or WRAPPER_TEXT_TYPES[raw["model_type"]]
    else:
        body = raw
        arch = (raw.get("architectures") or [None])[0]
        cls = getattr(transformers, arch, None) if arch else None
        if cls is not None and hasattr(cls, "config_class") and "CausalLM" in arch:
            model_type = cls.config_class.model_type  # e.g. kimi_k2 -> deepseek_v3
        else:
            model_type = WRAPPER_TEXT_TYPES.get(raw["model_type"], raw["model_type"])
    fields = {k: v for k, v in body.items() if k not in DROP}
    return CONFIG_MAPPING[model_type](**fields)


def transformers_count(raw: dict) -> tuple[int, str]:
    cfg = text_config(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            if cfg.model_type in NO_AUTO_MODEL:
                model = getattr(transformers, NO_AUTO_MODEL[cfg.model_type])(cfg)
            else:
                model = AutoModel.from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    # A wrapper ties by its own tie_word_embeddings (Qwen3VLMoeForConditionalGeneration does);
    # the text config's own key wins where it has one, then its class default.
    nested = isinstance(raw.get("text_config"), dict)
    if nested and "tie_word_embeddings" not in raw["text_config"] and \
            "tie_word_embeddings" in raw:
        tied = raw["tie_word_embeddings"]
    else:
        tied = getattr(cfg, "tie_word_embeddings", False)
    if not tied:
        n += cfg.vocab_size * cfg.hidden_size  # lm_head
    # transformers drops DeepSeek-V3 / GLM multi-token-prediction modules on load; counted here
    # from the real last decoder layer: enorm, hnorm, eh_proj (2h -> h), the layer, final norm
    # (embedding and head shared with the main model).
    mtp = getattr(cfg, "num_nextn_predict_layers", 0) or 0
    if mtp:
        h = cfg.hidden_size
        layer = sum(p.numel() for p in model.layers[-1].parameters())
        n += mtp * (layer + 2 * h * h + 3 * h)
    return n, type(model).__name__


def planner_plan(cli: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [cli, "plan", "--model", path, "--format", "json", "--seq-len", "4096", "--cp", "1",
         "--gpus", "1", "--ep", "1", "--force", "keep", "--gpu-mem", "1000000"],
        capture_output=True, text=True, timeout=300)


@unittest.skipIf(transformers is None, "transformers is not installed (scripts/setup-deps)")
class HfModelParametersTest(unittest.TestCase):
    def setUp(self) -> None:
        self.cli = os.environ.get("STOWAGE_CLI")
        if not self.cli or not os.path.exists(self.cli):
            self.skipTest("STOWAGE_CLI is not set to a built `stowage` CLI (CTest sets it)")

    def test_every_config_counts_like_transformers(self) -> None:
        sources = json.load(open(os.path.join(DATA, "SOURCES.json")))
        paths = configs()
        self.assertGreaterEqual(len(paths), 12)
        rows = []
        for path in paths:
            name = os.path.splitext(os.path.basename(path))[0]
            with self.subTest(config=name):
                raw = json.load(open(path))
                out = planner_plan(self.cli, path)
                self.assertEqual(out.returncode, 0, out.stderr)
                planned = json.loads(out.stdout)["model_parameters"]
                real, cls = transformers_count(raw)
                rel = abs(planned - real) / real
                published = sources.get(name, {}).get("published_params")
                rows.append((name, cls, published, real, planned, rel))
                self.assertLess(rel, TOLERANCE,
                                f"{name}: planner {planned:,} vs {cls} {real:,} ({rel:.2e})")
        print("\nconfig                         transformers class          published        "
              "transformers          planner   rel.diff")
        for name, cls, published, real, planned, rel in rows:
            pub = f"{published / 1e9:8.2f}B" if published else "        -"
            print(f"{name:30s} {cls:26s} {pub} {real:16,d} {planned:16,d} {rel:9.1e}")

    def test_notes_say_what_was_not_planned(self) -> None:
        out = planner_plan(self.cli, os.path.join(DATA, "gpt-oss-20b.json"))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("quantization_config (mxfp4)", out.stderr)
        out = planner_plan(self.cli, os.path.join(DATA, "qwen3-vl-8b.json"))
        self.assertIn("only the text decoder (text_config, qwen3_vl_text)", out.stderr)
        out = planner_plan(self.cli, os.path.join(DATA, "gemma-2-9b.json"))
        self.assertIn("Gemma2Config defaults: tie_word_embeddings=true", out.stderr)


if __name__ == "__main__":
    unittest.main()
