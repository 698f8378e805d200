"""``kda::gdn_recurrent_step`` / ``kda::gdn_recurrent_step_inplace`` themselves: the CPU ops against
independent references (transformers' own token loops, ``torch_recurrent_gated_delta_rule`` and
``recurrent_kimi_delta_attention``, and a float64 einsum spelling written here), their fake impls,
the validator's errors (each names its argument), and the Triton kernel (the interpreter on CPU,
the GPU under ``.ci/gpu tests``) against the CPU op.

Tolerances. Everything is float32 math on O(1) values (unit-norm q / k, ``|v| ~ 1``, a state of
``randn``): the op and a reference differ only in how float32 roundings fall (``x / sqrt(d)`` vs
``x * d ** -0.5``, Kimi's ``x / sqrt(n)`` vs ``x * rsqrt(n)``, sums in another order), each
~1e-7 relative, over at most 8 tokens of a contracting recurrence (``exp(g) <= 1``,
``beta <= 1``): ``rtol = atol = 2e-5`` is ~100 float32 ulps of slack at the outputs' scale, and a
wrong term (a missing decay, the wrong key head, one token off) moves outputs by > 1e-2. Against
float64, ``1e-5``. 16-bit outputs: one rounding step of the output dtype more.
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch

from kda_inductor.lowerings import gdn_recurrent_step as mod

op = torch.ops.kda.gdn_recurrent_step.default
inplace_op = torch.ops.kda.gdn_recurrent_step_inplace.default
HAS_RUNNER = mod.triton is not None and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")
needs_runner = pytest.mark.skipif(not HAS_RUNNER, reason="needs a GPU or TRITON_INTERPRET=1 with triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(rtol=2e-5, atol=2e-5)


def inputs(seed, B=2, T=3, Hk=2, Hv=4, K=16, V=12, *, per_channel=False, dtype=torch.float32, state=True,
           layout="token-major"):
    """Random step inputs as a layer makes them: ``g = -softplus`` (log-space decay <= 0), ``beta``
    a sigmoid, q / k / v of unit-ish scale; ``layout`` ``"head-major"``: q / k / v / g / beta are
    transposed views of ``[B, H, T, ...]`` tensors (the head-major spelling), ``"split"``: q / k /
    v are views of one ``[B, T, C]`` projection (transformers' split)."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(dtype)

    if layout == "split":
        qkv = rnd(B, T, 2 * Hk * K + Hv * V)
        q, k, v = torch.split(qkv, [Hk * K, Hk * K, Hv * V], dim=-1)
        q, k, v = q.unflatten(-1, (Hk, K)), k.unflatten(-1, (Hk, K)), v.unflatten(-1, (Hv, V))
    elif layout == "head-major":
        q, k, v = rnd(B, Hk, T, K).transpose(1, 2), rnd(B, Hk, T, K).transpose(1, 2), rnd(B, Hv, T, V).transpose(1, 2)
    else:
        q, k, v = rnd(B, T, Hk, K), rnd(B, T, Hk, K), rnd(B, T, Hv, V)
    gshape = (B, T, Hv, K) if per_channel else (B, T, Hv)
    g = -torch.nn.functional.softplus(torch.randn(*gshape, generator=gen))
    beta = torch.sigmoid(torch.randn(B, T, Hv, generator=gen)).to(dtype)
    if layout == "head-major":
        g = g.movedim(2, 1).contiguous().movedim(1, 2)
        beta = beta.transpose(1, 2).contiguous().transpose(1, 2)
    s = torch.randn(B, Hv, K, V, generator=gen) if state else None
    return q, k, v, g, beta, s


def einsum_reference(q, k, v, g, beta, state, scale, l2norm, eps=1e-6):
    """The recurrence in float64 einsums on explicitly repeated heads (written independently of
    the op's loop)."""
    Hv, Hk = v.shape[2], q.shape[2]
    q, k = (x.double().repeat_interleave(Hv // Hk, dim=2) for x in (q, k))
    v, g, beta = v.double(), g.double(), beta.double()
    if l2norm:
        q = q / torch.sqrt((q ** 2).sum(-1, keepdim=True) + eps)
        k = k / torch.sqrt((k ** 2).sum(-1, keepdim=True) + eps)
    S = torch.zeros(v.shape[0], Hv, q.shape[-1], v.shape[-1], dtype=torch.float64) if state is None else state.double()
    outs = []
    for t in range(v.shape[1]):
        decay = g[:, t].exp()
        S = S * (decay.unsqueeze(-1) if g.dim() == 4 else decay[..., None, None])
        pred = torch.einsum("bhkv,bhk->bhv", S, k[:, t])
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], (v[:, t] - pred) * beta[:, t, :, None])
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t] * scale))
    return torch.stack(outs, 1), S


def _transformers(module: str, name: str):
    mod_ = pytest.importorskip(f"transformers.models.{module}.modeling_{module}")
    fn = getattr(mod_, name, None)
    if fn is None:
        pytest.skip(f"this transformers has no {module}.{name}")
    return inspect.unwrap(fn)  # the torch loop itself, not the hub / fla dispatch around it


# --------------------------------------------------------------------------- the CPU ops


@pytest.mark.parametrize("T", [1, 3, 8])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_cpu_op_is_transformers_gated_delta_rule(T, group):
    """Qwen3-Next's loop (l2norm in the kernel, ``q / sqrt(K)``), its q / k heads repeated by
    ``repeat_interleave`` first, as the layer of transformers <= 5.17 does before the call (5.25's
    function repeats them inside, and does nothing more when the heads already match); the op
    reads the unrepeated ones by index."""
    ref = _transformers("qwen3_next", "torch_recurrent_gated_delta_rule")
    q, k, v, g, beta, s = inputs(10 * T + group, B=2, T=T, Hk=2, Hv=2 * group, K=16, V=12, dtype=torch.bfloat16)
    rq, rk = (x.repeat_interleave(group, dim=2) for x in (q, k))
    want, want_state = ref(rq, rk, v, g, beta, initial_state=s, output_final_state=True, use_qk_l2norm_in_kernel=True)
    out, final = op(q, k, v, g, beta, s, 16 ** -0.5, True, 1e-6, torch.float32)
    torch.testing.assert_close(final, want_state, **TOL)
    torch.testing.assert_close(out.to(torch.bfloat16), want, rtol=0, atol=2 ** -7 * want.abs().max().item())
    torch.testing.assert_close(out, ref(rq.float(), rk.float(), v.float(), g, beta.float(), initial_state=s,
                                        output_final_state=True, use_qk_l2norm_in_kernel=True)[0], **TOL)


@pytest.mark.parametrize("T", [1, 4])
def test_cpu_op_is_transformers_kimi_delta_attention(T):
    """Kimi Linear's loop: a decay per key channel ``g [B, T, H, K]``, its ``x / sqrt(n)`` l2norm."""
    ref = _transformers("kimi_linear", "recurrent_kimi_delta_attention")
    q, k, v, g, beta, s = inputs(T, B=2, T=T, Hk=3, Hv=3, K=16, V=16, per_channel=True)
    want, want_state = ref(q, k, v, g, beta, s, True, use_qk_l2norm_in_kernel=True)
    out, final = op(q, k, v, g, beta, s, 16 ** -0.5, True)
    torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(final, want_state, **TOL)


@pytest.mark.parametrize("case", ["gqa4 per-channel", "no l2norm", "zero state", "K != V", "head-major", "split"])
def test_cpu_op_against_float64(case):
    kw = dict(per_channel="per-channel" in case, state=case != "zero state",
              layout=case if case in ("head-major", "split") else "token-major")
    dims = dict(Hk=1, Hv=4) if "gqa4" in case else dict(K=8, V=24) if case == "K != V" else {}
    q, k, v, g, beta, s = inputs(len(case), T=5, **dims, **kw)
    l2 = case != "no l2norm"
    if not l2:
        q, k = q * 0.25, k * 0.25
    out, final = op(q, k, v, g, beta, s, 0.3, l2)
    want, want_state = einsum_reference(q, k, v, g, beta, s, 0.3, l2)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final.double(), want_state, rtol=1e-5, atol=1e-5)


def test_cpu_inplace_op_writes_the_final_state():
    q, k, v, g, beta, s = inputs(5, per_channel=True)
    out, final = op(q, k, v, g, beta, s, 0.25, True)
    state = s.clone()
    got = inplace_op(q, k, v, g, beta, state, 0.25, True)
    assert torch.equal(got, out) and torch.equal(state, final)
    assert not torch.equal(state, s)


def test_cpu_final_state_is_contiguous_as_the_fake_says():
    """A transposed initial state (a [B, H, V, K] cache read as [B, H, K, V]) still gives a
    contiguous final state on CPU, at T = 0 and T > 0: the fake's strides, which Inductor asserts."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v, g, beta, s = inputs(11)
    s_t = s.transpose(-1, -2).contiguous().transpose(-1, -2)
    for T in (0, 3):
        _, final = op(q[:, :T], k[:, :T], v[:, :T], g[:, :T], beta[:, :T], s_t, 0.25, True)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = [mode.from_tensor(x) for x in (q[:, :T], k[:, :T], v[:, :T], g[:, :T], beta[:, :T], s_t)]
            _, fake_final = op(*fake, 0.25, True)
        assert final.is_contiguous() and final.stride() == fake_final.stride()
        torch.testing.assert_close(final, op(q[:, :T], k[:, :T], v[:, :T], g[:, :T], beta[:, :T], s_t.contiguous(),
                                             0.25, True)[1], rtol=0, atol=0)


def test_out_dtype_and_outputs():
    q, k, v, g, beta, s = inputs(6, dtype=torch.bfloat16)
    out, final = op(q, k, v, g, beta, s, 0.25, True)
    assert out.dtype == torch.bfloat16 and out.is_contiguous() and final.dtype == torch.float32
    full, _ = op(q, k, v, g, beta, s, 0.25, True, 1e-6, torch.float32)
    assert torch.equal(out, full.to(torch.bfloat16))
    assert final.data_ptr() != s.data_ptr()
    empty_out, same = op(q[:, :0], k[:, :0], v[:, :0], g[:, :0], beta[:, :0], s, 0.25, True)
    assert empty_out.shape == (2, 0, 4, 12) and torch.equal(same, s) and same.data_ptr() != s.data_ptr()


def test_fake_impls_and_opcheck():
    """The fake impls give the real outputs' shapes, dtypes and strides; torch's opcheck agrees."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v, g, beta, s = inputs(7)
    args = (q, k, v, g, beta, s, 0.25, True, 1e-6, torch.bfloat16)
    real = op(*args)
    with FakeTensorMode() as mode:
        fake = op(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    for f, r in zip(fake, real):
        assert (f.shape, f.dtype, f.stride()) == (r.shape, r.dtype, r.stride())
    torch.library.opcheck(op, args)
    torch.library.opcheck(inplace_op, (q, k, v, g, beta, s.clone(), 0.25, False))


def _err(match, *args, exc=ValueError, inplace=False):
    with pytest.raises(exc, match=match):
        (inplace_op if inplace else op)(*args)


def test_bad_arguments_are_named():
    q, k, v, g, beta, s = inputs(8)
    f = 0.25
    _err(r"^initial_state: expected \[B, Hv, K, V\] = \[2, 4, 16, 12\], got \[2, 4, 12, 16\]",
         q, k, v, g, beta, s.transpose(2, 3), f, True)
    _err("^state: expected a float32 state", q, k, v, g, beta, s.bfloat16(), f, True, inplace=True)
    _err("^v: its 3 heads are not a multiple of q / k's 2 heads", q, k, v[:, :, :3], g[..., :3], beta[..., :3], None,
         f, True)
    _err(r"^v: expected \[B, T, Hv, V\] with q's B = 2 and T = 3", q, k, v[:, :2], g, beta, None, f, True)
    _err(r"^k: expected q's shape", q, k[:, :, :1], v, g, beta, None, f, True)
    _err(r"^g: expected \[B, T, Hv\] \(a decay per head\)", q, k, v, g[:, :, :2], beta, None, f, True)
    _err(r"^g: expected \[B, T, Hv, K\] \(a decay per key channel\)", q, k, v, g[..., None].expand(2, 3, 4, 8), beta,
         None, f, True)
    _err("^g: expected a 3-D or 4-D floating-point tensor, got 2-D", q, k, v, g[0], beta, None, f, True)
    _err(r"^beta: expected \[B, T, Hv\] = \[2, 3, 4\], got \[2, 3, 2\]", q, k, v, g, beta[..., :2], None, f, True)
    _err(r"^beta: expected a 3-D floating-point tensor, got 4-D", q, k, v, g, beta[..., None], None, f, True)
    _err("^q: expected a 4-D floating-point tensor, got 4-D torch.int64", q.long(), k, v, g, beta, None, f, True)
    _err("^beta: expected a 3-D floating-point tensor, got 3-D torch.bool", q, k, v, g, beta > 0, None, f, True)
    _err(r"^scale: expected a finite float, got inf", q, k, v, g, beta, None, float("inf"), True)
    _err(r"^eps: expected a finite float >= 0", q, k, v, g, beta, None, f, True, -1.0)
    _err(r"^out_dtype: expected None or a floating-point dtype", q, k, v, g, beta, None, f, True, 1e-6, torch.int32)
    big = torch.zeros(1, 1, 1, 300)
    _err(r"^k: head dim K must be in \[1, 256\]", big, big, big, big[..., 0], big[..., 0], None, f, True)


def test_validate_directly():
    """The pattern calls :func:`validate` on fake values too: the geometry it returns, and the
    errors for what custom_op's schema would let through."""
    q, k, v, g, beta, s = inputs(9, Hk=1, Hv=4, per_channel=True)
    meta = mod.validate(q, k, v, g, beta, s, 0.25, True)
    assert meta == (2, 3, 1, 4, 16, 12, True) and meta.group == 4
    with pytest.raises(TypeError, match="^q: expected a Tensor"):
        mod.validate(q.tolist(), k, v, g, beta)
    with pytest.raises(TypeError, match="^use_qk_l2norm: expected a bool"):
        mod.validate(q, k, v, g, beta, s, 0.25, 1)
    with pytest.raises(TypeError, match="^scale: expected a finite float"):
        mod.validate(q, k, v, g, beta, s, "0.25", True)
    with pytest.raises(ValueError, match="^beta: expected device meta"):
        mod.validate(q.to("meta"), k.to("meta"), v.to("meta"), g.to("meta"), beta, None, 0.25, True)


def test_a_rejected_inplace_call_leaves_the_state_alone():
    q, k, v, g, beta, s = inputs(11)
    before = s.clone()
    with pytest.raises(ValueError, match="^g"):
        inplace_op(q, k, v, g[:, :1], beta, s, 0.25, True)
    assert torch.equal(s, before)


# --------------------------------------------------------------------------- the Triton kernel
# under the interpreter on CPU (TRITON_INTERPRET=1, set by conftest) or on the GPU; against the CPU
# op (float32: TOL, see the module docstring). A small launch (few programs) keeps the interpreter
# fast: BV = 16 columns per program unless a case needs several column blocks.

SMALL = mod.LaunchConfig(16, 1) if mod.triton is not None else None


def _dev(*ts):
    return [t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in ts]


def _poisoned(B, T, Hv, V, dtype):
    return torch.full((B, T, Hv, V), float("nan"), dtype=dtype, device=DEVICE)


def _kernel_vs_op(args, scale=0.25, l2=True, out_dtype=None, config=SMALL, inplace=False, tol=TOL):
    """The kernel (into a poisoned ``out``; ``inplace``: a poisoned copy of the state overwritten)
    against the CPU op on the same inputs; returns the kernel's outputs."""
    q, k, v, g, beta, s = args
    want, want_state = op(q, k, v, g, beta, s, scale, l2, 1e-6, out_dtype)
    out = _poisoned(*v.shape[:3], v.shape[3], want.dtype)
    state = None if s is None else s.to(DEVICE).clone()
    got, final = mod.step_triton(*_dev(q, k, v, g, beta), state, scale, l2, 1e-6, out_dtype, inplace=inplace,
                                 out=out, config=config)
    assert got is out and (final is state) == inplace
    assert final.shape == want_state.shape and final.dtype == torch.float32
    if want.dtype == torch.float32:
        torch.testing.assert_close(got.cpu(), want, **tol)
    else:  # one rounding step of the output dtype (the interpreter truncates float32 -> bf16)
        full = op(q, k, v, g, beta, s, scale, l2, 1e-6, torch.float32)[0]
        ulp = torch.finfo(want.dtype).eps * full.abs().clamp_min(torch.finfo(want.dtype).tiny)
        assert ((got.cpu().float() - full).abs() <= 2 * ulp + tol["atol"]).all()
    torch.testing.assert_close(final.cpu(), want_state, **tol)
    return got, final


@needs_runner
@pytest.mark.parametrize("T,group", [(1, 1), (1, 4), (2, 2), (5, 4), (8, 1)])
def test_triton_kernel_matches_the_cpu_op(T, group):
    """Two key heads, so that value head h reading key head h // group (repeat_interleave), not
    h % Hk (repeat), is what passes."""
    _kernel_vs_op(inputs(100 + T, B=2 if T < 5 else 1, T=T, Hk=2, Hv=2 * group, K=16, V=16))


@needs_runner
@pytest.mark.parametrize("case", ["gqa2 T1", "gqa4 T3", "no l2norm", "no state", "per-channel"])
def test_triton_kernel_scaled_body(case):
    """The ``SCALED`` body (the sums over raw q / k, the norms applied after them): masked K and V
    (12 / 20, three column blocks), grouped heads, several tokens, without l2norm or a state; a
    per-channel decay takes the plain body (and must still be right)."""
    T, group = (1, 2) if case == "gqa2 T1" else (3, 4) if case == "gqa4 T3" else (2, 1)
    q, k, v, g, beta, s = inputs(1300 + len(case), B=2, T=T, Hk=1, Hv=group, K=12, V=20,
                                 per_channel=case == "per-channel", state=case != "no state")
    l2 = case != "no l2norm"
    if not l2:
        q, k = 0.3 * q, 0.3 * k
    _kernel_vs_op((q, k, v, g, beta, s), scale=0.25 if l2 else 1.0, l2=l2,
                  config=mod.LaunchConfig(8, 1, scaled=True))


@needs_runner
@pytest.mark.parametrize("T", [1, 3])
def test_triton_kernel_per_channel_decay(T):
    """Kimi's decay per key channel, with grouped heads too (the op allows it)."""
    _kernel_vs_op(inputs(200 + T, B=1, T=T, Hk=1, Hv=2, K=16, V=16, per_channel=True))


@needs_runner
@pytest.mark.parametrize("per_channel", [False, True])
def test_triton_kernel_masks_k_and_v(per_channel):
    """K and V not powers of two (OLMo-hybrid's 96 / 192, scaled down: 12 / 20): K padded to 16
    rows, V in three column blocks of 8, the last one partial."""
    _kernel_vs_op(inputs(300, B=1, T=3, Hk=1, Hv=2, K=12, V=20, per_channel=per_channel),
                  config=mod.LaunchConfig(8, 1))


@needs_runner
def test_triton_kernel_without_state_or_l2norm():
    _kernel_vs_op(inputs(400, B=2, T=2, Hk=2, Hv=2, state=False))
    q, k, v, g, beta, s = inputs(401, B=1, T=4, Hk=1, Hv=2)
    _kernel_vs_op((0.3 * q, 0.3 * k, v, g, beta, s), scale=1.0, l2=False)


@needs_runner
@pytest.mark.parametrize("layout", ["head-major", "split"])
def test_triton_kernel_reads_strided_inputs(layout):
    """Transposed head-major q / k / v / g / beta and the split views of one projection, read by
    their strides (none of them contiguous)."""
    args = inputs(500, B=2, T=3, Hk=2, Hv=4, layout=layout)
    assert not any(t.is_contiguous() for t in args[:3])
    _kernel_vs_op(args)


@needs_runner
@pytest.mark.parametrize("dtype,out_dtype", [(torch.bfloat16, None), (torch.bfloat16, torch.float32),
                                             (torch.float32, torch.bfloat16), (torch.float16, torch.float16)])
def test_triton_kernel_dtypes(dtype, out_dtype):
    _kernel_vs_op(inputs(600, B=1, T=2, Hk=1, Hv=2, dtype=dtype), out_dtype=out_dtype)


@needs_runner
def test_triton_kernel_in_place():
    """The in-place launch overwrites the state it reads (every program reads its whole tile
    first): the same out and final state as the CPU op; two decode steps in place are one T = 2
    step; fresh inputs each time."""
    args = inputs(700, B=2, T=1, Hk=1, Hv=2, K=16, V=24)
    _kernel_vs_op(args, inplace=True, config=mod.LaunchConfig(8, 1))
    q, k, v, g, beta, s = inputs(701, B=2, T=2, Hk=1, Hv=2, per_channel=True)
    want, want_state = op(q, k, v, g, beta, s, 0.25, True)
    state = s.to(DEVICE).clone()
    for t in range(2):
        step = [x[:, t:t + 1] for x in (q, k, v, g, beta)]
        out, final = mod.step_triton(*_dev(*step), state, 0.25, True, inplace=True, config=SMALL)
        assert final is state
        torch.testing.assert_close(out.cpu(), want[:, t:t + 1], **TOL)
    torch.testing.assert_close(state.cpu(), want_state, **TOL)


@needs_runner
def test_triton_kernel_no_tokens():
    """T = 0: the final state is the initial one (zeros without), ``out`` empty."""
    *xs, s = inputs(800, B=1, T=3)
    q, k, v, g, beta = (x[:, :0] for x in xs)
    out, final = mod.step_triton(*_dev(q, k, v, g, beta, s), 0.25, True, config=SMALL)
    assert out.shape == (1, 0, 4, 12) and torch.equal(final.cpu(), s) and final.data_ptr() != s.data_ptr()
    _, zeros = mod.step_triton(*_dev(q, k, v, g, beta), None, 0.25, True, config=SMALL)
    assert torch.equal(zeros.cpu(), torch.zeros_like(s))


def test_launch_config_table():
    """The table's classes (``LAUNCH_TABLE``) at Qwen3-Next's dims (32 value heads, K = V = 128):
    T = 1 16 columns x 1 warp up to B = 16, 64 x 4 from B = 32 (measured); T > 1 the token-by-token
    body's 16 x 1, from B = 32 bounded at 128 registers a thread (the window body measured slower on
    an H100: a candidate only); OLMo-hybrid's K = 96
    pads to 128; K = 256 halves the columns, a narrow V caps them; the SCALED body stays off until a
    GPU has timed it in the table; every class is covered once, and every row names its run."""
    if mod.triton is None:
        pytest.skip("needs triton")
    cfg, small, big = mod.launch_config, mod.LaunchConfig(16, 1), mod.LaunchConfig(64, 4)
    assert [cfg(b, 32, 128, 128) for b in (1, 8, 16, 32, 128, 256)] == [small] * 3 + [big] * 3
    assert not any(cfg(b, 32, 128, 128, t).window for b in (1, 32, 128, 256) for t in (2, 3, 4, 5, 8))
    bounded = mod.LaunchConfig(16, 1, max_registers=128)
    assert cfg(32, 32, 128, 128, 9) == bounded  # past the table: token by token, its last class
    assert cfg(1, 32, 128, 128, 4) == cfg(16, 32, 128, 128, 8) == small
    assert cfg(32, 32, 128, 128, 2) == cfg(128, 32, 128, 128, 8) == bounded
    assert cfg(32, 30, 96, 192) == big and cfg(1, 30, 96, 192) == small
    assert cfg(128, 8, 256, 64) == mod.LaunchConfig(32, 4)
    assert cfg(32, 32, 64, 32) == mod.LaunchConfig(32, 4) and cfg(1, 1, 8, 4) == mod.LaunchConfig(8, 1)
    assert not any(cfg(b, 32, 128, 128, t).scaled for b in (1, 256) for t in (1, 4))
    rows = mod.LAUNCH_TABLE
    for t in range(1, 9):
        for heads in (1, 32, 512, 513, 4096):
            assert sum(r.tokens[0] <= t <= r.tokens[1] and r.heads[0] <= heads <= (r.heads[1] or heads)
                       for r in rows) == 1
    assert all(r.measured for r in rows) and not any(r.config.window for r in rows)


@needs_runner
@pytest.mark.parametrize("row", range(len(mod.LAUNCH_TABLE)))
def test_each_table_class_matches_the_cpu_op(row):
    """Each class's launch on the interpreter at both ends of its token range (T = 1 at B = 1 for
    the first class; 2; 3, 4; 5, 8), a scalar decay at the first end and Kimi's per-key-channel decay
    (in place) at the last, grouped heads, K and V not powers of two (12 / 20: masked rows and
    columns, a partial column block)."""
    r = mod.LAUNCH_TABLE[row]
    for T, per_channel in ((r.tokens[0], False), (r.tokens[1], True)):
        Hk, Hv = (1, 2) if per_channel else (2, 4)
        B = 1 if row == 0 or T >= 5 else 2
        args = inputs(1500 + 10 * row + T, B=B, T=T, Hk=Hk, Hv=Hv, K=12, V=20, per_channel=per_channel)
        _kernel_vs_op(args, config=r.config, inplace=per_channel)


@needs_runner
@pytest.mark.parametrize("T", [2, 4, 8])
def test_window_body_without_state_or_l2norm_and_strided(T):
    """The window body from a zeros state without l2norm (g strongly negative: the decays' ratios
    stay finite), on head-major strided inputs with a bf16 output; a window config given 9 tokens
    (past ``MAX_WINDOW``) runs them token by token."""
    q, k, v, g, beta, _ = inputs(1600 + T, B=1, T=T, Hk=1, Hv=2, K=16, V=16, state=False)
    W = mod.LaunchConfig(16, 2, window=True)
    _kernel_vs_op((0.3 * q, 0.3 * k, v, 8 * g, beta, None), scale=1.0, l2=False, config=W)
    args = inputs(1610 + T, B=2, T=T, Hk=1, Hv=2, K=16, V=16, layout="head-major", dtype=torch.bfloat16)
    _kernel_vs_op(args, config=W, out_dtype=torch.bfloat16)
    if T == 8:
        _kernel_vs_op(inputs(1620, B=1, T=9, Hk=1, Hv=1, K=16, V=16), config=W)


def test_step_triton_checks_its_out_argument():
    if mod.triton is None:
        pytest.skip("needs triton")
    q, k, v, g, beta, s = inputs(900)
    with pytest.raises(ValueError, match=r"^out: expected a contiguous \[2, 3, 4, 12\]"):
        mod.step_triton(q, k, v, g, beta, s, 0.25, True, out=torch.empty(2, 3, 12, 4).transpose(2, 3))
    with pytest.raises(ValueError, match="^state: the in-place step needs a state"):
        mod.step_triton(q, k, v, g, beta, None, 0.25, True, inplace=True)


# --------------------------------------------------------------------------- the CUDA ops (GPU only)
needs_cuda = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU; .ci/gpu tests runs them


@needs_cuda
@pytest.mark.parametrize("per_channel", [False, True])
def test_cuda_ops_match_the_cpu_op_at_model_dims(per_channel):
    """The CUDA impls at Qwen3-Next's (16 / 32 heads, 128 / 128) and Kimi's (32 / 32, per
    channel) dims, T = 1, 2, 4 and 8 at B = 3 and T = 4 at B = 17 (more than ``SMALL_HEADS`` state
    matrices): every class of the default launch table."""
    Hk = 32 if per_channel else 16
    for T, B in ((1, 3), (2, 3), (4, 3), (8, 3), (4, 17), (1, 17)):
        q, k, v, g, beta, s = inputs(T + B, B=B, T=T, Hk=Hk, Hv=32, K=128, V=128, per_channel=per_channel,
                                     dtype=torch.bfloat16)
        want, want_state = op(q, k, v, g, beta, s, 128 ** -0.5, True)
        out, final = op(*_dev(q, k, v, g, beta, s), 128 ** -0.5, True)
        torch.testing.assert_close(final.cpu(), want_state, **TOL)
        torch.testing.assert_close(out.cpu(), want, rtol=0, atol=2 ** -7 * want.abs().max().item())
        state = s.cuda()
        got = inplace_op(*_dev(q, k, v, g, beta), state, 128 ** -0.5, True)
        assert torch.equal(got, out) and torch.equal(state, final)


@needs_cuda
def test_cuda_inplace_op_under_graph_capture_without_syncs():
    """Captured in a CUDA graph (no host sync: sync debug mode 'error' while capturing and
    replaying), each replay advances the state one token."""
    q, k, v, g, beta, s = _dev(*inputs(1, B=4, T=1, Hk=16, Hv=32, K=128, V=128, dtype=torch.bfloat16))
    state = s.clone()
    fn = lambda: inplace_op(q, k, v, g, beta, state, 0.088, True)  # noqa: E731
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            fn()
        torch.cuda.synchronize()
        state.copy_(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        graph.replay()
        graph.replay()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cur = s.cpu()
    for _ in range(2):
        want, cur = op(q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), cur, 0.088, True)
    torch.testing.assert_close(state.cpu(), cur, **TOL)
    torch.testing.assert_close(out.cpu().float(), want.float(), rtol=0, atol=2 ** -7 * want.abs().max().item())


# --------------------------------------------------------------------------- under torch.compile


@pytest.mark.parametrize("dynamic", [False, True])
def test_ops_trace_and_functionalize(dynamic):
    """Both ops through Dynamo and AOTAutograd (``aot_eager``: functionalized, the in-place op as
    ``auto_functionalized``, the fake impls at symbolic sizes with ``dynamic=True``): the same
    results as eager, the state written back."""
    def step(q, k, v, g, beta, state):
        out = torch.ops.kda.gdn_recurrent_step_inplace(q, k, v, g, beta, state, 0.25, True)
        out2, final = torch.ops.kda.gdn_recurrent_step(q, k, v, g, beta, state, 0.25, True, 1e-6, torch.float32)
        return out, out2, final

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", dynamic=dynamic, fullgraph=True)
    for seed, B in ((0, 2), (1, 3)):
        *xs, s = inputs(1200 + seed, B=B, T=2, per_channel=bool(seed))
        mine, theirs = s.clone(), s.clone()
        got, want = compiled(*xs, mine), step(*xs, theirs)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        assert torch.equal(mine, theirs) and not torch.equal(mine, s)
    torch._dynamo.reset()
