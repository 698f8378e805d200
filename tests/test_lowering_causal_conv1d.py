"""``kda::causal_conv1d`` / ``kda::causal_conv1d_update`` themselves: the CPU ops against eager's
``F.conv1d`` spellings (bit-exact: they are aten's conv), the validator's errors (each names its
argument), and the Triton kernel (the interpreter on CPU, the GPU under ``.ci/gpu tests``)
against a reference that sums in the kernel's order (aten's CUDA order: the bias, then each
tap's product, oldest first, each an FMA): bit-exact without the activation (float32 too: the
kernel's float32 conv is aten's CPU conv bit for bit), silu's results within an ulp of the exp."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from kda_inductor.lowerings import causal_conv1d as mod
from kda_inductor.testing import assert_close_to_eager, max_ulps

HAS_RUNNER = mod.triton is not None and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")
needs_runner = pytest.mark.skipif(not HAS_RUNNER, reason="needs a GPU or TRITON_INTERPRET=1 with triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
op, update_op = torch.ops.kda.causal_conv1d.default, torch.ops.kda.causal_conv1d_update.default


def _x(g, B, C, T, dtype, layout="token-major"):
    """``[B, C, T]`` as a conv reads it: the transpose of a token-major ``[B, T, C]`` (a
    projection's output), a contiguous channel-first tensor, or token-major rows of a wider one."""
    if layout == "token-major":
        return torch.randn(B, T, C, generator=g).to(dtype).transpose(1, 2)
    if layout == "channel-first":
        return torch.randn(B, C, T, generator=g).to(dtype)
    return torch.randn(B, T, C + 24, generator=g).to(dtype)[:, :, 8:C + 8].transpose(1, 2)


def _params(g, C, K, dtype, bias=True):
    w = (0.5 * torch.randn(C, K, generator=g)).to(dtype)
    return w, ((0.5 * torch.randn(C, generator=g)).to(dtype) if bias else None)


def eager_fn(x, w, b, act="silu"):
    """transformers' ``causal_conv1d_fn``."""
    K, T = w.shape[-1], x.shape[-1]
    out = F.conv1d(x.to(w.dtype), w.unsqueeze(1), b, padding=K - 1, groups=w.shape[0])[:, :, :T]
    return (F.silu(out) if act == "silu" else out).to(x.dtype)


def eager_update(x, state, w, b, act="silu"):
    """transformers' ``causal_conv1d_update`` (writes ``state``)."""
    T, S = x.shape[-1], state.shape[-1]
    new = torch.cat([state, x], -1).to(w.dtype)
    state.copy_(new[:, :, -S:])
    out = F.conv1d(new, w.unsqueeze(1), b, padding=0, groups=w.shape[0])[:, :, -T:]
    return (F.silu(out) if act == "silu" else out).to(x.dtype)


def taps_reference(x, w, b=None, state=None, cu_seqlens=None, act="silu", act_dtype=None, out_dtype=None):
    """The kernel's arithmetic in torch: per sequence, ``acc = bias``, then ``fma(w[:, k], tap,
    acc)`` in float32 (emulated in float64), oldest tap first, taps before the sequence from
    the state (else skipped)."""
    B, C, T = x.shape
    K, d = w.shape[-1], w.dtype
    act_dtype, out_dtype = act_dtype or d, out_dtype or act_dtype or d
    bounds = [(r, 0, T) for r in range(B)] if cu_seqlens is None else \
        [(0, int(a), int(e)) for a, e in zip(cu_seqlens[:-1], cu_seqlens[1:])]
    out = torch.empty(B, T, C, dtype=out_dtype).transpose(1, 2)
    for n, (r, a, e) in enumerate(bounds):
        xs = x[r, :, a:e].to(d).float()
        pre = state[n, :, state.shape[-1] - (K - 1):].to(d).float() if state is not None and K > 1 else None
        cols = torch.cat([pre, xs], -1) if pre is not None else F.pad(xs, (K - 1, 0))
        skip = pre is None
        acc = (b.to(d).float()[:, None].expand(C, e - a).clone() if b is not None else torch.zeros(C, e - a))
        for k in range(K):
            tap = cols[:, k:k + e - a]
            valid = (torch.arange(e - a) >= K - 1 - k) if skip else torch.ones(e - a, dtype=torch.bool)
            fma = (acc.double() + w[:, k].double()[:, None] * tap.double()).float()  # one rounding (an FMA)
            acc = torch.where(valid, fma, acc)
        v = acc.to(act_dtype).float()
        out[r, :, a:e] = (v / (1 + torch.exp(-v)) if act == "silu" else v).to(out_dtype)
    return out


def _same(got, want, act, label=""):
    """Bit-exact, except silu's results: 16-bit within one ulp, float32 within a few (its exp
    differs by a float32 ulp between the interpreter's numpy, the GPU's libdevice and torch's
    CPU kernel)."""
    got = got.cpu()
    if act != "silu":
        assert_close_to_eager(got, want, exact=True)
    elif got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7, msg=label)
    else:
        assert max_ulps(got, want) <= 1, label


# --------------------------------------------------------------------------- the CPU ops


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("K", [1, 2, 4, 8])
def test_cpu_op_is_eagers_conv(dtype, K):
    g = torch.Generator().manual_seed(K)
    x = _x(g, 2, 24, 11, dtype)
    for bias in (False, True):
        w, b = _params(g, 24, K, dtype, bias)
        for act in ("silu", "none"):
            got = op(x, w, b, None, None, act, dtype, dtype)
            assert got.shape == x.shape and got.stride() == (11 * 24, 1, 24)
            assert_close_to_eager(got, eager_fn(x, w, b, act), exact=True)


@pytest.mark.parametrize("T", [1, 3, 6])
@pytest.mark.parametrize("S", [3, 4, 6])
def test_cpu_update_op_is_eagers_update(T, S):
    """The decode form (T=1), a few tokens (T < S) and more than the state holds (T > S):
    the output and the shifted state bit-exact."""
    g = torch.Generator().manual_seed(10 * T + S)
    x = _x(g, 3, 16, T, torch.bfloat16)
    w, b = _params(g, 16, 4, torch.bfloat16)
    state = torch.randn(3, 16, S, generator=g).to(torch.bfloat16)
    mine = state.clone()
    got = update_op(x, mine, w, b, "silu", torch.bfloat16, torch.bfloat16)
    want = eager_update(x, state, w, b)
    assert_close_to_eager([got, mine], [want, state], exact=True)


def test_cpu_op_initial_state_and_varlen():
    """With an initial state the conv continues it (FLA's / Dao's reference: ``cat([state,
    x])``, padding 0); with ``cu_seqlens`` each sequence restarts (an empty one included)."""
    g = torch.Generator().manual_seed(3)
    w, b = _params(g, 8, 4, torch.bfloat16)
    x = _x(g, 1, 8, 13, torch.bfloat16)
    state = torch.randn(4, 8, 3, generator=g).to(torch.bfloat16)
    cu = torch.tensor([0, 5, 5, 6, 13], dtype=torch.int32)
    got = op(x, w, b, state, cu, "silu", torch.bfloat16, torch.bfloat16)
    for n, (a, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        if a == e:
            continue
        xs = torch.cat([state[n:n + 1], x[:, :, a:e]], -1)
        want = F.silu(F.conv1d(xs, w.unsqueeze(1), b, groups=8)[:, :, :e - a])
        assert_close_to_eager(got[:, :, a:e], want, exact=True)
    plain = op(x, w, b, None, cu, "none", torch.bfloat16, torch.bfloat16)
    assert_close_to_eager(plain[:, :, 6:], eager_fn(x[:, :, 6:], w, b, "none"), exact=True)


def test_cpu_op_dtypes_of_the_activation_and_output():
    """FLA's reference: a float32 conv of bf16 inputs, silu in float32, cast back (act float32,
    out bf16); a bf16 conv whose silu is computed from its float32 cast (out float32)."""
    g = torch.Generator().manual_seed(4)
    x = _x(g, 2, 8, 9, torch.bfloat16)
    w, b = _params(g, 8, 4, torch.bfloat16)
    got = op(x, w.float(), b.float(), None, None, "silu", torch.float32, torch.bfloat16)
    want = F.silu(F.conv1d(x.float(), w.float().unsqueeze(1), b.float(), padding=3, groups=8)[..., :9]).bfloat16()
    assert_close_to_eager(got, want, exact=True)
    got = op(x, w, b, None, None, "silu", torch.bfloat16, torch.float32)
    want = F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=3, groups=8)[..., :9].float())
    # aten's CPU silu itself gives other float32 bits for a strided tensor than a contiguous one
    torch.testing.assert_close(got, want, rtol=2.5e-7, atol=0)


# --------------------------------------------------------------------------- validation


def _err(exc, match, *args, update=False):
    with pytest.raises(exc, match=match):
        (update_op if update else op)(*args)


def test_bad_arguments_are_named():
    x = torch.randn(2, 8, 5, dtype=torch.bfloat16)
    w = torch.randn(8, 4, dtype=torch.bfloat16)
    bf = torch.bfloat16
    _err(ValueError, "^conv_state: a state of width 2 cannot hold the 3 previous tokens",
         x, torch.zeros(2, 8, 2, dtype=bf), w, None, "silu", bf, bf, update=True)
    _err(ValueError, r"^conv_state: expected \[2, 8, S\]", x, torch.zeros(2, 6, 4, dtype=bf), w, None, "silu",
         bf, bf, update=True)
    _err(ValueError, r"^initial_state: expected \[2, 8, S\]", x, w, None, torch.zeros(3, 8, 3, dtype=bf), None,
         "silu", bf, bf)
    _err(ValueError, "^weight: kernel width must be a static int in \\[1, 8\\], got 9",
         x, torch.zeros(8, 9, dtype=bf), None, None, None, "silu", bf, bf)
    _err(ValueError, "^weight: expected 8 channels", x, torch.zeros(4, 4, dtype=bf), None, None, None, "silu", bf, bf)
    _err(ValueError, r"^bias: expected one value per channel \[8\]", x, w, torch.zeros(8, 1, dtype=bf)[:, 0][:4],
         None, None, "silu", bf, bf)
    _err(ValueError, "^activation: expected one of", x, w, None, None, None, "gelu", bf, bf)
    _err(ValueError, "^x: with cu_seqlens the sequences lie along one row", x, w, None, None,
         torch.tensor([0, 5]), "silu", bf, bf)
    x1 = x[:1]
    _err(IndexError, "^cu_seqlens: the sequences end at 7, expected x's 5 tokens \\(past the end\\)",
         x1, w, None, None, torch.tensor([0, 3, 7]), "silu", bf, bf)
    _err(ValueError, "^cu_seqlens: expected non-decreasing offsets from 0", x1, w, None, None,
         torch.tensor([0, 4, 3, 5]), "silu", bf, bf)
    _err(ValueError, "^cu_seqlens: expected a 1-D int32/int64 tensor", x1, w, None, None,
         torch.tensor([0.0, 5.0]), "silu", bf, bf)


def test_a_rejected_update_leaves_the_state_alone():
    x = torch.randn(2, 8, 1, dtype=torch.bfloat16)
    state = torch.randn(2, 8, 4, dtype=torch.bfloat16)
    before = state.clone()
    with pytest.raises(ValueError, match="^weight"):
        update_op(x, state, torch.zeros(8, 9, dtype=torch.bfloat16), None, "silu", torch.bfloat16, torch.bfloat16)
    assert torch.equal(state, before)


# --------------------------------------------------------------------------- the Triton kernel
# the interpreter truncates float32 -> bfloat16 casts: the kernel rounds by the bits there


def _dev(*ts):
    return [t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in ts]


@needs_runner
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("layout", ["token-major", "channel-first", "strided rows"])
def test_triton_kernel_matches_the_reference(dtype, layout):
    g = torch.Generator().manual_seed(7)
    x = _x(g, 2, 40, 37, dtype, layout)
    for K, bias, act in ((4, False, "silu"), (4, True, "none"), (2, True, "silu"), (8, False, "silu")):
        w, b = _params(g, 40, K, dtype, bias)
        out = torch.full((2, 37, 40), 7.0, dtype=dtype, device=DEVICE).transpose(1, 2)  # poisoned
        xd, wd, bd = _dev(x, w, b)
        mod.conv_triton(xd, wd, bd, activation=act, out=out)
        _same(out, taps_reference(x, w, b, act=act), act, f"K={K} bias={bias} {act}")


PREFILL_CLASSES = {f"{cfg}": cfg for _, _, cfg, _ in mod.PREFILL_CONFIGS}
"""The table's distinct configs (its classes share them until the sweep says otherwise)."""
WINDOWS = {"window 8 rows": mod.LaunchConfig(16, 256, 1, 1, 8, True),
           "window 4 rows, 2 stages": mod.LaunchConfig(8, 64, 1, 2, 4, True),
           "taps 16 rows, 2 stages": mod.LaunchConfig(32, 64, 2, 2, 16, False),
           "streaming window 2 rows": mod.LaunchConfig(16, 256, 1, 1, 2, True, True),
           "streaming window 4 rows, ptx": mod.LaunchConfig(16, 128, 1, 1, 4, True, True, True),
           "streaming window 8 rows, ptx": mod.LaunchConfig(16, 64, 1, 1, 8, True, True, True),
           "streaming window 1 row, ptx": mod.LaunchConfig(8, 64, 2, 1, 1, True, True, True),
           "streaming window 2 rows, 4 steps an iteration": mod.LaunchConfig(32, 128, 1, 1, 2, True, True, True, 4),
           "streaming window 2 rows, 2 steps an iteration": mod.LaunchConfig(16, 256, 1, 1, 2, True, True, False, 2)}
"""What the sweep also times (``benchmarks/tune_causal_conv1d.py``): the register window, the
pipelined loop, the streaming window (``_conv_stream.py``; its ``ptx`` division and rounding
are GPU-only: the interpreter runs the plain silu there, ``tests/test_causal_conv1d_cuda.py``
checks them on every bf16 value)."""
UPDATE_CLASSES = {reason.split(":")[1]: cfg for _, cfg, reason in mod.UPDATE_CONFIGS}
UPDATE_CLASSES.update({f"{name} {kind}": cfg._replace(**{kind: True}) for name, cfg in list(UPDATE_CLASSES.items())
                       for kind in ("tile", "vector")})
"""Each update class, and the same with ``tile`` (one token through the multi-token path) and with
``vector`` (one token through the decode's vector form where the layout allows)."""


def _poisoned(B, C, T, dtype=torch.bfloat16):
    """An output ``[B, C, T]`` over token-major memory, every value NaN until the kernel writes it."""
    return torch.full((B, T, C), float("nan"), dtype=dtype, device=DEVICE).transpose(1, 2)


def _check_prefill(cfg, label):
    """``cfg`` (fitted to each shape, as the launcher fits the table's) on tokens spanning an edge
    tile (the sequence start) and a partial last one (T not a multiple of BLOCK_T), T < K, and
    channels not a multiple of the channel block (masked: 40, 200; whole heads of 128: 256);
    varlen with a state (sequence starts inside a tile, one past the first tile)."""
    g = torch.Generator().manual_seed(cfg.block_t + cfg.block_c)
    for C, T in ((40, cfg.block_t + 5), (256, cfg.block_t + 5), (200, 2 * cfg.block_t + 3), (40, 2)):
        x = _x(g, 2 if C == 200 else 1, C, T, torch.bfloat16)
        w, b = _params(g, C, 4, torch.bfloat16)
        out = mod.conv_triton(*_dev(x, w, b), config=mod.fit(cfg, T, C), out=_poisoned(x.shape[0], C, T))
        _same(out, taps_reference(x, w, b), "silu", f"{label} C={C} T={T}")
    T = 2 * cfg.block_t + 5
    cu = torch.tensor([0, 1, 3, 4, cfg.block_t + 2, T], dtype=torch.int32)
    state = torch.randn(5, 40, 5, generator=g).to(torch.bfloat16)
    x = _x(g, 1, 40, T, torch.bfloat16)
    w, b = _params(g, 40, 4, torch.bfloat16)
    out = mod.conv_triton(*_dev(x, w, b, state, cu), activation="none", config=mod.fit(cfg, T, 40),
                          out=_poisoned(1, 40, T))
    _same(out, taps_reference(x, w, b, state, cu, act="none"), "none", f"{label} varlen")
    st = torch.randn(1, 200, 3, generator=g).to(torch.bfloat16)
    x = _x(g, 1, 200, T, torch.bfloat16)
    w, b = _params(g, 200, 4, torch.bfloat16)
    out = mod.conv_triton(*_dev(x, w, b, st), config=mod.fit(cfg, T, 200), out=_poisoned(1, 200, T))
    _same(out, taps_reference(x, w, b, st), "silu", f"{label} state")


@needs_runner
@pytest.mark.parametrize("name", list(PREFILL_CLASSES))
def test_triton_kernel_every_prefill_config_class(name):
    """Each distinct config of ``PREFILL_CONFIGS`` (:func:`_check_prefill`)."""
    _check_prefill(PREFILL_CLASSES[name], name)


@needs_runner
@pytest.mark.parametrize("name", list(WINDOWS))
def test_triton_kernel_the_sweeps_other_kinds_of_tile(name):
    """The register window and the pipelined loop, which the table may take after the sweep."""
    _check_prefill(WINDOWS[name], name)


@needs_runner
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_triton_kernel_streaming_window_every_width(dtype):
    """The streaming window at K = 2..8, with a bias, with and without the silu, in each dtype: a
    tile's halo, rows carried across its steps, a partial last tile and its prefetch past it."""
    g = torch.Generator().manual_seed(11)
    cfg = mod.LaunchConfig(8, 32, 1, 1, 2, True, True, True, 2)
    x = _x(g, 2, 40, 29, dtype, "token-major")
    for K, bias, act in ((2, True, "silu"), (3, False, "none"), (5, True, "silu"), (8, True, "silu")):
        w, b = _params(g, 40, K, dtype, bias)
        out = mod.conv_triton(*_dev(x, w, b), activation=act, config=cfg, out=_poisoned(2, 40, 29, dtype))
        _same(out, taps_reference(x, w, b, act=act), act, f"K={K} bias={bias} {act}")


@needs_runner
def test_triton_kernel_mixed_dtypes():
    """A float32 conv of bf16 inputs (FLA's reference), a bf16 conv read in float32."""
    g = torch.Generator().manual_seed(8)
    x = _x(g, 2, 20, 45, torch.bfloat16)
    w, b = _params(g, 20, 4, torch.bfloat16)
    out = mod.conv_triton(*_dev(x, w.float(), b.float()), act_dtype=torch.float32,
                          out=torch.empty(2, 45, 20, dtype=torch.bfloat16, device=DEVICE).transpose(1, 2))
    _same(out, taps_reference(x, w.float(), b.float(), act_dtype=torch.float32, out_dtype=torch.bfloat16), "silu")
    xf = _x(g, 2, 20, 45, torch.float32)
    out = mod.conv_triton(*_dev(xf, w, b), config=mod.LaunchConfig(8, 16, 1, 1, 4, True))
    _same(out, taps_reference(xf, w, b), "silu")


@needs_runner
def test_triton_kernel_initial_state_and_varlen():
    g = torch.Generator().manual_seed(9)
    w, b = _params(g, 24, 4, torch.float16)
    x = _x(g, 1, 24, 40, torch.float16)
    cu = torch.tensor([0, 1, 1, 9, 30, 40], dtype=torch.int32)
    state = torch.randn(5, 24, 6, generator=g).to(torch.float16)
    for st in (None, state):
        for cfg in (None, mod.LaunchConfig(8, 8, 1, 1, 4, True), mod.LaunchConfig(16, 8, 1, 1, 8, False)):
            out = mod.conv_triton(*_dev(x, w, b, st, cu), config=cfg)
            _same(out, taps_reference(x, w, b, st, cu), "silu", f"state={st is not None} {cfg}")
    fixed = _x(g, 3, 24, 5, torch.float16)
    st = torch.randn(3, 24, 3, generator=g).to(torch.float16)
    _same(mod.conv_triton(*_dev(fixed, w, b, st)), taps_reference(fixed, w, b, st), "silu")


@needs_runner
def test_triton_kernel_varlen_past_the_end_traps():
    x = torch.randn(1, 8, 6, dtype=torch.float16, device=DEVICE)
    w = torch.randn(8, 4, dtype=torch.float16, device=DEVICE)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32, device=DEVICE)
    if DEVICE == "cuda":
        pytest.skip("a device-side assert poisons the CUDA context: checked under the interpreter")
    with pytest.raises(Exception, match="cu_seqlens"):
        mod.conv_triton(x, w, None, None, cu)


def _check_update(x, state, w, b, act="none", config=None, label=""):
    """The update kernel (output and shifted state) bit-exact with the CPU op (16-bit)."""
    want_state = state.clone()
    want = update_op(x, want_state, w, b, act, w.dtype, w.dtype)
    xd, wd, bd, sd = _dev(x, w, b, state.clone())
    got = mod.conv_triton(xd, wd, bd, sd, activation=act, update=True, config=config,
                          out=_poisoned(x.shape[0], x.shape[1], x.shape[2], w.dtype))
    if act == "none":
        assert_close_to_eager([got.cpu(), sd.cpu()], [want, want_state], exact=True)
    else:
        _same(got, want, act, label)
        assert torch.equal(sd.cpu(), want_state), label


@needs_runner
@pytest.mark.parametrize("T", [1, 3, 7, 70])
def test_triton_kernel_update_matches_the_cpu_op(T):
    """The update launch (T <= UPDATE_MAX_T: decode, a few tokens, the state read once) or the
    prefill launch and the state shift alone (T = 70)."""
    g = torch.Generator().manual_seed(T)
    x = _x(g, 2, 24, T, torch.bfloat16)
    w, b = _params(g, 24, 4, torch.bfloat16)
    _check_update(x, torch.randn(2, 24, 4, generator=g).to(torch.bfloat16), w, b)


@needs_runner
@pytest.mark.parametrize("name", list(UPDATE_CLASSES))
def test_triton_kernel_every_update_config_class(name):
    """Each class of ``UPDATE_CONFIGS``: decode (T = 1, the one-token launch) with one row and
    several, a state of K (transformers), of K - 1 (vLLM); a few tokens, a state of 6; a state
    whose taps are strided (the generic addressing); K = 2, 4 and 8 (the vector form's rows of 2 and 8)."""
    cfg = UPDATE_CLASSES[name]
    g = torch.Generator().manual_seed(cfg.block_c)
    for B, T, S, K, strided in ((1, 1, 4, 4, False), (3, 1, 4, 4, False), (2, 1, 3, 4, False), (3, 3, 6, 4, False),
                                (1, 1, 4, 2, True), (3, 5, 3, 4, True), (2, 1, 2, 2, False), (2, 1, 8, 8, False)):
        x = _x(g, B, 40, T, torch.bfloat16)
        w, b = _params(g, 40, K, torch.bfloat16)
        state = torch.randn(B, 40, S, generator=g).to(torch.bfloat16)
        if strided:
            state = torch.randn(B, S, 40, generator=g).to(torch.bfloat16).transpose(1, 2)
        _check_update(x, state, w, b, "silu", cfg, f"{name} B={B} T={T} S={S} K={K} strided={strided}")


def test_the_decode_vector_form_reads_only_contiguous_rows():
    """``UpdateConfig(vector=True)`` takes the vector form only where each channel's state and weight rows
    are ``K`` contiguous values (K a power of two, the state K wide); elsewhere the decode path."""
    from kda_inductor.lowerings._conv_launch import _vector_layout
    from kda_inductor.lowerings._conv_validate import ConvMeta

    def meta(S, K):
        return ConvMeta(batch=2, channels=8, tokens=1, width=K, state_width=S, num_seqs=1)

    w4, w3 = torch.empty(8, 4), torch.empty(8, 3)
    assert _vector_layout(torch.empty(2, 8, 4), w4, meta(4, 4))
    assert not _vector_layout(torch.empty(2, 4, 8).transpose(1, 2), w4, meta(4, 4))  # taps strided
    assert not _vector_layout(torch.empty(2, 8, 3), w4, meta(3, 4))  # vLLM's K - 1
    assert not _vector_layout(torch.empty(2, 8, 3), w3, meta(3, 3))  # K not a power of two
    assert not _vector_layout(torch.empty(2, 8, 4), torch.empty(4, 8).t(), meta(4, 4))  # weights strided


def test_launch_config():
    """The fixed tables: each shape gets its class's config (tokens per row x channels; blocks
    capped at the tokens and the channels, warps at what the tile keeps busy), decode by the
    batch's channels; every class has a note naming where its measurement is recorded."""
    # what the second sweep chose (tune_causal_conv1d.md, H100): from 6144 channels, one warp over 128
    # channels, the streaming window (prefetch, the PTX silu, 4 / 2 steps unrolled)
    stream_4k, stream_16k = mod.LaunchConfig(32, 128, 1, 1, 2, True, True, True, 4), mod.LaunchConfig(
        64, 128, 1, 1, 4, True, True, True, 2)
    swept = {(4096, 8192): stream_4k, (16384, 8192): stream_16k, (4096, 12288): stream_4k,
             (16384, 11520): stream_16k}
    for (T, C), cfg in swept.items():
        assert mod.launch_config(T, C) == cfg
    # untimed widths take their token class's timed launch (the register window's guesses spill as launched)
    assert mod.launch_config(4096, 4096) == stream_4k and mod.launch_config(16384, 4096) == stream_16k
    # the short-T sweep's (2026-12-05 19:07) below 10240 channels; from 10240 at 64 tokens (2026-12-06 10:41)
    short = mod.LaunchConfig(16, 128, 4, 1, 8, False)
    for C in (4096, 8192, 11520, 12288):
        assert mod.launch_config(1024, C) == mod.launch_config(512, C) == short
        assert mod.launch_config(256, C) == short
        assert mod.launch_config(5, C) == mod.LaunchConfig(8, 256, 1, 1, 8, True)
        assert mod.launch_config(3, C) == mod.LaunchConfig(4, 256, 1, 1, 4, True)
        assert mod.launch_config(1, C) == mod.LaunchConfig(1, 256, 1, 1, 1, True)
    assert mod.launch_config(4096, 40) == mod.LaunchConfig(32, 64, 1, 1, 2, True, True, True, 4)
    assert all("provisional" not in note or "spills" in note or t == 1 for t, _, _, note in mod.PREFILL_CONFIGS)
    assert mod.update_config(1, 8192, 32) == mod.UpdateConfig(256, 2)
    assert mod.update_config(1, 8192, 128) == mod.UpdateConfig(128, 1, tile=True)
    assert mod.update_config(1, 4096, 2) == mod.UpdateConfig(64, 1)
    classes = [(t, c) for t, c, _, _ in mod.PREFILL_CONFIGS]
    assert classes == sorted(classes) and len(set(classes)) == len(classes) == 15
    for t, c, cfg, note in mod.PREFILL_CONFIGS:
        assert mod.launch_config(t, c) == mod.fit(cfg, t, c) and "tune_causal_conv1d.md" in note
        assert cfg.block_t % cfg.rows == 0 and (cfg.rows <= 8 or not cfg.window)
    for _, _, note in mod.UPDATE_CONFIGS:
        assert "tune_causal_conv1d.md" in note


@needs_runner
def test_triton_kernel_float32_is_atens_own_sum():
    """float32 products round, so here the order and the FMA show: the kernel's conv (no
    activation) is bit-identical to aten's CPU conv (the same order as its CUDA depthwise
    kernel: the bias, then each tap oldest first, fused multiply-adds)."""
    g = torch.Generator().manual_seed(11)
    x = _x(g, 2, 64, 50, torch.float32)
    w, b = _params(g, 64, 4, torch.float32)
    got = mod.conv_triton(*_dev(x, w, b), activation="none")
    assert_close_to_eager(got.cpu(), eager_fn(x, w, b, act="none"), exact=True)


@st.composite
def _cases(draw):
    """A conv of any small geometry: rows, channels (masked ones), tokens (block edges), width,
    bias, activation, dtype, layout, a state of any width >= K - 1, varlen with empty sequences."""
    K = draw(st.integers(1, mod.MAX_WIDTH))
    varlen = draw(st.booleans())
    B = 1 if varlen else draw(st.integers(1, 3))
    T = draw(st.integers(1, 40))
    cuts = sorted(draw(st.lists(st.integers(0, T), max_size=4))) if varlen else []
    cu = torch.tensor([0, *cuts, T], dtype=torch.int32) if varlen else None
    n = B if cu is None else cu.numel() - 1
    width = draw(st.one_of(st.none(), st.integers(max(K - 1, 0), K + 2)))
    return dict(B=B, C=draw(st.integers(1, 40)), T=T, K=K, cu=cu, n=n, width=width, bias=draw(st.booleans()),
                act=draw(st.sampled_from(["silu", "none"])), layout=draw(st.sampled_from(["token-major", "channel-first",
                                                                                         "strided rows"])),
                dtype=draw(st.sampled_from([torch.float16, torch.bfloat16, torch.float32])),
                seed=draw(st.integers(0, 2**16)))


@needs_runner
@settings(max_examples=int(os.environ.get("KDA_PROPERTY_EXAMPLES", "8" if DEVICE == "cuda" else "25")),
          deadline=None, derandomize=True, database=None)  # on a GPU each example compiles its variant
@given(_cases())
def test_triton_kernel_property(case):
    """The kernel against the reference over random geometries (the interpreter on CPU)."""
    c = case
    g = torch.Generator().manual_seed(c["seed"])
    x = _x(g, c["B"], c["C"], c["T"], c["dtype"], c["layout"])
    w, b = _params(g, c["C"], c["K"], c["dtype"], c["bias"])
    st_ = None if c["width"] is None else torch.randn(c["n"], c["C"], c["width"], generator=g).to(c["dtype"])
    out = mod.conv_triton(*_dev(x, w, b, st_, c["cu"]), activation=c["act"])
    _same(out, taps_reference(x, w, b, st_, c["cu"], act=c["act"]), c["act"], str(c))


# --------------------------------------------------------------------------- the cat form


cat_op, cat_update_op = torch.ops.kda.causal_conv1d_cat.default, torch.ops.kda.causal_conv1d_update_cat.default


def _qkv(g, B, T, heads=2, dq=8, dv=16, dtype=torch.bfloat16, device="cpu"):
    """Qwen3-Next's sources: q, k ``[B, T, heads, dq]`` and v ``[B, T, heads, dv]``, views of one
    ``qkvz`` projection on ``device`` (``z`` after them, not convolved); their cat has
    ``heads * (2 dq + dv)`` channels."""
    qkvz = torch.randn(B, T, heads, 2 * dq + 2 * dv, generator=g).to(dtype).to(device)
    q, k, v, _ = torch.split(qkvz, [dq, dq, dv, dv], dim=3)
    return [q, k, v]


def _cat(xs):
    """What the layer convolves: ``cat(q, k, v)`` token-major, transposed (``[B, C, T]``)."""
    return torch.cat([t.reshape(t.shape[0], t.shape[1], -1) for t in xs], -1).transpose(1, 2)


def test_cpu_cat_op_is_the_conv_of_the_cat():
    g = torch.Generator().manual_seed(20)
    xs = _qkv(g, 2, 9)
    C = _cat(xs).shape[1]
    w, b = _params(g, C, 4, torch.bfloat16)
    got = cat_op(xs, w, b, None, None, "silu", torch.bfloat16, torch.bfloat16)
    assert got.shape == (2, C, 9) and got.stride() == (9 * C, 1, C)
    assert_close_to_eager(got, eager_fn(_cat(xs), w, b), exact=True)
    state = torch.randn(2, C, 4, generator=g).to(torch.bfloat16)
    mine, ref = state.clone(), state.clone()
    got = cat_update_op([xs[0][:, :1], xs[1][:, :1], xs[2][:, :1]], mine, w, b, "silu", torch.bfloat16,
                        torch.bfloat16)
    want = eager_update(_cat([t[:, :1] for t in xs]), ref, w, b)
    assert_close_to_eager([got, mine], [want, ref], exact=True)


OPCHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_static")
"""opcheck's dynamic test makes the kernel width symbolic, which the ops refuse (it must be static)."""


def test_cat_op_fake_and_opcheck():
    g = torch.Generator().manual_seed(21)
    xs = _qkv(g, 1, 5)
    C = _cat(xs).shape[1]
    w, b = _params(g, C, 4, torch.bfloat16)
    torch.library.opcheck(torch.ops.kda.causal_conv1d_cat, (xs, w, b, None, None, "silu", torch.bfloat16,
                                                            torch.bfloat16), test_utils=OPCHECKS)
    state = torch.randn(1, C, 4, generator=g).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.kda.causal_conv1d_update_cat, (xs, state, w, None, "none", torch.bfloat16,
                                                                   torch.bfloat16), test_utils=OPCHECKS)


def test_cat_op_bad_arguments_are_named():
    g = torch.Generator().manual_seed(22)
    xs = _qkv(g, 1, 5)
    C = _cat(xs).shape[1]
    w = torch.randn(C, 4, dtype=torch.bfloat16)
    bf = torch.bfloat16
    with pytest.raises(ValueError, match=r"^xs\[2\]: expected xs\[0\]'s batch, tokens"):
        cat_op([xs[0], xs[1], xs[2][:, :4]], w, None, None, None, "silu", bf, bf)
    with pytest.raises(ValueError, match=r"^xs\[1\]: expected a 3-D \[B, T, C\] or 4-D"):
        cat_op([xs[0], xs[1][0, 0]], w, None, None, None, "silu", bf, bf)
    with pytest.raises(ValueError, match="^xs: expected a list of 1 to 4 tensors"):
        cat_op([xs[0]] * 5, w, None, None, None, "silu", bf, bf)
    with pytest.raises(ValueError, match=f"^weight: expected {C - xs[2][0, 0].numel()} channels .*, got {C}"):
        cat_op(xs[:2], w, None, None, None, "silu", bf, bf)


@needs_runner
def test_triton_kernel_cat_sources():
    """The sources read where they lie (views of one projection on the runner's device): heads
    of 8 and 16 channels (q / k / v), with a bias and without; a 3-D source among 4-D ones;
    varlen with a state; the update (decode and a few tokens); a source with a token stride of
    its own (read through the cat)."""
    g = torch.Generator().manual_seed(23)
    xs = _qkv(g, 2, 21, device=DEVICE)
    ref = _cat([t.cpu() for t in xs])
    C = ref.shape[1]
    w, b = _params(g, C, 4, torch.bfloat16)
    assert mod.read_sources(xs) is not None  # the kernel reads the views themselves
    for cfg in (None, mod.LaunchConfig(8, 32, 1, 1, 4, True), mod.LaunchConfig(16, 256, 1, 1, 8, True),
                mod.LaunchConfig(16, 128, 4, 1, 8, False)):
        _same(mod.conv_triton(xs, *_dev(w, b), config=cfg), taps_reference(ref, w, b), "silu", str(cfg))
    flat = [xs[0].flatten(2), xs[1], xs[2]]
    _same(mod.conv_triton(flat, *_dev(w, None)), taps_reference(ref, w, None), "silu", "3-D")
    one = [t[:1] for t in xs]
    cu = torch.tensor([0, 2, 13, 21], dtype=torch.int32)
    state = torch.randn(3, C, 4, generator=g).to(torch.bfloat16)
    _same(mod.conv_triton(one, *_dev(w, b, state, cu), activation="none"),
          taps_reference(ref[:1], w, b, state, cu, act="none"), "none", "varlen")
    for T in (1, 3):
        st = torch.randn(2, C, 4, generator=g).to(torch.bfloat16)
        want_state = st.clone()
        want = update_op(ref[:, :, :T], want_state, w, b, "silu", torch.bfloat16, torch.bfloat16)
        sd = st.clone().to(DEVICE)
        _same(mod.conv_triton([t[:, :T] for t in xs], *_dev(w, b), sd, update=True), want, "silu", f"update T={T}")
        assert torch.equal(sd.cpu(), want_state)
    own = torch.randn(2, 21, xs[1].shape[2] * xs[1].shape[3], generator=g).to(torch.bfloat16)
    mixed = [xs[0], own.to(DEVICE), xs[2]]
    assert mod.read_sources(mixed) is None  # its own token stride: the kernel reads the cat
    want = taps_reference(_cat([xs[0].cpu(), own, xs[2].cpu()]), w, b)
    _same(mod.conv_triton(mixed, *_dev(w, b)), want, "silu", "strided")
