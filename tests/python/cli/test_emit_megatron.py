"""`stowage plan --emit megatron` prints arguments Megatron-LM takes: every name is one of
Megatron-LM's (tests/data/megatron-lm-arguments.json, listed from its own parser by
scripts/gen-megatron-arguments), a parser with Megatron's names, nargs and choices parses them, and
where megatron-core is installed its TransformerConfig accepts the recompute / offload settings
together (its __post_init__ refuses the combinations Megatron cannot run). CTest passes the CLI as
STOWAGE_CLI."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import unittest

import support

ARGUMENTS = os.path.join(support.HERE, "..", "data", "megatron-lm-arguments.json")

CASES = [
    [],                                            # the reference run, 1M: offload_input
    ["--seq-len", "256K"],                         # block recompute, mixed policies
    ["--force", "recompute"],
    ["--force", "selective_recompute"],
    ["--force", "offload_saved", "--seq-len", "64K"],
    ["--model", "llama-3-8b", "--hardware", "h200", "--seq-len", "32K", "--tp", "2", "--cp", "2",
     "--gpus", "8"],
    ["--mtp-layers", "0"],                         # a run that does not train MTP
]


def _megatron_parser() -> argparse.ArgumentParser:
    with open(ARGUMENTS) as f:
        known = json.load(f)["arguments"]
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False, add_help=False)
    for name, spec in known.items():
        if not spec["takes_value"]:
            parser.add_argument(name, action="store_true")
        else:
            parser.add_argument(name, nargs=spec["nargs"], choices=spec["choices"])
    return parser


def _parse(parser: argparse.ArgumentParser, tokens: list) -> argparse.Namespace:
    """Megatron's reading of `tokens`: ArgumentError for a bad value, ValueError for a name it
    does not take (parse_known_args, so nothing prints a usage message)."""
    args, rest = parser.parse_known_args(tokens)
    if rest:
        raise ValueError(f"Megatron-LM takes no {rest}")
    return args


def _emitted(cli: str, flags: list) -> tuple[list, list]:
    out = subprocess.run([cli, "plan", *flags, "--emit", "megatron"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode in (0, 1), out.stderr  # 1: a forced plan over the budget, still shown
    lines = out.stdout.splitlines()
    notes = [l for l in lines if l.startswith("#")]
    body = " ".join(l.rstrip("\\").strip() for l in lines if not l.startswith("#"))
    return shlex.split(body), notes


class EmitMegatronTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.cli = os.environ.get("STOWAGE_CLI")
        if not cls.cli or not os.path.exists(cls.cli):
            raise unittest.SkipTest("STOWAGE_CLI is not set (CTest sets it to the built CLI)")
        cls.parser = _megatron_parser()

    def test_megatron_parses_what_is_emitted(self) -> None:
        for flags in CASES:
            with self.subTest(flags=flags):
                tokens, notes = _emitted(self.cli, flags)
                self.assertTrue(tokens)
                if any(n.startswith("# not expressed:") for n in notes):
                    # The last line names what runs the plan as planned inside Megatron-Core.
                    self.assertIn("with the Python module stowage.megatron: "
                                  "stowage.megatron.wrap(model, plan)", notes[-1])
                args = _parse(self.parser, tokens)
                self.assertGreaterEqual(args.tensor_model_parallel_size and
                                        int(args.tensor_model_parallel_size), 1)
                if args.recompute_granularity == "full":
                    self.assertIn(args.recompute_method, ("uniform", "block"))
                    self.assertIsNotNone(args.recompute_num_layers)
                if args.cpu_offloading_num_layers:
                    self.assertIsNone(args.recompute_granularity)
                # GLM-5.3-Flash's num_nextn_predict_layers is 1: trained unless --mtp-layers 0
                # (Note [MTP layers]); Llama has none.
                mtp = "1" if not flags or flags[0] in ("--seq-len", "--force") else None
                self.assertEqual(args.mtp_num_layers, mtp)

    def test_the_parser_refuses_what_megatron_would(self) -> None:
        for bad in (["--recompute-granularity", "partial"], ["--tensor-parallel-size", "2"],
                    ["--sequence-parallel", "true"]):
            with self.assertRaises((argparse.ArgumentError, ValueError), msg=bad):
                _parse(self.parser, bad)

    def test_megatron_core_accepts_the_settings_together(self) -> None:
        try:
            from megatron.core.transformer.transformer_config import TransformerConfig
        except ImportError as e:  # Debian's torch 1.13 has no megatron-core
            self.skipTest(f"megatron-core is not installed: {e}")
        for flags in CASES:
            with self.subTest(flags=flags):
                args = _parse(self.parser, _emitted(self.cli, flags)[0])
                num_layers = 45
                modules = args.recompute_modules
                TransformerConfig(
                    num_layers=num_layers, hidden_size=64, num_attention_heads=4,
                    tensor_model_parallel_size=int(args.tensor_model_parallel_size),
                    context_parallel_size=int(args.context_parallel_size),
                    sequence_parallel=args.sequence_parallel,
                    num_moe_experts=8 if args.expert_model_parallel_size else None,
                    moe_grouped_gemm=bool(args.expert_model_parallel_size),
                    recompute_granularity=args.recompute_granularity,
                    recompute_method=args.recompute_method,
                    recompute_num_layers=(int(args.recompute_num_layers)
                                          if args.recompute_num_layers else None),
                    recompute_modules=modules,
                    cpu_offloading=bool(args.cpu_offloading_num_layers),
                    cpu_offloading_num_layers=int(args.cpu_offloading_num_layers or 0),
                    mtp_num_layers=int(args.mtp_num_layers) if args.mtp_num_layers else None)


# Pipelined plans (Note [Megatron under pipeline parallelism]) Megatron runs as planned, and ones
# it cannot express.
_PP = ["--model", "llama-3.1-8b", "--hardware", "h200", "--cp", "1", "--gpus", "64", "--pp", "4",
       "--microbatches", "8"]
PIPELINED = [
    _PP + ["--seq-len", "8K"],                                       # Megatron's even split
    _PP + ["--seq-len", "8K", "--vpp", "2", "--schedule", "interleaved"],
    _PP + ["--seq-len", "8K", "--pp-layout", "7,9,9,7"],             # any other split
]
PIPELINED_REFUSED = [
    _PP + ["--seq-len", "64K", "--gpu-mem", "22"],  # the stages recompute different layers
]


def _plan(cli: str, flags: list) -> dict:
    out = subprocess.run([cli, "plan", *flags, "--format", "json"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)


def _planned_chunks(plan: dict) -> list:
    """(first layer, layers) of every stage's model chunks, stage by stage."""
    return [(c["first_layer"], c["num_layers"]) for s in plan["stages"] for c in s["chunks"]]


def _megatron_chunks(config, plan: dict) -> list:
    """What Megatron-Core builds for the same chunks under `config`: get_transformer_layer_offset
    and get_num_layers_to_build per pipeline rank and virtual stage, with parallel_state set to the
    plan's pipeline and reset after."""
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
    pp, vpp = plan["run"]["pp"], plan["run"]["vpp"]
    built = []
    try:
        parallel_state.set_pipeline_model_parallel_world_size(pp)
        parallel_state.set_virtual_pipeline_model_parallel_world_size(vpp if vpp > 1 else None)
        for stage in plan["stages"]:
            rank = stage["stage"]
            parallel_state.set_pipeline_model_parallel_rank(rank)
            for chunk in range(len(stage["chunks"])):
                vp = chunk if vpp > 1 else None
                parallel_state.set_virtual_pipeline_model_parallel_rank(vp)
                built.append((get_transformer_layer_offset(config, vp_stage=vp, pp_rank=rank),
                              get_num_layers_to_build(config, vp_stage=vp, pp_rank=rank)))
    finally:
        parallel_state.set_pipeline_model_parallel_world_size(None)
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)
        parallel_state.set_pipeline_model_parallel_rank(None)
        parallel_state.set_virtual_pipeline_model_parallel_rank(None)
    return built


class EmitMegatronPipelineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.cli = os.environ.get("STOWAGE_CLI")
        if not cls.cli or not os.path.exists(cls.cli):
            raise unittest.SkipTest("STOWAGE_CLI is not set (CTest sets it to the built CLI)")
        cls.parser = _megatron_parser()

    def test_megatron_splits_and_recomputes_as_planned(self) -> None:
        """Megatron-Core's own layer assignment (get_num_layers_to_build,
        get_transformer_layer_offset) for the emitted pipeline flags gives every stage the plan's
        chunks, and its recompute rule (recompute.py checkpointed_forward: uniform every layer,
        block the first K of each chunk) recomputes exactly the plan's layers."""
        try:
            from megatron.core.transformer.transformer_config import TransformerConfig
        except ImportError as e:  # Debian's torch 1.13 has no megatron-core
            self.skipTest(f"megatron-core is not installed: {e}")
        for flags in PIPELINED:
            with self.subTest(flags=flags):
                tokens, notes = _emitted(self.cli, flags)
                args = _parse(self.parser, tokens)
                plan = _plan(self.cli, flags)
                pp, vpp = plan["run"]["pp"], plan["run"]["vpp"]
                n = len(plan["layers"])
                self.assertEqual(int(args.pipeline_model_parallel_size), pp)
                if args.num_virtual_stages_per_pipeline_rank:  # arguments.py's derivation
                    virtual = int(args.num_virtual_stages_per_pipeline_rank)
                else:
                    virtual = vpp
                config = TransformerConfig(
                    num_layers=n, hidden_size=64, num_attention_heads=4,
                    tensor_model_parallel_size=int(args.tensor_model_parallel_size),
                    context_parallel_size=int(args.context_parallel_size),
                    sequence_parallel=args.sequence_parallel,
                    pipeline_model_parallel_size=pp,
                    virtual_pipeline_model_parallel_size=virtual if virtual > 1 else None,
                    pipeline_model_parallel_layout=args.pipeline_model_parallel_layout,
                    pipeline_dtype=__import__("torch").bfloat16,
                    recompute_granularity=args.recompute_granularity,
                    recompute_method=args.recompute_method,
                    recompute_num_layers=(int(args.recompute_num_layers)
                                          if args.recompute_num_layers else None),
                    recompute_modules=args.recompute_modules)
                self.assertEqual(config.virtual_pipeline_model_parallel_size or 1, vpp)
                built = _megatron_chunks(config, plan)
                self.assertEqual(built, _planned_chunks(plan))
                recomputed = set()
                for first, count in built:
                    if args.recompute_granularity == "full":
                        k = (count if args.recompute_method == "uniform"
                             else min(int(args.recompute_num_layers), count))
                        recomputed |= set(range(first, first + k))
                planned = {l["index"] for l in plan["layers"]
                           if l["policy"] in ("recompute", "offload_input")}
                self.assertEqual(recomputed, planned)
                if args.global_batch_size:
                    dp = int(flags[flags.index("--gpus") + 1]) // (
                        int(args.tensor_model_parallel_size) * int(args.context_parallel_size)
                        * pp)
                    self.assertEqual(int(args.global_batch_size),
                                     int(args.micro_batch_size) * dp * plan["run"]["microbatches"])

    def test_from_megatron_reads_back_what_was_emitted(self) -> None:
        """The emitted arguments, read back with --from-megatron, plan the same stages."""
        import tempfile
        base = ["--model", "llama-3.1-8b", "--hardware", "h200", "--cp", "1", "--gpus", "64",
                "--seq-len", "8K"]
        for flags in PIPELINED:
            with self.subTest(flags=flags):
                tokens, _ = _emitted(self.cli, flags)
                plan = _plan(self.cli, flags)
                with tempfile.NamedTemporaryFile("w", suffix=".sh") as script:
                    script.write("torchrun pretrain_gpt.py " + shlex.join(tokens) + "\n")
                    script.flush()
                    back = _plan(self.cli, base + ["--from-megatron", script.name])
                for key in ("pp", "vpp", "schedule", "microbatches"):
                    self.assertEqual(back["run"][key], plan["run"][key], key)
                self.assertEqual([s["chunks"] for s in back["stages"]],
                                 [s["chunks"] for s in plan["stages"]])

    def test_from_megatron_splits_as_megatron_core_does(self) -> None:
        """A launch script's split (the layout; uneven first and last stages with model chunks;
        layers per virtual stage), read with --from-megatron, gives every stage the chunks
        Megatron-Core builds (get_num_layers_to_build, get_transformer_layer_offset)."""
        try:
            import torch
            from megatron.core.transformer.transformer_config import TransformerConfig
        except ImportError as e:  # Debian's torch 1.13 has no megatron-core
            self.skipTest(f"megatron-core is not installed: {e}")
        import tempfile
        n = 32  # llama-3.1-8b's layers
        scripts = [
            ["--pipeline-model-parallel-size", "4",
             "--pipeline-model-parallel-layout", "E,t*7|(t*9|)*2,t*7,L"],
            ["--pipeline-model-parallel-size", "2",
             "--pipeline-model-parallel-layout", "E,t*3|(t*4|)*6,t*5,L"],
            ["--pipeline-model-parallel-size", "4", "--decoder-first-pipeline-num-layers", "6",
             "--decoder-last-pipeline-num-layers", "10",
             "--num-virtual-stages-per-pipeline-rank", "2"],
            ["--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage",
             "4"],
            ["--pipeline-model-parallel-size", "2", "--account-for-embedding-in-pipeline-split",
             "--account-for-loss-in-pipeline-split"],
        ]
        for script in scripts:
            with self.subTest(script=script):
                args = _parse(self.parser, ["--num-layers", str(n)] + script)
                with tempfile.NamedTemporaryFile("w", suffix=".sh") as f:
                    f.write(f"torchrun pretrain_gpt.py --num-layers {n} {shlex.join(script)}\n")
                    f.flush()
                    plan = _plan(self.cli, ["--model", "llama-3.1-8b", "--hardware", "h200",
                                            "--cp", "1", "--gpus", "64", "--seq-len", "8K",
                                            "--microbatches", "8", "--from-megatron", f.name])
                pp, vpp = plan["run"]["pp"], plan["run"]["vpp"]
                self.assertEqual(pp, int(args.pipeline_model_parallel_size))
                virtual = None  # arguments.py's derivation of the model chunks per rank
                if args.num_virtual_stages_per_pipeline_rank:
                    virtual = int(args.num_virtual_stages_per_pipeline_rank)
                elif args.num_layers_per_virtual_pipeline_stage:
                    virtual = n // pp // int(args.num_layers_per_virtual_pipeline_stage)
                config = TransformerConfig(
                    num_layers=n, hidden_size=64, num_attention_heads=4,
                    pipeline_model_parallel_size=pp,
                    virtual_pipeline_model_parallel_size=(
                        virtual if virtual and virtual > 1 else None),
                    pipeline_model_parallel_layout=args.pipeline_model_parallel_layout,
                    num_layers_in_first_pipeline_stage=(
                        int(args.decoder_first_pipeline_num_layers)
                        if args.decoder_first_pipeline_num_layers else None),
                    num_layers_in_last_pipeline_stage=(
                        int(args.decoder_last_pipeline_num_layers)
                        if args.decoder_last_pipeline_num_layers else None),
                    account_for_embedding_in_pipeline_split=(
                        args.account_for_embedding_in_pipeline_split),
                    account_for_loss_in_pipeline_split=args.account_for_loss_in_pipeline_split,
                    pipeline_dtype=torch.bfloat16)
                self.assertEqual(config.virtual_pipeline_model_parallel_size or 1, vpp)
                self.assertEqual(_megatron_chunks(config, plan), _planned_chunks(plan))

    def test_what_megatron_cannot_express_is_refused_naming_the_layer(self) -> None:
        for flags in PIPELINED_REFUSED:
            with self.subTest(flags=flags):
                out = subprocess.run([self.cli, "plan", *flags, "--emit", "megatron"],
                                     capture_output=True, text=True, timeout=120)
                self.assertEqual(out.returncode, 2, out.stderr)
                self.assertEqual(out.stdout, "")
                self.assertRegex(out.stderr, r"--emit megatron cannot express this pipelined "
                                             r"plan: stage \d+'s layer \d+ ")
                self.assertIn("stowage runtime", out.stderr)
                self.assertIn("stowage.megatron.wrap(model, plan) runs each TransformerLayer "
                              "under its own policy", out.stderr)


if __name__ == "__main__":
    unittest.main()
