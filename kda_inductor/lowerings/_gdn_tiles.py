"""The persistent body of ``kda::gdn_recurrent_step``'s Triton kernel (a launch option:
``LaunchConfig.persistent``, programs per SM): a fixed number of programs, each looping over state
tiles ``pid, pid + P, pid + 2 P, ...`` (``P`` programs; the column blocks of one head side by side,
as the one-program-a-tile kernel orders them). The tile loop is a ``tl.range`` of ``num_stages``
stages, so Triton's software pipeliner fetches the next tile's state (and, with the tokens
unrolled, its tokens' q / k / v) into shared memory (``cp.async``) while this tile's tokens run:
the state's traffic goes on under the tokens' work instead of alternating with it (an H200 ran
the one-program-a-tile kernel at T = 4 in about the floor plus the tokens' work, 55.8 us against a
32.3 floor at B = 32, ecb9247). Each tile's tokens are the token-by-token body's (the same
helpers: :func:`._gdn_token.token`), unrolled (``TT`` tokens, a constant) or, for a step
longer than :data:`MAX_UNROLLED`, the runtime loop: the same arithmetic (under the interpreter the
same bits; compiled, the unrolled code may contract other products into FMAs), or with a scalar decay
the lazy body (``LaunchConfig.lazy``: :func:`_lazy_token`, float32 sums in another order). Programs own disjoint tiles and read a tile whole before writing it: the
in-place op is safe. The grid is ``min(tiles, SMs x persistent)``, balanced so that every program
runs the same number of tiles within one.

sm_90 with Triton 3.9 (ahead of time, 2026-12-05; the H200 runs 3.6: its counts differ, the sweep
prints them), Qwen3-Next, 16 columns x 1 warp, two stages: the state tile, q / k and v go by
``cp.async`` (64 copies a tile at T = 4), g / beta by plain loads; 3,456 instructions a tile at T = 4
(the one-program-a-tile body: ~2,870, 592 a token), 6,200 at T = 8; ptxas' registers swing with the
token count (182 / 251 / 177 / 255 at T = 1 / 2 / 4 / 8, a few spilled words at 8): hence
``LaunchConfig.max_registers`` (168: 12 programs an SM, 24-96 spilled bytes). The lazy body
(:func:`_lazy_token`) takes 3,256 / 5,824 at T = 4 / 8. Unbounded, the tile loop hoisted 64-bit row
offsets of the state's load and store (205 registers at T = 1, no pipeline): :func:`_offsets`.
"""

from __future__ import annotations

import functools

import torch

from kda_inductor.lowerings._triton import tl, triton

MAX_UNROLLED = 8
"""The most tokens unrolled (loads at the tile loop's top level, where the pipeliner sees them)."""
LAZY_FLOOR = 2.0 ** -40
"""The lazy body's decay since the tile's last rescaling at the least (:func:`_lazy_token`)."""
INTERPRETER_SMS = 3
"""The "SMs" a launch on CPU tensors (the interpreter) counts: few programs, several tiles each."""

if triton is not None:
    _FLOOR = tl.constexpr(LAZY_FLOOR)

    from kda_inductor.lowerings._gdn_token import add3 as _add3
    from kda_inductor.lowerings._gdn_token import load_token as _load_token
    from kda_inductor.lowerings._gdn_token import sequential as _sequential
    from kda_inductor.lowerings._gdn_token import token as _token
    from kda_inductor.lowerings._gdn_window import add2 as _add2

    @triton.jit
    def _offsets(rk, rv, s_k, s_v):
        """A tile's element offsets within its ``[K, V]`` matrix, in int32 (so that what the tile
        loop hoists out of itself, ``rk * s_k``, is one 32-bit register a row, not a 64-bit one a
        row per pointer: the state's load and store share them when their strides are equal)."""
        return rk[:, None] * s_k + rv[None, :] * s_v

    @triton.jit
    def _unrolled(S, q_row, k_row, v_row, g_row, b_row, o_row, T, HV, V, rk, kmask, vmask, scale, eps, sq_t, sk_t,
                  sv_t, sg_t, sb_t, sq_k, sk_k, sg_k, TT: tl.constexpr, PER_CHANNEL: tl.constexpr,
                  L2NORM: tl.constexpr, SCALED: tl.constexpr):
        """``TT`` tokens through the tile, unrolled (every token's loads in the tile loop's body)."""
        for t in tl.static_range(TT):
            q, k, v, g, beta = _load_token(q_row, k_row, v_row, g_row, b_row, t, T, rk, kmask, vmask, sq_t, sk_t,
                                           sv_t, sg_t, sb_t, sq_k, sk_k, sg_k, PER_CHANNEL)
            S, o = _token(S, q, k, v, g, beta, scale, eps, PER_CHANNEL, L2NORM, SCALED)
            tl.store(o_row + t * HV * V, o.to(o_row.dtype.element_ty), mask=vmask)
        return S

    @triton.jit
    def _lazy_token(S, c, q, k, v, beta, e, scale, eps, L2NORM: tl.constexpr):
        """One token through the tile held as ``S / c`` (the true tile is ``c S``, ``c`` the decay
        since the tile was last rescaled), from the raw ``q``, ``k`` (their norms are scalars, applied
        to the sums): ``c <- c e``; ``kv = c nk sum_K(S k)``, ``delta = (v - kv) beta``; ``S <- S + k
        (nk delta / c)`` (one FMA an element: no ``S e``); ``out = nq (c sum_K(S_old q) + (q . k) nk
        delta)`` (the spec's ``sum_K(S_new q)``). When ``c`` falls under ``LAZY_FLOOR`` the tile takes
        it (``S <- c S``, ``c <- 1``: ``1 / c`` stays under 2^40). Returns the tile, ``c``, ``out``."""
        qq, kk, qk = tl.reduce((q * q, k * k, q * k), 0, _add3)
        if L2NORM:
            nq, nk = tl.math.rsqrt(qq + eps) * scale, tl.math.rsqrt(kk + eps)
        else:
            nq, nk = scale + 0.0 * qq, 1.0 + 0.0 * kk
        c = c * e
        if c < _FLOOR:
            S = S * c
            c = 1.0 + 0.0 * c
        kv, oq = tl.reduce((S * k[:, None], S * q[:, None]), 0, _add2)
        delta = (v - kv * (c * nk)) * beta
        return S + k[:, None] * (delta * (nk / c))[None, :], c, (oq * c + qk * nk * delta) * nq

    @triton.jit
    def _unrolled_lazy(S, q_row, k_row, v_row, g_row, b_row, o_row, T, HV, V, rk, kmask, vmask, scale, eps, sq_t,
                       sk_t, sv_t, sg_t, sb_t, sq_k, sk_k, TT: tl.constexpr, L2NORM: tl.constexpr):
        """:func:`_unrolled` for a scalar decay through :func:`_lazy_token` (the tile held as ``S / c``;
        the true tile written)."""
        c = tl.full([], 1.0, tl.float32)
        for t in tl.static_range(TT):
            q, k, v, g, beta = _load_token(q_row, k_row, v_row, g_row, b_row, t, T, rk, kmask, vmask, sq_t, sk_t,
                                           sv_t, sg_t, sb_t, sq_k, sk_k, 0, False)
            S, c, o = _lazy_token(S, c, q, k, v, beta, tl.exp(g), scale, eps, L2NORM)
            tl.store(o_row + t * HV * V, o.to(o_row.dtype.element_ty), mask=vmask)
        return S * c

    @triton.jit
    def _one_tile(tile, q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, s_ptr, f_ptr, o_ptr, T, HV, K, V, GROUP, scale, eps,
                  sq_b, sq_t, sq_h, sq_k, sk_b, sk_t, sk_h, sk_k, sv_b, sv_t, sv_h, sv_v, sg_b, sg_t, sg_h, sg_k,
                  sb_b, sb_t, sb_h, ss_b, ss_h, ss_k, ss_v, sf_b, sf_h, sf_k, sf_v, KP: tl.constexpr,
                  BV: tl.constexpr, PER_CHANNEL: tl.constexpr, L2NORM: tl.constexpr, HAS_STATE: tl.constexpr,
                  SCALED: tl.constexpr, TT: tl.constexpr, SAME_STRIDES: tl.constexpr, LAZY: tl.constexpr):
        """Tile ``tile`` (``(b * HV + h) * nv + j``): its state read, its tokens run, written
        (``SAME_STRIDES``: the final state's strides are the initial state's)."""
        nv = tl.cdiv(V, BV)
        b, h, j = tile // nv // HV, tile // nv % HV, tile % nv
        rk, rv = tl.arange(0, KP), j * BV + tl.arange(0, BV)
        kmask, vmask = rk < K, rv < V
        b64, hk = b.to(tl.int64), h // GROUP
        q_row, k_row = q_ptr + b64 * sq_b + hk * sq_h, k_ptr + b64 * sk_b + hk * sk_h
        v_row, g_row = v_ptr + b64 * sv_b + h * sv_h + rv * sv_v, g_ptr + b64 * sg_b + h * sg_h
        b_row, o_row = b_ptr + b64 * sb_b + h * sb_h, o_ptr + (b64 * T * HV + h) * V + rv
        mask = kmask[:, None] & vmask[None, :]
        if HAS_STATE:
            S = tl.load(s_ptr + b64 * ss_b + h * ss_h + _offsets(rk, rv, ss_k, ss_v), mask=mask, other=0.0)
        else:
            S = tl.zeros((KP, BV), tl.float32)
        if TT > 0 and LAZY and not PER_CHANNEL:
            S = _unrolled_lazy(S, q_row, k_row, v_row, g_row, b_row, o_row, T, HV, V, rk, kmask, vmask, scale, eps,
                               sq_t, sk_t, sv_t, sg_t, sb_t, sq_k, sk_k, TT, L2NORM)
        elif TT > 0:
            S = _unrolled(S, q_row, k_row, v_row, g_row, b_row, o_row, T, HV, V, rk, kmask, vmask, scale, eps, sq_t,
                          sk_t, sv_t, sg_t, sb_t, sq_k, sk_k, sg_k, TT, PER_CHANNEL, L2NORM, SCALED)
        else:
            S = _sequential(S, q_row, k_row, v_row, g_row, b_row, o_row, T, HV, V, rk, kmask, vmask, scale, eps,
                            sq_t, sk_t, sv_t, sg_t, sb_t, sq_k, sk_k, sg_k, PER_CHANNEL, L2NORM, SCALED)
        f_row = f_ptr + b64 * sf_b + h * sf_h
        if SAME_STRIDES:
            tl.store(f_row + _offsets(rk, rv, ss_k, ss_v), S, mask=mask)
        else:
            tl.store(f_row + _offsets(rk, rv, sf_k, sf_v), S, mask=mask)

    def _tiles_body(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, s_ptr, f_ptr, o_ptr, n_tiles, T, HV, K, V, GROUP, scale, eps,
                    sq_b, sq_t, sq_h, sq_k, sk_b, sk_t, sk_h, sk_k, sv_b, sv_t, sv_h, sv_v, sg_b, sg_t, sg_h, sg_k,
                    sb_b, sb_t, sb_h, ss_b, ss_h, ss_k, ss_v, sf_b, sf_h, sf_k, sf_v,
                    KP: tl.constexpr, BV: tl.constexpr, PER_CHANNEL: tl.constexpr, L2NORM: tl.constexpr,
                    HAS_STATE: tl.constexpr, SCALED: tl.constexpr, TT: tl.constexpr, STAGES: tl.constexpr,
                    SAME_STRIDES: tl.constexpr = False, LAZY: tl.constexpr = False):
        """Program ``pid`` runs tiles ``pid, pid + P, ...`` (``P`` programs) in a pipelined loop of
        ``STAGES`` stages (the next tile's loads in flight while this one's tokens run)."""
        for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), num_stages=STAGES):
            _one_tile(tile, q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, s_ptr, f_ptr, o_ptr, T, HV, K, V, GROUP, scale, eps,
                      sq_b, sq_t, sq_h, sq_k, sk_b, sk_t, sk_h, sk_k, sv_b, sv_t, sv_h, sv_v, sg_b, sg_t, sg_h,
                      sg_k, sb_b, sb_t, sb_h, ss_b, ss_h, ss_k, ss_v, sf_b, sf_h, sf_k, sf_v, KP, BV, PER_CHANNEL,
                      L2NORM, HAS_STATE, SCALED, TT, SAME_STRIDES, LAZY)

    tiles_kernel = triton.jit(_tiles_body)


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """The device's SMs (cached; host-side, no sync: safe under graph capture); on CPU tensors
    (the interpreter) :data:`INTERPRETER_SMS`."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())


def grid_size(tiles: int, sms: int, per_sm: int) -> int:
    """Programs for ``tiles`` tiles at most ``sms * per_sm`` of them, balanced: ``ceil(tiles /
    programs)`` tiles each, as few programs as give that."""
    cap = max(1, sms * per_sm)
    rounds = -(-tiles // cap)
    return -(-tiles // rounds) if tiles else 0


def launch_tiles(q, k, v, g, beta, state, final, out, scale, use_qk_l2norm, eps, meta, cfg):
    """One launch of :data:`tiles_kernel` (the arguments as ``gdn_recurrent_step._launch``'s);
    returns the compiled kernel, None if nothing ran."""
    tiles = meta.batch * meta.v_heads * triton.cdiv(meta.v_dim, cfg.block_v)
    programs = grid_size(tiles, sm_count(v.device), cfg.persistent)
    if programs == 0:
        return None
    s = state if state is not None else final
    g_strides = g.stride() if meta.per_channel else (*g.stride(), 0)
    return tiles_kernel[(programs,)](
        q, k, v, g, beta, s, final, out, tiles, meta.tokens, meta.v_heads, meta.k_dim, meta.v_dim, meta.group,
        float(scale), float(eps), *q.stride(), *k.stride(), *v.stride(), *g_strides, *beta.stride(),
        *(state.stride() if state is not None else (0, 0, 0, 0)), *final.stride(),
        KP=max(16, triton.next_power_of_2(meta.k_dim)), BV=cfg.block_v, PER_CHANNEL=meta.per_channel,
        L2NORM=bool(use_qk_l2norm), HAS_STATE=state is not None, SCALED=bool(cfg.scaled),
        TT=meta.tokens if cfg.unroll and meta.tokens <= MAX_UNROLLED else 0, STAGES=cfg.num_stages,
        SAME_STRIDES=state is not None and state.stride() == final.stride(), LAZY=bool(cfg.lazy),
        num_warps=cfg.num_warps,
        maxnreg=cfg.max_registers or None)


def aot_variants():
    """Qwen3-Next's window (bf16 q / k / v / beta, float32 g, K = V = 128, l2norm, a state) at
    T = 1, 4 and 8 unrolled, 16 columns x 1 warp, two stages (T = 4 also held to 168 registers, and
    in place: the state's strides shared); Kimi's per-channel decay at T = 4; the runtime token loop
    (T past :data:`MAX_UNROLLED`); 32 x 4; the lazy body at T = 4 and 8 (168 registers); a float32
    step without l2norm or state (plain and lazy)."""
    from kda_inductor.lowerings import AotVariant

    names = ("q_ptr", "k_ptr", "v_ptr", "g_ptr", "b_ptr", "s_ptr", "f_ptr", "o_ptr")
    consts = ("KP", "BV", "PER_CHANNEL", "L2NORM", "HAS_STATE", "SCALED", "TT", "STAGES", "SAME_STRIDES", "LAZY")
    ints = [n for n in tiles_kernel.arg_names if n not in (*names, *consts, "scale", "eps")]
    bf16 = dict(zip(names, ("*bf16", "*bf16", "*bf16", "*fp32", "*bf16", "*fp32", "*fp32", "*bf16")),
                **dict.fromkeys(ints, "i32"), scale="fp32", eps="fp32")
    fp32 = {**bf16, **dict.fromkeys(names, "*fp32")}
    base = dict(KP=128, BV=16, PER_CHANNEL=False, L2NORM=True, HAS_STATE=True, SCALED=False, TT=4, STAGES=2,
                SAME_STRIDES=False, LAZY=False)
    one = {"num_warps": 1, "num_stages": 1}
    variants = ((bf16, base, one), (bf16, dict(base, TT=1), one), (bf16, dict(base, TT=8), one),
                (bf16, dict(base, SAME_STRIDES=True), {**one, "maxnreg": 168}),
                (bf16, dict(base, PER_CHANNEL=True), one),
                (bf16, dict(base, TT=0), one), (bf16, dict(base, BV=32), {**one, "num_warps": 4}),
                (bf16, dict(base, LAZY=True), one), (bf16, dict(base, LAZY=True, TT=8), {**one, "maxnreg": 168}),
                (fp32, dict(base, L2NORM=False, HAS_STATE=False, TT=2, LAZY=True), one),
                (fp32, dict(base, L2NORM=False, HAS_STATE=False, TT=2), one))
    for types, consts_, options in variants:
        yield AotVariant(tiles_kernel, types, consts_, options)
