"""``kda_inductor.exporting``: ``torch.export`` (non-strict and strict) of transformers' Qwen3-Next GDN
layer (tiny dims, float32, prefill of 70 tokens: two chunks, no fla-core) traces its chunked core,
``torch_chunk_gated_delta_rule``, as one ``kda::gdn_chunk``, equal to eager; unforced on CPU it is a
miss at the modeling line (the speed rule); ``disable`` and code outside the context keep the
reference; the functions are put back on exit, also where a layer holds the reference as an
attribute (transformers <= 5.17); Kimi Linear's reference likewise (forced); and the AOTInductor
package of the export calls the op."""

from __future__ import annotations

import zipfile

import pytest
import torch

import kda_inductor
from kda_inductor import _dynamo_chunk, _dynamo_fixes

pytest.importorskip("transformers")
modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
OP = "kda.gdn_chunk"
NAME = _dynamo_chunk.TORCH_CHUNK_REFERENCE


@pytest.fixture(scope="module")
def layer_and_input():
    from transformers import Qwen3NextConfig

    from benchmarks import hf_models

    config = hf_models.config_for(hf_models.BY_NAME["qwen3_next"], Qwen3NextConfig, tiny=True)
    torch.manual_seed(0)
    layer = modeling.Qwen3NextGatedDeltaNet(config, 0).float().eval()
    return layer, torch.randn(1, 70, config.hidden_size)


def _ops(ep) -> int:
    return sum(1 for node in ep.graph.nodes if OP in str(node.target))


@pytest.mark.parametrize("strict", [False, True])
def test_export_traces_the_reference_as_the_op(layer_and_input, strict):
    layer, x = layer_and_input
    before = modeling.torch_chunk_gated_delta_rule
    with torch.no_grad():
        want = layer(x)
        with kda_inductor.exporting(layer, {"force": True}):
            assert modeling.torch_chunk_gated_delta_rule is not before
            ep = torch.export.export(layer, (x,), strict=strict)
        assert modeling.torch_chunk_gated_delta_rule is before  # put back
        assert _ops(ep) == 1
        got = ep.module()(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        assert _ops(torch.export.export(layer, (x,), strict=strict)) == 0  # outside the context: the reference


def test_unforced_on_cpu_is_a_miss_at_the_modeling_line_and_disable_is_silent(layer_and_input):
    layer, x = layer_and_input
    _dynamo_fixes.MISSES.clear()
    with torch.no_grad(), kda_inductor.exporting(layer):
        assert _ops(torch.export.export(layer, (x,))) == 0
    (miss,) = _dynamo_fixes.MISSES
    assert miss.location.startswith(modeling.__file__ + ":")
    assert miss.reason == ("the speed rule: kda::gdn_chunk is not yet measured faster than Inductor's code for the "
                           "reference off CUDA (options['kda']['force'] applies it)")
    _dynamo_fixes.MISSES.clear()
    with torch.no_grad(), kda_inductor.exporting(layer, {"force": True, "disable": ["gdn_chunk"]}):
        assert _ops(torch.export.export(layer, (x,))) == 0
    assert not _dynamo_fixes.MISSES


class _Bound(torch.nn.Module):
    """A layer that binds the reference at construction, as transformers <= 5.17 does
    (``self.chunk_gated_delta_rule = chunk_gated_delta_rule or torch_chunk_gated_delta_rule``)."""

    def __init__(self):
        super().__init__()
        self.chunk_gated_delta_rule = _dynamo_chunk.reference_behind(modeling.torch_chunk_gated_delta_rule, NAME)
        assert callable(self.chunk_gated_delta_rule) and "chunk_gated_delta_rule" in vars(self)

    def forward(self, q, k, v, g, beta):
        out, _ = self.chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
        return out * 2


def test_kimi_linears_reference_too():
    """Kimi Linear's torch chunked KDA core (``chunk_kimi_delta_attention``, forced only) in its
    layer's export: one op, equal to eager."""
    import transformers

    from benchmarks import hf_models

    kimi = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
    spec = hf_models.BY_NAME["kimi_linear"]
    config = hf_models.config_for(spec, getattr(transformers, spec.config), tiny=True)
    torch.manual_seed(0)
    layer = kimi.KimiLinearDeltaAttention(config, 0).float().eval()
    with torch.no_grad():  # the bare layer leaves some parameters as torch.empty made them (the model's init fills them)
        for param in layer.parameters():
            param.normal_(0, 0.1)
    x = torch.randn(1, 70, config.hidden_size)
    with torch.no_grad():
        want = layer(x)
        with kda_inductor.exporting(layer, {"force": True}):
            ep = torch.export.export(layer, (x,))
        assert _ops(ep) == 1
        torch.testing.assert_close(ep.module()(x), want, rtol=1e-5, atol=1e-5)


def test_a_layers_own_attribute_is_replaced_and_put_back():
    bound = _Bound()
    held = bound.chunk_gated_delta_rule
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 40, 2, 16, generator=gen) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(1, 40, 2, generator=gen))
    beta = torch.rand(1, 40, 2, generator=gen)
    with torch.no_grad():
        want = bound(q, k, v, g, beta)
        with kda_inductor.exporting(bound, {"force": True}):
            ep = torch.export.export(bound, (q, k, v, g, beta))
        assert bound.chunk_gated_delta_rule is held and _ops(ep) == 1
        torch.testing.assert_close(ep.module()(q, k, v, g, beta), want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_aotinductor_package_calls_the_op(layer_and_input, tmp_path):
    """The package of the export (our post-grad pass, forced: on CPU the speed rules leave code to
    Inductor) names the op in its wrapper and equals eager."""
    from kda_inductor import KdaOptions
    from kda_inductor.pass_manager import KdaPostGradPass

    layer, x = layer_and_input
    with torch.no_grad():
        want = layer(x)
        with kda_inductor.exporting(layer, {"force": True}):
            ep = torch.export.export(layer, (x,))
        pkg = torch._inductor.aoti_compile_and_package(
            ep, package_path=str(tmp_path / "gdn.pt2"),
            inductor_configs={"post_grad_custom_post_pass": KdaPostGradPass(KdaOptions(force=True))})
        got = torch._inductor.aoti_load_package(pkg)(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with zipfile.ZipFile(pkg) as z:
        wrappers = [n for n in z.namelist() if n.endswith(".wrapper.json")]
        assert wrappers and all(b"kda::gdn_chunk" in z.read(n) for n in wrappers)
