"""The Triton kernels of the ``kda::causal_conv1d`` ops (``causal_conv1d.py`` documents the
ops and their arithmetic; ``docs/causal_conv1d.md``, "The kernels", the design): the prefill
(:data:`prefill_kernel`; :data:`prefill_kernel_checked`, the varlen launch in Triton's debug
mode so that ``cu_seqlens``' device assert traps) and the update (:data:`update_kernel`, decode:
the state tile read once, the shifted tile written once). Their launches and configs:
``_conv_launch.py``, ``_conv_configs.py``; ``_conv_launch.aot_variants`` lists what the sm_90
compile check builds.

Every sum is aten's: the bias, then one FMA per tap, oldest first, in float32; the silu is
eager's ``v / (1 + expf(-v))`` with IEEE division; roundings to the conv's and the output's
dtypes as eager's casts."""

from __future__ import annotations

from kda_inductor.lowerings._conv_configs import (
    PREFILL_CONFIGS,
    QWEN3_NEXT_SOURCES,
    UPDATE_CONFIGS,
    LaunchConfig,
    aot_geometry,
)
from kda_inductor.lowerings._triton import tl, triton

__all__ = ["aot_variants", "prefill_kernel", "prefill_kernel_checked", "update_kernel"]

prefill_kernel = prefill_kernel_checked = update_kernel = None

if triton is not None:
    from kda_inductor.lowerings._conv_math import halo as _halo
    from kda_inductor.lowerings._conv_math import round_to as _round
    from kda_inductor.lowerings._conv_math import sel as _sel
    from kda_inductor.lowerings._conv_math import shift as _shift
    from kda_inductor.lowerings._conv_math import silu as _silu
    from kda_inductor.lowerings._conv_math import taps as _taps
    from kda_inductor.lowerings._conv_math import to_w as _to_w
    from kda_inductor.lowerings._conv_math import when as _when
    from kda_inductor.lowerings._conv_math import xrow as _xrow
    from kda_inductor.lowerings._conv_stream import stream_tile

    @triton.jit
    def _store_row(yp, t, T, m, acc, C: tl.constexpr, SILU: tl.constexpr, ACT_KIND: tl.constexpr,
                   OUT_KIND: tl.constexpr, HW: tl.constexpr):
        """Token ``t``'s sum rounded to the conv's dtype, activated, rounded to the output's,
        stored in the token-major output row (``yp``: the tile's channels of token 0)."""
        v = _round(acc, ACT_KIND, HW)
        if SILU:
            v = _silu(v, HW)
        y = _round(v, OUT_KIND, HW).to(yp.dtype.element_ty)
        tl.store(yp + t * C, y, mask=_when(t < T, m))

    @triton.jit
    def _find_seq(cu_ptr, t, num_seqs, STEPS: tl.constexpr):
        """The sequence of token ``t`` (a scalar): the largest ``n < num_seqs`` with ``cu[n] <= t``
        (binary search, ``STEPS >= ceil(log2(num_seqs)) + 1``)."""
        lo = t * 0
        size = lo + num_seqs
        for _ in tl.static_range(STEPS):
            half = size // 2
            ok = (half > 0) & (tl.load(cu_ptr + lo + half, mask=half > 0, other=0).to(tl.int64) <= t)
            lo = tl.where(ok, lo + half, lo)
            size = tl.where(half > 0, tl.where(ok, size - half, half), size)
        return lo

    # ---------------------------------------------------------------- the channel tile
    @triton.jit
    def _heads(j, H: tl.constexpr, D: tl.constexpr, SH: tl.constexpr, JB: tl.constexpr, CO: tl.constexpr,
               BH: tl.constexpr, BD: tl.constexpr, sx_c, X_UNIT: tl.constexpr):
        """Channel block ``j`` (this source's first is ``JB``) of a source of ``H`` heads of ``D``
        channels, head stride ``SH``: ``[BH, BD]`` channels, ``BD`` of one head per tile row
        (``R`` such virtual heads per head). Returns their element offsets in a token row of the
        source, their output channels (the source's first is ``CO``) and the mask."""
        R: tl.constexpr = (D + BD - 1) // BD
        vh = (j - JB) * BH + tl.arange(0, BH)[:, None]
        d = (vh % R) * BD + tl.arange(0, BD)[None, :]
        h = vh // R
        m = (h < H) & (d < D)
        if X_UNIT:
            off = h * SH + d
        else:
            off = h * SH + d * sx_c
        return off, CO + h * D + d, m

    @triton.jit
    def _block(j, x0, x1, x2, x3, sx_c, H0: tl.constexpr, D0: tl.constexpr, SH0: tl.constexpr,
               H1: tl.constexpr, D1: tl.constexpr, SH1: tl.constexpr, JB1: tl.constexpr, CO1: tl.constexpr,
               H2: tl.constexpr, D2: tl.constexpr, SH2: tl.constexpr, JB2: tl.constexpr, CO2: tl.constexpr,
               H3: tl.constexpr, D3: tl.constexpr, SH3: tl.constexpr, JB3: tl.constexpr, CO3: tl.constexpr,
               NSRC: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, X_UNIT: tl.constexpr):
        """The source channel block ``j`` lies in (blocks never straddle two) and its tile
        (:func:`_heads`): ``(source pointer, offsets, output channels, mask)``."""
        xp = x0
        off, ch, m = _heads(j, H0, D0, SH0, 0, 0, BH, BD, sx_c, X_UNIT)
        if NSRC > 1:
            if j >= JB1:
                xp = x1
                off, ch, m = _heads(j, H1, D1, SH1, JB1, CO1, BH, BD, sx_c, X_UNIT)
        if NSRC > 2:
            if j >= JB2:
                xp = x2
                off, ch, m = _heads(j, H2, D2, SH2, JB2, CO2, BH, BD, sx_c, X_UNIT)
        if NSRC > 3:
            if j >= JB3:
                xp = x3
                off, ch, m = _heads(j, H3, D3, SH3, JB3, CO3, BH, BD, sx_c, X_UNIT)
        return xp, off, ch, m

    # ---------------------------------------------------------------- taps
    @triton.jit
    def _wtap(w_ptr, ch, m, sw_c, sw_k, k: tl.constexpr, K: tl.constexpr):
        w = tl.zeros(ch.shape, tl.float32)
        if k < K:
            w = tl.load(w_ptr + ch * sw_c + k * sw_k, mask=m, other=0.0).to(tl.float32)
        return w

    @triton.jit
    def _weights(w_ptr, ch, m, sw_c, sw_k, K: tl.constexpr):
        """The ``K`` taps' weights of the tile's channels (float32, oldest tap first; 0 past K)."""
        return (_wtap(w_ptr, ch, m, sw_c, sw_k, 0, K), _wtap(w_ptr, ch, m, sw_c, sw_k, 1, K),
                _wtap(w_ptr, ch, m, sw_c, sw_k, 2, K), _wtap(w_ptr, ch, m, sw_c, sw_k, 3, K),
                _wtap(w_ptr, ch, m, sw_c, sw_k, 4, K), _wtap(w_ptr, ch, m, sw_c, sw_k, 5, K),
                _wtap(w_ptr, ch, m, sw_c, sw_k, 6, K), _wtap(w_ptr, ch, m, sw_c, sw_k, 7, K))

    @triton.jit
    def _bias(b_ptr, ch, m, D: tl.constexpr, W_KIND: tl.constexpr, HAS_BIAS: tl.constexpr, HW: tl.constexpr):
        """The sum's start: the bias in the weight's dtype, or 0."""
        acc = tl.zeros(ch.shape, tl.float32)
        if HAS_BIAS:
            acc = _to_w(tl.load(b_ptr + ch, mask=m, other=0.0), D, W_KIND, HW)
        return acc

    @triton.jit
    def _rows(xp, t, T, sx_t, m, ROWS: tl.constexpr, D: tl.constexpr, W_KIND: tl.constexpr, HW: tl.constexpr):
        """Tokens ``t .. t + ROWS - 1`` (``ROWS <= 8``), every load issued before any is used."""
        r0 = _xrow(xp, t, T, sx_t, m, D, W_KIND, HW)
        r1, r2, r3, r4, r5, r6, r7 = r0, r0, r0, r0, r0, r0, r0
        if ROWS > 1:
            r1 = _xrow(xp, t + 1, T, sx_t, m, D, W_KIND, HW)
        if ROWS > 2:
            r2 = _xrow(xp, t + 2, T, sx_t, m, D, W_KIND, HW)
            r3 = _xrow(xp, t + 3, T, sx_t, m, D, W_KIND, HW)
        if ROWS > 4:
            r4 = _xrow(xp, t + 4, T, sx_t, m, D, W_KIND, HW)
            r5 = _xrow(xp, t + 5, T, sx_t, m, D, W_KIND, HW)
            r6 = _xrow(xp, t + 6, T, sx_t, m, D, W_KIND, HW)
            r7 = _xrow(xp, t + 7, T, sx_t, m, D, W_KIND, HW)
        return r0, r1, r2, r3, r4, r5, r6, r7

    # ---------------------------------------------------------------- prefill tiles
    @triton.jit
    def _window_tile(xp, yp, m, t0, T, sx_t, bias, w0, w1, w2, w3, w4, w5, w6, w7, C: tl.constexpr,
                     K: tl.constexpr, BLOCK_T: tl.constexpr, ROWS: tl.constexpr, NUM_STAGES: tl.constexpr,
                     D: tl.constexpr, W_KIND: tl.constexpr, SILU: tl.constexpr, ACT_KIND: tl.constexpr,
                     OUT_KIND: tl.constexpr, HW: tl.constexpr):
        """A tile whose every window lies inside one sequence, the register window: each token
        read once (the ``K - 1`` before the tile once more, the halo), ``ROWS`` at a time, the
        window's ``K - 1`` previous tokens carried in registers."""
        p1, p2, p3, p4, p5, p6, p7 = _halo(xp, t0, T, sx_t, m, K, D, W_KIND, HW)
        for r in tl.range(0, BLOCK_T, ROWS, num_stages=NUM_STAGES):
            r0, r1, r2, r3, r4, r5, r6, r7 = _rows(xp, t0 + r, T, sx_t, m, ROWS, D, W_KIND, HW)
            for i in tl.static_range(ROWS):
                cur = _sel(i, r0, r1, r2, r3, r4, r5, r6, r7)
                acc = _taps(bias, cur, p1, p2, p3, p4, p5, p6, p7, w0, w1, w2, w3, w4, w5, w6, w7, K)
                _store_row(yp, t0 + r + i, T, m, acc, C, SILU, ACT_KIND, OUT_KIND, HW)
                p7, p6, p5, p4, p3, p2, p1 = _shift(p1, p2, p3, p4, p5, p6, p7, cur, K)

    @triton.jit
    def _edge_tap(acc, wk, xp, srow, src, start, mt, S, sx_t, ss_t, D: tl.constexpr, W_KIND: tl.constexpr,
                  HAS_STATE: tl.constexpr, HW: tl.constexpr):
        """One tap of a block of tokens reading tokens ``src``: from ``x`` inside their sequence
        (from ``start``), from the state's last columns before it (``srow``: each token's
        sequence's state row), else skipped (the conv's zero padding: the sum left as is)."""
        from_x = src >= start
        v = _to_w(tl.load(xp[None, :, :] + src * sx_t, mask=mt & from_x, other=0.0), D, W_KIND, HW)
        ok = from_x
        if HAS_STATE:
            col = S + (src - start)
            in_s = (src < start) & (col >= 0)
            sv = tl.load(srow + col * ss_t, mask=mt & in_s, other=0.0)
            v = tl.where(from_x, v, _to_w(sv, D, W_KIND, HW))
            ok = from_x | in_s
        return tl.where(ok, tl.fma(wk, v, acc), acc)

    @triton.jit
    def _taps_tile(xp, yp, sp, ch, m, cu_ptr, b, t0, T, S, num_seqs, sx_t, ss_n, ss_c, ss_t, bias,
                   w0, w1, w2, w3, w4, w5, w6, w7, C: tl.constexpr, K: tl.constexpr, BLOCK_T: tl.constexpr,
                   ROWS: tl.constexpr, NUM_STAGES: tl.constexpr, D: tl.constexpr, W_KIND: tl.constexpr,
                   EDGE: tl.constexpr, HAS_STATE: tl.constexpr, VARLEN: tl.constexpr, STEPS: tl.constexpr,
                   SILU: tl.constexpr, ACT_KIND: tl.constexpr, OUT_KIND: tl.constexpr, HW: tl.constexpr):
        """The tile as blocks of ``ROWS`` tokens x the channels, every token of a block at once:
        tap ``k`` is one load of the block ``K - 1 - k`` tokens back (the ``K`` loads overlap but
        for the halo: the cache serves the overlap, DRAM sees each row once). ``EDGE`` (a tile
        holding a sequence start): each tap of each token from ``x``, from its sequence's
        initial state (the state's last columns) before the sequence's start, else skipped (the
        conv's zero padding); varlen, each token's sequence searched in ``cu_seqlens``."""
        for r in tl.range(0, BLOCK_T, ROWS, num_stages=NUM_STAGES):
            t = t0 + r + tl.arange(0, ROWS)[:, None, None]
            mt = (t < T) & m[None, :, :]
            acc = tl.broadcast_to(bias[None, :, :], (ROWS, bias.shape[0], bias.shape[1]))
            if EDGE:
                seq = t * 0 + b
                start = t * 0
                if VARLEN:
                    seq = _find_seq(cu_ptr, t, num_seqs, STEPS)
                    start = tl.load(cu_ptr + seq, mask=t < T, other=0).to(tl.int64)
                srow = sp + seq * ss_n + ch[None, :, :] * ss_c
            for k in tl.static_range(K):
                src = t - (K - 1) + k
                wk = tl.broadcast_to(_sel(k, w0, w1, w2, w3, w4, w5, w6, w7)[None, :, :], acc.shape)
                if EDGE:
                    acc = _edge_tap(acc, wk, xp, srow, src, start, mt, S, sx_t, ss_t, D, W_KIND, HAS_STATE, HW)
                else:
                    v = _to_w(tl.load(xp[None, :, :] + src * sx_t, mask=mt, other=0.0), D, W_KIND, HW)
                    acc = tl.fma(wk, v, acc)
            v = _round(acc, ACT_KIND, HW)
            if SILU:
                v = _silu(v, HW)
            tl.store(yp[None, :, :] + t * C, _round(v, OUT_KIND, HW).to(yp.dtype.element_ty), mask=mt)

    @triton.jit
    def _is_edge(cu_ptr, t0, T, num_seqs, K: tl.constexpr, BLOCK_T: tl.constexpr, VARLEN: tl.constexpr,
                 STEPS: tl.constexpr):
        """Whether a window of the tile reaches before its sequence's start: the first tile of a
        row; varlen, a tile whose last token's sequence starts after ``t0 - (K - 1)``."""
        edge = t0 < K - 1
        if VARLEN:
            last = tl.minimum(t0 + BLOCK_T, T) - 1
            edge = tl.load(cu_ptr + _find_seq(cu_ptr, last, num_seqs, STEPS)).to(tl.int64) > t0 - (K - 1)
        return edge

    def _prefill_body(x0, x1, x2, x3, w_ptr, b_ptr, s_ptr, cu_ptr, y_ptr, T, S, num_seqs, sx_b, sx_t, sx_c,
                      ss_n, ss_c, ss_t, sw_c, sw_k, H0: tl.constexpr, D0: tl.constexpr, SH0: tl.constexpr,
                      H1: tl.constexpr, D1: tl.constexpr, SH1: tl.constexpr, JB1: tl.constexpr, CO1: tl.constexpr,
                      H2: tl.constexpr, D2: tl.constexpr, SH2: tl.constexpr, JB2: tl.constexpr, CO2: tl.constexpr,
                      H3: tl.constexpr, D3: tl.constexpr, SH3: tl.constexpr, JB3: tl.constexpr, CO3: tl.constexpr,
                      C: tl.constexpr, NSRC: tl.constexpr, K: tl.constexpr, BLOCK_T: tl.constexpr,
                      ROWS: tl.constexpr, NUM_STAGES: tl.constexpr, WINDOW: tl.constexpr, PREFETCH: tl.constexpr,
                      PTX: tl.constexpr, UNROLL: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr,
                      HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr, VARLEN: tl.constexpr, STEPS: tl.constexpr,
                      SILU: tl.constexpr, W_KIND: tl.constexpr, ACT_KIND: tl.constexpr, OUT_KIND: tl.constexpr,
                      HW: tl.constexpr, X_UNIT: tl.constexpr):
        """Program (i, j, b): tokens ``[i * BLOCK_T, +BLOCK_T)`` of row ``b`` (varlen: the row) x
        channel block ``j`` (``[BH, BD]`` channels of one source), its ``K`` weights and bias once
        in registers; inner windows as the streaming window (``PREFETCH``, ``_conv_stream.py``),
        the register window (``WINDOW``) or blocks of taps; a sequence start's: taps with the state."""
        t0 = tl.program_id(0).to(tl.int64) * BLOCK_T
        b = tl.program_id(2).to(tl.int64)
        xp, off, ch, m = _block(tl.program_id(1), x0, x1, x2, x3, sx_c, H0, D0, SH0, H1, D1, SH1, JB1, CO1,
                                H2, D2, SH2, JB2, CO2, H3, D3, SH3, JB3, CO3, NSRC, BH, BD, X_UNIT)
        xp = xp + b * sx_b + off
        yp = y_ptr + b * T * C + ch
        D = w_ptr.dtype.element_ty
        w0, w1, w2, w3, w4, w5, w6, w7 = _weights(w_ptr, ch, m, sw_c, sw_k, K)
        bias = _bias(b_ptr, ch, m, D, W_KIND, HAS_BIAS, HW)
        if VARLEN:
            tl.device_assert(tl.load(cu_ptr + num_seqs) == T, "causal_conv1d: cu_seqlens[-1] != x.shape[-1]")
        if _is_edge(cu_ptr, t0, T, num_seqs, K, BLOCK_T, VARLEN, STEPS):
            _taps_tile(xp, yp, s_ptr, ch, m, cu_ptr, b, t0, T, S, num_seqs, sx_t, ss_n, ss_c, ss_t, bias,
                       w0, w1, w2, w3, w4, w5, w6, w7, C, K, BLOCK_T, ROWS, 1, D, W_KIND, True, HAS_STATE, VARLEN,
                       STEPS, SILU, ACT_KIND, OUT_KIND, HW)
        elif PREFETCH:
            stream_tile(xp, yp, m, t0, T, sx_t, bias, w0, w1, w2, w3, w4, w5, w6, w7, C, K, BLOCK_T, ROWS, D, W_KIND,
                        SILU, ACT_KIND, OUT_KIND, HW, PTX, UNROLL)
        elif WINDOW:
            _window_tile(xp, yp, m, t0, T, sx_t, bias, w0, w1, w2, w3, w4, w5, w6, w7, C, K, BLOCK_T, ROWS,
                         NUM_STAGES, D, W_KIND, SILU, ACT_KIND, OUT_KIND, HW)
        else:
            _taps_tile(xp, yp, s_ptr, ch, m, cu_ptr, b, t0, T, S, num_seqs, sx_t, ss_n, ss_c, ss_t, bias,
                       w0, w1, w2, w3, w4, w5, w6, w7, C, K, BLOCK_T, ROWS, NUM_STAGES, D, W_KIND, False, HAS_STATE,
                       VARLEN, STEPS, SILU, ACT_KIND, OUT_KIND, HW)
    # ---------------------------------------------------------------- the update (decode)
    @triton.jit
    def _pick(tile, col):
        """Column ``col`` of ``tile [.., S_P2]`` (exactly: the others add as -0.0)."""
        jj = tl.arange(0, tile.shape[2])[None, None, :]
        return tl.sum(tl.where(jj == col, tile, -0.0), axis=2)

    @triton.jit
    def _update_taps(acc, xp, old_w, t, T, S, sx_t, m, w0, w1, w2, w3, w4, w5, w6, w7, K: tl.constexpr,
                     D: tl.constexpr, W_KIND: tl.constexpr, HW: tl.constexpr):
        """Token ``t``'s sum over ``[state | x]``: tap ``k`` reads column ``S + t - (K - 1) + k``,
        from the state tile in registers (``old_w``, in the weight's dtype) or from ``x``."""
        for k in tl.static_range(K):
            col = S + t - (K - 1) + k
            from_x = col >= S
            v = tl.where(from_x, _xrow(xp, col - S, T, sx_t, _when(from_x, m), D, W_KIND, HW), _pick(old_w, col))
            acc = tl.fma(_sel(k, w0, w1, w2, w3, w4, w5, w6, w7), v, acc)
        return acc

    @triton.jit
    def _shifted(old, xp, T, S, sx_t, m, S_KIND: tl.constexpr, HW: tl.constexpr):
        """The new state of the tile: column ``j`` is column ``j + T`` of ``[state | x]`` (the
        state's from ``old`` in registers, float32; ``x``'s rounded to the state's dtype)."""
        S_P2: tl.constexpr = old.shape[2]
        j = tl.arange(0, S_P2)[None, None, :]
        new = old
        for jj in tl.static_range(S_P2):
            new = tl.where(j + T == jj, _pick(old, jj)[:, :, None], new)
        for t in range(tl.maximum(T - S, 0), T):
            xv = tl.load(xp + t * sx_t, mask=m, other=0.0).to(tl.float32)
            new = tl.where(j == S - T + t, _round(xv, S_KIND, HW)[:, :, None], new)
        return new

    @triton.jit
    def _state_tile(sp, ch, m, S, ss_c, ss_t, S_P2: tl.constexpr, SS_C: tl.constexpr, S_W: tl.constexpr):
        """The pointers and mask of the tile's state ``[BH, BD, S_P2]`` (``sp``: the row's)."""
        jj = tl.arange(0, S_P2)[None, None, :]
        if SS_C > 0:
            ptrs = sp + ch[:, :, None] * SS_C + jj
        else:
            ptrs = sp + ch[:, :, None] * ss_c + jj * ss_t
        sm = m[:, :, None] & (jj < S_P2)
        if SS_C == 0 or S_P2 != S_W:
            sm = m[:, :, None] & (jj < S)
        return ptrs, sm

    @triton.jit
    def _decode_one(xp, sp, ch, m, w_ptr, b_ptr, yp, S, ss_t, sw_c, sw_k, C: tl.constexpr, K: tl.constexpr,
                    S_P2: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, W_KIND: tl.constexpr,
                    ACT_KIND: tl.constexpr, OUT_KIND: tl.constexpr, S_KIND: tl.constexpr, HW: tl.constexpr,
                    VECTOR: tl.constexpr):
        """One token (decode): :func:`_decode_rows` (``VECTOR``: each channel's rows as one vector), else
        :func:`_decode_cols`."""
        if VECTOR:
            _decode_rows(xp, sp, ch, m, w_ptr, b_ptr, yp, C, K, HAS_BIAS, SILU, W_KIND, ACT_KIND, OUT_KIND, S_KIND, HW)
        else:
            _decode_cols(xp, sp, ch, m, w_ptr, b_ptr, yp, S, ss_t, sw_c, sw_k, C, K, S_P2, HAS_BIAS, SILU, W_KIND,
                         ACT_KIND, OUT_KIND, S_KIND, HW)

    @triton.jit
    def _decode_cols(xp, sp, ch, m, w_ptr, b_ptr, yp, S, ss_t, sw_c, sw_k, C: tl.constexpr, K: tl.constexpr,
                     S_P2: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, W_KIND: tl.constexpr,
                     ACT_KIND: tl.constexpr, OUT_KIND: tl.constexpr, S_KIND: tl.constexpr, HW: tl.constexpr):
        """One token (decode) of the tile's channels (``sp``: their state rows): tap ``k`` reads
        column ``S - (K - 1) + k`` of ``[state | x]``, each a ``[BH, BD]`` vector of channels (``x``
        and the output contiguous: vector loads and stores); the new state's column ``j`` is the
        old one's ``j + 1``, its last ``x`` in the state's dtype; every read of the state before
        any write (it is shifted in place)."""
        D = w_ptr.dtype.element_ty
        w0, w1, w2, w3, w4, w5, w6, w7 = _weights(w_ptr, ch, m, sw_c, sw_k, K)
        acc = _bias(b_ptr, ch, m, D, W_KIND, HAS_BIAS, HW)
        xv = tl.load(xp, mask=m, other=0.0)
        for k in tl.static_range(K):
            if k == K - 1:
                v = _to_w(xv, D, W_KIND, HW)
            else:
                v = _to_w(tl.load(sp + (S - (K - 1) + k) * ss_t, mask=m, other=0.0), D, W_KIND, HW)
            acc = tl.fma(_sel(k, w0, w1, w2, w3, w4, w5, w6, w7), v, acc)
        jj = tl.arange(0, S_P2)[None, None, :]
        sp3 = sp[:, :, None]
        shifted = tl.load(sp3 + (jj + 1) * ss_t, mask=m[:, :, None] & (jj + 1 < S), other=0.0)
        xs = _round(xv.to(tl.float32), S_KIND, HW).to(sp.dtype.element_ty)
        new = tl.where(jj == S - 1, xs[:, :, None], shifted)
        _store_row(yp, 0, 1, m, acc, C, SILU, ACT_KIND, OUT_KIND, HW)
        tl.debug_barrier()  # every read of the state before any write
        tl.store(sp3 + jj * ss_t, new, mask=m[:, :, None] & (jj < S))

    @triton.jit
    def _decode_rows(xp, sp, ch, m, w_ptr, b_ptr, yp, C: tl.constexpr, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                     SILU: tl.constexpr, W_KIND: tl.constexpr, ACT_KIND: tl.constexpr, OUT_KIND: tl.constexpr,
                     S_KIND: tl.constexpr, HW: tl.constexpr):
        """:func:`_decode_cols` where the state's rows and the weights are ``[channels, K]``
        contiguous, ``K`` a power of two and the state ``K`` wide (transformers' and FLA's decode
        cache): each channel's state row and weight row read as one vector (no mask along the
        taps), the taps picked in registers (tap ``k`` is state column ``k + 1``, the last ``x``),
        the shifted row written as one vector. The same FMAs in the same order as
        :func:`_decode_cols`: bit-identical results."""
        D = w_ptr.dtype.element_ty
        jj = tl.arange(0, K)[None, None, :]
        m3 = m[:, :, None]
        # float32 (exact) before the picks: the interpreter's picks of bfloat16 came back negated
        old = tl.load(sp[:, :, None] + jj, mask=m3, other=0.0).to(tl.float32)
        wrow = tl.load(w_ptr + ch[:, :, None] * K + jj, mask=m3, other=0.0).to(tl.float32)
        acc = _bias(b_ptr, ch, m, D, W_KIND, HAS_BIAS, HW)
        xv = tl.load(xp, mask=m, other=0.0)
        for k in tl.static_range(K):
            if k == K - 1:
                v = _to_w(xv, D, W_KIND, HW)
            else:
                v = _to_w(_pick(old, k + 1), D, W_KIND, HW)
            acc = tl.fma(_pick(wrow, k), v, acc)
        new = tl.where(jj == K - 1, _round(xv.to(tl.float32), S_KIND, HW)[:, :, None], old)
        for j in tl.static_range(K - 1):
            new = tl.where(jj == j, _pick(old, j + 1)[:, :, None], new)
        _store_row(yp, 0, 1, m, acc, C, SILU, ACT_KIND, OUT_KIND, HW)
        tl.store(sp[:, :, None] + jj, new.to(sp.dtype.element_ty), mask=m3)

    def _update_body(x0, x1, x2, x3, s_ptr, w_ptr, b_ptr, y_ptr, T, S, sx_b, sx_t, sx_c, ss_n, ss_c, ss_t,
                     sw_c, sw_k, H0: tl.constexpr, D0: tl.constexpr, SH0: tl.constexpr,
                     H1: tl.constexpr, D1: tl.constexpr, SH1: tl.constexpr, JB1: tl.constexpr, CO1: tl.constexpr,
                     H2: tl.constexpr, D2: tl.constexpr, SH2: tl.constexpr, JB2: tl.constexpr, CO2: tl.constexpr,
                     H3: tl.constexpr, D3: tl.constexpr, SH3: tl.constexpr, JB3: tl.constexpr, CO3: tl.constexpr,
                     C: tl.constexpr, NSRC: tl.constexpr, K: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr,
                     S_P2: tl.constexpr, SS_C: tl.constexpr, S_W: tl.constexpr, CONV: tl.constexpr,
                     ONE: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, W_KIND: tl.constexpr,
                     ACT_KIND: tl.constexpr, OUT_KIND: tl.constexpr, S_KIND: tl.constexpr,
                     HW: tl.constexpr, X_UNIT: tl.constexpr, VECTOR: tl.constexpr = False):
        """Program (j, b): channel block ``j`` of row ``b``, every token: the state tile read once
        into registers, the conv of each token (``CONV``; else the state shift alone, after a
        prefill launch), the shifted state written once. ``SS_C > 0``: the state's taps are
        contiguous, ``SS_C`` apart per channel; ``S_W``: the state's width where a power of two
        (then unmasked taps: vector loads and stores). ``ONE``: one token, the conv (decode),
        :func:`_decode_one`; ``VECTOR`` (with ``ONE``): its vector form :func:`_decode_rows`."""
        b = tl.program_id(1).to(tl.int64)
        xp, off, ch, m = _block(tl.program_id(0), x0, x1, x2, x3, sx_c, H0, D0, SH0, H1, D1, SH1, JB1, CO1,
                                H2, D2, SH2, JB2, CO2, H3, D3, SH3, JB3, CO3, NSRC, BH, BD, X_UNIT)
        xp = xp + b * sx_b + off
        if ONE:
            _decode_one(xp, s_ptr + b * ss_n + ch * ss_c, ch, m, w_ptr, b_ptr, y_ptr + b * C + ch, S, ss_t, sw_c,
                        sw_k, C, K, S_P2, HAS_BIAS, SILU, W_KIND, ACT_KIND, OUT_KIND, S_KIND, HW, VECTOR)
            return
        sp, sm = _state_tile(s_ptr + b * ss_n, ch, m, S, ss_c, ss_t, S_P2, SS_C, S_W)
        old = tl.load(sp, mask=sm, other=0.0)
        D = w_ptr.dtype.element_ty
        if CONV:
            w0, w1, w2, w3, w4, w5, w6, w7 = _weights(w_ptr, ch, m, sw_c, sw_k, K)
            bias = _bias(b_ptr, ch, m, D, W_KIND, HAS_BIAS, HW)
            old_w = _to_w(old, D, W_KIND, HW)
            for t in range(0, T):
                acc = _update_taps(bias, xp, old_w, t, T, S, sx_t, m, w0, w1, w2, w3, w4, w5, w6, w7, K, D, W_KIND,
                                   HW)
                _store_row(y_ptr + b * T * C + ch, t, T, m, acc, C, SILU, ACT_KIND, OUT_KIND, HW)
        new = _shifted(old.to(tl.float32), xp, T, S, sx_t, m, S_KIND, HW)
        tl.debug_barrier()  # every read of the state before any write
        tl.store(sp, new.to(s_ptr.dtype.element_ty), mask=sm)


    prefill_kernel = triton.jit(_prefill_body)
    prefill_kernel_checked = triton.jit(debug=True)(_prefill_body)
    """The varlen launches: Triton's debug mode, so that ``cu_seqlens``' device assert traps."""
    update_kernel = triton.jit(_update_body)


def aot_variants():
    """None of its own: ``_conv_launch.aot_variants()`` compiles these kernels, with the launch values
    its launcher passes (an import of the launcher from here would be a cycle)."""
    return iter(())
