"""The op work LiveBytes counts (stowage.measure.op_work, Note [Kernel bytes]): ops whose CUDA
kernels move other bytes than their arguments, sorts and their passes, GEMMs by their operands'
dtype, grouped GEMMs."""

from __future__ import annotations

import unittest

import torch

import support  # noqa: F401  (puts the package on sys.path)
from measure.hf_cases import HAVE, needs_hf

if HAVE:
    from stowage.measure.live_bytes import LiveBytes
    from stowage.measure.op_work import OpWork, radix_sort_work, sort_key_bits


@needs_hf
class KernelBytesTest(unittest.TestCase):
    """Note [Kernel bytes]: ops whose CUDA kernels move other bytes than their arguments."""

    def work(self, fn) -> "OpWork":
        mode = LiveBytes()
        with mode:
            fn()
        return mode.work[None]

    def test_softmax_reads_a_wide_row_three_times(self) -> None:
        wide = torch.randn(4, 16384)   # 64 KiB fp32 rows: beyond one block's shared memory
        narrow = torch.randn(4, 128)
        self.assertEqual(self.work(lambda: torch.log_softmax(wide, -1)).elementwise_bytes,
                         3 * wide.nbytes + wide.nbytes)
        self.assertEqual(self.work(lambda: torch.softmax(narrow, -1)).elementwise_bytes,
                         2 * narrow.nbytes)

    def test_loss_reads_one_value_per_row(self) -> None:
        logp = torch.randn(8, 16384).log_softmax(-1).requires_grad_()
        target = torch.randint(0, 16384, (8,))
        w = self.work(lambda: torch.nn.functional.nll_loss(logp, target).backward())
        # nll_loss: the targets, one fp32 per row and the loss; its backward: the [8, V]
        # gradient written once and the targets — never the logits.
        self.assertLess(w.elementwise_bytes, logp.nbytes + 4 * target.nbytes)
        self.assertGreaterEqual(w.elementwise_bytes, logp.nbytes)

    def test_sort_and_fills(self) -> None:
        # Note [Routing kernels] in planner/frameworks/hf_ffn.cc
        # (tests/planner/frameworks/hf_routing_test.cc pins RadixSortWork to the same numbers):
        # every bit of an int64 key, 8 passes, the positions' fill; 21 kernels.
        keys = torch.randint(0, 128, (1000,))
        w = self.work(lambda: torch.sort(keys))
        self.assertEqual((w.elementwise_bytes, w.kernels), ((8 + 8 * 32 + 8) * 1000, 21))
        self.assertEqual(radix_sort_work(8, 64), (8 + 8 * 32, 20))
        self.assertEqual(radix_sort_work(8, 13), (8 + 2 * 32, 8))
        self.assertEqual(radix_sort_work(8, 17), (8 + 3 * 32, 10))
        self.assertEqual([sort_key_bits(n) for n in (0, 1, 2, 127, 8191, 65535, 65536)],
                         [1, 1, 2, 7, 13, 16, 17])
        x = torch.randn(64, 64)
        self.assertEqual(self.work(lambda: x.new_zeros(64, 64)).elementwise_bytes, x.nbytes)

    def test_index_put_rewrites_a_row_per_duplicate(self) -> None:
        # A gather's gradient with 8 copies of each of 16 rows (transformers' `hidden[perm // k]`
        # at top-8): indexing_backward_kernel reads every value row and reads and rewrites its
        # destination row for each, 3 x 128 x 64 x 4 bytes, plus the indices and their sort.
        target, values = torch.zeros(16, 64), torch.randn(128, 64)
        index = torch.arange(16).repeat_interleave(8)
        w = self.work(lambda: target.index_put_((index,), values, accumulate=True))
        # The sort: the 16 destination rows' ids on 4 bits, one pass, after the linear index
        # (three int64 kernels) and the positions: 56 + 8 + 32 bytes per index, 4 + 6 kernels.
        self.assertEqual(w.elementwise_bytes, 3 * values.nbytes + index.nbytes + 96 * 128)
        self.assertEqual(w.kernels, 1 + 4 + 6)
        # One-element slices sum a row's duplicates in a warp (indexing_backward_kernel_stride_1):
        # every tensor once.
        flat, weights = torch.zeros(16), torch.randn(128)
        w = self.work(lambda: flat.index_put_((index,), weights, accumulate=True))
        self.assertEqual(w.elementwise_bytes,
                         2 * flat.nbytes + weights.nbytes + index.nbytes + 96 * 128)
        # 8192 tokens' rows (13 bits) and 65536 routed rows (16): two passes, 128 bytes.
        wide, rows, grads = torch.zeros(8192, 2), torch.arange(8192), torch.randn(8192, 2)
        w = self.work(lambda: wide.index_put_((rows,), grads, accumulate=True))
        self.assertEqual(w.elementwise_bytes, 3 * 8192 * 2 * 4 + 8192 * 8 + 128 * 8192)
        self.assertEqual(w.kernels, 1 + 4 + 8)

    def test_topk_sorts_its_results_and_histc_zeroes_partials(self) -> None:
        # Note [Routing kernels]: the selection, then sorted=True's in-place sort of the k
        # values and int64 indices; histc's output zeros and, from 100 bins, its partials'.
        probs = torch.randn(64, 128)
        w = self.work(lambda: torch.topk(probs, 8, dim=-1))
        self.assertEqual((w.elementwise_bytes, w.kernels), (probs.nbytes + 3 * 64 * 8 * 12, 2))
        w = self.work(lambda: torch.topk(probs, 8, dim=-1, sorted=False))
        self.assertEqual((w.elementwise_bytes, w.kernels), (probs.nbytes + 64 * 8 * 12, 1))
        ids = torch.randint(0, 128, (512,)).float()
        self.assertEqual(self.work(lambda: torch.histc(ids, bins=128, min=0, max=127)).kernels, 3)
        self.assertEqual(self.work(lambda: torch.histc(ids, bins=60, min=0, max=59)).kernels, 2)

    def test_a_matmul_on_fp32_operands_is_an_fp32_gemm(self) -> None:
        # Note [Op time] (planner/hardware/op_time.cc): float32 mm / bmm run on the CUDA cores (TF32
        # off by torch's default), bf16 ones on the tensor cores; the operands' dtype decides.
        a, b = torch.randn(4, 64, 32), torch.randn(4, 32, 16)
        w = self.work(lambda: a @ b)
        self.assertEqual((w.fp32_gemm_flops, w.gemm_flops), (2 * 4 * 64 * 32 * 16, 0))
        w = self.work(lambda: a.bfloat16() @ b.bfloat16())
        self.assertEqual((w.fp32_gemm_flops, w.gemm_flops), (0, 2 * 4 * 64 * 32 * 16))
        x, weight = torch.randn(8, 32), torch.randn(16, 32)
        w = self.work(lambda: torch.nn.functional.linear(x, weight))
        self.assertEqual((w.fp32_gemm_flops, w.gemm_flops), (2 * 8 * 32 * 16, 0))

    @unittest.skipUnless(hasattr(torch, "_grouped_mm"), "torch without _grouped_mm")
    def test_grouped_mm_is_two_kernels(self) -> None:
        x, w8 = torch.randn(32, 16).bfloat16(), torch.randn(4, 16, 8).bfloat16()
        offs = torch.tensor([8, 16, 24, 32], dtype=torch.int32)
        w = self.work(lambda: torch._grouped_mm(x, w8, offs=offs))
        self.assertEqual((w.kernels, w.torch_grouped_mm_flops), (2, 2 * 32 * 16 * 8))


if __name__ == "__main__":
    unittest.main()
