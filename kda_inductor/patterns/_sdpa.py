"""The fused attention ops a post-grad graph holds where the user called
``F.scaled_dot_product_attention``, and how to read one: its arguments by name, its mask and its
live outputs. Used by ``gqa_decode_attention`` (the repeat of K / V folded into the query rows)
and ``mla_decode_absorb`` (MLA's expanded K / V replaced by the weight-absorbed attention).
"""

from __future__ import annotations

import operator
from typing import Any

import torch.fx as fx

from kda_inductor.patterns._graph import aten, is_dead

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
