"""``kda::gated_norm_merge``: the spec / non-spec merge (``index_copy_``) and the gated
RMSNorm of a GDN/KDA layer in one pass, with no merged buffer.

``sources[k]`` is ``[n_k, R * D]`` (token rows, ``R`` norm rows of ``D = weight.shape[0]``
each per token), ``indices[k]`` ``[n_k]`` the token each row goes to (negative counts from
the end, as ``out[:, idx] = ...`` does). ``merged`` has ``P = rows(z) // R`` tokens, all
``pad_value`` at first (``torch.zeros`` / ``torch.full``; ``None``: ``torch.empty``, undefined,
and then ``P == num_tokens``), then ``merged[indices[k][i]] = sources[k][i]`` for the first
``num_tokens`` of them: the tokens after those are the padding of a longer output the merge
was copied into (``core_attn_out[:n] = merged.squeeze(0)``). Viewed as ``[P * R, D]``, the op
returns ``y [P * R, D]`` (``out_dtype``). The gate ``z`` is ``[P * R, D]``, or ``[A, B, D]`` with
``A * B = P * R`` and any strides: its rows in order, read where they lie (a strided split of
a projection, ``[P, R * D]`` viewed ``[P, R, D]``, needs no copy)::

    x = merged.float(); r = rsqrt(mean(x * x, -1) + eps)        (or 1 / sqrt(...))
    form "fla": y = ((x * r) * weight.float()) * act(z.float())
    form "hf":  n = (x * r).to(in_dtype); h = weight * n        (in promote(weight, in_dtype))
                y = h.float() * act(z.float())

With one source and no indices, ``merged`` is ``sources[0]``: the merge-free gated RMSNorm.
``act`` is ``silu`` or ``sigmoid``; ``eps`` is an argument, never baked in. Rows of
``merged`` that no index covers hold ``pad_value`` (undefined where it is None, as in
``torch.empty``); the pattern matches merges into ``torch.empty``, ``torch.zeros`` and
``torch.full`` whose index lengths may partition the tokens, and where they do not (a
symbolic count that differs at run time) the CUDA path computes eager's merge-then-norm.
The CPU kernel computes exactly what eager does for those spellings (bit-exact); the Triton
kernel scatters: program ``p`` reads row ``p`` of one source, its token's gate rows of ``z``,
and writes that token's rows of ``y``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from kda_inductor.lowerings import arg_error as _err
from kda_inductor.lowerings import block_for_programs, definitely, triton_launch_options
from kda_inductor.lowerings._triton import tl, triton

ACTIVATIONS = ("silu", "sigmoid")
FORMS = ("fla", "hf")


def validate(sources, indices, z, weight, eps, activation, form, num_tokens, pad_value=None, in_dtype=None):
    """Sync-free checks of every argument, each bad one an error naming it (the op's CPU,
    CUDA and fake impls, ``gated_norm_quant``'s); returns ``(R, D, P)``: norm rows per token,
    their size, tokens. Sizes may be symbolic."""
    if not 1 <= len(sources) <= 2 or len(indices) not in (len(sources), 0) or (not indices and len(sources) != 1):
        raise _err("sources", f"expected 1 or 2 sources with as many indices (or 1 source and no indices: "
                   f"the merge-free norm), got {len(sources)} and {len(indices)}")
    if activation not in ACTIVATIONS:
        raise _err("activation", f"expected one of {ACTIVATIONS}, got {activation!r}")
    if form not in FORMS:
        raise _err("form", f"expected one of {FORMS}, got {form!r}")
    if z.dim() not in (2, 3):
        raise _err("z", f"expected [P * R, D] or [A, B, D] (A * B = P * R), got shape {tuple(z.shape)}")
    z_rows, D = gate_rows(z)
    if weight.dim() != 1 or weight.shape[0] != D:
        raise _err("weight", f"expected [D] = [{D}] (z's rows), got shape {tuple(weight.shape)}")
    if sources[0].dim() != 2 or sources[0].shape[1] % D or sources[0].shape[1] == 0:
        raise _err("sources[0]", f"expected [n, R * {D}] (R norm rows of D={D} per token), got "
                   f"{tuple(sources[0].shape)}")
    R = sources[0].shape[1] // D
    if definitely(z_rows % R != 0):
        raise _err("z", f"{z_rows} rows is not a multiple of R = {R} norm rows per token")
    P = z_rows // R
    if definitely(num_tokens < 0) or definitely(num_tokens > P) or (pad_value is None and definitely(num_tokens != P)):
        raise _err("num_tokens", f"expected {'' if pad_value is None else '<= '}{P} (z's tokens"
                   f"{'' if pad_value is None else '; the rest are padding'}), got {num_tokens}")
    _check_sources(sources, indices, z, R, D, num_tokens)
    if weight.device != z.device:
        raise _err("weight", f"expected device {z.device}, got {weight.device}")
    if eps < 0:
        raise _err("eps", f"must be >= 0, got {eps}")
    if in_dtype is not None and (in_dtype not in (torch.bfloat16, torch.float16) or sources[0].dtype != torch.float32):
        raise _err("in_dtype", f"expected bfloat16 / float16 with float32 sources (rounded to it first), got "
                   f"{in_dtype} with {sources[0].dtype} sources")
    return R, D, P


def _check_sources(sources, indices, z, R, D, num_tokens) -> None:
    """The sources' and indices' shapes, dtypes and devices (``validate``'s second half)."""
    dtype = sources[0].dtype
    if not indices and definitely(sources[0].shape[0] != num_tokens):
        raise _err("sources[0]", f"without indices the source is the tokens in order: expected {num_tokens} rows, "
                   f"got {sources[0].shape[0]}")
    for k, src in enumerate(sources):
        if src.dim() != 2 or src.shape[1] != R * D:
            raise _err(f"sources[{k}]", f"expected [n, {R * D}] (R={R} rows of D={D} per token), got {tuple(src.shape)}")
        if src.dtype != dtype:
            raise _err(f"sources[{k}]", f"expected {dtype} like sources[0], got {src.dtype}")
        if src.device != z.device:
            raise _err(f"sources[{k}]", f"expected device {z.device}, got {src.device}")
    for k, (src, idx) in enumerate(zip(sources, indices)):
        if idx.dim() != 1 or definitely(idx.shape[0] != src.shape[0]) or idx.dtype not in (torch.int32, torch.int64):
            raise _err(f"indices[{k}]", f"expected a 1-D int32/int64 tensor of {src.shape[0]} entries, "
                       f"got {idx.dim()}-D {idx.dtype} of shape {tuple(idx.shape)}")
        if idx.device != z.device:
            raise _err(f"indices[{k}]", f"expected device {z.device}, got {idx.device}")


def gate_rows(z: Tensor) -> tuple:
    """``(rows, D)`` of the gate: ``[rows, D]``, or ``[A, B, D]`` with ``A * B`` rows."""
    return (z.shape[0], z.shape[1]) if z.dim() == 2 else (z.shape[0] * z.shape[1], z.shape[2])


def hf_dtype(weight: Tensor, in_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the ``hf`` form's ``weight * n`` (``n`` in the input dtype)."""
    return torch.promote_types(weight.dtype, in_dtype)


def host_scalar(t: Tensor | None, arg: str, default: float) -> float:
    """The value of a lifted float (a 0-d CPU tensor: reading it is no device sync), or
    ``default`` without one."""
    if t is None:
        return default
    if not isinstance(t, Tensor) or t.dim() != 0 or t.device.type != "cpu" or not t.is_floating_point():
        raise _err(arg, f"expected a 0-d floating-point CPU tensor, got {getattr(t, 'shape', t)!r}")
    return float(t)


@torch.library.custom_op("kda::gated_norm_merge", mutates_args=(), device_types="cpu")
def gated_norm_merge(sources: list[Tensor], indices: list[Tensor], z: Tensor, weight: Tensor,
                     eps: float, activation: str, form: str, rsqrt: bool, num_tokens: int,
                     out_dtype: torch.dtype, pad_value: float | None = None,
                     eps_input: Tensor | None = None, in_dtype: torch.dtype | None = None) -> Tensor:
    """See the module docstring. ``eps_input``: eps as the 0-d CPU tensor ``dynamic=True``
    lifts a float attribute to (overrides ``eps``; read on the host, no device sync).
    ``in_dtype``: float32 sources are first rounded to this 16-bit dtype (the norm's input is
    their rounding; the op reads them before it, see ``patterns/_merged_norms._source_reads``)."""
    eps = host_scalar(eps_input, "eps_input", eps)
    validate(sources, indices, z, weight, eps, activation, form, num_tokens, pad_value, in_dtype)
    return merge_then_norm(sources, indices, z, weight, eps, activation, form, rsqrt, num_tokens, out_dtype,
                            pad_value, check_range=True, in_dtype=in_dtype)


def merge_then_norm(sources, indices, z, weight, eps, activation, form, rsqrt, num_tokens, out_dtype,
                     pad_value=None, *, check_range: bool, in_dtype: torch.dtype | None = None) -> Tensor:
    """Eager's computation, op for op: the CPU kernel, and the CUDA path when the index
    lengths do not add up to the tokens (uncovered rows, or duplicates where the later
    write must win). ``check_range`` reads the indices on the host (CPU only: a sync)."""
    if in_dtype is not None:
        sources = [s.to(in_dtype) for s in sources]
    z = z.reshape(-1, z.shape[-1])
    D = z.shape[1]
    R = sources[0].shape[1] // D
    P = z.shape[0] // R
    if not indices:
        merged = sources[0]
    elif pad_value is None:
        merged = sources[0].new_empty(num_tokens, R * D)
    else:
        merged = sources[0].new_full((num_tokens, R * D), pad_value)
    for k, (src, idx) in enumerate(zip(sources, indices)):
        if check_range and idx.numel():
            lo, hi = int(idx.min()), int(idx.max())
            if lo < -num_tokens or hi >= num_tokens:
                raise _err(f"indices[{k}]", f"index {lo if lo < -num_tokens else hi} out of range "
                           f"[-{num_tokens}, {num_tokens})", IndexError)
        merged.index_copy_(0, torch.where(idx < 0, idx + num_tokens, idx).long(), src)
    if P > num_tokens:
        merged = torch.cat([merged, merged.new_full((P - num_tokens, R * D), pad_value)])
    x = merged.reshape(-1, D).float()
    var = x.pow(2).mean(-1, keepdim=True) + eps
    r = torch.rsqrt(var) if rsqrt else 1 / torch.sqrt(var)
    zf = z.float()
    act = F.silu(zf) if activation == "silu" else torch.sigmoid(zf)
    if form == "fla":
        y = x * r * weight.float() * act
    else:
        n = (x * r).to(merged.dtype)
        y = (weight * n).float() * act
    return y.to(out_dtype)


@gated_norm_merge.register_fake
def _gated_norm_merge_fake(sources, indices, z, weight, eps, activation, form, rsqrt, num_tokens, out_dtype,
                           pad_value=None, eps_input=None, in_dtype=None):
    validate(sources, indices, z, weight, eps, activation, form, num_tokens, pad_value, in_dtype)
    return z.new_empty(gate_rows(z), dtype=out_dtype)


@gated_norm_merge.register_kernel("cuda")
def _gated_norm_merge_cuda(sources, indices, z, weight, eps, activation, form, rsqrt, num_tokens, out_dtype,
                           pad_value=None, eps_input=None, in_dtype=None):
    eps = host_scalar(eps_input, "eps_input", eps)
    validate(sources, indices, z, weight, eps, activation, form, num_tokens, pad_value, in_dtype)
    if sum(s.shape[0] for s in sources) != num_tokens:  # not a partition (a symbolic T matched)
        return merge_then_norm(sources, indices, z, weight, eps, activation, form, rsqrt, num_tokens, out_dtype,
                                pad_value, check_range=False, in_dtype=in_dtype)
    y = z.new_empty(gate_rows(z), dtype=out_dtype)
    if not indices and pad_value is None:  # the merge-free norm: its own kernel
        return norm_rows_triton(sources[0], z, weight, y, eps=eps, activation=activation, form=form, rsqrt=rsqrt,
                                in_dtype=in_dtype)
    norm_merge_triton(sources, indices, z, weight, y, eps=eps, activation=activation, form=form,
                      rsqrt=rsqrt, num_tokens=num_tokens, pad_value=pad_value, in_dtype=in_dtype)
    return y


# --------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------
TL_DTYPES = {}
"""torch dtype -> Triton dtype of the kernels' constexprs (``IN_DTYPE``, ``HF_DTYPE``, ...)."""
if triton is not None:
    from kda_inductor.lowerings._fp8 import bf16_round

    TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}

    @triton.jit
    def gated_rms_norm(x, g, w, D, eps, SIGMOID: tl.constexpr, HF: tl.constexpr, RSQRT: tl.constexpr,
                       IN_DTYPE: tl.constexpr, HF_DTYPE: tl.constexpr):
        """``y`` (float32) of rows ``x`` (float32, masked columns 0), gate ``g`` (float32) and
        weight ``w``, in the order of the module docstring's two forms: every kernel's math."""
        var = tl.sum(x * x, axis=1)[:, None] / D + eps
        if RSQRT:
            r = tl.math.rsqrt(var)
        else:
            r = 1.0 / tl.sqrt_rn(var)
        if SIGMOID:
            act = tl.sigmoid(g)
        else:  # silu, as Inductor decomposes it
            act = g / (1.0 + tl.exp(-g))
        if not HF:
            y = x * r * w.to(tl.float32) * act
        else:
            n = (x * r).to(IN_DTYPE)
            wn = (w.to(tl.float32) * n.to(tl.float32)).to(HF_DTYPE)
            y = wn.to(tl.float32) * act
        return y

    @triton.jit
    def round_input(x, IN_DTYPE: tl.constexpr, ROUND_IN: tl.constexpr):
        """``ROUND_IN``: the float32 sources read as the norm's 16-bit input (``in_dtype``): ``x``
        rounded to ``IN_DTYPE`` (to nearest, ties to even, as eager's cast), kept as float32;
        bf16 by integer arithmetic, the same bits on the GPU and under the interpreter (whose cast
        truncates)."""
        if ROUND_IN:
            if IN_DTYPE == tl.bfloat16:
                x = bf16_round(x)
            else:
                x = x.to(IN_DTYPE).to(tl.float32)
        return x

    @triton.jit
    def group_offset(row, rows_per_group, stride_group, stride_row):
        """Where row ``row`` of a tensor addressed as groups of rows starts: ``(row //
        rows_per_group) * stride_group + (row % rows_per_group) * stride_row`` (a 2-D tensor:
        groups of one row, Triton specializes the 1)."""
        return (row // rows_per_group) * stride_group + (row % rows_per_group) * stride_row

    @triton.jit
    def load_gate(z_ptr, row, z_rows_per_group, z_stride_group, z_stride_row, z_stride_col, dd, m):
        """The gate rows ``row`` (``[BLOCK, 1]``) at columns ``dd``, in float32."""
        zoff = group_offset(row, z_rows_per_group, z_stride_group, z_stride_row)
        return tl.load(z_ptr + zoff + dd * z_stride_col, mask=m, other=0.0).to(tl.float32)

    @triton.jit
    def merge_token(p, n0, n1, idx0, idx1, T, IDENTITY: tl.constexpr, PADDED: tl.constexpr, MSG: tl.constexpr):
        """``(first, i, t)`` of program row ``p``: from source 0 (``first``: p < n0) or 1, its
        row ``i`` there, the token ``t`` it goes to (negative indices count from the end, as
        ``out[:, idx]``; asserted in range, ``MSG`` the message). ``IDENTITY``: no merge, row
        p is token p (padding tokens too: they follow the source's rows). ``PADDED``: programs
        p >= n0 + n1 are the padding tokens T + (p - n0 - n1)."""
        first = p < n0
        i = tl.where(first, p, p - n0).to(tl.int64)
        if IDENTITY:
            t = p.to(tl.int64)
        else:
            t0 = tl.load(idx0 + i, mask=first, other=0).to(tl.int64)
            t1 = tl.load(idx1 + i, mask=(p >= n0) & (p < n0 + n1), other=0).to(tl.int64)
            t = tl.where(first, t0, t1)
            t = tl.where(t < 0, t + T, t)
            if PADDED:
                t = tl.where(p < n0 + n1, t, T + (p - n0 - n1))
                tl.device_assert((t >= 0) & ((t < T) | (p >= n0 + n1)), MSG)
            else:
                tl.device_assert((t >= 0) & (t < T), MSG)
        return first, i, t

    @triton.jit
    def load_merge_rows(src0, src1, first, i, p, n0, n1, src_stride0, src_stride1, rr, dd, m, D, pad,
                        PADDED: tl.constexpr):
        """Row ``i`` of source 0 (``first``) or 1, columns of norm rows ``rr``, in float32;
        padding programs (``PADDED``, p >= n0 + n1) read ``pad``."""
        col = rr * D + dd
        row = tl.where(first, src0 + i * src_stride0, src1 + i * src_stride1)
        if PADDED:
            real = (rr * 0 + p) < n0 + n1  # as a vector: the interpreter mis-types scalar & vector masks
            x = tl.load(row + col, mask=m & real, other=0.0).to(tl.float32)
            x = tl.where(real, x, tl.where(m, pad, 0.0))
        else:
            x = tl.load(row + col, mask=m, other=0.0).to(tl.float32)
        return x

    @triton.jit
    def merge_norm_tile(
        src0, src1, idx0, idx1, n0, n1, src_stride0, src_stride1,
        z_ptr, z_rows_per_group, z_stride_group, z_stride_row, z_stride_col, w_ptr, T, R, D, eps, pad,
        SIGMOID: tl.constexpr, HF: tl.constexpr, RSQRT: tl.constexpr, IN_DTYPE: tl.constexpr,
        HF_DTYPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, IDENTITY: tl.constexpr,
        PADDED: tl.constexpr, ROUND_IN: tl.constexpr, MSG: tl.constexpr,
    ):
        """Program (p, h)'s tile of the merge kernels (``gated_norm_merge``, ``gated_norm_quant``):
        row p of source 0 (p < n0) or p - n0 of source 1 (``merge_token``) -> rows h * BLOCK_R ..
        of its token's R norm rows. Returns ``(y, t, rr, dd, m, zrow)``: ``y`` float32 ``[BLOCK_R,
        BLOCK_D]``, the token, the tile's norm rows and columns, their mask, and the rows of ``y``
        (of the gate) they are. Gate row ``q`` lies at ``group_offset(q, z_rows_per_group, ..)``."""
        p = tl.program_id(0)
        h = tl.program_id(1)
        first, i, t = merge_token(p, n0, n1, idx0, idx1, T, IDENTITY, PADDED, MSG)
        rr = h * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
        dd = tl.arange(0, BLOCK_D)[None, :]
        m = (rr < R) & (dd < D)
        x = load_merge_rows(src0, src1, first, i, p, n0, n1, src_stride0, src_stride1, rr, dd, m, D, pad, PADDED)
        x = round_input(x, IN_DTYPE, ROUND_IN)
        w = tl.load(w_ptr + dd, mask=dd < D, other=0.0)
        zrow = t * R + rr
        g = load_gate(z_ptr, zrow, z_rows_per_group, z_stride_group, z_stride_row, z_stride_col, dd, m)
        y = gated_rms_norm(x, g, w, D, eps, SIGMOID, HF, RSQRT, IN_DTYPE, HF_DTYPE)
        return y, t, rr, dd, m, zrow

    @triton.jit(do_not_specialize=["n0", "n1", "T"], debug=True)
    def _gated_norm_merge_kernel(
        src0, src1, idx0, idx1, n0, n1, src_stride0, src_stride1,
        z_ptr, z_rows_per_group, z_stride_group, z_stride_row, z_stride_col, w_ptr, y_ptr, T, R, D, eps, pad,
        SIGMOID: tl.constexpr, HF: tl.constexpr, RSQRT: tl.constexpr, IN_DTYPE: tl.constexpr,
        HF_DTYPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, IDENTITY: tl.constexpr,
        PADDED: tl.constexpr, ROUND_IN: tl.constexpr,
    ):
        """Program (p, h): ``merge_norm_tile``'s rows of ``y``."""
        y, _, _, dd, m, zrow = merge_norm_tile(
            src0, src1, idx0, idx1, n0, n1, src_stride0, src_stride1,
            z_ptr, z_rows_per_group, z_stride_group, z_stride_row, z_stride_col, w_ptr, T, R, D, eps, pad,
            SIGMOID, HF, RSQRT, IN_DTYPE, HF_DTYPE, BLOCK_R, BLOCK_D, IDENTITY, PADDED, ROUND_IN,
            "gated_norm_merge: index out of range")
        tl.store(y_ptr + zrow * D + dd, y.to(y_ptr.dtype.element_ty), mask=m)

    @triton.jit(do_not_specialize=["rows"])
    def _gated_norm_rows_kernel(
        x_ptr, x_rows_per_group, x_stride_group, x_stride_row,
        z_ptr, z_rows_per_group, z_stride_group, z_stride_row, z_stride_col, w_ptr, y_ptr, rows, D, eps,
        SIGMOID: tl.constexpr, HF: tl.constexpr, RSQRT: tl.constexpr, IN_DTYPE: tl.constexpr,
        HF_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, ROUND_IN: tl.constexpr,
    ):
        """The merge-free gated RMSNorm: program ``p`` normalizes rows ``p * BLOCK_M ..`` of
        ``x`` with their gate rows into ``y [rows, D]``; ``x`` and ``z`` are addressed as groups
        of rows (``group_offset``). No index, no assert: compiled without debug."""
        rr = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
        dd = tl.arange(0, BLOCK_D)[None, :]
        m = (rr < rows) & (dd < D)
        xoff = group_offset(rr, x_rows_per_group, x_stride_group, x_stride_row)
        x = round_input(tl.load(x_ptr + xoff + dd, mask=m, other=0.0).to(tl.float32), IN_DTYPE, ROUND_IN)
        w = tl.load(w_ptr + dd, mask=dd < D, other=0.0)
        g = load_gate(z_ptr, rr, z_rows_per_group, z_stride_group, z_stride_row, z_stride_col, dd, m)
        y = gated_rms_norm(x, g, w, D, eps, SIGMOID, HF, RSQRT, IN_DTYPE, HF_DTYPE)
        tl.store(y_ptr + rr * D + dd, y.to(y_ptr.dtype.element_ty), mask=m)


TARGET_PROGRAMS = 1024
MAX_BLOCK_ELEMENTS = 1024


def rows_per_program(tokens: int, R: int, D: int = 128, target: int = TARGET_PROGRAMS) -> int:
    """Norm rows (heads) per program, a power of two, at most ``MAX_BLOCK_ELEMENTS`` values
    per program, halved while fewer than ``target`` programs would run: 8 rows and 2 warps
    were best at few and at many tokens, near a plain copy of the bytes at many (measured:
    ``benchmarks/results/gated_norm_merge.md``, the kernel sweep of
    ``benchmarks/tune_gated_norm_merge.py``, H=32, D=128)."""
    block = max(1, min(triton.next_power_of_2(R), MAX_BLOCK_ELEMENTS // triton.next_power_of_2(D)))
    return block_for_programs(block, lambda b: tokens * triton.cdiv(R, b), target)


def token_rows(src: Tensor) -> tuple[Tensor, int]:
    """``src`` with unit column stride (copied only where it has none) and its token stride."""
    if src.stride(-1) != 1 and src.shape[-1] != 1:
        src = src.contiguous()
    return src, src.stride(0)


def gate_strides(z: Tensor) -> tuple[int, int, int, int]:
    """The kernels' ``z_rows_per_group, z_stride_group, z_stride_row, z_stride_col``."""
    if z.dim() == 2:
        return 1, z.stride(0), 0, z.stride(1)
    return z.shape[1], z.stride(0), z.stride(1), z.stride(2)


def warps_for(block_r: int, block_d: int) -> int:
    """The merge kernels' default warps: one per 512 values of a program's tile, 1 to 8."""
    return max(1, min(8, block_r * block_d // 512))


class MergeLaunch(NamedTuple):
    """What both merge kernels (``gated_norm_merge``'s, ``gated_norm_quant``'s) are launched
    with: ``programs`` token rows (sources, then padding tokens), ``R`` norm rows of ``D``
    per token, the runtime arguments before the outputs (``inputs``: sources, indices, their
    counts and strides, the gate and its strides, the weight) and after them (``sizes``: ``T``,
    ``R``, ``D``, ``eps``, ``pad``), and the constexprs they share."""

    programs: int
    R: int
    D: int
    inputs: tuple
    sizes: tuple
    constexprs: dict


def norm_constexprs(activation: str, form: str, rsqrt: bool, source_dtype: torch.dtype, weight: Tensor,
                    in_dtype: torch.dtype | None = None) -> dict:
    """The norm's constexprs, every kernel's (``gated_rms_norm``'s, ``round_input``'s and
    ``BLOCK_D``): the norm's input dtype is ``in_dtype`` where given (float32 sources rounded to
    it first), else the sources'."""
    dtype = in_dtype or source_dtype
    return dict(SIGMOID=activation == "sigmoid", HF=form == "hf", RSQRT=rsqrt, IN_DTYPE=TL_DTYPES[dtype],
                HF_DTYPE=TL_DTYPES[hf_dtype(weight, dtype)], BLOCK_D=triton.next_power_of_2(weight.shape[0]),
                ROUND_IN=dtype != source_dtype)


def merge_launch(sources, indices, z, weight, *, eps: float, activation: str, form: str, rsqrt: bool,
                 num_tokens: int, pad_value: float | None, in_dtype: torch.dtype | None = None) -> MergeLaunch:
    """The launch of the module docstring's scatter for validated arguments (no sync)."""
    D = weight.shape[0]
    R = sources[0].shape[1] // D
    pad_tokens = gate_rows(z)[0] // R - num_tokens
    srcs = [token_rows(s) for s in sources]
    n = [s.shape[0] for s in sources] + [0]
    s1, st1 = srcs[1] if len(srcs) > 1 else srcs[0]
    identity = not indices
    idx0 = srcs[0][0] if identity else indices[0]  # unused pointer when identity
    idx1 = idx0 if len(indices) < 2 else indices[1]
    constexprs = dict(norm_constexprs(activation, form, rsqrt, sources[0].dtype, weight, in_dtype), IDENTITY=identity,
                      PADDED=pad_tokens > 0)
    inputs = (srcs[0][0], s1, idx0, idx1, n[0], n[1], srcs[0][1], st1, z, *gate_strides(z), weight)
    sizes = (num_tokens, R, D, eps, 0.0 if pad_value is None else float(pad_value))
    return MergeLaunch(n[0] + n[1] + pad_tokens, R, D, inputs, sizes, constexprs)


def norm_merge_triton(sources, indices, z, weight, y, *, eps: float, activation: str, form: str,
                      rsqrt: bool, num_tokens: int, pad_value: float | None = None, num_warps: int | None = None,
                      block_r: int | None = None, in_dtype: torch.dtype | None = None):
    """One launch writing ``y`` (fresh, contiguous ``[P * R, D]``). No sync, no allocation."""
    if triton is None:  # pragma: no cover
        raise RuntimeError("gated_norm_merge: the Triton kernel needs triton, which is not installed")
    L = merge_launch(sources, indices, z, weight, eps=eps, activation=activation, form=form, rsqrt=rsqrt,
                     num_tokens=num_tokens, pad_value=pad_value, in_dtype=in_dtype)
    if L.programs == 0:
        return y
    block_r = block_r or rows_per_program(L.programs, L.R, L.D)
    extra = triton_launch_options() if y.is_cuda else {}
    _gated_norm_merge_kernel[(L.programs, triton.cdiv(L.R, block_r))](
        *L.inputs, y, *L.sizes, **L.constexprs, BLOCK_R=block_r,
        num_warps=warps_for(block_r, L.constexprs["BLOCK_D"]) if num_warps is None else num_warps, **extra,
    )
    return y


ROWS_CONFIGS = ((1024, 1, 1), (8192, 16, 8), (262144, 16, 4), (None, 8, 1))
"""``(up to rows, BLOCK_M, num_warps)`` of the merge-free kernel, for D = 128: the fastest of
every ``(BLOCK_M, num_warps)`` in {1, 2, 4, 8, 16} x {1, 2, 4, 8} at each size, read off the
sweep in ``benchmarks/results/gated_norm_symbolic.md`` (the time depends on the rows
``T * H``, not on ``H``). Other ``D`` keep ``BLOCK_M * D``."""


def rows_config(rows: int, D: int = 128) -> tuple[int, int]:
    """``(BLOCK_M, num_warps)`` of the merge-free kernel for ``rows`` norm rows of ``D``."""
    block_d = triton.next_power_of_2(D)
    for limit, block_m, warps in ROWS_CONFIGS:
        if limit is None or rows <= limit:
            return max(1, block_m * 128 // block_d), warps
    raise AssertionError("unreachable")


def norm_rows_triton(x: Tensor, z: Tensor, weight: Tensor, y: Tensor, *, eps: float, activation: str,
                     form: str, rsqrt: bool, block_m: int | None = None, num_warps: int | None = None,
                     in_dtype: torch.dtype | None = None) -> Tensor:
    """The merge-free gated RMSNorm of ``x [n, R * D]`` (token-strided; ``R`` norm rows per
    token) into ``y`` (fresh, contiguous ``[n * R, D]``): one launch, no sync, no allocation."""
    if triton is None:  # pragma: no cover
        raise RuntimeError("gated_norm_merge: the Triton kernel needs triton, which is not installed")
    D = weight.shape[0]
    x, x_stride = token_rows(x)
    R = x.shape[1] // D
    rows = x.shape[0] * R
    if rows == 0:
        return y
    auto_m, auto_w = rows_config(rows, D)
    block_m, num_warps = block_m or auto_m, num_warps or auto_w
    _gated_norm_rows_kernel[(triton.cdiv(rows, block_m),)](
        x, *((1, D, 0) if x_stride == R * D else (R, x_stride, D)), z, *gate_strides(z), weight, y, rows, D, eps,
        **norm_constexprs(activation, form, rsqrt, x.dtype, weight, in_dtype), BLOCK_M=block_m, num_warps=num_warps,
    )
    return y


def aot_variants():
    """Both forms, both gates, rsqrt or 1 / sqrt (the merge), the merge-free norm, the merge
    copied into a padded output, and the merge-free kernel (``_gated_norm_rows_kernel``, both
    forms and gates, the smallest and the largest ``ROWS_CONFIGS`` tile), for the ahead-of-time
    sm_90 compile check."""
    import itertools

    from kda_inductor.lowerings import AotVariant, debug_options

    types = dict(src0="*bf16", src1="*bf16", idx0="*i64", idx1="*i64", n0="i32", n1="i32", src_stride0="i32",
                 src_stride1="i32", z_ptr="*bf16", z_rows_per_group="i32", z_stride_group="i32",
                 z_stride_row="i32", z_stride_col="i32", w_ptr="*fp32",
                 y_ptr="*bf16", T="i32", R="i32", D="i32", eps="fp32", pad="fp32")
    base = dict(IN_DTYPE=tl.bfloat16, HF_DTYPE=tl.float32, BLOCK_R=8, BLOCK_D=128, IDENTITY=False, PADDED=False,
                ROUND_IN=False)
    for hf, sigmoid, rsqrt in itertools.product((False, True), repeat=3):
        yield AotVariant(_gated_norm_merge_kernel, types, {**base, "SIGMOID": sigmoid, "HF": hf, "RSQRT": rsqrt},
                         debug_options())
    plain = {**base, "SIGMOID": True, "HF": False, "RSQRT": True}
    yield AotVariant(_gated_norm_merge_kernel, types, {**plain, "IDENTITY": True}, debug_options())
    yield AotVariant(_gated_norm_merge_kernel, types, {**plain, "PADDED": True}, debug_options())
    yield AotVariant(_gated_norm_merge_kernel, types, {**plain, "IDENTITY": True, "PADDED": True}, debug_options())
    rows = dict(x_ptr="*bf16", x_rows_per_group="i32", x_stride_group="i32", x_stride_row="i32", z_ptr="*bf16",
                z_rows_per_group="i32", z_stride_group="i32", z_stride_row="i32", z_stride_col="i32", w_ptr="*fp32",
                y_ptr="*bf16", rows="i32", D="i32", eps="fp32")
    for hf, sigmoid in itertools.product((False, True), repeat=2):
        consts = dict(SIGMOID=sigmoid, HF=hf, RSQRT=True, IN_DTYPE=tl.bfloat16, HF_DTYPE=tl.float32, BLOCK_M=16,
                      BLOCK_D=128, ROUND_IN=False)
        yield AotVariant(_gated_norm_rows_kernel, rows, consts, {"num_warps": 8})
    yield AotVariant(_gated_norm_rows_kernel, rows, {**consts, "BLOCK_M": 1}, {"num_warps": 1})
    # float32 sources read as the bf16 input they round to (transformers' recurrent decode core)
    yield AotVariant(_gated_norm_rows_kernel, {**rows, "x_ptr": "*fp32"}, {**consts, "ROUND_IN": True},
                     {"num_warps": 8})
