"""The v4 scan and output of ``kda::gdn_chunk`` (``LaunchConfig.scan4`` / ``LaunchConfig.out4``, off
by default): v2's ``scan2`` / ``output2`` functions written the way fla's forward kernels lay out
their work (``chunk_gated_delta_rule_fwd_kernel_h_blockdim64``, ``chunk_fwd_kernel_o``), so that
the launch sweep can time the layout apart from the math.

:data:`scan4_kernel` (program = sequence x value head x column block, a 1-D grid with the column
blocks fastest), sequential over the sequence's chunks, the state as ``K / 64`` register blocks of
``64 x BV`` (two at most):

* the head dims, the value heads and the group are compile-time constants and our own scratch
  (``w``, ``u``, ``gc``, ``1 / |k|``, ``v_new``, the per-chunk states, the final state) is read
  and written at its packed strides, so the only run-time masks are the chunk's rows (the column
  masks fold away where ``K`` and ``V`` fill the blocks);
* ``v_new = u - w S`` with the two key blocks' products accumulated in one tile, stored in the
  products' dtype (bfloat16 under ``lowp``) for the output;
* the decay as fla applies it: ``S *= exp(gc_last)`` before the update, then ``S += k^T (v_new
  exp(gc_last - gc) / |k|)`` as the product's accumulator (no separate sum), ``k`` loaded as the
  ``[64 keys, 64 tokens]`` operand directly (no transposed view of a row tile).

:data:`output4_kernel` (program = chunk x ``GP`` value heads x column block, a 1-D grid with the
column blocks fastest, then the chunks, then the heads): ``q k^T`` and ``|q|^2`` once from raw
``q`` / ``k`` (both 64-column key halves at once), then for each of its ``GP`` value heads (``GP``
= the GQA group: the siblings that read the same key head share the product and the ``q`` / ``k``
tiles; ``GP = 1``: one head a program) ``o = diag(s exp(gc)) (q S) + causal(diag(s) (q k^T)
diag(1 / |k|) exp(gc_i - gc_j)) v_new`` (``s = scale / |q|``), the states and ``v_new`` read as
:data:`scan4_kernel` or v2's ``scan2`` stored them. Rows past a sequence's end: zeros in, never
stored.
"""

from __future__ import annotations

from kda_inductor.lowerings._triton import tl, triton

if triton is not None:
    from kda_inductor.lowerings._gdn_chunk_kernels import chunk2 as _chunk2
    from kda_inductor.lowerings._gdn_chunk_kernels import decay_block as _decay_block
    from kda_inductor.lowerings._gdn_chunk_kernels import seq_range as _seq_range
    from kda_inductor.lowerings._gdn_chunk_kernels import sumsq as _sumsq
    from kda_inductor.lowerings._gdn_chunk_kernels import gc16, raw as _raw, tile as _tile, vec as _vec
    from kda_inductor.lowerings._gdn_chunk_kernels3 import put_lower
    from kda_inductor.lowerings._gdn_chunk_inverse import inverse as _inverse

    @triton.jit
    def _dota(a, b, acc, DOT: tl.constexpr):
        """``acc + a @ b`` with the product accumulated into ``acc`` (float32): ``DOT`` as
        :func:`~._gdn_chunk_kernels._dot` (``"bf16"`` operands, ``"bf16emu"`` the interpreter's same
        roundings, ``"tf32"`` / ``"ieee"`` float32 operands)."""
        if DOT == "bf16":
            return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
        elif DOT == "bf16emu":
            return tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32), acc,
                          input_precision="ieee")
        else:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=DOT)

    @triton.jit
    def _op(x, DOT: tl.constexpr):
        """``x`` as a product's operand (bfloat16 for the bf16 paths, else float32)."""
        if DOT == "bf16" or DOT == "bf16emu":
            return x.to(tl.bfloat16)
        else:
            return x.to(tl.float32)

    @triton.jit
    def _kT(kb, t, mt, sk_t, sk_k, k0, K: tl.constexpr, KB: tl.constexpr):
        """Keys ``k0 .. k0 + KB`` of the tokens ``t`` (``mt``: inside the chunk) as a ``[KB, 64]``
        tile, keys down the rows (the operand of ``k^T x``)."""
        ok = k0 + tl.arange(0, KB)
        return tl.load(kb + ok[:, None] * sk_k + t[None, :] * sk_t, mask=(ok[:, None] < K) & mt[None, :], other=0.0)

    @triton.jit
    def _rows(base, t, mt, s_t, c0, C: tl.constexpr, BC: tl.constexpr):
        """Columns ``c0 .. c0 + BC`` of the tokens ``t`` in a packed ``[tokens, ...]`` scratch (row
        stride ``s_t``, unit column stride, ``C`` columns)."""
        oc = c0 + tl.arange(0, BC)
        return base + t[:, None] * s_t + oc[None, :], mt[:, None] & (oc[None, :] < C)

    @triton.jit
    def _state(base, k0, j, K: tl.constexpr, V: tl.constexpr, KB: tl.constexpr, BV: tl.constexpr):
        """Rows ``k0 .. k0 + KB`` and column block ``j`` of a packed ``[K, V]`` state."""
        ok, ov = k0 + tl.arange(0, KB), j * BV + tl.arange(0, BV)
        return base + ok[:, None] * V + ov[None, :], (ok[:, None] < K) & (ov[None, :] < V)

    @triton.jit
    def _put(bp, x):
        tl.store(bp[0], x.to(bp[0].dtype.element_ty), mask=bp[1])

    @triton.jit
    def _get(bp):
        return tl.load(bp[0], mask=bp[1], other=0.0)

    @triton.jit
    def _state_load(sb, ss_k, ss_v, k0, j, K: tl.constexpr, V: tl.constexpr, KB: tl.constexpr, BV: tl.constexpr,
                    HAS_STATE: tl.constexpr):
        """The initial state's rows ``k0 .. k0 + KB``, column block ``j`` (any strides; zeros without one)."""
        if HAS_STATE:
            ok, ov = k0 + tl.arange(0, KB), j * BV + tl.arange(0, BV)
            return tl.load(sb + ok[:, None] * ss_k + ov[None, :] * ss_v, mask=(ok[:, None] < K) & (ov[None, :] < V),
                           other=0.0).to(tl.float32)
        else:
            return tl.zeros((KB, BV), tl.float32)

    @triton.jit
    def _program4(cu_ptr, cuc_ptr, n_tok, n_chk, V: tl.constexpr, HV: tl.constexpr, BV: tl.constexpr,
                  REGULAR: tl.constexpr):
        """Program (sequence, value head, column block) of a 1-D grid, the column blocks fastest: ``j``,
        ``n64``, ``h``, ``h64`` and the sequence's tokens / chunks ``ts, te, cs, ce``."""
        NV = tl.cdiv(V, BV)
        pid = tl.program_id(0)
        j, nh = pid % NV, pid // NV
        n, h = nh // HV, nh % HV
        n64, h64 = n.to(tl.int64), h.to(tl.int64)
        ts, te, cs, ce = _seq_range(n, n64, cu_ptr, cuc_ptr, n_tok, n_chk, REGULAR)
        return j, n64, h, h64, ts, te, cs, ce

    @triton.jit
    def _states_in(s_ptr, n64, h64, ss_n, ss_h, ss_k, ss_v, j, K: tl.constexpr, V: tl.constexpr, KB: tl.constexpr,
                   BV: tl.constexpr, TWO: tl.constexpr, HAS_STATE: tl.constexpr):
        """The initial state's blocks ``S1`` (rows ``0 .. KB``) and ``S2`` (``KB .. 2 KB``; ``S1`` itself
        without ``TWO``, never used then)."""
        sb = s_ptr + n64 * ss_n + h64 * ss_h
        S1 = _state_load(sb, ss_k, ss_v, 0, j, K, V, KB, BV, HAS_STATE)
        if TWO:
            S2 = _state_load(sb, ss_k, ss_v, KB, j, K, V, KB, BV, HAS_STATE)
        else:
            S2 = S1
        return S1, S2

    @triton.jit
    def _states_out(f_ptr, n64, h64, j, S1, S2, K: tl.constexpr, V: tl.constexpr, HV: tl.constexpr,
                    KB: tl.constexpr, BV: tl.constexpr, TWO: tl.constexpr):
        """The final state's blocks stored (``S2`` only with ``TWO``)."""
        fb = f_ptr + (n64 * HV + h64) * (K * V)
        _put(_state(fb, 0, j, K, V, KB, BV), S1)
        if TWO:
            _put(_state(fb, KB, j, K, V, KB, BV), S2)

    @triton.jit
    def _decay_f(cb, rb, t0, L, t, mt, HV: tl.constexpr, L2NORM: tl.constexpr):
        """The chunk's last ``gc`` and the update's row factors ``exp(gc_last - gc) rk``."""
        gl = tl.load(cb + (t0 + L - 1) * HV)  # L >= 1: a chunk of the sequence
        f = tl.exp(tl.where(mt, gl - tl.load(cb + t * HV, mask=mt, other=0.0), 0.0))
        if L2NORM:
            f = f * tl.load(rb + t * HV, mask=mt, other=0.0)
        return gl, f

    @triton.jit
    def scan4_kernel(k_ptr, w_ptr, u_ptr, gc_ptr, rk_ptr, s_ptr, f_ptr, h_ptr, vn_ptr, cu_ptr, cuc_ptr, n_tok, n_chk,
                     sk_t, sk_h, sk_k, ss_n, ss_h, ss_k, ss_v,
                     K: tl.constexpr, V: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KB: tl.constexpr,
                     TWO: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, HAS_STATE: tl.constexpr,
                     DOT: tl.constexpr, REGULAR: tl.constexpr):
        """Program (sequence, value head, column block) of a 1-D grid, the column blocks fastest: the
        state as rows ``0 .. KB`` (``S1``) and ``KB .. 2 KB`` (``S2``, when ``TWO``) through the
        sequence's chunks: store ``S`` (the chunk's start state); ``v_new = u - w S`` (stored);
        ``S = exp(gc_last) S + k^T (v_new exp(gc_last - gc) rk)`` as the product's accumulator."""
        j, n64, h, h64, ts, te, cs, ce = _program4(cu_ptr, cuc_ptr, n_tok, n_chk, V, HV, BV, REGULAR)
        r = tl.arange(0, 64)
        S1, S2 = _states_in(s_ptr, n64, h64, ss_n, ss_h, ss_k, ss_v, j, K, V, KB, BV, TWO, HAS_STATE)
        kb = k_ptr + (h // GROUP).to(tl.int64) * sk_h
        wb, ub, vnb = w_ptr + h64 * K, u_ptr + h64 * V, vn_ptr + h64 * V
        cb, rb = gc_ptr + h64, rk_ptr + h64
        for i in range(0, (ce - cs).to(tl.int32)):
            t0 = ts + i * 64
            L = tl.minimum(te - t0, 64).to(tl.int32)
            t, mt = t0 + r, r < L
            hb = h_ptr + ((cs + i) * HV + h64) * (K * V)
            _put(_state(hb, 0, j, K, V, KB, BV), S1)
            b = tl.zeros((64, BV), tl.float32)
            b = _dota(_get(_rows(wb, t, mt, HV * K, 0, K, KB)), _op(S1, DOT), b, DOT)
            if TWO:
                _put(_state(hb, KB, j, K, V, KB, BV), S2)
                b = _dota(_get(_rows(wb, t, mt, HV * K, KB, K, KB)), _op(S2, DOT), b, DOT)
            vn = _get(_rows(ub, t, mt, HV * V, j * BV, V, BV)).to(tl.float32) - b
            _put(_rows(vnb, t, mt, HV * V, j * BV, V, BV), vn)
            gl, f = _decay_f(cb, rb, t0, L, t, mt, HV, L2NORM)
            vs = _op(vn * f[:, None], DOT)
            decay = tl.exp(gl)
            S1 = _dota(_kT(kb, t, mt, sk_t, sk_k, 0, K, KB), vs, S1 * decay, DOT)
            if TWO:
                S2 = _dota(_kT(kb, t, mt, sk_t, sk_k, KB, K, KB), vs, S2 * decay, DOT)
        _states_out(f_ptr, n64, h64, j, S1, S2, K, V, HV, KB, BV, TWO)

    @triton.jit
    def scanout4_kernel(q_ptr, k_ptr, w_ptr, u_ptr, gc_ptr, rk_ptr, s_ptr, f_ptr, o_ptr, cu_ptr, cuc_ptr, n_tok, n_chk,
                        scale, eps, sq_t, sq_h, sq_k, sk_t, sk_h, sk_k, ss_n, ss_h, ss_k, ss_v, so_t, so_h,
                        K: tl.constexpr, V: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KB: tl.constexpr,
                        TWO: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, HAS_STATE: tl.constexpr,
                        DOT: tl.constexpr, REGULAR: tl.constexpr):
        """:data:`scan4_kernel` with the output fused (``LaunchConfig.scan4_out``): each chunk's ``o``
        from the state in registers, ``o = diag(s exp(gc)) (q S) + causal(diag(s) (q k^T) diag(rk)
        exp(gc_i - gc_j)) v_new``, ``q k^T`` from the key tile the update reads; the per-chunk states
        and ``v_new`` are never stored (no output launch: their bytes, the most of the scan's and the
        output's, never move). The output's products are off the sequential path."""
        j, n64, h, h64, ts, te, cs, ce = _program4(cu_ptr, cuc_ptr, n_tok, n_chk, V, HV, BV, REGULAR)
        r = tl.arange(0, 64)
        causal = r[:, None] >= r[None, :]
        S1, S2 = _states_in(s_ptr, n64, h64, ss_n, ss_h, ss_k, ss_v, j, K, V, KB, BV, TWO, HAS_STATE)
        hk = (h // GROUP).to(tl.int64)
        qb, kb = q_ptr + hk * sq_h, k_ptr + hk * sk_h
        wb, ub, ob = w_ptr + h64 * K, u_ptr + h64 * V, o_ptr + h64 * so_h
        cb, rb = gc_ptr + h64, rk_ptr + h64
        ov = j * BV + tl.arange(0, BV)
        for i in range(0, (ce - cs).to(tl.int32)):
            t0 = ts + i * 64
            L = tl.minimum(te - t0, 64).to(tl.int32)
            t, mt = t0 + r, r < L
            # the output's intra-chunk factor first (off the sequential path), held as the product's operand
            q1, k1, q2, k2, a, nq = _qk4(qb, kb, t, mt, sq_t, sq_k, sk_t, sk_k, K, KB, TWO, DOT)
            ag, sq, f, gl, gc = _intra4(a, nq, causal, cb, rb, t0, L, t, mt, scale, eps, HV, L2NORM, DOT)
            # the sequential path: v_new = u - w S, S = exp(gc_last) S + k^T (v_new f)
            S1, S2, vn, oq = _step4(wb, ub, t, mt, j, S1, S2, q1, k1, q2, k2, f, gl, K, V, HV, KB, BV, TWO, DOT)
            o = _dota(ag, vn, oq * (sq * tl.exp(gc))[:, None], DOT)
            tl.store(ob + t[:, None] * so_t + ov[None, :], o.to(o_ptr.dtype.element_ty),
                     mask=mt[:, None] & (ov[None, :] < V))
        _states_out(f_ptr, n64, h64, j, S1, S2, K, V, HV, KB, BV, TWO)

    @triton.jit
    def _qk4(qb, kb, t, mt, sq_t, sq_k, sk_t, sk_k, K: tl.constexpr, KB: tl.constexpr, TWO: tl.constexpr,
             DOT: tl.constexpr):
        """The chunk's raw ``q`` rows and ``k^T`` columns by key block (the second block is the first
        without ``TWO``, never used then), ``q k^T`` and ``|q|^2``."""
        q1, k1 = _q(qb, t, mt, sq_t, sq_k, 0, K, KB), _kT(kb, t, mt, sk_t, sk_k, 0, K, KB)
        a = _dota(q1, k1, tl.zeros((64, 64), tl.float32), DOT)
        nq = _sumsq(q1)
        if TWO:
            q2, k2 = _q(qb, t, mt, sq_t, sq_k, KB, K, KB), _kT(kb, t, mt, sk_t, sk_k, KB, K, KB)
            a = _dota(q2, k2, a, DOT)
            nq += _sumsq(q2)
        else:
            q2, k2 = q1, k1
        return q1, k1, q2, k2, a, nq

    @triton.jit
    def _intra4(a, nq, causal, cb, rb, t0, L, t, mt, scale, eps, HV: tl.constexpr, L2NORM: tl.constexpr,
                DOT: tl.constexpr):
        """From ``a = q k^T``: the output's intra-chunk factor ``causal(diag(s) a diag(rk) exp(gc_i -
        gc_j))`` as the product's operand, ``s = scale / |q|``, the update's row factors ``f``, the
        chunk's last ``gc`` and its ``gc``."""
        gl = tl.load(cb + (t0 + L - 1) * HV)  # L >= 1: a chunk of the sequence
        gc = tl.load(cb + t * HV, mask=mt, other=0.0)
        f = tl.exp(tl.where(mt, gl - gc, 0.0))
        sq = tl.full((64,), 1.0, tl.float32) * scale
        if L2NORM:
            rk = tl.load(rb + t * HV, mask=mt, other=0.0)
            f = f * rk
            sq = sq * tl.math.rsqrt(nq + eps)
            a = a * rk[None, :]
        ag = _op(tl.where(causal, a * (sq[:, None] * tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0))),
                          0.0), DOT)
        return ag, sq, f, gl, gc

    @triton.jit
    def _step4(wb, ub, t, mt, j, S1, S2, q1, k1, q2, k2, f, gl, K: tl.constexpr, V: tl.constexpr, HV: tl.constexpr,
               KB: tl.constexpr, BV: tl.constexpr, TWO: tl.constexpr, DOT: tl.constexpr):
        """One chunk of the fused scan's sequential path: ``v_new = u - w S``, ``q S`` from the same
        operands, ``S = exp(gc_last) S + k^T (v_new f)``; returns the states, ``v_new`` and ``q S``."""
        S1b = _op(S1, DOT)
        b = _dota(_get(_rows(wb, t, mt, HV * K, 0, K, KB)), S1b, tl.zeros((64, BV), tl.float32), DOT)
        oq = _dota(q1, S1b, tl.zeros((64, BV), tl.float32), DOT)
        if TWO:
            S2b = _op(S2, DOT)
            b = _dota(_get(_rows(wb, t, mt, HV * K, KB, K, KB)), S2b, b, DOT)
            oq = _dota(q2, S2b, oq, DOT)
        vn = _get(_rows(ub, t, mt, HV * V, j * BV, V, BV)).to(tl.float32) - b
        vs = _op(vn * f[:, None], DOT)
        decay = tl.exp(gl)
        S1 = _dota(k1, vs, S1 * decay, DOT)
        if TWO:
            S2 = _dota(k2, vs, S2 * decay, DOT)
        return S1, S2, vn, oq

    @triton.jit
    def _q(qb, t, mt, sq_t, sq_k, k0, K: tl.constexpr, KB: tl.constexpr):
        """Keys ``k0 .. k0 + KB`` of the chunk's ``q`` rows (raw, as stored)."""
        oq = k0 + tl.arange(0, KB)
        return tl.load(qb + t[:, None] * sq_t + oq[None, :] * sq_k, mask=mt[:, None] & (oq[None, :] < K), other=0.0)

    @triton.jit
    def _head_tail(a, o, sq, h64, t, mt, j, gc_ptr, rk_ptr, vn_ptr, o_ptr, so_t, so_h, V: tl.constexpr,
                   HV: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr,
                   SQ_LAST: tl.constexpr):
        """Value head ``h64``'s ``o = diag(s) (diag(exp(gc)) (q S) + causal((q k^T) diag(rk) exp(gc_i -
        gc_j)) v_new)`` from ``a = q k^T`` and ``o = q S`` (raw ``q`` / ``k``; ``sq = s``), stored.
        ``SQ_LAST``: ``s`` on the sum's rows (the group's loop: 141 registers for sm_90 at 64 columns and
        4 warps, 182 folded), else folded into both terms (a head a program: 182, 248 on the rows)."""
        r = tl.arange(0, 64)
        causal = r[:, None] >= r[None, :]
        gc = tl.load(gc_ptr + h64 + t * HV, mask=mt, other=0.0)
        fa = tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0))
        if not SQ_LAST:
            fa = sq[:, None] * fa
        if L2NORM:
            fa = fa * tl.load(rk_ptr + h64 + t * HV, mask=mt, other=0.0)[None, :]
        ag = _op(tl.where(causal, a * fa, 0.0), DOT)
        o = o * tl.exp(gc)[:, None] if SQ_LAST else o * (sq * tl.exp(gc))[:, None]
        o = _dota(ag, _get(_rows(vn_ptr + h64 * V, t, mt, HV * V, j * BV, V, BV)), o, DOT)
        if SQ_LAST:
            o = o * sq[:, None]
        ov = j * BV + tl.arange(0, BV)
        tl.store(o_ptr + h64 * so_h + t[:, None] * so_t + ov[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=mt[:, None] & (ov[None, :] < V))

    @triton.jit
    def output4_kernel(q_ptr, k_ptr, gc_ptr, rk_ptr, h_ptr, vn_ptr, o_ptr, seq_ptr, start_ptr, len_ptr, n_tok, n_chk,
                       M, scale, eps, sq_t, sq_h, sq_k, sk_t, sk_h, sk_k, so_t, so_h,
                       K: tl.constexpr, V: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, GP: tl.constexpr,
                       KB: tl.constexpr, TWO: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr,
                       DOT: tl.constexpr, REGULAR: tl.constexpr):
        """Program (chunk, ``GP`` value heads, column block) of a 1-D grid (column blocks fastest, then
        chunks, then heads): ``q k^T`` and ``|q|^2`` once, then each head's ``o`` (module docstring).
        (``q k^T`` and ``q S`` in one pass over the key halves, as fla's, took 244 registers for sm_90
        at ``GP = 1``, 64 columns, 4 warps, against 182 this way.)"""
        NV = tl.cdiv(V, BV)
        pid = tl.program_id(0)
        j, rest = pid % NV, pid // NV
        c, hg = rest % M, rest // M
        _, t0, L = _chunk2(c, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, REGULAR)
        t, mt = t0 + tl.arange(0, 64), tl.arange(0, 64) < L
        h0 = hg * GP
        hk = (h0 // GROUP).to(tl.int64)
        qb, kb = q_ptr + hk * sq_h, k_ptr + hk * sk_h
        # a chunk id past the last chunk (L = 0) reads chunk 0's state and stores nothing
        cc = c.to(tl.int64) * (L > 0)
        q1 = _q(qb, t, mt, sq_t, sq_k, 0, K, KB)
        a = _dota(q1, _kT(kb, t, mt, sk_t, sk_k, 0, K, KB), tl.zeros((64, 64), tl.float32), DOT)
        nq = _sumsq(q1)
        if TWO:
            q2 = _q(qb, t, mt, sq_t, sq_k, KB, K, KB)
            a = _dota(q2, _kT(kb, t, mt, sk_t, sk_k, KB, K, KB), a, DOT)
            nq += _sumsq(q2)
        sq = tl.full((64,), 1.0, tl.float32) * scale
        if L2NORM:
            sq = sq * tl.math.rsqrt(nq + eps)
        for g in range(0, GP):
            h64 = (h0 + g).to(tl.int64)
            hb = h_ptr + (cc * HV + h64) * (K * V)
            o = _dota(q1, _get(_state(hb, 0, j, K, V, KB, BV)), tl.zeros((64, BV), tl.float32), DOT)
            if TWO:
                o = _dota(q2, _get(_state(hb, KB, j, K, V, KB, BV)), o, DOT)
            _head_tail(a, o, sq, h64, t, mt, j, gc_ptr, rk_ptr, vn_ptr, o_ptr, so_t, so_h, V, HV, BV, L2NORM, DOT,
                       GP > 1)


    @triton.jit
    def _blk(a, ri, rj, bi, ci, cj, DIAG: tl.constexpr):
        """Block ``(i, j)`` of ``A`` from ``a = k_i . k_j`` (raw keys): ``beta_i a rk_i rk_j exp(gc_i -
        gc_j)`` (``ri`` / ``rj`` the rows' ``1 / |k|``, ones without l2norm), strictly lower on the diagonal."""
        return _decay_block(a * (bi * ri)[:, None] * rj[None, :], ci, cj, DIAG, bi, False)

    @triton.jit
    def _rk16(n, rb, s_t, rows, L, eps, L2NORM: tl.constexpr):
        """``1 / |k|`` of 16 rows from their sums of squares ``n`` (stored at ``rb``), ones without l2norm."""
        if L2NORM:
            rk = tl.math.rsqrt(n + eps)
            tl.store(rb + rows * s_t, rk, mask=rows < L)
            return rk
        else:
            return tl.full((16,), 1.0, tl.float32)

    @triton.jit
    def _kkt4(kb, L, K, sk_t, sk_k, BK: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr):
        """``A``'s ten 16 x 16 blocks of raw ``k k^T`` and the four row blocks' sums of squares (zeros
        without l2norm), accumulated over ``BK``-column key blocks."""
        z = tl.zeros((16, 16), tl.float32)
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = z, z, z, z, z, z, z, z, z, z
        zv = tl.zeros((16,), tl.float32)
        n0, n1, n2, n3 = zv, zv, zv, zv
        for i in range(0, tl.cdiv(K, BK)):
            x0 = _raw(_tile(kb, L, K, sk_t, sk_k, 0, i * BK, 16, BK))
            x1 = _raw(_tile(kb, L, K, sk_t, sk_k, 16, i * BK, 16, BK))
            x2 = _raw(_tile(kb, L, K, sk_t, sk_k, 32, i * BK, 16, BK))
            x3 = _raw(_tile(kb, L, K, sk_t, sk_k, 48, i * BK, 16, BK))
            A00 = _dota(x0, tl.trans(x0), A00, DOT)
            A10 = _dota(x1, tl.trans(x0), A10, DOT)
            A11 = _dota(x1, tl.trans(x1), A11, DOT)
            A20 = _dota(x2, tl.trans(x0), A20, DOT)
            A21 = _dota(x2, tl.trans(x1), A21, DOT)
            A22 = _dota(x2, tl.trans(x2), A22, DOT)
            A30 = _dota(x3, tl.trans(x0), A30, DOT)
            A31 = _dota(x3, tl.trans(x1), A31, DOT)
            A32 = _dota(x3, tl.trans(x2), A32, DOT)
            A33 = _dota(x3, tl.trans(x3), A33, DOT)
            if L2NORM:
                n0, n1, n2, n3 = n0 + _sumsq(x0), n1 + _sumsq(x1), n2 + _sumsq(x2), n3 + _sumsq(x3)
        return A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, n0, n1, n2, n3

    @triton.jit
    def solve4_kernel(k_ptr, g_ptr, b_ptr, gc_ptr, rk_ptr, ai_ptr, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, K,
                      GROUP, eps, sk_t, sk_h, sk_k, sg_t, sg_h, sb_t, sb_h, sc_t, sc_h, sa_t, sa_h,
                      KP: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr, REGULAR: tl.constexpr,
                      INV: tl.constexpr, BK: tl.constexpr):
        """v3's ``solve3_kernel`` (``LaunchConfig.solve_bk``) with the key dimension in a loop of ``BK``
        columns, as fla's ``kkt_solve``: ``A``'s ten 16 x 16 blocks and the rows' sums of squares
        accumulated over raw key blocks (one ``[16, BK]`` block of each row block live, pipelined by
        the stages), the norms, beta and decay applied to the sums; then the inverse and its store."""
        c, h = tl.program_id(0), tl.program_id(1)
        _, t0, L = _chunk2(c, seq_ptr, start_ptr, len_ptr, n_tok, n_chk, REGULAR)
        r = tl.arange(0, 16)
        h64 = h.to(tl.int64)
        gb, bb, cb = g_ptr + h64 * sg_h + t0 * sg_t, b_ptr + h64 * sb_h + t0 * sb_t, gc_ptr + h64 * sc_h + t0 * sc_t
        c0, c1, c2, c3 = gc16(gb, cb, sg_t, sc_t, r, L)
        kb = k_ptr + (h // GROUP).to(tl.int64) * sk_h + t0 * sk_t
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, n0, n1, n2, n3 = _kkt4(kb, L, K, sk_t, sk_k, BK, L2NORM,
                                                                                 DOT)
        rb = rk_ptr + h64 * sc_h + t0 * sc_t
        r0, r1 = _rk16(n0, rb, sc_t, r, L, eps, L2NORM), _rk16(n1, rb, sc_t, r + 16, L, eps, L2NORM)
        r2, r3 = _rk16(n2, rb, sc_t, r + 32, L, eps, L2NORM), _rk16(n3, rb, sc_t, r + 48, L, eps, L2NORM)
        b0, b1, b2, b3 = _vec(bb, sb_t, r, L), _vec(bb, sb_t, r + 16, L), _vec(bb, sb_t, r + 32, L), \
            _vec(bb, sb_t, r + 48, L)
        T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _inverse(
            _blk(A00, r0, r0, b0, c0, c0, True), _blk(A10, r1, r0, b1, c1, c0, False),
            _blk(A11, r1, r1, b1, c1, c1, True), _blk(A20, r2, r0, b2, c2, c0, False),
            _blk(A21, r2, r1, b2, c2, c1, False), _blk(A22, r2, r2, b2, c2, c2, True),
            _blk(A30, r3, r0, b3, c3, c0, False), _blk(A31, r3, r1, b3, c3, c1, False),
            _blk(A32, r3, r2, b3, c3, c2, False), _blk(A33, r3, r3, b3, c3, c3, True), INV)
        put_lower(ai_ptr + h64 * sa_h + t0 * sa_t, L, sa_t, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33)


def _packed(*ts) -> None:
    for x in ts:  # the v4 kernels index our scratch at its packed strides
        assert x.is_contiguous(), "gdn_chunk v4: expected packed scratch"


def launch_scan4(k3, w, u, gc, rk, s, final, hs, vn, cu, cu_chunks, TS, NT, meta, cfg, dot, l2, regular) -> None:
    """:attr:`~.gdn_chunk.LaunchConfig.scan4`'s launch in place of v2's ``scan2`` (same scratch,
    same function): ``scan_block_v`` columns, ``scan_warps``, ``scan_stages`` (else ``num_stages``)."""
    K, V, Hv, N = meta.k_dim, meta.v_dim, meta.v_heads, meta.sequences
    _packed(w, u, gc, rk, hs, vn, final)
    KP, vp = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))
    BV = min(max(16, cfg.scan_block_v), vp)
    scan4_kernel[(N * Hv * triton.cdiv(V, BV),)](
        k3, w, u, gc, rk, s if s is not None else final, final, hs, vn, cu, cu_chunks, TS, NT, *k3.stride(),
        *(s.stride() if s is not None else (0, 0, 0, 0)), K=K, V=V, HV=Hv, GROUP=Hv // meta.k_heads,
        KB=min(KP, 64), TWO=KP > 64, BV=BV, L2NORM=l2, HAS_STATE=s is not None, DOT=dot, REGULAR=regular,
        num_warps=cfg.scan_warps, num_stages=cfg.num_stages if cfg.scan_stages is None else cfg.scan_stages)


def launch_scanout4(q3, k3, w, u, gc, rk, s, final, o3, cu, cu_chunks, TS, NT, meta, cfg, dot, l2, scale, eps,
                    regular) -> None:
    """:attr:`~.gdn_chunk.LaunchConfig.scan4_out`'s one launch in place of the scan and the output
    (the scan's ``scan_block_v`` / ``scan_warps`` / ``scan_stages``)."""
    K, V, Hv, N = meta.k_dim, meta.v_dim, meta.v_heads, meta.sequences
    _packed(w, u, gc, rk, final)
    KP, vp = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))
    BV = min(max(16, cfg.scan_block_v), vp)
    scanout4_kernel[(N * Hv * triton.cdiv(V, BV),)](
        q3, k3, w, u, gc, rk, s if s is not None else final, final, o3, cu, cu_chunks, TS, NT, scale, eps,
        *q3.stride(), *k3.stride(), *(s.stride() if s is not None else (0, 0, 0, 0)), *o3.stride()[:2], K=K, V=V,
        HV=Hv, GROUP=Hv // meta.k_heads, KB=min(KP, 64), TWO=KP > 64, BV=BV, L2NORM=l2, HAS_STATE=s is not None,
        DOT=dot, REGULAR=regular, num_warps=cfg.scan_warps,
        num_stages=cfg.num_stages if cfg.scan_stages is None else cfg.scan_stages)


def launch_out4(q3, k3, gc, rk, hs, vn, o3, maps, TS, NT, M, meta, cfg, dot, l2, scale, eps, regular) -> None:
    """:attr:`~.gdn_chunk.LaunchConfig.out4`'s launch in place of v2's ``output2``: ``"group"`` (a
    program per key head's GQA group, ``q k^T`` shared) or ``"head"`` (a program per value head);
    ``out_block_v`` columns, ``out_warps``, ``num_stages``."""
    if cfg.out4 not in ("group", "head"):
        raise ValueError(f"gdn_chunk: expected out4 '', 'group' or 'head', got {cfg.out4!r}")
    K, V, Hv = meta.k_dim, meta.v_dim, meta.v_heads
    group = Hv // meta.k_heads
    _packed(gc, rk, hs, vn)
    KP, vp = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))
    OBV = min(max(16, cfg.out_block_v), vp)
    gp = group if cfg.out4 == "group" else 1
    output4_kernel[(M * (Hv // gp) * triton.cdiv(V, OBV),)](
        q3, k3, gc, rk, hs, vn, o3, *maps, TS, NT, M, scale, eps, *q3.stride(), *k3.stride(), *o3.stride()[:2],
        K=K, V=V, HV=Hv, GROUP=group, GP=gp, KB=min(KP, 64), TWO=KP > 64, BV=OBV, L2NORM=l2, DOT=dot,
        REGULAR=regular, num_warps=cfg.out_warps, num_stages=cfg.num_stages)


def _signature(kernel, ptrs: dict) -> dict:
    """A kernel's runtime argument types for ahead-of-time compiles: ``ptrs`` by name, other pointers
    float32, ``scale`` / ``eps`` float32, the rest int32 (constexprs, by the kernel's own parameters,
    left out)."""
    out = {}
    for p in kernel.params:
        if p.is_constexpr:
            continue
        n = p.name
        out[n] = ptrs.get(n, "*fp32" if n.endswith("_ptr") else "fp32" if n in ("scale", "eps") else "i32")
    return out


def aot_variants():
    """The v4 launches for sm_90 at Qwen3-Next's prefill (K = V = 128, 32 value heads for 16 key heads,
    bf16 inputs, operands and intermediates, l2norm, a state) as the sweep's rows launch them."""
    from kda_inductor.lowerings import AotVariant

    maps = {"seq_ptr": "*i32", "start_ptr": "*i64", "len_ptr": "*i32", "cu_ptr": "*i64", "cuc_ptr": "*i64"}
    bf = {**maps, **dict.fromkeys(("q_ptr", "k_ptr", "w_ptr", "u_ptr", "h_ptr", "vn_ptr", "o_ptr", "b_ptr",
                                    "ai_ptr"), "*bf16")}
    dims = dict(K=128, V=128, HV=32, GROUP=2, KB=64, TWO=True, L2NORM=True, DOT="bf16", REGULAR=True)
    state = dict(dims, HAS_STATE=True)
    yield AotVariant(scan4_kernel, _signature(scan4_kernel, bf), dict(state, BV=32), {"num_warps": 4, "num_stages": 3})
    yield AotVariant(scanout4_kernel, _signature(scanout4_kernel, bf), dict(state, BV=16),
                     {"num_warps": 4, "num_stages": 2})
    for gp in (2, 1):
        yield AotVariant(output4_kernel, _signature(output4_kernel, bf), dict(dims, GP=gp, BV=64),
                         {"num_warps": 4, "num_stages": 2})
    yield AotVariant(solve4_kernel, _signature(solve4_kernel, bf),
                     dict(KP=128, L2NORM=True, DOT="bf16", REGULAR=True, INV="ieee", BK=32),
                     {"num_warps": 4, "num_stages": 2})


__all__ = ["aot_variants", "launch_out4", "launch_scan4", "launch_scanout4"]
