"""`stowage plan --emit torchtitan` prints TOML that torchtitan's own config takes: every section
and key is a field of torchtitan's JobConfig dataclasses (torchtitan/config/job_config.py of the
release scripts/setup-deps pins, 0.2.2), every value has the field's type and is one of its Literal
choices, the dataclasses build from it, torchtitan's ParallelDims accepts the degrees for the
job's GPUs, and torchtitan's own apply_ac, run on a stand-in model with the plan's layer count,
checkpoints at least the layers the plan recomputes (exactly those when nothing is noted).

torchtitan is installed without its dependencies (scripts/setup-deps): its package __init__ pulls in
tyro and the data stack, so the modules are loaded by path under stand-in parent packages. The
suite skips where torchtitan is not installed (Debian's torch 1.13 interpreter). CTest passes the
CLI as STOWAGE_CLI."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
import types
import typing
import unittest

import support  # noqa: F401  (puts python on the path)

PINNED = "0.2.2"

CASES = [
    [],                                            # the reference run, 1M: offload_input
    ["--seq-len", "256K"],                         # mixed policies
    ["--force", "recompute"],
    ["--force", "keep", "--seq-len", "16K"],
    ["--force", "selective_recompute"],
    ["--force", "offload_saved", "--seq-len", "64K"],
    ["--model", "llama-3-8b", "--hardware", "h200", "--seq-len", "32K", "--tp", "2", "--cp", "2",
     "--gpus", "8"],
    ["--model", "llama-3.1-8b", "--hardware", "h200", "--seq-len", "128K", "--cp", "1", "--gpus",
     "8", "--sharding", "no_shard"],
]


def _root() -> str:
    """The installed torchtitan's folder, found without importing it (once stand-in packages are
    in sys.modules, their __path__ says it)."""
    if "torchtitan" in sys.modules:
        return sys.modules["torchtitan"].__path__[0]
    return importlib.util.find_spec("torchtitan").submodule_search_locations[0]


def _torchtitan() -> tuple[types.ModuleType, type, typing.Callable]:
    """(job_config, ParallelDims, apply_ac) from the installed torchtitan, or SkipTest."""
    try:
        import importlib.metadata as metadata
        version = metadata.version("torchtitan")
    except Exception as e:  # noqa: BLE001
        raise unittest.SkipTest(f"torchtitan is not installed: {e}")
    if version != PINNED:
        raise unittest.SkipTest(f"torchtitan {version} is installed; the check is for {PINNED}")
    root = _root()
    for name in ("torchtitan", "torchtitan.config", "torchtitan.distributed"):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(root, *name.split(".")[1:])]
            sys.modules[name] = package
    job_config = importlib.import_module("torchtitan.config.job_config")
    parallel_dims = importlib.import_module("torchtitan.distributed.parallel_dims")
    ac = importlib.import_module("torchtitan.distributed.activation_checkpoint")
    return job_config, parallel_dims.ParallelDims, ac


def _pipeline_parallel(root: str) -> types.ModuleType:
    """torchtitan's distributed/pipeline_parallel.py, loaded as _torchtitan loads the others. Its
    train_spec import pulls in the data stack; the two names it takes from there are only
    annotations, so a stand-in module gives them."""
    for name in ("torchtitan.components", "torchtitan.protocols", "torchtitan.tools"):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(root, *name.split(".")[1:])]
            sys.modules[name] = package
    sys.modules["torchtitan.config"].JobConfig = importlib.import_module(
        "torchtitan.config.job_config").JobConfig
    sys.modules["torchtitan.distributed"].ParallelDims = importlib.import_module(
        "torchtitan.distributed.parallel_dims").ParallelDims
    if "torchtitan.protocols.train_spec" not in sys.modules:
        spec = types.ModuleType("torchtitan.protocols.train_spec")
        spec.BaseModelArgs = spec.ParallelizeFunction = object
        sys.modules["torchtitan.protocols.train_spec"] = spec
    return importlib.import_module("torchtitan.distributed.pipeline_parallel")


def _run(cli: str, flags: list, *extra: str) -> subprocess.CompletedProcess:
    out = subprocess.run([cli, "plan", *flags, *extra], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode in (0, 1), out.stderr  # 1: a forced plan over the budget, still shown
    return out


def _check_value(test: unittest.TestCase, where: str, value, hint) -> None:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):  # `list[list[str]] | None`: one of its types
        options = [h for h in typing.get_args(hint) if h is not type(None)]  # noqa: E721 (is)
        test.assertEqual(len(options), 1, f"{where}: {hint}")
        _check_value(test, where, value, options[0])
    elif origin is list:
        test.assertIsInstance(value, list, where)
        for i, item in enumerate(value):
            _check_value(test, f"{where}[{i}]", item, typing.get_args(hint)[0])
    elif origin is typing.Literal:
        test.assertIn(value, typing.get_args(hint), where)
    elif hint is bool:
        test.assertIsInstance(value, bool, where)
    elif hint is int:
        test.assertTrue(isinstance(value, int) and not isinstance(value, bool), where)
    elif hint is str:
        test.assertIsInstance(value, str, where)
    else:
        test.fail(f"{where}: emitted a field of type {hint} the check does not know")


class EmitTorchtitanTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.cli = os.environ.get("STOWAGE_CLI")
        if not cls.cli or not os.path.exists(cls.cli):
            raise unittest.SkipTest("STOWAGE_CLI is not set (CTest sets it to the built CLI)")
        cls.job_config, cls.ParallelDims, cls.ac = _torchtitan()

    def emitted(self, flags: list) -> tuple[dict, list, dict]:
        """(the TOML, its `# not expressed:` notes, the plan JSON) for one case."""
        text = _run(self.cli, flags, "--emit", "torchtitan").stdout
        notes = [l for l in text.splitlines() if l.startswith("# not expressed:")]
        plan = json.loads(_run(self.cli, flags, "--format", "json").stdout)
        return tomllib.loads(text), notes, plan

    def test_torchtitan_takes_every_emitted_field(self) -> None:
        sections = {f.name: f.type for f in dataclasses.fields(self.job_config.JobConfig)}
        for flags in CASES:
            with self.subTest(flags=flags):
                config, _, plan = self.emitted(flags)
                self.assertLessEqual({"parallelism", "training", "activation_checkpoint"},
                                     set(config))
                for section, values in config.items():
                    self.assertIn(section, sections, f"torchtitan has no [{section}]")
                    cls = getattr(self.job_config, sections[section]) \
                        if isinstance(sections[section], str) else sections[section]
                    hints = typing.get_type_hints(cls)
                    for key, value in values.items():
                        self.assertIn(key, hints, f"torchtitan's [{section}] has no {key}")
                        _check_value(self, f"{section}.{key}", value, hints[key])
                    cls(**values)  # the dataclass builds from exactly these fields
                self.assertEqual(config["training"]["seq_len"], plan["run"]["seq_len"])
                self.assertEqual(config["training"]["local_batch_size"],
                                 plan["run"]["micro_batch"])

    def test_parallel_dims_accept_the_degrees(self) -> None:
        for flags in CASES:
            with self.subTest(flags=flags):
                config, _, plan = self.emitted(flags)
                p = config["parallelism"]
                gpus = int(flags[flags.index("--gpus") + 1]) if "--gpus" in flags else 64
                dims = self.ParallelDims(
                    dp_replicate=p["data_parallel_replicate_degree"],
                    dp_shard=p["data_parallel_shard_degree"],
                    cp=p["context_parallel_degree"], tp=p["tensor_parallel_degree"],
                    pp=p["pipeline_parallel_degree"], ep=p["expert_parallel_degree"],
                    etp=p.get("expert_tensor_parallel_degree", 1), world_size=gpus)
                self.assertEqual(dims.tp, plan["run"]["tp"])
                self.assertEqual(dims.cp, plan["run"]["cp"])

    def test_torchtitan_checkpoints_what_the_plan_recomputes(self) -> None:
        import torch.nn as nn
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointWrapper)

        class Stand(nn.Module):  # torchtitan's models keep their blocks in `layers`
            def __init__(self, n: int):
                super().__init__()
                self.layers = nn.ModuleDict({str(i): nn.Linear(2, 2) for i in range(n)})

        for flags in CASES:
            with self.subTest(flags=flags):
                config, notes, plan = self.emitted(flags)
                ac = config["activation_checkpoint"]
                model = Stand(len(plan["layers"]))
                self.ac._layer_sac_count = 0  # apply_ac counts blocks per process
                # As torchtitan's parallelize_* do: mode "none" never calls apply_ac.
                if ac["mode"] != "none":
                    self.ac.apply_ac(model, self.job_config.ActivationCheckpoint(**ac))
                wrapped = {int(i) for i, m in model.layers.named_children()
                           if isinstance(m, CheckpointWrapper)}
                recomputed = {l["index"] for l in plan["layers"]
                              if l["policy"] != "keep" and l["policy"] != "offload_saved"}
                self.assertLessEqual(recomputed, wrapped)
                if not any("recomputed too" in n for n in notes):
                    self.assertEqual(recomputed, wrapped)
                offloads = [l for l in plan["layers"] if l["host_bytes"] > 0]
                self.assertEqual(bool(offloads), any("offload" in n for n in notes), notes)


# Pipelined plans (Note [torchtitan under pipeline parallelism]) torchtitan runs as planned, and
# ones it cannot express.
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


class EmitTorchtitanPipelineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.cli = os.environ.get("STOWAGE_CLI")
        if not cls.cli or not os.path.exists(cls.cli):
            raise unittest.SkipTest("STOWAGE_CLI is not set (CTest sets it to the built CLI)")
        cls.job_config, cls.ParallelDims, cls.ac = _torchtitan()
        cls.pp = _pipeline_parallel(_root())

    def split(self, model, rank: int, pp: int, schedule: str, fqns: list) -> list:
        """The model parts rank `rank` builds: torchtitan's own pipeline_module_split, with a
        stand-in PipelineStage (the real one needs a process group) and mesh."""
        mesh = types.SimpleNamespace(get_local_rank=lambda: rank, size=lambda: pp,
                                     get_group=lambda name: None)
        real = self.pp.PipelineStage
        self.pp.PipelineStage = lambda model, index, stages, device, group: types.SimpleNamespace(
            submod=model, index=index)
        try:
            import torch
            _, parts = self.pp.pipeline_module_split(model, mesh, schedule, torch.device("cpu"),
                                                     fqns)
        finally:
            self.pp.PipelineStage = real
        return parts

    def test_torchtitan_splits_and_checkpoints_as_planned(self) -> None:
        import torch.nn as nn
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointWrapper)

        class Stand(nn.Module):  # torchtitan's decoder: these four children
            def __init__(self, n: int):
                super().__init__()
                self.tok_embeddings = nn.Embedding(4, 2)
                self.layers = nn.ModuleDict({str(i): nn.Linear(2, 2) for i in range(n)})
                self.norm = nn.LayerNorm(2)
                self.output = nn.Linear(2, 4)

        for flags in PIPELINED:
            with self.subTest(flags=flags):
                out = _run(self.cli, flags, "--emit", "torchtitan")
                self.assertEqual(out.returncode, 0, out.stderr)
                config = tomllib.loads(out.stdout)
                plan = json.loads(_run(self.cli, flags, "--format", "json").stdout)
                p, ac = config["parallelism"], config["activation_checkpoint"]
                pp = plan["run"]["pp"]
                self.assertEqual(p["pipeline_parallel_degree"], pp)
                for section, cls_name in (("parallelism", "Parallelism"),
                                          ("training", "Training"),
                                          ("activation_checkpoint", "ActivationCheckpoint")):
                    cls = getattr(self.job_config, cls_name)
                    hints = typing.get_type_hints(cls)
                    for key, value in config[section].items():
                        _check_value(self, f"{section}.{key}", value, hints[key])
                    cls(**config[section])
                gpus = int(flags[flags.index("--gpus") + 1])
                self.ParallelDims(dp_replicate=p["data_parallel_replicate_degree"],
                                  dp_shard=p["data_parallel_shard_degree"],
                                  cp=p["context_parallel_degree"], tp=p["tensor_parallel_degree"],
                                  pp=pp, ep=p["expert_parallel_degree"],
                                  etp=p.get("expert_tensor_parallel_degree", 1), world_size=gpus)
                self.assertEqual(config["training"]["local_batch_size"]
                                 // p["pipeline_parallel_microbatch_size"],
                                 plan["run"]["microbatches"])
                n = len(plan["layers"])
                model = Stand(n)
                wrapped = set()
                for rank in range(pp):
                    parts = self.split(model, rank, pp, p["pipeline_parallel_schedule"],
                                       p["module_fqns_per_model_part"])
                    stage = plan["stages"][rank]
                    self.assertEqual(
                        [sorted(int(i) for i in part.layers.keys()) for part in parts],
                        [list(range(c["first_layer"], c["first_layer"] + c["num_layers"]))
                         for c in stage["chunks"]])
                    self.ac._layer_sac_count = 0  # one process per rank
                    for part in parts:  # as pipeline_llm: parallelize_fn, so apply_ac, per part
                        if ac["mode"] != "none":
                            self.ac.apply_ac(part, self.job_config.ActivationCheckpoint(**ac))
                        wrapped |= {int(i) for i, m in part.layers.named_children()
                                    if isinstance(m, CheckpointWrapper)}
                recomputed = {l["index"] for l in plan["layers"]
                              if l["policy"] not in ("keep", "offload_saved")}
                self.assertEqual(recomputed, wrapped)

    def test_from_torchtitan_reads_back_what_was_emitted(self) -> None:
        """The emitted job config, read back with --from-torchtitan, plans the same stages."""
        import tempfile
        base = ["--model", "llama-3.1-8b", "--hardware", "h200", "--cp", "1", "--gpus", "64",
                "--seq-len", "8K"]
        for flags in PIPELINED:
            with self.subTest(flags=flags):
                emitted = _run(self.cli, flags, "--emit", "torchtitan")
                self.assertEqual(emitted.returncode, 0, emitted.stderr)
                plan = json.loads(_run(self.cli, flags, "--format", "json").stdout)
                with tempfile.NamedTemporaryFile("w", suffix=".toml") as job:
                    job.write(emitted.stdout)
                    job.flush()
                    back = json.loads(_run(self.cli, base, "--from-torchtitan", job.name,
                                           "--format", "json").stdout)
                for key in ("pp", "vpp", "schedule", "microbatches"):
                    self.assertEqual(back["run"][key], plan["run"][key], key)
                self.assertEqual([s["chunks"] for s in back["stages"]],
                                 [s["chunks"] for s in plan["stages"]])

    def test_from_torchtitan_splits_as_pipeline_llm_does(self) -> None:
        """Without module_fqns_per_model_part, torchtitan's own pipeline_llm (its stage count
        from the schedule or pipeline_parallel_layers_per_stage, generate_llm_fqn_per_model_part,
        stages looped over the ranks) gives every rank the chunks stowage plans."""
        import tempfile
        n = 32  # llama-3.1-8b's layers
        jobs = [
            {"pipeline_parallel_degree": 4},
            {"pipeline_parallel_degree": 4, "pipeline_parallel_schedule": "Interleaved1F1B"},
            {"pipeline_parallel_degree": 4, "pipeline_parallel_schedule": "Interleaved1F1B",
             "pipeline_parallel_layers_per_stage": 3},
            {"pipeline_parallel_degree": 2, "pipeline_parallel_first_stage_less_layers": 2,
             "pipeline_parallel_last_stage_less_layers": 0},
        ]
        for settings in jobs:
            with self.subTest(settings=settings):
                job = self.job_config.JobConfig()
                for key, value in settings.items():
                    setattr(job.parallelism, key, value)
                # pipeline_llm itself, with the module names it passes to pipeline_module_split
                # captured (the stages need a process group) and no schedule built.
                captured = []

                def split(model, mesh, schedule, device, names):
                    captured.append(names)
                    return [], []

                real = self.pp.pipeline_module_split, self.pp.build_pipeline_schedule
                self.pp.pipeline_module_split = split
                self.pp.build_pipeline_schedule = lambda job_config, stages, loss_fn: None
                dims = types.SimpleNamespace(get_mesh=lambda name: None,
                                             pp=settings["pipeline_parallel_degree"])
                try:
                    self.pp.pipeline_llm(None, dims, job, None, types.SimpleNamespace(n_layers=n),
                                         None, None)
                finally:
                    self.pp.pipeline_module_split, self.pp.build_pipeline_schedule = real
                names = captured[0]
                text = "[parallelism]\n" + "".join(
                    f"{k} = {json.dumps(v)}\n" for k, v in settings.items())
                with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
                    f.write(text)
                    f.flush()
                    plan = json.loads(_run(self.cli, ["--model", "llama-3.1-8b", "--hardware",
                                                      "h200", "--cp", "1", "--gpus", "64",
                                                      "--seq-len", "8K", "--microbatches", "8",
                                                      "--from-torchtitan", f.name,
                                                      "--format", "json"]).stdout)
                pp = plan["run"]["pp"]
                self.assertEqual(pp * plan["run"]["vpp"], len(names))
                for rank, stage in enumerate(plan["stages"]):
                    for chunk, want in enumerate(stage["chunks"]):
                        layers = [int(m.split(".")[1]) for m in names[chunk * pp + rank]
                                  if m.startswith("layers.")]
                        first = want["first_layer"]
                        self.assertEqual(layers, list(range(first, first + want["num_layers"])))

    def test_what_torchtitan_cannot_express_is_refused_naming_the_layer(self) -> None:
        for flags in PIPELINED_REFUSED:
            with self.subTest(flags=flags):
                out = subprocess.run([self.cli, "plan", *flags, "--emit", "torchtitan"],
                                     capture_output=True, text=True, timeout=120)
                self.assertEqual(out.returncode, 2, out.stderr)
                self.assertEqual(out.stdout, "")
                self.assertRegex(out.stderr, r"--emit torchtitan cannot express this pipelined "
                                             r"plan: stage \d+'s layer \d+ ")
                self.assertIn("stowage runtime", out.stderr)


if __name__ == "__main__":
    unittest.main()
