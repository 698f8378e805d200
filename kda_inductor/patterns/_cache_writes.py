"""The functional writes into a paged byte cache, read: what the ``indexer_k_write`` rewrite
matches its stores with. A graph-input cache written by ``index_put`` (possibly inside
``slice_scatter``, as ``index_put_``, ``index_copy_`` and ``view[blk, off] = ...`` into views of
the cache become) and copied back with ``copy_`` is a chain of versions (:class:`CacheChain`),
each seen through a meta tensor laid out as the cache's bytes; each write (:func:`read_write`)
stores rows of a source tensor at byte addresses read symbolically (:class:`_SlotAlgebra`: per-token
sequences such as ``slot_mapping``, and ``_index_algebra``'s arithmetic), masked or not
(``torch.where(slot_mapping >= 0, new, old)``, or its race-free delta added with
``accumulate=True``). Symbolic sizes take their example values plus ``shift``
(:func:`sizes_do_not_matter`: a chain that addresses alike with every free size one larger does
not depend on it), but for the sizes the kernel needs static (:func:`fixed_sizes`).
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, NamedTuple

import sympy
import torch
import torch.fx as fx

from kda_inductor.patterns._index_algebra import IndexAlgebra, Sym, Table, known, same
from kda_inductor.patterns._layout import (
    concrete_args,
    free_symbols,
    input_sizes,
    is_view_op,
    meta_like,
    row_sizes,
    same_addressing,
    same_count,
    static_size,
)
from kda_inductor.patterns.base import SHAPE_VIEWS, VIEWS, aten, is_op, prims, val

TOKEN, BYTE = sympy.symbols("t j", integer=True, nonnegative=True)
"""The axes of a write: byte ``j`` of token ``t``'s stored row."""
_VALUE_VIEWS = SHAPE_VIEWS
_CASTS = (prims.convert_element_type, aten._to_copy)


@dataclasses.dataclass(frozen=True)
class _CacheWrite:
    node: fx.Node  # aten.index_put
    layout: torch.Tensor  # meta tensor: the base's view of the cache bytes
    version: int  # writes before this one
    accumulate: bool = False  # index_put(..., accumulate=True): must add where(valid, new - old, 0)


@dataclasses.dataclass
class CacheState:
    """A tensor of the cache's write chain: the cache after ``writes``, seen through
    ``layout`` (a meta tensor viewing a byte buffer laid out as the cache)."""

    writes: tuple[_CacheWrite, ...]
    layout: torch.Tensor


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
            and tuple(a.stride()) == tuple(b.stride()) and a.storage_offset() == b.storage_offset())


class CacheChain:
    """Reads the functional write chain of one graph-input cache. Symbolic sizes (a block
    count that varies) take their example values plus ``shift`` (see ``sizes_do_not_matter``),
    but for ``fixed``'s (the block size and row width, specialized on replacing): their example
    values."""

    def __init__(self, cache: fx.Node, shift: int = 0, fixed: dict | None = None):  # ValueError: no example value
        self.cache = cache
        self.shift = shift
        self.fixed = row_sizes(cache) if fixed is None else fixed  # IndexerKWrite._written adds the rows' widths
        self.root = meta_like(val(cache), shift, self.fixed)
        self.memo: dict[fx.Node, CacheState | None] = {}

    def state(self, n: Any) -> CacheState | None:
        if not isinstance(n, fx.Node):
            return None
        if n not in self.memo:
            self.memo[n] = None  # cycles cannot happen; this also bounds the recursion
            try:
                self.memo[n] = self._state(n)
            except Exception:  # noqa: BLE001 - a view meta tensors reject: not ours
                self.memo[n] = None
        return self.memo[n]

    def _state(self, n: fx.Node) -> CacheState | None:
        if n is self.cache:
            return CacheState((), self.root)
        if not n.args:
            return None
        a = (n.args[0], *fx.node.map_aggregate(n.args[1:], self._leaf))
        if is_op(n, *VIEWS) and n.target is not aten.view.dtype:
            s = self.state(a[0])
            if s is None:
                return None
            r = s.layout.reshape(list(a[1]))
            return CacheState(s.writes, r) if r._is_view() else None
        if n.target is aten.view.dtype:
            s = self.state(a[0])
            return None if s is None else CacheState(s.writes, s.layout.view(a[1]))
        if is_op(n, aten.slice):
            s = self.state(a[0])
            if s is None:
                return None
            return CacheState(s.writes, aten.slice.Tensor(s.layout, *a[1:]))
        if n.target is aten.index_put.default:  # accumulate: checked as a masked delta (read_write)
            s = self.state(a[0])
            if s is None:
                return None
            return CacheState(s.writes + (_CacheWrite(n, s.layout, len(s.writes), bool(len(a) > 3 and a[3])),), s.layout)
        if n.target is aten.slice_scatter.default:
            base, src = self.state(a[0]), self.state(a[1])
            if base is None or src is None or src.writes[: len(base.writes)] != base.writes:
                return None
            if not same_layout(src.layout, aten.slice.Tensor(base.layout, *a[2:])):
                return None
            return CacheState(src.writes, base.layout)
        return None

    def _leaf(self, x: Any) -> Any:
        """A tensor node as it is; a size (int or symbolic) as an int; anything else: not ours."""
        if isinstance(x, (bool, torch.dtype)) or isinstance(x, fx.Node) and isinstance(val(x), torch.Tensor):
            return x
        got = concrete_args(x, self.shift, self.fixed)
        if got is None and x is not None:
            raise ValueError(f"not a size: {x!r}")
        return got


# --------------------------------------------------------------------------- slot algebra


class _SlotAlgebra(IndexAlgebra):
    """``IndexAlgebra`` where 1-D integer tensors of ``num_tokens`` entries are per-token
    sequences ``seq_<node>(tok)`` along one token axis, and ``clamp(min=0)`` of a sequence
    is the sequence (remembered in ``clamped``: only sound where the writes are masked)."""

    def __init__(self, num_tokens: Any):
        super().__init__()
        self.num_tokens = num_tokens
        self.tok = sympy.Symbol("tok", integer=True, nonnegative=True)
        self.axis_len[self.tok] = num_tokens
        self.sequences: set[fx.Node] = set()
        self.clamped = False

    def seq_fn(self, node: fx.Node):
        return self._fn("seq", node)

    def _interpret(self, n: fx.Node):
        v = val(n)
        if is_op(n, aten.clamp_min, aten.clamp) and isinstance(v, torch.Tensor):
            lo = n.args[1] if len(n.args) > 1 else n.kwargs.get("min")
            hi = n.args[2] if len(n.args) > 2 else n.kwargs.get("max")
            x = self.interpret(n.args[0])
            if lo == 0 and hi is None and isinstance(x, Sym) and x.expr.func.__name__.startswith("seq_"):
                self.clamped = True
                return x
            return None
        out = super()._interpret(n)
        if (
            isinstance(out, Table) and out.offset == 0 and isinstance(v, torch.Tensor)
            and v.dim() == 1 and same_count(v.shape[0], self.num_tokens)
        ):
            self.sequences.add(n)
            return Sym(self.seq_fn(n)(self.tok), (self.tok,))
        return out


# --------------------------------------------------------------------------- quant region


def through_views(n: Any, views=_VALUE_VIEWS) -> tuple[Any, list[fx.Node]]:
    """Follow value-preserving views up to their source; returns (source, views passed)."""
    seen = []
    while is_op(n, *views) or (isinstance(n, fx.Node) and n.target is aten.view.dtype):
        seen.append(n)
        n = n.args[0]
    return n, seen


def sizes_do_not_matter(copy: fx.Node, final: CacheState, fixed: dict) -> bool:
    """The chain addresses the cache alike with every symbolic size but ``fixed``'s one larger
    (a block count that varies moves no byte the writes address): ``final``'s writes and result
    read again."""
    try:
        chain = CacheChain(copy.args[0], shift=1, fixed=fixed)
    except ValueError:  # a size without an example value
        return False
    other = chain.state(copy.args[1])
    return (other is not None and same_layout(other.layout, chain.root) and len(other.writes) == len(final.writes)
            and all(same_addressing(w.layout, o.layout) for w, o in zip(final.writes, other.writes)))


def fixed_sizes(copy: fx.Node, chain: CacheChain, final: CacheState) -> dict:
    """The sizes a match reads as their example values, specialized when it is replaced
    (``_layout.specialize``): the cache's block size and row width, and the widths of the rows
    the writes store (k's head dim, its groups). Token and block counts stay symbolic."""
    widths = []
    for w in final.writes:
        indices = list(w.node.args[1])
        got = None if any(i is None for i in indices) else _unwrapped(w, indices, w.node.args[2])
        if isinstance(got, tuple) and isinstance(val(got[1]), torch.Tensor):
            widths += list(val(got[1]).shape[1:])
    return {**chain.fixed, **input_sizes(copy.graph, free_symbols(*widths))}


def sizes_only(n: fx.Node, versions: dict, depth: int = 0) -> bool:
    """``n`` reads only sizes of a cache version, for the chain's own views (``dynamic=True``
    graphs size them so: ``sym_size(view(slice(cache_version)), 1)``): no byte of it."""
    if is_op(n, aten.sym_size, aten.sym_stride, aten.sym_numel):
        return all(u in versions or isinstance(val(u), torch.SymInt) for u in n.users)
    return (is_view_op(n) and depth < 8 and bool(n.users)
            and all(u in versions or sizes_only(u, versions, depth + 1) for u in n.users))


def _masked_delta(values: Any) -> tuple[fx.Node, fx.Node, fx.Node, set[fx.Node]] | None:
    """``where(mask, new - old, 0)`` -> (mask, new, old, its nodes), else None."""
    if not (isinstance(values, fx.Node) and values.target is aten.where.self):
        return None
    mask, diff, zero = values.args
    if not (is_op(diff, aten.sub) and diff.target is aten.sub.Tensor and not diff.kwargs
            and isinstance(zero, fx.Node) and zero.target is aten.scalar_tensor.default and zero.args[0] == 0):
        return None
    return mask, diff.args[0], diff.args[1], {values, diff, zero}


def _flat_pair(indices: list, values: Any) -> tuple[fx.Node, fx.Node] | None:
    """``flat.index_copy_(0, idx.reshape(-1), v.reshape(-1))`` with ``idx`` and ``v`` of one
    2-D shape -> ``(idx, v)``; else None."""
    if len(indices) == 1 and val(indices[0]).dim() == 1 and is_op(indices[0], *VIEWS) and is_op(values, *VIEWS):
        xi, xv = indices[0].args[0], values.args[0]
        if val(xi).dim() == 2 and val(xv).dim() == 2 and all(map(known, map(operator.eq, val(xi).shape, val(xv).shape))):
            return xi, xv
    return None


def _leading_ones(v: Any) -> bool:
    """``v`` is ``[1, B]``: a one-token row that setitem reshapes to ``[B]`` before storing."""
    return isinstance(v, torch.Tensor) and v.dim() == 2 and known(v.shape[0] == 1)


# --------------------------------------------------------------------------- one write, read


class Stored(NamedTuple):
    """One write of the cache, read (:func:`read_write`): what it stores, where."""

    kind: str  # "values" (an fp8 cast) or "scales" (float32)
    src: fx.Node  # the stored tensor, before its views
    masked: bool  # stored through torch.where(slot_mapping >= 0, new, old) (or its masked delta)
    write: _CacheWrite
    nodes: set  # the write's nodes (the index_put, the stored views, the mask)
    reads: set  # the old cache bytes a masked write reads
    addr: sympy.Expr  # byte address of byte j of token t's stored row
    row_bytes: int  # bytes stored per token
    algebra: _SlotAlgebra  # shared by both writes (the second write's reading extends the first's)


def _unwrapped(w: _CacheWrite, indices: list, values: Any):
    """``(indices, stored values, masked, nodes)`` of a write: the stored values without the
    one-token reshape, the mask (``(mask, old)``, or None when unmasked) and the flat
    ``index_copy_``'s flattening; or why not."""
    nodes = {w.node}
    masked = None
    if (is_op(values, *VIEWS) and val(values).dim() < 2 and _leading_ones(val(values.args[0]))
            and _flat_pair(indices, values) is None):
        nodes |= {values}  # one token: x[i] = v strips v's leading 1s ([1, B] -> [B])
        values = values.args[0]
    if w.accumulate:  # the race-free masked spelling: add where(valid, new - old, 0)
        delta = _masked_delta(values)
        if delta is None:
            return "accumulating write that does not add where(slot_mapping >= 0, new - old, 0)"
        mask, new, old, delta_nodes = delta
        masked, values = (mask, old), new
        nodes |= delta_nodes
    elif is_op(values, aten.where) and values.target is aten.where.self:
        mask, new, old = values.args
        masked = (mask, old)
        nodes |= {values}
        values = new
    flat = _flat_pair(indices, values)
    if flat is not None:  # index_copy_ on a flat view: unflatten both
        nodes |= {indices[0], values}
        indices, values = [flat[0]], flat[1]
    return indices, values, masked, nodes


def _byte_address(lay: torch.Tensor, indices: list, vv: torch.Tensor, algebra: _SlotAlgebra) -> sympy.Expr | str:
    """The byte address of byte ``j`` of token ``t``'s stored row ``vv`` in a write of the view
    laid out as ``lay`` at ``indices``, or why not."""
    syms = [algebra.interpret(i) for i in indices]
    if not all(isinstance(s, Sym) for s in syms):
        return "index tensors are not integer arithmetic of slot_mapping and arange"
    tail = list(lay.shape[len(indices):])
    p_rank = max(len(s.dims) for s in syms)
    if p_rank + len(tail) != 2:
        return "the write is not [tokens, bytes] shaped"
    bound = algebra.bind(syms, [TOKEN, BYTE][:p_rank])
    if bound is None:
        return "index tensors do not broadcast to [tokens] or [tokens, bytes]"
    exprs, axes = bound
    if axes[0] is not algebra.tok:
        return "the first index dim is not the token axis"
    width = static_size(vv.shape[1], algebra.static)
    if p_rank == 2 and not known(static_size(algebra.axis_len.get(axes[1], -1), algebra.static) == width):
        return "the byte axis does not span the stored row"
    elem = sum(e * st for e, st in zip(exprs, lay.stride())) + lay.storage_offset()
    if tail:
        if not known(tail[0] == width):
            return "the stored row does not fill the indexed row"
        elem = elem + BYTE * lay.stride(len(indices))
    esize = lay.element_size()
    if vv.element_size() != esize:
        return "stored dtype size differs from the cache view's"
    addr = esize * elem  # byte address of element (t, j); bytes within it follow in order
    if esize > 1:
        addr = addr.subs(BYTE, sympy.floor(BYTE / esize)) + sympy.Mod(BYTE, esize)
    return addr


def _stored_source(values: Any, vv: torch.Tensor, esize: int, fixed: Any):
    """``(kind, source, views, row bytes)`` of the stored ``values``: fp8 values (an fp8 cast)
    or float32 scales (also as a view of their bits), all of it; or why not. ``fixed``: the
    size symbols read as their example values (the row width's, specialized on replacing)."""
    src, views = through_views(values)
    row_bytes = static_size(vv.shape[1], fixed) * esize
    if not isinstance(row_bytes, int):
        return "the stored rows have a symbolic width"
    f32 = [v for v in [*views, src] if val(v) is not None and val(v).dtype == torch.float32]
    if f32 and val(src).dtype != torch.float32:  # scales stored from a float32 view of their bits
        src = f32[-1]
    if is_op(src, *_CASTS) and val(src).dtype == torch.float8_e4m3fn:
        kind = "values"
    elif val(src) is not None and val(src).dtype == torch.float32:
        kind = "scales"
    else:
        return "stores neither fp8 values nor float32 scales"
    if not known(val(src).numel() == vv.numel() * esize // val(src).element_size()):
        return "the stored bytes are not all of the quantized tensor"
    return kind, src, views, row_bytes


def read_write(w: _CacheWrite, chain: CacheChain, algebra, fixed: dict) -> Stored | str:
    """One write -> what it stores where (:class:`Stored`), or why not. ``fixed``: the
    sizes read as their example values (:func:`fixed_sizes`); ``algebra``: the first write's
    (the second write's reading extends it), None for the first."""
    indices = w.node.args[1]
    if any(i is None for i in indices) or len(indices) > w.layout.dim():
        return "index_put with None (slice) indices"
    got = _unwrapped(w, list(indices), w.node.args[2])
    if isinstance(got, str):
        return got
    indices, values, masked, nodes = got
    vv = val(values)
    if vv is None or vv.dim() != 2:
        return "the stored values are not [tokens, bytes]"
    if algebra is None:
        algebra = _SlotAlgebra(vv.shape[0])
        algebra.static |= set(fixed)
    elif not known(algebra.num_tokens == vv.shape[0]):
        return "the two writes store different numbers of tokens"
    addr = _byte_address(w.layout, indices, vv, algebra)
    if isinstance(addr, str):
        return addr
    reads: set[fx.Node] = set()
    if masked is not None:
        why = _check_mask(masked, w, chain, indices, algebra, w.layout)
        if why:
            return why
        reads.add(masked[1])
        ge, views = through_views(masked[0], (aten.unsqueeze, aten.expand, *VIEWS))
        nodes |= {masked[1], ge, *views}
    stored = _stored_source(values, vv, w.layout.element_size(), algebra.static)
    if isinstance(stored, str):
        return stored
    kind, src, views, row_bytes = stored
    return Stored(kind, src, masked is not None, w, nodes | set(views), reads, addr, row_bytes, algebra)


def _check_mask(masked, w, chain, indices, algebra, lay) -> str | None:
    """Why the masked write's ``torch.where(mask, new, old)`` is not ``slot_mapping >= 0`` keeping
    the old bytes of the same cache version at the same addresses, or None."""
    mask, old = masked
    m, _ = through_views(mask, (aten.unsqueeze, aten.expand, *VIEWS))
    ok = (is_op(m, aten.ge) and m.args[1] == 0) or (is_op(m, aten.gt) and m.args[1] == -1)
    if not ok or m.args[0] not in algebra.sequences and algebra.interpret(m.args[0]) is None:
        return "torch.where mask is not slot_mapping >= 0"
    ms = algebra.interpret(m.args[0])
    if not (isinstance(ms, Sym) and ms.expr.func.__name__.startswith("seq_")):
        return "torch.where mask is not slot_mapping >= 0"
    if not (is_op(old, aten.index) and old.target is aten.index.Tensor):
        return "torch.where does not keep the old cache bytes"
    st = chain.state(old.args[0])
    if st is None or len(st.writes) != w.version or not same_layout(st.layout, lay):
        return "torch.where keeps bytes of another cache version or view"
    a = [algebra.interpret(i) for i in old.args[1]]
    b = [algebra.interpret(i) for i in indices]
    if len(a) != len(b) or not all(isinstance(s, Sym) for s in a):
        return "torch.where keeps bytes from other addresses"
    ba, bb = algebra.bind(a, [TOKEN, BYTE][: max(len(s.dims) for s in a)]), algebra.bind(b, [TOKEN, BYTE][: max(len(s.dims) for s in b)])
    if ba is None or bb is None or not all(same(x, y) for x, y in zip(ba[0], bb[0])):
        return "torch.where keeps bytes from other addresses"
    return None
