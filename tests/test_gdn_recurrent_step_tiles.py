"""``gdn_recurrent_step``'s persistent body (``LaunchConfig(persistent=...)``, ``_gdn_tiles``): a
few programs looping over the state tiles, the tile loop software-pipelined (``num_stages``), the
tokens unrolled or in the runtime loop. On CPU under the interpreter (``INTERPRETER_SMS`` "SMs":
three programs a launch at one per SM, so each runs several tiles and the tiles do not divide
evenly), on the GPU under ``.ci/gpu tests``; against the float32 CPU op (``TOL``, the lowering test's
tolerances) and the float64 einsum reference on fresh random inputs, outputs poisoned first.
"""

from __future__ import annotations

import pytest
import torch

from kda_inductor.lowerings import gdn_recurrent_step as mod
from tests.test_lowering_gdn_recurrent_step import (
    DEVICE,
    _kernel_vs_op,
    einsum_reference,
    inputs,
    needs_runner,
)

tiles = pytest.importorskip("kda_inductor.lowerings._gdn_tiles") if mod.triton is not None else None


def persistent(bv=8, warps=1, stages=2, per_sm=1, unroll=True, scaled=False, lazy=False):
    return mod.LaunchConfig(bv, warps, stages, scaled, persistent=per_sm, unroll=unroll, lazy=lazy)


@needs_runner
@pytest.mark.parametrize("T", [1, 2, 3, 4, 8, 9])
@pytest.mark.parametrize("per_channel", [False, True])
def test_persistent_body_matches_the_op_and_float64(T, per_channel):
    """Grouped heads (two key heads), K and V not powers of two (12 / 20: masked rows, three
    column blocks of 8, the last partial): 2 x 4 x 3 = 24 tiles over 3 programs (T = 9: past the
    unrolled range, the runtime loop); the in-place op for the per-channel decay."""
    args = inputs(2700 + 10 * T + per_channel, B=2, T=T, Hk=2, Hv=4, K=12, V=20, per_channel=per_channel)
    got, final = _kernel_vs_op(args, config=persistent(), inplace=per_channel)
    want, want_state = einsum_reference(*args, 0.25, True)
    torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final.cpu().double(), want_state, rtol=1e-5, atol=1e-5)


@needs_runner
@pytest.mark.parametrize("cfg", ["loop", "one stage", "scaled", "two per SM", "wide", "registers", "seq registers"])
def test_persistent_body_options(cfg):
    """The runtime token loop, one stage (no pipelining), the ``SCALED`` body, 6 programs (two per
    "SM"; 18 tiles: 3 each), 16 columns x 2 warps (two column blocks, the last partial), a register
    bound (ptxas' ``maxnreg``: the interpreter takes and ignores it), also on the one-program-a-tile body."""
    config = {"loop": persistent(unroll=False), "one stage": persistent(stages=1),
              "scaled": persistent(scaled=True), "two per SM": persistent(per_sm=2),
              "wide": persistent(bv=16, warps=2), "registers": persistent()._replace(max_registers=128),
              "seq registers": mod.LaunchConfig(8, 1, max_registers=96)}[cfg]
    args = inputs(2800 + len(cfg), B=3, T=4, Hk=1, Hv=2, K=16, V=20)
    _kernel_vs_op(args, config=config)


@needs_runner
@pytest.mark.parametrize("T", [1, 2, 4, 8])
def test_lazy_body_matches_the_op_and_float64(T):
    """The lazy body (the tile held as ``S / c``): grouped heads, masked K and V, 24 tiles over 3
    programs; in place at T = 4; a per-channel decay (which it leaves to the plain body) at T = 2."""
    args = inputs(3100 + T, B=2, T=T, Hk=2, Hv=4, K=12, V=20, per_channel=T == 2)
    got, final = _kernel_vs_op(args, config=persistent(lazy=True), inplace=T == 4)
    want, want_state = einsum_reference(*args, 0.25, True)
    torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final.cpu().double(), want_state, rtol=1e-5, atol=1e-5)


@needs_runner
@pytest.mark.parametrize("case", ["rescaled", "underflow", "no l2norm or state"])
def test_lazy_body_rescales_its_tile(case):
    """Decays whose product falls under ``LAZY_FLOOR`` within the window (``g`` about -20 a token:
    the tile takes ``c`` every second token), one that underflows to zero in float32 (``g = -200``:
    the state wiped, as the spec's ``S * exp(g)`` wipes it), and the body without l2norm or state."""
    q, k, v, g, beta, s = inputs(3200 + len(case), B=2, T=6, Hk=1, Hv=2, K=16, V=16)
    if case == "rescaled":
        g = 16 * g - 8
        assert (g.sum(1) < -40 * 0.6931).all()  # 2^-40: several rescalings per window
    elif case == "underflow":
        g[:, 3] = -200.0
    else:
        q, k, s = 0.3 * q, 0.3 * k, None
    _kernel_vs_op((q, k, v, g, beta, s), l2=case != "no l2norm or state", config=persistent(lazy=True))


@needs_runner
@pytest.mark.parametrize("T", [2, 5])
def test_persistent_body_without_state_or_l2norm_strided_bf16(T):
    """From a zeros state without l2norm; head-major strided bf16 inputs with a bf16 output."""
    q, k, v, g, beta, _ = inputs(2900 + T, B=2, T=T, Hk=1, Hv=2, K=16, V=16, state=False)
    _kernel_vs_op((0.3 * q, 0.3 * k, v, g, beta, None), scale=1.0, l2=False, config=persistent())
    args = inputs(2910 + T, B=2, T=T, Hk=1, Hv=2, K=16, V=16, layout="head-major", dtype=torch.bfloat16)
    _kernel_vs_op(args, config=persistent(per_sm=2), out_dtype=torch.bfloat16)


@needs_runner
@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's arithmetic: the same ops in the same order")
def test_persistent_body_is_the_token_by_token_body_bit_for_bit():
    """Under the interpreter both bodies run the same helpers on the same values: identical bits."""
    args = inputs(3000, B=2, T=3, Hk=1, Hv=2, K=12, V=20)
    a = mod.step_triton(*args, 0.25, True, config=mod.LaunchConfig(8, 1))
    b = mod.step_triton(*args, 0.25, True, config=persistent())
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.skipif(mod.triton is None, reason="needs triton")
@pytest.mark.parametrize("tiles_, sms, per_sm", [(8192, 132, 12), (8192, 132, 8), (512, 132, 8), (24, 3, 1),
                                                 (7, 3, 4), (1, 132, 8), (32768, 114, 12)])
def test_grid_size_is_balanced(tiles_, sms, per_sm):
    """At most ``sms * per_sm`` programs, every tile covered, each program ``ceil(tiles / programs)``
    tiles or one fewer, and no fewer programs than that round count needs."""
    n = tiles.grid_size(tiles_, sms, per_sm)
    rounds = -(-tiles_ // n)
    assert 1 <= n <= min(tiles_, sms * per_sm) and n * rounds >= tiles_ and (n - 1) * rounds < tiles_
    assert rounds == -(-tiles_ // (sms * per_sm))
    assert tiles.grid_size(0, sms, per_sm) == 0


@pytest.mark.cuda  # the kda_inductor pytest plugin skips it without a GPU; .ci/gpu tests runs it
@pytest.mark.parametrize("label", ["16x1 x8", "16x1 x12 r168 lazy", "8x1 x16 r128", "16x1 x4 one stage loop"])
def test_cuda_persistent_body_at_model_dims(label):
    """The benchmark's persistent candidates (``pst16w1x8s2``, ``pst16w1x12s2r168+lazy``,
    ``pst8w1x16s2r128``, ``pst16w1x4s1+loop``) on the GPU at Qwen3-Next's dims (16 / 32 heads, K = V
    = 128) and Kimi's (per-channel decay), B = 25 (6,400 tiles of 16 columns: 5 to 13 a program, on
    132 SMs not all programs the same count), T = 1, 4, 8 (KDA: 4), in place, against the CPU op;
    inside a CUDA graph the same bits."""
    cfg = {"16x1 x8": persistent(16, per_sm=8),
           "16x1 x12 r168 lazy": persistent(16, per_sm=12, lazy=True)._replace(max_registers=168),
           "8x1 x16 r128": persistent(8, per_sm=16)._replace(max_registers=128),
           "16x1 x4 one stage loop": persistent(16, stages=1, per_sm=4, unroll=False)}[label]
    for T, per_channel in ((1, False), (4, False), (8, False), (4, True)):
        args = inputs(3300 + T, B=25, T=T, Hk=32 if per_channel else 16, Hv=32, K=128, V=128,
                      per_channel=per_channel, dtype=torch.bfloat16)
        got, final = _kernel_vs_op(args, scale=128 ** -0.5, config=cfg, inplace=True)
        q, k, v, g, beta, s = (x.cuda() for x in args)
        state, out = s.clone(), torch.empty_like(v)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            mod.step_triton(q, k, v, g, beta, state, 128 ** -0.5, True, inplace=True, out=out, config=cfg)
        state.copy_(s)
        graph.replay()
        assert torch.equal(out, got) and torch.equal(state, final)
