"""gated_norm_merge on CUDA: CUDA-graph safety, no host syncs (skipped without a GPU)."""

from __future__ import annotations


import pytest
import torch

from kda_inductor.testing import (
    assert_cudagraph_safe,
    compile_for_test,
    fresh_compile,
    max_ulps,
)

from tests.helpers import EXAMPLE_LAYERS, ON, example_layer_reduce_overhead  # noqa: E402

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU


@pytest.mark.parametrize("kind", EXAMPLE_LAYERS)
def test_reduce_overhead_no_cudagraph_skips(kind):
    assert example_layer_reduce_overhead(kind, ON).matches["gated_norm_merge"] == 1


def test_graph_capture_no_host_syncs_and_two_ulps():
    from tests.test_gated_norm_merge import _inputs, _layer_tail, fla

    args = [t.cuda() for t in _inputs(T=40, n_spec=30, seed=3)]
    fn = _layer_tail(fla)
    with fresh_compile():
        compiled = compile_for_test(fn, options=ON)
        out = compiled(*args)
        assert compiled.matches["gated_norm_merge"] == 1
        assert max_ulps(out, fn(*args)) <= 2
        graph = assert_cudagraph_safe(compiled, *args)
        args[0].copy_(torch.randn_like(args[0]))  # new data in the same buffers
        graph.replay()
        torch.cuda.synchronize()
        assert max_ulps(graph.captured, fn(*args)) <= 2
