"""flash-linear-attention's recurrent kernels as torch custom ops: the "real core" of the
GDN / KDA example layers (``examples/gdn_layers.py``, ``core="fla"`` / ``"auto"``).

Serving runs the gated delta rule with flash-linear-attention's Triton kernels (the
``fla-core`` wheel: pure Python, needs only einops; ``pip install "kda-inductor[fla]"``).
Wrapped with ``torch.library.custom_op`` and a fake implementation, they are opaque to
``torch.compile``: Dynamo does not trace into fla's Python (autotuners, identity caches,
``@torch.compiler.disable``), Inductor calls them as extern kernels, and our rewrites see
the code around them exactly as with the plain-torch core.

Four ops, all ``(q, k, v, g, beta, initial_state, cu_seqlens, scale) -> (o, final_state)``,
layouts as fla's (``[B, T, heads, dim]``, states ``[N, HV, K, V]`` float32, K-major):

=============================  =================================================  ==========
op                             fla function                                        decay ``g``
=============================  =================================================  ==========
``fla_core::gdn_recurrent``    ``fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule``  ``[B, T, HV]``
``fla_core::gdn_chunk``        ``fla.ops.gated_delta_rule.chunk_gated_delta_rule``            ``[B, T, HV]``
``fla_core::kda_recurrent``    ``fla.ops.kda.fused_recurrent_kda``                            ``[B, T, HV, K]``
``fla_core::kda_chunk``        ``fla.ops.kda.chunk_kda``                                      ``[B, T, HV, K]``
=============================  =================================================  ==========

``q, k [B, T, H, K]`` (not normalized: the kernels l2-normalize them,
``use_qk_l2norm_in_kernel=True``; ``H`` may divide ``HV``, grouped value heads), ``v [B, T,
HV, V]``, ``g`` the log decay (float32), ``beta [B, T, HV]``, ``initial_state [N, HV, K, V]``
float32 (``N = B``, or ``len(cu_seqlens) - 1`` with ``cu_seqlens``, which needs ``B == 1``),
``scale`` multiplies the normalized q (``K ** -0.5`` in the layers). ``o`` has ``v``'s dtype
and shape; ``final_state`` the initial state's. The recurrent kernels serve decode and spec
decode (fixed tokens per request, no ``cu_seqlens``); the chunked ones serve prefill
(varlen through ``cu_seqlens``).

No host syncs, so CUDA graphs can capture every op: fla builds the chunked kernels' list of
``(sequence, chunk)`` pairs for varlen input on the host (``prepare_chunk_indices`` reads the
lengths back: a sync), so ``gdn_chunk`` builds it on the device with a static length
(``cdiv(T, 64) + N``), padded with chunks of one extra zero-length sequence that the kernels
mask out entirely; ``kda_chunk`` uses fla's own fixed-shape mode (``use_graph=True``).
fla's identity-keyed tensor caches (``fla.utils.tensor_cache``) are turned off: under CUDA-graph
replay the same tensor object holds new data every step.

fla is imported on the first call, not at import: it is slow to import (seconds) and warns
on machines without a GPU. Its Triton kernels need CUDA, except the two recurrent ones,
which also run under the Triton interpreter (``TRITON_INTERPRET=1``) on CPU tensors; that is
how the CPU tests check these wrappers.
"""

import functools
import importlib.util
from types import SimpleNamespace
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK = 64
"""fla's default chunk size for the gated delta rule and KDA."""


def available() -> bool:
    """Whether the ``fla`` package (``fla-core``) is installed (without importing it)."""
    try:
        return importlib.util.find_spec("fla") is not None
    except (ImportError, ValueError):  # pragma: no cover
        return False


@functools.cache
def fla() -> SimpleNamespace:
    """fla's kernels, imported once (the first call of an op, or a test)."""
    if not available():
        raise ImportError("flash-linear-attention is not installed: pip install 'kda-inductor[fla]' "
                          "(the fla-core wheel), or use core='torch'")
    import fla.utils as fla_utils

    fla_utils.FLA_DISABLE_TENSOR_CACHE = True  # results keyed by tensor identity: stale under graph replay
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    from fla.ops.kda import chunk_kda, fused_recurrent_kda

    return SimpleNamespace(gdn_recurrent=fused_recurrent_gated_delta_rule, gdn_chunk=chunk_gated_delta_rule,
                           kda_recurrent=fused_recurrent_kda, kda_chunk=chunk_kda)


# --------------------------------------------------------------------------- checks
def _check(op: str, kda: bool, q, k, v, g, beta, initial_state, cu_seqlens) -> None:
    """Clear errors, naming the argument, before a kernel reads out of bounds."""
    def fail(msg):
        raise ValueError(f"fla_core::{op}: {msg}")

    if q.dim() != 4 or k.shape != q.shape:
        fail(f"q and k must be [B, T, H, K] of one shape, got q {list(q.shape)}, k {list(k.shape)}")
    B, T, H, K = q.shape
    if v.dim() != 4 or tuple(v.shape[:2]) != (B, T) or v.shape[2] % H:
        fail(f"v must be [B, T, HV, V] with B, T of q and HV a multiple of H={H}, got {list(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    want_g = (B, T, HV, K) if kda else (B, T, HV)
    if tuple(g.shape) != want_g:
        fail(f"g must be {list(want_g)} ({'per key channel' if kda else 'one decay per head'}), got {list(g.shape)}")
    if tuple(beta.shape) != (B, T, HV):
        fail(f"beta must be {[B, T, HV]}, got {list(beta.shape)}")
    if cu_seqlens is not None:
        if B != 1:
            fail(f"cu_seqlens needs B == 1 (tokens flattened), got B={B}")
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
            fail(f"cu_seqlens must be 1-D int32/int64, got {cu_seqlens.dtype} {list(cu_seqlens.shape)}")
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if tuple(initial_state.shape) != (N, HV, K, V) or initial_state.dtype != torch.float32:
        fail(f"initial_state must be float32 {[N, HV, K, V]}, got {initial_state.dtype} {list(initial_state.shape)}")
    devices = {t.device for t in (q, k, v, g, beta, initial_state) + (() if cu_seqlens is None else (cu_seqlens,))}
    if len(devices) > 1:
        fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")


def _nothing_to_do(v: Tensor, initial_state: Tensor):
    """No tokens: the output is empty and every state is unchanged."""
    return v.new_empty(v.shape), initial_state.clone()


def static_chunk_indices(cu_seqlens: Tensor, num_tokens: int, chunk: int = CHUNK) -> Tensor:
    """fla's varlen ``chunk_indices`` (rows ``(sequence, chunk in it)``) built on the device with
    ``cdiv(num_tokens, chunk) + N`` rows, an upper bound of the real count; the rows past the
    real chunks name sequence ``N``, a zero-length sequence the caller appends to ``cu_seqlens``."""
    n = cu_seqlens.shape[0] - 1
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    offsets = F.pad(torch.cumsum((lens + chunk - 1) // chunk, 0), (1, 0))
    rows = torch.arange(-(-num_tokens // chunk) + n, device=cu_seqlens.device, dtype=offsets.dtype)
    seq = torch.searchsorted(offsets, rows, right=True) - 1
    within = rows - offsets[seq.clamp(max=n)]
    real = rows < offsets[-1]
    seq = torch.where(real, seq, torch.full_like(seq, n))
    within = torch.where(real, within, torch.zeros_like(within))
    return torch.stack([seq, within], 1).to(cu_seqlens.dtype)


# --------------------------------------------------------------------------- the ops
def _fake(q, k, v, g, beta, initial_state, cu_seqlens, scale):
    return v.new_empty(v.shape), initial_state.new_empty(initial_state.shape)


@torch.library.custom_op("fla_core::gdn_recurrent", mutates_args=())
def gdn_recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor,
                  cu_seqlens: Optional[Tensor], scale: float) -> Tuple[Tensor, Tensor]:
    """Gated delta rule, one decay per head, token by token (decode, spec decode)."""
    _check("gdn_recurrent", False, q, k, v, g, beta, initial_state, cu_seqlens)
    if q.shape[0] * q.shape[1] == 0:
        return _nothing_to_do(v, initial_state)
    o, ht = fla().gdn_recurrent(q, k, v, g=g, beta=beta, scale=scale, initial_state=initial_state,
                                output_final_state=True, use_qk_l2norm_in_kernel=True,
                                cu_seqlens=None if cu_seqlens is None else cu_seqlens.long())
    return o.contiguous(), ht.contiguous()


@torch.library.custom_op("fla_core::gdn_chunk", mutates_args=())
def gdn_chunk(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor,
              cu_seqlens: Optional[Tensor], scale: float) -> Tuple[Tensor, Tensor]:
    """Gated delta rule, one decay per head, chunked (prefill; varlen through ``cu_seqlens``)."""
    _check("gdn_chunk", False, q, k, v, g, beta, initial_state, cu_seqlens)
    if q.shape[0] * q.shape[1] == 0:
        return _nothing_to_do(v, initial_state)
    kw = dict(scale=scale, output_final_state=True, use_qk_l2norm_in_kernel=True)
    if cu_seqlens is None:
        o, ht = fla().gdn_chunk(q, k, v, g, beta, initial_state=initial_state, **kw)
        return o.contiguous(), ht.contiguous()
    n = cu_seqlens.shape[0] - 1
    cu = cu_seqlens.long()
    cu_ext = torch.cat([cu, cu[-1:]])  # sequence n: zero tokens, the padding rows' target
    h0_ext = torch.cat([initial_state, initial_state.new_zeros(1, *initial_state.shape[1:])])
    o, ht = fla().gdn_chunk(q, k, v, g, beta, initial_state=h0_ext, cu_seqlens=cu_ext,
                            chunk_indices=static_chunk_indices(cu, q.shape[1]), **kw)
    return o.contiguous(), ht[:n].contiguous()


@torch.library.custom_op("fla_core::kda_recurrent", mutates_args=())
def kda_recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor,
                  cu_seqlens: Optional[Tensor], scale: float) -> Tuple[Tensor, Tensor]:
    """KDA (decay per key channel), token by token (decode, spec decode)."""
    _check("kda_recurrent", True, q, k, v, g, beta, initial_state, cu_seqlens)
    if q.shape[0] * q.shape[1] == 0:
        return _nothing_to_do(v, initial_state)
    o, ht = fla().kda_recurrent(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                output_final_state=True, use_qk_l2norm_in_kernel=True,
                                cu_seqlens=None if cu_seqlens is None else cu_seqlens.long())
    return o.contiguous(), ht.contiguous()


@torch.library.custom_op("fla_core::kda_chunk", mutates_args=())
def kda_chunk(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor,
              cu_seqlens: Optional[Tensor], scale: float) -> Tuple[Tensor, Tensor]:
    """KDA, chunked (prefill; varlen through ``cu_seqlens``, in fla's fixed-shape graph mode)."""
    _check("kda_chunk", True, q, k, v, g, beta, initial_state, cu_seqlens)
    if q.shape[0] * q.shape[1] == 0:
        return _nothing_to_do(v, initial_state)
    kw = dict(scale=scale, initial_state=initial_state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    if cu_seqlens is not None:
        kw.update(cu_seqlens=cu_seqlens.long(), use_graph=True, max_num_seqs=cu_seqlens.shape[0] - 1)
    o, ht = fla().kda_chunk(q, k, v, g, beta, **kw)
    return o.contiguous(), ht.contiguous()


for _op in (gdn_recurrent, gdn_chunk, kda_recurrent, kda_chunk):
    _op.register_fake(_fake)

OPS = {"gdn": {"recurrent": gdn_recurrent, "chunk": gdn_chunk},
       "kda": {"recurrent": kda_recurrent, "chunk": kda_chunk}}
"""``OPS[layer kind][kernel]``: what the example layers call."""
