"""``kda::gdn_recurrent_step`` and ``kda::gdn_recurrent_step_inplace``: the gated delta rule's
recurrence over a few tokens (decode T = 1, a spec-decode verify window up to 8) continuing a
float32 state, as transformers' ``torch_recurrent_gated_delta_rule`` (Qwen3-Next, Qwen3.5,
OLMo-hybrid) and ``recurrent_kimi_delta_attention`` (Kimi Linear, decay per key channel) write it
as a Python loop over the tokens.

``kda::gdn_recurrent_step(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, eps=1e-6,
out_dtype=None) -> (out, final_state)``; ``kda::gdn_recurrent_step_inplace(q, k, v, g, beta,
state, scale, use_qk_l2norm, eps=1e-6, out_dtype=None) -> out`` reads ``state`` as the initial
state and overwrites it with the final one (called through ``auto_functionalized``, which
Inductor re-inplaces). Per value head ``h`` (key head ``h // (Hv // Hk)``: repeat_interleave's
grouping, read by index, never repeated) and token ``t``, in float32 (``S [K, V]``)::

    if use_qk_l2norm: q = q * rsqrt(sum(q * q) + eps); k = k * rsqrt(sum(k * k) + eps)
    q = q * scale
    S = S * exp(g_t)                      # g_t a scalar (GDN) or one value per key row (KDA)
    kv = sum_K(S * k[:, None]); delta = (v - kv) * beta_t
    S = S + k[:, None] * delta[None, :]
    out_t = sum_K(S * q[:, None])

* ``q``, ``k``: ``[B, T, Hk, K]``; ``v``: ``[B, T, Hv, V]``, ``Hv % Hk == 0``; any strides (the
  token-major views of a projection's split, or transposed head-major tensors: read by strides,
  no copy); any float dtype, read as float32.
* ``g``: ``[B, T, Hv]`` (scalar decay) or ``[B, T, Hv, K]`` (per key channel), log-space;
  ``beta``: ``[B, T, Hv]``.
* ``initial_state`` / ``state`` / ``final_state``: float32 ``[B, Hv, K, V]`` (``initial_state``
  None: zeros; any strides). ``out``: contiguous ``[B, T, Hv, V]`` in ``out_dtype`` (None:
  ``v.dtype``).

The CPU kernel is that loop in plain float32 torch (:func:`reference_step`, the spec). The CUDA
kernel (:func:`step_triton`) is one Triton launch: program ``(b, h, j)`` holds the float32 tile
``S[b, h, :, j * BV : (j + 1) * BV]`` in registers, read once and written once, and runs every
token through it, the next token's inputs loaded before this one's reductions. Per token: one
reduction over ``q``'s and ``k``'s ``K`` values (``q . q``, ``k . k``, ``q . k`` together) and
one over the tile (two sums together, ``tl.reduce`` of a pair), by the identity

    out_t = sum_K(S_old * (e * q)) + (q . k) * delta,   kv = sum_K(S_old * (e * k))

(``e = exp(g_t)``, ``S_new = S_old * e + k delta``): exactly the spec's ``sum_K(S_new * q)``,
rounded otherwise (float32 sums in another order: within ~1e-6 relative of the loop, as any
reduction order; ``tests/test_lowering_gdn_recurrent_step.py``). The in-place variant reads its
whole tile before it writes it, and programs own disjoint tiles, so ``state`` may be read and
written by the one launch. No host sync, no allocation but the outputs, safe under CUDA-graph
capture; the launch configuration (``BV`` columns per program, warps, the body) comes from a fixed
table by (tokens, ``B * Hv``) class (:data:`LAUNCH_TABLE`, each row measured on an H200 or marked
provisional; no run-time autotuning: CUDA graphs and reproducibility). The window body
(:mod:`._gdn_window`, the chunk form: every token's q / k / v / g / beta loaded once per tile as
``[TP, ...]`` blocks, the tile read by ``T`` independent sums and updated once) is a launch option
(``LaunchConfig(window=True)``), not in the table: an H100 timed it slower than the token-by-token
body at T = 4 (:data:`LAUNCH_TABLE`); the persistent body (:mod:`._gdn_tiles`) is another. (Its tile
products on tensor cores, 1.6-5.9x slower at every case an H100 timed, are gone:
``benchmarks/results/gdn_recurrent_step_window_dot.md``, ``docs/speed-rules.md``.) For
sm_90 (unit strides specialized: 16-byte tile loads and stores) the token-by-token body does not spill:
K = V = 128, Triton 3.6, 16 columns x 1 warp take 127 registers for T = 1 and 165 for T > 1 (4 / 2
barriers a token), 64 x 4 125 / 168 (13 / 14) (``tests/aot_sm90.py --as-launched --registers gdn_recurrent_step``,
2026-12-06, Triton 3.6: T = 1 16 x 1 126, 64 x 4 124, no spills; its strides as plain ints: 248 / 255 with 536 stack
bytes); the window body's are with :data:`LAUNCH_TABLE`. The ``SCALED`` body
(:func:`._gdn_token._update_scaled`, a launch option the sweep times) has two fewer conversions a token.

Every argument is checked by :func:`validate` (also the pattern's check), each bad one an error
naming it; a rejected call leaves ``state`` untouched.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from kda_inductor.lowerings import arg_error as _err
from kda_inductor.lowerings import check_tensor, definitely
from kda_inductor.lowerings._gdn_tiles import launch_tiles
from kda_inductor.lowerings._triton import tl, triton

__all__ = ["MAX_K", "LaunchConfig", "StepMeta", "gdn_recurrent_step", "gdn_recurrent_step_inplace",
           "launch_config", "reference_step", "step_triton", "validate"]

MAX_K = 256
"""The largest key head dim: a program holds every key row of its tile (Qwen3-Next, Qwen3.5 and
Kimi Linear have 128, OLMo-hybrid 96)."""
_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


class StepMeta(NamedTuple):
    """The geometry :func:`validate` returns."""

    batch: int
    tokens: int
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    per_channel: bool
    """``g`` holds one decay per key channel (``[B, T, Hv, K]``, Kimi's KDA)."""

    @property
    def group(self) -> int:
        """Value heads per key head."""
        return self.v_heads // self.k_heads


# --------------------------------------------------------------------------------------
# validation (the ops, their fake impls, the launcher and the pattern)
# --------------------------------------------------------------------------------------
def _differ(a, b) -> bool:
    """``a != b`` for sure (symbolic sizes that may be equal are left to the real call)."""
    return definitely(a != b)


def _check_float(x, arg: str, dims: tuple[int, ...]) -> None:
    check_tensor(x, arg)
    if x.dim() not in dims or x.dtype not in _FLOATS:
        want = " or ".join(f"{d}-D" for d in dims)
        raise _err(arg, f"expected a {want} floating-point tensor, got {x.dim()}-D {x.dtype}")


def check_sizes(x, arg: str, want: list, names: str) -> None:
    """``x.shape`` must be ``want`` (``names`` spells the expected shape in words)."""
    if len(x.shape) != len(want) or any(_differ(a, b) for a, b in zip(x.shape, want)):
        raise _err(arg, f"expected {names} = {list(want)}, got {list(x.shape)}")


def check_qkv(q, k, v) -> tuple:
    """``q``, ``k [B, T, Hk, K]``, ``v [B, T, Hv, V]`` with ``Hv % Hk == 0``; their sizes."""
    for x, arg in ((q, "q"), (k, "k"), (v, "v")):
        _check_float(x, arg, (4,))
    B, T, Hk, K = q.shape
    check_sizes(k, "k", list(q.shape), "q's shape [B, T, Hk, K]")
    if _differ(v.shape[0], B) or _differ(v.shape[1], T):
        raise _err("v", f"expected [B, T, Hv, V] with q's B = {B} and T = {T}, got {list(v.shape)}")
    Hv, V = v.shape[2], v.shape[3]
    if definitely(Hk < 1) or (not definitely(Hk < 1) and definitely(Hv % Hk != 0)):
        raise _err("v", f"its {Hv} heads are not a multiple of q / k's {Hk} heads (grouped heads: Hv % Hk == 0)")
    if isinstance(K, int) and not 1 <= K <= MAX_K:
        raise _err("k", f"head dim K must be in [1, {MAX_K}] (a program holds every key row), got {K}")
    return B, T, Hk, K, Hv, V


def check_gates(g, beta, B, T, Hv, K) -> bool:
    """``g [B, T, Hv]`` or ``[B, T, Hv, K]``, ``beta [B, T, Hv]``; whether ``g`` is per channel."""
    _check_float(g, "g", (3, 4))
    want = [B, T, Hv] + ([K] if g.dim() == 4 else [])
    check_sizes(g, "g", want, "[B, T, Hv] (a decay per head) or [B, T, Hv, K] (per key channel)" if g.dim() == 3
                 else "[B, T, Hv, K] (a decay per key channel) or [B, T, Hv] (per head)")
    _check_float(beta, "beta", (3,))
    check_sizes(beta, "beta", [B, T, Hv], "[B, T, Hv]")
    return g.dim() == 4


def _check_state(state, arg: str, B, Hv, K, V) -> None:
    check_tensor(state, arg)
    if state.dtype != torch.float32:
        raise _err(arg, f"expected a float32 state [B, Hv, K, V], got {state.dtype}")
    check_sizes(state, arg, [B, Hv, K, V], "[B, Hv, K, V]")


def _check_number(x, arg: str, what: str, ok) -> None:
    """``x`` a Python int or float (a TypeError otherwise) with ``ok(x)`` (a ValueError otherwise)."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        raise _err(arg, f"expected {what}, got {x!r}", TypeError)
    if not ok(x):
        raise _err(arg, f"expected {what}, got {x!r}")


def check_scalars(scale, use_qk_l2norm, eps, out_dtype) -> None:
    _check_number(scale, "scale", "a finite float", math.isfinite)
    _check_number(eps, "eps", "a finite float >= 0", lambda e: math.isfinite(e) and e >= 0)
    if not isinstance(use_qk_l2norm, bool):
        raise _err("use_qk_l2norm", f"expected a bool, got {type(use_qk_l2norm).__name__}", TypeError)
    if out_dtype is not None and out_dtype not in _FLOATS:
        raise _err("out_dtype", f"expected None or a floating-point dtype, got {out_dtype}")


def validate(q, k, v, g, beta, state=None, scale=1.0, use_qk_l2norm=False, eps=1e-6, out_dtype=None, *,
             state_arg: str = "initial_state") -> StepMeta:
    """The ops' one validator (sync-free: shapes, dtypes, devices), each bad argument an error
    naming it; returns the geometry. ``state_arg`` names the state in errors (``state`` for the
    in-place op). Symbolic sizes are checked where the answer is known at trace time."""
    B, T, Hk, K, Hv, V = check_qkv(q, k, v)
    per_channel = check_gates(g, beta, B, T, Hv, K)
    if state is not None:
        _check_state(state, state_arg, B, Hv, K, V)
    check_scalars(scale, use_qk_l2norm, eps, out_dtype)
    for t, arg in ((k, "k"), (v, "v"), (g, "g"), (beta, "beta"), (state, state_arg)):
        if t is not None and t.device != q.device:
            raise _err(arg, f"expected device {q.device} (q's), got {t.device}")
    return StepMeta(B, T, Hk, Hv, K, V, per_channel)


def _new_output(v: Tensor, meta: StepMeta, out_dtype) -> Tensor:
    """``out [B, T, Hv, V]``: contiguous, in ``out_dtype`` (None: ``v``'s)."""
    return v.new_empty((meta.batch, meta.tokens, meta.v_heads, meta.v_dim), dtype=out_dtype or v.dtype)


def _new_outputs(v: Tensor, meta: StepMeta, out_dtype) -> tuple[Tensor, Tensor]:
    """``out`` and a float32 final state ``[B, Hv, K, V]``."""
    return _new_output(v, meta, out_dtype), v.new_empty((meta.batch, meta.v_heads, meta.k_dim, meta.v_dim),
                                                        dtype=torch.float32)


# --------------------------------------------------------------------------------------
# CPU: the token loop in float32 torch (the spec)
# --------------------------------------------------------------------------------------
def _heads(x: Tensor, group: int) -> Tensor:
    """``x [B, T, Hk, K]`` as float32 ``[B, T, Hv, K]`` (each key head serving ``group``
    consecutive value heads)."""
    return x.float().repeat_interleave(group, dim=2) if group > 1 else x.float()


def reference_step(q, k, v, g, beta, state, scale, use_qk_l2norm, eps=1e-6) -> tuple[Tensor, Tensor]:
    """The recurrence in float32 torch, token by token: float32 ``out [B, T, Hv, V]`` and the
    final state (a new tensor; ``state`` None: zeros). Arguments as the ops' (unchecked)."""
    group = v.shape[2] // q.shape[2]
    q, k = _heads(q, group), _heads(k, group)
    B, T, Hv, V = v.shape
    if state is None:
        S = v.new_zeros((B, Hv, q.shape[-1], V), dtype=torch.float32)
    else:  # a new contiguous state, as the fake says, whatever the initial state's strides
        S = state.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    out = v.new_empty((B, T, Hv, V), dtype=torch.float32)
    for t in range(T):
        qt, kt = q[:, t], k[:, t]
        if use_qk_l2norm:
            qt = qt * torch.rsqrt((qt * qt).sum(-1, keepdim=True) + eps)
            kt = kt * torch.rsqrt((kt * kt).sum(-1, keepdim=True) + eps)
        qt = qt * scale
        decay = g[:, t].float().exp()
        S = S * (decay[..., None] if g.dim() == 4 else decay[..., None, None])
        kv = (S * kt[..., None]).sum(-2)
        delta = (v[:, t].float() - kv) * beta[:, t].float()[..., None]
        S = S + kt[..., None] * delta[..., None, :]
        out[:, t] = (S * qt[..., None]).sum(-2)
    return out, S


# --------------------------------------------------------------------------------------
# custom ops
# --------------------------------------------------------------------------------------
@torch.library.custom_op("kda::gdn_recurrent_step", mutates_args=(), device_types="cpu")
def gdn_recurrent_step(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor | None,
                       scale: float, use_qk_l2norm: bool, eps: float = 1e-6,
                       out_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """The recurrence over ``q``'s tokens from ``initial_state`` (None: zeros): ``(out, final_state)``
    (the module docstring)."""
    validate(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, eps, out_dtype)
    out, final = reference_step(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, eps)
    return out.to(out_dtype or v.dtype), final


@gdn_recurrent_step.register_fake
def _gdn_recurrent_step_fake(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, eps=1e-6, out_dtype=None):
    meta = validate(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, eps, out_dtype)
    return _new_outputs(v, meta, out_dtype)


@torch.library.custom_op("kda::gdn_recurrent_step_inplace", mutates_args=("state",), device_types="cpu")
def gdn_recurrent_step_inplace(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                               scale: float, use_qk_l2norm: bool, eps: float = 1e-6,
                               out_dtype: torch.dtype | None = None) -> Tensor:
    """The recurrence continuing ``state``, which it overwrites with the final state; returns ``out``."""
    validate(q, k, v, g, beta, state, scale, use_qk_l2norm, eps, out_dtype, state_arg="state")
    out, final = reference_step(q, k, v, g, beta, state, scale, use_qk_l2norm, eps)
    state.copy_(final)
    return out.to(out_dtype or v.dtype)


@gdn_recurrent_step_inplace.register_fake
def _gdn_recurrent_step_inplace_fake(q, k, v, g, beta, state, scale, use_qk_l2norm, eps=1e-6, out_dtype=None):
    meta = validate(q, k, v, g, beta, state, scale, use_qk_l2norm, eps, out_dtype, state_arg="state")
    return _new_output(v, meta, out_dtype)


@gdn_recurrent_step.register_kernel("cuda")
def _gdn_recurrent_step_cuda(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, eps=1e-6, out_dtype=None):
    meta = validate(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, eps, out_dtype)
    out, final = _new_outputs(v, meta, out_dtype)
    _launch(q, k, v, g, beta, initial_state, final, out, scale, use_qk_l2norm, eps, meta)
    return out, final


@gdn_recurrent_step_inplace.register_kernel("cuda")
def _gdn_recurrent_step_inplace_cuda(q, k, v, g, beta, state, scale, use_qk_l2norm, eps=1e-6, out_dtype=None):
    meta = validate(q, k, v, g, beta, state, scale, use_qk_l2norm, eps, out_dtype, state_arg="state")
    out = _new_output(v, meta, out_dtype)
    _launch(q, k, v, g, beta, state, state, out, scale, use_qk_l2norm, eps, meta)
    return out


# --------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------
if triton is not None:
    from kda_inductor.lowerings._gdn_token import sequential as _sequential
    from kda_inductor.lowerings._gdn_window import window_tile as _window_tile

    @triton.jit
    def _program(V, HV, BV: tl.constexpr):
        """This program's sequence ``b``, value head ``h`` and column block ``j`` (the column
        blocks of one head run side by side: they read the same q / k)."""
        pid = tl.program_id(0)
        nv = tl.cdiv(V, BV)
        bh = pid // nv
        return bh // HV, bh % HV, pid % nv

    @triton.jit
    def _tile(ptr, b, h, rk, rv, s_b, s_h, s_k, s_v):
        """The addresses of the state tile ``[b, h, rk, rv]``."""
        base = ptr + b.to(tl.int64) * s_b + h.to(tl.int64) * s_h
        return base + rk[:, None] * s_k + rv[None, :] * s_v

    def _step_body(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, s_ptr, f_ptr, o_ptr, T, HV, K, V, GROUP, scale, eps,
                   sq_b, sq_t, sq_h, sq_k, sk_b, sk_t, sk_h, sk_k, sv_b, sv_t, sv_h, sv_v, sg_b, sg_t, sg_h, sg_k,
                   sb_b, sb_t, sb_h, ss_b, ss_h, ss_k, ss_v, sf_b, sf_h, sf_k, sf_v,
                   KP: tl.constexpr, BV: tl.constexpr, PER_CHANNEL: tl.constexpr, L2NORM: tl.constexpr,
                   HAS_STATE: tl.constexpr, SCALED: tl.constexpr = False, TP: tl.constexpr = 0):
        """Program ``(b, h, j)``: the state tile ``[b, h, :, j * BV : (j + 1) * BV]`` read once
        into registers (zeros without a state), the tokens run through it (``TP`` > 0: the window
        body, every token's inputs loaded at once, ``TP >= T`` rows; else token by token), written once."""
        b, h, j = _program(V, HV, BV)
        rk = tl.arange(0, KP)
        rv = j * BV + tl.arange(0, BV)
        kmask, vmask = rk < K, rv < V
        b64, hk = b.to(tl.int64), h // GROUP
        q_row, k_row = q_ptr + b64 * sq_b + hk * sq_h, k_ptr + b64 * sk_b + hk * sk_h
        v_base, g_row = v_ptr + b64 * sv_b + h * sv_h, g_ptr + b64 * sg_b + h * sg_h
        b_row, o_row = b_ptr + b64 * sb_b + h * sb_h, o_ptr + (b64 * T * HV + h) * V + rv
        mask = kmask[:, None] & vmask[None, :]
        if HAS_STATE:
            S = tl.load(_tile(s_ptr, b, h, rk, rv, ss_b, ss_h, ss_k, ss_v), mask=mask, other=0.0)
        else:
            S = tl.zeros((KP, BV), tl.float32)
        if TP > 0:
            S = _window_tile(S, q_row, k_row, v_base, g_row, b_row, o_row, T, HV, V, rk, rv, kmask, vmask, scale,
                             eps, sq_t, sk_t, sv_t, sv_v, sg_t, sb_t, sq_k, sk_k, sg_k, TP, PER_CHANNEL, L2NORM)
        else:
            S = _sequential(S, q_row, k_row, v_base + rv * sv_v, g_row, b_row, o_row, T, HV, V, rk, kmask, vmask,
                            scale, eps, sq_t, sk_t, sv_t, sg_t, sb_t, sq_k, sk_k, sg_k, PER_CHANNEL, L2NORM,
                            SCALED)
        tl.store(_tile(f_ptr, b, h, rk, rv, sf_b, sf_h, sf_k, sf_v), S, mask=mask)

    _step_kernel = triton.jit(_step_body)


# --------------------------------------------------------------------------------------
# launch configuration: a fixed table (no run-time autotuning)
# --------------------------------------------------------------------------------------
class LaunchConfig(NamedTuple):
    block_v: int
    """State columns per program (``BV``, a power of two)."""
    num_warps: int
    num_stages: int = 1
    scaled: bool = False
    """The ``SCALED`` body for a scalar decay (``_update_scaled``: two layout conversions a token,
    not three; sm_90, Triton 3.6, K = 128, T > 1: 12 / 3 barriers a token at 4 / 1 warps, not 14 / 4,
    no spills). Untimed: off in the table, timed by the sweep; ignored for a per-channel decay."""
    window: bool = False
    """The window body for ``T > 1`` (:func:`_window`, the chunk form: every token's inputs loaded once,
    the tile read by ``T`` independent sums and updated once); ignored at ``T = 1``."""
    persistent: int = 0
    """Programs per SM of :mod:`._gdn_tiles`' persistent body (``num_stages``: its pipeline); 0: off."""
    unroll: bool = True
    """The persistent body's tokens unrolled (their loads pipelined too); False: the runtime loop."""
    max_registers: int = 0
    """Registers per thread at most (ptxas' ``maxnreg``: programs an SM); 0: ptxas' choice."""
    lazy: bool = False
    """The persistent body's unrolled tokens with a scalar decay holding the tile as ``S / c`` (one FMA
    an element a token for the update, not two: ``._gdn_tiles._lazy_token``); ignored for KDA."""


class TableRow(NamedTuple):
    """One class of the launch table: steps of ``tokens`` (first, last) over ``heads`` state matrices
    (``B * Hv``: first, last; None unbounded), the launch, and its measurement (None: provisional, not
    yet measured on a GPU: ``bench_gdn_recurrent_step.py --verify --candidates`` times it)."""

    tokens: tuple[int, int]
    heads: tuple[int, int | None]
    config: LaunchConfig
    measured: str | None


SMALL_HEADS = 512
"""At most this many ``B * Hv`` state matrices (B <= 16 at 32 value heads): a small-batch class."""
LAUNCH_TABLE = (
    TableRow((1, 1), (1, SMALL_HEADS), LaunchConfig(16, 1), "H200 2026-12-03 (bf322d0): B 1 4.2 us, B 8 10.8"),
    TableRow((1, 1), (SMALL_HEADS + 1, None), LaunchConfig(64, 4), "H200 2026-12-03: B 32 37.7, B 128 135.7 us"),
    TableRow((2, 8), (1, SMALL_HEADS), LaunchConfig(16, 1),
             "H100 2026-12-05 21:28 (6136ae3): B 1 T 2 / 4 / 8 4.66 / 6.05 / 8.83 us (floor 1.4; FLA 15.1 / 18.0 / 23.7)"),
    TableRow((2, 8), (SMALL_HEADS + 1, None), LaunchConfig(16, 1, max_registers=128),
             "H100 2026-12-05 21:28 (6136ae3): T 4, B 32 58.8, B 128 203.8 us (floor 45.2 / 180.6; FLA 91.1 / 317.2; "
             "without the register bound 64.8 / 240.5)"),
)
"""The fixed launch table (no run-time autotuning: CUDA graphs and reproducibility) at Qwen3-Next's
dims (K = V = 128), by class. Measured rows name their run. ``T > 1`` from 32 sequences bounds the
token-by-token body at 128 registers a thread (more programs an SM: the state tiles' loads of one
program overlap another's token math): on an H100 (2026-12-05 21:28, 6136ae3, ``--verify``), T 2 / 4 /
8 at B 32: 53.5 / 58.8 / 76.8 us against 55.3 / 64.8 / 87.2 without the bound, at B 128 203.0 / 203.8 /
268.1 against 211.6 / 240.5 / 315.9 (KDA alike: T 4 63.2 / 219.2 against 68.8 / 256.5); the
persistent body (:mod:`._gdn_tiles`) was slower than both at every B >= 32 (T 4, B 128: 264.5-386.6),
and at T = 1 the 64 x 4 launch stays ahead (184.2 us at B 128 against 203.0 bounded). The window body: on an H100 (2026-12-05, ``bench_gdn_recurrent_step.py --verify``,
``benchmarks/results/gdn_recurrent_step_verify.json``), Qwen3-Next T = 4, the window body (16 x 1)
took 70.0 / 255.7 us at B 32 / 128 against the token-by-token body's 65.5 / 242.7 (16 x 1), 64.4 /
237.4 (16 x 1, scaled) and 67.4 / 229.2 (64 x 4), floor 45.6 / 182.5, FLA 91.4 / 318.8; so the
window body stays a candidate (``LaunchConfig(window=True)``), not a default. Its launches were
chosen by the fewest warp-instructions per state column in the sm_90 SASS
(Triton 3.9, 2026-12-05, the kernel of this commit; the H200 runs 3.6, whose counts differ), the
token-by-token body ~400 at T = 4 (its loop body times 4). Window, scalar decay, instructions per
column (registers; spill instructions; barriers where many): TP 2: 16 x 1 146 (177), 8 x 1 184
(128); TP 4: 16 x 1 242 (168; 173), 8 x 1 312 (168), 16 x 2 326 (188; 107 barriers), 32 x 4 332
(138; 149 barriers); TP 8: 16 x 1 468 (255; 274), 8 x 1 655 (255; 86), 16 x 4 1190 (156; 301
barriers). KDA, TP 4: 16 x 1 271 (255; 138), 16 x 2 334 (210; 65 barriers), 8 x 1 363 (208)."""
MAX_WINDOW = 8
"""The most tokens the window body takes (its ``[TP, K]`` blocks live in registers): a longer step
(the op called directly) runs token by token at its class's launch."""
MIN_BLOCK_V = 8
"""32 bytes per key row: one DRAM sector."""
TABLE_KP = 128
"""The key dim the table was measured at (Qwen3-Next, Qwen3.5, Kimi Linear; OLMo-hybrid's 96 pads
to it). Other ``KP``: the columns scaled by ``TABLE_KP / KP`` (the same state values per thread;
not measured)."""


def table_row(heads: int, tokens: int) -> TableRow:
    """The class of a step of ``tokens`` over ``heads`` state matrices (``tokens`` past the table:
    its last row's)."""
    t = max(1, min(int(tokens), LAUNCH_TABLE[-1].tokens[1]))
    return next(r for r in LAUNCH_TABLE if r.tokens[0] <= t <= r.tokens[1] and r.heads[0] <= max(1, int(heads))
                and (r.heads[1] is None or heads <= r.heads[1]))


def launch_config(batch: int, v_heads: int, k_dim: int, v_dim: int, tokens: int = 1) -> LaunchConfig:
    """The launch of :data:`LAUNCH_TABLE`'s class for this step: columns no wider than ``V`` (a
    power of two), scaled by ``TABLE_KP / KP`` for other key dims."""
    kp = max(16, triton.next_power_of_2(int(k_dim)))
    cfg = table_row(int(batch) * int(v_heads), tokens).config
    widest = max(MIN_BLOCK_V, triton.next_power_of_2(max(int(v_dim), 1)))
    bv = min(max(MIN_BLOCK_V, cfg.block_v * TABLE_KP // kp), widest)
    return cfg._replace(block_v=bv, window=cfg.window and int(tokens) <= MAX_WINDOW)


def _window_rows(cfg: LaunchConfig, tokens: int) -> int:
    """The window body's block rows ``TP``, the tokens padded to a power of two (0: token by token)."""
    if not cfg.window or not 1 < tokens <= MAX_WINDOW:
        return 0
    return triton.next_power_of_2(int(tokens))


def _launch(q, k, v, g, beta, state, final, out, scale, use_qk_l2norm, eps, meta: StepMeta,
            config: LaunchConfig | None = None):
    """One launch of :data:`_step_kernel` on validated arguments (``state`` None: zeros; ``final``
    may be ``state`` itself: the in-place op). Returns what Triton's launch returns (the compiled
    kernel: its ``n_regs`` / ``n_spills`` for the benchmark's sweep), None if nothing ran."""
    if triton is None:  # pragma: no cover
        raise RuntimeError("gdn_recurrent_step: the Triton kernel needs triton, which is not installed")
    cfg = config or launch_config(meta.batch, meta.v_heads, meta.k_dim, meta.v_dim, meta.tokens)
    if cfg.persistent:
        return launch_tiles(q, k, v, g, beta, state, final, out, scale, use_qk_l2norm, eps, meta, cfg)
    tp = _window_rows(cfg, meta.tokens)
    kp = max(16, triton.next_power_of_2(meta.k_dim))
    programs = meta.batch * meta.v_heads * triton.cdiv(meta.v_dim, cfg.block_v)
    if programs == 0:
        return None
    s = state if state is not None else final
    g_strides = g.stride() if meta.per_channel else (*g.stride(), 0)
    return _step_kernel[(programs,)](
        q, k, v, g, beta, s, final, out, meta.tokens, meta.v_heads, meta.k_dim, meta.v_dim, meta.group,
        float(scale), float(eps), *q.stride(), *k.stride(), *v.stride(), *g_strides, *beta.stride(),
        *(state.stride() if state is not None else (0, 0, 0, 0)), *final.stride(),
        KP=kp, BV=cfg.block_v, PER_CHANNEL=meta.per_channel,
        L2NORM=bool(use_qk_l2norm), HAS_STATE=state is not None, SCALED=bool(cfg.scaled),
        TP=tp, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        maxnreg=cfg.max_registers or None,
    )


def step_triton(q, k, v, g, beta, state=None, scale=1.0, use_qk_l2norm=False, eps=1e-6, out_dtype=None, *,
                inplace: bool = False, out: Tensor | None = None, config: LaunchConfig | None = None):
    """The Triton kernel on checked arguments (what the CUDA impls launch; also on CPU tensors
    under ``TRITON_INTERPRET=1``): ``(out, final_state)``; ``inplace``: ``state`` is overwritten
    and returned as the final state. ``out``: a contiguous ``[B, T, Hv, V]`` to write (default
    a new one); ``config``: the launch (default :func:`launch_config`)."""
    meta = validate(q, k, v, g, beta, state, scale, use_qk_l2norm, eps, out_dtype,
                    state_arg="state" if inplace else "initial_state")
    if inplace and state is None:
        raise _err("state", "the in-place step needs a state to overwrite, got None")
    want = _new_output(v, meta, out.dtype if out is not None else out_dtype)
    if out is None:
        out = want
    elif out.shape != want.shape or not out.is_contiguous() or out.device != v.device:
        raise _err("out", f"expected a contiguous {list(want.shape)} on {v.device}, got {list(out.shape)} "
                   f"strides {out.stride()}")
    final = state if inplace else _new_outputs(v, meta, None)[1]
    _launch(q, k, v, g, beta, state, final, out, scale, use_qk_l2norm, eps, meta, config)
    return out, final


def aot_variants():
    """The launches to compile ahead of time for sm_90: Qwen3-Next's decode (bf16 q / k / v and
    beta, float32 g, K = 128, scalar decay, l2norm, a state) at the table's two T = 1 configs and in
    the ``SCALED`` body, Kimi's per-channel decay, a float32 step without l2norm or state, K = 256,
    and each window class of the table (scalar and per-channel decay; one without l2norm or state)."""
    from kda_inductor.lowerings import AotVariant

    names = ("q_ptr", "k_ptr", "v_ptr", "g_ptr", "b_ptr", "s_ptr", "f_ptr", "o_ptr")
    ints = ("T", "HV", "K", "V", "GROUP", "sq_b", "sq_t", "sq_h", "sq_k", "sk_b", "sk_t", "sk_h", "sk_k", "sv_b",
            "sv_t", "sv_h", "sv_v", "sg_b", "sg_t", "sg_h", "sg_k", "sb_b", "sb_t", "sb_h", "ss_b", "ss_h", "ss_k",
            "ss_v", "sf_b", "sf_h", "sf_k", "sf_v")
    bf16 = dict(zip(names, ("*bf16", "*bf16", "*bf16", "*fp32", "*bf16", "*fp32", "*fp32", "*bf16")),
                **dict.fromkeys(ints, "i32"), scale="fp32", eps="fp32")
    fp32 = {**bf16, **dict.fromkeys(names, "*fp32")}
    big = dict(KP=128, BV=64, PER_CHANNEL=False, L2NORM=True, HAS_STATE=True, SCALED=False, TP=0)
    small = dict(big, BV=16)
    variants = ((bf16, big, 4), (bf16, small, 1), (bf16, dict(small, SCALED=True), 1),
                (bf16, dict(big, SCALED=True), 4), (bf16, dict(big, PER_CHANNEL=True), 4),
                (fp32, dict(small, L2NORM=False, HAS_STATE=False), 1), (bf16, dict(big, KP=256, BV=32), 4),
                *((bf16, dict(big, BV=row.config.block_v, TP=triton.next_power_of_2(row.tokens[1]), PER_CHANNEL=pc),
                   row.config.num_warps) for row in LAUNCH_TABLE if row.config.window for pc in (False, True)),
                (fp32, dict(small, L2NORM=False, HAS_STATE=False, TP=4), 1))
    for types, consts, warps in variants:
        yield AotVariant(_step_kernel, types, consts, {"num_warps": warps, "num_stages": 1},
                         _aot_launch(consts["TP"] or 1, consts["KP"], consts["PER_CHANNEL"]))


def _aot_launch(t: int, k: int, per_channel: bool) -> dict:
    """The integers of a launch on contiguous Qwen3-Next-shaped tensors (32 sequences, 16 q / k heads,
    32 value heads, V = 128; ``t`` tokens, ``k`` keys) for ``aot_sm90.py --as-launched``."""
    b, h, hv, v = 32, 16, 32, 128
    g = (t * hv * k, hv * k, k, 1) if per_channel else (t * hv, hv, 1, 0)
    return dict(zip(("T", "HV", "K", "V", "GROUP", "sq_b", "sq_t", "sq_h", "sq_k", "sk_b", "sk_t", "sk_h", "sk_k",
                     "sv_b", "sv_t", "sv_h", "sv_v", "sg_b", "sg_t", "sg_h", "sg_k", "sb_b", "sb_t", "sb_h", "ss_b",
                     "ss_h", "ss_k", "ss_v", "sf_b", "sf_h", "sf_k", "sf_v"),
                    (t, hv, k, v, hv // h, t * h * k, h * k, k, 1, t * h * k, h * k, k, 1, t * hv * v, hv * v, v, 1,
                     *g, t * hv, hv, 1, hv * k * v, k * v, v, 1, hv * k * v, k * v, v, 1)))
