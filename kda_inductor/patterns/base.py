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
import enum
import operator
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
import torch.fx as fx

aten = torch.ops.aten
prims = torch.ops.prims
VIEWS = (aten.view, aten.reshape, aten._unsafe_view)
"""The reshaping ops of post-grad graphs (for ``is_op``): same elements, another shape."""
SHAPE_VIEWS = (*VIEWS, aten.squeeze, aten.unsqueeze)
"""The reshapes and the unit-dim views: every element keeps its value (the base of each
rewrite's own view set)."""


class Stage(enum.IntEnum):
    """How far a rejected candidate got, in the order every matcher checks: a miss at a later
    stage is closer to a match (``Rewrite.closest_misses`` keeps the furthest ones)."""

    FORM = 1
    """The anchor op is there, but not in this computation's form (dims, index shapes)."""
    LAYOUT = 2
    """The data's geometry does not fit (row widths, rows straddling tokens, the output)."""
    PIECES = 3
    """The computation's parts are not all there, or not one each (writes, scales, launches)."""
    INDEXING = 4
    """The parts do not index by one shared index (the slot mapping and its mask)."""
    ADDRESSING = 5
    """The bytes do not land where the layout puts them."""
    VALUES = 6
    """What is stored or computed is not this computation's value."""
    VALIDATED = 7
    """The fused op's own validator rejects these inputs."""
    REGION = 8
    """A value inside the region is read outside it (or through a view the op cannot keep)."""
    SPEED_RULE = 9
    """Everything matched; the speed rule leaves it to Inductor (measured faster there)."""


@dataclasses.dataclass(frozen=True)
class Miss:
    """A candidate a rewrite looked at and rejected, for ``explain()`` and ``--explain-misses``.

    ``stage`` says how far it got (higher is closer to a match); ``check`` names
    the check that rejected it; ``location`` is the user's source line the candidate
    node came from (``"model.py:123"``, from the node's stack trace; ``None`` when the
    graph has no trace for it) and ``code`` that line's text.
    """

    node: str
    stage: Stage
    check: str
    location: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location else ""
        return f"{where}not rewritten: {self.check}"


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>[^\n]+)\n(?P<code>[^\n]*)')


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def source_location(node: fx.Node) -> tuple[str | None, str | None]:
    """``("file.py:123", "the line's code")`` of the innermost user frame that made ``node``
    (from ``node.meta["stack_trace"]``), or ``(None, None)``. Frames in torch's own files
    (``nn.RMSNorm``'s ``torch/nn/functional.py``) are not the user's: the innermost frame
    outside torch is, where the trace has one."""
    trace = node.meta.get("stack_trace") if isinstance(node, fx.Node) else None
    if not trace:
        return None, None
    frames = list(_FRAME.finditer(trace + "\n"))
    if not frames:
        return None, None
    users = [f for f in frames if not os.path.abspath(f["file"]).startswith(_TORCH_DIR)]
    last = (users or frames)[-1]
    return f"{last['file']}:{last['line']}", (last["code"].strip() or None)


@dataclasses.dataclass
class Match:
    """One place to rewrite. Each rewrite subclasses it with typed fields for what its
    ``replace`` needs; ``nodes`` is every node of the matched region (outputs included),
    erased once dead."""

    nodes: list[fx.Node]

    @property
    def anchor(self) -> fx.Node:
        """The node a miss of this match is reported at (the last one with a source line)."""
        traced = [n for n in self.nodes if n.meta.get("stack_trace")]
        return (traced or self.nodes)[-1]

    @property
    def part(self) -> str | None:
        """Which part of its rewrite this match fuses, where a rewrite fuses more or less of the
        code it finds (``gated_norm_merge``: ``"merge + norm"`` or ``"norm alone"``); the pass
        counts each in its record (``PassRecord.parts``) and the rewrite table shows them.
        None where a rewrite has one part."""
        return None

    @property
    def device(self) -> str:
        """The device type the matched code runs on ("cuda", "cpu", ...)."""
        for n in self.nodes:
            v = val(n)
            if isinstance(v, torch.Tensor):
                return v.device.type
        return "cpu"


class Rewrite:
    """Base class of one rewrite; subclasses live one per file in ``patterns/``."""

    name: ClassVar[str]
    finds: ClassVar[str]
    """What the rewrite recognizes, in the words of the README's rewrite table (generated from
    these: ``kda-inductor rewrites``)."""
    becomes: ClassVar[str]
    """What it puts in the graph instead (the table's last column)."""
    eager_form_hint: ClassVar[str | None] = None
    """Where to find a traceable spelling, for ``explain()`` when a frame fell back to eager."""

    def __init__(self) -> None:
        self.misses: list[Miss] = []

    def miss(self, node: fx.Node, stage: Stage, check: str) -> None:
        """Record that ``node`` was a candidate rejected by ``check``, at the user's source
        line it came from (returns None, so ``return self.miss(...)`` rejects)."""
        self.misses.append(Miss(node.name, stage, check, *source_location(node)))

    def region_closed(self, region: Iterable[fx.Node], outputs: Iterable[fx.Node], *, at: fx.Node,
                      what: str = "an intermediate of the region") -> bool:
        """The region check every rewrite makes: no value of ``region`` other than ``outputs``
        is read outside it (else replacing the region would recompute it). False, with a
        :attr:`Stage.REGION` miss at ``at`` naming the first escaping node, when one is."""
        leaking = escaping(region, outputs)
        if leaking:
            self.miss(at, Stage.REGION, f"{what} is read elsewhere ({leaking[0].name})")
        return not leaking

    def closest_misses(self) -> list[Miss]:
        """The rejected candidates that got furthest."""
        if not self.misses:
            return []
        best = max(m.stage for m in self.misses)
        return [m for m in self.misses if m.stage == best]

    def find(self, graph: fx.Graph) -> list[Match]:
        raise NotImplementedError

    def speed_rule(self, match: Match) -> str | None:
        """Why this match is left to Inductor (its op was measured slower than Inductor's
        code for it on this device and size), or None to rewrite it. Each rewrite writes
        its rule in its pattern file, citing the measurement in ``benchmarks/results/``;
        ``options["kda"]["force"]`` ignores the rules (tests of matching and numerics)."""
        return None

    def replace(self, graph: fx.Graph, match: Match) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------- helpers


def val(node: Any) -> Any:
    """The fake value recorded on a node (``None`` when absent or not a node)."""
    return node.meta.get("val") if isinstance(node, fx.Node) else None


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
    """``nodes`` (of one graph) sorted as the graph runs them: a match's ``nodes``."""
    nodes = list(dict.fromkeys(nodes))
    if not nodes:
        return []
    order = positions(nodes[0].graph)
    return sorted(nodes, key=order.__getitem__)


def earliest(nodes: Iterable[fx.Node]) -> fx.Node:
    """The first of ``nodes`` in graph order: where a fused op that replaces them all goes
    (``insert_fused(before=...)``), so it runs before any of their readers."""
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
    order = positions(graph)
    doomed: set[fx.Node] = set()
    for n in set(nodes):
        if n.op == "call_function" and is_dead(n):
            doomed.add(n)
            doomed |= reachable([n], upstream=False)
    for n in sorted(doomed, key=order.__getitem__, reverse=True):
        if not n.users:
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


# --------------------------------------------------------------------------- inserting a fused op


@dataclasses.dataclass(frozen=True)
class Route:
    """Where one output of a fused op goes: ``old``'s users (those ``only`` accepts, all by
    default) read output ``index`` of the op (``None``: the op's single result) instead,
    reshaped to ``shape`` when given."""

    old: fx.Node
    index: int | None = None
    only: Any = None  # Callable[[fx.Node], bool] | None
    shape: Any = None  # list[int | SymInt] | None


def shape_arg(shape) -> list:
    """A reshape's size argument for ``shape``, which may hold symbolic sizes: one of them
    becomes ``-1`` (inferred from the element count); more than one is not supported here.
    A size the rewrite specialized (``_layout.specialize``) counts as the int it now is."""
    shape = [_specialized(s) for s in shape]
    sym = [i for i, s in enumerate(shape) if not isinstance(s, int)]
    if len(sym) > 1:
        raise NotImplementedError(f"reshape to a shape with several symbolic sizes: {list(shape)}")
    return [-1 if i in sym else s for i, s in enumerate(shape)]


def _specialized(size: Any) -> Any:
    """A SymInt that a guard made constant, as that int; any other size as it is."""
    try:
        env, expr = size.node.shape_env, size.node.expr
        expr = env.replace(expr) if hasattr(env, "replace") else expr
        return int(expr) if expr.is_Integer else size
    except AttributeError:  # an int, or no shape env
        return size


def insert_fused(graph: fx.Graph, op: Any, args: tuple = (), kwargs: dict | None = None, *,
                 before: fx.Node, routes: Iterable[Route], region: Iterable[fx.Node],
                 origin: fx.Node | None = None, mutated: str | None = None) -> fx.Node:
    """The one way a rewrite inserts its fused op: call ``op(*args, **kwargs)`` right before
    ``before`` with its fake value set, send each :class:`Route`'s users to the op's output,
    and erase what of ``region`` is left dead. ``origin`` lends the new nodes its stack trace
    (Inductor's provenance, our misses). ``mutated``: ``op`` is a mutating custom op, called
    through ``auto_functionalized`` (which Inductor re-inplaces); the routes' indices then
    count ``auto_functionalized``'s outputs (0: the op's result, 1...: the new values of the
    mutated arguments in schema order). Returns the inserted op node.

    Everything is inserted before any user is rerouted, so :func:`transaction` can undo a
    failure; rerouting comes last."""
    routes = list(routes)
    made: dict[tuple, fx.Node] = {}
    with graph.inserting_before(before):
        fused = _op_node(graph, op, args, kwargs, mutated)
        outputs = [_route_output(graph, fused, r, made) for r in routes]
    trace = origin.meta.get("stack_trace") if origin is not None else None
    if trace:
        for n in [fused, *made.values()]:
            n.meta["stack_trace"] = trace
    _reroute(routes, outputs)
    erase_dead(graph, region)
    return fused


def _op_node(graph: fx.Graph, op: Any, args: tuple, kwargs: dict | None, mutated: str | None) -> fx.Node:
    """The fused op's call at the graph's insertion point, its fake value set: ``op`` itself,
    or ``auto_functionalized(op, **kwargs)`` for a mutating op (``mutated``)."""
    from torch._higher_order_ops.auto_functionalize import auto_functionalized

    if mutated is not None:
        fused = graph.call_function(auto_functionalized, (op,), dict(kwargs or {}))
    else:
        fused = graph.call_function(op, tuple(args), dict(kwargs or {}))
    set_fake_vals(graph, fused)
    return fused


def _route_output(graph: fx.Graph, fused: fx.Node, route: Route, made: dict[tuple, fx.Node]) -> fx.Node:
    """The node ``route``'s users are to read: the op's result, or its output ``route.index``,
    reshaped to ``route.shape`` where that differs. Each such node is made once (in ``made``):
    routes to the same output share it."""
    out = fused
    if route.index is not None:
        key = ("item", route.index)
        if key not in made:
            made[key] = graph.call_function(operator.getitem, (fused, route.index))
            made[key].meta["val"] = fused.meta["val"][route.index]
        out = made[key]
    if route.shape is not None and list(val(out).shape) != list(route.shape):
        key = ("view", route.index, tuple(map(str, route.shape)))
        if key not in made:
            made[key] = graph.call_function(aten.reshape.default, (out, shape_arg(route.shape)))
            set_fake_vals(graph, made[key])
        out = made[key]
    return out


def _reroute(routes: list[Route], outputs: list[fx.Node]) -> None:
    """Send each route's users (those its ``only`` accepts) to its output node: the one step
    :func:`transaction` cannot undo, so the last."""
    for r, out in zip(routes, outputs):
        if r.only is None:
            r.old.replace_all_uses_with(out)
        else:
            r.old.replace_all_uses_with(out, delete_user_cb=r.only)
