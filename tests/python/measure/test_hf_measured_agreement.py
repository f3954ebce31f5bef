"""`stowage plan --profile <measured>` against `stowage plan --framework hf` and against the live
bytes of the whole step, on every family transformers builds here: peaks and step times within
1%, the analytic peak never below the live bytes by more than 0.5% (NEVER_BELOW); and the public
H200 cases through the measured profile: peaks within 3%, as the analytic profile. The tables say
where a side is known to miss, and why."""

from __future__ import annotations

import json
import os
import tempfile
import unittest

import support  # noqa: F401  (puts the package on sys.path)
from measure.hf_cases import (CUBLAS_WORKSPACES, FAMILIES, HAVE, HF_FLAGS, LENGTHS, MEASURED,
                              MEASURING, POLICIES, live_step, needs_hf, peak, plan, plan_both)

if HAVE:
    from stowage.measure.hf_fit import HfMeasurement
    from stowage.measure.hf_model import build_hf_model
    from stowage.measure.hf_profile import measure_hf, to_model_profile


# Where the measured profile is above the truth, and why: the planner's structure, not the
# measurement (family, tokens) -> the reason.
# Mixtral 4096 (+2.1-2.4%) was here until the profile stated the moment a layer's backward peaks
# (schema_version 2: the gradients made by then, the saved tensors released by then;
# Note [The backward peak's moment] in stowage/measure/hf_step.py): keep +2.39% -> 0.00%, recompute
# +2.13% -> -0.25%.
MEASURED_GAPS: dict = {}

# Where the measured profile is below the truth by more than 1%, and why (the planner's structure
# again; the test fails once it is not): (family, policy, tokens) -> the reason.
MEASURED_BELOW: dict = {}
# Both rows that were here peak with the model output's logits alive beyond the loss, which the
# profile counted in the layers' own backward bytes only; it states them now
# (loss.held_logits_bytes, Note [The backward peak's moment] in stowage/measure/hf_step.py):
# deepseek_v3 4096 recompute (at the step's end, every gradient made) -1.32% -> -0.07%; glm_moe_dsa
# 4096 recompute (layer 0's rerun with the DSA indexer's scores, Note [Recompute moment] in
# planner/cost/cost_model.cc: -6.15% -> -2.40%) -2.40% -> 0.00%.

# Where the two profiles' step times differ by more than 1%, and why: family -> the reason.
# The linear-attention hybrids were all here (measured step +10% to +92% at 768 tokens) until
# the recipe counted the torch fallbacks' chunk loops op by op (Note [hf linear attention work]
# in planner/frameworks/hf_linear_attention.cc): qwen3_5_text +10.4% -> +0.1%, kimi_linear +91.9% /
# +78.9% -> +0.2% / +0.2%, qwen3_next +16.0% / +14.4% -> +1.2% / +1.1%, qwen3_5_moe_text +14.8% ->
# +1.2%. The last two kept +1.2% in their MoE block (8 us forward, 66 us backward a layer) until
# both sides counted its sorts and index_puts from their CUDA code (Note [Routing kernels] in
# planner/frameworks/hf_ffn.cc): qwen3_next +1.2% -> +0.7%, qwen3_5_moe_text +1.2% -> +0.8%.
STEP_GAPS: dict = {}

# Where `--framework hf` misses what transformers' code holds by more than 1% (the live bytes say
# so; the test fails once the recipe is fixed: then drop the entry), above it only: a peak below
# the live bytes is never listed (NEVER_BELOW). (family, policy, tokens or None for every length)
# -> the term. Mistral 4096 recompute, Mixtral (both lengths) and Llama 4 4096
# recompute were here until the simulator made each layer's gradients when its modules' backward
# runs and the hf recipe held the output's logits through the backward (Note [Gradient timing] in
# planner/cost/cost_model.cc, Note [hf gradient timing] in planner/frameworks/hf_build_layer.cc);
# Llama 4 recompute went from +4.17% to +0.68% (the 0.21 GiB its entry left unattributed).
ANALYTIC_GAPS = {
    # Gemma 2 at 16384 with recompute (-6.8%, then -1.05% with the logits held) peaks in the
    # backward of layer 1 with the step's two s x s masks alive, which the layers' checkpoints
    # hold: it left this table with them counted in a recomputed layer's backward
    # (LayerCost::checkpoint_held_bytes, Note [hf masks] in planner/frameworks/hf_build_layer.cc):
    # +0.37%; gpt_oss recompute -0.18% -> +0.18% at 4096, -0.44% -> +0.44% at 16384 by the same
    # masks. glm_moe_dsa 4096 recompute (-5.2%) left it with the rerun forward's indexer scores in
    # the backward peak (Note [Recompute moment] in planner/cost/cost_model.cc): 0.00%. gpt_oss
    # (4096 and 16384 recompute, 16384 keep: -6.0%, -5.8%, -4.1%) left it with the held logits.
    # glm4_moe 4096 keep (-1.05%: o_proj's copy of the attention output after GLM-4.5's
    # partial-RoPE cat) left it with Note [hf partial rotary] in planner/frameworks/hf_attention.cc:
    # -0.00%. glm_moe_dsa 4096 keep (-1.04%) and deepseek_v3 4096 recompute (-1.7%) left this table
    # with the gradients timed and the logits held (Note [Gradient timing]): -0.10%, -0.07%.
    # kimi_linear 768 keep and recompute (+2.62%: the KDA core's backward transient charged as
    # everything the core keeps) left it with the transient at the fallback's backward peak,
    # decay_mask's SelectBackward0 in the last chunk, the FFN's input norm freed by then
    # (LinearAttention and BuildHfLayer in planner/frameworks/): -0.02%.
    # Gemma 2 / gpt-oss recompute held both of the step's masks to the lowest checkpoint's
    # backward (an upper bound); each layer type's mask is now held by its own checkpoints
    # (LayerCost::checkpoint_held_group, Note [hf masks]): gemma2 16384 +0.21% -> -0.15%,
    # gpt_oss 4096 +0.05% -> -0.13%, 16384 +0.36% -> -0.08%; what was left below the live bytes
    # in every family's recompute rows, 2h per token in each recomputed layer's backward, was the
    # input its checkpoint holds there, which transformers' layers do not save under keep (the
    # first RMSNorm saves its fp32 upcast): counted where keep does not save it (SavesInput,
    # Note [Recompute moment] in planner/cost/cost_model.cc), those rows are within 0.01%.
}


# How close the analytic hf plan and the measured profile's plan must be where neither is known to
# miss (no gap above): the two count the same moments (EvaluateOption's, Note [Measured layers] in
# planner/frameworks/layer_profile.cc), so they agree to the bytes the fit rounds (every row within
# 0.01%). Looser, the bookkeeping of a moment slips through: olmo3 4096 recompute was -0.73% (the
# input's gradient counted before autograd makes it, and down_proj's gradient at the
# post-feedforward norm's moment: Note [Gradient timing] in planner/cost/cost_model.cc,
# Note [hf OLMo and Phi-3] in planner/frameworks/hf_build_layer.cc), llama4_text 16384 recompute
# -0.26% without the shared expert's input gradient at the routed experts' moment.
HF_MEASURED_AGREEMENT = 0.0005

# How far below the live bytes of the whole step the analytic hf peak may be, in every row of every
# family, ANALYTIC_GAPS' included: a peak below what runs is the one error that turns into an OOM
# at launch. Every row the recipe once planned low was at least twice that: glm_moe_dsa 4096
# recompute -5.2% (the rerun's DSA indexer scores, Note [hf MLA] in planner/frameworks/hf_mla.cc),
# gemma2 16384 recompute -1.05% (the masks the checkpoints hold, Note [hf masks] in
# planner/frameworks/hf_build_layer.cc), glm4_moe 4096 keep -1.05% (o_proj's copy of SDPA's
# output, Note [hf partial rotary] in planner/frameworks/hf_attention.cc), mistral 4096 recompute
# -0.91% and mixtral 16384 recompute -0.70% (the input a recomputed layer's checkpoint holds
# through its backward, Note [Recompute moment] in planner/cost/cost_model.cc).
NEVER_BELOW = 0.005

# The families whose forward under recompute the hf recipe counts at its moment (every layer's
# forward level within 1% of the live bytes): Note [hf recompute forward] in
# planner/frameworks/hf_build_layer.cc. Llama 4's MoE layers were 13.8 GiB low at 16384 tokens.
RECOMPUTE_FORWARD = ("llama4_text",)

# The live peak of the whole step at full depth with the cuBLAS workspaces the CPU cannot see, and
# each layer's forward level likewise: (family, tokens, policy) -> (bytes, [bytes]). Both of
# AgreementTest's family tests read it, so each step is traced once.
LIVE: dict = {}
_FULL: dict = {}  # the last family's full-depth model (fake tensors: no weights' memory)


def rows() -> list[tuple[str, int, str]]:
    """(family, tokens, policy) of every row AgreementTest checks; STOWAGE_HF_FAMILIES (a comma
    list) picks some families, to iterate on a few."""
    only = os.environ.get("STOWAGE_HF_FAMILIES")
    return [(family, seq_len, force) for family in FAMILIES
            if not only or family in only.split(",")
            for seq_len in LENGTHS.get(family, (4096, 16384))
            for force in POLICIES.get(family, ("keep", "recompute"))]


def live(family: str, seq_len: int, force: str) -> tuple[int, list[int]]:
    """The truth on these fake tensors (the real code at real widths; recompute is transformers'
    own gradient checkpointing) for one row: LIVE's."""
    key = (family, seq_len, force)
    if key not in LIVE:
        if family not in _FULL:
            _FULL.clear()
            _FULL[family] = build_hf_model(FAMILIES[family], one_per_kind=False)
        truth, forward = live_step(_FULL[family], seq_len, force == "recompute")
        LIVE[key] = (truth + CUBLAS_WORKSPACES, [f + CUBLAS_WORKSPACES for f in forward])
    return LIVE[key]


@needs_hf
class AgreementTest(unittest.TestCase):
    def test_measured_and_analytic_hf_profiles_agree_within_1_percent(self) -> None:
        # Three peaks per family, length and policy: the live bytes of the whole step at full
        # depth (the truth on these fake tensors: the real code at real widths; recompute is
        # transformers' own gradient checkpointing), `stowage plan --profile <measured>`, and
        # `stowage plan --framework hf`. The measured profile must land within 1% of the truth;
        # the analytic plan within 1% of the truth and the two profiles within 1% of each other
        # (unless the measured profile is known to miss, MEASURED_GAPS), except where the
        # analytic plan is known to miss the truth (ANALYTIC_GAPS), where it must still be above
        # it by more than 1% (the test fails once that is fixed: then drop the entry); their
        # step times within 1%. The CPU cannot see the cuBLAS workspaces (64 MiB, CUDA only):
        # they are added to the live bytes (live()); both plans count them (fixed memory:
        # kTorchCublasWorkspacesBytes in planner/frameworks/step_cost.h). The analytic peak's
        # floor, NEVER_BELOW, is the test below.
        table = []
        m, measured_family = None, None
        for family, seq_len, force in rows():
            config = FAMILIES[family]
            if measured_family != family:
                m = (measure_hf(config, lengths=MEASURING[family]) if family in MEASURING else
                     measure_hf(config, seq_len=4096))
                measured_family = family
            if not m.covers(seq_len):  # Note [One side of every threshold]
                m = measure_hf(config, seq_len=seq_len)
            with self.subTest(family=family, seq_len=seq_len, force=force):
                truth, live_forward = live(family, seq_len, force)
                a, b, levels = plan_both(config, m, seq_len, force)
                analytic, measured = peak(a), peak(b)
                ta, tb = a["predicted"]["step_seconds"], b["predicted"]["step_seconds"]
                table.append(f"{family:10s} {seq_len:6d} {force:9s} {truth / 2**30:8.3f} "
                             f"{measured / 2**30:8.3f} {analytic / 2**30:8.3f} "
                             f"{100 * (measured - truth) / truth:+6.2f}% "
                             f"{100 * (measured - analytic) / analytic:+6.2f}% "
                             f"{ta:8.4f} {tb:8.4f} {100 * (tb - ta) / ta:+6.1f}%")
                below = MEASURED_BELOW.get((family, force, seq_len))
                if below is not None:
                    self.assertLess(measured, truth * 0.99, f"{table[-1]}: {below}")
                elif (family, seq_len) in MEASURED_GAPS:
                    # Conservative: never below the truth, within 3%.
                    self.assertGreaterEqual(measured, truth, table[-1])
                    self.assertLessEqual((measured - truth) / truth, 0.03,
                                         f"{table[-1]}: {MEASURED_GAPS[family, seq_len]}")
                else:
                    self.assertLessEqual(abs(measured - truth) / truth, 0.01, table[-1])
                # Step time: the same op work by class on both sides (Note [Kernel bytes] in
                # stowage/measure/op_work.py; Note [Step time] in
                # planner/frameworks/hf_layer.h), so the same seconds within 1%.
                step_gap = STEP_GAPS.get(family)
                if step_gap is None:
                    self.assertLessEqual(abs(tb - ta) / ta, 0.01, table[-1])
                else:
                    self.assertGreater(abs(tb - ta) / ta, 0.01, f"{table[-1]}: {step_gap}")
                gap = ANALYTIC_GAPS.get((family, force, seq_len),
                                        ANALYTIC_GAPS.get((family, force, None)))
                if gap is None:
                    self.assertLessEqual(abs(analytic - truth) / truth, 0.01, table[-1])
                    # A measured profile known to miss the truth is not held to the
                    # analytic plan that meets it.
                    if (family, seq_len) not in MEASURED_GAPS and below is None:
                        self.assertLessEqual(abs(measured - analytic) / analytic,
                                             HF_MEASURED_AGREEMENT, table[-1])
                else:  # a pessimistic miss only: NEVER_BELOW
                    self.assertGreater((analytic - truth) / truth, 0.01, f"{table[-1]}: {gap}")
                # Each layer's forward under recompute (the plan's level there, the
                # timeline's points 1..n: plan_levels), where the recipe states the
                # moment (Note [hf recompute forward] in
                # planner/frameworks/hf_build_layer.cc).
                if force == "recompute" and family in RECOMPUTE_FORWARD:
                    for j, forward in enumerate(live_forward):
                        self.assertLessEqual(
                            abs(levels[1 + j] - forward) / forward, 0.01,
                            f"{table[-1]}: the forward of layer {j}: planned "
                            f"{levels[1 + j] / 2**30:.3f} GiB, live {forward / 2**30:.3f}")
        print("\nfamily     tokens policy    live GiB measured   hf GiB  vs live  vs hf   "
              "hf s     meas s   diff\n" + "\n".join(table))

    def test_the_analytic_peak_is_never_below_the_live_bytes(self) -> None:
        # Every row of the test above (the live bytes shared through LIVE): `stowage plan
        # --framework hf` at least the live peak of the whole step less NEVER_BELOW, whatever
        # ANALYTIC_GAPS says. A plan that fits a budget the step then exceeds is an OOM at
        # launch; a plan above the truth only wastes memory.
        table = []
        for family, seq_len, force in rows():
            with self.subTest(family=family, seq_len=seq_len, force=force):
                truth, _forward = live(family, seq_len, force)
                with tempfile.TemporaryDirectory() as tmp:
                    cfg = os.path.join(tmp, "config.json")
                    with open(cfg, "w") as f:
                        json.dump(FAMILIES[family], f)
                    analytic = peak(plan(["--model", cfg, "--seq-len", str(seq_len), *HF_FLAGS,
                                          "--force", force]))
                table.append(f"{family:16s} {seq_len:6d} {force:9s} {truth / 2**30:9.3f} "
                             f"{analytic / 2**30:9.3f} {100 * (analytic - truth) / truth:+6.2f}%")
                self.assertGreaterEqual(analytic, truth * (1 - NEVER_BELOW),
                                        f"{table[-1]}: the analytic peak below the live bytes")
        print("\nfamily           tokens policy     live GiB    hf GiB  vs live\n" +
              "\n".join(table))

    def test_public_h200_cases_through_the_measured_profile(self) -> None:
        cases = []
        with open(os.path.join(MEASURED, "hf-h200.jsonl")) as f:
            for line in f:
                j = json.loads(line)
                if "case" in j:
                    cases.append(j)
        self.assertEqual(len(cases), 4)
        measured: dict[str, HfMeasurement] = {}
        for c in cases:
            key = json.dumps(c["config"], sort_keys=True)
            if key not in measured:
                measured[key] = measure_hf(os.path.join(MEASURED, c["config"]))
            force = "recompute" if c["gradient_checkpointing"] else "keep"
            with self.subTest(case=c["case"], seq_len=c["seq_len"], force=force):
                with tempfile.TemporaryDirectory() as tmp:
                    prof = os.path.join(tmp, "profile.json")
                    to_model_profile(measured[key], c["seq_len"]).save(prof)
                    p = plan(["--profile", prof, "--hardware", "h200", "--force", force])
                err = (peak(p) - c["peak_bytes_2"]) / c["peak_bytes_2"]
                print(f"\n{c['case']:16s} {force:9s} measured profile "
                      f"{peak(p) / 2**30:.3f} GiB, H200 {c['peak_bytes_2'] / 2**30:.3f} GiB "
                      f"({100 * err:+.2f}%)")
                # Within 0.1% of what the H200 allocated. The regression: every case was below
                # it (-0.11% to -0.35%, 62 to 77 MiB) while profiles did not count the cuBLAS
                # workspaces (TORCH_CUBLAS_WORKSPACES_BYTES in stowage/measure/layer_profile.py).
                self.assertLessEqual(abs(err), 0.001)


if __name__ == "__main__":
    unittest.main()
