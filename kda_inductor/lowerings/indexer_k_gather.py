"""``kda::indexer_k_gather``: gather DeepSeek-V3.2 indexer K rows out of a paged fp8 cache.

Cache layout (``docs/indexer-cache.md``, "The blocked layout"): ``kv_cache`` is
uint8 ``[num_blocks, block_size, head_dim + 4 * G]`` with ``G = head_dim // 128`` float32
scales per token, or SGLang's 2-D page buffer ``[num_pages, block_size * (head_dim + 4 * G)]``
with the op's ``block_size`` argument giving the tokens per page; the shape is nominal: each
block is laid out BLOCKED, its ``block_size * head_dim`` fp8 value bytes first (token ``o``
at ``o * head_dim``), then its scale bytes (token ``o`` at ``block_size * head_dim + 4 * G *
o``). Each block must be contiguous; the block stride is free.

Token ``t < num_tokens`` belongs to request ``b = searchsorted(cu_seq_lens, t, right=True) - 1``
at position ``pos = t - cu_seq_lens[b]``; it is read from block ``block_table[b, pos //
block_size]`` at offset ``pos % block_size`` and written to row ``t`` of the outputs. Requests
may be empty. The gather is a pure byte copy, bit-identical to
:func:`kda_inductor.reference.gather_indexer_k` (and the seed's loop).

Ops:

* ``kda::indexer_k_gather(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim,
  block_size=0)`` returns ``(values uint8 [num_tokens, head_dim], scales uint8 [num_tokens,
  4 * G])``.
* ``kda::indexer_k_gather_out(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens,
  block_size=0)`` writes in place into ``dst_value`` (any 1-byte dtype ``[N, head_dim]``) and
  ``dst_scale`` (``4 * G`` bytes per row, e.g. float32 ``[N, G]`` or uint8 ``[N, 4 * G]``).

``block_size``: 0 for a 3-D cache (its ``shape[1]``); required for a 2-D cache.

Invalid indices (the rule, next to the op). The op computes exactly what the
eager code it replaces (:func:`kda_inductor.reference.gather_indexer_k`: ``searchsorted``
and advanced indexing) computes wherever that is defined, on CPU and CUDA alike, and
refuses the call (CPU: an error naming the argument; CUDA: a device-side assert, as stock
Inductor's indexing does) only where that code raises or its result is not defined:

* a block id ``b`` in ``[-num_blocks, 0)`` is block ``b + num_blocks`` (Python indexing, as
  eager and stock Inductor read it); outside ``[-num_blocks, num_blocks)``: refused (eager:
  ``IndexError``). Table entries no token reads (spare columns and rows) may hold anything;
* a token whose block-table column is past the table's width: refused (eager: ``IndexError``);
* ``num_tokens > cu_seq_lens[-1]``: refused. The tokens past the last request belong to no
  request: without a spare table row eager raises; with one, ``cu_seq_lens[req]`` reads
  ``block_table[num_requests]`` while the equal spellings the pattern accepts
  (``cu_seq_lens[:-1][req]``, a prefix of the table) raise: no one result to reproduce;
* ``cu_seq_lens[0] > 0`` (with ``num_tokens > 0``): refused. The tokens before it belong to
  no request, and the spellings the pattern identifies differ there
  (``searchsorted(cu, t, right=True) - 1`` is -1 and wraps to the last request and table
  row, ``bucketize(t, cu[1:], right=True)`` is 0 at a negative position); the pattern's
  index algebra assumes ``cu_seq_lens[0] <= t``. ``cu_seq_lens[0] <= 0`` is fine;
* ``cu_seq_lens`` decreasing anywhere: refused. ``searchsorted``/``bucketize`` results on
  unsorted boundaries are undefined (torch documents it; eager CPU, eager CUDA and
  Inductor's binary searches probe differently and disagree), and a decreasing
  ``cu_seq_lens`` is a negative request length: a corrupted index;
* ``num_tokens < cu_seq_lens[-1]``: the first ``num_tokens`` tokens, as eager.

Metadata (dtypes, shapes, devices) is validated everywhere without syncing, before
anything is written. The CPU kernel is pure torch and validates values (syncs). The CUDA
kernel is the Triton launcher :func:`gather_triton`: sync-free, CUDA-graph safe, compiled
in Triton's debug mode (overflow checks off, see ``triton_launch_options``) so that its
``tl.device_assert`` traps each refused case; the interpreter traps the same way
(``interpreter_checks``). ``gather_triton(..., check=False)`` is the explicit no-assert
variant (benchmarks only, not used by the op): refused indices then read nothing and their
rows are unspecified (zeros where the kernel sees them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kda_inductor.lowerings import arg_error as _err
from kda_inductor.lowerings import cache_bytes, check_kv_cache, check_tensor, definitely
from kda_inductor.lowerings import interpreter_checks, triton_launch_options
from kda_inductor.lowerings._triton import tl, triton
from kda_inductor.reference import QUANT_GROUP, CacheLayout

__all__ = ["indexer_k_gather", "indexer_k_gather_out", "gather_triton", "validate", "word_bytes"]

_INDEX_DTYPES = (torch.int32, torch.int64)
_WORD_DTYPES = {4: torch.int32, 2: torch.int16, 1: torch.uint8}

DEFAULT_FANOUT = 16
"""Branching factor of the kernel's search of each token's request in ``cu_seq_lens``."""


# --------------------------------------------------------------------------------------
# validation (shared by the ops, their fake impls and the launcher)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Meta:
    num_blocks: int
    block_size: int
    head_dim: int
    scale_bytes: int


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_head_dim(head_dim, arg: str) -> None:
    if _is_int(head_dim) and (head_dim <= 0 or head_dim % QUANT_GROUP != 0):
        raise _err(arg, f"head_dim must be a positive multiple of {QUANT_GROUP}, got {head_dim}")


def _check_num_tokens(num_tokens) -> None:
    if _is_int(num_tokens):
        if num_tokens < 0:
            raise _err("num_tokens", f"expected >= 0, got {num_tokens}")
    else:  # SymInt under tracing
        torch._check(num_tokens >= 0, lambda: "num_tokens: expected >= 0")


def _check_meta(kv_cache, block_table, cu_seq_lens, head_dim, head_dim_arg: str, block_size=0) -> _Meta:
    """Sync-free checks of everything but the data; returns the cache geometry."""
    for x, arg in ((kv_cache, "kv_cache"), (block_table, "block_table"), (cu_seq_lens, "cu_seq_lens")):
        check_tensor(x, arg)
    _check_head_dim(head_dim, head_dim_arg)
    sb = CacheLayout(head_dim).scale_bytes
    num_blocks, block_size = check_kv_cache(kv_cache, head_dim, block_size)
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
    if definitely(cu_seq_lens.shape[0] < 1) or definitely(cu_seq_lens.shape[0] > block_table.shape[0] + 1):
        raise _err(
            "cu_seq_lens",
            f"expected length num_requests + 1 with 1 <= length <= block_table.shape[0] + 1 "
            f"= {block_table.shape[0] + 1} (the table may have spare rows), "
            f"got {cu_seq_lens.shape[0]}",
        )
    for x, arg in ((block_table, "block_table"), (cu_seq_lens, "cu_seq_lens")):
        if x.device != kv_cache.device:
            raise _err(arg, f"expected device {kv_cache.device} (kv_cache's), got {x.device}")
    return _Meta(num_blocks, block_size, head_dim, sb)


def _check_dst(dst, arg: str, num_tokens, row_bytes, device) -> None:
    """``dst`` must be 2-D ``[num_tokens, *]`` with ``row_bytes`` contiguous bytes per row
    (symbolic sizes: checked where known at trace time, never a guard)."""
    check_tensor(dst, arg)
    if dst.dim() != 2:
        raise _err(arg, f"expected a 2-D tensor, got {dst.dim()}-D")
    if dst.device != device:
        raise _err(arg, f"expected device {device} (kv_cache's), got {dst.device}")
    if definitely(dst.shape[0] != num_tokens):
        raise _err(arg, f"expected {num_tokens} rows (dst_value.shape[0]), got {dst.shape[0]}")
    if definitely(dst.shape[1] * dst.element_size() != row_bytes):
        raise _err(
            arg,
            f"expected {row_bytes} bytes per row, got {dst.shape[1]} x {dst.dtype} "
            f"({dst.shape[1] * dst.element_size()} bytes)",
        )
    if definitely(dst.stride(1) != 1) and definitely(dst.shape[1] > 1):
        raise _err(arg, f"rows must be contiguous (stride(1) == 1), got strides {tuple(dst.stride())}")


def validate(kv_cache, block_table, cu_seq_lens, num_tokens=None, head_dim=None, block_size=0, *,
             dst_value=None, dst_scale=None) -> _Meta:
    """The ops' one validator (their CPU, CUDA and fake impls, :func:`gather_triton`, and the
    pattern, whose ``Stage.VALIDATED`` misses quote its errors): sync-free checks of everything
    but the data, each bad argument an error naming it; returns the cache geometry. Symbolic
    sizes (the fake impls' and the pattern's) are checked where known at trace time: never a
    guard.
    ``kda::indexer_k_gather`` passes ``num_tokens`` and ``head_dim``; ``kda::indexer_k_gather_out``
    passes ``dst_value`` and ``dst_scale`` instead, whose shapes give them."""
    if dst_value is None and dst_scale is None:
        _check_num_tokens(num_tokens)
        return _check_meta(kv_cache, block_table, cu_seq_lens, head_dim, "head_dim", block_size)
    return _check_out(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens, block_size)


def _check_out(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens, block_size=0) -> _Meta:
    """:func:`validate` of the out op's arguments."""
    check_tensor(dst_value, "dst_value")
    if dst_value.dim() != 2 or dst_value.element_size() != 1:
        raise _err(
            "dst_value",
            f"expected a 2-D tensor of a 1-byte dtype, got {dst_value.dim()}-D {dst_value.dtype}",
        )
    num_tokens, head_dim = dst_value.shape
    meta = _check_meta(kv_cache, block_table, cu_seq_lens, head_dim, "dst_value", block_size)
    _check_dst(dst_value, "dst_value", num_tokens, head_dim, kv_cache.device)
    _check_dst(dst_scale, "dst_scale", num_tokens, meta.scale_bytes, kv_cache.device)
    return meta


def _first(cond: Tensor) -> int | None:
    """The first index where the 1-D ``cond`` holds (a host sync), or None."""
    hit = torch.nonzero(cond)
    return int(hit[0, 0]) if hit.numel() else None


def _check_lengths_cpu(cu_seq_lens, num_tokens: int, n_arg: str) -> Tensor:
    """Data checks of ``cu_seq_lens`` (syncs), the module's rule; returns it as int64."""
    cu = cu_seq_lens.to(torch.int64)
    i = _first(cu[1:] < cu[:-1])
    if i is not None:
        raise _err(
            "cu_seq_lens",
            f"expected non-decreasing values, got cu_seq_lens[{i}] = {int(cu[i])} > "
            f"cu_seq_lens[{i + 1}] = {int(cu[i + 1])} (searchsorted on unsorted boundaries is undefined)",
        )
    total = int(cu[-1])
    if num_tokens > total:
        raise _err(n_arg, f"num_tokens {num_tokens} exceeds cu_seq_lens[-1] = {total}: "
                   "tokens past the last request belong to no request")
    if num_tokens > 0 and int(cu[0]) > 0:
        raise _err("cu_seq_lens", f"expected cu_seq_lens[0] <= 0 (usually == 0), got {int(cu[0])}: "
                   f"tokens before it belong to no request")
    return cu


def _check_values_cpu(block_table, cu_seq_lens, num_tokens: int, meta: _Meta, n_arg: str):
    """Data checks (syncs), the module's rule. Returns each token's ``(block id, offset)``
    as int64 tensors, negative block ids wrapped as Python indexing wraps them.

    ``n_arg`` names where ``num_tokens`` came from (``num_tokens`` or ``dst_value``).
    """
    cu = _check_lengths_cpu(cu_seq_lens, num_tokens, n_arg)
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
    nb = meta.num_blocks
    t = _first((blk < -nb) | (blk >= nb))
    if t is not None:
        raise _err(
            "block_table",
            f"block id {int(blk[t])} out of range [-{nb}, {nb}) for request {int(req[t])} "
            f"(token {t}; negative ids count from the end, as Python indexing)",
            IndexError,
        )
    return torch.where(blk < 0, blk + nb, blk), pos % meta.block_size


# --------------------------------------------------------------------------------------
# byte views
# --------------------------------------------------------------------------------------
def _byte_rows(x: Tensor) -> Tensor:
    """A 2-D tensor with contiguous rows -> uint8 ``[rows, row_bytes]`` view (stride(1) == 1)."""
    if x.shape[1] == 1 and x.stride(1) != 1:
        x = x.as_strided(x.shape, (x.stride(0), 1))
    return x.view(torch.uint8)


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

    @triton.jit
    def _copy_tile(
        kv_ptr, dv_ptr, ds_ptr, row, store, load, src_v, src_s, dv_stride, ds_stride,
        VALUE_WORDS: tl.constexpr, VALUE_WORDS_P2: tl.constexpr,
        SCALE_WORDS: tl.constexpr, SCALE_WORDS_P2: tl.constexpr,
    ):
        """Copy each token's value words from ``src_v`` and scale words from ``src_s`` to
        output ``row``; rows with ``store`` but not ``load`` get zeros."""
        w = tl.arange(0, VALUE_WORDS_P2)
        ld = load[:, None]
        st = store[:, None]
        if VALUE_WORDS != VALUE_WORDS_P2:  # only then: a mask along words blocks 16-B vectors
            ld = ld & (w[None, :] < VALUE_WORDS)
            st = st & (w[None, :] < VALUE_WORDS)
        v = tl.load(kv_ptr + src_v[:, None] + w[None, :], mask=ld, other=0)
        s = tl.arange(0, SCALE_WORDS_P2)
        ld_s = load[:, None]
        st_s = store[:, None]
        if SCALE_WORDS != SCALE_WORDS_P2:
            ld_s = ld_s & (s[None, :] < SCALE_WORDS)
            st_s = st_s & (s[None, :] < SCALE_WORDS)
        sc = tl.load(kv_ptr + src_s[:, None] + s[None, :], mask=ld_s, other=0)
        tl.store(dv_ptr + (row * dv_stride)[:, None] + w[None, :], v, mask=st)
        tl.store(ds_ptr + (row * ds_stride)[:, None] + s[None, :], sc, mask=st_s)

    @triton.jit
    def _copy_from_block(
        kv_ptr, dv_ptr, ds_ptr, row, store, load, blk, off, kv_block_stride, dv_stride, ds_stride,
        BLOCK_SIZE: tl.constexpr, VALUE_WORDS: tl.constexpr, VALUE_WORDS_P2: tl.constexpr,
        SCALE_WORDS: tl.constexpr, SCALE_WORDS_P2: tl.constexpr,
    ):
        """Copy token ``off`` of cache block ``blk`` (blocked layout) to output ``row``."""
        base = blk * kv_block_stride  # int64: caches can exceed 2**31 bytes
        _copy_tile(
            kv_ptr, dv_ptr, ds_ptr, row, store, load, base + off * VALUE_WORDS,
            base + BLOCK_SIZE * VALUE_WORDS + off * SCALE_WORDS, dv_stride, ds_stride,
            VALUE_WORDS, VALUE_WORDS_P2, SCALE_WORDS, SCALE_WORDS_P2,
        )

    @triton.jit
    def _check_sorted(cu_ptr, first, num_reqs, step, BLOCK_T: tl.constexpr):
        """Assert ``cu_seq_lens[i] <= cu_seq_lens[i + 1]`` for ``i`` in ``first + k * step +
        [0, BLOCK_T)`` below ``num_reqs`` (the grid's programs share the pairs)."""
        for i0 in range(first, num_reqs, step):
            i = i0 + tl.arange(0, BLOCK_T)
            m = i < num_reqs
            a = tl.load(cu_ptr + i, mask=m, other=0)
            c = tl.load(cu_ptr + i + 1, mask=m, other=0)
            tl.device_assert(~m | (c >= a), "indexer_k_gather: cu_seq_lens decreases (a negative request length)")

    @triton.jit
    def _wrap_block(blk, num_blocks):
        """Block id -> (block, in range): ids in [-num_blocks, 0) count from the end."""
        blk = tl.where(blk < 0, blk + num_blocks, blk)
        return blk, (blk >= 0) & (blk < num_blocks)

    @triton.jit(do_not_specialize=["num_tokens", "num_reqs", "num_blocks", "bt_width"], debug=True)
    def _gather_by_block_kernel(
        kv_ptr, bt_ptr, cu_ptr, dv_ptr, ds_ptr,
        num_tokens, num_reqs, num_blocks, bt_width,
        kv_block_stride, bt_stride_req, bt_stride_col, dv_stride, ds_stride,
        BLOCK_SIZE: tl.constexpr, VALUE_WORDS: tl.constexpr, VALUE_WORDS_P2: tl.constexpr,
        SCALE_WORDS: tl.constexpr, SCALE_WORDS_P2: tl.constexpr,
        BLOCK_T: tl.constexpr, SUBTILES: tl.constexpr, CHECK: tl.constexpr,
    ):
        """Program (x, b) copies tokens [sub * BLOCK_T, +BLOCK_T) of table column x // SUBTILES
        of request b (the grid covers the table's width, > 0). Its three metadata loads are
        independent, so the data load waits for one round trip. Row b == num_reqs checks
        the rows no request covers (CHECK) or zero-fills them."""
        pid = tl.program_id(0)
        b = tl.program_id(1)
        if b < num_reqs:
            col = pid // SUBTILES
            start = tl.load(cu_ptr + b).to(tl.int64)
            end = tl.load(cu_ptr + b + 1).to(tl.int64)
            blk = tl.load(bt_ptr + b.to(tl.int64) * bt_stride_req + col * bt_stride_col).to(tl.int64)
            off = (pid % SUBTILES) * BLOCK_T + tl.arange(0, BLOCK_T)
            row = start + col * BLOCK_SIZE + off
            hi = tl.minimum(end, num_tokens)  # eager computes rows [0, num_tokens) only
            store = (row < hi) & (row >= 0)
            blk = blk + off * 0  # as a vector: the interpreter mis-types scalar & vector masks
            blk, blk_ok = _wrap_block(blk, num_blocks)
            if CHECK:
                tl.device_assert(end >= start, "indexer_k_gather: cu_seq_lens decreases (a negative request length)")
                tl.device_assert((hi <= tl.maximum(start, 0)) | (hi - start <= bt_width * BLOCK_SIZE),
                                 "indexer_k_gather: a token's block-table column is past the table's width")
                tl.device_assert(~store | blk_ok, "indexer_k_gather: block id out of range [-num_blocks, num_blocks)")
            _copy_from_block(
                kv_ptr, dv_ptr, ds_ptr, row, store, store & blk_ok, blk, off, kv_block_stride, dv_stride,
                ds_stride, BLOCK_SIZE, VALUE_WORDS, VALUE_WORDS_P2, SCALE_WORDS, SCALE_WORDS_P2,
            )
        else:
            _uncovered_rows(cu_ptr, dv_ptr, ds_ptr, pid, num_tokens, num_reqs, dv_stride, ds_stride, VALUE_WORDS,
                            VALUE_WORDS_P2, SCALE_WORDS, SCALE_WORDS_P2, BLOCK_T, CHECK)

    @triton.jit
    def _uncovered_rows(
        cu_ptr, dv_ptr, ds_ptr, pid, num_tokens, num_reqs, dv_stride, ds_stride,
        VALUE_WORDS: tl.constexpr, VALUE_WORDS_P2: tl.constexpr, SCALE_WORDS: tl.constexpr,
        SCALE_WORDS_P2: tl.constexpr, BLOCK_T: tl.constexpr, CHECK: tl.constexpr,
    ):
        """The block kernel's last grid row: rows before cu_seq_lens[0] or past cu_seq_lens[-1],
        no request's: checked (``CHECK``) or zero-filled."""
        cu0 = tl.load(cu_ptr).to(tl.int64)
        last = tl.load(cu_ptr + num_reqs).to(tl.int64)
        if CHECK:
            tl.device_assert((num_tokens == 0) | (cu0 <= 0),
                             "indexer_k_gather: a token before cu_seq_lens[0] (> 0) belongs to no request")
            tl.device_assert(num_tokens <= last,
                             "indexer_k_gather: num_tokens past cu_seq_lens[-1]: tokens of no request")
        step = tl.num_programs(0) * BLOCK_T
        # without CHECK, zeros; both ranges are empty for valid input: these loops then cost nothing
        for r0 in range(pid * BLOCK_T, tl.minimum(cu0, num_tokens), step):
            _zero_rows(dv_ptr, ds_ptr, r0 + tl.arange(0, BLOCK_T), cu0, num_tokens,
                       dv_stride, ds_stride, VALUE_WORDS, VALUE_WORDS_P2, SCALE_WORDS, SCALE_WORDS_P2)
        for r0 in range(tl.maximum(last, 0) + pid * BLOCK_T, num_tokens, step):
            _zero_rows(dv_ptr, ds_ptr, r0 + tl.arange(0, BLOCK_T), num_tokens, num_tokens,
                       dv_stride, ds_stride, VALUE_WORDS, VALUE_WORDS_P2, SCALE_WORDS, SCALE_WORDS_P2)

    @triton.jit
    def _zero_rows(
        dv_ptr, ds_ptr, row, end, num_tokens, dv_stride, ds_stride,
        VALUE_WORDS: tl.constexpr, VALUE_WORDS_P2: tl.constexpr,
        SCALE_WORDS: tl.constexpr, SCALE_WORDS_P2: tl.constexpr,
    ):
        store = (row < end) & (row < num_tokens)
        zero = row * 0
        _copy_tile(
            dv_ptr, dv_ptr, ds_ptr, row, store, zero != 0, zero, zero, dv_stride, ds_stride,
            VALUE_WORDS, VALUE_WORDS_P2, SCALE_WORDS, SCALE_WORDS_P2,
        )

    @triton.jit(do_not_specialize=["num_tokens", "num_reqs", "num_blocks", "bt_width", "search_levels",
                                   "search_span"], debug=True)
    def _gather_by_token_kernel(
        kv_ptr, bt_ptr, cu_ptr, dv_ptr, ds_ptr,
        num_tokens, num_reqs, num_blocks, bt_width,
        search_levels,  # levels of the FANOUT-ary search over cu_seq_lens[1:]
        search_span,  # FANOUT ** search_levels
        kv_block_stride, bt_stride_req, bt_stride_col, dv_stride, ds_stride,
        BLOCK_SIZE: tl.constexpr, VALUE_WORDS: tl.constexpr, VALUE_WORDS_P2: tl.constexpr,
        SCALE_WORDS: tl.constexpr, SCALE_WORDS_P2: tl.constexpr,
        BLOCK_T: tl.constexpr, FANOUT: tl.constexpr, CHECK: tl.constexpr,
    ):
        """Program p copies output rows [p * BLOCK_T, +BLOCK_T), finding each row's request."""
        pid = tl.program_id(0)
        if CHECK:  # the programs share cu_seq_lens' pairs: a few masked loads, most programs none
            _check_sorted(cu_ptr, pid * BLOCK_T, num_reqs, tl.num_programs(0) * BLOCK_T, BLOCK_T)
        tok = pid.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        in_range = tok < num_tokens
        cu0 = tl.load(cu_ptr).to(tl.int64)
        req, start = _request_of(cu_ptr, tok, cu0, num_reqs, search_levels, search_span, BLOCK_T, FANOUT)
        if CHECK:
            tl.device_assert(~in_range | (tok >= cu0),
                             "indexer_k_gather: a token before cu_seq_lens[0] (> 0) belongs to no request")
            tl.device_assert(~in_range | (req < num_reqs),
                             "indexer_k_gather: num_tokens past cu_seq_lens[-1]: tokens of no request")
        valid = in_range & (req < num_reqs) & (tok >= cu0)
        pos = tl.where(valid, tok - start, 0)
        col = pos // BLOCK_SIZE
        off = pos % BLOCK_SIZE
        if CHECK:
            tl.device_assert(~valid | (col < bt_width),
                             "indexer_k_gather: a token's block-table column is past the table's width")
        valid = valid & (col < bt_width)
        blk = tl.load(bt_ptr + req * bt_stride_req + col * bt_stride_col, mask=valid, other=0)
        blk, blk_ok = _wrap_block(blk.to(tl.int64), num_blocks)
        if CHECK:
            tl.device_assert(~valid | blk_ok, "indexer_k_gather: block id out of range [-num_blocks, num_blocks)")
        _copy_from_block(
            kv_ptr, dv_ptr, ds_ptr, tok, in_range, valid & blk_ok, blk, off, kv_block_stride, dv_stride,
            ds_stride, BLOCK_SIZE, VALUE_WORDS, VALUE_WORDS_P2, SCALE_WORDS, SCALE_WORDS_P2,
        )


if triton is not None:

    @triton.jit
    def _request_of(cu_ptr, tok, cu0, num_reqs, search_levels, search_span, BLOCK_T: tl.constexpr,
                    FANOUT: tl.constexpr):
        """``(req, start)`` of each row ``tok``: how many request ends (cu_seq_lens[1:]) are <= tok,
        by a FANOUT-ary search: each level compares the last entry of FANOUT sub-ranges at once,
        so only ceil(log_FANOUT(num_reqs)) dependent loads (2 for 256 requests). The largest end
        seen that is <= tok is cu_seq_lens[req], the request's start: no extra load."""
        lo = tl.zeros([BLOCK_T], dtype=tl.int64)
        start = tl.zeros([BLOCK_T], dtype=tl.int64) + cu0
        k = tl.arange(0, FANOUT).to(tl.int64)
        span = search_span  # FANOUT ** levels >= num_reqs
        for _ in range(search_levels):
            span = span // FANOUT
            idx = lo[:, None] + (k[None, :] + 1) * span - 1
            ends = tl.load(cu_ptr + 1 + idx, mask=idx < num_reqs, other=0).to(tl.int64)
            below = (ends <= tok[:, None]) & (idx < num_reqs)
            lo += tl.sum(below.to(tl.int64), axis=1) * span
            start = tl.maximum(start, tl.max(tl.where(below, ends, cu0), axis=1))
        return lo, start


def default_block_t(num_tokens: int) -> int:
    """Tokens per program: 16 for small gathers (more programs in flight: they are
    latency-bound), 32 for large ones. From the H200 sweep in benchmarks/results/."""
    return 16 if num_tokens < 16384 else 32


def default_num_warps(block_t: int, value_words: int) -> int:
    """About 512 words (2 KB) per warp: 1 warp for 16 x 128 B, 2 for 32 x 128 B."""
    return max(1, min(8, block_t * triton.next_power_of_2(value_words) // 512))


def _search_levels(num_reqs: int, fanout: int) -> int:
    levels, span = 0, 1
    while span < num_reqs:
        levels, span = levels + 1, span * fanout
    return levels


MAX_EMPTY_PROGRAMS = 2.0
"""The by-block grid has ``num_reqs * table_width * subtiles`` programs, many empty when
requests differ in length; it is used while that is at most this many times the by-token
grid (one program per tile of output rows), else the by-token kernel."""


@dataclass(frozen=True)
class _Plan:
    """How one launch covers the output rows (see :func:`_plan`)."""

    grid_by: str  # "block" or "token"
    block_t: int  # tokens per program
    subtiles: int  # programs per block (by-block grid)
    programs: int  # the by-token grid's programs
    num_warps: int


def _plan(meta: _Meta, num_tokens: int, num_reqs: int, width: int, value_bytes: int, block_t, num_warps,
          grid_by: str) -> _Plan:
    """The grid, tile and warps of a launch: ``grid_by`` "auto" takes the by-block grid while
    it has at most ``MAX_EMPTY_PROGRAMS`` times the by-token grid's programs."""
    if block_t is None:
        block_t = default_block_t(num_tokens)
    if width == 0:  # no column for a by-block program to read: the by-token kernel checks tokens
        grid_by = "token"
    block_t = min(block_t, triton.next_power_of_2(max(1, meta.block_size))) if grid_by != "token" else block_t
    subtiles = triton.cdiv(meta.block_size, block_t)
    by_token_programs = triton.cdiv(num_tokens, block_t)
    if grid_by == "auto":
        fits = num_reqs * width * subtiles <= MAX_EMPTY_PROGRAMS * by_token_programs
        grid_by = "block" if fits else "token"
    if num_warps is None:
        num_warps = default_num_warps(block_t, value_bytes // 4)
    return _Plan(grid_by, block_t, subtiles, by_token_programs, num_warps)


def _launch(kv_cache, block_table, cu_seq_lens, dv, ds, meta: _Meta, block_t, num_warps,
            fanout: int = DEFAULT_FANOUT, grid_by: str = "auto", check: bool = True) -> int:
    """Launch on pre-validated args; ``dv``/``ds`` are uint8 row views. Returns the word size.

    ``grid_by``: "block" (a program per block of a request: no search, one metadata round
    trip), "token" (a program per tile of rows, each searching its requests), or "auto".
    ``check``: the device-side asserts (the module's rule); False only for measuring them.
    """
    if triton is None:  # pragma: no cover
        raise RuntimeError("indexer_k_gather: the Triton kernel needs triton, which is not installed")
    num_tokens = dv.shape[0]
    kv = cache_bytes(kv_cache)
    w = word_bytes(kv, dv, ds, sizes=(meta.head_dim, meta.scale_bytes))
    if num_tokens == 0:  # eager reads nothing: nothing to check either
        return w
    kv_w, dv_w, ds_w = _as_words(kv, w), _as_words(dv, w), _as_words(ds, w)
    vw, sw = meta.head_dim // w, meta.scale_bytes // w
    num_reqs, width = cu_seq_lens.shape[0] - 1, block_table.shape[1]  # spare table rows unused
    plan = _plan(meta, num_tokens, num_reqs, width, vw * w, block_t, num_warps, grid_by)
    common = dict(
        BLOCK_SIZE=meta.block_size, VALUE_WORDS=vw, VALUE_WORDS_P2=triton.next_power_of_2(vw),
        SCALE_WORDS=sw, SCALE_WORDS_P2=triton.next_power_of_2(sw), BLOCK_T=plan.block_t, CHECK=bool(check),
        num_warps=plan.num_warps, **(triton_launch_options() if kv_cache.is_cuda else {}),
    )
    args = (kv_w, block_table, cu_seq_lens, dv_w, ds_w, num_tokens, num_reqs, meta.num_blocks, width)
    strides = (kv_w.stride(0), block_table.stride(0), block_table.stride(1), dv_w.stride(0), ds_w.stride(0))
    with interpreter_checks(check and not kv_cache.is_cuda):
        if plan.grid_by == "block":
            _gather_by_block_kernel[(width * plan.subtiles, num_reqs + 1)](
                *args, *strides, SUBTILES=plan.subtiles, **common)
        else:
            levels = _search_levels(num_reqs, fanout)
            _gather_by_token_kernel[(plan.programs,)](
                *args, levels, fanout**levels, *strides, FANOUT=fanout, **common)
    return w


def gather_triton(
    kv_cache: Tensor,
    block_table: Tensor,
    cu_seq_lens: Tensor,
    dst_value_u8: Tensor,
    dst_scale_u8: Tensor,
    *,
    block_size: int = 0,
    block_t: int | None = None,
    num_warps: int | None = None,
    fanout: int = DEFAULT_FANOUT,
    grid_by: str = "auto",
    check: bool = True,
) -> int:
    """Gather into ``dst_value_u8`` ``[N, head_dim]`` and ``dst_scale_u8`` ``[N, 4 * G]`` with Triton.

    Any 1-byte (values) or ``4 * G``-bytes-per-row (scales) 2-D destinations with contiguous
    rows are accepted. Metadata is validated on the host; index values by device-side
    asserts (the module's rule). ``check=False`` drops the asserts: an explicit fast path
    for measuring their cost, never used by the op (refused indices then read nothing and
    leave their rows unspecified). Copies in the widest word (4/2/1 bytes) that every
    address, stride and size allows and returns that word size. No host sync, no
    allocation: safe under CUDA-graph capture. ``block_t``, ``num_warps``, ``fanout`` and
    ``grid_by`` are tuning knobs (see ``_launch``).
    """
    meta = validate(kv_cache, block_table, cu_seq_lens, block_size=block_size, dst_value=dst_value_u8,
                    dst_scale=dst_scale_u8)
    if block_t is not None and not (_is_int(block_t) and block_t > 0 and block_t & (block_t - 1) == 0):
        raise _err("block_t", f"expected a positive power of two, got {block_t}")
    if not (_is_int(fanout) and fanout >= 2 and fanout & (fanout - 1) == 0):
        raise _err("fanout", f"expected a power of two >= 2, got {fanout}")
    if grid_by not in ("auto", "block", "token"):
        raise _err("grid_by", f"expected 'auto', 'block' or 'token', got {grid_by!r}")
    return _launch(
        kv_cache, block_table, cu_seq_lens, _byte_rows(dst_value_u8), _byte_rows(dst_scale_u8),
        meta, block_t, num_warps, fanout, grid_by, check,
    )


# --------------------------------------------------------------------------------------
# custom ops
# --------------------------------------------------------------------------------------
def _gather_cpu(kv_cache, block_table, cu_seq_lens, num_tokens: int, meta: _Meta, n_arg: str):
    """Validated pure-torch gather -> fresh contiguous uint8 ``(values, scales)``."""
    blk, off = _check_values_cpu(block_table, cu_seq_lens, num_tokens, meta, n_arg)
    flat = cache_bytes(kv_cache)
    split = meta.block_size * meta.head_dim
    vals = flat[:, :split].unflatten(1, (meta.block_size, meta.head_dim))
    scs = flat[:, split:].unflatten(1, (meta.block_size, meta.scale_bytes))
    return vals[blk, off], scs[blk, off]


@torch.library.custom_op("kda::indexer_k_gather", mutates_args=(), device_types="cpu")
def indexer_k_gather(
    kv_cache: Tensor, block_table: Tensor, cu_seq_lens: Tensor, num_tokens: int, head_dim: int,
    block_size: int = 0,
) -> tuple[Tensor, Tensor]:
    """Gather ``num_tokens`` K rows -> ``(values uint8 [N, head_dim], scales uint8 [N, 4G])``.

    ``kv_cache``: 3-D ``[num_blocks, block_size, head_dim + 4G]`` (``block_size`` 0) or a 2-D
    page buffer ``[num_pages, block_size * (head_dim + 4G)]``. Invalid indices: the module's
    rule (negative block ids wrap as Python indexing; what eager cannot compute is refused:
    an error on CPU, a device-side assert on CUDA)."""
    meta = validate(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim, block_size)
    return _gather_cpu(kv_cache, block_table, cu_seq_lens, num_tokens, meta, "num_tokens")


@indexer_k_gather.register_kernel("cuda")
def _indexer_k_gather_cuda(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim, block_size=0):
    meta = validate(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim, block_size)
    values = kv_cache.new_empty((num_tokens, head_dim))
    scales = kv_cache.new_empty((num_tokens, meta.scale_bytes))
    _launch(kv_cache, block_table, cu_seq_lens, values, scales, meta, None, None)
    return values, scales


@indexer_k_gather.register_fake
def _indexer_k_gather_fake(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim, block_size=0):
    meta = validate(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim, block_size)
    return (
        kv_cache.new_empty((num_tokens, head_dim)),
        kv_cache.new_empty((num_tokens, meta.scale_bytes)),
    )


@torch.library.custom_op(
    "kda::indexer_k_gather_out", mutates_args=("dst_value", "dst_scale"), device_types="cpu"
)
def indexer_k_gather_out(
    kv_cache: Tensor, dst_value: Tensor, dst_scale: Tensor, block_table: Tensor, cu_seq_lens: Tensor,
    block_size: int = 0,
) -> None:
    """Gather ``dst_value.shape[0]`` K rows in place into ``dst_value`` and ``dst_scale``
    (``kv_cache`` and invalid indices as ``kda::indexer_k_gather``)."""
    meta = validate(kv_cache, block_table, cu_seq_lens, block_size=block_size, dst_value=dst_value,
                    dst_scale=dst_scale)
    values, scales = _gather_cpu(
        kv_cache, block_table, cu_seq_lens, dst_value.shape[0], meta, "dst_value"
    )
    _byte_rows(dst_value).copy_(values)
    _byte_rows(dst_scale).copy_(scales)


@indexer_k_gather_out.register_kernel("cuda")
def _indexer_k_gather_out_cuda(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens, block_size=0):
    meta = validate(kv_cache, block_table, cu_seq_lens, block_size=block_size, dst_value=dst_value,
                    dst_scale=dst_scale)
    _launch(
        kv_cache, block_table, cu_seq_lens, _byte_rows(dst_value), _byte_rows(dst_scale),
        meta, None, None,
    )


@indexer_k_gather_out.register_fake
def _indexer_k_gather_out_fake(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens, block_size=0):
    validate(kv_cache, block_table, cu_seq_lens, block_size=block_size, dst_value=dst_value, dst_scale=dst_scale)


def aot_variants():
    """Both grids with and without the device asserts (head_dim 128, block 64), and the
    by-block grid for head_dim 512, for the ahead-of-time sm_90 compile check."""
    from kda_inductor.lowerings import AotVariant, debug_options

    common = dict(kv_ptr="*i32", bt_ptr="*i32", cu_ptr="*i32", dv_ptr="*i32", ds_ptr="*i32", num_tokens="i32",
                  num_reqs="i32", num_blocks="i32", bt_width="i32", kv_block_stride="i64", bt_stride_req="i32",
                  bt_stride_col="i32", dv_stride="i32", ds_stride="i32")
    by_token = dict(common, search_levels="i32", search_span="i32")
    for hd, check in ((128, True), (128, False), (512, True)):
        words = dict(BLOCK_SIZE=64, VALUE_WORDS=hd // 4, VALUE_WORDS_P2=hd // 4, SCALE_WORDS=hd // 128,
                     SCALE_WORDS_P2=hd // 128, BLOCK_T=16, CHECK=check)
        yield AotVariant(_gather_by_block_kernel, common, dict(words, SUBTILES=4), debug_options())
        if hd == 128:
            yield AotVariant(_gather_by_token_kernel, by_token, dict(words, FANOUT=DEFAULT_FANOUT), debug_options())
