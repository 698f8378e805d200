"""The merge-free gated RMSNorm's own Triton kernel (``norm_rows_triton``, what
``kda::gated_norm_merge`` launches on CUDA with one source and no indices) against the CPU op:
within 1 ulp of the output dtype (interpreter and GPU alike: see assert_kernel_matches_cpu_op).
Every form, gate, reciprocal, block shape, a token-strided source and strided 2-D / 3-D gates;
poisoned outputs."""

from __future__ import annotations

import os

import pytest
import torch

from kda_inductor.lowerings import gated_norm_merge as mod
from tests.test_gated_norm_merge import assert_kernel_matches_cpu_op

HAS_RUNNER = mod.triton is not None and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")
pytestmark = pytest.mark.skipif(not HAS_RUNNER, reason="needs a GPU or TRITON_INTERPRET=1 with triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the interpreter truncates float32 -> bfloat16 instead of rounding: float16 there
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16


def _case(T, H, D, seed, *, x_pad=0, gate="contiguous"):
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(T, H * D + x_pad, generator=g).to(DTYPE).to(DEVICE)
    x = wide[:, x_pad:]  # token-strided when x_pad > 0
    zt = torch.randn(T, 3 * H * D, generator=g).to(DTYPE).to(DEVICE)
    z = {"contiguous": zt[:, :H * D].contiguous().view(-1, D),
         "split of a projection": zt[:, H * D:2 * H * D].view(T, H, D),
         "head-major": zt[:, :H * D].reshape(T, H, D).transpose(0, 1).contiguous().transpose(0, 1)}[gate]
    w = (1 + 0.1 * torch.randn(D, generator=g)).to(DEVICE)
    return x, z, w


def _check(x, z, w, *, act="silu", form="fla", rsqrt=True, block_m=None):
    D = w.shape[0]
    rows = x.shape[0] * (x.shape[1] // D)
    want = torch.ops.kda.gated_norm_merge.default([x.cpu()], [], z.cpu(), w.cpu(), 1e-6, act, form, rsqrt,
                                                  x.shape[0], DTYPE)
    y = torch.full((rows, D), 7.0, dtype=DTYPE, device=x.device)  # poisoned
    mod.norm_rows_triton(x, z, w, y, eps=1e-6, activation=act, form=form, rsqrt=rsqrt, block_m=block_m)
    assert_kernel_matches_cpu_op(y, want, f"{act} {form} rsqrt={rsqrt} block_m={block_m}")


@pytest.mark.parametrize("form", ["fla", "hf"])
@pytest.mark.parametrize("act", ["silu", "sigmoid"])
def test_triton_kernel_rows_matches_the_cpu_op(form, act):
    x, z, w = _case(T=7, H=3, D=16, seed=1)
    for rsqrt, block_m in ((True, None), (False, None), (True, 4), (True, 1)):
        _check(x, z, w, act=act, form=form, rsqrt=rsqrt, block_m=block_m)


@pytest.mark.parametrize("gate", ["split of a projection", "head-major"])
def test_triton_kernel_rows_strided_source_and_gate(gate):
    """A source whose token rows are strided (a slice of a wider buffer) and a gate read where
    it lies; D not a power of two (masked columns)."""
    x, z, w = _case(T=5, H=2, D=24, seed=2, x_pad=8, gate=gate)
    assert x.stride(0) != x.shape[1] and not z.is_contiguous()
    _check(x, z, w, block_m=2)
    _check(x, z, w)


def test_triton_kernel_rows_config_is_the_measured_table():
    """The launch table: each size band gets its measured (BLOCK_M, warps), the bands meet, the
    last one is open; other D keep BLOCK_M * D (at least one row)."""
    assert [mod.rows_config(r) for r in (1, 1024, 1025, 8192, 8193, 262144, 262145, 1 << 24)] == [
        (1, 1), (1, 1), (16, 8), (16, 8), (16, 4), (16, 4), (8, 1), (8, 1)]
    assert mod.rows_config(5000, 64) == (32, 8) and mod.rows_config(5000, 4096) == (1, 8)


ROUNDING_CASES = [(torch.float16, "fla"), (torch.float16, "hf"), (torch.bfloat16, "fla")]
if DEVICE == "cuda":  # the hf form rounds x * r to bf16: the interpreter's cast truncates
    ROUNDING_CASES.append((torch.bfloat16, "hf"))


@pytest.mark.parametrize("in_dtype, form", ROUNDING_CASES)
def test_triton_kernel_rows_rounds_float32_sources(in_dtype, form):
    """float32 sources read as the 16-bit input they round to (``in_dtype``: the pattern reads a
    norm's input before its rounding, ``patterns/_merged_norms._source_reads``): the kernel
    rounds in registers as eager's cast does (bf16 by integer arithmetic, the same bits under the
    interpreter); the CPU op equals the op on the rounded sources, bit for bit."""
    g = torch.Generator().manual_seed(9)
    x = (3 * torch.randn(6, 3 * 16, generator=g)).to(DEVICE)
    z = torch.randn(18, 16, generator=g).to(DTYPE).to(DEVICE)
    w = (1 + 0.1 * torch.randn(16, generator=g)).to(DEVICE)
    op = torch.ops.kda.gated_norm_merge.default
    want = op([x.cpu()], [], z.cpu(), w.cpu(), 1e-6, "silu", form, True, 6, DTYPE, None, None, in_dtype)
    rounded = op([x.cpu().to(in_dtype)], [], z.cpu(), w.cpu(), 1e-6, "silu", form, True, 6, DTYPE)
    assert torch.equal(want, rounded)
    y = torch.full((18, 16), 7.0, dtype=DTYPE, device=DEVICE)  # poisoned
    mod.norm_rows_triton(x, z, w, y, eps=1e-6, activation="silu", form=form, rsqrt=True, in_dtype=in_dtype)
    assert_kernel_matches_cpu_op(y, want, f"{in_dtype} {form}")
    y = torch.full((18, 16), 7.0, dtype=DTYPE, device=DEVICE)  # the merge kernel's loads round alike
    idx = torch.arange(6, device=DEVICE).flip(0)
    mod.norm_merge_triton([x.flip(0)], [idx], z, w, y, eps=1e-6, activation="silu", form=form, rsqrt=True,
                          num_tokens=6, in_dtype=in_dtype)
    assert_kernel_matches_cpu_op(y, want, f"merge {in_dtype} {form}")


def test_in_dtype_needs_float32_sources():
    """``in_dtype`` rounds float32 sources: 16-bit sources with it, or a float32 ``in_dtype``, are
    errors naming the argument."""
    x = torch.randn(2, 16)
    z, w = torch.randn(2, 16), torch.ones(16)
    op = torch.ops.kda.gated_norm_merge.default
    with pytest.raises(ValueError, match="in_dtype"):
        op([x.half()], [], z, w, 1e-6, "silu", "fla", True, 2, torch.float32, None, None, torch.bfloat16)
    with pytest.raises(ValueError, match="in_dtype"):
        op([x], [], z, w, 1e-6, "silu", "fla", True, 2, torch.float32, None, None, torch.float32)
