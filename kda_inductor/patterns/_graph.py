"""Reading and editing post-grad FX graphs: the node helpers every rewrite uses (re-exported by
:mod:`kda_inductor.patterns.base`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx

aten = torch.ops.aten
prims = torch.ops.prims
VIEWS = (aten.view, aten.reshape, aten._unsafe_view)
"""The reshaping ops of post-grad graphs (for ``is_op``): same elements, another shape."""
SHAPE_VIEWS = (*VIEWS, aten.squeeze, aten.unsqueeze)
"""The reshapes and the unit-dim views: every element keeps its value (the base of each
rewrite's own view set)."""


def val(node: Any) -> Any:
    """The fake value recorded on a node (``None`` when absent or not a node)."""
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def is_op(node: Any, *targets: Any) -> bool:
    """``node`` calls one of ``targets`` (an OpOverload or an OpOverloadPacket)."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    t = node.target
    for want in targets:
        if t is want or getattr(t, "overloadpacket", None) is want:
            return True
    return False


def copy_into(value: fx.Node, buffer: fx.Node | None = None) -> fx.Node | None:
    """The user of ``value`` that copies it into ``buffer`` (into any buffer where None):
    ``copy_(buffer, value)``, or Dynamo's functional ``copy(buffer, value)`` (its result written
    back by a ``copy_`` at the graph's end); None where none does."""
    for u in value.users:
        if (is_op(u, aten.copy) or u.target is aten.copy_.default) and u.args[1] is value \
                and (buffer is None or u.args[0] is buffer):
            return u
    return None


def escaping(nodes: Iterable[fx.Node], outputs: Iterable[fx.Node]) -> list[fx.Node]:
    """The region's nodes, other than its outputs, that are read outside it (by a node
    that is not dead: Inductor leaves dead views behind, e.g. of ``out[:n] = ...``).

    A region whose intermediate values are read elsewhere cannot be replaced
    without recomputing them, so rewrites refuse it (empty list: closed).
    """
    inside = set(nodes)
    if not inside:
        return []
    outs = set(outputs)
    graph = next(iter(inside)).graph
    return [
        n for n in graph.nodes  # graph order: deterministic messages
        if n in inside and n not in outs and any(u not in inside and not is_dead(u) for u in n.users)
    ]


def is_dead(n: fx.Node) -> bool:
    """``n`` is a pure op whose value nothing live reads (Inductor will drop it)."""
    if n.op != "call_function" or n.is_impure():
        return False
    schema = getattr(n.target, "_schema", None)
    if schema is not None and schema.is_mutable:
        return False
    return all(is_dead(u) for u in n.users)


def live_users(n: fx.Node) -> list[fx.Node]:
    """``n``'s users that are not dead."""
    return [u for u in n.users if not is_dead(u)]


def positions(graph: fx.Graph) -> dict[fx.Node, int]:
    """Each node's index in ``graph`` (for ordering and placement decisions)."""
    return {n: i for i, n in enumerate(graph.nodes)}


def in_graph_order(nodes: Iterable[fx.Node]) -> list[fx.Node]:
    """``nodes`` (of one graph) sorted as the graph runs them: a match's ``nodes``. By torch's
    own order key of each node (``Node._sort_key``, which FX keeps as nodes are inserted and
    ``Node.__lt__`` compares), where this torch has it; else by a position map of the graph."""
    nodes = list(dict.fromkeys(nodes))
    if not nodes:
        return []
    if getattr(nodes[0], "_sort_key", None) is not None:
        return sorted(nodes, key=_sort_key)
    order = positions(nodes[0].graph)
    return sorted(nodes, key=order.__getitem__)


def _sort_key(n: fx.Node) -> Any:
    return n._sort_key


def earliest(nodes: Iterable[fx.Node]) -> fx.Node:
    """The first of ``nodes`` in graph order: where a fused op that replaces them all goes
    (``replace_by_function(before=...)``), so it runs before any of their readers."""
    return in_graph_order(nodes)[0]


def reachable(nodes: Iterable[fx.Node], *, upstream: bool) -> set[fx.Node]:
    """Every node the given ones read (``upstream``) or feed, transitively, excluding them."""
    seen: set[fx.Node] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        for m in (n.all_input_nodes if upstream else n.users):
            if m not in seen:
                seen.add(m)
                stack.append(m)
    return seen


def downstream(n: fx.Node, depth: int) -> list[fx.Node]:
    """Nodes reading ``n`` (live users) within ``depth`` steps, nearest first, each once (every
    reader at any depth, unordered: :func:`reachable`)."""
    seen, frontier, out = {n}, [n], []
    for _ in range(depth):
        frontier = [u for f in frontier for u in live_users(f) if u not in seen]
        seen.update(frontier)
        out += frontier
    return out


def mutated_nodes(graph: fx.Graph) -> set[fx.Node]:
    """Nodes whose storage the graph writes: ``copy_`` targets and mutable op arguments."""
    out: set[fx.Node] = set()
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        schema = getattr(n.target, "_schema", None)
        if schema is None:
            continue
        for arg, value in zip(schema.arguments, n.args):
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, fx.Node):
                out.add(value)
        for arg in schema.arguments:
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(n.kwargs.get(arg.name), fx.Node):
                out.add(n.kwargs[arg.name])
    return out


def erase_dead(graph: fx.Graph, nodes: Iterable[fx.Node]) -> None:
    """Erase the given nodes that nothing live reads any more, with the dead nodes that
    read them (views Inductor left unused), users before producers."""
    doomed: set[fx.Node] = set()
    for n in set(nodes):
        if n.op == "call_function" and is_dead(n):
            doomed.add(n)
            doomed |= reachable([n], upstream=False)
    for n in reversed(in_graph_order(doomed)):
        if not n.users:
            graph.erase_node(n)


# --------------------------------------------------------------------------- old -> new (base.remap)


def moved(outputs: Iterable[fx.Node | None], new: Iterable[fx.Node]) -> dict[fx.Node, fx.Node]:
    """What ``replace`` returns: each replaced output (None: not read) -> the node that stands for
    it now (:func:`replace_by_function`'s results, in order)."""
    return {old: n for old, n in zip(outputs, new) if old is not None}


def remap(match: Any, moved: dict[fx.Node, fx.Node]) -> Any:
    """``match`` with every input node it names that an earlier replacement stood in for read as
    its replacement (``moved``: old -> new, followed to the last one); its region (``nodes``) is
    its own and stays. The same object where nothing moved (matches are frozen: a copy)."""
    if not moved:
        return match
    changes = {f.name: new for f in dataclasses.fields(match) if f.name != "nodes" and f.init
               and (new := _remapped(old := getattr(match, f.name), moved)) is not old}
    return dataclasses.replace(match, **changes) if changes else match


def _remapped(x: Any, moved: dict[fx.Node, fx.Node]) -> Any:
    if isinstance(x, fx.Node):
        while x in moved:
            x = moved[x]
        return x
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        changes = {f.name: new for f in dataclasses.fields(x) if f.init
                   and (new := _remapped(old := getattr(x, f.name), moved)) is not old}
        return dataclasses.replace(x, **changes) if changes else x
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        new = [_remapped(v, moved) for v in x]
        return type(x)(new) if any(a is not b for a, b in zip(new, x)) else x
    if isinstance(x, dict):
        new = {k: _remapped(v, moved) for k, v in x.items()}
        return new if any(new[k] is not x[k] for k in x) else x
    return x
