"""Under kda_inductor, fla's ``chunk_kda`` (Kimi Linear's prefill; kept out of graphs by fla's
``torch.compiler.disable``) is traced as ``kda::gdn_chunk``, by identity (``kda_inductor/_dynamo_chunk.py``,
rule ``gdn_chunk``), on the fla-core stand-in (``tests/fla_standin.py``): stock compile breaks the
graph at the call; kda_inductor, forced (its KDA launches are not yet timed against fla's), keeps one
graph holding the op, equal to a float64 reference of the KDA recurrence (GVA heads, a state, l2norm,
a scale, varlen). Each argument form the op does not cover keeps fla's function (the graph breaks)
and is a miss with its reason at this file's line; ``disable`` keeps fla's without a miss. With
fla-core importable (``pip install fla-core einops``), the same on its real ``chunk_kda`` object."""

import inspect

import pytest
import torch

import fla_standin

from kda_inductor import _dynamo_fixes
from kda_inductor.pass_manager import graph_caches_off, observe
from tests.test_dynamo_fixes import fla  # noqa: F401  (the stand-in fixture)

OP = "torch.ops.kda.gdn_chunk.default"
H, HV, K, V = 2, 4, 16, 8


def _inputs(T=70, B=1, k_dim=K, N=None):
    """Fresh random inputs: q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``, a log decay per key channel,
    beta logits, a float32 state ``[N, HV, K, V]``."""
    q, k = torch.randn(B, T, H, k_dim), torch.randn(B, T, H, k_dim)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, k_dim) + 2)
    return q, k, torch.randn(B, T, HV, V), g, torch.randn(B, T, HV), torch.randn(N or B, HV, k_dim, V) * 0.1


def reference64(q, k, v, g, beta, state, scale, cu_seqlens=None):
    """The KDA recurrence per token in float64, l2-normalized q / k (eps 1e-6), value heads grouped
    over the key heads: ``(o, final states)``."""
    rep = v.shape[2] // q.shape[2]
    q, k = (x.double().repeat_interleave(rep, 2) for x in (q, k))
    q, k = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    offsets = [0, q.shape[1]] if cu_seqlens is None else cu_seqlens.tolist()
    o, finals = torch.zeros(*v.shape, dtype=torch.float64), []
    for n, (s, e) in enumerate(zip(offsets[:-1], offsets[1:])):
        S = state[n if cu_seqlens is not None else slice(None)].double().clone()
        for t in range(s, e):
            S = S * g[:, t].double().exp()[..., None]
            delta = (v[:, t].double() - (S * k[:, t, ..., None]).sum(-2)) * beta[:, t].double()[..., None]
            S = S + k[:, t, ..., None] * delta[..., None, :]
            o[:, t] = (S * q[:, t, ..., None] * scale).sum(-2)
        finals.append(S.reshape(-1, *S.shape[-3:]))
    return o, torch.cat(finals)


def _layer(fn, **extra):
    """A prefill layer's core as transformers calls fla (keywords after q, k, v), work around it."""

    def layer(q, k, v, g, b, state):
        o, final = fn(q, k, v, g=g, beta=b.sigmoid(), scale=0.3, initial_state=state, output_final_state=True,
                      use_qk_l2norm_in_kernel=True, **extra)
        return o * 2 + 1, final * 0.5

    return layer


def _expected(args, cu_seqlens=None):
    q, k, v, g, b, state = args
    o, final = reference64(q, k, v, g, b.sigmoid(), state, 0.3, cu_seqlens)
    return o * 2 + 1, final * 0.5


def _compiled(fn, args, backend="kda_inductor", **options):
    """``(outputs, graphs, kda::gdn_chunk calls in them, misses recorded)`` of ``fn`` compiled fresh."""
    torch._dynamo.reset()
    _dynamo_fixes.MISSES.clear()
    if backend != "kda_inductor":
        counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
        return torch.compile(fn, backend=counter)(*args), counter.frame_count, 0, []
    with graph_caches_off(), observe() as records:
        out = torch.compile(fn, backend=backend, options=options or None)(*args)
    return out, len(records), sum(r.before.count(OP) for r in records), list(_dynamo_fixes.MISSES)


def _close(got, want, tol=1e-4):
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol)


def _line_of(fn) -> str:
    """``file:line`` of the fla call in :func:`_layer` (the user's source line of a miss)."""
    lines, first = inspect.getsourcelines(_layer)
    return f"{__file__}:{first + next(i for i, line in enumerate(lines) if 'o, final = fn(' in line)}"


def test_fla_kda_prefill_is_one_graph_with_our_op(fla):  # noqa: F811
    args = _inputs()
    layer, expected = _layer(fla.kda_chunk), _expected(args)
    _close(layer(*args), expected)  # the stand-in is the reference's function
    stock, graphs, _, _ = _compiled(layer, args, "eager")
    assert graphs == 2  # broken at fla's call
    unforced, graphs, with_op, misses = _compiled(layer, args)
    assert (graphs, with_op) == (2, 0)  # its KDA launches are not yet timed against fla's
    assert [m.reason for m in misses] == ["the speed rule: kda::gdn_chunk is not yet measured faster than fla's "
                                          "chunk_kda (options['kda']['force'] applies it)"]
    assert str(misses[0]).startswith(f"{_line_of(layer)}: fla_standin.chunk_kda kept, not traced as kda::gdn_chunk")
    ours, graphs, with_op, misses = _compiled(layer, args, kda={"force": True})
    assert (graphs, with_op, misses) == (1, 1, [])
    for got in (stock, unforced, ours):
        _close(got, expected)


def test_varlen_batches_and_the_arguments_that_leave_the_result_as_is(fla):  # noqa: F811
    cu = torch.tensor([0, 5, 70, 90])
    args = _inputs(T=90, N=3)
    layer = _layer(fla.kda_chunk, cu_seqlens=cu)
    ours, graphs, with_op, _ = _compiled(layer, args, kda={"force": True})
    assert (graphs, with_op) == (1, 1)
    _close(ours, _expected(args, cu))
    args = _inputs(T=40)
    same = dict(chunk_size=32, safe_gate=True, disable_recompute=True, A_log=torch.zeros(HV), dt_bias=None)
    ours, graphs, with_op, _ = _compiled(_layer(fla.kda_chunk, **same), args, kda={"force": True})
    assert (graphs, with_op) == (1, 1)
    _close(ours, _expected(args))


OUTSIDE = [  # (keywords, what the miss says); fla's function computes each (the stand-in does)
    (dict(use_gate_in_kernel=True, A_log=torch.randn(HV), dt_bias=torch.randn(HV * K)), "use_gate_in_kernel: fla"),
    (dict(use_beta_sigmoid_in_kernel=True), "use_beta_sigmoid_in_kernel: beta in logit space"),
    (dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True), "use_beta_sigmoid_in_kernel"),
    (dict(cu_seqlens_cpu=torch.tensor([0, 40])), "cu_seqlens_cpu: a host copy"),
    (dict(foo=1), "foo given: an argument kda::gdn_chunk does not read"),
]


@pytest.mark.parametrize("extra, reason", OUTSIDE, ids=[r.split(":")[0].split(" ")[0] for _, r in OUTSIDE])
def test_what_the_op_does_not_cover_keeps_flas_function_with_its_reason(fla, extra, reason):  # noqa: F811
    args = _inputs(T=40)
    layer = _layer(fla.kda_chunk, **extra)
    out, graphs, with_op, misses = _compiled(layer, args, kda={"force": True})
    assert (graphs, with_op) == (2, 0)
    assert len(misses) == 1 and misses[0].reason.startswith(reason), misses
    assert misses[0].location == _line_of(layer) and misses[0].op == "kda::gdn_chunk"
    _close(out, layer(*args), 1e-5)


@pytest.mark.parametrize("case", ["wide_keys", "bf16_state", "chunk_size_16", "per_head_decay", "varlen_batch_2"])
def test_outside_the_domain_in_shapes_and_values(fla, case):  # noqa: F811
    """K > 128 (the op's KDA launches), a state fla refuses, a chunk size fla refuses, a decay per head,
    varlen offsets over a batch of two rows: fla's function, with fla's answer (its result or its error)."""
    args = list(_inputs(T=3, B=2 if case == "varlen_batch_2" else 1, k_dim=130 if case == "wide_keys" else K))
    extra = {"chunk_size": 16} if case == "chunk_size_16" else {}
    if case == "varlen_batch_2":
        extra = {"cu_seqlens": torch.tensor([0, 1, 3])}
    if case == "bf16_state":
        args[5] = args[5].bfloat16()
    if case == "per_head_decay":
        args[3] = args[3][..., 0]
    layer = _layer(fla.kda_chunk, **extra)
    if case == "wide_keys":
        out, graphs, with_op, misses = _compiled(layer, args, kda={"force": True})
        assert (graphs, with_op) == (2, 0)
        _close(out, _expected(args))
    else:
        with pytest.raises(Exception):  # fla's own check, in fla's function
            _compiled(layer, args, kda={"force": True})
        misses = list(_dynamo_fixes.MISSES)
    expected = {"wide_keys": "K > 128", "bf16_state": "initial_state is not float32",
                "chunk_size_16": "chunk_size is not 32 or 64", "per_head_decay": "g is not a log decay per key",
                "varlen_batch_2": "cu_seqlens with a batch"}
    assert [m.reason.split(":")[0][:len(expected[case])] for m in misses] == [expected[case]]


def test_disable_keeps_flas_function_without_a_miss_and_the_other_rules_stay(fla):  # noqa: F811
    args = _inputs(T=40)
    _, graphs, with_op, misses = _compiled(_layer(fla.kda_chunk), args, kda={"disable": ["gdn_chunk"], "force": True})
    assert (graphs, with_op, misses) == (2, 0, [])
    _, graphs, with_op, _ = _compiled(_layer(fla.kda_chunk), args,
                                      kda={"disable": ["gdn_recurrent_step"], "force": True})
    assert (graphs, with_op) == (1, 1)


def test_the_real_fla_core_chunk_kda_is_traced_by_identity(monkeypatch):
    """fla-core's own ``chunk_kda`` (its kernels never run: the op's CPU implementation does): the
    stand-in's signature is fla's, the rule registers for that object, forced it is our op."""
    kda = pytest.importorskip("fla.ops.kda", reason="fla-core (and einops) not importable")
    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert params(kda.chunk_kda) == params(fla_standin.chunk_kda)
    _dynamo_fixes.register()  # as the backend does at each compile, for fla modules imported since
    assert _dynamo_fixes._substituted.get(id(kda.chunk_kda)) is kda.chunk_kda
    args = _inputs()
    ours, graphs, with_op, misses = _compiled(_layer(kda.chunk_kda), args, kda={"force": True})
    assert (graphs, with_op, misses) == (1, 1, [])
    _close(ours, _expected(args))


@pytest.mark.slow
@pytest.mark.parametrize("with_fla", [True, False], ids=["fla_standin", "torch_reference"])
def test_transformers_kimi_linear_prefill_is_one_graph(fla, monkeypatch, with_fla):  # noqa: F811
    """transformers' own Kimi Linear prefill (tiny dims, float32, 3 KDA layers + 1 MLA layer, 70
    tokens: two chunks), its chunked core dispatched to fla (the stand-in) or to its torch reference
    (``chunk_kimi_delta_attention``; the stand-in left out): forced, kda_inductor compiles it to one
    graph with one ``kda::gdn_chunk`` per KDA layer, equal to eager."""
    pytest.importorskip("transformers.integrations.hub_kernels")
    from benchmarks import hf_models

    spec = hf_models.BY_NAME["kimi_linear"]
    modeling = fla_standin.modeling(monkeypatch, spec.module)
    if not with_fla:
        hf_models.use_torch_cores(modeling)
    config = hf_models.config_for(spec, getattr(pytest.importorskip("transformers"), spec.config), tiny=True)
    torch.manual_seed(0)
    model = getattr(modeling, spec.model)(config).float().eval()
    step, _ = hf_models.prefill_case(model, config, tokens=70, device="cpu")
    _dynamo_fixes.register()  # the reference of the module executed anew (the backend does it at each compile)
    with torch.inference_mode():
        expected = step(model.model)
        torch._dynamo.reset()
        with graph_caches_off(), observe() as records:
            ours = step(torch.compile(model.model, backend="kda_inductor", options={"kda": {"force": True}}))
    assert (len(records), sum(r.before.count(OP) for r in records)) == (1, hf_models.linear_layers(spec))
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)
    if with_fla:  # unforced: fla's function (the speed rule), one miss at the layer's call in transformers' file
        source, first = inspect.getsourcelines(modeling.KimiLinearDeltaAttention.forward)
        line = first + next(i for i, text in enumerate(source) if "= chunk_kimi_delta_attention(" in text)
        torch._dynamo.reset()
        _dynamo_fixes.MISSES.clear()
        with torch.inference_mode():
            torch.testing.assert_close(step(torch.compile(model.model, backend="kda_inductor")), expected)
        assert [(m.location, m.reason.split(":")[0]) for m in _dynamo_fixes.MISSES] == [
            (f"{inspect.getsourcefile(modeling)}:{line}", "the speed rule")]
    torch._dynamo.reset()
