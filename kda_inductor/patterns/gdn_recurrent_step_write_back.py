"""``gdn_recurrent_step``'s second stage: where a functional ``kda::gdn_recurrent_step`` writes its
final state back into the cache buffer it started from, the op runs in place on that buffer.

A rewrite of its own (:class:`GdnRecurrentStepWriteBack`: its own ``find`` / ``replace``), with no
name of its own: the registry lists it as a stage of ``gdn_recurrent_step``
(``patterns.STAGES``), which the pass manager runs right after that rewrite on each graph, its
matches and misses counted under ``gdn_recurrent_step`` (``disable: ["gdn_recurrent_step"]``
turns both off; the reports, the options and ``.ci/gpu`` know only the registered names). It
reads the functional ops in the graph by then: the fla rule's (``_dynamo_fixes`` traces fla-core's
decode kernels as one) and any ``gdn_recurrent_step`` left functional.

It reads the write-back as ``copy_(buffer, state)`` (the epilogue a functional graph keeps for a
mutated input) or Dynamo's functional ``copy(buffer, state)`` before it, and replaces the op and
the copy with ``kda::gdn_recurrent_step_inplace`` on that buffer (:class:`WriteBackMatch`).
Without it the step runs the op, which writes a new state, then Inductor's copy kernel of it into
the cache: the state read and written twice (H200, Qwen3-Next decode 32: 33.8 us the op, 33.2 us
the copy, a layer). No speed rule: the same op in place, one pass over the state fewer, on every
device.

Not put in place (the functional op stays, a miss at the user's line): the new state read
elsewhere too (written in place, that reader would share the cache's buffer: a returned state
would alias the cache), written into another buffer than the one it started from, a starting
state that is not a graph input itself (a view of the buffer: Inductor re-inplaces a mutated view
of a graph input only on some torch versions, else it clones the cache first; a cast or a copy of
it: nothing to write back into), the buffer read again after the step (Inductor would clone it).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch.fx.operator_schemas import normalize_function
from torch.multiprocessing.reductions import StorageWeakRef

from kda_inductor.lowerings import gdn_recurrent_step as _lowering  # noqa: F401  (registers the ops)
from kda_inductor.patterns import base
from kda_inductor.patterns._graph import copy_into
from kda_inductor.patterns.base import SHAPE_VIEWS, Match, Rewrite, Stage, aten, in_graph_order, is_op, positions, val

_INPUTS = ("q", "k", "v", "g", "beta")
_SCALARS = ("scale", "use_qk_l2norm", "eps", "out_dtype")


@dataclasses.dataclass(frozen=True)
class WriteBackMatch(Match):
    """A functional ``kda::gdn_recurrent_step`` (``op``, its arguments by name ``args``) whose
    final state goes only back into ``buffer``, its initial state: ``out`` (the output's
    ``getitem``, None if unread) and ``state_out`` (the node whose readers get the new state: the
    final state, its views or Dynamo's functional copy) are what the in-place op's results
    replace."""

    op: fx.Node
    args: dict[str, Any]
    out: fx.Node | None
    state_out: fx.Node

    @property
    def anchor(self) -> fx.Node:
        return self.op

    @property
    def buffer(self) -> fx.Node:
        return self.args["initial_state"]

    @property
    def part(self) -> str:
        return "op's state in place"

    def fn(self) -> Callable[..., Any]:
        def fn(q, k, v, g, beta, state, scale, use_qk_l2norm, eps, out_dtype):
            out = torch.ops.kda.gdn_recurrent_step_inplace(q, k, v, g, beta, state, scale, use_qk_l2norm, eps,
                                                           None if out_dtype == v.dtype else out_dtype)
            return out, state

        return fn

    def replace(self, graph: fx.Graph) -> dict[fx.Node, fx.Node]:
        args = [self.args[n] for n in _INPUTS] + [self.buffer] + [self.args[n] for n in _SCALARS]
        outputs = [self.out, self.state_out]
        return base.moved(outputs, base.replace_by_function(graph, self.fn(), args, outputs=outputs, before=self.op,
                                                            region=self.nodes, origin=self.op))


class GdnRecurrentStepWriteBack(Rewrite):
    """The stage (module docstring): a functional step's write-back -> the step in place."""

    name = "gdn_recurrent_step"  # a stage of it (patterns.STAGES): its matches and misses are counted there
    finds = "a functional `kda::gdn_recurrent_step` whose new state only goes back into its initial state's buffer"
    becomes = "`kda::gdn_recurrent_step_inplace` on that buffer"

    def find(self, graph: fx.Graph) -> list[Match]:
        """Every functional ``kda::gdn_recurrent_step`` of ``graph`` whose state can be written in
        place; those that write their state back but cannot get a miss."""
        out = []
        for op in graph.find_nodes(op="call_function", target=torch.ops.kda.gdn_recurrent_step.default):
            got = _outputs(op)
            if got is None or got[1] is None:
                continue  # the new state is not read (or read as no getitem): nothing is written back
            views = _views(got[1])
            end = views[-1] if views else got[1]
            w = copy_into(end)
            if w is None:
                continue  # the new state is not written back: the functional op is the right one
            args = normalize_function(op.target, op.args, op.kwargs, normalize_to_only_use_kwargs=True).kwargs
            why = _why_not(op, args["initial_state"], end, w)
            if why is not None:
                self.miss(op, *why)
                continue
            functional_copy = [w] if is_op(w, aten.copy) else []
            out.append(WriteBackMatch(in_graph_order([op, *(n for n in got if n is not None), *views, *functional_copy]),
                                      op, args, got[0], (functional_copy or [end])[0]))
        return out

    def replace(self, graph: fx.Graph, match: WriteBackMatch) -> dict[fx.Node, fx.Node]:
        return match.replace(graph)


def _outputs(op: fx.Node) -> tuple[fx.Node | None, fx.Node | None] | None:
    """``(the output's getitem, the final state's)`` of the op (None: unread); None where its
    results are read otherwise (two getitems of one, or the tuple itself)."""
    got: dict[int, fx.Node] = {}
    for u in op.users:
        if u.target is not operator.getitem or u.args[1] in got:
            return None
        got[u.args[1]] = u
    return got.get(0), got.get(1)


def _views(final: fx.Node) -> list[fx.Node]:
    """The views of ``final`` of its own shape (no-ops on its elements), each the only reader of
    the one before, that a write-back may read instead of ``final`` itself."""
    out, n = [], final
    while len(n.users) == 1 and is_op(u := next(iter(n.users)), *SHAPE_VIEWS) and val(u).shape == val(final).shape:
        out.append(n := u)
    return out


def _why_not(op: fx.Node, buffer: Any, end: fx.Node, w: fx.Node) -> tuple[Stage, str] | None:
    """Why the op's state, written back by ``w`` (``end`` the state or its view that ``w`` reads),
    cannot be written in place; None where it can."""
    target = w.args[0]
    readers = [u for u in end.users if u is not w] + [u for u in w.users if not (
        is_op(w, aten.copy) and u.target is aten.copy_.default and u.args == (target, w))]
    if readers:
        return Stage.REGION, (f"the new state is read elsewhere too ({readers[0].name}), not only written "
                              "back: written in place, that reader would share the cache's buffer")
    if target is not buffer:
        return Stage.LAYOUT, (f"the new state is written into another buffer ({getattr(target, 'name', target)}) "
                              f"than the initial state it continues ({getattr(buffer, 'name', buffer)})")
    if buffer.op not in ("placeholder", "get_attr"):
        return Stage.LAYOUT, (f"the initial state ({buffer.name}) is not the cache buffer itself (a view, a cast "
                              "or a copy of it): the op writes in place only a graph input's own buffer")
    late = _read_after(op, buffer, w)
    if late is not None:
        return Stage.REGION, (f"the cache's old state is read after the step ({late.name}): written in place, "
                              "Inductor would copy the cache first")
    return None


def _read_after(op: fx.Node, buffer: fx.Node, w: fx.Node) -> fx.Node | None:
    """A node after ``op`` that reads ``buffer``'s storage (through any view of it), other than
    the write-back ``w`` and the functional graph's ``copy_`` epilogue into it."""
    where = positions(op.graph)
    storage = StorageWeakRef(val(buffer).untyped_storage())
    for n in op.graph.nodes:
        v = val(n)
        if not (isinstance(v, torch.Tensor) and StorageWeakRef(v.untyped_storage()) == storage):
            continue
        for u in n.users:
            if where[u] > where[op] and u is not w and not (u.target is aten.copy_.default and u.args[0] is buffer):
                return u
    return None
