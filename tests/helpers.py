"""Helpers shared by the test files: compile with the backend and count rewrites."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from kda_inductor import pass_manager

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
device_params = pytest.mark.parametrize(
    "device", [pytest.param(d, marks=[pytest.mark.cuda] if d == "cuda" else []) for d in DEVICES]
)


@contextlib.contextmanager
def fresh_compile():
    """Caches off and Dynamo reset, so every compile runs our pass."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        yield
    torch._dynamo.reset()


def compile_and_run(fn, *args, options: dict[str, Any] | None = None, **compile_kw):
    """Compile ``fn`` with the backend (strict by default), run it once.

    Returns ``(result, matches)`` where ``matches`` sums every graph's counts.
    """
    options = dict(options or {})
    options.setdefault("kda", {"strict": True})
    with fresh_compile(), pass_manager.observe() as records:
        out = torch.compile(fn, backend="kda_inductor", options=options, **compile_kw)(*args)
    matches: dict[str, int] = {}
    for r in records:
        for k, v in r["matches"].items():
            matches[k] = matches.get(k, 0) + v
    return out, matches


def as_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.uint8)


def assert_bytes_equal(actual, expected):
    for a, e in zip(actual, expected, strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype, (a.shape, a.dtype, e.shape, e.dtype)
        assert torch.equal(as_bytes(a).cpu(), as_bytes(e).cpu()), "bytes differ"


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["inductor"].get(k, 0) for k in ("cudagraph_skips",))


def assert_capturable_without_syncs(fn, *args):
    """``fn`` (already compiled and warmed up) runs with no host sync and can be
    captured in ``torch.cuda.graph``; the replay gives the same bytes as a call."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        expected = fn(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(*args)
    graph.replay()
    torch.cuda.synchronize()
    assert_bytes_equal(captured, expected)
    return graph, captured
