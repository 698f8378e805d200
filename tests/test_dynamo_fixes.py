"""kda_inductor's two trace rules (``kda_inductor/_dynamo_fixes.py``, ``docs/dynamo-rules.md``),
each applied only to traces for kda_inductor:

1. ``torch.compiler.is_exporting()`` reads the flag (pytorch#176499 backported): tested on this
   torch (which has the fix: the rule changes nothing) and on this torch with its handler made to
   fold the constant as torch <= 2.12 does (the rule then gives our traces the flag, and stock
   keeps the constant).
2. fla's recurrent decode entry points become ``kda::gdn_recurrent_step``: with a
   stand-in for fla-core (``tests/fla_standin.py``), stock compile breaks the graph at every call,
   kda_inductor keeps one graph with the op, equal to eager; ``disable`` and arguments outside the
   op's domain keep fla's function.

On the H200's torch 2.11 the first rule is the one torch lacks (``.ci/gpu tests`` runs this file)."""

import subprocess
import sys
import textwrap
import types

import pytest
import torch
import torch._dynamo.testing

import fla_standin
from kda_inductor import _dynamo_fixes
from kda_inductor.pass_manager import graph_caches_off, observe


def _flags(x):
    return x + 1 if torch.compiler.is_exporting() else x - 1


def _compiled_flags(backend="kda_inductor", x=None):
    torch._dynamo.reset()
    x = torch.randn(4) if x is None else x
    return torch.equal(torch.compile(_flags, backend=backend, fullgraph=True)(x), x + 1)


@pytest.fixture
def unfixed_torch(monkeypatch):
    """This torch's Dynamo with the behaviour of torch <= 2.12 (pytorch#176347): its handler of
    ``is_exporting`` traces the constant True whatever the flag. The rule wraps that handler."""
    torch.compile(_flags, backend="kda_inductor")  # torch resolves the name: the rules are registered
    rule = _dynamo_fixes._exporting_rule
    assert isinstance(rule, _dynamo_fixes.ReadsTheFlag)
    from torch._dynamo.variables import ConstantVariable

    def folds(variable, tx, *args, **kwargs):
        rule_torch(variable, tx, *args, **kwargs)  # torch's own bookkeeping (side effects marked)
        return ConstantVariable.create(True)

    rule_torch = rule.torch_handler
    monkeypatch.setattr(rule, "torch_handler", folds)
    yield
    torch._dynamo.reset()


def test_is_exporting_false_under_kda_inductor():
    assert not _compiled_flags()


def test_is_exporting_true_under_torch_export():
    class M(torch.nn.Module):
        def forward(self, x):
            return _flags(x)

    x = torch.randn(4)
    ep = torch.export.export(M(), (x,), strict=True)
    assert torch.equal(ep.module()(x), x + 1)


def test_the_backport_on_a_torch_that_folds_the_constant(unfixed_torch):
    """Where torch folds ``is_exporting()`` to True: our traces read the flag, stock keeps torch's
    constant, ``applied_to_every_backend()`` gives stock the flag too, torch.export still says True."""
    assert _compiled_flags("eager")  # stock: the folded constant, as torch <= 2.12
    assert not _compiled_flags("kda_inductor")
    with _dynamo_fixes.applied_to_every_backend():
        assert not _compiled_flags("eager")
    assert not _dynamo_fixes._every_backend
    test_is_exporting_true_under_torch_export()


def test_the_rule_keeps_torchs_answer_where_it_is_the_flag_or_the_trace_is_not_ours():
    """The rule's decision on its own: torch's answer object stands where it already is the flag
    (a torch with #176499, this one) or the trace is another backend's; else the flag."""
    import kda_inductor.backend
    from torch._dynamo.variables import ConstantVariable

    def trace_for(backend):
        return types.SimpleNamespace(output=types.SimpleNamespace(compiler_fn=backend))

    assert not torch.compiler._is_exporting_flag
    for answer in (False, True):
        torch_answer = ConstantVariable.create(answer)
        rule = _dynamo_fixes.ReadsTheFlag(lambda variable, tx: torch_answer)
        assert rule(None, trace_for(torch._dynamo.lookup_backend("eager"))) is torch_answer
        ours = rule(None, trace_for(kda_inductor.backend.kda_inductor))
        assert (ours is torch_answer) == (answer is False) and ours.as_python_constant() is False


def test_the_feature_probe_reads_what_this_torch_does_and_leaves_counters_as_found(unfixed_torch):
    from torch._dynamo.utils import counters

    counters["kda_probe_test"]["seen"] += 1
    groups = {group: (id(c), dict(c)) for group, c in counters.items()}
    _dynamo_fixes.torch_folds_is_exporting.cache_clear()
    try:
        assert _dynamo_fixes.torch_folds_is_exporting() is True  # the simulated torch <= 2.12
        assert {group: (id(c), dict(c)) for group, c in counters.items() if c} == {
            g: v for g, v in groups.items() if v[1]}
    finally:
        _dynamo_fixes.torch_folds_is_exporting.cache_clear()
        del counters["kda_probe_test"]


def test_importing_kda_inductor_and_its_backend_changes_nothing_in_dynamo():
    """``import kda_inductor`` imports no torch and adds no import hook; importing the backend
    leaves Dynamo's handler of ``is_exporting`` torch's and registers no polyfill; torch resolving
    ``backend="kda_inductor"`` (before any trace) registers the rules."""
    code = textwrap.dedent("""
        import sys
        hooks = list(sys.meta_path)
        import kda_inductor
        assert "torch" not in sys.modules and sys.meta_path == hooks, "import kda_inductor"
        import torch
        from torch._dynamo.variables.torch import TorchInGraphFunctionVariable as V
        torch_handler = V._get_handlers()[torch.compiler.is_exporting]
        import kda_inductor.backend
        from kda_inductor import _dynamo_fixes
        assert V._get_handlers()[torch.compiler.is_exporting] is torch_handler, "import kda_inductor.backend"
        torch.compile(lambda x: x, backend="kda_inductor")
        rule = V._get_handlers()[torch.compiler.is_exporting]
        assert isinstance(rule, _dynamo_fixes.ReadsTheFlag) and rule.torch_handler is torch_handler
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


# --------------------------------------------------------------------------- rule 2: fla's decode


def _inputs(kda, B=2, T=1, H=2, HV=4, K=8, V=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    decay = torch.nn.functional.logsigmoid(r(B, T, HV, K) if kda else r(B, T, HV))
    return r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V), decay, r(B, T, HV), r(B, HV, K, V)


@pytest.fixture
def fla(monkeypatch):
    """The fla-core stand-in, imported before torch resolves ``backend="kda_inductor"`` (as when
    transformers has loaded the model's module before you compile it): torch's registry is made to
    resolve the name through our entry point again at the next ``torch.compile``, as in a new
    process (and put back afterwards)."""
    from importlib.metadata import entry_points

    from torch._dynamo.backends import registry

    standin = fla_standin.install(monkeypatch)
    registry.lookup_backend("kda_inductor")  # torch's registry has read the entry points
    (entry,) = entry_points(group="torch_dynamo_backends", name="kda_inductor")
    monkeypatch.delitem(registry._COMPILER_FNS, "kda_inductor")
    monkeypatch.setitem(registry._BACKENDS, "kda_inductor", entry)
    return standin


def _layer(fn, **extra):
    """A decode layer's core: work before (beta's sigmoid), transformers' call (keywords after
    q, k, v), work after."""

    def layer(q, k, v, g, b, state):
        o, final = fn(q, k, v, g=g, beta=b.sigmoid(), initial_state=state, output_final_state=True,
                      use_qk_l2norm_in_kernel=True, **extra)
        return o * 2 + 1, final * 0.5

    return layer


OP = "torch.ops.kda.gdn_recurrent_step.default"


def _compile_counted(fn, call, backend, *, in_place=False, **options):
    """``(call(fn compiled fresh), graphs, kda::gdn_recurrent_step calls in them)``; with
    ``in_place``, also the in-place op's calls after our pass."""
    torch._dynamo.reset()
    if backend != "kda_inductor":
        counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
        return call(torch.compile(fn, backend=counter)), counter.frame_count, 0
    with graph_caches_off(), observe() as records:  # every graph through our pass, none from a cache
        out = call(torch.compile(fn, backend=backend, options=options or None))
    counts = [len(records), sum(r.before.count(OP) for r in records)]
    if in_place:
        counts.append(sum(r.after.count("kda.gdn_recurrent_step_inplace.default") for r in records))
    return out, *counts


def _on(args):
    return lambda compiled: compiled(*args)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_fla_decode_is_one_graph_with_our_op(fla, kind):
    args = _inputs(kind == "kda")
    layer = _layer(getattr(fla, kind))
    expected = layer(*args)
    stock, stock_graphs, _ = _compile_counted(layer, _on(args), "eager")
    assert stock_graphs == 2  # broken at fla's call: the graph before it and the one after
    ours, graphs, with_op = _compile_counted(layer, _on(args), "kda_inductor")
    assert (graphs, with_op) == (1, 1)
    for got in (stock, ours):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_disable_and_arguments_outside_the_ops_domain_keep_flas_function(fla):
    args = _inputs(False)
    _, graphs, with_op = _compile_counted(_layer(fla.gdn), _on(args), "kda_inductor",
                                          kda={"disable": ["gdn_recurrent_step"]})
    assert (graphs, with_op) == (2, 0)
    varlen = _layer(fla.gdn, cu_seqlens=torch.tensor([0, 1]))  # fla's varlen mode: not the op's
    with pytest.raises(NotImplementedError, match="the stand-in computes"):  # fla's function ran, eagerly
        _compile_counted(varlen, _on(args), "kda_inductor")


def test_an_fla_module_imported_after_the_first_compile_gets_the_rule_from_the_next(monkeypatch):
    torch.compile(_flags, backend="kda_inductor")(torch.randn(2))  # torch has resolved the backend
    late = fla_standin.install(monkeypatch)
    args = _inputs(False)
    _, graphs, _ = _compile_counted(_layer(late.gdn), _on(args), "kda_inductor")
    assert graphs == 2  # registered when that compile called the backend, after its trace
    _, graphs, with_op = _compile_counted(_layer(late.gdn), _on(args), "kda_inductor")
    assert (graphs, with_op) == (1, 1)


@pytest.fixture
def hub():
    """transformers' hub-kernel dispatch module (skipped where this transformers lacks it)."""
    module = pytest.importorskip("transformers.integrations.hub_kernels")
    if not hasattr(module, "use_kernel_func_from_hub_with_fallback"):
        pytest.skip("this transformers has no use_kernel_func_from_hub_with_fallback")
    return module


def test_transformers_dispatches_to_fla_and_the_rule_takes_it(fla, hub, unfixed_torch):
    """transformers' dispatch of its recurrent core, on a torch that folds ``is_exporting()``:
    stock traces transformers' torch reference (one graph, no op, the reference's values),
    kda_inductor reads the flag, dispatches to fla, and the rule makes that our op."""

    @hub.use_kernel_func_from_hub_with_fallback("fused_recurrent_gated_delta_rule", "fla")
    def torch_recurrent_rule(q, k, v, g, beta, initial_state=None, output_final_state=False,
                             use_qk_l2norm_in_kernel=False, **kwargs):
        return v * 0 + 3, initial_state * 0  # not the rule: tells which one a trace took

    args = _inputs(False)
    layer = _layer(torch_recurrent_rule)
    ours, graphs, with_op = _compile_counted(layer, _on(args), "kda_inductor")
    assert (graphs, with_op) == (1, 1)
    torch.testing.assert_close(ours, _layer(fla.gdn)(*args), rtol=1e-5, atol=1e-5)
    stock, graphs, _ = _compile_counted(layer, _on(args), "eager")
    assert graphs == 1 and torch.equal(stock[0], torch.full_like(stock[0], 7.0))  # 3 * 2 + 1


# --------------------------------------------------------------------------- transformers' models


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_next", "kimi_linear"])
def test_transformers_decode_step_with_fla_is_one_graph(fla, hub, monkeypatch, family):
    """The torch 2.13 + fla-core (stand-in) graph-count test: transformers' own
    decode step (tiny dims, float32, 3 linear-attention layers + 1 full attention), dispatching
    its recurrent core to fla: stock Dynamo breaks the graph at each layer's fla call (11 graphs
    for the 4 layers on torch 2.13; where torch folds ``is_exporting()``, stock traces
    transformers' torch reference instead: one graph); kda_inductor compiles it to one graph
    holding one ``kda::gdn_recurrent_step`` per layer, equal to eager; the cache's ``copy_`` of
    its new state makes each the in-place op on the cache (no copy kernel of the state)."""
    from benchmarks import hf_models

    spec = hf_models.BY_NAME[family]
    modeling = fla_standin.modeling(monkeypatch, spec.module)
    config = hf_models.config_for(spec, getattr(pytest.importorskip("transformers"), spec.config), tiny=True)
    torch.manual_seed(0)
    model = getattr(modeling, spec.model)(config).float().eval()
    step, reset = hf_models.decode_case(model, config, batch=2, context=8, device="cpu")
    layers = hf_models.linear_layers(spec)
    with torch.inference_mode():
        reset()
        expected = step(model.model).clone()
        reset()
        _, stock_graphs, _ = _compile_counted(model.model, step, "eager")
        reset()
        ours, graphs, with_op, in_place = _compile_counted(model.model, step, "kda_inductor", in_place=True)
    assert stock_graphs == 1 if _dynamo_fixes.torch_folds_is_exporting() else stock_graphs > layers
    assert (graphs, with_op, in_place) == (1, layers, layers)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
