"""kda::gated_norm_quant: the CPU op against eager's norm-then-QuantFP8 code (bit-exact), the
Triton kernel under the interpreter (or on a GPU), the fake impl, opcheck, bad arguments.

Kernel bounds: the fused kernel's norm is ``gated_norm_merge``'s kernel math, within 1 ulp of
the CPU op (machine-dependent reduction order under the interpreter: see
tests/test_gated_norm_merge.py::assert_kernel_matches_cpu_op); so the kernel is asserted
bit-exact (q bytes and scales) against the quantization of the norm kernel's own output, and
within one fp8 step (dequantized) of the CPU op."""

from __future__ import annotations

import os

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kda_inductor.lowerings import gated_norm_merge as norm_mod
from kda_inductor.lowerings import gated_norm_quant as mod
from kda_inductor.reference import fp8_step

OP = torch.ops.kda.gated_norm_quant.default
HAS_RUNNER = mod.triton is not None and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the interpreter truncates float32 -> bfloat16 inside the norm's hf form: float16 there
KDTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16


def eager(sources, indices, z, weight, eps, activation, form, rsqrt, num_tokens, norm_dtype, width, group_size,
          ue8m0, reciprocal, column_major, pad_value=None, eps_input=None):
    """The spec, as written in the module docstring."""
    y = torch.ops.kda.gated_norm_merge.default(sources, indices, z, weight, eps, activation, form, rsqrt,
                                               num_tokens, norm_dtype, pad_value, eps_input)
    x = y.reshape(-1, width)
    K = width
    xg = x.view(-1, K // group_size, group_size)
    amax = xg.abs().amax(-1, keepdim=True).float()
    s = amax / 448.0
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    s = s.clamp(min=1.0 / (448.0 * 512.0))
    xs = xg.float() * s.reciprocal() if reciprocal else xg / s
    q = xs.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(-1, K)
    scales = s.squeeze(-1)
    if column_major:
        scales = scales.t().contiguous().t()
    return q, scales


def _inputs(T=7, R=4, D=32, *, merge=True, dtype=torch.bfloat16, seed=0, gate="2d", n_real=None, scale=1.0):
    """``(sources, indices, z, weight, num_tokens)``: two sources whose indices partition the
    first ``n_real`` (default T) tokens (a random split, negative indices among them), or one
    source in token order."""
    g = torch.Generator().manual_seed(seed)
    n = T if n_real is None else n_real
    if merge:
        perm = torch.randperm(n, generator=g)
        k = n // 2
        a, b = perm[:k], perm[k:]
        b = torch.where(torch.arange(b.shape[0]) % 2 == 0, b - n, b)  # some count from the end
        sources = [(scale * torch.randn(a.shape[0], R * D, generator=g)).to(dtype),
                   (scale * torch.randn(b.shape[0], R * D, generator=g)).to(dtype)]
        indices = [a, b.to(torch.int32)]
    else:
        sources, indices = [(scale * torch.randn(n, R * D, generator=g)).to(dtype)], []
    zt = torch.randn(T, 2 * R * D, generator=g).to(dtype)
    z = zt[:, :R * D].contiguous().view(-1, D) if gate == "2d" else zt[:, R * D:].view(T, R, D)
    w = 1 + 0.1 * torch.randn(D, generator=g)
    return sources, indices, z, w, n


def _bytes(q):
    return q.view(torch.uint8)


def _assert_same(got, want):
    (q, s), (q0, s0) = got, want
    assert q.dtype == torch.float8_e4m3fn and q.shape == q0.shape and q.is_contiguous()
    assert torch.equal(_bytes(q), _bytes(q0))
    assert s.dtype == torch.float32 and s.shape == s0.shape and s.stride() == s0.stride()
    assert torch.equal(s, s0)


# ----------------------------------------------------------------------------- CPU op


@pytest.mark.parametrize("layout", ["group", "per-token", "sub-row groups", "two-token rows"])
@pytest.mark.parametrize("merge", [True, False], ids=["merge", "merge-free"])
def test_cpu_op_is_eager_bit_exact(layout, merge):
    R, D = 4, 32
    width, group, reciprocal = {"group": (R * D, D, False), "per-token": (R * D, R * D, True),
                                "sub-row groups": (R * D, 16, False), "two-token rows": (2 * R * D, D, False)}[layout]
    T = 6
    for seed, (act, form) in enumerate((("silu", "fla"), ("sigmoid", "hf"), ("silu", "hf"), ("sigmoid", "fla"))):
        sources, indices, z, w, n = _inputs(T, R, D, merge=merge, seed=seed, gate="2d" if seed % 2 else "3d")
        for ue8m0 in (False, True):
            for column_major in (False, True):
                args = (sources, indices, z, w, 1e-6, act, form, seed % 2 == 0, n, torch.bfloat16, width, group,
                        ue8m0, reciprocal, column_major)
                got, want = OP(*args), eager(*args)
                _assert_same(got, want)
                M, G = T * R * D // width, width // group
                assert got[0].shape == (M, width) and got[1].shape == (M, G)
                if column_major and G > 1:
                    assert got[1].stride() == (1, M)


def test_cpu_op_padded_output_eps_input_and_float32_norm():
    """Padding tokens (pad_value), eps lifted to a 0-d tensor, a float32 norm output, tiny
    values (scales at the clamp) and zero groups (padding of 0)."""
    R, D, T = 2, 16, 5
    sources, indices, z, w, n = _inputs(T, R, D, seed=3, n_real=3, scale=1e-6)
    for pad, dtype in ((0.0, torch.float32), (0.5, torch.bfloat16)):
        for ue8m0 in (False, True):
            args = (sources, indices, z, w, 0.0, "silu", "fla", True, n, dtype, R * D, D, ue8m0, False, False, pad,
                    torch.tensor(1e-5))
            got = OP(*args)
            _assert_same(got, eager(*args))
            assert got[0].shape == (T, R * D) and got[1].shape == (T, R)
    assert float(got[1].min()) == pytest.approx(1.0 / (448 * 512))


def test_cpu_op_outputs_are_new_tensors():
    sources, indices, z, w, n = _inputs(seed=4)
    args = (sources, indices, z, w, 1e-6, "silu", "fla", True, n, torch.bfloat16, 128, 32, False, False, False)
    (q1, s1), (q2, s2) = OP(*args), OP(*args)
    assert q1.data_ptr() != q2.data_ptr() and s1.data_ptr() != s2.data_ptr()
    ptrs = {t.untyped_storage().data_ptr() for t in (*sources, z, w)}
    assert q1.untyped_storage().data_ptr() not in ptrs and s1.untyped_storage().data_ptr() not in ptrs


# ----------------------------------------------------------------------------- bad arguments


def _bad(**kw):
    sources, indices, z, w, n = _inputs(T=4, R=2, D=32, seed=5)
    a = dict(sources=sources, indices=indices, z=z, weight=w, eps=1e-6, activation="silu", form="fla", rsqrt=True,
             num_tokens=n, norm_dtype=torch.bfloat16, width=64, group_size=32, ue8m0=False, reciprocal=False,
             column_major=False)
    a.update(kw)
    return a


@pytest.mark.parametrize("kw, match", [
    (dict(group_size=24), r"^group_size: 24 does not divide width 64"),
    (dict(width=96, group_size=32), r"^width: 96 does not divide"),
    (dict(group_size=0), r"^group_size: must be > 0"),
    (dict(weight=torch.ones(16)), r"^weight: expected \[D\] = \[32\]"),
    (dict(norm_dtype=torch.int8), r"^norm_dtype: expected one of"),
    (dict(activation="gelu"), r"^activation: expected one of"),
])
def test_bad_arguments_name_the_argument(kw, match):
    a = _bad(**kw)
    with pytest.raises(ValueError, match=match):
        OP(*a.values())
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(ValueError, match=match):  # the fake impl too
        OP(*a.values())
    with pytest.raises(ValueError, match=match):  # public validate
        mod.validate(*a.values())


# ----------------------------------------------------------------------------- fake impl


@pytest.mark.parametrize("column_major", [False, True])
def test_fake_impl_shapes_dtypes_strides(column_major):
    R, D, T = 4, 32, 6
    sources, indices, z, w, n = _inputs(T, R, D, seed=6)
    for width, group in ((R * D, D), (R * D, R * D), (2 * R * D, 16)):
        args = (sources, indices, z, w, 1e-6, "silu", "fla", True, n, torch.bfloat16, width, group, True,
                group == width, column_major)
        real = OP(*args)
        with FakeTensorMode() as fm:
            fargs = tuple([fm.from_tensor(t) for t in a] if isinstance(a, list) else
                          fm.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
            q, s = OP(*fargs)
        M, G = T * R * D // width, width // group
        assert q.shape == real[0].shape == (M, width) and q.dtype == torch.float8_e4m3fn and q.is_contiguous()
        assert s.shape == real[1].shape == (M, G) and s.dtype == torch.float32
        want = (1, M) if column_major else (G, 1)
        assert s.stride() == want  # the kernel path's allocation
        for d in range(2):  # eager's strides, where they matter (dims of size > 1)
            if s.shape[d] > 1:
                assert s.stride(d) == real[1].stride(d)


def test_fake_impl_symbolic_tokens():
    """Symbolic token counts: M = rows * D // width traced on SymInts, no guard on the values."""
    from torch.fx.experimental.proxy_tensor import make_fx

    R, D, T = 2, 32, 6
    sources, indices, z, w, n = _inputs(T, R, D, merge=False, seed=7)

    def f(x, z, w):
        return OP([x], [], z, w, 1e-6, "silu", "fla", True, x.shape[0], torch.bfloat16, R * D, D, False, False,
                  True)

    gm = make_fx(f, tracing_mode="symbolic")(sources[0], z, w)
    out = [node for node in gm.graph.nodes if node.op == "output"][0].args[0]
    q, s = (a.meta["val"] for a in out)
    assert isinstance(q.shape[0], torch.SymInt) and q.shape[1] == R * D and q.dtype == torch.float8_e4m3fn
    assert s.shape[1] == R and s.stride(0) == 1 and s.dtype == torch.float32
    assert str(s.shape[0]) == str(q.shape[0])
    q2, s2 = gm(sources[0], z, w)
    _assert_same((q2, s2), f(sources[0], z, w))


def test_opcheck():
    sources, indices, z, w, n = _inputs(T=5, R=2, D=16, seed=8)
    for column_major in (False, True):
        args = (sources, indices, z, w, 1e-6, "sigmoid", "hf", False, n, torch.bfloat16, 32, 16, True, False,
                column_major)
        torch.library.opcheck(torch.ops.kda.gated_norm_quant, args)


# ----------------------------------------------------------------------------- Triton kernel

kernel = pytest.mark.skipif(not HAS_RUNNER, reason="needs a GPU or TRITON_INTERPRET=1 with triton")


def _to(xs):
    return [x.to(DEVICE) for x in xs]


def _run_kernel(sources, indices, z, w, *, n, width, group, ue8m0, reciprocal, column_major, act="silu", form="fla",
                rsqrt=True, pad_value=None, norm_dtype=None, block_r=None, divide=None):
    """The kernel's (q, scales) from poisoned outputs, the CPU op's, and the exact result: the
    quantization of the norm kernel's own output, by ``x * (1 / s)`` where the kernel multiplies
    (``reciprocal``, or ``GROUP_DIVIDE``'s ``"reciprocal"``), else by ``x / s``."""
    norm_dtype = norm_dtype or KDTYPE
    args = (sources, indices, z, w, 1e-6, act, form, rsqrt, n, norm_dtype, width, group, ue8m0, reciprocal,
            column_major, pad_value)
    want = OP(*args)
    M, G = want[0].shape[0], width // group
    q = torch.full((M, width), 77.0, device=DEVICE).to(torch.float8_e4m3fn)  # poisoned
    s = (torch.full((G, M), -3.0, device=DEVICE).t() if column_major else
         torch.full((M, G), -3.0, device=DEVICE))
    mod.norm_quant_triton(_to(sources), _to(indices), z.to(DEVICE), w.to(DEVICE), q, s, eps=1e-6, activation=act,
                          form=form, rsqrt=rsqrt, num_tokens=n, norm_dtype=norm_dtype, group_size=group,
                          ue8m0=ue8m0, reciprocal=reciprocal, column_major=column_major, pad_value=pad_value,
                          block_r=block_r, divide=divide)
    # the quantization of the norm kernel's own output, same tile: the fused kernel's exact result
    D = w.shape[0]
    R = sources[0].shape[1] // D
    row_group, _ = mod.kernel_mode(R, D, group)
    br = norm_mod.triton.next_power_of_2(R) if row_group > 1 else block_r
    y = torch.empty(z.reshape(-1, D).shape, dtype=norm_dtype, device=DEVICE)
    norm_mod.norm_merge_triton(_to(sources), _to(indices), z.to(DEVICE), w.to(DEVICE), y, eps=1e-6, activation=act,
                               form=form, rsqrt=rsqrt, num_tokens=n, pad_value=pad_value, block_r=br)
    multiplies = reciprocal or (divide or mod.GROUP_DIVIDE) == "reciprocal"
    exact = mod.quantize(y.cpu(), width, group, ue8m0, multiplies, column_major)  # torch's CPU log2
    return (q.cpu(), s.cpu()), want, exact


def _assert_kernel(got, want, exact, ue8m0, label):
    (q, s), (q0, s0) = got, want
    assert s.stride() == exact[1].stride() or s.shape[1] == 1, label
    assert torch.equal(s, exact[1]), label
    assert torch.equal(_bytes(q), _bytes(exact[0])), label
    # against the CPU op: the norm within 1 ulp, so scales within an ulp (or one power of two)
    ratio = s / s0
    if ue8m0:
        assert bool(((ratio == 1) | (ratio == 2) | (ratio == 0.5)).all()), label
    else:
        assert float((ratio - 1).abs().max()) <= 2.0**-8, label
    G = s.shape[1]
    qa = q.float().view(q.shape[0], G, -1)
    qb = q0.float().view(q.shape[0], G, -1)
    a, b = qa * s[:, :, None], qb * s0[:, :, None]
    big = torch.maximum(qa.abs(), qb.abs())
    tol = (fp8_step(big) + big * 2.0**-7) * torch.maximum(s, s0)[:, :, None]
    assert int(((a - b).abs() > tol).sum()) == 0, label


LAYOUTS = {  # (R, D, width, group, reciprocal)
    "group = D": (4, 32, 128, 32, False),
    "per-token": (4, 32, 128, 128, True),
    "two norm rows a group": (4, 32, 128, 64, False),
    "sub-row groups": (2, 64, 128, 16, False),
    "width of two tokens": (2, 32, 128, 32, False),
    "D not a power of two": (3, 24, 72, 24, False),
    "per-token, R = 3": (3, 16, 48, 48, True),
}


@kernel
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_kernel_layouts(layout):
    R, D, width, group, reciprocal = LAYOUTS[layout]
    T = 6
    cases = ((True, False, False, "silu", "fla"), (True, True, True, "sigmoid", "hf"),
             (False, True, False, "sigmoid", "fla"), (False, False, True, "silu", "hf"))
    for merge, ue8m0, column_major, act, form in cases:
        sources, indices, z, w, n = _inputs(T, R, D, merge=merge, dtype=KDTYPE, seed=R + D + merge,
                                            gate="3d" if ue8m0 else "2d")
        got, want, exact = _run_kernel(sources, indices, z, w, n=n, width=width, group=group, ue8m0=ue8m0,
                                       reciprocal=reciprocal, column_major=column_major, act=act, form=form,
                                       rsqrt=not ue8m0)
        _assert_kernel(got, want, exact, ue8m0, f"{layout} merge={merge} ue8m0={ue8m0} cm={column_major} {act} {form}")


@kernel
def test_kernel_padding_float32_norm_and_row_blocks():
    """Padding tokens (pad_value), a float32 norm output, row blocks smaller than R, a zero
    pad (scales at the clamp)."""
    R, D, T = 4, 16, 6
    sources, indices, z, w, n = _inputs(T, R, D, dtype=KDTYPE, seed=11, n_real=4)
    for pad, norm_dtype, block_r, ue8m0 in ((0.0, torch.float32, 2, True), (0.25, KDTYPE, 1, False),
                                            (0.0, KDTYPE, None, False)):
        got, want, exact = _run_kernel(sources, indices, z, w, n=n, width=R * D, group=D, ue8m0=ue8m0,
                                       reciprocal=False, column_major=True, pad_value=pad, norm_dtype=norm_dtype,
                                       block_r=block_r)
        _assert_kernel(got, want, exact, ue8m0, f"pad={pad} {norm_dtype} block_r={block_r}")
    sources, _, z, w, n = _inputs(T, R, D, merge=False, dtype=KDTYPE, seed=12, n_real=4)
    got, want, exact = _run_kernel(sources, [], z, w, n=n, width=R * D, group=R * D, ue8m0=False, reciprocal=True,
                                   column_major=False, pad_value=0.0)
    _assert_kernel(got, want, exact, False, "merge-free, padded")


@kernel
@pytest.mark.parametrize("divide", mod.DIVIDES)
def test_triton_kernel_divide_modes(divide):
    """Both ways the kernel divides group scales: each bit-exact with its torch spelling (``x /
    s``, ``x * s.reciprocal()``) of the norm kernel's output, and within one fp8 step of the CPU
    op; one reciprocal per group for sub-row groups and row groups alike."""
    for R, D, width, group in ((4, 32, 128, 32), (2, 64, 128, 16), (4, 32, 128, 64)):
        sources, indices, z, w, n = _inputs(6, R, D, dtype=KDTYPE, seed=R + group)
        got, want, exact = _run_kernel(sources, indices, z, w, n=n, width=width, group=group, ue8m0=False,
                                       reciprocal=False, column_major=False, divide=divide)
        _assert_kernel(got, want, exact, False, f"{divide} R={R} D={D} group={group}")


def _norm_like_groups(seed: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random bf16 values shaped as a norm's output in groups of 128 (rows of varied
    magnitude) and their scales ``amax / 448``, correctly rounded, floored as vLLM's."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(4096, 1024, generator=g) * torch.rand(4096, 1, generator=g) * scale).to(torch.bfloat16)
    x[:, :2] = torch.tensor([0.0, -0.0])  # signed zeros (a gated norm gives -0.0 where the gate is negative)
    xg = x.view(-1, 8, 128)
    return xg, (xg.abs().amax(-1, keepdim=True).float() / torch.tensor(448.0)).clamp(min=1.0 / (448.0 * 512.0))


def _fp8(v: torch.Tensor) -> torch.Tensor:
    return v.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()


def test_group_divide_modes_against_ieee_division():
    """The math of ``GROUP_DIVIDE``'s modes against IEEE ``x / s`` (vLLM's CUDA group quant, eager)
    on 16.7 million fresh values: ``"reciprocal"`` (``x * fl(1/s)``) moves a few hundred per
    million fp8 values by exactly one step, ue8m0 scales none; ``"corrected"`` (its Markstein
    step, the FMAs emulated in float64, exact there) gives IEEE's float32 quotient every time."""
    moved, total, wrong = 0, 0, 0
    for seed, scale in enumerate((0.01, 1.0, 4.0, 300.0)):
        xg, s = _norm_like_groups(seed, scale)
        ieee, r = xg / s, s.reciprocal()
        q = xg.float() * r
        t = (q.double() * s.double() - xg.double()).float()  # fma(q, s, -x): one rounding
        corrected = (q.double() - t.double() * r.double()).float()  # fma(-t, r, q)
        wrong += int((corrected.view(torch.int32) != ieee.view(torch.int32)).sum())  # the bits: -0.0 too
        a, b = _fp8(ieee), _fp8(q)
        off = a != b
        steps = (a - b).abs()[off] / fp8_step(torch.maximum(a.abs(), b.abs())[off])
        assert bool((steps == 1).all()), f"scale {scale}: steps {steps.unique().tolist()}"
        moved, total = moved + int(off.sum()), total + off.numel()
        p2 = torch.exp2(torch.ceil(torch.log2(s)))
        assert torch.equal(_fp8(xg / p2), _fp8(xg.float() * p2.reciprocal()))
    print(f"reciprocal: {moved} of {total} fp8 values one step from IEEE's; corrected: {wrong} quotients differ")
    assert wrong == 0
    assert 0 < moved < total * 1e-3  # the difference the mode's docstring states, seen and bounded


@kernel
def test_cuda_impl_paths():
    """The CUDA impl's choice (run here on the runner's tensors): the kernel where the layout
    allows; where not (a group spanning two tokens, groups neither dividing nor a multiple of
    D, indices that do not partition the tokens) the norm op then eager's quantization, which
    on CPU tensors is the CPU op exactly."""
    R, D, T = 2, 16, 6
    sources, indices, z, w, n = _inputs(T, R, D, dtype=KDTYPE, seed=13)
    dev = (_to(sources), _to(indices), z.to(DEVICE), w.to(DEVICE))
    assert mod.kernel_mode(R, D, 2 * R * D) is None and mod.kernel_mode(R, D, 24) is None
    assert mod.kernel_mode(R, D, D) == (1, 0) and mod.kernel_mode(R, D, 8) == (0, 8)
    for width, group in ((2 * R * D, 2 * R * D), (48, 24), (R * D, 8)):
        args = (1e-6, "silu", "fla", True, n, KDTYPE, width, group, False, group == width, True)
        got = tuple(t.cpu() for t in mod._gated_norm_quant_cuda(*dev, *args))
        if mod.kernel_mode(R, D, group) is None:
            if DEVICE == "cpu":
                _assert_same(got, OP(sources, indices, z, w, *args))
            continue
        q = torch.empty((T * R * D // width, width), device=DEVICE).to(torch.float8_e4m3fn)
        s = torch.empty((width // group, q.shape[0]), device=DEVICE).t()
        mod.norm_quant_triton(*dev, q, s, eps=1e-6, activation="silu", form="fla", rsqrt=True, num_tokens=n,
                              norm_dtype=KDTYPE, group_size=group, ue8m0=False, reciprocal=False, column_major=True)
        _assert_same(got, (q.cpu(), s.cpu()))
    # not a partition: 5 of 6 tokens covered, the rest pad_value
    part, idx = [sources[0][:2], sources[1]], [indices[0][:2], indices[1]]
    args = (1e-6, "silu", "fla", True, n, KDTYPE, R * D, D, True, False, False, 0.0)
    got = mod._gated_norm_quant_cuda(_to(part), _to(idx), z.to(DEVICE), w.to(DEVICE), *args)
    want = OP(part, idx, z, w, *args)
    assert got[0].shape == want[0].shape and got[1].shape == want[1].shape
    if DEVICE == "cpu":
        _assert_same(got, want)


REGROUPED = {  # (R, D, T, width, group, block_r, k): k tokens a program token
    "one row a token, group = D": (1, 32, 24, 128, 32, 4, 8),
    "sub-row groups": (1, 64, 16, 128, 16, 2, 16),
    "per-token scale of 2 rows": (2, 32, 8, 64, 64, None, 8),
    "odd token count": (1, 32, 7, 32, 32, 4, 1),
}


@kernel
@pytest.mark.parametrize("layout", list(REGROUPED))
def test_triton_kernel_regrouped_tokens(layout, monkeypatch):
    """The merge-free norm's tokens taken ``k`` at a time (``regroup``: a symbolic token count
    reached the op as one norm row a token): bit-exact with the quantization of the norm
    kernel's own output, scales row- and column-major, groups of rows and inside rows; an odd
    count keeps its tokens."""
    monkeypatch.setattr(mod, "TARGET_PROGRAMS", 1)  # groups of rows regrouped at test sizes too
    R, D, T, width, group, block_r, k = REGROUPED[layout]
    sources, _, z, w, n = _inputs(T, R, D, merge=False, dtype=KDTYPE, seed=R + D + T, gate="3d")
    plan = mod.launch_plan(_to(sources), [], z.to(DEVICE), w.to(DEVICE), eps=1e-6, activation="silu", form="fla",
                           rsqrt=True, num_tokens=n, group_size=group, block_r=block_r)
    assert (plan.merge.R, plan.merge.programs) == (R * k, T // k), layout
    for ue8m0, column_major in ((False, False), (True, True)):
        got, want, exact = _run_kernel(sources, [], z, w, n=n, width=width, group=group, ue8m0=ue8m0,
                                       reciprocal=group == width, column_major=column_major, block_r=block_r)
        _assert_kernel(got, want, exact, ue8m0, f"{layout} ue8m0={ue8m0} cm={column_major}")


def _meta_norm(T: int, H: int, D: int, rows_per_token: int):
    """A merge-free norm's tensors on the meta device: the source ``[T * H / r, r * D]``, the gate
    a strided split of a projection, a bf16 weight."""
    x = torch.empty(T * H * D, dtype=torch.bfloat16, device="meta").view(-1, rows_per_token * D)
    z = torch.empty(T, 2 * H * D, dtype=torch.bfloat16, device="meta")[:, H * D:].view(T, H, D)
    return [x], z, torch.empty(D, dtype=torch.bfloat16, device="meta")


@pytest.mark.skipif(mod.triton is None, reason="the launch plan needs triton")
@pytest.mark.parametrize("T", [1, 3, 256, 1024, 4096, 16384])
def test_one_row_tokens_launch_as_tokens_of_heads(T):
    """H = 32 heads of 128: the source as ``[T, H * D]`` (a static graph's) and as ``[T * H, D]``
    (one norm row a token) launch the same tiles, warps and programs at every T; without
    ``regroup`` the second ran one row and one warp a program (2x stock Inductor's time)."""
    H, D = 32, 128
    plans = []
    for r in (H, 1):
        sources, z, w = _meta_norm(T, H, D, r)
        plans.append(mod.launch_plan(sources, [], z, w, eps=1e-6, activation="silu", form="fla", rsqrt=True,
                                     num_tokens=sources[0].shape[0], group_size=D))
    (a, b) = plans
    assert (a.block_r, a.num_warps, a.grid[0] * a.grid[1]) == (b.block_r, b.num_warps, b.grid[0] * b.grid[1])
    assert b.merge.R == 8 and (T < 256 or (a.block_r, a.num_warps) == (8, 2))


def test_regroup_keeps_merges_padding_and_strided_sources():
    """Only the merge-free norm of token rows that lie one after another is regrouped: not a
    merge (its indices address tokens), not padding tokens, not a source that is a strided split."""
    if mod.triton is None:
        pytest.skip("no triton")
    R, D, T = 1, 32, 16
    sources, indices, z, w, n = _inputs(T, R, D, seed=5)
    assert mod.regroup(sources, indices, z, w, n, 1) == (sources, n)
    sources, _, z, w, n = _inputs(T, R, D, merge=False, seed=5, n_real=12)  # 4 padding tokens
    assert mod.regroup(sources, [], z, w, n, 1) == (sources, n)
    wide = torch.randn(T, 2 * R * D)[:, :R * D]
    assert mod.regroup([wide], [], z, w, T, 1) == ([wide], T)
    (regrouped,), tokens = mod.regroup([wide.contiguous()], [], z, w, T, 1)
    assert (tuple(regrouped.shape), tokens) == ((1, 16 * D), 1)


def test_aot_variants_enumerate():
    if mod.triton is None:
        pytest.skip("no triton")
    variants = list(mod.aot_variants())
    assert len(variants) >= 6
    names = set(mod._gated_norm_quant_kernel.arg_names)
    for v in variants:
        assert set(v.types) | set(v.constexprs) == names


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("merge", [True, False], ids=["merge", "merge-free"])
def test_op_on_cuda_matches_the_cpu_op(merge):
    """The op's CUDA dispatch (kernel and fallbacks) against the CPU op, D = 128, bf16."""
    R, D, T = 4, 128, 37
    sources, indices, z, w, n = _inputs(T, R, D, merge=merge, seed=21, gate="3d")
    cases = ((R * D, D, False, False, True), (R * D, D, True, False, True), (R * D, R * D, False, True, False),
             (R * D, 64, True, False, False), (2 * R * D, 2 * R * D, False, True, False))
    for width, group, ue8m0, reciprocal, column_major in cases:
        args = (1e-6, "silu", "fla", True, n, torch.bfloat16, width, group, ue8m0, reciprocal, column_major)
        want = OP(sources, indices, z, w, *args)
        got = OP(_to(sources), _to(indices), z.cuda(), w.cuda(), *args)
        assert got[1].stride() == want[1].stride() or got[1].shape[1] == 1
        (q, s), (q0, s0) = tuple(t.cpu() for t in got), want
        ratio = s / s0
        ok = (ratio == 1) | (ratio == 2) | (ratio == 0.5) if ue8m0 else (ratio - 1).abs() <= 2.0**-7
        assert bool(ok.all()), (width, group)
        G = s.shape[1]
        qa, qb = q.float().view(q.shape[0], G, -1), q0.float().view(q.shape[0], G, -1)
        big = torch.maximum(qa.abs(), qb.abs())
        tol = (fp8_step(big) + big * 2.0**-7) * torch.maximum(s, s0)[:, :, None]
        assert int(((qa * s[:, :, None] - qb * s0[:, :, None]).abs() > tol).sum()) == 0, (width, group)
