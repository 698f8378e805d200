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
kernel (:func:`step_triton`; not in this first commit: CPU and fake impls only) is one Triton launch: program ``(b, h, j)`` holds the float32 tile
``S[b, h, :, j * BV : (j + 1) * BV]`` in registers, read once and written once, and runs every
token through it. Per token it reduces ``S`` over ``K`` once, for two sums at a time
(``tl.reduce`` of a pair), by the identity

    out_t = sum_K(S_old * (e * q)) + (q . k) * delta,   kv = sum_K(S_old * (e * k))

(``e = exp(g_t)``, ``S_new = S_old * e + k delta``): exactly the spec's ``sum_K(S_new * q)``,
rounded otherwise (float32 sums in another order: within ~1e-6 relative of the loop, as any
reduction order; ``tests/test_lowering_gdn_recurrent_step.py``). The in-place variant reads its
whole tile before it writes it, and programs own disjoint tiles, so ``state`` may be read and
written by the one launch. No host sync, no allocation but the outputs, safe under CUDA-graph
capture; the launch configuration (``BV`` columns per program, warps) comes from a fixed table
(:func:`launch_config`; no run-time autotuning: CUDA graphs and reproducibility).

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
from kda_inductor.lowerings._triton import tl, triton

__all__ = ["MAX_K", "StepMeta", "gdn_recurrent_step", "gdn_recurrent_step_inplace", "reference_step", "validate"]

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


def _check_sizes(x, arg: str, want: list, names: str) -> None:
    """``x.shape`` must be ``want`` (``names`` spells the expected shape in words)."""
    if len(x.shape) != len(want) or any(_differ(a, b) for a, b in zip(x.shape, want)):
        raise _err(arg, f"expected {names} = {list(want)}, got {list(x.shape)}")


def _check_qkv(q, k, v) -> tuple:
    """``q``, ``k [B, T, Hk, K]``, ``v [B, T, Hv, V]`` with ``Hv % Hk == 0``; their sizes."""
    for x, arg in ((q, "q"), (k, "k"), (v, "v")):
        _check_float(x, arg, (4,))
    B, T, Hk, K = q.shape
    _check_sizes(k, "k", list(q.shape), "q's shape [B, T, Hk, K]")
    if _differ(v.shape[0], B) or _differ(v.shape[1], T):
        raise _err("v", f"expected [B, T, Hv, V] with q's B = {B} and T = {T}, got {list(v.shape)}")
    Hv, V = v.shape[2], v.shape[3]
    if definitely(Hk < 1) or (not definitely(Hk < 1) and definitely(Hv % Hk != 0)):
        raise _err("v", f"its {Hv} heads are not a multiple of q / k's {Hk} heads (grouped heads: Hv % Hk == 0)")
    if isinstance(K, int) and not 1 <= K <= MAX_K:
        raise _err("k", f"head dim K must be in [1, {MAX_K}] (a program holds every key row), got {K}")
    return B, T, Hk, K, Hv, V


def _check_gates(g, beta, B, T, Hv, K) -> bool:
    """``g [B, T, Hv]`` or ``[B, T, Hv, K]``, ``beta [B, T, Hv]``; whether ``g`` is per channel."""
    _check_float(g, "g", (3, 4))
    want = [B, T, Hv] + ([K] if g.dim() == 4 else [])
    _check_sizes(g, "g", want, "[B, T, Hv] (a decay per head) or [B, T, Hv, K] (per key channel)" if g.dim() == 3
                 else "[B, T, Hv, K] (a decay per key channel) or [B, T, Hv] (per head)")
    _check_float(beta, "beta", (3,))
    _check_sizes(beta, "beta", [B, T, Hv], "[B, T, Hv]")
    return g.dim() == 4


def _check_state(state, arg: str, B, Hv, K, V) -> None:
    check_tensor(state, arg)
    if state.dtype != torch.float32:
        raise _err(arg, f"expected a float32 state [B, Hv, K, V], got {state.dtype}")
    _check_sizes(state, arg, [B, Hv, K, V], "[B, Hv, K, V]")


def _check_scalars(scale, use_qk_l2norm, eps, out_dtype) -> None:
    real = (int, float)
    if not isinstance(scale, real) or isinstance(scale, bool) or not math.isfinite(scale):
        raise _err("scale", f"expected a finite float, got {scale!r}", TypeError if not isinstance(scale, real) else
                   ValueError)
    if not isinstance(use_qk_l2norm, bool):
        raise _err("use_qk_l2norm", f"expected a bool, got {type(use_qk_l2norm).__name__}", TypeError)
    if not isinstance(eps, real) or isinstance(eps, bool) or not (math.isfinite(eps) and eps >= 0):
        raise _err("eps", f"expected a finite float >= 0, got {eps!r}")
    if out_dtype is not None and out_dtype not in _FLOATS:
        raise _err("out_dtype", f"expected None or a floating-point dtype, got {out_dtype}")


def validate(q, k, v, g, beta, state=None, scale=1.0, use_qk_l2norm=False, eps=1e-6, out_dtype=None, *,
             state_arg: str = "initial_state") -> StepMeta:
    """The ops' one validator (sync-free: shapes, dtypes, devices), each bad argument an error
    naming it; returns the geometry. ``state_arg`` names the state in errors (``state`` for the
    in-place op). Symbolic sizes are checked where the answer is known at trace time."""
    B, T, Hk, K, Hv, V = _check_qkv(q, k, v)
    per_channel = _check_gates(g, beta, B, T, Hv, K)
    if state is not None:
        _check_state(state, state_arg, B, Hv, K, V)
    _check_scalars(scale, use_qk_l2norm, eps, out_dtype)
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
    S = v.new_zeros((B, Hv, q.shape[-1], V), dtype=torch.float32) if state is None else state.float().clone()
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
