"""CUDA: flash-linear-attention's chunked and recurrent kernels (examples/fla_core.py) against the
plain-torch core, sync-free and capturable; the hybrid model with the fla core compiled with
``mode="reduce-overhead"``: zero cudagraph skips, no host syncs, replays inside
``torch.cuda.graph``, every rewrite in every graph, outputs as eager."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from kda_inductor.testing import assert_cudagraph_safe, assert_no_cudagraph_skips, compile_for_test, fresh_compile

import fla_core  # noqa: E402
import gdn_layers as G  # noqa: E402
import hybrid_model as H  # noqa: E402

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(not fla_core.available(), reason="needs fla-core (carried in .whl/)")]


def varlen_inputs(kda: bool, lens, H=2, HV=4, K=64, V=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = sum(lens)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    q, k, v = r(1, n, H, K).bfloat16(), r(1, n, H, K).bfloat16(), r(1, n, HV, V).bfloat16()
    decay = F.logsigmoid(r(1, n, HV, K) if kda else r(1, n, HV)).float() * 0.3
    beta = torch.rand(1, n, HV, generator=g).bfloat16()
    h0 = r(len(lens), HV, K, V) * 0.1
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return [t.cuda() for t in (q, k, v, decay, beta, h0)], cu.cuda()


def per_request_torch(q, k, v, g, beta, h0, cu):
    rep = v.shape[2] // q.shape[2]
    outs, states = [], []
    for r in range(cu.numel() - 1):
        a, b = int(cu[r]), int(cu[r + 1])
        if a == b:  # no tokens: the state stays
            states.append(h0[r : r + 1])
            continue
        o, h = G.gated_delta_rule(q[:, a:b].repeat_interleave(rep, 2), k[:, a:b].repeat_interleave(rep, 2),
                                  v[:, a:b], g[:, a:b], beta[:, a:b], h0[r : r + 1])
        outs.append(o.to(v.dtype))
        states.append(h)
    return torch.cat(outs, 1), torch.cat(states)


LENS = [1, 64, 65, 130, 7, 0, 200]  # chunk edges, a zero-length request


@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("kernel", ["chunk", "recurrent"])
def test_fla_varlen_matches_torch_core(kda, kernel):
    """bf16 chunked recurrences reorder the sums: outputs within 2**-5 of their range, float32
    final states within 1% of theirs."""
    (q, k, v, g, beta, h0), cu = varlen_inputs(kda, LENS, H=4 if kda else 2)
    o, h = fla_core.OPS["kda" if kda else "gdn"][kernel](q, k, v, g, beta, h0, cu, q.shape[-1] ** -0.5)
    ro, rh = per_request_torch(q, k, v, g, beta, h0, cu)
    torch.testing.assert_close(o.float(), ro.float(), rtol=2**-5, atol=2**-5 * float(ro.abs().max()))
    torch.testing.assert_close(h, rh, rtol=1e-2, atol=1e-2 * float(rh.abs().max()))


def test_gdn_chunk_device_chunk_list_is_bit_exact_with_fla_own():
    """Our sync-free chunk list (padded, a zero-length extra sequence) computes every real
    chunk exactly as fla's own host-built list does."""
    (q, k, v, g, beta, h0), cu = varlen_inputs(False, LENS)
    o, h = fla_core.gdn_chunk(q, k, v, g, beta, h0, cu, 0.125)
    ro, rh = fla_core.fla().gdn_chunk(q, k, v, g, beta, scale=0.125, initial_state=h0, output_final_state=True,
                                      use_qk_l2norm_in_kernel=True, cu_seqlens=cu.long())
    assert torch.equal(o, ro) and torch.equal(h, rh)


@pytest.mark.parametrize("name", ["gdn_chunk", "kda_chunk", "gdn_recurrent", "kda_recurrent"])
def test_fla_ops_are_sync_free_and_capturable(name):
    kda = name.startswith("kda")
    (q, k, v, g, beta, h0), cu = varlen_inputs(kda, LENS, H=4 if kda else 2)
    op = getattr(fla_core, name)
    args = (q, k, v, g, beta, h0, cu, 0.125)
    op(*args)  # autotune outside the checks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        want = op(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = op(*args)
    g.mul_(0.5)  # new data in the same buffers: the replay must see it
    graph.replay()
    torch.cuda.synchronize()
    fresh = op(*args)
    assert torch.equal(got[0], fresh[0]) and torch.equal(got[1], fresh[1])
    assert not torch.equal(got[0], want[0])


@pytest.fixture(scope="module")
def model():
    return H.make_model(H.HybridConfig.tiny(), device="cuda", core="fla")


@pytest.mark.parametrize("kind", ["spec", "prefill", "mixed"])
def test_hybrid_fla_core_reduce_overhead(model, kind):
    """Three steps of one shape: no cudagraph skip, each as eager; every graph has every
    rewrite; then no host sync and a replay inside torch.cuda.graph."""
    assert model.gdn.uses_fla(model.attn.kv_cache)

    def batch(seed):
        torch.manual_seed(seed)
        if kind == "spec":
            return H.spec_decode_batch(model, 24, seed=seed)
        if kind == "prefill":
            return H.prefill_batch(model, 40, 4, seed=seed)
        return H.make_batch(model, 3, 2, [9, 4], seed=seed)

    with torch.no_grad(), fresh_compile():
        compiled = compile_for_test(model, mode="reduce-overhead")

        def steps():
            for seed in range(3):
                H.check_against_eager(model, batch(seed), compiled)

        assert_no_cudagraph_skips(steps)
        want = H.expected_matches(varlen=kind != "spec")  # forced: the varlen conv's gathers too
        for rec in compiled.records:
            got = {n: rec.matches.get(n, 0) for n in H.EXPECTED_MATCHES}
            assert got == want and not rec.errors, (got, rec.errors)
    # a capture of the step inside torch.cuda.graph (no host syncs): compiled in the default
    # mode, since reduce-overhead's own CUDA graphs cannot be captured inside another capture
    b = batch(0)
    with torch.no_grad(), fresh_compile():
        plain = compile_for_test(model)
        plain(*b.args(), **b.kwargs())
        assert_cudagraph_safe(lambda *a: plain(*a, **b.kwargs()), *b.args())


def _real_dims_step_records(make_batch) -> list[dict]:
    """The real-dims model with the fla core, as the report runs it (default options: the
    CUDA speed rules decide), compiled and checked against eager on ``make_batch(model)``;
    the compile's records."""
    torch.manual_seed(0)
    big = H.make_model(H.HybridConfig(), device="cuda", core="fla")
    b = make_batch(big)
    with torch.no_grad(), fresh_compile():
        compiled = compile_for_test(big, force=False)
        print(H.check_against_eager(big, b, compiled))
    return compiled.records


def test_hybrid_real_dims_spec_step_with_fla_core():
    """The real-dims spec step compiles with every rewrite and matches eager."""
    for rec in _real_dims_step_records(lambda m: H.spec_decode_batch(m, 256)):
        assert {n: rec.matches.get(n, 0) for n in H.EXPECTED_MATCHES} == H.EXPECTED_MATCHES


def test_hybrid_real_dims_prefill_leaves_the_one_sided_split_to_inductor():
    """The real-dims pure prefill: no spec set, so the split's launches are one-sided and
    stay with Inductor (``patterns/gdn_spec_split.py``'s speed rule, with the reason); every
    other rewrite fires; the step matches eager."""
    want = {**H.EXPECTED_MATCHES, "gdn_spec_split": 0}
    for rec in _real_dims_step_records(lambda m: H.prefill_batch(m, 2048)):
        assert {n: rec.matches.get(n, 0) for n in H.EXPECTED_MATCHES} == want
        assert "only one index gathers rows" in str(rec.misses["gdn_spec_split"])
