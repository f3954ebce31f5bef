"""LiveBytes (stowage.measure.live_bytes: the TorchDispatchMode that follows live bytes by storage)
against a hand count on a tiny module and against what autograd saves (saved_tensors_hooks) in real
decoder layers; and the backward peak's moment (Note [The backward peak's moment] in
stowage/measure/hf_step.py) worked by hand on a logged step, through the planner."""

from __future__ import annotations

import os
import tempfile
import unittest

import torch

import support  # noqa: F401  (puts the package on sys.path)
from measure.hf_cases import HAVE, TINY, TINY_MLA, needs_hf, peak, plan
from stowage.measure.layer_profile import LayerProfile, ModelProfile, SavedTensor

if HAVE:
    from stowage.measure.hf_model import build_hf_model
    from stowage.measure.hf_step import evaluate
    from stowage.measure.hf_trace import StepTrace, trace_step
    from stowage.measure.live_bytes import LiveBytes, storage_key


@needs_hf
class LiveBytesTest(unittest.TestCase):
    def test_hand_count_of_a_tiny_module(self) -> None:
        w = torch.randn(8, 16, requires_grad=True)
        x = torch.randn(4, 8, requires_grad=True)
        mode = LiveBytes()
        saved: list[int] = []
        with mode, torch.autograd.graph.saved_tensors_hooks(
                lambda t: saved.append(storage_key(t)) or t, lambda t: t):
            loss = (x @ w).relu().sum()
            # mm's [4, 16] fp32 output (256 B) and relu's (256 B) were alive together; the mm
            # output is freed, relu's is saved for backward, the loss is 4 B.
            self.assertEqual(mode.peak, 512)
            self.assertEqual(mode.live, 256 + 4)
            # What autograd keeps that the step made: relu's output (x and w existed before).
            made = [k for k in saved if k in mode.live_ids]
            self.assertEqual(sum(mode.sizes[mode.live_ids[k]] for k in set(made)), 256)
            loss.backward()
            del loss
            # Left: the gradients, x.grad [4, 8] (128 B) and w.grad [8, 16] (512 B).
            self.assertEqual(mode.live, 128 + 512)
        self.assertEqual(mode.sizes[mode.ref(w.grad)], 512)

    def test_views_and_in_place_ops_allocate_nothing(self) -> None:
        x = torch.randn(64)
        mode = LiveBytes()
        with mode:
            y = x.view(8, 8).t()
            y.mul_(2)
            z = y.contiguous()  # a copy: 256 B
        self.assertEqual(mode.live, 256)
        del z
        self.assertEqual(mode.live, 0)

    def test_live_bytes_agree_with_autograd_saved_bytes_in_real_layers(self) -> None:
        # What stays allocated after a layer's forward, less its output, is what it saves.
        for family, config in TINY.items():
            hf = build_hf_model(config, fake=False)
            step = evaluate(trace_step(hf, 64))
            for j, layer in enumerate(step.layers):
                with self.subTest(family=family, layer=j):
                    self.assertGreater(layer.saved_bytes, 0)
                    self.assertEqual(layer.retained_bytes - layer.output_bytes, layer.saved_bytes)

    def test_a_dropped_branch_keeps_nothing(self) -> None:
        # Note [Saved by allocation]: the group-limited router's topk(2) indices and group mask
        # are saved for a branch of the graph it drops; they are freed before the layer ends
        # and their addresses go to later saves. What a layer keeps is what stays allocated
        # (the saved list counted them, and skipped later saves at reused addresses).
        step = evaluate(trace_step(build_hf_model(TINY_MLA["deepseek_v3"]), 64))
        for j, layer in enumerate(step.layers):
            with self.subTest(layer=j):
                self.assertEqual(layer.retained_bytes - layer.output_bytes, layer.saved_bytes)


@needs_hf
class BackwardMomentTest(unittest.TestCase):
    """Note [The backward peak's moment], worked by hand on a logged step of one layer: what its
    backward holds at its peak of its gradients and saved tensors, and the logits the caller
    holds; the planner reaches the live peak from them (a profile without them is 60 B high)."""

    # Allocation ids: 0 the layer's input, 1 and 2 its saved tensors A (100) and B (50), 3 its
    # output, 4 the logits (40), 5 the LM head's gradient (7), 6 the output's gradient, 7 and 9
    # the layer's weight gradients (120 made before the peak, 20 after), 8 a transient (10),
    # 10 the embedding's gradient.
    SIZES = [10, 100, 50, 10, 40, 7, 10, 120, 10, 20, 5]
    EVENTS = [("p", "embedding"), ("a", 0), ("p", ("forward", 0)), ("a", 1), ("a", 2), ("a", 3),
              ("m", ("forward_end", 0)), ("p", "loss"), ("a", 4), ("a", 5),
              ("p", ("backward", 0)), ("a", 6), ("f", 1), ("a", 7), ("a", 8), ("f", 8),
              ("f", 2), ("a", 9), ("f", 6), ("p", "embedding_backward"), ("a", 10),
              ("m", "backward_end"), ("f", 4), ("p", "end")]

    def trace(self) -> "StepTrace":
        return StepTrace(seq_len=8, events=self.EVENTS, sizes=self.SIZES,
                         saved=[[("A", 1, ""), ("B", 2, "")]], inputs=[0], outputs=[3],
                         grads={"loss": [5], ("layer", 0): [7, 9], "embedding": [10]},
                         work={}, module_work={})

    def test_the_moment_and_the_held_logits(self) -> None:
        step = evaluate(self.trace())
        layer = step.layers[0]
        # Live in the backward: 217 on entry (input 10, A, B, output 10, logits, head gradient),
        # the output's gradient 227, A released 127, gate/up's gradient 247, the transient 257:
        # the peak, with 120 of the layer's 140 gradient bytes made and 100 saved bytes freed.
        self.assertEqual((layer.grad_bytes, layer.peak_grad_bytes, layer.peak_released_bytes),
                         (140, 120, 100))
        self.assertEqual(step.held_logits_bytes, 40)
        # Own bytes at the peak: 257 less the head's gradient, the 120 made and the logits.
        self.assertEqual(layer.backward_own_bytes, 257 - 7 - 120 - 40)
        # The loss: 217 less the layer's saved 150 and its output.
        self.assertEqual(step.loss_peak_bytes, 57)
        self.assertEqual(step.peak_bytes, 257)

    def profile(self, stated: bool) -> "ModelProfile":
        step = evaluate(self.trace())
        p = step.layers[0]
        layer = LayerProfile(
            index=0, type="Layer", input_bytes=p.input_bytes, output_bytes=p.output_bytes,
            saved=[SavedTensor(n, b, m) for n, b, m in p.saved], modules=[],
            forward_peak_bytes=p.forward_own_bytes - p.input_bytes,
            backward_peak_bytes=p.backward_own_bytes, forward_seconds=0.001,
            backward_seconds=0.002, grad_bytes=p.grad_bytes,
            backward_peak_grad_bytes=p.peak_grad_bytes if stated else None,
            backward_peak_released_bytes=p.peak_released_bytes if stated else 0)
        if not stated:  # what the profile measured before: own bytes net of every gradient,
            layer.backward_peak_bytes += p.peak_grad_bytes - p.grad_bytes + step.held_logits_bytes
        return ModelProfile(layers=[layer], device="cpu", weights_bytes=0, gradients_bytes=0,
                            other_bytes=0, loss_peak_bytes=step.loss_peak_bytes,
                            loss_seconds=0.001, d2h_bytes_per_second=1e9,
                            h2d_bytes_per_second=1e9, tokens=8, gradients_in_backward=True,
                            loss_grad_bytes=step.loss_grad_bytes,
                            embedding_grad_bytes=step.embedding_grad_bytes,
                            held_logits_bytes=step.held_logits_bytes if stated else 0)

    def test_the_planner_reaches_the_live_peak(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "profile.json")
            peaks = []
            for stated in (True, False):
                self.profile(stated).save(path)
                peaks.append(peak(plan(["--profile", path, "--gpu-mem", "1", "--force", "keep"])))
        # Stated: 257 exactly. Net of all 140 gradient bytes with every saved tensor held, the
        # layer's own bytes clamp at saved + output + input: 150 + 20 + 140 + 7 = 317.
        self.assertEqual(peaks, [257, 317])


if __name__ == "__main__":
    unittest.main()
