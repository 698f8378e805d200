"""kda_inductor's Dynamo fix (``kda_inductor/_dynamo_fixes.py``): ``torch.compiler.is_exporting()``
is False in a torch.compile trace for kda_inductor, so transformers' hub-kernel dispatch keeps the
installed package's kernel (fla-core's gated delta rule) instead of its torch reference.

On a torch that already reads the flag at trace time (2.13+) these hold without the fix; on the
H200's torch 2.11 they hold only with it (``.ci/gpu tests`` runs this file there)."""

import sys
import types

import pytest
import torch

import kda_inductor.backend  # noqa: F401  (installs the fix, as torch.compile's backend lookup does)
from kda_inductor import _dynamo_fixes


def _flags(x):
    return x + 1 if torch.compiler.is_exporting() else x - 1


def test_is_exporting_false_under_kda_inductor():
    torch._dynamo.reset()
    x = torch.randn(4)
    assert torch.equal(torch.compile(_flags, backend="kda_inductor", fullgraph=True)(x), x - 1)


def test_is_exporting_true_under_torch_export():
    class M(torch.nn.Module):
        def forward(self, x):
            return _flags(x)

    x = torch.randn(4)
    ep = torch.export.export(M(), (x,), strict=True)
    assert torch.equal(ep.module()(x), x + 1)


@pytest.fixture
def hub():
    """transformers' hub-kernel dispatch module (skipped where this transformers lacks it)."""
    module = pytest.importorskip("transformers.integrations.hub_kernels")
    if not hasattr(module, "use_kernel_func_from_hub_with_fallback"):
        pytest.skip("this transformers has no use_kernel_func_from_hub_with_fallback")
    return module


@pytest.fixture
def fake_kernel_package(monkeypatch):
    pkg = types.ModuleType("kda_fake_kernels")
    pkg.fast_rule = lambda x, g=None: x.cos()
    monkeypatch.setitem(sys.modules, "kda_fake_kernels", pkg)
    return pkg


def _torch_folds_is_exporting() -> bool:
    """This torch traces ``is_exporting()`` to True under torch.compile (pytorch#176347)."""
    torch._dynamo.reset()
    x = torch.randn(4)
    return torch.equal(torch.compile(_flags, backend="eager", fullgraph=True)(x), x + 1)


def test_transformers_dispatch_package_for_chunk_reference_for_recurrent(fake_kernel_package, hub):
    """transformers' dispatch under kda_inductor: a chunked core gets the package's kernel; a
    recurrent one keeps the reference where torch folds the flag (measured faster there)."""

    @hub.use_kernel_func_from_hub_with_fallback("fast_rule", "kda_fake_kernels")
    def torch_chunk_rule(x, g=None):
        return x.sin()

    @hub.use_kernel_func_from_hub_with_fallback("fast_rule", "kda_fake_kernels")
    def torch_recurrent_rule(x, g=None):
        return x.sin()

    folds = _torch_folds_is_exporting()
    torch._dynamo.reset()
    x = torch.randn(8)
    assert torch.equal(torch_chunk_rule(x), x.cos()) and torch.equal(torch_recurrent_rule(x), x.cos())
    out = torch.compile(lambda t: torch.stack([torch_chunk_rule(t), torch_recurrent_rule(t)]) * 2,
                        backend="kda_inductor", fullgraph=True)(x)
    torch.testing.assert_close(out[0], x.cos() * 2)
    torch.testing.assert_close(out[1], (x.sin() if folds else x.cos()) * 2)
    # stock keeps its torch's behaviour
    torch._dynamo.reset()
    stock = torch.compile(lambda t: torch_chunk_rule(t) * 2, backend="eager", fullgraph=True)(x)
    torch.testing.assert_close(stock, (x.sin() if folds else x.cos()) * 2)


def test_only_our_backend_is_recognized():
    assert _dynamo_fixes._ours(kda_inductor.backend.kda_inductor)
    wrapped = types.SimpleNamespace(compiler_fn=types.SimpleNamespace(compiler_fn=kda_inductor.backend.kda_inductor))
    assert _dynamo_fixes._ours(wrapped)
    from torch._dynamo.backends.registry import lookup_backend

    assert not _dynamo_fixes._ours(lookup_backend("eager"))
    assert not _dynamo_fixes._ours(lookup_backend("inductor"))
    assert not _dynamo_fixes._tracing_for_us()  # not inside a trace


def test_installed_where_torch_has_the_pieces():
    from torch._dynamo.variables import torch as dynamo_torch

    table = dynamo_torch.tracing_state_functions()
    assert _dynamo_fixes.install() is isinstance(table, _dynamo_fixes._TracingState)
    assert table[torch.compiler.is_compiling] is True  # the other entries untouched


def test_the_feature_check_reads_what_this_torch_does():
    """The fix is installed exactly where this torch folds ``is_exporting()`` (2.11 on the H200:
    installed; 2.13 in CI: torch reads the flag itself, the fix is off), a check of behaviour,
    not of a version string; the probe leaves Dynamo's counters as it found them."""
    from torch._dynamo.utils import counters
    from torch._dynamo.variables import torch as dynamo_torch

    _dynamo_fixes.torch_folds_is_exporting.cache_clear()
    before = {k: dict(v) for k, v in counters.items()}
    folds = _dynamo_fixes.torch_folds_is_exporting()
    assert {k: dict(v) for k, v in counters.items() if v} == {k: v for k, v in before.items() if v}
    installed = _dynamo_fixes.install()
    assert folds == _torch_folds_is_exporting()
    assert installed == folds
    assert isinstance(dynamo_torch.tracing_state_functions(), _dynamo_fixes._TracingState) == installed


def test_the_feature_check_can_say_needed(monkeypatch):
    """Where the probe sees torch fold the constant, ``install`` goes on to install (the pieces of
    this torch permitting): the check can fail both ways."""
    monkeypatch.setattr(_dynamo_fixes, "torch_folds_is_exporting", lambda: True)
    monkeypatch.setattr(_dynamo_fixes, "_installed", False)
    from torch._dynamo.variables import torch as dynamo_torch

    original = dynamo_torch.tracing_state_functions
    try:
        assert _dynamo_fixes.install() is True
        assert isinstance(dynamo_torch.tracing_state_functions(), _dynamo_fixes._TracingState)
    finally:
        dynamo_torch.tracing_state_functions = original
        _dynamo_fixes._installed = isinstance(original(), _dynamo_fixes._TracingState)


def test_applied_to_every_backend_gives_stock_the_package(fake_kernel_package, hub):
    """``applied_to_every_backend()``: stock Inductor traces with the fix (the benchmarks' "stock +
    fix" baseline): transformers' chunked core dispatches to the package's kernel."""

    @hub.use_kernel_func_from_hub_with_fallback("fast_rule", "kda_fake_kernels")
    def torch_chunk_rule(x, g=None):
        return x.sin()

    x = torch.randn(8)
    torch._dynamo.reset()
    with _dynamo_fixes.applied_to_every_backend():
        out = torch.compile(lambda t: torch_chunk_rule(t) * 2, backend="eager", fullgraph=True)(x)
    torch.testing.assert_close(out, x.cos() * 2)
    assert not _dynamo_fixes._every_backend
