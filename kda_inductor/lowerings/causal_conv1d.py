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

Every argument is validated (:func:`validate`, ``_conv_validate.py``; also the pattern's
``Stage.VALIDATED`` check), with errors that name it. ``cu_seqlens`` values are checked on the
host on CPU (an error naming ``cu_seqlens``) and by a device-side assert on CUDA (a sequence
past the end of ``x``: the kernel's debug mode, as ``kda::gdn_spec_split`` traps its indices).
The CPU kernel is aten's conv itself (``F.conv1d`` per sequence on the assembled ``[state |
x]``, then eager's silu): bit-identical to eager on CPU. The CUDA kernels (:func:`conv_triton`,
``_conv_launch.py``; the kernels ``_conv_kernels.py``, their configs ``_conv_configs.py``;
``docs/causal_conv1d.md``, "The kernels"): the prefill tiles tokens x channels with 16-byte
channel loads, the tile's weights and bias in registers, its windows run as a register window
(each ``x`` row read once) or as blocks of shifted taps (tiles holding a sequence start: blocks
of taps from ``x`` or the state); the update reads and writes the state tile once. Fixed
configs per shape class (``PREFILL_CONFIGS``, ``UPDATE_CONFIGS``), no host sync, no allocation
but the output, safe under CUDA-graph capture.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kda_inductor.lowerings import arg_error as _err
from kda_inductor.lowerings._conv_configs import (
    PREFILL_CONFIGS,
    UPDATE_CONFIGS,
    UPDATE_MAX_T,
    LaunchConfig,
    UpdateConfig,
    fit,
    launch_config,
    read_sources,
    update_config,
)
from kda_inductor.lowerings._conv_launch import conv_triton, launch
from kda_inductor.lowerings._conv_validate import (
    FLOATS,
    MAX_SOURCES,
    MAX_WIDTH,
    ConvMeta,
    cat_sources,
    new_output,
    validate,
    validate_sources,
)
from kda_inductor.lowerings._triton import triton

__all__ = ["FLOATS", "MAX_SOURCES", "MAX_WIDTH", "PREFILL_CONFIGS", "UPDATE_CONFIGS", "UPDATE_MAX_T", "LaunchConfig",
           "UpdateConfig", "causal_conv1d", "causal_conv1d_cat", "causal_conv1d_update", "causal_conv1d_update_cat",
           "conv_cpu", "conv_triton", "fit", "launch_config", "read_sources", "triton", "update_config", "validate",
           "validate_sources"]


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


def conv_cpu(x, weight, bias, state, cu_seqlens, activation, act_dtype, out_dtype, meta: ConvMeta) -> Tensor:
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
    return conv_cpu(x, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype, meta)


@causal_conv1d.register_fake
def _causal_conv1d_fake(x, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype):
    validate(x, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype)
    return new_output(x, out_dtype)


@causal_conv1d.register_kernel("cuda")
def _causal_conv1d_cuda(x, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype):
    meta = validate(x, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype)
    out = new_output(x, out_dtype)
    launch(x, weight, bias, initial_state, cu_seqlens, out, activation, act_dtype, meta)
    return out


@torch.library.custom_op("kda::causal_conv1d_update", mutates_args=("conv_state",), device_types="cpu")
def causal_conv1d_update(x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None, activation: str,
                         act_dtype: torch.dtype, out_dtype: torch.dtype) -> Tensor:
    """The conv of ``x [B, C, T]`` continuing ``conv_state [B, C, S]``, which it then shifts
    in place: its new columns are the last ``S`` of ``[conv_state | x]``."""
    meta = validate(x, weight, bias, conv_state, None, activation, act_dtype, out_dtype, state_arg="conv_state")
    out = conv_cpu(x, weight, bias, conv_state, None, activation, act_dtype, out_dtype, meta)
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
    launch(x, weight, bias, conv_state, None, out, activation, act_dtype, meta, update=True)
    return out


@torch.library.custom_op("kda::causal_conv1d_cat", mutates_args=(), device_types="cpu")
def causal_conv1d_cat(xs: list[Tensor], weight: Tensor, bias: Tensor | None, initial_state: Tensor | None,
                      cu_seqlens: Tensor | None, activation: str, act_dtype: torch.dtype,
                      out_dtype: torch.dtype) -> Tensor:
    """``causal_conv1d`` of ``cat([x.flatten(2) for x in xs], -1).transpose(1, 2)``: the sources
    (token-major ``[B, T, C_i]`` or ``[B, T, H_i, D_i]``, any strides) read where they lie, no cat."""
    meta = validate_sources(xs, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype)
    return conv_cpu(cat_sources(xs), weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype,
                     meta)


@causal_conv1d_cat.register_fake
def _causal_conv1d_cat_fake(xs, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype):
    meta = validate_sources(xs, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype)
    return xs[0].new_empty((meta.batch, meta.tokens, meta.channels), dtype=out_dtype).transpose(1, 2)


@causal_conv1d_cat.register_kernel("cuda")
def _causal_conv1d_cat_cuda(xs, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype):
    meta = validate_sources(xs, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype)
    out = xs[0].new_empty((meta.batch, meta.tokens, meta.channels), dtype=out_dtype).transpose(1, 2)
    launch(list(xs), weight, bias, initial_state, cu_seqlens, out, activation, act_dtype, meta)
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
    launch(list(xs), weight, bias, conv_state, None, out, activation, act_dtype, meta, update=True)
    return out
