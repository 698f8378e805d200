"""``moe_routing``: the sort of a MoE layer's (token, expert) pairs by expert id, as a rank by comparisons.

What it finds (post-grad graph): transformers' ``grouped_mm`` experts (``integrations/moe.py``,
``grouped_mm_experts_forward``, 5.17-5.25; the experts' default on GPUs outside ``generate()``'s
decoding, and what ``benchmarks/hf_models.py``'s steps run) sort the flattened top-k ids,
``expert_ids_g, perm = torch.sort(expert_ids)`` (``aten.sort`` of a ``[S]`` integer tensor, ascending),
and count the sorted ids per expert with ``torch.histc`` (of ``ids_g.int()`` on CUDA, ``.float()`` on
CPU) for the grouped GEMM's offsets. Inductor compiles that sort of a few hundred integers into one
program (``XBLOCK`` 1): in kda's Qwen3-Next decode-32 step (H100, 8101af1, ``hf_models.json``'s kernel
table) the kernel with the sort and the count took 61.7 us over 4 layers and a second sort kernel 32.8,
against 225 us for the grouped GEMMs themselves.

Spellings: ``torch.sort(ids)`` / ``ids.sort()`` / ``torch.sort(ids, stable=True)`` (``aten.sort.default``,
``aten.sort.stable``), the sorted ids counted by ``histc`` (through a dtype cast or not). Must not match:
a descending sort, a sort of floats or of more than one dim, sorted values no ``histc`` counts (not a
MoE routing: no miss reported), a symbolic pair count or one past ``MAX_PAIRS`` (the rank is O(S^2)).

Speed rule (``speed_rule``): on CUDA from 320 to 1,280 pairs (``MEASURED``: 32 to 128 decode tokens at
top-10), measured in Qwen3-Next's decode-32 step (0.96x, H100, 2026-12-07, 1cd46cc); elsewhere forced only. ``benchmarks/bench_moe_routing.py`` times it (``pairwise``) beside transformers'
sort + ``histc``, our stable sort and a one-hot count (H100, 2026-12-07, 2095f50: the sort + count
13.5-13.7 us at 320 pairs, 38.4-39.6 at 1,280; the one-hot count 6.2-11.3 / 8.9-20.0,
``benchmarks/results/moe_routing.md``); the history: ``docs/speed-rules.md``.

Replacement (:func:`ranked_sort`): each pair's place is the number of pairs with a smaller id plus those
with the same id before it (one reduction over ``S x S`` comparisons, no host sync), the ids and their
pair indices scattered to their places: exactly ``torch.sort(ids, stable=True)`` for ANY integer values
(negative ids and expert-parallel sentinels included), so a valid result of the unstable sort it stands
for; ties come in pair order where eager's unstable sort leaves their order unspecified, so the rows of
one expert's group may come in another order than eager's (each row's value the same). No kernel of ours.
Turn it on with ``options={"kda": {"force": ["moe_routing"]}}``.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from kda_inductor.patterns.base import Match, Rewrite, Stage, aten, erase_dead, is_op, moved, replace_by_function, val

MEASURED: dict[str, tuple[int, int]] = {"cuda": (320, 1280)}
"""Per device type, the pair counts (lowest, highest) where the rank was measured faster than Inductor's
sort in the step it sits in. CUDA (H100, torch 2.11, 2026-12-07, commit 1cd46cc, ``benchmarks/hf_models.py``
``kda@with-moe_routing``): Qwen3-Next decode 32 (320 pairs) 922 and 920 us against kda's 960 (0.96x, two
compiles); alone 6.2-11.3 / 8.9-20.0 us against the sort + count's 13.5 / 38.4 at 320 / 1,280 pairs
(``benchmarks/results/moe_routing.md``). The sort won at 10 and 40,960 pairs: outside the range, Inductor's."""

MAX_PAIRS = 4096
"""The most pairs ranked: ``S x S`` comparisons (16.8 M at 4,096, one reduction); past it the sort stays."""

_INTEGER = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


@dataclasses.dataclass(frozen=True)
class RoutingMatch(Match):
    """One sort of expert ids: its input and its two outputs (None where nothing reads one)."""

    sort: fx.Node
    ids: fx.Node
    values: fx.Node | None
    indices: fx.Node | None

    @property
    def anchor(self) -> fx.Node:
        return self.sort


class MoeRouting(Rewrite):
    name = "moe_routing"
    finds = ("a MoE layer's routing as transformers' `grouped_mm` experts write it: the (token, expert) pairs "
             "sorted by expert id, the sorted ids counted per expert by `histc`")
    spellings = ("`torch.sort(ids)` / `ids.sort()` / `torch.sort(ids, stable=True)` of `[S]` integer ids "
                 "(static S <= 4,096), ascending, the values counted by `torch.histc` (cast first or not); "
                 "on CUDA at 320-1,280 pairs (measured), elsewhere forced only")
    becomes = ("a rank by comparisons (one reduction over S x S, the stable sort's exact result for any ids), "
               "the ids and pair indices scattered to their places: no kernel of ours")

    def speed_rule(self, match: RoutingMatch) -> str | None:
        span = MEASURED.get(match.device)
        pairs = val(match.ids).shape[0]
        if span is not None and span[0] <= pairs <= span[1]:
            return None
        where = f"{span[0]}-{span[1]} pairs" if span else "no size"
        return (f"{pairs} pairs: the rank was measured faster than the sort on {match.device} at {where} "
                "(MEASURED in patterns/moe_routing.py; benchmarks/bench_moe_routing.py times it): forced only here")

    def find(self, graph: fx.Graph) -> list[Match]:
        found = []
        for node in graph.nodes:
            if is_op(node, aten.sort):
                m = self._routing(node)
                if m is not None:
                    found.append(m)
        return found

    def _routing(self, sort: fx.Node) -> RoutingMatch | None:
        outs = {u.args[1]: u for u in sort.users if u.target is _getitem()}
        values = outs.get(0)
        if values is None or not any(_counted(u) for u in values.users):
            return None  # not a MoE routing: no miss a user would look for
        ids, v = sort.args[0], val(sort.args[0])
        kw = dict(sort.kwargs)
        dim = sort.args[1] if len(sort.args) > 1 else kw.get("dim", -1)
        descending = sort.args[2] if len(sort.args) > 2 else kw.get("descending", False)
        if v is None or v.dim() != 1 or v.dtype not in _INTEGER or dim not in (0, -1) or descending:
            return self.miss(sort, Stage.FORM, "not an ascending sort of one [S] integer tensor of expert ids")
        if not isinstance(v.shape[0], int) or v.shape[0] > MAX_PAIRS:
            return self.miss(sort, Stage.FORM, f"{v.shape[0]} pairs: the rank by comparisons is O(S^2), taken for "
                             f"a static S <= {MAX_PAIRS} only; the sort stays")
        nodes = [n for n in (sort, values, outs.get(1)) if n is not None]
        return RoutingMatch(nodes=nodes, sort=sort, ids=ids, values=values, indices=outs.get(1))

    def replace(self, graph: fx.Graph, match: RoutingMatch) -> dict[fx.Node, fx.Node]:
        outputs = [match.values, match.indices]
        new = replace_by_function(graph, ranked_sort, (match.ids,), outputs=outputs, before=match.sort,
                                  origin=match.sort)
        erase_dead(graph, match.nodes)
        return moved(outputs, new)


def _getitem():
    import operator

    return operator.getitem


def _counted(node: fx.Node) -> bool:
    """``node`` (the sorted ids) is counted by ``histc``, through a dtype cast or not."""
    if is_op(node, torch.ops.prims.convert_element_type, aten._to_copy):
        return any(is_op(u, aten.histc) for u in node.users)
    return is_op(node, aten.histc)


def ranked_sort(ids):
    """``torch.sort(ids, stable=True)`` of a ``[S]`` integer tensor without a sort: a pair's place is the count
    of pairs with a smaller id, plus those with the same id before it."""
    pair = torch.arange(ids.shape[0], device=ids.device)
    lower = (ids[None, :] < ids[:, None]) | ((ids[None, :] == ids[:, None]) & (pair[None, :] < pair[:, None]))
    place = lower.sum(1)
    return torch.empty_like(ids).index_put((place,), ids), torch.empty_like(pair).index_put((place,), pair)
