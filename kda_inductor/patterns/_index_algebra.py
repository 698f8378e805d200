"""Read integer index arithmetic in a post-grad graph as sympy expressions.

Rewrites that replace gathers must prove that the user's index tensors compute
a specific function of the output position (``t`` along dim 0, ``j`` along dim
1). Rather than matching one spelling node by node, :class:`IndexAlgebra`
interprets the index-producing nodes symbolically: ``arange``/``iota`` become
axis symbols, integer lookups into tensors become uninterpreted functions
(``tab_<node>(i, ...)``), ``searchsorted``/``bucketize`` with ``right=True``
become ``ss_<node>(x)`` (the count of entries ``<= x``), and ``+ - * // % >> &``
and dtype casts become sympy arithmetic. Two spellings match when their
normalized expressions are equal, so ``bucketize`` vs ``searchsorted``,
``view`` vs ``reshape``, int32 vs int64, ``x % b`` vs ``x - x // b * b`` and
``x >> 6`` vs ``x // 64`` all agree, while a different block size, group
size or layout does not.

Assumptions (documented for each rewrite that relies on them): index values are
in range and non-negative where ``//``/``%`` are applied, so casts between
integer dtypes and floor vs. truncating division do not change values, and a
boundaries tensor sliced as ``b[1:]`` has ``b[0] <= x`` (``cu_seq_lens[0] == 0``).

Used by ``indexer_k_gather`` and ``indexer_k_write`` (directly and through :mod:`._cache_writes`),
and by :mod:`.canonical` (every rewrite that reads canonical terms).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from kda_inductor.patterns._layout import static_size
from kda_inductor.patterns.base import VIEWS, aten, is_op, prims, val

_counter = itertools.count()


@dataclasses.dataclass(frozen=True)
class Table:
    """An integer tensor read by index (``cu_seq_lens``, ``block_table``...).

    ``offset`` is a leading ``[k:]`` slice on dim 0 (only used for boundaries).
    """

    node: fx.Node
    offset: int = 0


@dataclasses.dataclass(frozen=True)
class Sym:
    """An integer tensor as ``expr`` of its axes; ``dims[d]`` is the axis symbol of dim d."""

    expr: sympy.Expr
    dims: tuple[sympy.Symbol | None, ...]


def _normalize(e: sympy.Expr) -> sympy.Expr:
    """Canonical form: ``Mod`` spelled with ``floor``, everything expanded."""
    e = e.replace(sympy.Mod, lambda a, b: a - b * sympy.floor(a / b))
    return sympy.expand(e, deep=True)


def same(a: sympy.Expr, b: sympy.Expr) -> bool:
    return sympy.simplify(_normalize(a) - _normalize(b)) == 0


def _is_one(size: Any) -> bool:
    return isinstance(size, int) and size == 1


_INT_DTYPES = {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}
_CASTS = (prims.convert_element_type, aten._to_copy, aten.to)
_OTHER_OP = object()
"""What a ``_read_*`` step of :meth:`IndexAlgebra._interpret` answers for an op not its own."""


class IndexAlgebra:
    """Memoized symbolic interpretation of integer nodes; see the module doc."""

    def __init__(self) -> None:
        self._memo: dict[fx.Node, Any] = {}
        self.axis_len: dict[sympy.Symbol, Any] = {}
        """Axis symbol -> the length argument of its iota/arange (int or node)."""
        self.visited: set[fx.Node] = set()
        """Every node interpreted as arithmetic (not tables): the region to replace."""
        self._tables: dict[str, fx.Node] = {}
        self.symints: dict[sympy.Symbol, Any] = {}
        """Symbols standing for symbolic sizes used as clamp bounds -> their SymInt values."""
        self.static: set = set()
        """Size symbols the rewrite specializes (a cache's block size and row width): a symbolic
        size of only these reads as its example value (``_layout.static_size``)."""

    # ---------------------------------------------------------------- tables
    def table_fn(self, node: fx.Node) -> Any:
        """``tab_<node>(i, ...)``: the value of ``node`` at an index."""
        return self._fn("tab", node)

    def count_le_fn(self, node: fx.Node) -> Any:
        """``ss_<node>(x)``: how many entries of the 1-D ``node`` are ``<= x``."""
        return self._fn("ss", node)

    def _fn(self, kind: str, node: fx.Node) -> Any:
        name = f"{kind}_{node.name}"
        self._tables[name] = node
        return sympy.Function(name)

    def tables_read(self, e: sympy.Expr, kind: str, arity: int) -> set[fx.Node]:
        """Nodes read by ``kind`` ("tab"/"ss") functions of ``arity`` args in ``e``."""
        return {
            self._tables[f.func.__name__]
            for f in e.atoms(sympy.core.function.AppliedUndef)
            if f.func.__name__.startswith(kind + "_") and len(f.args) == arity
        }

    # ---------------------------------------------------------------- public
    def interpret(self, node: Any) -> Sym | Table | int | None:
        if isinstance(node, bool):
            return None
        if isinstance(node, int):
            return node
        if not isinstance(node, fx.Node):
            return None
        if isinstance(val(node), torch.SymInt):  # a size (not memoized: ``static`` may grow)
            got = static_size(node, self.static)
            return got if isinstance(got, int) else None
        if node not in self._memo:
            self._memo[node] = self._interpret(node)
            if isinstance(self._memo[node], Sym):
                self.visited.add(node)
        return self._memo[node]

    @staticmethod
    def bind(
        values: list[Sym], names: list[sympy.Symbol]
    ) -> tuple[list[sympy.Expr], list[sympy.Symbol]] | None:
        """Broadcast ``values`` together and rename their axes to ``names``.

        Returns the renamed expressions and the original axis symbol of each
        name, or ``None`` when the broadcast shape uses axes other than
        ``names`` (or a ``names`` axis is missing).
        """
        rank = len(names)
        if any(len(v.dims) > rank for v in values):
            return None
        axes: list[sympy.Symbol | None] = [None] * rank
        exprs = []
        for v in values:
            e = v.expr
            for pos, s in enumerate((None,) * (rank - len(v.dims)) + v.dims):
                if s is None:
                    continue
                if axes[pos] is None:
                    axes[pos] = s
                elif axes[pos] != s:
                    e = e.subs(s, axes[pos])
            exprs.append(e)
        if any(a is None for a in axes):
            return None
        mapping = dict(zip(axes, names))
        out = [e.xreplace(mapping) for e in exprs]
        stray = set().union(*(e.free_symbols for e in out)) - set(names)
        return None if stray else (out, axes)

    # -------------------------------------------------------------- internal
    def _interpret(self, n: fx.Node) -> Sym | Table | int | None:
        """One integer node's meaning: an axis, a cast or view of another node's, arithmetic
        or a lookup; any other integer node is a table (values unknown, read by index)."""
        v = val(n)
        if not isinstance(v, torch.Tensor) or v.dtype not in _INT_DTYPES:
            return None
        for read in (self._read_axis, self._read_view, self._read_arithmetic, self._read_lookup):
            got = read(n)
            if got is not _OTHER_OP:
                return got
        if n.op in ("placeholder", "call_function", "get_attr"):
            return Table(n)
        return None

    def _read_axis(self, n: fx.Node) -> Sym | None | object:
        """``iota`` / ``arange`` -> ``start + step * axis`` of a fresh axis symbol."""
        a, kw = n.args, n.kwargs
        if is_op(n, prims.iota):
            return self._axis(a[0], kw.get("start", 0), kw.get("step", 1))
        if not is_op(n, aten.arange):
            return _OTHER_OP
        if n.target is aten.arange.default:
            return self._axis(a[0], 0, 1)
        if n.target is aten.arange.start:
            return self._axis_range(a[0], a[1], 1)
        if n.target is aten.arange.start_step:
            return self._axis_range(a[0], a[1], a[2] if len(a) > 2 else kw.get("step", 1))
        return None

    def _read_view(self, n: fx.Node) -> Sym | Table | None | object:
        """Casts, copies and views: their source's values, its axes where they moved."""
        if is_op(n, *_CASTS):
            inner = self.interpret(n.args[0])
            return inner if isinstance(inner, (Sym, Table)) else None
        if is_op(n, aten.clone, aten.alias):
            return self.interpret(n.args[0])
        if is_op(n, aten.slice):
            return self._slice(n)
        if is_op(n, aten.unsqueeze):
            return self._unsqueeze(n)
        if is_op(n, aten.squeeze, *VIEWS, aten.expand):
            return self._reshape(n)
        return _OTHER_OP

    def _read_arithmetic(self, n: fx.Node) -> Sym | None | object:
        """``+ - * // % >> &``, negation and clamps -> sympy arithmetic."""
        if is_op(n, aten.add, aten.sub, aten.mul):
            return self._binary(n)
        if is_op(n, aten.neg):
            x = self.interpret(n.args[0])
            return Sym(-x.expr, x.dims) if isinstance(x, Sym) else None
        if is_op(n, aten.div) and n.kwargs.get("rounding_mode") == "floor" or is_op(n, aten.floor_divide):
            return self._binary(n, lambda x, y: sympy.floor(x / y))
        if is_op(n, aten.remainder):
            return self._binary(n, sympy.Mod)
        if is_op(n, aten.bitwise_right_shift, aten.__rshift__):
            return self._binary(n, lambda x, y: sympy.floor(x / 2**y), const_rhs=True)
        if is_op(n, aten.bitwise_and):
            return self._and_mask(n)
        if is_op(n, aten.clamp, aten.clamp_min, aten.clamp_max):
            return self._clamp(n)
        return _OTHER_OP

    def _read_lookup(self, n: fx.Node) -> Sym | None | object:
        """``searchsorted`` / ``bucketize`` -> counts of boundaries; ``x[i, ...]`` of a table ->
        its function of the indices."""
        a, kw = n.args, n.kwargs
        if is_op(n, aten.searchsorted):
            right = kw.get("right", False) or kw.get("side") == "right"
            return self._count_le(a[0], a[1], right)
        if is_op(n, aten.bucketize):
            right = kw.get("right", a[3] if len(a) > 3 else False)
            return self._count_le(a[1], a[0], right)
        if is_op(n, aten.index) and n.target is aten.index.Tensor:
            return self._lookup(n)
        return _OTHER_OP

    def _unsqueeze(self, n: fx.Node) -> Sym | None:
        x = self.interpret(n.args[0])
        if not isinstance(x, Sym):
            return None
        d = n.args[1] % (len(x.dims) + 1)
        return Sym(x.expr, x.dims[:d] + (None,) + x.dims[d:])

    def _axis(self, length: Any, start: Any, step: Any) -> Sym | None:
        if not (isinstance(start, int) and isinstance(step, int)):
            return None
        s = sympy.Symbol(f"axis{next(_counter)}", integer=True, nonnegative=True)
        self.axis_len[s] = length
        return Sym(start + step * s, (s,))

    def _axis_range(self, start: Any, end: Any, step: Any) -> Sym | None:
        if not (isinstance(start, int) and isinstance(end, int) and isinstance(step, int)):
            return None
        return self._axis((end - start + step - 1) // step, start, step)

    def _operand(self, x: Any) -> Sym | None:
        y = self.interpret(x)
        if isinstance(y, int):
            return Sym(sympy.Integer(y), ())
        return y if isinstance(y, Sym) else None

    def _binary(self, n: fx.Node, fn: Any = None, const_rhs: bool = False) -> Sym | None:
        x, y = self._operand(n.args[0]), self._operand(n.args[1])
        if x is None or y is None or (const_rhs and not y.expr.is_Integer):
            return None
        if fn is None:
            alpha = n.kwargs.get("alpha", 1)
            fn = {
                "add": lambda p, q: p + alpha * q,
                "sub": lambda p, q: p - alpha * q,
                "mul": lambda p, q: p * q,
            }[n.target.overloadpacket.__name__]
        merged, ye = self._broadcast(x, y)
        return Sym(fn(merged.expr, ye), merged.dims)

    def _and_mask(self, n: fx.Node) -> Sym | None:
        x, m = self._operand(n.args[0]), self._operand(n.args[1])
        if x is None or m is None or not m.expr.is_Integer:
            return None
        mask = int(m.expr)
        if mask < 0 or mask & (mask + 1):
            return None
        return Sym(sympy.Mod(x.expr, mask + 1), x.dims)

    def _reshape(self, n: fx.Node) -> Sym | None:
        x = self.interpret(n.args[0])
        if not isinstance(x, Sym):
            return None
        in_shape, out_shape = tuple(val(n.args[0]).shape), tuple(val(n).shape)
        if is_op(n, aten.expand):
            lead = len(out_shape) - len(in_shape)
            if lead < 0:
                return None
            dims = (None,) * lead + x.dims
            # expanding a size-1 dim creates a constant axis: fine, no symbol.
            return Sym(x.expr, dims)
        kept_in = [(s, d) for s, d in zip(in_shape, x.dims) if not _is_one(s)]
        kept_out = [i for i, s in enumerate(out_shape) if not _is_one(s)]
        if len(kept_in) != len(kept_out):
            return None
        dims: list[sympy.Symbol | None] = [None] * len(out_shape)
        for (size, d), pos in zip(kept_in, kept_out):
            if not statically_known_true(size == out_shape[pos]):
                return None
            dims[pos] = d
        return Sym(x.expr, tuple(dims))

    def _slice(self, n: fx.Node) -> Sym | Table | None:
        x = self.interpret(n.args[0])
        dim = n.args[1] if len(n.args) > 1 else 0
        start = n.args[2] if len(n.args) > 2 else 0
        end = n.args[3] if len(n.args) > 3 else None
        step = n.args[4] if len(n.args) > 4 else 1
        if step != 1 or not isinstance(start, int):
            return None
        if isinstance(x, Table):
            if start == 0:
                return x  # a prefix of a table reads the same values
            base = val(x.node)
            if dim == 0 and base.dim() == 1 and x.offset + start <= 1:
                return Table(x.node, x.offset + start)
            return None
        size = val(n.args[0]).shape[dim]
        if isinstance(x, Sym) and start == 0 and (end is None or statically_known_true(end >= size)):
            return x
        return None

    def _clamp(self, n: fx.Node) -> Sym | None:
        """``clamp(x, lo, hi)`` -> ``clamp(x, lo, hi)`` (an uninterpreted function: a rewrite
        that knows ``x`` is in range drops it, see :func:`drop_clamps`); a missing bound is
        ``None`` (``-oo`` / ``oo``)."""
        x = self._operand(n.args[0])
        if x is None:
            return None
        if is_op(n, aten.clamp_min):
            lo, hi = n.args[1], None
        elif is_op(n, aten.clamp_max):
            lo, hi = None, n.args[1]
        else:
            lo = n.args[1] if len(n.args) > 1 else n.kwargs.get("min")
            hi = n.args[2] if len(n.args) > 2 else n.kwargs.get("max")
        bounds = []
        for b in (lo, hi):
            if b is None:
                bounds.append(sympy.nan)
            elif isinstance(b, int) and not isinstance(b, bool):
                bounds.append(sympy.Integer(b))
            elif isinstance(b, fx.Node) and isinstance(val(b), torch.SymInt):
                bounds.append(sympy.Symbol(f"symint_{b.name}", integer=True))
                self.symints[bounds[-1]] = val(b)
            else:
                return None
        return Sym(_CLAMP(x.expr, *bounds), x.dims)

    def _count_le(self, boundaries: Any, values: Any, right: bool) -> Sym | None:
        """``searchsorted(b, x, right=True)`` counts the entries ``<= x``; with
        ``right=False`` it counts those ``< x``, which for integers is ``<= x - 1``
        (so ``searchsorted(cu, t + 1) - 1`` is the same request index)."""
        b = self.interpret(boundaries)
        x = self._operand(values)
        if not isinstance(b, Table) or x is None or val(b.node).dim() != 1:
            return None
        e = x.expr if right else x.expr - 1
        return Sym(self.count_le_fn(b.node)(sympy.expand(e)) - b.offset, x.dims)

    def _lookup(self, n: fx.Node) -> Sym | None:
        table = self.interpret(n.args[0])
        indices = n.args[1]
        if not isinstance(table, Table) or any(i is None for i in indices):
            return None
        if len(indices) != val(table.node).dim():
            return None
        ops = [self._operand(i) for i in indices]
        if any(o is None for o in ops):
            return None
        # broadcast the index tensors together
        merged = ops[0]
        exprs = [merged.expr]
        for o in ops[1:]:
            merged, e = self._broadcast(merged, o)
            exprs.append(e)
        if table.offset:
            exprs[0] = exprs[0] + table.offset
        return Sym(self.table_fn(table.node)(*exprs), merged.dims)

    @staticmethod
    def _broadcast(x: Sym, y: Sym) -> tuple[Sym, sympy.Expr]:
        """Broadcast ``x`` and ``y``; returns merged dims (with x's expr) and y's expr."""
        rank = max(len(x.dims), len(y.dims))
        xd = (None,) * (rank - len(x.dims)) + x.dims
        yd = (None,) * (rank - len(y.dims)) + y.dims
        ye = y.expr
        dims = []
        for p, q in zip(xd, yd):
            if p is not None and q is not None and p != q:
                ye = ye.subs(q, p)
            dims.append(p if p is not None else q)
        return Sym(x.expr, tuple(dims)), ye


_CLAMP = sympy.Function("clamp")
"""``clamp(x, lo, hi)`` of index arithmetic; ``nan`` for a missing bound."""


def drop_clamps(e: sympy.Expr, in_range) -> sympy.Expr:
    """``e`` with every ``clamp(x, lo, hi)`` for which ``in_range(x, lo, hi)`` holds replaced
    by ``x`` (the clamp cannot change an in-range value)."""
    return e.replace(_CLAMP, lambda x, lo, hi: x if in_range(x, lo, hi) else _CLAMP(x, lo, hi))


def known(pred: Any) -> bool:
    """``pred`` is true for every value of its symbols: torch's ``statically_known_true`` (no
    guard added), for a ``pred`` of any type: torch's takes only a bool or a SymBool (and
    raises on anything else: an int, a sympy relational), where this answers False."""
    return isinstance(pred, (bool, torch.SymBool)) and statically_known_true(pred)
