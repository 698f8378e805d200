"""examples/indexer_block.py: the DeepSeek-V3.2-style indexer block compiles with both rewrites."""

from __future__ import annotations


import torch

from kda_inductor.reference import written_cache_mismatch
from kda_inductor.testing import compile_for_test, fresh_compile

import indexer_block as ib  # noqa: E402


def test_indexer_block_matches_both_rewrites_and_agrees_with_eager(capsys):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    block = ib.make_block(ib.TINY, device)
    *inputs, n = ib.make_inputs(ib.TINY, [23, 0, 9, 40], num_padding=3, device=device)
    cache0 = block.kv_cache.clone()
    ref_idx, ref_logits = block(*inputs, n)
    ref_cache = block.kv_cache.clone()
    block.kv_cache.copy_(cache0)
    with fresh_compile():
        compiled = compile_for_test(block)
        idx, _ = compiled(*inputs, n)
    assert compiled.matches["indexer_k_write"] == 1 and compiled.matches["indexer_k_gather"] == 1
    slots = inputs[2]
    why = written_cache_mismatch(block.kv_cache, ref_cache, slots, ib.TINY.head_dim)
    assert why is None, why
    rows, swapped = ib.topk_agreement(ref_idx[:n].cpu(), idx[:n].cpu(), ref_logits[:n].float().cpu())
    with capsys.disabled():
        print(f"\nindexer block top-k: {rows} of {n} rows differ from eager, {swapped} tied entries swapped")
    assert rows <= n // 4, (rows, swapped)
