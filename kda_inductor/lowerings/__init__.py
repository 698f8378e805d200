"""Fused ops, one file per rewrite: custom op, Triton kernel, CPU and fake impls.

Also the checks and views the ops share (the indexer's paged K cache is read by
``indexer_k_gather`` and written by ``indexer_k_write``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from kda_inductor.reference import QUANT_GROUP, scale_bytes


def arg_error(arg: str, msg: str, exc: type[Exception] = ValueError) -> Exception:
    """The error for a bad argument: its message starts with the argument's name."""
    return exc(f"{arg}: {msg}")


def triton_launch_options() -> dict:
    """Extra launch options for our debug-mode kernels: Triton's debug mode (needed for
    ``device_assert``) also adds overflow checks to 32-bit integer arithmetic, which cost
    up to 20% (benchmarks/results/gdn_spec_split.md); keep the asserts, drop those checks
    where this Triton lets us."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:  # pragma: no cover
        return {}
    fields = getattr(CUDAOptions, "__dataclass_fields__", {})
    return {"sanitize_overflow": False} if "sanitize_overflow" in fields else {}


def block_for_programs(block: int, programs: Callable[[int], int], target: int) -> int:
    """Halve the power-of-two work ``block`` of one program while fewer than ``target``
    programs (``programs(block)``) would run: big blocks when there is enough work to fill
    the GPU, smaller ones when few tokens would leave it idle."""
    while block > 1 and programs(block) < target:
        block //= 2
    return block


class AotVariant(NamedTuple):
    """One way a lowering launches one of its Triton kernels, for the ahead-of-time sm_90
    compile check (``tests/aot_sm90.py``): the kernel, the types of its runtime arguments
    (Triton signature strings, e.g. ``"*bf16"``, ``"i32"``), its constexpr values, and the
    compile options. Each lowering module declares its own in ``aot_variants()``."""

    kernel: Any
    types: dict
    constexprs: dict
    options: dict


def debug_options(num_warps: int = 4) -> dict:
    """Compile options of our debug-mode kernels (``device_assert``), as launched."""
    return {"num_warps": num_warps, "debug": True, **triton_launch_options()}


def definitely(pred) -> bool:
    """``pred`` (a bool, or a SymBool while tracing) is known true for every value of its
    symbols: size checks in fake impls must never add guards, so a check that cannot be
    decided at trace time is left to the real call."""
    if isinstance(pred, bool):
        return pred
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(pred))


def check_tensor(x, arg: str) -> None:
    """``x`` must be a Tensor (a TypeError naming ``arg`` otherwise)."""
    if not isinstance(x, Tensor):
        raise arg_error(arg, f"expected a Tensor, got {type(x).__name__}", TypeError)


def check_kv_cache(kv_cache: Tensor, head_dim) -> tuple[int, int]:
    """The indexer's blocked K cache for ``head_dim``: uint8 ``[num_blocks, block_size,
    head_dim + 4 * (head_dim // 128)]`` with contiguous blocks. Returns ``(num_blocks,
    block_size)``."""
    sb = scale_bytes(head_dim)
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 3:
        raise arg_error("kv_cache", f"expected a 3-D uint8 tensor, got {kv_cache.dim()}-D {kv_cache.dtype}")
    num_blocks, block_size, row = kv_cache.shape
    if row != head_dim + sb:
        raise arg_error(
            "kv_cache",
            f"expected last dim head_dim + 4 * (head_dim // {QUANT_GROUP}) = {head_dim + sb} "
            f"for head_dim {head_dim}, got {row}",
        )
    if (kv_cache.stride(2) != 1 and row > 1) or (kv_cache.stride(1) != row and block_size > 1):
        raise arg_error(
            "kv_cache",
            f"each block must be contiguous (strides (*, {row}, 1)), got strides {tuple(kv_cache.stride())}",
        )
    return num_blocks, block_size


def cache_bytes(kv_cache: Tensor) -> Tensor:
    """``kv_cache`` -> uint8 ``[num_blocks, block_size * row]`` view (blocks are contiguous)."""
    nb, bs, row = kv_cache.shape
    return kv_cache.as_strided((nb, bs * row), (kv_cache.stride(0), 1))
