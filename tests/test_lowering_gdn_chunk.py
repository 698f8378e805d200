"""``kda::gdn_chunk`` itself: the CPU op against independent references (transformers' chunked
torch reference ``torch_chunk_gated_delta_rule``, a float64 einsum loop, per-sequence calls for
``cu_seqlens``), its fake impl (symbolic T), torch.compile of the op, the validator's errors, the
device-side chunk map, and the Triton kernels (the interpreter on CPU, the GPU under ``.ci/gpu
tests``) against the CPU op.

Tolerances. The CPU op is the float32 token loop; the kernels compute the same function by chunks
(an inverse of ``I + A`` per 64 tokens, products in another order): on O(1) values (unit-norm q / k
or 0.2-scaled raw ones, ``|v| ~ 1``, a ``randn`` state) the interpreter (float32 numpy products)
lands within ~1e-6 of the loop; ``rtol = atol = 2e-5`` leaves ~20x slack, and a wrong term (a
missing decay, the wrong key head, a chunk crossing a sequence's end, one token off) moves
outputs by > 1e-2. On a GPU the large products run in tf32 (``dot="tf32"``, the default): there
the kernel tests pass ``dot="ieee"`` for the same tolerance; tf32 itself is measured against
float32 and fla in ``tests/test_gdn_chunk_cuda.py``.
"""

from __future__ import annotations

import os

import pytest
import torch

from kda_inductor.lowerings import gdn_chunk as mod
from tests.test_lowering_gdn_recurrent_step import einsum_reference

op = torch.ops.kda.gdn_chunk.default
HAS_RUNNER = mod.triton is not None and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")
needs_runner = pytest.mark.skipif(not HAS_RUNNER, reason="needs a GPU or TRITON_INTERPRET=1 with triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(rtol=2e-5, atol=2e-5)


def inputs(seed, B=1, T=70, Hk=1, Hv=2, K=16, V=16, *, N=None, dtype=torch.float32, state=True, weak=False):
    """Random prefill inputs as a layer makes them (``g = -softplus``, ``beta`` a sigmoid);
    ``weak``: decays near 1 and beta near 1 (the inverse's entries grow: the hard case for a chunked
    solve). ``N``: sequences of the state (default B)."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    q, k, v = rnd(B, T, Hk, K), rnd(B, T, Hk, K), rnd(B, T, Hv, V)
    g = -torch.nn.functional.softplus(torch.randn(B, T, Hv, generator=gen) - (6 if weak else 0))
    beta = torch.sigmoid(torch.randn(B, T, Hv, generator=gen) + (4 if weak else 0)).to(dtype)
    s = torch.randn(N or B, Hv, K, V, generator=gen) if state else None
    return q, k, v, g, beta, s


def _transformers_chunk():
    from tests.test_gdn_recurrent_step import torch_core

    return torch_core("qwen3_next", "torch_chunk_gated_delta_rule")


# --------------------------------------------------------------------------- the CPU op


@pytest.mark.parametrize("T,group", [(1, 1), (63, 2), (130, 2)])
def test_cpu_op_is_transformers_chunk_gated_delta_rule(T, group):
    """transformers' chunked torch reference (l2norm in the kernel, ``K ** -0.5``, GQA by
    repeat_interleave) on float32 inputs: the op's default scale is K ** -0.5."""
    ref = _transformers_chunk()
    q, k, v, g, beta, s = inputs(T + group, B=2, T=T, Hk=2, Hv=2 * group, K=16, V=12)
    want, want_state = ref(q, k, v, g, beta, initial_state=s, output_final_state=True, use_qk_l2norm_in_kernel=True)
    out, final = op(q, k, v, g, beta, None, s, True)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final, want_state, rtol=1e-4, atol=1e-4)


def test_cpu_op_is_the_float64_loop():
    q, k, v, g, beta, s = inputs(3, B=2, T=9, Hk=1, Hv=3)
    want, want_state = einsum_reference(q, k, v, g, beta, s, 0.3, False)
    out, final = op(q, k, v, g, beta, 0.3, s, False)
    torch.testing.assert_close(out, want.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, want_state.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("state", [True, False])
def test_cpu_varlen_is_one_call_per_sequence(state):
    """Sequences packed along T (one of length 1, one empty) run as separate calls."""
    cu = [0, 5, 6, 6, 19]
    q, k, v, g, beta, s = inputs(4, T=19, N=4, state=state)
    out, final = op(q, k, v, g, beta, None, s, True, torch.tensor(cu))
    assert out.shape == v.shape and final.shape == (4, 2, 16, 16)
    for n, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        one, fin = op(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], None,
                      None if s is None else s[n:n + 1], True)
        torch.testing.assert_close(out[:, a:b], one, rtol=0, atol=0)
        torch.testing.assert_close(final[n:n + 1], fin, rtol=0, atol=0)


def test_out_dtype_and_fake_with_symbolic_tokens():
    """The fake's outputs (shape, dtype, strides) are the real ones', with T symbolic (one graph for
    every prompt length) and N taken from cu_seqlens; torch's opcheck agrees."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
    from torch.fx.experimental.symbolic_shapes import StatelessSymbolicContext as Ctx

    q, k, v, g, beta, s = inputs(5, T=7, N=2, dtype=torch.bfloat16)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    args = (q, k, v, g, beta, 0.25, s, True, cu, 1e-6, None)
    real = op(*args)
    assert real[0].dtype == torch.bfloat16 and real[1].dtype == torch.float32
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        def fake(x):
            if not isinstance(x, torch.Tensor):
                return x
            dyn = [DimDynamic.DYNAMIC if i == 1 and x.dim() >= 3 else DimDynamic.STATIC for i in range(x.dim())]
            return mode.from_tensor(x, symbolic_context=Ctx(dynamic_sizes=dyn))

        f = op(*(fake(a) for a in args))
        assert isinstance(f[0].shape[1], torch.SymInt)
    for a, b in zip(f, real):
        assert (a.dtype, a.dim()) == (b.dtype, b.dim()) and tuple(a.shape[2:]) == tuple(b.shape[2:])
    assert f[1].shape == real[1].shape
    torch.library.opcheck(op, args)


def test_compiles_in_one_graph_with_dynamic_tokens():
    """The op in a compiled function: one graph, no break, a second prompt length without a recompile."""
    from torch._dynamo.testing import CompileCounter

    cnt = CompileCounter()

    @torch.compile(backend=cnt, fullgraph=True, dynamic=True)
    def fn(q, k, v, g, beta, s):
        o, f = torch.ops.kda.gdn_chunk(q, k, v, g, beta, None, s, True)
        return o * 2, f

    for T in (5, 9):
        q, k, v, g, beta, s = inputs(T, T=T)
        out, final = fn(q, k, v, g, beta, s)
        want, want_state = op(q, k, v, g, beta, None, s, True)
        torch.testing.assert_close(out, 2 * want)
        torch.testing.assert_close(final, want_state)
    assert cnt.frame_count == 1


def _err(match, *args, exc=ValueError):
    with pytest.raises(exc, match=match):
        op(*args)


def test_bad_arguments_are_named():
    q, k, v, g, beta, s = inputs(8, B=2, T=5)
    cu = torch.tensor([0, 2, 5])
    _err(r"^initial_state: expected \[N, Hv, K, V\] = \[2, 2, 16, 16\]", q, k, v, g, beta, None, s[:1])
    _err("^initial_state: expected a float32 state", q, k, v, g, beta, None, s.double())
    _err("^q: with cu_seqlens the sequences are packed along T: expected B = 1, got 2", q, k, v, g, beta, None, None,
         True, cu)
    _err("^cu_seqlens: expected a 1-D int32 / int64 tensor", q[:1], k[:1], v[:1], g[:1], beta[:1], None, None, True,
         cu.float())
    _err("^cu_seqlens: expected at least 2 offsets", q[:1], k[:1], v[:1], g[:1], beta[:1], None, None, True, cu[:1])
    _err(r"^initial_state: expected \[N, Hv, K, V\] = \[2, 2, 16, 16\], got \[1, 2, 16, 16\]", q[:1], k[:1], v[:1],
         g[:1], beta[:1], None, s[:1], True, cu)
    _err(r"^beta: expected \[B, T, Hv\]", q, k, v, g, beta[:, :4])
    _err("^scale: expected a finite float, got inf", q, k, v, g, beta, float("inf"))
    with pytest.raises(ValueError, match="^cu_seqlens: expected device meta"):
        mod.validate(*(x.to("meta") for x in (q[:1], k[:1], v[:1], g[:1], beta[:1])), cu_seqlens=cu)


def test_chunk_map():
    """Chunks never cross a sequence's end; ids past the last chunk have length 0."""
    seq, start, length, cu_chunks, M = mod.chunk_map(torch.tensor([0, 1, 1, 130, 194]), 194)
    assert M == 194 // 64 + 4
    assert cu_chunks.tolist() == [0, 1, 1, 4, 5]
    assert seq.tolist() == [0, 2, 2, 2, 3, 4, 4]
    assert start.tolist()[:5] == [0, 1, 65, 129, 130] and length.tolist() == [1, 64, 64, 1, 64, 0, 0]


# --------------------------------------------------------------------------- the Triton kernels
# under the interpreter on CPU (TRITON_INTERPRET=1, set by conftest) or on the GPU (dot="ieee");
# outputs poisoned first (NaN), against the CPU op.


def _dev(*ts):
    return [t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in ts]


def _kernel_vs_op(args, scale=None, l2=True, cu=None, out_dtype=None, tol=TOL, config=None):
    q, k, v, g, beta, s = args
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    want, want_state = op(q, k, v, g, beta, scale, s, l2, cu_t, 1e-6, out_dtype)
    out = torch.full(want.shape, float("nan"), dtype=want.dtype, device=DEVICE)
    got, final = mod.chunk_triton(*_dev(q, k, v, g, beta), scale, *_dev(s), l2, *_dev(cu_t), 1e-6, out_dtype, out=out,
                                  dot="ieee", config=config)
    assert got is out and final.shape == want_state.shape and final.dtype == torch.float32
    if want.dtype == torch.float32:
        torch.testing.assert_close(got.cpu(), want, **tol)
    else:  # one rounding step of the output dtype (the interpreter truncates float32 -> bf16)
        full = op(q, k, v, g, beta, scale, s, l2, cu_t, 1e-6, torch.float32)[0]
        ulp = torch.finfo(want.dtype).eps * full.abs()
        assert ((got.cpu().float() - full).abs() <= 2 * ulp + tol["atol"]).all()
    torch.testing.assert_close(final.cpu(), want_state, **tol)


@needs_runner
@pytest.mark.parametrize("T", [1, 37, 64, 100, 130])
def test_triton_kernel_matches_the_cpu_op(T):
    """T below, at and across the 64-token chunk, not a multiple of it; two key heads for four
    value heads (value head h reads key head h // 2)."""
    _kernel_vs_op(inputs(100 + T, T=T, Hk=2, Hv=4))


@needs_runner
@pytest.mark.parametrize("case", ["no state", "no l2norm", "batch 2", "weak decay", "masked K V"])
def test_triton_kernel_cases(case):
    """No initial state; raw q / k (scaled down) with a scale; two sequences as a batch; decays near
    1 with beta near 1 (the inverse's entries largest); K = 12 and V = 20 (masked rows and columns,
    two column blocks of 16)."""
    kw = dict(state=case != "no state", B=2 if case == "batch 2" else 1, weak=case == "weak decay", T=90)
    if case == "masked K V":
        kw.update(K=12, V=20)
    q, k, v, g, beta, s = inputs(200 + len(case), **kw)
    if case == "no l2norm":
        q, k = 0.2 * q, 0.2 * k
    _kernel_vs_op((q, k, v, g, beta, s), scale=0.4 if case == "no l2norm" else None, l2=case != "no l2norm")


@needs_runner
@pytest.mark.parametrize("state", [True, False])
def test_triton_kernel_varlen(state):
    """Three sequences of odd lengths packed along T (one of length 1, one crossing a chunk
    boundary) and an empty one, with GQA: chunks restart at each sequence."""
    cu = [0, 1, 70, 70, 103]
    _kernel_vs_op(inputs(300, T=103, Hk=1, Hv=2, N=4, state=state), cu=cu)


@needs_runner
def test_triton_kernel_bf16_inputs_and_output():
    q, k, v, g, beta, s = inputs(400, T=80, dtype=torch.bfloat16)
    _kernel_vs_op((q, k, v, g, beta, s))
    _kernel_vs_op((q, k, v, g, beta, s), out_dtype=torch.float32)


@needs_runner
def test_triton_kernel_launch_configs():
    """Several scan and output column blocks (V = 40: 16-column blocks, the last one masked), 4 warps,
    two pipeline stages; bfloat16 intermediates (w, u, v_new, the per-chunk states) within their
    rounding."""
    args = inputs(500, T=75, V=40)
    _kernel_vs_op(args, config=mod.LaunchConfig(16, 4, 16, 4, 4, 2))
    _kernel_vs_op(args, config=mod.LaunchConfig(precompute_kd=True))
    _kernel_vs_op(inputs(501, T=75, V=40, Hk=1, N=3), cu=[0, 1, 66, 75], config=mod.LaunchConfig(precompute_kd=True))
    _kernel_vs_op(args, config=mod.LaunchConfig(inter_dtype=torch.bfloat16), tol=dict(rtol=2e-2, atol=2e-2))


@needs_runner
def test_triton_kernel_no_tokens():
    """T = 0: the final state is the initial state (zeros without one)."""
    q, k, v, g, beta, s = inputs(5, T=0, B=2)
    out, final = mod.chunk_triton(*_dev(q, k, v, g, beta), None, *_dev(s), True)
    assert out.shape == (2, 0, 2, 16) and torch.equal(final.cpu(), s)
    _, zeros = mod.chunk_triton(*_dev(q, k, v, g, beta), None, None, True)
    assert torch.equal(zeros.cpu(), torch.zeros_like(s))


# --------------------------------------------------------------------------- the v2 launches
# (LaunchConfig.v2: kkt fused into wu, the scan's state in 64-row blocks, the output from raw q / k;
# FAST adds bfloat16 operands and intermediates)

V2 = mod.LaunchConfig(v2=True, scan_block_v=16, out_block_v=16)
V3 = V2._replace(v3=True, out_v_first=True)
"""v2 with ``wu2`` split in ``solve3`` (the inverse, its diagonal blocks by a product of factors)
and ``wu3`` (64-row products with the stored inverse); the output's grid with a chunk's column
blocks adjacent (``V = 20``, ``"K 80 V 20 masked"``: two blocks of 16)."""
V3F = V3._replace(fuse_wu=True)
"""v3 with ``solve3`` and ``wu3`` in one launch (the inverse through its scratch behind a barrier)."""
CFG = {"V2": V2, "V3": V3, "V3F": V3F, "FAST": mod.FAST, "FAST3": mod.FAST3,
       "FAST3F": mod.FAST3._replace(fuse_wu=True), "FASTI": mod.FAST._replace(wu_inverse="ieee"),
       "FASTD": mod.FAST._replace(wu_inverse="doubling_tf32")}


@needs_runner
@pytest.mark.parametrize("config", ["V2", "V3", "V3F"])
@pytest.mark.parametrize("case", ["T 1", "T 37 GQA", "T 130 GQA", "no state", "no l2norm", "K 80 V 20 masked",
                                  "batch 3", "weak decay"])
def test_v2_kernels_match_the_cpu_op(case, config):
    """float32 products (``dot="ieee"``): the v2 launches compute the op's function to float32
    rounding: T below / across the chunk and not a multiple of it, GQA (value head h reads key head
    h // 2), no state, raw q / k with a scale, K = 80 (two 64-row state blocks, the second masked)
    with V = 20 (two column blocks, the last masked), three sequences as a batch (without
    ``cu_seqlens`` the kernels place each chunk from its id: no chunk map), decays near 1 with beta
    near 1 (the state carries across chunks: the other cases' decays, ``-softplus(randn)`` a token,
    leave ~e^-45 of it after a chunk)."""
    kw = dict(T=int(case.split()[1]) if case.startswith("T ") else 90, Hk=2, Hv=4, state=case != "no state",
              B=3 if case == "batch 3" else 1, weak=case == "weak decay")
    if case.startswith("K 80"):
        kw.update(K=80, V=20, Hk=1, Hv=2)
    q, k, v, g, beta, s = inputs(600 + len(case), **kw)
    if case == "no l2norm":
        q, k = 0.2 * q, 0.2 * k
    _kernel_vs_op((q, k, v, g, beta, s), scale=0.4 if case == "no l2norm" else None, l2=case != "no l2norm",
                  config=CFG[config])


@needs_runner
@pytest.mark.parametrize("inverse", ["tf32", "subst", "doubling"])
@pytest.mark.parametrize("case", ["T 130 GQA", "weak decay"])
def test_v3_inverse_variants(case, inverse):
    """``LaunchConfig.solve_inverse``: the diagonal blocks by substitution, by doubling blocks, or the
    product of factors in tf32 (float32 in the interpreter: here the same function as ``"ieee"``)."""
    q, k, v, g, beta, s = inputs(650 + len(case), T=130 if case.startswith("T") else 90, Hk=2, Hv=4,
                                 weak=case == "weak decay")
    _kernel_vs_op((q, k, v, g, beta, s), config=V3._replace(solve_inverse=inverse))


@needs_runner
@pytest.mark.parametrize("v_first", [True, False])
def test_v3_output_column_blocks(v_first):
    """V = 40 in three 16-column blocks (the last masked) under both output grids, varlen with GQA."""
    cfg = V3._replace(out_v_first=v_first)
    _kernel_vs_op(inputs(660, T=75, V=40), config=cfg)
    _kernel_vs_op(inputs(661, T=75, V=40, Hk=1, N=3), cu=[0, 1, 66, 75], config=cfg)


@needs_runner
@pytest.mark.parametrize("config", ["V2", "V3", "V3F"])
@pytest.mark.parametrize("state", [True, False])
def test_v2_kernels_varlen(state, config):
    """Sequences of lengths 1, 69, 0 and 33 packed along T with GQA: chunks restart at each one."""
    _kernel_vs_op(inputs(700, T=103, Hk=1, Hv=2, N=4, state=state), cu=[0, 1, 70, 70, 103], config=CFG[config])


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@needs_runner
@pytest.mark.parametrize("config", ["FAST", "FAST3", "FAST3F", "FASTI", "FASTD"])
@pytest.mark.parametrize("case", ["T 100 GQA state", "T 40 no state", "varlen", "T 150 weak decay"])
def test_fast_bf16_operands_within_their_rounding(case, config):
    """:data:`FAST` on bfloat16 inputs (bf16 operands and intermediates; on CPU the interpreter's
    roundings then float32 products, ``"bf16emu"``): within 2e-2 (relative norm) of the float32 op on
    the same inputs. Wrong terms are caught by the float32 tests above (2e-5); this bound only keeps
    the roundings in check (a 10% error in the chunk decay moves the weak-decay case's state by 2.4e-2,
    the first chunk's cumulative decay by 5e-2). The interpreter truncates to bf16 (twice the error
    of rounding, and biased): on the GPU the same launch is held to fla's own distance
    (``tests/test_gdn_chunk_cuda.py``)."""
    T = int(case.split()[1]) if case.startswith("T ") else 100
    cu = [0, 30, 30, 100] if case == "varlen" else None
    q, k, v, g, beta, s = inputs(800 + len(case), T=T, Hk=1, Hv=2, K=32, V=32, dtype=torch.bfloat16,
                                 N=3 if cu else None, state=case != "T 40 no state", weak="weak" in case)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    want, want_state = op(q, k, v, g, beta, None, s, True, cu_t, 1e-6, torch.float32)
    out = torch.full(want.shape, float("nan"), dtype=torch.float32, device=DEVICE)
    got, final = mod.chunk_triton(*_dev(q, k, v, g, beta), None, *_dev(s), True, *_dev(cu_t), 1e-6, torch.float32,
                                  out=out, dot="tf32", config=CFG[config])
    assert got is out and not got.isnan().any()
    assert _rel(got.cpu(), want) < 2e-2 and _rel(final.cpu(), want_state) < 2e-2, (_rel(got.cpu(), want),
                                                                                   _rel(final.cpu(), want_state))


@needs_runner
@pytest.mark.parametrize("config", ["V2", "FAST", "V3", "FAST3"])
def test_v2_no_tokens(config):
    """T = 0: no chunk launch; the final state is the initial state (zeros without one)."""
    cfg = CFG[config]
    q, k, v, g, beta, s = inputs(5, T=0, B=2, dtype=torch.bfloat16)
    out, final = mod.chunk_triton(*_dev(q, k, v, g, beta), None, *_dev(s), True, config=cfg)
    assert out.shape == (2, 0, 2, 16) and torch.equal(final.cpu(), s)
    _, zeros = mod.chunk_triton(*_dev(q, k, v, g, beta), None, None, True, config=cfg)
    assert torch.equal(zeros.cpu(), torch.zeros_like(s))


# --------------------------------------------------------------------------- a decay per key channel (KDA)
# g [B, T, Hv, K] (Kimi Linear): the three launches of _gdn_chunk_kda_kernels against the CPU loop.


def kda_inputs(seed, T=70, Hk=1, Hv=2, K=16, V=16, *, N=None, decay="mixed", state=True, dtype=torch.float32):
    """``inputs`` with ``g [B, T, Hv, K]``: ``"weak"`` (``-softplus(x - 5)``, ~-7e-3 a token: the state
    carries across chunks), ``"moderate"`` (down to -3 a token: a 16-row block spans up to 48, under
    ``DIAG_SPAN``, so its diagonal block is two products with factors up to ``e^48``), ``"strong"`` (down
    to -10 a token in every channel, as Kimi's gates reach: a chunk's cumulative decay to ~-300, past
    float32's ``exp`` range; the diagonal blocks by the loop), ``"mixed"`` (even channels strong, odd
    ones weak: both within one product)."""
    q, k, v, _, beta, s = inputs(seed, T=T, Hk=Hk, Hv=Hv, K=K, V=V, N=N, state=state, dtype=dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    weak = -torch.nn.functional.softplus(torch.randn(1, T, Hv, K, generator=gen) - 5)
    strong = -10 * torch.rand(1, T, Hv, K, generator=gen)
    g = {"weak": weak, "strong": strong, "moderate": 0.3 * strong,
         "mixed": torch.where(torch.arange(K) % 2 == 0, strong, weak)}[decay]
    return q, k, v, g, beta, s


@needs_runner
@pytest.mark.parametrize("decay", ["weak", "moderate", "strong", "mixed"])
@pytest.mark.parametrize("T", [1, 37, 130])
def test_kda_kernels_match_the_cpu_op(T, decay):
    """T below / across the chunk and not a multiple of it, GQA (value head h reads key head h // 2),
    K = 32 with V = 16, an initial state; weak, moderate, strong and mixed decays per key channel
    (the diagonal blocks as products, as products, by the loop, by the loop)."""
    _kernel_vs_op(kda_inputs(900 + T, T=T, Hk=2, Hv=4, K=32, V=16, decay=decay))


@needs_runner
@pytest.mark.parametrize("case", ["no state", "no l2norm", "K 80 V 20 masked", "out v first", "batch 2"])
def test_kda_kernel_cases(case):
    """No initial state; raw q / k (scaled down) with a scale; K = 80 (two 64-row state blocks, the
    second masked) with V = 20 (two column blocks of 16, the last masked); the output's grid with a
    chunk's column blocks adjacent; two sequences as a batch (each chunk placed from its id)."""
    kw = dict(T=90, state=case != "no state", decay="mixed")
    if case.startswith("K 80"):
        kw.update(K=80, V=20)
    q, k, v, g, beta, s = kda_inputs(950 + len(case), **kw)
    if case == "batch 2":
        q2, k2, v2, g2, b2, s2 = kda_inputs(960, **kw)
        pairs = ((q, q2), (k, k2), (v, v2), (g, g2), (beta, b2), (s, s2))
        q, k, v, g, beta, s = (torch.cat([a, b]) for a, b in pairs)
    if case == "no l2norm":
        q, k = 0.2 * q, 0.2 * k
    cfg = V2._replace(out_v_first=True) if case == "out v first" else V2
    _kernel_vs_op((q, k, v, g, beta, s), scale=0.4 if case == "no l2norm" else None, l2=case != "no l2norm",
                  config=cfg)


@needs_runner
@pytest.mark.parametrize("state", [True, False])
def test_kda_kernels_varlen(state):
    """Sequences of lengths 1, 69, 0 and 33 packed along T with GQA: chunks restart at each one (and
    the empty sequence's final state is its initial state)."""
    _kernel_vs_op(kda_inputs(980, T=103, Hk=1, Hv=2, N=4, state=state), cu=[0, 1, 70, 70, 103])


@needs_runner
@pytest.mark.parametrize("intra", ["tf32", ""])
@pytest.mark.parametrize("decay", ["weak", "mixed"])
def test_kda_bf16_operands_within_their_rounding(decay, intra):
    """The op's own launches (:data:`~kda_inductor.lowerings.gdn_chunk.KDA`: bf16 operands and
    intermediates, ``"bf16emu"`` in the interpreter; the intra launch's products tf32, float32 here, or
    bf16 as the others') on bf16 inputs with varlen: within 2e-2 (relative norm) of the float32 op,
    as FAST's bound above."""
    cu = torch.tensor([0, 30, 30, 100], dtype=torch.int32)
    q, k, v, g, beta, s = kda_inputs(990, T=100, Hk=1, Hv=2, K=32, V=32, N=3, decay=decay, dtype=torch.bfloat16)
    want, want_state = op(q, k, v, g, beta, None, s, True, cu, 1e-6, torch.float32)
    out = torch.full(want.shape, float("nan"), dtype=torch.float32, device=DEVICE)
    got, final = mod.chunk_triton(*_dev(q, k, v, g, beta), None, *_dev(s), True, *_dev(cu), 1e-6, torch.float32,
                                  out=out, config=mod.KDA._replace(kda_intra_dot=intra))
    assert got is out and not got.isnan().any()
    assert _rel(got.cpu(), want) < 2e-2 and _rel(final.cpu(), want_state) < 2e-2, (_rel(got.cpu(), want),
                                                                                   _rel(final.cpu(), want_state))


@needs_runner
@pytest.mark.parametrize("decay", ["weak", "moderate", "strong", "mixed"])
@pytest.mark.parametrize("shape", ["T 130 K 32 by 16", "T 37 K 80 by 32", "T 90 K 80 V 20 by 64 varlen"])
def test_kda_intra_by_column_blocks(shape, decay):
    """``LaunchConfig.kda_intra_cols``: ``A`` and ``Aqk`` block by block, the key dimension in a loop of
    16 / 32 / 64 columns (a masked last block at K = 80; two-block and three-block gaps below the
    diagonal, each column block's decay its own; the diagonal blocks by products or by the loop
    per column block), against the CPU op."""
    T, K = int(shape.split()[1]), int(shape.split()[3])
    V, cols, cu = (20, 64, [0, 5, 5, 90]) if "varlen" in shape else (16, int(shape.split()[-1]), None)
    args = kda_inputs(1000 + T + K, T=T, Hk=1, Hv=2, K=K, V=V, N=3 if cu else None, decay=decay)
    _kernel_vs_op(args, cu=cu, config=V2._replace(kda_intra_cols=cols))


@needs_runner
@pytest.mark.parametrize("decay", ["weak", "strong", "mixed"])
@pytest.mark.parametrize("shape", ["T 130 K 32", "T 37 K 80 by 32", "T 90 K 80 V 20 varlen"])
def test_kda_intra_split(shape, decay):
    """``LaunchConfig.kda_intra_split``: ``A`` / ``Aqk`` one program per block pair (each pair's gap below
    the diagonal summed at run time; the diagonal blocks by products or by the loop), the rest reading
    ``A`` back: the CPU op's result (T below / across chunks, a masked last key block at K = 80, varlen
    with an empty sequence, GQA)."""
    T, K = int(shape.split()[1]), int(shape.split()[3])
    V, cu = (20, [0, 5, 5, 90]) if "varlen" in shape else (16, None)
    cols = 32 if "by 32" in shape else 0
    args = kda_inputs(1200 + T + K, T=T, Hk=1, Hv=2, K=K, V=V, N=3 if cu else None, decay=decay)
    _kernel_vs_op(args, cu=cu, config=V2._replace(kda_intra_split=True, kda_intra_cols=cols))


@needs_runner
@pytest.mark.parametrize("inverse", ["doubling", "ieee"])
@pytest.mark.parametrize("decay", ["weak", "mixed"])
def test_kda_intra_inverse_choices(decay, inverse):
    """The KDA ``intra`` launch takes ``wu_inverse`` as ``wu2`` does (its diagonal blocks by doubling or a
    product of factors instead of the substitution; float32 products here), with and without
    ``kda_intra_cols``: the op's function to float32 rounding."""
    args = kda_inputs(1100 + len(decay), T=130, Hk=1, Hv=2, K=32, V=16, decay=decay)
    for cols in (0, 16):
        _kernel_vs_op(args, config=V2._replace(kda_intra_cols=cols, wu_inverse=inverse))
    with pytest.raises(ValueError, match="expected an inverse"):
        _kernel_vs_op(args, config=V2._replace(wu_inverse="nope"))


@needs_runner
def test_kda_no_tokens_and_past_k_128():
    """T = 0: the initial state back; K = 192 per channel: the kernels refuse (the CUDA op runs the loop)."""
    q, k, v, g, beta, s = kda_inputs(5, T=0, dtype=torch.bfloat16)
    out, final = mod.chunk_triton(*_dev(q, k, v, g, beta), None, *_dev(s), True)
    assert out.shape == (1, 0, 2, 16) and torch.equal(final.cpu(), s)
    q, k, v, g, beta, s = kda_inputs(6, T=3, K=192)
    with pytest.raises(NotImplementedError, match="per key channel .KDA. up to K = 128, got K = 192"):
        mod.chunk_triton(*_dev(q, k, v, g, beta), None, *_dev(s), True)


# --------------------------------------------------------------------------- wu2's inverse (LaunchConfig.wu_inverse)


@needs_runner
@pytest.mark.parametrize("inverse", ["ieee", "tf32", "doubling", "doubling_tf32"])
@pytest.mark.parametrize("case", ["T 130 GQA", "weak decay", "varlen"])
def test_v2_wu_inverse_by_factors(case, inverse):
    """``wu2`` with the diagonal blocks of the inverse as a product of factors or by doubling blocks
    (float32 products here: ``dot="ieee"`` keeps the tf32 ones float32): the op's function to float32
    rounding; decays near 1 with beta near 1 (the inverse's entries largest), T across chunks with
    GQA, sequences packed by ``cu_seqlens``."""
    cfg = V2._replace(wu_inverse=inverse)
    if case == "varlen":
        return _kernel_vs_op(inputs(720, T=103, Hk=1, Hv=2, N=4), cu=[0, 1, 70, 70, 103], config=cfg)
    q, k, v, g, beta, s = inputs(710 + len(case), T=130 if case.startswith("T") else 90, Hk=2, Hv=4,
                                 weak=case == "weak decay")
    _kernel_vs_op((q, k, v, g, beta, s), config=cfg)


@needs_runner
@pytest.mark.parametrize("inverse", ["subst", "ieee", "doubling"])
def test_v2_wu_inverse_on_correlated_keys(inverse):
    """The hard case for the product of factors: keys 0.9 shared + 0.1 their own (unit-normalized in
    the kernel: ``k_i . k_j`` ~ 0.99), beta and decays near 1, so ``A``'s powers grow to ~1e3 while
    the inverse stays <= 1 and the factors cancel (float32 products here; tf32 ones lose it all on a
    GPU: ``LaunchConfig.wu_inverse``). Against the float32 op: the substitution and the doubling
    within float32 rounding, the factors within ``TOLC``."""
    q, k, v, g, beta, s = inputs(750, T=130, Hk=1, Hv=2, K=32, V=32, weak=True)
    k = 0.9 * k[:, :1] + 0.1 * k
    _kernel_vs_op((q, k, v, g, beta, s), config=V2._replace(wu_inverse=inverse), tol=TOLC if inverse == "ieee" else TOL)


TOLC = dict(rtol=1e-3, atol=1e-3)
"""The factors' float32 cancellation on :func:`test_v2_wu_inverse_on_correlated_keys`' inputs
(``k_i . k_j`` 0.99 on average): 5e-5 on ``o``, 1.6e-4 on the state (the substitution: 3e-7, 1.5e-6)."""


@needs_runner
def test_scan_stages_apart():
    """``LaunchConfig.scan_stages``: the scan's pipeline stages apart from the other launches' (the
    interpreter ignores stages: the launch path, varlen and regular)."""
    cfg = V2._replace(num_stages=1, scan_stages=3)
    _kernel_vs_op(inputs(760, T=75, Hk=1, Hv=2), config=cfg)
    _kernel_vs_op(inputs(761, T=75, Hk=1, Hv=2, N=3), cu=[0, 1, 66, 75], config=cfg)


def test_unknown_inverse_is_an_error():
    args = _dev(*inputs(730, T=10)[:5])
    with pytest.raises(ValueError, match="expected an inverse"):
        mod.chunk_triton(*args, None, None, True, config=V2._replace(wu_inverse="lu"))


# --------------------------------------------------------------------------- no read of unwritten scratch


@needs_runner
@pytest.mark.parametrize("config", ["FAST 1 stage", "FAST3", "V2"])
@pytest.mark.parametrize("case", ["T 100", "varlen"])
def test_scratch_is_written_before_it_is_read(config, case, monkeypatch):
    """Every float buffer the launches allocate (``gc``, ``1 / |k|``, ``w``, ``u``, ``v_new``, the
    per-chunk states, the inverse's scratch, the outputs) starts as NaN: a read of anything no launch
    wrote (a row past a chunk's end, a chunk the scan skipped, a column block not covered) would carry
    the NaN into ``o`` or the final state (``NaN * 0`` is NaN). :data:`FAST` at one pipeline stage (NaN
    on the H200 at T 16,384, 2026-12-05): the interpreter runs one program at a time, so this rules
    out unwritten reads, not races or a stage-dependent miscompile."""
    empty, new_empty = torch.empty, torch.Tensor.new_empty

    def nan(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    cfg = {"FAST 1 stage": mod.FAST._replace(num_stages=1), "FAST3": mod.FAST3, "V2": V2}[config]
    cu = [0, 1, 70, 70, 103] if case == "varlen" else None
    q, k, v, g, beta, s = inputs(740, T=103 if cu else 100, Hk=1, Hv=2, K=32, V=32, N=4 if cu else None,
                                 dtype=torch.float32 if config == "V2" else torch.bfloat16)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    want, want_state = op(q, k, v, g, beta, None, s, True, cu_t, 1e-6, torch.float32)
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: nan(empty(*a, **kw)))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **kw: nan(new_empty(self, *a, **kw)))
    got, final = mod.chunk_triton(*_dev(q, k, v, g, beta), None, *_dev(s), True, *_dev(cu_t), 1e-6, torch.float32,
                                  dot="ieee" if config == "V2" else "tf32", config=cfg)
    monkeypatch.undo()
    assert not got.isnan().any() and not final.isnan().any()
    bound = 2e-5 if config == "V2" else 2e-2
    assert _rel(got.cpu(), want) < bound and _rel(final.cpu(), want_state) < bound


@needs_runner
@pytest.mark.parametrize("case", ["T 100", "varlen"])
def test_kda_split_scratch_is_written_before_it_is_read(case, monkeypatch):
    """As above for :attr:`LaunchConfig.kda_intra_split` (KDA): ``A``'s float32 scratch, ``Aqk``, ``gc``, ``w``,
    ``u``, ``kd`` start as NaN; the pair programs write every block the rest reads."""
    empty = torch.empty
    cu = [0, 1, 70, 70, 103] if case == "varlen" else None
    q, k, v, g, beta, s = kda_inputs(750, T=103 if cu else 100, Hk=1, Hv=2, K=32, V=16, N=4 if cu else None)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    want, want_state = op(q, k, v, g, beta, None, s, True, cu_t, 1e-6, torch.float32)
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: (lambda t: t.fill_(float("nan")) if t.is_floating_point()
                                                          else t)(empty(*a, **kw)))
    got, final = mod.chunk_triton(*_dev(q, k, v, g, beta), None, *_dev(s), True, *_dev(cu_t), 1e-6, torch.float32,
                                  dot="ieee", config=V2._replace(kda_intra_split=True))
    monkeypatch.undo()
    assert not got.isnan().any() and not final.isnan().any()
    assert _rel(got.cpu(), want) < 2e-5 and _rel(final.cpu(), want_state) < 2e-5
