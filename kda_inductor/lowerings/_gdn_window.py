"""The window body of ``kda::gdn_recurrent_step``'s Triton kernel (``T > 1`` tokens, a launch option:
``LaunchConfig.window``), in the chunk form: per program, the float32 state tile ``S [KP, BV]`` in
registers and every token's ``q`` / ``k`` / ``v`` / ``g`` / ``beta`` loaded once as ``[TP, ...]`` blocks
(``TP`` the tokens padded to a power of two, zeros past the last). With ``G_t`` the cumulative log
decay from the window's start (per head or per key channel), the spec's loop is, exactly in real
arithmetic (float32 sums in another order)::

    a_t = sum_K(S e^G_t k_t)          b_t = sum_K(S e^G_t q_t)          # T sums, independent
    d_t = (v_t - a_t - sum_{i<t} (k_t . k_i e^(G_t - G_i)) d_i) beta_t  # [BV] vectors, per token
    o_t = b_t + sum_{i<=t} (q_t . k_i e^(G_t - G_i)) d_i
    S'  = S e^G_last + sum_t (k_t e^(G_last - G_t)) d_t^T                # the tile updated once

(``e^(G_t - G_i)`` per key channel inside the dots for KDA; exponents of ``i > t`` masked to
``-inf`` before ``exp``, never overflowing). No token waits on the last one's tile update: the
tile is read by ``T`` independent sums and written by one pass of ``T`` outer products.
"""

from __future__ import annotations

from kda_inductor.lowerings._triton import tl, triton

if triton is not None:

    @triton.jit
    def add2(a0, b0, a1, b1):
        return a0 + a1, b0 + b1

    @triton.jit
    def row(X, rt, t):
        """Row ``t`` of the register block ``X [TP, N]`` (a ``[N]`` vector)."""
        return tl.sum(tl.where(rt[:, None] == t, X, 0.0), 0)

    @triton.jit
    def put(X, rt, t, x):
        """``X`` with row ``t`` set to the vector ``x``."""
        return tl.where(rt[:, None] == t, x[None, :], X)

    @triton.jit
    def elem(x, rt, t):
        """Element ``t`` of the vector ``x [TP]``."""
        return tl.sum(tl.where(rt == t, x, 0.0), 0)

    @triton.jit
    def load_window(q_row, k_row, v_base, g_row, b_row, T, rt, rk, rv, kmask, vmask, sq_t, sk_t, sv_t, sv_v,
                     sg_t, sb_t, sq_k, sk_k, sg_k, PER_CHANNEL: tl.constexpr):
        """Every token's ``q``, ``k`` (``[TP, KP]``), ``v`` (``[TP, BV]``), ``g`` (``[TP]`` or ``[TP, KP]``)
        and ``beta`` (``[TP]``) as float32, loaded once; zeros past the last token."""
        tm = rt < T
        mk = tm[:, None] & kmask[None, :]
        q = tl.load(q_row + rt[:, None] * sq_t + rk[None, :] * sq_k, mask=mk, other=0.0).to(tl.float32)
        k = tl.load(k_row + rt[:, None] * sk_t + rk[None, :] * sk_k, mask=mk, other=0.0).to(tl.float32)
        v = tl.load(v_base + rt[:, None] * sv_t + rv[None, :] * sv_v, mask=tm[:, None] & vmask[None, :], other=0.0)
        if PER_CHANNEL:
            g = tl.load(g_row + rt[:, None] * sg_t + rk[None, :] * sg_k, mask=mk, other=0.0).to(tl.float32)
        else:
            g = tl.load(g_row + rt * sg_t, mask=tm, other=0.0).to(tl.float32)
        beta = tl.load(b_row + rt * sb_t, mask=tm, other=0.0).to(tl.float32)
        return q, k, v.to(tl.float32), g, beta

    @triton.jit
    def window_keys(q, k, g, T, rt, scale, eps, L2NORM: tl.constexpr, PER_CHANNEL: tl.constexpr,
                    ZERO_PAST: tl.constexpr):
        """The window's keys, every token at once: ``q`` normalized and scaled, ``k`` normalized (with
        ``ZERO_PAST``, rows past ``T`` exactly zero, also at ``eps = 0``: the tensor-core window's padded
        rows); ``gc`` the cumulative log decay from the window's start (``G_t``: ``[TP]`` or ``[TP, KP]``)
        and its last value ``G_last``."""
        if L2NORM and ZERO_PAST:
            q = q * tl.where(rt < T, tl.math.rsqrt(tl.sum(q * q, 1) + eps) * scale, 0.0)[:, None]
            k = k * tl.where(rt < T, tl.math.rsqrt(tl.sum(k * k, 1) + eps), 0.0)[:, None]
        elif L2NORM:
            q = q * (tl.math.rsqrt(tl.sum(q * q, 1) + eps) * scale)[:, None]
            k = k * tl.math.rsqrt(tl.sum(k * k, 1) + eps)[:, None]
        else:
            q = q * scale
        gc = tl.cumsum(g, 0)
        if PER_CHANNEL:
            return q, k, gc, row(gc, rt, T - 1)
        else:
            return q, k, gc, elem(gc, rt, T - 1)

    @triton.jit
    def _decayed(x, gc, rt, t, base, PER_CHANNEL: tl.constexpr):
        """Row ``t`` of ``x [TP, KP]`` times ``exp(base - G_t)`` (per key channel or one number)."""
        if PER_CHANNEL:
            return row(x, rt, t) * tl.exp(base - row(gc, rt, t))
        else:
            return row(x, rt, t) * tl.exp(base - elem(gc, rt, t))

    @triton.jit
    def pairs(k, gc, rt, t, kt, qt, gt, PER_CHANNEL: tl.constexpr):
        """Token ``t``'s couplings to the window's tokens ``i`` (``kt``, ``qt``, ``gt``: its ``k``, ``q``,
        ``G``): ``m[i] = k_t . (k_i decayed from i to t)`` for ``i < t`` (what their updates add to the
        state read of ``t``), ``n[i] = q_t . (k_i decayed from i to t)`` for ``i <= t`` (to its output)."""
        if PER_CHANNEL:
            kr = k * tl.exp(tl.where(rt[:, None] <= t, gt[None, :] - gc, float("-inf")))
            m, n = tl.sum(kr * kt[None, :], 1), tl.sum(kr * qt[None, :], 1)
        else:
            r = tl.exp(tl.where(rt <= t, gt - gc, float("-inf")))
            m, n = tl.sum(k * kt[None, :], 1) * r, tl.sum(k * qt[None, :], 1) * r
        return tl.where(rt < t, m, 0.0), n

    @triton.jit
    def window(S, q, k, v, g, beta, T, rt, scale, eps, TP: tl.constexpr, PER_CHANNEL: tl.constexpr,
               L2NORM: tl.constexpr):
        """The window through the tile ``S [KP, BV]`` with one pass over it (the chunk form; ``G_t``
        the cumulative log decay), per token: ``a_t = sum_K(S e^G_t k_t)``, ``b_t = sum_K(S e^G_t q_t)``
        (of the initial tile: no token waits on another's), ``d_t = (v_t - a_t - sum_{i<t} m_ti d_i)
        beta_t``, ``o_t = b_t + sum_{i<=t} n_ti d_i`` (``[BV]`` vectors); then the tile once: ``S
        e^G_last + sum_t (k_t e^(G_last - G_t)) d_t^T``. The spec's loop, summed in another order."""
        q, k, gc, last = window_keys(q, k, g, T, rt, scale, eps, L2NORM, PER_CHANNEL, False)
        d = tl.zeros_like(v)
        o = tl.zeros_like(v)
        for t in tl.static_range(TP):
            kt, qt = row(k, rt, t), row(q, rt, t)
            gt = row(gc, rt, t) if PER_CHANNEL else elem(gc, rt, t)
            e = tl.exp(gt)  # the decay from the window's start to t
            at, bt = tl.reduce((S * (kt * e)[:, None], S * (qt * e)[:, None]), 0, add2)
            m, n = pairs(k, gc, rt, t, kt, qt, gt, PER_CHANNEL)
            d = put(d, rt, t, (row(v, rt, t) - at - tl.sum(d * m[:, None], 0)) * elem(beta, rt, t))
            o = put(o, rt, t, bt + tl.sum(d * n[:, None], 0))
        S = S * (tl.exp(last)[:, None] if PER_CHANNEL else tl.exp(last))
        for t in tl.static_range(TP):
            S += _decayed(k, gc, rt, t, last, PER_CHANNEL)[:, None] * row(d, rt, t)[None, :]
        return S, o

    @triton.jit
    def window_tile(S, q_row, k_row, v_base, g_row, b_row, o_row, T, HV, V, rk, rv, kmask, vmask, scale, eps,
                    sq_t, sk_t, sv_t, sv_v, sg_t, sb_t, sq_k, sk_k, sg_k, TP: tl.constexpr,
                    PER_CHANNEL: tl.constexpr, L2NORM: tl.constexpr):
        """Every token's inputs loaded once as ``[TP, ...]`` blocks, :func:`window` run, the outputs
        stored; returns the new tile."""
        rt = tl.arange(0, TP)
        q, k, v, g, beta = load_window(q_row, k_row, v_base, g_row, b_row, T, rt, rk, rv, kmask, vmask, sq_t, sk_t,
                                       sv_t, sv_v, sg_t, sb_t, sq_k, sk_k, sg_k, PER_CHANNEL)
        S, o = window(S, q, k, v, g, beta, T, rt, scale, eps, TP, PER_CHANNEL, L2NORM)
        tl.store(o_row + rt[:, None] * HV * V, o.to(o_row.dtype.element_ty), mask=(rt[:, None] < T) & vmask[None, :])
        return S


def aot_variants():
    """None of its own: these helpers are inlined into ``gdn_recurrent_step``'s kernel, whose
    ``aot_variants()`` compile each window class."""
    return ()
