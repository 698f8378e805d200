"""The v3 kernels of ``kda::gdn_chunk`` (``LaunchConfig.v3``): :data:`wu2_kernel`'s work split in
two launches, as fla splits its ``kkt_solve`` and ``recompute_w_u``, so that the products with
the inverse run as 64-row tiles (the tensor cores' shape) instead of sixteen-row ones.

1. :data:`solve3_kernel` (program = chunk x head): ``gc``, ``1 / |k|`` (``L2NORM``), ``A``'s ten
   16 x 16 blocks on and below the diagonal from the chunk's key rows, ``Tinv = (I + A)^-1``: each
   diagonal block without a sequential loop (``A`` strictly lower is nilpotent, ``A^16 = 0``, so
   ``(I + A)^-1 = (I - A)(I + A^2)(I + A^4)(I + A^8)``: six 16 x 16 products, no reductions across
   threads), those below by the merges of :func:`~._gdn_chunk_inverse.inverse`; the ten blocks
   stored in a ``[tokens, heads, 64]`` scratch (row = token; the blocks above the diagonal are
   never written and never read).
2. :data:`wu3_kernel` (chunk x head): ``Tinv`` as one ``[64, 64]`` tile (lower triangle),
   ``w = Tinv (beta exp(gc) k / |k|)`` and ``u = Tinv (beta v)`` by 64-column blocks.

3. v2's ``scan2_kernel`` (it reads ``w``, ``u``, ``gc`` and ``1 / |k|`` as stored here).
4. :data:`output3_kernel` (chunk x head x column block, the column blocks adjacent in the grid with
   ``V_FIRST``): v2's ``output2_kernel`` with the key dimension in a loop of ``BK`` columns.

:data:`solvewu3_kernel` (``LaunchConfig.fuse_wu``) runs 1 and 2 in one program, the inverse through
the scratch behind a CTA barrier. Rows past a sequence's end: zeros in, never stored.
"""

from __future__ import annotations

from kda_inductor.lowerings._gdn_chunk_kernels import aot_signature as _aot_signature
from kda_inductor.lowerings._triton import tl, triton

if triton is not None:
    from kda_inductor.lowerings._gdn_chunk_kernels import chunk2 as _chunk2
    from kda_inductor.lowerings._gdn_chunk_kernels import chunk_rows as _chunk_rows
    from kda_inductor.lowerings._gdn_chunk_kernels import dot as _dot
    from kda_inductor.lowerings._gdn_chunk_kernels import load as _load
    from kda_inductor.lowerings._gdn_chunk_kernels import store as _store
    from kda_inductor.lowerings._gdn_chunk_kernels import tile as _tile
    from kda_inductor.lowerings._gdn_chunk_kernels import out_ids as _out_ids
    from kda_inductor.lowerings._gdn_chunk_kernels import raw as _raw
    from kda_inductor.lowerings._gdn_chunk_kernels import sumsq as _sumsq
    from kda_inductor.lowerings._gdn_chunk_kernels import vec as _vec
    from kda_inductor.lowerings._gdn_chunk_kernels import rows_inverse as _rows_inverse

    @triton.jit
    def _put(ab, L, s_t, i, j, X):
        """Store block ``(i, j)`` of a chunk's ``[64, 64]`` matrix (row = token, stride ``s_t``)."""
        _store(_tile(ab, L, 64, s_t, 1, 16 * i, 16 * j, 16, 16), X)

    @triton.jit
    def put_lower(ab, L, s_t, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33):
        _put(ab, L, s_t, 0, 0, T00)
        _put(ab, L, s_t, 1, 0, T10)
        _put(ab, L, s_t, 1, 1, T11)
        _put(ab, L, s_t, 2, 0, T20)
        _put(ab, L, s_t, 2, 1, T21)
        _put(ab, L, s_t, 2, 2, T22)
        _put(ab, L, s_t, 3, 0, T30)
        _put(ab, L, s_t, 3, 1, T31)
        _put(ab, L, s_t, 3, 2, T32)
        _put(ab, L, s_t, 3, 3, T33)

    @triton.jit
    def solve3_kernel(k_ptr, g_ptr, b_ptr, gc_ptr, rk_ptr, ai_ptr, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, K,
                      GROUP, eps, sk_t, sk_h, sk_k, sg_t, sg_h, sb_t, sb_h, sc_t, sc_h, sa_t, sa_h,
                      KP: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr, REGULAR: tl.constexpr,
                      INV: tl.constexpr = "ieee"):
        """Program (chunk, head): ``gc`` and (``L2NORM``) ``1 / |k|`` stored (float32 ``[tokens,
        heads]``), ``A``'s blocks from the chunk's key rows (``DOT`` products), ``Tinv = (I + A)^-1``
        (:func:`~._gdn_chunk_inverse.inverse`, ``INV``: its products' precision or ``"subst"``) stored by
        its ten lower blocks in ``ai`` (``[tokens, heads, 64]``)."""
        c, h = tl.program_id(0), tl.program_id(1)
        _, t0, L = _chunk2(c, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, REGULAR)
        _solve(k_ptr, g_ptr, b_ptr, gc_ptr, rk_ptr, ai_ptr, h, t0, L, K, GROUP, eps, sk_t, sk_h, sk_k, sg_t, sg_h, sb_t,
               sb_h, sc_t, sc_h, sa_t, sa_h, KP, L2NORM, DOT, INV)

    @triton.jit
    def _solve(k_ptr, g_ptr, b_ptr, gc_ptr, rk_ptr, ai_ptr, h, t0, L, K, GROUP, eps, sk_t, sk_h, sk_k, sg_t, sg_h, sb_t,
               sb_h, sc_t, sc_h, sa_t, sa_h, KP: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr,
               INV: tl.constexpr):
        """:data:`solve3_kernel`'s work for head ``h`` of the chunk at token ``t0`` (``L`` tokens)."""
        h64, c0, c1, c2, c3, b0, b1, b2, b3, X0, X1, X2, X3 = _chunk_rows(
            k_ptr, g_ptr, b_ptr, gc_ptr, rk_ptr, h, t0, L, K, GROUP, eps, sk_t, sk_h, sk_k, sg_t, sg_h, sb_t, sb_h, sc_t,
            sc_h, KP, L2NORM, DOT, True)
        T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _rows_inverse(
            X0, X1, X2, X3, b0, b1, b2, b3, c0, c1, c2, c3, DOT, True, INV)
        put_lower(ai_ptr + h64 * sa_h + t0 * sa_t, L, sa_t, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33)

    @triton.jit
    def _tinv(ab, L, s_t):
        """A chunk's stored ``Tinv`` as one ``[64, 64]`` tile in its stored dtype (the lower triangle;
        zeros above it and in rows past ``L``)."""
        r = tl.arange(0, 64)
        return tl.load(ab + r[:, None] * s_t + r[None, :], mask=(r[:, None] < L) & (r[None, :] <= r[:, None]),
                       other=0.0)

    @triton.jit
    def wu3_kernel(k_ptr, v_ptr, b_ptr, gc_ptr, rk_ptr, ai_ptr, w_ptr, u_ptr, seq_ptr, start_ptr, len_ptr, n_tok,
                   n_chk, K, V, GROUP, sk_t, sk_h, sk_k, sv_t, sv_h, sv_v, sb_t, sb_h, sc_t, sc_h, sa_t, sa_h, sw_t,
                   sw_h, su_t, su_h, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr,
                   REGULAR: tl.constexpr):
        """Program (chunk, head): ``w = Tinv (beta exp(gc) rk k)`` by ``BK`` key columns and ``u = Tinv
        (beta v)`` by ``BV`` value columns, ``Tinv`` one ``[64, 64]`` operand (``rk = 1 / |k|`` from
        :data:`solve3_kernel` when ``L2NORM``, else 1)."""
        c, h = tl.program_id(0), tl.program_id(1)
        _, t0, L = _chunk2(c, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, REGULAR)
        _wu(k_ptr, v_ptr, b_ptr, gc_ptr, rk_ptr, ai_ptr, w_ptr, u_ptr, h, t0, L, K, V, GROUP, sk_t, sk_h, sk_k, sv_t,
            sv_h, sv_v, sb_t, sb_h, sc_t, sc_h, sa_t, sa_h, sw_t, sw_h, su_t, su_h, BK, BV, L2NORM, DOT)

    @triton.jit
    def _wu(k_ptr, v_ptr, b_ptr, gc_ptr, rk_ptr, ai_ptr, w_ptr, u_ptr, h, t0, L, K, V, GROUP, sk_t, sk_h, sk_k, sv_t,
            sv_h, sv_v, sb_t, sb_h, sc_t, sc_h, sa_t, sa_h, sw_t, sw_h, su_t, su_h, BK: tl.constexpr, BV: tl.constexpr,
            L2NORM: tl.constexpr, DOT: tl.constexpr):
        """:data:`wu3_kernel`'s work for head ``h`` of the chunk at token ``t0`` (``L`` tokens)."""
        r = tl.arange(0, 64)
        h64 = h.to(tl.int64)
        A = _tinv(ai_ptr + h64 * sa_h + t0 * sa_t, L, sa_t)
        beta = _vec(b_ptr + h64 * sb_h + t0 * sb_t, sb_t, r, L)
        fk = beta * tl.exp(_vec(gc_ptr + h64 * sc_h + t0 * sc_t, sc_t, r, L))
        if L2NORM:
            fk = fk * _vec(rk_ptr + h64 * sc_h + t0 * sc_t, sc_t, r, L)
        kb, wb = k_ptr + (h // GROUP).to(tl.int64) * sk_h + t0 * sk_t, w_ptr + h64 * sw_h + t0 * sw_t
        for i in range(0, tl.cdiv(K, BK)):
            x = _load(_tile(kb, L, K, sk_t, sk_k, 0, i * BK, 64, BK)) * fk[:, None]
            _store(_tile(wb, L, K, sw_t, 1, 0, i * BK, 64, BK), _dot(A, x, DOT))
        vb, ub = v_ptr + h64 * sv_h + t0 * sv_t, u_ptr + h64 * su_h + t0 * su_t
        for j in range(0, tl.cdiv(V, BV)):
            x = _load(_tile(vb, L, V, sv_t, sv_v, 0, j * BV, 64, BV)) * beta[:, None]
            _store(_tile(ub, L, V, su_t, 1, 0, j * BV, 64, BV), _dot(A, x, DOT))

    @triton.jit
    def solvewu3_kernel(k_ptr, v_ptr, g_ptr, b_ptr, gc_ptr, rk_ptr, ai_ptr, w_ptr, u_ptr, seq_ptr, start_ptr, len_ptr,
                        n_tok, n_chk, K, V, GROUP, eps, sk_t, sk_h, sk_k, sv_t, sv_h, sv_v, sg_t, sg_h, sb_t, sb_h,
                        sc_t, sc_h, sa_t, sa_h, sw_t, sw_h, su_t, su_h, KP: tl.constexpr, BK: tl.constexpr,
                        BV: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr, REGULAR: tl.constexpr,
                        INV: tl.constexpr):
        """:data:`solve3_kernel` then :data:`wu3_kernel` in one program (``LaunchConfig.fuse_wu``): the
        inverse goes through the ``ai`` scratch (stored by blocks, read back as one ``[64, 64]``
        tile by other threads: a CTA barrier between, which orders the block's global writes before
        its reads), ``k`` read again from L1 / L2, one launch fewer."""
        c, h = tl.program_id(0), tl.program_id(1)
        _, t0, L = _chunk2(c, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, REGULAR)
        _solve(k_ptr, g_ptr, b_ptr, gc_ptr, rk_ptr, ai_ptr, h, t0, L, K, GROUP, eps, sk_t, sk_h, sk_k, sg_t, sg_h, sb_t,
               sb_h, sc_t, sc_h, sa_t, sa_h, KP, L2NORM, DOT, INV)
        tl.debug_barrier()
        _wu(k_ptr, v_ptr, b_ptr, gc_ptr, rk_ptr, ai_ptr, w_ptr, u_ptr, h, t0, L, K, V, GROUP, sk_t, sk_h, sk_k, sv_t,
            sv_h, sv_v, sb_t, sb_h, sc_t, sc_h, sa_t, sa_h, sw_t, sw_h, su_t, su_h, BK, BV, L2NORM, DOT)

    @triton.jit
    def _out_tail(a, o, nq, gb, rb, s_t, scale, eps, L, L2NORM: tl.constexpr):
        """The output's factors on ``a = q k^T`` and ``o = q S`` of raw ``q`` / ``k`` (``nq``: ``|q|^2``):
        ``(causal(s (q k^T) rk exp(gc_i - gc_j)), s exp(gc) (q S))`` (``s = scale / |q|``)."""
        r = tl.arange(0, 64)
        sq = tl.full((64,), 1.0, tl.float32) * scale
        if L2NORM:
            sq = sq * tl.math.rsqrt(nq + eps)
        gc = _vec(gb, s_t, r, L)
        causal = r[:, None] >= r[None, :]
        fa = sq[:, None] * tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0))
        if L2NORM:
            fa = fa * _vec(rb, s_t, r, L)[None, :]
        return tl.where(causal, a * fa, 0.0), o * (sq * tl.exp(gc))[:, None]

    @triton.jit
    def output3_kernel(q_ptr, k_ptr, gc_ptr, rk_ptr, h_ptr, vn_ptr, o_ptr, seq_ptr, start_ptr, len_ptr, n_tok, n_chk,
                       K, V, GROUP, scale, eps, sq_t, sq_h, sq_k, sk_t, sk_h, sk_k, sc_t, sc_h, sh_c, sh_h, sh_k,
                       svn_t, svn_h, so_t, so_h, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr,
                       DOT: tl.constexpr, REGULAR: tl.constexpr, V_FIRST: tl.constexpr):
        """``output2_kernel``'s function with the key dimension in a loop of ``BK`` columns (fla's
        shape: one ``q`` / ``k`` / state block live at a time, pipelined by ``num_stages``; any ``K``):
        ``o = diag(s exp(gc)) (q S) + causal(diag(s) (q k^T) diag(1 / |k|) exp(gc_i - gc_j)) v_new``."""
        c, h, j = _out_ids(V, BV, V_FIRST)
        _, t0, L = _chunk2(c, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, REGULAR)
        h64, hk = h.to(tl.int64), (h // GROUP).to(tl.int64)
        qb, kb = q_ptr + hk * sq_h + t0 * sq_t, k_ptr + hk * sk_h + t0 * sk_t
        # a chunk id past the last chunk reads chunk 0's rows of nothing (L = 0) and stores nothing
        hb = h_ptr + c.to(tl.int64) * sh_c * (L > 0) + h64 * sh_h
        a = tl.zeros((64, 64), tl.float32)
        o = tl.zeros((64, BV), tl.float32)
        nq = tl.zeros((64,), tl.float32)
        for i in range(0, tl.cdiv(K, BK)):
            qi = _raw(_tile(qb, L, K, sq_t, sq_k, 0, i * BK, 64, BK))
            a += _dot(qi, tl.trans(_raw(_tile(kb, L, K, sk_t, sk_k, 0, i * BK, 64, BK))), DOT)
            o += _dot(qi, _raw(_tile(hb, K, V, sh_k, 1, i * BK, j * BV, BK, BV)), DOT)
            if L2NORM:
                nq += _sumsq(qi)
        a, o = _out_tail(a, o, nq, gc_ptr + h64 * sc_h + t0 * sc_t, rk_ptr + h64 * sc_h + t0 * sc_t, sc_t, scale, eps,
                         L, L2NORM)
        o += _dot(a, _raw(_tile(vn_ptr + h64 * svn_h + t0 * svn_t, L, V, svn_t, 1, 0, j * BV, 64, BV)), DOT)
        _store(_tile(o_ptr + h64 * so_h + t0 * so_t, L, V, so_t, 1, 0, j * BV, 64, BV), o)


def aot_variants():
    """``LaunchConfig.v3``'s two own launches for sm_90 (Qwen3-Next's prefill: bf16 q / k / v and
    beta, float32 g, K = V = 128, l2norm; bf16 products and intermediates as ``gdn_chunk.FAST3``),
    and the float32 ones (tf32 products, float32 scratch)."""
    from kda_inductor.lowerings import AotVariant

    maps = {"seq_ptr": "*i32", "start_ptr": "*i64", "len_ptr": "*i32"}
    bf16 = {**maps, **dict.fromkeys(("k_ptr", "v_ptr", "b_ptr"), "*bf16")}
    low = {**bf16, **dict.fromkeys(("w_ptr", "u_ptr", "ai_ptr"), "*bf16")}
    opts = {"num_warps": 4, "num_stages": 2}
    for io, dot in ((low, "bf16"), (bf16, "tf32")):
        for regular in (True, False):
            yield AotVariant(solve3_kernel, _aot_signature(solve3_kernel, io),
                             dict(KP=128, L2NORM=True, DOT=dot, REGULAR=regular), {"num_warps": 4, "num_stages": 1})
            yield AotVariant(wu3_kernel, _aot_signature(wu3_kernel, io),
                             dict(BK=64, BV=64, L2NORM=True, DOT=dot, REGULAR=regular), opts)
    v2 = {**low, "q_ptr": "*bf16", "o_ptr": "*bf16", "h_ptr": "*bf16", "vn_ptr": "*bf16"}
    for v_first in (True, False):  # LaunchConfig.out_v_first
        yield AotVariant(output3_kernel, _aot_signature(output3_kernel, v2), dict(BK=64, BV=64, L2NORM=True,
                         DOT="bf16", REGULAR=True, V_FIRST=v_first), opts)
    yield AotVariant(solvewu3_kernel, _aot_signature(solvewu3_kernel, low),  # LaunchConfig.fuse_wu
                     dict(KP=128, BK=64, BV=64, L2NORM=True, DOT="bf16", REGULAR=True, INV="ieee"),
                     {"num_warps": 8, "num_stages": 2})
    for inv in ("tf32", "subst", "doubling", "doubling_tf32"):  # LaunchConfig.solve_inverse
        yield AotVariant(solve3_kernel, _aot_signature(solve3_kernel, low),
                         dict(KP=128, L2NORM=True, DOT="bf16", REGULAR=True, INV=inv),
                         {"num_warps": 4, "num_stages": 1})
