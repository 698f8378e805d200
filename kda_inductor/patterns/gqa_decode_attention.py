"""``gqa_decode_attention``: a decode step's grouped-query attention without the repeated K / V.

Finds (post-grad graph) a fused sdpa op (``_scaled_dot_product_cudnn_attention``,
``_scaled_dot_product_flash_attention``, ``_scaled_dot_product_efficient_attention``,
``_scaled_dot_product_flash_attention_for_cpu``, and XPU's ``..._fused_attention_overrideable``
where this torch has it) whose query ``[B, H, 1, D]`` has one query token and whose key and
value are each a repeat of a ``[B, Hkv, S, D]`` tensor, head ``h * n_rep + r`` reading kv head
``h``: ``unsqueeze(x, 2) -> expand [B, Hkv, n_rep, S, D] -> (clone) -> reshape / view /
_unsafe_view [B, H, S, D]``, the post-grad form of transformers' ``repeat_kv``, of
``x[:, :, None].expand(...).reshape(...)`` and of ``x.repeat_interleave(n_rep, dim=1)`` alike.
transformers hands the fused op the repeat because its mask is materialized under compile
(``use_gqa_in_sdpa`` enables GQA only without a mask, and its one-token ``pack_gqa`` path is
eager only): each decode step copies K and V ``n_rep`` times, the costliest Inductor kernel of
Qwen3-Next's decode step at 128 sequences (~220 of ~2,000 us on an H100, torch 2.11,
transformers 5.17). transformers 5.25 on torch 2.13 skips an all-ones mask under compile and
asks for GQA (no repeat in the graph); a left-padded batch still gets the mask and the repeat.
Kimi Linear's (and DeepSeek's) MLA attention has per-head K / V (``k_pe`` broadcast into a
per-head key, no repeat of kv heads): nothing to fold there (checked on transformers' tiny
Kimi Linear decode: no candidate, no miss). A repeat read elsewhere too stays for its other readers (the attention still reads the
un-repeated K / V).

Must not match (misses at the user's sdpa line): more than one query token (a prefill: the
fold needs one query row per head; logged at DEBUG, ``Stage.INCIDENTAL``), dropout, ``is_causal``
(with one query token it means "key 0 only", top-left aligned: folded, row ``r`` would see
``r + 1`` keys), a key repeated and a value not (or by another count), a mask that does not
broadcast per group, an extra output (the logsumexp) read. ``x.repeat(1, n_rep, 1, 1)`` (head
``r * Hkv + h``: tiled, not interleaved) is no repeat of this form and is left alone; so is the
math backend's decomposed attention (matmul / softmax: no fused op to find).

Speed rule (``speed_rule``): on CUDA at every size (``MEASURED`` True); CPU forced only (not timed).
The fold removes the repeat's write of ``2 x B x H x S x D`` elements and the attention's read of
them (the attention reads ``B x Hkv x S x D`` once per group instead). Measured (H100, torch 2.11,
transformers 5.17, 2026-12-06, commit 8b741ab): the region alone
(``benchmarks/bench_gqa_decode_attention.py``, Qwen3-Next's and Qwen3.5's dims, B 32 / 128,
S 256 / 4096) 21-316 us against stock's 117-1,636 (4.1-10.3x); in the decode step at 128
sequences (``benchmarks/hf_models.py``, 2 compiles each) Qwen3-Next 1,595 against 2,016 us
(0.79x), Qwen3.5 1,673 against 2,020 (0.83x), logits as without it. A copy removed is never
slower, so symbolic sizes keep the rule; the history: ``docs/speed-rules.md``.

Replacement (:func:`folded`): the same attention with the group folded into the query rows: q
viewed ``[B, Hkv, n_rep, D]``, k / v un-repeated, the mask ``[.., 1, 1, S]`` left to broadcast
(or, per head, ``[B, H, 1, S]`` regrouped ``[B, Hkv, n_rep, S]``), the output viewed back to
``[B, H, 1, D]``. It calls ``F.scaled_dot_product_attention``, traced in the graph's fake mode,
so torch's own selection (``sdp_utils``) picks the fused backend for the folded shapes (with
``n_rep`` query rows every backend is legal where it was for one); the scale is the user's (the
head dim is unchanged). Attention rows are independent, so the result is eager's up to the
backend's own rounding (a kernel tiles ``n_rep`` rows differently from one). Turn it off with
``options={"kda": {"disable": ["gqa_decode_attention"]}}``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

from kda_inductor.lowerings import gqa_decode_attention as _lowering  # noqa: F401  (registers the op)
from kda_inductor.patterns._sdpa import (
    bound,
    drop_replaced,
    extra_outputs,
    getitems,
    mask_of,
    mask_rows,
    not_plain,
    sdpa_calls,
)
from kda_inductor.patterns.base import VIEWS, Match, Rewrite, Stage, aten, is_op, moved, replace_by_function, val

KERNEL_MEASURED: dict[str, bool] = {"cuda": True}
"""Device types where our decode kernel (``kda::gqa_decode_attention``: the keys split over programs, each
kv head's rows at once) replaces the folded sdpa: CUDA, from the step (H100, torch 2.11, 2026-12-07, commit
1cd46cc, ``benchmarks/hf_models.py`` ``kda@with-gqa_decode_kernel``): Qwen3-Next decode 32 944 against
960 us, and with ``moe_routing`` 900 against 920 (0.98x twice); the op alone ties cuDNN's folded sdpa
(13.2-54.7 against 14.2-54.8 us, ``benchmarks/results/gqa_decode_attention.md``); CPU: the op
is torch's sdpa there, not timed. Float32 and heads
over 256 wide run torch's sdpa inside the op."""

MEASURED = True
"""Whether the fold was measured faster than stock Inductor's code on CUDA: yes (H100, 2026-12-06,
commit 8b741ab): alone 4.1-10.3x (``benchmarks/bench_gqa_decode_attention.py``), in Qwen3-Next's /
Qwen3.5's decode step at 128 sequences 0.79x / 0.83x (``benchmarks/hf_models.py``'s
``kda@with-gqa_decode_attention`` against ``kda`` before the flip; now ``kda-no-gqa_decode_attention``)."""


@dataclasses.dataclass(frozen=True)
class _Repeat:
    """``node`` is ``src`` [B, Hkv, S, D] with each head repeated ``n_rep`` times in place."""

    src: fx.Node
    n_rep: int
    nodes: tuple[fx.Node, ...]


@dataclasses.dataclass(frozen=True)
class FoldMatch(Match):
    """One decode attention: the fused op, its output, the un-repeated K / V and the rest of
    its arguments."""

    op: fx.Node
    outs: tuple[fx.Node, ...]
    query: fx.Node
    key: fx.Node
    value: fx.Node
    mask: fx.Node | None
    n_rep: int
    scale: float | None
    per_head_mask: bool

    @property
    def anchor(self) -> fx.Node:
        return self.op

    def repeated_bytes(self) -> int | None:
        """Bytes the repeats write (K and V, ``B x H x S x D`` each): what the fold saves twice
        (written, then read by the attention); None for symbolic sizes."""
        k, q = val(self.key), val(self.query)
        sizes = (q.shape[0], q.shape[1], k.shape[2], k.shape[3])
        if not all(isinstance(s, int) for s in sizes):
            return None
        b, h, s, d = sizes
        return 2 * b * h * s * d * k.element_size()


def _known(x: Any) -> bool:
    return bool(statically_known_true(x))


def _same_sizes(a, b) -> bool:
    return len(a) == len(b) and all(_known(x == y) for x, y in zip(a, b))


def repeated(node: fx.Node) -> _Repeat | None:
    """``node`` as a repeat of a ``[B, Hkv, S, D]`` tensor along its heads, head ``h * n_rep
    + r`` reading head ``h`` (``unsqueeze(2) -> expand -> (clone) -> reshape``), else None."""
    if not is_op(node, *VIEWS):
        return None
    chain = [node]
    x = node.args[0]
    if is_op(x, aten.clone):
        chain.append(x)
        x = x.args[0]
    if not is_op(x, aten.expand):
        return None
    chain.append(x)
    ev, inner = val(x), x.args[0]
    iv, out = val(inner), val(node)
    if iv is None or ev is None or out is None or iv.dim() != 5 or ev.dim() != 5 or out.dim() != 4:
        return None
    n_rep = ev.shape[2]
    if not (_known(iv.shape[2] == 1) and isinstance(n_rep, int) and n_rep > 1):
        return None
    if not (_same_sizes(iv.shape[:2] + iv.shape[3:], ev.shape[:2] + ev.shape[3:])
            and _same_sizes(out.shape, (ev.shape[0], ev.shape[1] * n_rep, ev.shape[3], ev.shape[4]))):
        return None
    src = _unit_dim_source(inner)
    return None if src is None else _Repeat(src, n_rep, (*chain, inner))


def _unit_dim_source(inner: fx.Node) -> fx.Node | None:
    """The 4-D tensor that ``inner`` [B, Hkv, 1, S, D] is with a unit dim inserted at 2."""
    if is_op(inner, aten.unsqueeze):
        src = inner.args[0]
        return src if inner.args[1] % 5 == 2 and val(src) is not None and val(src).dim() == 4 else None
    if is_op(inner, *VIEWS):
        src, iv = inner.args[0], val(inner)
        sv = val(src)
        if sv is not None and sv.dim() == 4 and _same_sizes(sv.shape, iv.shape[:2] + iv.shape[3:]):
            return src
    return None


class GqaDecodeAttention(Rewrite):
    name = "gqa_decode_attention"
    finds = ("a decode step's grouped-query attention (one query token) fed a `repeat_kv` of K and V "
             "(transformers' hybrid models)")
    spellings = (
        "one query token (`q [B, H, 1, D]`) into a fused sdpa op (cuDNN, flash, efficient, CPU flash) whose "
        "key and value are each `[B, Hkv, S, D]` repeated per head (transformers' `repeat_kv`: `x[:, :, None]"
        ".expand(...).reshape(...)`, `repeat_interleave(n_rep, dim=1)`), with a float or bool mask broadcast "
        "over heads (`[B, 1, 1, S]`), a per-head mask (`[B, H, 1, S]`, regrouped) or none; on CUDA at every "
        "size (measured 4-10x faster alone, 0.79-0.83x the decode step at 128 sequences), CPU forced only"
    )
    becomes = ("the same attention on `q` viewed `[B, Hkv, n_rep, D]` and the un-repeated K / V: on CUDA "
               "`kda::gqa_decode_attention` (our flash-decoding kernel; bf16 / fp16), elsewhere torch's sdpa")

    def speed_rule(self, match: FoldMatch) -> str | None:
        if match.device == "cuda" and MEASURED:
            return None
        saved = match.repeated_bytes()
        size = "" if saved is None else f" (here {saved / 1e6:.1f} MB written, then read)"
        return (f"not measured on {match.device} (CUDA only): forced only; the fold saves the repeat of K and V, "
                f"2 x B x H x S x D elements written and read back by the attention{size} "
                "(benchmarks/bench_gqa_decode_attention.py; MEASURED in patterns/gqa_decode_attention.py)")

    def find(self, graph: fx.Graph) -> list[Match]:
        return [m for m in map(self._fold, sdpa_calls(graph)) if m is not None]

    def _fold(self, op: fx.Node) -> FoldMatch | None:
        a = bound(op)
        rk, rv = repeated(a["key"]), repeated(a["value"])
        if rk is None and rv is None:
            return None  # no repeated heads: multi-head attention, nothing to fold
        if rk is None or rv is None or rk.n_rep != rv.n_rep:
            return self.miss(op, Stage.PIECES, "only one of key and value is a repeat of its kv heads "
                             "(or by another count): the fold needs both un-repeated")
        qv = val(a["query"])
        if qv is None or qv.dim() != 4 or not _known(qv.shape[1] == val(a["key"]).shape[1]):
            return self.miss(op, Stage.FORM, "the query is not [B, H, L, D] with the repeated heads")
        if not _known(qv.shape[2] == 1):
            return self.miss(op, Stage.INCIDENTAL, f"{qv.shape[2]} query tokens: folding the group into the "
                             "query rows needs one query token per sequence (decode)")
        why = not_plain(a)
        if why:
            return self.miss(op, Stage.VALUES, f"{why}: the folded rows would attend differently")
        mask = mask_of(a)
        per_head = self._per_head(op, mask, qv.shape[1])
        if per_head is None:
            return None
        items = getitems(op)
        if extra_outputs(op):
            return self.miss(op, Stage.REGION, f"outputs {extra_outputs(op)} of {op.target.__name__} "
                             "(its logsumexp) are read: the fold would have to regroup them")
        if 0 not in items:
            return None  # the attention's output is not read
        outs = tuple(items[0])  # one getitem, or several where nothing CSE'd them yet
        return FoldMatch(nodes=[op, *outs, *rk.nodes, *rv.nodes], op=op, outs=outs, query=a["query"], key=rk.src,
                         value=rv.src, mask=mask, n_rep=rk.n_rep, scale=a.get("scale"), per_head_mask=per_head)

    def _per_head(self, op: fx.Node, mask: fx.Node | None, heads) -> bool | None:
        """Whether ``mask`` has one row per head (regrouped) rather than one for all heads
        (broadcast); None with a miss where it is neither."""
        dims = mask_rows(mask)
        if dims is None or not _known(dims[1] == 1):
            return self.miss(op, Stage.LAYOUT, "the mask is not [.., heads, 1, S]: it does not broadcast per group")
        if _known(dims[0] == 1):
            return False
        if _known(dims[0] == heads):
            return True
        return self.miss(op, Stage.LAYOUT, f"the mask's head dim ({dims[0]}) is neither 1 nor the {heads} "
                         "query heads: it does not regroup per kv head")

    def replace(self, graph: fx.Graph, match: FoldMatch) -> dict[fx.Node, fx.Node]:
        m = match
        args = (m.query, m.key, m.value, m.mask, m.n_rep, m.scale, m.per_head_mask, len(m.outs),
                bool(KERNEL_MEASURED.get(m.device)))
        new = replace_by_function(graph, folded, args, outputs=list(m.outs), before=m.op, region=m.nodes, origin=m.op)
        drop_replaced(graph, m.op, m.nodes, m.outs)  # the fused op, then the repeats
        return moved(list(m.outs), new)


def folded(query, key, value, mask, n_rep, scale, per_head_mask, readers=1, kernel=False):
    """The replacement: ``query [B, H, 1, D]`` as ``n_rep`` query rows of each kv head of ``key``
    / ``value [B, Hkv, S, D]`` (head ``h * n_rep + r`` -> kv head ``h``, row ``r``), the output
    viewed back to ``[B, H, 1, D]`` (once for each of the op's ``readers`` of it); attended by
    torch's sdpa, or with ``kernel`` by ``kda::gqa_decode_attention`` (the same computation)."""
    q = query.unflatten(1, (-1, n_rep)).squeeze(3)  # [B, Hkv, n_rep, D]
    if mask is not None:
        mask = mask[(None,) * (4 - mask.dim())]  # [b, h, 1, s]
        if per_head_mask:
            mask = mask.unflatten(1, (-1, n_rep)).squeeze(3)  # [b, Hkv, n_rep, s]
    if kernel:
        out = torch.ops.kda.gqa_decode_attention(q, key, value, mask, scale)
    else:
        out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scale)
    return (out.unsqueeze(3).flatten(1, 2),) * readers  # [B, H, 1, D]
