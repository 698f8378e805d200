"""``kda::gated_norm_quant``: ``kda::gated_norm_merge`` (the merge and the gated RMSNorm of a
GDN/KDA layer, see its module docstring) followed by vLLM's dynamic FP8 e4m3 quantization of
its output (``QuantFP8.forward_native``), in one pass: neither the merged buffer nor the norm's
output is written.

The arguments up to ``num_tokens`` and ``pad_value`` / ``eps_input`` are the norm's;
``norm_dtype`` is its output dtype (``out_dtype``). The op returns ``(q, scales)``, exactly::

    y = gated_norm_merge(sources, indices, z, weight, eps, activation, form, rsqrt,
                         num_tokens, norm_dtype, pad_value, eps_input)   # [rows, D], norm_dtype
    x = y.reshape(-1, width)                     # [M, K]: the quantizer's tokens, K = width
    xg = x.view(-1, K // group_size, group_size)
    amax = xg.abs().amax(-1, keepdim=True).float()
    s = amax / 448.0
    if ue8m0: s = torch.exp2(torch.ceil(torch.log2(s)))
    s = s.clamp(min=1.0 / (448.0 * 512.0))
    xs = xg.float() * s.reciprocal() if reciprocal else xg / s
    q = xs.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(-1, K)  # [M, K]
    scales = s.squeeze(-1)                                           # [M, G] float32, G = K // group_size
    if column_major: scales = scales.t().contiguous().t()            # same values, strides (1, M)

(group quantization divides by ``s``; per-token quantization, ``group_size == width``, is
spelled with ``reciprocal=True``). ``M = rows * D // width``; ``width`` must divide the
``rows * D`` values of ``y`` and ``group_size`` must divide ``width``.

The CPU kernel is that code (bit-exact). On CUDA one Triton kernel computes it: program
``(p, h)`` takes row ``p`` of one source (the merge's scatter: it writes token ``idx[p]``;
without indices row ``p`` is token ``p``, the tokens taken several at a time where they have
few norm rows, ``regroup``; padding tokens hold ``pad_value``), normalizes the
norm rows ``h * BLOCK_R ..`` of that token with ``gated_norm_merge``'s ``merge_norm_tile``,
rounds ``y`` to ``norm_dtype`` in registers, and quantizes groups that lie inside the tile (the
scale with one ``div_rn`` per group; ``x / s`` as ``GROUP_DIVIDE`` says, by default a reciprocal
per group, a multiply and a correction per value: IEEE's quotient; ``reciprocal=True``: the
multiply alone, eager's spelling):

* ``group_size`` a multiple ``k * D`` of the norm row with ``k`` dividing ``R`` (the norm rows
  per token): ``k == 1`` is one group per norm row (``group_size == D``), ``k == R`` one group
  per token (``group_size == width == R * D``, the per-token scale); any ``D``;
* ``group_size`` a power of two dividing ``D``: several groups per norm row.

Other layouts (a group spanning tokens; a group that neither divides nor is a multiple of
``D``; index lengths that do not partition ``num_tokens``, as ``gated_norm_merge``'s CUDA path)
run the norm op and then the quantization code above on the GPU. Scales are stored row-major
``[M, G]`` or column-major (strides ``(1, M)``); ``q`` is contiguous ``[M, K]``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from kda_inductor.lowerings import arg_error as _err
from kda_inductor.lowerings import definitely, triton_launch_options
from kda_inductor.lowerings._fp8 import FP8_MAX, SCALE_FLOOR, hardware_casts
from kda_inductor.lowerings._triton import tl, triton
from kda_inductor.lowerings.gated_norm_merge import (
    MAX_BLOCK_ELEMENTS,
    TARGET_PROGRAMS,
    TL_DTYPES,
    MergeLaunch,
    gate_rows,
    host_scalar,
    merge_launch,
    merge_then_norm,
    rows_per_program,
    warps_for,
)
from kda_inductor.lowerings.gated_norm_merge import validate as validate_norm

NORM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DIVIDES = ("corrected", "reciprocal", "ieee")
GROUP_DIVIDE = "corrected"
"""How the CUDA kernel computes a group's ``x / s`` where the op's ``reciprocal`` is False
(eager's ``xg / s``); every mode computes the scale itself with one ``div_rn``:

* ``"corrected"`` (default): one correctly rounded reciprocal ``r = 1 / s`` per group, then per
  value ``q = x * r`` and one Markstein correction, ``fma(-fma(q, s, -x), r, q)`` (two FMAs; the
  residual ``x - q s`` negated twice so that ``-0.0`` keeps its sign): the
  correctly rounded quotient ``x / s`` (IEEE, eager's and vLLM's CUDA group quant's) wherever
  nothing underflows, and where the residual would (``|x| < 2**-102``) the fp8 value is 0 either
  way. Checked: 0 of 16.7 million quotients differ from IEEE division
  (``tests/test_lowering_gated_norm_quant.py``, CPU emulation), the kernel bit-exact with ``x / s``
  under the interpreter; ``bench_gated_norm_quant.py`` checks every value on the GPU.
* ``"reciprocal"``: ``x * r`` alone (what eager computes for ``reciprocal=True``): within one
  fp8 step of IEEE on about 0.05% of the fp8 values of a bf16 norm output (none for ue8m0
  scales, whose reciprocal is exact).
* ``"ieee"``: ``div_rn(x, s)`` per value (a dozen instructions and a branch each).

``bench_gated_norm_quant.py`` times all three (``kda``, ``kda-recip``, ``kda-ieee``)."""
_DIVIDE_MODE = {"ieee": 0, "reciprocal": 1, "corrected": 2}


def validate(sources, indices, z, weight, eps, activation, form, rsqrt, num_tokens, norm_dtype, width,
             group_size, ue8m0, reciprocal, column_major, pad_value=None, eps_input=None, in_dtype=None):
    """Sync-free checks of every argument (the norm's by ``gated_norm_merge.validate``);
    returns ``(R, D, P, M, G)``: norm rows per token, their size, tokens, the quantizer's
    tokens and groups per token. Sizes may be symbolic."""
    R, D, P = validate_norm(sources, indices, z, weight, eps, activation, form, num_tokens, pad_value, in_dtype)
    if norm_dtype not in NORM_DTYPES:
        raise _err("norm_dtype", f"expected one of {NORM_DTYPES}, got {norm_dtype}")
    for name, v in (("width", width), ("group_size", group_size)):
        if isinstance(v, bool) or not isinstance(v, (int, torch.SymInt)):
            raise _err(name, f"expected an int, got {type(v).__name__}", TypeError)
        if definitely(v <= 0):
            raise _err(name, f"must be > 0, got {v}")
    if definitely(width % group_size != 0):
        raise _err("group_size", f"{group_size} does not divide width {width}")
    values = P * R * D
    if definitely(values % width != 0):
        raise _err("width", f"{width} does not divide the norm's {P * R} rows x {D} = {values} values")
    M = values // width
    return R, D, P, M, width // group_size


def quantize(y: Tensor, width: int, group_size: int, ue8m0: bool, reciprocal: bool,
             column_major: bool) -> tuple[Tensor, Tensor]:
    """The quantization of the module docstring, op for op (eager's code): the CPU kernel's
    second half and the CUDA fallback's."""
    x = y.reshape(-1, width)
    K = x.shape[1]
    xg = x.view(-1, K // group_size, group_size)
    amax = xg.abs().amax(-1, keepdim=True).float()
    s = amax / FP8_MAX
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    s = s.clamp(min=SCALE_FLOOR)
    xs = xg.float() * s.reciprocal() if reciprocal else xg / s
    q = xs.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(-1, K)
    scales = s.squeeze(-1)
    if column_major:
        scales = scales.t().contiguous().t()
    return q, scales


@torch.library.custom_op("kda::gated_norm_quant", mutates_args=(), device_types="cpu")
def gated_norm_quant(sources: list[Tensor], indices: list[Tensor], z: Tensor, weight: Tensor,
                     eps: float, activation: str, form: str, rsqrt: bool, num_tokens: int,
                     norm_dtype: torch.dtype, width: int, group_size: int, ue8m0: bool,
                     reciprocal: bool, column_major: bool, pad_value: float | None = None,
                     eps_input: Tensor | None = None, in_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """See the module docstring. ``eps_input`` and ``in_dtype`` as in ``gated_norm_merge``."""
    eps = host_scalar(eps_input, "eps_input", eps)
    validate(sources, indices, z, weight, eps, activation, form, rsqrt, num_tokens, norm_dtype, width,
             group_size, ue8m0, reciprocal, column_major, pad_value, in_dtype=in_dtype)
    y = merge_then_norm(sources, indices, z, weight, eps, activation, form, rsqrt, num_tokens, norm_dtype,
                         pad_value, check_range=True, in_dtype=in_dtype)
    return quantize(y, width, group_size, ue8m0, reciprocal, column_major)


def _new_outputs(z: Tensor, M, width, G, column_major: bool) -> tuple[Tensor, Tensor]:
    q = z.new_empty((M, width), dtype=torch.float8_e4m3fn)
    if column_major:
        scales = z.new_empty((G, M), dtype=torch.float32).t()
    else:
        scales = z.new_empty((M, G), dtype=torch.float32)
    return q, scales


@gated_norm_quant.register_fake
def _gated_norm_quant_fake(sources, indices, z, weight, eps, activation, form, rsqrt, num_tokens, norm_dtype,
                           width, group_size, ue8m0, reciprocal, column_major, pad_value=None, eps_input=None,
                           in_dtype=None):
    _, _, _, M, G = validate(sources, indices, z, weight, eps, activation, form, rsqrt, num_tokens, norm_dtype,
                             width, group_size, ue8m0, reciprocal, column_major, pad_value, in_dtype=in_dtype)
    return _new_outputs(z, M, width, G, column_major)


def kernel_mode(R: int, D: int, group_size: int) -> tuple[int, int] | None:
    """``(ROW_GROUP, GROUP)`` of the Triton kernel for this layout, or None (the fallback):
    ``(k, 0)`` for groups of ``k`` whole norm rows (``k`` divides ``R``), ``(0, group_size)``
    for power-of-two groups dividing ``D``."""
    if group_size % D == 0 and R % (group_size // D) == 0:
        return group_size // D, 0
    if group_size < D and D % group_size == 0 and group_size & (group_size - 1) == 0:
        return 0, group_size
    return None


@gated_norm_quant.register_kernel("cuda")
def _gated_norm_quant_cuda(sources, indices, z, weight, eps, activation, form, rsqrt, num_tokens, norm_dtype,
                           width, group_size, ue8m0, reciprocal, column_major, pad_value=None, eps_input=None,
                           in_dtype=None):
    eps = host_scalar(eps_input, "eps_input", eps)
    R, D, P, M, G = validate(sources, indices, z, weight, eps, activation, form, rsqrt, num_tokens, norm_dtype,
                             width, group_size, ue8m0, reciprocal, column_major, pad_value, in_dtype=in_dtype)
    partition = sum(s.shape[0] for s in sources) == num_tokens
    if not partition or kernel_mode(R, D, group_size) is None:
        y = torch.ops.kda.gated_norm_merge.default(sources, indices, z, weight, eps, activation, form, rsqrt,
                                                   num_tokens, norm_dtype, pad_value, None, in_dtype)
        return quantize(y, width, group_size, ue8m0, reciprocal, column_major)
    q, scales = _new_outputs(z, M, width, G, column_major)
    norm_quant_triton(sources, indices, z, weight, q, scales, eps=eps, activation=activation, form=form,
                      rsqrt=rsqrt, num_tokens=num_tokens, norm_dtype=norm_dtype, group_size=group_size,
                      ue8m0=ue8m0, reciprocal=reciprocal, column_major=column_major, pad_value=pad_value,
                      in_dtype=in_dtype)
    return q, scales


# --------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------
if triton is not None:
    from kda_inductor.lowerings._fp8 import bf16_round, clamp_fp8, dynamic_scale, to_e4m3
    from kda_inductor.lowerings.gated_norm_merge import merge_norm_tile

    @triton.jit
    def quantize_bits(x, s, DIVIDE: tl.constexpr, HW_CASTS: tl.constexpr):
        """fp8 e4m3fn bits (uint8) of ``x / s`` clamped to +-448, ``s`` group-shaped (unit dims
        where the group's values lie): ``DIVIDE`` 0 ``div_rn`` per value; 1 ``x * r`` with one
        correctly rounded ``r = 1 / s`` per group; 2 that and a Markstein correction (see
        ``GROUP_DIVIDE``)."""
        if DIVIDE == 0:
            xs = tl.math.div_rn(x, s)
        else:
            r = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
            xs = x * r
            if DIVIDE == 2:  # q - (q s - x) r, the residual negated: -0.0 stays -0.0
                xs = tl.fma(-tl.fma(xs, s, -x), r, xs)
        return to_e4m3(clamp_fp8(xs), HW_CASTS)

    @triton.jit
    def _scale_offset(gflat, M, G, COLUMN_MAJOR: tl.constexpr):
        if COLUMN_MAJOR:
            return (gflat % G) * M + gflat // G
        return gflat

    @triton.jit
    def _as_norm_output(y, m, NORM_DTYPE: tl.constexpr, HW_CASTS: tl.constexpr):
        """``y`` as the norm op returns it (``NORM_DTYPE``), back in float32; masked values 0."""
        if NORM_DTYPE == tl.bfloat16 and not HW_CASTS:
            y = bf16_round(y)
        else:
            y = y.to(NORM_DTYPE).to(tl.float32)
        return tl.where(m, y, 0.0)

    @triton.jit
    def _quant_row_groups(y, t, rr, s_ptr, R, M, G, BLOCK_R: tl.constexpr, ROW_GROUP: tl.constexpr,
                          UE8M0: tl.constexpr, DIVIDE: tl.constexpr, COLUMN_MAJOR: tl.constexpr,
                          HW_CASTS: tl.constexpr, BLOCK_D: tl.constexpr):
        """Groups of ``ROW_GROUP`` whole norm rows: their scales stored, the tile's fp8 bits returned."""
        amax = tl.max(tl.abs(y), axis=1)  # [BLOCK_R]
        if ROW_GROUP > 1:  # the max over each group's rows
            same = (rr // ROW_GROUP) == (tl.reshape(rr, [1, BLOCK_R]) // ROW_GROUP)
            amax = tl.max(tl.where(same, tl.reshape(amax, [1, BLOCK_R]), 0.0), axis=1)
        s = dynamic_scale(amax, UE8M0)
        bits = quantize_bits(y, s[:, None], DIVIDE, HW_CASTS)
        r1 = tl.reshape(rr, [BLOCK_R])
        gflat = (t * R + r1) // ROW_GROUP
        tl.store(s_ptr + _scale_offset(gflat, M, G, COLUMN_MAJOR), s, mask=(r1 < R) & (r1 % ROW_GROUP == 0))
        return bits

    @triton.jit
    def _quant_column_groups(y, t, rr, s_ptr, R, D, M, G, BLOCK_R: tl.constexpr, GROUP: tl.constexpr,
                             UE8M0: tl.constexpr, DIVIDE: tl.constexpr, COLUMN_MAJOR: tl.constexpr,
                             HW_CASTS: tl.constexpr, BLOCK_D: tl.constexpr):
        """Groups of ``GROUP`` columns inside each norm row: their scales stored, the bits returned."""
        NG: tl.constexpr = BLOCK_D // GROUP
        y3 = tl.reshape(y, [BLOCK_R, NG, GROUP])
        amax = tl.max(tl.abs(y3), axis=2)  # [BLOCK_R, NG]
        s = dynamic_scale(amax, UE8M0)
        bits = quantize_bits(y3, s[:, :, None], DIVIDE, HW_CASTS)
        bits = tl.reshape(bits, [BLOCK_R, BLOCK_D])
        gj = tl.arange(0, NG)[None, :]
        gflat = (t * R + rr) * (D // GROUP) + gj
        tl.store(s_ptr + _scale_offset(gflat, M, G, COLUMN_MAJOR), s, mask=(rr < R) & (gj * GROUP < D))
        return bits

    @triton.jit(do_not_specialize=["n0", "n1", "T", "M"], debug=True)
    def _gated_norm_quant_kernel(
        src0, src1, idx0, idx1, n0, n1, src_stride0, src_stride1,
        z_ptr, z_rows_per_group, z_stride_group, z_stride_row, z_stride_col, w_ptr,
        q_ptr, s_ptr, T, R, D, eps, pad, M, G,
        SIGMOID: tl.constexpr, HF: tl.constexpr, RSQRT: tl.constexpr, IN_DTYPE: tl.constexpr,
        HF_DTYPE: tl.constexpr, NORM_DTYPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
        IDENTITY: tl.constexpr, PADDED: tl.constexpr, ROW_GROUP: tl.constexpr, GROUP: tl.constexpr,
        UE8M0: tl.constexpr, DIVIDE: tl.constexpr, COLUMN_MAJOR: tl.constexpr, HW_CASTS: tl.constexpr,
        ROUND_IN: tl.constexpr,
    ):
        """Program (p, h): ``gated_norm_merge``'s merge kernel's rows (``merge_norm_tile``: source
        row p -> its token's norm rows h * BLOCK_R ..), then the quantization of the groups in
        the tile: ``ROW_GROUP = k > 0``: groups of k norm rows (BLOCK_R >= R when k > 1); else
        groups of ``GROUP`` columns. ``HW_CASTS`` (GPU): the hardware's rounding casts; without
        it (the interpreter, whose bf16 / fp8 casts truncate) bf16 and fp8 by integer arithmetic."""
        y, t, rr, dd, m, zrow = merge_norm_tile(
            src0, src1, idx0, idx1, n0, n1, src_stride0, src_stride1,
            z_ptr, z_rows_per_group, z_stride_group, z_stride_row, z_stride_col, w_ptr, T, R, D, eps, pad,
            SIGMOID, HF, RSQRT, IN_DTYPE, HF_DTYPE, BLOCK_R, BLOCK_D, IDENTITY, PADDED, ROUND_IN,
            "gated_norm_quant: index out of range")
        y = _as_norm_output(y, m, NORM_DTYPE, HW_CASTS)
        if ROW_GROUP > 0:
            bits = _quant_row_groups(y, t, rr, s_ptr, R, M, G, BLOCK_R, ROW_GROUP, UE8M0, DIVIDE, COLUMN_MAJOR,
                                     HW_CASTS, BLOCK_D)
        else:
            bits = _quant_column_groups(y, t, rr, s_ptr, R, D, M, G, BLOCK_R, GROUP, UE8M0, DIVIDE,
                                        COLUMN_MAJOR, HW_CASTS, BLOCK_D)
        tl.store(q_ptr + zrow * D + dd, bits, mask=m)


def _check_outputs(q: Tensor, scales: Tensor, group_size: int, column_major: bool) -> tuple[int, int]:
    """``(M, G)`` of the outputs, whose layout the kernel assumes."""
    M, K = q.shape
    if column_major:
        assert M <= 1 or scales.stride(0) == 1, "scales must be column-major"
    else:
        assert scales.is_contiguous(), "scales must be contiguous"
    return M, K // group_size


class QuantLaunch(NamedTuple):
    """How ``norm_quant_triton`` launches the kernel: the merge kernels' arguments (``merge``,
    after ``regroup``), the grid ``(token rows, row blocks)``, the norm rows of a program's tile,
    its warps, and the layout's ``(ROW_GROUP, GROUP)`` (``kernel_mode``)."""

    merge: MergeLaunch
    grid: tuple[int, int]
    block_r: int
    num_warps: int
    row_group: int
    group: int


def regroup(sources, indices, z, weight, num_tokens: int, row_group: int) -> tuple[list[Tensor], int]:
    """The merge-free norm's tokens taken ``k`` at a time (``k`` a power of two dividing the
    token count, the source ``[P, R * D]`` viewed ``[P / k, k * R * D]``, no copy): the kernel's
    programs then hold as many norm rows as for tokens of many heads, whatever rows a "token"
    had in the graph (a symbolic token count reaches the op as ``[T * H, D]``, one row a token:
    one row and one warp a program ran 2x slower than stock Inductor on the H200). Rows, the
    gate's rows, the outputs' rows and every group stay where they were (``k * R`` rows a token;
    a group of rows divides ``R``). Up to a full tile (``MAX_BLOCK_ELEMENTS``: 8 rows of 128);
    groups of several rows (one program a token) only while ``TARGET_PROGRAMS`` programs remain.
    Chosen at each call from the actual sizes (on the host: no sync). Merges and padded
    outputs keep their tokens."""
    src = sources[0]
    D = weight.shape[0]
    R = src.shape[1] // D
    P = num_tokens
    if indices or gate_rows(z)[0] != P * R or src.stride(-1) != 1 or (P > 1 and src.stride(0) != R * D):
        return sources, num_tokens
    full = MAX_BLOCK_ELEMENTS // triton.next_power_of_2(D)
    k = 1
    while R * k * 2 <= full and P % (k * 2) == 0 and (row_group <= 1 or P // (k * 2) >= TARGET_PROGRAMS):
        k *= 2
    return ([src.view(P // k, k * R * D)] if k > 1 else sources), P // k


def launch_plan(sources, indices, z, weight, *, eps: float, activation: str, form: str, rsqrt: bool,
                num_tokens: int, group_size: int, pad_value: float | None = None, in_dtype: torch.dtype | None = None,
                block_r: int | None = None, num_warps: int | None = None) -> QuantLaunch:
    """The kernel's launch for validated arguments whose layout ``kernel_mode`` takes, from the
    actual sizes (ints at run time: the same launch for a graph compiled with a symbolic or a
    static token count). A group of rows is one program's (its token's rows in one tile);
    else ``rows_per_program``'s tile, or ``block_r`` rows."""
    D = weight.shape[0]
    mode = kernel_mode(sources[0].shape[1] // D, D, group_size)
    if mode is None:
        raise ValueError(f"group_size: {group_size} is no layout of the kernel for rows of "
                         f"{sources[0].shape[1]} values, D={D}")
    row_group, group = mode
    sources, num_tokens = regroup(sources, indices, z, weight, num_tokens, row_group)
    L = merge_launch(sources, indices, z, weight, eps=eps, activation=activation, form=form, rsqrt=rsqrt,
                     num_tokens=num_tokens, pad_value=pad_value, in_dtype=in_dtype)
    if row_group > 1:
        block_r = triton.next_power_of_2(L.R)
    else:
        block_r = block_r or rows_per_program(L.programs, L.R, D)
    warps = warps_for(block_r, L.constexprs["BLOCK_D"]) if num_warps is None else num_warps
    return QuantLaunch(L, (L.programs, triton.cdiv(L.R, block_r)), block_r, warps, row_group, group)


def norm_quant_triton(sources, indices, z, weight, q, scales, *, eps: float, activation: str, form: str,
                      rsqrt: bool, num_tokens: int, norm_dtype: torch.dtype, group_size: int, ue8m0: bool,
                      reciprocal: bool, column_major: bool, pad_value: float | None = None,
                      block_r: int | None = None, num_warps: int | None = None, in_dtype: torch.dtype | None = None,
                      divide: str | None = None):
    """One launch (``launch_plan``'s) writing ``q`` (contiguous fp8 ``[M, K]``) and ``scales``
    (``[M, G]``, row- or column-major as ``column_major`` says). The caller has validated the
    arguments and checked that the index lengths partition ``num_tokens`` and that
    ``kernel_mode`` is not None. ``divide``: ``GROUP_DIVIDE``'s choice for this launch (default:
    ``GROUP_DIVIDE``). No sync, no allocation."""
    if triton is None:  # pragma: no cover
        raise RuntimeError("gated_norm_quant: the Triton kernel needs triton, which is not installed")
    divide = divide or GROUP_DIVIDE
    if divide not in DIVIDES:
        raise ValueError(f"divide: expected one of {DIVIDES}, got {divide!r}")
    M, G = _check_outputs(q, scales, group_size, column_major)
    plan = launch_plan(sources, indices, z, weight, eps=eps, activation=activation, form=form, rsqrt=rsqrt,
                       num_tokens=num_tokens, group_size=group_size, pad_value=pad_value, in_dtype=in_dtype,
                       block_r=block_r, num_warps=num_warps)
    L = plan.merge
    if L.programs == 0:
        return q, scales
    extra = triton_launch_options() if q.is_cuda else {}
    _gated_norm_quant_kernel[plan.grid](
        *L.inputs, q.view(torch.uint8), scales, *L.sizes, M, G, **L.constexprs,
        NORM_DTYPE=TL_DTYPES[norm_dtype], BLOCK_R=plan.block_r, ROW_GROUP=plan.row_group, GROUP=plan.group,
        UE8M0=ue8m0, DIVIDE=1 if reciprocal else _DIVIDE_MODE[divide], COLUMN_MAJOR=column_major,
        HW_CASTS=hardware_casts(q), num_warps=plan.num_warps, **extra,
    )
    return q, scales


def aot_variants():
    """The merge with one group per norm row (D = 128), ue8m0 or not, scales row- or
    column-major (the corrected reciprocal); the per-token scale (all R = 8 rows, reciprocal);
    groups of 64 inside a row; IEEE division; the merge-free norm; the hf form and a padded
    output, for the ahead-of-time sm_90 check."""
    from kda_inductor.lowerings import AotVariant, debug_options

    types = dict(src0="*bf16", src1="*bf16", idx0="*i64", idx1="*i64", n0="i32", n1="i32", src_stride0="i32",
                 src_stride1="i32", z_ptr="*bf16", z_rows_per_group="i32", z_stride_group="i32",
                 z_stride_row="i32", z_stride_col="i32", w_ptr="*fp32", q_ptr="*u8", s_ptr="*fp32",
                 T="i32", R="i32", D="i32", eps="fp32", pad="fp32", M="i32", G="i32")
    base = dict(SIGMOID=True, HF=False, RSQRT=True, IN_DTYPE=tl.bfloat16, HF_DTYPE=tl.float32,
                NORM_DTYPE=tl.bfloat16, BLOCK_R=8, BLOCK_D=128, IDENTITY=False, PADDED=False, ROW_GROUP=1,
                GROUP=0, UE8M0=False, DIVIDE=2, COLUMN_MAJOR=False, HW_CASTS=True, ROUND_IN=False)
    opts = debug_options(2)
    for ue8m0 in (False, True):
        for column_major in (False, True):
            yield AotVariant(_gated_norm_quant_kernel, types, {**base, "UE8M0": ue8m0, "COLUMN_MAJOR": column_major},
                             opts)
    yield AotVariant(_gated_norm_quant_kernel, types, {**base, "ROW_GROUP": 8, "DIVIDE": 1}, opts)
    yield AotVariant(_gated_norm_quant_kernel, types, {**base, "ROW_GROUP": 0, "GROUP": 64}, opts)
    yield AotVariant(_gated_norm_quant_kernel, types, {**base, "DIVIDE": 0}, opts)
    yield AotVariant(_gated_norm_quant_kernel, types, {**base, "IDENTITY": True, "HF": True, "SIGMOID": False}, opts)
    yield AotVariant(_gated_norm_quant_kernel, types, {**base, "PADDED": True, "NORM_DTYPE": tl.float32}, opts)
