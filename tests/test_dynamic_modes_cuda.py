"""The rewrites at symbolic sizes on a GPU (skipped without one): ``dynamic=True``
with the default speed rules (every rewrite kept at a symbolic token / block count on CUDA),
under ``mode="reduce-overhead"`` (no cudagraph skip, one compile for T = 7, 64, 300) and
captured by ``torch.cuda.graph`` at a symbolic T (no host sync, the replay writes the same
bytes). The serving code and inputs are ``tests/test_dynamic_modes.py``'s."""

from __future__ import annotations

import pytest
import torch

from kda_inductor.reference import written_cache_mismatch
from kda_inductor.testing import (
    assert_close_in_range,
    assert_close_to_eager,
    assert_cudagraph_safe,
    assert_no_cudagraph_skips,
    fresh_compile,
)
from tests.test_dynamic_modes import (
    CACHES,
    D,
    CountingBackend,
    fresh,
    gather_inputs,
    gdn_split,
    indexer_write,
    kda_merge_norm,
    norm_inputs,
    split_inputs,
    write_inputs,
)

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU
STEPS = (7, 64, 300)  # T = 2's one-token halves are static sizes: a graph of their own


def _cuda(args):
    return tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)


class Gather(torch.nn.Module):
    """The indexer gather with the cache as a module buffer (a static address), returning the
    gathered bytes (``indexer_gather`` of the CPU file writes preallocated buffers instead)."""

    def __init__(self, cache):
        super().__init__()
        self.register_buffer("kv_cache", cache)

    def forward(self, block_table, cu_seq_lens, positions):
        nb, bs, row = self.kv_cache.shape
        n, hd = positions.shape[0], D
        tok = torch.arange(n, device=positions.device)
        req = torch.searchsorted(cu_seq_lens, tok, right=True) - 1
        pos = tok - cu_seq_lens[req]
        blk = block_table[req, pos // bs].unsqueeze(1)
        off = (pos % bs).unsqueeze(1)
        pages = self.kv_cache.view(nb, bs * row)
        values = pages[blk, off * hd + torch.arange(hd, device=positions.device)]
        scales = pages[blk, bs * hd + off * (row - hd) + torch.arange(row - hd, device=positions.device)]
        return values, scales


class Write(torch.nn.Module):
    """The indexer write with the cache as a module buffer (a static address: cudagraphs)."""

    def __init__(self, cache, weight, bias):
        super().__init__()
        self.register_buffer("kv_cache", cache)
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)

    def forward(self, k, slot_mapping):
        indexer_write(k, self.weight, self.bias, self.kv_cache, slot_mapping)


def _gather_step(T, seed):
    cache, _, _, table, cu = _cuda(gather_inputs(T, seed, CACHES[0]))
    return cache, (table, cu, torch.empty(int(cu[-1]), device="cuda"))


def _write_step(T, seed):
    k, _, _, _, slots = _cuda(write_inputs(T, seed, CACHES[0]))
    return k, slots


def _case(name):
    """``(module or function, T -> args)``: the step's callable and its inputs at T tokens."""
    if name == "gdn_spec_split":
        return fresh(gdn_split), lambda T: _cuda(split_inputs(T, T))
    if name == "gated_norm_merge":
        return fresh(kda_merge_norm), lambda T: _cuda(norm_inputs(T, T))
    if name == "indexer_k_gather":
        return Gather(_gather_step(300, 0)[0]), lambda T: _gather_step(T, T)[1]
    _, w, b, cache, _ = _cuda(write_inputs(300, 0, CACHES[0]))
    return Write(cache, w, b), lambda T: _write_step(T, T)


def _run_and_check(name, fn, compiled, args, records) -> None:
    """One step: ``compiled(*args)`` against eager (the write: on a copy of the cache, within
    the fp8 step ``written_cache_mismatch`` allows for another math order; the norm: the
    reduction order; the gathers: bytes)."""
    from kda_inductor import pass_manager

    if name == "indexer_k_write":
        ref = fn.kv_cache.clone()
        indexer_write(args[0], fn.weight, fn.bias, ref, args[1])
        with pass_manager.observe() as got:
            compiled(*args)
        records.extend(got)
        why = written_cache_mismatch(fn.kv_cache, ref, args[1], D)
        assert why is None, why
        return
    want = fn(*args)
    with pass_manager.observe() as got:
        out = compiled(*args)
    records.extend(got)
    if name == "gated_norm_merge":
        assert_close_in_range((out,), (want,))
    else:
        assert_close_to_eager(tuple(out), tuple(want), exact=True)


NAMES = ["gdn_spec_split", "gated_norm_merge", "indexer_k_gather", "indexer_k_write"]


@pytest.mark.parametrize("name", NAMES)
def test_reduce_overhead_at_a_symbolic_token_count(name):
    """dynamic=True, the default speed rules, mode="reduce-overhead": one compile serves
    T = 7, 64, 300, every graph rewritten, no cudagraph skip, results as eager's."""
    fn, inputs = _case(name)
    backend = CountingBackend({"kda": {"strict": True}, "triton.cudagraphs": True})
    records = []

    def run_steps():
        compiled = torch.compile(fn, backend=backend, dynamic=True)
        for T in STEPS:
            _run_and_check(name, fn, compiled, inputs(T), records)

    with fresh_compile():
        assert_no_cudagraph_skips(run_steps)
    assert backend.compiles == 1, backend.compiles
    assert [r.matches[name] for r in records] == [1], [(r.matches, r.misses.get(name)) for r in records]


@pytest.mark.parametrize("name", NAMES)
def test_capture_at_a_symbolic_token_count(name):
    """The dynamic=True graph (compiled at T = 7) runs T = 64 without a host sync and is captured
    by torch.cuda.graph; the replay writes the same bytes (the write: the same cache bytes)."""
    fn, inputs = _case(name)
    backend = CountingBackend({"kda": {"strict": True}})
    with fresh_compile():
        compiled = torch.compile(fn, backend=backend, dynamic=True)
        compiled(*inputs(7))
        args = inputs(64)
        compiled(*args)  # the same graph (no compile inside the sync check)
        assert backend.compiles == 1
        assert_cudagraph_safe(compiled, *args)
        if name == "indexer_k_write":  # writing the same k at the same slots again leaves the cache as it is
            before = fn.kv_cache.clone()
            compiled(*args)
            assert torch.equal(fn.kv_cache, before)
