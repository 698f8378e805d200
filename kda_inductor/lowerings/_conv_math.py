"""The arithmetic the ``kda::causal_conv1d`` kernels share (``_conv_kernels.py``'s register
window and blocks of taps, ``_conv_stream.py``'s streaming window): roundings to the conv's
dtypes as eager's casts, eager's silu, the taps' sum in aten's order (the bias, then one FMA per
tap, oldest first, in float32), token rows, a tile's halo and the register window's step
(``shift``)."""

from __future__ import annotations

from kda_inductor.lowerings._triton import tl, triton

__all__ = ["aot_variants", "halo", "round_to", "sel", "shift", "silu", "taps", "to_w", "when", "xrow"]

halo = round_to = sel = shift = silu = taps = to_w = when = xrow = None

if triton is not None:
    try:
        from triton.language.extra import libdevice
    except ImportError:  # pragma: no cover - Triton 3.0 keeps it per backend
        from triton.language.extra.cuda import libdevice

    from kda_inductor.lowerings._fp8 import bf16_round

    @triton.jit
    def round_to(v, KIND: tl.constexpr, HW: tl.constexpr):
        """float32 ``v`` rounded to nearest even in the dtype ``KIND`` (0 float32, 1 bfloat16,
        2 float16), as float32. Without ``HW`` (the interpreter, whose float32 -> bfloat16 cast
        truncates) bfloat16 by the bits (``_fp8.bf16_round``)."""
        if KIND == 1:
            if HW:
                v = v.to(tl.bfloat16).to(tl.float32)
            else:
                v = bf16_round(v)
        elif KIND == 2:
            v = v.to(tl.float16).to(tl.float32)
        return v

    @triton.jit
    def to_w(v, D: tl.constexpr, W_KIND: tl.constexpr, HW: tl.constexpr):
        """A loaded value in the weight's dtype ``D`` (the user's ``x.to(w.dtype)``), as float32."""
        if HW:
            out = v.to(D).to(tl.float32)
        else:
            out = round_to(v.to(tl.float32), W_KIND, False)
        return out

    @triton.jit
    def silu(v, HW: tl.constexpr):
        """``v / (1 + exp(-v))`` as eager's CUDA silu computes it: libdevice's expf, IEEE division
        (the interpreter has no libdevice: numpy's exp there)."""
        if HW:
            e = libdevice.exp(-v)
        else:
            e = tl.exp(-v)
        return tl.math.div_rn(v, 1.0 + e)

    @triton.jit
    def when(cond, m):
        """``m & cond`` for a scalar ``cond`` (a select: the interpreter's ``&`` of a bool tensor
        and a scalar bool returns integers, which its loads reject as a mask)."""
        return tl.where(cond, m, False)

    @triton.jit
    def sel(n: tl.constexpr, a0, a1, a2, a3, a4, a5, a6, a7):
        """``(a0, .., a7)[n]`` for a constexpr ``n`` (chosen at compile time: no select is emitted)."""
        lo = (a1 if n == 1 else a0) if n < 2 else (a3 if n == 3 else a2)
        hi = (a5 if n == 5 else a4) if n < 6 else (a7 if n == 7 else a6)
        return lo if n < 4 else hi

    @triton.jit
    def taps(acc, cur, p1, p2, p3, p4, p5, p6, p7, w0, w1, w2, w3, w4, w5, w6, w7, K: tl.constexpr):
        """aten's sum over a full window: tap ``k`` (oldest first, an FMA each) reads the token
        ``K - 1 - k`` back (``cur``: this token, ``p<n>``: ``n`` back)."""
        for k in tl.static_range(K):
            acc = tl.fma(sel(k, w0, w1, w2, w3, w4, w5, w6, w7), sel(K - 1 - k, cur, p1, p2, p3, p4, p5, p6, p7),
                         acc)
        return acc

    @triton.jit
    def shift(p1, p2, p3, p4, p5, p6, p7, cur, K: tl.constexpr):
        """The window one token on: ``cur`` becomes 1 back (returned oldest first)."""
        if K > 7:
            p7 = p6
        if K > 6:
            p6 = p5
        if K > 5:
            p5 = p4
        if K > 4:
            p4 = p3
        if K > 3:
            p3 = p2
        if K > 2:
            p2 = p1
        return p7, p6, p5, p4, p3, p2, cur

    @triton.jit
    def xrow(xp, t, T, sx_t, m, D: tl.constexpr, W_KIND: tl.constexpr, HW: tl.constexpr):
        """Token ``t`` of the tile's channels in the weight's dtype (float32; 0 outside ``[0, T)``)."""
        v = tl.load(xp + t * sx_t, mask=when((t >= 0) & (t < T), m), other=0.0)
        return to_w(v, D, W_KIND, HW)

    @triton.jit
    def _back(n: tl.constexpr, xp, t0, T, sx_t, m, K: tl.constexpr, D: tl.constexpr, W_KIND: tl.constexpr,
              HW: tl.constexpr):
        """The token ``n`` before ``t0`` (0 past ``K - 1``)."""
        if K > n:
            v = xrow(xp, t0 - n, T, sx_t, m, D, W_KIND, HW)
        else:
            v = tl.zeros(m.shape, tl.float32)
        return v

    @triton.jit
    def halo(xp, t0, T, sx_t, m, K: tl.constexpr, D: tl.constexpr, W_KIND: tl.constexpr, HW: tl.constexpr):
        """The ``K - 1`` tokens before ``t0`` (``p<n>``: ``n`` back; 0 past ``K - 1``)."""
        return (_back(1, xp, t0, T, sx_t, m, K, D, W_KIND, HW), _back(2, xp, t0, T, sx_t, m, K, D, W_KIND, HW),
                _back(3, xp, t0, T, sx_t, m, K, D, W_KIND, HW), _back(4, xp, t0, T, sx_t, m, K, D, W_KIND, HW),
                _back(5, xp, t0, T, sx_t, m, K, D, W_KIND, HW), _back(6, xp, t0, T, sx_t, m, K, D, W_KIND, HW),
                _back(7, xp, t0, T, sx_t, m, K, D, W_KIND, HW))


def aot_variants():
    """None of its own: these helpers are inlined into ``_conv_kernels``' prefill and update
    kernels, whose ``aot_variants()`` compile them."""
    return ()
