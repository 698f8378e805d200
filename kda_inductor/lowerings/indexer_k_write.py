"""``kda::indexer_k_write``: LayerNorm + fp8 quantization + paged-cache write, in place.

``kda::indexer_k_write(kv_cache, k, slot_mapping, weight, bias, eps, ue8m0, round_norm=True,
block_size=0, wrap_negative=False)``. For each token ``t`` of ``k [T, D]`` with slot ``s =
slot_mapping[t]``:

* optional LayerNorm (``weight``/``bias`` float32 ``[D]``, computed in float32 and cast back
  to ``k``'s dtype, as DeepSeek-V3.2's indexer ``k_norm``; with ``round_norm=False`` kept in
  float32: the graph Inductor hands us after its joint-graph pass drops a
  float32 -> bf16 -> float32 round trip, as torch 2.9-2.11 do);
* per group of 128 values: ``scale = max(amax(|x|), 1e-4) / 448``, with ``ue8m0`` rounded up
  to a power of two exactly as ``2 ** ceil(log2(scale))`` computes it in float32;
  ``q = fp8_e4m3(clamp(x / scale, -448, 448))``;
* the ``D`` value bytes go to block ``s // block_size`` at byte ``(s % block_size) * D`` and
  the ``G = D // 128`` float32 scales (little-endian) at ``block_size * D + (s % block_size)
  * 4G``: the blocked layout (``docs/indexer-cache.md``) that ``kda::indexer_k_gather`` reads.

``kv_cache`` is uint8 ``[num_blocks, block_size, D + 4G]`` (``block_size`` 0: its
``shape[1]``) or SGLang's 2-D page buffer ``[num_pages, block_size * (D + 4G)]`` (then
``block_size``, tokens per page, is required), each block contiguous (the block stride is
free). Nothing outside the written slots changes. Two tokens with one slot: one of them
wins (which one is unspecified, as with ``index_put_``).

Slots (the rule, next to the op), with ``num_slots = num_blocks *
block_size``:

* ``wrap_negative=False`` (code that masks padding, ``torch.where(slot >= 0, new, old)``,
  e.g. :func:`kda_inductor.reference.write_indexer_k`): a slot < 0 is padding and skipped;
* ``wrap_negative=True`` (code that does not mask: ``flat[s // bs, ...] = q``): a slot ``s``
  in ``[-num_slots, 0)`` is written at ``s + num_slots`` exactly as Python indexing does it
  (``s // bs`` floors to block ``-1``, ``s % bs`` is ``bs - 1`` for ``s = -1``: the last row of
  the last block); below ``-num_slots`` it is out of range;
* a slot ``>= num_slots`` (or below ``-num_slots`` with ``wrap_negative``) is refused: eager
  raises ``IndexError``, stock Inductor traps with a device-side assert; so do we (CPU: an
  ``IndexError`` naming ``slot_mapping``, before anything is written; CUDA: a device-side
  assert).

All arguments are validated (dtypes, shapes, devices) before anything is written, so a call
rejected on the host leaves the cache untouched. The CPU kernel is plain torch with the
reference math (bit-identical to :func:`kda_inductor.reference.write_indexer_k`). The CUDA
kernel is the Triton launcher :func:`write_triton`: sync-free, CUDA-graph safe, compiled in
Triton's debug mode (overflow checks off) so its ``tl.device_assert`` traps a refused slot;
the interpreter traps the same way. ``write_triton(..., check=False)`` is the explicit
no-assert variant (benchmarks only, never used by the op): refused slots are then skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from kda_inductor.lowerings import arg_error as _err
from kda_inductor.lowerings import (
    block_for_programs,
    cache_bytes,
    check_kv_cache,
    check_tensor,
    definitely,
    interpreter_checks,
    triton_launch_options,
)
from kda_inductor.lowerings._fp8 import AMAX_FLOOR, FP8_MAX, hardware_casts
from kda_inductor.lowerings._triton import tl, triton
from kda_inductor.reference import QUANT_GROUP, CacheLayout, layer_norm_k, quantize_k

__all__ = ["indexer_k_write", "validate", "write_triton"]

_K_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)


# --------------------------------------------------------------------------------------
# validation (shared by the op, its fake impl and the launcher)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Meta:
    num_tokens: int
    num_blocks: int
    block_size: int
    head_dim: int
    groups: int

    @property
    def layout(self) -> CacheLayout:
        return CacheLayout(self.head_dim, self.block_size)


def validate(kv_cache, k, slot_mapping, weight, bias, eps, block_size=0, wrap_negative=False) -> _Meta:
    """The op's one validator (its CPU, CUDA and fake impls, :func:`write_triton`, and the
    pattern, whose ``Stage.VALIDATED`` misses quote its errors): sync-free checks of everything
    but slot values, each bad argument an error naming it; returns the geometry. Symbolic sizes
    (the fake impl's and the pattern's) are checked where known at trace time: never a guard."""
    for x, arg in ((kv_cache, "kv_cache"), (k, "k"), (slot_mapping, "slot_mapping")):
        check_tensor(x, arg)
    if k.dim() != 2 or k.dtype not in _K_DTYPES:
        raise _err("k", f"expected a 2-D bfloat16/float16/float32 tensor, got {k.dim()}-D {k.dtype}")
    num_tokens, head_dim = k.shape
    if isinstance(head_dim, int) and (head_dim <= 0 or head_dim % QUANT_GROUP):
        raise _err("k", f"head_dim (k.shape[1]) must be a positive multiple of {QUANT_GROUP}, got {head_dim}")
    groups = CacheLayout(head_dim).groups
    num_blocks, block_size = check_kv_cache(kv_cache, head_dim, block_size)
    if not isinstance(wrap_negative, bool):
        raise _err("wrap_negative", f"expected a bool, got {type(wrap_negative).__name__}", TypeError)
    if slot_mapping.dim() != 1 or slot_mapping.dtype not in _INDEX_DTYPES:
        raise _err(
            "slot_mapping",
            f"expected a 1-D int32/int64 tensor, got {slot_mapping.dim()}-D {slot_mapping.dtype}",
        )
    if definitely(slot_mapping.shape[0] != num_tokens):
        raise _err("slot_mapping", f"expected {num_tokens} entries (k.shape[0]), got {slot_mapping.shape[0]}")
    _check_norm(weight, bias, eps, head_dim)
    for x, arg in ((k, "k"), (slot_mapping, "slot_mapping"), (weight, "weight"), (bias, "bias")):
        if x is not None and x.device != kv_cache.device:
            raise _err(arg, f"expected device {kv_cache.device} (kv_cache's), got {x.device}")
    return _Meta(num_tokens, num_blocks, block_size, head_dim, groups)


def _check_norm(weight, bias, eps, head_dim) -> None:
    """The LayerNorm's arguments: float32 ``[head_dim]`` weight and bias (both or neither), eps."""
    if (weight is None) != (bias is None):
        raise _err("weight" if weight is None else "bias", "weight and bias come together (both or neither)")
    for x, arg in ((weight, "weight"), (bias, "bias")):
        if x is None:
            continue
        check_tensor(x, arg)
        if x.dim() != 1 or x.dtype != torch.float32 or definitely(x.shape[0] != head_dim):
            raise _err(arg, f"expected a float32 tensor [{head_dim}], got {x.dtype}{list(x.shape)}")
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise _err("eps", f"expected a finite float >= 0, got {eps!r}")


# --------------------------------------------------------------------------------------
# Triton kernel and launcher
# --------------------------------------------------------------------------------------
if triton is not None:
    from kda_inductor.lowerings._fp8 import bf16_round, ceil_pow2, clamp_fp8, indexer_scale, to_e4m3

    @triton.jit
    def _slots(slot_ptr, t, in_range, num_slots, WRAP_NEGATIVE: tl.constexpr, CHECK: tl.constexpr):
        """Tokens ``t``'s slots (int64) and which of them are written (the kernel's rule)."""
        slot = tl.load(slot_ptr + t, mask=in_range, other=-1).to(tl.int64)
        if WRAP_NEGATIVE:
            slot = tl.where(slot < 0, slot + num_slots, slot)
            if CHECK:
                tl.device_assert(~in_range | ((slot >= 0) & (slot < num_slots)),
                                 "indexer_k_write: slot out of range [-num_slots, num_slots)")
        elif CHECK:
            tl.device_assert(~in_range | (slot < num_slots), "indexer_k_write: slot >= num_blocks * block_size")
        return slot, in_range & (slot >= 0) & (slot < num_slots)

    @triton.jit
    def _layer_norm(x, d, dmask, k_ptr, w_ptr, b_ptr, eps, HEAD_DIM: tl.constexpr, K_BF16: tl.constexpr,
                    HW_CASTS: tl.constexpr, ROUND_NORM: tl.constexpr):
        """LayerNorm of the float32 rows ``x`` (masked columns 0), rounded to ``k``'s dtype
        unless ``ROUND_NORM`` is off; back in float32."""
        mean = tl.sum(x, axis=1) / HEAD_DIM
        xc = tl.where(dmask[None, :], x - mean[:, None], 0.0)
        var = tl.sum(xc * xc, axis=1) / HEAD_DIM
        rstd = 1.0 / tl.sqrt_rn(var + eps)
        w = tl.load(w_ptr + d, mask=dmask, other=0.0)
        b = tl.load(b_ptr + d, mask=dmask, other=0.0)
        y = xc * rstd[:, None] * w[None, :] + b[None, :]
        if not ROUND_NORM:  # the normalized k stays float32
            x = y
        elif K_BF16 and not HW_CASTS:  # to bfloat16, nearest even, by hand
            x = bf16_round(y)
        else:  # LayerNorm's output dtype is k's
            x = y.to(k_ptr.dtype.element_ty).to(tl.float32)
        return x

    @triton.jit
    def _quantize(x, BLOCK_T: tl.constexpr, GROUPS_P2: tl.constexpr, UE8M0: tl.constexpr, HW_CASTS: tl.constexpr):
        """``(fp8 bits [BLOCK_T, GROUPS_P2 * 128], float32 scales [BLOCK_T, GROUPS_P2])`` of the
        rows ``x``: ``reference.quantize_k``."""
        xg = tl.reshape(x, [BLOCK_T, GROUPS_P2, 128])
        scale = indexer_scale(tl.max(tl.abs(xg), axis=2))
        if UE8M0:
            scale = ceil_pow2(scale)
            # x / 2**e == x * 2**-e exactly (same real value, same rounding); 2**-e from the bits
            recip = ((254 - ((scale.to(tl.int32, bitcast=True) >> 23) & 0xFF)) << 23).to(tl.float32, bitcast=True)
            q = xg * recip[:, :, None]
        else:
            q = tl.math.div_rn(xg, tl.broadcast_to(scale[:, :, None], [BLOCK_T, GROUPS_P2, 128]))
        return to_e4m3(tl.reshape(clamp_fp8(q), [BLOCK_T, GROUPS_P2 * 128]), HW_CASTS), scale

    @triton.jit
    def _store_scales(kv_ptr, base, off, scale, valid, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                      GROUPS: tl.constexpr, GROUPS_P2: tl.constexpr, BLOCK_T: tl.constexpr):
        """The float32 scales as 4 little-endian bytes each (no alignment needed), after the
        block's values."""
        sbits = tl.reshape(
            tl.broadcast_to(scale.to(tl.int32, bitcast=True)[:, :, None], [BLOCK_T, GROUPS_P2, 4]),
            [BLOCK_T, GROUPS_P2 * 4],
        )
        j = tl.arange(0, GROUPS_P2 * 4)
        sbytes = ((sbits >> (8 * (j % 4))[None, :]) & 0xFF).to(tl.uint8)
        s_addr = (base + BLOCK_SIZE * HEAD_DIM + off * (4 * GROUPS))[:, None] + j[None, :]
        tl.store(kv_ptr + s_addr, sbytes, mask=valid[:, None] & (j < 4 * GROUPS)[None, :])

    @triton.jit(do_not_specialize=["num_tokens", "num_slots", "eps"], debug=True)
    def _write_kernel(
        kv_ptr, k_ptr, slot_ptr, w_ptr, b_ptr,
        num_tokens, num_slots, k_stride_t, k_stride_d, kv_block_stride, eps,
        BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, GROUPS: tl.constexpr,
        GROUPS_P2: tl.constexpr, BLOCK_T: tl.constexpr, NORM: tl.constexpr, UE8M0: tl.constexpr,
        K_BF16: tl.constexpr, HW_CASTS: tl.constexpr, ROUND_NORM: tl.constexpr,
        WRAP_NEGATIVE: tl.constexpr, CHECK: tl.constexpr,
    ):
        """Program p normalizes, quantizes and stores tokens [p * BLOCK_T, +BLOCK_T).

        ``HW_CASTS`` (GPU): bf16 and fp8 by the hardware's round-to-nearest-even casts, as
        torch's own kernels do. Without it (the interpreter, whose casts truncate), the same
        roundings by integer arithmetic: slower, and bit-identical. ``WRAP_NEGATIVE``: slots
        in [-num_slots, 0) count from the end (else negative slots are padding); ``CHECK``:
        assert that every other slot is in range (else out-of-range slots are skipped)."""
        t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        in_range = t < num_tokens
        slot, valid = _slots(slot_ptr, t, in_range, num_slots, WRAP_NEGATIVE, CHECK)
        d = tl.arange(0, GROUPS_P2 * 128)
        dmask = d < HEAD_DIM
        m2 = valid[:, None] & dmask[None, :]
        # k's load does not wait for the slots (masked by range only): one round trip, not two
        x = tl.load(k_ptr + t[:, None] * k_stride_t + d[None, :] * k_stride_d,
                    mask=in_range[:, None] & dmask[None, :], other=0.0)
        x = x.to(tl.float32)
        if NORM:
            x = _layer_norm(x, d, dmask, k_ptr, w_ptr, b_ptr, eps, HEAD_DIM, K_BF16, HW_CASTS, ROUND_NORM)
        q, scale = _quantize(x, BLOCK_T, GROUPS_P2, UE8M0, HW_CASTS)
        off = slot % BLOCK_SIZE
        base = (slot // BLOCK_SIZE) * kv_block_stride  # int64: caches can exceed 2**31 bytes
        tl.store(kv_ptr + (base + off * HEAD_DIM)[:, None] + d[None, :], q, mask=m2)
        _store_scales(kv_ptr, base, off, scale, valid, BLOCK_SIZE, HEAD_DIM, GROUPS, GROUPS_P2, BLOCK_T)


MAX_BLOCK_VALUES = 1024
TARGET_PROGRAMS = 1024


def default_block_t(head_dim: int, num_tokens: int | None = None) -> int:
    """Tokens per program, a power of two: up to ``MAX_BLOCK_VALUES`` values (8 tokens of
    128), halved while fewer than ``TARGET_PROGRAMS`` programs would run (one token per
    program for decode). From the H200 sweep (``benchmarks/tune_indexer_k_write.py``, head_dim
    128; its figures: ``benchmarks/results/indexer_k_write.md``, "Kernel sweep"): decode best at
    1 token and 1 warp per program, large T at 8-16 tokens."""
    if triton is None:  # pragma: no cover
        raise RuntimeError("indexer_k_write: the Triton kernel needs triton, which is not installed")
    block = max(1, MAX_BLOCK_VALUES // triton.next_power_of_2(head_dim))
    if num_tokens is None:
        return block
    return block_for_programs(block, lambda b: -(-num_tokens // b), TARGET_PROGRAMS)


def _launch(kv_cache, k, slot_mapping, weight, bias, eps, ue8m0, meta: _Meta,
            block_t: int | None = None, num_warps: int | None = None, hw_casts: bool | None = None,
            round_norm: bool = True, wrap_negative: bool = False, check: bool = True) -> None:
    if triton is None:  # pragma: no cover
        raise RuntimeError("indexer_k_write: the Triton kernel needs triton, which is not installed")
    if meta.num_tokens == 0 or (meta.num_blocks == 0 and not check):
        return  # (an empty cache with checks: every real slot is out of range, the kernel traps)
    kv = cache_bytes(kv_cache)
    block_t = block_t or default_block_t(meta.head_dim, meta.num_tokens)
    groups_p2 = triton.next_power_of_2(meta.groups)
    if num_warps is None:  # one warp per 512 values
        num_warps = max(1, min(8, block_t * groups_p2 * 128 // 512))
    if hw_casts is None:
        hw_casts = hardware_casts(kv_cache)
    norm = weight is not None
    extra = triton_launch_options() if kv_cache.is_cuda else {}
    with interpreter_checks(check and not kv_cache.is_cuda):
        _write_kernel[(triton.cdiv(meta.num_tokens, block_t),)](
            kv, k, slot_mapping, weight if norm else k, bias if norm else k,
            meta.num_tokens, meta.num_blocks * meta.block_size, k.stride(0), k.stride(1),
            kv.stride(0), float(eps),
            BLOCK_SIZE=meta.block_size, HEAD_DIM=meta.head_dim, GROUPS=meta.groups,
            GROUPS_P2=groups_p2, BLOCK_T=block_t, NORM=norm, UE8M0=bool(ue8m0),
            K_BF16=k.dtype == torch.bfloat16, HW_CASTS=bool(hw_casts), ROUND_NORM=bool(round_norm),
            WRAP_NEGATIVE=bool(wrap_negative), CHECK=bool(check), num_warps=num_warps, **extra,
        )


def write_triton(kv_cache: Tensor, k: Tensor, slot_mapping: Tensor, weight: Tensor | None = None,
                 bias: Tensor | None = None, eps: float = 1e-6, ue8m0: bool = False, *,
                 block_size: int = 0, wrap_negative: bool = False, block_t: int | None = None,
                 num_warps: int | None = None, hw_casts: bool | None = None, round_norm: bool = True,
                 check: bool = True) -> None:
    """The Triton kernel on validated metadata; slot values are checked by device-side
    asserts (the module's rule). ``check=False`` drops the asserts: an explicit fast path
    for measuring their cost, never used by the op (refused slots are then skipped). No host
    sync, no allocation: safe under CUDA-graph capture. ``hw_casts``: hardware bf16/fp8
    casts (default: on CUDA tensors) or integer roundings."""
    meta = validate(kv_cache, k, slot_mapping, weight, bias, eps, block_size, wrap_negative)
    if block_t is not None and not (block_t > 0 and block_t & (block_t - 1) == 0):
        raise _err("block_t", f"expected a positive power of two, got {block_t}")
    _launch(kv_cache, k, slot_mapping, weight, bias, eps, ue8m0, meta, block_t, num_warps, hw_casts, round_norm,
            wrap_negative, check)


# --------------------------------------------------------------------------------------
# custom op
# --------------------------------------------------------------------------------------
def _write_cpu(kv_cache, k, slot_mapping, weight, bias, eps, ue8m0, meta: _Meta, round_norm: bool = True,
               wrap_negative: bool = False, check_only: bool = False) -> None:
    slots = slot_mapping.to(torch.int64)
    total = meta.num_blocks * meta.block_size
    if wrap_negative:
        bad = torch.nonzero((slots >= total) | (slots < -total))
    else:
        bad = torch.nonzero(slots >= total)
    if bad.numel():  # checked before anything is written
        t = int(bad[0, 0])
        lo = -total if wrap_negative else 0
        raise _err(
            "slot_mapping",
            f"slot {int(slots[t])} (token {t}) out of range [{lo}, {total}) for {meta.num_blocks} blocks of "
            f"{meta.block_size}" + ("" if wrap_negative else " (slots < 0 are padding)"),
            IndexError,
        )
    if check_only:
        return
    if wrap_negative:  # Python indexing: s in [-total, 0) is s + total
        slots = torch.where(slots < 0, slots + total, slots)
    if weight is not None:
        k = layer_norm_k(k, weight, bias, eps, round_to_input=round_norm)
    q, scale = quantize_k(k, ue8m0)
    keep = torch.nonzero(slots >= 0).flatten()
    blk, off = slots[keep] // meta.block_size, slots[keep] % meta.block_size
    flat = cache_bytes(kv_cache)
    bs, hd = meta.block_size, meta.head_dim
    vals = flat[:, : bs * hd].unflatten(1, (bs, hd))
    scs = flat[:, bs * hd :].unflatten(1, (bs, meta.layout.scale_bytes))
    vals[blk, off] = q.view(torch.uint8)[keep]
    scs[blk, off] = scale.contiguous().view(torch.uint8)[keep]


def _fp8_max(fp8_max_input: Tensor | None) -> float:
    """The scale divisor: 448, or the lifted float ``dynamic=True`` made of it (a 0-d CPU
    tensor: reading it is no device sync)."""
    if fp8_max_input is None:
        return FP8_MAX
    if not (isinstance(fp8_max_input, Tensor) and fp8_max_input.dim() == 0 and fp8_max_input.device.type == "cpu"
            and fp8_max_input.is_floating_point()):
        raise _err("fp8_max_input", f"expected a 0-d floating-point CPU tensor, got {fp8_max_input!r}")
    return float(fp8_max_input)


def _write_other_divisor(kv_cache, k, slot_mapping, weight, bias, eps, ue8m0, meta: _Meta, round_norm, wrap_negative,
                         divisor: float) -> None:
    """The matched code with a scale divisor other than 448 (a lifted float that changed),
    in torch ops, sync-free: what the code computes, slower than the kernel."""
    if weight is not None:
        k = layer_norm_k(k, weight, bias, eps, round_to_input=round_norm)
    t, d = k.shape
    x = k.float().view(t, d // QUANT_GROUP, QUANT_GROUP)
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=AMAX_FLOOR) / divisor
    if ue8m0:
        scale = torch.pow(2.0, torch.ceil(torch.log2(scale)))
    q = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(t, d)
    total = meta.num_blocks * meta.block_size
    slots = slot_mapping.to(torch.int64)
    slots = torch.where(slots < 0, slots + total, slots) if wrap_negative else slots
    valid = (slots >= 0)[:, None]
    slots = slots.clamp(min=0)
    blk, off = slots // meta.block_size, slots % meta.block_size
    flat = cache_bytes(kv_cache)
    bs, hd = meta.block_size, meta.head_dim
    vals = flat[:, : bs * hd].unflatten(1, (bs, hd))
    scs = flat[:, bs * hd :].unflatten(1, (bs, meta.layout.scale_bytes))
    vals[blk, off] = torch.where(valid, q.view(torch.uint8), vals[blk, off])
    scs[blk, off] = torch.where(valid, scale.reshape(t, -1).contiguous().view(torch.uint8), scs[blk, off])


@torch.library.custom_op("kda::indexer_k_write", mutates_args=("kv_cache",), device_types="cpu")
def indexer_k_write(
    kv_cache: Tensor, k: Tensor, slot_mapping: Tensor, weight: Tensor | None, bias: Tensor | None,
    eps: float, ue8m0: bool, round_norm: bool = True, block_size: int = 0, wrap_negative: bool = False,
    fp8_max_input: Tensor | None = None,
) -> None:
    """Normalize (if ``weight``; rounded to ``k``'s dtype if ``round_norm``), quantize and
    store ``k`` at ``slot_mapping`` in ``kv_cache`` (3-D, or 2-D pages of ``block_size``
    tokens). Slots < 0: skipped, or with ``wrap_negative`` counted from the end as Python
    indexing does; out of range: refused (the module's rule). ``fp8_max_input``: the scale
    divisor as the 0-d CPU tensor ``dynamic=True`` lifts ``FP8_MAX`` to; compared with 448 on
    the host at each call (no device sync); another value runs the matched code's formula."""
    meta = validate(kv_cache, k, slot_mapping, weight, bias, eps, block_size, wrap_negative)
    divisor = _fp8_max(fp8_max_input)
    if divisor != FP8_MAX:
        _write_cpu(kv_cache, k, slot_mapping, weight, bias, eps, ue8m0, meta, round_norm, wrap_negative,
                   check_only=True)
        _write_other_divisor(kv_cache, k, slot_mapping, weight, bias, eps, ue8m0, meta, round_norm, wrap_negative,
                             divisor)
        return
    _write_cpu(kv_cache, k, slot_mapping, weight, bias, eps, ue8m0, meta, round_norm, wrap_negative)


@indexer_k_write.register_kernel("cuda")
def _indexer_k_write_cuda(kv_cache, k, slot_mapping, weight, bias, eps, ue8m0, round_norm=True, block_size=0,
                          wrap_negative=False, fp8_max_input=None):
    meta = validate(kv_cache, k, slot_mapping, weight, bias, eps, block_size, wrap_negative)
    divisor = _fp8_max(fp8_max_input)
    if divisor != FP8_MAX:
        _write_other_divisor(kv_cache, k, slot_mapping, weight, bias, eps, ue8m0, meta, round_norm, wrap_negative,
                             divisor)
        return
    _launch(kv_cache, k, slot_mapping, weight, bias, eps, ue8m0, meta, round_norm=round_norm,
            wrap_negative=wrap_negative)


@indexer_k_write.register_fake
def _indexer_k_write_fake(kv_cache, k, slot_mapping, weight, bias, eps, ue8m0, round_norm=True, block_size=0,
                          wrap_negative=False, fp8_max_input=None):
    validate(kv_cache, k, slot_mapping, weight, bias, eps, block_size, wrap_negative)


def aot_variants():
    """head_dim 128 / 512, with and without the norm, plain / ue8m0 scales, both cast paths
    (asserts on, negative slots skipped: the op's defaults), plus wrap_negative and the
    no-assert variants, for the ahead-of-time sm_90 compile check."""
    import itertools

    from kda_inductor.lowerings import AotVariant, debug_options

    types = dict(kv_ptr="*u8", k_ptr="*bf16", slot_ptr="*i64", w_ptr="*fp32", b_ptr="*fp32", num_tokens="i32",
                 num_slots="i32", k_stride_t="i32", k_stride_d="i32", kv_block_stride="i32", eps="fp32")
    base = dict(BLOCK_SIZE=64, GROUPS_P2=1, BLOCK_T=4, K_BF16=True, WRAP_NEGATIVE=False, CHECK=True)
    for (hd, g), norm, ue, hw in itertools.product(((128, 1), (512, 4)), (False, True), (False, True), (False, True)):
        consts = dict(base, HEAD_DIM=hd, GROUPS=g, GROUPS_P2=g, NORM=norm, UE8M0=ue, HW_CASTS=hw,
                      ROUND_NORM=not (norm and hw and ue))
        yield AotVariant(_write_kernel, types, consts, debug_options())
    plain = dict(base, HEAD_DIM=128, GROUPS=1, NORM=True, UE8M0=True, HW_CASTS=True, ROUND_NORM=True)
    yield AotVariant(_write_kernel, types, dict(plain, WRAP_NEGATIVE=True), debug_options())
    yield AotVariant(_write_kernel, types, dict(plain, WRAP_NEGATIVE=True, CHECK=False), debug_options())
    yield AotVariant(_write_kernel, types, dict(plain, CHECK=False), debug_options())
