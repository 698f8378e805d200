"""mla_decode_absorb on CUDA: bf16 at Kimi Linear's MLA dims (the scores in float32 through
``bmm``'s ``out_dtype`` where torch has it), against eager and a float32 eager, under
``mode="reduce-overhead"`` with no cudagraph skip (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from kda_inductor.testing import assert_close_to_eager, assert_no_cudagraph_skips, compile_for_test, fresh_compile
from tests.test_mla_decode_absorb import MLAAttention, _inputs

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU


def _kimi_layer():
    """Kimi Linear's MLA dims (32 heads, rank 512, dn 128, dr 64, dv 128), a smaller hidden size."""
    torch.manual_seed(0)
    return MLAAttention(hidden=256, heads=32, rank=512, dn=128, dr=64, dv=128).eval().cuda()


@pytest.mark.parametrize("mask", ["bool", "float"])
def test_bf16_decode_close_to_eager(mask):
    layer = _kimi_layer()
    args = [t.cuda() if t is not None else None for t in _inputs(layer, mask, batch=8, context=300, seed=1)]
    want32 = layer(*args)  # float32 eager
    layer, args = layer.bfloat16(), [t.bfloat16() if t is not None and t.is_floating_point() else t for t in args]
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(layer)
        got, want = c(*args), layer(*args)
    assert c.matches["mla_decode_absorb"] == 1
    # as close to the float32 model as bf16 eager is (within its own distance, plus a bf16 step)
    bound = float((want.float() - want32).abs().max()) + torch.finfo(torch.bfloat16).eps * float(want32.abs().max())
    assert float((got.float() - want32).abs().max()) <= 2 * bound
    assert_close_to_eager(got.float(), want.float(), atol=2 * bound, rtol=0.05)


def test_reduce_overhead_no_cudagraph_skips():
    layer = _kimi_layer().bfloat16()

    def run():
        for seed in range(3):
            args = [t.cuda() if t is not None else None for t in _inputs(layer, "bool", batch=4, context=64, seed=seed)]
            args = [t.bfloat16() if t is not None and t.is_floating_point() else t for t in args]
            got, want = compiled(*args), layer(*args)
            assert_close_to_eager(got.float(), want.float(), atol=0.05, rtol=0.05)

    with torch.no_grad(), fresh_compile():
        compiled = compile_for_test(layer, mode="reduce-overhead")
        assert_no_cudagraph_skips(run)
    assert compiled.matches["mla_decode_absorb"] >= 1
