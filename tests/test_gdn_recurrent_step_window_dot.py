"""``gdn_recurrent_step``'s window body with its state-tile products on tensor cores
(``LaunchConfig(window=True, window_dot=...)``, :mod:`kda_inductor.lowerings._gdn_window_dot`): the
window's tokens padded to 16 rows for ``tl.dot``, the d-solve by a unit lower-triangular inverse.

On CPU under the interpreter (``tl.dot`` is a float32 matmul there whatever the precision: every
precision (on a GPU ``ieee`` and ``tf32x3``) is held to the lowering test's float32 ``TOL`` against the CPU op and to 1e-5 against the
float64 einsum reference), on fresh random inputs into NaN-poisoned outputs: scalar and per key channel
decay, grouped heads, masked K / V (12 / 20: padded key rows, a partial column block), with and without
l2norm or a state, in place, T = 2, 3, 4, 5, 8 (16 padded rows; rows past T must add exactly zero, also
at ``eps = 0``, where a padded row's norm would be ``0 * inf``), and one case at the real dims
(K = V = 128). On the GPU (``pytest.mark.cuda``): Qwen3-Next's and Kimi's dims, T = 2 / 4 / 8, B = 32:
``ieee`` and ``tf32x3`` at float32's bounds (``TOL`` on the state, a bf16 step on the output), ``tf32``
(one tf32 product, 10-bit mantissas) at its own bound, ``TF32_BOUND`` of the outputs' scale (not yet
measured on a GPU: the test prints the error it sees).
"""

from __future__ import annotations

import pytest
import torch

from kda_inductor.lowerings import gdn_recurrent_step as mod
from tests.test_lowering_gdn_recurrent_step import (
    DEVICE,
    TOL,
    _kernel_vs_op,
    einsum_reference,
    inputs,
    needs_runner,
    op,
)

dot = pytest.importorskip("kda_inductor.lowerings._gdn_window_dot") if mod.triton is not None else None
PRECISIONS = ("ieee", "tf32x3", "tf32")
FLOAT32_LIKE = PRECISIONS if DEVICE == "cpu" else ("ieee", "tf32x3")
"""The precisions held to float32's ``TOL`` (under the interpreter all three are float32 matmuls; on a GPU
``tf32`` is not, and has its own test)."""
TF32_BOUND = 1e-2
"""``tf32``'s bound on the GPU, relative to the outputs' / state's largest magnitude (inputs rounded to
10-bit mantissas, ~5e-4 each, summed over K = 128 and 8 tokens); provisional until measured."""


def wdot(precision="tf32x3", bv=16, warps=1, transposed=False, key_block=0):
    return mod.LaunchConfig(bv, warps, window=True, window_dot=precision, dot_transposed=transposed,
                            dot_key_block=key_block)


def _against_float64(args, got, final, l2=True):
    want, want_state = einsum_reference(*args, 0.25 if l2 else 1.0, l2)
    torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final.cpu().double(), want_state, rtol=1e-5, atol=1e-5)


@needs_runner
@pytest.mark.parametrize("T", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_dot_window_matches_the_op_and_float64(T, per_channel):
    """Two key heads over four value heads (head ``h`` reads key head ``h // 2``), K = 12 / V = 20
    (masked rows, two column blocks of 16, the second partial), B = 3 at odd T and 1 at even; in place
    for a per-channel decay; each precision in turn, transposed (``dot_transposed``) at T = 3 and 8."""
    B = 3 if T % 2 else 1
    args = inputs(4000 + 10 * T + per_channel, B=B, T=T, Hk=2, Hv=4, K=12, V=20, per_channel=per_channel)
    cfg = wdot(FLOAT32_LIKE[(T + per_channel) % len(FLOAT32_LIKE)], transposed=T in (3, 8))
    got, final = _kernel_vs_op(args, config=cfg, inplace=per_channel)
    _against_float64(args, got, final)


@needs_runner
@pytest.mark.parametrize("case", ["no state", "no l2norm", "strided bf16", "two warps bv32", "transposed"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_dot_window_options(case, per_channel):
    """From a zeros state; without l2norm (g strongly negative: the couplings' decays far from 1);
    head-major strided bf16 inputs into a bf16 output; 32 columns x 2 warps."""
    T = 4 if per_channel else 3
    q, k, v, g, beta, s = inputs(4100 + len(case) + per_channel, B=2, T=T, Hk=1, Hv=2, K=12, V=20,
                                 per_channel=per_channel, state=case != "no state",
                                 layout="head-major" if case == "strided bf16" else "token-major",
                                 dtype=torch.bfloat16 if case == "strided bf16" else torch.float32)
    if case == "no l2norm":
        _kernel_vs_op((0.3 * q, 0.3 * k, v, 4 * g, beta, s), scale=1.0, l2=False, config=wdot("ieee"))
    elif case == "strided bf16":
        _kernel_vs_op((q, k, v, g, beta, s), config=wdot(), out_dtype=torch.bfloat16)
    else:
        cfg = wdot(bv=32, warps=2) if case == "two warps bv32" else wdot(transposed=case == "transposed")
        got, final = _kernel_vs_op((q, k, v, g, beta, s), config=cfg)
        _against_float64((q, k, v, g, beta, s), got, final)


@needs_runner
@pytest.mark.parametrize("per_channel", [False, True])
def test_dot_window_padded_rows_add_nothing_at_eps_zero(per_channel):
    """``eps = 0`` with l2norm: a padded row's ``0 * rsqrt(0)`` would be NaN; the rows past T (3 of
    16) must stay exactly zero, so the outputs and state are finite and the CPU op's."""
    q, k, v, g, beta, s = inputs(4200 + per_channel, B=1, T=3, Hk=1, Hv=2, K=16, V=16, per_channel=per_channel)
    want, want_state = op(q, k, v, g, beta, s, 0.25, True, 0.0)
    out = torch.full_like(want, float("nan"))
    got, final = mod.step_triton(q, k, v, g, beta, s, 0.25, True, 0.0, out=out, config=wdot())
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(final, want_state, **TOL)


@needs_runner
@pytest.mark.parametrize("per_channel", [False, True])
def test_dot_window_at_the_real_dims(per_channel):
    """K = V = 128 (Qwen3-Next's and Kimi's heads), T = 4, grouped heads, one sequence (transposed for
    a per-channel decay)."""
    args = inputs(4300 + per_channel, B=1, T=4, Hk=1, Hv=2, K=128, V=128, per_channel=per_channel)
    cfg = wdot("ieee", bv=64, warps=4, transposed=per_channel)
    got, final = _kernel_vs_op(args, config=cfg, inplace=not per_channel)
    _against_float64(args, got, final)


@pytest.mark.skipif(mod.triton is None, reason="needs triton")
def test_dot_window_config_errors():
    """A precision outside ``tl.dot``'s, fewer than 16 columns, or no window: errors that say so,
    before any launch (the state untouched); T = 1 and T past ``MAX_WINDOW`` run token by token."""
    args = inputs(4400, B=1, T=2, Hk=1, Hv=1, K=16, V=16)
    for cfg, match in ((wdot("bf16"), "window_dot must be '' .off. or one of"), (wdot(bv=8), "block_v >= 16"),
                       (mod.LaunchConfig(16, 1, window_dot="ieee"), "needs window=True")):
        state = args[-1].clone()
        with pytest.raises(ValueError, match=match):
            mod.step_triton(*args[:5], state, 0.25, True, inplace=True, config=cfg)
        assert torch.equal(state, args[-1])
    assert mod._window_rows(wdot(), 3, "cpu") == (16, 4) and mod._window_rows(wdot(), 1, "cpu") == (0, 0)
    assert mod._window_rows(wdot(), 9, "cpu") == (0, 0) and mod._window_rows(wdot()._replace(window_dot=""), 3,
                                                                              "cpu") == (4, 4)
    assert set(PRECISIONS) <= set(dot.allowed_precisions("cpu"))
    assert mod.LaunchConfig(16, 1).window_dot == "" and not any(r.config.window_dot for r in mod.LAUNCH_TABLE)


@needs_runner
@pytest.mark.parametrize("T", [1, 9])
def test_dot_window_config_outside_the_window(T):
    """A dot-window launch given one token or more than ``MAX_WINDOW`` runs the token-by-token body."""
    _kernel_vs_op(inputs(4500 + T, B=1, T=T, Hk=1, Hv=2, K=12, V=20), config=wdot())


@needs_runner
@pytest.mark.parametrize("T", [3, 8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("dims", [(12, 20, 32), (48, 20, 16), (128, 128, 32), (128, 128, 64)])
def test_dot_window_in_key_blocks(dims, per_channel, T):
    """``dot_key_block``: the tile as ``KP / KS`` register chunks (:mod:`._gdn_window_dot_ks`). K = 12 /
    V = 20 (KS 32 lowered to KP = 16: one chunk; masked keys, a partial column block; grouped heads, B = 2),
    K = 48 in four chunks of 16 (the last all past K), K = V = 128 in four chunks of 32 and two of 64 (B = 1);
    in place for a per-channel decay; against the CPU op and the float64 reference."""
    K, V, ks = dims
    small = K < 128
    args = inputs(4700 + K + ks + 10 * T + per_channel, B=2 if small else 1, T=T, Hk=2 if small else 1, Hv=4 if small
                  else 2, K=K, V=V, per_channel=per_channel)
    cfg = wdot(FLOAT32_LIKE[(T + per_channel + ks) % len(FLOAT32_LIKE)], bv=16 if small else 64,
               warps=1 if small else 4, key_block=ks)
    got, final = _kernel_vs_op(args, config=cfg, inplace=per_channel)
    _against_float64(args, got, final)


@needs_runner
@pytest.mark.parametrize("case", ["no state", "no l2norm", "strided bf16", "eps zero"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_dot_window_in_key_blocks_options(case, per_channel):
    """``dot_key_block`` 16 at K = 64 (four chunks): from a zeros state; without l2norm (g strongly
    negative); head-major strided bf16 inputs into a bf16 output; ``eps = 0`` with l2norm (the padded rows'
    factors exactly zero, the outputs finite)."""
    T = 4 if per_channel else 3
    q, k, v, g, beta, s = inputs(4800 + len(case) + per_channel, B=2, T=T, Hk=1, Hv=2, K=64, V=20,
                                 per_channel=per_channel, state=case != "no state",
                                 layout="head-major" if case == "strided bf16" else "token-major",
                                 dtype=torch.bfloat16 if case == "strided bf16" else torch.float32)
    cfg = wdot("ieee", key_block=16)
    if case == "no l2norm":
        _kernel_vs_op((0.3 * q, 0.3 * k, v, 4 * g, beta, s), scale=1.0, l2=False, config=cfg)
    elif case == "strided bf16":
        _kernel_vs_op((q, k, v, g, beta, s), config=cfg, out_dtype=torch.bfloat16)
    elif case == "eps zero":
        want, want_state = op(q, k, v, g, beta, s, 0.25, True, 0.0)
        out = torch.full_like(want, float("nan"))
        got, final = mod.step_triton(q, k, v, g, beta, s, 0.25, True, 0.0, out=out, config=cfg)
        torch.testing.assert_close(got, want, **TOL)
        torch.testing.assert_close(final, want_state, **TOL)
    else:
        got, final = _kernel_vs_op((q, k, v, g, beta, s), config=cfg)
        _against_float64((q, k, v, g, beta, s), got, final)


@pytest.mark.skipif(mod.triton is None, reason="needs triton")
def test_dot_window_key_block_config():
    """A key block that is not a power of two >= 16, with ``dot_transposed`` or without ``window_dot``:
    errors before any launch (the state untouched); the block between ``KP / 4`` and ``KP``; off by default."""
    from kda_inductor.lowerings._gdn_window_dot_ks import key_block

    args = inputs(4900, B=1, T=2, Hk=1, Hv=1, K=16, V=16)
    for cfg, match in ((wdot(key_block=24), "power of two >= 16"), (wdot(key_block=8), "power of two >= 16"),
                       (wdot(transposed=True, key_block=32), "does not take dot_transposed"),
                       (mod.LaunchConfig(16, 1, window=True, dot_key_block=32), "needs window_dot")):
        state = args[-1].clone()
        with pytest.raises(ValueError, match=match):
            mod.step_triton(*args[:5], state, 0.25, True, inplace=True, config=cfg)
        assert torch.equal(state, args[-1])
    assert [key_block(ks, 128) for ks in (0, 16, 32, 64, 256)] == [0, 32, 32, 64, 128]
    assert key_block(32, 16) == 16 and key_block(16, 256) == 64
    assert mod.LaunchConfig(16, 1).dot_key_block == 0 and not any(r.config.dot_key_block for r in mod.LAUNCH_TABLE)


# ------------------------------------------------------------------------------------------ CUDA
DIMS = {"qwen3_next": (16, 32, False), "kimi_linear": (32, 32, True)}  # Hk, Hv, per-channel (K = V = 128)


def _cuda_inputs(family, B, T, seed):
    hk, hv, kda = DIMS[family]
    q, k, v, g, beta, s = inputs(seed, B=B, T=T, Hk=hk, Hv=hv, K=128, V=128, per_channel=kda)
    return (q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta.bfloat16(), 0.1 * s)


def _rel(got, want):
    return ((got.float().cpu() - want).abs().max() / want.abs().max()).item()


@pytest.mark.cuda
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("family", sorted(DIMS))
@pytest.mark.parametrize("T", [2, 4, 8])
def test_cuda_dot_window_at_model_dims(T, family, precision):
    """B = 32 in place at 16 columns x 4 warps, 64 x 8 and 64 x 4 transposed, and 16 x 4 / 64 x 8 in key
    blocks of 32 (``dot_key_block``), against the float32 CPU op."""
    args = _cuda_inputs(family, 32, T, seed=4600 + T)
    want, want_state = op(*args, 0.25, True)
    for cfg in (wdot(precision, warps=4), wdot(precision, bv=64, warps=8), wdot(precision, 64, 4, True),
                wdot(precision, warps=4, key_block=32), wdot(precision, bv=64, warps=8, key_block=32)):
        state = args[-1].cuda().clone()
        out = torch.full(want.shape, float("nan"), dtype=want.dtype, device="cuda")
        mod.step_triton(*(x.cuda() for x in args[:5]), state, 0.25, True, inplace=True, out=out, config=cfg)
        err_o, err_s = _rel(out, want.float()), _rel(state, want_state)
        print(f"{family} T={T} {precision} {cfg.block_v}x{cfg.num_warps}{' tr' * cfg.dot_transposed}{f' ks{cfg.dot_key_block}' * bool(cfg.dot_key_block)}: "
              f"out {err_o:.2e} state {err_s:.2e}")
        if precision == "tf32":
            assert err_o <= TF32_BOUND and err_s <= TF32_BOUND
        else:
            torch.testing.assert_close(state.cpu(), want_state, **TOL)
            torch.testing.assert_close(out.cpu().float(), want.float(), rtol=0,
                                       atol=2 ** -7 * want.abs().max().item())
