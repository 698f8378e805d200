"""The Triton kernels of ``kda::gdn_chunk`` with a decay per key channel (KDA, Kimi Linear: ``g``
``[B, T, Hv, K]``); the op, its checks and the launcher are in :mod:`kda_inductor.lowerings.gdn_chunk`.

Per value head and chunk of ``C = 64`` tokens (rows ``i, j``), ``gc`` the cumulative log decay
``[C, K]`` inside the chunk (``<= 0``, non-increasing down the rows), keys and queries
l2-normalized when asked (``rk = 1 / |k|``, ``rq = 1 / |q|``), ``S`` the state ``[K, V]`` at the
chunk's start; the token recurrence ``S_t = diag(exp(g_t)) S_{t-1} + k_t delta_t^T`` unrolled::

    A_ij   = beta_i sum_c k_ic k_jc exp(gc_ic - gc_jc)   (j < i)      w = (I + A)^-1 (beta k exp(gc))
    Aqk_ij = scale sum_c q_ic k_jc exp(gc_ic - gc_jc)    (j <= i)     u = (I + A)^-1 (beta v)
    v_new = u - w S;  S' = diag(exp(gc_last)) S + (k exp(gc_last - gc))^T v_new
    o = (scale q exp(gc)) S + Aqk v_new

Numerics: ``exp(gc_i - gc_j)`` is never a product of ``exp(gc_i)`` and ``exp(-gc_j)`` (the second
overflows float32 past ``-gc = 88``: 9 tokens at Kimi's strongest decays). The chunk is four blocks
of 16 rows; ``G`` a block's own cumulative sum (from its first row, ``>= -160`` at ``g = -10``),
``tot`` its sum. Below the diagonal, block ``(I, J)``'s factor is split at the last token of block
``J``: ``exp(gc_j' - gc_j) = exp(tot_J - G_J)`` on the right (``R_J``, made once a block) and
``exp(G_I + sum_{J < M < I} tot_M)`` on the left, every exponent ``<= 0`` (an underflow to zero is
the true value's, below 1e-38), every difference of sums within the blocks involved (no ``gc`` of
-600 minus another). On the diagonal, column by column: ``exp(G_I[i] - G_I[j])`` for ``i >= j``
only (16 steps, the key row and ``G_I[j]`` read again). ``gc = G + sum_{M < I} tot_M`` and ``k
exp(gc_last - gc) = k exp((tot_I - G_I) + sum_{M > I} tot_M)`` likewise. The norms and ``beta`` /
``scale`` are applied to the products (raw keys as operands).

1. :data:`intra_kernel` (chunk x head): ``A`` in registers (row block by row block: its blocks
   below the diagonal, then the diagonal one; with ``AB`` block by block, each over key column
   blocks of ``AB``, :func:`_blocks_cols`), ``Aqk`` stored as its blocks come, ``Tinv``
   (:func:`~._gdn_chunk_kernels._inverse`), then by 64 key columns ``gc`` (float32), ``kd = k rk
   exp(gc_last - gc)`` and ``w`` stored (the scan's sequential path then holds no exponential of a
   tile), and ``u``.
2. :data:`scan_kernel` (sequence x head x column block): the state in two 64-row register blocks:
   store ``S``, ``v_new = u - w S``, ``S = exp(gc_last) S + kd^T v_new`` (``exp(gc_last)`` a row
   factor of the state).
3. :data:`output_kernel` (chunk x head x column block): ``o = diag(scale rq) ((q exp(gc)) S) +
   Aqk v_new``.

``DOT`` as in :mod:`~kda_inductor.lowerings._gdn_chunk_kernels` (``"bf16"``: bfloat16 operands,
float32 accumulation; the intermediates then stored bfloat16 by the launcher); ``gc``, ``A`` and the
inverse stay float32. Rows past a sequence's end load as zeros and are never stored.
"""

from __future__ import annotations

from kda_inductor.lowerings._gdn_chunk_kernels import aot_signature as _aot_signature
from kda_inductor.lowerings._triton import tl, triton

DIAG_SPAN = 60.0
"""The largest ``-sum(g)`` over a 16-row block (every channel) for which its diagonal block is two
products (``e^60`` times the keys' products stays finite in float32 and bfloat16); past it, the loop."""

if triton is not None:
    _SPAN = tl.constexpr(DIAG_SPAN)
    from kda_inductor.lowerings._gdn_chunk_kernels import chunk2 as _chunk2
    from kda_inductor.lowerings._gdn_chunk_kernels import dot as _dot
    from kda_inductor.lowerings._gdn_chunk_kernels import inverse as _inverse
    from kda_inductor.lowerings._gdn_chunk_kernels import load as _load
    from kda_inductor.lowerings._gdn_chunk_kernels import out_ids as _out_ids
    from kda_inductor.lowerings._gdn_chunk_kernels import raw as _raw
    from kda_inductor.lowerings._gdn_chunk_kernels import seq_range as _seq_range
    from kda_inductor.lowerings._gdn_chunk_kernels import state_in as _state_in
    from kda_inductor.lowerings._gdn_chunk_kernels import store as _store
    from kda_inductor.lowerings._gdn_chunk_kernels import sumsq as _sumsq
    from kda_inductor.lowerings._gdn_chunk_kernels import tile as _tile
    from kda_inductor.lowerings._gdn_chunk_kernels import ut as _ut
    from kda_inductor.lowerings._gdn_chunk_kernels import vec as _vec

    @triton.jit
    def _gblock(gb, i, L, K, sg_t, sg_k, c0, KP: tl.constexpr):
        """Block ``i``'s (rows ``16 i ..``, columns ``c0 ..``) own cumulative log decay ``G`` ``[16, KP]``
        and its sum ``tot``."""
        g = _load(_tile(gb, L, K, sg_t, sg_k, 16 * i, c0, 16, KP))
        return tl.cumsum(g, 0), tl.sum(g, 0)

    @triton.jit
    def _diag_loop(X, Q, G, kb, gb, i, L, K, sk_t, sk_k, sg_t, sg_k, c0, KP: tl.constexpr):
        """Diagonal block ``i`` of ``A`` and ``Aqk`` (raw keys, no ``beta`` / norms / scale; the key
        columns ``c0 .. c0 + KP``), column by column: ``exp(G[r] - G[j])`` for rows ``r >= j`` only (no
        exponent above zero)."""
        r, cols = tl.arange(0, 16), c0 + tl.arange(0, KP)
        a = tl.zeros((16, 16), tl.float32)
        aq = tl.zeros((16, 16), tl.float32)
        gj = tl.zeros((KP,), tl.float32)
        for j in range(16):
            row = 16 * i + j
            live = (cols < K) & (cols * 0 + row < L)
            kj = tl.load(kb + row * sk_t + cols * sk_k, mask=live, other=0.0).to(tl.float32)
            gj += tl.load(gb + row * sg_t + cols * sg_k, mask=live, other=0.0).to(tl.float32)
            e = tl.exp(tl.where(r[:, None] >= j, G - gj[None, :], 0.0)) * kj[None, :]
            at = tl.where(r > j, tl.sum(X * e, 1), 0.0)
            qt = tl.where(r >= j, tl.sum(Q * e, 1), 0.0)
            a += tl.where(r[None, :] == j, at[:, None], 0.0)
            aq += tl.where(r[None, :] == j, qt[:, None], 0.0)
        return a, aq

    @triton.jit
    def _diag(X, Q, G, tot, kb, gb, i, L, K, sk_t, sk_k, sg_t, sg_k, c0, KP: tl.constexpr, DOT: tl.constexpr):
        """Diagonal block ``i`` of ``A`` and ``Aqk`` (raw). Where the block's decay spans at most
        :data:`DIAG_SPAN` in every channel (Kimi's gates nearly always: ~-0.5 a token), as two products
        split before the block's first row, ``(X exp(G)) (k exp(-G))^T`` (the right factor at most
        ``e^SPAN``, finite with a margin of ``e^28`` for the keys' products); else column by column
        (:func:`_diag_loop`: 16 steps, each reading a key row)."""
        if tl.max(-tot, 0) <= _SPAN:
            r = tl.arange(0, 16)
            Rt = tl.trans(X * tl.exp(-G))
            e = tl.exp(G)
            a = tl.where(r[:, None] > r[None, :], _dot(X * e, Rt, DOT), 0.0)
            aq = tl.where(r[:, None] >= r[None, :], _dot(Q * e, Rt, DOT), 0.0)
        else:
            a, aq = _diag_loop(X, Q, G, kb, gb, i, L, K, sk_t, sk_k, sg_t, sg_k, c0, KP)
        return a, aq

    @triton.jit
    def _inv_norm(n, eps, L2NORM: tl.constexpr):
        if L2NORM:
            return tl.math.rsqrt(n + eps)
        else:
            return tl.full(n.shape, 1.0, tl.float32)

    @triton.jit
    def _rows(qb, kb, gb, bb, ab, i, L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, sb_t, sa_t, scale, eps,
              KP: tl.constexpr, L2NORM: tl.constexpr):
        """Block ``i``'s raw key and query rows, ``G``, ``tot``, the keys' ``rk``, the queries' ``scale rq``
        and ``beta rk`` (``f``); ``Aqk``'s row block ``i`` right of its diagonal block stored (zeros)."""
        X = _load(_tile(kb, L, K, sk_t, sk_k, 16 * i, 0, 16, KP))
        Q = _load(_tile(qb, L, K, sq_t, sq_k, 16 * i, 0, 16, KP))
        G, tot = _gblock(gb, i, L, K, sg_t, sg_k, 0, KP)
        rk, sq = _inv_norm(_sumsq(X), eps, L2NORM), _inv_norm(_sumsq(Q), eps, L2NORM) * scale
        f = _vec(bb, sb_t, 16 * i + tl.arange(0, 16), L) * rk
        _store(_tile(ab, L, 64, sa_t, 1, 16 * i, 16 * i + 16, 16, 64), tl.zeros((16, 64), tl.float32))
        return X, Q, G, tot, rk, sq, f

    @triton.jit
    def _on(X, Q, G, tot, rk, sq, f, kb, gb, ab, i, L, K, sk_t, sk_k, sg_t, sg_k, sa_t, KP: tl.constexpr,
            DOT: tl.constexpr):
        """Diagonal block ``i`` (:func:`_diag`): ``A``'s returned, ``Aqk``'s stored, both scaled."""
        a, aq = _diag(X, Q, G, tot, kb, gb, i, L, K, sk_t, sk_k, sg_t, sg_k, 0, KP, DOT)
        _store(_tile(ab, L, 64, sa_t, 1, 16 * i, 16 * i, 16, 16), aq * sq[:, None] * rk[None, :])
        return a * f[:, None] * rk[None, :]

    @triton.jit
    def _off(X, Q, G, between, R, rkj, sq, f, ab, L, sa_t, i, j, DOT: tl.constexpr):
        """Block ``(i, j)`` below the diagonal: ``A``'s returned, ``Aqk``'s stored, both scaled; raw,
        ``(X_i exp(G_i + between)) R_j^T`` (``R_j = k_j exp(tot_j - G_j)``, ``between``: the sums of
        the blocks between ``j`` and ``i``)."""
        e = tl.exp(G + between[None, :])
        Rt = tl.trans(R)
        _store(_tile(ab, L, 64, sa_t, 1, 16 * i, 16 * j, 16, 16), _dot(Q * e, Rt, DOT) * sq[:, None] * rkj[None, :])
        return _dot(X * e, Rt, DOT) * f[:, None] * rkj[None, :]

    @triton.jit
    def _blocks(qb, kb, gb, bb, ab, L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, sb_t, sa_t, scale, eps,
                KP: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr):
        """``A``'s ten blocks on and below the diagonal (``beta`` and the norms applied), ``Aqk`` stored
        by row blocks as they come (none of its blocks kept), the rows' ``rk`` and ``beta rk`` (``f``)."""
        rows = (L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, sb_t, sa_t, scale, eps)
        X0, Q0, G0, t0, k0, s0, f0 = _rows(qb, kb, gb, bb, ab, 0, *rows, KP, L2NORM)
        a00 = _on(X0, Q0, G0, t0, k0, s0, f0, kb, gb, ab, 0, L, K, sk_t, sk_k, sg_t, sg_k, sa_t,
                  KP, DOT)
        R0 = X0 * tl.exp(t0[None, :] - G0)
        X1, Q1, G1, t1, k1, s1, f1 = _rows(qb, kb, gb, bb, ab, 1, *rows, KP, L2NORM)
        z = tl.zeros((KP,), tl.float32)
        a10 = _off(X1, Q1, G1, z, R0, k0, s1, f1, ab, L, sa_t, 1, 0, DOT)
        a11 = _on(X1, Q1, G1, t1, k1, s1, f1, kb, gb, ab, 1, L, K, sk_t, sk_k, sg_t, sg_k, sa_t,
                  KP, DOT)
        R1 = X1 * tl.exp(t1[None, :] - G1)
        X2, Q2, G2, t2, k2, s2, f2 = _rows(qb, kb, gb, bb, ab, 2, *rows, KP, L2NORM)
        a20 = _off(X2, Q2, G2, t1, R0, k0, s2, f2, ab, L, sa_t, 2, 0, DOT)
        a21 = _off(X2, Q2, G2, z, R1, k1, s2, f2, ab, L, sa_t, 2, 1, DOT)
        a22 = _on(X2, Q2, G2, t2, k2, s2, f2, kb, gb, ab, 2, L, K, sk_t, sk_k, sg_t, sg_k, sa_t,
                  KP, DOT)
        R2 = X2 * tl.exp(t2[None, :] - G2)
        X3, Q3, G3, t3, k3, s3, f3 = _rows(qb, kb, gb, bb, ab, 3, *rows, KP, L2NORM)
        a30 = _off(X3, Q3, G3, t1 + t2, R0, k0, s3, f3, ab, L, sa_t, 3, 0, DOT)
        a31 = _off(X3, Q3, G3, t2, R1, k1, s3, f3, ab, L, sa_t, 3, 1, DOT)
        a32 = _off(X3, Q3, G3, z, R2, k2, s3, f3, ab, L, sa_t, 3, 2, DOT)
        a33 = _on(X3, Q3, G3, t3, k3, s3, f3, kb, gb, ab, 3, L, K, sk_t, sk_k, sg_t, sg_k, sa_t,
                  KP, DOT)
        return a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, k0, k1, k2, k3, f0, f1, f2, f3

    @triton.jit
    def _cols_rows(qb, kb, gb, i, L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, c0, AB: tl.constexpr):
        """Block ``i``'s raw key and query rows in the columns ``c0 .. c0 + AB``, its ``G`` and ``tot`` there."""
        X = _load(_tile(kb, L, K, sk_t, sk_k, 16 * i, c0, 16, AB))
        Q = _load(_tile(qb, L, K, sq_t, sq_k, 16 * i, c0, 16, AB))
        G, tot = _gblock(gb, i, L, K, sg_t, sg_k, c0, AB)
        return X, Q, G, tot

    @triton.jit
    def _pair_cols(qb, kb, gb, L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, I: tl.constexpr, J: tl.constexpr,
                   AB: tl.constexpr, DOT: tl.constexpr):
        """Block ``(I, J)`` (``J <= I``) of ``A`` and ``Aqk``, raw (no norms / ``beta`` / ``scale``), the
        key dimension in a loop of ``AB`` columns (each column block's decay factors its own): the
        diagonal by :func:`_diag`, below it ``(X_I exp(G_I + between)) R_J^T`` (:func:`_off`'s);
        :func:`_pair_rt` with the pair known when compiled."""
        return _pair_rt(qb, kb, gb, L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, I, J, AB, DOT)

    @triton.jit
    def _norms(qb, kb, L, K, sq_t, sq_k, sk_t, sk_k, i, eps, AB: tl.constexpr, L2NORM: tl.constexpr):
        """Block ``i``'s keys' ``1 / |k|`` and queries' ``1 / |q|`` (ones without ``L2NORM``), by ``AB`` columns."""
        n = tl.zeros((16,), tl.float32)
        m = tl.zeros((16,), tl.float32)
        if L2NORM:
            for c0 in range(0, K, AB):
                n += _sumsq(_load(_tile(kb, L, K, sk_t, sk_k, 16 * i, c0, 16, AB)))
                m += _sumsq(_load(_tile(qb, L, K, sq_t, sq_k, 16 * i, c0, 16, AB)))
        return _inv_norm(n, eps, L2NORM), _inv_norm(m, eps, L2NORM)

    @triton.jit
    def _cols_block(qb, kb, gb, ab, L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, sa_t, f, sq, rkj,
                    I: tl.constexpr, J: tl.constexpr, AB: tl.constexpr, DOT: tl.constexpr):
        """Block ``(I, J)``: ``Aqk``'s scaled and stored, ``A``'s scaled and returned."""
        a, aq = _pair_cols(qb, kb, gb, L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, I, J, AB, DOT)
        _store(_tile(ab, L, 64, sa_t, 1, 16 * I, 16 * J, 16, 16), aq * sq[:, None] * rkj[None, :])
        return a * f[:, None] * rkj[None, :]

    @triton.jit
    def _blocks_cols(qb, kb, gb, bb, ab, L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, sb_t, sa_t, scale, eps,
                     AB: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr):
        """:func:`_blocks` block by block, each block's products over the key dimension in a loop of
        ``AB`` columns (:func:`_pair_cols`), the norms first: one block's accumulators live at a time
        (twenty 16 x 16 accumulators at once spill at any column width: sm_90, 4 / 8 warps)."""
        cols = (L, K, sq_t, sq_k, sk_t, sk_k)
        k0, s0 = _norms(qb, kb, *cols, 0, eps, AB, L2NORM)
        k1, s1 = _norms(qb, kb, *cols, 1, eps, AB, L2NORM)
        k2, s2 = _norms(qb, kb, *cols, 2, eps, AB, L2NORM)
        k3, s3 = _norms(qb, kb, *cols, 3, eps, AB, L2NORM)
        s0, s1, s2, s3 = s0 * scale, s1 * scale, s2 * scale, s3 * scale
        r = tl.arange(0, 16)
        f0, f1 = _vec(bb, sb_t, r, L) * k0, _vec(bb, sb_t, r + 16, L) * k1
        f2, f3 = _vec(bb, sb_t, r + 32, L) * k2, _vec(bb, sb_t, r + 48, L) * k3
        zr = tl.zeros((16, 64), tl.float32)
        for i in tl.static_range(4):  # Aqk right of each diagonal block
            _store(_tile(ab, L, 64, sa_t, 1, 16 * i, 16 * i + 16, 16, 64), zr)
        blk = (qb, kb, gb, ab, L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, sa_t)
        a00 = _cols_block(*blk, f0, s0, k0, 0, 0, AB, DOT)
        a10 = _cols_block(*blk, f1, s1, k0, 1, 0, AB, DOT)
        a11 = _cols_block(*blk, f1, s1, k1, 1, 1, AB, DOT)
        a20 = _cols_block(*blk, f2, s2, k0, 2, 0, AB, DOT)
        a21 = _cols_block(*blk, f2, s2, k1, 2, 1, AB, DOT)
        a22 = _cols_block(*blk, f2, s2, k2, 2, 2, AB, DOT)
        a30 = _cols_block(*blk, f3, s3, k0, 3, 0, AB, DOT)
        a31 = _cols_block(*blk, f3, s3, k1, 3, 1, AB, DOT)
        a32 = _cols_block(*blk, f3, s3, k2, 3, 2, AB, DOT)
        a33 = _cols_block(*blk, f3, s3, k3, 3, 3, AB, DOT)
        return a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, k0, k1, k2, k3, f0, f1, f2, f3

    @triton.jit
    def _wkd_block(kb, cb, kdb, P, suffix, G, tot, f, rk, i, c0, L, K, sk_t, sk_k, sc_t, skd_t, BK: tl.constexpr):
        """Block ``i``: ``gc = G + P`` (``P``: the blocks before's sums) and ``kd = k rk exp((tot - G) +
        suffix)`` (``suffix``: the blocks after's sums) stored; returns ``w``'s operand ``k f exp(gc)``
        (``f = beta rk``)."""
        x = _load(_tile(kb, L, K, sk_t, sk_k, 16 * i, c0, 16, BK))
        _store(_tile(cb, L, K, sc_t, 1, 16 * i, c0, 16, BK), G + P[None, :])
        kd = x * rk[:, None] * tl.exp(tot[None, :] - G + suffix[None, :])
        _store(_tile(kdb, L, K, skd_t, 1, 16 * i, c0, 16, BK), kd)
        return x * f[:, None] * tl.exp(G + P[None, :])

    @triton.jit
    def _w_kd(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, kb, gb, cb, kdb, wb, f0, f1, f2, f3, k0, k1, k2, k3,
              L, K, sk_t, sk_k, sg_t, sg_k, sc_t, skd_t, sw_t, BK: tl.constexpr, DOT: tl.constexpr):
        """``gc``, ``kd`` and ``w = Tinv (beta rk k exp(gc))`` stored by ``BK`` key columns (independent
        here: the decays are sums down the rows), the blocks' decays again from ``g``."""
        for c0 in range(0, K, BK):
            G0, t0 = _gblock(gb, 0, L, K, sg_t, sg_k, c0, BK)
            G1, t1 = _gblock(gb, 1, L, K, sg_t, sg_k, c0, BK)
            G2, t2 = _gblock(gb, 2, L, K, sg_t, sg_k, c0, BK)
            G3, t3 = _gblock(gb, 3, L, K, sg_t, sg_k, c0, BK)
            z = tl.zeros((BK,), tl.float32)
            X0 = _wkd_block(kb, cb, kdb, z, t1 + t2 + t3, G0, t0, f0, k0, 0, c0, L, K, sk_t, sk_k, sc_t, skd_t, BK)
            X1 = _wkd_block(kb, cb, kdb, t0, t2 + t3, G1, t1, f1, k1, 1, c0, L, K, sk_t, sk_k, sc_t, skd_t, BK)
            X2 = _wkd_block(kb, cb, kdb, t0 + t1, t3, G2, t2, f2, k2, 2, c0, L, K, sk_t, sk_k, sc_t, skd_t, BK)
            X3 = _wkd_block(kb, cb, kdb, t0 + t1 + t2, z, G3, t3, f3, k3, 3, c0, L, K, sk_t, sk_k, sc_t, skd_t, BK)
            _ut(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, X0, X1, X2, X3, wb, L, K, sw_t, c0, BK, DOT)

    @triton.jit
    def _u(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, vb, ub, b0, b1, b2, b3, L, V, sv_t, sv_v, su_t,
           BV: tl.constexpr, DOT: tl.constexpr):
        """``u = Tinv (beta v)`` stored, by ``BV`` value columns."""
        for j in range(0, tl.cdiv(V, BV)):
            c0 = j * BV
            _ut(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33,
                _load(_tile(vb, L, V, sv_t, sv_v, 0, c0, 16, BV)) * b0[:, None],
                _load(_tile(vb, L, V, sv_t, sv_v, 16, c0, 16, BV)) * b1[:, None],
                _load(_tile(vb, L, V, sv_t, sv_v, 32, c0, 16, BV)) * b2[:, None],
                _load(_tile(vb, L, V, sv_t, sv_v, 48, c0, 16, BV)) * b3[:, None], ub, L, V, su_t, c0, BV, DOT)

    @triton.jit
    def intra_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, gc_ptr, w_ptr, u_ptr, kd_ptr, aq_ptr, seq_ptr, start_ptr,
                     len_ptr, n_tok, n_chk, K, V, GROUP, scale, eps, sq_t, sq_h, sq_k, sk_t, sk_h, sk_k, sv_t, sv_h,
                     sv_v, sg_t, sg_h, sg_k, sb_t, sb_h, sc_t, sc_h, sw_t, sw_h, su_t, su_h, skd_t, skd_h, sa_t, sa_h,
                     KP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr,
                     DOT: tl.constexpr, REGULAR: tl.constexpr, AB: tl.constexpr = 0,
                     INV: tl.constexpr = "subst"):
        """Program (chunk, head): ``gc``, ``Aqk``, ``w``, ``u``, ``kd`` stored (the module docstring;
        ``A`` / ``Aqk`` from whole key rows, ``KP`` columns, or by ``AB`` columns accumulated
        (:func:`_blocks_cols`; ``AB = 0``: whole rows); ``gc``, ``kd``, ``w`` by ``BK`` columns; ``INV``:
        the inverse's diagonal blocks, :func:`~._gdn_chunk_inverse.inverse16`'s choices)."""
        c, h = tl.program_id(0), tl.program_id(1)
        _, t0, L = _chunk2(c, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, REGULAR)
        h64, hk = h.to(tl.int64), (h // GROUP).to(tl.int64)
        qb, kb, gb = q_ptr + hk * sq_h + t0 * sq_t, k_ptr + hk * sk_h + t0 * sk_t, g_ptr + h64 * sg_h + t0 * sg_t
        bb = b_ptr + h64 * sb_h + t0 * sb_t
        if AB:
            a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, k0, k1, k2, k3, f0, f1, f2, f3 = _blocks_cols(
                qb, kb, gb, bb, aq_ptr + h64 * sa_h + t0 * sa_t, L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, sb_t,
                sa_t, scale, eps, AB, L2NORM, DOT)
        else:
            a00, a10, a11, a20, a21, a22, a30, a31, a32, a33, k0, k1, k2, k3, f0, f1, f2, f3 = _blocks(
                qb, kb, gb, bb, aq_ptr + h64 * sa_h + t0 * sa_t, L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, sb_t,
                sa_t, scale, eps, KP, L2NORM, DOT)
        T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _inverse(a00, a10, a11, a20, a21, a22, a30, a31, a32, a33,
                                                                    INV)
        _w_kd(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, kb, gb, gc_ptr + h64 * sc_h + t0 * sc_t,
              kd_ptr + h64 * skd_h + t0 * skd_t, w_ptr + h64 * sw_h + t0 * sw_t, f0, f1, f2, f3, k0, k1, k2, k3,
              L, K, sk_t, sk_k, sg_t, sg_k, sc_t, skd_t, sw_t, BK, DOT)
        r = tl.arange(0, 16)
        _u(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, v_ptr + h64 * sv_h + t0 * sv_t,
           u_ptr + h64 * su_h + t0 * su_t, _vec(bb, sb_t, r, L), _vec(bb, sb_t, r + 16, L), _vec(bb, sb_t, r + 32, L),
           _vec(bb, sb_t, r + 48, L), L, V, sv_t, sv_v, su_t, BV, DOT)

    @triton.jit
    def _pair_rt(qb, kb, gb, L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, I, J, AB: tl.constexpr, DOT: tl.constexpr):
        """Block ``(I, J)`` (``J <= I``) of ``A`` and ``Aqk``, raw, by ``AB`` key columns (:func:`_pair_cols`),
        the pair known at run time (one program a pair: :data:`pairs_kernel`) or when compiled."""
        a = tl.zeros((16, 16), tl.float32)
        aq = tl.zeros((16, 16), tl.float32)
        for c0 in range(0, K, AB):
            X, Q, G, tot = _cols_rows(qb, kb, gb, I, L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, c0, AB)
            if I == J:
                da, dq = _diag(X, Q, G, tot, kb, gb, I, L, K, sk_t, sk_k, sg_t, sg_k, c0, AB, DOT)
            else:
                Xj = _load(_tile(kb, L, K, sk_t, sk_k, 16 * J, c0, 16, AB))
                Gj, tj = _gblock(gb, J, L, K, sg_t, sg_k, c0, AB)
                between = tl.zeros((AB,), tl.float32)
                for m in range(J + 1, I):
                    between += _gblock(gb, m, L, K, sg_t, sg_k, c0, AB)[1]
                e = tl.exp(G + between[None, :])
                Rt = tl.trans(Xj * tl.exp(tj[None, :] - Gj))
                da, dq = _dot(X * e, Rt, DOT), _dot(Q * e, Rt, DOT)
            a += da
            aq += dq
        return a, aq

    @triton.jit
    def pairs_kernel(q_ptr, k_ptr, g_ptr, b_ptr, a_ptr, aq_ptr, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, K, GROUP,
                     scale, eps, sq_t, sq_h, sq_k, sk_t, sk_h, sk_k, sg_t, sg_h, sg_k, sb_t, sb_h, sa_t, sa_h,
                     AB: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr, REGULAR: tl.constexpr):
        """Program (chunk, head, block pair ``p`` of the ten on and below the diagonal: ``I`` its row block,
        ``J <= I`` its column block): ``A``'s block (``beta`` and the norms applied, float32 ``[tokens,
        heads, 64]``) and ``Aqk``'s (with ``scale``) stored; a diagonal program also zeros ``Aqk`` right
        of its block. :data:`rest_kernel` reads ``A`` back."""
        c, h, p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        I = (p >= 1).to(tl.int32) + (p >= 3).to(tl.int32) + (p >= 6).to(tl.int32)
        J = p - I * (I + 1) // 2
        _, t0, L = _chunk2(c, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, REGULAR)
        h64, hk = h.to(tl.int64), (h // GROUP).to(tl.int64)
        qb, kb, gb = q_ptr + hk * sq_h + t0 * sq_t, k_ptr + hk * sk_h + t0 * sk_t, g_ptr + h64 * sg_h + t0 * sg_t
        ab, aqb = a_ptr + h64 * sa_h + t0 * sa_t, aq_ptr + h64 * sa_h + t0 * sa_t
        rk, rq = _norms(qb, kb, L, K, sq_t, sq_k, sk_t, sk_k, I, eps, AB, L2NORM)
        rkj = _norms(qb, kb, L, K, sq_t, sq_k, sk_t, sk_k, J, eps, AB, L2NORM)[0]
        f = _vec(b_ptr + h64 * sb_h + t0 * sb_t, sb_t, 16 * I + tl.arange(0, 16), L) * rk
        a, aq = _pair_rt(qb, kb, gb, L, K, sq_t, sq_k, sk_t, sk_k, sg_t, sg_k, I, J, AB, DOT)
        _store(_tile(ab, L, 64, sa_t, 1, 16 * I, 16 * J, 16, 16), a * f[:, None] * rkj[None, :])
        _store(_tile(aqb, L, 64, sa_t, 1, 16 * I, 16 * J, 16, 16), aq * (rq * scale)[:, None] * rkj[None, :])
        if I == J:
            _store(_tile(aqb, L, 64, sa_t, 1, 16 * I, 16 * I + 16, 16, 64), tl.zeros((16, 64), tl.float32))

    @triton.jit
    def rest_kernel(k_ptr, v_ptr, g_ptr, b_ptr, a_ptr, gc_ptr, w_ptr, u_ptr, kd_ptr, seq_ptr, start_ptr, len_ptr,
                    n_tok, n_chk, K, V, GROUP, eps, sk_t, sk_h, sk_k, sv_t, sv_h, sv_v, sg_t, sg_h, sg_k, sb_t, sb_h,
                    sa_t, sa_h, sc_t, sc_h, sw_t, sw_h, su_t, su_h, skd_t, skd_h, BK: tl.constexpr,
                    BV: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr, REGULAR: tl.constexpr,
                    INV: tl.constexpr = "subst"):
        """Program (chunk, head): :data:`intra_kernel` after its ``A``: the ten blocks :data:`pairs_kernel`
        stored read back, the inverse, ``gc``, ``kd``, ``w`` and ``u`` stored."""
        c, h = tl.program_id(0), tl.program_id(1)
        _, t0, L = _chunk2(c, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, REGULAR)
        h64, hk = h.to(tl.int64), (h // GROUP).to(tl.int64)
        kb, gb, bb = k_ptr + hk * sk_h + t0 * sk_t, g_ptr + h64 * sg_h + t0 * sg_t, b_ptr + h64 * sb_h + t0 * sb_t
        ab = a_ptr + h64 * sa_h + t0 * sa_t
        T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _inverse(
            _block_a(ab, L, sa_t, 0, 0), _block_a(ab, L, sa_t, 1, 0), _block_a(ab, L, sa_t, 1, 1),
            _block_a(ab, L, sa_t, 2, 0), _block_a(ab, L, sa_t, 2, 1), _block_a(ab, L, sa_t, 2, 2),
            _block_a(ab, L, sa_t, 3, 0), _block_a(ab, L, sa_t, 3, 1), _block_a(ab, L, sa_t, 3, 2),
            _block_a(ab, L, sa_t, 3, 3), INV)
        r, keys = tl.arange(0, 16), (kb, L, K, sk_t, sk_k)
        k0, k1 = _key_norm(*keys, 0, eps, BK, L2NORM), _key_norm(*keys, 1, eps, BK, L2NORM)
        k2, k3 = _key_norm(*keys, 2, eps, BK, L2NORM), _key_norm(*keys, 3, eps, BK, L2NORM)
        b0, b1 = _vec(bb, sb_t, r, L), _vec(bb, sb_t, r + 16, L)
        b2, b3 = _vec(bb, sb_t, r + 32, L), _vec(bb, sb_t, r + 48, L)
        _w_kd(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, kb, gb, gc_ptr + h64 * sc_h + t0 * sc_t,
              kd_ptr + h64 * skd_h + t0 * skd_t, w_ptr + h64 * sw_h + t0 * sw_t, b0 * k0, b1 * k1, b2 * k2, b3 * k3,
              k0, k1, k2, k3, L, K, sk_t, sk_k, sg_t, sg_k, sc_t, skd_t, sw_t, BK, DOT)
        _u(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, v_ptr + h64 * sv_h + t0 * sv_t,
           u_ptr + h64 * su_h + t0 * su_t, b0, b1, b2, b3, L, V, sv_t, sv_v, su_t, BV, DOT)

    @triton.jit
    def _block_a(ab, L, sa_t, i: tl.constexpr, j: tl.constexpr):
        return _load(_tile(ab, L, 64, sa_t, 1, 16 * i, 16 * j, 16, 16))

    @triton.jit
    def _key_norm(kb, L, K, sk_t, sk_k, i, eps, AB: tl.constexpr, L2NORM: tl.constexpr):
        """Block ``i``'s keys' ``1 / |k|`` (ones without ``L2NORM``), by ``AB`` columns."""
        n = tl.zeros((16,), tl.float32)
        if L2NORM:
            for c0 in range(0, K, AB):
                n += _sumsq(_load(_tile(kb, L, K, sk_t, sk_k, 16 * i, c0, 16, AB)))
        return _inv_norm(n, eps, L2NORM)

    @triton.jit
    def _decay_rows(cb, K, sc_t, L, c0, KB: tl.constexpr):
        """``exp(gc_last)`` of the key rows ``c0 .. c0 + KB`` (the state's row factor; ``L >= 1``)."""
        cols = c0 + tl.arange(0, KB)
        return tl.exp(tl.load(cb + (L - 1) * sc_t + cols, mask=cols < K, other=0.0))

    @triton.jit
    def scan_kernel(w_ptr, u_ptr, kd_ptr, gc_ptr, s_ptr, f_ptr, h_ptr, vn_ptr, cu_ptr, cuc_ptr, n_tok, n_chk, K, V,
                    sw_t, sw_h, su_t, su_h, skd_t, skd_h, sc_t, sc_h, ss_n, ss_h, ss_k, ss_v, sh_c, sh_h, sh_k,
                    svn_t, svn_h, sf_n, sf_h, sf_k, KB: tl.constexpr, TWO: tl.constexpr, BV: tl.constexpr,
                    HAS_STATE: tl.constexpr, DOT: tl.constexpr, REGULAR: tl.constexpr):
        """Program (sequence, head, column block): the state as rows ``0 .. KB`` (``S1``) and ``KB ..
        2 KB`` (``S2``, ``TWO``) through the chunks: store ``S``; ``v_new = u - w S`` (stored); ``S =
        diag(exp(gc_last)) S + kd^T v_new``."""
        n, h, j = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        h64, n64 = h.to(tl.int64), n.to(tl.int64)
        ts, te, cs, ce = _seq_range(n, n64, cu_ptr, cuc_ptr, n_tok, n_chk, REGULAR)
        S1, S2 = _state_in(s_ptr + n64 * ss_n + h64 * ss_h, K, V, ss_k, ss_v, j, KB, BV, HAS_STATE, TWO)
        for c in range(cs, ce):
            t0 = ts + (c - cs) * 64
            L = tl.minimum(te - t0, 64).to(tl.int32)
            hb, wb = h_ptr + c * sh_c + h64 * sh_h, w_ptr + h64 * sw_h + t0 * sw_t
            kdb, cb = kd_ptr + h64 * skd_h + t0 * skd_t, gc_ptr + h64 * sc_h + t0 * sc_t
            _store(_tile(hb, K, V, sh_k, 1, 0, j * BV, KB, BV), S1)
            u = _load(_tile(u_ptr + h64 * su_h + t0 * su_t, L, V, su_t, 1, 0, j * BV, 64, BV))
            vn = u - _dot(_raw(_tile(wb, L, K, sw_t, 1, 0, 0, 64, KB)), S1, DOT)
            if TWO:
                _store(_tile(hb, K, V, sh_k, 1, KB, j * BV, KB, BV), S2)
                vn -= _dot(_raw(_tile(wb, L, K, sw_t, 1, 0, KB, 64, KB)), S2, DOT)
            _store(_tile(vn_ptr + h64 * svn_h + t0 * svn_t, L, V, svn_t, 1, 0, j * BV, 64, BV), vn)
            S1 = S1 * _decay_rows(cb, K, sc_t, L, 0, KB)[:, None] + _dot(
                tl.trans(_raw(_tile(kdb, L, K, skd_t, 1, 0, 0, 64, KB))), vn, DOT)
            if TWO:
                S2 = S2 * _decay_rows(cb, K, sc_t, L, KB, KB)[:, None] + _dot(
                    tl.trans(_raw(_tile(kdb, L, K, skd_t, 1, 0, KB, 64, KB))), vn, DOT)
        fb = f_ptr + n64 * sf_n + h64 * sf_h
        _store(_tile(fb, K, V, sf_k, 1, 0, j * BV, KB, BV), S1)
        if TWO:
            _store(_tile(fb, K, V, sf_k, 1, KB, j * BV, KB, BV), S2)

    @triton.jit
    def _q_state(qb, cb, hb, L, K, V, sq_t, sq_k, sc_t, sh_k, c0, j, KB: tl.constexpr, BV: tl.constexpr,
                 DOT: tl.constexpr):
        """Key columns ``c0 .. c0 + KB``'s part of ``(q exp(gc)) S`` and of the query rows' squared norms."""
        q = _load(_tile(qb, L, K, sq_t, sq_k, 0, c0, 64, KB))
        qg = q * tl.exp(_load(_tile(cb, L, K, sc_t, 1, 0, c0, 64, KB)))
        return _dot(qg, _raw(_tile(hb, K, V, sh_k, 1, c0, j * BV, KB, BV)), DOT), _sumsq(q)

    @triton.jit
    def output_kernel(q_ptr, gc_ptr, aq_ptr, h_ptr, vn_ptr, o_ptr, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, K, V,
                      GROUP, scale, eps, sq_t, sq_h, sq_k, sc_t, sc_h, sa_t, sa_h, sh_c, sh_h, sh_k, svn_t, svn_h,
                      so_t, so_h, KB: tl.constexpr, TWO: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr,
                      DOT: tl.constexpr, REGULAR: tl.constexpr, V_FIRST: tl.constexpr = False):
        """Program (chunk, head, column block): ``o = diag(scale rq) ((q exp(gc)) S) + Aqk v_new``."""
        c, h, j = _out_ids(V, BV, V_FIRST)
        _, t0, L = _chunk2(c, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, REGULAR)
        h64, hk = h.to(tl.int64), (h // GROUP).to(tl.int64)
        qb, cb = q_ptr + hk * sq_h + t0 * sq_t, gc_ptr + h64 * sc_h + t0 * sc_t
        # a chunk id past the last chunk reads chunk 0's rows of nothing (L = 0) and stores nothing
        hb = h_ptr + c.to(tl.int64) * sh_c * (L > 0) + h64 * sh_h
        o, nq = _q_state(qb, cb, hb, L, K, V, sq_t, sq_k, sc_t, sh_k, 0, j, KB, BV, DOT)
        if TWO:
            o2, nq2 = _q_state(qb, cb, hb, L, K, V, sq_t, sq_k, sc_t, sh_k, KB, j, KB, BV, DOT)
            o, nq = o + o2, nq + nq2
        sq = _inv_norm(nq, eps, L2NORM) * scale
        aq = _raw(_tile(aq_ptr + h64 * sa_h + t0 * sa_t, L, 64, sa_t, 1, 0, 0, 64, 64))
        vn = _raw(_tile(vn_ptr + h64 * svn_h + t0 * svn_t, L, V, svn_t, 1, 0, j * BV, 64, BV))
        o = o * sq[:, None] + _dot(aq, vn, DOT)
        _store(_tile(o_ptr + h64 * so_h + t0 * so_t, L, V, so_t, 1, 0, j * BV, 64, BV), o)


def aot_variants():
    """The KDA launches for sm_90 at Kimi Linear's dims (K = V = 128, bf16 q / k / v / beta, float32
    g, l2norm, a state) as ``gdn_chunk.KDA`` runs them (bf16 intermediates, ``intra``'s products tf32,
    the others' bf16), ``intra`` with bf16 products (``kda_intra_dot=""``), the float32
    intermediates of ``lowp=False`` (tf32 products), ``intra`` over 32-column key blocks
    (``kda_intra_cols=32``), and ``kda_intra_split``'s ``pairs`` (64 / 32 columns) and ``rest``."""
    from kda_inductor.lowerings import AotVariant

    maps = {"seq_ptr": "*i32", "start_ptr": "*i64", "len_ptr": "*i32", "cu_ptr": "*i64", "cuc_ptr": "*i64"}
    bf16 = {**maps, **dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "b_ptr", "o_ptr"), "*bf16")}
    low = {**bf16, **dict.fromkeys(("w_ptr", "u_ptr", "kd_ptr", "aq_ptr", "h_ptr", "vn_ptr"), "*bf16")}
    opts4, opts8 = {"num_warps": 4, "num_stages": 2}, {"num_warps": 8, "num_stages": 2}
    for io, dot, ab in ((low, "tf32", 0), (low, "bf16", 0), (bf16, "tf32", 0), (low, "tf32", 32)):
        yield AotVariant(intra_kernel, _aot_signature(intra_kernel, io),
                         dict(KP=128, BK=64, BV=64, L2NORM=True, DOT=dot, REGULAR=True, AB=ab), opts8)
    for ab in (64, 32):  # kda_intra_split's two launches
        pairs = {**bf16, "a_ptr": "*fp32", "aq_ptr": "*bf16"}
        yield AotVariant(pairs_kernel, _aot_signature(pairs_kernel, pairs),
                         dict(AB=ab, L2NORM=True, DOT="tf32", REGULAR=True), {"num_warps": 4, "num_stages": 2})
    rest = {**low, "a_ptr": "*fp32"}
    yield AotVariant(rest_kernel, _aot_signature(rest_kernel, rest),
                     dict(BK=64, BV=64, L2NORM=True, DOT="tf32", REGULAR=True), opts8)
    for io, dot in ((low, "bf16"), (bf16, "tf32")):
        yield AotVariant(scan_kernel, _aot_signature(scan_kernel, io),
                         dict(KB=64, TWO=True, BV=32, HAS_STATE=True, DOT=dot, REGULAR=False), opts4)
        yield AotVariant(output_kernel, _aot_signature(output_kernel, io),
                         dict(KB=64, TWO=True, BV=64, L2NORM=True, DOT=dot, REGULAR=True), opts4)
