"""fp8 e4m3 (``torch.float8_e4m3fn``): the constants and the Triton roundings the quantizing
ops share (``indexer_k_write``, ``gated_norm_quant``) and the references use
(``kda_inductor.reference``). The one definition of each: patterns import them from here too.

Two floors, two formulas (both keep an all-zero group's scale finite):

* ``AMAX_FLOOR``: DeepSeek-V3.2's indexer floors the group's absmax before dividing,
  ``scale = max(amax, 1e-4) / 448``;
* ``SCALE_FLOOR``: vLLM's dynamic quantization (``QuantFP8``) floors the scale itself,
  ``scale = max(amax / 448, 1 / (448 * 512))`` (vLLM's ``_FP8_MIN_SCALING_FACTOR``).

The Triton helpers round by integer arithmetic where the interpreter's casts truncate
(``e4m3_bits``, ``bf16_round``): exact on every backend and the same as torch's casts.
"""

from __future__ import annotations

import torch

from kda_inductor.lowerings._triton import tl, triton

FP8_MAX = 448.0
"""Largest finite fp8 e4m3 value: quantized values saturate at +-FP8_MAX."""
AMAX_FLOOR = 1e-4
"""The indexer's floor of a group's absmax before dividing by FP8_MAX."""
SCALE_FLOOR = 1.0 / (FP8_MAX * 512.0)
"""vLLM's ``_FP8_MIN_SCALING_FACTOR``: the floor of a dynamic fp8 scale."""
TINY_POW2_INPUT = 7.888609052210118e-31
"""2**-100: what ``dynamic_scale`` raises a zero or tiny scale to before its power-of-two
ceiling (far below ``SCALE_FLOOR``, so the floor still decides, as eager's 0 or 2**ceil)."""

__all__ = ["AMAX_FLOOR", "FP8_MAX", "SCALE_FLOOR", "aot_variants", "hardware_casts"]


def hardware_casts(t: torch.Tensor) -> bool:
    """Whether the kernels' ``HW_CASTS`` hold for ``t``'s device: a GPU that casts to fp8 e4m3 in
    hardware (compute capability 8.9+: Ada, Hopper and newer; Triton refuses ``float8e4nv`` below).
    Elsewhere (an A100, the interpreter) they round by integer arithmetic: the same bits, exact."""
    return t.is_cuda and torch.cuda.get_device_capability(t.device) >= (8, 9)

if triton is not None:
    _FP8_MAX = tl.constexpr(FP8_MAX)
    _AMAX_FLOOR = tl.constexpr(AMAX_FLOOR)
    _SCALE_FLOOR = tl.constexpr(SCALE_FLOOR)
    _TINY = tl.constexpr(TINY_POW2_INPUT)

    @triton.jit
    def ceil_pow2(scale):
        """``2 ** ceil(log2(scale))`` with float32 ``log2`` correctly rounded, as torch computes
        it, from the bits alone (positive normal ``scale``): ``ceil`` gives ``k + 1`` for
        ``scale = 2**k * (1 + m)``, ``m > 0``, unless ``k + log2(1 + m)`` rounds to ``k`` in
        float32, i.e. ``log2(1 + m)`` (about ``m / ln 2``) is below half the float32 gap
        above ``k``: ``mantissa < ln2 * 2**n`` with ``n = floor(log2 |k|) - 1`` (one less for
        negative powers of two, where the gap above ``k`` is the finer one below ``|k|``)."""
        bits = scale.to(tl.int32, bitcast=True)
        k = ((bits >> 23) & 0xFF) - 127
        mant = bits & 0x7FFFFF
        a = tl.maximum(tl.abs(k), 1)
        fl = ((a.to(tl.float32).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        pow2 = (a & (a - 1)) == 0
        n = fl - 1 - ((k < 0) & pow2).to(tl.int32)
        thr = (((n + 127) << 23).to(tl.float32, bitcast=True)) * 0.6931471805599453
        stays = (mant == 0) | ((mant.to(tl.float32) < thr) & (k != 0))
        e = tl.where(stays, k, k + 1)
        return ((e + 127) << 23).to(tl.float32, bitcast=True)

    @triton.jit
    def e4m3_bits(q):
        """float32 ``q`` with ``|q| <= 448`` -> fp8 e4m3fn bits (uint8), round to nearest even,
        by integer arithmetic: exact on every backend (the Triton interpreter's own fp8 cast
        halves some values next to a power of two) and the same as torch's cast."""
        bits = q.to(tl.int32, bitcast=True)
        sign = (bits >> 24) & 0x80
        a = bits & 0x7FFFFFFF
        e32 = a >> 23
        # normal fp8 (|q| >= 2**-6): keep 3 mantissa bits, the carry may bump the exponent
        normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - (120 << 3)
        # subnormal fp8: round(|q| * 2**9) to an integer (8 becomes the smallest normal)
        mant = (a & 0x7FFFFF) | 0x800000
        s = tl.minimum(141 - e32, 31)
        one = tl.full(s.shape, 1, tl.int32)
        sub = (mant + ((one << (s - 1)) - 1) + ((mant >> s) & 1)) >> s
        sub = tl.where(e32 == 0, 0, sub)
        enc = tl.minimum(tl.where(e32 >= 121, normal, sub), 0x7E)
        return (enc | sign).to(tl.uint8)

    @triton.jit
    def to_e4m3(q, HW_CASTS: tl.constexpr):
        """fp8 e4m3fn bits (uint8) of float32 ``q`` (``|q| <= 448``): the hardware's
        round-to-nearest-even cast (``HW_CASTS``, GPU) or ``e4m3_bits`` (the interpreter)."""
        if HW_CASTS:
            return q.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
        return e4m3_bits(q)

    @triton.jit
    def clamp_fp8(x):
        """``x`` clamped to ``[-FP8_MAX, FP8_MAX]`` (the saturation before the cast)."""
        return tl.minimum(tl.maximum(x, -_FP8_MAX), _FP8_MAX)

    @triton.jit
    def div_fp8_max(amax):
        """``amax / FP8_MAX``, correctly rounded (float32, as torch divides)."""
        return tl.math.div_rn(amax, tl.full(amax.shape, _FP8_MAX, tl.float32))

    @triton.jit
    def indexer_scale(absmax):
        """The indexer's scale ``max(absmax, AMAX_FLOOR) / FP8_MAX`` (before any ue8m0 ceiling)."""
        return div_fp8_max(tl.maximum(absmax, _AMAX_FLOOR))

    @triton.jit
    def dynamic_scale(amax, UE8M0: tl.constexpr):
        """vLLM's dynamic scale from the float32 ``amax`` (>= 0): ``amax / FP8_MAX``, with
        ``UE8M0`` its power-of-two ceiling, floored at ``SCALE_FLOOR``. A zero or tiny scale
        becomes ``TINY_POW2_INPUT`` before the ceiling (below the floor, as eager's 0 or 2**ceil)."""
        s = div_fp8_max(amax)
        if UE8M0:
            s = ceil_pow2(tl.maximum(s, _TINY))
        return tl.maximum(s, _SCALE_FLOOR)

    @triton.jit
    def bf16_round(y):
        """float32 ``y`` rounded to the nearest bfloat16 (ties to even), kept as float32, by
        integer arithmetic (the interpreter's bf16 cast truncates)."""
        yb = y.to(tl.int32, bitcast=True)
        yb = (yb + 0x7FFF + ((yb >> 16) & 1)) & -65536
        return yb.to(tl.float32, bitcast=True)


def aot_variants():
    """None of its own: the helpers compile inside the kernels that call them (their modules
    declare those launches)."""
    return iter(())
