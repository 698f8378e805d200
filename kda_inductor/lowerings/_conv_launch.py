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
    PREFILL_CONFIGS,
    QWEN3_NEXT_SOURCES,
    UPDATE_CONFIGS,
    UPDATE_MAX_T,
    LaunchConfig,
    Source,
    UpdateConfig,
    aot_geometry,
    geometry,
    head_block,
    launch_config,
    next_power_of_2,
    read_sources,
    update_config,
)
from kda_inductor.lowerings._conv_validate import KIND, MAX_SOURCES, ConvMeta, cat_sources, validate, validate_sources
from kda_inductor.lowerings._triton import triton

__all__ = ["aot_variants", "conv_triton", "launch"]


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


def _vector_layout(state, w, meta: ConvMeta) -> bool:
    """Whether the decode's vector form (``_decode_rows``) reads this state and weight: ``[C, K]``
    rows contiguous in both, ``K`` a power of two, the state ``K`` wide."""
    k = meta.width
    return (meta.state_width == k and k in (2, 4, 8) and state.stride()[1:] == (k, 1)
            and tuple(w.stride()) == (k, 1))


def _launch_update(srcs, w, bias, state, out, activation, act_dtype, meta: ConvMeta, cfg: UpdateConfig, *,
                   conv: bool) -> None:
    bh, bd = head_block(srcs, cfg.block_c)
    ptrs, strides, consts, blocks = _common(srcs, w, bias, out, activation, act_dtype, meta, bh, bd)
    kernels.update_kernel[(blocks, meta.batch)](
        *ptrs, state, w, bias if bias is not None else w, out, meta.tokens, meta.state_width, **strides,
        ss_n=state.stride(0), ss_c=state.stride(1), ss_t=state.stride(2), sw_c=w.stride(0), sw_k=w.stride(1),
        **consts, S_P2=next_power_of_2(max(meta.state_width, 1)), CONV=conv,
        ONE=conv and meta.tokens == 1 and not cfg.tile, VECTOR=cfg.vector and _vector_layout(state, w, meta),
        S_KIND=KIND[state.dtype],
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


def aot_variants():
    """The launches to compile ahead of time for sm_90 (K = 4, bf16): every distinct prefill
    config of ``PREFILL_CONFIGS`` and two of the streaming window (``_conv_stream.py``, with and
    without its ``ptx``) at 8192 channels and in the Qwen3-Next cat form; with bias,
    state and no silu; varlen (the checked kernel) with a state; every update config class, and
    the state shift alone. Each with the integers our launcher passes at a representative launch
    (:func:`_aot_launches`), for ``tests/aot_sm90.py --as-launched``."""
    from kda_inductor.lowerings import AotVariant, debug_options

    ptrs = {n: "*bf16" for n in ("x0", "x1", "x2", "x3", "w_ptr", "b_ptr", "s_ptr", "y_ptr")}
    ints = {n: "i32" for n in ("T", "S", "sx_b", "sx_t", "sx_c", "ss_n", "ss_c", "ss_t", "sw_c", "sw_k")}
    pre_types = dict(ptrs, cu_ptr="*i32", num_seqs="i32", **ints)
    base = dict(K=4, HAS_BIAS=False, SILU=True, W_KIND=1, ACT_KIND=1, OUT_KIND=1, HW=True, X_UNIT=True)
    pre = dict(base, HAS_STATE=False, VARLEN=False, STEPS=1)
    plain = ((1, 8192, 0),)

    def tile(cfg):
        return dict(BLOCK_T=cfg.block_t, ROWS=cfg.rows, NUM_STAGES=cfg.num_stages, WINDOW=cfg.window,
                    PREFETCH=cfg.prefetch, PTX=cfg.ptx, UNROLL=cfg.unroll)

    at = _aot_launches()
    stream = (LaunchConfig(64, 256, 1, 1, 2, True, True, True, 4), LaunchConfig(64, 128, 1, 1, 4, True, True))
    for cfg in dict.fromkeys([cfg for _, _, cfg, _ in PREFILL_CONFIGS] + list(stream)):
        for sources in (plain, QWEN3_NEXT_SOURCES):
            consts = dict(pre, **aot_geometry(sources, cfg.block_c), **tile(cfg))
            yield AotVariant(kernels.prefill_kernel, pre_types, consts, {"num_warps": cfg.num_warps},
                             at[sources, False])
    big = dict(pre, **aot_geometry(plain, 128), **tile(PREFILL_CONFIGS[-1][2]))
    yield AotVariant(kernels.prefill_kernel, pre_types, dict(big, HAS_BIAS=True, SILU=False, HAS_STATE=True),
                     {"num_warps": 4}, at[plain, False])
    yield AotVariant(kernels.prefill_kernel_checked, pre_types, dict(big, HAS_STATE=True, VARLEN=True, STEPS=4),
                     debug_options(), at[plain, False])
    yield from _aot_updates(dict(ptrs, **{n: t for n, t in ints.items() if n != "num_seqs"}), base, at)


def _aot_updates(up_types: dict, base: dict, at: dict):
    """:func:`aot_variants`' update launches: every update config class, the decode's vector form, and the
    state shift alone."""
    from kda_inductor.lowerings import AotVariant

    plain = ((1, 8192, 0),)
    for _, cfg, _ in UPDATE_CONFIGS:
        consts = dict(base, **aot_geometry(plain, cfg.block_c), S_P2=4, SS_C=4, S_W=4, CONV=True, ONE=True, S_KIND=1)
        yield AotVariant(kernels.update_kernel, up_types, consts, {"num_warps": cfg.num_warps}, at[plain, True])
    warps = {"num_warps": cfg.num_warps}
    yield AotVariant(kernels.update_kernel, up_types, dict(consts, ONE=False), warps, at[plain, True])
    yield AotVariant(kernels.update_kernel, up_types, dict(consts, CONV=False, ONE=False), warps, at[plain, True])
    yield AotVariant(kernels.update_kernel, up_types, dict(consts, **aot_geometry(QWEN3_NEXT_SOURCES, 256)),
                     {"num_warps": 1}, at[QWEN3_NEXT_SOURCES, True])
    yield AotVariant(kernels.update_kernel, up_types, dict(consts, VECTOR=True), warps, at[plain, True])


def _aot_launches() -> dict:
    """``{(sources, update): launch}`` for :func:`aot_variants`, recorded from :func:`conv_triton` on CPU
    tensors (``recorded_launch``; no kernel runs): the prefill of 4,096 tokens of one sequence and the
    decode update of 32 sequences (a ``[B, C, 4]`` state), of 8,192 token-major channels or Qwen3-Next's
    ``cat(q, k, v)`` as views of its ``[B, T, 16, 768]`` projection."""
    from kda_inductor.lowerings import recorded_launch

    bf16, out, plain = torch.bfloat16, {}, ((1, 8192, 0),)
    w = torch.empty(8192, 4, dtype=bf16)
    for update, (b, t) in ((False, (1, 4096)), (True, (32, 1))):
        proj = torch.empty(b, t, 16, 768, dtype=bf16)
        state = torch.empty(b, 8192, 4, dtype=bf16) if update else None
        for sources, x in ((plain, torch.empty(b, t, 8192, dtype=bf16).transpose(1, 2)),
                           (QWEN3_NEXT_SOURCES, [proj[..., :128], proj[..., 128:256], proj[..., 256:512]])):
            name = "update_kernel" if update else "prefill_kernel"
            out[sources, update] = recorded_launch(kernels, name, lambda: conv_triton(
                x, w, initial_state=state, update=update))
    return out
