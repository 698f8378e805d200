"""``indexer_k_gather``: DeepSeek-V3.2's indexer K-cache gather -> one fused op.

Finds (post-grad graph) two ``aten.index`` gathers out of a flat uint8 view of the blocked paged
cache ``kv_cache [num_blocks, block_size, D + 4G]`` (``kv_cache.view(num_blocks, -1)[rows,
cols]``, or the 1-D form ``kv_cache.view(-1)[rows * block_bytes + cols]``): one reading the ``D``
fp8 value bytes of every token, one reading its ``4G`` scale bytes. Their index tensors must
compute exactly, for output row ``t`` and column ``j``::

    req  = searchsorted(cu_seq_lens, t, right=True) - 1
    pos  = t - cu_seq_lens[req]
    rows = block_table[req, pos // block_size]
    cols = (pos % block_size) * D + j                                # values
    cols = block_size * D + (pos % block_size) * 4G + j              # scales

which is checked symbolically (``_index_algebra``), so any spelling of the same arithmetic
matches (bucketize, ``cu[1:]`` without the ``- 1``, int32 or int64, ``view`` or ``reshape``,
``%`` or ``&``, ...) and a different layout, block size or group size does not. The scale bytes
may be viewed as float32 ``[N, G]`` or kept as uint8 ``[N, 4G]``; the result may be returned or
copied into preallocated buffers: only the gathers are replaced, the user's views and copies stay.

Extra checks: both gathers present and reading the same cache, table and lengths; ``D`` a
multiple of 128; no lookup of the region (a gathered byte, the block ids) read elsewhere, where
it would be computed twice (plain index arithmetic read elsewhere, e.g. an ``arange`` CSE'd with
the cache write's, stays in the graph for its other readers).

Symbolic sizes (``docs/dynamic.md``): the token, request and block counts stay symbolic (the
cache's views are replayed with their example sizes and again with every such symbol one larger,
``_layout.symbolic_layout_from``, and read only where both address alike); the block size, row
width and head dim are read as their example values and specialized on replacing
(``_layout.specialize``); a size the user marked dynamic is a miss naming it.

Speed rule (``speed_rule``): on CUDA always where the gathered bytes are written out (returned,
copied into ``dst_value`` / ``dst_scale``, read by an opaque op such as DeepGEMM's logits): the op
is several times faster than stock, and kda without it is 10.1 us slower in the hybrid model's
T=256 spec step; left to Inductor where every use of both is elementwise code (a dequantization
in plain torch), which Inductor fuses the lookups into. On CPU only from ``CPU_MIN_TOKENS``
gathered tokens (static counts). Measured: ``benchmarks/results/report.md``,
``profile_step.md``; the history: ``docs/speed-rules.md``.

Replacement (:func:`gather`): ``kda::indexer_k_gather`` returning both byte tensors; where each
gather's only use is a copy (possibly through a dtype view) into a graph input (serving code's
preallocated ``dst_value`` / ``dst_scale``), :func:`gather_into`: ``kda::indexer_k_gather_out``
writing there directly, functionalized as ``auto_functionalized``, which Inductor re-inplaces
(no extra copy).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch
import torch.fx as fx

from kda_inductor.lowerings import indexer_k_gather as _lowering  # registers the op
from kda_inductor.patterns._index_algebra import IndexAlgebra, Sym, drop_clamps, known, same
from kda_inductor.patterns.base import (
    VIEWS,
    Match,
    Rewrite,
    Stage,
    aten,
    cpu_min_count_rule,
    earliest,
    escaping,
    fused_into_users,
    in_graph_order,
    is_op,
    reachable,
    replace_by_function,
    val,
)
from kda_inductor.patterns._layout import (
    SYMBOLIC_ROW,
    byte_address,
    free_symbols,
    input_sizes,
    is_view_op,
    marked_dynamic,
    marked_dynamic_miss,
    row_sizes,
    specialize,
    static_size,
    symbolic_layout_from,
    symbolic_row,
    view_root,
)
from kda_inductor.reference import CacheLayout

_T, _J = sympy.symbols("t j", integer=True, nonnegative=True)

CPU_MIN_TOKENS = 16384
"""Gathered tokens (a static count) from which the op runs on CPU (see the speed rule)."""


@dataclasses.dataclass
class _Gather:
    """One ``aten.index`` out of a view of the cache, with the byte it reads for each output
    byte: ``addr`` is the byte address in the cache (a function of the token ``t`` and the
    byte ``j`` of its row)."""

    node: fx.Node  # the gathered [N, W] values: the aten.index, or the view of its 1-D result
    cache: fx.Node  # the cache: 3-D [num_blocks, block_size, row], or 2-D pages (unit dims between)
    addr: sympy.Expr
    width: Any  # bytes per gathered row
    t_axis: sympy.Symbol
    region: tuple = ()  # nodes between the aten.index and ``node`` (the 1-D form's views)
    views: tuple = ()  # the view chain from the cache to what is indexed
    fixed: dict = dataclasses.field(default_factory=dict)  # the cache's sizes read static (_layout.row_sizes)


def _is_cache(n: fx.Node) -> bool:
    """A contiguous uint8 buffer of 2 or more dims: the indexer cache, 3-D ``[num_blocks,
    block_size, head_dim + 4G]``, or pages ``[num_pages, page_bytes]`` (unit dims between)."""
    v = val(n)
    return isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() >= 2 and v.is_contiguous()


@dataclasses.dataclass(frozen=True)
class GatherMatch(Match):
    values: fx.Node
    scales: fx.Node
    cache: fx.Node
    block_table: fx.Node
    cu_seq_lens: fx.Node
    num_tokens: Any
    head_dim: int
    block_size: int
    dst: Any = None  # ((dst_value, copy_), (dst_scale, copy_)) when copied into graph inputs
    fixed: dict = dataclasses.field(default_factory=dict)  # sizes specialized on replacing (_layout.specialize)

    @property
    def anchor(self) -> fx.Node:
        return self.values

    @property
    def layout(self) -> CacheLayout:
        return CacheLayout(self.head_dim, self.block_size)


@dataclasses.dataclass(frozen=True)
class _Rows:
    """Where the values gather reads token ``t`` (``_T``): block ``row`` of the cache, whose
    blocks are ``block_bytes`` apart, at offset ``off`` in it, read through the lengths ``cu``
    and the table ``bt``."""

    cu: fx.Node
    bt: fx.Node
    row: sympy.Expr
    off: sympy.Expr
    block_bytes: Any

    def fits(self, g: _Gather, col: sympy.Expr) -> bool:
        """``g`` reads byte ``col`` (of ``_J``) of token ``t``'s block."""
        return same(g.addr, self.row * self.block_bytes + col)


class IndexerKGather(Rewrite):
    name = "indexer_k_gather"
    finds = (
        "DeepSeek-V3.2's indexer K-cache gather written sync-free (`searchsorted` and advanced indexing into "
        "the blocked fp8 paged cache)"
    )
    spellings = (
        'DeepSeek-V3.2 indexer K-cache gather written sync-free (`searchsorted`/`bucketize`, '
        '`searchsorted(cu, t + 1) - 1`, a clamped request index; advanced indexing into any view of '
        'the blocked fp8 paged cache: flat 2-D or 1-D views, `as_strided` regions, 1-D flat byte '
        "indices viewed back, SGLang's 2-D page buffers; symbolic token, request and block counts; "
        'a `dynamic=True` block size and head dim specialized), returned or copied into preallocated buffers'
    )
    becomes = '`kda::indexer_k_gather` / `kda::indexer_k_gather_out` (one Triton kernel)'
    eager_form_hint = (
        "kda_inductor.reference.gather_indexer_k (sync-free: searchsorted + advanced "
        "indexing) traces into one graph and is rewritten by indexer_k_gather"
    )

    def speed_rule(self, match: GatherMatch) -> str | None:
        if match.device == "cpu":
            return cpu_min_count_rule(val(match.values).shape[0], CPU_MIN_TOKENS, "gathered tokens",
                                      "indexer_k_gather.py")
        if match.device != "cuda":
            return f"the op was never measured on {match.device} (see patterns/indexer_k_gather.py)"
        if match.dst is None and fused_into_users(match.values) and fused_into_users(match.scales):
            return ("the gathered values and scales only feed elementwise code, which Inductor fuses the "
                    "lookups into without writing the bytes out; the op would add that write (measured, see "
                    "patterns/indexer_k_gather.py)")
        return None

    def find(self, graph: fx.Graph) -> list[Match]:
        algebra = IndexAlgebra()
        gathers = [g for n in graph.nodes if (g := self._gather(n, algebra)) is not None]
        gathers = [_unclamped(g, algebra) for g in gathers]
        matches = []
        used: set[fx.Node] = set()
        for values in gathers:
            if values.node in used:
                continue
            layout = self._layout(values)
            if layout is None or values.width != layout.head_dim:
                continue  # not the cache, or a scales candidate: looked at when pairing
            m = self._pair(values, gathers, layout, algebra, used)
            if m is not None:
                used.update((m.values, m.scales))
                matches.append(m)
        return matches

    # ------------------------------------------------------------------ recognition
    def _gather(self, n: fx.Node, algebra: IndexAlgebra) -> _Gather | None:
        """``n`` as a gather of [tokens, bytes] out of a view of a cache, else None (a
        ``Stage.FORM`` miss where it is one in another form)."""
        if not (is_op(n, aten.index) and n.target is aten.index.Tensor):
            return None
        src, indices = n.args
        if any(i is None for i in indices):
            return None
        cache = view_root(src, lambda x: not is_view_op(x))
        if cache is None or not _is_cache(cache):
            return None
        fixed = row_sizes(cache)  # a symbolic block size and row width: read static, specialized
        lay = self._view_layout(n, src, cache, fixed)
        rows = None if lay is None else self._rows(n, list(indices), lay)
        if rows is None:
            return None
        node, indices, out, region = rows
        fixed = {**fixed, **input_sizes(n.graph, free_symbols(*out.shape[1:]))}  # and the gathered row's width
        marked = marked_dynamic(fixed)
        if marked:
            return self.miss(n, Stage.FORM, marked_dynamic_miss(marked))
        algebra.static |= set(fixed)
        read = self._bytes_read(n, indices, out, lay, algebra)
        if read is None:
            return None
        addr, t_axis = read
        width = static_size(out.shape[1], fixed) * out.element_size()
        views = tuple(v for v in reachable([src], upstream=True) | {src} if v is not cache and is_view_op(v)
                      and cache in reachable([v], upstream=True))
        return _Gather(node, cache, addr, width, t_axis, region, views, fixed)

    def _view_layout(self, n: fx.Node, src: fx.Node, cache: fx.Node, fixed: dict):
        """The layout (a meta tensor) of the cache's view ``src`` that ``n`` indexes, the sizes
        ``fixed`` at their example values, else None."""
        try:
            lay = symbolic_layout_from(src, cache, fixed)
        except ValueError:
            return None
        if lay is None:
            return self.miss(n, Stage.FORM, SYMBOLIC_ROW) if symbolic_row(cache) else None
        return lay

    def _rows(self, n: fx.Node, indices: list, lay: torch.Tensor):
        """``(node, indices, value, region)`` of the gather ``n`` as a 2-D one: 1-D flat byte
        indices (one per dim indexed), the bytes viewed back as [N, W], read as the 2-D gather
        of the unflattened indices; None when the result is not 2-D."""
        out, node, region = val(n), n, ()
        if out is not None and out.dim() == 1 and len(indices) == lay.dim():
            unflat = _unflattened(n, indices)
            if unflat is None:
                return self.miss(n, Stage.FORM, "1-D flat byte indices that are not the gathered rows' [N, W] indices "
                                       "flattened (e.g. one request's whole pages, cut to its length: no "
                                       "cu_seq_lens or block table for the op)")
            node, unflat_indices = unflat
            region = (n, node, *indices)
            indices, out = unflat_indices, val(node)
        if out is None or out.dim() != 2:
            return None
        return node, indices, out, region

    def _bytes_read(self, n: fx.Node, indices: list, out: torch.Tensor, lay: torch.Tensor,
                    algebra: IndexAlgebra) -> tuple[sympy.Expr, sympy.Symbol] | None:
        """``(byte address of output byte (t, j), token axis)`` of the gather ``n`` indexing
        the view laid out as ``lay`` by ``indices``, else None."""
        syms = [algebra.interpret(i) for i in indices]
        if not all(isinstance(s_, Sym) for s_ in syms):
            return self.miss(
                n, Stage.FORM, "index tensors are not integer arithmetic of arange, searchsorted/"
                "bucketize and table lookups"
            )
        p_rank = max(len(s_.dims) for s_ in syms)
        trailing = lay.dim() - len(indices)
        if p_rank + trailing != 2 or trailing not in (0, 1):
            return self.miss(n, Stage.FORM, "the gather is not [tokens, bytes] shaped")
        bound = algebra.bind(syms, [_T, _J][:p_rank])
        if bound is None:
            return self.miss(n, Stage.FORM, "index tensors do not broadcast to [tokens, bytes] from two aranges")
        exprs, axes = bound
        if p_rank == 2:
            across = [static_size(x, algebra.static) for x in (algebra.axis_len.get(axes[1], -1), out.shape[1])]
            if not known(across[0] == across[1]):
                return None  # not an arange across the row
        return byte_address(lay, exprs, _J, trailing == 1), axes[0]

    # ------------------------------------------------------------------ layout
    def _layout(self, values: _Gather) -> CacheLayout | None:
        """The cache's layout (a page buffer's block size from the candidate's width), else
        None (a ``Stage.LAYOUT`` miss for a 3-D cache whose rows fit no head_dim)."""
        shape = _shape(values.cache, values.fixed)
        layout = CacheLayout.parse(shape, values.width)
        if layout is None and len(shape) == 3 and shape[1] != 1:
            self.miss(values.node, Stage.LAYOUT, "cache row width is not head_dim + 4 * head_dim // 128")
        return layout

    # ------------------------------------------------------------------ the pair
    def _pair(self, values, gathers, layout: CacheLayout, algebra, used) -> Match | None:
        """The match of the values gather ``values`` with its scales gather, else None (a miss)."""
        rows = self._values_rows(values, layout, algebra)
        if rows is None or not self._validated(values, layout, rows, algebra):
            return None
        for scales in gathers:
            if self._scales_of(values, scales, layout, rows, algebra, used):
                region = self._region(values, scales, algebra)
                if region is not None:
                    return self._placed(values, scales, layout, rows, region, algebra)
        return self.miss(
            values.node, Stage.ADDRESSING, f"no scales gather of the same cache and tokens with columns "
            f"{layout.scales_start} + (pos % {layout.block_size}) * {layout.scale_bytes} + j"
        )

    def _values_rows(self, values: _Gather, layout: CacheLayout, algebra: IndexAlgebra) -> _Rows | None:
        """Where ``values`` reads each token, when it reads block ``block_table[req, pos //
        block_size]`` at its value bytes; else None (a ``Stage.PIECES`` miss)."""
        bs = layout.block_size
        e = values.addr
        cus, bts = algebra.tables_read(e, "ss", 1), algebra.tables_read(e, "tab", 2)
        if len(cus) != 1 or len(bts) != 1:
            return self.miss(
                values.node, Stage.PIECES, "rows do not read one block_table through "
                "searchsorted(cu_seq_lens, t, right=True) - 1"
            )
        cu, bt = cus.pop(), bts.pop()
        req = algebra.count_le_fn(cu)(_T) - 1
        pos = _T - algebra.table_fn(cu)(req)
        rows = _Rows(cu, bt, algebra.table_fn(bt)(req, sympy.floor(pos / bs)), sympy.Mod(pos, bs),
                     static_size(val(values.cache).stride(0), values.fixed))
        if not rows.fits(values, layout.value_byte(rows.off) + _J):
            return self.miss(
                values.node, Stage.PIECES, f"indices differ from block_table[req, pos // {bs}] and "
                f"(pos % {bs}) * {layout.head_dim} + j (another layout or block size)"
            )
        return rows

    def _validated(self, values: _Gather, layout: CacheLayout, rows: _Rows, algebra: IndexAlgebra) -> bool:
        """The op's validator accepts these inputs (what it would reject is no match, not a
        failed rewrite); else a ``Stage.VALIDATED`` miss."""
        num_tokens = algebra.axis_len[values.t_axis]
        n_val = val(num_tokens) if isinstance(num_tokens, fx.Node) else num_tokens
        try:
            cache, block_size = _blocks(values.cache, layout, values.fixed)
            _lowering.validate(cache, val(rows.bt), val(rows.cu), n_val, layout.head_dim, block_size)
        except (ValueError, TypeError) as exc:
            self.miss(values.node, Stage.VALIDATED, f"kda.indexer_k_gather rejects these inputs: {exc}")
            return False
        return True

    @staticmethod
    def _scales_of(values: _Gather, scales: _Gather, layout: CacheLayout, rows: _Rows, algebra: IndexAlgebra,
                   used: set) -> bool:
        """``scales`` reads the scale bytes of the tokens ``values`` reads."""
        return not (
            scales.node in used
            or scales.cache is not values.cache
            or scales.width != layout.scale_bytes
            or algebra.axis_len[scales.t_axis] != algebra.axis_len[values.t_axis]
            or not rows.fits(scales, layout.scale_byte(rows.off) + _J)
        )

    def _region(self, values: _Gather, scales: _Gather, algebra: IndexAlgebra) -> set[fx.Node] | None:
        """The nodes the op replaces, when no lookup of them is read elsewhere; else None (a
        ``Stage.REGION`` miss). Index arithmetic shared with other code (an arange CSE'd with
        the cache write's) stays for its other readers; gathered bytes read elsewhere would be
        gathered twice."""
        region = (algebra.visited & reachable([values.node, scales.node], upstream=True)) | {
            values.node,
            scales.node,
            *values.region, *scales.region,
        }
        outside = [n for n in escaping(region, [values.node, scales.node])
                   if is_op(n, aten.index) or n in values.region or n in scales.region]
        if outside:
            self.miss(values.node, Stage.REGION, f"intermediate {outside[0].name} is also read by "
                      f"{', '.join(u.name for u in outside[0].users if u not in region)}")
            return None
        return region

    @staticmethod
    def _placed(values: _Gather, scales: _Gather, layout: CacheLayout, rows: _Rows, region: set[fx.Node],
                algebra: IndexAlgebra) -> GatherMatch:
        """The match: the region, the user's views of the cache and, where both gathers are
        copied into preallocated graph inputs, those copies' dtype views."""
        cache, block_size = _blocks(values.cache, layout, values.fixed)
        dst = _preallocated_dst(values.node, scales.node, cache, rows.bt, rows.cu, block_size)
        extra = {n for (_, copy) in (dst or ()) for n in _chain(copy)}
        flats = set(values.views) | set(scales.views)
        return GatherMatch(
            nodes=in_graph_order(region | flats | extra),
            dst=dst, values=values.node, scales=scales.node, cache=values.cache, block_table=rows.bt,
            cu_seq_lens=rows.cu, num_tokens=algebra.axis_len[values.t_axis], head_dim=layout.head_dim,
            block_size=layout.block_size,
            fixed=input_sizes(values.node.graph, algebra.static),  # every size the shared algebra read static
        )

    # --------------------------------------------------------------- replace
    def replace(self, graph: fx.Graph, match: GatherMatch) -> None:
        m = match
        specialize(m.fixed)  # the kernel's block size and row width: this graph serves these values
        first = earliest([m.values, m.scales, *[n for n in m.nodes if is_op(n, aten.index)]])
        shape = _shape(m.cache, m.fixed)
        pages = None if len(shape) == 3 and shape[1] == m.block_size else [-1, m.block_size, m.layout.row_bytes]
        if m.dst is None:
            fn, args = gather, (m.cache, m.block_table, m.cu_seq_lens, m.num_tokens, m.head_dim, pages)
            outputs = [m.values, m.scales]
        else:
            (dst_v, copy_v), (dst_s, copy_s) = m.dst
            fn, args = gather_into, (m.cache, dst_v, dst_s, m.block_table, m.cu_seq_lens, pages)
            outputs = [copy_v.args[1], copy_s.args[1]]  # what the user's copy_ into dst_value / dst_scale reads
        replace_by_function(graph, fn, args, outputs=outputs, before=first, region=m.nodes, origin=m.values)


def gather(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim, pages):
    """The replacement: both byte tensors gathered by one op (a page buffer read as ``pages``:
    ``[num_pages, block_size, row]``)."""
    cache = kv_cache if pages is None else kv_cache.reshape(pages)
    return torch.ops.kda.indexer_k_gather(cache, block_table, cu_seq_lens, num_tokens, head_dim)


def gather_into(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens, pages):
    """The replacement where the user copies both into preallocated graph inputs: the op writes
    them in place (re-inplaced by Inductor: no temporary, no copy)."""
    cache = kv_cache if pages is None else kv_cache.reshape(pages)
    torch.ops.kda.indexer_k_gather_out(cache, dst_value, dst_scale, block_table, cu_seq_lens)
    return dst_value, dst_scale


def _unclamped(g: _Gather, algebra: IndexAlgebra) -> _Gather:
    """``g`` without clamps of its request index to ``[0, num_requests - 1]`` (forks guard the
    table read so): for every token the op accepts (``t < num_tokens <= cu_seq_lens[-1]``, with
    ``cu_seq_lens[0] == 0``) the request index is already in that range."""
    e = g.addr
    cus, bts = algebra.tables_read(e, "ss", 1), algebra.tables_read(e, "tab", 2)
    if len(cus) != 1 or len(bts) != 1:
        return g
    cu, bt = next(iter(cus)), next(iter(bts))
    req = algebra.count_le_fn(cu)(_T) - 1
    last_req = val(cu).shape[0] - 2  # block_table has at least num_requests rows (checked by the op)

    def in_range(x, lo, hi):
        if not same(x, req) or lo not in (sympy.Integer(0), sympy.nan):
            return False
        if hi is sympy.nan:
            return True
        h = algebra.symints.get(hi, hi)
        h = int(h) if isinstance(h, sympy.Integer) else h
        return known(h >= last_req) or known(h == val(bt).shape[0] - 1)

    return dataclasses.replace(g, addr=drop_clamps(g.addr, in_range))


def _unflattened(n: fx.Node, indices: list[Any]):
    """``flat[idx.reshape(-1), ...].view(N, W)`` -> ``(the view, [idx, ...])`` when every ``idx``
    is ``[N, W]``: the 1-D gather of flattened indices, viewed back, is the 2-D gather of them."""
    users = [u for u in n.users]
    if len(users) != 1 or not is_op(users[0], *VIEWS) or not all(is_op(i, *VIEWS) for i in indices):
        return None
    view, idxs = users[0], [i.args[0] for i in indices]
    vv = val(view)
    if vv is None or vv.dim() != 2:
        return None
    for idx in idxs:
        iv = val(idx)
        if iv is None or iv.dim() != 2 or not all(known(a == b) for a, b in zip(iv.shape, vv.shape)):
            return None
    return view, idxs


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


def _shape(cache: fx.Node, fixed: dict) -> list:
    """The cache's sizes, those of ``fixed`` as their example values (the block count may stay
    symbolic)."""
    return [static_size(x, fixed) for x in val(cache).shape]


def _blocks(cache: fx.Node, layout: CacheLayout, fixed: dict) -> tuple:
    """``(cache, block_size)`` as the op's validator reads the (fake) cache: a 3-D cache and 0,
    a page buffer and its block size (``[num_pages, 1, page]`` viewed as ``[num_pages,
    block_size, row]`` where its sizes are static)."""
    cv, shape = val(cache), _shape(cache, fixed)
    if len(shape) == 3 and shape[1] == layout.block_size:
        return cv, 0
    if cv.dim() == 3 and all(isinstance(x, int) for x in cv.shape[1:]):
        return cv.view(cv.shape[0], layout.block_size, layout.row_bytes), 0
    return cv, layout.block_size


def _preallocated_dst(values, scales, cache, bt, cu, block_size=0):
    """``((dst_value, copy), (dst_scale, copy))`` if both gathers are only copied into
    graph inputs that ``kda.indexer_k_gather_out`` accepts as destinations, else None."""
    dst = (_copied_into_input(values), _copied_into_input(scales))
    if None in dst or dst[0][0] is dst[1][0]:
        return None
    dv, ds = val(dst[0][0]), val(dst[1][0])
    if not known(dv.shape[0] == val(values).shape[0]):
        return None
    try:
        _lowering.validate(cache, val(bt), val(cu), block_size=block_size, dst_value=dv, dst_scale=ds)
    except (ValueError, TypeError):
        return None
    return dst
