"""``indexer_k_gather``: DeepSeek-V3.2's indexer K-cache gather -> one fused op.

What it finds (post-grad graph): two ``aten.index`` gathers out of a flat uint8
view of the blocked paged cache ``kv_cache [num_blocks, block_size, D + 4G]``
(``kv_cache.view(num_blocks, -1)[rows, cols]``, or the 1-D form
``kv_cache.view(-1)[rows * block_bytes + cols]``): one reading the ``D`` fp8
value bytes of every token, one reading its ``4G`` scale bytes. Their index
tensors must compute exactly, for output row ``t`` and column ``j``::

    req  = searchsorted(cu_seq_lens, t, right=True) - 1
    pos  = t - cu_seq_lens[req]
    rows = block_table[req, pos // block_size]
    cols = (pos % block_size) * D + j                                # values
    cols = block_size * D + (pos % block_size) * 4G + j              # scales

which is checked symbolically (``_index_algebra``), so any spelling of the same
arithmetic matches (bucketize, ``cu[1:]`` without the ``- 1``, int32 or int64,
``view`` or ``reshape``, ``%`` or ``&``, ...) and a different layout, block
size or group size does not. The scale bytes may be viewed as float32 ``[N, G]``
or kept as uint8 ``[N, 4G]``; the result may be returned or copied into
preallocated buffers: only the gathers are replaced, the user's views and
copies stay.

Extra checks: both gathers present and reading the same cache, table and
lengths; ``D`` a multiple of 128; every intermediate node used only by the
gathers (a region whose intermediates are read elsewhere is left alone).

Replacement: ``torch.ops.kda.indexer_k_gather(kv_cache, block_table,
cu_seq_lens, num_tokens, D)`` returning both byte tensors. When each gather's
only use is a copy (possibly through a dtype view) into a graph input (the
preallocated ``dst_value``/``dst_scale`` of serving code), the in-place
``kda.indexer_k_gather_out`` writes there directly instead, as
``auto_functionalized``, which Inductor re-inplaces: no extra copy.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch
import torch.fx as fx

from kda_inductor.lowerings import indexer_k_gather as _lowering  # registers the op
from kda_inductor.patterns._index_algebra import IndexAlgebra, Sym, known, same
from kda_inductor.patterns.base import (
    VIEWS,
    Match,
    Rewrite,
    Route,
    aten,
    escaping,
    insert_fused,
    is_op,
    positions,
    reachable,
    val,
)
from kda_inductor.reference import QUANT_GROUP

_T, _J = sympy.symbols("t j", integer=True, nonnegative=True)


@dataclasses.dataclass
class _Gather:
    """One ``aten.index`` out of the flat cache, with what its indices compute."""

    node: fx.Node
    cache: fx.Node
    flat: fx.Node
    rows: sympy.Expr  # block row index (2-D form) or None (1-D form)
    cols: sympy.Expr  # byte column within the block (2-D) or flat byte index (1-D)
    width: Any
    t_axis: sympy.Symbol


def _cache_of(flat: Any) -> fx.Node | None:
    """The 3-D uint8 cache that ``flat`` is a flat view of, else ``None``."""
    if not is_op(flat, *VIEWS):
        return None
    cache = flat.args[0]
    cv, fv = val(cache), val(flat)
    if cv is None or fv is None or cv.dtype != torch.uint8 or cv.dim() != 3:
        return None
    nb, bs, row = cv.shape
    if fv.dim() == 2 and fv.shape[1] == bs * row:
        return cache
    if fv.dim() == 1:
        return cache
    return None


def _layout(cache: fx.Node) -> tuple[int, int, int] | None:
    """(block_size, head_dim, scale_bytes) of a blocked cache, if its row width fits."""
    _, bs, row = val(cache).shape
    if not all(isinstance(x, int) for x in (bs, row)):
        return None
    if row % (QUANT_GROUP + 4):
        return None
    groups = row // (QUANT_GROUP + 4)
    return bs, groups * QUANT_GROUP, 4 * groups


@dataclasses.dataclass
class GatherMatch(Match):
    values: fx.Node
    scales: fx.Node
    cache: fx.Node
    block_table: fx.Node
    cu_seq_lens: fx.Node
    num_tokens: Any
    head_dim: int
    dst: Any = None  # ((dst_value, copy_), (dst_scale, copy_)) when copied into graph inputs


class IndexerKGather(Rewrite):
    name = "indexer_k_gather"
    summary = "DeepSeek-V3.2 indexer K-cache gather (values + scales) -> kda::indexer_k_gather"
    eager_form_hint = (
        "kda_inductor.reference.gather_indexer_k (sync-free: searchsorted + advanced "
        "indexing) traces into one graph and is rewritten by indexer_k_gather"
    )

    def find(self, graph: fx.Graph) -> list[Match]:
        algebra = IndexAlgebra()
        gathers = [g for n in graph.nodes if (g := self._gather(n, algebra)) is not None]
        matches = []
        used: set[fx.Node] = set()
        for values in gathers:
            if values.node in used:
                continue
            layout = _layout(values.cache)
            if layout is None:
                self.miss(values.node, 2, "cache row width is not head_dim + 4 * head_dim // 128")
                continue
            if values.width != layout[1]:
                continue  # a scales candidate: looked at when pairing
            m = self._pair(values, gathers, layout, algebra, used)
            if m is not None:
                used.update((m.values, m.scales))
                matches.append(m)
        return matches

    # ------------------------------------------------------------------ find
    def _gather(self, n: fx.Node, algebra: IndexAlgebra) -> _Gather | None:
        if not (is_op(n, aten.index) and n.target is aten.index.Tensor):
            return None
        flat, indices = n.args
        cache = _cache_of(flat)
        out = val(n)
        if cache is None or out is None or out.dim() != 2 or any(i is None for i in indices):
            return None
        if len(indices) != val(flat).dim():
            return None
        syms = [algebra.interpret(i) for i in indices]
        if not all(isinstance(s, Sym) for s in syms):
            return self.miss(
                n, 1, "index tensors are not integer arithmetic of arange, searchsorted/"
                "bucketize and table lookups"
            )
        bound = algebra.bind(syms, [_T, _J])
        if bound is None:
            return self.miss(n, 1, "index tensors do not broadcast to [tokens, bytes] from two aranges")
        exprs, axes = bound
        rows, cols = (exprs if len(exprs) == 2 else (None, exprs[0]))
        return _Gather(n, cache, flat, rows, cols, out.shape[1], axes[0])

    def _pair(self, values, gathers, layout, algebra, used) -> Match | None:
        bs, hd, sb = layout
        e = values.rows if values.rows is not None else values.cols
        cus, bts = algebra.tables_read(e, "ss", 1), algebra.tables_read(e, "tab", 2)
        if len(cus) != 1 or len(bts) != 1:
            return self.miss(
                values.node, 3, "rows do not read one block_table through "
                "searchsorted(cu_seq_lens, t, right=True) - 1"
            )
        cu, bt = cus.pop(), bts.pop()
        req = algebra.count_le_fn(cu)(_T) - 1
        pos = _T - algebra.table_fn(cu)(req)
        row = algebra.table_fn(bt)(req, sympy.floor(pos / bs))
        off = sympy.Mod(pos, bs)
        block_bytes = bs * (hd + sb)

        def fits(g: _Gather, col: sympy.Expr) -> bool:
            if g.rows is None:  # 1-D form: one flat byte index
                return same(g.cols, row * block_bytes + col)
            return same(g.rows, row) and same(g.cols, col)

        if not fits(values, off * hd + _J):
            return self.miss(
                values.node, 3, f"indices differ from block_table[req, pos // {bs}] and "
                f"(pos % {bs}) * {hd} + j (another layout or block size)"
            )
        num_tokens = algebra.axis_len[values.t_axis]
        n_val = val(num_tokens) if isinstance(num_tokens, fx.Node) else num_tokens
        try:  # what the fused op would reject is no match (not a failed rewrite)
            _lowering._check_functional(val(values.cache), val(bt), val(cu), n_val, hd)
        except (ValueError, TypeError) as exc:
            return self.miss(values.node, 4, f"kda.indexer_k_gather rejects these inputs: {exc}")
        for scales in gathers:
            if (
                scales.node in used
                or scales.cache is not values.cache
                or scales.width != sb
                or algebra.axis_len[scales.t_axis] != algebra.axis_len[values.t_axis]
                or not fits(scales, bs * hd + off * sb + _J)
            ):
                continue
            region = (algebra.visited & reachable([values.node, scales.node], upstream=True)) | {
                values.node,
                scales.node,
            }
            outside = escaping(region, [values.node, scales.node])
            if outside:
                self.miss(values.node, 6, f"intermediate {outside[0].name} is also read by "
                          f"{', '.join(u.name for u in outside[0].users if u not in region)}")
                continue
            dst = _preallocated_dst(values.node, scales.node, values.cache, bt, cu)
            extra = {n for (_, copy) in (dst or ()) for n in _chain(copy)}
            return GatherMatch(
                nodes=sorted(region | {values.flat, scales.flat} | extra,
                             key=positions(values.node.graph).__getitem__),
                dst=dst, values=values.node, scales=scales.node, cache=values.cache, block_table=bt,
                cu_seq_lens=cu, num_tokens=num_tokens, head_dim=hd,
            )
        return self.miss(
            values.node, 5, f"no scales gather of the same cache and tokens with columns "
            f"{bs * hd} + (pos % {bs}) * {sb} + j"
        )

    # --------------------------------------------------------------- replace
    def replace(self, graph: fx.Graph, match: GatherMatch) -> None:
        m = match
        first = min((m.values, m.scales), key=positions(graph).__getitem__)
        if m.dst is None:
            insert_fused(
                graph, torch.ops.kda.indexer_k_gather.default,
                (m.cache, m.block_table, m.cu_seq_lens, m.num_tokens, m.head_dim),
                before=first, routes=[Route(m.values, 0), Route(m.scales, 1)], region=m.nodes, origin=m.values,
            )
            return
        (dst_v, copy_v), (dst_s, copy_s) = m.dst
        # auto_functionalized's outputs: (op result, new dst_value, new dst_scale)
        insert_fused(
            graph, torch.ops.kda.indexer_k_gather_out.default,
            kwargs={"kv_cache": m.cache, "dst_value": dst_v, "dst_scale": dst_s,
                    "block_table": m.block_table, "cu_seq_lens": m.cu_seq_lens},
            before=first, mutated="dst_value, dst_scale",
            routes=[Route(copy_v.args[1], 1, only=lambda u, c=copy_v: u is c),
                    Route(copy_s.args[1], 2, only=lambda u, c=copy_s: u is c)],
            region=m.nodes, origin=m.values,
        )


def _chain(copy: fx.Node) -> list[fx.Node]:
    """The dtype view (if any) between a gather and its ``copy_``."""
    src = copy.args[1]
    return [src] if is_op(src, aten.view) else []


def _copied_into_input(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """``(graph input, copy_ node)`` when ``node``'s one use is ``input.copy_(node)``,
    directly or through one ``.view(dtype)``."""
    if len(node.users) != 1:
        return None
    user = next(iter(node.users))
    if user.target is aten.view.dtype and len(user.users) == 1:
        node, user = user, next(iter(user.users))
    if (user.target is aten.copy_.default and user.args[1] is node
            and user.args[0].op in ("placeholder", "get_attr")):  # get_attr: a buffer under AOTInductor
        return user.args[0], user
    return None


def _preallocated_dst(values, scales, cache, bt, cu):
    """``((dst_value, copy), (dst_scale, copy))`` if both gathers are only copied into
    graph inputs that ``kda.indexer_k_gather_out`` accepts as destinations, else None."""
    dst = (_copied_into_input(values), _copied_into_input(scales))
    if None in dst or dst[0][0] is dst[1][0]:
        return None
    dv, ds = val(dst[0][0]), val(dst[1][0])
    if not known(dv.shape[0] == val(values).shape[0]):
        return None
    try:
        _lowering._check_out(val(cache), dv, ds, val(bt), val(cu))
    except (ValueError, TypeError):
        return None
    return dst
