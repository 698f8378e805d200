"""Eager references for the rewrites, kept deliberately plain.

Every function here is the *specification* the fused ops are tested against.
Cache layout (``docs/indexer-cache.md``; :class:`CacheLayout`): ``kv_cache`` is uint8 ``[num_blocks,
block_size, head_dim + 4 * head_dim // 128]`` laid out BLOCKED: one block holds ``block_size * head_dim``
fp8 value bytes (token ``o`` at ``o * head_dim``) followed by ``block_size`` float32 scales per 128-value
group (token ``o``, group ``g`` at ``block_size * head_dim + 4 * (o * G + g)``).
"""

from __future__ import annotations

import dataclasses  # CacheLayout (at the end: the references' line numbers are quoted by tests)
import torch

QUANT_GROUP = 128
"""Values per float32 scale (the one definition: patterns and lowerings import it)."""
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)
"""fp8 e4m3's largest finite value, 448: quantized values saturate at +-FP8_MAX."""
AMAX_FLOOR = 1e-4
"""DeepSeek-V3.2's floor of a group's absmax before dividing by FP8_MAX (all-zero groups stay finite)."""
NORM_EPS = 1e-6
"""DeepSeek-V3.2 indexer ``k_norm`` LayerNorm eps."""


def scale_bytes(head_dim: int) -> int:
    """Bytes of float32 scales per token for ``head_dim`` values."""
    return CacheLayout(head_dim).scale_bytes


def cache_row_bytes(head_dim: int) -> int:
    """The nominal last dim of ``kv_cache``: value bytes plus scale bytes per token."""
    return CacheLayout(head_dim).row_bytes


def gather_indexer_k_loop(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens):
    """The seed's per-request Python loop (host syncs and all). Fills ``dst_*`` in place.

    ``dst_value``: ``[N, head_dim]`` fp8/uint8; ``dst_scale``: ``[N, 4 * G]`` uint8.
    Cannot be traced by Dynamo (data-dependent branching); kept to check the others.
    """
    num_blocks, block_size, _ = kv_cache.shape
    head_dim = dst_value.shape[-1]
    sb = scale_bytes(head_dim)
    flat = kv_cache.view(num_blocks, -1)
    dst_value = dst_value.view(torch.uint8)
    dst_scale = dst_scale.view(torch.uint8).view(dst_value.shape[0], sb)
    for b in range(block_table.shape[0]):
        start, end = cu_seq_lens[b], cu_seq_lens[b + 1]
        s = end - start
        if s == 0:
            continue
        n_blk = (s + block_size - 1) // block_size
        for i in range(n_blk):
            blk = block_table[b, i]
            lo = start + i * block_size
            hi = torch.minimum(end, lo + block_size)
            cnt = hi - lo
            dst_value[lo:hi] = flat[blk, : cnt * head_dim].view(-1, head_dim)
            base = block_size * head_dim
            dst_scale[lo:hi] = flat[blk, base : base + cnt * sb].view(-1, sb)
    return dst_value, dst_scale


def gather_indexer_k(kv_cache, block_table, cu_seq_lens, num_tokens: int):
    """The sync-free vectorized form: what ``indexer_k_gather`` matches.

    Returns ``(values, scales)``: fp8 e4m3 ``[N, head_dim]`` and float32 ``[N, G]``.
    """
    num_blocks, block_size, row = kv_cache.shape
    head_dim = row * QUANT_GROUP // (QUANT_GROUP + 4)
    sb = scale_bytes(head_dim)
    device = kv_cache.device
    token = torch.arange(num_tokens, device=device)
    req = torch.searchsorted(cu_seq_lens, token, right=True) - 1
    pos = token - cu_seq_lens[req]
    blk = block_table[req, pos // block_size]
    off = pos % block_size
    flat = kv_cache.view(num_blocks, -1)
    val_col = (off * head_dim).unsqueeze(1) + torch.arange(head_dim, device=device)
    values = flat[blk.unsqueeze(1), val_col]
    sc_col = (block_size * head_dim + off * sb).unsqueeze(1) + torch.arange(sb, device=device)
    scales = flat[blk.unsqueeze(1), sc_col]
    return values.view(torch.float8_e4m3fn), scales.view(torch.float32)


def dequantize_k(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp8 values ``[N, D]`` times their float32 group scales ``[N, D // 128]`` -> float32."""
    v = values.view(torch.float8_e4m3fn).float()
    s = scales.view(torch.float32).reshape(v.shape[0], -1)
    return (v.view(v.shape[0], -1, QUANT_GROUP) * s.unsqueeze(-1)).view_as(v)


def random_indexer_cache(seq_lens, block_size=64, head_dim=128, *, extra_blocks=3,
                         table_stride_pad=0, index_dtype=torch.int32, device="cpu",
                         generator=None):
    """A random blocked cache plus a shuffled block table for requests of ``seq_lens``.

    Every byte of the cache is random (value bytes are replaced by finite fp8 and
    scales by positive float32 so that dequantizing is meaningful). The table gets
    ``table_stride_pad`` unused columns per row and is returned as a column slice,
    so its row stride is larger than its width. Returns
    ``(kv_cache, block_table, cu_seq_lens, num_tokens)``.
    """
    g = generator
    seq_lens = [int(s) for s in seq_lens]
    blocks_per = [(s + block_size - 1) // block_size for s in seq_lens]
    width = max(1, max(blocks_per, default=1))
    num_blocks = sum(blocks_per) + extra_blocks
    sb = scale_bytes(head_dim)
    vals = (torch.randn(num_blocks, block_size * head_dim, generator=g) * 40).to(torch.float8_e4m3fn)
    scs = torch.rand(num_blocks, block_size * sb // 4, generator=g) * 0.1 + 1e-3
    cache = torch.cat([vals.view(torch.uint8), scs.view(torch.uint8)], dim=1)
    cache = cache.view(num_blocks, block_size, head_dim + sb)
    perm = torch.randperm(num_blocks, generator=g)
    table = torch.randint(0, num_blocks, (len(seq_lens), width + table_stride_pad), generator=g)
    used = 0
    for b, n in enumerate(blocks_per):
        table[b, :n] = perm[used : used + n]
        used += n
    table = table.to(index_dtype)[:, :width]
    cu = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(seq_lens, dtype=torch.int64), 0)
    return cache.to(device), table.to(device), cu.to(device), int(cu[-1])


# --------------------------------------------------------------------------- indexer_k_write


def layer_norm_k(k, weight, bias, eps: float = NORM_EPS, *, round_to_input: bool = True):
    """DeepSeek-V3.2's indexer ``k_norm``: LayerNorm in float32 (float32 weight and bias),
    cast back to ``k``'s dtype (kept float32 with ``round_to_input=False``)."""
    y = torch.nn.functional.layer_norm(k.float(), (k.shape[-1],), weight, bias, eps)
    return y.to(k.dtype) if round_to_input else y


def quantize_k(k, ue8m0: bool = False):
    """fp8 e4m3 quantization per group of 128 values -> ``(values fp8 [T, D], scales f32 [T, G])``.

    ``scale = max(amax, 1e-4) / 448``, with ``ue8m0`` rounded up to a power of two as
    ``2 ** ceil(log2(scale))`` (float32 ``log2``: where it rounds to an integer just above a
    power of two, the scale stays that power of two); ``q = fp8(clamp(x / scale, +-448))``.
    """
    t, d = k.shape
    x = k.float().view(t, d // QUANT_GROUP, QUANT_GROUP)
    amax = x.abs().amax(dim=-1, keepdim=True).clamp(min=AMAX_FLOOR)
    scale = amax / FP8_MAX
    if ue8m0:
        scale = torch.pow(2.0, torch.ceil(torch.log2(scale)))
    q = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(t, d), scale.view(t, d // QUANT_GROUP)


def write_indexer_k(k, kv_cache, slot_mapping, ue8m0: bool = False, weight=None, bias=None,
                    eps: float = NORM_EPS):
    """Optional LayerNorm, fp8 quantization, and the store into the blocked cache, in place:
    the form ``indexer_k_write`` matches (``index_put_`` into a flat view).

    Token ``t`` goes to slot ``s = slot_mapping[t]`` (block ``s // block_size``, offset
    ``s % block_size``); slots < 0 are padding and leave the cache unchanged. Race-free and
    sync-free: padding is clamped to slot 0 for the indexing and every token *adds*
    ``where(valid, new - old, 0)`` (uint8, wrapping) with ``accumulate=True``, so a padding
    token adds 0 wherever it lands and a real token that shares slot 0 still gets its bytes
    (a plain ``index_put_`` of ``where(valid, new, old)`` would write slot 0 twice with
    different bytes: duplicate indices, an undefined winner). Distinct real slots are the
    caller's contract (two real tokens on one slot add their deltas: garbage).
    """
    if weight is not None:
        k = layer_norm_k(k, weight, bias, eps)
    q, scale = quantize_k(k, ue8m0)
    flat, valid, blk, cols, scols = _masked_slots(kv_cache, slot_mapping, k.shape[1])
    flat.index_put_((blk, cols), torch.where(valid, q.view(torch.uint8) - flat[blk, cols], 0), accumulate=True)
    flat.index_put_((blk, scols), torch.where(valid, scale.view(torch.uint8) - flat[blk, scols], 0), accumulate=True)


def _masked_slots(kv_cache, slot_mapping, d: int):
    """The flat cache view, the padding mask and the value / scale byte addresses of each
    token's slot (padding clamped to slot 0), as the masked spellings index them."""
    nb, bs, row = kv_cache.shape
    valid = (slot_mapping >= 0)[:, None]
    slot = slot_mapping.clamp(min=0)
    blk, off = (slot // bs)[:, None], slot % bs
    cols = off[:, None] * d + torch.arange(d, device=kv_cache.device)
    scols = bs * d + off[:, None] * (row - d) + torch.arange(row - d, device=kv_cache.device)
    return kv_cache.view(nb, -1), valid, blk, cols, scols


def write_indexer_k_racy(k, kv_cache, slot_mapping, ue8m0: bool = False):
    """The masked spelling that races (kept to test what the rewrite does with it): padding
    clamped to slot 0 writes slot 0's old bytes back with a plain ``index_put_``, in the same
    write as a real token that targets slot 0 (duplicate indices: which write wins is
    undefined; CPU eager keeps the padding's old bytes). Well defined, and equal to
    :func:`write_indexer_k`, wherever no real token uses slot 0 (vLLM reserves block 0)."""
    q, scale = quantize_k(k, ue8m0)
    flat, valid, blk, cols, scols = _masked_slots(kv_cache, slot_mapping, k.shape[1])
    flat[blk, cols] = torch.where(valid, q.view(torch.uint8), flat[blk, cols])
    flat[blk, scols] = torch.where(valid, scale.view(torch.uint8), flat[blk, scols])


def write_indexer_k_loop(k, kv_cache, slot_mapping, ue8m0: bool = False, weight=None, bias=None,
                         eps: float = NORM_EPS):
    """Token by token, bytes by hand (host syncs): the specification the others are checked
    against. Slots < 0 are skipped."""
    if weight is not None:
        k = layer_norm_k(k, weight, bias, eps)
    nb, bs, row = kv_cache.shape
    d = k.shape[1]
    sb = row - d
    q, scale = quantize_k(k, ue8m0)
    q, scale = q.view(torch.uint8), scale.contiguous().view(torch.uint8)
    flat = kv_cache.view(nb, bs * row)
    for t, s in enumerate(slot_mapping.tolist()):
        if s < 0:
            continue
        blk, off = divmod(s, bs)
        flat[blk, off * d : (off + 1) * d] = q[t]
        flat[blk, bs * d + off * sb : bs * d + (off + 1) * sb] = scale[t]


def fp8_step(v: torch.Tensor) -> torch.Tensor:
    """Spacing of the fp8 e4m3 grid at magnitude ``v`` (the subnormal spacing below 2**-6)."""
    e = torch.floor(torch.log2(v.clamp(min=2.0**-6)))
    return torch.pow(2.0, e - 3)


def written_cache_mismatch(got, ref, slot_mapping, head_dim: int) -> str | None:
    """How cache ``got`` differs from ``ref`` beyond what a different math order allows, or None.

    Bytes outside the slots of ``slot_mapping`` (entries < 0 ignored) must be identical;
    written values must agree within one fp8 step after dequantizing (plus 2**-7 relative,
    for scales computed from inputs one bf16 ulp apart).
    """
    got, ref, slots = got.cpu(), ref.cpu(), slot_mapping.cpu()
    nb, bs, row = got.shape
    s = slots[slots >= 0].long()
    blk, off = s // bs, s % bs
    sb = row - head_dim
    vcols = (off * head_dim)[:, None] + torch.arange(head_dim)
    scols = (bs * head_dim + off * sb)[:, None] + torch.arange(sb)
    gf, rf = got.reshape(nb, -1), ref.reshape(nb, -1)
    mask = torch.zeros_like(gf, dtype=torch.bool)
    mask[blk[:, None], vcols] = True
    mask[blk[:, None], scols] = True
    outside = int((gf[~mask] != rf[~mask]).sum())
    if outside:
        return f"{outside} bytes outside the written slots differ"
    gs, rs = gf[blk[:, None], scols], rf[blk[:, None], scols]
    a = dequantize_k(gf[blk[:, None], vcols], gs)
    r = dequantize_k(rf[blk[:, None], vcols], rs)
    sa = gs.view(torch.float32).repeat_interleave(QUANT_GROUP, 1)
    sr = rs.view(torch.float32).repeat_interleave(QUANT_GROUP, 1)
    big = torch.maximum(a.abs() / sa, r.abs() / sr)
    tol = (fp8_step(big) + big * 2.0**-7) * torch.maximum(sa, sr)
    bad = int(((a - r).abs() > tol).sum())
    return f"{bad} written values differ by more than one fp8 step" if bad else None


# --------------------------------------------------------------------------- the cache layout


@dataclasses.dataclass(frozen=True)
class CacheLayout:
    """The blocked layout of one block (one page) of the indexer K cache: ``block_size`` tokens
    of ``head_dim`` fp8 value bytes, token-major, then their float32 scales (``scale_bytes`` per
    token). The one place the row formula is written; :meth:`parse` is the one reading of a
    cache's shape (the rewrites' matchers), ``lowerings.check_kv_cache`` the validating one
    (the ops). The block stride is no part of it: it is free."""

    head_dim: int  # or a SymInt in fake impls
    block_size: int = 0  # tokens per block; 0: not known (a layout for one row's widths)

    @property
    def groups(self) -> int:
        """float32 scales per token."""
        return self.head_dim // QUANT_GROUP

    @property
    def scale_bytes(self) -> int:
        """Bytes of float32 scales per token."""
        return 4 * self.groups

    @property
    def row_bytes(self) -> int:
        """The nominal last dim of a 3-D cache: value bytes plus scale bytes per token."""
        return self.head_dim + self.scale_bytes

    @property
    def block_bytes(self) -> int:
        """Bytes of one block (one page)."""
        return self.block_size * self.row_bytes

    @property
    def scales_start(self) -> int:
        """Where a block's scales start: after its ``block_size * head_dim`` value bytes."""
        return self.block_size * self.head_dim

    def value_byte(self, off: int) -> int:
        """The first value byte of the token at offset ``off`` of its block."""
        return off * self.head_dim

    def scale_byte(self, off: int) -> int:
        """The first scale byte of the token at offset ``off`` of its block."""
        return self.scales_start + off * self.scale_bytes

    @staticmethod
    def valid_head_dim(head_dim: int) -> bool:
        """``head_dim`` is a positive int multiple of ``QUANT_GROUP``."""
        return isinstance(head_dim, int) and not isinstance(head_dim, bool) and head_dim > 0 \
            and head_dim % QUANT_GROUP == 0

    @classmethod
    def of_row(cls, row: int, block_size: int = 0) -> CacheLayout | None:
        """The layout whose tokens take ``row`` bytes (``head_dim`` derived), or None."""
        if row % (QUANT_GROUP + 4):
            return None
        return cls(row // (QUANT_GROUP + 4) * QUANT_GROUP, block_size)

    @classmethod
    def parse(cls, shape: tuple, head_dim: int | None = None) -> CacheLayout | None:
        """The layout of a cache of ``shape`` (static sizes), or None where none fits: 3-D
        ``[num_blocks, block_size, row]`` (``head_dim`` from ``row``; a block dim of 1 reads as a
        page), or pages ``[num_pages, page_bytes]`` with unit dims between (SGLang,
        TensorRT-LLM), which do not say their block size: ``head_dim`` (a valid one) does."""
        shape = tuple(shape)
        if len(shape) == 3 and shape[1] != 1:
            bs, row = shape[1:]
            if not (isinstance(bs, int) and isinstance(row, int)):
                return None
            return cls.of_row(row, bs)
        if any(s != 1 for s in shape[1:-1]):
            return None
        page = shape[-1]
        if not (isinstance(page, int) and cls.valid_head_dim(head_dim)):
            return None
        row = cls(head_dim).row_bytes
        return cls(head_dim, page // row) if page % row == 0 else None

