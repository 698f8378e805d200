"""What every rewrite implements, and the graph helpers they share.

A rewrite is two steps over a post-grad FX graph:

* ``find(graph)`` looks, never mutates, and returns matches;
* ``replace(graph, match)`` inserts the fused op and reroutes the users.

The pass manager runs ``replace`` inside :func:`transaction`, so a rewrite that
raises half-way leaves the graph as it found it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
import torch.fx as fx

aten = torch.ops.aten
prims = torch.ops.prims
VIEWS = (aten.view, aten.reshape, aten._unsafe_view)
"""The reshaping ops of post-grad graphs (for ``is_op``): same elements, another shape."""


@dataclasses.dataclass(frozen=True)
class Miss:
    """A candidate a rewrite looked at and rejected, for ``--explain-misses``.

    ``stage`` says how far it got (higher is closer to a match); ``check`` names
    the check that rejected it.
    """

    node: str
    stage: int
    check: str


@dataclasses.dataclass
class Match:
    """One place to rewrite: the nodes it replaces and whatever the rewrite needs."""

    nodes: list[fx.Node]
    """Every node of the matched region (outputs included); erased when dead."""
    data: dict[str, Any] = dataclasses.field(default_factory=dict)


class Rewrite:
    """Base class of one rewrite; subclasses live one per file in ``patterns/``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    default_enabled: ClassVar[bool] = True
    """Opt-in rewrites (False) run only when named in ``options["kda"]["enable"]``."""
    eager_form_hint: ClassVar[str | None] = None
    """Where to find a traceable spelling, for ``explain()`` when a frame fell back to eager."""

    def __init__(self) -> None:
        self.misses: list[Miss] = []

    def miss(self, node: fx.Node, stage: int, check: str) -> None:
        """Record that ``node`` was a candidate rejected by ``check`` (returns None)."""
        self.misses.append(Miss(node.name, stage, check))

    def closest_misses(self) -> list[Miss]:
        """The rejected candidates that got furthest."""
        if not self.misses:
            return []
        best = max(m.stage for m in self.misses)
        return [m for m in self.misses if m.stage == best]

    def find(self, graph: fx.Graph) -> list[Match]:
        raise NotImplementedError

    def replace(self, graph: fx.Graph, match: Match) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------- helpers


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


def escaping(nodes: Iterable[fx.Node], outputs: Iterable[fx.Node]) -> list[fx.Node]:
    """The region's nodes, other than its outputs, that are read outside it.

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
        if n in inside and n not in outs and any(u not in inside for u in n.users)
    ]


def positions(graph: fx.Graph) -> dict[fx.Node, int]:
    """Each node's index in ``graph`` (for ordering and placement decisions)."""
    return {n: i for i, n in enumerate(graph.nodes)}


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


def erase_dead(graph: fx.Graph, nodes: Iterable[fx.Node]) -> None:
    """Erase the given nodes that have no users left, users before producers."""
    order = positions(graph)
    for n in sorted(set(nodes), key=order.__getitem__, reverse=True):
        if not n.users and n.op == "call_function":
            graph.erase_node(n)


def fake_mode_of(graph: fx.Graph):
    """The FakeTensorMode the graph's metadata was made with."""
    from torch._guards import detect_fake_mode

    vals = [val(n) for n in graph.nodes if n.op == "placeholder"]
    return detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])


def set_fake_vals(graph: fx.Graph, node: fx.Node) -> None:
    """Run ``node``'s target on the fake values of its args and record the result."""
    mode = fake_mode_of(graph)
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: val(n))
    ctx = mode if mode is not None else contextlib.nullcontext()
    with ctx:
        node.meta["val"] = node.target(*args, **kwargs)


@contextlib.contextmanager
def transaction(graph: fx.Graph) -> Iterator[None]:
    """Undo node insertions if the body raises.

    Rewrites insert new nodes first and reroute users last, so erasing what was
    inserted restores the graph. If users were already rerouted the graph is
    not restorable and the error propagates as a hard failure.
    """
    before = set(graph.nodes)
    try:
        yield
    except BaseException:
        new = [n for n in graph.nodes if n not in before]
        for n in reversed(new):
            if any(u in before for u in n.users):
                raise RuntimeError(
                    "kda_inductor: a rewrite failed after rerouting users; "
                    "the graph cannot be restored"
                )
            graph.erase_node(n)
        raise
