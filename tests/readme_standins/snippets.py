"""Names README snippets use as placeholders: a small model and inputs that really compile."""

import torch

from kda_inductor.reference import gather_indexer_k, random_indexer_cache


class _Gather(torch.nn.Module):
    def __init__(self, cache, num_tokens):
        super().__init__()
        self.register_buffer("kv_cache", cache)
        self.num_tokens = num_tokens

    def forward(self, block_table, cu_seq_lens):
        return gather_indexer_k(self.kv_cache, block_table, cu_seq_lens, self.num_tokens)


def build_my_indexer(device="cpu"):
    """``(model, args)``: the sync-free indexer K gather on a tiny paged cache."""
    g = torch.Generator().manual_seed(0)
    cache, table, cu, n = random_indexer_cache([5, 40, 0, 33], 16, 128, generator=g)
    return _Gather(cache, n).to(device), (table.to(device), cu.to(device))


model, args = build_my_indexer()
fn = model
inputs = args
x = args
