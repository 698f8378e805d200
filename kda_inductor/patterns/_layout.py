"""Where a view of a buffer puts its elements: views replayed on meta tensors.

Rewrites that read or write a byte layout (the indexer's blocked paged cache) must know, for
any chain of views the user wrote (``view`` / ``reshape`` of a contiguous tensor, ``view(dtype)``,
``slice``, ``select``, ``unsqueeze`` / ``squeeze``, ``as_strided``, ``permute`` / ``transpose``,
``expand``), which storage element each index of the final view addresses. Replaying each
op on a meta tensor laid out as its input gives the final view's sizes, strides and storage
offset exactly as torch computes them; :func:`byte_address` turns indices into a byte address.

Used by ``indexer_k_gather`` and ``indexer_k_write`` (directly and through :mod:`._cache_writes` /
:mod:`._index_algebra`: the byte layouts of the paged cache), and for the sizes a match reads
static (:func:`specialize`, :func:`static_size`, ...) by ``gated_norm_merge`` and ``gated_norm_quant``
(through :mod:`._gated_norm`).
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from kda_inductor.patterns.base import VIEWS, aten, is_op, val

_REPLAYED = (*VIEWS, aten.slice, aten.select, aten.unsqueeze, aten.squeeze, aten.as_strided, aten.permute,
             aten.transpose, aten.t, aten.expand, aten.alias)


def is_view_op(n: Any) -> bool:
    """``n`` is one of the view ops :func:`_replay_view` replays."""
    return is_op(n, *_REPLAYED)


def _size_value(x: Any, shift: int = 0, fixed: Any = ()) -> int | None:
    """``x`` (an int, a SymInt, or a node holding one) as an int: each symbol of a symbolic
    size takes its example value plus ``shift`` (the symbols in ``fixed``: their example value);
    None when there is none (no hint, no int)."""
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
        return int(expr.xreplace({s: int(values[s]) + (0 if s in fixed else shift) for s in expr.free_symbols}))
    except Exception:  # noqa: BLE001 - no example value (an unbacked size)
        return None


def concrete_args(args: Any, shift: int = 0, fixed: Any = ()) -> Any:
    """``args`` with every symbolic size (a SymInt, or a node holding one) as :func:`_size_value`
    gives it; None when a leaf is neither that, an int, None nor a dtype."""
    if isinstance(args, (list, tuple)):
        out = [concrete_args(x, shift, fixed) for x in args]
        return None if any(o is None and x is not None for o, x in zip(out, args)) else type(args)(out)
    if args is None or isinstance(args, torch.dtype) or (isinstance(args, int) and not isinstance(args, bool)):
        return args
    return _size_value(args, shift, fixed)


def meta_like(t: torch.Tensor, shift: int = 0, fixed: Any = ()) -> torch.Tensor:
    """A meta tensor with ``t``'s dtype, sizes, strides and storage offset, symbolic sizes
    replaced by their example values (plus ``shift`` but for ``fixed``: see
    :func:`symbolic_layout_from`)."""
    parts = concrete_args([list(t.shape), list(t.stride()), t.storage_offset()], shift, fixed)
    if parts is None:
        raise ValueError("a size without an example value")
    shape, stride, offset = parts
    return torch.empty_strided(shape, stride, dtype=t.dtype, device="meta").as_strided(shape, stride, offset)


# --------------------------------------------------------------------------- static sizes


def _expr(x: Any) -> Any:
    """The sympy expression of a SymInt (a node holding one: its value's), else None."""
    x = val(x) if isinstance(x, fx.Node) else x
    if not isinstance(x, torch.SymInt):
        return None
    env = x.node.shape_env
    return env.replace(x.node.expr) if hasattr(env, "replace") else x.node.expr  # guarded sizes: constants


def _plain_sizes(*sizes: Any) -> dict:
    """``{symbol: SymInt}`` of the ``sizes`` that are one backed symbol each (an input's dim,
    with an example value): the sizes a rewrite may specialize (:func:`specialize`). Static
    sizes and sizes computed from several symbols give none."""
    out = {}
    for x in sizes:
        e = _expr(x)
        x = val(x) if isinstance(x, fx.Node) else x
        if isinstance(e, sympy.Symbol) and _size_value(x) is not None:
            out.setdefault(e, x)
    return out


def input_sizes(graph: fx.Graph, symbols: Any) -> dict:
    """``{symbol: SymInt}`` for each of ``symbols`` that is one of the graph inputs' sizes (a
    SymInt input, or a size of a tensor input) with an example value: the symbols a rewrite can
    specialize (every backed size symbol is an input's). Others are left out."""
    wanted, out = set(symbols), {}
    for n in graph.nodes:
        if n.op != "placeholder" or len(out) == len(wanted):
            break  # placeholders come first
        v = val(n)
        sizes = [v] if isinstance(v, torch.SymInt) else list(v.shape) if isinstance(v, torch.Tensor) else []
        out.update({s: x for s, x in _plain_sizes(*sizes).items() if s in wanted})
    return out


def free_symbols(*sizes: Any) -> set:
    """The size symbols of ``sizes`` (ints, SymInts or nodes holding them)."""
    return set().union(*[e.free_symbols for e in map(_expr, sizes) if e is not None])


def same_count(a: Any, b: Any) -> bool:
    """Two counts that eager requires equal (an ``index_put_``'s values and index rows) may be
    read as one: proven equal, or both symbolic with equal example values (Dynamo keeps some
    such counts as separate symbols; the op's validator compares them at every call)."""
    if isinstance(a, (bool, torch.SymBool)) or isinstance(b, (bool, torch.SymBool)):
        return False
    if statically_known_true(a == b):
        return True
    return (isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt) and _size_value(a) is not None
            and _size_value(a) == _size_value(b))


def static_size(x: Any, fixed: Any) -> Any:
    """``x`` (an int, a SymInt or a node holding one) as an int where every symbol of it is in
    ``fixed`` (its example value: the match specializes those symbols), else as it is (a
    SymInt, or a node's value)."""
    x = val(x) if isinstance(x, fx.Node) else x
    e = _expr(x)
    if e is None or not e.free_symbols <= set(fixed):
        return x
    got = _size_value(x)
    return x if got is None else got


def static_equal(a: Any, b: Any, fixed: Any) -> bool:
    """Sizes ``a`` and ``b`` are equal once ``fixed``'s symbols take their example values (the
    match specializes them; the other symbols stay free): e.g. ``x.numel()`` and ``k.numel()``
    of ``x = k.view(-1, D // 128, 128)`` with ``D`` specialized."""
    ea, eb = (_expr(x) if _expr(x) is not None else sympy.sympify(x) for x in (a, b))
    values = {s: _size_value(fixed[s]) for s in (ea.free_symbols | eb.free_symbols) & set(fixed)}
    if None in values.values():
        return False
    return sympy.expand(ea.xreplace(values) - eb.xreplace(values)) == 0


def marked_dynamic(fixed: dict) -> str | None:
    """The first of ``fixed``'s sizes that the user marked dynamic (``torch._dynamo.mark_dynamic``
    on that dim, or ``Dim.DYNAMIC``), by its source (``L['kv_cache'].size()[1]``), else None:
    specializing it would fail the compile (Dynamo's ``ConstraintViolationError``), so a
    rewrite that needs it static does not match it. ``dynamic=True``, automatic dynamic and
    ``maybe_mark_dynamic`` allow the specialization. Read from Dynamo's tracing context
    (``tensor_to_context``, each input's symbolic context): None where this torch has none."""
    try:
        contexts = {_name(c.tensor_source): c for c in torch._guards.TracingContext.try_get().tensor_to_context.values()}
    except Exception:  # noqa: BLE001 - not under Dynamo, or another torch: nothing marked that we can see
        return None
    for symbol, size in fixed.items():
        for src in getattr(size.node.shape_env, "var_to_sources", {}).get(symbol, ()):
            ctx = contexts.get(_name(getattr(src, "base", None)))
            sizes = getattr(ctx, "constraint_sizes", None) or ()
            idx = getattr(src, "idx", None)
            if getattr(getattr(src, "prop", None), "name", "") == "SIZE" and isinstance(idx, int) and idx < len(sizes) \
                    and sizes[idx] is not None and not getattr(sizes[idx], "warn_only", True):
                return _name(src)
    return None


def _name(source: Any) -> str | None:
    """A Dynamo source's name (a property from torch 2.10, a method before)."""
    name = getattr(source, "name", None)
    return name() if callable(name) else name


def specialize(fixed: dict) -> None:
    """Make each of ``fixed``'s sizes (``{symbol: SymInt}``, :func:`_plain_sizes`) static at its
    example value with a guard, as Inductor does where a kernel needs a size (``guard_int``:
    torch 2.9-2.14): the graph compiled with a rewrite that read them so is used only for those
    values; another value recompiles (and is specialized again). Called by a rewrite's
    ``replace``, never while matching: code left to Inductor keeps every size symbolic."""
    from torch.fx.experimental.symbolic_shapes import guard_int

    for size in fixed.values():
        guard_int(size)


def same_addressing(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Two layouts address their elements alike: one dtype, rank, strides and storage offset."""
    return (a is not None and b is not None and a.dtype == b.dtype and a.dim() == b.dim()
            and tuple(a.stride()) == tuple(b.stride()) and a.storage_offset() == b.storage_offset())


def _replay_view(n: fx.Node, layout: torch.Tensor, shift: int = 0, fixed: Any = ()) -> torch.Tensor | None:
    """``n``'s layout over the same storage, given its input's ``layout``; None when ``n`` is
    no view op or is not a view of its input (a reshape that copies). Symbolic sizes among its
    arguments take their example values plus ``shift`` (``fixed``'s: none), as in ``layout``."""
    args = concrete_args(n.args[1:], shift, fixed) if is_op(n, *_REPLAYED) and not n.kwargs else None
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


def _layout_from(n: Any, root: fx.Node, root_layout: torch.Tensor, memo: dict | None = None,
                shift: int = 0, fixed: Any = ()) -> torch.Tensor | None:
    """The layout of ``n``, a chain of views of ``root`` (laid out as ``root_layout``), else None."""
    if not isinstance(n, fx.Node):
        return None
    if n is root:
        return root_layout
    memo = {} if memo is None else memo
    if n not in memo:
        memo[n] = None
        if n.op == "call_function" and n.args:
            base = _layout_from(n.args[0], root, root_layout, memo, shift, fixed)
            memo[n] = None if base is None else _replay_view(n, base, shift, fixed)
    return memo[n]


def symbolic_layout_from(n: Any, root: fx.Node, fixed: Any = ()) -> torch.Tensor | None:
    """:func:`_layout_from` where sizes may be symbolic (a cache whose block count varies, a
    view sized by it): the views are replayed with the example sizes and again with every
    symbol but ``fixed``'s one larger; the layout counts only where both address alike (its
    strides and offset do not depend on the sizes left symbolic), else None. ``fixed``: the
    symbols the match specializes (:func:`specialize`; a cache's block size and row width).
    Raises ValueError for a root size without an example value."""
    lay = _layout_from(n, root, meta_like(val(root)))
    if lay is None:
        return None
    other = _layout_from(n, root, meta_like(val(root), 1, fixed), shift=1, fixed=fixed)
    return lay if same_addressing(lay, other) else None


SYMBOLIC_ROW = ("the cache's block size or row width is symbolic without an example value (an unbacked size): "
                "the op needs them static, and only a size with an example value can be specialized; "
                "torch._dynamo.mark_static(kv_cache, 1) and mark_static(kv_cache, 2) keep only the block count "
                "and token count dynamic")


def marked_dynamic_miss(source: str) -> str:
    """The miss of a match that needs ``source``'s size static where the user marked it dynamic."""
    return (f"{source} is marked dynamic (torch._dynamo.mark_dynamic) but the op needs it static (a block size, "
            "row width or head dim), and specializing a marked size fails the compile: mark only the token and "
            "block counts, or use torch._dynamo.maybe_mark_dynamic")


def row_sizes(cache: fx.Node) -> dict:
    """The sizes of a cache input's dims after its first (block size, row width) that a match
    specializes: ``{symbol: SymInt}`` of the input sizes they are made of (``input_sizes``; a
    row width may be read as ``head_dim + 4``: k's dim then)."""
    t = val(cache)
    return input_sizes(cache.graph, free_symbols(*t.shape[1:])) if isinstance(t, torch.Tensor) else {}


def symbolic_row(cache: fx.Node) -> bool:
    """A cache whose sizes after the first (block size, row width) are symbolic and not all of
    them can be specialized (a symbol with no example value, or none an input size gives)."""
    t = val(cache)
    return isinstance(t, torch.Tensor) and row_sizes(cache).keys() != free_symbols(*t.shape[1:])


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
