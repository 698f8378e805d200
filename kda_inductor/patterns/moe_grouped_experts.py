"""``moe_grouped_experts``: a MoE layer's experts run as one grouped GEMM per projection instead of
a copy of every selected expert's weights.

What it finds (post-grad graph): transformers' ``batched_mm`` experts (``integrations/moe.py``,
``batched_mm_experts_forward``, 5.17-5.25): each (token, expert) pair's weights gathered by the
routing's expert ids, ``W[ids]`` (``aten.index.Tensor(W, [ids])``, W ``[E, N, K]``, ids ``[S]``),
then one batched matrix-vector product a pair, ``bmm(W[ids], x.unsqueeze(-1))`` (``[S, N, 1]``), or
with transposed weights (``is_transposed``, W ``[E, K, N]``) ``bmm(x.unsqueeze(1), W[ids])``
(``[S, 1, N]``). transformers' ``generate()`` switches every ``grouped_mm`` experts implementation
to this one for the decoding steps on GPUs (``GenerationMixin._optimize_model_for_decode``), so a
compiled generate of Qwen3-Next / Qwen3.5-MoE / Kimi Linear / DeepSeek-V3.2 decodes through it: the
gather writes ``S x N x K`` weight elements a projection (a [S, 2I, H] copy of the experts' weights
for S = tokens x top-k pairs) and the bmm reads them back. On an H100 (torch 2.11, transformers
5.17, 2026-12-07, ``benchmarks/hf_generate.py --profile``), Qwen3-Next's generate at 32 sequences
spent ~97 % of a step's ~8.3 ms of GPU time there (Inductor's gathers 5.2 ms, the bmms 2.9 ms);
the recurrence, 0.13 ms. Every gather by one ids tensor is one match (the up and the down
projection of a layer share their sort).

Also read: ``@`` / ``matmul`` (an ``expand`` of the gather to its own shape before the bmm),
``einsum("snk,sk->sn", W[ids], x)``, ``W.index_select(0, ids)`` and the pairs' matrices read transposed
(``W[ids].transpose(1, 2)``). Not read: ``(W[ids] * x[:, None]).sum(-1)`` (no bmm: Inductor fuses that
gather into its reduction, no copy to save).

Must not match: a gather read elsewhere too (the copy stays, a miss), ids that are not one index
tensor of ``[S]`` integers, weights that are not ``[E, rows, cols]`` with static sizes, a bmm whose
other operand is not the per-pair vector (``[S, K, 1]`` / ``[S, 1, K]``), dtypes that differ, anything
but bf16 (torch's grouped GEMM's shape check; on CUDA other dtypes would take a host-syncing loop), and
on CUDA rows that are not 16-byte aligned. A GPU older than sm_80 (no grouped GEMM there; transformers
checks the same) is the framework's miss (``Rewrite.min_cuda_capability``).

Speed rule (``speed_rule``): on CUDA at every size (``MEASURED["cuda"]``); CPU forced only (not timed).
The grouped GEMM reads each used expert's weights once (``E_used x N x K``) where the gather writes and the
bmm reads ``S x N x K`` (S = tokens x top-k pairs), for a sort of the S ids and two row permutations.
Measured (H100, torch 2.11, transformers 5.17, 2026-12-07, tree 702e9f7): transformers' ``Qwen3NextExperts``
alone (``benchmarks/bench_moe_grouped_experts.py``, Qwen3-Next's expert dims, bf16) 1.11x / 3.27x / 6.91x
stock at 1 / 32 / 128 tokens with the released 512 experts, 1.17x / 22.6x / 68.7x with 16; in ``generate()``
(``benchmarks/hf_generate.py``, Qwen3-Next, 4 layers, 16 experts, one cold compile each) 648.5 against
stock's 531.1 tokens/s at batch 1 (1.22x); at 8214426, one process at a time, cold / warm: batch 32
16,627 / 17,752 against 3,104 / 3,388 (5.36x / 5.24x), batch 1 1.04x / 1.30x. No measured size is slower, so symbolic token counts keep the rule; the
history: ``docs/speed-rules.md``.

Replacement (:func:`routing` once an ids tensor, :func:`project` a projection): the pairs sorted by expert id
(stable), each expert's rows offset by ``searchsorted`` (no host sync: CUDA-graph safe), or ranked by a
cumulative count per expert at the pair counts where that was measured faster (:data:`RANKED_PAIRS`);
``torch._grouped_mm`` (``F.grouped_mm`` where this torch has it) of the sorted rows with the weights, the rows put back in pair
order. Negative ids read ``W[id + E]`` as the gather does; an id outside ``[-E, E)`` fails an assert where the
device checks them (on CPU; eager's gather raises) and its pair's rows come out NaN (on CUDA Inductor's assert
did not trap on an H100, torch 2.11: the NaN is what a user sees), never rows the GEMM left unwritten. Each
output row is one expert's dot products over K in float32, rounded once to the dtype: the gather + bmm's value
up to the GEMM's summation order (bit-exact on CPU here, within bf16 rounding on CUDA where cuBLAS and CUTLASS
tile K differently). No kernel of ours: torch's grouped GEMM (Inductor's lowering of ``aten._grouped_mm``).
Turn it off with ``options={"kda": {"disable": ["moe_grouped_experts"]}}``.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from kda_inductor.patterns.base import (
    Match,
    Rewrite,
    Stage,
    aten,
    erase_dead,
    is_op,
    moved,
    replace_by_function,
    val,
)

MEASURED: dict[str, bool] = {"cuda": True}
"""Devices where the grouped form was measured faster than stock Inductor's gather + bmm, alone and in the
step it sits in: CUDA (H100, 2026-12-07: alone 1.11-68.7x at 1-128 tokens, 512 or 16 experts; generate()
batch 1 1.04-1.30x, batch 32 5.24-5.36x); CPU not timed (forced only)."""

_INTEGER = (torch.int64, torch.int32)


@dataclasses.dataclass(frozen=True)
class Projection:
    """One ``bmm`` of gathered expert weights: its output, the vector operand, the experts' weights
    (``[E, N, K]`` when ``weights_first``, else ``[E, K, N]``; the other way round with ``flip``)."""

    bmm: fx.Node
    vector: fx.Node
    weight: fx.Node
    weights_first: bool
    flip: bool  # the bmm reads the pairs' matrices transposed (``W[ids].transpose(1, 2)``)
    chain: tuple[fx.Node, ...]  # the gather and the views between it and the bmm


@dataclasses.dataclass(frozen=True)
class GroupedMatch(Match):
    """The projections that gather by one ``ids`` tensor (a MoE layer's up and down projections), in
    graph order."""

    ids: fx.Node
    projections: tuple[Projection, ...]

    @property
    def anchor(self) -> fx.Node:
        return self.projections[0].bmm


def _static(sizes) -> bool:
    return all(isinstance(s, int) for s in sizes)


class MoeGroupedExperts(Rewrite):
    name = "moe_grouped_experts"
    finds = ("a MoE layer's experts as transformers' `batched_mm` runs them (generate()'s decoding steps): "
             "every selected expert's weights gathered per (token, expert) pair, then a batched matrix-vector product")
    spellings = (
        "`bmm(W[ids], x.unsqueeze(-1))` with W `[E, N, K]` (transformers' `_batched_linear`) or "
        "`bmm(x.unsqueeze(1), W[ids])` with W `[E, K, N]` (`is_transposed`), also as `@` / `matmul`, "
        "`einsum(\"snk,sk->sn\")`, `W.index_select(0, ids)` and `W[ids].transpose(1, 2)`; ids `[S]` integers (a "
        "flattened top-k), several projections by one ids tensor as one match; bf16; on CUDA at every size "
        "(measured 1.1-69x "
        "alone, 5.2-5.4x generate()'s tokens/s at batch 32), CPU forced only"
    )
    becomes = ("the pairs sorted by expert and one `torch._grouped_mm` per projection (each used expert's weights "
               "read once, no copy), rows back in pair order: no kernel of ours")

    runs_before = ("gdn_spec_split",)  # its gathers by one index are the spec split's form too: the copy goes first

    def speed_rule(self, match: GroupedMatch) -> str | None:
        if MEASURED.get(match.device):
            return None
        return (f"not measured on {match.device} (CUDA only): forced only; the grouped GEMM reads each used expert's "
                "weights once where the gather copies them for every (token, expert) pair "
                "(benchmarks/bench_moe_grouped_experts.py; MEASURED in patterns/moe_grouped_experts.py)")

    def find(self, graph: fx.Graph) -> list[Match]:
        by_ids: dict[tuple[fx.Node, int], list[Projection]] = {}  # by (ids, experts)
        for node in graph.nodes:
            if is_op(node, aten.bmm):
                p = self._projection(node)
                if p is not None:
                    by_ids.setdefault((p[0], val(p[1].weight).shape[0]), []).append(p[1])
        return [GroupedMatch(nodes=[n for p in ps for n in (p.bmm, *p.chain)],
                             ids=ids, projections=tuple(ps)) for (ids, _), ps in by_ids.items()]

    def _projection(self, bmm: fx.Node) -> tuple[fx.Node, Projection] | None:
        a, b = bmm.args[:2]
        first = _gather(a)
        gathered = first if first is not None else _gather(b)
        if gathered is None:
            return None  # a bmm of anything else
        weights_first = first is not None
        chain, weight, ids, flip = gathered
        wv, iv, vec = val(weight), val(ids), val(b if weights_first else a)
        if wv is None or iv is None or vec is None or wv.dim() != 3 or iv.dim() != 1 or iv.dtype not in _INTEGER:
            return self.miss(bmm, Stage.FORM, "the gathered weights are not [E, rows, cols] indexed by one "
                             "[S] integer tensor of expert ids")
        if not _static(wv.shape):
            return self.miss(bmm, Stage.FORM, f"the experts' weights have symbolic sizes {tuple(wv.shape)}")
        k = wv.shape[1 if weights_first == flip else 2]  # the products' inner dim, as the bmm reads W[id]
        want = (iv.shape[0], k, 1) if weights_first else (iv.shape[0], 1, k)
        if vec.dim() != 3 or not all(statically_known_true(x == y) for x, y in zip(vec.shape, want)):
            return self.miss(bmm, Stage.FORM, f"the other operand {tuple(vec.shape)} is not one vector a pair "
                             f"({list(want)}): a batched GEMM, not the experts' matrix-vector products")
        why = _grouped_mm_refuses(wv, vec)
        if why:
            return self.miss(bmm, Stage.LAYOUT, why)
        if any(len(n.users) != 1 for n in chain):
            return self.miss(bmm, Stage.REGION, "the gathered weights are read elsewhere too: the copy would stay")
        return ids, Projection(bmm, b if weights_first else a, weight, weights_first, flip, tuple(chain))

    def replace(self, graph: fx.Graph, match: GroupedMatch) -> dict[fx.Node, fx.Node]:
        ps, old, new = match.projections, [], []
        first = ps[0].bmm  # the earliest (found in graph order): the ids are there, each vector at its own bmm
        perm, offs, valid = replace_by_function(graph, routing, (match.ids, val(ps[0].weight).shape[0]),
                                                outputs=[None, None, None], before=first, origin=first)
        for p in ps:
            old.append(p.bmm)
            new += replace_by_function(graph, project, (p.vector, p.weight, perm, offs, valid, p.weights_first, p.flip),
                                       outputs=[p.bmm], before=p.bmm, origin=p.bmm)
        erase_dead(graph, match.nodes)
        return moved(old, new)


def _gather(node) -> tuple[list[fx.Node], fx.Node, fx.Node, bool] | None:
    """``(chain, W, ids, flip)`` where ``node`` is ``W[ids]`` (``aten.index.Tensor(W, [ids])``), through
    what ``@`` / ``matmul`` put between it and the bmm (an ``expand`` to its own shape, a
    ``transpose(1, 2)``: ``flip``, the pairs' matrices read transposed); ``chain``: those nodes, the gather
    last. Else None."""
    chain, flip = [], False
    if is_op(node, aten.expand) and val(node) is not None and val(node.args[0]) is not None \
            and tuple(val(node).shape) == tuple(val(node.args[0]).shape):
        chain.append(node)
        node = node.args[0]
    if is_op(node, aten.permute) and list(node.args[1]) == [0, 2, 1]:
        chain.append(node)
        node, flip = node.args[0], True
    if not is_op(node, aten.index) or len(node.args) < 2:
        return None
    indices = node.args[1]
    if not isinstance(indices, (list, tuple)) or len(indices) != 1 or not isinstance(indices[0], fx.Node):
        return None
    return [*chain, node], node.args[0], indices[0], flip


def _grouped_mm_refuses(weight, vector) -> str | None:
    """Why torch's grouped GEMM cannot take these operands on their device, or None."""
    if weight.dtype != vector.dtype:
        return f"the weights ({weight.dtype}) and the vectors ({vector.dtype}) differ in dtype"
    if weight.dtype != torch.bfloat16:
        return (f"{weight.dtype} weights: torch's grouped GEMM takes bf16 only (its shape check; on CUDA other "
                "dtypes would run a loop over the experts that syncs with the host)")
    if weight.device.type == "cuda" and any(s * weight.element_size() % 16 for s in weight.shape[1:]):
        return f"rows of {tuple(weight.shape[1:])} bf16 elements are not 16-byte aligned for the grouped GEMM"
    return None


def _grouped_mm(x, w, offs):
    fn = getattr(torch.nn.functional, "grouped_mm", None)
    return fn(x, w, offs=offs) if fn is not None else torch._grouped_mm(x, w, offs=offs)


RANKED_PAIRS = (320, 1280)
"""Pair counts S (a static size; experts E <= 512) whose routing ranks the pairs by a cumulative count per
expert (:func:`ranked`, O(S x E)) instead of sorting them: measured alone (``benchmarks/bench_moe_routing.py``,
H100, torch 2.11, stock Inductor of each form, CUDA-graph replay, 2026-12-07, commit 2095f50,
``benchmarks/results/moe_routing.md``) the count took 6.2 / 8.7 / 11.3 us at 320 pairs with 16 / 64 / 512
experts against the stable sort's 13.4-13.6, and 8.9-20.0 against 35.7-36.4 at 1,280; the sort won at 10
pairs (3.2-3.4 against 5.5-5.8) and at 40,960 (78-81 against 85-449). Between the measured sizes the sort
stays, and a symbolic S keeps the sort (neither form is faster at every measured size)."""


def routing(ids, experts: int):
    """``(perm, offs, valid)``: the pairs sorted by expert id (stable; a negative id read as ``id + E``, as
    the gather reads it), each expert's end offset among them (no host sync) and which pairs' ids lie in
    ``[-E, E)``. Computed once for the projections that gather by ``ids``. An id outside it fails an assert
    where the device checks them (CPU; eager's gather raises) and its rows come out NaN (the grouped GEMM
    leaves rows past the last offset unwritten): never silent garbage. The same ``perm`` whichever of the
    sort or the count (:data:`RANKED_PAIRS`) computes it, for ids in range."""
    valid = (ids >= -experts) & (ids < experts)
    torch._assert_async(valid.all(), "moe_grouped_experts: an expert id outside [-E, E)")
    normal = torch.where(ids < 0, ids + experts, ids)
    pairs = ids.shape[0]
    if isinstance(pairs, int) and RANKED_PAIRS[0] <= pairs <= RANKED_PAIRS[1] and experts <= 512:
        return (*ranked(normal, experts), valid)
    order, perm = torch.sort(normal, stable=True)
    bounds = torch.arange(experts, device=ids.device, dtype=order.dtype)
    return perm, torch.searchsorted(order, bounds, right=True, out_int32=True), valid


def ranked(normal, experts: int):
    """``(perm, offs)`` of :func:`routing` without a sort: a pair's place is the count of pairs of lower
    experts plus its rank among its own expert's pairs (a cumulative count per expert, ``[S, E]``); pairs
    whose id is outside ``[0, E)`` go after the last offset, in pair order (their rows come out NaN)."""
    inside = (normal >= 0) & (normal < experts)
    own = normal.clamp(0, experts - 1)
    hot = (normal[:, None] == torch.arange(experts, device=normal.device)).to(torch.int32)
    seen = hot.cumsum(0)  # [S, E]: each expert's pairs up to here
    counts = seen[-1]
    offs = counts.cumsum(0, dtype=torch.int32)
    place = (offs - counts)[own] + seen.gather(1, own[:, None]).squeeze(1) - 1
    place = torch.where(inside, place.long(), offs[-1].long() + (~inside).long().cumsum(0) - 1)
    arange = torch.arange(normal.shape[0], device=normal.device)
    return torch.empty_like(normal).index_put((place,), arange), offs


def project(vector, weight, perm, offs, valid, weights_first: bool, flip: bool = False):
    """One projection's replacement: ``bmm(weight[ids], vector)`` (``weights_first``; else
    ``bmm(vector, weight[ids])``; ``flip``: of ``weight[ids].transpose(1, 2)``) as a grouped GEMM of the
    sorted pairs, rows back in pair order (NaN where the pair's id is out of range)."""
    weight = weight.transpose(-2, -1) if flip else weight
    rows = vector.squeeze(-1) if weights_first else vector.squeeze(1)  # [S, K]
    # a gather along rows (aten.gather), not rows[perm]: no index of ours for the spec split to look at
    rows = rows.gather(0, perm[:, None].expand(-1, rows.shape[1]))
    got = _grouped_mm(rows, weight.transpose(-2, -1) if weights_first else weight, offs)  # [S, N], sorted
    back = torch.where(valid[:, None], got.new_empty(got.shape).index_put((perm,), got), float("nan"))
    return back.unsqueeze(-1) if weights_first else back.unsqueeze(1)
