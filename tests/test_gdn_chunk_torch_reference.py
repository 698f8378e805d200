"""Under kda_inductor with ``force``, transformers' torch chunked core
(``torch_chunk_gated_delta_rule``: what prefill runs without fla-core) is traced as
``kda::gdn_chunk``, by identity (``kda_inductor/_dynamo_fixes.py``, rule 3, named ``gdn_chunk``
for ``disable``): one op in the graph, equal to eager. Without ``force``, on CPU it is left to
Inductor (the speed rule was measured on CUDA only: ``tests/test_gdn_chunk_cuda.py`` checks it fires
there unforced); ``disable``, another chunk size and a keyword the op does not read keep
transformers' function."""

import pytest
import torch

from kda_inductor import _dynamo_chunk
from kda_inductor.pass_manager import graph_caches_off, observe

modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
OP = "torch.ops.kda.gdn_chunk.default"


def _inputs(T=70, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, T, 2, 16, generator=gen), torch.randn(1, T, 2, 16, generator=gen)
    v = torch.randn(1, T, 4, 16, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, 4, generator=gen))
    return q, k, v, g, torch.randn(1, T, 4, generator=gen), torch.randn(1, 4, 16, 16, generator=gen)


def _layer(core=None, **extra):
    """A prefill layer's core as transformers' GatedDeltaNet calls it, work around it."""
    core = core or modeling.torch_chunk_gated_delta_rule

    def layer(q, k, v, g, b, state):
        o, final = core(q, k, v, g=g, beta=b.sigmoid(), initial_state=state,
                                                         output_final_state=True, use_qk_l2norm_in_kernel=True,
                                                         **extra)
        return o * 2 + 1, final * 0.5

    return layer


def _compiled(fn, args, **options):
    """``(outputs, graphs, kda::gdn_chunk calls in them)`` of ``fn`` compiled fresh."""
    torch._dynamo.reset()
    with graph_caches_off(), observe() as records:
        out = torch.compile(fn, backend="kda_inductor", options=options or None)(*args)
    return out, len(records), sum(r.before.count(OP) for r in records)


def test_the_reference_is_found_under_transformers_wrappers():
    found = _dynamo_chunk.torch_chunk_references()
    assert found and all(fn.__name__ == "torch_chunk_gated_delta_rule" for fn in found)
    assert all("chunk_size" in fn.__code__.co_varnames for fn in found)  # the body, not a wrapper


def test_forced_the_reference_is_our_op_and_equal_to_eager():
    args = _inputs()
    layer = _layer(cu_seqlens=None)  # as transformers' layer passes it without packed sequences
    expected = layer(*args)
    ours, graphs, with_op = _compiled(layer, args, kda={"force": True})
    assert (graphs, with_op) == (1, 1)
    for got, want in zip(ours, expected):
        torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("options, extra", [
    ({}, {}),  # the speed rule: measured on CUDA, not on CPU
    ({"disable": ["gdn_chunk"], "force": True}, {}),
    ({"force": True}, {"chunk_size": 32}),
])
def test_what_keeps_transformers_function(options, extra):
    args = _inputs(T=40, seed=1)
    layer = _layer(**extra)
    out, graphs, with_op = _compiled(layer, args, kda=options)
    assert with_op == 0
    for got, want in zip(out, layer(*args)):
        torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)


def test_a_keyword_the_op_does_not_read_keeps_the_reference():
    """Past transformers' wrappers (which drop keywords the function does not name), the plain
    function called with a keyword its ``**kwargs`` takes: None is in the op's domain, else not."""
    plain = next(fn for fn in _dynamo_chunk.torch_chunk_references() if fn.__module__ == modeling.__name__)
    args = _inputs(T=40, seed=2)
    for value, ops in ((None, 1), (1, 0)):
        layer = _layer(plain, extra_keyword=value)
        out, _, with_op = _compiled(layer, args, kda={"force": True})
        assert with_op == ops
        for got, want in zip(out, layer(*args)):
            torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)


def test_explain_names_what_the_trace_rules_did():
    """explain(): the calls traced as the op (``report.traced``, its own table) and, unforced on CPU,
    the trace rule's miss with its reason at the user's line (this file's call of the reference)."""
    import kda_inductor

    args = _inputs(T=40, seed=2)
    report = kda_inductor.explain(_layer(), *args, options={"kda": {"force": True}})
    assert report.traced == {"gdn_chunk": 1} and not report.trace_misses
    assert "traced as our ops (trace rules):" in str(report)
    report = kda_inductor.explain(_layer(), *args)
    assert report.traced == {}
    (miss,) = report.trace_misses
    assert miss.location.startswith(__file__ + ":") and miss.op == "kda::gdn_chunk"
    assert miss.reason.startswith("the speed rule: kda::gdn_chunk is not yet measured faster")
    text = str(report)
    assert "not traced as our ops (trace rules):" in text and "torch_chunk_gated_delta_rule kept" in text
