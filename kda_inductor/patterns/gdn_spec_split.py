"""``gdn_spec_split``: the token gathers of a GDN/KDA layer -> one ``kda.gdn_spec_split`` launch.

Finds (post-grad graph) row gathers ``aten.index.Tensor(src, [None]*d + [idx])`` where every dim
of ``src`` before ``d`` has size 1 (``index_select(0, idx)`` on ``[T, W]``,
``index_select(1, idx)`` on ``[1, T, H]``, ``x[idx]``, ``x[:, idx]`` on ``[1, T, ...]``). It
groups them by index tensor (the same graph node) and puts each group in one launch with the
group whose index reads the most of the same sources (the spec / non-spec pair; index tensors
that gather nothing in common stay apart). Where a gather's output feeds another gather's source
or index, the launch is cut into the largest legal groups, in input order; a group of one gather
is left to Inductor.

Must not match: gathers along a dim that has a non-1 dim before it (column gathers); lookups of
single elements (``x[idx]`` of a 1-D tensor, e.g. the bytes of a flattened cache: an indexer
gather, not a split of token rows); index tensors or sources the graph mutates (moving the read
would see the new values); more than ``MAX_SOURCES`` sources are split into several launches. A
lone row gather, whose index no other gather shares and whose source no other index gathers (a
MoE's routing: ``hidden[perm // top_k]``), is nothing like a split: its miss is
``Stage.INCIDENTAL`` (logged at DEBUG, not shown by ``explain()``).

Speed rule (``speed_rule``): on CUDA a launch of two or more gathers whose rows add up to at least
``MIN_ROW_BYTES`` bytes per token, except where every gather only feeds elementwise code (Inductor
fuses it there as an indirect load) or one index gathers all the rows (a pure prefill or decode
batch: plain row copies Inductor fuses into their producer and consumer); on CPU never. Measured
on an H200: in the hybrid model's T=256 spec step the split is 14.4 us of the 105.5 us kda saves
(``benchmarks/results/gdn_spec_split.md``, ``profile_step.md``); the history:
``docs/speed-rules.md``.

Replacement (:func:`split`): ``kda::gdn_spec_split`` over the launch's sources and index tensors,
placed right after the last of its inputs (users of the gathers that stood earlier move after it:
``replace_by_function``). Turn it off with ``options={"kda": {"disable": ["gdn_spec_split"]}}``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
import torch.fx as fx

from kda_inductor.lowerings import gdn_spec_split as _lowering  # registers the op
from kda_inductor.patterns.base import (
    Match,
    Rewrite,
    Stage,
    aten,
    fused_into_users,
    in_graph_order,
    moved,
    mutated_nodes,
    positions,
    reachable,
    replace_by_function,
    val,
)
from kda_inductor.patterns.canonical import Canon


@dataclasses.dataclass(frozen=True)
class _RowGather:
    node: fx.Node
    src: fx.Node
    dim: int
    idx: fx.Node


@dataclasses.dataclass(frozen=True)
class SplitMatch(Match):
    """One launch: its row gathers, in input order."""

    gathers: list[_RowGather]


MIN_ROW_BYTES = 64
"""Bytes per gathered token, summed over a launch's sources, below which it is left to
Inductor on CUDA (the narrowest rows measured faster: beta's 32 bf16 heads)."""


def _row_bytes(g: _RowGather) -> int | None:
    v = val(g.src)
    width = math.prod(v.shape[g.dim + 1:])
    return width * v.element_size() if isinstance(width, int) else None


ONE_SIDED_TO_INDUCTOR = True
"""Leave a launch with rows from one index only to Inductor on CUDA (see the speed rule;
``benchmarks/profile_step.py --one-sided-split`` turns it off to measure it)."""


def _sides(match: SplitMatch) -> set[fx.Node]:
    """The index tensors of ``match`` that may gather rows (all but the statically empty: a
    symbolic size may be anything, and is not compared, which would add a guard)."""
    return {g.idx for g in match.gathers if not (isinstance(n := val(g.idx).shape[0], int) and n == 0)}


def _indices(match: SplitMatch) -> set[fx.Node]:
    return {g.idx for g in match.gathers}


class GdnSpecSplit(Rewrite):
    name = "gdn_spec_split"
    finds = "a GDN/KDA layer's spec / non-spec token gathers (`index_select` / `x[idx]`), grouped by shared index"
    spellings = (
        "a GDN/KDA layer's token gathers (`index_select` / `x[idx]` along the token dim) grouped by "
        "shared index, spec and non-spec together (up to 12 gathers: vLLM's BailingMoeV3 KDA has 10)"
    )
    becomes = '`kda::gdn_spec_split` (one launch for all of them)'

    def speed_rule(self, match: SplitMatch) -> str | None:
        if match.device != "cuda":
            return (f"on {match.device} the fused op's implementation is slower than the code Inductor "
                    "generates for the gathers (measured, see patterns/gdn_spec_split.py)")
        widths = [_row_bytes(g) for g in match.gathers]
        if all(w is not None for w in widths) and sum(widths) < MIN_ROW_BYTES:
            return (f"the gathered rows add up to {sum(widths)} bytes per token, fewer than the "
                    f"{MIN_ROW_BYTES} measured faster than Inductor's fused lookups")
        if ONE_SIDED_TO_INDUCTOR and len(_sides(match)) <= 1:
            other = ("the other set is empty: a pure prefill or decode batch" if len(_indices(match)) > 1
                     else "no other index gathers the same tensors")
            return (f"only one index gathers rows here ({other}), so the gathers are plain row copies that "
                    "Inductor fuses into their producers and consumers; the fused launch would add the copies "
                    "(measured, see patterns/gdn_spec_split.py)")
        if all(fused_into_users(g.node) for g in match.gathers):
            return ("every gather only feeds elementwise code, which Inductor fuses the gather into as an "
                    "indirect load (no copy); the fused launch would add a copy (measured: the hybrid model's "
                    "16K-token prefill, whose varlen conv reads its taps so, 19.5 vs 18.3 ms)")
        return None

    def find(self, graph: fx.Graph) -> list[Match]:
        pos = positions(graph)
        mutated = mutated_nodes(graph)
        groups: dict[fx.Node, list[_RowGather]] = {}
        for n in graph.nodes:
            g = self._row_gather(n, mutated)
            if g is not None:
                groups.setdefault(g.idx, []).append(g)
        matches, done = [], set()
        value = _source_values(graph)
        for idx, members in groups.items():
            if idx in done:
                continue
            done.add(idx)
            sources = {value(g.src) for g in members}
            overlap = {j: len(sources & {value(g.src) for g in other})
                       for j, other in groups.items() if j not in done}
            partner = max(overlap, key=overlap.__getitem__, default=None)
            if partner is not None and overlap[partner] > 0:
                done.add(partner)
                members = members + groups[partner]
            if len(members) == 1:  # a MoE's routing gather (hidden[perm // k]): nothing like a split
                self.miss(members[0].node, Stage.INCIDENTAL, "a lone row gather: no other gather shares its index "
                          "or reads its source, nothing like a spec / non-spec split")
                continue
            for launch in _legal_launches(members, pos):
                if len(launch) >= 2:
                    matches.append(SplitMatch(nodes=[g.node for g in launch], gathers=launch))
                elif (_row_bytes(launch[0]) or MIN_ROW_BYTES) >= MIN_ROW_BYTES:  # a lookup is no split
                    self.miss(launch[0].node, Stage.PIECES, "no other gather of this index can share its launch "
                              "(an output is used before another gather's input exists)")
        return matches

    def _row_gather(self, n: fx.Node, mutated: set[fx.Node]) -> _RowGather | None:
        if n.op != "call_function" or n.target is not aten.index.Tensor:
            return None
        src, indices = n.args
        tensors = [(d, i) for d, i in enumerate(indices) if i is not None]
        sv = val(src)
        if len(tensors) != 1 or sv is None:
            return None
        dim, idx = tensors[0]
        iv = val(idx)
        if iv is None or iv.dim() != 1 or iv.dtype not in (torch.int32, torch.int64):
            return None
        if any(s != 1 for s in sv.shape[:dim]):
            return self.miss(n, Stage.FORM, f"gathers along dim {dim} of {tuple(sv.shape)}: not a token (row) gather")
        if dim == sv.dim() - 1:
            return None  # single elements (x[idx] of a 1-D tensor): a lookup, not a split of token rows
        if idx in mutated or src in mutated:
            return self.miss(n, Stage.FORM, "its index or source is mutated in the graph")
        return _RowGather(n, src, dim, idx)

    def replace(self, graph: fx.Graph, match: SplitMatch) -> dict[fx.Node, fx.Node]:
        # a source or index that was the output of a gather an earlier launch replaced (a split of a
        # split) is that launch's output by now: the pass manager remaps the match (base.remap)
        gathers = match.gathers
        indices = list(dict.fromkeys(g.idx for g in gathers))
        last_input = in_graph_order(n for g in gathers for n in (g.src, g.idx))[-1]
        args = ([g.src for g in gathers], indices, [g.dim for g in gathers], [indices.index(g.idx) for g in gathers])
        outputs = [g.node for g in gathers]
        outs = replace_by_function(graph, split, args, outputs=outputs, before=last_input.next,
                                   region=match.nodes, origin=gathers[0].node)
        return moved(outputs, outs)


def split(sources, indices, dims, index_of):
    """The replacement: one launch for every gather (``sources[i]`` along ``dims[i]`` by
    ``indices[index_of[i]]``)."""
    return torch.ops.kda.gdn_spec_split(sources, indices, dims, index_of)


def _source_values(graph: fx.Graph):
    """``node -> key``: equal keys for sources that compute the same value (canonical terms),
    so that the two sets pair up where each gathers its own copy of a view: Inductor does not
    CSE before our pass, and ``q[:n].index_select(0, idx)`` written per set makes one ``q[:n]``
    node per set (the pairing compared nodes, and left each set a one-sided launch)."""
    canon = Canon()

    def value(n: fx.Node):
        t = canon(n)
        try:
            hash(t)
        except TypeError:  # a term holding an unhashable constant: the node itself
            return n
        return t

    return functools.cache(value)


def _legal_launches(members: list[_RowGather], pos: dict[fx.Node, int]) -> list[list[_RowGather]]:
    """Cut ``members`` into launches with no gather feeding another's source or index
    (the fused node must come after all its inputs): in input order, each launch as large
    as it can be, at most ``MAX_SOURCES`` sources."""
    downstream = functools.cache(lambda node: reachable([node], upstream=False))

    todo = sorted(members, key=lambda g: max(pos[g.src], pos[g.idx]))
    launches = []
    while todo:
        launch, later = [todo[0]], []
        fed = {todo[0].node, *downstream(todo[0].node)}  # the gather itself too: a split of its output
        for g in todo[1:]:
            inputs = {x for m in launch for x in (m.src, m.idx)}
            ok = (len(launch) < _lowering.MAX_SOURCES and g.src not in fed and g.idx not in fed
                  and not ({g.node, *downstream(g.node)} & inputs))
            if ok:
                launch.append(g)
                fed |= {g.node, *downstream(g.node)}
            else:
                later.append(g)
        launches.append(launch)
        todo = later
    return launches
