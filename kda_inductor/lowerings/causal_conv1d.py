"""``kda::causal_conv1d`` and ``kda::causal_conv1d_update``: the depthwise causal short conv of a
GDN / KDA (or Mamba) layer, its activation and its conv state, in one launch.

``kda::causal_conv1d(x, weight, bias, initial_state, cu_seqlens, activation, act_dtype,
out_dtype)``: for each channel ``c`` and token ``t`` of a sequence,

    acc = bias[c]   (0 without bias; float32)
    acc = fma(weight[c, k], x[c, t - (K - 1) + k], acc)   for k = 0 .. K - 1, oldest tap first

where a tap before the sequence's first token reads the sequence's initial state (its last
``K - 1`` columns; ``initial_state [N, C, S]``, ``S >= K - 1``) or, without one, is skipped (the
conv's zero padding); then ``v = acc`` rounded to ``act_dtype``, ``y = silu(v)`` (computed in
float32: ``v / (1 + exp(-v))``) or ``v`` (``activation="none"``), rounded to ``out_dtype``.
Inputs, state and bias are first converted to the weight's dtype (the user's ``x.to(w.dtype)``).

That is aten's own order: ``conv_depthwise2d_forward_kernel_generic`` (CUDA, the kernel
transformers' fallback runs) starts from the bias and adds ``weight * input`` per tap, oldest
first, in float32, each an FMA (nvcc contracts ``value += w * x``; the kernel calls ``tl.fma``),
and rounds the sum to the conv's dtype. aten's CPU conv sums float32 the same way: the kernel's
float32 conv is bit-identical to it under the interpreter (``tests/test_lowering_causal_conv1d.py``).
The product of two 16-bit floats is exact in float32, so for bf16 / fp16 models the FMA does not
matter and the order is aten's: bit-exact with aten's depthwise kernel on GPU, the silu included
where it is eager's own ``x / (1 + expf(-x))`` with IEEE division (the kernel's libdevice
``expf`` and ``div_rn``). Eager may hand a token-major 16-bit input (channels-last to cuDNN's
eyes) to cuDNN instead, whose sums may round otherwise: within one ulp of that
(``tests/test_causal_conv1d_cuda.py`` checks both on the H200). On CPU, aten's fp16 conv adds
the bias last: there the CPU op (aten's conv) and the kernel differ by an ulp at times.

* ``x``: ``[B, C, T]`` (channel-first, as ``F.conv1d`` reads it), any strides; the fast layout
  is token-major (``x.transpose(1, 2)`` of a ``[B, T, C]`` projection: channels contiguous,
  16-byte loads). With ``cu_seqlens`` (int32/int64 ``[N + 1]``, from 0 to ``T``,
  non-decreasing) ``B`` is 1 and each range of tokens is a sequence of its own (a sequence
  start resets the causal window; its initial state is ``initial_state[n]``).
* ``weight``: ``[C, K]`` or ``[C, 1, K]`` with ``1 <= K <= MAX_WIDTH``; ``bias``: ``[C]`` or None.
* The result is ``[B, C, T]`` with token-major memory (strides ``(T * C, 1, C)``): its
  ``transpose(1, 2)`` is a contiguous ``[B, T, C]`` whose split into q / k / v is views.

``kda::causal_conv1d_update(x, conv_state, weight, bias, activation, act_dtype, out_dtype)``:
the same conv of a batch of ``B`` sequences continuing ``conv_state [B, C, S]`` (``S >= K - 1``),
which it then overwrites in place with the last ``S`` columns of ``[conv_state | x]`` (cast to
the state's dtype): transformers' ``causal_conv1d_update`` (decode) and its prefill continuing
a cached state. Called through ``auto_functionalized``, which Inductor re-inplaces.

``kda::causal_conv1d_cat(xs, weight, ...)`` and ``kda::causal_conv1d_update_cat(xs, conv_state,
...)``: the same two ops on ``cat([x.flatten(2) for x in xs], -1).transpose(1, 2)`` without the
cat: ``xs`` are 1 to ``MAX_SOURCES`` token-major ``[B, T, C_i]`` or ``[B, T, H_i, D_i]`` tensors
(Qwen3-Next's q / k / v views of its ``qkvz`` projection), read where they lie
(:func:`validate_sources`).

Every argument is validated (:func:`validate`, also the pattern's ``Stage.VALIDATED`` check),
with errors that name it. ``cu_seqlens`` values are checked on the host on CPU (an error naming
``cu_seqlens``) and by a device-side assert on CUDA (a sequence past the end of ``x``: the
kernel's debug mode, as ``kda::gdn_spec_split`` traps its indices). The CPU kernel is aten's
conv itself (``F.conv1d`` per sequence on the assembled ``[state | x]``, then eager's silu):
bit-identical to eager on CPU. The CUDA kernels (:func:`conv_triton`; ``docs/causal_conv1d.md``,
"The kernels"): the prefill tiles tokens x channels, 16-byte channel loads, the ``K - 1``
previous tokens kept in registers so that each ``x`` element is read once per tile (tiles
holding a sequence start take the state or skip, token by token); the update reads and writes
the state tile once. Fixed configs per shape class (``PREFILL_CONFIGS``, ``UPDATE_CONFIGS``), no
host sync, no allocation but the output, safe under CUDA-graph capture.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from kda_inductor.lowerings import arg_error as _err
from kda_inductor.lowerings import check_tensor, definitely, interpreter_checks, triton_launch_options
from kda_inductor.lowerings._triton import tl, triton

__all__ = ["MAX_SOURCES", "MAX_WIDTH", "causal_conv1d", "causal_conv1d_cat", "causal_conv1d_update",
           "causal_conv1d_update_cat", "conv_triton", "validate", "validate_sources"]

MAX_WIDTH = 8
"""The widest kernel the op takes (every GDN / KDA / Mamba model has 4; 2..8 are tested)."""
MAX_SOURCES = 4
"""The most sources the ``_cat`` ops read (Qwen3-Next concatenates three: q, k, v)."""
ACTIVATIONS = ("silu", "none")
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


class ConvMeta(NamedTuple):
    """The geometry :func:`validate` returns."""

    batch: int
    channels: int
    tokens: int
    width: int
    num_seqs: int
    state_width: int


# --------------------------------------------------------------------------------------
# validation (the ops, their fake impls, the launcher and the pattern)
# --------------------------------------------------------------------------------------
def _check_float(x, arg: str, dims: int) -> None:
    check_tensor(x, arg)
    if x.dim() != dims or x.dtype not in _FLOATS:
        raise _err(arg, f"expected a {dims}-D float32/bfloat16/float16 tensor, got {x.dim()}-D {x.dtype}")


def _weight_shape(weight, channels) -> int:
    """The kernel width K of ``weight`` ``[C, K]`` or ``[C, 1, K]`` (checked)."""
    check_tensor(weight, "weight")
    ok = weight.dim() == 2 or (weight.dim() == 3 and weight.shape[1] == 1)
    if not ok or weight.dtype not in _FLOATS:
        raise _err("weight", f"expected a float tensor [C, K] or [C, 1, K], got {weight.dtype}{list(weight.shape)}")
    if definitely(weight.shape[0] != channels):
        raise _err("weight", f"expected {channels} channels (x.shape[1]), got {weight.shape[0]}")
    width = weight.shape[-1]
    if not (isinstance(width, int) and 1 <= width <= MAX_WIDTH):
        raise _err("weight", f"kernel width must be a static int in [1, {MAX_WIDTH}], got {width}")
    return width


def _check_state(state, arg: str, num_seqs, channels, width) -> int:
    """``state [num_seqs, C, S]`` with ``S >= K - 1``; returns ``S``."""
    _check_float(state, arg, 3)
    n, c, s = state.shape
    if definitely(n != num_seqs) or definitely(c != channels):
        raise _err(arg, f"expected [{num_seqs}, {channels}, S] (one row per sequence, x's channels), "
                   f"got {list(state.shape)}")
    if definitely(s < width - 1):
        raise _err(arg, f"a state of width {s} cannot hold the {width - 1} previous tokens a kernel of "
                   f"width {width} reads (S >= K - 1)")
    return s


def _check_cu_seqlens(cu_seqlens, batch) -> int:
    check_tensor(cu_seqlens, "cu_seqlens")
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise _err("cu_seqlens", f"expected a 1-D int32/int64 tensor, got {cu_seqlens.dim()}-D {cu_seqlens.dtype}")
    if definitely(cu_seqlens.shape[0] < 2):
        raise _err("cu_seqlens", f"expected at least 2 entries (one sequence), got {cu_seqlens.shape[0]}")
    if definitely(batch != 1):
        raise _err("x", f"with cu_seqlens the sequences lie along one row: expected x.shape[0] == 1, got {batch}")
    return cu_seqlens.shape[0] - 1


def _check_options(activation, act_dtype, out_dtype) -> None:
    if activation not in ACTIVATIONS:
        raise _err("activation", f"expected one of {ACTIVATIONS}, got {activation!r}")
    for d, arg in ((act_dtype, "act_dtype"), (out_dtype, "out_dtype")):
        if d not in _FLOATS:
            raise _err(arg, f"expected float32, bfloat16 or float16, got {d}")


def validate(x, weight, bias=None, initial_state=None, cu_seqlens=None, activation="silu",
             act_dtype=torch.bfloat16, out_dtype=torch.bfloat16, *, state_arg="initial_state") -> ConvMeta:
    """The ops' one validator: sync-free checks of everything but ``cu_seqlens``' values, each
    bad argument an error naming it; returns the geometry. ``state_arg`` names the state in
    errors (``conv_state`` for the update op)."""
    _check_float(x, "x", 3)
    return _validate_conv(x.shape, x.device, weight, bias, initial_state, cu_seqlens, activation, act_dtype,
                          out_dtype, state_arg)


def _validate_conv(shape, device, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype,
                   state_arg) -> ConvMeta:
    """:func:`validate` of an input ``[B, C, T]`` on ``device`` (``x``, or the sources' cat)."""
    batch, channels, tokens = shape
    width = _weight_shape(weight, channels)
    if bias is not None:
        _check_float(bias, "bias", 1)
        if definitely(bias.shape[0] != channels):
            raise _err("bias", f"expected one value per channel [{channels}], got {list(bias.shape)}")
    num_seqs = batch if cu_seqlens is None else _check_cu_seqlens(cu_seqlens, batch)
    s = 0 if initial_state is None else _check_state(initial_state, state_arg, num_seqs, channels, width)
    _check_options(activation, act_dtype, out_dtype)
    for t, arg in ((weight, "weight"), (bias, "bias"), (initial_state, state_arg), (cu_seqlens, "cu_seqlens")):
        if t is not None and t.device != device:
            raise _err(arg, f"expected device {device} (x's), got {t.device}")
    return ConvMeta(batch, channels, tokens, width, num_seqs, s)


def _check_sources(xs) -> tuple[int, int, int]:
    """``xs``: 1 .. MAX_SOURCES token-major float tensors ``[B, T, C_i]`` or ``[B, T, H_i, D_i]`` of
    one dtype and device, the same ``B`` and ``T``; returns ``(B, C, T)`` of their cat."""
    if not isinstance(xs, (list, tuple)) or not 1 <= len(xs) <= MAX_SOURCES:
        raise _err("xs", f"expected a list of 1 to {MAX_SOURCES} tensors, got {type(xs).__name__}"
                   + (f" of {len(xs)}" if isinstance(xs, (list, tuple)) else ""))
    channels = 0
    for i, t in enumerate(xs):
        check_tensor(t, f"xs[{i}]")
        if t.dim() not in (3, 4) or t.dtype not in _FLOATS:
            raise _err(f"xs[{i}]", f"expected a 3-D [B, T, C] or 4-D [B, T, H, D] float32/bfloat16/float16 tensor, "
                       f"got {t.dim()}-D {t.dtype}")
        other = definitely(t.shape[0] != xs[0].shape[0]) or definitely(t.shape[1] != xs[0].shape[1])
        if other or t.dtype != xs[0].dtype or t.device != xs[0].device:
            raise _err(f"xs[{i}]", f"expected xs[0]'s batch, tokens, dtype and device ({list(xs[0].shape[:2])}, "
                       f"{xs[0].dtype}, {xs[0].device}), got {list(t.shape[:2])}, {t.dtype}, {t.device}")
        channels = channels + math.prod(t.shape[2:])
    return xs[0].shape[0], channels, xs[0].shape[1]


def validate_sources(xs, weight, bias=None, initial_state=None, cu_seqlens=None, activation="silu",
                     act_dtype=torch.bfloat16, out_dtype=torch.bfloat16, *, state_arg="initial_state") -> ConvMeta:
    """:func:`validate` for the ``_cat`` ops: the conv of ``cat([x.flatten(2) for x in xs],
    -1).transpose(1, 2)`` (channels in the sources' order)."""
    shape = _check_sources(xs)
    return _validate_conv(shape, xs[0].device, weight, bias, initial_state, cu_seqlens, activation, act_dtype,
                          out_dtype, state_arg)


def cat_sources(xs) -> Tensor:
    """The ``[B, C, T]`` input the ``_cat`` ops convolve: ``cat(xs, -1)`` (token-major), transposed."""
    return torch.cat([t.flatten(2) for t in xs], dim=-1).transpose(1, 2)


def new_output(x: Tensor, out_dtype: torch.dtype) -> Tensor:
    """The ops' result: ``[B, C, T]`` over token-major memory (what the consumers' transpose
    wants contiguous)."""
    b, c, t = x.shape
    return x.new_empty((b, t, c), dtype=out_dtype).transpose(1, 2)


# --------------------------------------------------------------------------------------
# CPU: aten's conv per sequence (bit-identical to eager)
# --------------------------------------------------------------------------------------
def _segments(meta: ConvMeta, cu_seqlens) -> list[tuple[int, int, int]]:
    """``(row, start, end)`` of every sequence; ``cu_seqlens``' values checked (host)."""
    if cu_seqlens is None:
        return [(b, 0, meta.tokens) for b in range(meta.batch)]
    cu = [int(v) for v in cu_seqlens.tolist()]
    if cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise _err("cu_seqlens", f"expected non-decreasing offsets from 0, got {cu}")
    if cu[-1] != meta.tokens:
        raise _err("cu_seqlens", f"the sequences end at {cu[-1]}, expected x's {meta.tokens} tokens "
                   f"({'past the end' if cu[-1] > meta.tokens else 'tokens left over'})", IndexError)
    return [(0, a, b) for a, b in zip(cu, cu[1:])]


def _conv_segment(xs, weight, bias, state, width) -> Tensor:
    """``F.conv1d`` of one sequence ``xs [1, C, L]`` continuing ``state [1, C, S]`` (or None), in
    the spellings eager runs: the state's last ``K - 1`` columns in front, padding 0; else
    padding ``K - 1`` and the first ``L`` outputs."""
    d = weight.dtype
    w = weight.reshape(weight.shape[0], 1, width)
    xs = xs.to(d)
    if state is not None and width > 1:
        xs = torch.cat([state[:, :, state.shape[-1] - (width - 1):].to(d), xs], dim=-1)
        return F.conv1d(xs, w, bias, padding=0, groups=w.shape[0])
    return F.conv1d(xs, w, bias, padding=width - 1, groups=w.shape[0])[..., :xs.shape[-1]]


def _activate(v: Tensor, activation: str, act_dtype, out_dtype) -> Tensor:
    v = v.to(act_dtype)
    if activation == "silu":
        v = F.silu(v.float()) if out_dtype != act_dtype else F.silu(v)
    return v.to(out_dtype)


def _conv_cpu(x, weight, bias, state, cu_seqlens, activation, act_dtype, out_dtype, meta: ConvMeta) -> Tensor:
    out = new_output(x, out_dtype)
    for n, (row, start, end) in enumerate(_segments(meta, cu_seqlens)):
        if end == start:
            continue
        st = None if state is None else state[n:n + 1]
        v = _conv_segment(x[row:row + 1, :, start:end], weight, bias, st, meta.width)
        out[row:row + 1, :, start:end] = _activate(v, activation, act_dtype, out_dtype)
    return out


def _new_state_cpu(x: Tensor, conv_state: Tensor) -> Tensor:
    """The last ``S`` columns of ``[conv_state | x]`` per row, in the state's dtype."""
    s = conv_state.shape[-1]
    return torch.cat([conv_state, x.to(conv_state.dtype)], dim=-1)[:, :, x.shape[-1]:x.shape[-1] + s]


# --------------------------------------------------------------------------------------
# custom ops
# --------------------------------------------------------------------------------------
@torch.library.custom_op("kda::causal_conv1d", mutates_args=(), device_types="cpu")
def causal_conv1d(x: Tensor, weight: Tensor, bias: Tensor | None, initial_state: Tensor | None,
                  cu_seqlens: Tensor | None, activation: str, act_dtype: torch.dtype,
                  out_dtype: torch.dtype) -> Tensor:
    """The depthwise causal conv (+ silu) of ``x [B, C, T]`` (the module docstring)."""
    meta = validate(x, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype)
    return _conv_cpu(x, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype, meta)


@causal_conv1d.register_fake
def _causal_conv1d_fake(x, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype):
    validate(x, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype)
    return new_output(x, out_dtype)


@causal_conv1d.register_kernel("cuda")
def _causal_conv1d_cuda(x, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype):
    meta = validate(x, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype)
    out = new_output(x, out_dtype)
    _launch(x, weight, bias, initial_state, cu_seqlens, out, activation, act_dtype, meta)
    return out


@torch.library.custom_op("kda::causal_conv1d_update", mutates_args=("conv_state",), device_types="cpu")
def causal_conv1d_update(x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None, activation: str,
                         act_dtype: torch.dtype, out_dtype: torch.dtype) -> Tensor:
    """The conv of ``x [B, C, T]`` continuing ``conv_state [B, C, S]``, which it then shifts
    in place: its new columns are the last ``S`` of ``[conv_state | x]``."""
    meta = validate(x, weight, bias, conv_state, None, activation, act_dtype, out_dtype, state_arg="conv_state")
    out = _conv_cpu(x, weight, bias, conv_state, None, activation, act_dtype, out_dtype, meta)
    conv_state.copy_(_new_state_cpu(x, conv_state))
    return out


@causal_conv1d_update.register_fake
def _causal_conv1d_update_fake(x, conv_state, weight, bias, activation, act_dtype, out_dtype):
    validate(x, weight, bias, conv_state, None, activation, act_dtype, out_dtype, state_arg="conv_state")
    return new_output(x, out_dtype)


@causal_conv1d_update.register_kernel("cuda")
def _causal_conv1d_update_cuda(x, conv_state, weight, bias, activation, act_dtype, out_dtype):
    meta = validate(x, weight, bias, conv_state, None, activation, act_dtype, out_dtype, state_arg="conv_state")
    out = new_output(x, out_dtype)
    _launch(x, weight, bias, conv_state, None, out, activation, act_dtype, meta, update=True)
    return out


@torch.library.custom_op("kda::causal_conv1d_cat", mutates_args=(), device_types="cpu")
def causal_conv1d_cat(xs: list[Tensor], weight: Tensor, bias: Tensor | None, initial_state: Tensor | None,
                      cu_seqlens: Tensor | None, activation: str, act_dtype: torch.dtype,
                      out_dtype: torch.dtype) -> Tensor:
    """``causal_conv1d`` of ``cat([x.flatten(2) for x in xs], -1).transpose(1, 2)``: the sources
    (token-major ``[B, T, C_i]`` or ``[B, T, H_i, D_i]``, any strides) read where they lie, no cat."""
    meta = validate_sources(xs, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype)
    return _conv_cpu(cat_sources(xs), weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype,
                     meta)


@causal_conv1d_cat.register_fake
def _causal_conv1d_cat_fake(xs, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype):
    meta = validate_sources(xs, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype)
    return xs[0].new_empty((meta.batch, meta.tokens, meta.channels), dtype=out_dtype).transpose(1, 2)


@causal_conv1d_cat.register_kernel("cuda")
def _causal_conv1d_cat_cuda(xs, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype):
    meta = validate_sources(xs, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype)
    out = xs[0].new_empty((meta.batch, meta.tokens, meta.channels), dtype=out_dtype).transpose(1, 2)
    _launch(list(xs), weight, bias, initial_state, cu_seqlens, out, activation, act_dtype, meta)
    return out


@torch.library.custom_op("kda::causal_conv1d_update_cat", mutates_args=("conv_state",), device_types="cpu")
def causal_conv1d_update_cat(xs: list[Tensor], conv_state: Tensor, weight: Tensor, bias: Tensor | None,
                             activation: str, act_dtype: torch.dtype, out_dtype: torch.dtype) -> Tensor:
    """``causal_conv1d_update`` of the sources' cat (see ``causal_conv1d_cat``)."""
    validate_sources(xs, weight, bias, conv_state, None, activation, act_dtype, out_dtype, state_arg="conv_state")
    return causal_conv1d_update(cat_sources(xs), conv_state, weight, bias, activation, act_dtype, out_dtype)


@causal_conv1d_update_cat.register_fake
def _causal_conv1d_update_cat_fake(xs, conv_state, weight, bias, activation, act_dtype, out_dtype):
    meta = validate_sources(xs, weight, bias, conv_state, None, activation, act_dtype, out_dtype,
                            state_arg="conv_state")
    return xs[0].new_empty((meta.batch, meta.tokens, meta.channels), dtype=out_dtype).transpose(1, 2)


@causal_conv1d_update_cat.register_kernel("cuda")
def _causal_conv1d_update_cat_cuda(xs, conv_state, weight, bias, activation, act_dtype, out_dtype):
    meta = validate_sources(xs, weight, bias, conv_state, None, activation, act_dtype, out_dtype,
                            state_arg="conv_state")
    out = xs[0].new_empty((meta.batch, meta.tokens, meta.channels), dtype=out_dtype).transpose(1, 2)
    _launch(list(xs), weight, bias, conv_state, None, out, activation, act_dtype, meta, update=True)
    return out


# --------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------
if triton is not None:
    try:
        from triton.language.extra import libdevice
    except ImportError:  # pragma: no cover - Triton 3.0 keeps it per backend
        from triton.language.extra.cuda import libdevice

    from kda_inductor.lowerings._fp8 import bf16_round

    @triton.jit
    def _round(v, KIND: tl.constexpr, HW: tl.constexpr):
        """float32 ``v`` rounded to nearest even in the dtype ``KIND`` (0 float32, 1 bfloat16,
        2 float16), as float32. Without ``HW`` (the interpreter, whose float32 -> bfloat16 cast
        truncates) bfloat16 by the bits (``_fp8.bf16_round``)."""
        if KIND == 1:
            if HW:
                v = v.to(tl.bfloat16).to(tl.float32)
            else:
                v = bf16_round(v)
        elif KIND == 2:
            v = v.to(tl.float16).to(tl.float32)
        return v

    @triton.jit
    def _to_w(v, D: tl.constexpr, W_KIND: tl.constexpr, HW: tl.constexpr):
        """A loaded value in the weight's dtype ``D`` (the user's ``x.to(w.dtype)``), as float32."""
        if HW:
            out = v.to(D).to(tl.float32)
        else:
            out = _round(v.to(tl.float32), W_KIND, False)
        return out

    @triton.jit
    def _silu(v, HW: tl.constexpr):
        """``v / (1 + exp(-v))`` as eager's CUDA silu computes it: libdevice's expf, IEEE division
        (the interpreter has no libdevice: numpy's exp there)."""
        if HW:
            e = libdevice.exp(-v)
        else:
            e = tl.exp(-v)
        return tl.math.div_rn(v, 1.0 + e)

    @triton.jit
    def _when(cond, m):
        """``m & cond`` for a scalar ``cond`` (a select: the interpreter's ``&`` of a bool tensor
        and a scalar bool returns integers, which its loads reject as a mask)."""
        return tl.where(cond, m, False)

    @triton.jit
    def _store_row(yp, t, T, m, acc, C: tl.constexpr, SILU: tl.constexpr, ACT_KIND: tl.constexpr,
                   OUT_KIND: tl.constexpr, HW: tl.constexpr):
        """Token ``t``'s sum rounded to the conv's dtype, activated, rounded to the output's,
        stored in the token-major output row (``yp``: the tile's channels of token 0)."""
        v = _round(acc, ACT_KIND, HW)
        if SILU:
            v = _silu(v, HW)
        y = _round(v, OUT_KIND, HW).to(yp.dtype.element_ty)
        tl.store(yp + t * C, y, mask=_when(t < T, m))

    @triton.jit
    def _find_seq(cu_ptr, t, num_seqs, STEPS: tl.constexpr):
        """The sequence of token ``t`` (a scalar): the largest ``n < num_seqs`` with ``cu[n] <= t``
        (binary search, ``STEPS >= ceil(log2(num_seqs)) + 1``)."""
        lo = t * 0
        size = lo + num_seqs
        for _ in tl.static_range(STEPS):
            half = size // 2
            ok = (half > 0) & (tl.load(cu_ptr + lo + half, mask=half > 0, other=0).to(tl.int64) <= t)
            lo = tl.where(ok, lo + half, lo)
            size = tl.where(half > 0, tl.where(ok, size - half, half), size)
        return lo

    # ---------------------------------------------------------------- the channel tile
    @triton.jit
    def _heads(j, H: tl.constexpr, D: tl.constexpr, SH: tl.constexpr, JB: tl.constexpr, CO: tl.constexpr,
               BH: tl.constexpr, BD: tl.constexpr, sx_c, X_UNIT: tl.constexpr):
        """Channel block ``j`` (this source's first is ``JB``) of a source of ``H`` heads of ``D``
        channels, head stride ``SH``: ``[BH, BD]`` channels, ``BD`` of one head per tile row
        (``R`` such virtual heads per head). Returns their element offsets in a token row of the
        source, their output channels (the source's first is ``CO``) and the mask."""
        R: tl.constexpr = (D + BD - 1) // BD
        vh = (j - JB) * BH + tl.arange(0, BH)[:, None]
        d = (vh % R) * BD + tl.arange(0, BD)[None, :]
        h = vh // R
        m = (h < H) & (d < D)
        if X_UNIT:
            off = h * SH + d
        else:
            off = h * SH + d * sx_c
        return off, CO + h * D + d, m

    @triton.jit
    def _block(j, x0, x1, x2, x3, sx_c, H0: tl.constexpr, D0: tl.constexpr, SH0: tl.constexpr,
               H1: tl.constexpr, D1: tl.constexpr, SH1: tl.constexpr, JB1: tl.constexpr, CO1: tl.constexpr,
               H2: tl.constexpr, D2: tl.constexpr, SH2: tl.constexpr, JB2: tl.constexpr, CO2: tl.constexpr,
               H3: tl.constexpr, D3: tl.constexpr, SH3: tl.constexpr, JB3: tl.constexpr, CO3: tl.constexpr,
               NSRC: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, X_UNIT: tl.constexpr):
        """The source channel block ``j`` lies in (blocks never straddle two) and its tile
        (:func:`_heads`): ``(source pointer, offsets, output channels, mask)``."""
        xp = x0
        off, ch, m = _heads(j, H0, D0, SH0, 0, 0, BH, BD, sx_c, X_UNIT)
        if NSRC > 1:
            if j >= JB1:
                xp = x1
                off, ch, m = _heads(j, H1, D1, SH1, JB1, CO1, BH, BD, sx_c, X_UNIT)
        if NSRC > 2:
            if j >= JB2:
                xp = x2
                off, ch, m = _heads(j, H2, D2, SH2, JB2, CO2, BH, BD, sx_c, X_UNIT)
        if NSRC > 3:
            if j >= JB3:
                xp = x3
                off, ch, m = _heads(j, H3, D3, SH3, JB3, CO3, BH, BD, sx_c, X_UNIT)
        return xp, off, ch, m

    # ---------------------------------------------------------------- taps
    @triton.jit
    def _wtap(w_ptr, ch, m, sw_c, sw_k, k: tl.constexpr, K: tl.constexpr):
        w = tl.zeros(ch.shape, tl.float32)
        if k < K:
            w = tl.load(w_ptr + ch * sw_c + k * sw_k, mask=m, other=0.0).to(tl.float32)
        return w

    @triton.jit
    def _weights(w_ptr, ch, m, sw_c, sw_k, K: tl.constexpr):
        """The ``K`` taps' weights of the tile's channels (float32, oldest tap first; 0 past K)."""
        return (_wtap(w_ptr, ch, m, sw_c, sw_k, 0, K), _wtap(w_ptr, ch, m, sw_c, sw_k, 1, K),
                _wtap(w_ptr, ch, m, sw_c, sw_k, 2, K), _wtap(w_ptr, ch, m, sw_c, sw_k, 3, K),
                _wtap(w_ptr, ch, m, sw_c, sw_k, 4, K), _wtap(w_ptr, ch, m, sw_c, sw_k, 5, K),
                _wtap(w_ptr, ch, m, sw_c, sw_k, 6, K), _wtap(w_ptr, ch, m, sw_c, sw_k, 7, K))

    @triton.jit
    def _bias(b_ptr, ch, m, D: tl.constexpr, W_KIND: tl.constexpr, HAS_BIAS: tl.constexpr, HW: tl.constexpr):
        """The sum's start: the bias in the weight's dtype, or 0."""
        acc = tl.zeros(ch.shape, tl.float32)
        if HAS_BIAS:
            acc = _to_w(tl.load(b_ptr + ch, mask=m, other=0.0), D, W_KIND, HW)
        return acc

    @triton.jit
    def _sel(n: tl.constexpr, a0, a1, a2, a3, a4, a5, a6, a7):
        """``(a0, .., a7)[n]`` for a constexpr ``n``."""
        v = a0
        if n == 1:
            v = a1
        if n == 2:
            v = a2
        if n == 3:
            v = a3
        if n == 4:
            v = a4
        if n == 5:
            v = a5
        if n == 6:
            v = a6
        if n == 7:
            v = a7
        return v

    @triton.jit
    def _taps(acc, cur, p1, p2, p3, p4, p5, p6, p7, w0, w1, w2, w3, w4, w5, w6, w7, K: tl.constexpr):
        """aten's sum over a full window: tap ``k`` (oldest first, an FMA each) reads the token
        ``K - 1 - k`` back (``cur``: this token, ``p<n>``: ``n`` back)."""
        for k in tl.static_range(K):
            acc = tl.fma(_sel(k, w0, w1, w2, w3, w4, w5, w6, w7), _sel(K - 1 - k, cur, p1, p2, p3, p4, p5, p6, p7),
                         acc)
        return acc

    @triton.jit
    def _xrow(xp, t, T, sx_t, m, D: tl.constexpr, W_KIND: tl.constexpr, HW: tl.constexpr):
        """Token ``t`` of the tile's channels in the weight's dtype (float32; 0 outside ``[0, T)``)."""
        v = tl.load(xp + t * sx_t, mask=_when((t >= 0) & (t < T), m), other=0.0)
        return _to_w(v, D, W_KIND, HW)

    @triton.jit
    def _rows(xp, t, T, sx_t, m, ROWS: tl.constexpr, D: tl.constexpr, W_KIND: tl.constexpr, HW: tl.constexpr):
        """Tokens ``t .. t + ROWS - 1`` (``ROWS <= 8``), every load issued before any is used."""
        r0 = _xrow(xp, t, T, sx_t, m, D, W_KIND, HW)
        r1, r2, r3, r4, r5, r6, r7 = r0, r0, r0, r0, r0, r0, r0
        if ROWS > 1:
            r1 = _xrow(xp, t + 1, T, sx_t, m, D, W_KIND, HW)
        if ROWS > 2:
            r2 = _xrow(xp, t + 2, T, sx_t, m, D, W_KIND, HW)
            r3 = _xrow(xp, t + 3, T, sx_t, m, D, W_KIND, HW)
        if ROWS > 4:
            r4 = _xrow(xp, t + 4, T, sx_t, m, D, W_KIND, HW)
            r5 = _xrow(xp, t + 5, T, sx_t, m, D, W_KIND, HW)
            r6 = _xrow(xp, t + 6, T, sx_t, m, D, W_KIND, HW)
            r7 = _xrow(xp, t + 7, T, sx_t, m, D, W_KIND, HW)
        return r0, r1, r2, r3, r4, r5, r6, r7

    @triton.jit
    def _halo(xp, t0, T, sx_t, m, K: tl.constexpr, D: tl.constexpr, W_KIND: tl.constexpr, HW: tl.constexpr):
        """The ``K - 1`` tokens before ``t0`` (``p<n>``: ``n`` back; 0 past ``K - 1``)."""
        p1 = tl.zeros(m.shape, tl.float32)
        p2, p3, p4, p5, p6, p7 = p1, p1, p1, p1, p1, p1
        if K > 1:
            p1 = _xrow(xp, t0 - 1, T, sx_t, m, D, W_KIND, HW)
        if K > 2:
            p2 = _xrow(xp, t0 - 2, T, sx_t, m, D, W_KIND, HW)
        if K > 3:
            p3 = _xrow(xp, t0 - 3, T, sx_t, m, D, W_KIND, HW)
        if K > 4:
            p4 = _xrow(xp, t0 - 4, T, sx_t, m, D, W_KIND, HW)
        if K > 5:
            p5 = _xrow(xp, t0 - 5, T, sx_t, m, D, W_KIND, HW)
        if K > 6:
            p6 = _xrow(xp, t0 - 6, T, sx_t, m, D, W_KIND, HW)
        if K > 7:
            p7 = _xrow(xp, t0 - 7, T, sx_t, m, D, W_KIND, HW)
        return p1, p2, p3, p4, p5, p6, p7

    # ---------------------------------------------------------------- prefill tiles
    @triton.jit
    def _fast_tile(xp, yp, m, t0, T, sx_t, bias, w0, w1, w2, w3, w4, w5, w6, w7, C: tl.constexpr,
                   K: tl.constexpr, BLOCK_T: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr,
                   W_KIND: tl.constexpr, SILU: tl.constexpr, ACT_KIND: tl.constexpr, OUT_KIND: tl.constexpr,
                   HW: tl.constexpr):
        """A tile whose every window lies inside one sequence: each token read once (its
        ``K - 1`` predecessors once more, the halo), the window kept in registers."""
        p1, p2, p3, p4, p5, p6, p7 = _halo(xp, t0, T, sx_t, m, K, D, W_KIND, HW)
        for r in range(0, BLOCK_T, ROWS):
            r0, r1, r2, r3, r4, r5, r6, r7 = _rows(xp, t0 + r, T, sx_t, m, ROWS, D, W_KIND, HW)
            for i in tl.static_range(ROWS):
                cur = _sel(i, r0, r1, r2, r3, r4, r5, r6, r7)
                acc = _taps(bias, cur, p1, p2, p3, p4, p5, p6, p7, w0, w1, w2, w3, w4, w5, w6, w7, K)
                _store_row(yp, t0 + r + i, T, m, acc, C, SILU, ACT_KIND, OUT_KIND, HW)
                if K > 7:
                    p7 = p6
                if K > 6:
                    p6 = p5
                if K > 5:
                    p5 = p4
                if K > 4:
                    p4 = p3
                if K > 3:
                    p3 = p2
                if K > 2:
                    p2 = p1
                p1 = cur

    @triton.jit
    def _edge_tap(acc, wk, xp, sp, t, src, start, S, T, sx_t, ss_t, m, D: tl.constexpr, W_KIND: tl.constexpr,
                  HAS_STATE: tl.constexpr, HW: tl.constexpr):
        """One tap of token ``t`` reading token ``src``: from ``x`` inside the sequence, from the
        state's last columns before its start (``sp``: the sequence's state row), else skipped
        (the conv's zero padding: the sum is left as is)."""
        from_x = src >= start
        v = _xrow(xp, src, T, sx_t, _when(from_x, m), D, W_KIND, HW)
        ok = from_x
        if HAS_STATE:
            col = S + (src - start)
            in_s = (src < start) & (col >= 0)
            sv = tl.load(sp + col * ss_t, mask=_when(in_s, m), other=0.0)
            v = tl.where(from_x, v, _to_w(sv, D, W_KIND, HW))
            ok = from_x | in_s
        return tl.where(ok, tl.fma(wk, v, acc), acc)

    @triton.jit
    def _edge_tile(xp, yp, sp, ch, m, cu_ptr, b, t0, T, S, num_seqs, sx_t, ss_n, ss_c, ss_t, bias,
                   w0, w1, w2, w3, w4, w5, w6, w7, C: tl.constexpr, K: tl.constexpr, BLOCK_T: tl.constexpr,
                   D: tl.constexpr, W_KIND: tl.constexpr, HAS_STATE: tl.constexpr, VARLEN: tl.constexpr,
                   STEPS: tl.constexpr, SILU: tl.constexpr, ACT_KIND: tl.constexpr, OUT_KIND: tl.constexpr,
                   HW: tl.constexpr):
        """A tile holding a sequence's start: token by token, each tap from ``x``, the state or
        skipped (:func:`_edge_tap`); varlen, the token's sequence carried from the previous
        token's, searched again where the token passes the next sequence's start."""
        seq, start, nxt = _seq_at(cu_ptr, b, t0, T, num_seqs, VARLEN, STEPS)
        for i in range(0, BLOCK_T):
            t = t0 + i
            if VARLEN:
                if t >= nxt:
                    seq, start, nxt = _seq_at(cu_ptr, b, t, T, num_seqs, VARLEN, STEPS)
            srow = sp + seq * ss_n + ch * ss_c
            acc = bias
            for k in tl.static_range(K):
                acc = _edge_tap(acc, _sel(k, w0, w1, w2, w3, w4, w5, w6, w7), xp, srow, t, t - (K - 1) + k, start,
                                S, T, sx_t, ss_t, m, D, W_KIND, HAS_STATE, HW)
            _store_row(yp, t, T, m, acc, C, SILU, ACT_KIND, OUT_KIND, HW)

    @triton.jit
    def _seq_at(cu_ptr, b, t, T, num_seqs, VARLEN: tl.constexpr, STEPS: tl.constexpr):
        """``(sequence, its start, the next one's start)`` of token ``t``: row ``b``, 0, ``T``
        without varlen."""
        seq = b
        start = t * 0
        nxt = start + T
        if VARLEN:
            seq = _find_seq(cu_ptr, t, num_seqs, STEPS)
            start = tl.load(cu_ptr + seq).to(tl.int64)
            nxt = tl.load(cu_ptr + seq + 1).to(tl.int64)
        return seq, start, nxt

    @triton.jit
    def _is_edge(cu_ptr, t0, T, num_seqs, K: tl.constexpr, BLOCK_T: tl.constexpr, VARLEN: tl.constexpr,
                 STEPS: tl.constexpr):
        """Whether a window of the tile reaches before its sequence's start: the first tile of a
        row; varlen, a tile whose last token's sequence starts after ``t0 - (K - 1)``."""
        edge = t0 < K - 1
        if VARLEN:
            last = tl.minimum(t0 + BLOCK_T, T) - 1
            edge = tl.load(cu_ptr + _find_seq(cu_ptr, last, num_seqs, STEPS)).to(tl.int64) > t0 - (K - 1)
        return edge

    def _prefill_body(x0, x1, x2, x3, w_ptr, b_ptr, s_ptr, cu_ptr, y_ptr, T, S, num_seqs, sx_b, sx_t, sx_c,
                      ss_n, ss_c, ss_t, sw_c, sw_k, H0: tl.constexpr, D0: tl.constexpr, SH0: tl.constexpr,
                      H1: tl.constexpr, D1: tl.constexpr, SH1: tl.constexpr, JB1: tl.constexpr, CO1: tl.constexpr,
                      H2: tl.constexpr, D2: tl.constexpr, SH2: tl.constexpr, JB2: tl.constexpr, CO2: tl.constexpr,
                      H3: tl.constexpr, D3: tl.constexpr, SH3: tl.constexpr, JB3: tl.constexpr, CO3: tl.constexpr,
                      C: tl.constexpr, NSRC: tl.constexpr, K: tl.constexpr, BLOCK_T: tl.constexpr,
                      ROWS: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, HAS_BIAS: tl.constexpr,
                      HAS_STATE: tl.constexpr, VARLEN: tl.constexpr, STEPS: tl.constexpr, SILU: tl.constexpr,
                      W_KIND: tl.constexpr, ACT_KIND: tl.constexpr, OUT_KIND: tl.constexpr, HW: tl.constexpr,
                      X_UNIT: tl.constexpr):
        """Program (i, j, b): tokens ``[i * BLOCK_T, +BLOCK_T)`` of row ``b`` (varlen: of the one
        row) x channel block ``j`` (``[BH, BD]`` channels of one source)."""
        t0 = tl.program_id(0).to(tl.int64) * BLOCK_T
        b = tl.program_id(2).to(tl.int64)
        xp, off, ch, m = _block(tl.program_id(1), x0, x1, x2, x3, sx_c, H0, D0, SH0, H1, D1, SH1, JB1, CO1,
                                H2, D2, SH2, JB2, CO2, H3, D3, SH3, JB3, CO3, NSRC, BH, BD, X_UNIT)
        xp = xp + b * sx_b + off
        yp = y_ptr + b * T * C + ch
        D = w_ptr.dtype.element_ty
        w0, w1, w2, w3, w4, w5, w6, w7 = _weights(w_ptr, ch, m, sw_c, sw_k, K)
        bias = _bias(b_ptr, ch, m, D, W_KIND, HAS_BIAS, HW)
        if VARLEN:
            tl.device_assert(tl.load(cu_ptr + num_seqs) == T, "causal_conv1d: cu_seqlens[-1] != x.shape[-1]")
        if _is_edge(cu_ptr, t0, T, num_seqs, K, BLOCK_T, VARLEN, STEPS):
            _edge_tile(xp, yp, s_ptr, ch, m, cu_ptr, b, t0, T, S, num_seqs, sx_t, ss_n, ss_c, ss_t, bias,
                       w0, w1, w2, w3, w4, w5, w6, w7, C, K, BLOCK_T, D, W_KIND, HAS_STATE, VARLEN, STEPS, SILU,
                       ACT_KIND, OUT_KIND, HW)
        else:
            _fast_tile(xp, yp, m, t0, T, sx_t, bias, w0, w1, w2, w3, w4, w5, w6, w7, C, K, BLOCK_T, ROWS, D,
                       W_KIND, SILU, ACT_KIND, OUT_KIND, HW)

    # ---------------------------------------------------------------- the update (decode)
    @triton.jit
    def _pick(tile, col):
        """Column ``col`` of ``tile [.., S_P2]`` (exactly: the others add as -0.0)."""
        jj = tl.arange(0, tile.shape[2])[None, None, :]
        return tl.sum(tl.where(jj == col, tile, -0.0), axis=2)

    @triton.jit
    def _update_taps(acc, xp, old_w, t, T, S, sx_t, m, w0, w1, w2, w3, w4, w5, w6, w7, K: tl.constexpr,
                     D: tl.constexpr, W_KIND: tl.constexpr, HW: tl.constexpr):
        """Token ``t``'s sum over ``[state | x]``: tap ``k`` reads column ``S + t - (K - 1) + k``,
        from the state tile in registers (``old_w``, in the weight's dtype) or from ``x``."""
        for k in tl.static_range(K):
            col = S + t - (K - 1) + k
            from_x = col >= S
            v = tl.where(from_x, _xrow(xp, col - S, T, sx_t, _when(from_x, m), D, W_KIND, HW), _pick(old_w, col))
            acc = tl.fma(_sel(k, w0, w1, w2, w3, w4, w5, w6, w7), v, acc)
        return acc

    @triton.jit
    def _shifted(old, xp, T, S, sx_t, m, S_KIND: tl.constexpr, HW: tl.constexpr):
        """The new state of the tile: column ``j`` is column ``j + T`` of ``[state | x]`` (the
        state's from ``old`` in registers, float32; ``x``'s rounded to the state's dtype)."""
        S_P2: tl.constexpr = old.shape[2]
        j = tl.arange(0, S_P2)[None, None, :]
        new = old
        for jj in tl.static_range(S_P2):
            new = tl.where(j + T == jj, _pick(old, jj)[:, :, None], new)
        for t in range(tl.maximum(T - S, 0), T):
            xv = tl.load(xp + t * sx_t, mask=m, other=0.0).to(tl.float32)
            new = tl.where(j == S - T + t, _round(xv, S_KIND, HW)[:, :, None], new)
        return new

    def _update_body(x0, x1, x2, x3, s_ptr, w_ptr, b_ptr, y_ptr, T, S, sx_b, sx_t, sx_c, ss_n, ss_c, ss_t,
                     sw_c, sw_k, H0: tl.constexpr, D0: tl.constexpr, SH0: tl.constexpr,
                     H1: tl.constexpr, D1: tl.constexpr, SH1: tl.constexpr, JB1: tl.constexpr, CO1: tl.constexpr,
                     H2: tl.constexpr, D2: tl.constexpr, SH2: tl.constexpr, JB2: tl.constexpr, CO2: tl.constexpr,
                     H3: tl.constexpr, D3: tl.constexpr, SH3: tl.constexpr, JB3: tl.constexpr, CO3: tl.constexpr,
                     C: tl.constexpr, NSRC: tl.constexpr, K: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr,
                     S_P2: tl.constexpr, SS_C: tl.constexpr, S_W: tl.constexpr, CONV: tl.constexpr, HAS_BIAS: tl.constexpr,
                     SILU: tl.constexpr,
                     W_KIND: tl.constexpr, ACT_KIND: tl.constexpr, OUT_KIND: tl.constexpr, S_KIND: tl.constexpr,
                     HW: tl.constexpr, X_UNIT: tl.constexpr):
        """Program (j, b): channel block ``j`` of row ``b``, every token: the state tile read once
        into registers, the conv of each token (``CONV``; else the state shift alone, after a
        prefill launch), the shifted state written once. ``SS_C > 0``: the state's taps are
        contiguous, ``SS_C`` apart per channel; ``S_W``: the state's width where a power of two
        (then unmasked taps: vector loads and stores)."""
        b = tl.program_id(1).to(tl.int64)
        xp, off, ch, m = _block(tl.program_id(0), x0, x1, x2, x3, sx_c, H0, D0, SH0, H1, D1, SH1, JB1, CO1,
                                H2, D2, SH2, JB2, CO2, H3, D3, SH3, JB3, CO3, NSRC, BH, BD, X_UNIT)
        xp = xp + b * sx_b + off
        jj = tl.arange(0, S_P2)[None, None, :]
        if SS_C > 0:
            sp = s_ptr + b * ss_n + ch[:, :, None] * SS_C + jj
        else:
            sp = s_ptr + b * ss_n + ch[:, :, None] * ss_c + jj * ss_t
        sm = m[:, :, None] & (jj < S_P2)
        if SS_C == 0 or S_P2 != S_W:
            sm = m[:, :, None] & (jj < S)
        old = tl.load(sp, mask=sm, other=0.0)
        D = w_ptr.dtype.element_ty
        if CONV:
            w0, w1, w2, w3, w4, w5, w6, w7 = _weights(w_ptr, ch, m, sw_c, sw_k, K)
            bias = _bias(b_ptr, ch, m, D, W_KIND, HAS_BIAS, HW)
            old_w = _to_w(old, D, W_KIND, HW)
            for t in range(0, T):
                acc = _update_taps(bias, xp, old_w, t, T, S, sx_t, m, w0, w1, w2, w3, w4, w5, w6, w7, K, D, W_KIND,
                                   HW)
                _store_row(y_ptr + b * T * C + ch, t, T, m, acc, C, SILU, ACT_KIND, OUT_KIND, HW)
        new = _shifted(old.to(tl.float32), xp, T, S, sx_t, m, S_KIND, HW)
        tl.debug_barrier()  # every read of the state before any write
        tl.store(sp, new.to(s_ptr.dtype.element_ty), mask=sm)

    _prefill_kernel = triton.jit(_prefill_body)
    _prefill_kernel_checked = triton.jit(debug=True)(_prefill_body)
    """The varlen launches: Triton's debug mode, so that ``cu_seqlens``' device assert traps."""
    _update_kernel = triton.jit(_update_body)


# --------------------------------------------------------------------------------------
# launch configurations (fixed per shape class: no run-time autotuning)
# --------------------------------------------------------------------------------------
class LaunchConfig(NamedTuple):
    """A prefill launch: ``block_t`` tokens x ``block_c`` channels per program, loaded ``rows``
    tokens at a time (``rows <= 8``, a power of two dividing ``block_t``), ``num_warps`` warps."""

    block_t: int
    rows: int
    block_c: int
    num_warps: int


class UpdateConfig(NamedTuple):
    """An update launch: ``block_c`` channels of one row per program, every token, ``num_warps``."""

    block_c: int
    num_warps: int


PREFILL_CONFIGS = (
    (1, LaunchConfig(8, 8, 256, 1), "T < 64: 8 tokens a program (fewer: all), loaded together, 256 channels a "
                                    "warp (8 a thread: 16-byte loads)"),
    (64, LaunchConfig(16, 8, 256, 1), "64 <= T < 512: T / 16 x C / 256 programs (512 at T = 256, C = 8192)"),
    (512, LaunchConfig(32, 8, 512, 2), "512 <= T < 2048: 512 programs at T = 1024, halo 3 / 32"),
    (2048, LaunchConfig(64, 8, 1024, 4), "T >= 2048: 512+ programs of 4 warps, halo 3 / 64"),
)
"""Prefill configs by tokens per row (``B * T`` of the batch counts too: see ``launch_config``),
from the smallest token count they serve. Provisional (not yet swept on a GPU):
``benchmarks/bench_causal_conv1d.py --sweep`` times them against the alternatives."""

UPDATE_CONFIGS = (
    (1, UpdateConfig(128, 1), "B * C < 64K (a few rows): small blocks, more programs"),
    (1 << 16, UpdateConfig(256, 1), "64K <= B * C < 512K (decode 8 .. 63 at 8192): 256 channels a warp"),
    (1 << 19, UpdateConfig(512, 2), "B * C >= 512K (decode 64+ at 8192): 512 channels, 2 warps"),
)
"""Update configs by the channels of the whole batch (``B * C``)."""
UPDATE_MAX_T = 64
"""Tokens per row up to which the update op runs one launch (each program every token of its
channels); above, the prefill launch and then the state shift (``CONV=False``)."""


def _from_table(table, key: int):
    return [cfg for start, cfg, _ in table if key >= start][-1]


def launch_config(tokens: int, channels: int, batch: int = 1) -> LaunchConfig:
    """The prefill config of ``PREFILL_CONFIGS`` for ``tokens`` per row, channel blocks capped at
    the channels (a power of two), tokens per program at the tokens."""
    cfg = _from_table(PREFILL_CONFIGS, int(tokens))
    block_t = min(cfg.block_t, triton.next_power_of_2(max(int(tokens), 1)))
    block_c = min(cfg.block_c, max(8, triton.next_power_of_2(int(channels))))
    return LaunchConfig(block_t, min(cfg.rows, block_t), block_c, max(1, min(cfg.num_warps, block_c // 256)))


def update_config(tokens: int, channels: int, batch: int) -> UpdateConfig:
    """The update config of ``UPDATE_CONFIGS`` for ``batch * channels`` (capped at the channels)."""
    cfg = _from_table(UPDATE_CONFIGS, int(batch) * int(channels))
    block_c = min(cfg.block_c, max(8, triton.next_power_of_2(int(channels))))
    return UpdateConfig(block_c, max(1, min(cfg.num_warps, block_c // 256)))


# --------------------------------------------------------------------------------------
# launching
# --------------------------------------------------------------------------------------
class _Source(NamedTuple):
    """One source as the kernels read it: ``H`` heads of ``D`` channels, strides in elements."""

    t: Tensor
    H: int
    D: int
    sb: int
    st: int
    sh: int
    sd: int


def _sources(x) -> list[_Source] | None:
    """The kernels' view of ``x`` (``[B, C, T]``: one source of one head) or of the sources
    list; None where the sources do not share batch / token / channel strides (then the cat)."""
    if isinstance(x, Tensor):
        return [_Source(x, 1, x.shape[1], x.stride(0), x.stride(2), 0, x.stride(1) if x.shape[1] > 1 else 1)]
    out = []
    for t in x:
        if t.dim() == 3:
            out.append(_Source(t, 1, t.shape[2], t.stride(0), t.stride(1), 0, t.stride(2)))
        else:
            sd = t.stride(3) if t.shape[3] > 1 else 1
            out.append(_Source(t, t.shape[2], t.shape[3], t.stride(0), t.stride(1), t.stride(2), sd))
    shared = {(s.sb if s.t.shape[0] > 1 else 0, s.st if s.t.shape[1] > 1 else 0, s.sd) for s in out}
    return out if len(shared) == 1 else None


def _head_block(srcs: list[_Source], block_c: int) -> tuple[int, int]:
    """``(BH, BD)``: ``BD`` channels of a head per tile row (the largest power of two up to 128
    dividing every source's head size; at least 8, masked, where none does), ``BH`` rows."""
    g = 0
    for s in srcs:
        g = math.gcd(g, s.D)
    bd = min(128, block_c, g & -g if g else 1)
    if bd < 8:
        bd = min(block_c, 128, triton.next_power_of_2(min(s.D for s in srcs)))
    return max(1, block_c // bd), bd


def _geometry(srcs: list[_Source], bh: int, bd: int) -> tuple[dict, int]:
    """The kernels' per-source constexprs (heads, head size, head stride, first block, first
    output channel; unused sources repeat source 0) and the number of channel blocks."""
    geo, block, chan = {}, 0, 0
    for i in range(MAX_SOURCES):
        s = srcs[i] if i < len(srcs) else None
        if s is None:
            geo.update({f"H{i}": 0, f"D{i}": 1, f"SH{i}": 0} | ({f"JB{i}": 1 << 30, f"CO{i}": 0} if i else {}))
            continue
        geo.update({f"H{i}": s.H, f"D{i}": s.D, f"SH{i}": s.sh} | ({f"JB{i}": block, f"CO{i}": chan} if i else {}))
        block += -(-s.H * -(-s.D // bd) // bh)
        chan += s.H * s.D
    return geo, block


def _steps(num_seqs: int) -> int:
    return max(1, math.ceil(math.log2(max(num_seqs, 1)))) + 1


def _common(srcs: list[_Source], weight, bias, out, activation, act_dtype, meta: ConvMeta, bh: int, bd: int):
    """The launch arguments both kernels share: pointers, strides and constexprs."""
    geo, blocks = _geometry(srcs, bh, bd)
    ptrs = [s.t for s in srcs] + [srcs[0].t] * (MAX_SOURCES - len(srcs))
    strides = dict(sx_b=srcs[0].sb, sx_t=srcs[0].st, sx_c=srcs[0].sd)
    consts = dict(geo, C=meta.channels, NSRC=len(srcs), K=meta.width, BH=bh, BD=bd, HAS_BIAS=bias is not None,
                  SILU=activation == "silu", W_KIND=_KIND[weight.dtype], ACT_KIND=_KIND[act_dtype],
                  OUT_KIND=_KIND[out.dtype], HW=out.is_cuda, X_UNIT=srcs[0].sd == 1)
    return ptrs, strides, consts, blocks


def _launch(x, weight, bias, state, cu_seqlens, out, activation, act_dtype, meta: ConvMeta, *,
            update: bool = False, config=None) -> None:
    """The conv of ``x`` (``[B, C, T]``, or the ``_cat`` ops' sources list) into ``out``;
    ``update``: ``state`` is the conv state, shifted in place (one launch up to ``UPDATE_MAX_T``
    tokens, else the prefill launch and the shift)."""
    if triton is None:  # pragma: no cover
        raise RuntimeError("causal_conv1d: the Triton kernel needs triton, which is not installed")
    if meta.tokens == 0 or meta.batch == 0 or meta.channels == 0:
        return
    srcs = _sources(x)
    if srcs is None:  # sources with strides of their own: read their cat
        srcs = _sources(cat_sources(x))
    w = weight.reshape(weight.shape[0], weight.shape[-1])
    if update and meta.tokens <= UPDATE_MAX_T:
        cfg = config if isinstance(config, UpdateConfig) else update_config(meta.tokens, meta.channels, meta.batch)
        _launch_update(srcs, w, bias, state, out, activation, act_dtype, meta, cfg, conv=True)
        return
    cfg = config if isinstance(config, LaunchConfig) else launch_config(meta.tokens, meta.channels, meta.batch)
    _launch_prefill(srcs, w, bias, state, cu_seqlens, out, activation, act_dtype, meta, cfg)
    if update:
        _launch_update(srcs, w, bias, state, out, activation, act_dtype, meta,
                       update_config(meta.tokens, meta.channels, meta.batch), conv=False)


def _launch_prefill(srcs, w, bias, state, cu_seqlens, out, activation, act_dtype, meta: ConvMeta,
                    cfg: LaunchConfig) -> None:
    bh, bd = _head_block(srcs, cfg.block_c)
    ptrs, strides, consts, blocks = _common(srcs, w, bias, out, activation, act_dtype, meta, bh, bd)
    hw = out.is_cuda
    kernel = _prefill_kernel_checked if cu_seqlens is not None else _prefill_kernel
    extra = triton_launch_options() if hw and cu_seqlens is not None else {}
    st = state if state is not None else w
    s_strides = state.stride() if state is not None else (0, 0, 0)
    grid = (triton.cdiv(meta.tokens, cfg.block_t), blocks, meta.batch)
    with interpreter_checks(cu_seqlens is not None and not hw):
        kernel[grid](
            *ptrs, w, bias if bias is not None else w, st, cu_seqlens if cu_seqlens is not None else w, out,
            meta.tokens, meta.state_width, meta.num_seqs, **strides, ss_n=s_strides[0], ss_c=s_strides[1],
            ss_t=s_strides[2], sw_c=w.stride(0), sw_k=w.stride(1), **consts, BLOCK_T=cfg.block_t, ROWS=cfg.rows,
            HAS_STATE=state is not None, VARLEN=cu_seqlens is not None, STEPS=_steps(meta.num_seqs),
            num_warps=cfg.num_warps, **extra,
        )


def _launch_update(srcs, w, bias, state, out, activation, act_dtype, meta: ConvMeta, cfg: UpdateConfig, *,
                   conv: bool) -> None:
    bh, bd = _head_block(srcs, cfg.block_c)
    ptrs, strides, consts, blocks = _common(srcs, w, bias, out, activation, act_dtype, meta, bh, bd)
    _update_kernel[(blocks, meta.batch)](
        *ptrs, state, w, bias if bias is not None else w, out, meta.tokens, meta.state_width, **strides,
        ss_n=state.stride(0), ss_c=state.stride(1), ss_t=state.stride(2), sw_c=w.stride(0), sw_k=w.stride(1),
        **consts, S_P2=triton.next_power_of_2(max(meta.state_width, 1)), CONV=conv, S_KIND=_KIND[state.dtype],
        SS_C=state.stride(1) if state.stride(2) == 1 or meta.state_width == 1 else 0,
        S_W=meta.state_width if meta.state_width in (1, 2, 4, 8, 16) else 0,
        num_warps=cfg.num_warps,
    )


def conv_triton(x: Tensor | list[Tensor], weight: Tensor, bias: Tensor | None = None,
                initial_state: Tensor | None = None, cu_seqlens: Tensor | None = None, activation: str = "silu",
                act_dtype: torch.dtype | None = None, out: Tensor | None = None, *, update: bool = False,
                config: LaunchConfig | UpdateConfig | None = None) -> Tensor:
    """The Triton kernels on validated arguments (what the CUDA impls launch; also on CPU
    tensors under ``TRITON_INTERPRET=1``). ``x``: ``[B, C, T]``, or the ``_cat`` ops' sources;
    ``out``: ``[B, C, T]`` (any strides whose ``transpose(1, 2)`` is contiguous), default a fresh
    one in ``act_dtype``; ``update``: the update op (``initial_state`` is the conv state, shifted
    in place); ``config``: the launch (default :func:`launch_config` / :func:`update_config`).
    No host sync; no allocation but a default ``out``."""
    act_dtype = act_dtype or weight.dtype
    out_dtype = out.dtype if out is not None else act_dtype
    check = validate if isinstance(x, Tensor) else validate_sources
    meta = check(x, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype)
    shape = (meta.batch, meta.channels, meta.tokens)
    if out is None:
        out = weight.new_empty((meta.batch, meta.tokens, meta.channels), dtype=out_dtype).transpose(1, 2)
    elif tuple(out.shape) != shape or not out.transpose(1, 2).is_contiguous():
        raise _err("out", f"expected {list(shape)} over token-major memory, got {list(out.shape)} "
                   f"strides {out.stride()}")
    _launch(x, weight, bias, initial_state, cu_seqlens, out, activation, act_dtype, meta, update=update,
            config=config)
    return out


QWEN3_NEXT_SOURCES = ((16, 128, 768), (16, 128, 768), (16, 256, 768))
"""Qwen3-Next's ``cat(q, k, v)`` as the kernels read it: (heads, head size, head stride) of each
source, views of the ``[B, T, 16, 768]`` qkvz projection (TP1)."""


def _aot_geometry(sources, block_c: int) -> dict:
    """:func:`_geometry`'s constexprs for sources given as ``(H, D, SH)`` (no tensors)."""
    srcs = [_Source(None, h, d, 0, 0, sh, 1) for h, d, sh in sources]
    bh, bd = _head_block(srcs, block_c)
    geo, _ = _geometry(srcs, bh, bd)
    return dict(geo, C=sum(h * d for h, d, _ in sources), NSRC=len(srcs), BH=bh, BD=bd)


def aot_variants():
    """The launches to compile ahead of time for sm_90 (K = 4, bf16): every prefill config class
    of ``PREFILL_CONFIGS`` at 8192 channels, the Qwen3-Next cat form, with bias, state, varlen
    (the checked kernel), no silu; every update config class, and the state shift alone."""
    from kda_inductor.lowerings import AotVariant, debug_options

    ptrs = {n: "*bf16" for n in ("x0", "x1", "x2", "x3", "w_ptr", "b_ptr", "s_ptr", "y_ptr")}
    ints = {n: "i32" for n in ("T", "S", "sx_b", "sx_t", "sx_c", "ss_n", "ss_c", "ss_t", "sw_c", "sw_k")}
    pre_types = dict(ptrs, cu_ptr="*i32", num_seqs="i32", **ints)
    base = dict(K=4, HAS_BIAS=False, SILU=True, W_KIND=1, ACT_KIND=1, OUT_KIND=1, HW=True, X_UNIT=True)
    pre = dict(base, HAS_STATE=False, VARLEN=False, STEPS=1)
    plain = [((1, 8192, 0),)]
    for _, cfg, _ in PREFILL_CONFIGS:
        for sources in plain + ([QWEN3_NEXT_SOURCES] if cfg.block_c >= 512 else []):
            consts = dict(pre, **_aot_geometry(sources, cfg.block_c), BLOCK_T=cfg.block_t, ROWS=cfg.rows)
            yield AotVariant(_prefill_kernel, pre_types, consts, {"num_warps": cfg.num_warps})
    big = dict(pre, **_aot_geometry(plain[0], 1024), BLOCK_T=64, ROWS=8)
    yield AotVariant(_prefill_kernel, pre_types, dict(big, HAS_BIAS=True, SILU=False, HAS_STATE=True), {"num_warps": 4})
    yield AotVariant(_prefill_kernel_checked, pre_types, dict(big, HAS_STATE=True, VARLEN=True, STEPS=4),
                     debug_options())
    up_types = dict(ptrs, **{n: t for n, t in ints.items() if n != "num_seqs"})
    for _, cfg, _ in UPDATE_CONFIGS:
        consts = dict(base, **_aot_geometry(plain[0], cfg.block_c), S_P2=4, SS_C=4, S_W=4, CONV=True, S_KIND=1)
        yield AotVariant(_update_kernel, up_types, consts, {"num_warps": cfg.num_warps})
    yield AotVariant(_update_kernel, up_types, dict(consts, CONV=False), {"num_warps": cfg.num_warps})
    yield AotVariant(_update_kernel, up_types, dict(consts, **_aot_geometry(QWEN3_NEXT_SOURCES, 256)),
                     {"num_warps": 1})
