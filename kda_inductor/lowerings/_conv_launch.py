"""Launching the ``kda::causal_conv1d`` kernels (``_conv_kernels.py``) on validated arguments:
:func:`conv_triton` (what the CUDA impls call; also on CPU tensors under ``TRITON_INTERPRET=1``).
No host sync, no allocation but the output, safe under CUDA-graph capture; configs from
``_conv_configs.py``."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kda_inductor.lowerings import _conv_kernels as kernels
from kda_inductor.lowerings import arg_error as _err
from kda_inductor.lowerings import interpreter_checks, triton_launch_options
from kda_inductor.lowerings._conv_configs import (
    UPDATE_MAX_T,
    LaunchConfig,
    Source,
    UpdateConfig,
    geometry,
    head_block,
    launch_config,
    next_power_of_2,
    read_sources,
    update_config,
)
from kda_inductor.lowerings._conv_validate import KIND, MAX_SOURCES, ConvMeta, cat_sources, validate, validate_sources
from kda_inductor.lowerings._triton import triton

__all__ = ["conv_triton", "launch"]


def _steps(num_seqs: int) -> int:
    return max(1, math.ceil(math.log2(max(num_seqs, 1)))) + 1


def _common(srcs: list[Source], weight, bias, out, activation, act_dtype, meta: ConvMeta, bh: int, bd: int):
    """The launch arguments both kernels share: pointers, strides and constexprs."""
    geo, blocks = geometry(srcs, bh, bd)
    ptrs = [s.t for s in srcs] + [srcs[0].t] * (MAX_SOURCES - len(srcs))
    strides = dict(sx_b=srcs[0].sb, sx_t=srcs[0].st, sx_c=srcs[0].sd)
    consts = dict(geo, C=meta.channels, NSRC=len(srcs), K=meta.width, BH=bh, BD=bd, HAS_BIAS=bias is not None,
                  SILU=activation == "silu", W_KIND=KIND[weight.dtype], ACT_KIND=KIND[act_dtype],
                  OUT_KIND=KIND[out.dtype], HW=out.is_cuda, X_UNIT=srcs[0].sd == 1)
    return ptrs, strides, consts, blocks


def launch(x, weight, bias, state, cu_seqlens, out, activation, act_dtype, meta: ConvMeta, *,
           update: bool = False, config=None) -> None:
    """The conv of ``x`` (``[B, C, T]``, or the ``_cat`` ops' sources list) into ``out``;
    ``update``: ``state`` is the conv state, shifted in place (one launch up to ``UPDATE_MAX_T``
    tokens, else the prefill launch and the shift)."""
    if triton is None:  # pragma: no cover
        raise RuntimeError("causal_conv1d: the Triton kernel needs triton, which is not installed")
    if meta.tokens == 0 or meta.batch == 0 or meta.channels == 0:
        return
    srcs = read_sources(x)
    if srcs is None:  # sources with strides of their own: read their cat
        srcs = read_sources(cat_sources(x))
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
    bh, bd = head_block(srcs, cfg.block_c)
    ptrs, strides, consts, blocks = _common(srcs, w, bias, out, activation, act_dtype, meta, bh, bd)
    hw = out.is_cuda
    kernel = kernels.prefill_kernel_checked if cu_seqlens is not None else kernels.prefill_kernel
    extra = triton_launch_options() if hw and cu_seqlens is not None else {}
    st = state if state is not None else w
    s_strides = state.stride() if state is not None else (0, 0, 0)
    grid = (triton.cdiv(meta.tokens, cfg.block_t), blocks, meta.batch)
    with interpreter_checks(cu_seqlens is not None and not hw):
        kernel[grid](
            *ptrs, w, bias if bias is not None else w, st, cu_seqlens if cu_seqlens is not None else w, out,
            meta.tokens, meta.state_width, meta.num_seqs, **strides, ss_n=s_strides[0], ss_c=s_strides[1],
            ss_t=s_strides[2], sw_c=w.stride(0), sw_k=w.stride(1), **consts, BLOCK_T=cfg.block_t, ROWS=cfg.rows,
            NUM_STAGES=cfg.num_stages, WINDOW=cfg.window, PREFETCH=cfg.prefetch, UNROLL=cfg.unroll,
            PTX=cfg.ptx and (bh * bd) % (128 * cfg.num_warps) == 0, HAS_STATE=state is not None,
            VARLEN=cu_seqlens is not None, STEPS=_steps(meta.num_seqs), num_warps=cfg.num_warps, **extra,
        )


def _launch_update(srcs, w, bias, state, out, activation, act_dtype, meta: ConvMeta, cfg: UpdateConfig, *,
                   conv: bool) -> None:
    bh, bd = head_block(srcs, cfg.block_c)
    ptrs, strides, consts, blocks = _common(srcs, w, bias, out, activation, act_dtype, meta, bh, bd)
    kernels.update_kernel[(blocks, meta.batch)](
        *ptrs, state, w, bias if bias is not None else w, out, meta.tokens, meta.state_width, **strides,
        ss_n=state.stride(0), ss_c=state.stride(1), ss_t=state.stride(2), sw_c=w.stride(0), sw_k=w.stride(1),
        **consts, S_P2=next_power_of_2(max(meta.state_width, 1)), CONV=conv,
        ONE=conv and meta.tokens == 1 and not cfg.tile, S_KIND=KIND[state.dtype],
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
    in place); ``config``: the launch, used as given (default :func:`launch_config` /
    :func:`update_config`). No host sync; no allocation but a default ``out``."""
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
    launch(x, weight, bias, initial_state, cu_seqlens, out, activation, act_dtype, meta, update=update,
           config=config)
    return out
