"""The arguments of the ``kda::causal_conv1d`` ops, checked (``causal_conv1d.py`` documents
the ops): :func:`validate` / :func:`validate_sources` are the ops' one validator (their CPU and
CUDA kernels, their fake impls, the Triton launcher and the pattern's ``Stage.VALIDATED``
check), each bad argument an error that names it; the geometry they return (:class:`ConvMeta`);
the ``_cat`` ops' sources as one input (:func:`cat_sources`) and the ops' output
(:func:`new_output`)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from kda_inductor.lowerings import arg_error as _err
from kda_inductor.lowerings import check_tensor, definitely

__all__ = ["ACTIVATIONS", "FLOATS", "KIND", "MAX_SOURCES", "MAX_WIDTH", "ConvMeta", "cat_sources", "new_output",
           "validate", "validate_sources"]

MAX_WIDTH = 8
"""The widest kernel the op takes (every GDN / KDA / Mamba model has 4; 2..8 are tested)."""
MAX_SOURCES = 4
"""The most sources the ``_cat`` ops read (Qwen3-Next concatenates three: q, k, v)."""
ACTIVATIONS = ("silu", "none")
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
"""The kernels' dtype codes (``W_KIND``, ``ACT_KIND``, ``OUT_KIND``, ``S_KIND``)."""


class ConvMeta(NamedTuple):
    """The geometry :func:`validate` returns."""

    batch: int
    channels: int
    tokens: int
    width: int
    num_seqs: int
    state_width: int


def _check_float(x, arg: str, dims: int) -> None:
    check_tensor(x, arg)
    if x.dim() != dims or x.dtype not in FLOATS:
        raise _err(arg, f"expected a {dims}-D float32/bfloat16/float16 tensor, got {x.dim()}-D {x.dtype}")


def _weight_shape(weight, channels) -> int:
    """The kernel width K of ``weight`` ``[C, K]`` or ``[C, 1, K]`` (checked)."""
    check_tensor(weight, "weight")
    ok = weight.dim() == 2 or (weight.dim() == 3 and weight.shape[1] == 1)
    if not ok or weight.dtype not in FLOATS:
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
        if d not in FLOATS:
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
        if t.dim() not in (3, 4) or t.dtype not in FLOATS:
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
