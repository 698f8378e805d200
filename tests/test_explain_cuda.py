"""explain() on CUDA: cudagraph skip reasons (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

import kda_inductor
from kda_inductor.reference import gather_indexer_k, random_indexer_cache

pytestmark = pytest.mark.cuda


def test_cudagraph_skip_reason_is_reported():
    """dst buffers passed as plain arguments are mutated non-static inputs: Inductor skips
    CUDA graphs, and the report says why."""
    g = torch.Generator().manual_seed(5)
    cache, table, cu, n = random_indexer_cache([40, 0, 70], 16, 128, device="cuda", generator=g)
    dst_v = torch.empty(n, 128, dtype=torch.uint8, device="cuda")
    dst_s = torch.empty(n, 4, dtype=torch.uint8, device="cuda")

    def fn(c, t, s, dv, ds):
        v, sc = gather_indexer_k(c, t, s, n)
        dv.copy_(v.view(torch.uint8))
        ds.copy_(sc.view(torch.uint8))

    report = kda_inductor.Explainer(mode="reduce-overhead")(fn, cache, table, cu, dst_v, dst_s)
    assert report.matches["indexer_k_gather"] == 1
    assert report.cudagraph_skips and "mutated inputs" in " ".join(report.cudagraph_skips)
    assert "cudagraph skips:" in str(report) and "mutated inputs" in str(report)
