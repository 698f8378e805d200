"""The gated norms of a graph and the merges that wrote their inputs: the search
``gated_norm_merge`` and ``gated_norm_quant`` share (``gated_norm_quant`` rewrites the norms whose
output only an fp8 quantization reads, ``gated_norm_merge`` the rest), and the arguments their ops
both take.

Public: the analysis :func:`gated_norms` (read through ``Rewrite.analysis(graph, gated_norms)``:
run once per graph, whichever rewrite asks first) with its match :class:`NormMatch`, and for the
replacements :func:`norm_arguments` / :func:`as_read` (the ops' arguments) and :func:`norm_region`
(what replacing a match leaves dead). What it matches and must not match:
``patterns/gated_norm_merge.py``'s docstring; the norm itself: :mod:`._gated_norm`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from kda_inductor.patterns._gated_norm import (
    HALF,
    NO_FILL,
    Norm,
    before_cast,
    copy_chain,
    dtype_name,
    fresh_fill,
    gate_view,
    gated_norms_of,
    static_row_size,
)
from kda_inductor.patterns.base import Match, Miss, Misses, Stage, aten, in_graph_order, is_op, live_users, val
from kda_inductor.patterns.canonical import Canon


def _same_or_symbolic(a, b) -> bool:
    """Sizes that index_put_ requires equal: proven equal, or both symbolic (Dynamo
    specializes sizes 0 and 1, so a symbolic size is never a broadcast 1; some torch
    versions keep the values' and the index's token counts as separate symbols)."""
    return statically_known_true(a == b) or (isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt))


@dataclasses.dataclass
class _Write:
    index: fx.Node
    values: fx.Node
    dim: int


@dataclasses.dataclass(frozen=True)
class NormMatch(Match):
    """A gated RMSNorm and, unless merge-free, the merge that wrote its input."""

    norm: Norm
    writes: list[_Write]
    num_tokens: Any  # merged tokens: an int, or the SymInt node that sized the torch.empty
    width: int  # values per token (R norm rows of D)
    pad_value: float | None = None  # the merged buffer's fill (rows no source writes; padding tokens)
    plain: bool = False  # the merge-free norm
    source: fx.Node | None = None  # merge-free: the tensor copied into a padded output
    reads: list[fx.Node] = dataclasses.field(default_factory=list)  # what the op reads its sources from
    in_dtype: torch.dtype | None = None  # the dtype it rounds them to first (None: read as they are)
    absorbed: list[fx.Node] = dataclasses.field(default_factory=list)  # the roundings it reads before
    fixed: dict = dataclasses.field(default_factory=dict)  # D's and width's sizes, specialized on replacing

    @property
    def anchor(self) -> fx.Node:
        return self.norm.y

    @property
    def part(self) -> Literal["merge + norm", "norm alone"]:
        """The norm alone where no merge wrote its input (or a gather did: ``cat`` + ``argsort``)."""
        return "norm alone" if self.plain else "merge + norm"


class _Searcher(Misses):
    """The search behind :func:`gated_norms`: each gated norm, then what wrote its input."""

    def search(self, graph: fx.Graph) -> list[NormMatch]:
        """Every gated norm in ``graph`` and what wrote its input."""
        canon = Canon()
        matches: list[Match] = []
        taken: set[fx.Node] = set()
        for norm in gated_norms_of(graph, canon, self.miss):
            if norm.y in taken:
                continue
            m = self._match(norm, canon)
            if m is not None and not taken & set(m.nodes):
                reads, in_dtype, absorbed = _source_reads(m)
                matches.append(m := dataclasses.replace(m, reads=reads, in_dtype=in_dtype, absorbed=absorbed))
                taken |= set(m.nodes)
        return matches

    # ------------------------------------------------------------------ what wrote x
    def _match(self, norm: Norm, canon: Canon) -> NormMatch | None:
        x, views = _source(canon, norm.x)
        if is_op(x, aten.index_put):
            return self._merge_match(norm, x, views, pad=None)
        scatter = _padded_write(x)
        if scatter is None:
            return self._plain_match(norm, views)
        base, src, end, fill, folded = scatter
        if fill is None:
            return self.miss(x, Stage.LAYOUT, "the padded output is a graph input or other data, not torch.zeros / torch.full / "
                                   "torch.empty: its rows must be stored")
        if len(live_users(x)) != 1 or any(u not in folded for u in live_users(base)):
            return self.miss(x, Stage.LAYOUT, "the padded output is read elsewhere")
        merge, chain = _source(canon, src)
        if is_op(merge, aten.index_put):
            return self._merge_match(norm, merge, [*views, *chain], pad=(fill, end, base), extra=[*folded, base])
        # a tensor copied into the padded output (vLLM Kimi: core_attn_out[0, :n] = o[0, :n]): no merge
        return self._plain_match(norm, [*views, *chain, *folded, base], copied=(src, fill))

    def _merge_match(self, norm: Norm, last: fx.Node, views: list[fx.Node], pad, extra=()) -> NormMatch | None:
        merge = self._merge(last)
        if merge is None:
            return None
        writes, T, chain, pad_value = merge
        if any(len(live_users(v)) != 1 for v in views if v is not norm.x) or len(live_users(last)) != 1:
            return self.miss(last, Stage.LAYOUT, "the merged buffer is read elsewhere")
        per_token_size = math.prod(val(last).shape[writes[0].dim + 1:])
        per_token, fixed = static_row_size(last.graph, per_token_size, norm.fixed)
        if not (isinstance(per_token, int) and per_token % norm.D == 0):
            return self.miss(last, Stage.LAYOUT, "norm rows straddle tokens")
        if pad is not None:
            fill, end, base = pad
            end = val(end) if isinstance(end, fx.Node) else end
            if not statically_known_true(end == val(last).shape[writes[0].dim]):
                return self.miss(last, Stage.LAYOUT, "the merge is copied into part of the padded output other than its first rows")
            if (not statically_known_true(math.prod(val(base).shape) % per_token_size == 0)
                    or not statically_known_true(val(base).shape[-1] == val(last).shape[-1])):
                return self.miss(last, Stage.LAYOUT, "the padded output's rows are not the merge's tokens")
            pad_value = fill  # torch.empty's uncovered merged rows are undefined: the padding's fill will do
        region = norm.nodes | {norm.x, *views, *chain, *extra}
        if not self.region_closed(region, [norm.y], at=last, what="an intermediate of the norm"):
            return None
        return NormMatch(nodes=in_graph_order(region | {norm.y}), norm=norm, writes=writes, num_tokens=T,
                         width=per_token, pad_value=pad_value, fixed=fixed)

    def _merge(self, last: fx.Node):
        """The index_put chain into a fresh buffer (``torch.empty`` / ``zeros`` / ``full``)
        ending at ``last`` -> ``(writes, T, nodes, fill)``, or None with a miss."""
        writes = self._writes(last)
        if writes is None:
            return None
        chain = _index_put_chain(last)
        base = chain[-1]
        fill = fresh_fill(base)
        if fill is NO_FILL or len(live_users(base)) != 1:
            return self.miss(last, Stage.FORM, "the merge does not start from torch.empty / torch.zeros / torch.full "
                                      "(rows no index covers would have to keep their data)")
        if not self._token_rows(last, writes):
            return None
        T = self._partition(last, writes, base)
        if T is None or not self._values_fit(last, writes):
            return None
        return writes, T, chain, fill

    def _writes(self, last: fx.Node) -> list[_Write] | None:
        """The row writes of the index_put chain ending at ``last``, first write first: one
        index tensor each, no accumulation, no partial merge read elsewhere."""
        writes, n = [], last
        while is_op(n, aten.index_put):
            base, indices, values = n.args[:3]
            accumulate = n.args[3] if len(n.args) > 3 else n.kwargs.get("accumulate", False)
            tensors = [(d, i) for d, i in enumerate(indices) if i is not None]
            if accumulate or len(tensors) != 1:
                return self.miss(n, Stage.FORM, "not a row write (accumulate, or several index tensors)")
            d, idx = tensors[0]
            writes.append(_Write(idx, values, d))
            if n is not last and len(live_users(n)) != 1:
                return self.miss(n, Stage.FORM, "a partial merge is read elsewhere")
            n = base
        writes.reverse()
        return writes

    def _token_rows(self, last: fx.Node, writes: list[_Write]) -> bool:
        """The layout: one or two writes along one dim, every dim before it of size 1 (token rows)."""
        if len(writes) > 2 or len({w.dim for w in writes}) != 1:
            self.miss(last, Stage.FORM, "more than two writes, or writes along different dims")
            return False
        d, mv = writes[0].dim, val(last)
        if any(s != 1 for s in mv.shape[:d]):
            self.miss(last, Stage.FORM, f"writes along dim {d} of {tuple(mv.shape)}: not token rows")
            return False
        return True

    def _partition(self, last: fx.Node, writes: list[_Write], base: fx.Node) -> Any:
        """The merged token count ``T`` (an int, or the node that sized the buffer where it is
        symbolic), where the index tensors may partition the tokens: distinct graph values
        whose lengths do not provably miss ``T`` (the values cannot be checked); else None."""
        d = writes[0].dim
        T = val(last).shape[d]
        if len({w.index for w in writes}) != len(writes):
            return self.miss(last, Stage.FORM, "the same index tensor written twice: not a partition")
        lengths = [val(w.index).shape[0] for w in writes]
        if statically_known_true(sum(lengths) != T):
            return self.miss(last, Stage.FORM, f"index lengths {lengths} do not add up to the {T} tokens: not a partition")
        if not isinstance(T, int):  # symbolic: the empty's size (serving recompiles with T dynamic)
            T = base.args[0][d] if isinstance(base.args[0], (list, tuple)) else None
            if not isinstance(T, fx.Node):
                return self.miss(last, Stage.FORM, "the token count is symbolic but not a size of the torch.empty")
        return T

    def _values_fit(self, last: fx.Node, writes: list[_Write]) -> bool:
        """Each write's values are exactly the rows it writes (``[1, ..., n, *rest]``, leading
        1s optional: ``out[:, idx] = v``), of the buffer's dtype: no broadcast."""
        mv = val(last)
        rest = list(mv.shape[writes[0].dim + 1:])
        for w in writes:
            vv = val(w.values)
            full = [val(w.index).shape[0]] + rest
            shape = list(vv.shape)
            while len(shape) > len(full) and shape[0] == 1:
                shape.pop(0)
            if len(shape) != len(full) or not all(map(_same_or_symbolic, shape, full)) or vv.dtype != mv.dtype:
                self.miss(last, Stage.FORM, "written values are broadcast or of another dtype")
                return False
        return True

    def _plain_match(self, norm: Norm, views: list[fx.Node], copied=None) -> NormMatch | None:
        """The norm of a tensor no merge wrote; ``copied``: ``(src, fill)`` when it is ``src``
        copied into the first rows of a padded ``torch.zeros`` / ``full`` output."""
        xv = val(norm.x)
        if xv.dtype not in HALF:  # not what the merge-free kernel was measured on
            return self.miss(norm.y, Stage.LAYOUT, f"the normalized tensor is {dtype_name(xv.dtype)} and no merge wrote "
                             "it: the merge-free op takes bf16 / fp16 tensors (a float32 norm alone was not measured)")
        region = norm.nodes | ({norm.x, *views} if copied else set())
        if not self.region_closed(region, [norm.y], at=norm.y, what="an intermediate of the norm"):
            return None
        if copied is None:
            rows = xv.numel() // norm.D
            R = math.gcd(rows, 32) if isinstance(rows, int) else 1  # norm rows per "token": any split in order
            return NormMatch(nodes=in_graph_order(region | {norm.y}), norm=norm, writes=[],
                             num_tokens=rows // R if isinstance(rows, int) else None, width=R * norm.D, plain=True,
                             fixed=norm.fixed)
        src, fill = copied
        sv = val(src)
        lead = next((i for i, s_ in enumerate(sv.shape) if s_ != 1), sv.dim() - 1)
        width, fixed = static_row_size(norm.y.graph, math.prod(sv.shape[lead + 1:]), norm.fixed)
        if not (isinstance(width, int) and width % norm.D == 0):
            return self.miss(norm.y, Stage.LAYOUT, "the copied rows straddle norm rows")
        return NormMatch(nodes=in_graph_order(region | {norm.y}), norm=norm, writes=[], num_tokens=sv.shape[lead],
                         width=width, plain=True, pad_value=fill, source=src, fixed=fixed)


@dataclasses.dataclass(frozen=True)
class _NormSearch:
    """The ``gated_norms`` analysis: every gated norm in a graph with what wrote its input, and
    the candidates rejected (``gated_norm_merge`` reports them)."""

    matches: list[NormMatch]
    misses: list[Miss]


def gated_norms(graph: fx.Graph) -> _NormSearch:
    """The norm search, run once per graph: ``gated_norm_quant`` and ``gated_norm_merge`` read
    it through ``Rewrite.analysis(graph, gated_norms)``."""
    searcher = _Searcher()
    return _NormSearch(searcher.search(graph), searcher.misses)


def norm_arguments(match: NormMatch) -> dict:
    """``kda::gated_norm_merge``'s arguments for ``match`` by the op's names (``kda::gated_norm_quant``
    takes them too, ``out_dtype`` as its ``norm_dtype``): graph nodes and constants, with how the
    op reads them (:func:`as_read`: ``width``, each source's row width; ``gate_shape``, the gate's
    view, None: as it lies; ``num_tokens`` None: the merge-free norm's row count). Reads only: the
    replacement specializes the sizes the match read static first (``_layout.specialize(match.fixed)``)."""
    m, n = match, match.norm
    z, gate_shape = gate_view(n.z, n.D)
    eps, eps_input = (0.0, n.eps[1]) if isinstance(n.eps, tuple) else (n.eps, None)
    tokens = None if m.plain and not isinstance(m.num_tokens, int) else m.num_tokens
    return dict(sources=m.reads, indices=[w.index for w in m.writes], z=z, weight=n.weight, eps=eps,
                activation=n.act, form=n.form, rsqrt=n.rsqrt, num_tokens=tokens, out_dtype=n.out_dtype,
                pad_value=m.pad_value, eps_input=eps_input, in_dtype=m.in_dtype, width=m.width, gate_shape=gate_shape)


def as_read(args: dict) -> dict:
    """:func:`norm_arguments` as the op takes them: each source as rows of ``width`` values, the
    gate viewed ``gate_shape``, the merge-free count that of the rows."""
    args = dict(args)
    width, gate_shape = args.pop("width"), args.pop("gate_shape")
    args["sources"] = [s.reshape(-1, width) for s in args["sources"]]
    args["z"] = args["z"] if gate_shape is None else args["z"].reshape(gate_shape)
    if args["num_tokens"] is None:
        args["num_tokens"] = args["sources"][0].shape[0]
    return args


def norm_region(match: NormMatch) -> list[fx.Node]:
    """What replacing ``match`` leaves dead: its nodes, the user's copy of the gate (and its views)
    where the op reads the gate where it lies, the roundings the op reads before
    (:func:`_source_reads`); erased where dead."""
    return [*match.nodes, *copy_chain(match.norm.z), *match.absorbed]


def _source_reads(match: NormMatch) -> tuple[list[fx.Node], torch.dtype | None, list[fx.Node]]:
    """The nodes the op reads its sources from, the 16-bit dtype it rounds them to first (None:
    they are read as they are) and the nodes of those roundings (dead once replaced). Where every source is a 16-bit rounding of a float32 value
    (:func:`before_cast`: transformers' recurrent decode core writes its float32 output into a
    zeroed ``[B, H, 1, V]`` buffer, transposes it and casts it to bf16) the op reads the float32
    values and rounds them in registers (the same bytes): the rounding, the transpose and the
    copy are then code of no kernel, so Inductor emits the producer's kernel as stock does. Read
    as bf16, they were fused into the producing reduction as its epilogue, and that kernel lost
    its tiled loop (strided loads of the recurrent state): 59 -> 221 us a call in Qwen3.5's
    decode step on the H200, the whole step 1.08x / 1.26x stock's at 32 / 128 sequences
    (``benchmarks/results/hf_models.md``)."""
    m = match
    nodes = [m.source if m.source is not None else m.norm.x] if m.plain else [w.values for w in m.writes]
    found = [before_cast(x) for x in nodes]
    dtypes = {f[2] for f in found if f is not None}
    if m.source is not None or None in found or len(dtypes) != 1:
        return nodes, None, []
    return [f[0] for f in found], dtypes.pop(), [c for f in found for c in f[1]]


def _padded_write(n: fx.Node):
    """``base[:end] = src`` along the token dim (post-grad ``slice_scatter``), also as
    ``base[0, :end] = src`` into ``[1, T_pad, ...]`` (``select_scatter`` of a
    ``slice_scatter``) -> ``(base, src, end, fill or None, folded nodes)``."""
    folded = [n]
    if is_op(n, aten.select_scatter):
        base, inner, dim, index = n.args[:4]
        if dim != 0 or index != 0 or val(base).shape[0] != 1 or not is_op(inner, aten.slice_scatter):
            return None
        sel = inner.args[0]
        if not (is_op(sel, aten.select) and sel.args[0] is base and tuple(sel.args[1:3]) == (0, 0)):
            return None
        folded += [inner, sel]
        n = inner
    elif is_op(n, aten.slice_scatter):
        base = n.args[0]
    else:
        return None
    _, src, dim, start, end = (list(n.args) + [0, None, None, 1])[:5]
    step = n.args[5] if len(n.args) > 5 else 1
    sv = val(n.args[0])
    if start not in (0, None) or step != 1 or any(s != 1 for s in sv.shape[:dim]):
        return None
    fill = fresh_fill(base)
    fill = None if fill is NO_FILL else (0.0 if fill is None else fill)  # empty's rows: any value will do
    end = sv.shape[dim] if end is None else end
    return base, src, end, fill, folded


def _index_put_chain(last: fx.Node) -> list[fx.Node]:
    """The ``index_put`` nodes ending at ``last``, last first, then the buffer they write."""
    chain, n = [], last
    while is_op(n, aten.index_put):
        chain.append(n)
        n = n.args[0]
    return chain + [n]


def _source(canon: Canon, n: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """The node ``n`` is a view of (``n`` itself if none), and the view nodes in between."""
    t = canon(n)
    if t.op == "view" and t.args[0].node is not None:
        return t.args[0].node, in_graph_order(t.nodes)
    return n, []
