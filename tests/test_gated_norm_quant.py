"""``gated_norm_quant``: vLLM's gated RMSNorm (``RMSNormGated.forward_native``) followed by its
dynamic fp8 quantization (``QuantFP8.forward_native``: per group of 128 with optional ue8m0
scales, or per token), as vLLM traces a GDN layer's output projection for FP8 checkpoints
(written here from vLLM's source). Compiled with the backend: exact match counts, scales
bit-exact and values within one fp8 step of eager; what must not match (a static scale, a group
that does not divide the head, the norm's output also read in bf16); the speed rule's reason."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from kda_inductor.testing import compile_for_test
from tests.helpers import fresh_compile

H, D = 2, 128
FP8_MAX, MIN_SCALE = 448.0, 1.0 / (448.0 * 512.0)


def gated_norm(x, z, weight, eps=1e-6):  # RMSNormGated.forward_native (vLLM's forward_static)
    dtype = x.dtype
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    return (out * F.silu(z.float())).to(dtype).flatten(-2)


def group_quant(x, group=128, ue8m0=False):  # QuantFP8._quantize_group_native, no padding
    xg = x.view(-1, x.shape[-1] // group, group)
    absmax = xg.abs().max(dim=-1, keepdim=True)[0].float()
    s = absmax / FP8_MAX
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    s = s.clamp(min=MIN_SCALE)
    q = (xg / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(-1, x.shape[-1]), s.squeeze(-1)


def token_quant(x):  # QuantFP8.forward_native, dynamic per-token scale
    x_max = x.abs().max(dim=-1)[0].unsqueeze(-1).to(torch.float32)
    s = (x_max / FP8_MAX).clamp(min=MIN_SCALE)
    q = (x.to(torch.float32) * s.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, s


def _inputs(T=6, seed=0, h=H, d=D):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, h, d, generator=g).to(torch.bfloat16)
    proj = torch.randn(T, 2 * h * d, generator=g).to(torch.bfloat16)
    return x, proj[:, h * d:].view(T, h, d), (1 + 0.1 * torch.randn(d, generator=g)).to(torch.bfloat16)


def _close(got, want):
    """Scales bit-exact; values within one fp8 step of eager's."""
    (q, s), (qe, se) = got, want
    assert torch.equal(s, se), (s - se).abs().max()
    a, e = q.float(), qe.float()
    step = torch.pow(2.0, torch.floor(torch.log2(e.abs().clamp(min=2.0**-6))) - 3)
    assert q.shape == qe.shape and bool(((a - e).abs() <= step).all()), (a - e).abs().max()


def _run(fn, *args, force=True):
    with fresh_compile():
        c = compile_for_test(fn, force=force)
        with torch.inference_mode():
            out = c(*args)
    return out, c


CASES = {
    "group 128": lambda x, z, w: group_quant(gated_norm(x, z, w)),
    "group 128, ue8m0": lambda x, z, w: group_quant(gated_norm(x, z, w), ue8m0=True),
    "per token": lambda x, z, w: token_quant(gated_norm(x, z, w)),
}


@pytest.mark.parametrize("case", CASES)
def test_norm_then_quant_is_one_op(case):
    fn = CASES[case]
    args = _inputs(seed=len(case))
    out, c = _run(fn, *args)
    assert (c.matches["gated_norm_quant"], c.matches["gated_norm_merge"]) == (1, 0), c.diff()
    assert "kda.gated_norm_quant" in c.records[0].after
    for seed in (1, 2):  # fresh inputs through the compiled graph
        args = _inputs(seed=seed)
        with torch.inference_mode():
            _close(c(*args), fn(*args))
    _close(out, fn(*_inputs(seed=len(case))))


def test_cpu_rule_leaves_it_to_inductor():
    """Unforced on CPU: the speed rule leaves it (the op is the norm op then the quantization op
    by op); the norm alone is then the gated_norm_merge rule's (on CPU: left too), and explain()
    says why at the quant's line."""
    _, c = _run(CASES["group 128"], *_inputs(), force=False)
    assert c.matches["gated_norm_quant"] == 0
    assert "on cpu the op runs the norm op" in str(c.records[0].misses["gated_norm_quant"])


def test_speed_rule_reads_the_measured_verdicts():
    """``faster_than_inductor`` on a made-up table: a static count fires where the measured
    counts around it were faster (outside the measured counts: not measured), a symbolic count
    where the symbolic graph was never slower; an unmeasured width fires only between two
    measured widths that both fire; another kind of shape is not measured."""
    from kda_inductor.patterns.gated_norm_quant import Measured, Shape, faster_than_inductor

    plain = Shape(False, 4096, False)
    table = {plain: Measured(faster=(1, 256, 16384), slower=(16,), symbolic=False),
             plain._replace(width=2048): Measured(faster=(1, 16, 256, 16384), slower=(), symbolic=True),
             plain._replace(width=8192): Measured(faster=(16, 256), slower=(1,), symbolic=True)}
    rule = lambda shape, T: faster_than_inductor(table, shape, T)  # noqa: E731
    assert rule(plain, 1) is None and rule(plain, 256) is None and rule(plain, 16384) is None
    assert "not measured at T=100000" in rule(plain, 100000)  # no extrapolation past the largest
    assert "slower than Inductor's code at T=16" in rule(plain, 16) and "T=16" in rule(plain, 100)
    assert "symbolic" in rule(plain, None) and rule(plain._replace(width=2048), None) is None
    assert rule(plain._replace(width=3072), 256) is None  # 2048 and 4096 both faster there
    assert "4096 values per token: slower" in rule(plain._replace(width=3072), 16)
    assert "8192" in rule(plain._replace(width=6144), 1)  # 8192 is slower at T=1
    assert "not measured at 16384 values" in rule(plain._replace(width=16384), 256)
    assert "not measured" in rule(Shape(True, 4096, False), 256)
    assert "not measured" in rule(Shape(False, 4096, True), 256)


def vllm_norm_fp32_weight(x, z, weight, eps=1e-6):
    """vLLM's ``RMSNormGated.forward_static`` as Qwen3.5-FP8 runs it: the norm's weight float32,
    its input and gate bf16 (vLLM #45770: its RMSNorm + quant fusion skips such mixed dtypes)."""
    dtype = x.dtype
    xf, w, zf = x.float(), weight.float(), z.float()  # weight.float() is a no-op here
    out = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * w
    return (out * F.silu(zf)).to(dtype).flatten(-2)


@pytest.mark.parametrize("quant", ["group 128", "per token"])
def test_fp32_weight_bf16_input_is_one_op_and_exact(quant):
    """The mixed-dtype spelling is the same well-defined function (float32 math whatever the
    weight's dtype, the output rounded to the input's bf16): rewritten, the op reading the
    float32 weight as it is (no cast of it in the graph), scales exact, values within one fp8
    step of eager on fresh inputs."""
    q = group_quant if quant == "group 128" else token_quant
    fn = lambda x, z, w: q(vllm_norm_fp32_weight(x, z, w))  # noqa: E731

    def inputs(seed):
        x, z, w = _inputs(seed=seed)
        return x, z, (w.float() + 0.01 * torch.randn(D, generator=torch.Generator().manual_seed(seed)))

    out, c = _run(fn, *inputs(5))
    assert (c.matches["gated_norm_quant"], c.matches["gated_norm_merge"]) == (1, 0), c.diff()
    call = re.search(r"kda\.gated_norm_quant\.default\]\(args = \((\[[^]]*\]), (\[[^]]*\]), (%\w+), (%\w+)",
                     c.records[0].after)
    # the weight argument is a graph input (the float32 weight as it is), not a cast of it
    assert call and re.fullmatch(r"%arg\d+_1", call.group(4)), c.records[0].after
    _close(out, fn(*inputs(5)))
    for seed in (6, 7):
        args = inputs(seed)
        with torch.inference_mode():
            _close(c(*args), fn(*args))


def static_scale(x, z, w):
    y = gated_norm(x, z, w)
    return (y.float() / 0.05).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def read_in_bf16_too(x, z, w):
    y = gated_norm(x, z, w)
    return group_quant(y), y


@pytest.mark.parametrize("fn, why", [
    (static_scale, "scale"),
    (read_in_bf16_too, "also read elsewhere"),
])
def test_what_must_not_match(fn, why):
    args = _inputs(seed=3)
    out, c = _run(fn, *args)
    assert c.matches["gated_norm_quant"] == 0
    assert c.matches["gated_norm_merge"] == 1  # the norm alone, forced
    assert why in str(c.records[0].misses["gated_norm_quant"])


def test_group_that_does_not_divide_the_head_is_not_matched():
    """Heads of 64, groups of 96 (192 values per token): a group straddles two heads."""
    args = _inputs(seed=4, h=3, d=64)
    _, c = _run(lambda x, z, w: group_quant(gated_norm(x, z, w), group=96), *args)
    assert c.matches["gated_norm_quant"] == 0
    assert "do not divide" in str(c.records[0].misses["gated_norm_quant"])


def test_benchmark_smoke(capsys):
    """benchmarks/bench_gated_norm_quant.py's sweep on CPU (two of its cases): every system
    compared, kda's check ok and its compiles rewrote once (a failed check exits 1), the default
    rules compiled (on CPU they leave it)."""
    from benchmarks import bench_gated_norm_quant as bench

    rows = bench.main(["--smoke", "--cases", f"vllm H=32,{bench.MODEL_SHAPE}"])
    assert [(r["case"], r["T"], r["mode"]) for r in rows] == [
        ("vllm H=2", 2, "symbolic"), ("vllm H=2", 8, "symbolic"), ("vllm H=2", 1, "static"),
        (bench.MODEL_SHAPE, 8, "symbolic")]
    assert all(r["check"] == "ok" and r["kda_us"] > 0 and "stock_vs_eager" in r for r in rows)
    assert rows[0]["kda_fired"] == 1 and rows[0]["default_fired"] == 0 and "kda_fired" not in rows[1]
    assert "NOT meaningful" in capsys.readouterr().out


def test_benchmark_lean_plan_reaches_the_large_static_sizes():
    """``--lean`` (the GPU command that times symbolic and static T within ~3 minutes): the
    symbolic graph from T = 256, then the static sizes largest first (the budget cut 4096 / 16384
    last time), stock and kda only; the full plan unchanged."""
    from benchmarks import bench_gated_norm_quant as bench

    case = bench.CASES[0]
    lean = [(j.mode, j.sizes) for j in bench.plan([case], quick=False, smoke=False, lean=True)]
    assert lean == [("symbolic", (256, 1024, 4096, 16384)), ("static", (16384,)), ("static", (4096,)),
                    ("static", (1024,)), ("static", (256,))]
    full = [(j.mode, j.sizes) for j in bench.plan([case], quick=False, smoke=False)]
    assert full[0] == ("symbolic", bench.T_VALUES) and [s for _, s in full[1:]] == [(t,) for t in bench.STATIC_T]
    r = bench.Run("cpu", None, None, False, None, lean=True)
    assert bench.variants(case, r, True) == bench.variants(case, r, False) == ["stock", "kda"]


def test_benchmark_check_and_verdicts_can_fail():
    """The benchmark's kda check passes IEEE's own output and fails a scale moved beyond one
    bf16 ulp of the amax or a value two fp8 steps off; its verdicts follow the rows."""
    from benchmarks import bench_gated_norm_quant as bench
    from kda_inductor.patterns.gated_norm_quant import Measured, Shape

    case = bench.CASES[0]._replace(H=2)
    args = bench.inputs(case, 4, "cpu")
    exact = bench.vllm_group_fp8(*args, exact=True)
    y = bench.norm_output(case, args)
    assert bench.kda_check(exact, exact, y, False) == "ok"
    q, s = exact
    assert bench.kda_check((q, s * (1 + 2.0**-6)), exact, y, False).startswith("FAIL: 8 scales")
    bumped = (q.float() * 1.3).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert "values up to" in bench.kda_check((bumped, s), exact, y, False)
    rows = [{"case": "vllm H=32", "T": t, "mode": m, "kda_us": k, "stock_us": 2.0}
            for t, m, k in ((1, "static", 1.0), (16, "static", 3.0), (1, "symbolic", 2.05), (16, "symbolic", 1.0))]
    want = {Shape(False, 4096, False): Measured(faster=(1,), slower=(16,), symbolic=True)}
    assert bench.verdicts(rows) == want
    assert eval(bench.measured_literal(want).split(" = ", 1)[1], {"Shape": Shape, "Measured": Measured}) == want
    rows[2]["kda_us"] = 2.1  # 5% slower: no longer "never slower"
    assert bench.verdicts(rows)[Shape(False, 4096, False)].symbolic is False
    assert bench.verdicts(rows[:2])[Shape(False, 4096, False)].symbolic is False  # not measured symbolic


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_example_layer_with_an_fp8_output_projection(kind):
    """The example GDN / KDA layer with ``Fp8Linear`` as its output projection: the merge, the
    gated norm and the projection's input quantization become one op (forced); the split is
    untouched; the step stays close to eager (the fp8 matmul's inputs within one fp8 step)."""
    import gdn_layers as G

    torch.manual_seed(0)
    layer = G.Qwen3NextGDN(G.GDNConfig.tiny()) if kind == "gdn" else G.KimiKDA(G.KDAConfig.tiny())
    layer.out_proj = G.Fp8Linear.from_linear(layer.out_proj, group=layer.head_v)
    hidden, batch, states = G.make_inputs(layer, 2, 3, seed=1)
    args = (hidden, batch.spec_idx, batch.non_spec_idx, *states)
    with torch.inference_mode():
        want = layer(*[a.clone() for a in args])
    with fresh_compile():
        c = compile_for_test(layer)
        with torch.inference_mode():
            got = c(*[a.clone() for a in args])
    assert (c.matches["gated_norm_quant"], c.matches["gated_norm_merge"], c.matches["gdn_spec_split"]) == (1, 0, 1)
    torch.testing.assert_close(got[0].float(), want[0].float(), rtol=0.1, atol=0.1)


def _two_norms(x, z, w):
    """One norm read by a quantization, one read in bf16: one gated_norm_quant, one gated_norm_merge."""
    return group_quant(gated_norm(x, z, w)), gated_norm(x * 2, z, w)


@pytest.mark.parametrize("fn, want", [(_two_norms, (1, 1)), (lambda x, z, w: gated_norm(x, z, w), (0, 1))],
                         ids=["quant-and-norm", "no-fp8-cast"])
def test_the_norm_search_runs_once_per_graph(fn, want, monkeypatch):
    """Both rewrites read the norms from the framework's one ``gated_norms`` analysis: the
    matcher searches each graph once (gated_norm_quant first, gated_norm_merge after it takes
    what is left); a graph with no fp8 cast is searched by gated_norm_merge alone."""
    from kda_inductor.patterns import _merged_norms as shared

    searches = []
    search = shared._Searcher.search
    monkeypatch.setattr(shared._Searcher, "search", lambda self, g: searches.append(g) or search(self, g))
    args = _inputs(seed=5)
    out, c = _run(fn, *args)
    assert (c.matches["gated_norm_quant"], c.matches["gated_norm_merge"]) == want, c.diff()
    assert len(searches) == len(c.records) == 1
    if want == (1, 1):
        _close(out[0], fn(*args)[0])
        torch.testing.assert_close(out[1], fn(*args)[1])


def test_dynamic_true_keeps_the_norm_and_says_why_not_the_quant():
    """Under ``dynamic=True`` Dynamo makes the quantization's Python floats (448, the floor)
    graph inputs: the op's formula needs constants, so the quantization stays with Inductor and
    the miss says that at the user's line (not "another divisor"); the norm, with its heads
    symbolic too, is still one ``gated_norm_merge`` (the output's reshape reads the size inputs);
    one graph for every T, close to eager."""
    fn = CASES["group 128"]
    with fresh_compile():
        c = compile_for_test(fn, dynamic=True)
        with torch.inference_mode():
            for T, seed in ((5, 1), (9, 2)):
                args = _inputs(T=T, seed=seed, h=3)
                _close(c(*args), fn(*args))
    assert len(c.records) == 1
    assert (c.matches["gated_norm_quant"], c.matches["gated_norm_merge"]) == (0, 1)
    (miss,) = c.records[0].misses["gated_norm_quant"]
    assert "is a graph input here, not a constant: dynamic=True" in miss.check
    assert miss.location and "test_gated_norm_quant.py" in miss.location


def _spied_calls(monkeypatch) -> list[tuple]:
    """The op's calls on real tensors, each its arguments as the CPU impl gets them (read at its
    ``validate``; the fake impl's calls while compiling are left out)."""
    from torch._subclasses.fake_tensor import FakeTensor

    from kda_inductor.lowerings import gated_norm_quant as L

    calls, validate = [], L.validate

    def spy(*args, **kw):
        if not isinstance(args[2], FakeTensor):
            calls.append((args, kw))
        return validate(*args, **kw)
    monkeypatch.setattr(L, "validate", spy)
    return calls


def _plan(call):
    """The Triton launch (``launch_plan``) of one spied call: grid, tile rows, warps."""
    from kda_inductor.lowerings import gated_norm_quant as L

    (sources, indices, z, w, eps, act, form, rsqrt, n, _, _, group, *_), kw = call
    p = L.launch_plan(sources, indices, z, w, eps=eps, activation=act, form=form, rsqrt=rsqrt, num_tokens=n,
                      group_size=group, in_dtype=kw.get("in_dtype"))
    return p.grid, p.block_r, p.num_warps, (p.row_group, p.group)


SIZES = (16, 24, 5, 64)


def _run_sizes(fn, dynamic: bool, calls: list) -> tuple[object, list]:
    """``fn`` compiled (forced) with T marked dynamic (one graph) or static (a graph per T),
    run at each of ``SIZES`` against eager; the op's launch at each T."""
    plans = []
    with fresh_compile():
        c = compile_for_test(fn, dynamic=None if dynamic else False)
        for T in SIZES:
            x, z, w = _inputs(T=T, seed=T, h=4)
            if dynamic:
                for t in (x, z):
                    torch._dynamo.maybe_mark_dynamic(t, 0)
            with torch.inference_mode():
                _close(c(x, z, w), fn(x, z, w))
            plans.append(_plan(calls[-1]))
    return c, plans


needs_triton = pytest.mark.skipif(__import__("kda_inductor.lowerings._triton", fromlist=["triton"]).triton is None,
                                  reason="the launch plan needs triton")


@needs_triton
@pytest.mark.parametrize("case", CASES)
def test_symbolic_tokens_launch_as_static_ones(case, monkeypatch):
    """T marked dynamic (vLLM's way): one graph, rewritten once, exact against eager at every T,
    and the op gets the tokens as ``[T, H * D]`` (the quantizer's), as the static graphs do: the
    Triton launch at each T is the static graph's (it ran 2x slower than stock Inductor on the
    H200 when the symbolic graph passed ``[T * H, D]``, one norm row a token; per-token scales
    then fell back to the unfused code)."""
    fn = CASES[case]
    calls = _spied_calls(monkeypatch)
    c, symbolic = _run_sizes(fn, True, calls)
    assert len(c.records) == 1 and c.matches["gated_norm_quant"] == 1, c.diff()
    assert all(call[0][0][0].shape[1] == 4 * D for call in calls)  # sources [T, H * D]
    assert [call[0][8] for call in calls] == list(SIZES)  # num_tokens: T
    c, static = _run_sizes(fn, False, calls)
    assert len(c.records) == len(SIZES) and c.matches["gated_norm_quant"] == len(SIZES)
    assert symbolic == static
    assert all(p[3][0] == (4 if case == "per token" else 1) for p in static)  # in the kernel, no fallback


def merged_group_quant(o_s, o_ns, s_idx, ns_idx, z, w):
    """The hybrid layer's tail: both halves ``index_copy_``-ed into a fresh buffer, the norm, the
    group quantization."""
    out = torch.empty(s_idx.shape[0] + ns_idx.shape[0], *o_s.shape[1:], dtype=o_s.dtype)
    out.index_copy_(0, s_idx, o_s)
    out.index_copy_(0, ns_idx, o_ns)
    return group_quant(gated_norm(out, z, w))


def _merged_inputs(T: int, seed: int, h: int = 4):
    x, z, w = _inputs(T=T, seed=seed, h=h)
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(seed))
    k = T * 3 // 4
    return x[:k].clone(), x[k:].clone(), perm[:k], perm[k:], z, w


@needs_triton
def test_symbolic_merge_launches_as_static_ones(monkeypatch):
    """The merge in front (spec / non-spec halves), T marked dynamic: one graph, exact against
    eager, and the same launch as the static graphs (the sources are the halves' token rows
    either way)."""
    calls = _spied_calls(monkeypatch)
    plans = {}
    for dynamic in (True, False):
        with fresh_compile():
            c = compile_for_test(merged_group_quant, dynamic=None if dynamic else False)
            for T in (8, 12, 20):
                args = _merged_inputs(T, seed=T)
                if dynamic:
                    for t in args[:5]:
                        torch._dynamo.maybe_mark_dynamic(t, 0)
                with torch.inference_mode():
                    _close(c(*args), merged_group_quant(*args))
                plans.setdefault(dynamic, []).append(_plan(calls[-1]))
        assert (len(c.records), c.matches["gated_norm_quant"]) == ((1, 1) if dynamic else (3, 3)), c.diff()
    assert plans[True] == plans[False]
