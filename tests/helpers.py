"""Project-specific test helpers, on top of kda_inductor.testing (the pytest plugin's)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from kda_inductor.testing import (
    CompiledForTest,
    assert_close_in_range,
    assert_close_to_eager,
    assert_no_cudagraph_skips,
    compile_for_test,
    fresh_compile,
)

ON = {"kda": {"strict": True}}
"""The backend's default speed rules with a failing rewrite raised: what a user gets on CUDA (the
CUDA tests' options; on CPU the rules leave everything to Inductor)."""


def eager(fn, *args):
    """``fn(*args)`` as the compiled function runs it: under ``inference_mode``."""
    with torch.inference_mode():
        return fn(*args)


def clones(args):
    """Fresh copies of the tensors of ``args`` (the rest as they are): for a function that mutates
    its inputs (a cache), one copy for eager and one for the compiled call."""
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
device_params = pytest.mark.parametrize(
    "device", [pytest.param(d, marks=[pytest.mark.cuda] if d == "cuda" else []) for d in DEVICES]
)


@functools.cache
def stock_inductor_compiles_the_write() -> bool:
    """Whether this torch's stock Inductor lowers the reference cache write on CPU. Torch 2.9's
    cannot: its lowering of the scales' byte view raises "must be 1 to view Float as Byte"
    (the backend then compiles such a graph again with the rewrites forced)."""
    from kda_inductor.reference import cache_row_bytes, write_indexer_k

    for ue8m0 in (True, False):
        k, cache = torch.randn(3, 128), torch.zeros(2, 16, cache_row_bytes(128), dtype=torch.uint8)
        fn = torch.compile(lambda k, c, s, u=ue8m0: write_indexer_k(k, c, s, u), backend="inductor",
                           fullgraph=True, dynamic=False)
        try:
            with torch._inductor.config.patch(force_disable_caches=True):
                fn(k, cache, torch.arange(3))
        except torch._dynamo.exc.BackendCompilerFailed as exc:
            if "view Float as Byte" not in str(exc):
                raise
            return False
    return True


def compile_and_run(fn, *args, options: dict[str, Any] | None = None, **compile_kw):
    """Compile ``fn`` with the backend (strict unless ``options["kda"]`` says otherwise),
    caches off, run it once. Returns ``(result, matches)`` summed over graphs."""
    with fresh_compile():
        compiled = compile_for_test(fn, options=options, **compile_kw)
        out = compiled(*args)
    return out, compiled.matches


def assert_bytes_equal(actual, expected):
    """Bit-identical outputs (gathers and copies must be)."""
    assert_close_to_eager(tuple(actual), tuple(expected), exact=True)


EXAMPLE_LAYERS = ("gdn", "kda")
"""The tiny ``examples/gdn_layers.py`` layers :func:`example_layer_reduce_overhead` builds: Qwen3-Next's GDN
and Kimi Linear's KDA (a test parametrizes over these names)."""


def example_layer_reduce_overhead(kind: str, options: dict[str, Any], steps: int = 3) -> CompiledForTest:
    """Compile the tiny ``examples/gdn_layers.py`` layer ``kind`` (:data:`EXAMPLE_LAYERS`) on CUDA with
    ``mode="reduce-overhead"`` and ``options``, run ``steps`` new batches of the same
    shape, each close to eager (``assert_close_in_range``), with no cudagraph skip."""
    import gdn_layers as G

    cls, cfg = {"gdn": (G.Qwen3NextGDN, G.GDNConfig.tiny()), "kda": (G.KimiKDA, G.KDAConfig.tiny())}[kind]
    torch.manual_seed(0)
    layer = cls(cfg).cuda().eval()

    def run_steps():
        for step in range(steps):
            hidden, batch, states = G.make_inputs(layer, 3, 4, seed=step, device="cuda")
            args = (hidden, batch.spec_idx, batch.non_spec_idx, *states)
            assert_close_in_range(compiled(*args), layer(*args))

    with torch.no_grad(), fresh_compile():
        compiled = compile_for_test(layer, mode="reduce-overhead", options=options)
        assert_no_cudagraph_skips(run_steps)
    return compiled
