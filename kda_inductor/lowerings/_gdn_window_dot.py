"""The window body of ``kda::gdn_recurrent_step``'s Triton kernel with its state-tile products on
tensor cores (``tl.dot``; a launch option, off by default: ``LaunchConfig.window_dot``, the dot's
``input_precision``). The arithmetic is :mod:`._gdn_window`'s chunk form; here the window's tokens are
rows of ``[TD, ...]`` blocks, ``TD = max(16, next_pow2(T))`` (``tl.dot`` takes no dimension under 16),
the rows past the last token zeros (their ``beta``, ``k``, ``v`` and so their ``d`` exactly zero, so they
add nothing to the outputs or the tile). With ``G_t`` the cumulative log decay from the window's start,
``Kd = k e^G``, ``Qd = q e^G`` and ``Kl = k e^(G_last - G)`` (per head or per key channel)::

    A = Kd @ S        B = Qd @ S                                   # [TD, BV]: the initial tile's reads
    M[t, i] = k_t . k_i e^(G_t - G_i) (i < t)    N[t, i] = q_t . k_i e^(G_t - G_i) (i <= t)
    d = (I + diag(beta) M)^-1 (beta (v - A))     # the unit lower-triangular inverse by forward
    o = B + N @ d                                # substitution over the ``TS`` live rows ([TD, TD])
    S' = S e^G_last + Kl^T @ d

(a scalar decay: ``M``, ``N`` from ``k @ k^T``, ``q @ k^T`` times ``e^(G_t - G_i)``, the exponent masked
to ``-inf`` above the diagonal; per key channel the couplings row by row as :func:`._gdn_window.pairs`
(``e^(G_t - G_i)`` inside the dot, never ``e^-G`` alone, which can overflow)). ``input_precision``:
``"ieee"`` (float32 FMAs, not tensor cores), ``"tf32x3"`` (three tf32 products: about float32),
``"tf32"`` (one: ~1e-3 relative, measured at its own bound; never a default unmeasured). ``TRANSPOSED``
(``LaunchConfig.dot_transposed``): the tile's reads and the solve as ``S^T @ Kd^T`` (``[BV, TD]``: the
tile's columns the dots' M; at 64 columns x 4 warps sm_90 ``wgmma``; the same sums in real arithmetic).
"""

from __future__ import annotations

from kda_inductor.lowerings._triton import tl, triton

PRECISIONS = ("ieee", "tf32x3", "tf32")
"""``LaunchConfig.window_dot``'s values (``""``: off), ``tl.dot``'s ``input_precision``."""
MIN_ROWS = 16
"""``tl.dot``'s least M / N / K: the window's rows and the tile's columns at least this many."""


def allowed_precisions(device_type: str) -> tuple[str, ...]:
    """The ``input_precision`` values the installed Triton takes for ``device_type``'s backend (the
    interpreter's on CPU tensors), read from its options class (a feature check, no version string)."""
    try:
        if device_type == "cpu":
            from triton.runtime.interpreter import InterpreterOptions as opts
        else:
            from triton.backends.nvidia.compiler import CUDAOptions as opts
    except ImportError:  # pragma: no cover - an older or other backend: let tl.dot judge
        return PRECISIONS
    return tuple(getattr(opts, "allowed_dot_input_precisions", PRECISIONS))


def check_precision(value: str, device_type: str) -> None:
    """``value`` one of :data:`PRECISIONS` and taken by this Triton (else a ValueError saying which)."""
    if value not in PRECISIONS:
        raise ValueError(f"gdn_recurrent_step: LaunchConfig.window_dot must be '' (off) or one of {PRECISIONS}, "
                         f"got {value!r}")
    allowed = allowed_precisions(device_type)
    if value not in allowed:
        raise ValueError(f"gdn_recurrent_step: LaunchConfig.window_dot={value!r}: this Triton "
                         f"({triton.__version__}) takes tl.dot input_precision only in {allowed} on {device_type}")


if triton is not None:
    from kda_inductor.lowerings._gdn_window import load_window
    from kda_inductor.lowerings._gdn_window import pairs as _pairs
    from kda_inductor.lowerings._gdn_window import put as _put
    from kda_inductor.lowerings._gdn_window import row as _row
    from kda_inductor.lowerings._gdn_window import window as _window
    from kda_inductor.lowerings._gdn_window import window_keys

    @triton.jit
    def couplings(q, k, gc, rt, TP: tl.constexpr, TS: tl.constexpr, PER_CHANNEL: tl.constexpr,
                   DOT: tl.constexpr):
        """``M`` (strictly lower) and ``N`` (lower, diagonal included): ``[TD, TD]``, zero past the
        ``TS`` live rows' couplings."""
        if PER_CHANNEL:
            M = tl.zeros((TP, TP), tl.float32)
            N = tl.zeros((TP, TP), tl.float32)
            for t in tl.static_range(TS):
                m, n = _pairs(k, gc, rt, t, _row(k, rt, t), _row(q, rt, t), _row(gc, rt, t), True)
                M, N = _put(M, rt, t, m), _put(N, rt, t, n)
            return M, N
        else:
            r = tl.exp(tl.where(rt[None, :] <= rt[:, None], gc[:, None] - gc[None, :], float("-inf")))
            kk = tl.dot(k, tl.trans(k), input_precision=DOT)
            qk = tl.dot(q, tl.trans(k), input_precision=DOT)
            return tl.where(rt[None, :] < rt[:, None], kk * r, 0.0), qk * r

    @triton.jit
    def unit_lower_inverse(L, rt, TS: tl.constexpr):
        """``(I + L)^-1`` for a strictly lower ``L [TD, TD]`` whose rows from ``TS`` on are zero, by
        forward substitution: row ``t`` is ``e_t - sum_{i<t} L[t, i] X[i, :]`` (rows ``i < t`` done)."""
        X = (rt[:, None] == rt[None, :]).to(tl.float32)
        for t in tl.static_range(1, TS):
            lt = _row(L, rt, t)
            X = _put(X, rt, t, tl.where(rt == t, 1.0, 0.0) - tl.sum(lt[:, None] * X, 0))
        return X

    @triton.jit
    def _reads_transposed(S, qd, kd, DOT: tl.constexpr):
        """``B = qd @ S`` and ``A = kd @ S`` as ``(S^T @ qd^T)^T``: the tile's columns as the dot's M
        (64 of them make an sm_90 ``wgmma``, whose other operand stays in shared memory)."""
        St = tl.trans(S)
        return (tl.trans(tl.dot(St, tl.trans(qd), input_precision=DOT)),
                tl.trans(tl.dot(St, tl.trans(kd), input_precision=DOT)))

    @triton.jit
    def window_dot(S, q, k, v, g, beta, T, rt, scale, eps, TP: tl.constexpr, TS: tl.constexpr,
                   PER_CHANNEL: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr,
                   TRANSPOSED: tl.constexpr = False):
        """The window through the tile ``S [KP, BV]`` (the module docstring): the new tile and the
        outputs ``o [TD, BV]`` (rows past ``T`` not meaningful)."""
        q, k, gc, last = window_keys(q, k, g, T, rt, scale, eps, L2NORM, PER_CHANNEL, True)
        M, N = couplings(q, k, gc, rt, TP, TS, PER_CHANNEL, DOT)
        # the [TD, KP] blocks in the order that frees them soonest (q, then k and a per-channel G)
        eg = tl.exp(gc) if PER_CHANNEL else tl.exp(gc)[:, None]
        if TRANSPOSED:
            B, A = _reads_transposed(S, q * eg, k * eg, DOT)
        else:
            B = tl.dot(q * eg, S, input_precision=DOT)
            A = tl.dot(k * eg, S, input_precision=DOT)
        kl = k * (tl.exp(last[None, :] - gc) if PER_CHANNEL else tl.exp(last - gc)[:, None])
        inv = unit_lower_inverse(M * beta[:, None], rt, TS)
        if TRANSPOSED:
            dt = tl.dot(tl.trans((v - A) * beta[:, None]), tl.trans(inv), input_precision=DOT)
            o = B + tl.trans(tl.dot(dt, tl.trans(N), input_precision=DOT))
            d = tl.trans(dt)
        else:
            d = tl.dot(inv, (v - A) * beta[:, None], input_precision=DOT)
            o = B + tl.dot(N, d, input_precision=DOT)
        S = S * (tl.exp(last)[:, None] if PER_CHANNEL else tl.exp(last))
        return S + tl.dot(tl.trans(kl), d, input_precision=DOT), o

    @triton.jit
    def window_tile(S, q_row, k_row, v_base, g_row, b_row, o_row, T, HV, V, rk, rv, kmask, vmask, scale, eps,
                    sq_t, sk_t, sv_t, sv_v, sg_t, sb_t, sq_k, sk_k, sg_k, TP: tl.constexpr, TS: tl.constexpr,
                    PER_CHANNEL: tl.constexpr, L2NORM: tl.constexpr, DOT: tl.constexpr,
                    TRANSPOSED: tl.constexpr = False):
        """Every token's inputs loaded once as ``[TP, ...]`` blocks, the window run (``DOT`` ``""``:
        :func:`._gdn_window.window`'s elementwise products; else :func:`window_dot`), the outputs
        stored; returns the new tile."""
        rt = tl.arange(0, TP)
        q, k, v, g, beta = load_window(q_row, k_row, v_base, g_row, b_row, T, rt, rk, rv, kmask, vmask, sq_t, sk_t,
                                       sv_t, sv_v, sg_t, sb_t, sq_k, sk_k, sg_k, PER_CHANNEL)
        if DOT == "":
            S, o = _window(S, q, k, v, g, beta, T, rt, scale, eps, TP, PER_CHANNEL, L2NORM)
        else:
            S, o = window_dot(S, q, k, v, g, beta, T, rt, scale, eps, TP, TS, PER_CHANNEL, L2NORM, DOT, TRANSPOSED)
        tl.store(o_row + rt[:, None] * HV * V, o.to(o_row.dtype.element_ty), mask=(rt[:, None] < T) & vmask[None, :])
        return S


def aot_variants():
    """None of its own: these helpers are inlined into ``gdn_recurrent_step``'s kernel, whose
    ``aot_variants()`` compile them."""
    return ()
