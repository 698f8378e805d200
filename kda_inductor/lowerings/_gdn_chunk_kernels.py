"""The Triton kernels of ``kda::gdn_chunk`` (the chunked gated delta rule forward; the op, its
checks and the launcher are in :mod:`kda_inductor.lowerings.gdn_chunk`).

Chunks of ``C = 64`` tokens that never cross a sequence's end; per value head ``h`` (key head
``h // GROUP``), chunk rows ``i, j`` (tokens of one chunk), ``q`` / ``k`` l2-normalized when asked,
``q`` scaled, all in float32, ``gc`` the cumulative sum of ``g`` inside the chunk and
``S`` the state ``[K, V]`` at the chunk's start:

1. :data:`inverse_kernel` (program = chunk x head): ``A = strict_lower(beta_i (k_i . k_j)
   exp(gc_i - gc_j))`` and ``Tinv = (I + A)^-1``, built from 16 x 16 blocks: the four diagonal
   blocks inverted by forward substitution (row by row, in registers), the six blocks below them
   by ``Tinv_ij = -Tinv_ii sum_{j <= m < i} A_im Tinv_mj`` (float32 products, ``ieee``). Stores
   ``Tinv`` (the lower blocks; rows of the chunk's tokens) and ``gc``.
2. :data:`wu_kernel` (chunk x head): ``w = Tinv (beta exp(gc) k)`` ``[C, K]`` and ``u = Tinv (beta v)``
   ``[C, V]`` (the UT / WY form: the chunk's deltas are ``u - w S``).
3. :data:`scan_kernel` (sequence x head x column block, sequential over the sequence's chunks):
   the state tile in registers; per chunk: store ``S`` (the chunk's start state for step 4),
   ``v_new = u - w S``, ``S = exp(gc_last) S + (k exp(gc_last - gc))^T v_new``; the final state.
4. :data:`output_kernel` (chunk x head x column block): ``o = (q exp(gc)) S + causal(q k^T
   exp(gc_i - gc_j)) v_new``.

Rows past a sequence's end are loaded as zeros (``k``, ``v``, ``beta``, ``g``), so they add
nothing and ``gc`` stays flat after the last token; they are never stored. A chunk id past the
last chunk (the grid is sized from shapes: ``T // C + N`` chunks at most) has length 0 and does
nothing. ``DOT``: the input precision of the large products (``"tf32"`` on GPU, as FLA's bf16
products or better; ``"ieee"`` for exact float32); the interpreter computes them in float32.
"""

from __future__ import annotations

from kda_inductor.lowerings._triton import tl, triton

CHUNK = 64
"""Tokens per chunk."""
BLOCK = 16
"""Rows of the inverse's blocks (``CHUNK // BLOCK`` = 4 diagonal blocks)."""

if triton is not None:

    @triton.jit
    def _chunk(c, seq_ptr, start_ptr, len_ptr):
        """Chunk ``c``'s sequence, first token and length (0: no chunk)."""
        return tl.load(seq_ptr + c), tl.load(start_ptr + c).to(tl.int64), tl.load(len_ptr + c)

    @triton.jit
    def _rows(ptr, tok, s_t, col, s_c, rmask, cmask):
        """Float32 ``[rows, cols]`` tile ``ptr[tok, col]`` (zeros outside the masks)."""
        return tl.load(ptr + tok[:, None] * s_t + col[None, :] * s_c, mask=rmask[:, None] & cmask[None, :],
                       other=0.0).to(tl.float32)

    @triton.jit
    def _keys(ptr, tok, s_t, rk, s_k, rmask, kmask, eps, L2NORM: tl.constexpr):
        """Rows of ``q`` or ``k`` as float32, l2-normalized when asked (``x rsqrt(sum(x^2) + eps)``)."""
        x = _rows(ptr, tok, s_t, rk, s_k, rmask, kmask)
        if L2NORM:
            x = x * tl.math.rsqrt(tl.sum(x * x, 1) + eps)[:, None]
        return x

    @triton.jit
    def _vec(ptr, tok, s_t, rmask):
        return tl.load(ptr + tok * s_t, mask=rmask, other=0.0).to(tl.float32)

    @triton.jit
    def _unit_lower_inverse(A, BC: tl.constexpr):
        """``(I + A)^-1`` of a strictly lower ``[BC, BC]`` ``A``, row by row: ``X_i = e_i - sum_j A_ij X_j``."""
        r = tl.arange(0, BC)
        X = tl.zeros((BC, BC), tl.float32)
        for i in tl.static_range(BC):
            a = tl.sum(tl.where(r[:, None] == i, A, 0.0), 0)
            xi = tl.where(r == i, 1.0, 0.0) - tl.sum(a[:, None] * X, 0)
            X = tl.where(r[:, None] == i, xi[None, :], X)
        return X

    @triton.jit
    def _kkt(ki, bi, gi, kj, gj, DIAG: tl.constexpr, DOT: tl.constexpr):
        """The block ``A_ij = beta_i (k_i . k_j) exp(gc_i - gc_j)`` (strictly lower on the diagonal)."""
        a = tl.dot(ki, tl.trans(kj), input_precision=DOT)
        d = gi[:, None] - gj[None, :]
        if DIAG:
            r = tl.arange(0, ki.shape[0])
            low = r[:, None] > r[None, :]
            return tl.where(low, a * tl.exp(tl.where(low, d, 0.0)) * bi[:, None], 0.0)
        return a * tl.exp(d) * bi[:, None]

    @triton.jit
    def _mm(a, b):
        return tl.dot(a, b, input_precision="ieee")

    @triton.jit
    def _store_block(ptr, tok, s_t, col, blk, rmask):
        tl.store(ptr + tok[:, None] * s_t + col[None, :], blk, mask=rmask[:, None])

    @triton.jit
    def inverse_kernel(k_ptr, g_ptr, b_ptr, t_ptr, gc_ptr, seq_ptr, start_ptr, len_ptr, K, GROUP, eps,
                       sk_t, sk_h, sk_k, sg_t, sg_h, sb_t, sb_h, st_t, st_h, sc_t, sc_h,
                       KP: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr):
        """Program (chunk, head): ``Tinv`` (float32 ``[tokens, heads, C]``, row = token, the lower
        blocks) and ``gc`` (float32 ``[tokens, heads]``) of the chunk."""
        c, h = tl.program_id(0), tl.program_id(1)
        _, t0, L = _chunk(c, seq_ptr, start_ptr, len_ptr)
        r = tl.arange(0, 16)
        rk = tl.arange(0, KP)
        kmask = rk < K
        kb = k_ptr + (h // GROUP).to(tl.int64) * sk_h
        gb, bb = g_ptr + h.to(tl.int64) * sg_h, b_ptr + h.to(tl.int64) * sb_h
        r0, r1, r2, r3 = r, r + 16, r + 32, r + 48
        m0, m1, m2, m3 = r0 < L, r1 < L, r2 < L, r3 < L
        k0 = _keys(kb, t0 + r0, sk_t, rk, sk_k, m0, kmask, eps, L2NORM)
        k1 = _keys(kb, t0 + r1, sk_t, rk, sk_k, m1, kmask, eps, L2NORM)
        k2 = _keys(kb, t0 + r2, sk_t, rk, sk_k, m2, kmask, eps, L2NORM)
        k3 = _keys(kb, t0 + r3, sk_t, rk, sk_k, m3, kmask, eps, L2NORM)
        g0, g1 = _vec(gb, t0 + r0, sg_t, m0), _vec(gb, t0 + r1, sg_t, m1)
        g2, g3 = _vec(gb, t0 + r2, sg_t, m2), _vec(gb, t0 + r3, sg_t, m3)
        b0, b1 = _vec(bb, t0 + r0, sb_t, m0), _vec(bb, t0 + r1, sb_t, m1)
        b2, b3 = _vec(bb, t0 + r2, sb_t, m2), _vec(bb, t0 + r3, sb_t, m3)
        g0 = tl.cumsum(g0, 0)
        g1 = tl.cumsum(g1, 0) + tl.sum(tl.where(r == 15, g0, 0.0), 0)
        g2 = tl.cumsum(g2, 0) + tl.sum(tl.where(r == 15, g1, 0.0), 0)
        g3 = tl.cumsum(g3, 0) + tl.sum(tl.where(r == 15, g2, 0.0), 0)
        gcb = gc_ptr + h.to(tl.int64) * sc_h
        tl.store(gcb + (t0 + r0) * sc_t, g0, mask=m0)
        tl.store(gcb + (t0 + r1) * sc_t, g1, mask=m1)
        tl.store(gcb + (t0 + r2) * sc_t, g2, mask=m2)
        tl.store(gcb + (t0 + r3) * sc_t, g3, mask=m3)
        # the diagonal blocks' inverses
        T00 = _unit_lower_inverse(_kkt(k0, b0, g0, k0, g0, True, DOT), 16)
        T11 = _unit_lower_inverse(_kkt(k1, b1, g1, k1, g1, True, DOT), 16)
        T22 = _unit_lower_inverse(_kkt(k2, b2, g2, k2, g2, True, DOT), 16)
        T33 = _unit_lower_inverse(_kkt(k3, b3, g3, k3, g3, True, DOT), 16)
        A10 = _kkt(k1, b1, g1, k0, g0, False, DOT)
        A20 = _kkt(k2, b2, g2, k0, g0, False, DOT)
        A21 = _kkt(k2, b2, g2, k1, g1, False, DOT)
        A30 = _kkt(k3, b3, g3, k0, g0, False, DOT)
        A31 = _kkt(k3, b3, g3, k1, g1, False, DOT)
        A32 = _kkt(k3, b3, g3, k2, g2, False, DOT)
        # below the diagonal: Tinv_ij = -Tinv_ii sum_{j <= m < i} A_im Tinv_mj
        T10 = -_mm(T11, _mm(A10, T00))
        T21 = -_mm(T22, _mm(A21, T11))
        T20 = -_mm(T22, _mm(A20, T00) + _mm(A21, T10))
        T32 = -_mm(T33, _mm(A32, T22))
        T31 = -_mm(T33, _mm(A31, T11) + _mm(A32, T21))
        T30 = -_mm(T33, _mm(A30, T00) + _mm(A31, T10) + _mm(A32, T20))
        tb = t_ptr + h.to(tl.int64) * st_h
        _store_block(tb, t0 + r0, st_t, r0, T00, m0)
        _store_block(tb, t0 + r1, st_t, r0, T10, m1)
        _store_block(tb, t0 + r1, st_t, r1, T11, m1)
        _store_block(tb, t0 + r2, st_t, r0, T20, m2)
        _store_block(tb, t0 + r2, st_t, r1, T21, m2)
        _store_block(tb, t0 + r2, st_t, r2, T22, m2)
        _store_block(tb, t0 + r3, st_t, r0, T30, m3)
        _store_block(tb, t0 + r3, st_t, r1, T31, m3)
        _store_block(tb, t0 + r3, st_t, r2, T32, m3)
        _store_block(tb, t0 + r3, st_t, r3, T33, m3)

    @triton.jit
    def wu_kernel(k_ptr, v_ptr, b_ptr, t_ptr, gc_ptr, w_ptr, u_ptr, seq_ptr, start_ptr, len_ptr, K, V, GROUP, eps,
                  sk_t, sk_h, sk_k, sv_t, sv_h, sv_v, sb_t, sb_h, st_t, st_h, sc_t, sc_h, sw_t, sw_h, su_t, su_h,
                  KP: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr):
        """Program (chunk, head): ``w = Tinv (beta exp(gc) k)`` and ``u = Tinv (beta v)``."""
        c, h = tl.program_id(0), tl.program_id(1)
        _, t0, L = _chunk(c, seq_ptr, start_ptr, len_ptr)
        r = tl.arange(0, 64)
        rk = tl.arange(0, KP)
        m = r < L
        tok = t0 + r
        h64 = h.to(tl.int64)
        Tm = _rows(t_ptr + h64 * st_h, tok, st_t, r, 1, m, r < 64)
        Tm = tl.where(r[None, :] <= r[:, None], Tm, 0.0)
        beta = _vec(b_ptr + h64 * sb_h, tok, sb_t, m)
        gc = _vec(gc_ptr + h64 * sc_h, tok, sc_t, m)
        k = _keys(k_ptr + (h // GROUP).to(tl.int64) * sk_h, tok, sk_t, rk, sk_k, m, rk < K, eps, L2NORM)
        w = tl.dot(Tm, k * (beta * tl.exp(gc))[:, None], input_precision=DOT)
        tl.store(w_ptr + h64 * sw_h + tok[:, None] * sw_t + rk[None, :], w.to(w_ptr.dtype.element_ty),
                 mask=m[:, None] & (rk < K)[None, :])
        for j in range(0, tl.cdiv(V, BV)):
            rv = j * BV + tl.arange(0, BV)
            vv = _rows(v_ptr + h64 * sv_h, tok, sv_t, rv, sv_v, m, rv < V) * beta[:, None]
            u = tl.dot(Tm, vv, input_precision=DOT)
            tl.store(u_ptr + h64 * su_h + tok[:, None] * su_t + rv[None, :], u.to(u_ptr.dtype.element_ty),
                     mask=m[:, None] & (rv < V)[None, :])

    @triton.jit
    def scan_kernel(k_ptr, w_ptr, u_ptr, gc_ptr, s_ptr, f_ptr, h_ptr, vn_ptr, cu_ptr, cuc_ptr, K, V, GROUP, eps,
                    sk_t, sk_h, sk_k, sw_t, sw_h, su_t, su_h, sc_t, sc_h, ss_n, ss_h, ss_k, ss_v,
                    sh_c, sh_h, sh_k, svn_t, svn_h, sf_n, sf_h, sf_k,
                    KP: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, HAS_STATE: tl.constexpr,
                    DOT: tl.constexpr):
        """Program (sequence, head, column block): the state tile through the sequence's chunks."""
        n, h, j = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        h64, n64 = h.to(tl.int64), n.to(tl.int64)
        ts, te = tl.load(cu_ptr + n).to(tl.int64), tl.load(cu_ptr + n + 1).to(tl.int64)
        cs, ce = tl.load(cuc_ptr + n).to(tl.int64), tl.load(cuc_ptr + n + 1).to(tl.int64)
        r = tl.arange(0, 64)
        rk = tl.arange(0, KP)
        rv = j * BV + tl.arange(0, BV)
        kmask, vmask = rk < K, rv < V
        smask = kmask[:, None] & vmask[None, :]
        if HAS_STATE:
            S = tl.load(s_ptr + n64 * ss_n + h64 * ss_h + rk[:, None] * ss_k + rv[None, :] * ss_v, mask=smask,
                        other=0.0).to(tl.float32)
        else:
            S = tl.zeros((KP, BV), tl.float32)
        kb = k_ptr + (h // GROUP).to(tl.int64) * sk_h
        for c in range(cs, ce):
            t0 = ts + (c - cs) * 64
            m = r < te - t0
            tok = t0 + r
            tl.store(h_ptr + c * sh_c + h64 * sh_h + rk[:, None] * sh_k + rv[None, :], S.to(h_ptr.dtype.element_ty),
                     mask=smask)
            w = _rows(w_ptr + h64 * sw_h, tok, sw_t, rk, 1, m, kmask)
            u = _rows(u_ptr + h64 * su_h, tok, su_t, rv, 1, m, vmask)
            vn = u - tl.dot(w, S, input_precision=DOT)
            tl.store(vn_ptr + h64 * svn_h + tok[:, None] * svn_t + rv[None, :], vn.to(vn_ptr.dtype.element_ty),
                     mask=m[:, None] & vmask[None, :])
            gc = _vec(gc_ptr + h64 * sc_h, tok, sc_t, m)
            gl = tl.sum(tl.where(r == tl.minimum(te - t0, 64) - 1, gc, 0.0), 0)
            k = _keys(kb, tok, sk_t, rk, sk_k, m, kmask, eps, L2NORM)
            kd = k * tl.exp(tl.where(m, gl - gc, 0.0))[:, None]
            S = S * tl.exp(gl) + tl.dot(tl.trans(kd), vn, input_precision=DOT)
        tl.store(f_ptr + n64 * sf_n + h64 * sf_h + rk[:, None] * sf_k + rv[None, :], S, mask=smask)

    @triton.jit
    def output_kernel(q_ptr, k_ptr, gc_ptr, h_ptr, vn_ptr, o_ptr, seq_ptr, start_ptr, len_ptr, K, V, GROUP, scale,
                      eps, sq_t, sq_h, sq_k, sk_t, sk_h, sk_k, sc_t, sc_h, sh_c, sh_h, sh_k, svn_t, svn_h, so_t, so_h,
                      KP: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr):
        """Program (chunk, head, column block): ``o = (q exp(gc)) S + causal(q k^T exp(gc_i - gc_j)) v_new``."""
        c, h, j = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        _, t0, L = _chunk(c, seq_ptr, start_ptr, len_ptr)
        r = tl.arange(0, 64)
        rk = tl.arange(0, KP)
        rv = j * BV + tl.arange(0, BV)
        kmask, vmask = rk < K, rv < V
        m = r < L
        tok = t0 + r
        h64, hk = h.to(tl.int64), (h // GROUP).to(tl.int64)
        q = _keys(q_ptr + hk * sq_h, tok, sq_t, rk, sq_k, m, kmask, eps, L2NORM) * scale
        k = _keys(k_ptr + hk * sk_h, tok, sk_t, rk, sk_k, m, kmask, eps, L2NORM)
        gc = _vec(gc_ptr + h64 * sc_h, tok, sc_t, m)
        S = tl.load(h_ptr + c.to(tl.int64) * sh_c + h64 * sh_h + rk[:, None] * sh_k + rv[None, :],
                    mask=kmask[:, None] & vmask[None, :] & (rk[:, None] * 0 + L > 0), other=0.0).to(tl.float32)
        vn = _rows(vn_ptr + h64 * svn_h, tok, svn_t, rv, 1, m, vmask)
        causal = r[:, None] >= r[None, :]
        a = tl.dot(q, tl.trans(k), input_precision=DOT)
        a = tl.where(causal, a * tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0)), 0.0)
        o = tl.dot(q * tl.exp(gc)[:, None], S, input_precision=DOT) + tl.dot(a, vn, input_precision=DOT)
        tl.store(o_ptr + h64 * so_h + tok[:, None] * so_t + rv[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=m[:, None] & vmask[None, :])
