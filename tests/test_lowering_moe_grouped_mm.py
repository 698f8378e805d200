"""``kda::moe_grouped_mm``: the op (CPU: torch's grouped GEMM), its checks, and its Triton kernel under
the interpreter (fp16: this Triton's interpreter multiplies bf16 dots wrongly; bf16 runs in the CUDA
tests) against the groups one by one in float32: empty groups, groups longer than a row block, K and
N not multiples of their tiles, the weights as a transposed view, rows past the last offset left as
they were."""

from __future__ import annotations

import os

import pytest
import torch

from kda_inductor.lowerings import moe_grouped_mm as mod

HAS_KERNEL_RUNNER = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_runner = pytest.mark.skipif(not HAS_KERNEL_RUNNER or mod.triton is None, reason="no triton runner")


def _case(S, E, K, N, counts=None, dtype=torch.float16, seed=0, transposed=True, device=DEVICE):
    """``(x [S, K], w [E, K, N], offs [E])``: ``counts`` rows a group (random where None; their sum may be
    below S: the rows after it belong to no group), ``w`` the ``[E, N, K]`` weights transposed (a view)."""
    g = torch.Generator().manual_seed(seed)
    if counts is None:
        counts = torch.multinomial(torch.ones(E), S, replacement=True, generator=g).bincount(minlength=E).tolist()
    x = torch.randn(S, K, generator=g).to(dtype)
    w = (torch.randn(E, N, K, generator=g) / K ** 0.5).to(dtype)
    w = w.transpose(1, 2) if transposed else w.transpose(1, 2).contiguous()
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    return x.to(device), w.to(device), offs.to(device)


@needs_runner
@pytest.mark.parametrize("S, E, K, N, counts, launch", [
    (20, 4, 64, 48, [5, 0, 12, 3], None),                 # an empty group; N not a multiple of 32
    (40, 3, 80, 32, [3, 35, 2], (16, 32, 32, 4, 2)),      # a group of 35 rows: three row blocks of 16
    (24, 5, 48, 40, [4, 4, 0, 4, 4], (16, 16, 32, 4, 2)),  # K 48 in tiles of 32 (a masked tail)
    (30, 4, 32, 24, [6, 6, 6, 6], None),                   # 6 rows past the last offset: left as they were
    (16, 6, 32, 16, None, None),                           # random counts
], ids=["empty_group", "long_group", "k_tail", "rows_past_offs", "random"])
def test_triton_kernel_matches_the_groups_one_by_one(S, E, K, N, counts, launch):
    x, w, offs = _case(S, E, K, N, counts)
    poison = torch.full((S, N), float("nan"), dtype=x.dtype, device=x.device)
    out = poison.clone()
    mod.grouped_triton(x, w, offs, out, launch=launch, sms=4)
    used = int(offs[-1])
    want = mod.reference(x, w, offs)
    torch.testing.assert_close(out[:used].float(), want[:used].float(), rtol=2e-3, atol=2e-3)
    assert torch.isnan(out[used:]).all(), "rows past the last offset were written"


@needs_runner
def test_contiguous_weights_and_a_strided_x():
    """``w`` stored ``[E, K, N]`` (transformers' ``is_transposed`` experts) and ``x`` a column slice."""
    x, w, offs = _case(12, 3, 32, 16, [4, 5, 3], transposed=False)
    wide = torch.randn(12, 48, dtype=x.dtype, device=x.device)
    wide[:, 8:40] = x
    x = wide[:, 8:40]
    out = torch.full((12, 16), float("nan"), dtype=x.dtype, device=x.device)
    mod.grouped_triton(x, w, offs, out, sms=4)
    torch.testing.assert_close(out.float(), mod.reference(x, w, offs).float(), rtol=2e-3, atol=2e-3)


def test_the_op_on_cpu_is_torchs_grouped_mm():
    """bf16 on CPU: ``torch._grouped_mm`` itself, bit for bit; other dtypes the groups one by one."""
    x, w, offs = _case(20, 4, 32, 16, [5, 0, 12, 3], dtype=torch.bfloat16, device="cpu")
    got = torch.ops.kda.moe_grouped_mm(x, w, offs)
    assert torch.equal(got[:20], torch._grouped_mm(x, w, offs=offs)[:20])
    x32, w32 = x.float(), w.float()
    torch.testing.assert_close(torch.ops.kda.moe_grouped_mm(x32, w32, offs), mod.reference(x32, w32, offs))


@pytest.mark.parametrize("args, name, says", [
    (lambda x, w, o: (x[0], w, o), "x", "2-D"),
    (lambda x, w, o: (x, w[:, :8], o), "w", "K=32"),
    (lambda x, w, o: (x, w.float(), o), "w", "dtype"),
    (lambda x, w, o: (x, w, o.long()), "offs", "int32"),
    (lambda x, w, o: (x, w, o[:2]), "offs", "E=4"),
    (lambda x, w, o: (x.int(), w.int(), o), "x", "bf16, fp16 or fp32"),
])
def test_bad_arguments_name_themselves(args, name, says):
    x, w, offs = _case(20, 4, 32, 16, [5, 0, 12, 3], dtype=torch.bfloat16, device="cpu")
    with pytest.raises(ValueError, match=rf"^{name}: .*{says}"):
        torch.ops.kda.moe_grouped_mm(*args(x, w, offs))


def test_fake_gives_the_shape_without_running():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w = torch.empty(320, 2048, dtype=torch.bfloat16), torch.empty(16, 2048, 1024, dtype=torch.bfloat16)
        out = torch.ops.kda.moe_grouped_mm(x, w, torch.empty(16, dtype=torch.int32))
    assert out.shape == (320, 1024) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("S, E, K, N, sms, want", [
    (320, 16, 2048, 1024, 132, (32, 32, 128, 4, 4)),    # Qwen3-Next decode 32, gate_up: 20 rows a group, 256 column blocks of 64 under 2 an SM
    (320, 512, 2048, 1024, 132, (16, 64, 128, 4, 4)),   # 512 experts: under a row a group
    (1280, 16, 512, 2048, 132, (64, 64, 128, 4, 3)),    # decode 128, down: 80 rows a group
    (320, 16, 512, 2048, 132, (32, 128, 64, 8, 3)),     # decode 32, down: 32-row blocks over K 512 (measured)
    (320, 16, 1024, 2048, 132, (32, 64, 128, 4, 4)),    # ... not over a longer K
    (320, 4, 2048, 256, 132, (64, 32, 128, 4, 3)),      # few column blocks: narrower ones
    (10, 16, 40, 64, 132, (16, 32, 64, 4, 4)),          # K under a tile
])
def test_launch_for(S, E, K, N, sms, want):
    assert mod.launch_for(S, E, K, N, sms) == want
