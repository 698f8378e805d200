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
    def _mm(a, b):
        return tl.dot(a, b, input_precision="ieee")

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
    def _ut(T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, X0, X1, X2, X3, ob, L, cols, s_t, c0,
            BC: tl.constexpr, DOT: tl.constexpr):
        """Store ``Tinv X`` (``X`` by its four row blocks) at ``ob``."""
        _store(_tile(ob, L, cols, s_t, 1, 0, c0, 16, BC), tl.dot(T00, X0, input_precision=DOT))
        _store(_tile(ob, L, cols, s_t, 1, 16, c0, 16, BC),
               tl.dot(T10, X0, input_precision=DOT) + tl.dot(T11, X1, input_precision=DOT))
        _store(_tile(ob, L, cols, s_t, 1, 32, c0, 16, BC), tl.dot(T20, X0, input_precision=DOT)
               + tl.dot(T21, X1, input_precision=DOT) + tl.dot(T22, X2, input_precision=DOT))
        _store(_tile(ob, L, cols, s_t, 1, 48, c0, 16, BC), tl.dot(T30, X0, input_precision=DOT)
               + tl.dot(T31, X1, input_precision=DOT) + tl.dot(T32, X2, input_precision=DOT)
               + tl.dot(T33, X3, input_precision=DOT))

    @triton.jit
    def _block_inverse(ab, L, sa_t):
        """``(I + A)^-1`` of a chunk by its 16 x 16 blocks: the diagonal ones by forward substitution,
        those below by ``Tinv_ij = -Tinv_ii sum_{j <= m < i} A_im Tinv_mj`` (float32 products)."""
        T00 = _unit_lower_inverse(_block(ab, L, sa_t, 0, 0), 16)
        T11 = _unit_lower_inverse(_block(ab, L, sa_t, 1, 1), 16)
        T22 = _unit_lower_inverse(_block(ab, L, sa_t, 2, 2), 16)
        T33 = _unit_lower_inverse(_block(ab, L, sa_t, 3, 3), 16)
        T10 = -_mm(T11, _mm(_block(ab, L, sa_t, 1, 0), T00))
        A21 = _block(ab, L, sa_t, 2, 1)
        T21 = -_mm(T22, _mm(A21, T11))
        T20 = -_mm(T22, _mm(_block(ab, L, sa_t, 2, 0), T00) + _mm(A21, T10))
        A32 = _block(ab, L, sa_t, 3, 2)
        A31 = _block(ab, L, sa_t, 3, 1)
        T32 = -_mm(T33, _mm(A32, T22))
        T31 = -_mm(T33, _mm(A31, T11) + _mm(A32, T21))
        T30 = -_mm(T33, _mm(_block(ab, L, sa_t, 3, 0), T00) + _mm(A31, T10) + _mm(A32, T20))
        return T00, T10, T11, T20, T21, T22, T30, T31, T32, T33

    @triton.jit
    def _store_kd(kdb, gl, X0, X1, X2, X3, c0, c1, c2, c3, r, L, K, skd_t, KP: tl.constexpr):
        """The scan's ``k exp(gc_last - gc)`` of a chunk's four row blocks (``PRE_KD``)."""
        _store(_tile(kdb, L, K, skd_t, 1, 0, 0, 16, KP), X0 * tl.exp(tl.where(r < L, gl - c0, 0.0))[:, None])
        _store(_tile(kdb, L, K, skd_t, 1, 16, 0, 16, KP), X1 * tl.exp(tl.where(r + 16 < L, gl - c1, 0.0))[:, None])
        _store(_tile(kdb, L, K, skd_t, 1, 32, 0, 16, KP), X2 * tl.exp(tl.where(r + 32 < L, gl - c2, 0.0))[:, None])
        _store(_tile(kdb, L, K, skd_t, 1, 48, 0, 16, KP), X3 * tl.exp(tl.where(r + 48 < L, gl - c3, 0.0))[:, None])

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


def aot_variants():
    """The launches to compile ahead of time for sm_90: Qwen3-Next's prefill (bf16 q / k / v and
    beta, float32 g, K = V = 128, l2norm, a state, tf32 products, float32 intermediates), and a
    float32 one without l2norm or state in ieee products."""
    from kda_inductor.lowerings import AotVariant

    def sig(kernel, ptrs: dict, **scalars):
        out = {}
        for name in kernel.arg_names:
            if name in ptrs:
                out[name] = ptrs[name]
            elif name.endswith("_ptr"):
                out[name] = "*fp32"
            elif name in ("scale", "eps"):
                out[name] = "fp32"
            elif name.isupper() and name not in ("K", "V", "GROUP"):
                continue  # constexpr
            else:
                out[name] = "i32"
        return out

    maps = {"seq_ptr": "*i32", "start_ptr": "*i64", "len_ptr": "*i32", "cu_ptr": "*i64", "cuc_ptr": "*i64"}
    bf16 = {**maps, **dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "b_ptr", "o_ptr"), "*bf16")}
    fp32 = dict(maps)
    for io, dot, l2, state in ((bf16, "tf32", True, True), (fp32, "ieee", False, False)):
        common, opts = dict(KP=128, L2NORM=l2, DOT=dot), {"num_warps": 8, "num_stages": 1}
        yield AotVariant(kkt_kernel, sig(kkt_kernel, io), common, opts)
        yield AotVariant(wu_kernel, sig(wu_kernel, io), dict(common, BV=64), opts)
        yield AotVariant(scan_kernel, sig(scan_kernel, io), dict(common, BV=32, HAS_STATE=state), opts)
        yield AotVariant(output_kernel, sig(output_kernel, io), dict(common, BV=64), opts)
    pre = dict(KP=128, L2NORM=True, DOT="tf32", PRE_KD=True)  # LaunchConfig(precompute_kd=True)
    yield AotVariant(wu_kernel, sig(wu_kernel, bf16), dict(pre, BV=64), {"num_warps": 8, "num_stages": 1})
    yield AotVariant(scan_kernel, sig(scan_kernel, bf16), dict(pre, BV=32, HAS_STATE=True),
                     {"num_warps": 8, "num_stages": 1})
