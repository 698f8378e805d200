"""``kda::gqa_decode_attention`` on CUDA: bf16 at the real models' dims against a float32 sdpa,
split and direct launches, CUDA-graph capture without host syncs, and the fold calling it in a
compiled decode attention (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from kda_inductor.lowerings import gqa_decode_attention as mod
from kda_inductor.testing import assert_close_to_eager, assert_cudagraph_safe, compile_for_test, fresh_compile, op_counts
from tests.test_gqa_decode_attention import GQAAttention, _inputs
from tests.test_lowering_gqa_decode_attention import _case, _reference

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU


@pytest.mark.parametrize("B, H, R, S, D, mask", [
    (32, 2, 8, 257, 256, "bool"),     # Qwen3-Next decode 32: split over the keys
    (128, 4, 4, 300, 256, "bool"),    # Qwen3.5's 4 kv heads at 128 sequences: one slice, direct
    (3, 2, 8, 1000, 128, "float"),    # few heads, many keys: many slices; a per-row bias
    (2, 1, 5, 77, 192, "empty_row"),  # D not a power of two; a row with no key
], ids=["qwen3_next_b32", "qwen3_5_b128", "long_float", "odd_empty"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_op_matches_float32_sdpa(B, H, R, S, D, mask, dtype):
    q, k, v, m = _case(B, H, R, S, D, D, mask, dtype=dtype, device="cuda")
    got = torch.ops.kda.gqa_decode_attention(q, k, v, m, None)
    ref = _reference(q, k, v, m)
    step = torch.finfo(dtype).eps * float(ref.abs().max())
    assert_close_to_eager(got.float(), ref, atol=4 * step, rtol=0.02)


def test_graph_capture_and_no_host_syncs():
    q, k, v, m = _case(32, 2, 8, 257, 256, 256, "bool", dtype=torch.bfloat16, device="cuda")
    op = lambda *a: torch.ops.kda.gqa_decode_attention(*a, None)  # noqa: E731
    op(q, k, v, m)  # the Triton compile (it may sync) before the checked call
    assert_cudagraph_safe(op, q, k, v, m)


def test_float32_runs_torch_sdpa():
    q, k, v, m = _case(2, 2, 4, 40, 64, 64, "bool", dtype=torch.float32, device="cuda")
    assert "bf16 / fp16" in mod.refusal(q, v)
    got = torch.ops.kda.gqa_decode_attention(q, k, v, m, None)
    assert_close_to_eager(got, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m))


def test_fold_calls_the_kernel_in_a_compiled_step(monkeypatch):
    from kda_inductor.patterns import gqa_decode_attention as pattern

    monkeypatch.setitem(pattern.KERNEL_MEASURED, "cuda", True)
    torch.manual_seed(0)
    layer = GQAAttention(hidden=256, heads=16, kv_heads=2, head_dim=128).eval().cuda().to(torch.bfloat16)
    args = [t.cuda() if t is not None else None for t in _inputs(layer, "bool", batch=8, context=300,
                                                                 dtype=torch.bfloat16)]
    with torch.inference_mode(), fresh_compile():
        c = compile_for_test(layer, force=False)
        got, want = c(*args), layer(*args)
    assert c.matches["gqa_decode_attention"] == 1
    assert op_counts(c).after["kda.gqa_decode_attention.default"] == 1
    assert_close_to_eager(got, want)
