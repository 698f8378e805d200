"""Where a view of a buffer puts its elements: views replayed on meta tensors.

Rewrites that read or write a byte layout (the indexer's blocked paged cache) must know, for
any chain of views the user wrote (``view`` / ``reshape`` of a contiguous tensor, ``view(dtype)``,
``slice``, ``select``, ``unsqueeze`` / ``squeeze``, ``as_strided``, ``permute`` / ``transpose``,
``expand``), which storage element each index of the final view addresses. Replaying each
op on a meta tensor laid out as its input gives the final view's sizes, strides and storage
offset exactly as torch computes them; :func:`address` turns indices into a byte address.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.fx as fx

from kda_inductor.patterns.base import VIEWS, aten, is_op, val

_REPLAYED = (*VIEWS, aten.slice, aten.select, aten.unsqueeze, aten.squeeze, aten.as_strided, aten.permute,
             aten.transpose, aten.t, aten.expand, aten.alias)


def is_view_op(n: Any) -> bool:
    """``n`` is one of the view ops :func:`replay_view` replays."""
    return is_op(n, *_REPLAYED)


def size_value(x: Any, shift: int = 0) -> int | None:
    """``x`` (an int, a SymInt, or a node holding one) as an int: each symbol of a symbolic
    size takes its example value plus ``shift``; None when there is none (no hint, no int)."""
    if isinstance(x, fx.Node):
        x = val(x)
    if isinstance(x, bool) or not isinstance(x, (int, torch.SymInt)):
        return None
    if isinstance(x, int):
        return x
    node = x.node
    try:
        env = node.shape_env  # backed_var_to_val: torch 2.13+ (var_to_val warns there)
        values = env.backed_var_to_val if hasattr(env, "backed_var_to_val") else env.var_to_val
        expr = env.replace(node.expr) if hasattr(env, "replace") else node.expr  # sizes guarded to constants
        return int(expr.xreplace({s: int(values[s]) + shift for s in expr.free_symbols}))
    except Exception:  # noqa: BLE001 - no example value (an unbacked size)
        return None


def concrete_args(args: Any, shift: int = 0) -> Any:
    """``args`` with every symbolic size (a SymInt, or a node holding one) as :func:`size_value`
    gives it; None when a leaf is neither that, an int, None nor a dtype."""
    if isinstance(args, (list, tuple)):
        out = [concrete_args(x, shift) for x in args]
        return None if any(o is None and x is not None for o, x in zip(out, args)) else type(args)(out)
    if args is None or isinstance(args, torch.dtype) or (isinstance(args, int) and not isinstance(args, bool)):
        return args
    return size_value(args, shift)


def meta_like(t: torch.Tensor, shift: int = 0) -> torch.Tensor:
    """A meta tensor with ``t``'s dtype, sizes, strides and storage offset, symbolic sizes
    replaced by their example values (plus ``shift``: see :func:`symbolic_layout_from`)."""
    parts = concrete_args([list(t.shape), list(t.stride()), t.storage_offset()], shift)
    if parts is None:
        raise ValueError("a size without an example value")
    shape, stride, offset = parts
    return torch.empty_strided(shape, stride, dtype=t.dtype, device="meta").as_strided(shape, stride, offset)


def same_addressing(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Two layouts address their elements alike: one dtype, rank, strides and storage offset."""
    return (a is not None and b is not None and a.dtype == b.dtype and a.dim() == b.dim()
            and tuple(a.stride()) == tuple(b.stride()) and a.storage_offset() == b.storage_offset())


def replay_view(n: fx.Node, layout: torch.Tensor, shift: int = 0) -> torch.Tensor | None:
    """``n``'s layout over the same storage, given its input's ``layout``; None when ``n`` is
    no view op or is not a view of its input (a reshape that copies). Symbolic sizes among its
    arguments take their example values plus ``shift``, as in ``layout``."""
    args = concrete_args(n.args[1:], shift) if is_op(n, *_REPLAYED) and not n.kwargs else None
    if args is None:
        return None
    try:
        if n.target is aten.view.dtype:
            return layout.view(args[0])
        if is_op(n, *VIEWS):
            r = layout.reshape(list(args[0]))
            return r if r._is_view() or r.data_ptr() == layout.data_ptr() else None
        return n.target(layout, *args)
    except Exception:  # noqa: BLE001 - an op meta tensors reject is no view of this layout
        return None


def layout_from(n: Any, root: fx.Node, root_layout: torch.Tensor, memo: dict | None = None,
                shift: int = 0) -> torch.Tensor | None:
    """The layout of ``n``, a chain of views of ``root`` (laid out as ``root_layout``), else None."""
    if not isinstance(n, fx.Node):
        return None
    if n is root:
        return root_layout
    memo = {} if memo is None else memo
    if n not in memo:
        memo[n] = None
        if n.op == "call_function" and n.args:
            base = layout_from(n.args[0], root, root_layout, memo, shift)
            memo[n] = None if base is None else replay_view(n, base, shift)
    return memo[n]


def symbolic_layout_from(n: Any, root: fx.Node) -> torch.Tensor | None:
    """:func:`layout_from` where sizes may be symbolic (a cache whose block count varies, a
    view sized by it): the views are replayed with the example sizes and again with every
    symbol one larger; the layout counts only where both address alike (its strides and
    offset do not depend on the symbolic sizes), else None. Raises ValueError for a root
    size without an example value."""
    lay = layout_from(n, root, meta_like(val(root)))
    if lay is None:
        return None
    other = layout_from(n, root, meta_like(val(root), 1), shift=1)
    return lay if same_addressing(lay, other) else None


SYMBOLIC_ROW = ("the cache's block size or row width is symbolic (dynamic=True makes every size symbolic): "
                "the op needs them static; torch._dynamo.mark_static(kv_cache, 1) and mark_static(kv_cache, 2) "
                "(and mark_static(k, 1) for the write) keep only the block count and token count dynamic")


def symbolic_row(t: Any) -> bool:
    """A cache whose sizes after the first (block size, row width) are symbolic."""
    return isinstance(t, torch.Tensor) and any(not isinstance(x, int) for x in t.shape[1:])


def view_root(n: Any, accept) -> fx.Node | None:
    """The first node up ``n``'s chain of view ops that ``accept`` accepts (``n`` itself too)."""
    seen = 0
    while isinstance(n, fx.Node) and seen < 64:
        if accept(n):
            return n
        if not is_op(n, *_REPLAYED):
            return None
        n, seen = n.args[0], seen + 1
    return None


def byte_address(layout: torch.Tensor, exprs: list, j: sympy.Symbol, trailing: bool) -> sympy.Expr:
    """The byte address (in the root's storage) of byte ``j`` of row ``t`` of ``view[exprs]``,
    ``view`` laid out as ``layout``: the index expressions ``exprs`` (of ``t`` and, without a
    trailing dim, of the element column ``j``) address its first dims; with ``trailing`` the
    next dim is read whole (element ``j`` of it). Elements wider than a byte count bytes:
    byte ``j`` is byte ``j % size`` of element ``j // size``."""
    elem = sum(e * st for e, st in zip(exprs, layout.stride())) + layout.storage_offset()
    if trailing:
        elem = elem + j * layout.stride(len(exprs))
    size = layout.element_size()
    if size == 1:
        return elem
    return size * elem.subs(j, sympy.floor(j / size)) + sympy.Mod(j, size)
