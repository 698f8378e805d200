"""The Triton kernels of ``kda::gdn_chunk`` (the chunked gated delta rule forward; the op, its
checks and the launcher are in :mod:`kda_inductor.lowerings.gdn_chunk`).

Chunks of ``C = 64`` tokens that never cross a sequence's end; per value head ``h`` (key head
``h // GROUP``), chunk rows ``i, j`` (tokens of one chunk), ``q`` / ``k`` l2-normalized when asked,
``q`` scaled, all in float32, ``gc`` the cumulative sum of ``g`` inside the chunk and
``S`` the state ``[K, V]`` at the chunk's start:

1. :data:`kkt_kernel` (program = chunk x head): ``gc`` and ``A = strict_lower(beta_i (k_i . k_j)
   exp(gc_i - gc_j))`` (one ``[64, K] x [K, 64]`` product), stored float32.
2. :data:`wu_kernel` (chunk x head): ``Tinv = (I + A)^-1`` from 16 x 16 blocks of ``A``: the four
   diagonal blocks inverted by forward substitution (row by row, in registers), the six below them
   by ``Tinv_ij = -Tinv_ii sum_{j <= m < i} A_im Tinv_mj`` (float32 products, ``ieee``); then, by
   those blocks, ``w = Tinv (beta exp(gc) k)`` ``[C, K]`` and ``u = Tinv (beta v)`` ``[C, V]`` (the
   UT / WY form: the chunk's deltas are ``u - w S``). ``Tinv`` never leaves registers.
3. :data:`scan_kernel` (sequence x head x column block, sequential over the sequence's chunks):
   the state tile in registers; per chunk: store ``S`` (the chunk's start state for step 4),
   ``v_new = u - w S``, ``S = exp(gc_last) S + (k exp(gc_last - gc))^T v_new``; the final state.
4. :data:`output_kernel` (chunk x head x column block): ``o = (q exp(gc)) S + causal(q k^T
   exp(gc_i - gc_j)) v_new``.

``LaunchConfig.v2`` (``gdn_chunk.FAST``) runs three launches instead: :data:`wu2_kernel` (1 and 2
fused: ``A``'s ten 16 x 16 blocks from the chunk's key rows in registers, never stored; ``gc`` and
``1 / |k|`` stored), :data:`scan2_kernel` (the state as two 64-row register blocks; the decay and
``1 / |k|`` folded into ``v_new``'s rows, so raw ``k`` is the product's operand and no reduction is
on the sequential path) and :data:`output2_kernel` (raw ``q`` / ``k`` as operands, the norms and
scale applied to the products' rows and columns); with ``DOT = "bf16"`` the large products take
bfloat16 operands (float32 accumulation) and ``w``, ``u``, ``v_new`` and the per-chunk states are
stored bfloat16, as fla's kernels do; the state, ``gc`` and the inverse stay float32.

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
    from kda_inductor.lowerings._gdn_chunk_inverse import inverse as _inverse

    @triton.jit
    def _chunk(c, seq_ptr, start_ptr, len_ptr):
        """Chunk ``c``'s sequence, first token and length (0: no chunk)."""
        return tl.load(seq_ptr + c), tl.load(start_ptr + c).to(tl.int64), tl.load(len_ptr + c)

    @triton.jit
    def _tile(base, rows, cols, s_r, s_c, r0, c0, BR: tl.constexpr, BC: tl.constexpr):
        """``(pointers, mask)`` of ``base[r0 : r0 + BR, c0 : c0 + BC]`` in a ``[rows, cols]`` matrix
        (int32 offsets from the chunk's int64 base; outside it: zeros on loads, nothing on stores)."""
        rr = r0 + tl.arange(0, BR)
        cc = c0 + tl.arange(0, BC)
        return base + (rr[:, None] * s_r + cc[None, :] * s_c), (rr[:, None] < rows) & (cc[None, :] < cols)

    @triton.jit
    def _load(bp):
        return tl.load(bp[0], mask=bp[1], other=0.0).to(tl.float32)

    @triton.jit
    def _store(bp, x):
        tl.store(bp[0], x.to(bp[0].dtype.element_ty), mask=bp[1])

    @triton.jit
    def _keys(bp, eps, L2NORM: tl.constexpr):
        """Rows of ``q`` or ``k`` as float32, l2-normalized when asked (``x rsqrt(sum(x^2) + eps)``)."""
        x = _load(bp)
        if L2NORM:
            x = x * tl.math.rsqrt(tl.sum(x * x, 1) + eps)[:, None]
        return x

    @triton.jit
    def _vec(base, s_t, r, L):
        return tl.load(base + r * s_t, mask=r < L, other=0.0).to(tl.float32)

    @triton.jit
    def _last(x, r, i):
        """``x[i]`` of a vector, as a scalar."""
        return tl.sum(tl.where(r == i, x, 0.0), 0)

    @triton.jit
    def kkt_kernel(k_ptr, g_ptr, b_ptr, a_ptr, gc_ptr, seq_ptr, start_ptr, len_ptr, K, GROUP, eps,
                   sk_t, sk_h, sk_k, sg_t, sg_h, sb_t, sb_h, sa_t, sa_h, sc_t, sc_h,
                   KP: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr):
        """Program (chunk, head): ``gc`` (float32 ``[tokens, heads]``) and ``A`` (float32 ``[tokens,
        heads, C]``, row = token: ``beta_i (k_i . k_j) exp(gc_i - gc_j)`` for ``j < i``, else 0)."""
        c, h = tl.program_id(0), tl.program_id(1)
        _, t0, L = _chunk(c, seq_ptr, start_ptr, len_ptr)
        r = tl.arange(0, 64)
        h64 = h.to(tl.int64)
        k = _keys(_tile(k_ptr + (h // GROUP).to(tl.int64) * sk_h + t0 * sk_t, L, K, sk_t, sk_k, 0, 0, 64, KP), eps,
                  L2NORM)
        gc = tl.cumsum(_vec(g_ptr + h64 * sg_h + t0 * sg_t, sg_t, r, L), 0)
        beta = _vec(b_ptr + h64 * sb_h + t0 * sb_t, sb_t, r, L)
        tl.store(gc_ptr + h64 * sc_h + t0 * sc_t + r * sc_t, gc, mask=r < L)
        low = r[:, None] > r[None, :]
        A = tl.dot(k * beta[:, None], tl.trans(k), input_precision=DOT)
        A = tl.where(low, A * tl.exp(tl.where(low, gc[:, None] - gc[None, :], 0.0)), 0.0)
        _store(_tile(a_ptr + h64 * sa_h + t0 * sa_t, L, 64, sa_t, 1, 0, 0, 64, 64), A)

    @triton.jit
    def _block(base, L, s_t, i, j):
        return _load(_tile(base, L, 64, s_t, 1, 16 * i, 16 * j, 16, 16))

    @triton.jit
    def _rows16(base, L, cols, s_t, s_c, i, c0, scale, BC: tl.constexpr):
        """Rows ``16 i .. 16 i + 15`` of a chunk's ``[64, cols]`` tile, times ``scale`` (a vector of the
        rows' factors)."""
        return _load(_tile(base, L, cols, s_t, s_c, 16 * i, c0, 16, BC)) * scale[:, None]

    @triton.jit
    def _dot(a, b, DOT: tl.constexpr):
        """``a @ b`` with float32 accumulation: ``DOT`` ``"bf16"``: bfloat16 operands (tensor cores at
        bf16 rate, as fla's kernels run them); ``"bf16emu"``: the same roundings, then float32 products
        (the interpreter, whose bf16 ``tl.dot`` is wrong in Triton 3.9); ``"tf32"`` / ``"ieee"``: float32
        operands in that precision."""
        if DOT == "bf16":
            return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
        elif DOT == "bf16emu":
            return tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32), input_precision="ieee")
        else:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=DOT)

    @triton.jit
    def _ut(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, X0, X1, X2, X3, ob, L, cols, s_t, c0,
            BC: tl.constexpr, DOT: tl.constexpr):
        """Store ``Tinv X`` (``X`` by its four row blocks) at ``ob``."""
        _store(_tile(ob, L, cols, s_t, 1, 0, c0, 16, BC), _dot(T00, X0, DOT))
        _store(_tile(ob, L, cols, s_t, 1, 16, c0, 16, BC),
               _dot(T10, X0, DOT) + _dot(T11, X1, DOT))
        _store(_tile(ob, L, cols, s_t, 1, 32, c0, 16, BC), _dot(T20, X0, DOT)
               + _dot(T21, X1, DOT) + _dot(T22, X2, DOT))
        _store(_tile(ob, L, cols, s_t, 1, 48, c0, 16, BC), _dot(T30, X0, DOT)
               + _dot(T31, X1, DOT) + _dot(T32, X2, DOT)
               + _dot(T33, X3, DOT))

    @triton.jit
    def _block_inverse(ab, L, sa_t):
        """:func:`~._gdn_chunk_inverse.inverse` (by substitution) of the chunk's ``A`` stored at ``ab``."""
        return _inverse(_block(ab, L, sa_t, 0, 0), _block(ab, L, sa_t, 1, 0), _block(ab, L, sa_t, 1, 1),
                        _block(ab, L, sa_t, 2, 0), _block(ab, L, sa_t, 2, 1), _block(ab, L, sa_t, 2, 2),
                        _block(ab, L, sa_t, 3, 0), _block(ab, L, sa_t, 3, 1), _block(ab, L, sa_t, 3, 2),
                        _block(ab, L, sa_t, 3, 3), "subst")

    @triton.jit
    def _store_kd(kdb, gl, X0, X1, X2, X3, c0, c1, c2, c3, r, L, K, skd_t, KP: tl.constexpr):
        """The scan's ``k exp(gc_last - gc)`` of a chunk's four row blocks (``PRE_KD``)."""
        _store(_tile(kdb, L, K, skd_t, 1, 0, 0, 16, KP), X0 * tl.exp(tl.where(r < L, gl - c0, 0.0))[:, None])
        _store(_tile(kdb, L, K, skd_t, 1, 16, 0, 16, KP), X1 * tl.exp(tl.where(r + 16 < L, gl - c1, 0.0))[:, None])
        _store(_tile(kdb, L, K, skd_t, 1, 32, 0, 16, KP), X2 * tl.exp(tl.where(r + 32 < L, gl - c2, 0.0))[:, None])
        _store(_tile(kdb, L, K, skd_t, 1, 48, 0, 16, KP), X3 * tl.exp(tl.where(r + 48 < L, gl - c3, 0.0))[:, None])

    @triton.jit
    def _wu_store(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, X0, X1, X2, X3, b0, b1, b2, b3, c0, c1, c2, c3,
                  w_ptr, v_ptr, u_ptr, h64, t0, L, K, V, sw_t, sw_h, sv_t, sv_h, sv_v, su_t, su_h, KP: tl.constexpr,
                  BV: tl.constexpr, DOT: tl.constexpr):
        """``wu_kernel``'s and ``wu2_kernel``'s last step: from ``Tinv``'s blocks, the key rows ``X``,
        ``beta`` (``b``) and ``gc`` (``c``) by their four 16-row blocks, ``w = Tinv (beta exp(gc) k)``
        and ``u = Tinv (beta v)`` (by ``BV`` value columns) stored."""
        X0, X1 = X0 * (b0 * tl.exp(c0))[:, None], X1 * (b1 * tl.exp(c1))[:, None]
        X2, X3 = X2 * (b2 * tl.exp(c2))[:, None], X3 * (b3 * tl.exp(c3))[:, None]
        _ut(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, X0, X1, X2, X3, w_ptr + h64 * sw_h + t0 * sw_t, L, K,
            sw_t, 0, KP, DOT)
        vb, ub = v_ptr + h64 * sv_h + t0 * sv_t, u_ptr + h64 * su_h + t0 * su_t
        for j in range(0, tl.cdiv(V, BV)):
            _ut(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, _rows16(vb, L, V, sv_t, sv_v, 0, j * BV, b0, BV),
                _rows16(vb, L, V, sv_t, sv_v, 1, j * BV, b1, BV), _rows16(vb, L, V, sv_t, sv_v, 2, j * BV, b2, BV),
                _rows16(vb, L, V, sv_t, sv_v, 3, j * BV, b3, BV), ub, L, V, su_t, j * BV, BV, DOT)

    @triton.jit
    def wu_kernel(k_ptr, v_ptr, b_ptr, a_ptr, gc_ptr, w_ptr, u_ptr, kd_ptr, seq_ptr, start_ptr, len_ptr, K, V, GROUP,
                  eps, sk_t, sk_h, sk_k, sv_t, sv_h, sv_v, sb_t, sb_h, sa_t, sa_h, sc_t, sc_h, sw_t, sw_h, su_t, su_h,
                  skd_t, skd_h, KP: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr,
                  PRE_KD: tl.constexpr = False):
        """Program (chunk, head): ``Tinv = (I + A)^-1`` by 16 x 16 blocks (the diagonal ones by forward
        substitution, those below by ``Tinv_ij = -Tinv_ii sum_{j <= m < i} A_im Tinv_mj``, float32
        products), then ``w = Tinv (beta exp(gc) k)`` and ``u = Tinv (beta v)``; ``PRE_KD``: also the
        scan's ``k exp(gc_last - gc)`` (``kd``), so that the sequential scan reads it instead of
        normalizing ``k`` and decaying it itself."""
        c, h = tl.program_id(0), tl.program_id(1)
        _, t0, L = _chunk(c, seq_ptr, start_ptr, len_ptr)
        r = tl.arange(0, 16)
        h64 = h.to(tl.int64)
        T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _block_inverse(a_ptr + h64 * sa_h + t0 * sa_t, L, sa_t)
        bb, cb = b_ptr + h64 * sb_h + t0 * sb_t, gc_ptr + h64 * sc_h + t0 * sc_t
        b0, b1, b2, b3 = _vec(bb, sb_t, r, L), _vec(bb, sb_t, r + 16, L), _vec(bb, sb_t, r + 32, L), \
            _vec(bb, sb_t, r + 48, L)
        c0, c1, c2, c3 = _vec(cb, sc_t, r, L), _vec(cb, sc_t, r + 16, L), _vec(cb, sc_t, r + 32, L), \
            _vec(cb, sc_t, r + 48, L)
        kb = k_ptr + (h // GROUP).to(tl.int64) * sk_h + t0 * sk_t
        X0 = _keys(_tile(kb, L, K, sk_t, sk_k, 0, 0, 16, KP), eps, L2NORM)
        X1 = _keys(_tile(kb, L, K, sk_t, sk_k, 16, 0, 16, KP), eps, L2NORM)
        X2 = _keys(_tile(kb, L, K, sk_t, sk_k, 32, 0, 16, KP), eps, L2NORM)
        X3 = _keys(_tile(kb, L, K, sk_t, sk_k, 48, 0, 16, KP), eps, L2NORM)
        if PRE_KD:
            _store_kd(kd_ptr + h64 * skd_h + t0 * skd_t, tl.load(cb + (L - 1) * sc_t, mask=L > 0, other=0.0),
                      X0, X1, X2, X3, c0, c1, c2, c3, r, L, K, skd_t, KP)
        _wu_store(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, X0, X1, X2, X3, b0, b1, b2, b3, c0, c1, c2, c3,
                  w_ptr, v_ptr, u_ptr, h64, t0, L, K, V, sw_t, sw_h, sv_t, sv_h, sv_v, su_t, su_h, KP, BV, DOT)

    @triton.jit
    def scan_kernel(k_ptr, w_ptr, u_ptr, gc_ptr, s_ptr, f_ptr, h_ptr, vn_ptr, kd_ptr, cu_ptr, cuc_ptr, K, V, GROUP,
                    eps, sk_t, sk_h, sk_k, sw_t, sw_h, su_t, su_h, sc_t, sc_h, ss_n, ss_h, ss_k, ss_v,
                    sh_c, sh_h, sh_k, svn_t, svn_h, sf_n, sf_h, sf_k, skd_t, skd_h,
                    KP: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, HAS_STATE: tl.constexpr,
                    DOT: tl.constexpr, PRE_KD: tl.constexpr = False):
        """Program (sequence, head, column block): the state tile through the sequence's chunks."""
        n, h, j = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        h64, n64 = h.to(tl.int64), n.to(tl.int64)
        ts, te = tl.load(cu_ptr + n).to(tl.int64), tl.load(cu_ptr + n + 1).to(tl.int64)
        cs, ce = tl.load(cuc_ptr + n).to(tl.int64), tl.load(cuc_ptr + n + 1).to(tl.int64)
        r = tl.arange(0, 64)
        if HAS_STATE:
            S = _load(_tile(s_ptr + n64 * ss_n + h64 * ss_h, K, V, ss_k, ss_v, 0, j * BV, KP, BV))
        else:
            S = tl.zeros((KP, BV), tl.float32)
        kb = k_ptr + (h // GROUP).to(tl.int64) * sk_h
        for c in range(cs, ce):
            t0 = ts + (c - cs) * 64
            L = tl.minimum(te - t0, 64).to(tl.int32)
            _store(_tile(h_ptr + c * sh_c + h64 * sh_h, K, V, sh_k, 1, 0, j * BV, KP, BV), S)
            w = _load(_tile(w_ptr + h64 * sw_h + t0 * sw_t, L, K, sw_t, 1, 0, 0, 64, KP))
            u = _load(_tile(u_ptr + h64 * su_h + t0 * su_t, L, V, su_t, 1, 0, j * BV, 64, BV))
            vn = u - tl.dot(w, S, input_precision=DOT)
            _store(_tile(vn_ptr + h64 * svn_h + t0 * svn_t, L, V, svn_t, 1, 0, j * BV, 64, BV), vn)
            if PRE_KD:
                gl = tl.load(gc_ptr + h64 * sc_h + (t0 + L - 1) * sc_t)
                kd = _load(_tile(kd_ptr + h64 * skd_h + t0 * skd_t, L, K, skd_t, 1, 0, 0, 64, KP))
            else:
                gc = _vec(gc_ptr + h64 * sc_h + t0 * sc_t, sc_t, r, L)
                gl = _last(gc, r, L - 1)
                k = _keys(_tile(kb + t0 * sk_t, L, K, sk_t, sk_k, 0, 0, 64, KP), eps, L2NORM)
                kd = k * tl.exp(tl.where(r < L, gl - gc, 0.0))[:, None]
            S = S * tl.exp(gl) + tl.dot(tl.trans(kd), vn, input_precision=DOT)
        _store(_tile(f_ptr + n64 * sf_n + h64 * sf_h, K, V, sf_k, 1, 0, j * BV, KP, BV), S)

    @triton.jit
    def output_kernel(q_ptr, k_ptr, gc_ptr, h_ptr, vn_ptr, o_ptr, seq_ptr, start_ptr, len_ptr, K, V, GROUP, scale,
                      eps, sq_t, sq_h, sq_k, sk_t, sk_h, sk_k, sc_t, sc_h, sh_c, sh_h, sh_k, svn_t, svn_h, so_t, so_h,
                      KP: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr):
        """Program (chunk, head, column block): ``o = (q exp(gc)) S + causal(q k^T exp(gc_i - gc_j)) v_new``."""
        c, h, j = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        _, t0, L = _chunk(c, seq_ptr, start_ptr, len_ptr)
        r = tl.arange(0, 64)
        h64, hk = h.to(tl.int64), (h // GROUP).to(tl.int64)
        q = _keys(_tile(q_ptr + hk * sq_h + t0 * sq_t, L, K, sq_t, sq_k, 0, 0, 64, KP), eps, L2NORM) * scale
        k = _keys(_tile(k_ptr + hk * sk_h + t0 * sk_t, L, K, sk_t, sk_k, 0, 0, 64, KP), eps, L2NORM)
        gc = _vec(gc_ptr + h64 * sc_h + t0 * sc_t, sc_t, r, L)
        causal = r[:, None] >= r[None, :]
        a = tl.dot(q, tl.trans(k), input_precision=DOT)
        a = tl.where(causal, a * tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0)), 0.0)
        # a chunk id past the last chunk reads chunk 0's rows of nothing (L = 0) and stores nothing
        S = _load(_tile(h_ptr + c.to(tl.int64) * sh_c * (L > 0) + h64 * sh_h, K, V, sh_k, 1, 0, j * BV, KP, BV))
        vn = _load(_tile(vn_ptr + h64 * svn_h + t0 * svn_t, L, V, svn_t, 1, 0, j * BV, 64, BV))
        o = tl.dot(q * tl.exp(gc)[:, None], S, input_precision=DOT) + tl.dot(a, vn, input_precision=DOT)
        _store(_tile(o_ptr + h64 * so_h + t0 * so_t, L, V, so_t, 1, 0, j * BV, 64, BV), o)


    # ------------------------------------------------------------------ the v2 kernels (LaunchConfig.v2)
    # kkt fused into wu (A never stored), the scan's state in two 64-row register blocks with the
    # decay and the key norm folded into v_new's rows (k read raw, as the dot's operand), the output
    # from raw q / k (norms and scale applied to the products' rows / columns); ``DOT = "bf16"``: the
    # products' operands in bfloat16 (fp32 accumulation), the intermediates stored bfloat16.

    @triton.jit
    def _chunk2(c, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, REGULAR: tl.constexpr):
        """:func:`_chunk`; ``REGULAR`` (no ``cu_seqlens``: sequences of ``n_tok`` tokens, ``n_chk`` chunks
        each): from ``c`` alone, no chunk map (its ~20 small torch kernels are not launched)."""
        if REGULAR:
            n = c // n_chk
            i = c - n * n_chk
            t0 = n.to(tl.int64) * n_tok + i * 64
            L = tl.minimum(n_tok - i * 64, 64)
        else:
            n = tl.load(seq_ptr + c)
            t0 = tl.load(start_ptr + c).to(tl.int64)
            L = tl.load(len_ptr + c)
        return n, t0, L

    @triton.jit
    def _raw(bp):
        """A tile as stored (its dtype: the dot operand without a conversion)."""
        return tl.load(bp[0], mask=bp[1], other=0.0)

    @triton.jit
    def _sumsq(x):
        xf = x.to(tl.float32)
        return tl.sum(xf * xf, 1)

    @triton.jit
    def _keys_rk(bp, rkb, s_t, rows, L, eps, L2NORM: tl.constexpr):
        """:func:`_keys` of 16 rows, storing their ``1 / |k|`` at ``rkb`` (``L2NORM``)."""
        x = _load(bp)
        if L2NORM:
            rk = tl.math.rsqrt(tl.sum(x * x, 1) + eps)
            tl.store(rkb + rows * s_t, rk, mask=rows < L)
            x = x * rk[:, None]
        return x

    @triton.jit
    def _akk(Xi, Xj, bi, ci, cj, DOT: tl.constexpr, DIAG: tl.constexpr, BETA_AFTER: tl.constexpr):
        """Block ``(i, j)`` of ``A``: ``beta_i (k_i . k_j) exp(gc_i - gc_j)`` (strictly lower on the diagonal);
        ``BETA_AFTER``: beta applied to the product (v3's operands, the keys as ``OPERAND`` keeps them)."""
        if BETA_AFTER:
            return decay_block(_dot(Xi, tl.trans(Xj), DOT), ci, cj, DIAG, bi, True)
        else:
            return decay_block(_dot(Xi * bi[:, None], tl.trans(Xj), DOT), ci, cj, DIAG, bi, False)

    @triton.jit
    def rows_inverse(X0, X1, X2, X3, b0, b1, b2, b3, c0, c1, c2, c3, DOT: tl.constexpr, BETA_AFTER: tl.constexpr,
                     INV: tl.constexpr):
        """``Tinv = (I + A)^-1`` of a chunk from its four 16-row key blocks ``X``, beta and ``gc`` blocks:
        ``A``'s ten lower blocks (:func:`_akk`), then :func:`~._gdn_chunk_inverse.inverse`."""
        return _inverse(
            _akk(X0, X0, b0, c0, c0, DOT, True, BETA_AFTER), _akk(X1, X0, b1, c1, c0, DOT, False, BETA_AFTER),
            _akk(X1, X1, b1, c1, c1, DOT, True, BETA_AFTER), _akk(X2, X0, b2, c2, c0, DOT, False, BETA_AFTER),
            _akk(X2, X1, b2, c2, c1, DOT, False, BETA_AFTER), _akk(X2, X2, b2, c2, c2, DOT, True, BETA_AFTER),
            _akk(X3, X0, b3, c3, c0, DOT, False, BETA_AFTER), _akk(X3, X1, b3, c3, c1, DOT, False, BETA_AFTER),
            _akk(X3, X2, b3, c3, c2, DOT, False, BETA_AFTER), _akk(X3, X3, b3, c3, c3, DOT, True, BETA_AFTER), INV)

    @triton.jit
    def decay_block(a, ci, cj, DIAG: tl.constexpr, bi, BETA: tl.constexpr):
        """The 16 x 16 block ``a`` (``BETA``: times ``bi`` by rows) times ``exp(gc_i - gc_j)``; on the
        diagonal (``DIAG``) strictly lower, the exponent masked before ``exp`` (never overflowing above
        the diagonal)."""
        d = ci[:, None] - cj[None, :]
        if DIAG:
            r = tl.arange(0, 16)
            low = r[:, None] > r[None, :]
            if BETA:
                a = a * bi[:, None]
            return tl.where(low, a * tl.exp(tl.where(low, d, 0.0)), 0.0)
        else:
            if BETA:
                a = a * bi[:, None]
            return a * tl.exp(d)

    @triton.jit
    def gc16(gb, cb, sg_t, sc_t, r, L):
        """The chunk's cumulative decay ``gc`` by its four 16-row blocks, stored at ``cb``."""
        g0, g1, g2, g3 = _vec(gb, sg_t, r, L), _vec(gb, sg_t, r + 16, L), _vec(gb, sg_t, r + 32, L), \
            _vec(gb, sg_t, r + 48, L)
        c0 = tl.cumsum(g0, 0)
        c1 = tl.cumsum(g1, 0) + tl.sum(g0, 0)
        c2 = tl.cumsum(g2, 0) + tl.sum(g0, 0) + tl.sum(g1, 0)
        c3 = tl.cumsum(g3, 0) + tl.sum(g0, 0) + tl.sum(g1, 0) + tl.sum(g2, 0)
        tl.store(cb + r * sc_t, c0, mask=r < L)
        tl.store(cb + (r + 16) * sc_t, c1, mask=r + 16 < L)
        tl.store(cb + (r + 32) * sc_t, c2, mask=r + 32 < L)
        tl.store(cb + (r + 48) * sc_t, c3, mask=r + 48 < L)
        return c0, c1, c2, c3

    @triton.jit
    def _keys_op(bp, rkb, s_t, rows, L, eps, L2NORM: tl.constexpr, DOT: tl.constexpr, OPERAND: tl.constexpr):
        """:func:`_keys_rk`; ``OPERAND``: kept in the products' operand dtype (bfloat16 for ``DOT``
        ``"bf16"`` / ``"bf16emu"``: half the registers of the four row blocks)."""
        x = _keys_rk(bp, rkb, s_t, rows, L, eps, L2NORM)
        if OPERAND:
            if DOT == "bf16" or DOT == "bf16emu":
                x = x.to(tl.bfloat16)
        return x

    @triton.jit
    def _chunk_rows(k_ptr, g_ptr, b_ptr, gc_ptr, rk_ptr, h, t0, L, K, GROUP, eps, sk_t, sk_h, sk_k, sg_t, sg_h, sb_t,
                    sb_h, sc_t, sc_h, KP: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr,
                    OPERAND: tl.constexpr):
        """What ``wu2_kernel`` and v3's solve read of head ``h``'s chunk at ``t0``, by four 16-row
        blocks: ``gc`` (stored, :func:`gc16`), ``beta`` and the key rows (:func:`_keys_op`, their
        ``1 / |k|`` stored when ``L2NORM``). Returns ``(h64, c0..c3, b0..b3, X0..X3)``."""
        r = tl.arange(0, 16)
        h64 = h.to(tl.int64)
        gb, bb, cb = g_ptr + h64 * sg_h + t0 * sg_t, b_ptr + h64 * sb_h + t0 * sb_t, gc_ptr + h64 * sc_h + t0 * sc_t
        c0, c1, c2, c3 = gc16(gb, cb, sg_t, sc_t, r, L)
        b0, b1, b2, b3 = _vec(bb, sb_t, r, L), _vec(bb, sb_t, r + 16, L), _vec(bb, sb_t, r + 32, L), \
            _vec(bb, sb_t, r + 48, L)
        kb, rb = k_ptr + (h // GROUP).to(tl.int64) * sk_h + t0 * sk_t, rk_ptr + h64 * sc_h + t0 * sc_t
        X0 = _keys_op(_tile(kb, L, K, sk_t, sk_k, 0, 0, 16, KP), rb, sc_t, r, L, eps, L2NORM, DOT, OPERAND)
        X1 = _keys_op(_tile(kb, L, K, sk_t, sk_k, 16, 0, 16, KP), rb, sc_t, r + 16, L, eps, L2NORM, DOT, OPERAND)
        X2 = _keys_op(_tile(kb, L, K, sk_t, sk_k, 32, 0, 16, KP), rb, sc_t, r + 32, L, eps, L2NORM, DOT, OPERAND)
        X3 = _keys_op(_tile(kb, L, K, sk_t, sk_k, 48, 0, 16, KP), rb, sc_t, r + 48, L, eps, L2NORM, DOT, OPERAND)
        return h64, c0, c1, c2, c3, b0, b1, b2, b3, X0, X1, X2, X3

    @triton.jit
    def _seq_range(n, n64, cu_ptr, cuc_ptr, n_tok, n_chk, REGULAR: tl.constexpr):
        """``(first token, end token, first chunk, end chunk)`` of sequence ``n``."""
        if REGULAR:
            ts, cs = n64 * n_tok, n64 * n_chk
            te, ce = ts + n_tok, cs + n_chk
        else:
            ts, te = tl.load(cu_ptr + n).to(tl.int64), tl.load(cu_ptr + n + 1).to(tl.int64)
            cs, ce = tl.load(cuc_ptr + n).to(tl.int64), tl.load(cuc_ptr + n + 1).to(tl.int64)
        return ts, te, cs, ce

    @triton.jit
    def _state_in(sb, K, V, ss_k, ss_v, j, KB: tl.constexpr, BV: tl.constexpr, HAS_STATE: tl.constexpr,
                  TWO: tl.constexpr):
        """The state's column block ``j`` as rows ``0 .. KB`` and ``KB .. 2 KB`` (zeros without a
        state; the second unread unless ``TWO``)."""
        if HAS_STATE:
            S1 = _load(_tile(sb, K, V, ss_k, ss_v, 0, j * BV, KB, BV))
        else:
            S1 = tl.zeros((KB, BV), tl.float32)
        if TWO and HAS_STATE:
            S2 = _load(_tile(sb, K, V, ss_k, ss_v, KB, j * BV, KB, BV))
        else:
            S2 = tl.zeros((KB, BV), tl.float32)
        return S1, S2

    @triton.jit
    def _row_factor(cb, rb, sc_t, r, L, L2NORM: tl.constexpr):
        """``(exp(gc_last - gc) rk, gc_last)`` of a chunk's rows (``rk = 1 / |k|`` when ``L2NORM``)."""
        gc = _vec(cb, sc_t, r, L)
        gl = tl.load(cb + (L - 1) * sc_t)  # L >= 1: a chunk of the sequence
        f = tl.exp(tl.where(r < L, gl - gc, 0.0))
        if L2NORM:
            f = f * _vec(rb, sc_t, r, L)
        return f, gl

    @triton.jit
    def wu2_kernel(k_ptr, v_ptr, g_ptr, b_ptr, gc_ptr, rk_ptr, w_ptr, u_ptr, seq_ptr, start_ptr, len_ptr, n_tok, n_chk,
                   K, V, GROUP, eps, sk_t, sk_h, sk_k, sv_t, sv_h, sv_v, sg_t, sg_h, sb_t, sb_h, sc_t, sc_h, sw_t,
                   sw_h, su_t, su_h,
                   KP: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr,
                   REGULAR: tl.constexpr, INV: tl.constexpr = "subst"):
        """Program (chunk, head): ``gc`` and (``L2NORM``) the keys' ``1 / |k|`` (``rk``, float32 like
        ``gc``) stored for the next launches, ``A`` by its ten 16 x 16 blocks from the chunk's key rows
        (in registers), ``Tinv = (I + A)^-1`` (``INV``: its diagonal blocks by substitution or a product
        of factors, :func:`~._gdn_chunk_inverse.inverse`), ``w = Tinv (beta exp(gc) k)``, ``u = Tinv (beta v)``."""
        c, h = tl.program_id(0), tl.program_id(1)
        _, t0, L = _chunk2(c, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, REGULAR)
        h64, c0, c1, c2, c3, b0, b1, b2, b3, X0, X1, X2, X3 = _chunk_rows(
            k_ptr, g_ptr, b_ptr, gc_ptr, rk_ptr, h, t0, L, K, GROUP, eps, sk_t, sk_h, sk_k, sg_t, sg_h, sb_t, sb_h, sc_t,
            sc_h, KP, L2NORM, DOT, False)
        T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = rows_inverse(
            X0, X1, X2, X3, b0, b1, b2, b3, c0, c1, c2, c3, DOT, False, INV)
        _wu_store(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, X0, X1, X2, X3, b0, b1, b2, b3, c0, c1, c2, c3,
                  w_ptr, v_ptr, u_ptr, h64, t0, L, K, V, sw_t, sw_h, sv_t, sv_h, sv_v, su_t, su_h, KP, BV, DOT)

    @triton.jit
    def scan2_kernel(k_ptr, w_ptr, u_ptr, gc_ptr, rk_ptr, s_ptr, f_ptr, h_ptr, vn_ptr, cu_ptr, cuc_ptr, n_tok, n_chk, K,
                     V, GROUP, eps, sk_t, sk_h, sk_k, sw_t, sw_h, su_t, su_h, sc_t, sc_h, ss_n, ss_h, ss_k, ss_v,
                     sh_c, sh_h, sh_k, svn_t, svn_h, sf_n, sf_h, sf_k,
                     KB: tl.constexpr, TWO: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr,
                     HAS_STATE: tl.constexpr, DOT: tl.constexpr, REGULAR: tl.constexpr):
        """Program (sequence, head, column block): the state as rows ``0 .. KB`` (``S1``) and ``KB ..
        2 KB`` (``S2``, when ``TWO``) through the sequence's chunks: store ``S``; ``v_new = u - w S``
        (stored); ``S = exp(gc_last) S + k^T (v_new exp(gc_last - gc) rk)`` (``rk = 1 / |k|``, from
        ``wu2``: no reduction on the sequential path)."""
        n, h, j = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        h64, n64 = h.to(tl.int64), n.to(tl.int64)
        ts, te, cs, ce = _seq_range(n, n64, cu_ptr, cuc_ptr, n_tok, n_chk, REGULAR)
        r = tl.arange(0, 64)
        S1, S2 = _state_in(s_ptr + n64 * ss_n + h64 * ss_h, K, V, ss_k, ss_v, j, KB, BV, HAS_STATE, TWO)
        kb = k_ptr + (h // GROUP).to(tl.int64) * sk_h
        for c in range(cs, ce):
            t0 = ts + (c - cs) * 64
            L = tl.minimum(te - t0, 64).to(tl.int32)
            hb, wb = h_ptr + c * sh_c + h64 * sh_h, w_ptr + h64 * sw_h + t0 * sw_t
            _store(_tile(hb, K, V, sh_k, 1, 0, j * BV, KB, BV), S1)
            k1 = _raw(_tile(kb + t0 * sk_t, L, K, sk_t, sk_k, 0, 0, 64, KB))
            u = _load(_tile(u_ptr + h64 * su_h + t0 * su_t, L, V, su_t, 1, 0, j * BV, 64, BV))
            vn = u - _dot(_raw(_tile(wb, L, K, sw_t, 1, 0, 0, 64, KB)), S1, DOT)
            if TWO:
                _store(_tile(hb, K, V, sh_k, 1, KB, j * BV, KB, BV), S2)
                k2 = _raw(_tile(kb + t0 * sk_t, L, K, sk_t, sk_k, 0, KB, 64, KB))
                vn -= _dot(_raw(_tile(wb, L, K, sw_t, 1, 0, KB, 64, KB)), S2, DOT)
            _store(_tile(vn_ptr + h64 * svn_h + t0 * svn_t, L, V, svn_t, 1, 0, j * BV, 64, BV), vn)
            f, gl = _row_factor(gc_ptr + h64 * sc_h + t0 * sc_t, rk_ptr + h64 * sc_h + t0 * sc_t, sc_t, r, L, L2NORM)
            vs = vn * f[:, None]
            decay = tl.exp(gl)
            S1 = S1 * decay + _dot(tl.trans(k1), vs, DOT)
            if TWO:
                S2 = S2 * decay + _dot(tl.trans(k2), vs, DOT)
        fb = f_ptr + n64 * sf_n + h64 * sf_h
        _store(_tile(fb, K, V, sf_k, 1, 0, j * BV, KB, BV), S1)
        if TWO:
            _store(_tile(fb, K, V, sf_k, 1, KB, j * BV, KB, BV), S2)

    @triton.jit
    def _out_ids(V, BV: tl.constexpr, V_FIRST: tl.constexpr):
        """``(chunk, head, column block)`` of an output program: grid ``(chunks, heads, blocks)``, or
        with ``V_FIRST`` ``(chunks * blocks, heads)`` with the blocks fastest (programs reading the
        same ``q`` / ``k`` rows run together, as fla orders its grid: L2 hits instead of HBM reads)."""
        if V_FIRST:
            nvb = tl.cdiv(V, BV)
            p = tl.program_id(0)
            return p // nvb, tl.program_id(1), p % nvb
        else:
            return tl.program_id(0), tl.program_id(1), tl.program_id(2)

    @triton.jit
    def output2_kernel(q_ptr, k_ptr, gc_ptr, rk_ptr, h_ptr, vn_ptr, o_ptr, seq_ptr, start_ptr, len_ptr, n_tok, n_chk,
                       K, V, GROUP, scale, eps, sq_t, sq_h, sq_k, sk_t, sk_h, sk_k, sc_t, sc_h, sh_c, sh_h, sh_k,
                       svn_t, svn_h, so_t, so_h,
                       KB: tl.constexpr, TWO: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr,
                       DOT: tl.constexpr, REGULAR: tl.constexpr, V_FIRST: tl.constexpr = False):
        """Program (chunk, head, column block): ``o = diag(s exp(gc)) (q S) + causal(diag(s) (q k^T)
        diag(1 / |k|) exp(gc_i - gc_j)) v_new`` on raw ``q`` / ``k`` (``s = scale / |q|``); ``V_FIRST``:
        the grid is ``(chunks x column blocks, heads)``, a chunk's column blocks adjacent (:func:`_out_ids`)."""
        c, h, j = _out_ids(V, BV, V_FIRST)
        _, t0, L = _chunk2(c, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, REGULAR)
        r = tl.arange(0, 64)
        h64, hk = h.to(tl.int64), (h // GROUP).to(tl.int64)
        qb, kb = q_ptr + hk * sq_h + t0 * sq_t, k_ptr + hk * sk_h + t0 * sk_t
        # a chunk id past the last chunk reads chunk 0's rows of nothing (L = 0) and stores nothing
        hb = h_ptr + c.to(tl.int64) * sh_c * (L > 0) + h64 * sh_h
        q1, k1 = _raw(_tile(qb, L, K, sq_t, sq_k, 0, 0, 64, KB)), _raw(_tile(kb, L, K, sk_t, sk_k, 0, 0, 64, KB))
        a = _dot(q1, tl.trans(k1), DOT)
        o = _dot(q1, _raw(_tile(hb, K, V, sh_k, 1, 0, j * BV, KB, BV)), DOT)
        if L2NORM:
            nq = _sumsq(q1)
        if TWO:
            q2, k2 = _raw(_tile(qb, L, K, sq_t, sq_k, 0, KB, 64, KB)), _raw(_tile(kb, L, K, sk_t, sk_k, 0, KB, 64, KB))
            a += _dot(q2, tl.trans(k2), DOT)
            o += _dot(q2, _raw(_tile(hb, K, V, sh_k, 1, KB, j * BV, KB, BV)), DOT)
            if L2NORM:
                nq += _sumsq(q2)
        sq = tl.full((64,), 1.0, tl.float32) * scale
        if L2NORM:
            sq = sq * tl.math.rsqrt(nq + eps)
        gc = _vec(gc_ptr + h64 * sc_h + t0 * sc_t, sc_t, r, L)
        causal = r[:, None] >= r[None, :]
        fa = sq[:, None] * tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0))
        if L2NORM:
            fa = fa * _vec(rk_ptr + h64 * sc_h + t0 * sc_t, sc_t, r, L)[None, :]
        a = tl.where(causal, a * fa, 0.0)
        vn = _raw(_tile(vn_ptr + h64 * svn_h + t0 * svn_t, L, V, svn_t, 1, 0, j * BV, 64, BV))
        o = o * (sq * tl.exp(gc))[:, None] + _dot(a, vn, DOT)
        _store(_tile(o_ptr + h64 * so_h + t0 * so_t, L, V, so_t, 1, 0, j * BV, 64, BV), o)

    # shared with the v3 kernels (:mod:`~kda_inductor.lowerings._gdn_chunk_kernels3`)
    chunk2, chunk_rows, dot, load, store, tile, vec = _chunk2, _chunk_rows, _dot, _load, _store, _tile, _vec
    out_ids, raw, sumsq = _out_ids, _raw, _sumsq
    inverse, seq_range, state_in, ut = _inverse, _seq_range, _state_in, _ut  # and the KDA kernels'


def _aot_signature(kernel, ptrs: dict) -> dict:
    """A kernel's argument types for ahead-of-time compiles: ``ptrs`` by name, other pointers
    float32, ``scale`` / ``eps`` float32, sizes and strides int32 (constexprs left out)."""
    out = {}
    for name in kernel.arg_names:
        if name in ptrs:
            out[name] = ptrs[name]
        elif name.endswith("_ptr"):
            out[name] = "*fp32"
        elif name in ("scale", "eps"):
            out[name] = "fp32"
        elif not (name.isupper() and name not in ("K", "V", "GROUP")):  # else a constexpr
            out[name] = "i32"
    return out


def aot_variants():
    """The launches to compile ahead of time for sm_90: Qwen3-Next's prefill (bf16 q / k / v and
    beta, float32 g, K = V = 128, l2norm, a state, tf32 products, float32 intermediates), and a
    float32 one without l2norm or state in ieee products."""
    from kda_inductor.lowerings import AotVariant

    sig = _aot_signature
    maps = {"seq_ptr": "*i32", "start_ptr": "*i64", "len_ptr": "*i32", "cu_ptr": "*i64", "cuc_ptr": "*i64"}
    bf16 = {**maps, **dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "b_ptr", "o_ptr"), "*bf16")}
    fp32 = dict(maps)
    for io, dot, l2, state in ((bf16, "tf32", True, True), (fp32, "ieee", False, False)):
        common, opts = dict(KP=128, L2NORM=l2, DOT=dot), {"num_warps": 8, "num_stages": 1}
        yield AotVariant(kkt_kernel, sig(kkt_kernel, io), common, opts)
        yield AotVariant(wu_kernel, sig(wu_kernel, io), dict(common, BV=64), opts)
        yield AotVariant(scan_kernel, sig(scan_kernel, io), dict(common, BV=32, HAS_STATE=state), opts)
        yield AotVariant(output_kernel, sig(output_kernel, io), dict(common, BV=64), opts)
    # gdn_chunk.FAST (v2, bf16 operands and intermediates): Qwen3-Next's prefill with a state
    v2 = {**bf16, **dict.fromkeys(("w_ptr", "u_ptr", "h_ptr", "vn_ptr"), "*bf16")}
    opts4 = {"num_warps": 8, "num_stages": 2}
    yield AotVariant(wu2_kernel, sig(wu2_kernel, v2), dict(KP=128, BV=64, L2NORM=True, DOT="bf16",
                                                           REGULAR=True, INV="subst"), opts4)
    yield AotVariant(scan2_kernel, sig(scan2_kernel, v2), dict(KB=64, TWO=True, BV=32, L2NORM=True, HAS_STATE=True,
                                                               DOT="bf16", REGULAR=False), opts4)
    yield AotVariant(output2_kernel, sig(output2_kernel, v2), dict(KB=64, TWO=True, BV=64, L2NORM=True, DOT="bf16",
                                                                       REGULAR=True), opts4)
    pre = dict(KP=128, L2NORM=True, DOT="tf32", PRE_KD=True)  # LaunchConfig(precompute_kd=True)
    yield AotVariant(wu_kernel, sig(wu_kernel, bf16), dict(pre, BV=64), {"num_warps": 8, "num_stages": 1})
    yield AotVariant(scan_kernel, sig(scan_kernel, bf16), dict(pre, BV=32, HAS_STATE=True),
                     {"num_warps": 8, "num_stages": 1})
    for inv in ("ieee", "tf32", "doubling", "doubling_tf32"):  # LaunchConfig.wu_inverse at FAST's 4 warps
        yield AotVariant(wu2_kernel, sig(wu2_kernel, v2), dict(KP=128, BV=64, L2NORM=True, DOT="bf16", REGULAR=True,
                                                               INV=inv), {"num_warps": 4, "num_stages": 2})


aot_signature = _aot_signature
