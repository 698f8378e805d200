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


def meta_like(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with ``t``'s dtype, sizes, strides and storage offset (symbolic sizes
    replaced by their example values: only strides and offsets matter for addresses)."""
    def concrete(x):
        if isinstance(x, int):
            return x
        hint = getattr(getattr(x, "node", None), "hint", None)
        if hint is None:
            raise ValueError("a size without an example value")
        return int(hint)

    shape = tuple(concrete(x) for x in t.shape)
    stride = tuple(concrete(x) for x in t.stride())
    return torch.empty_strided(shape, stride, dtype=t.dtype, device="meta").as_strided(
        shape, stride, concrete(t.storage_offset()))


def _ints(args) -> bool:
    """Every leaf of ``args`` is a plain int or a dtype (no symbolic sizes, no nodes)."""
    for x in args:
        if isinstance(x, (list, tuple)):
            if not _ints(x):
                return False
        elif not isinstance(x, (int, torch.dtype)):
            return False
    return True


def replay_view(n: fx.Node, layout: torch.Tensor) -> torch.Tensor | None:
    """``n``'s layout over the same storage, given its input's ``layout``; None when ``n`` is
    no view op, has symbolic arguments, or is not a view of its input (a reshape that copies)."""
    if not is_op(n, *_REPLAYED) or not _ints(n.args[1:]) or n.kwargs:
        return None
    try:
        if n.target is aten.view.dtype:
            return layout.view(n.args[1])
        if is_op(n, *VIEWS):
            r = layout.reshape(list(n.args[1]))
            return r if r._is_view() or r.data_ptr() == layout.data_ptr() else None
        return n.target(layout, *n.args[1:])
    except Exception:  # noqa: BLE001 - an op meta tensors reject is no view of this layout
        return None


def layout_from(n: Any, root: fx.Node, root_layout: torch.Tensor, memo: dict | None = None) -> torch.Tensor | None:
    """The layout of ``n``, a chain of views of ``root`` (laid out as ``root_layout``), else None."""
    if not isinstance(n, fx.Node):
        return None
    if n is root:
        return root_layout
    memo = {} if memo is None else memo
    if n not in memo:
        memo[n] = None
        if n.op == "call_function" and n.args:
            base = layout_from(n.args[0], root, root_layout, memo)
            memo[n] = None if base is None else replay_view(n, base)
    return memo[n]


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
