"""The prefill's streaming register window (``_conv_kernels.py``'s ``_prefill_body`` runs it for a
``LaunchConfig`` with ``prefetch``): each step's tokens loaded a step ahead, and, on the GPU with
``ptx``, the silu's division and the conv dtype's rounding in fewer instructions, same bits.

Why (sm_90 SASS of the window, 2026-12-05): 30-34 instructions an output value in the loop, of
which the exact silu takes 18 (libdevice's expf 8; the IEEE division 10: its reciprocal and 5
FMAs, then a range check, a branch and its two barriers per value) and the conv dtype's rounding
2 (a scalar F2F on the quarter-rate conversion pipe and a shift). At 8192 channels x 4096 tokens
that is about 31 us of issue on an H200 (132 SMs x 4 schedulers x 32 lanes at 1.98 GHz) against
a 31.7 us memory floor: the kernel is issue-bound as much as memory-bound, and one-warp programs
leave about 4 warps a scheduler to hide a load's latency behind. ``prefetch`` keeps the next
rows' loads in flight under the arithmetic; ``ptx`` checks the division's range once per 4
values (a branch to the IEEE ``div.rn`` for the group, taken only outside ``2**-64 <= |v| <
64``, where the reciprocal-and-correction sequence the compiler emits for ``div.rn`` is its
exact value) and rounds two values per packed conversion (net: about 1.5 instructions a value fewer).
"""

from __future__ import annotations

from kda_inductor.lowerings._triton import tl, triton

__all__ = ["aot_variants", "stream_tile"]

stream_tile = None

if triton is not None:
    try:
        from triton.language.extra import libdevice
    except ImportError:  # pragma: no cover - Triton 3.0 keeps it per backend
        from triton.language.extra.cuda import libdevice

    from kda_inductor.lowerings._conv_math import halo, round_to, sel, shift, silu, taps, to_w, when

    @triton.jit
    def _ahead(xp, t, end, sx_t, m, ROWS: tl.constexpr):
        """Tokens ``t .. t + ROWS - 1`` as loaded (the source's dtype; masked from ``end``), every
        load issued before any is used."""
        r0 = tl.load(xp + t * sx_t, mask=when(t < end, m), other=0.0)
        r1, r2, r3, r4, r5, r6, r7 = r0, r0, r0, r0, r0, r0, r0
        if ROWS > 1:
            r1 = tl.load(xp + (t + 1) * sx_t, mask=when(t + 1 < end, m), other=0.0)
        if ROWS > 2:
            r2 = tl.load(xp + (t + 2) * sx_t, mask=when(t + 2 < end, m), other=0.0)
            r3 = tl.load(xp + (t + 3) * sx_t, mask=when(t + 3 < end, m), other=0.0)
        if ROWS > 4:
            r4 = tl.load(xp + (t + 4) * sx_t, mask=when(t + 4 < end, m), other=0.0)
            r5 = tl.load(xp + (t + 5) * sx_t, mask=when(t + 5 < end, m), other=0.0)
            r6 = tl.load(xp + (t + 6) * sx_t, mask=when(t + 6 < end, m), other=0.0)
            r7 = tl.load(xp + (t + 7) * sx_t, mask=when(t + 7 < end, m), other=0.0)
        return r0, r1, r2, r3, r4, r5, r6, r7

    _DIV4 = tl.constexpr("""{
    .reg .f32 r<4>, e<4>, q<4>, s<4>, a<4>, n<4>;
    .reg .pred p<4>;
    """ + "".join(f"""
    rcp.approx.ftz.f32 r{i}, ${8 + i};
    neg.f32 n{i}, ${8 + i};
    fma.rn.f32 e{i}, n{i}, r{i}, 0f3F800000;
    fma.rn.f32 r{i}, r{i}, e{i}, r{i};
    mul.rn.f32 q{i}, ${4 + i}, r{i};
    fma.rn.f32 s{i}, n{i}, q{i}, ${4 + i};
    fma.rn.f32 ${i}, r{i}, s{i}, q{i};
    abs.f32 a{i}, ${4 + i};
    setp.ge.f32 p{i}, a{i}, 0f1F800000;
    setp.lt.and.f32 p{i}, a{i}, 0f42800000, p{i};""" for i in range(4)) + """
    and.pred p0, p0, p1;
    and.pred p2, p2, p3;
    and.pred p0, p0, p2;
    @p0 bra DONE;
    div.rn.f32 $0, $4, $8;
    div.rn.f32 $1, $5, $9;
    div.rn.f32 $2, $6, $10;
    div.rn.f32 $3, $7, $11;
    DONE:
    }""")
    """The silu's ``v / d`` (``d = 1 + expf(-v)``) rounded as IEEE ``div.rn.f32``, 4 values at a
    time: the compiler's own sequence for ``div.rn`` (reciprocal, one Newton step, the product,
    its remainder, the correction) where ``2**-64 <= |v| < 64`` (then ``1 < d < 2**93`` and the
    quotient, the reciprocal and every remainder are normal: the range its check passes), the
    IEEE division for the whole group where any value is outside (zeros, tiny, large values)."""

    _ROUND2 = tl.constexpr("""{
    .reg .b32 t;
    cvt.rn.bf16x2.f32 t, $3, $2;
    shl.b32 $0, t, 16;
    and.b32 $1, t, 0xffff0000;
    }""")
    """Two float32 values rounded to bfloat16 (nearest even) in one packed conversion, as float32."""

    @triton.jit
    def _act(acc, SILU: tl.constexpr, ACT_KIND: tl.constexpr, HW: tl.constexpr, PTX: tl.constexpr):
        """The sum rounded to the conv's dtype and activated (``PTX``: bfloat16 / float16, on the GPU,
        the packed rounding and the grouped division; the same bits as ``round_to`` / ``silu``)."""
        if PTX and HW and ACT_KIND == 1:
            v = tl.inline_asm_elementwise(_ROUND2, "=r,=r,r,r", [acc], dtype=tl.float32, is_pure=True, pack=2)
        else:
            v = round_to(acc, ACT_KIND, HW)
        if SILU:
            if PTX and HW and ACT_KIND != 0:
                d = 1.0 + libdevice.exp(-v)
                v = tl.inline_asm_elementwise(_DIV4, "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [v, d], dtype=tl.float32,
                                              is_pure=True, pack=4)
            else:
                v = silu(v, HW)
        return v

    @triton.jit
    def _out_row(yp, t, end, m, acc, C: tl.constexpr, SILU: tl.constexpr, ACT_KIND: tl.constexpr,
                 OUT_KIND: tl.constexpr, HW: tl.constexpr, PTX: tl.constexpr):
        """Token ``t``'s sum through :func:`_act`, rounded to the output's dtype, stored in the
        token-major output row (masked from ``end``)."""
        y = round_to(_act(acc, SILU, ACT_KIND, HW, PTX), OUT_KIND, HW).to(yp.dtype.element_ty)
        tl.store(yp + t * C, y, mask=when(t < end, m))

    @triton.jit
    def _stream_tile(xp, yp, m, t0, T, sx_t, bias, w0, w1, w2, w3, w4, w5, w6, w7, C: tl.constexpr,
                     K: tl.constexpr, BLOCK_T: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr,
                     W_KIND: tl.constexpr, SILU: tl.constexpr, ACT_KIND: tl.constexpr, OUT_KIND: tl.constexpr,
                     HW: tl.constexpr, PTX: tl.constexpr, UNROLL: tl.constexpr):
        """The register window (``_window_tile``: the same sums, token by token) with the next
        ``ROWS`` tokens' loads issued before this step's sums (:func:`_ahead`, kept as loaded until
        their step): a step's loads in flight under the previous step's arithmetic. ``UNROLL``
        steps a loop iteration (the carried rows renamed between them, not moved)."""
        end = tl.minimum(t0 + BLOCK_T, T)
        p1, p2, p3, p4, p5, p6, p7 = halo(xp, t0, T, sx_t, m, K, D, W_KIND, HW)
        n0, n1, n2, n3, n4, n5, n6, n7 = _ahead(xp, t0, end, sx_t, m, ROWS)
        for r in tl.range(0, BLOCK_T, ROWS, loop_unroll_factor=UNROLL):
            c0, c1, c2, c3, c4, c5, c6, c7 = n0, n1, n2, n3, n4, n5, n6, n7
            n0, n1, n2, n3, n4, n5, n6, n7 = _ahead(xp, t0 + r + ROWS, end, sx_t, m, ROWS)
            for i in tl.static_range(ROWS):
                cur = to_w(sel(i, c0, c1, c2, c3, c4, c5, c6, c7), D, W_KIND, HW)
                acc = taps(bias, cur, p1, p2, p3, p4, p5, p6, p7, w0, w1, w2, w3, w4, w5, w6, w7, K)
                _out_row(yp, t0 + r + i, end, m, acc, C, SILU, ACT_KIND, OUT_KIND, HW, PTX)
                p7, p6, p5, p4, p3, p2, p1 = shift(p1, p2, p3, p4, p5, p6, p7, cur, K)

    stream_tile = _stream_tile


def aot_variants():
    """None of its own: these helpers are inlined into ``_conv_kernels``' prefill kernel, whose ``aot_variants()``
    compile them."""
    return ()
