"""``kda::gqa_decode_attention``: a decode step's attention, each kv head's query rows at once,
the keys split over programs (flash decoding).

``out[b, h, r] = softmax(scale * q[b, h, r] . k[b, h, s] + mask[b, h, r, s]) @ v[b, h, s]`` over
``s < S``, for ``query [B, Hkv, R, D]`` (the ``R`` query rows that share kv head ``h``: a grouped
query attention's group folded into rows, one query token each), ``key [B, Hkv, S, D]``, ``value
[B, Hkv, S, Dv]`` and an optional ``mask`` that broadcasts to ``[B, Hkv, R, S]``, bool (True:
attend) or float (added to the scores), as ``F.scaled_dot_product_attention`` takes them; ``scale``
None is ``1 / sqrt(D)``. The output is ``[B, Hkv, R, Dv]`` in the query's dtype. A row whose keys are
all masked is zeros (torch's math backend, ``_safe_softmax``).

The CPU implementation is ``F.scaled_dot_product_attention`` itself. The CUDA kernel (bf16 / fp16)
gives each program one kv head of one sequence and a slice of its keys: the ``R`` rows (padded to
16, a tensor-core tile) against ``BLOCK_S`` keys at a time, an online softmax in float32 (scores in
base 2), the probabilities rounded to the value's dtype for their product with V as flash
attention does; slices are merged by a second launch (their maxima and sums), or written directly
where one slice per head already fills the GPU. K and V are read once per kv head, not once per
query head. Its speed against the fused sdpa kernels: ``benchmarks/bench_gqa_decode_attention.py``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from kda_inductor.lowerings import arg_error as _err
from kda_inductor.lowerings import check_tensor, definitely
from kda_inductor.lowerings._gdn_tiles import sm_count
from kda_inductor.lowerings._triton import tl, triton

HALF = (torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256
"""The widest q / k and v rows the kernel takes (a [16, 256] float32 accumulator a program)."""
MAX_ROWS = 64
"""The most query rows per kv head the kernel takes (the group size ``n_rep``)."""
BLOCK_S = 32
"""Keys a program scores per step: 32 with 4 warps holds 256-wide heads in 227 registers a thread,
no spills (64: 255 and 424 stack bytes; 16: 150), compiled for sm_90 by ``tests/aot_sm90.py
--registers gqa_decode_attention`` (Triton 3.9); not yet timed against the others."""
STAGES = 2
"""Pipeline stages of the key loop: two K and V tiles in flight (64 KB each at 256-wide bf16 heads;
three would hold 192 KB of shared memory)."""
PROGRAMS_PER_SM = 2
"""Key slices are added until about this many programs per SM run."""


def _check(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_tensor(t, name)
        if t.dim() != 4:
            raise _err(name, f"expected a 4-D tensor [B, Hkv, {'R' if name == 'query' else 'S'}, D], "
                       f"got {t.dim()}-D {tuple(t.shape)}")
        if t.dtype != query.dtype or t.device != query.device:
            raise _err(name, f"expected query's dtype and device ({query.dtype}, {query.device}), "
                       f"got {t.dtype}, {t.device}")
    B, H, _, D = query.shape
    if not (definitely(key.shape[0] == B) and definitely(key.shape[1] == H) and definitely(key.shape[3] == D)):
        raise _err("key", f"expected [B={B}, Hkv={H}, S, D={D}] as query's, got {tuple(key.shape)}")
    if not (definitely(value.shape[0] == B) and definitely(value.shape[1] == H)
            and definitely(value.shape[2] == key.shape[2])):
        raise _err("value", f"expected [B={B}, Hkv={H}, S={key.shape[2]}, Dv], got {tuple(value.shape)}")
    if mask is not None:
        _check_mask(mask, query, key)


def _check_mask(mask: Tensor, query: Tensor, key: Tensor) -> None:
    check_tensor(mask, "mask")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise _err("mask", f"expected a bool or floating-point tensor, got {mask.dtype}")
    if mask.device != query.device:
        raise _err("mask", f"expected device {query.device}, got {mask.device}")
    full = (*query.shape[:3], key.shape[2])
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    if mask.dim() > 4 or any(not (definitely(m == 1) or definitely(m == f)) for m, f in zip(shape, full)):
        raise _err("mask", f"expected a shape that broadcasts to [B, Hkv, R, S] = {list(full)}, "
                   f"got {tuple(mask.shape)}")


@torch.library.custom_op("kda::gqa_decode_attention", mutates_args=(), device_types="cpu")
def gqa_decode_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None,
                         scale: float | None = None) -> Tensor:
    """``F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)`` for
    ``query [B, Hkv, R, D]``, ``key [B, Hkv, S, D]``, ``value [B, Hkv, S, Dv]``."""
    _check(query, key, value, mask)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale).contiguous()


@gqa_decode_attention.register_fake
def _gqa_decode_attention_fake(query, key, value, mask=None, scale=None):
    _check(query, key, value, mask)
    return query.new_empty((*query.shape[:3], value.shape[3]))


@gqa_decode_attention.register_kernel("cuda")
def _gqa_decode_attention_cuda(query, key, value, mask=None, scale=None):
    _check(query, key, value, mask)
    if refusal(query, value) is not None:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale).contiguous()
    out = query.new_empty((*query.shape[:3], value.shape[3]))
    attention_triton(query, key, value, mask, scale, out)
    return out


def refusal(query: Tensor, value: Tensor) -> str | None:
    """Why the Triton kernel does not take these shapes (the op then runs torch's sdpa), or None."""
    if query.dtype not in HALF:
        return f"{query.dtype} (the kernel takes bf16 / fp16)"
    if max(query.shape[3], value.shape[3]) > MAX_HEAD_DIM:
        return f"head dims {query.shape[3]} / {value.shape[3]} over {MAX_HEAD_DIM}"
    if query.shape[2] > MAX_ROWS:
        return f"{query.shape[2]} query rows per kv head, over {MAX_ROWS}"
    return None


def splits_for(heads: int, S: int, sms: int, block_s: int = BLOCK_S) -> tuple[int, int]:
    """``(splits, keys per split)``: slices of each head's keys, multiples of ``block_s``, added
    until about :data:`PROGRAMS_PER_SM` programs per SM run (one where the heads alone do)."""
    blocks = max(1, -(-S // block_s))
    splits = min(blocks, max(1, -(-PROGRAMS_PER_SM * sms // max(heads, 1))))
    per = -(-blocks // splits) * block_s
    return -(-max(S, 1) // per), per


# --------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _scores(q, k_ptr, m_ptr, s, ok, d, D, scale_log2, sk_s, sk_d, rows, R, sm_r, sm_s,
                MASK: tl.constexpr):
        """``[RP, BLOCK]`` base-2 scores of the rows against keys ``s`` (``ok``: in the slice), the
        mask applied (-inf where a key is masked or out of the slice)."""
        k = tl.load(k_ptr + s[:, None] * sk_s + d[None, :] * sk_d, mask=ok[:, None] & (d < D)[None, :], other=0.0)
        qk = tl.dot(q, tl.trans(k)) * scale_log2
        keep = ok[None, :] & (rows < R)[:, None]
        if MASK == 1:
            allowed = tl.load(m_ptr + rows[:, None] * sm_r + s[None, :] * sm_s, mask=keep, other=0)
            keep = keep & (allowed != 0)
        if MASK == 2:
            bias = tl.load(m_ptr + rows[:, None] * sm_r + s[None, :] * sm_s, mask=keep, other=0.0)
            qk += bias.to(tl.float32) * 1.4426950408889634
        return tl.where(keep, qk, float("-inf"))

    @triton.jit
    def _slice(q, k_ptr, v_ptr, m_ptr, start, end, D, DVN, scale_log2, sk_s, sk_d, sv_s, sv_d, rows, R,
               sm_r, sm_s, DP: tl.constexpr, DVP: tl.constexpr, RP: tl.constexpr, BLOCK: tl.constexpr,
               MASK: tl.constexpr):
        """The rows' online softmax over keys ``[start, end)``: ``(acc [RP, DVP], max, sum)``, the
        accumulator not yet divided by the sum (base-2 maxima)."""
        d = tl.arange(0, DP)
        dv = tl.arange(0, DVP)
        m_i = tl.full([RP], float("-inf"), tl.float32)
        l_i = tl.zeros([RP], tl.float32)
        acc = tl.zeros([RP, DVP], tl.float32)
        for s0 in range(start, end, BLOCK):
            s = s0 + tl.arange(0, BLOCK)
            ok = s < end
            qk = _scores(q, k_ptr, m_ptr, s, ok, d, D, scale_log2, sk_s, sk_d, rows, R, sm_r, sm_s, MASK)
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(qk - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + s[:, None] * sv_s + dv[None, :] * sv_d, mask=ok[:, None] & (dv < DVN)[None, :],
                        other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        return acc, m_i, l_i

    @triton.jit
    def partial_kernel(q_ptr, k_ptr, v_ptr, m_ptr, o_ptr, w_ptr, ml_ptr, S, per, R, H, D, DVN, scale_log2,
                      sq_b, sq_h, sq_r, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d,
                      sm_b, sm_h, sm_r, sm_s, so_b, so_h, so_r, so_d,
                      DP: tl.constexpr, DVP: tl.constexpr, RP: tl.constexpr, BLOCK: tl.constexpr,
                      MASK: tl.constexpr, DIRECT: tl.constexpr):
        """Program ``(split, b * H + h)``: kv head ``h`` of sequence ``b`` over its ``split``-th
        ``per`` keys; the normalized output (``DIRECT``: one split) or the slice's unnormalized
        accumulator, max and sum into the float32 workspace ``w`` / ``ml``."""
        split = tl.program_id(0)
        bh = tl.program_id(1)
        b = (bh // H).to(tl.int64)
        h = (bh % H).to(tl.int64)
        rows = tl.arange(0, RP)
        d = tl.arange(0, DP)
        q = tl.load(q_ptr + b * sq_b + h * sq_h + rows[:, None] * sq_r + d[None, :] * sq_d,
                    mask=(rows < R)[:, None] & (d < D)[None, :], other=0.0)
        start = split * per
        end = tl.minimum(start + per, S)
        acc, m_i, l_i = _slice(q, k_ptr + b * sk_b + h * sk_h, v_ptr + b * sv_b + h * sv_h, m_ptr + b * sm_b + h * sm_h,
                               start, end, D, DVN, scale_log2, sk_s, sk_d, sv_s, sv_d, rows, R, sm_r, sm_s,
                               DP, DVP, RP, BLOCK, MASK)
        dv = tl.arange(0, DVP)
        keep = (rows < R)[:, None] & (dv < DVN)[None, :]
        if DIRECT:
            out = tl.where(l_i[:, None] > 0, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)
            tl.store(o_ptr + b * so_b + h * so_h + rows[:, None] * so_r + dv[None, :] * so_d,
                     out.to(o_ptr.dtype.element_ty), mask=keep)
        else:
            slot = bh.to(tl.int64) * tl.num_programs(0) + split
            tl.store(w_ptr + (slot * RP + rows[:, None]) * DVP + dv[None, :], acc)
            tl.store(ml_ptr + (slot * 2 * RP) + rows, m_i)
            tl.store(ml_ptr + (slot * 2 * RP) + RP + rows, l_i)

    @triton.jit
    def merge_kernel(w_ptr, ml_ptr, o_ptr, splits, R, H, DVN, so_b, so_h, so_r, so_d,
                    DVP: tl.constexpr, RP: tl.constexpr):
        """Program ``b * H + h``: its slices merged (rescaled to their common max), normalized,
        written in the output's dtype; zeros for a row with no unmasked key."""
        bh = tl.program_id(0).to(tl.int64)
        rows = tl.arange(0, RP)
        dv = tl.arange(0, DVP)
        m_all = tl.full([RP], float("-inf"), tl.float32)
        l_all = tl.zeros([RP], tl.float32)
        acc = tl.zeros([RP, DVP], tl.float32)
        for j in range(0, splits):
            slot = bh * splits + j
            m_j = tl.load(ml_ptr + slot * 2 * RP + rows)
            l_j = tl.load(ml_ptr + slot * 2 * RP + RP + rows)
            a_j = tl.load(w_ptr + (slot * RP + rows[:, None]) * DVP + dv[None, :])
            m_new = tl.maximum(m_all, m_j)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            old, new = tl.exp2(m_all - m_safe), tl.exp2(m_j - m_safe)
            acc = acc * old[:, None] + a_j * new[:, None]
            l_all = l_all * old + l_j * new
            m_all = m_new
        out = tl.where(l_all[:, None] > 0, acc / tl.where(l_all > 0, l_all, 1.0)[:, None], 0.0)
        b, h = bh // H, bh % H
        tl.store(o_ptr + b * so_b + h * so_h + rows[:, None] * so_r + dv[None, :] * so_d,
                 out.to(o_ptr.dtype.element_ty), mask=(rows < R)[:, None] & (dv < DVN)[None, :])



def _p2(n: int, least: int) -> int:
    return max(least, 1 << max(0, int(n) - 1).bit_length())


def _mask_view(mask: Tensor | None, full: tuple[int, ...]) -> tuple[Tensor | None, int, tuple[int, ...]]:
    """``(mask expanded to [B, Hkv, R, S] (strides 0 where broadcast), kind, strides)``; kind 0:
    none, 1: bool, 2: additive."""
    if mask is None:
        return None, 0, (0, 0, 0, 0)
    m = mask[(None,) * (4 - mask.dim())].expand(full)
    return m, (1 if m.dtype == torch.bool else 2), tuple(m.stride())


def attention_triton(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, scale: float | None,
                     out: Tensor, block_s: int = BLOCK_S, sms: int | None = None, num_warps: int = 4) -> None:
    """Launch the kernel(s) into ``out [B, Hkv, R, Dv]`` (checked shapes, bf16 / fp16)."""
    B, H, R, D = query.shape
    S, DV = key.shape[2], value.shape[3]
    if B * H * R == 0:
        return
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    m, kind, sm = _mask_view(mask, (B, H, R, S))
    splits, per = splits_for(B * H, S, sm_count(query.device) if sms is None else sms, block_s)
    RP, DP, DVP = _p2(R, 16), _p2(D, 16), _p2(DV, 16)
    direct = splits == 1
    w = ml = out
    if not direct:
        w = torch.empty((B * H * splits * RP * DVP,), device=query.device, dtype=torch.float32)
        ml = torch.empty((B * H * splits * 2 * RP,), device=query.device, dtype=torch.float32)
    partial_kernel[(splits, B * H)](
        query, key, value, query if m is None else m, out, w, ml, S, per, R, H, D, DV, scale * 1.4426950408889634,
        *query.stride(), *key.stride(), *value.stride(), *sm, *out.stride(),
        DP=DP, DVP=DVP, RP=RP, BLOCK=block_s, MASK=kind, DIRECT=direct, num_warps=num_warps, num_stages=STAGES)
    if not direct:
        merge_kernel[(B * H,)](w, ml, out, splits, R, H, DV, *out.stride(), DVP=DVP, RP=RP, num_warps=num_warps)


def aot_variants():
    """The launches to compile ahead of time for sm_90: Qwen3-Next's decode attention (8 rows of
    256-wide heads) with a bool mask, split and direct, and its merge."""
    from kda_inductor.lowerings import AotVariant

    ints = ("S", "per", "R", "H", "D", "DVN", "sq_b", "sq_h", "sq_r", "sk_b", "sk_h", "sk_s", "sv_b", "sv_h", "sv_s",
            "sm_b", "sm_s", "so_b", "so_h", "so_r")
    ones = ("sq_d", "sk_d", "sv_d", "so_d")
    zeros = ("sm_h", "sm_r")
    types = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "m_ptr": "*i1", "o_ptr": "*bf16",
             "w_ptr": "*fp32", "ml_ptr": "*fp32", "scale_log2": "fp32", **{n: "i32" for n in ints + ones + zeros}}
    for direct in (False, True):
        constexprs = {"DP": 256, "DVP": 256, "RP": 16, "BLOCK": BLOCK_S, "MASK": 1, "DIRECT": direct}
        yield AotVariant(partial_kernel, types, constexprs, {"num_warps": 4, "num_stages": STAGES})
    merge_types = {"w_ptr": "*fp32", "ml_ptr": "*fp32", "o_ptr": "*bf16", "splits": "i32", "R": "i32", "H": "i32",
                   "DVN": "i32", "so_b": "i32", "so_h": "i32", "so_r": "i32", "so_d": "i32"}
    yield AotVariant(merge_kernel, merge_types, {"DVP": 256, "RP": 16}, {"num_warps": 4})
