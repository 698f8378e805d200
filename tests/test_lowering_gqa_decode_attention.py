"""``kda::gqa_decode_attention``: the op (CPU: torch's sdpa), its checks, and its Triton kernel
under the interpreter (fp16: this Triton's interpreter multiplies bf16 dots wrongly; bf16 runs in
the CUDA tests), split and direct, against a float32 sdpa reference."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from kda_inductor.lowerings import gqa_decode_attention as mod
from kda_inductor.testing import assert_close_to_eager

HAS_KERNEL_RUNNER = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(B, H, R, S, D, DV, mask, dtype=torch.float16, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, R, H, D, generator=g).to(dtype).transpose(1, 2)  # not contiguous, as a folded query
    k = torch.randn(B, H, S, D, generator=g).to(dtype)
    v = torch.randn(B, H, S, DV, generator=g).to(dtype)
    m = None
    if mask == "bool":  # a left-padded batch: [B, 1, 1, S]
        m = torch.ones(B, 1, 1, S, dtype=torch.bool)
        m[1::2, ..., : S // 3] = False
    elif mask == "float":  # one bias per row
        m = torch.randn(B, H, R, S, generator=g).to(dtype)
    elif mask == "keys":  # [1, S]: broadcast over everything else
        m = torch.randn(1, S, generator=g).to(dtype)
    elif mask == "empty_row":  # sequence 0 sees no key at all
        m = torch.rand(B, 1, 1, S, generator=g) > 0.5
        m[0] = False
        m[1:, ..., -1] = True
    return [t.to(device) if t is not None else None for t in (q, k, v, m)]


def _reference(q, k, v, m, scale=None):
    mm = m if m is None or m.dtype == torch.bool else m.float()
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mm, scale=scale)
    return torch.nan_to_num(out, nan=0.0)  # a row with no key: zeros (the op's definition)


needs_runner = pytest.mark.skipif(not HAS_KERNEL_RUNNER or mod.triton is None, reason="no triton runner")


@needs_runner
@pytest.mark.parametrize("B, H, R, S, D, DV, mask, sms", [
    (2, 2, 8, 70, 32, 32, "bool", 4),        # split: 4 programs per SM wanted, 2 heads
    (2, 2, 8, 70, 32, 32, "bool", 1),        # split into 1: written directly
    (3, 1, 3, 37, 24, 40, "float", 8),       # R, D, Dv not powers of two, Dv != D, per-row bias
    (2, 2, 4, 33, 16, 16, "keys", 2),        # a [S] mask
    (2, 1, 4, 40, 16, 16, "empty_row", 4),   # a row with no key: zeros
    (1, 2, 5, 5, 16, 16, None, 8),           # fewer keys than a block
], ids=["split", "direct", "odd_dims", "keys_mask", "empty_row", "short"])
def test_triton_kernel_matches_sdpa(B, H, R, S, D, DV, mask, sms):
    q, k, v, m = _case(B, H, R, S, D, DV, mask)
    out = torch.full((B, H, R, DV), float("nan"), dtype=q.dtype, device=q.device)  # poisoned
    mod.attention_triton(q, k, v, m, None, out, block_s=16, sms=sms)
    assert_close_to_eager(out.float(), _reference(q, k, v, m), atol=2e-3, rtol=2e-3)


@needs_runner
def test_triton_kernel_scale_and_splits():
    """A user's scale, and the split count: every split merged gives the unsplit result."""
    q, k, v, m = _case(2, 2, 4, 64, 16, 16, "bool", seed=3)
    outs = []
    for sms in (1, 2, 8):
        out = torch.full((2, 2, 4, 16), 5.0, dtype=q.dtype, device=q.device)
        mod.attention_triton(q, k, v, m, 0.3, out, block_s=16, sms=sms)
        outs.append(out.float())
    ref = _reference(q, k, v, m, scale=0.3)
    for out in outs:
        assert_close_to_eager(out, ref, atol=2e-3, rtol=2e-3)


def test_splits_for():
    assert mod.splits_for(heads=64, S=256, sms=132) == (4, 64)  # Qwen3-Next decode 32: 4 slices of 64 keys
    assert mod.splits_for(heads=512, S=4096, sms=132) == (1, 4096)  # enough heads: one slice, written directly
    assert mod.splits_for(heads=1, S=1, sms=132) == (1, mod.BLOCK_S)
    splits, per = mod.splits_for(heads=2, S=1000, sms=132)
    assert per % mod.BLOCK_S == 0 and (splits - 1) * per < 1000 <= splits * per


def test_op_on_cpu_is_sdpa():
    q, k, v, m = _case(2, 2, 4, 9, 8, 8, "bool", dtype=torch.float32, device="cpu")
    got = torch.ops.kda.gqa_decode_attention(q, k, v, m, None)
    assert_close_to_eager(got, F.scaled_dot_product_attention(q, k, v, attn_mask=m), exact=True)


def test_opcheck():
    q, k, v, m = _case(2, 2, 4, 9, 8, 8, "float", dtype=torch.float32, device="cpu")
    torch.library.opcheck(torch.ops.kda.gqa_decode_attention.default, (q, k, v, m, 0.5))
    torch.library.opcheck(torch.ops.kda.gqa_decode_attention.default, (q, k, v, None, None))


@pytest.mark.parametrize("change, message", [
    (lambda q, k, v, m: (q[0], k, v, m), r"query: expected a 4-D tensor"),
    (lambda q, k, v, m: (q, k[:, :1], v, m), r"key: expected \[B=2, Hkv=2, S, D=8\]"),
    (lambda q, k, v, m: (q, k, v[:, :, :3], m), r"value: expected \[B=2, Hkv=2, S=9, Dv\]"),
    (lambda q, k, v, m: (q, k, v.double(), m), r"value: expected query's dtype"),
    (lambda q, k, v, m: (q, k, v, m.int()), r"mask: expected a bool or floating-point tensor"),
    (lambda q, k, v, m: (q, k, v, m[..., :4]), r"mask: expected a shape that broadcasts to \[B, Hkv, R, S\]"),
])
def test_bad_arguments_name_the_argument(change, message):
    args = change(*_case(2, 2, 4, 9, 8, 8, "bool", dtype=torch.float32, device="cpu"))
    with pytest.raises(ValueError, match=message):
        torch.ops.kda.gqa_decode_attention(*args, None)


def test_refusal_names_what_the_kernel_does_not_take():
    q, _, v, _ = _case(1, 1, 2, 4, 8, 8, None, dtype=torch.float32, device="cpu")
    assert "bf16 / fp16" in mod.refusal(q, v)
    q, _, v, _ = _case(1, 1, 2, 4, 8, 8, None, device="cpu")
    assert mod.refusal(q, v) is None
    assert "over 256" in mod.refusal(q, torch.empty(1, 1, 4, 320, dtype=q.dtype))
