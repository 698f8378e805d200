"""``kda::gdn_chunk`` on CUDA (skipped without a GPU): the Triton kernels at Qwen3-Next's dims
(16 q / k heads, 32 v heads, K = V = 128, bf16 inputs) against the float32 token loop (the op's CPU
spec, run on the GPU) and against fla's ``chunk_gated_delta_rule`` where fla-core is importable;
varlen with ``cu_seqlens`` on the device; CUDA-graph capture and replay; ``torch.compile`` with the
op in one graph; exact float32 (``dot="ieee"``) at small dims. A decay per key channel (KDA) at Kimi
Linear's dims likewise, against fla's ``chunk_kda``, and fla's ``chunk_kda`` called in a compiled
function: traced as the op (``kda_inductor/_dynamo_chunk.py``).

Tolerances: relative norm errors ``|o - ref| / |ref|``. bf16 outputs carry ~2^-9 relative rounding
(a norm error of ~1.5e-3); the kernels' tf32 products add their ~1e-3 per product: the op must stay
within 1e-2 of the reference and within 1.5x fla's own error (+ 1e-3) where fla runs, the final
state likewise (float32 throughout, its products tf32 or, with ``FAST``, bf16 as fla's).
"""

from __future__ import annotations

import pytest
import torch

from kda_inductor.lowerings import gdn_chunk as mod

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU
BF = torch.bfloat16


def _inputs(T, seed, Hk=16, Hv=32, D=128, N=1, state=False, dtype=BF, weak=False):
    """``weak``: decays near 1 (``logsigmoid(x + 6)``, ~0.85 a chunk), so the state carries across
    chunks and the products' roundings accumulate over them (``logsigmoid(x)`` leaves ~e^-45 a chunk)."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=g)

    q, k, v = rnd(1, T, Hk, D).to(dtype), rnd(1, T, Hk, D).to(dtype), rnd(1, T, Hv, D).to(dtype)
    gate = torch.nn.functional.logsigmoid(rnd(1, T, Hv) + (6 if weak else 0))
    beta = torch.sigmoid(rnd(1, T, Hv)).to(dtype)
    s = 0.1 * rnd(N, Hv, D, D) if state else None
    return q, k, v, gate, beta, s


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception:  # noqa: BLE001 - fla-core not installed or not importable here
        return None
    return chunk_gated_delta_rule


CONFIGS = {"default": None, "FAST": mod.FAST, "fp32": mod.LaunchConfig(), "FAST3": mod.FAST3,
           "FAST3 inv tf32": mod.FAST3._replace(solve_inverse="tf32"),
           "FAST3 fused": mod.FAST3._replace(fuse_wu=True, warps=8),
           "FAST inv ieee": mod.FAST._replace(wu_inverse="ieee"),
           "FAST inv doubling": mod.FAST._replace(wu_inverse="doubling"),
           "FAST inv doubling tf32": mod.FAST._replace(wu_inverse="doubling_tf32"),
           "FAST 1 stage": mod.FAST._replace(num_stages=1), "FAST scan 1 stage": mod.FAST._replace(scan_stages=1),
           "FAST 1 stage scan 2": mod.FAST._replace(num_stages=1, scan_stages=2),
           "FAST inv doubling tf32 scan 3 stages": mod.FAST._replace(wu_inverse="doubling_tf32", scan_stages=3),
           "FAST inv doubling tf32 scanout4": mod.FAST._replace(wu_inverse="doubling_tf32", scan4_out=True),
           "FAST4": mod.FAST3._replace(scan4=True, scan_stages=3, out4="group"),
           "FAST4 fused": mod.FAST3._replace(scan4_out=True),
           "FAST scanout4 bv16 w8 s3": mod.FAST._replace(scan4_out=True, scan_block_v=16, scan_warps=8, scan_stages=3)}
"""The op's launches (:data:`~kda_inductor.lowerings.gdn_chunk.DEFAULT`: ``FAST``'s three launches,
bf16 operands and intermediates, ``wu2``'s inverse by doubling in tf32, the scan as fla's at 3 stages,
the output per GQA group), ``FAST`` itself, the four float32 launches, and ``FAST3`` (v3: the inverse and
``w, u`` in two launches; also with the inverse's products in tf32, and the two fused in one launch
through a CTA barrier), ``FAST`` with ``wu2``'s inverse by a product of factors or doubling blocks
(``wu_inverse``) and at one pipeline stage (NaN in the H200 sweep at T 16,384, 2026-12-05; the
interpreter finds no read of unwritten scratch: ``test_scratch_is_written_before_it_is_read``), the
scan alone or all but the scan (``scan_stages``), and the v4 scan / output (``scan4``, ``out4``) and
the scan with the output fused (``scan4_out``): held to the same bounds."""


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("T,state,weak", [(1, True, False), (100, False, False), (1000, True, False),
                                          (4096, False, False), (4096, True, True)])
def test_op_matches_the_float32_loop_and_fla(T, state, weak, config, request):
    if CONFIGS[config] is not None and CONFIGS[config].v3 and T == 4096:  # FAST3 and what builds on it
        # measured (H100, 2026-12-06): v3's inverse / w, u leave 2.6-3.4e-2 at T 4,096 with weak decay
        # and a state, and FAST3 fused / inv tf32 failed the bounds without them in one of two runs:
        # why FAST3 is not the default (``gdn_chunk.FAST3``)
        request.applymarker(pytest.mark.xfail(reason="FAST3's error at T 4096 (H100, 2026-12-06)", strict=False))
    if CONFIGS[config] is not None and CONFIGS[config].scan4_out and T == 1:
        # measured (H100, 2026-12-06 03:38): scanout4 leaves 0.46-0.51 in the output and 2.4-2.6e-2 in the
        # final state at T 1 with a state (both of its launches); the interpreter gets the same case right
        # at small dims, so a GPU-only fault: why scanout4 is off (``LaunchConfig.scan4_out``)
        request.applymarker(pytest.mark.xfail(reason="scanout4 at T 1 on the GPU (H100, 2026-12-06)", strict=False))
    q, k, v, g, beta, s = _inputs(T, seed=T, state=state, weak=weak)
    cfg = CONFIGS[config]
    with torch.inference_mode():
        want, want_state = mod.reference(q, k, v, g, beta, None, s, True)
        out = torch.full_like(v, float("nan"))
        got, final = mod.chunk_triton(q, k, v, g, beta, None, s, True, out=out, config=cfg)
        op_out, op_final = torch.ops.kda.gdn_chunk(q, k, v, g, beta, None, s, True)
    assert got.dtype == BF and final.dtype == torch.float32 and not got.isnan().any()
    if cfg is None:
        assert torch.equal(op_out, got) and torch.equal(op_final, final)  # the op is these launches
    err, serr = _rel(got, want), _rel(final, want_state)
    assert err < 1e-2 and serr < 1e-2, (err, serr)
    fla = _fla()
    if fla is not None:
        with torch.inference_mode():
            fo, fs = fla(q, k, v, g, beta, initial_state=s, output_final_state=True, use_qk_l2norm_in_kernel=True)
        fla_err = _rel(fo, want)
        fla_serr = _rel(fs, want_state)
        print(f"T={T}{' weak' if weak else ''} {config}: kda {err:.2e} / state {serr:.2e}; fla {fla_err:.2e} / state {fla_serr:.2e}")
        assert err <= 1.5 * fla_err + 1e-3, (err, fla_err)
        assert serr <= 1.5 * fla_serr + 1e-3, (serr, fla_serr)


@pytest.mark.parametrize("config", ["default", "FAST3", pytest.param("FAST3 inv tf32", marks=pytest.mark.xfail(
    reason="the product of factors in tf32 cancels (torch emulation: the inverse 0.76 off)", strict=False)),
    "FAST inv ieee", "FAST inv doubling", "FAST inv doubling tf32"])
def test_correlated_keys_and_slow_decay(config):
    """Keys 0.9 shared + 0.1 their own, decays near 1, beta near 1 (``k_i . k_j`` ~ 0.99 after the
    l2norm): the inverse's product of factors cancels here (``LaunchConfig.wu_inverse``); every launch
    within the random inputs' bounds of the float32 loop (the output 1e-2 and 1.5x fla's error)."""
    q, k, v, g, beta, s = _inputs(1000, seed=11, state=True, weak=True)
    k = (0.9 * k[:, :, :1].float() + 0.1 * k.float()).to(BF)
    beta = torch.sigmoid(beta.float() * 0 + 4).to(BF)
    with torch.inference_mode():
        want, want_state = mod.reference(q, k, v, g, beta, None, s, True)
        got, final = mod.chunk_triton(q, k, v, g, beta, None, s, True, config=CONFIGS[config])
    err, serr = _rel(got, want), _rel(final, want_state)
    print(f"correlated keys, slow decay, {config}: kda {err:.2e} / state {serr:.2e}")
    assert err < 1e-2 and serr < 1e-2, (err, serr)
    fla = _fla()
    if fla is not None:
        with torch.inference_mode():
            fo, fs = fla(q, k, v, g, beta, initial_state=s, output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert err <= 1.5 * _rel(fo, want) + 1e-3 and serr <= 1.5 * _rel(fs, want_state) + 1e-3


@pytest.mark.parametrize("config", list(CONFIGS))
def test_varlen_on_the_device(config):
    """Four sequences packed along T (lengths 1, 699, 0, 1348), an initial state each, ``cu_seqlens``
    on the GPU: per-sequence loops give the same."""
    cu = torch.tensor([0, 1, 700, 700, 2048], device="cuda", dtype=torch.int32)
    q, k, v, g, beta, s = _inputs(2048, seed=3, N=4, state=True)
    with torch.inference_mode():
        if CONFIGS[config] is None:
            got, final = torch.ops.kda.gdn_chunk(q, k, v, g, beta, None, s, True, cu)
        else:
            got, final = mod.chunk_triton(q, k, v, g, beta, None, s, True, cu, config=CONFIGS[config])
        want, want_state = mod.reference(q, k, v, g, beta, None, s, True, cu)
    assert _rel(got, want) < 1e-2 and _rel(final, want_state) < 1e-2
    torch.testing.assert_close(final[2], s[2], rtol=0, atol=0)  # the empty sequence keeps its state


@pytest.mark.parametrize("config", list(CONFIGS))
def test_exact_float32_products_at_small_dims(config):
    """``dot="ieee"``: the kernels' float32 math within 1e-4 of the loop (T across chunks, GQA 1:2);
    FAST's v2 launches in float32 (``lowp`` applies to bf16 inputs only)."""
    q, k, v, g, beta, s = _inputs(300, seed=5, Hk=2, Hv=4, D=64, state=True, dtype=torch.float32)
    with torch.inference_mode():
        want, want_state = mod.reference(q, k, v, g, beta, 0.2, s, True)
        got, final = mod.chunk_triton(q, k, v, g, beta, 0.2, s, True, dot="ieee", config=CONFIGS[config])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final, want_state, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_cuda_graph_capture_and_replay(config):
    """No host sync (varlen included): captured once, replayed on new inputs copied in."""
    cu = torch.tensor([0, 37, 300], device="cuda", dtype=torch.int64)
    a = _inputs(300, seed=7, Hk=4, Hv=8, D=64, N=2, state=True)
    b = _inputs(300, seed=8, Hk=4, Hv=8, D=64, N=2, state=True)
    bufs = [x.clone() for x in a]

    def call(xs=bufs):
        if CONFIGS[config] is None:
            return torch.ops.kda.gdn_chunk(*xs[:5], None, xs[5], True, cu)
        return mod.chunk_triton(*xs[:5], None, xs[5], True, cu, config=CONFIGS[config])

    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, final = call()
        for x, y in zip(bufs, b):
            x.copy_(y)
        graph.replay()
        want, want_state = call(b)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(final, want_state, rtol=0, atol=0)


def test_compiled_in_one_graph():
    """torch.compile (Inductor) of a prefill core calling the op, T dynamic: one graph, no break."""
    from torch._dynamo.testing import CompileCounterWithBackend

    cnt = CompileCounterWithBackend("inductor")

    @torch.compile(backend=cnt, fullgraph=True, dynamic=True)
    def core(q, k, v, g, beta):
        o, state = torch.ops.kda.gdn_chunk(q, k, v, g, beta, None, None, True)
        return o.flatten(-2), state

    for T in (200, 333):
        xs = _inputs(T, seed=T, Hk=2, Hv=4, D=64)[:5]
        with torch.inference_mode():
            o, state = core(*xs)
            want, want_state = torch.ops.kda.gdn_chunk(*xs, None, None, True)
        torch.testing.assert_close(o, want.flatten(-2), rtol=0, atol=0)
        torch.testing.assert_close(state, want_state, rtol=0, atol=0)
    assert cnt.frame_count == 1


def test_transformers_reference_is_the_op_on_cuda_without_force():
    """Rule 3's speed rule (measured on CUDA, ``_dynamo_fixes.TORCH_CHUNK_RULE_MEASURED``): without
    ``force``, transformers' ``torch_chunk_gated_delta_rule`` on CUDA tensors compiles to one
    ``kda::gdn_chunk`` call, within the op's bounds of eager's float32-accumulating reference."""
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    from kda_inductor.pass_manager import graph_caches_off, observe

    q, k, v, g, beta, s = _inputs(300, seed=11, Hk=2, Hv=4, D=64, state=True)

    def layer(q, k, v, g, beta, s):
        return modeling.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=s,
                                                     output_final_state=True, use_qk_l2norm_in_kernel=True)

    torch._dynamo.reset()
    with torch.inference_mode(), graph_caches_off(), observe() as records:
        got, final = torch.compile(layer, backend="kda_inductor")(q, k, v, g, beta, s)
        want, want_state = layer(q.float(), k.float(), v.float(), g, beta.float(), s)
    assert sum(r.before.count("torch.ops.kda.gdn_chunk.default") for r in records) == 1
    assert _rel(got.float(), want) < 1e-2 and _rel(final, want_state) < 1e-2


def test_fla_chunk_compiled_under_kda_inductor_is_the_op_without_force():
    """Rule 2's speed rule for prefill (``_dynamo_chunk.CHUNK_RULE_MEASURED``, measured on CUDA in the
    prefill step): without ``force``, a function calling fla's ``chunk_gated_delta_rule`` as
    transformers does compiles to ONE graph holding one ``kda::gdn_chunk``, within 1e-2 of fla's own
    output; ``disable`` keeps fla's function behind its graph break."""
    fla = _fla()
    if fla is None:
        pytest.skip("fla-core is not installed")
    from kda_inductor.pass_manager import graph_caches_off, observe

    q, k, v, g, beta, s = _inputs(300, seed=13, Hk=2, Hv=4, D=64, state=True)

    def layer(q, k, v, g, beta, s):
        g = g + 0.0  # work before the call too: fla's function breaks the graph in two
        o, final = fla(q, k, v, g=g, beta=beta, initial_state=s, output_final_state=True,
                       use_qk_l2norm_in_kernel=True)
        return o * 2, final

    def compiled(**kda):
        torch._dynamo.reset()
        with graph_caches_off(), observe() as records:
            out = torch.compile(layer, backend="kda_inductor", options={"kda": kda} if kda else None)(
                q, k, v, g, beta, s)
        return out, len(records), sum(r.before.count("torch.ops.kda.gdn_chunk.default") for r in records)

    with torch.inference_mode():
        fo, fs = layer(q, k, v, g, beta, s)
        (got, final), graphs, ops = compiled()
        assert (graphs, ops) == (1, 1) and got.dtype == BF and final.dtype == torch.float32
        assert _rel(got, fo) < 1e-2 and _rel(final, fs) < 1e-2, (_rel(got, fo), _rel(final, fs))
        (got, final), graphs, ops = compiled(disable=["gdn_chunk"])
        assert (graphs, ops) == (2, 0)
        assert _rel(got, fo) < 1e-3 and _rel(final, fs) < 1e-3


# --------------------------------------------------------------------------- a decay per key channel (KDA)


def _kda_inputs(T, seed, H=32, D=128, N=1, state=False, strong=False):
    """Kimi Linear's dims (32 q / k / v heads, K = V = 128), bf16 inputs; ``g [1, T, H, K]`` as Kimi's
    gate makes it (``-A softplus(x + dt_bias)``, ``A`` in 1..16 a head); ``strong``: down to -10 a
    token in every channel (a chunk's cumulative decay past float32's ``exp`` range)."""
    q, k, v, _, beta, s = _inputs(T, seed, Hk=H, Hv=H, D=D, N=N, state=state)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    if strong:
        g = -10 * torch.rand(1, T, H, D, device="cuda", generator=gen)
    else:
        a = 1 + 15 * torch.rand(H, 1, device="cuda", generator=gen)
        g = -a * torch.nn.functional.softplus(torch.randn(1, T, H, D, device="cuda", generator=gen) - 4)
    return q, k, v, g, beta, s


def _kda_fla():
    try:
        from fla.ops.kda import chunk_kda
    except Exception:  # noqa: BLE001 - fla-core not installed or not importable here
        return None
    return chunk_kda


KDA_CONFIGS = {"default": None, "intra bf16": mod.KDA._replace(kda_intra_dot=""),
               "fp32 inter": mod.KDA._replace(lowp=False), "cols 32": mod.KDA._replace(kda_intra_cols=32),
               "split": mod.KDA._replace(kda_intra_split=True)}
"""The op's KDA launches (:data:`~kda_inductor.lowerings.gdn_chunk.KDA`: bf16 intermediates, the
intra launch's products tf32, the others' bf16), the same with bf16 products in the intra launch
too, tf32 products with float32 intermediates, ``A`` / ``Aqk`` over 32-column key blocks
(``kda_intra_cols``) and one program per block pair (``kda_intra_split``): held to the same bounds."""


@pytest.mark.parametrize("config", list(KDA_CONFIGS))
@pytest.mark.parametrize("T,state,strong", [(1, True, False), (100, False, False), (1000, True, True),
                                            (4096, False, False), (4096, True, True)])
def test_kda_matches_the_float32_loop_and_fla(T, state, strong, config):
    q, k, v, g, beta, s = _kda_inputs(T, seed=T, state=state, strong=strong)
    cfg = KDA_CONFIGS[config]
    with torch.inference_mode():
        want, want_state = mod.reference(q, k, v, g, beta, None, s, True)
        out = torch.full_like(v, float("nan"))
        got, final = mod.chunk_triton(q, k, v, g, beta, None, s, True, out=out, config=cfg)
        op_out, op_final = torch.ops.kda.gdn_chunk(q, k, v, g, beta, None, s, True)
    assert got.dtype == BF and final.dtype == torch.float32 and not got.isnan().any()
    if cfg is None:
        assert torch.equal(op_out, got) and torch.equal(op_final, final)  # the op is these launches
    err, serr = _rel(got, want), _rel(final, want_state)
    assert err < 1e-2 and serr < 1e-2, (err, serr)
    fla = _kda_fla()
    if fla is not None:
        with torch.inference_mode():
            fo, fs = fla(q, k, v, g, beta, initial_state=s, output_final_state=True, use_qk_l2norm_in_kernel=True)
        fla_err, fla_serr = _rel(fo, want), _rel(fs, want_state)
        print(f"KDA T={T}{' strong' if strong else ''} {config}: kda {err:.2e} / state {serr:.2e}; "
              f"fla {fla_err:.2e} / state {fla_serr:.2e}")
        assert err <= 1.5 * fla_err + 1e-3 and serr <= 1.5 * fla_serr + 1e-3, (err, fla_err, serr, fla_serr)


def test_kda_varlen_exact_products_and_cuda_graph():
    """Varlen with ``cu_seqlens`` on the device (lengths 1, 699, 0, 1348) against per-sequence loops;
    ``dot="ieee"`` within 1e-4 of the loop at small dims (GQA 1:2); captured in a CUDA graph (varlen:
    no host sync) and replayed on new inputs."""
    cu = torch.tensor([0, 1, 700, 700, 2048], device="cuda", dtype=torch.int32)
    q, k, v, g, beta, s = _kda_inputs(2048, seed=3, N=4, state=True)
    with torch.inference_mode():
        got, final = torch.ops.kda.gdn_chunk(q, k, v, g, beta, None, s, True, cu)
        want, want_state = mod.reference(q, k, v, g, beta, None, s, True, cu)
    assert _rel(got, want) < 1e-2 and _rel(final, want_state) < 1e-2
    torch.testing.assert_close(final[2], s[2], rtol=0, atol=0)  # the empty sequence keeps its state
    q, k, v, _, beta, s = _inputs(300, seed=5, Hk=2, Hv=4, D=64, state=True, dtype=torch.float32)
    g = -torch.rand(1, 300, 4, 64, device="cuda") * 3
    with torch.inference_mode():
        want, want_state = mod.reference(q, k, v, g, beta, 0.2, s, True)
        got, final = mod.chunk_triton(q, k, v, g, beta, 0.2, s, True, dot="ieee")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final, want_state, rtol=1e-4, atol=1e-4)
    cu = torch.tensor([0, 37, 300], device="cuda", dtype=torch.int64)
    a, b = (_kda_inputs(300, seed=sd, H=8, D=64, N=2, state=True) for sd in (7, 8))
    bufs = [x.clone() for x in a]
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.ops.kda.gdn_chunk(*bufs[:5], None, bufs[5], True, cu)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, final = torch.ops.kda.gdn_chunk(*bufs[:5], None, bufs[5], True, cu)
        for x, y in zip(bufs, b):
            x.copy_(y)
        graph.replay()
        want, want_state = torch.ops.kda.gdn_chunk(*b[:5], None, b[5], True, cu)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(final, want_state, rtol=0, atol=0)


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_fla_chunk_kda_compiled_under_kda_inductor_is_the_op(varlen):
    """Rule 2 for Kimi Linear's prefill (``kda_inductor/_dynamo_chunk.py``) on fla-core's real
    ``chunk_kda``: a function calling it, compiled under kda_inductor with ``force`` (the op's KDA
    launches are not yet timed against fla's), is one graph with one ``kda::gdn_chunk``; its output
    (bf16, q's dtype as fla's) and final state within 1e-2 of fla eager's and within 1.5x fla's own
    distance from the float32 loop (+ 1e-3). Unforced, fla's own function runs (a miss, the speed
    rule), equal to fla eager."""
    fla = _kda_fla()
    if fla is None:
        pytest.skip("fla-core not importable")
    from kda_inductor import _dynamo_fixes
    from kda_inductor.pass_manager import graph_caches_off, observe

    _dynamo_fixes.register()  # for fla modules imported since the backend was resolved (as each compile does)
    q, k, v, g, beta, s = _kda_inputs(1000, seed=21, N=3 if varlen else 1, state=True)
    cu = torch.tensor([0, 300, 301, 1000], device="cuda") if varlen else None

    def layer(q, k, v, g, beta, s, cu):
        o, final = fla(q, k, v, g=g * 1.0, beta=beta, initial_state=s, output_final_state=True,
                       use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
        return o * 2, final

    def compiled(**kda):
        torch._dynamo.reset()
        _dynamo_fixes.MISSES.clear()
        with torch.inference_mode(), graph_caches_off(), observe() as records:
            out = torch.compile(layer, backend="kda_inductor", options={"kda": kda})(q, k, v, g, beta, s, cu)
        return out, len(records), sum(r.before.count("torch.ops.kda.gdn_chunk.default") for r in records)

    with torch.inference_mode():
        fo, fs = layer(q, k, v, g, beta, s, cu)
        want, want_state = mod.reference(q, k, v, g, beta, None, s, True, cu)
    (got, final), graphs, ops = compiled(force=True)
    assert (graphs, ops) == (1, 1) and got.dtype == BF and final.dtype == torch.float32
    assert _rel(got, fo) < 1e-2 and _rel(final, fs) < 1e-2, (_rel(got, fo), _rel(final, fs))
    err, serr = _rel(got, 2 * want), _rel(final, want_state)
    fla_err, fla_serr = _rel(fo, 2 * want), _rel(fs, want_state)
    print(f"fla chunk_kda compiled ({'varlen' if varlen else 'batch'}): kda {err:.2e} / state {serr:.2e}; "
          f"fla {fla_err:.2e} / state {fla_serr:.2e}")
    assert err <= 1.5 * fla_err + 1e-3 and serr <= 1.5 * fla_serr + 1e-3, (err, fla_err, serr, fla_serr)
    (got, final), _, ops = compiled()
    assert ops == 0 and [m.reason.split(":")[0] for m in _dynamo_fixes.MISSES] == ["the speed rule"]
    assert _rel(got, fo) < 1e-3 and _rel(final, fs) < 1e-3
