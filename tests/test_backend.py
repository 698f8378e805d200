"""The backend, its options, the pass manager and explain(), end to end."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

import kda_inductor
from kda_inductor.options import KdaOptions
from kda_inductor.pass_manager import KdaPostGradPass, combine_with
from kda_inductor.patterns.indexer_k_gather import IndexerKGather
from kda_inductor.reference import gather_indexer_k, gather_indexer_k_loop, random_indexer_cache
from tests.helpers import assert_bytes_equal, compile_and_run, fresh_compile


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(1234)
    return random_indexer_cache([3, 0, 40, 17], 16, 128, table_stride_pad=1, generator=g)


def _gather_fn(n):
    return lambda c, t, s: gather_indexer_k(c, t, s, n)


def test_registered_through_entry_point():
    assert "kda_inductor" in torch._dynamo.list_backends(exclude_tags=())
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("kda_inductor") is kda_inductor.backend.kda_inductor


def test_public_names_survive_imports_of_internal_modules():
    """Importing the implementation modules (as the CLI and the HTML report do) leaves
    ``kda_inductor.explain`` the function, whatever ran first."""
    import importlib

    for mod in ("kda_inductor._explain", "kda_inductor.report_html", "kda_inductor.cli", "kda_inductor.testing"):
        importlib.import_module(mod)
    assert callable(kda_inductor.explain) and kda_inductor.explain.__name__ == "explain"
    assert isinstance(kda_inductor.Report, type) and isinstance(kda_inductor.GraphReport, type)


FORCED = kda_inductor.Explainer(options={"kda": {"force": True}})
"""``explain`` with the speed rules off: on CPU they leave these small gathers to Inductor."""


def test_explain_reports_every_rewrite_and_both_graphs(inputs):
    cache, table, cu, n = inputs
    report = FORCED(_gather_fn(n), cache, table, cu)
    assert report.matches == {name: (1 if name == "indexer_k_gather" else 0) for name in kda_inductor.REWRITE_NAMES}
    assert set(report.matches) == set(kda_inductor.REWRITE_NAMES)
    assert "aten.searchsorted" in report.before and "kda.indexer_k_gather" not in report.before
    assert "kda.indexer_k_gather" in report.after and "aten.searchsorted" not in report.after
    assert report.graph_breaks == [] and report.eager_frames == []
    text = str(report)
    for name in kda_inductor.REWRITE_NAMES:
        assert name in text
    assert "frames that fell back to eager: 0" in text


def test_explain_takes_mode_and_options_and_passes_other_keywords_to_fn(inputs):
    cache, table, cu, n = inputs
    seen = []

    def fn(c, t, s, *, tokens):
        seen.append(tokens)
        return gather_indexer_k(c, t, s, tokens)

    report = kda_inductor.explain(fn, cache, table, cu, tokens=n, options={"kda": {"force": True}})
    assert report.matches["indexer_k_gather"] == 1 and seen == [n]  # forced: the CPU speed rule is off
    # a keyword of fn's own named like explain's goes through Explainer, which passes every keyword to fn
    report = kda_inductor.Explainer()(lambda x, mode, options: x * mode + options, torch.ones(3), mode=2.0, options=1.0)
    assert report.matches == dict.fromkeys(kda_inductor.REWRITE_NAMES, 0) and len(report.graphs) == 1


def test_explain_loop_form_points_to_vectorized_form(inputs):
    cache, table, cu, n = inputs
    dv = torch.empty(n, 128, dtype=torch.uint8)
    ds = torch.empty(n, 4, dtype=torch.uint8)
    report = kda_inductor.explain(gather_indexer_k_loop, cache, dv, ds, table, cu)
    assert report.matches["indexer_k_gather"] == 0
    assert [f.name for f in report.eager_frames] == ["gather_indexer_k_loop"]
    frame = report.eager_frames[0]
    assert "data-dependent branching" in frame.reason.lower()
    assert "kda_inductor.reference.gather_indexer_k" in frame.hint
    assert any("data-dependent" in b.reason.lower() for b in report.graph_breaks)
    assert "gather_indexer_k_loop" in str(report) and "hint:" in str(report)


def test_disable_option(inputs):
    cache, table, cu, n = inputs
    out, matches = compile_and_run(
        _gather_fn(n), cache, table, cu, options={"kda": {"disable": ["indexer_k_gather"]}}
    )
    assert matches["indexer_k_gather"] == 0
    assert_bytes_equal(out, gather_indexer_k(cache, table, cu, n))


@pytest.mark.parametrize(
    "kda, message",
    [
        ({"disable": ["no_such_rewrite"]}, r"valid names are \['indexer_k_write', 'indexer_k_gather'"),
        ({"disabled": []}, r"valid options are \['disable', 'strict', 'force'\]"),
        ({"disable": "indexer_k_gather"}, r"must be a list of rewrite names"),
    ],
)
def test_bad_kda_options_are_clear_errors(kda, message, inputs):
    with pytest.raises(Exception, match=message) as parsed:
        KdaOptions.parse(kda)
    cache, table, cu, n = inputs
    with fresh_compile():
        compiled = torch.compile(_gather_fn(n), backend="kda_inductor", options={"kda": kda})
        for _ in range(2):  # plainly, at every call: not wrapped in BackendCompilerFailed, no "report a bug"
            with pytest.raises(parsed.type, match=message) as called:
                compiled(cache, table, cu)
            assert type(called.value) is parsed.type and str(called.value) == str(parsed.value)


def test_other_options_go_to_inductor(inputs):
    cache, table, cu, n = inputs
    for settings in ({"options": {"not_an_inductor_option": 1}}, {"mode": "no-such-mode"}):
        with fresh_compile(), pytest.raises(RuntimeError, match="not_an_inductor_option|no-such-mode") as called:
            torch.compile(_gather_fn(n), backend="kda_inductor", **settings)(cache, table, cu)
        assert type(called.value) is RuntimeError and "TORCHDYNAMO_VERBOSE" not in str(called.value)
    # a real Inductor option is accepted and our rewrite still runs
    out, matches = compile_and_run(
        _gather_fn(n), cache, table, cu, options={"kda": {"strict": True}, "size_asserts": False}
    )
    assert matches["indexer_k_gather"] == 1


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_modes_accepted(mode):
    """A mode and no options (the rewrite fires under the CPU speed rule: a gather of its
    threshold's size)."""
    from kda_inductor.patterns.indexer_k_gather import CPU_MIN_TOKENS

    cache, table, cu, n = random_indexer_cache([CPU_MIN_TOKENS], 64, 128, generator=torch.Generator().manual_seed(3))
    with fresh_compile(), kda_inductor.pass_manager.observe() as records:
        out = torch.compile(_gather_fn(n), backend="kda_inductor", mode=mode)(cache, table, cu)
    assert sum(r.matches["indexer_k_gather"] for r in records) == 1
    assert_bytes_equal(out, gather_indexer_k(cache, table, cu, n))


def test_failing_rewrite_falls_back_with_warning(inputs, monkeypatch):
    def boom(self, graph, match):
        graph.call_function(torch.ops.aten.relu.default, (next(iter(graph.nodes)),))
        raise RuntimeError("synthetic failure")

    monkeypatch.setattr(IndexerKGather, "replace", boom)
    cache, table, cu, n = inputs
    with pytest.warns(RuntimeWarning, match="rewrite 'indexer_k_gather' failed and was skipped"):
        out, matches = compile_and_run(_gather_fn(n), cache, table, cu, strict=False)
    assert matches["indexer_k_gather"] == 0
    assert_bytes_equal(out, gather_indexer_k(cache, table, cu, n))
    report = FORCED(_gather_fn(n), cache, table, cu)
    assert "synthetic failure" in str(report)


def test_strict_option_raises(inputs, monkeypatch):
    monkeypatch.setattr(IndexerKGather, "find", lambda self, g: 1 / 0)
    cache, table, cu, n = inputs
    with pytest.raises(Exception, match="ZeroDivisionError"):
        compile_and_run(_gather_fn(n), cache, table, cu)


def test_timed_sees_each_run_of_the_pass_inside_the_block_only():
    from kda_inductor import pass_manager

    fn = torch.compile(lambda x: x * 2 + 1, backend="kda_inductor")
    with fresh_compile(), pass_manager.timed() as outer:
        with pass_manager.timed() as inner:
            fn(torch.randn(8))
        torch.compile(lambda x: x - 3, backend="kda_inductor")(torch.randn(8))
    torch.compile(lambda x: x / 5, backend="kda_inductor")(torch.randn(8))
    assert len(inner) == 1 and len(outer) == 2 and all(t > 0 for t in outer)
    assert not pass_manager._timers


def test_counted_sees_the_replacements_made_inside_the_block_only():
    from kda_inductor import pass_manager

    def split(x, s, ns):
        return x.index_select(0, s), x.index_select(0, ns)

    perm = torch.randperm(12)
    args = (torch.randn(12, 64), perm[:5], perm[5:])
    with fresh_compile():
        with pass_manager.counted() as made:
            torch.compile(split, backend="kda_inductor", options={"kda": {"force": True}})(*args)
        with pass_manager.counted() as nothing:
            torch.compile(lambda x: x * 2 + 1, backend="kda_inductor")(torch.randn(8))
    assert made == {"gdn_spec_split": 1} and nothing == {}


def test_uuid_tracks_options_and_is_stable():
    a, b = KdaPostGradPass(), KdaPostGradPass()
    c = KdaPostGradPass(KdaOptions.parse({"disable": ["indexer_k_gather"]}))
    d = KdaPostGradPass(KdaOptions.parse({"disable": ["gdn_spec_split"]}))
    assert isinstance(a, CustomGraphPass)
    assert a.uuid() == b.uuid() != c.uuid() != d.uuid() != a.uuid()
    assert len(a.uuid()) == 64


def test_every_rewrite_runs_unless_disabled():
    assert {"gdn_spec_split", "indexer_k_gather"} <= set(KdaOptions().enabled())


class _Recorder(CustomGraphPass):
    def __init__(self):
        self.seen = []

    def __call__(self, graph):
        self.seen.append(str(graph))

    def uuid(self):
        return "recorder-v1"


def test_user_post_grad_pass_still_runs(inputs):
    user_pass = _Recorder()
    chained = combine_with(KdaPostGradPass(), user_pass)
    assert chained.uuid() != KdaPostGradPass().uuid()
    assert combine_with(KdaPostGradPass(), [user_pass])[1] is user_pass
    cache, table, cu, n = inputs
    out, matches = compile_and_run(
        _gather_fn(n), cache, table, cu,
        options={"kda": {"strict": True}, "post_grad_custom_post_pass": user_pass},
    )
    assert matches["indexer_k_gather"] == 1
    assert len(user_pass.seen) == 1 and "kda.indexer_k_gather" in user_pass.seen[0]


def test_fx_graph_cache_serves_same_options_and_never_stale(inputs):
    """Our uuid keeps Inductor's caches on (no bypass) and keyed by our options."""
    from torch._dynamo.utils import counters
    from torch._inductor import utils as inductor_utils

    fresh_cache = getattr(inductor_utils, "fresh_cache", None) or inductor_utils.fresh_inductor_cache
    cache, table, cu, n = inputs
    fn = _gather_fn(n)

    def compile_once(kda):
        torch._dynamo.reset()
        with kda_inductor.pass_manager.observe() as records:
            out = torch.compile(fn, backend="kda_inductor", options={"kda": kda})(cache, table, cu)
        assert_bytes_equal(out, gather_indexer_k(cache, table, cu, n))
        return [r.matches["indexer_k_gather"] for r in records]

    counters.clear()
    with fresh_cache(), torch._inductor.config.patch(fx_graph_cache=True, force_disable_caches=False):
        assert compile_once({"force": True}) == [1]  # compiled: our pass ran
        assert compile_once({"force": True}) == []  # served from the cache: our pass did not run
        assert compile_once({"force": True, "disable": ["indexer_k_gather"]}) == [0]  # other options: recompiled
        assert compile_once({}) == [0]  # the speed rules on: another key, recompiled (left to Inductor on CPU)
    assert counters["inductor"]["fxgraph_cache_bypass"] == 0
    torch._dynamo.reset()


@pytest.mark.parametrize("capability,refused", [((7, 5), True), ((8, 0), False), ((9, 0), False)])
def test_a_gpu_older_than_sm80_is_a_miss_even_when_forced(capability, refused, monkeypatch):
    """Our kernels are written for sm_80+ (``Rewrite.min_cuda_capability``): on an older GPU every
    match is a miss that names the GPU's generation, ``force`` or not, and the graph is untouched."""
    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kda_inductor.patterns import REWRITES
    from kda_inductor.patterns.base import Match, Stage

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    graph = fx.Graph()
    x = graph.placeholder("x")
    with FakeTensorMode():
        x.meta["val"] = torch.empty(4, 8, device="cuda")
    y = graph.call_function(torch.ops.aten.neg.default, (x,))
    graph.output(y)
    rewrite = REWRITES["gdn_spec_split"]()
    replaced = []
    monkeypatch.setattr(rewrite, "replace", lambda graph, match: replaced.append(match))
    done = KdaPostGradPass(KdaOptions.parse({"force": True}))._replace(graph, rewrite, Match(nodes=[x, y]), {})
    assert done is (not refused) and len(replaced) == (0 if refused else 1)
    misses = rewrite.misses
    if refused:
        assert [m.stage for m in misses] == [Stage.VALIDATED]
        assert "compute capability 7.5: the replacement needs 8.0 or newer" in misses[0].check
    else:
        assert not misses
