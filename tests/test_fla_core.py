"""examples/fla_core.py: flash-linear-attention's kernels as custom ops.

On CPU the two recurrent kernels run under the Triton interpreter (tests/conftest.py sets
TRITON_INTERPRET=1), so their wrappers are checked here against the plain-torch core; the
chunked kernels need CUDA (tests/test_hybrid_model_cuda.py). Skipped when fla-core is not
installed (``pip install 'kda-inductor[fla]'``).
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

import fla_core  # noqa: E402
import gdn_layers as G  # noqa: E402

needs_fla = pytest.mark.skipif(not fla_core.available(), reason="fla-core is not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def inputs(kda: bool, B=3, T=4, H=2, HV=4, K=16, V=16, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    q, k = r(B, T, H, K).bfloat16(), r(B, T, H, K).bfloat16()
    v = r(B, T, HV, V).bfloat16()
    decay = F.logsigmoid(r(B, T, HV, K) if kda else r(B, T, HV)) * 0.5
    beta = torch.rand(B, T, HV, generator=g).bfloat16()
    h0 = r(B, HV, K, V) * 0.1
    return [t.to(device) for t in (q, k, v, decay, beta, h0)]


def torch_core(q, k, v, g, beta, h0):
    rep = v.shape[2] // q.shape[2]
    o, h = G.gated_delta_rule(q.repeat_interleave(rep, 2), k.repeat_interleave(rep, 2), v, g, beta, h0)
    return o.to(v.dtype), h


@needs_fla
@pytest.mark.parametrize("kda", [False, True], ids=["gdn", "kda"])
def test_recurrent_op_matches_torch_core(kda):
    """Fixed-length batches (decode, spec decode), grouped value heads for GDN, initial and
    final states: bf16 outputs within two bf16 ulps of the range, float32 states closer."""
    q, k, v, g, beta, h0 = inputs(kda, H=4 if kda else 2)
    op = fla_core.OPS["kda" if kda else "gdn"]["recurrent"]
    o, h = op(q, k, v, g, beta, h0, None, q.shape[-1] ** -0.5)
    ro, rh = torch_core(q, k, v, g, beta, h0)
    torch.testing.assert_close(o.float(), ro.float(), rtol=2**-7, atol=2**-6 * float(ro.abs().max()))
    torch.testing.assert_close(h, rh, rtol=1e-3, atol=1e-3 * float(rh.abs().max()))
    assert not torch.equal(h, h0)  # the state moved


@needs_fla
def test_recurrent_op_varlen_matches_per_request():
    """``cu_seqlens`` over one flattened batch: the same as each request on its own."""
    q, k, v, g, beta, h0 = inputs(False, B=1, T=9)
    cu = torch.tensor([0, 2, 3, 9], dtype=torch.int32, device=DEVICE)
    h0 = torch.randn(3, *h0.shape[1:], device=DEVICE) * 0.1
    o, h = fla_core.gdn_recurrent(q, k, v, g, beta, h0, cu, 16 ** -0.5)
    for r in range(3):
        a, b = int(cu[r]), int(cu[r + 1])
        ro, rh = torch_core(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], h0[r : r + 1])
        torch.testing.assert_close(o[:, a:b].float(), ro.float(), rtol=2**-7, atol=2**-6 * float(ro.abs().max()))
        torch.testing.assert_close(h[r : r + 1], rh, rtol=1e-3, atol=1e-3 * float(rh.abs().max()))


def test_bad_input_names_the_argument():
    q, k, v, g, beta, h0 = inputs(False, device="cpu")
    with pytest.raises(ValueError, match="initial_state"):
        fla_core.gdn_recurrent(q, k, v, g, beta, h0[:2], None, 0.25)
    with pytest.raises(ValueError, match="g must be"):
        fla_core.kda_recurrent(q, k, v, g, beta, h0, None, 0.25)  # a per-head decay for KDA
    with pytest.raises(ValueError, match="cu_seqlens needs B == 1"):
        fla_core.gdn_chunk(q, k, v, g, beta, h0, torch.tensor([0, 4]), 0.25)
    with pytest.raises(ValueError, match="beta"):
        fla_core.gdn_recurrent(q, k, v, g, beta[..., :1], h0, None, 0.25)


def test_no_tokens_leaves_states_unchanged():
    """An empty set (no spec requests in a prefill batch) never reaches fla's kernels."""
    q, k, v, g, beta, h0 = inputs(False, B=0, device="cpu")
    o, h = fla_core.gdn_recurrent(q, k, v, g, beta, h0, None, 0.25)
    assert o.shape == v.shape and h.shape == h0.shape
    q, k, v, g, beta, h0 = inputs(True, B=1, T=0, H=4, device="cpu")
    cu = torch.zeros(3, dtype=torch.int32)
    h0 = torch.randn(2, *h0.shape[1:])
    o, h = fla_core.kda_chunk(q, k, v, g, beta, h0, cu, 0.25)
    assert torch.equal(h, h0) and h.data_ptr() != h0.data_ptr()


def test_static_chunk_indices():
    """fla's (sequence, chunk) rows on the device: real chunks first, then padding rows naming
    the zero-length sequence N; never fewer rows than chunks."""
    cu = torch.tensor([0, 3, 3, 70, 71])
    rows = fla_core.static_chunk_indices(cu, 71, 64)
    assert rows.tolist() == [[0, 0], [2, 0], [2, 1], [3, 0], [4, 0], [4, 0]]
    for lens in ([64] * 5, [1] * 7, [65, 63, 1], [0, 0, 200]):
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
        rows = fla_core.static_chunk_indices(cu, sum(lens), 64)
        real = sum(-(-n // 64) for n in lens)
        assert (rows[:real, 0] < len(lens)).all() and (rows[real:, 0] == len(lens)).all(), (lens, rows)


@needs_fla
def test_ops_are_opaque_to_compile_and_fakes_agree():
    """``torch.library.opcheck``: schema, fake impl and the real one agree (recurrent ops on the
    interpreter on CPU; every op on CUDA); compiled with fullgraph, no graph break."""
    for kda in (False, True):
        args = inputs(kda, H=4 if kda else 2)
        op = fla_core.OPS["kda" if kda else "gdn"]["recurrent"]
        torch.library.opcheck(op, (*args, None, 0.25), test_utils=("test_schema", "test_faketensor"))
        fn = torch.compile(lambda *a, op=op: op(*a, None, 0.25), fullgraph=True, backend="aot_eager")
        o, h = fn(*args)
        ro, rh = op(*args, None, 0.25)
        torch.testing.assert_close(o, ro)
        torch.testing.assert_close(h, rh)


@needs_fla
def test_layer_with_fla_core_matches_torch_core():
    """The GDN and KDA example layers, decode + spec decode with core='fla' (the recurrent
    kernels) against core='torch'."""
    for cls, cfg in ((G.Qwen3NextGDN, G.GDNConfig.tiny()), (G.KimiKDA, G.KDAConfig.tiny())):
        torch.manual_seed(0)
        layer = cls(cfg, core="fla").to(DEVICE).eval()
        hidden, batch, states = G.make_inputs(layer, 2, 3, seed=1, device=DEVICE)
        args = (hidden, batch.spec_idx, batch.non_spec_idx, *states)
        with torch.no_grad():
            got = layer(*args)
            layer.set_core("torch")
            want = layer(*args)
        for a, e in zip(got, want):
            torch.testing.assert_close(a.float(), e.float(), rtol=2**-6, atol=2**-6 * float(e.float().abs().max()))


def test_core_option_is_checked():
    with pytest.raises(ValueError, match="core must be one of"):
        G.Qwen3NextGDN(G.GDNConfig.tiny(), core="triton")
