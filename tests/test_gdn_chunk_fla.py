"""Under kda_inductor, fla's ``chunk_gated_delta_rule`` (prefill; kept out of
graphs by fla's ``torch.compiler.disable``) is traced as ``kda::gdn_chunk``, by identity
(``kda_inductor/_dynamo_fixes.py``, rule ``gdn_chunk``), on the fla-core stand-in
(``tests/fla_standin.py``): stock compile breaks the graph at the call, kda_inductor keeps one graph
holding the op, equal to eager; ``disable``, a per-channel decay (``chunk_kda``'s domain, traced by its
own rule: ``tests/test_gdn_chunk_kda_fla.py``) and fla's varlen keywords it does not read keep fla's
function."""

import pytest
import torch

import fla_standin

from kda_inductor import _dynamo_fixes
from kda_inductor.pass_manager import graph_caches_off, observe
from tests.test_dynamo_fixes import fla  # noqa: F401  (the stand-in fixture)

OP = "torch.ops.kda.gdn_chunk.default"


def _inputs(T=70, per_channel=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, T, 2, 16, generator=gen), torch.randn(1, T, 2, 16, generator=gen)
    v = torch.randn(1, T, 4, 16, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, 4, *((16,) if per_channel else ()), generator=gen))
    return q, k, v, g, torch.randn(1, T, 4, generator=gen)


def _layer(fn, **extra):
    """A prefill layer's core as transformers calls fla (keywords after q, k, v), work around it."""

    def layer(q, k, v, g, b):
        o, final = fn(q, k, v, g=g, beta=b.sigmoid(), initial_state=None, output_final_state=True,
                      use_qk_l2norm_in_kernel=True, **extra)
        return o * 2 + 1, final * 0.5

    return layer


def _compiled(fn, args, backend, **options):
    """``(outputs, graphs, kda::gdn_chunk calls in them)`` of ``fn`` compiled fresh."""
    torch._dynamo.reset()
    if backend != "kda_inductor":
        counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
        return torch.compile(fn, backend=counter)(*args), counter.frame_count, 0
    with graph_caches_off(), observe() as records:
        out = torch.compile(fn, backend=backend, options=options or None)(*args)
    return out, len(records), sum(r.before.count(OP) for r in records)


def test_fla_prefill_is_one_graph_with_our_op(fla):  # noqa: F811
    args = _inputs()
    layer = _layer(fla.gdn_chunk)
    expected = layer(*args)
    stock, stock_graphs, _ = _compiled(layer, args, "eager")
    assert stock_graphs == 2  # broken at fla's call
    _dynamo_fixes.MISSES.clear()
    unforced, graphs, with_op = _compiled(layer, args, "kda_inductor")
    assert (graphs, with_op) == (2, 0)  # measured on CUDA only (fla runs on GPUs): forced off CUDA
    assert [m.reason for m in _dynamo_fixes.MISSES] == [
        "the speed rule: kda::gdn_chunk is not yet measured faster than fla's chunk_gated_delta_rule off CUDA "
        "(options['kda']['force'] applies it)"]
    ours, graphs, with_op = _compiled(layer, args, "kda_inductor", kda={"force": True})
    assert (graphs, with_op) == (1, 1)
    for got in (stock, unforced, ours):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_disable_and_what_the_op_does_not_cover_keep_flas_function(fla):  # noqa: F811
    args = _inputs()
    _, graphs, with_op = _compiled(_layer(fla.gdn_chunk), args, "kda_inductor",
                                   kda={"disable": ["gdn_chunk"], "force": True})
    assert (graphs, with_op) == (2, 0)
    kda_args = _inputs(per_channel=True)  # a decay per key channel: fla's function (the stand-in computes it)
    out, graphs, with_op = _compiled(_layer(fla.gdn_chunk), kda_args, "kda_inductor", kda={"force": True})
    assert (graphs, with_op) == (2, 0)
    torch.testing.assert_close(out, _layer(fla.gdn_chunk)(*kda_args), rtol=1e-5, atol=1e-5)
    extra = _layer(fla.gdn_chunk, chunk_indices=torch.tensor([0]))  # a keyword the op does not read
    with pytest.raises(NotImplementedError, match="the stand-in computes"):  # fla's function ran, eagerly
        _compiled(extra, args, "kda_inductor", kda={"force": True})


def test_the_decode_rule_is_unchanged_beside_it(fla):  # noqa: F811
    """Disabling the chunk rule leaves the recurrent one (and the other way round)."""
    from tests.test_dynamo_fixes import _compile_counted, _inputs as decode_inputs, _layer as decode_layer, _on

    args = decode_inputs(False)
    _, graphs, with_op = _compile_counted(decode_layer(fla.gdn), _on(args), "kda_inductor",
                                          kda={"disable": ["gdn_chunk"]})
    assert (graphs, with_op) == (1, 1)
    _, graphs, with_op = _compiled(_layer(fla.gdn_chunk), _inputs(), "kda_inductor",
                                   kda={"disable": ["gdn_recurrent_step"], "force": True})
    assert (graphs, with_op) == (1, 1)


@pytest.mark.slow
def test_transformers_qwen3_next_prefill_with_fla_is_one_graph(fla, monkeypatch):  # noqa: F811
    """transformers' own Qwen3-Next prefill (tiny dims, float32, 3 GDN layers + 1 full attention, 70
    tokens: two chunks), dispatching its chunked core to fla (the stand-in): kda_inductor compiles
    it to one graph with one ``kda::gdn_chunk`` per GDN layer, equal to eager."""
    pytest.importorskip("transformers.integrations.hub_kernels")
    from benchmarks import hf_models

    spec = hf_models.BY_NAME["qwen3_next"]
    modeling = fla_standin.modeling(monkeypatch, spec.module)
    config = hf_models.config_for(spec, getattr(pytest.importorskip("transformers"), spec.config), tiny=True)
    torch.manual_seed(0)
    model = getattr(modeling, spec.model)(config).float().eval()
    step, _ = hf_models.prefill_case(model, config, tokens=70, device="cpu")
    layers = hf_models.linear_layers(spec)
    with torch.inference_mode():
        expected = step(model.model)
        torch._dynamo.reset()
        with graph_caches_off(), observe() as records:
            ours = step(torch.compile(model.model, backend="kda_inductor", options={"kda": {"force": True}}))
    assert (len(records), sum(r.before.count(OP) for r in records)) == (1, layers)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
