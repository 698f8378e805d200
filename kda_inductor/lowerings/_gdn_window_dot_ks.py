""":mod:`._gdn_window_dot`'s window with the key dimension split into blocks (``LaunchConfig.dot_key_block``,
off by default): the state tile ``S [KP, BV]`` held as ``NC = KP / KS`` separate register tiles
``S1 .. S4`` of ``KS`` key rows (at most four: Triton cannot index a register tensor by a chunk), and the
window's ``[TD, KS]`` key blocks read from memory per chunk (``q`` / ``k`` / a per-channel ``g``: a few
hundred cached bytes), never whole: every ``tl.dot`` operand is ``[16, KS]``, not ``[16, KP]``. The same
arithmetic as the whole-K form, its sums over keys split by chunk::

    A = sum_c Kd[:, c] @ S_c      B = sum_c Qd[:, c] @ S_c      M = sum_c M_c      N = sum_c N_c
    d = (I + diag(beta) M)^-1 (beta (v - A))     o = B + N @ d
    S_c' = S_c e^G_last[c] + Kl[:, c]^T @ d

(the l2norm's row sums over all keys first, by one pass over the chunks; ``M_c`` / ``N_c`` the chunk's
couplings, :func:`._gdn_window_dot.couplings` on its keys: linear in the key sum, so their sum is the
whole-K couplings)."""

from __future__ import annotations

from kda_inductor.lowerings._triton import tl, triton

MAX_CHUNKS = 4
"""The most key blocks (``S1 .. S4``): a smaller ``dot_key_block`` is raised to ``KP / 4``."""


def key_block(dot_key_block: int, kp: int) -> int:
    """The key block a launch runs at: ``dot_key_block`` (a power of two, at least 16) between
    ``KP / MAX_CHUNKS`` and ``KP`` (``KP`` itself: one block, the tile loaded as one chunk); 0 off."""
    if not dot_key_block:
        return 0
    if dot_key_block < 16 or dot_key_block & (dot_key_block - 1):
        raise ValueError(f"gdn_recurrent_step: LaunchConfig.dot_key_block must be 0 (off) or a power of two >= 16 "
                         f"(tl.dot's least K), got {dot_key_block}")
    return min(kp, max(dot_key_block, kp // MAX_CHUNKS))


if triton is not None:
    from kda_inductor.lowerings._gdn_window import elem as _at
    from kda_inductor.lowerings._gdn_window import row as _row
    from kda_inductor.lowerings._gdn_window_dot import couplings, unit_lower_inverse

    @triton.jit
    def _keys(ptr, s_t, s_k, T, rt, c0, K, KS: tl.constexpr):
        """The ``[TD, KS]`` block of keys ``c0 ..`` (float32; zeros past ``T`` and ``K``)."""
        rk = c0 + tl.arange(0, KS)
        m = (rt < T)[:, None] & (rk < K)[None, :]
        return tl.load(ptr + rt[:, None] * s_t + rk[None, :] * s_k, mask=m, other=0.0).to(tl.float32)

    @triton.jit
    def _row_scales(q_row, k_row, T, rt, K, sq_t, sq_k, sk_t, sk_k, scale, eps, TP: tl.constexpr,
                    KS: tl.constexpr, NC: tl.constexpr, L2NORM: tl.constexpr):
        """``q``'s and ``k``'s row factors (l2norm over all keys; rows past ``T`` zero, also at ``eps = 0``)."""
        if L2NORM:
            sq = tl.zeros((TP,), tl.float32)
            sk = tl.zeros((TP,), tl.float32)
            for c in tl.static_range(NC):
                q = _keys(q_row, sq_t, sq_k, T, rt, c * KS, K, KS)
                k = _keys(k_row, sk_t, sk_k, T, rt, c * KS, K, KS)
                sq += tl.sum(q * q, 1)
                sk += tl.sum(k * k, 1)
            tm = rt < T
            return tl.where(tm, tl.math.rsqrt(sq + eps) * scale, 0.0), tl.where(tm, tl.math.rsqrt(sk + eps), 0.0)
        else:
            return tl.zeros((TP,), tl.float32) + scale, tl.zeros((TP,), tl.float32) + 1.0

    @triton.jit
    def _chunk_keys(c0, q_row, k_row, g_row, T, rt, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, qs, ks, gs,
                    KS: tl.constexpr, PER_CHANNEL: tl.constexpr):
        """Chunk ``c0``'s scaled ``q``, ``k`` and its ``G`` (per key channel: the chunk's cumulative log
        decay; a scalar decay: ``gs``, the head's)."""
        q = _keys(q_row, sq_t, sq_k, T, rt, c0, K, KS) * qs[:, None]
        k = _keys(k_row, sk_t, sk_k, T, rt, c0, K, KS) * ks[:, None]
        if PER_CHANNEL:
            return q, k, tl.cumsum(_keys(g_row, sg_t, sg_k, T, rt, c0, K, KS), 0)
        else:
            return q, k, gs

    @triton.jit
    def _chunk_reads(S, c0, q_row, k_row, g_row, T, rt, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, qs, ks, gs,
                     TP: tl.constexpr, TS: tl.constexpr, KS: tl.constexpr, PER_CHANNEL: tl.constexpr,
                     DOT: tl.constexpr):
        """Chunk ``c0``'s share of ``M``, ``N``, ``A``, ``B``."""
        q, k, gc = _chunk_keys(c0, q_row, k_row, g_row, T, rt, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, qs, ks, gs,
                               KS, PER_CHANNEL)
        M, N = couplings(q, k, gc, rt, TP, TS, PER_CHANNEL, DOT)
        eg = tl.exp(gc) if PER_CHANNEL else tl.exp(gc)[:, None]
        B = tl.dot(q * eg, S, input_precision=DOT)
        A = tl.dot(k * eg, S, input_precision=DOT)
        return M, N, A, B

    @triton.jit
    def _chunk_update(S, d, c0, k_row, g_row, T, rt, K, sk_t, sk_k, sg_t, sg_k, ks, gs, last,
                      KS: tl.constexpr, PER_CHANNEL: tl.constexpr, DOT: tl.constexpr):
        """``S_c e^G_last + Kl[:, c]^T @ d`` (``k`` and a per-channel ``G`` read again)."""
        k = _keys(k_row, sk_t, sk_k, T, rt, c0, K, KS) * ks[:, None]
        if PER_CHANNEL:
            gc = tl.cumsum(_keys(g_row, sg_t, sg_k, T, rt, c0, K, KS), 0)
            lc = _row(gc, rt, T - 1)
            S = S * tl.exp(lc)[:, None]
            kl = k * tl.exp(lc[None, :] - gc)
        else:
            S = S * tl.exp(last)
            kl = k * tl.exp(last - gs)[:, None]
        return S + tl.dot(tl.trans(kl), d, input_precision=DOT)

    @triton.jit
    def _chunk_tile(ptr, b64, h, c0, rv, K, vmask, s_b, s_h, s_k, s_v, KS: tl.constexpr):
        """The addresses of key rows ``c0 .. c0 + KS`` of the state tile and their mask."""
        rk = c0 + tl.arange(0, KS)
        addr = ptr + b64 * s_b + h.to(tl.int64) * s_h + rk[:, None] * s_k + rv[None, :] * s_v
        return addr, (rk < K)[:, None] & vmask[None, :]

    @triton.jit
    def _load_chunk(s_ptr, b64, h, c0, rv, K, vmask, ss_b, ss_h, ss_k, ss_v, KS: tl.constexpr, BV: tl.constexpr,
                    HAS_STATE: tl.constexpr):
        if HAS_STATE:
            addr, m = _chunk_tile(s_ptr, b64, h, c0, rv, K, vmask, ss_b, ss_h, ss_k, ss_v, KS)
            return tl.load(addr, mask=m, other=0.0)
        else:
            return tl.zeros((KS, BV), tl.float32)

    @triton.jit
    def _store_chunk(S, f_ptr, b64, h, c0, rv, K, vmask, sf_b, sf_h, sf_k, sf_v, KS: tl.constexpr):
        addr, m = _chunk_tile(f_ptr, b64, h, c0, rv, K, vmask, sf_b, sf_h, sf_k, sf_v, KS)
        tl.store(addr, S, mask=m)

    @triton.jit
    def _load_chunks(s_ptr, b64, h, rv, K, vmask, ss_b, ss_h, ss_k, ss_v, KS: tl.constexpr, NC: tl.constexpr,
                     BV: tl.constexpr, HAS_STATE: tl.constexpr):
        """The tile's ``NC`` chunks ``S1 .. S4`` (past ``NC``: ``S1`` again, unused)."""
        S1 = _load_chunk(s_ptr, b64, h, 0, rv, K, vmask, ss_b, ss_h, ss_k, ss_v, KS, BV, HAS_STATE)
        S2, S3, S4 = S1, S1, S1
        if NC > 1:
            S2 = _load_chunk(s_ptr, b64, h, KS, rv, K, vmask, ss_b, ss_h, ss_k, ss_v, KS, BV, HAS_STATE)
        if NC > 2:
            S3 = _load_chunk(s_ptr, b64, h, 2 * KS, rv, K, vmask, ss_b, ss_h, ss_k, ss_v, KS, BV, HAS_STATE)
            S4 = _load_chunk(s_ptr, b64, h, 3 * KS, rv, K, vmask, ss_b, ss_h, ss_k, ss_v, KS, BV, HAS_STATE)
        return S1, S2, S3, S4

    @triton.jit
    def _reads(S1, S2, S3, S4, q_row, k_row, g_row, T, rt, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, qs, ks, gs,
               TP: tl.constexpr, TS: tl.constexpr, KS: tl.constexpr, NC: tl.constexpr, PER_CHANNEL: tl.constexpr,
               DOT: tl.constexpr):
        """``M``, ``N``, ``A``, ``B``: every chunk's shares summed."""
        M, N, A, B = _chunk_reads(S1, 0, q_row, k_row, g_row, T, rt, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, qs, ks,
                                  gs, TP, TS, KS, PER_CHANNEL, DOT)
        for c in tl.static_range(1, NC):
            if c == 1:
                Sc = S2
            elif c == 2:
                Sc = S3
            else:
                Sc = S4
            m, n, a, bb = _chunk_reads(Sc, c * KS, q_row, k_row, g_row, T, rt, K, sq_t, sq_k, sk_t, sk_k, sg_t,
                                       sg_k, qs, ks, gs, TP, TS, KS, PER_CHANNEL, DOT)
            M, N, A, B = M + m, N + n, A + a, B + bb
        return M, N, A, B

    @triton.jit
    def _update_store(S, d, c0, f_ptr, b64, h, k_row, g_row, T, rt, K, rv, vmask, sk_t, sk_k, sg_t, sg_k, ks, gs,
                      last, sf_b, sf_h, sf_k, sf_v, KS: tl.constexpr, PER_CHANNEL: tl.constexpr, DOT: tl.constexpr):
        """Chunk ``c0``'s new rows (:func:`_chunk_update`) stored."""
        S = _chunk_update(S, d, c0, k_row, g_row, T, rt, K, sk_t, sk_k, sg_t, sg_k, ks, gs, last, KS, PER_CHANNEL,
                          DOT)
        _store_chunk(S, f_ptr, b64, h, c0, rv, K, vmask, sf_b, sf_h, sf_k, sf_v, KS)

    @triton.jit
    def window_step_ks(s_ptr, f_ptr, b64, h, q_row, k_row, v_base, g_row, b_row, o_row, T, HV, K, V, rv, vmask,
                       scale, eps, sq_t, sk_t, sv_t, sv_v, sg_t, sb_t, sq_k, sk_k, sg_k, ss_b, ss_h, ss_k, ss_v,
                       sf_b, sf_h, sf_k, sf_v, BV: tl.constexpr, TP: tl.constexpr, TS: tl.constexpr,
                       KS: tl.constexpr, NC: tl.constexpr, PER_CHANNEL: tl.constexpr, L2NORM: tl.constexpr,
                       HAS_STATE: tl.constexpr, DOT: tl.constexpr):
        """Program ``(b, h, column block)``'s whole step in ``NC`` key blocks of ``KS`` rows: the tile's
        chunks loaded, the window run (the module docstring), the outputs and the chunks stored."""
        rt = tl.arange(0, TP)
        tm = rt < T
        S1, S2, S3, S4 = _load_chunks(s_ptr, b64, h, rv, K, vmask, ss_b, ss_h, ss_k, ss_v, KS, NC, BV, HAS_STATE)
        qs, ks = _row_scales(q_row, k_row, T, rt, K, sq_t, sq_k, sk_t, sk_k, scale, eps, TP, KS, NC, L2NORM)
        if PER_CHANNEL:
            gs = tl.zeros((TP,), tl.float32)
        else:
            gs = tl.cumsum(tl.load(g_row + rt * sg_t, mask=tm, other=0.0).to(tl.float32), 0)
        last = _at(gs, rt, T - 1)
        M, N, A, B = _reads(S1, S2, S3, S4, q_row, k_row, g_row, T, rt, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, qs,
                            ks, gs, TP, TS, KS, NC, PER_CHANNEL, DOT)
        v = tl.load(v_base + rt[:, None] * sv_t + rv[None, :] * sv_v, mask=tm[:, None] & vmask[None, :],
                    other=0.0).to(tl.float32)
        beta = tl.load(b_row + rt * sb_t, mask=tm, other=0.0).to(tl.float32)
        inv = unit_lower_inverse(M * beta[:, None], rt, TS)
        d = tl.dot(inv, (v - A) * beta[:, None], input_precision=DOT)
        o = B + tl.dot(N, d, input_precision=DOT)
        tl.store(o_row + rt[:, None] * HV * V, o.to(o_row.dtype.element_ty), mask=tm[:, None] & vmask[None, :])
        for c in tl.static_range(NC):
            if c == 0:
                Sc = S1
            elif c == 1:
                Sc = S2
            elif c == 2:
                Sc = S3
            else:
                Sc = S4
            _update_store(Sc, d, c * KS, f_ptr, b64, h, k_row, g_row, T, rt, K, rv, vmask, sk_t, sk_k, sg_t, sg_k,
                          ks, gs, last, sf_b, sf_h, sf_k, sf_v, KS, PER_CHANNEL, DOT)


def aot_variants():
    """None of its own: inlined into ``gdn_recurrent_step``'s kernel, whose ``aot_variants()`` compile it."""
    return ()
