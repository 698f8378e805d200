"""The token-by-token body of ``kda::gdn_recurrent_step``'s Triton kernel, shared by its two kernels
(``gdn_recurrent_step``'s one program a tile, ``_gdn_tiles``' persistent programs): one token through
a float32 state tile ``S [KP, BV]`` in registers (:func:`token`: :func:`_keys` then :func:`_update`,
or :func:`_update_scaled`), a token's inputs (:func:`load_token`) and the runtime token loop
(:func:`sequential`). The module docstring of ``gdn_recurrent_step`` gives the arithmetic.
"""

from __future__ import annotations

from kda_inductor.lowerings._triton import tl, triton

if triton is not None:
    from kda_inductor.lowerings._gdn_window import add2 as _add2

    @triton.jit
    def add3(a0, b0, c0, a1, b1, c1):
        return a0 + a1, b0 + b1, c0 + c1

    @triton.jit
    def load_token(q_row, k_row, v_row, g_row, b_row, t, T, rk, kmask, vmask, sq_t, sk_t, sv_t, sg_t, sb_t,
                   sq_k, sk_k, sg_k, PER_CHANNEL: tl.constexpr):
        """Token ``t``'s raw ``q``, ``k`` (``[KP]``), ``v`` (``[BV]``), ``g`` (scalar or ``[KP]``) and
        ``beta``, as float32; all zeros for ``t >= T`` (the prefetch past the last token)."""
        live = (tl.program_id(0) * 0 + t) < T
        km = kmask & (rk * 0 + t < T)  # (a vector & a scalar mask trips the interpreter)
        q = tl.load(q_row + t * sq_t + rk * sq_k, mask=km, other=0.0).to(tl.float32)
        k = tl.load(k_row + t * sk_t + rk * sk_k, mask=km, other=0.0).to(tl.float32)
        v = tl.load(v_row + t * sv_t, mask=vmask & (tl.zeros_like(vmask.to(tl.int32)) + t < T), other=0.0)
        v = v.to(tl.float32)
        if PER_CHANNEL:
            g = tl.load(g_row + t * sg_t + rk * sg_k, mask=km, other=0.0).to(tl.float32)
        else:
            g = tl.load(g_row + t * sg_t, mask=live, other=0.0).to(tl.float32)
        beta = tl.load(b_row + t * sb_t, mask=live, other=0.0).to(tl.float32)
        return q, k, v, g, beta

    @triton.jit
    def _keys(q, k, scale, eps, L2NORM: tl.constexpr):
        """``q`` normalized and scaled, ``k`` normalized (float32 ``[KP]``), and ``q . k`` (the three
        sums in one reduction)."""
        if L2NORM:
            qq, kk, qk = tl.reduce((q * q, k * k, q * k), 0, add3)
            nq = tl.math.rsqrt(qq + eps)
            nk = tl.math.rsqrt(kk + eps)
            q = q * nq * scale
            k = k * nk
            qk = qk * (nq * nk) * scale
        else:
            q = q * scale
            qk = tl.sum(q * k, 0)
        return q, k, qk

    @triton.jit
    def _update(S, q, k, qk, v, beta, e, PER_CHANNEL: tl.constexpr):
        """One token through the tile ``S [KP, BV]``: the new tile and this token's output.
        ``S_new = S e + k delta`` with ``delta = (v - sum_K(S e k)) beta``, and
        ``out = sum_K(S_new q) = sum_K(S e q) + (q . k) delta``: one reduction over K of the old
        tile for both sums."""
        kv, oq = tl.reduce((S * (k * e)[:, None], S * (q * e)[:, None]), 0, _add2)
        delta = (v - kv) * beta
        if PER_CHANNEL:
            S = S * e[:, None] + k[:, None] * delta[None, :]
        else:
            S = S * e + k[:, None] * delta[None, :]
        return S, oq + qk * delta

    @triton.jit
    def _update_scaled(S, q, k, v, beta, e, scale, eps, L2NORM: tl.constexpr):
        """:func:`_keys` and :func:`_update` for a scalar decay ``e`` from the raw ``q``, ``k``: the
        norms are scalars, so both tile sums are taken on the raw vectors and scaled after
        (``kv = nk sum_K(S e k)``, ``S_new = S e + k (nk delta)``), and only the raw ``q`` and ``k``
        move into the tile's row layout (two layout conversions a token, not three)."""
        qq, kk, qk = tl.reduce((q * q, k * k, q * k), 0, add3)
        if L2NORM:
            nq = tl.math.rsqrt(qq + eps) * scale
            nk = tl.math.rsqrt(kk + eps)
        else:
            nq = scale + 0.0 * qq
            nk = 1.0 + 0.0 * kk
        q, k = q[:, None], k[:, None]
        kv, oq = tl.reduce((S * (k * e), S * (q * e)), 0, _add2)
        delta = (v - kv * nk) * beta
        return S * e + k * (delta * nk)[None, :], (oq + qk * nk * delta) * nq

    @triton.jit
    def token(S, q, k, v, g, beta, scale, eps, PER_CHANNEL: tl.constexpr, L2NORM: tl.constexpr,
              SCALED: tl.constexpr):
        """One token through the tile: the new tile and the token's output (``SCALED`` with a
        scalar decay: :func:`_update_scaled`; a per-channel decay needs its own conversion
        either way, and SCALED gains it nothing there: :func:`_keys` then :func:`_update`)."""
        if SCALED and not PER_CHANNEL:
            return _update_scaled(S, q, k, v, beta, tl.exp(g), scale, eps, L2NORM)
        else:
            q, k, qk = _keys(q, k, scale, eps, L2NORM)
            return _update(S, q, k, qk, v, beta, tl.exp(g), PER_CHANNEL)

    @triton.jit
    def sequential(S, q_row, k_row, v_row, g_row, b_row, o_row, T, HV, V, rk, kmask, vmask, scale, eps, sq_t, sk_t,
                   sv_t, sg_t, sb_t, sq_k, sk_k, sg_k, PER_CHANNEL: tl.constexpr, L2NORM: tl.constexpr,
                   SCALED: tl.constexpr):
        """Token by token through the tile (the next token's inputs loaded before this one's
        reductions), each output stored as it comes; returns the final tile."""
        nxt = load_token(q_row, k_row, v_row, g_row, b_row, 0, T, rk, kmask, vmask, sq_t, sk_t, sv_t, sg_t,
                         sb_t, sq_k, sk_k, sg_k, PER_CHANNEL)
        for t in range(T):
            q, k, v, g, beta = nxt
            nxt = load_token(q_row, k_row, v_row, g_row, b_row, t + 1, T, rk, kmask, vmask, sq_t, sk_t,
                             sv_t, sg_t, sb_t, sq_k, sk_k, sg_k, PER_CHANNEL)
            S, o = token(S, q, k, v, g, beta, scale, eps, PER_CHANNEL, L2NORM, SCALED)
            tl.store(o_row + t * HV * V, o.to(o_row.dtype.element_ty), mask=vmask)
        return S


def aot_variants():
    """None of its own: these helpers are inlined into ``gdn_recurrent_step``'s and ``_gdn_tiles``'
    kernels, whose ``aot_variants()`` compile them."""
    return ()
