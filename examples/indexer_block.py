"""A DeepSeek-V3.2-style sparse-attention indexer block in plain PyTorch (prefill).

    python examples/indexer_block.py            # tiny on CPU, real dims on a GPU
    python examples/indexer_block.py --small    # tiny everywhere

Per step: ``k = wk(x)``, LayerNorm (float32 weight and bias, eps 1e-6), rotary on the first
64 dims, fp8 quantization with ue8m0 scales and the write into the blocked paged cache (a
module buffer) at ``slot_mapping`` (padding slots -1 masked out), then the prefill gather of
every request's K out of the cache, the logits (``sum_h w[t, h] * relu(q[t, h] . k[s])`` over
each query's own request, causal; :func:`fp8_mqa_logits`, a stand-in op for DeepGEMM's kernel
that reads the gathered fp8 values and scales, opaque to torch.compile as the real one is) and
top-k.

``make_step_inputs`` lays out decode and spec-decode steps too (requests with a context in the
cache and a few new tokens); ``examples/hybrid_model.py`` serves those. Compiled with
``backend="kda_inductor"`` it reports ``indexer_k_write`` (quant + write: the
rotary between the norm and the quantization keeps the norm with Inductor) and
``indexer_k_gather`` (on a GPU; on CPU the speed rules leave small steps to Inductor).
``build()`` is what ``kda-inductor graph-diff examples/indexer_block.py``
compiles.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kda_inductor.reference import (
    cache_row_bytes,
    dequantize_k,
    gather_indexer_k,
    layer_norm_k,
    write_indexer_k,
    written_cache_mismatch,
)


@dataclass(frozen=True)
class IndexerConfig:
    dim: int = 7168  # model width (DeepSeek-V3.2)
    n_heads: int = 64  # indexer heads
    head_dim: int = 128
    rope_dim: int = 64
    topk: int = 2048
    block_size: int = 64
    num_blocks: int = 4096
    ue8m0: bool = True  # V3.2's scale format
    max_positions: int = 32768  # rows of the rotary cos / sin cache


_eager_write_indexer_k = torch.compiler.disable(write_indexer_k)


@torch.library.custom_op("kda_examples::fp8_mqa_logits", mutates_args=())
def fp8_mqa_logits(q: torch.Tensor, k_values: torch.Tensor, k_scales: torch.Tensor, weights: torch.Tensor,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
    """A stand-in for DeepGEMM's ``fp8_mqa_logits``, opaque to torch.compile as the real
    kernel is in serving: ``sum_h weights[t, h] * relu(q[t, h] . k)`` float32 for the keys
    ``k`` of the fp8 values ``[N, D]`` and float32 group scales ``[N, G]`` the indexer
    gather returns; every key (``[T, N]``) or each query's ``rows`` (``[T, W]``)."""
    keys = dequantize_k(k_values, k_scales).to(q.dtype)  # [N, D]
    if rows is None:
        scores = torch.einsum("thd,nd->thn", q, keys)
    else:
        scores = torch.einsum("thd,twd->thw", q, keys[rows])
    return (F.relu(scores.float()) * weights[:, :, None]).sum(dim=1)


@fp8_mqa_logits.register_fake
def _(q, k_values, k_scales, weights, rows=None):
    width = k_values.shape[0] if rows is None else rows.shape[1]
    return q.new_empty((q.shape[0], width), dtype=torch.float32)

TINY = IndexerConfig(dim=64, n_heads=4, head_dim=128, rope_dim=64, topk=16, block_size=16, num_blocks=24)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """Rotate-half rotary on the first ``rope_dim`` dims of ``x [T, ..., D]`` (float32 math)."""
    pe, nope = x[..., :rope_dim], x[..., rope_dim:]
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (rope_dim // 2,)
    c, s = cos.view(shape), sin.view(shape)
    x1, x2 = pe.float().chunk(2, dim=-1)
    pe = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
    return torch.cat([pe, nope], dim=-1)


class IndexerBlock(torch.nn.Module):
    def __init__(self, cfg: IndexerConfig = IndexerConfig(), device=None, dtype=torch.bfloat16):
        super().__init__()
        self.cfg = cfg
        d, h, hd = cfg.dim, cfg.n_heads, cfg.head_dim
        self.wq = torch.nn.Linear(d, h * hd, bias=False, device=device, dtype=dtype)
        self.wk = torch.nn.Linear(d, hd, bias=False, device=device, dtype=dtype)
        self.weights_proj = torch.nn.Linear(d, h, bias=False, device=device, dtype=dtype)
        self.k_norm_weight = torch.nn.Parameter(torch.ones(hd, device=device))
        self.k_norm_bias = torch.nn.Parameter(torch.zeros(hd, device=device))
        cache = torch.zeros(cfg.num_blocks, cfg.block_size, cache_row_bytes(hd), dtype=torch.uint8, device=device)
        self.register_buffer("kv_cache", cache)
        # cos | sin of every position, computed once (vLLM's RotaryEmbedding.cos_sin_cache)
        inv = 1.0 / (10000 ** (torch.arange(0, cfg.rope_dim, 2, device=device).float() / cfg.rope_dim))
        ang = torch.arange(cfg.max_positions, device=device).float()[:, None] * inv[None, :]
        self.register_buffer("cos_sin_cache", torch.cat([ang.cos(), ang.sin()], dim=-1), persistent=False)

    def rope(self, positions):
        """cos, sin ``[T, rope_dim / 2]`` of each token's position (a lookup in the cache)."""
        return self.cos_sin_cache[positions].chunk(2, dim=-1)

    eager_write = False
    """Run the cache write (quant + store) eagerly, outside the graph: for stock Inductor, which
    fails to lower it on some GPUs ("must be 1 to view Float as Byte")."""

    def write_k(self, x, cos, sin, slot_mapping) -> None:
        """K: project, normalize, rotate, quantize and write into the paged cache (the buffer)."""
        k = layer_norm_k(self.wk(x), self.k_norm_weight, self.k_norm_bias)
        k = rotary(k, cos, sin, self.cfg.rope_dim)
        write = _eager_write_indexer_k if self.eager_write else write_indexer_k
        write(k, self.kv_cache, slot_mapping, ue8m0=self.cfg.ue8m0)

    def queries(self, x, cos, sin):
        """Rotated queries ``[T, H, D]`` and float32 head weights ``[T, H]``."""
        cfg, t = self.cfg, x.shape[0]
        q = rotary(self.wq(x).view(t, cfg.n_heads, cfg.head_dim), cos, sin, cfg.rope_dim)
        w = self.weights_proj(x).float() * (cfg.n_heads ** -0.5 * cfg.head_dim ** -0.5)
        return q, w

    def gather_k(self, block_table, cu_seq_lens, num_tokens):
        """Every request's K out of the cache (the prefill gather): fp8 values ``[N, D]`` and
        float32 scales ``[N, G]``, as ``fp8_mqa_logits`` takes them."""
        return gather_indexer_k(self.kv_cache, block_table, cu_seq_lens, num_tokens)

    def forward(self, x, positions, slot_mapping, block_table, cu_seq_lens, req_of_token, num_tokens: int):
        cfg = self.cfg
        cos, sin = self.rope(positions)
        self.write_k(x, cos, sin, slot_mapping)
        q, w = self.queries(x, cos, sin)
        # prefill gather of every request's K, and the logits (DeepGEMM's kernel in serving)
        values, scales = self.gather_k(block_table, cu_seq_lens, num_tokens)  # [N, D], [N, G]
        logits = fp8_mqa_logits(q, values, scales, w)  # [T, N]
        # each query sees its own request's keys up to its position
        key = torch.arange(num_tokens, device=x.device)
        key_req = torch.searchsorted(cu_seq_lens, key, right=True) - 1
        key_pos = key - cu_seq_lens[key_req]
        visible = (key_req[None, :] == req_of_token[:, None]) & (key_pos[None, :] <= positions[:, None])
        logits = logits.masked_fill(~visible, float("-inf"))
        top = logits.topk(min(cfg.topk, num_tokens), dim=-1)
        return top.indices, logits


def make_inputs(cfg: IndexerConfig, seq_lens, num_padding=0, device="cpu", seed=0):
    """Prefill inputs: ``x``, positions, slot mapping (padding -1), block table (block 0
    reserved as the null block, as vLLM does), ``cu_seq_lens``, each token's request, N."""
    g = torch.Generator().manual_seed(seed)
    bs = cfg.block_size
    blocks_per = [(s + bs - 1) // bs for s in seq_lens]
    width = max(1, max(blocks_per))
    assert sum(blocks_per) < cfg.num_blocks, "cache too small for these requests"
    perm = torch.randperm(cfg.num_blocks - 1, generator=g) + 1
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    used = 0
    for b, nblk in enumerate(blocks_per):
        table[b, :nblk] = perm[used : used + nblk]
        used += nblk
    positions, slots, reqs = [], [], []
    for b, s in enumerate(seq_lens):
        for p in range(s):
            positions.append(p)
            slots.append(int(table[b, p // bs]) * bs + p % bs)
            reqs.append(b)
    n = len(slots)
    positions += [0] * num_padding
    slots += [-1] * num_padding
    reqs += [-1] * num_padding
    cu = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(seq_lens), 0)
    x = torch.randn(n + num_padding, cfg.dim, generator=g).to(torch.bfloat16)
    to = dict(device=device)
    return (x.to(**to), torch.tensor(positions, **to), torch.tensor(slots, **to), table.to(**to),
            cu.to(**to), torch.tensor(reqs, **to), n)


@dataclass
class StepInputs:
    """One step of requests that each have ``context_lens[b]`` tokens, the last ``new_lens[b]``
    of them new (decode: 1, spec decode: draft tokens + 1, prefill: all), in batch order.

    ``x``, ``positions``, ``slot_mapping`` and ``req_of_token`` are per new token; ``cu_seq_lens``
    (int32) over the contexts, ``block_table`` their blocks (block 0 is the null block);
    ``ctx_positions`` each context token's position in its request (``N`` of them);
    ``past_slots`` the slots of the tokens that were written before this step (fill them with
    :func:`fill_past` before the step)."""

    x: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    cu_seq_lens: torch.Tensor
    req_of_token: torch.Tensor
    ctx_positions: torch.Tensor
    past_slots: torch.Tensor

    @property
    def num_ctx_tokens(self) -> int:
        return self.ctx_positions.shape[0]


def make_step_inputs(cfg: IndexerConfig, context_lens, new_lens, *, dim: int | None = None,
                     device="cpu", seed=0, table_width: int | None = None) -> StepInputs:
    """:class:`StepInputs` for requests with these context and new-token counts; the block
    table ``table_width`` wide (default: as wide as the longest context needs)."""
    if len(context_lens) != len(new_lens) or any(not 0 <= n <= c for c, n in zip(context_lens, new_lens)):
        raise ValueError(f"new_lens must be 0 <= new <= context per request, got {list(context_lens)}, {list(new_lens)}")
    g = torch.Generator().manual_seed(seed)
    bs = cfg.block_size
    blocks_per = [(c + bs - 1) // bs for c in context_lens]
    if sum(blocks_per) >= cfg.num_blocks:
        raise ValueError(f"cache too small: {sum(blocks_per)} blocks needed, num_blocks={cfg.num_blocks}")
    perm = torch.randperm(cfg.num_blocks - 1, generator=g) + 1
    width = max(1, max(blocks_per, default=1))
    if table_width is not None:
        if table_width < width:
            raise ValueError(f"table_width={table_width} < {width} blocks of the longest context")
        width = table_width
    table = torch.zeros(len(context_lens), width, dtype=torch.int32)
    used = 0
    for b, nblk in enumerate(blocks_per):
        table[b, :nblk] = perm[used : used + nblk]
        used += nblk
    positions, slots, reqs, past = [], [], [], []
    for b, (c, n) in enumerate(zip(context_lens, new_lens)):
        for p in range(c):
            slot = int(table[b, p // bs]) * bs + p % bs
            if p < c - n:
                past.append(slot)
            else:
                positions.append(p)
                slots.append(slot)
                reqs.append(b)
    cu = torch.zeros(len(context_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(list(context_lens), dtype=torch.int64), 0)
    ctx_pos = [p for c in context_lens for p in range(c)]
    x = torch.randn(len(slots), dim or cfg.dim, generator=g).to(torch.bfloat16)
    to = dict(device=device)
    as_i64 = lambda v: torch.tensor(v, dtype=torch.int64, **to)  # noqa: E731
    return StepInputs(x.to(**to), as_i64(positions), as_i64(slots), table.to(**to), cu.to(**to),
                      as_i64(reqs), torch.tensor(ctx_pos, dtype=torch.int32, **to), as_i64(past))


def fill_past(block: IndexerBlock, past_slots: torch.Tensor, seed: int = 0) -> None:
    """Write random K (quantized as the block writes it) for the tokens before this step."""
    if past_slots.numel() == 0:
        return
    g = torch.Generator().manual_seed(seed + 7)
    k = torch.randn(past_slots.shape[0], block.cfg.head_dim, generator=g).to(torch.bfloat16)
    write_indexer_k(k.to(block.kv_cache.device), block.kv_cache, past_slots, ue8m0=block.cfg.ue8m0)


def make_block(cfg: IndexerConfig, device="cpu", seed=0) -> IndexerBlock:
    torch.manual_seed(seed)
    block = IndexerBlock(cfg, device=device)
    with torch.no_grad():  # non-trivial norm parameters, and weights scaled like trained ones
        block.k_norm_weight.uniform_(0.5, 1.5)
        block.k_norm_bias.normal_(0, 0.1)
        for lin in (block.wq, block.wk, block.weights_proj):
            lin.weight.normal_(0, cfg.dim ** -0.5)
    return block.eval().requires_grad_(False)


def build(small: bool = True):
    """What ``kda-inductor graph-diff examples/indexer_block.py`` compiles."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = TINY if small else IndexerConfig()
    seqs = [23, 0, 9, 40] if small else [500, 1000, 333, 2000]  # scores [T, H, N]: ~2 GB in bf16
    block = make_block(cfg, device)
    *args, n = make_inputs(cfg, seqs, num_padding=3, device=device)
    return block, (*args, n)


def topk_agreement(ref_idx, got_idx, ref_logits, rtol=0.07) -> tuple[int, int]:
    """(rows whose top-k sets differ, entries swapped). A swap is allowed only between
    logits that tie within ``rtol`` (relative, against the k-th logit) in eager's logits;
    raises AssertionError otherwise."""
    rows = swapped = 0
    for r in range(ref_idx.shape[0]):
        a, b = set(ref_idx[r].tolist()), set(got_idx[r].tolist())
        if a == b:
            continue
        rows += 1
        kth = ref_logits[r, ref_idx[r]].min()
        tol = rtol * kth.abs().clamp(min=1e-6)
        for i in a ^ b:
            v = ref_logits[r, i]
            if not (torch.isfinite(v) and (v - kth).abs() <= tol):
                raise AssertionError(f"row {r}: index {i} (logit {float(v):.5g}) is no tie with the "
                                     f"k-th logit {float(kth):.5g}")
        swapped += len(a - b)
    return rows, swapped


def demo(small: bool) -> None:
    """Compile the block with the backend, print what matched, check against eager."""
    import kda_inductor

    block, inputs = build(small=small)
    cache0 = block.kv_cache.clone()
    ref_idx, ref_logits = block(*inputs)
    ref_cache = block.kv_cache.clone()
    block.kv_cache.copy_(cache0)
    report = kda_inductor.explain(block, *inputs)
    print(report)
    block.kv_cache.copy_(cache0)
    compiled = torch.compile(block, backend="kda_inductor")
    idx, _ = compiled(*inputs)
    n = inputs[-1]
    why = written_cache_mismatch(block.kv_cache, ref_cache, inputs[2], block.cfg.head_dim)
    rows, swapped = topk_agreement(ref_idx[:n].cpu(), idx[:n].cpu(), ref_logits[:n].float().cpu())
    print(f"cache against eager: {why or 'bytes outside the slots identical, values within one fp8 step'}; "
          f"top-k rows differing from eager: {rows} of {n} ({swapped} tied entries swapped)")
    if why:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="tiny sizes even on a GPU")
    args = parser.parse_args()
    demo(small=args.small or not torch.cuda.is_available())


if __name__ == "__main__":
    main()
