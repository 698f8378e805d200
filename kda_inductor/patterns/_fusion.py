"""What Inductor fuses around a match, read for the speed rules (re-exported by
:mod:`kda_inductor.patterns.base`): a fused op that materializes a value Inductor would have kept
in registers, or that breaks a fusion Inductor would have made, can slow the step it sits in
(``docs/speed-rules.md``, "In context"). Used by ``gated_norm_merge`` (:func:`inline_producer`,
:func:`fused_consumer_reduction`), ``gdn_spec_split`` and ``indexer_k_gather``
(:func:`fused_into_users`), ``indexer_k_gather`` and ``indexer_k_write`` (:func:`cpu_min_count_rule`),
``causal_conv1d`` and ``gdn_recurrent_step`` (:func:`cuda_min_count_rule`)."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from kda_inductor.patterns._graph import SHAPE_VIEWS, aten, is_op, prims

def cpu_min_count_rule(count: Any, minimum: int, unit: str, pattern_file: str) -> str | None:
    """The CPU speed rule of an op measured faster than Inductor's C++ only from ``minimum``
    ``unit`` on: why a match of ``count`` is left to Inductor, or None. A symbolic count is
    left to Inductor (the graph serves the small sizes too)."""
    where = f"measured, see patterns/{pattern_file}"
    if not isinstance(count, int):
        return f"on cpu the op is faster only from {minimum} {unit}, and this graph's count is symbolic ({where})"
    if count < minimum:
        return f"on cpu the op is slower than Inductor's code below {minimum} {unit} (this one: {count}; {where})"
    return None


def cuda_min_count_rule(count: Any, minimum: int, unit: str, pattern_file: str, *,
                        faster_than: str = "Inductor's code") -> str | None:
    """The CUDA speed rule of an op measured faster than ``faster_than`` only from ``minimum``
    ``unit`` on (1: at every size): why a match of ``count`` is left to Inductor, or None."""
    if minimum > 1 and not (isinstance(count, int) and count >= minimum):
        return (f"on cuda the op is faster than {faster_than} from {minimum} {unit} (this one: {count}; "
                f"measured, see patterns/{pattern_file})")
    return None


def fused_into_users(n: fx.Node) -> bool:
    """Every (transitive, through views) user of ``n`` is elementwise or a gather: Inductor
    reads ``n``'s elements inside those kernels (an indexed load) and never writes ``n`` out,
    so an op that materializes ``n`` adds a copy (the speed rules of the gathers)."""
    stack, seen = list(n.users), set()
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.op != "call_function":
            return False
        if is_op(u, *SHAPE_VIEWS, aten.expand):
            stack.extend(u.users)
            continue
        tags = getattr(u.target, "tags", ())
        if not (torch.Tag.pointwise in tags or is_op(u, aten.index, aten.where)):
            return False
    return True


_FUSED_INTO_READERS = (
    aten.alias, aten.clone, aten.permute, aten.expand, aten.slice, aten.select, aten.index, aten.cat,
    aten.where, aten.select_scatter, aten.slice_scatter, aten.constant_pad_nd, aten._to_copy,
    prims.convert_element_type, aten.full, aten.zeros, aten.scalar_tensor, aten.arange, prims.iota,
)
"""Ops Inductor generates inside the kernels that read their values (besides those tagged
pointwise): casts, copies and rearrangements, gathers, fills."""
_SPLITS = (aten.split, aten.split_with_sizes, aten.unbind, aten.chunk, aten.unsafe_split)


def inline_producer(n: Any) -> fx.Node | None:
    """The node whose code Inductor emits inside the kernels that read ``n`` (a pointwise op, a
    cast, a copy or rearrangement, a gather), reached from ``n`` through views and splits; None
    where ``n``'s value is a buffer Inductor writes out in any case: a graph input or constant,
    a reduction, the output of an op that runs as a kernel of its own (a matmul, a convolution, a
    custom op, a scatter, a sort). A fused op that reads an inline producer's value makes Inductor
    write it out first, which moves that code into another kernel: the speed rules in context
    (``speed_rule``) read this to judge a rewrite by the step it sits in."""
    while isinstance(n, fx.Node) and n.op == "call_function":
        if is_op(n, *SHAPE_VIEWS):
            n = n.args[0]
        elif n.target is operator.getitem and is_op(n.args[0], *_SPLITS):
            n = n.args[0].args[0]
        else:
            tags = getattr(n.target, "tags", ())
            return n if torch.Tag.pointwise in tags or is_op(n, *_FUSED_INTO_READERS) else None
    return None


_REDUCTIONS = (aten.amax, aten.amin, aten.max, aten.min, aten.sum, aten.mean, aten.var, aten.prod)


def fused_consumer_reduction(n: fx.Node, limit: int = 24) -> fx.Node | None:
    """A reduction that reads ``n``'s values through views, casts and pointwise code (a dynamic
    quantization's ``amax(|y|)`` over the norm's rows), which Inductor fuses, with that code, into
    the kernel that computes ``n`` when ``n`` is its own reduction over the same rows; None where
    no reduction reads it so (a matmul, an output). A fused op that writes ``n`` breaks that
    fusion: the speed rules in context read this."""
    stack, seen = list(n.users), set()
    while stack and len(seen) < limit:
        u = stack.pop()
        if u in seen or u.op != "call_function":
            continue
        seen.add(u)
        if is_op(u, *_REDUCTIONS):
            return u
        if is_op(u, *SHAPE_VIEWS, aten.abs) or torch.Tag.pointwise in getattr(u.target, "tags", ()):
            stack.extend(u.users)
    return None
