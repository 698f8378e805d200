"""``kda::gdn_chunk``: the gated delta rule's forward over a prefill (one sequence, a batch, or
sequences packed along T by ``cu_seqlens``), computed by chunks of 64 tokens, as transformers'
``torch_chunk_gated_delta_rule`` (Qwen3-Next, Qwen3.5) and fla's ``chunk_gated_delta_rule``; with a
decay per key channel, as Kimi Linear's ``chunk_kimi_delta_attention`` and fla's ``chunk_kda`` (the
trace rules that emit it: ``kda_inductor/_dynamo_chunk.py``).

``kda::gdn_chunk(q, k, v, g, beta, scale=None, initial_state=None, use_qk_l2norm=False,
cu_seqlens=None, eps=1e-6, out_dtype=None) -> (o, final_state)``. The same function as
``kda::gdn_recurrent_step`` (per value head ``h``, key head ``h // (Hv // Hk)``, per token, in
float32)::

    if use_qk_l2norm: q = q * rsqrt(sum(q * q) + eps); k = k * rsqrt(sum(k * k) + eps)
    q = q * scale                           # scale None: K ** -0.5
    S = S * exp(g_t); delta = (v - sum_K(S * k[:, None])) * beta_t
    S = S + k[:, None] * delta[None, :];  o_t = sum_K(S * q[:, None])

* ``q``, ``k``: ``[B, T, Hk, K]``; ``v``: ``[B, T, Hv, V]``, ``Hv % Hk == 0`` (GQA / GVA); any
  strides, any float dtype.
* ``g``: ``[B, T, Hv]`` log decay (GDN; float32 as the layers make it); or ``[B, T, Hv, K]``, a decay
  per key channel (Kimi's KDA): on CUDA its own three launches for ``K <= 128``
  (:mod:`~kda_inductor.lowerings._gdn_chunk_kda_kernels`, :data:`KDA`), the float32 loop past that
  (:func:`_cuda`). ``beta``: ``[B, T, Hv]``.
* ``cu_seqlens``: None (``B`` sequences of ``T`` tokens) or an int tensor ``[N + 1]`` on ``q``'s
  device with ``B == 1`` (fla's varlen: sequence ``n`` is tokens ``cu_seqlens[n]:cu_seqlens[n+1]``,
  ``cu_seqlens[0] == 0``, ``cu_seqlens[N] == T``; never read on the host by the CUDA path).
* ``initial_state``: None (zeros) or float32 ``[N, Hv, K, V]`` (``N = B`` without ``cu_seqlens``).
* Returns ``o`` contiguous ``[B, T, Hv, V]`` in ``out_dtype`` (None: ``v``'s) and the float32
  ``final_state [N, Hv, K, V]``.

CPU: :func:`reference` (the token loop of ``gdn_recurrent_step``, per sequence: the spec). CUDA, a
decay per key channel: three launches of their own (:func:`_launch_kda`, :data:`KDA`). CUDA, a decay
per head: four Triton launches by chunks (:mod:`kda_inductor.lowerings._gdn_chunk_kernels`: the inverse of
``I + A`` per chunk, the UT transform ``w, u``, the sequential scan over chunks holding the state
in registers, the output; :data:`FAST`: three, with bfloat16 products as fla's; :data:`FAST3`: four,
the inverse and ``w, u`` apart as fla's, :mod:`~kda_inductor.lowerings._gdn_chunk_kernels3`), float32 state and
inverse; the chunk map (which sequence and tokens each chunk holds) computed on the device from
``cu_seqlens``: no host sync, CUDA-graph safe.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from kda_inductor.lowerings import arg_error as _err
from kda_inductor.lowerings import check_tensor, definitely
from kda_inductor.lowerings._gdn_chunk_kernels import CHUNK
from kda_inductor.lowerings._triton import triton
from kda_inductor.lowerings.gdn_recurrent_step import (StepMeta, check_gates, check_qkv, check_scalars, check_sizes,
                                                       reference_step)

__all__ = ["CHUNK", "DEFAULT", "FAST", "FAST3", "KDA", "ChunkMeta", "LaunchConfig", "chunk_map", "chunk_triton",
           "gdn_chunk", "reference", "validate"]

_INTS = (torch.int32, torch.int64)


class ChunkMeta(NamedTuple("_ChunkFields", [*StepMeta.__annotations__.items(), ("sequences", int)])):
    """The geometry :func:`validate` returns: :class:`~.gdn_recurrent_step.StepMeta`'s fields (the same
    names, in its order, and its ``group``), then ``sequences`` (``N``: ``B``, or ``len(cu_seqlens) - 1``)."""

    __slots__ = ()
    group = StepMeta.group


def validate(q, k, v, g, beta, scale=None, initial_state=None, use_qk_l2norm=False, cu_seqlens=None, eps=1e-6,
             out_dtype=None) -> ChunkMeta:
    """The op's one validator (sync-free: shapes, dtypes, devices), each bad argument an error naming
    it; symbolic sizes checked where the answer is known at trace time."""
    B, T, Hk, K, Hv, V = check_qkv(q, k, v)
    per_channel = check_gates(g, beta, B, T, Hv, K)
    check_scalars(1.0 if scale is None else scale, use_qk_l2norm, eps, out_dtype)
    N = B
    if cu_seqlens is not None:
        check_tensor(cu_seqlens, "cu_seqlens")
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in _INTS:
            raise _err("cu_seqlens", f"expected a 1-D int32 / int64 tensor [N + 1], got {cu_seqlens.dim()}-D "
                       f"{cu_seqlens.dtype}")
        if definitely(cu_seqlens.shape[0] < 2):
            raise _err("cu_seqlens", f"expected at least 2 offsets (one sequence), got {cu_seqlens.shape[0]}")
        if definitely(B != 1):
            raise _err("q", f"with cu_seqlens the sequences are packed along T: expected B = 1, got {B}")
        N = cu_seqlens.shape[0] - 1
    if initial_state is not None:
        check_tensor(initial_state, "initial_state")
        if initial_state.dtype != torch.float32:
            raise _err("initial_state", f"expected a float32 state [N, Hv, K, V], got {initial_state.dtype}")
        check_sizes(initial_state, "initial_state", [N, Hv, K, V], "[N, Hv, K, V]")
    for t, arg in ((k, "k"), (v, "v"), (g, "g"), (beta, "beta"), (initial_state, "initial_state"),
                   (cu_seqlens, "cu_seqlens")):
        if t is not None and t.device != q.device:
            raise _err(arg, f"expected device {q.device} (q's), got {t.device}")
    return ChunkMeta(B, T, Hk, Hv, K, V, per_channel, N)


def _scale(scale, meta: ChunkMeta) -> float:
    return float(meta.k_dim) ** -0.5 if scale is None else float(scale)


def _new_outputs(v: Tensor, meta: ChunkMeta, out_dtype) -> tuple[Tensor, Tensor]:
    o = v.new_empty((meta.batch, meta.tokens, meta.v_heads, meta.v_dim), dtype=out_dtype or v.dtype)
    return o, v.new_empty((meta.sequences, meta.v_heads, meta.k_dim, meta.v_dim), dtype=torch.float32)


# --------------------------------------------------------------------------------------
# CPU: the token loop per sequence (the spec)
# --------------------------------------------------------------------------------------
def reference(q, k, v, g, beta, scale=None, initial_state=None, use_qk_l2norm=False, cu_seqlens=None, eps=1e-6):
    """The recurrence in float32 torch, token by token, per sequence: float32 ``o [B, T, Hv, V]``
    and the final states ``[N, Hv, K, V]`` (arguments as the op's, unchecked; reads ``cu_seqlens``
    on the host)."""
    scale = float(q.shape[-1]) ** -0.5 if scale is None else float(scale)
    if cu_seqlens is None:
        return reference_step(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, eps)
    B, T, Hv, V = v.shape
    offsets = [int(x) for x in cu_seqlens.tolist()]
    o = v.new_zeros((B, T, Hv, V), dtype=torch.float32)
    finals = []
    for n, (s, e) in enumerate(zip(offsets[:-1], offsets[1:])):
        state = None if initial_state is None else initial_state[n:n + 1]
        out, final = reference_step(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], state, scale,
                                    use_qk_l2norm, eps)
        o[:, s:e] = out
        finals.append(final)
    return o, torch.cat(finals) if finals else v.new_zeros((0, Hv, q.shape[-1], V), dtype=torch.float32)


# --------------------------------------------------------------------------------------
# the custom op
# --------------------------------------------------------------------------------------
@torch.library.custom_op("kda::gdn_chunk", mutates_args=(), device_types="cpu")
def gdn_chunk(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: float | None = None,
              initial_state: Tensor | None = None, use_qk_l2norm: bool = False, cu_seqlens: Tensor | None = None,
              eps: float = 1e-6, out_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """The chunked gated delta rule forward: ``(o, final_state)`` (the module docstring)."""
    validate(q, k, v, g, beta, scale, initial_state, use_qk_l2norm, cu_seqlens, eps, out_dtype)
    o, final = reference(q, k, v, g, beta, scale, initial_state, use_qk_l2norm, cu_seqlens, eps)
    return o.to(out_dtype or v.dtype), final


@gdn_chunk.register_fake
def _gdn_chunk_fake(q, k, v, g, beta, scale=None, initial_state=None, use_qk_l2norm=False, cu_seqlens=None,
                    eps=1e-6, out_dtype=None):
    meta = validate(q, k, v, g, beta, scale, initial_state, use_qk_l2norm, cu_seqlens, eps, out_dtype)
    return _new_outputs(v, meta, out_dtype)


@gdn_chunk.register_kernel("cuda")
def _cuda(q, k, v, g, beta, scale=None, initial_state=None, use_qk_l2norm=False, cu_seqlens=None, eps=1e-6,
          out_dtype=None):
    meta = validate(q, k, v, g, beta, scale, initial_state, use_qk_l2norm, cu_seqlens, eps, out_dtype)
    if meta.per_channel and meta.k_dim > 128:  # KDA past the kernels' two 64-row state blocks: the float32 loop
        o, final = reference(q, k, v, g, beta, scale, initial_state, use_qk_l2norm, cu_seqlens, eps)
        return o.to(out_dtype or v.dtype), final
    return chunk_triton(q, k, v, g, beta, scale, initial_state, use_qk_l2norm, cu_seqlens, eps, out_dtype)


# --------------------------------------------------------------------------------------
# the Triton launches
# --------------------------------------------------------------------------------------
def chunk_map(cu_seqlens: Tensor, tokens: int) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """On the device, from ``cu_seqlens [N + 1]`` over ``tokens`` packed tokens: ``(seq, start,
    length, cu_chunks, M)``: for each of ``M = tokens // CHUNK + N`` chunk ids (at least the number
    of chunks, from shapes alone) its sequence, first token and length (0 past the last chunk), and
    the first chunk id of each sequence (int32 ``[N + 1]``). No host sync."""
    cu = cu_seqlens.to(torch.int64)
    N = cu.shape[0] - 1
    lens = (cu[1:] - cu[:-1]).clamp_min(0)
    counts = (lens + CHUNK - 1) // CHUNK
    cu_chunks = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    M = tokens // CHUNK + N
    ids = torch.arange(M, device=cu.device)
    seq = torch.searchsorted(cu_chunks[1:], ids, right=True)
    live = seq < N
    s = seq.clamp(max=max(N - 1, 0))
    start = cu[s] + (ids - cu_chunks[s]) * CHUNK
    length = torch.where(live, (cu[s + 1] - start).clamp(0, CHUNK), 0)
    start = torch.where(live, start, 0)
    return seq.to(torch.int32), start, length.to(torch.int32), cu_chunks, M


class LaunchConfig(NamedTuple):
    """The four launches' shapes (no run-time autotuning: CUDA graphs and reproducibility). The
    defaults: no register spills at K = V = 128 for sm_90 (Triton 3.9, ahead-of-time compile:
    ``kkt`` 112 registers at 8 warps, ``wu`` 254, ``output`` 197 at 64 columns; the scan 255 with
    56 bytes of stack at 32 columns, the least of the configurations tried: 4 warps or 64 columns
    spill 300-1800 bytes). Not yet timed on a GPU: ``benchmarks/bench_gdn_chunk.py --sweep``."""

    scan_block_v: int = 32
    """State columns per scan program (``Hv * V / scan_block_v`` programs per sequence run the
    sequential part: 128 at Qwen3-Next's 32 x 128)."""
    scan_warps: int = 8
    out_block_v: int = 64
    out_warps: int = 8
    warps: int = 8
    """The ``kkt`` and ``wu`` launches'."""
    num_stages: int = 1
    precompute_kd: bool = False
    """``wu`` also stores ``k exp(gc_last - gc)`` (``K`` values a token and head, ``inter_dtype``), and
    the sequential scan reads it instead of normalizing and decaying ``k`` itself (fewer reductions
    on the sequential path, more bytes moved)."""
    inter_dtype: torch.dtype = torch.float32
    """The stored ``w``, ``u``, ``v_new`` and per-chunk states (float32; bfloat16 halves their
    traffic, as fla stores them, at the cost of a rounding)."""
    v2: bool = False
    """Three launches instead of four (K <= 128; larger K runs the four): ``kkt`` fused into ``wu``
    (``A`` never leaves registers), the scan's state in two 64-row register blocks with the decay and
    the key norm folded into ``v_new``'s rows (``k`` read raw as the product's operand), the output
    from raw ``q`` / ``k`` with the norms and scale applied to the products (no float32 copies of the
    tiles). ``precompute_kd`` does not apply."""
    lowp: bool = False
    """With ``v2``, bfloat16 inputs and ``dot != "ieee"``: the large products' operands in bfloat16
    (float32 accumulation, as fla runs them) and ``w``, ``u``, ``v_new`` and the per-chunk states
    stored bfloat16 (``inter_dtype`` ignored); the state, ``gc`` and the inverse stay float32."""
    v3: bool = False
    """v2's launches with ``wu2`` split in two, as fla's ``kkt_solve`` / ``recompute_w_u``
    (:mod:`~kda_inductor.lowerings._gdn_chunk_kernels3`): ``solve3`` (``gc``, ``1 / |k|``, the inverse
    of ``I + A`` by 16 x 16 blocks, its diagonal blocks by a product of four factors instead of a
    sequential substitution, stored as ``w``'s dtype) then ``wu3`` (``w``, ``u`` as 64-row products
    with the stored inverse), v2's scan, and ``output3`` (v2's output with the key dimension in a loop
    of 64-column blocks, as fla's: fewer tiles live at once); implies ``v2``."""
    solve_warps: int = 4
    """With ``v3``: ``solve3``'s warps (its products are 16 x 16 tiles)."""
    fuse_wu: bool = False
    """With ``v3``: ``solve3`` and ``wu3`` in one launch (``solvewu3``, ``warps``; the inverse still
    goes through its scratch, behind a CTA barrier)."""
    out_v_first: bool = False
    """With ``v2`` / ``v3``: the output's grid ``(chunks x column blocks, heads)``, a chunk's column
    blocks adjacent (they read the same ``q`` / ``k`` rows: from L2 instead of HBM, as fla orders
    its grid), instead of ``(chunks, heads, column blocks)``."""
    solve_inverse: str = "ieee"
    """With ``v3``: the inverse's diagonal blocks and merges: ``"ieee"`` (a product of four factors,
    float32 products), ``"tf32"`` (the same on tf32 tensor cores; its factors cancel on correlated keys
    with slow decay, far past ``lowp``'s bfloat16 rounding: :attr:`wu_inverse`), ``"subst"`` (v2's
    row-by-row substitution, float32 merges), ``"doubling"`` / ``"doubling_tf32"`` (:attr:`wu_inverse`)."""
    wu_inverse: str = "subst"
    """With ``v2`` (not ``v3``), and KDA's ``intra``: the inverse, :attr:`solve_inverse`'s choices; ``"subst"`` (v2's,
    :data:`FAST`'s). ``"ieee"`` / ``"tf32"`` take the two cross-row reductions a row out of the diagonal
    blocks (sm_90, Triton 3.9, :data:`FAST`'s ``wu2`` at 4 warps: 465 CTA barriers -> 114 / 99, 80 bytes
    of stack -> 24 / 0). The product of factors cancels: ``A^8``'s entries reach ~1e3 where the
    inverse's stay <= 1 (correlated keys, beta and decay near 1). Measured in torch (a 64-token
    chunk, keys ``0.9 shared + 0.1 own`` unit-normalized, the op's weak-decay inputs), the inverse's
    relative error: substitution 8.5e-8, ``"ieee"`` 9.3e-5, ``"tf32"`` 0.76 (unusable; ``solve_inverse``
    likewise). ``"doubling"`` / ``"doubling_tf32"`` (:func:`~._gdn_chunk_inverse.doubling16`: the
    diagonal blocks by doubling the inverted block, 2 -> 4 -> 8 -> 16 rows, six products, no
    reductions, nothing grows): 7.5e-8 and 1.1e-3 there; for sm_90 at 4 warps 171 / 93 barriers, 304 /
    8 stack bytes. Candidates: ``"doubling"``, ``"doubling_tf32"``, ``"ieee"``; ``"tf32"`` a time only."""
    scan_stages: int | None = None
    """With ``v2`` / ``v3``: the scan's pipeline stages (None: :attr:`num_stages`, as before); the other
    launches keep :attr:`num_stages`. fla tunes its scan's apart (2-4); it also splits the sweep's NaN
    of ``num_stages=1`` (H200, T 16,384) between ``scan2`` and the others (``wu2``'s code changes with
    the stages too, ``output2``'s does not)."""
    scan4: bool = False
    """With ``v2`` / ``v3``: :mod:`~kda_inductor.lowerings._gdn_chunk_kernels4`'s ``scan4`` in place of
    ``scan2`` (the same function laid out as fla's scan: head dims constexpr, packed scratch, the decay
    applied before the update and the update as the product's accumulator, a 1-D grid). sm_90 at
    Qwen3-Next's dims, run-time specialized (``benchmarks/gdn_chunk_registers.py``), 32 columns, 4 warps,
    2 stages: 118 registers (``scan2`` 178; fla's ``fwd_kernel_h`` 106), 0 stack bytes."""
    solve_bk: int = 0
    """With ``v3`` (not ``fuse_wu``): ``solve4`` (``_gdn_chunk_kernels4``) in place of ``solve3``, the key
    dimension in a loop of this many columns (fla's ``kkt_solve``: 32 / 64), ``solve_warps``,
    ``num_stages``; 0: ``solve3``."""
    scan4_out: bool = False
    """With ``v2`` / ``v3``: ``scanout4`` in place of the scan and the output (``scan4`` with each
    chunk's output from the state in registers: the per-chunk states and ``v_new`` never stored; for
    sm_90 at 16 or 32 columns, 4 or 8 warps, 2 stages: 194-204 registers, no spills; 64 columns spill)."""
    out4: str = ""
    """With ``v2`` / ``v3``: ``output4`` in place of ``output2`` / ``output3``: ``"group"`` (one program
    for a key head's GQA group: ``q k^T`` once for its value heads) or ``"head"``; ``""``: off."""
    kda_intra_dot: str = ""
    """A decay per key channel (:data:`KDA`): the ``intra`` launch's products (``A``, ``Aqk``, ``w``,
    ``u``) in this precision (``"tf32"``: float32 operands on tf32 tensor cores) instead of the
    launch's (``"bf16"`` with ``lowp``); ``""``: the launch's; ``dot="ieee"`` keeps float32."""
    kda_intra_split: bool = False
    """KDA: ``intra`` as two launches: ``A`` / ``Aqk`` one program per block pair (chunk x head x 10, the ten
    16 x 16 blocks on and below the diagonal: :data:`~._gdn_chunk_kda_kernels.pairs_kernel`, ``A`` stored
    float32), then the inverse, ``w``, ``kd``, ``u`` (:data:`~._gdn_chunk_kda_kernels.rest_kernel`), as
    fla splits its ``chunk_kda`` intra kernels: ten times the programs for the exponentials' products where
    the single launch runs them one after another (2,136 us a layer in Kimi Linear's prefill 4096 against
    fla's three intra kernels' ~315: H100, 584a967, ``docs/speed-rules.md``). The pairs' key columns by
    ``kda_intra_cols`` (0: 64). Not yet timed on a GPU."""
    kda_intra_cols: int = 0
    """KDA: ``intra``'s ``A`` / ``Aqk`` block by block over this many key columns (0: whole key rows, which
    spill at K = 128; sm_90 at 32 columns, 8 warps: 88 stack bytes against 960 with Triton 3.9, 0 against
    528-536 with the device's 3.6). Not yet timed on a GPU."""


FAST = LaunchConfig(scan_block_v=32, scan_warps=4, out_block_v=64, out_warps=4, warps=4, num_stages=2, v2=True,
                    lowp=True)
"""The fla-like launch (``v2``, bfloat16 operands and intermediates, 2 stages, 4 warps): on the H200
(triton 3.6, 2026-12-05, ``benchmarks/results/gdn_chunk.md``, ``--sweep`` at T 16,384, Qwen3-Next's
dims) 1,583 us against 2,950 at 8 warps and 4,726 for the four float32 launches
(:class:`LaunchConfig`'s defaults), error 3.33e-3 against fla's 4.07e-3; fla's own kernels take
1,014 us there (the op's launches since: :data:`DEFAULT`). Ahead of time for sm_90
(Triton 3.9) with the run-time specialization these dims get (sizes and strides divisible by 16, unit
strides constant; registers / stack bytes): ``wu2`` 255 / 80 (465 CTA barriers, most of them the
diagonal blocks' substitution: :attr:`LaunchConfig.wu_inverse`), ``scan2`` 178 / 0, ``output2``
168 / 0 (without the specialization, 336 and 232 stack bytes for ``scan2`` and ``wu2``)."""

FAST3 = FAST._replace(v3=True, out_v_first=True)
""":data:`FAST` with :attr:`LaunchConfig.v3` (four launches: ``solve3``, ``wu3``, ``scan2``,
``output3``) and the output's column blocks adjacent in its grid (``out_v_first``). Not yet timed
on a GPU (``benchmarks/bench_gdn_chunk.py --sweep``: ``FAST3``, ``FAST3 out v last``, ``FAST out v
first`` separate the two changes; ``--profile``: each kernel's time). Ahead of time for sm_90
(Triton 3.9, Qwen3-Next's dims, bf16; registers / stack bytes): ``solve3`` 213 / 0 at 4 warps (8:
194 / 0), ``wu3`` 252 / 0 (8 warps: 128 / 0), ``solvewu3`` (``fuse_wu``) 250 / 0 (8: 208 / 0),
``output3`` 255 / 128 (64 columns; 128 at 8 warps: 235 / 0), ``scan2`` 255 / 408; ``wu2`` (FAST)
255 / 224, ``output2`` 255 / 112."""

DEFAULT = FAST._replace(wu_inverse="doubling_tf32", scan4=True, scan_stages=3, out4="group")
"""What :func:`chunk_triton` (and so the op on CUDA) runs without a ``config``: :data:`FAST` with
``wu2``'s diagonal-block inverse by doubling, its products in tf32 (:attr:`LaunchConfig.wu_inverse`),
the scan laid out as fla's at 3 stages (:attr:`LaunchConfig.scan4`) and the output sharing ``q k^T``
over a GQA group (:attr:`LaunchConfig.out4`). Measured (H100, triton 3.6, 2026-12-06 03:34,
``bench_gdn_chunk.py --sweep``, Qwen3-Next's dims, ``benchmarks/results/gdn_chunk.md``): 292 / 1,117 us
at T 4,096 / 16,384 against 357 / 1,391 for the default before it (``FAST`` with the tf32 inverse) in
the same run, the same error against the float32 loop (3.33e-3); the fastest of the run's eight
launch sets. Every CUDA test of ``tests/test_gdn_chunk_cuda.py`` for it passed on that H100 (T 1 /
100 / 1,000 / 4,096, weak decay with a state, varlen, CUDA-graph replay, exact float32 products).
fla's kernels took 344 / 1,333 us in the next call on the same machine (``--quick``, where the
default before took 355 / 1,404). Side by side (H100, 2026-12-06 05:56, 8b741ab, ``--quick``): 294.0 /
1,118.5 us against fla's 293.0 / 1,129.6, a tie; in the prefill step (no graph break at each layer's
chunk call) Qwen3-Next 1 x 4096 took 9,186 us against 9,689 with fla's kernels (H100, d461889,
``hf_models``' ``kda@with-gdn_chunk``), which turned ``_dynamo_chunk.CHUNK_RULE_MEASURED`` on for CUDA."""

KDA = FAST._replace(warps=8, kda_intra_dot="tf32")
"""The launches of a decay per key channel (:mod:`~kda_inductor.lowerings._gdn_chunk_kda_kernels`,
``K <= 128``; what :func:`chunk_triton` runs for one without a ``config``): ``intra`` at ``warps``,
the scan at ``scan_block_v`` / ``scan_warps``, the output at ``out_block_v`` / ``out_warps`` /
``out_v_first``; ``lowp`` as :data:`FAST`'s (bf16 operands, ``w``, ``u``, ``kd``, ``Aqk``, ``v_new``
and the per-chunk states stored bf16; ``gc``, ``A`` and the inverse float32) except ``intra``'s
products, tf32 (:attr:`LaunchConfig.kda_intra_dot`: under the interpreter's bf16 roundings, Kimi's
gates, bf16 products there double the output's error, 1.7e-2 against 8.8e-3, ``Aqk``'s and ``A``'s
about equally); ``v2`` / ``v3`` and their options do not apply. Not yet timed on a GPU
(``benchmarks/bench_gdn_chunk.py --kda``, ``--kda --sweep``). Ahead of time for sm_90 (Triton 3.9,
Kimi Linear's dims K = V = 128, bf16, l2norm, a state; registers / stack bytes, ``tests/aot_sm90.py
--registers _gdn_chunk_kda_kernels``): ``intra``
255 / 960 at 8 warps (bf16 products: 255 / 320; at 4 warps 255 / 1,264, at 16 128 / 872), ``scan``
255 / 0 at 4 warps (8: 218 / 0), ``output`` 254 / 0 at 4 warps (8: 196 / 0); with float32
intermediates (``lowp=False``, tf32 products) ``intra`` 255 / 968, ``scan`` 255 / 776, ``output``
255 / 0."""


def chunk_triton(q, k, v, g, beta, scale=None, initial_state=None, use_qk_l2norm=False, cu_seqlens=None, eps=1e-6,
                 out_dtype=None, *, out: Tensor | None = None, dot: str = "tf32",
                 config: LaunchConfig | None = None) -> tuple[Tensor, Tensor]:
    """The four Triton launches on checked arguments (what the CUDA impl runs; also on CPU tensors
    under ``TRITON_INTERPRET=1``): ``(o, final_state)``. ``out``: a contiguous ``[B, T, Hv, V]`` to
    write (default a new one); ``dot``: the large products' input precision (``"tf32"``, ``"ieee"``);
    ``config``: the launches (default :class:`LaunchConfig`)."""
    if triton is None:  # pragma: no cover
        raise RuntimeError("gdn_chunk: the Triton kernels need triton, which is not installed")
    meta = validate(q, k, v, g, beta, scale, initial_state, use_qk_l2norm, cu_seqlens, eps, out_dtype)
    if meta.per_channel and meta.k_dim > 128:
        raise NotImplementedError(f"gdn_chunk: the Triton kernels take a decay per key channel (KDA) up to K = 128, "
                                  f"got K = {meta.k_dim}")
    o, final = _new_outputs(v, meta, out_dtype if out is None else out.dtype)
    if out is not None:
        if out.shape != o.shape or not out.is_contiguous() or out.device != v.device:
            raise _err("out", f"expected a contiguous {list(o.shape)} on {v.device}, got {list(out.shape)}")
        o = out
    B, T, Hv, N = meta.batch, meta.tokens, meta.v_heads, meta.sequences
    if N == 0 or Hv == 0:
        return o, final
    cfg = config or (KDA if meta.per_channel else DEFAULT)
    if meta.per_channel:
        _launch_kda(q, k, v, g, beta, o, final, initial_state, cu_seqlens, meta, cfg, dot, bool(use_qk_l2norm),
                    _scale(scale, meta), float(eps))
        return o, final
    if (cfg.v2 or cfg.v3) and meta.k_dim <= 128:
        _launch_v2(q, k, v, g, beta, o, final, initial_state, cu_seqlens, meta, cfg, dot, bool(use_qk_l2norm),
                   _scale(scale, meta), float(eps))
        return o, final
    if cu_seqlens is None:
        cu_seqlens = torch.arange(0, B + 1, device=v.device, dtype=torch.int64) * T
    _launch_all(q, k, v, g, beta, o, final, initial_state, cu_seqlens.to(torch.int64), meta, cfg, dot,
                bool(use_qk_l2norm), _scale(scale, meta), float(eps))
    return o, final


def _launch_all(q, k, v, g, beta, o, final, s, cu_seqlens, meta, cfg, dot, l2, scale, eps) -> None:
    """The four launches (``kkt``, ``wu``, ``scan``, ``output``) with their float32 /
    ``inter_dtype`` intermediates, on token-major 3-D views ``[B * T, heads, dim]`` of the inputs
    (a copy only where B and T do not merge)."""
    from kda_inductor.lowerings import _gdn_chunk_kernels as kern

    B, T, Hk, K, Hv, V, N = (meta.batch, meta.tokens, meta.k_heads, meta.k_dim, meta.v_heads, meta.v_dim,
                             meta.sequences)
    Ttot, dev, f32, inter = B * T, v.device, torch.float32, cfg.inter_dtype
    seq, start, length, cu_chunks, M = chunk_map(cu_seqlens, Ttot)
    q3, k3, v3 = q.reshape(Ttot, Hk, K), k.reshape(Ttot, Hk, K), v.reshape(Ttot, Hv, V)
    g2, b2, o3 = g.reshape(Ttot, Hv), beta.reshape(Ttot, Hv), o.view(Ttot, Hv, V)
    akk = torch.empty((Ttot, Hv, CHUNK), device=dev, dtype=f32)
    gc = torch.empty((Ttot, Hv), device=dev, dtype=f32)
    w, u, vn = (torch.empty((Ttot, Hv, n), device=dev, dtype=inter) for n in (K, V, V))
    hs = torch.empty((M, Hv, K, V), device=dev, dtype=inter)
    pre = bool(cfg.precompute_kd)
    kd = torch.empty((Ttot, Hv, K), device=dev, dtype=inter) if pre else w  # w: an unread placeholder
    KP, vp = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))
    BV, OBV = min(max(16, cfg.scan_block_v), vp), min(max(16, cfg.out_block_v), vp)
    stages, group = cfg.num_stages, Hv // Hk
    kern.kkt_kernel[(M, Hv)](
        k3, g2, b2, akk, gc, seq, start, length, K, group, eps, *k3.stride(), *g2.stride(), *b2.stride(),
        *akk.stride()[:2], *gc.stride(), KP=KP, L2NORM=l2, DOT=dot, num_warps=cfg.warps, num_stages=stages)
    kern.wu_kernel[(M, Hv)](
        k3, v3, b2, akk, gc, w, u, kd, seq, start, length, K, V, group, eps, *k3.stride(), *v3.stride(),
        *b2.stride(), *akk.stride()[:2], *gc.stride(), *w.stride()[:2], *u.stride()[:2], *kd.stride()[:2], KP=KP,
        BV=OBV, L2NORM=l2, DOT=dot, PRE_KD=pre, num_warps=cfg.warps, num_stages=stages)
    kern.scan_kernel[(N, Hv, triton.cdiv(V, BV))](
        k3, w, u, gc, s if s is not None else final, final, hs, vn, kd, cu_seqlens, cu_chunks, K, V, group, eps,
        *k3.stride(), *w.stride()[:2], *u.stride()[:2], *gc.stride(),
        *(s.stride() if s is not None else (0, 0, 0, 0)), *hs.stride()[:3], *vn.stride()[:2],
        *final.stride()[:3], *kd.stride()[:2], KP=KP, BV=BV, L2NORM=l2, HAS_STATE=s is not None, DOT=dot, PRE_KD=pre,
        num_warps=cfg.scan_warps,
        num_stages=stages)
    kern.output_kernel[(M, Hv, triton.cdiv(V, OBV))](
        q3, k3, gc, hs, vn, o3, seq, start, length, K, V, group, scale, eps, *q3.stride(), *k3.stride(),
        *gc.stride(), *hs.stride()[:3], *vn.stride()[:2], *o3.stride()[:2], KP=KP, BV=OBV, L2NORM=l2, DOT=dot,
        num_warps=cfg.out_warps, num_stages=stages)




def _v2_chunks(cu_seqlens, placeholder, B: int, T: int):
    """``(chunks, tokens a sequence, chunks a sequence, (seq, start, length, cu, cu_chunks))`` of
    the v2 launches: without ``cu_seqlens`` every sequence has ``T`` tokens and the kernels find
    a chunk's place from its id (the maps are unread placeholders); else :func:`chunk_map`'s."""
    if cu_seqlens is None:
        return B * triton.cdiv(T, CHUNK), T, triton.cdiv(T, CHUNK), (placeholder,) * 5
    cu = cu_seqlens.to(torch.int64)
    seq, start, length, cu_chunks, M = chunk_map(cu, B * T)
    return M, 0, 0, (seq, start, length, cu, cu_chunks)


def _launch_v2(q, k, v, g, beta, o, final, s, cu_seqlens, meta, cfg, dot, l2, scale, eps) -> None:
    """:attr:`LaunchConfig.v2`'s three launches (``wu2``, ``scan2``, ``output2``); without
    ``cu_seqlens`` the kernels derive each chunk's place from its id (no chunk map)."""
    from kda_inductor.lowerings import _gdn_chunk_kernels4 as kern4

    B, T, Hk, K, Hv, V = meta.batch, meta.tokens, meta.k_heads, meta.k_dim, meta.v_heads, meta.v_dim
    Ttot, dev = B * T, v.device
    q3, k3, v3 = q.reshape(Ttot, Hk, K), k.reshape(Ttot, Hk, K), v.reshape(Ttot, Hv, V)
    g2, b2, o3 = g.reshape(Ttot, Hv), beta.reshape(Ttot, Hv), o.view(Ttot, Hv, V)
    regular = cu_seqlens is None
    M, TS, NT, (seq, start, length, cu, cu_chunks) = _v2_chunks(cu_seqlens, final, B, T)
    lowp = cfg.lowp and dot != "ieee" and k3.dtype == torch.bfloat16
    inter = torch.bfloat16 if lowp else cfg.inter_dtype
    if lowp:  # the interpreter's bf16 tl.dot is wrong: the same roundings, float32 products
        dot = "bf16emu" if dev.type == "cpu" else "bf16"
    gc, rk = (torch.empty((Ttot, Hv), device=dev, dtype=torch.float32) for _ in range(2))
    w, u = (torch.empty((Ttot, Hv, n), device=dev, dtype=inter) for n in (K, V))
    fused = cfg.scan4_out  # no per-chunk states or v_new
    vn = w if fused else torch.empty((Ttot, Hv, V), device=dev, dtype=inter)
    hs = w if fused else torch.empty((M, Hv, K, V), device=dev, dtype=inter)
    if M:
        _launch_wu(k3, v3, g2, b2, gc, rk, w, u, (seq, start, length), TS, NT, M, meta, cfg, dot, l2, eps, regular)
    if fused:
        kern4.launch_scanout4(q3, k3, w, u, gc, rk, s, final, o3, cu, cu_chunks, TS, NT, meta, cfg, dot, l2, scale, eps,
                              regular)
        return
    _launch_scan(k3, w, u, gc, rk, s, final, hs, vn, cu, cu_chunks, TS, NT, meta, cfg, dot, l2, eps, regular)
    if M:
        _launch_out(q3, k3, gc, rk, hs, vn, o3, (seq, start, length), TS, NT, M, meta, cfg, dot, l2, scale, eps,
                    regular)


def _launch_scan(k3, w, u, gc, rk, s, final, hs, vn, cu, cu_chunks, TS, NT, meta, cfg, dot, l2, eps, regular) -> None:
    """The v2 launches' scan: ``scan4`` (:attr:`LaunchConfig.scan4`, fla's layout) or ``scan2``, a
    program per (sequence, head, column block)."""
    from kda_inductor.lowerings import _gdn_chunk_kernels as kern
    from kda_inductor.lowerings import _gdn_chunk_kernels4 as kern4

    K, V, Hv, N, group = meta.k_dim, meta.v_dim, meta.v_heads, meta.sequences, meta.v_heads // meta.k_heads
    KP, vp = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))
    KB, TWO = min(KP, 64), KP > 64
    BV = min(max(16, cfg.scan_block_v), vp)
    stages = cfg.num_stages
    if cfg.scan4:
        kern4.launch_scan4(k3, w, u, gc, rk, s, final, hs, vn, cu, cu_chunks, TS, NT, meta, cfg, dot, l2, regular)
    else:
        kern.scan2_kernel[(N, Hv, triton.cdiv(V, BV))](
            k3, w, u, gc, rk, s if s is not None else final, final, hs, vn, cu, cu_chunks, TS, NT, K, V, group, eps,
            *k3.stride(), *w.stride()[:2], *u.stride()[:2], *gc.stride(),
            *(s.stride() if s is not None else (0, 0, 0, 0)), *hs.stride()[:3], *vn.stride()[:2],
            *final.stride()[:3], KB=KB, TWO=TWO, BV=BV, L2NORM=l2, HAS_STATE=s is not None, DOT=dot,
            REGULAR=regular, num_warps=cfg.scan_warps,
            num_stages=stages if cfg.scan_stages is None else cfg.scan_stages)


def _launch_out(q3, k3, gc, rk, hs, vn, o3, maps, TS, NT, M, meta, cfg, dot, l2, scale, eps, regular) -> None:
    """The v2 launches' output: ``output2`` (both 64-row halves of the key dimension at once), or with
    :attr:`LaunchConfig.v3` ``output3`` (a loop over 64-column key blocks, fla's shape)."""
    from kda_inductor.lowerings import _gdn_chunk_kernels as kern
    from kda_inductor.lowerings import _gdn_chunk_kernels3 as kern3

    K, V, Hv, group = meta.k_dim, meta.v_dim, meta.v_heads, meta.v_heads // meta.k_heads
    KP, vp = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))
    OBV = min(max(16, cfg.out_block_v), vp)
    nvb, vf = triton.cdiv(V, OBV), cfg.out_v_first
    args = (q3, k3, gc, rk, hs, vn, o3, *maps, TS, NT, K, V, group, scale, eps, *q3.stride(), *k3.stride(),
            *gc.stride(), *hs.stride()[:3], *vn.stride()[:2], *o3.stride()[:2])
    grid = (M * nvb, Hv, 1) if vf else (M, Hv, nvb)
    if cfg.out4:
        from kda_inductor.lowerings import _gdn_chunk_kernels4 as kern4

        kern4.launch_out4(q3, k3, gc, rk, hs, vn, o3, maps, TS, NT, M, meta, cfg, dot, l2, scale, eps, regular)
    elif cfg.v3:
        kern3.output3_kernel[grid](*args, BK=min(KP, 64), BV=OBV, L2NORM=l2, DOT=dot, REGULAR=regular, V_FIRST=vf,
                                   num_warps=cfg.out_warps, num_stages=cfg.num_stages)
    else:
        kern.output2_kernel[grid](*args, KB=min(KP, 64), TWO=KP > 64, BV=OBV, L2NORM=l2, DOT=dot, REGULAR=regular,
                                  V_FIRST=vf, num_warps=cfg.out_warps, num_stages=cfg.num_stages)


def _inverse(name: str, dot: str) -> str:
    """The inverse's ``INV`` (:attr:`LaunchConfig.solve_inverse`'s choices): ``dot="ieee"`` keeps it
    float32 throughout (``"tf32"`` becomes ``"ieee"``)."""
    if name not in ("ieee", "tf32", "subst", "doubling", "doubling_tf32"):
        raise ValueError(f"gdn_chunk: expected an inverse 'ieee', 'tf32', 'subst', 'doubling' or 'doubling_tf32', "
                         f"got {name!r}")
    return {"tf32": "ieee", "doubling_tf32": "doubling"}.get(name, name) if dot == "ieee" else name


def _launch_wu(k3, v3, g2, b2, gc, rk, w, u, maps, TS, NT, M, meta, cfg, dot, l2, eps, regular) -> None:
    """The v2 launches' first step: ``wu2`` (one launch), or with :attr:`LaunchConfig.v3` ``solve3``
    (the inverse, stored in a ``[tokens, heads, 64]`` scratch of ``w``'s dtype) then ``wu3`` (the
    products with it as 64-row tiles)."""
    from kda_inductor.lowerings import _gdn_chunk_kernels as kern

    K, V, Hv, group = meta.k_dim, meta.v_dim, meta.v_heads, meta.v_heads // meta.k_heads
    KP, vp = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))
    OBV = min(max(16, cfg.out_block_v), vp)
    if not cfg.v3:
        kern.wu2_kernel[(M, Hv)](
            k3, v3, g2, b2, gc, rk, w, u, *maps, TS, NT, K, V, group, eps, *k3.stride(), *v3.stride(),
            *g2.stride(), *b2.stride(), *gc.stride(), *w.stride()[:2], *u.stride()[:2], KP=KP, BV=OBV, L2NORM=l2,
            DOT=dot, REGULAR=regular, INV=_inverse(cfg.wu_inverse, dot), num_warps=cfg.warps,
            num_stages=cfg.num_stages)
        return
    _launch_wu3(k3, v3, g2, b2, gc, rk, w, u, maps, TS, NT, M, meta, cfg, dot, l2, eps, regular)


def _launch_wu3(k3, v3, g2, b2, gc, rk, w, u, maps, TS, NT, M, meta, cfg, dot, l2, eps, regular) -> None:
    """:attr:`LaunchConfig.v3`'s first step: ``solve3`` (or ``solve4`` with :attr:`LaunchConfig.solve_bk`)
    then ``wu3``, or both in one launch (``solvewu3``, :attr:`LaunchConfig.fuse_wu`)."""
    from kda_inductor.lowerings import _gdn_chunk_kernels3 as kern3

    K, V, Hv, group = meta.k_dim, meta.v_dim, meta.v_heads, meta.v_heads // meta.k_heads
    KP, vp = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))
    ai = torch.empty((k3.shape[0], Hv, CHUNK), device=v3.device, dtype=w.dtype)
    inv = _inverse(cfg.solve_inverse, dot)
    blocks = dict(BK=min(KP, 64), BV=min(vp, 64), L2NORM=l2, DOT=dot, REGULAR=regular)
    if cfg.fuse_wu:
        kern3.solvewu3_kernel[(M, Hv)](
            k3, v3, g2, b2, gc, rk, ai, w, u, *maps, TS, NT, K, V, group, eps, *k3.stride(), *v3.stride(),
            *g2.stride(), *b2.stride(), *gc.stride(), *ai.stride()[:2], *w.stride()[:2], *u.stride()[:2], KP=KP,
            INV=inv, **blocks, num_warps=cfg.warps, num_stages=cfg.num_stages)
        return
    args = (k3, g2, b2, gc, rk, ai, *maps, TS, NT, K, group, eps, *k3.stride(), *g2.stride(), *b2.stride(),
            *gc.stride(), *ai.stride()[:2])
    if cfg.solve_bk:
        from kda_inductor.lowerings import _gdn_chunk_kernels4 as kern4

        kern4.solve4_kernel[(M, Hv)](*args, KP=KP, L2NORM=l2, DOT=dot, REGULAR=regular, INV=inv,
                                     BK=min(max(16, cfg.solve_bk), KP), num_warps=cfg.solve_warps,
                                     num_stages=cfg.num_stages)
    else:
        kern3.solve3_kernel[(M, Hv)](*args, KP=KP, L2NORM=l2, DOT=dot, REGULAR=regular, INV=inv,
                                     num_warps=cfg.solve_warps, num_stages=1)
    kern3.wu3_kernel[(M, Hv)](
        k3, v3, b2, gc, rk, ai, w, u, *maps, TS, NT, K, V, group, *k3.stride(), *v3.stride(), *b2.stride(),
        *gc.stride(), *ai.stride()[:2], *w.stride()[:2], *u.stride()[:2], **blocks, num_warps=cfg.warps,
        num_stages=cfg.num_stages)


def _launch_kda_intra(kern, M, ins, outs, maps, K, V, group, scale, eps, meta, cfg) -> None:
    """``intra``: one launch, or :attr:`LaunchConfig.kda_intra_split`'s two (``A`` through a float32 scratch)."""
    (q3, k3, v3, g3, b2), (gc, w, u, kd, aq) = ins, outs
    KP, Hv, flags = meta["KP"], v3.shape[1], {n: meta[n] for n in ("L2NORM", "DOT", "REGULAR")}
    if not cfg.kda_intra_split:
        kern.intra_kernel[(M, Hv)](
            q3, k3, v3, g3, b2, gc, w, u, kd, aq, *maps, K, V, group, scale, eps, *q3.stride(), *k3.stride(),
            *v3.stride(), *g3.stride(), *b2.stride(), *gc.stride()[:2], *w.stride()[:2], *u.stride()[:2],
            *kd.stride()[:2], *aq.stride()[:2], KP=KP, BK=meta["BK"], BV=meta["BV"], INV=meta["INV"], **flags,
            AB=min(KP, max(16, cfg.kda_intra_cols)) if cfg.kda_intra_cols else 0, num_warps=cfg.warps,
            num_stages=cfg.num_stages)
        return
    a = torch.empty(aq.shape, device=aq.device, dtype=torch.float32)
    kern.pairs_kernel[(M, Hv, 10)](
        q3, k3, g3, b2, a, aq, *maps, K, group, scale, eps, *q3.stride(), *k3.stride(), *g3.stride(), *b2.stride(),
        *aq.stride()[:2], AB=min(KP, max(16, cfg.kda_intra_cols or 64)), **flags, num_warps=4,
        num_stages=cfg.num_stages)
    kern.rest_kernel[(M, Hv)](
        k3, v3, g3, b2, a, gc, w, u, kd, *maps, K, V, group, eps, *k3.stride(), *v3.stride(), *g3.stride(),
        *b2.stride(), *a.stride()[:2], *gc.stride()[:2], *w.stride()[:2], *u.stride()[:2], *kd.stride()[:2],
        BK=meta["BK"], BV=meta["BV"], INV=meta["INV"], **flags, num_warps=cfg.warps, num_stages=cfg.num_stages)


def _launch_kda(q, k, v, g, beta, o, final, s, cu_seqlens, meta, cfg, dot, l2, scale, eps) -> None:
    """A decay per key channel (KDA, ``K <= 128``): ``intra`` (``gc``, ``Aqk``, ``w``, ``u``, ``kd``),
    the scan, the output (:mod:`~kda_inductor.lowerings._gdn_chunk_kda_kernels`); without
    ``cu_seqlens`` the kernels place each chunk from its id (no chunk map), as the v2 launches."""
    from kda_inductor.lowerings import _gdn_chunk_kda_kernels as kern

    B, T, Hk, K, Hv, V, N = (meta.batch, meta.tokens, meta.k_heads, meta.k_dim, meta.v_heads, meta.v_dim,
                             meta.sequences)
    Ttot, dev, regular = B * T, v.device, cu_seqlens is None
    q3, k3, v3 = q.reshape(Ttot, Hk, K), k.reshape(Ttot, Hk, K), v.reshape(Ttot, Hv, V)
    g3, b2, o3 = g.reshape(Ttot, Hv, K), beta.reshape(Ttot, Hv), o.view(Ttot, Hv, V)
    M, TS, NT, (seq, start, length, cu, cu_chunks) = _v2_chunks(cu_seqlens, final, B, T)
    lowp = cfg.lowp and dot != "ieee" and k3.dtype == torch.bfloat16
    inter = torch.bfloat16 if lowp else cfg.inter_dtype
    if lowp:  # the interpreter's bf16 tl.dot is wrong: the same roundings, float32 products
        dot = "bf16emu" if dev.type == "cpu" else "bf16"
    idot = dot if dot == "ieee" or not cfg.kda_intra_dot else cfg.kda_intra_dot
    gc, maps = torch.empty((Ttot, Hv, K), device=dev, dtype=torch.float32), (seq, start, length, TS, NT)
    hs = torch.empty((M, Hv, K, V), device=dev, dtype=inter)
    w, kd, u, vn, aq = (torch.empty((Ttot, Hv, n), device=dev, dtype=inter) for n in (K, K, V, V, CHUNK))
    KP, vp = max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))
    BV, OBV, group = min(max(16, cfg.scan_block_v), vp), min(max(16, cfg.out_block_v), vp), Hv // Hk
    if M:
        _launch_kda_intra(kern, M, (q3, k3, v3, g3, b2), (gc, w, u, kd, aq), maps, K, V, group, scale, eps,
                          dict(KP=KP, BK=min(KP, 64), BV=OBV, L2NORM=l2, DOT=idot, REGULAR=regular,
                               INV=_inverse(cfg.wu_inverse, idot)), cfg)
    kern.scan_kernel[(N, Hv, triton.cdiv(V, BV))](
        w, u, kd, gc, s if s is not None else final, final, hs, vn, cu, cu_chunks, TS, NT, K, V, *w.stride()[:2],
        *u.stride()[:2], *kd.stride()[:2], *gc.stride()[:2], *(s.stride() if s is not None else (0, 0, 0, 0)),
        *hs.stride()[:3], *vn.stride()[:2], *final.stride()[:3], KB=min(KP, 64), TWO=KP > 64, BV=BV,
        HAS_STATE=s is not None, DOT=dot, REGULAR=regular, num_warps=cfg.scan_warps, num_stages=cfg.num_stages)
    nvb, vf = triton.cdiv(V, OBV), cfg.out_v_first
    if M:
        kern.output_kernel[(M * nvb, Hv, 1) if vf else (M, Hv, nvb)](
            q3, gc, aq, hs, vn, o3, *maps, K, V, group, scale, eps, *q3.stride(), *gc.stride()[:2], *aq.stride()[:2],
            *hs.stride()[:3], *vn.stride()[:2], *o3.stride()[:2], KB=min(KP, 64), TWO=KP > 64, BV=OBV, L2NORM=l2,
            DOT=dot, REGULAR=regular, V_FIRST=vf, num_warps=cfg.out_warps, num_stages=cfg.num_stages)
