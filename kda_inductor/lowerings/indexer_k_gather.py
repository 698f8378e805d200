"""``kda::indexer_k_gather``: gather DeepSeek-V3.2 indexer K rows out of a paged fp8 cache.

Cache layout (see ``shared/reference.md``, section ``indexer_k_gather``): ``kv_cache`` is
uint8 ``[num_blocks, block_size, head_dim + 4 * G]`` with ``G = head_dim // 128`` float32
scales per token, but the shape is nominal: each block is laid out BLOCKED, its
``block_size * head_dim`` fp8 value bytes first (token ``o`` at ``o * head_dim``), then its
scale bytes (token ``o`` at ``block_size * head_dim + 4 * G * o``). Each block must be
contiguous; the block stride is free.

Token ``t < num_tokens`` belongs to request ``b = searchsorted(cu_seq_lens, t, right=True) - 1``
at position ``pos = t - cu_seq_lens[b]``; it is read from block ``block_table[b, pos //
block_size]`` at offset ``pos % block_size`` and written to row ``t`` of the outputs. Requests
may be empty. The gather is a pure byte copy, bit-identical to
:func:`kda_inductor.reference.gather_indexer_k_loop`.

Ops:

* ``kda::indexer_k_gather(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim)``
  returns ``(values uint8 [num_tokens, head_dim], scales uint8 [num_tokens, 4 * G])``.
* ``kda::indexer_k_gather_out(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens)``
  writes in place into ``dst_value`` (any 1-byte dtype ``[N, head_dim]``) and ``dst_scale``
  (``4 * G`` bytes per row, e.g. float32 ``[N, G]`` or uint8 ``[N, 4 * G]``).

Metadata (dtypes, shapes, devices) is validated everywhere without syncing. The CPU kernel
is pure torch and also validates values (sorted ``cu_seq_lens`` starting at 0, ``num_tokens
<= cu_seq_lens[-1]``, block ids in range). The CUDA kernel is the Triton launcher
:func:`gather_triton`: sync-free and CUDA-graph safe; tokens it cannot resolve (past
``cu_seq_lens[-1]``, a table column or block id out of range) read nothing and get zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

try:  # Triton is optional on CPU-only installs; the CPU kernel does not need it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

__all__ = ["indexer_k_gather", "indexer_k_gather_out", "gather_triton", "word_bytes"]

QUANT_GROUP = 128
"""fp8 values per float32 scale."""

_INDEX_DTYPES = (torch.int32, torch.int64)
_WORD_DTYPES = {4: torch.int32, 2: torch.int16, 1: torch.uint8}

DEFAULT_BLOCK_T = 64
"""Tokens per Triton program on GPU (tunable)."""


# --------------------------------------------------------------------------------------
# validation (shared by the ops, their fake impls and the launcher)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Meta:
    num_blocks: int
    block_size: int
    head_dim: int
    scale_bytes: int


def _err(arg: str, msg: str, exc: type[Exception] = ValueError) -> Exception:
    return exc(f"{arg}: {msg}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_tensor(x, arg: str) -> None:
    if not isinstance(x, Tensor):
        raise _err(arg, f"expected a Tensor, got {type(x).__name__}", TypeError)


def _check_head_dim(head_dim, arg: str) -> None:
    if _is_int(head_dim) and (head_dim <= 0 or head_dim % QUANT_GROUP != 0):
        raise _err(arg, f"head_dim must be a positive multiple of {QUANT_GROUP}, got {head_dim}")


def _check_num_tokens(num_tokens) -> None:
    if _is_int(num_tokens):
        if num_tokens < 0:
            raise _err("num_tokens", f"expected >= 0, got {num_tokens}")
    else:  # SymInt under tracing
        torch._check(num_tokens >= 0, lambda: "num_tokens: expected >= 0")


def _check_meta(kv_cache, block_table, cu_seq_lens, head_dim, head_dim_arg: str) -> _Meta:
    """Sync-free checks of everything but the data; returns the cache geometry."""
    for x, arg in ((kv_cache, "kv_cache"), (block_table, "block_table"), (cu_seq_lens, "cu_seq_lens")):
        _check_tensor(x, arg)
    _check_head_dim(head_dim, head_dim_arg)
    sb = 4 * (head_dim // QUANT_GROUP)
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 3:
        raise _err("kv_cache", f"expected a 3-D uint8 tensor, got {kv_cache.dim()}-D {kv_cache.dtype}")
    num_blocks, block_size, row = kv_cache.shape
    if row != head_dim + sb:
        raise _err(
            "kv_cache",
            f"expected last dim head_dim + 4 * (head_dim // {QUANT_GROUP}) = {head_dim + sb} "
            f"for head_dim {head_dim}, got {row}",
        )
    if (kv_cache.stride(2) != 1 and row > 1) or (kv_cache.stride(1) != row and block_size > 1):
        raise _err(
            "kv_cache",
            f"each block must be contiguous (strides (*, {row}, 1)), "
            f"got strides {tuple(kv_cache.stride())}",
        )
    if block_table.dim() != 2 or block_table.dtype not in _INDEX_DTYPES:
        raise _err(
            "block_table",
            f"expected a 2-D int32/int64 tensor, got {block_table.dim()}-D {block_table.dtype}",
        )
    if cu_seq_lens.dim() != 1 or cu_seq_lens.dtype not in _INDEX_DTYPES:
        raise _err(
            "cu_seq_lens",
            f"expected a 1-D int32/int64 tensor, got {cu_seq_lens.dim()}-D {cu_seq_lens.dtype}",
        )
    num_reqs = block_table.shape[0]
    if cu_seq_lens.shape[0] != num_reqs + 1:
        raise _err(
            "cu_seq_lens",
            f"expected length block_table.shape[0] + 1 = {num_reqs + 1}, got {cu_seq_lens.shape[0]}",
        )
    for x, arg in ((block_table, "block_table"), (cu_seq_lens, "cu_seq_lens")):
        if x.device != kv_cache.device:
            raise _err(arg, f"expected device {kv_cache.device} (kv_cache's), got {x.device}")
    return _Meta(num_blocks, block_size, head_dim, sb)


def _check_dst(dst, arg: str, num_tokens, row_bytes, device) -> None:
    """``dst`` must be 2-D ``[num_tokens, *]`` with ``row_bytes`` contiguous bytes per row."""
    _check_tensor(dst, arg)
    if dst.dim() != 2:
        raise _err(arg, f"expected a 2-D tensor, got {dst.dim()}-D")
    if dst.device != device:
        raise _err(arg, f"expected device {device} (kv_cache's), got {dst.device}")
    if dst.shape[0] != num_tokens:
        raise _err(arg, f"expected {num_tokens} rows (dst_value.shape[0]), got {dst.shape[0]}")
    if dst.shape[1] * dst.element_size() != row_bytes:
        raise _err(
            arg,
            f"expected {row_bytes} bytes per row, got {dst.shape[1]} x {dst.dtype} "
            f"({dst.shape[1] * dst.element_size()} bytes)",
        )
    if dst.stride(1) != 1 and dst.shape[1] > 1:
        raise _err(arg, f"rows must be contiguous (stride(1) == 1), got strides {tuple(dst.stride())}")


def _check_functional(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim) -> _Meta:
    _check_num_tokens(num_tokens)
    return _check_meta(kv_cache, block_table, cu_seq_lens, head_dim, "head_dim")


def _check_out(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens) -> _Meta:
    _check_tensor(dst_value, "dst_value")
    if dst_value.dim() != 2 or dst_value.element_size() != 1:
        raise _err(
            "dst_value",
            f"expected a 2-D tensor of a 1-byte dtype, got {dst_value.dim()}-D {dst_value.dtype}",
        )
    num_tokens, head_dim = dst_value.shape
    meta = _check_meta(kv_cache, block_table, cu_seq_lens, head_dim, "dst_value")
    _check_dst(dst_value, "dst_value", num_tokens, head_dim, kv_cache.device)
    _check_dst(dst_scale, "dst_scale", num_tokens, meta.scale_bytes, kv_cache.device)
    return meta


def _check_values_cpu(block_table, cu_seq_lens, num_tokens: int, meta: _Meta, n_arg: str):
    """Data checks (syncs). Returns each token's ``(block id, offset)`` as int64 tensors.

    ``n_arg`` names where ``num_tokens`` came from (``num_tokens`` or ``dst_value``).
    """
    cu = cu_seq_lens.to(torch.int64)
    if int(cu[0]) != 0:
        raise _err("cu_seq_lens", f"expected cu_seq_lens[0] == 0, got {int(cu[0])}")
    dec = torch.nonzero(cu[1:] < cu[:-1])
    if dec.numel():
        i = int(dec[0, 0])
        raise _err(
            "cu_seq_lens",
            f"expected non-decreasing values, got cu_seq_lens[{i}] = {int(cu[i])} > "
            f"cu_seq_lens[{i + 1}] = {int(cu[i + 1])}",
        )
    total = int(cu[-1])
    if num_tokens > total:
        raise _err(n_arg, f"num_tokens {num_tokens} exceeds cu_seq_lens[-1] = {total}")
    token = torch.arange(num_tokens, dtype=torch.int64, device=cu.device)
    req = torch.searchsorted(cu, token, right=True) - 1
    pos = token - cu[req]
    col = pos // meta.block_size
    width = block_table.shape[1]
    wide = torch.nonzero(col >= width)
    if wide.numel():
        t = int(wide[0, 0])
        b = int(req[t])
        raise _err(
            "block_table",
            f"request {b} needs block column {int(col[t])} (token {t}) "
            f"but the table has {width} columns",
            IndexError,
        )
    blk = block_table[req, col].to(torch.int64)
    bad = torch.nonzero((blk < 0) | (blk >= meta.num_blocks))
    if bad.numel():
        t = int(bad[0, 0])
        raise _err(
            "block_table",
            f"block id {int(blk[t])} out of range [0, {meta.num_blocks}) for request {int(req[t])}",
            IndexError,
        )
    return blk, pos % meta.block_size


# --------------------------------------------------------------------------------------
# byte views
# --------------------------------------------------------------------------------------
def _byte_rows(x: Tensor) -> Tensor:
    """A 2-D tensor with contiguous rows -> uint8 ``[rows, row_bytes]`` view (stride(1) == 1)."""
    if x.shape[1] == 1 and x.stride(1) != 1:
        x = x.as_strided(x.shape, (x.stride(0), 1))
    return x.view(torch.uint8)


def _cache_bytes(kv_cache: Tensor) -> Tensor:
    """``kv_cache`` -> uint8 ``[num_blocks, block_size * row]`` view (blocks are contiguous)."""
    nb, bs, row = kv_cache.shape
    return kv_cache.as_strided((nb, bs * row), (kv_cache.stride(0), 1))


def word_bytes(*byte_rows: Tensor, sizes: tuple[int, ...] = ()) -> int:
    """The widest word (4, 2 or 1 bytes) dividing every address, row stride and size involved.

    ``byte_rows`` are 2-D uint8 tensors with ``stride(1) == 1``; ``sizes`` are byte counts
    (head_dim, scale bytes). Host metadata only: no sync.
    """
    for w in (4, 2):
        ok = all(s % w == 0 for s in sizes)
        for x in byte_rows:
            ok = ok and x.data_ptr() % w == 0 and x.storage_offset() % w == 0
            ok = ok and (x.shape[0] <= 1 or x.stride(0) % w == 0) and x.shape[1] % w == 0
        if ok:
            return w
    return 1


def _as_words(x: Tensor, w: int) -> Tensor:
    if w == 1:
        return x
    if x.shape[0] <= 1:  # the row stride of a single row is arbitrary; make it viewable
        x = x.as_strided(x.shape, (x.shape[1], 1))
    return x.view(_WORD_DTYPES[w])


# --------------------------------------------------------------------------------------
# Triton kernel and launcher
# --------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit(do_not_specialize=["num_tokens", "num_reqs", "num_blocks", "bt_width", "search_steps"])
    def _indexer_k_gather_kernel(
        kv_ptr,  # words, block b at b * kv_block_stride
        bt_ptr,
        cu_ptr,
        dv_ptr,  # words, row t at t * dv_stride
        ds_ptr,  # words, row t at t * ds_stride
        num_tokens,
        num_reqs,
        num_blocks,
        bt_width,
        search_steps,  # bit_length(num_reqs): binary search over cu_seq_lens[1:]
        kv_block_stride,
        bt_stride_req,
        bt_stride_col,
        dv_stride,
        ds_stride,
        BLOCK_SIZE: tl.constexpr,
        VALUE_WORDS: tl.constexpr,
        VALUE_WORDS_P2: tl.constexpr,
        SCALE_WORDS: tl.constexpr,
        SCALE_WORDS_P2: tl.constexpr,
        BLOCK_T: tl.constexpr,
    ):
        pid = tl.program_id(0)
        tok = pid.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        in_range = tok < num_tokens

        # request = number of cu_seq_lens[1:] entries <= tok (vectorized binary search)
        lo = tl.zeros([BLOCK_T], dtype=tl.int32)
        hi = lo + num_reqs
        for _ in range(search_steps):
            active = lo < hi
            mid = (lo + hi) // 2
            c = tl.load(cu_ptr + 1 + mid, mask=active, other=0).to(tl.int64)
            right = active & (c <= tok)
            lo = tl.where(right, mid + 1, lo)
            hi = tl.where(active & (c > tok), mid, hi)
        req = lo
        cu0 = tl.load(cu_ptr).to(tl.int64)
        valid = in_range & (req < num_reqs) & (tok >= cu0)
        start = tl.load(cu_ptr + req, mask=valid, other=0).to(tl.int64)
        pos = tl.where(valid, tok - start, 0)
        col = pos // BLOCK_SIZE
        off = pos % BLOCK_SIZE
        valid = valid & (col < bt_width)
        blk = tl.load(
            bt_ptr + req.to(tl.int64) * bt_stride_req + col * bt_stride_col, mask=valid, other=0
        ).to(tl.int64)
        valid = valid & (blk >= 0) & (blk < num_blocks)
        base = blk * kv_block_stride  # int64: caches can exceed 2**31 bytes

        # values: [BLOCK_T, VALUE_WORDS] tile, contiguous words per token
        w = tl.arange(0, VALUE_WORDS_P2)
        ld_mask = valid[:, None]
        st_mask = in_range[:, None]
        if VALUE_WORDS != VALUE_WORDS_P2:
            ld_mask = ld_mask & (w[None, :] < VALUE_WORDS)
            st_mask = st_mask & (w[None, :] < VALUE_WORDS)
        src = base + off * VALUE_WORDS
        v = tl.load(kv_ptr + src[:, None] + w[None, :], mask=ld_mask, other=0)
        tl.store(dv_ptr + (tok * dv_stride)[:, None] + w[None, :], v, mask=st_mask)

        # scales: [BLOCK_T, SCALE_WORDS] tile after the block's value bytes
        s = tl.arange(0, SCALE_WORDS_P2)
        ld_mask = valid[:, None]
        st_mask = in_range[:, None]
        if SCALE_WORDS != SCALE_WORDS_P2:
            ld_mask = ld_mask & (s[None, :] < SCALE_WORDS)
            st_mask = st_mask & (s[None, :] < SCALE_WORDS)
        src = base + BLOCK_SIZE * VALUE_WORDS + off * SCALE_WORDS
        sc = tl.load(kv_ptr + src[:, None] + s[None, :], mask=ld_mask, other=0)
        tl.store(ds_ptr + (tok * ds_stride)[:, None] + s[None, :], sc, mask=st_mask)


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _launch(kv_cache, block_table, cu_seq_lens, dv, ds, meta: _Meta, block_t, num_warps) -> int:
    """Launch on pre-validated args; ``dv``/``ds`` are uint8 row views. Returns the word size."""
    if triton is None:  # pragma: no cover
        raise RuntimeError("indexer_k_gather: the Triton kernel needs triton, which is not installed")
    num_tokens = dv.shape[0]
    kv = _cache_bytes(kv_cache)
    w = word_bytes(kv, dv, ds, sizes=(meta.head_dim, meta.scale_bytes))
    if num_tokens == 0:
        return w
    kv_w, dv_w, ds_w = _as_words(kv, w), _as_words(dv, w), _as_words(ds, w)
    vw, sw = meta.head_dim // w, meta.scale_bytes // w
    if num_warps is None:
        num_warps = 4 if block_t * _next_pow2(vw) <= 2048 else 8
    num_reqs = block_table.shape[0]
    grid = (triton.cdiv(num_tokens, block_t),)
    _indexer_k_gather_kernel[grid](
        kv_w,
        block_table,
        cu_seq_lens,
        dv_w,
        ds_w,
        num_tokens,
        num_reqs,
        meta.num_blocks,
        block_table.shape[1],
        num_reqs.bit_length(),
        kv_w.stride(0),
        block_table.stride(0),
        block_table.stride(1),
        dv_w.stride(0),
        ds_w.stride(0),
        BLOCK_SIZE=meta.block_size,
        VALUE_WORDS=vw,
        VALUE_WORDS_P2=_next_pow2(vw),
        SCALE_WORDS=sw,
        SCALE_WORDS_P2=_next_pow2(sw),
        BLOCK_T=block_t,
        num_warps=num_warps,
    )
    return w


def gather_triton(
    kv_cache: Tensor,
    block_table: Tensor,
    cu_seq_lens: Tensor,
    dst_value_u8: Tensor,
    dst_scale_u8: Tensor,
    *,
    block_t: int = DEFAULT_BLOCK_T,
    num_warps: int | None = None,
) -> int:
    """Gather into ``dst_value_u8`` ``[N, head_dim]`` and ``dst_scale_u8`` ``[N, 4 * G]`` with Triton.

    Any 1-byte (values) or ``4 * G``-bytes-per-row (scales) 2-D destinations with contiguous
    rows are accepted. Metadata is validated, data is not: unresolvable tokens get zeros.
    Copies in the widest word (4/2/1 bytes) that every address, stride and size allows and
    returns that word size. No host sync, no allocation: safe under CUDA-graph capture.
    """
    meta = _check_out(kv_cache, dst_value_u8, dst_scale_u8, block_table, cu_seq_lens)
    if not (_is_int(block_t) and block_t > 0 and block_t & (block_t - 1) == 0):
        raise _err("block_t", f"expected a positive power of two, got {block_t}")
    return _launch(
        kv_cache, block_table, cu_seq_lens, _byte_rows(dst_value_u8), _byte_rows(dst_scale_u8),
        meta, block_t, num_warps,
    )


# --------------------------------------------------------------------------------------
# custom ops
# --------------------------------------------------------------------------------------
def _gather_cpu(kv_cache, block_table, cu_seq_lens, num_tokens: int, meta: _Meta, n_arg: str):
    """Validated pure-torch gather -> fresh contiguous uint8 ``(values, scales)``."""
    blk, off = _check_values_cpu(block_table, cu_seq_lens, num_tokens, meta, n_arg)
    flat = _cache_bytes(kv_cache)
    split = meta.block_size * meta.head_dim
    vals = flat[:, :split].unflatten(1, (meta.block_size, meta.head_dim))
    scs = flat[:, split:].unflatten(1, (meta.block_size, meta.scale_bytes))
    return vals[blk, off], scs[blk, off]


@torch.library.custom_op("kda::indexer_k_gather", mutates_args=(), device_types="cpu")
def indexer_k_gather(
    kv_cache: Tensor, block_table: Tensor, cu_seq_lens: Tensor, num_tokens: int, head_dim: int
) -> tuple[Tensor, Tensor]:
    """Gather ``num_tokens`` K rows -> ``(values uint8 [N, head_dim], scales uint8 [N, 4G])``."""
    meta = _check_functional(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim)
    return _gather_cpu(kv_cache, block_table, cu_seq_lens, num_tokens, meta, "num_tokens")


@indexer_k_gather.register_kernel("cuda")
def _indexer_k_gather_cuda(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim):
    meta = _check_functional(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim)
    values = kv_cache.new_empty((num_tokens, head_dim))
    scales = kv_cache.new_empty((num_tokens, meta.scale_bytes))
    _launch(kv_cache, block_table, cu_seq_lens, values, scales, meta, DEFAULT_BLOCK_T, None)
    return values, scales


@indexer_k_gather.register_fake
def _indexer_k_gather_fake(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim):
    meta = _check_functional(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim)
    return (
        kv_cache.new_empty((num_tokens, head_dim)),
        kv_cache.new_empty((num_tokens, meta.scale_bytes)),
    )


@torch.library.custom_op(
    "kda::indexer_k_gather_out", mutates_args=("dst_value", "dst_scale"), device_types="cpu"
)
def indexer_k_gather_out(
    kv_cache: Tensor, dst_value: Tensor, dst_scale: Tensor, block_table: Tensor, cu_seq_lens: Tensor
) -> None:
    """Gather ``dst_value.shape[0]`` K rows in place into ``dst_value`` and ``dst_scale``."""
    meta = _check_out(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens)
    values, scales = _gather_cpu(
        kv_cache, block_table, cu_seq_lens, dst_value.shape[0], meta, "dst_value"
    )
    _byte_rows(dst_value).copy_(values)
    _byte_rows(dst_scale).copy_(scales)


@indexer_k_gather_out.register_kernel("cuda")
def _indexer_k_gather_out_cuda(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens):
    meta = _check_out(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens)
    _launch(
        kv_cache, block_table, cu_seq_lens, _byte_rows(dst_value), _byte_rows(dst_scale),
        meta, DEFAULT_BLOCK_T, None,
    )


@indexer_k_gather_out.register_fake
def _indexer_k_gather_out_fake(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens):
    _check_out(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens)
