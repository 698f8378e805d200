"""gdn_spec_split: pattern, op and Triton kernel."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from kda_inductor.lowerings import gdn_spec_split as mod
from kda_inductor.testing import assert_close_to_eager, compile_for_test, fresh_compile
from tests.helpers import ON, device_params

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import gdn_layers as G  # noqa: E402

OFF = {"kda": {"disable": ["gdn_spec_split"], "strict": True}}


def _split(T, n_spec, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(T, generator=g)
    return perm[:n_spec].to(torch.int32).to(device), perm[n_spec:].to(torch.int32).to(device)


def _run(fn, *args, options):
    with fresh_compile():
        c = compile_for_test(fn, options=options)
        out = c(*args)
    return out, c


def _fused_sources(compiled) -> list[int]:
    """Sources per kda.gdn_spec_split launch, from the post-grad graphs."""
    counts = []
    for r in compiled.records:
        for row in r.after_nodes:
            if row.target == "kda.gdn_spec_split.default":
                counts.append(row.args.split("]")[0].count("%"))
    return counts


# --------------------------------------------------------------------------- examples
@pytest.mark.parametrize("build", [G.build_gdn, G.build_kda], ids=["gdn", "kda"])
def test_example_layers_one_launch_of_six(build):
    layer, args = build()
    with torch.no_grad():
        out_on, on = _run(layer, *args, options=ON)
        out_off, _ = _run(layer, *args, options=OFF)
    assert on.matches["gdn_spec_split"] == 1 and _fused_sources(on) == [6]
    # The gathers are bit-exact (tests below); downstream, Inductor now fuses the
    # consumers without the gather and may round differently (seen on torch 2.9: 1 ulp
    # in float32 states), so the layer is compared with each dtype's tolerance.
    assert_close_to_eager(out_on, out_off)


def test_on_by_default_and_can_be_disabled():
    layer, args = G.build_gdn()
    with torch.no_grad():
        _, default = _run(layer, *args, options=None)
        _, off = _run(layer, *args, options=OFF)
    assert default.matches["gdn_spec_split"] == 1
    assert off.matches["gdn_spec_split"] == 0


# --------------------------------------------------------------------------- group sizes
@device_params
@pytest.mark.parametrize("n", [2, 3, 5])
def test_groups_of_n_mixed_dtypes_and_widths(device, n):
    T = 37
    spec, non_spec = _split(T, 20, device, seed=n)
    srcs = [torch.randn(T, 64, device=device).to(torch.bfloat16),
            torch.randn(1, T, 4, device=device),
            torch.randn(1, T, 4, device=device).half()]

    def fn(a, b, c, s, ns):
        pool = [a.index_select(0, s), b.index_select(1, s), c[:, s], a[ns], b.index_select(1, ns)]
        return pool[:n]

    out, c = _run(fn, *srcs, spec, non_spec, options=ON)
    assert c.matches["gdn_spec_split"] == 1 and _fused_sources(c) == [n]
    assert_close_to_eager(out, fn(*srcs, spec, non_spec), exact=True)


@device_params
def test_int64_and_int32_indices(device):
    T = 16
    spec, non_spec = _split(T, 9, device)
    spec[0] -= T  # a negative index: x[idx] counts it from the end
    x, y = torch.randn(T, 8, device=device), torch.randn(1, T, 2, device=device)
    fn = lambda x, y, s, ns: (x[s], y[:, s], x[ns], y[:, ns])  # noqa: E731
    out, c = _run(fn, x, y, spec.long(), non_spec, options=ON)
    assert _fused_sources(c) == [4]
    assert_close_to_eager(out, fn(x, y, spec.long(), non_spec), exact=True)


def test_placement_splits_when_an_output_is_used_before_an_input_exists():
    """qkv's gathers feed work that g/beta's inputs depend on: two legal launches."""
    T = 24
    spec, non_spec = _split(T, 10, "cpu")
    qkv, w = torch.randn(T, 16), torch.randn(16, 3)

    def fn(qkv, w, s, ns):
        a, b = qkv.index_select(0, s), qkv.index_select(0, ns)
        g = torch.cat([a, b]) @ w  # g depends on the first two gathers' outputs
        g = g.T.unsqueeze(0)  # [1, 3, T]: not token-major, so transpose back
        g = g.transpose(1, 2).contiguous()  # [1, T, 3]
        return a, b, g.index_select(1, s), g.index_select(1, ns)

    out, c = _run(fn, qkv, w, spec, non_spec, options=ON)
    assert c.matches["gdn_spec_split"] == 2 and sorted(_fused_sources(c)) == [2, 2]
    assert_close_to_eager(out, fn(qkv, w, spec, non_spec), exact=True)


# --------------------------------------------------------------------------- must not match
def test_column_gather_is_not_a_token_gather():
    x = torch.randn(8, 12)
    idx = torch.tensor([3, 1, 0], dtype=torch.int32)
    fn = lambda x, i: (x[:, i], x.index_select(1, i))  # noqa: E731
    out, c = _run(fn, x, idx, options=ON)
    assert c.matches["gdn_spec_split"] == 0
    assert_close_to_eager(out, fn(x, idx), exact=True)


def test_index_mutated_later_is_not_fused():
    x, y = torch.randn(10, 4), torch.randn(10, 4)
    idx = torch.tensor([1, 5, 2], dtype=torch.int64)

    def fn(x, y, i):
        a, b = x[i], y[i]
        i.add_(1)
        return a, b

    out, c = _run(fn, x, y, idx.clone(), options=ON)
    assert c.matches["gdn_spec_split"] == 0
    assert_close_to_eager(out, fn(x, y, idx.clone()), exact=True)


def test_unrelated_indices_fuse_only_by_shared_index():
    T = 12
    a_idx, b_idx = _split(T, 5, "cpu")
    other = torch.tensor([0, 11, 4], dtype=torch.int32)
    x, y, z = torch.randn(T, 4), torch.randn(T, 6), torch.randn(T, 2)
    fn = lambda x, y, z, i, j: (x[i], y[i], z[j])  # noqa: E731  (j gathers another source)
    out, c = _run(fn, x, y, z, a_idx, other, options=ON)
    assert c.matches["gdn_spec_split"] == 1 and _fused_sources(c) == [2]
    assert_close_to_eager(out, fn(x, y, z, a_idx, other), exact=True)


# --------------------------------------------------------------------------- the op
def test_op_rejects_out_of_range_indices_on_cpu():
    x = torch.randn(6, 3)
    neg = torch.ops.kda.gdn_spec_split([x, x], [torch.tensor([-1, 0]), torch.tensor([-6])], [0, 0], [0, 1])
    assert_close_to_eager(neg, [x[[-1, 0]], x[[-6]]], exact=True)  # as x[idx] counts from the end
    with pytest.raises(IndexError, match=r"indices\[1\]: index 6 out of range \[-6, 6\)"):
        torch.ops.kda.gdn_spec_split([x, x], [torch.tensor([0]), torch.tensor([6])], [0, 0], [0, 1])
    with pytest.raises(ValueError, match=r"sources\[0\]: dims\[0\] = 1 must index a dim after only size-1"):
        torch.ops.kda.gdn_spec_split([x], [torch.tensor([0])], [1], [0])


def test_opcheck():
    T = 9
    s, ns = _split(T, 4, "cpu")
    x, g = torch.randn(T, 5), torch.randn(1, T, 3)
    torch.library.opcheck(torch.ops.kda.gdn_spec_split.default, ([x, g, x], [s, ns], [0, 1, 0], [0, 0, 1]))


HAS_KERNEL_RUNNER = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.skipif(not HAS_KERNEL_RUNNER or mod.triton is None, reason="no triton runner")
def test_triton_kernel_matches_index_select():
    from tests.test_lowering_indexer_k_gather import LAUNCHER_OK

    if not LAUNCHER_OK:
        pytest.skip("this Triton interpreter cannot run our kernels")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    T = 23
    s, ns = _split(T, 15, device, seed=4)
    s[3] -= T  # negative: counts from the end
    srcs = [torch.randn(T, 40, device=device).to(torch.bfloat16), torch.randn(T, 40, device=device).to(torch.bfloat16),
            torch.randn(1, T, 3, device=device), torch.randn(1, T, 3, device=device),
            torch.randn(1, T, 3, device=device).half(),
            torch.randn(1, T, 3, 2, device=device).half().transpose(2, 3)]  # rows not contiguous
    dims, which = [0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 0, 1]
    wrapped = [s % T, ns]
    expected = [src.index_select(d, wrapped[k]) for src, d, k in zip(srcs, dims, which)]
    outs = [torch.full_like(e, 3.0) for e in expected]  # poisoned
    mod.split_triton(srcs, [s, ns], dims, which, outs, block_w=16)
    assert_close_to_eager(outs, expected, exact=True)


# --------------------------------------------------------------------------- speed rule
def test_speed_rule_cpu_and_narrow_rows(monkeypatch):
    """Unforced: on CPU the split stays with Inductor (measured slower there), with the
    reason; on CUDA (the match's device reported as cuda here) a launch of narrow rows (two
    1-byte lookups of a flattened uint8 buffer: an indexer gather, not a split) stays with
    Inductor too, while the layer's rows are fused."""
    from kda_inductor.patterns import gdn_spec_split as pattern

    unforced = {"kda": {"strict": True, "force": False}}
    s, ns = _split(12, 9, "cpu", seed=5)
    qkv, flat = torch.randn(12, 64).bfloat16(), torch.randint(0, 255, (12,), dtype=torch.uint8)

    def wide(q, s, ns):
        return q.index_select(0, s), q.index_select(0, ns)

    def narrow(f, s, ns):
        return f[s.long()], f[ns.long()]

    out, c = _run(wide, qkv, s, ns, options=unforced)
    assert c.matches["gdn_spec_split"] == 0
    assert "left to Inductor: on cpu" in str(c.records[0].misses["gdn_spec_split"])
    monkeypatch.setattr(pattern.SplitMatch, "device", "cuda")
    out, c = _run(wide, qkv, s, ns, options=unforced)
    assert c.matches["gdn_spec_split"] == 1
    out, c = _run(narrow, flat, s, ns, options={"kda": {"strict": True}})  # forced: structurally no split
    assert c.matches["gdn_spec_split"] == 0 and c.records[0].misses["gdn_spec_split"] == []
    assert_close_to_eager(out, narrow(flat, s, ns), exact=True)
    rows = flat.view(12, 1)  # 1-byte token rows: a split, but narrower than any measured faster
    out, c = _run(narrow, rows, s, ns, options=unforced)
    assert c.matches["gdn_spec_split"] == 0
    assert "2 bytes per token" in str(c.records[0].misses["gdn_spec_split"])
    assert_close_to_eager(out, narrow(rows, s, ns), exact=True)


def test_speed_rule_one_sided_launch(monkeypatch):
    """On CUDA (the match's device reported as cuda here), a launch whose other index is
    statically empty (a pure prefill batch: no spec requests, size 0 specialized) stays with
    Inductor with the reason; the same code with both sets non-empty is fused."""
    from kda_inductor.patterns import gdn_spec_split as pattern

    unforced = {"kda": {"strict": True, "force": False}}
    monkeypatch.setattr(pattern.SplitMatch, "device", "cuda")
    qkv, g = torch.randn(12, 64).bfloat16(), torch.randn(1, 12, 4)

    def layer(q, g, s, ns):
        return (q.index_select(0, s), q.index_select(0, ns), g.index_select(1, s), g.index_select(1, ns))

    empty, everything = _split(12, 0, "cpu", seed=7)
    out, c = _run(layer, qkv, g, empty, everything, options=unforced)
    assert c.matches["gdn_spec_split"] == 0
    assert "only one index gathers rows" in str(c.records[0].misses["gdn_spec_split"])
    assert_close_to_eager(out, layer(qkv, g, empty, everything), exact=True)
    s, ns = _split(12, 4, "cpu", seed=7)
    out, c = _run(layer, qkv, g, s, ns, options=unforced)
    assert c.matches["gdn_spec_split"] == 1
    assert_close_to_eager(out, layer(qkv, g, s, ns), exact=True)
    monkeypatch.setattr(pattern, "ONE_SIDED_TO_INDUCTOR", False)  # the benchmark's switch
    out, c = _run(layer, qkv, g, empty, everything, options=unforced)
    assert c.matches["gdn_spec_split"] == 1


def test_speed_rule_gathers_that_only_feed_elementwise_code(monkeypatch):
    """On CUDA (the match's device reported as cuda here), a launch whose gathers all feed
    only elementwise code (a varlen conv's taps) stays with Inductor, which fuses the gathers
    into that code as indirect loads; one whose gathers are materialized anyway is fused."""
    from kda_inductor.patterns import gdn_spec_split as pattern

    unforced = {"kda": {"strict": True, "force": False}}
    monkeypatch.setattr(pattern.SplitMatch, "device", "cuda")
    s, ns = _split(12, 9, "cpu", seed=6)
    x, w = torch.randn(12, 64), torch.randn(64)

    def taps(x, w, s, ns):  # x[idx] * w + x[idx2]: elementwise consumers only
        return x.index_select(0, s) * w, (x.index_select(0, ns) + 1).sum(-1)

    out, c = _run(taps, x, w, s, ns, options=unforced)
    assert c.matches["gdn_spec_split"] == 0
    assert "only feeds elementwise code" in str(c.records[0].misses["gdn_spec_split"])
    assert_close_to_eager(out, taps(x, w, s, ns))


def _bailing_per_set_views(q, k, v, g1, beta, spec_idx, non_spec_idx, n: int):
    """vLLM BailingMoeV3 KDA's ten gathers, each set slicing its own ``x[:n]`` (one view node
    per set: Inductor does not CSE before our pass)."""
    outs = []
    for idx in (spec_idx, non_spec_idx):
        outs += [q[:n].index_select(0, idx), k[:n].index_select(0, idx), v[:n].index_select(0, idx),
                 g1[:, :n].index_select(1, idx), beta[:, :n].index_select(1, idx)]
    return outs


def test_ten_gathers_two_sets_one_launch(monkeypatch):
    """Ten gathers over two index sets are one launch of ten, also where each set gathers its
    own copy of a view (the sets pair by the value of their sources, not the node): forced,
    and by the CUDA speed rule (the match's device reported as cuda here), which before left
    each set to Inductor as a one-sided launch ("the other set is empty", though it was not)."""
    from kda_inductor.patterns import gdn_spec_split as pattern
    from tests.spellings.cases_gdn import _bailing_split_inputs, bailing_kda_split

    args = _bailing_split_inputs(3)
    for fn in (bailing_kda_split, _bailing_per_set_views):
        out, c = _run(fn, *args, options=ON)
        assert c.matches["gdn_spec_split"] == 1 and _fused_sources(c) == [10], fn.__name__
        assert_close_to_eager(out, fn(*args), exact=True)
    monkeypatch.setattr(pattern.SplitMatch, "device", "cuda")
    out, c = _run(_bailing_per_set_views, *args, options={"kda": {"strict": True, "force": False}})
    assert c.matches["gdn_spec_split"] == 1 and _fused_sources(c) == [10]
    assert c.records[0].misses["gdn_spec_split"] == []


def test_one_sided_launch_of_an_unpaired_index_says_so(monkeypatch):
    """A set no other index shares sources with is one-sided: on CUDA left to Inductor, with
    that reason (not "the other set is empty") at the user's line; forced, one launch."""
    from kda_inductor.patterns import gdn_spec_split as pattern

    s, ns = _split(12, 4, "cpu", seed=8)
    a, b, c_ = torch.randn(12, 64).bfloat16(), torch.randn(1, 12, 8), torch.randn(12, 32)

    def fn(a, b, c_, s, ns):
        return a.index_select(0, s), b.index_select(1, s), c_.index_select(0, ns)

    out, c = _run(fn, a, b, c_, s, ns, options=ON)
    assert c.matches["gdn_spec_split"] == 1 and _fused_sources(c) == [2]
    monkeypatch.setattr(pattern.SplitMatch, "device", "cuda")
    out, c = _run(fn, a, b, c_, s, ns, options={"kda": {"strict": True, "force": False}})
    assert c.matches["gdn_spec_split"] == 0
    misses = [str(m) for m in c.records[0].misses["gdn_spec_split"]]
    why = "no other index gathers the same tensors"
    assert any("test_gdn_spec_split.py:" in m and why in m for m in misses), misses
    assert_close_to_eager(out, fn(a, b, c_, s, ns), exact=True)
