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
