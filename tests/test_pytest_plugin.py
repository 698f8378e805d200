"""The pytest plugin (pytest11 entry point) and kda_inductor.testing, used as a user would."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from kda_inductor.testing import assert_close_to_eager, max_ulps

USER_TEST = '''
import pytest, torch
from kda_inductor.reference import gather_indexer_k, random_indexer_cache
from kda_inductor.testing import assert_close_to_eager, assert_rewrites
from graph_targets import interleaved

def inputs():
    g = torch.Generator().manual_seed(0)
    return random_indexer_cache([5, 40, 0, 33], 16, 128, generator=g)

@pytest.mark.kda_expect(indexer_k_gather=1)
def test_marker_holds(kda_compile):
    cache, table, cu, n = inputs()
    fn = lambda c, t, s: gather_indexer_k(c, t, s, n)
    out = kda_compile(fn)(cache, table, cu)
    assert_close_to_eager(out, fn(cache, table, cu))

@pytest.mark.kda_expect(indexer_k_gather=2)
def test_marker_fails_with_diff(kda_compile):
    cache, table, cu, n = inputs()
    kda_compile(lambda c, t, s: gather_indexer_k(c, t, s, n))(cache, table, cu)

def test_helper_fails_with_diff(kda_compile):
    cache, table, cu, n = inputs()
    compiled = kda_compile(lambda c, t, s: gather_indexer_k(c, t, s, n), options={"kda": {"disable": ["indexer_k_gather"]}})
    compiled(cache, table, cu)
    assert_rewrites(compiled, expect={"indexer_k_gather": 1})

@pytest.mark.kda_expect(indexer_k_gather=1)
def test_misses_at_user_line(kda_compile):
    fn, args, _ = interleaved()
    kda_compile(fn)(*args)

class WithParam(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.n = n
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, c, t, s):
        values, scales = gather_indexer_k(c, t, s, self.n)
        return values, scales * self.scale

@pytest.mark.kda_expect(indexer_k_gather=1)
def test_traced_with_grad(kda_compile):
    cache, table, cu, n = inputs()
    kda_compile(WithParam(n))(cache, table, cu)

@pytest.mark.kda_expect(indexer_k_gathr=1)
def test_bad_marker_name(kda_compile):
    print("BODY RAN")
    kda_compile(lambda x: x + 1)(torch.ones(2))

@pytest.mark.cuda
def test_needs_gpu():
    assert torch.cuda.is_available()
'''


def test_plugin_fixture_markers_and_failure_messages(pytester):
    pytester.makepyfile(test_user=USER_TEST, graph_targets=Path(__file__).with_name("graph_targets.py").read_text())
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    expected_skips = 0 if torch.cuda.is_available() else 1
    assert outcomes.get("passed", 0) == 1 + (1 - expected_skips)
    assert outcomes.get("failed") == 4 and outcomes.get("skipped", 0) == expected_skips
    assert outcomes.get("errors") == 1
    text = result.stdout.str()
    # both count failures carry the rewrite table and the graph diff
    assert "expected {'indexer_k_gather': 2}, got {'indexer_k_gather': 1}" in text
    assert "expected {'indexer_k_gather': 1}, got {'indexer_k_gather': 0}" in text
    assert "+indexer_k_gather_0 = kda.indexer_k_gather.default" in text
    assert "graph 0 before kda_inductor" in text
    # a miss says why, at the user's line; a graph traced with grad enabled says so
    assert re.search(r"indexer_k_gather: 1 fewer match\(es\); closest candidates not rewritten:\n"
                     r"\s+\S*graph_targets\.py:\d+: not rewritten: indices differ", text), text
    assert "not rewritten: this graph was traced with grad enabled" in text
    assert "our pass changed nothing in the 1 compiled graph(s)" in text
    # an unknown name fails at setup, before the body compiles anything
    assert "ERROR at setup of test_bad_marker_name" in text and "unknown rewrite(s) ['indexer_k_gathr']" in text
    assert "BODY RAN" not in text
    # no plugin internals, no torch trace records, no caches-off warnings
    assert "pytest_plugin.py" not in text and "kda_inductor/testing.py" not in text
    assert "torch.__trace" not in text and "dynamo_pgo" not in text
    if expected_skips:
        assert "needs a CUDA GPU" in pytester.runpytest_subprocess("-rs", "-k", "needs_gpu").stdout.str()


@pytest.mark.parametrize(
    "dtype, bump, should_pass",
    [
        (torch.float32, 1e-7, True),
        (torch.float32, 1e-3, False),
        (torch.bfloat16, 2 ** -8, True),  # within two bf16 ulps of 1.0
        (torch.bfloat16, 2 ** -5, False),
        (torch.int64, 0, True),
        (torch.int64, 1, False),
    ],
)
def test_close_to_eager_tolerance_per_dtype(dtype, bump, should_pass):
    base = torch.ones(64, dtype=torch.float64)
    expected = base.to(dtype)
    actual = (base + bump).to(dtype)
    if should_pass:
        assert_close_to_eager((actual, [actual]), (expected, [expected]))
    else:
        with pytest.raises(AssertionError):
            assert_close_to_eager((actual, [actual]), (expected, [expected]))


def test_close_to_eager_fp8_and_exact_are_bitwise():
    x = torch.randn(32).to(torch.float8_e4m3fn)
    assert_close_to_eager(x, x.clone())
    y = x.view(torch.uint8).clone()
    y[3] ^= 1
    with pytest.raises(AssertionError, match="differ in 1 of 32 bytes"):
        assert_close_to_eager(y.view(torch.float8_e4m3fn), x)
    with pytest.raises(AssertionError, match="bytes"):
        assert_close_to_eager(torch.ones(4), torch.ones(4) + 1e-7, exact=True)


def test_close_to_eager_compares_nans_by_bytes():
    """float32 scales read from random cache bytes hold NaNs: the same bytes pass."""
    bits = torch.randint(-2**31, 2**31 - 1, (64,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    bits[[3, 9, 40]] = torch.tensor([0x7FC00000, 0x7F800001, -1], dtype=torch.int32)  # three NaN payloads
    scales = bits.view(torch.float32)
    assert scales.isnan().sum() >= 3
    assert_close_to_eager((scales, scales.to(torch.bfloat16)), (scales.clone(), scales.to(torch.bfloat16)))
    number = scales.clone()
    number[9] = 1.0
    with pytest.raises(AssertionError, match=r"output 0: torch.float32: NaN where eager has a number at 1 of 64 "
                                             r"position\(s\); first at index \(9,\): got nan, eager 1.0"):
        assert_close_to_eager((scales, scales), (number, scales))
    with pytest.raises(AssertionError, match=r"a number where eager has NaN at 1 of 64 position\(s\); first at "
                                             r"index \(9,\): got 1.0, eager nan"):
        assert_close_to_eager(number, scales)
    payload = bits.clone()
    payload[40] = 0x7FC00000
    with pytest.raises(AssertionError, match=r"1 of \d+ NaN\(s\) have other bit patterns than eager's"):
        assert_close_to_eager(payload.view(torch.float32), scales)


class _SmallBf16Model(torch.nn.Module):
    """RMSNorm, SwiGLU MLP, residual: a transformer block's MLP half."""

    def __init__(self, d: int = 64):
        super().__init__()
        self.norm = torch.nn.RMSNorm(d)
        self.up = torch.nn.Linear(d, 2 * d, bias=False)
        self.down = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        a, b = self.up(self.norm(x)).chunk(2, -1)
        return x + self.down(torch.nn.functional.silu(a) * b)


def test_close_to_eager_default_bf16_tolerance_passes_stock_inductor():
    """Inductor keeps fused intermediates in float32 where eager rounds each op to bf16:
    torch.testing's bf16 atol (1e-5) fails this; one bf16 step at the output's scale does not."""
    torch.manual_seed(0)
    model = _SmallBf16Model().to(torch.bfloat16).eval()
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    torch._dynamo.reset()
    with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
        got, want = torch.compile(model, backend="inductor")(x), model(x)
    torch._dynamo.reset()
    assert not torch.equal(got, want)  # the two round differently
    with pytest.raises(AssertionError, match="not close"):
        torch.testing.assert_close(got, want)
    assert_close_to_eager(got, want)
    # real errors still fail: an indexing bug, an element near 0 off by 2% of the scale, the
    # largest off by 8 bf16 steps (3.4%; torch.testing's rtol alone allows up to 4 near 3.75)
    with pytest.raises(AssertionError, match="not close"):
        assert_close_to_eager(got.roll(1, 0), want)
    near_zero = got.clone().view(-1)
    near_zero[want.abs().argmin()] += 0.02 * float(want.abs().max())
    steps = got.clone().view(-1).view(torch.int16)
    steps[want.abs().argmax()] += 8  # 8 representable values away from 0
    for bad in (near_zero, steps.view(torch.bfloat16)):
        with pytest.raises(AssertionError, match="not close"):
            assert_close_to_eager(bad.view_as(want), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_max_ulps_counts_representable_steps(dtype):
    x = torch.randn(64).to(dtype).abs() + 1
    inf = torch.tensor(float("inf"), dtype=dtype)
    one_up = torch.nextafter(x, inf)
    assert max_ulps(x, x) == 0
    assert max_ulps(one_up, x) == 1
    assert max_ulps(torch.nextafter(one_up, inf), x) == 2
    with pytest.raises(TypeError, match="bf16 or two fp16"):
        max_ulps(x.float(), x.float())
