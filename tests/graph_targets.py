"""Builders for ``kda-inductor graph-diff`` tests (the CLI's TARGET convention)."""

import torch

from kda_inductor.reference import QUANT_GROUP, gather_indexer_k, random_indexer_cache


def _inputs():
    g = torch.Generator().manual_seed(0)
    return random_indexer_cache([5, 40, 0, 33], 16, 128, generator=g)


def build():
    """The sync-free gather: one match."""
    cache, table, cu, n = _inputs()
    return (lambda c, t, s: gather_indexer_k(c, t, s, n)), (cache, table, cu)


def interleaved():
    """A per-token interleaved layout: must not match; --explain-misses says why."""
    cache, table, cu, n = _inputs()

    def fn(c, t, s):
        nb, bs, row = c.shape
        hd = row * QUANT_GROUP // (QUANT_GROUP + 4)
        tok = torch.arange(n)
        req = torch.searchsorted(s, tok, right=True) - 1
        pos = tok - s[req]
        blk, off = t[req, pos // bs], pos % bs
        flat = c.view(nb, -1)
        values = flat[blk[:, None], (off * row)[:, None] + torch.arange(hd)]
        scales = flat[blk[:, None], (off * row + hd)[:, None] + torch.arange(row - hd)]
        return values, scales

    return fn, (cache, table, cu), {}


class _WithParameter(torch.nn.Module):
    """The gather plus a parameter (requires grad): traced with grad enabled unless under
    inference_mode / no_grad."""

    def __init__(self, n):
        super().__init__()
        self.n = n
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, c, t, s):
        values, scales = gather_indexer_k(c, t, s, self.n)
        return values, scales * self.scale


def with_parameter():
    cache, table, cu, n = _inputs()
    return _WithParameter(n), (cache, table, cu)
