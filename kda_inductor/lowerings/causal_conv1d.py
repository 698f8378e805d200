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

Every argument is validated (:func:`validate`, also the pattern's ``Stage.VALIDATED`` check),
with errors that name it. ``cu_seqlens`` values are checked on the host on CPU (an error naming
``cu_seqlens``) and by a device-side assert on CUDA (a sequence past the end of ``x``: the
kernel's debug mode, as ``kda::gdn_spec_split`` traps its indices). The CPU kernel is aten's
conv itself (``F.conv1d`` per sequence on the assembled ``[state | x]``, then eager's silu):
bit-identical to eager on CPU. The CUDA kernel is :func:`conv_triton`: no host sync, no
allocation but the output, safe under CUDA-graph capture.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from kda_inductor.lowerings import arg_error as _err
from kda_inductor.lowerings import check_tensor, definitely, interpreter_checks, triton_launch_options

try:  # Triton is optional on CPU-only installs; the CPU kernel does not need it.
    import triton
    import triton.language as tl

    try:
        from triton.language.extra import libdevice
    except ImportError:  # pragma: no cover - Triton 3.0 keeps it per backend
        from triton.language.extra.cuda import libdevice
except ImportError:  # pragma: no cover
    triton = None
    tl = None

__all__ = ["MAX_WIDTH", "causal_conv1d", "causal_conv1d_update", "conv_triton", "validate"]

MAX_WIDTH = 8
"""The widest kernel the op takes (every GDN / KDA / Mamba model has 4; 2..8 are tested)."""
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
    if not definitely(weight.shape[0] == channels):
        raise _err("weight", f"expected {channels} channels (x.shape[1]), got {weight.shape[0]}")
    width = weight.shape[-1]
    if not (isinstance(width, int) and 1 <= width <= MAX_WIDTH):
        raise _err("weight", f"kernel width must be a static int in [1, {MAX_WIDTH}], got {width}")
    return width


def _check_state(state, arg: str, num_seqs, channels, width) -> int:
    """``state [num_seqs, C, S]`` with ``S >= K - 1``; returns ``S``."""
    _check_float(state, arg, 3)
    n, c, s = state.shape
    if not (definitely(n == num_seqs) and definitely(c == channels)):
        raise _err(arg, f"expected [{num_seqs}, {channels}, S] (one row per sequence, x's channels), "
                   f"got {list(state.shape)}")
    if not definitely(s >= width - 1):
        raise _err(arg, f"a state of width {s} cannot hold the {width - 1} previous tokens a kernel of "
                   f"width {width} reads (S >= K - 1)")
    return s


def _check_cu_seqlens(cu_seqlens, batch) -> int:
    check_tensor(cu_seqlens, "cu_seqlens")
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise _err("cu_seqlens", f"expected a 1-D int32/int64 tensor, got {cu_seqlens.dim()}-D {cu_seqlens.dtype}")
    if not definitely(cu_seqlens.shape[0] >= 2):
        raise _err("cu_seqlens", f"expected at least 2 entries (one sequence), got {cu_seqlens.shape[0]}")
    if not definitely(batch == 1):
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
    batch, channels, tokens = x.shape
    width = _weight_shape(weight, channels)
    if bias is not None:
        _check_float(bias, "bias", 1)
        if not definitely(bias.shape[0] == channels):
            raise _err("bias", f"expected one value per channel [{channels}], got {list(bias.shape)}")
    num_seqs = batch if cu_seqlens is None else _check_cu_seqlens(cu_seqlens, batch)
    s = 0 if initial_state is None else _check_state(initial_state, state_arg, num_seqs, channels, width)
    _check_options(activation, act_dtype, out_dtype)
    for t, arg in ((weight, "weight"), (bias, "bias"), (initial_state, state_arg), (cu_seqlens, "cu_seqlens")):
        if t is not None and t.device != x.device:
            raise _err(arg, f"expected device {x.device} (x's), got {t.device}")
    return ConvMeta(batch, channels, tokens, width, num_seqs, s)


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


# --------------------------------------------------------------------------------------
# Triton
# --------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _round(v, KIND: tl.constexpr, HW: tl.constexpr):
        """float32 ``v`` rounded to nearest even in the dtype ``KIND`` (0 float32, 1 bfloat16,
        2 float16), as float32. Without ``HW`` (the interpreter, whose float32 -> bfloat16 cast
        truncates) bfloat16 by the bits."""
        if KIND == 1:
            if HW:
                v = v.to(tl.bfloat16).to(tl.float32)
            else:
                b = v.to(tl.int32, bitcast=True)
                v = ((b + 0x7FFF + ((b >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
        elif KIND == 2:
            v = v.to(tl.float16).to(tl.float32)
        return v

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
    def _find_seq(cu_ptr, t, num_seqs, STEPS: tl.constexpr):
        """The sequence of each token ``t``: the largest ``n < num_seqs`` with ``cu[n] <= t``
        (binary search, ``STEPS >= ceil(log2(num_seqs)) + 1``)."""
        lo = tl.zeros_like(t)
        size = lo + num_seqs
        for _ in tl.static_range(STEPS):
            half = size // 2
            ok = (half > 0) & (tl.load(cu_ptr + lo + half, mask=half > 0, other=0).to(tl.int64) <= t)
            lo = tl.where(ok, lo + half, lo)
            size = tl.where(half > 0, tl.where(ok, size - half, half), size)
        return lo

    @triton.jit
    def _tap(x_row, s_ptr, seq, t, live, start, c, cmask, S, sx_t, sx_c, ss_n, ss_c, ss_t, back,
             HAS_STATE: tl.constexpr, D: tl.constexpr):
        """The input ``back`` tokens before each token ``t`` (float32 ``[BLOCK_T, BLOCK_C]``,
        in the weight's dtype ``D`` first) and whether the tap counts: from ``x`` inside the
        sequence, from the state's last columns before its start, else skipped (padding)."""
        src = t - back
        in_x = (src >= start) & live
        v = tl.load(x_row + src[:, None] * sx_t + c[None, :] * sx_c, mask=in_x[:, None] & cmask[None, :], other=0.0)
        v = v.to(D).to(tl.float32)
        valid = in_x
        if HAS_STATE:
            col = S + (src - start)
            in_s = (src < start) & (col >= 0) & live
            sv = tl.load(s_ptr + seq[:, None] * ss_n + c[None, :] * ss_c + col[:, None] * ss_t,
                         mask=in_s[:, None] & cmask[None, :], other=0.0)
            v = tl.where(in_x[:, None], v, sv.to(D).to(tl.float32))
            valid = in_x | in_s
        return v, valid

    @triton.jit
    def _write_state(x_row, s_ptr, row, c, cmask, T, S, sx_t, sx_c, ss_n, ss_c, ss_t,
                     S_P2: tl.constexpr, HW: tl.constexpr, S_KIND: tl.constexpr):
        """Row ``row`` of the state becomes the last ``S`` columns of ``[state | x]`` (this
        program's channels; every read before the barrier, every write after it)."""
        j = tl.arange(0, S_P2)
        p = j + T
        jm = j < S
        from_s = p < S
        base = s_ptr + row.to(tl.int64) * ss_n + c[:, None] * ss_c
        old = tl.load(base + p[None, :] * ss_t, mask=cmask[:, None] & (jm & from_s)[None, :], other=0.0)
        xv = tl.load(x_row + (p - S)[None, :] * sx_t + c[:, None] * sx_c,
                     mask=cmask[:, None] & (jm & ~from_s)[None, :], other=0.0)
        xv = _round(xv.to(tl.float32), S_KIND, HW).to(s_ptr.dtype.element_ty)
        new = tl.where(from_s[None, :], old, xv)
        tl.debug_barrier()
        tl.store(base + j[None, :] * ss_t, new, mask=cmask[:, None] & jm[None, :])

    @triton.jit
    def _conv_sum(x_row, w_ptr, b_ptr, s_ptr, seq, t, live, start, c, cmask, S, sx_t, sx_c, ss_n, ss_c, ss_t,
                  sw_c, sw_k, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
                  HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr):
        """aten's sum: the bias (or 0), then each tap's product added oldest first with one
        rounding (an FMA, as nvcc compiles aten's ``value += w * x``), skipped taps leaving it
        as is."""
        D = w_ptr.dtype.element_ty
        if HAS_BIAS:
            bias = tl.load(b_ptr + c, mask=cmask, other=0.0).to(D).to(tl.float32)
            acc = tl.broadcast_to(bias[None, :], (BLOCK_T, BLOCK_C))
        else:
            acc = tl.zeros((BLOCK_T, BLOCK_C), tl.float32)
        for k in tl.static_range(K):
            wk = tl.load(w_ptr + c * sw_c + k * sw_k, mask=cmask, other=0.0).to(tl.float32)
            v, valid = _tap(x_row, s_ptr, seq, t, live, start, c, cmask, S, sx_t, sx_c, ss_n, ss_c, ss_t, K - 1 - k,
                            HAS_STATE, D)
            acc = tl.where(valid[:, None], tl.fma(tl.broadcast_to(wk[None, :], (BLOCK_T, BLOCK_C)), v, acc), acc)
        return acc

    def _conv_body(x_ptr, w_ptr, b_ptr, s_ptr, cu_ptr, y_ptr, T, C, S, num_seqs,
                   sx_b, sx_c, sx_t, ss_n, ss_c, ss_t, sw_c, sw_k,
                   K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr,
                   HAS_STATE: tl.constexpr, VARLEN: tl.constexpr, STEPS: tl.constexpr, SILU: tl.constexpr,
                   ACT_KIND: tl.constexpr, OUT_KIND: tl.constexpr, UPDATE: tl.constexpr, S_P2: tl.constexpr,
                   S_KIND: tl.constexpr, HW: tl.constexpr):
        """Program (i, j, b): tokens [i * BLOCK_T, +BLOCK_T) x channels [j * BLOCK_C, +BLOCK_C)
        of row b (varlen: of the one row, each token in its own sequence); ``UPDATE``: this
        program holds its row's every token and also shifts the row's state."""
        b = tl.program_id(2)
        t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        cmask = c < C
        x_row = x_ptr + b.to(tl.int64) * sx_b
        if VARLEN:
            seq = _find_seq(cu_ptr, t, num_seqs, STEPS)
            start = tl.load(cu_ptr + seq).to(tl.int64)
            tl.device_assert(tl.load(cu_ptr + num_seqs) == T, "causal_conv1d: cu_seqlens[-1] != x.shape[-1]")
        else:
            seq = tl.zeros_like(t) + b
            start = tl.zeros_like(t)
        live = t < T
        acc = _conv_sum(x_row, w_ptr, b_ptr, s_ptr, seq, t, live, start, c, cmask, S, sx_t, sx_c, ss_n, ss_c, ss_t,
                        sw_c, sw_k, K, BLOCK_T, BLOCK_C, HAS_BIAS, HAS_STATE)
        v = _round(acc, ACT_KIND, HW)
        if SILU:
            v = _silu(v, HW)
        y = _round(v, OUT_KIND, HW).to(y_ptr.dtype.element_ty)
        m = live[:, None] & cmask[None, :]
        tl.store(y_ptr + (b.to(tl.int64) * T + t)[:, None] * C + c[None, :], y, mask=m)
        if UPDATE:
            _write_state(x_row, s_ptr, b, c, cmask, T, S, sx_t, sx_c, ss_n, ss_c, ss_t, S_P2, HW, S_KIND)

    def _state_body(x_ptr, s_ptr, T, C, S, sx_b, sx_c, sx_t, ss_n, ss_c, ss_t,
                    BLOCK_C: tl.constexpr, S_P2: tl.constexpr, S_KIND: tl.constexpr, HW: tl.constexpr):
        """The state shift alone (after a conv launch of several token blocks per row)."""
        b = tl.program_id(1)
        c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
        _write_state(x_ptr + b.to(tl.int64) * sx_b, s_ptr, b, c, c < C, T, S, sx_t, sx_c, ss_n, ss_c, ss_t,
                     S_P2, HW, S_KIND)

    _conv_kernel = triton.jit(_conv_body)
    _conv_kernel_checked = triton.jit(debug=True)(_conv_body)
    """The varlen launches: Triton's debug mode, so that ``cu_seqlens``' device assert traps."""
    _state_kernel = triton.jit(_state_body)


class LaunchConfig(NamedTuple):
    block_t: int
    block_c: int
    num_warps: int


MAX_BLOCK_T = 32
MAX_BLOCK_C = 128
UPDATE_MAX_T = 64
"""Tokens per row up to which the update op shifts the state in its conv launch (one token
block per row); above, a second launch does."""


TARGET_PROGRAMS = 512
"""Blocks shrink (channels first, down to 32) while fewer programs than this would run."""


def launch_config(tokens: int, channels: int, batch: int = 1, *, update: bool = False) -> LaunchConfig:
    """Tokens x channels per program (powers of two) and warps (one per 1024 values, 1 to 8).
    Prefill: 32 x 128 (each tap's loads beyond the block's 32 tokens, K - 1 of them, hit the
    cache); decode and the update op: every token of a row in one program (the state shift
    needs them), 256 channels; both shrink while fewer than ``TARGET_PROGRAMS`` programs would
    fill the GPU. Not yet measured on a GPU: ``benchmarks/bench_causal_conv1d.py --sweep``
    times the alternatives."""
    cap = UPDATE_MAX_T if update else MAX_BLOCK_T
    block_t = min(triton.next_power_of_2(max(int(tokens), 1)), cap)
    block_c = min(triton.next_power_of_2(max(int(channels), 1)), MAX_BLOCK_C if block_t > 1 else 256)

    def programs(bt, bc):
        return -(-int(tokens) // bt) * -(-int(channels) // bc) * max(int(batch), 1)

    while programs(block_t, block_c) < TARGET_PROGRAMS and block_c > 32:
        block_c //= 2
    while programs(block_t, block_c) < TARGET_PROGRAMS and block_t > 8 and not update:
        block_t //= 2
    return LaunchConfig(block_t, block_c, max(1, min(8, block_t * block_c // 1024)))


def _steps(num_seqs: int) -> int:
    return max(1, math.ceil(math.log2(max(num_seqs, 1)))) + 1


def _launch(x, weight, bias, state, cu_seqlens, out, activation, act_dtype, meta: ConvMeta, *,
            update: bool = False, config: LaunchConfig | None = None) -> None:
    if triton is None:  # pragma: no cover
        raise RuntimeError("causal_conv1d: the Triton kernel needs triton, which is not installed")
    if meta.tokens == 0 or meta.batch == 0 or meta.channels == 0:
        return
    cfg = config or launch_config(meta.tokens, meta.channels, meta.batch, update=update)
    fused = update and cfg.block_t >= meta.tokens
    hw = x.is_cuda
    w = weight.reshape(weight.shape[0], weight.shape[-1])
    dummy = x
    st = state if state is not None else dummy
    grid = (triton.cdiv(meta.tokens, cfg.block_t), triton.cdiv(meta.channels, cfg.block_c), meta.batch)
    kernel = _conv_kernel_checked if cu_seqlens is not None else _conv_kernel
    extra = triton_launch_options() if hw and cu_seqlens is not None else {}
    s_strides = st.stride() if state is not None else (0, 0, 0)
    with interpreter_checks(cu_seqlens is not None and not hw):
        kernel[grid](
            x, w, bias if bias is not None else w, st, cu_seqlens if cu_seqlens is not None else w, out,
            meta.tokens, meta.channels, meta.state_width, meta.num_seqs, *x.stride(), *s_strides, *w.stride(),
            K=meta.width, BLOCK_T=cfg.block_t, BLOCK_C=cfg.block_c, HAS_BIAS=bias is not None,
            HAS_STATE=state is not None, VARLEN=cu_seqlens is not None, STEPS=_steps(meta.num_seqs),
            SILU=activation == "silu", ACT_KIND=_KIND[act_dtype], OUT_KIND=_KIND[out.dtype], UPDATE=fused,
            S_P2=triton.next_power_of_2(max(meta.state_width, 1)), S_KIND=_KIND[st.dtype], HW=hw,
            num_warps=cfg.num_warps, **extra,
        )
    if update and not fused:
        _launch_state(x, state, meta, cfg, hw)


def _launch_state(x, state, meta: ConvMeta, cfg: LaunchConfig, hw: bool) -> None:
    block_c = min(cfg.block_c, 128)
    _state_kernel[(triton.cdiv(meta.channels, block_c), meta.batch)](
        x, state, meta.tokens, meta.channels, meta.state_width, *x.stride(), *state.stride(),
        BLOCK_C=block_c, S_P2=triton.next_power_of_2(max(meta.state_width, 1)), S_KIND=_KIND[state.dtype], HW=hw,
        num_warps=max(1, min(4, block_c // 32)),
    )


def conv_triton(x: Tensor, weight: Tensor, bias: Tensor | None = None, initial_state: Tensor | None = None,
                cu_seqlens: Tensor | None = None, activation: str = "silu", act_dtype: torch.dtype | None = None,
                out: Tensor | None = None, *, update: bool = False, config: LaunchConfig | None = None) -> Tensor:
    """The Triton kernel on validated arguments (what the CUDA impls launch; also on CPU
    tensors under ``TRITON_INTERPRET=1``). ``out``: ``[B, C, T]`` (any strides whose
    ``transpose(1, 2)`` is contiguous), default a fresh one in ``act_dtype``; ``update``: the
    update op (``initial_state`` is the conv state, shifted in place); ``config``: the launch
    (default :func:`launch_config`). No host sync; no allocation but a default ``out``."""
    act_dtype = act_dtype or weight.dtype
    out_dtype = out.dtype if out is not None else act_dtype
    meta = validate(x, weight, bias, initial_state, cu_seqlens, activation, act_dtype, out_dtype)
    if out is None:
        out = new_output(x, out_dtype)
    elif tuple(out.shape) != tuple(x.shape) or not out.transpose(1, 2).is_contiguous():
        raise _err("out", f"expected {list(x.shape)} over token-major memory, got {list(out.shape)} "
                   f"strides {out.stride()}")
    _launch(x, weight, bias, initial_state, cu_seqlens, out, activation, act_dtype, meta, update=update,
            config=config)
    return out


def aot_variants():
    """The launches to compile ahead of time for sm_90: K = 4, bf16, prefill (32 x 128) and
    decode blocks, with and without bias, state, varlen, silu and the fused state shift, plus
    the state kernel."""
    from kda_inductor.lowerings import AotVariant, debug_options

    types = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", s_ptr="*bf16", cu_ptr="*i32", y_ptr="*bf16",
                 T="i32", C="i32", S="i32", num_seqs="i32", sx_b="i32", sx_c="i32", sx_t="i32", ss_n="i32",
                 ss_c="i32", ss_t="i32", sw_c="i32", sw_k="i32")
    base = dict(K=4, BLOCK_T=32, BLOCK_C=128, HAS_BIAS=False, HAS_STATE=False, VARLEN=False, STEPS=1, SILU=True,
                ACT_KIND=1, OUT_KIND=1, UPDATE=False, S_P2=4, S_KIND=1, HW=True)
    yield AotVariant(_conv_kernel, types, base, {"num_warps": 4})
    yield AotVariant(_conv_kernel, types, dict(base, HAS_BIAS=True, SILU=False), {"num_warps": 4})
    yield AotVariant(_conv_kernel, types, dict(base, BLOCK_T=1, BLOCK_C=256, HAS_STATE=True, UPDATE=True),
                     {"num_warps": 1})
    yield AotVariant(_conv_kernel_checked, types, dict(base, HAS_STATE=True, VARLEN=True, STEPS=4), debug_options())
    state_types = {k: types[k] for k in ("x_ptr", "s_ptr", "T", "C", "S", "sx_b", "sx_c", "sx_t", "ss_n", "ss_c",
                                         "ss_t")}
    yield AotVariant(_state_kernel, state_types, dict(BLOCK_C=128, S_P2=4, S_KIND=1, HW=True), {"num_warps": 4})
