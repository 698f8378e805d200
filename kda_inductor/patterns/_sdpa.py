"""The fused attention ops a post-grad graph holds where the user called
``F.scaled_dot_product_attention``, and how to read one: its arguments by name, its mask and its
live outputs. Used by ``gqa_decode_attention`` (the repeat of K / V folded into the query rows)
and ``mla_decode_absorb`` (MLA's expanded K / V replaced by the weight-absorbed attention).
"""

from __future__ import annotations

import operator
from typing import Any

import torch.fx as fx

from kda_inductor.patterns._graph import aten, erase_dead, is_dead, val

_OP_NAMES = ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_fused_attention_overrideable")
SDPA_OPS = tuple(getattr(aten, name).default for name in _OP_NAMES if hasattr(aten, name))
"""The fused attention ops sdpa lowers to; each returns the attention output first."""
MASK_ARGS = ("attn_bias", "attn_mask")
"""The mask's name in each op's schema (flash has none)."""


def bound(node: fx.Node) -> dict[str, Any]:
    """``node``'s arguments by their schema names, defaults filled in."""
    out, args = {}, list(node.args)
    for i, a in enumerate(node.target._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


def mask_of(args: dict[str, Any]) -> fx.Node | None:
    """The attention mask among the op's ``bound`` arguments, or None."""
    return next((args[n] for n in MASK_ARGS if args.get(n) is not None), None)


def getitems(op: fx.Node) -> dict[int, list[fx.Node]]:
    """The op's live ``getitem`` users by output index."""
    items: dict[int, list[fx.Node]] = {}
    for u in op.users:
        if u.op == "call_function" and u.target is operator.getitem and not is_dead(u):
            items.setdefault(u.args[1], []).append(u)
    return items


def sdpa_calls(graph: fx.Graph) -> list[fx.Node]:
    """The graph's fused attention calls (:data:`SDPA_OPS`), in order."""
    return [n for n in graph.nodes if n.op == "call_function" and n.target in SDPA_OPS]


def not_plain(args: dict[str, Any]) -> str | None:
    """Why the ``bound`` arguments are no plain attention a rewrite may restate (dropout, or
    ``is_causal``: with one query token "key 0 only", top-left aligned), or None."""
    if args.get("dropout_p", 0.0) != 0.0:
        return "dropout"
    if args.get("is_causal", False):
        return "is_causal=True (one query token sees key 0 only)"
    return None


def mask_rows(mask: fx.Node | None) -> tuple[Any, Any] | None:
    """``(mask's head dim, its query-row dim)`` with the mask read as 4-D ``[b, h, rows, S]``
    (leading unit dims added); ``(1, 1)`` without a mask; None where it has no such reading."""
    if mask is None:
        return 1, 1
    mv = val(mask)
    if mv is None or mv.dim() > 4:
        return None
    shape = (1,) * (4 - mv.dim()) + tuple(mv.shape)
    return shape[1], shape[2]


def extra_outputs(op: fx.Node) -> list[int]:
    """The op's outputs besides the attention (its logsumexp, ...) that something reads."""
    return sorted(set(getitems(op)) - {0})


def drop_replaced(graph: fx.Graph, op: fx.Node, region: list[fx.Node], outs: tuple[fx.Node, ...]) -> None:
    """After ``outs`` were replaced: the fused op, its unread outputs and the region's dead nodes
    erased. The fused ops are tagged nondeterministic_seeded (their dropout), which fx reads as
    impure, so ``erase_dead`` alone would keep them."""
    for item in [u for u in op.users if not u.users]:
        graph.erase_node(item)
    if not op.users:
        graph.erase_node(op)
        erase_dead(graph, [n for n in region if n is not op and n not in outs])
