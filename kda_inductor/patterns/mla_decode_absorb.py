"""``mla_decode_absorb``: a decode step's multi-head latent attention (MLA) without the expanded K / V.

Finds (post-grad graph) a fused sdpa op (the ops of ``_sdpa.SDPA_OPS``) with one query token
(``query [B, H, 1, dn + dr]``) whose value and the first ``dn`` features of whose key are slices
of ONE expansion of cached latents: ``kv_b_proj(c)``, an ``mm`` of ``c [B * S, r]`` (the
``kv_a_layernorm``-ed latents ``[B, 1, S, r]`` of every cached token, flattened) by a weight
``W^T [r, H * (dn + dv)]``, viewed ``[B, S, H, dn + dv]``, heads moved before tokens
(``transpose(1, 2)``), split into ``k_nope [B, H, S, dn]`` and ``value [B, H, S, dv]``
(``torch.split`` or slices); the key's other ``dr`` features are one ``k_rot [B, 1, S, dr]``
broadcast over the heads (``expand``). The key is built as transformers 5.25 writes it
(``new_empty`` and two ``copy_`` into slices: ``slice_scatter`` of ``copy`` post-grad) or with
``torch.cat`` (older versions), its two parts in either order. That is transformers'
``expand_kv`` of Kimi Linear's ``KimiLinearAttention`` and of DeepSeek-V2 / V3 / V3.2's,
GLM-MoE-DSA's and Bailing-hybrid's MLA: every decode step re-expands the whole compressed cache
(``H x (dn + dv)`` values per token written, then read) and builds the key (``H x (dn + dr)``
more). On an H100 (Kimi Linear's decode step at 128 sequences x 256 cached tokens, torch 2.11)
that is ~945 us per MLA layer (the kv_b GEMM 425, the key's build 223, cuDNN's attention 297)
of a 2,535 us step.

Must not match (misses at the user's sdpa line): more than one query token (a prefill: absorbing
pays only where each cached token is read by few queries; logged at DEBUG, ``Stage.INCIDENTAL``),
a key not made of that expansion's other slice and one broadcast ``k_rot`` (another
projection, a rope part per head), a ``kv_b_proj`` with a bias (``addmm``: not handled), dropout,
``is_causal`` (one query token would see key 0 only), the logsumexp output read, a mask that is
not one row per sequence or per head (``[B, 1, 1, S]`` / ``[B, H, 1, S]`` or broadcasts of them),
and an expanded K / V read elsewhere too (a cache storing the expanded key: absorbing would no
longer compute it, and recomputing it saves nothing).

Speed rule (``speed_rule``): on CUDA at every size (``MEASURED``): it removes a write and a read of
the whole expanded cache, never slower; measured (H100, 2026-12-07, 1cd46cc) 10.9x / 16.7x stock alone
at Kimi Linear's dims (B 32 / 128, S 256), 0.68x kda's decode-128 step without it. CPU forced only
(not timed). ``benchmarks/bench_mla_decode_absorb.py`` times it; the history: ``docs/speed-rules.md``.

Replacement (:func:`absorbed`): weight absorption (DeepSeek-V2; FlashMLA and vLLM's MLA backend
serve it). With ``W`` viewed ``[H, dn + dv, r]``, ``W_UK = W[:, :dn]``, ``W_UV = W[:, dn:]``:
``q_lat = q_nope @ W_UK [B, H, r]``; ``scores = scale * (q_lat . c + q_rope . k_rot)`` (+ mask),
one bmm over the latents shared by all heads (MQA: no expand copies); softmax in float32;
``o_lat = p @ c [B, H, r]``; ``out = o_lat @ W_UV^T``, returned ``[B, H, 1, dv]`` as sdpa's
output was. It reads the compressed cache twice instead of materializing the expansion. Another
summation order than eager's: equal within the dtype's rounding, not bit for bit. Turn it off
with ``options={"kda": {"disable": ["mla_decode_absorb"]}}``.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from kda_inductor.patterns import _sdpa as sdpa
from kda_inductor.patterns._graph import escaping
from kda_inductor.patterns.base import VIEWS, Match, Rewrite, Stage, aten, is_op, moved, replace_by_function, val

MEASURED: dict[str, bool] = {"cuda": True}
"""Device types where the absorbed attention was measured faster than stock Inductor's code for the
expansion and the attention: CUDA (H100, torch 2.11, 2026-12-07, commit 1cd46cc): alone 22.2 / 54.1 us
against stock's 241.1 / 902.8 at Kimi Linear's dims, B 32 / 128, S 256 (``benchmarks/bench_mla_decode_absorb.py``);
in Kimi Linear's decode-128 step 1,769 against 2,610 us (0.68x, ``benchmarks/hf_models.py``
``kda@with-mla_decode_absorb``). CPU: not timed, forced only."""
BENCHMARK = "benchmarks/bench_mla_decode_absorb.py"
_END = 2 ** 62  # a slice's end at or past this is "to the end"


def _known(x: Any) -> bool:
    return bool(statically_known_true(x))


def _last_dim(dim: int, node: fx.Node) -> bool:
    v = val(node)
    return v is not None and dim % v.dim() == v.dim() - 1


@dataclasses.dataclass(frozen=True)
class _Slice:
    """``node`` is features ``[lo, hi)`` of ``mm`` viewed ``[B, S, H, E]`` with heads before tokens."""

    mm: fx.Node
    lo: int
    hi: int
    nodes: tuple[fx.Node, ...]
    heads: tuple[int, Any]  # (H, E): how the mm's columns split into heads


def _feature_slice(node: fx.Node) -> tuple[fx.Node, int, int, list[fx.Node]] | None:
    """``(source, lo, hi, nodes)`` where ``node`` is ``source[..., lo:hi]`` (a slice, or one output
    of a split along the last dim)."""
    if is_op(node, aten.slice) and _last_dim(node.args[1] if len(node.args) > 1 else 0, node.args[0]):
        src, (start, end, step) = node.args[0], (list(node.args[2:5]) + [None, None, 1][len(node.args[2:5]):])
        width = val(src).shape[-1]
        if step != 1 or not isinstance(width, int):
            return None
        lo, hi = start or 0, width if end is None or end >= _END else min(end, width)
        return src, lo, hi, [node]
    if node.op != "call_function" or node.target is not operator.getitem:
        return None
    split, i = node.args
    if not is_op(split, aten.split_with_sizes, aten.split) or not _last_dim(split.args[2] if len(split.args) > 2
                                                                              else 0, split.args[0]):
        return None
    sizes = split.args[1]
    if isinstance(sizes, int):  # split.Tensor: equal pieces, the last one shorter
        sizes = [sizes] * (i + 1)
    if not all(isinstance(s, int) for s in sizes[: i + 1]):
        return None
    return split.args[0], sum(sizes[:i]), sum(sizes[: i + 1]), [node, split]


def expanded(node: fx.Node) -> _Slice | None:
    """``node`` as ``mm.view(B, S, H, E).transpose(1, 2)[..., lo:hi]`` (transformers' ``expand_kv``:
    ``kv_b_proj`` of the latents of every cached token, heads moved before tokens, split), else None."""
    sliced = _feature_slice(node)
    if sliced is None:
        return None
    p, lo, hi, nodes = sliced
    heads_first = (is_op(p, aten.permute) and [d % 4 for d in p.args[1]] == [0, 2, 1, 3]) or (
        is_op(p, aten.transpose) and sorted(d % 4 for d in p.args[1:3]) == [1, 2])
    if not heads_first:
        return None
    x, chain = p.args[0], [p]
    while is_op(x, *VIEWS):
        chain.append(x)
        x = x.args[0]
    xv, pv, mv = val(p.args[0]), val(p), val(x)
    if not is_op(x, aten.mm, aten.addmm) or xv is None or pv is None or mv is None or xv.dim() != 4 or mv.dim() != 2:
        return None
    b, s, h, e = xv.shape
    if not (_known(mv.shape[0] == b * s) and _known(mv.shape[1] == h * e) and isinstance(h, int)):
        return None
    return _Slice(x, lo, hi, (*nodes, *chain, x), (h, e))


def _pieces(node: fx.Node, nodes: list[fx.Node]) -> list[tuple[int, int, fx.Node]] | None:
    """``node``'s last dim as ``(lo, hi, source)`` pieces, each written once: a ``cat`` along it, or
    ``slice_scatter`` of (``copy`` into) slices of a fresh ``empty`` (``new_empty`` + ``copy_``)."""
    nodes.append(node)
    if is_op(node, aten.cat) and _last_dim(node.args[1] if len(node.args) > 1 else 0, node):
        out, at = [], 0
        for t in node.args[0]:
            w = val(t).shape[-1]
            out.append((at, at + w, t))
            at += w
        return out
    if is_op(node, aten.empty, aten.empty_like, aten.new_empty):
        return []
    if not is_op(node, aten.slice_scatter):
        return None
    base, src, dim, start, end, step = (list(node.args) + [0, None, None, 1][len(node.args) - 2:])[:6]
    width = val(node).shape[-1]
    if not _last_dim(dim, node) or step != 1 or not isinstance(width, int):
        return None
    lo, hi = start or 0, width if end is None or end >= _END else min(end, width)
    inner = _pieces(base, nodes)
    if inner is None or any(a < hi and lo < b for a, b, _ in inner):
        return None  # a feature written twice
    if is_op(src, aten.copy):
        nodes += [src, src.args[0]]
        src = src.args[1]  # copy_ into the slice: the source, broadcast to the slice's shape
    return sorted([*inner, (lo, hi, src)], key=lambda p: p[0])


def _broadcast_rot(node: fx.Node, b, s) -> tuple[fx.Node, list[fx.Node]] | None:
    """``(k_rot, nodes)`` where ``node`` is one ``k_rot [B, 1, S, dr]`` broadcast over the heads."""
    nodes = []
    if is_op(node, aten.expand):
        nodes.append(node)
        node = node.args[0]
    v = val(node)
    if v is None or v.dim() != 4 or not (_known(v.shape[0] == b) and _known(v.shape[1] == 1)
                                         and _known(v.shape[2] == s)):
        return None
    return node, nodes


@dataclasses.dataclass(frozen=True)
class AbsorbMatch(Match):
    """One MLA decode attention: the fused op, its output readers, the latents, the weight and
    where each part of the query, key and value sits in it."""

    op: fx.Node
    outs: tuple[fx.Node, ...]
    query: fx.Node
    latents: fx.Node  # c [B * S, r]: the mm's input
    weight_t: fx.Node  # W^T [r, H * (dn + dv)]: the mm's weight
    rot: fx.Node  # k_rot [B, 1, S, dr]
    mask: fx.Node | None
    key_nope: tuple[int, int]  # k_nope's features in each head's row of W^T (and in the key: at q_nope)
    value: tuple[int, int]  # the value's features in each head's row of W^T
    q_nope: int  # where k_nope starts in the key's (and the query's) features
    q_rope: int  # where k_rot starts there
    scale: float | None

    @property
    def anchor(self) -> fx.Node:
        return self.op


class MlaDecodeAbsorb(Rewrite):
    name = "mla_decode_absorb"
    finds = ("a decode step's MLA attention (one query token) fed K / V expanded from the whole latent cache by "
             "`kv_b_proj` every step (transformers' Kimi Linear, DeepSeek-V3 / V3.2)")
    spellings = (
        "one query token (`q [B, H, 1, dn + dr]`) into a fused sdpa op (cuDNN, flash, efficient, CPU flash) whose "
        "value and key's `k_nope` are the two slices (`torch.split` or slicing) of `kv_b_proj(c).view(B, S, H, dn + dv)"
        ".transpose(1, 2)`, one `mm` of the latents `c [B, 1, S, r]` (no bias), and whose key's rope part is "
        "`k_rot [B, 1, S, dr]` expanded over the heads: the key built by `new_empty` + two `copy_` into slices "
        "(transformers 5.25's `expand_kv`) or by `torch.cat`, either part first; a float or bool mask `[B, 1, 1, S]`, "
        "per head `[B, H, 1, S]`, or none; the expanded K / V read by the attention only; forced only (not yet "
        "measured)"
    )
    becomes = ("weight absorption in plain torch ops: `q_nope @ W_UK` per head, scores against the latents (one bmm, "
               "all heads sharing them) plus `q_rope . k_rot`, float32 softmax, `p @ c`, then `@ W_UV^T` per head: "
               "the cache read twice, no expansion; no kernel of ours")

    def speed_rule(self, match: AbsorbMatch) -> str | None:
        if MEASURED.get(match.device):
            return None
        return (f"not measured on {match.device}: forced only ({BENCHMARK} decides; MEASURED in "
                "patterns/mla_decode_absorb.py); "
                "absorbing removes the expansion of every cached token's latents into H x (dn + dv) values and the "
                "key's build, and reads the latents twice instead")

    def find(self, graph: fx.Graph) -> list[Match]:
        return [m for m in map(self._absorb, sdpa.sdpa_calls(graph)) if m is not None]

    def _absorb(self, op: fx.Node) -> AbsorbMatch | None:
        a = sdpa.bound(op)
        value = expanded(a["value"])
        if value is None:
            return None  # the value is no slice of an expansion of latents: no MLA attention
        qv, kv = val(a["query"]), val(a["key"])
        if qv is None or qv.dim() != 4 or kv is None or kv.dim() != 4 or not _known(qv.shape[1] == value.heads[0]):
            return None  # not one query head per expanded head
        if not _known(qv.shape[2] == 1):
            return self.miss(op, Stage.INCIDENTAL, f"{qv.shape[2]} query tokens: absorbing the weights pays for "
                             "one query token per sequence (decode); a prefill reads each expanded token many times")
        key = self._key(op, a["key"], value)
        if key is None or not self._plain(op, a, value.mm):
            return None
        nope, rot, nope_at, rot_at, key_nodes = key
        mask = sdpa.mask_of(a)
        outs = self._outs(op) if self._mask_fits(op, mask, qv.shape[1]) else None
        if outs is None:
            return None
        region = list(dict.fromkeys([op, *outs, *key_nodes, *nope.nodes, *value.nodes]))
        leaking = escaping(region, outs)
        if leaking:
            return self.miss(op, Stage.REGION, f"the expanded K / V ({leaking[0].name}) is read elsewhere too "
                             "(e.g. a cache storing it): absorbing would no longer compute it")
        mm = value.mm
        return AbsorbMatch(nodes=region, op=op, outs=outs, query=a["query"], latents=mm.args[0], weight_t=mm.args[1],
                           rot=rot, mask=mask, key_nope=(nope.lo, nope.hi), value=(value.lo, value.hi),
                           q_nope=nope_at, q_rope=rot_at, scale=a.get("scale"))

    def _key(self, op: fx.Node, key: fx.Node, value: _Slice):
        """``(k_nope slice, k_rot, where each starts in the key, nodes)``: the key as the value's
        expansion's other slice beside one broadcast ``k_rot``; None with a miss where it is not."""
        nodes: list[fx.Node] = []
        pieces = _pieces(key, nodes)
        width = val(key).shape[-1]
        if pieces is None or len(pieces) != 2 or pieces[0][0] != 0 or pieces[0][1] != pieces[1][0] \
                or pieces[1][1] != width:
            return self.miss(op, Stage.PIECES, "the key is not built of two parts along its features (`cat`, or "
                             "`new_empty` + two `copy_` into slices): no k_nope + k_rot key")
        b, s = val(key).shape[0], val(key).shape[2]
        for (lo, _, src), (rot_lo, _, rot_src) in (pieces, pieces[::-1]):
            nope, rot = expanded(src), _broadcast_rot(rot_src, b, s)
            if nope is not None and nope.mm is value.mm and nope.heads == value.heads and rot is not None:
                return nope, rot[0], lo, rot_lo, [*nodes, *rot[1]]
        return self.miss(op, Stage.PIECES, "the key is not the value's kv_b_proj expansion (its other slice) "
                         "beside one k_rot [B, 1, S, dr] broadcast over the heads: absorbing needs both from the "
                         "same latents")

    def _plain(self, op: fx.Node, a: dict[str, Any], mm: fx.Node) -> bool:
        """No bias on ``kv_b_proj``, no dropout, no ``is_causal``; False with a miss otherwise."""
        if is_op(mm, aten.addmm):
            return bool(self.miss(op, Stage.VALUES, "kv_b_proj has a bias (addmm): not absorbed"))
        why = sdpa.not_plain(a)
        if why:
            return bool(self.miss(op, Stage.VALUES, f"{why}: the absorbed attention has no such form"))
        return True

    def _mask_fits(self, op: fx.Node, mask: fx.Node | None, heads) -> bool:
        """``mask`` is none, or one row of keys per sequence or per head; False with a miss otherwise."""
        dims = sdpa.mask_rows(mask)
        if dims is not None and _known(dims[1] == 1) and (_known(dims[0] == 1) or _known(dims[0] == heads)):
            return True
        return bool(self.miss(op, Stage.LAYOUT, "the mask is not [B, 1 or heads, 1, S]: no row per head to add to "
                              "the absorbed scores"))

    def _outs(self, op: fx.Node) -> tuple[fx.Node, ...] | None:
        """The readers of the attention's output; None (a miss where the logsumexp is read) otherwise."""
        if sdpa.extra_outputs(op):
            return self.miss(op, Stage.REGION, f"outputs {sdpa.extra_outputs(op)} of {op.target.__name__} "
                             "(its logsumexp) are read: the absorbed attention does not make them")
        items = sdpa.getitems(op)
        return tuple(items[0]) if 0 in items else None

    def replace(self, graph: fx.Graph, match: AbsorbMatch) -> dict[fx.Node, fx.Node]:
        m = match
        args = (m.query, m.latents, m.weight_t, m.rot, m.mask, m.key_nope, m.value, m.q_nope, m.q_rope, m.scale,
                len(m.outs))
        new = replace_by_function(graph, absorbed, args, outputs=list(m.outs), before=m.op, region=m.nodes,
                                  origin=m.op)
        sdpa.drop_replaced(graph, m.op, m.nodes, m.outs)  # the fused op, then the expansion
        return moved(list(m.outs), new)


def absorbed(query, latents, weight_t, rot, mask, key_nope, value, q_nope, q_rope, scale, readers=1):
    """The replacement: ``query [B, H, 1, D]`` against the latents ``[B * S, r]`` and ``k_rot [B, 1, S,
    dr]`` through the absorbed weights (``weight_t [r, H * E]``: each head's ``E`` features hold
    ``k_nope`` at ``key_nope`` and the value at ``value``); the output ``[B, H, 1, dv]`` (once for
    each of the op's ``readers`` of it)."""
    b, h, _, d = query.shape
    r, dr = latents.shape[-1], rot.shape[-1]
    c = latents.reshape(b, -1, r)  # [B, S, r]
    w = weight_t.reshape(r, h, -1).permute(1, 0, 2)  # [H, r, E]
    q = query.squeeze(2).transpose(0, 1)  # [H, B, D]
    q_lat = torch.bmm(q[..., q_nope:q_nope + key_nope[1] - key_nope[0]],
                      w[..., key_nope[0]:key_nope[1]].transpose(1, 2))  # [H, B, r]
    # scores kept [B, S, H] (keys down the rows): every GEMM operand's rows start 16-byte aligned
    # whatever S is. A decode step's S (the cache + the new token) is odd; as [B, H, S] rows, cuBLAS
    # ran its unaligned kernels in Kimi Linear's decode-128 step (S 257, H100, hf_models.md's 1cd46cc /
    # bef5211 kernel tables): 66 us for the two score GEMMs and 37 for p @ c, where the whole absorbed
    # attention takes 54 alone at S 256 (benchmarks/results/mla_decode_absorb.md)
    scores = _float_bmm(c, q_lat.permute(1, 2, 0))  # [B, S, H]: all heads share c
    q_r = q[..., q_rope:q_rope + dr].permute(1, 2, 0)  # [B, dr, H]
    scores = scores + _float_bmm(rot.reshape(b, -1, dr), q_r)
    scores = scores * (d ** -0.5 if scale is None else scale)
    if mask is not None:
        m = mask[(None,) * (4 - mask.dim())][:, :, 0].transpose(1, 2)  # [b, S, h]
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m
    p = torch.softmax(scores, dim=1).to(query.dtype)
    o_lat = torch.bmm(p.transpose(1, 2), c)  # [B, H, r]
    out = torch.bmm(o_lat.transpose(0, 1), w[..., value[0]:value[1]])  # [H, B, dv]
    return (out.transpose(0, 1).unsqueeze(2),) * readers


def _float_bmm(a, b):
    """``a @ b`` as float32 scores, not rounded to the inputs' dtype (eager's attention keeps its
    scores in float32): CUDA's ``bmm`` with ``out_dtype`` where this torch has it (no float32 copy
    of the cache), else on float32 copies."""
    if a.dtype != torch.float32 and a.device.type == "cuda" and hasattr(torch.ops.aten.bmm, "dtype"):
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float())
