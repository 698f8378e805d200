"""indexer_k_gather on CUDA: CUDA-graph safety of the compiled code (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from kda_inductor.reference import gather_indexer_k, random_indexer_cache
from kda_inductor.testing import (
    assert_cudagraph_safe,
    assert_no_cudagraph_skips,
    compile_for_test,
    fresh_compile,
)
from tests.helpers import assert_bytes_equal

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU


class IndexerKCache(torch.nn.Module):
    """The cache as a module buffer (static address), gathering into dst buffers."""

    def __init__(self, cache, num_tokens, head_dim=128, return_outputs=True):
        super().__init__()
        self.return_outputs = return_outputs
        self.register_buffer("kv_cache", cache)
        self.register_buffer("dst_value", torch.empty(num_tokens, head_dim, dtype=torch.float8_e4m3fn, device=cache.device))
        self.register_buffer("dst_scale", torch.empty(num_tokens, head_dim // 128 * 4, dtype=torch.uint8, device=cache.device))
        self.num_tokens = num_tokens

    def forward(self, block_table, cu_seq_lens):
        v, s = gather_indexer_k(self.kv_cache, block_table, cu_seq_lens, self.num_tokens)
        self.dst_value.copy_(v)
        self.dst_scale.view(torch.float32).copy_(s)
        return (v, s) if self.return_outputs else None


def _inputs(seed, seqs=(300, 0, 77, 1024, 5)):
    g = torch.Generator().manual_seed(seed)
    return random_indexer_cache(list(seqs), 64, 128, table_stride_pad=2, device="cuda", generator=g)


@pytest.mark.parametrize(
    "mode, return_outputs",
    [("reduce-overhead", True), ("reduce-overhead", False), ("max-autotune", False)],
)
def test_reduce_overhead_no_cudagraph_skips(mode, return_outputs):
    """Returned outputs use kda.indexer_k_gather; buffers only, the in-place _out variant."""
    cache, table, cu, n = _inputs(1)
    model = IndexerKCache(cache, n, return_outputs=return_outputs)

    def run_steps():
        for step in range(4):  # new block tables each step, same shapes
            table2 = table[torch.randperm(table.shape[0], device="cuda")] if step else table
            out = compiled(table2, cu)
            expected = gather_indexer_k(cache, table2, cu, n)
            if return_outputs:
                assert_bytes_equal(out, expected)
            assert_bytes_equal([model.dst_value, model.dst_scale.view(torch.float32)], expected)

    with fresh_compile():
        compiled = compile_for_test(model, mode=mode)
        assert_no_cudagraph_skips(run_steps)
    assert compiled.matches["indexer_k_gather"] == 1


def test_graph_capture_and_no_host_syncs():
    cache, table, cu, n = _inputs(2)
    with fresh_compile():
        compiled = torch.compile(lambda c, t, s: gather_indexer_k(c, t, s, n), backend="kda_inductor")
        compiled(cache, table, cu)  # compile outside the sync check
        graph = assert_cudagraph_safe(compiled, cache, table, cu)
        captured = graph.captured
        # new data in the same buffers: the replay gathers it
        g = torch.Generator().manual_seed(3)
        cache2, *_ = random_indexer_cache([300, 0, 77, 1024, 5], 64, 128, generator=g)
        cache.copy_(cache2.cuda())
        table.copy_(table.flip(0))
        graph.replay()
        assert_bytes_equal(captured, gather_indexer_k(cache, table, cu, n))


def test_without_checks_out_of_range_block_ids_never_read_out_of_bounds():
    """The explicit no-assert launcher variant (``check=False``, benchmarks only) reads
    nothing for an out-of-range block id and writes zeros; the ops trap instead
    (tests/test_indexer_asserts_cuda.py, in subprocesses)."""
    from kda_inductor.lowerings.indexer_k_gather import gather_triton

    cache, table, cu, n = _inputs(4)
    bad = table.clone()
    bad[0, 0] = cache.shape[0] + 1000
    values = torch.full((n, 128), 0xAB, dtype=torch.uint8, device="cuda")
    scales = torch.full((n, 4), 0xAB, dtype=torch.uint8, device="cuda")
    gather_triton(cache, bad, cu, values, scales, check=False)
    torch.cuda.synchronize()
    first = int(cu[1])
    assert first > 0
    assert torch.all(values[: min(64, first)] == 0) and torch.all(scales[: min(64, first)] == 0)
    ref = gather_indexer_k(cache, table, cu, n)
    assert torch.equal(values[64:].cpu(), ref[0].view(torch.uint8)[64:].cpu())
