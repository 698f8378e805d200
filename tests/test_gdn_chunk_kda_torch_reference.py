"""Under kda_inductor with ``force``, Kimi Linear's torch chunked KDA core
(``chunk_kimi_delta_attention``: what its prefill runs without fla-core, on a device fla does not
support, and under ``torch.export``) is traced as ``kda::gdn_chunk``, by identity
(``kda_inductor/_dynamo_chunk.py``, rule 3, named ``gdn_chunk`` for ``disable``): one op in the
graph, equal to eager and to a float64 reference of the recurrence. Not yet measured against
Inductor's code for it, so unforced it is left to Inductor (a miss, the speed rule); ``disable``
(no miss), another chunk size, heads the reference does not take and a keyword the op does not read
keep transformers' function, each a miss with its reason."""

import pytest
import torch

from kda_inductor import _dynamo_chunk, _dynamo_fixes
from kda_inductor.pass_manager import graph_caches_off, observe
from tests.test_gdn_chunk_kda_fla import reference64

modeling = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
OP = "torch.ops.kda.gdn_chunk.default"


def _inputs(T=70, H=4, HV=4, K=16, V=8):
    """Fresh random inputs, as Kimi's layer makes them: q / k / v ``[1, T, heads, dim]``, a log
    decay per key channel, beta logits, a float32 state."""
    q, k, v = torch.randn(1, T, H, K), torch.randn(1, T, H, K), torch.randn(1, T, HV, V)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, K) + 2)
    return q, k, v, g, torch.randn(1, T, HV), torch.randn(1, HV, K, V) * 0.1


def _layer(core=None, **extra):
    """A prefill layer's core as Kimi's ``KimiLinearDeltaAttention`` calls it, work around it."""
    core = core or modeling.chunk_kimi_delta_attention

    def layer(q, k, v, g, b, state):
        o, final = core(q, k, v, g=g, beta=b.sigmoid(), initial_state=state, output_final_state=True,
                        use_qk_l2norm_in_kernel=True, **extra)
        return o * 2 + 1, final * 0.5

    return layer


def _compiled(fn, args, **options):
    """``(outputs, graphs, kda::gdn_chunk calls in them, misses recorded)`` of ``fn`` compiled fresh."""
    torch._dynamo.reset()
    _dynamo_fixes.MISSES.clear()
    with graph_caches_off(), observe() as records:
        out = torch.compile(fn, backend="kda_inductor", options=options or None)(*args)
    return out, len(records), sum(r.before.count(OP) for r in records), list(_dynamo_fixes.MISSES)


def _close(got, want, tol=2e-4):
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol)


def test_the_reference_is_found_under_transformers_wrappers():
    found = _dynamo_chunk.torch_chunk_references(_dynamo_chunk.TORCH_KDA_REFERENCE)
    assert found and all(fn.__name__ == "chunk_kimi_delta_attention" for fn in found)
    assert all("chunk_size" in fn.__code__.co_varnames and "decay_mask" in fn.__code__.co_varnames for fn in found)
    assert not set(map(id, found)) & set(map(id, _dynamo_chunk.torch_chunk_references()))  # GDN's are apart


@pytest.mark.parametrize("heads", [4, 1], ids=["same_heads", "one_key_head"])
def test_forced_the_reference_is_our_op_and_equal_to_eager_and_float64(heads):
    """The reference's heads: q / k / v alike (Kimi's), or one q / k head it broadcasts over the value
    heads (the op's GVA)."""
    args = _inputs(H=heads)
    layer = _layer()
    eager = layer(*args)
    q, k, v, g, b, state = args
    o, final = reference64(q, k, v, g, b.sigmoid(), state, q.shape[-1] ** -0.5)
    _close(eager, (o * 2 + 1, final * 0.5))
    ours, graphs, with_op, misses = _compiled(layer, args, kda={"force": True})
    assert (graphs, with_op, misses) == (1, 1, [])
    _close(ours, eager)


@pytest.mark.parametrize("options, extra, heads, reason", [
    ({}, {}, 4, "the speed rule: kda::gdn_chunk is not yet measured faster than Inductor's code"),
    ({"disable": ["gdn_chunk"], "force": True}, {}, 4, None),
    ({"force": True}, {"chunk_size": 32}, 4, "chunk_size is not 64"),
], ids=["unforced", "disabled", "chunk_size_32"])
def test_what_keeps_transformers_function(options, extra, heads, reason):
    args = _inputs(T=40, H=heads)
    layer = _layer(**extra)
    out, graphs, with_op, misses = _compiled(layer, args, kda=options)
    assert (graphs, with_op) == (1, 0)  # the reference, traced by Dynamo, compiled by Inductor
    assert [m.reason[:len(reason)] for m in misses] == ([reason] if reason else [])
    _close(out, layer(*args))


def test_heads_and_keywords_the_reference_does_not_take_keep_it():
    """Past transformers' wrappers (which drop keywords the function does not name), the plain
    function: a keyword its ``**kwargs`` takes given as None is in the op's domain, any other value
    not; q / k heads neither 1 nor the value heads' are the reference's (its broadcast fails)."""
    plain = next(fn for fn in _dynamo_chunk.torch_chunk_references(_dynamo_chunk.TORCH_KDA_REFERENCE)
                 if fn.__module__ == modeling.__name__)
    args = _inputs(T=40)
    for value, ops in ((None, 1), (1, 0)):
        out, _, with_op, misses = _compiled(_layer(plain, extra_keyword=value), args, kda={"force": True})
        assert with_op == ops
        assert [m.reason for m in misses] == ([] if ops else ["extra_keyword given: an argument kda::gdn_chunk "
                                                                 "does not read"])
        _close(out, _layer(plain, extra_keyword=value)(*args))
    with pytest.raises(Exception):  # the reference's own error, in the reference
        _compiled(_layer(plain), _inputs(T=40, H=2, HV=4), kda={"force": True})
    assert [m.reason.split(":")[0] for m in _dynamo_fixes.MISSES][:1] == ["q / k heads neither 1 nor the value heads'"]
