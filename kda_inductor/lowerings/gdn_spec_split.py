"""``kda::gdn_spec_split``: several row gathers sharing one or two index tensors, one launch.

``outputs[i] = sources[i].index_select(dims[i], indices[index_of[i]])`` (negative indices
counting from the end, as ``x[idx]`` does) where every
dimension before ``dims[i]`` has size 1, so the gather picks whole rows of the 2-D view
``[T, row_width]``: the token split of a GDN/KDA layer (``mixed_qkv [T, conv_dim]`` along 0,
``g``/``beta [1, T, H]`` along 1). Sources may differ in dtype and row width; a program
copies one output row of every source that uses the row's index tensor, so a single
launch serves all of them.

The CPU kernel is ``index_select`` (bit-exact) after validating every index (a clear
``IndexError``). The CUDA kernel is compiled with Triton's debug mode so that its
``device_assert`` traps on an out-of-range index, as stock ``index_select`` does, instead
of reading the wrong row (its cost: ``benchmarks/results/gdn_spec_split.md``, the kernel
sweep with and without the asserts).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kda_inductor.lowerings import arg_error as _err
from kda_inductor.lowerings import triton_launch_options
from kda_inductor.lowerings._triton import tl, triton

MAX_SOURCES = 12
"""Gathers one launch takes (the kernel's unrolled slots); the pattern splits larger groups.
12 covers every layer seen: Qwen3-Next's 6, vLLM BailingMoeV3 KDA's 10 (q, k, v, decay, beta
both ways)."""


def _rows(src: Tensor, dim: int) -> tuple[int, int]:
    """``(T, row_width)`` of ``src`` gathered along ``dim`` (leading dims must be 1)."""
    width = 1
    for s in src.shape[dim + 1:]:
        width *= s
    return src.shape[dim], width


def _check(sources, indices, dims, index_of) -> None:
    if not (len(sources) == len(dims) == len(index_of)) or not sources:
        raise _err("sources", f"expected as many sources, dims and index_of entries (>= 1), got "
                   f"{len(sources)}, {len(dims)}, {len(index_of)}")
    if len(sources) > MAX_SOURCES:
        raise _err("sources", f"at most {MAX_SOURCES} per launch, got {len(sources)}")
    if not 1 <= len(indices) <= 2:
        raise _err("indices", f"expected 1 or 2 index tensors, got {len(indices)}")
    device = sources[0].device
    for j, idx in enumerate(indices):
        if idx.dim() != 1 or idx.dtype not in (torch.int32, torch.int64):
            raise _err(f"indices[{j}]", f"expected a 1-D int32/int64 tensor, got {idx.dim()}-D {idx.dtype}")
        if idx.device != device:
            raise _err(f"indices[{j}]", f"expected device {device}, got {idx.device}")
    for i, (src, d, k) in enumerate(zip(sources, dims, index_of)):
        if not 0 <= d < src.dim() or any(s != 1 for s in src.shape[:d]):
            raise _err(f"sources[{i}]", f"dims[{i}] = {d} must index a dim after only size-1 dims "
                       f"(a row gather), got shape {tuple(src.shape)}")
        if not 0 <= k < len(indices):
            raise _err("index_of", f"index_of[{i}] = {k} is not an index of indices")
        if src.device != device:
            raise _err(f"sources[{i}]", f"expected device {device}, got {src.device}")


def _out_shape(src: Tensor, dim: int, n: int) -> list[int]:
    shape = list(src.shape)
    shape[dim] = n
    return shape


@torch.library.custom_op("kda::gdn_spec_split", mutates_args=(), device_types="cpu")
def gdn_spec_split(sources: list[Tensor], indices: list[Tensor], dims: list[int],
                   index_of: list[int]) -> list[Tensor]:
    """``[src.index_select(dim, indices[k]) for src, dim, k in zip(sources, dims, index_of)]``."""
    _check(sources, indices, dims, index_of)
    for j, idx in enumerate(indices):
        if idx.numel():
            lo, hi = int(idx.min()), int(idx.max())
            users = [i for i, k in enumerate(index_of) if k == j]
            for i in users:
                T = sources[i].shape[dims[i]]
                if lo < -T or hi >= T:
                    raise _err(f"indices[{j}]", f"index {lo if lo < -T else hi} out of range "
                               f"[-{T}, {T}) for sources[{i}]", IndexError)
    # negative indices count from the end, as x[idx] (the pattern's aten.index) does
    return [s.index_select(d, _wrap(indices[k], s.shape[d])) for s, d, k in zip(sources, dims, index_of)]


def _wrap(idx: Tensor, T: int) -> Tensor:
    return torch.where(idx < 0, idx + T, idx)


@gdn_spec_split.register_fake
def _gdn_spec_split_fake(sources, indices, dims, index_of):
    _check(sources, indices, dims, index_of)
    return [s.new_empty(_out_shape(s, d, indices[k].shape[0])) for s, d, k in zip(sources, dims, index_of)]


@gdn_spec_split.register_kernel("cuda")
def _gdn_spec_split_cuda(sources, indices, dims, index_of):
    _check(sources, indices, dims, index_of)
    outs = [s.new_empty(_out_shape(s, d, indices[k].shape[0])) for s, d, k in zip(sources, dims, index_of)]
    split_triton(sources, indices, dims, index_of, outs)
    return outs


# --------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _copy_row(src_ptr, dst_ptr, row, r, ok, T, width, src_stride, which, sel, col,
                  BLOCK_W: tl.constexpr):
        """Copy this program's column chunks of source row ``r`` to output row ``row`` if
        this source uses index ``sel``."""
        if (which == sel) & ok:
            r = tl.where(r < 0, r + T, r)  # negative indices count from the end, as x[idx]
            tl.device_assert((r >= 0) & (r < T), "gdn_spec_split: index out of range")
            for c0 in range(col * BLOCK_W, width, tl.num_programs(1) * BLOCK_W):
                c = c0 + tl.arange(0, BLOCK_W)
                m = c < width
                v = tl.load(src_ptr + r * src_stride + c, mask=m)
                tl.store(dst_ptr + row.to(tl.int64) * width + c, v, mask=m)

    @triton.jit
    def _output_row(p, idx0_ptr, idx1_ptr, n0, n1):
        """``(sel, row, ok, r)`` of program row ``p``: index tensor 0 (p < n0) or 1, output row
        ``row`` of it (``ok``: there is one), and the source row ``r`` it reads (int64)."""
        first = p < n0
        sel = tl.where(first, 0, 1)
        row = tl.where(first, p, p - n0)
        ok = row < tl.where(first, n0, n1)
        r0 = tl.load(idx0_ptr + row, mask=first & ok, other=0).to(tl.int64)
        r1 = tl.load(idx1_ptr + row, mask=(p >= n0) & ok, other=0).to(tl.int64)
        return sel, row, ok, tl.where(first, r0, r1)

    @triton.jit(do_not_specialize=["n0", "n1"], debug=True)
    def _gdn_spec_split_kernel(
        idx0_ptr, idx1_ptr, n0, n1,
        s0, d0, t0, w0, st0, k0, s1, d1, t1, w1, st1, k1, s2, d2, t2, w2, st2, k2,
        s3, d3, t3, w3, st3, k3, s4, d4, t4, w4, st4, k4, s5, d5, t5, w5, st5, k5,
        s6, d6, t6, w6, st6, k6, s7, d7, t7, w7, st7, k7, s8, d8, t8, w8, st8, k8,
        s9, d9, t9, w9, st9, k9, s10, d10, t10, w10, st10, k10, s11, d11, t11, w11, st11, k11,
        NUM: tl.constexpr, BLOCK_W: tl.constexpr,
    ):
        """Program (p, c) handles column chunks c, c + C, ... (C = programs along axis 1)
        of output row p of index tensor 0 (p < n0) or p - n0 of tensor 1."""
        p = tl.program_id(0)
        col = tl.program_id(1)
        sel, row, ok, r = _output_row(p, idx0_ptr, idx1_ptr, n0, n1)
        # One block per source slot: Triton kernels take no arrays of pointers (tuple
        # arguments are too new for the triton versions torch 2.9-2.14 ship with).
        if NUM > 0:
            _copy_row(s0, d0, row, r, ok, t0, w0, st0, k0, sel, col, BLOCK_W)
        if NUM > 1:
            _copy_row(s1, d1, row, r, ok, t1, w1, st1, k1, sel, col, BLOCK_W)
        if NUM > 2:
            _copy_row(s2, d2, row, r, ok, t2, w2, st2, k2, sel, col, BLOCK_W)
        if NUM > 3:
            _copy_row(s3, d3, row, r, ok, t3, w3, st3, k3, sel, col, BLOCK_W)
        if NUM > 4:
            _copy_row(s4, d4, row, r, ok, t4, w4, st4, k4, sel, col, BLOCK_W)
        if NUM > 5:
            _copy_row(s5, d5, row, r, ok, t5, w5, st5, k5, sel, col, BLOCK_W)
        if NUM > 6:
            _copy_row(s6, d6, row, r, ok, t6, w6, st6, k6, sel, col, BLOCK_W)
        if NUM > 7:
            _copy_row(s7, d7, row, r, ok, t7, w7, st7, k7, sel, col, BLOCK_W)
        if NUM > 8:
            _copy_row(s8, d8, row, r, ok, t8, w8, st8, k8, sel, col, BLOCK_W)
        if NUM > 9:
            _copy_row(s9, d9, row, r, ok, t9, w9, st9, k9, sel, col, BLOCK_W)
        if NUM > 10:
            _copy_row(s10, d10, row, r, ok, t10, w10, st10, k10, sel, col, BLOCK_W)
        if NUM > 11:
            _copy_row(s11, d11, row, r, ok, t11, w11, st11, k11, sel, col, BLOCK_W)


def _as_rows(src: Tensor, dim: int) -> tuple[Tensor, int, int, int]:
    """``src`` as ``(tensor, T, width, row_stride)`` with each row's elements contiguous
    (a copy only when they are not, e.g. ``[1, T, H]`` transposed from ``[1, H, T]``)."""
    T, width = _rows(src, dim)
    expected = 1
    for size, stride in reversed(list(zip(src.shape[dim + 1:], src.stride()[dim + 1:]))):
        if size != 1 and stride != expected:
            src = src.contiguous()
            break
        expected *= size
    return src, T, width, src.stride(dim)


TARGET_PROGRAMS = 2048
"""Column programs per row are added until the grid has about this many programs."""


def column_programs(rows: int, max_width: int, block_w: int, target: int = TARGET_PROGRAMS) -> int:
    """Programs sharing one output row: few rows want the row split (several programs per
    row), many rows still gain a little from 2 (measured: ``benchmarks/results/gdn_spec_split.md``,
    the kernel sweep of ``benchmarks/tune_gdn_spec_split.py``, Qwen3-Next sizes, which also
    times the debug-mode asserts)."""
    chunks = -(-max_width // block_w)
    return max(1, min(chunks, max(2, target // max(rows, 1))))


def split_triton(sources, indices, dims, index_of, outs, *, block_w: int = 1024, num_warps: int = 2,
                 col_programs: int | None = None):
    """Launch one kernel filling ``outs`` (fresh contiguous tensors). No sync, no allocation
    beyond ``.contiguous()`` of a source whose rows are not contiguous."""
    if triton is None:  # pragma: no cover
        raise RuntimeError("gdn_spec_split: the Triton kernel needs triton, which is not installed")
    n = [i.shape[0] for i in indices] + [0]
    if n[0] + n[1] == 0:
        return outs
    args = []
    max_width = 1
    for src, dim, k, out in zip(sources, dims, index_of, outs):
        src, T, width, stride = _as_rows(src, dim)
        max_width = max(max_width, width)
        args += [src, out, T, width, stride, k]
    dummy = [sources[0], outs[0], 1, 0, 0, -1]
    args += dummy * (MAX_SOURCES - len(sources))
    idx1 = indices[1] if len(indices) > 1 else indices[0]
    cols = col_programs or column_programs(n[0] + n[1], max_width, block_w)
    extra = triton_launch_options() if outs[0].is_cuda else {}
    _gdn_spec_split_kernel[(n[0] + n[1], cols)](
        indices[0], idx1, n[0], n[1], *args,
        NUM=len(sources), BLOCK_W=block_w, num_warps=num_warps, **extra,
    )
    return outs


def aot_variants():
    """The launches to compile ahead of time for sm_90: the Qwen3-Next layer's 6 gathers,
    a pair, and the largest launch."""
    from kda_inductor.lowerings import AotVariant, debug_options

    types = {"idx0_ptr": "*i32", "idx1_ptr": "*i32", "n0": "i32", "n1": "i32"}
    for i in range(MAX_SOURCES):
        types.update({f"s{i}": "*bf16", f"d{i}": "*bf16", f"t{i}": "i32", f"w{i}": "i32", f"st{i}": "i32",
                      f"k{i}": "i32"})
    for num in (2, 6, MAX_SOURCES):
        yield AotVariant(_gdn_spec_split_kernel, types, {"NUM": num, "BLOCK_W": 1024}, debug_options())
