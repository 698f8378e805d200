"""Fused ops, one file per rewrite: custom op, Triton kernel, CPU and fake impls.

Also the checks and views the ops share (the indexer's paged K cache is read by
``indexer_k_gather`` and written by ``indexer_k_write``)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import statically_known_true

from kda_inductor.reference import QUANT_GROUP, CacheLayout


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
    (Triton signature strings, e.g. ``"*bf16"``, ``"i32"``), its constexpr values, the
    compile options, and the integers' values at a representative launch (``aot_sm90.py
    --as-launched`` specializes them as Triton's launcher does). Each lowering module declares its
    own in ``aot_variants()``."""

    kernel: Any
    types: dict
    constexprs: dict
    options: dict
    launch: dict | None = None


def recorded_launch(holder: Any, name: str, call: Callable[[], Any]) -> dict:
    """The runtime integers that ``call()`` passes to the kernel ``holder.<name>`` (a module's
    ``triton.jit`` function) when it runs our launcher, the kernel itself not run: an
    :class:`AotVariant`'s ``launch`` taken from the real launcher on CPU tensors of a representative
    shape instead of written by hand. The last launch wins."""
    kernel, seen = getattr(holder, name), {}
    hints = getattr(getattr(kernel, "fn", kernel), "__annotations__", {})  # the interpreter's wrapper too
    runtime = [n for n in kernel.arg_names if "constexpr" not in str(hints.get(n, ""))]

    class _Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: seen.update(zip(kernel.arg_names, args), **kw)

    setattr(holder, name, _Recorder())
    try:
        call()
    finally:
        setattr(holder, name, kernel)
    return {n: int(seen[n]) for n in runtime if isinstance(seen.get(n), int) and not isinstance(seen[n], bool)}


def debug_options(num_warps: int = 4) -> dict:
    """Compile options of our debug-mode kernels (``device_assert``), as launched."""
    return {"num_warps": num_warps, "debug": True, **triton_launch_options()}


definitely = statically_known_true
"""``definitely(pred)``: ``pred`` (a bool, or a SymBool while tracing) is known true for every
value of its symbols. Torch's ``statically_known_true`` under the name our fake impls' size
checks read as: they must never add guards, so a check that cannot be decided at trace time
is left to the real call."""


def check_tensor(x, arg: str) -> None:
    """``x`` must be a Tensor (a TypeError naming ``arg`` otherwise)."""
    if not isinstance(x, Tensor):
        raise arg_error(arg, f"expected a Tensor, got {type(x).__name__}", TypeError)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_block_size(block_size) -> None:
    """``block_size`` (the op argument) must be an int >= 0 (0: taken from a 3-D cache)."""
    if _is_int(block_size):
        if block_size < 0:
            raise arg_error("block_size", f"expected >= 0 (0: the 3-D cache's shape[1]), got {block_size}")
    elif not isinstance(block_size, torch.SymInt):
        raise arg_error("block_size", f"expected an int, got {type(block_size).__name__}", TypeError)


def check_kv_cache(kv_cache: Tensor, head_dim, block_size=0) -> tuple[int, int]:
    """The indexer's blocked K cache for ``head_dim`` (``row = CacheLayout(head_dim).row_bytes``
    bytes per token), in one of two shapes:

    * 3-D uint8 ``[num_blocks, block_size, row]`` (vLLM), each block contiguous; the
      ``block_size`` argument is 0 or ``kv_cache.shape[1]``;
    * 2-D uint8 ``[num_pages, block_size * row]`` (SGLang's page buffer), each page
      contiguous, with the same blocked layout inside a page; ``block_size`` (tokens per
      page) is then required and must divide the row into ``row``-byte tokens; also with
      unit dims between (TensorRT-LLM's pool view ``[num_blocks, 1, 1, block_bytes]``).

    Returns ``(num_blocks, block_size)``. The block stride is free in both. (The matchers'
    reading of a cache's shape, without errors, is :meth:`CacheLayout.parse`.) Symbolic sizes
    (a fake impl's) are checked only where the answer is known at trace time (``definitely``):
    never a guard; the real call checks the rest."""
    check_block_size(block_size)
    row = CacheLayout(head_dim).row_bytes
    if kv_cache.dim() > 3 and all(definitely(s == 1) for s in kv_cache.shape[1:-1]):  # pages, unit dims between
        kv_cache = kv_cache.as_strided((kv_cache.shape[0], kv_cache.shape[-1]), (kv_cache.stride(0), kv_cache.stride(-1)))
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() not in (2, 3):
        raise arg_error("kv_cache", f"expected a 3-D uint8 tensor [num_blocks, block_size, {row}] or a 2-D "
                        f"uint8 page buffer [num_pages, block_size * {row}], got {kv_cache.dim()}-D {kv_cache.dtype}")
    if kv_cache.dim() == 2:
        return _check_pages(kv_cache, head_dim, row, block_size)
    return _check_blocks(kv_cache, head_dim, row, block_size)


def _check_pages(kv_cache: Tensor, head_dim, row, block_size) -> tuple[int, int]:
    """:func:`check_kv_cache` of a 2-D page buffer ``[num_pages, block_size * row]``."""
    num_blocks, page = kv_cache.shape
    if definitely(block_size == 0):
        raise arg_error("block_size", f"required (tokens per page) for a 2-D kv_cache [num_pages, "
                        f"block_size * {row}], got 0")
    if definitely(page != block_size * row):
        raise arg_error(
            "block_size",
            f"a 2-D kv_cache's rows must hold block_size tokens of head_dim + 4 * (head_dim // "
            f"{QUANT_GROUP}) = {row} bytes for head_dim {head_dim}: expected {block_size} * {row} = "
            f"{block_size * row} bytes per page, got {page}",
        )
    if definitely(kv_cache.stride(1) != 1) and definitely(page > 1):
        raise arg_error("kv_cache", f"each page must be contiguous (stride(1) == 1), got strides "
                        f"{tuple(kv_cache.stride())}")
    return num_blocks, block_size


def _check_blocks(kv_cache: Tensor, head_dim, row, block_size) -> tuple[int, int]:
    """:func:`check_kv_cache` of a 3-D cache ``[num_blocks, block_size, row]``."""
    num_blocks, bs, last = kv_cache.shape
    if definitely(last != row):
        raise arg_error(
            "kv_cache",
            f"expected last dim head_dim + 4 * (head_dim // {QUANT_GROUP}) = {row} "
            f"for head_dim {head_dim}, got {last}",
        )
    if definitely(block_size != 0) and definitely(block_size != bs):
        raise arg_error("block_size", f"expected 0 or kv_cache.shape[1] = {bs} for a 3-D kv_cache, got {block_size}")
    strided = ((definitely(kv_cache.stride(2) != 1) and definitely(last > 1))
               or (definitely(kv_cache.stride(1) != last) and definitely(bs > 1)))
    if strided:
        raise arg_error(
            "kv_cache",
            f"each block must be contiguous (strides (*, {last}, 1)), got strides {tuple(kv_cache.stride())}",
        )
    return num_blocks, bs


def cache_bytes(kv_cache: Tensor) -> Tensor:
    """``kv_cache`` (3-D or 2-D, checked) -> uint8 ``[num_blocks, block_bytes]`` view (blocks
    are contiguous)."""
    return kv_cache.as_strided((kv_cache.shape[0], kv_cache.shape[1:].numel()), (kv_cache.stride(0), 1))


@contextlib.contextmanager
def interpreter_checks(enabled: bool = True):
    """Let ``tl.device_assert`` fire under the Triton interpreter (``TRITON_INTERPRET=1``).

    The interpreter ignores a kernel's ``debug=True``: it asserts only when its own
    builder's options say debug (seen in Triton 3.6 and 3.9). Our launchers wrap CPU-tensor
    launches in this so the interpreter traps exactly where the GPU does (an
    ``InterpreterError`` naming the assert's message), and CPU tests can cover the kernels'
    checks. A no-op on GPU launches and where this Triton has no such builder."""
    builder = None
    if enabled:
        try:
            from triton.runtime import interpreter as _interp

            builder = getattr(_interp, "interpreter_builder", None)
        except ImportError:  # pragma: no cover
            builder = None
    opts = getattr(builder, "options", None)
    if opts is None or not dataclasses.is_dataclass(opts) or not hasattr(opts, "debug") or opts.debug:
        yield
        return
    builder.options = dataclasses.replace(opts, debug=True)
    try:
        yield
    finally:
        builder.options = opts
