"""``patterns.base.replace_by_function``: a replacement stated as a plain function of torch and
``torch.ops.kda`` calls, traced in the graph's fake mode and spliced in (plain ops, several
outputs, a mutating op re-inplaced by Inductor, symbolic sizes, a failure undone)."""

from __future__ import annotations

import operator
import re

import pytest
import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.utils import run_and_get_code
from torch.fx.experimental.proxy_tensor import make_fx

from kda_inductor.lowerings import gdn_spec_split as _split  # noqa: F401  (registers kda::gdn_spec_split)
from kda_inductor.patterns.base import is_op, replace_by_function, transaction, val
from kda_inductor.testing import fresh_compile

aten = torch.ops.aten


@torch.library.custom_op("kda_test::add_into", mutates_args=("acc",))
def add_into(acc: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``acc += x`` in place; returns ``2 * x``."""
    acc.add_(x)
    return x * 2


@add_into.register_fake
def _(acc, x):
    return torch.empty_like(x)


def _first(graph: fx.Graph, op) -> fx.Node:
    return next(n for n in graph.nodes if is_op(n, op))


def _traced(fn, *args, mode="fake") -> fx.GraphModule:
    return make_fx(fn, tracing_mode=mode)(*args)


def test_a_plain_op_replaces_the_region():
    def f(a, b):
        return torch.relu(a) + b, b.sum()

    gm = _traced(f, torch.randn(5, 4), torch.randn(5, 4))
    g = gm.graph
    relu, add = _first(g, aten.relu), _first(g, aten.add)
    relu.meta["stack_trace"] = 'File "model.py", line 3, in f\n    return torch.relu(a) + b\n'
    a, b = g.find_nodes(op="placeholder")
    with transaction(g):
        (out,) = replace_by_function(g, lambda a, b: torch.clamp_min(a, 0) + b, [a, b], outputs=[add],
                                     before=relu, region=[relu, add], origin=relu)
    g.lint()
    assert not any(is_op(n, aten.relu) for n in g.nodes)  # the region is gone
    new = [n for n in g.nodes if n.op == "call_function" and not is_op(n, aten.sum)]
    assert [n.target for n in new] == [aten.clamp_min.default, aten.add.Tensor] and out is new[-1]
    assert all(isinstance(val(n), torch.Tensor) for n in new)
    assert all(n.meta["stack_trace"] == relu.meta["stack_trace"] for n in new)
    gm.recompile()
    x, y = torch.randn(5, 4), torch.randn(5, 4)
    assert all(torch.equal(p, q) for p, q in zip(gm(x, y), f(x, y)))


def test_several_outputs_a_list_argument_and_an_unused_output():
    """Gathers replaced by one ``kda::gdn_spec_split`` launch: its list arguments hold nodes and
    constants, its outputs (a list) read back through ``getitem``; a ``None`` output is not read."""
    def f(x, g, i):
        return x.index_select(0, i), g.index_select(1, i), x.sum()

    x, gt, i = torch.randn(6, 8), torch.randn(1, 6, 3), torch.tensor([4, 0, 2], dtype=torch.int32)
    gm = _traced(f, x, gt, i)
    graph = gm.graph
    gx, gg = [n for n in graph.nodes if is_op(n, aten.index_select)]
    px, pg, pi = graph.find_nodes(op="placeholder")

    def split(x, g, i):
        a, b = torch.ops.kda.gdn_spec_split([x, g], [i], [0, 1], [0, 0])
        return a, b, a.sum()

    with transaction(graph):
        outs = replace_by_function(graph, split, [px, pg, pi], outputs=[gx, gg, None], before=gx,
                                   region=[gx, gg])
    graph.lint()
    assert sum(is_op(n, torch.ops.kda.gdn_spec_split) for n in graph.nodes) == 1
    assert [n.target for n in outs[:2]] == [operator.getitem, operator.getitem]
    assert not any(is_op(n, aten.index_select) for n in graph.nodes)
    assert is_op(outs[2], aten.sum) and not outs[2].users  # traced, not read: erased at the next DCE
    gm.recompile()
    assert all(torch.equal(p, q) for p, q in zip(gm(x, gt, i), f(x, gt, i)))


class _Pass(CustomGraphPass):
    """A post-grad pass that runs ``rewrite(graph)`` (the kda backend's place for its rewrites)."""

    def __init__(self, rewrite):
        self.rewrite = rewrite
        self.graphs: list[str] = []

    def __call__(self, graph: fx.Graph) -> None:
        with transaction(graph):
            self.rewrite(graph)
        self.graphs.append(str(graph))

    def uuid(self):
        return None


def _compiled(fn, rewrite, *args, **compile_kw):
    """``(result, output code, post-grad graphs)`` of ``fn`` compiled by Inductor with ``rewrite``."""
    p = _Pass(rewrite)
    with fresh_compile(), torch._inductor.config.patch(post_grad_custom_post_pass=p):
        out, code = run_and_get_code(torch.compile(fn, backend="inductor", **compile_kw), *args)
    return out, "\n".join(code), p.graphs


def _in_place(graph: fx.Graph) -> None:
    """``acc.add_(x); return x * 2`` (post-grad: ``add``, ``mul``, ``copy_(acc, add)``) becomes
    ``kda_test::add_into`` on ``acc``."""
    add, mul = _first(graph, aten.add), _first(graph, aten.mul)

    def into(acc, x):
        doubled = torch.ops.kda_test.add_into(acc, x)
        return acc, doubled

    replace_by_function(graph, into, list(add.args), outputs=[add, mul], before=add, region=[add, mul], origin=add)


def test_a_mutating_op_is_functionalized_and_reinplaced():
    """The mutating op comes out as ``auto_functionalized`` (v1), whose new ``acc`` feeds the
    graph's ``copy_`` back into the input; Inductor re-inplaces it: the output code calls the op
    on the input buffer, with no clone and no copy."""
    def f(acc, x):
        acc.add_(x)
        return x * 2

    acc, x = torch.randn(6, 3), torch.randn(6, 3)
    expected = acc + x
    out, code, graphs = _compiled(f, _in_place, acc, x)
    assert "higher_order.auto_functionalized](args = (kda_test.add_into.default,)" in graphs[0]
    assert "kda_test.add_into.default(arg" in code
    assert not re.search(r"copy_\(|clone\(|aten\.copy", code), code
    assert torch.equal(acc, expected) and torch.equal(out, x * 2)


def test_a_mutated_input_must_be_returned():
    """A mutation the replacement does not return would be dropped by functionalization: an
    error, and the graph is left as it was."""
    def f(acc, x):
        return acc + x

    gm = _traced(f, torch.randn(3), torch.randn(3))
    g, before = gm.graph, str(gm.graph)
    add = _first(g, aten.add)
    with pytest.raises(ValueError, match="mutates its input 0"), transaction(g):
        replace_by_function(g, lambda a, x: torch.ops.kda_test.add_into(a, x), list(add.args), outputs=[add],
                            before=add, region=[add])
    assert str(g) == before


def test_symbolic_sizes_are_read_from_the_graph():
    """Under ``dynamic=True`` a reshape back to a shape of two symbolic sizes (the heads too)
    reads them from the graph (``sym_size`` of an input, or its ``SymInt`` inputs); the graph
    then serves other sizes without compiling again."""
    def f(x):
        return (x.reshape(-1, x.shape[-1]) * 2).reshape(x.shape).sum(-1)

    def rewrite(graph: fx.Graph) -> None:
        mul = _first(graph, aten.mul)
        view = next(iter(mul.users))
        shape = list(val(view).shape)
        assert sum(not isinstance(s, int) for s in shape) >= 2
        (out,) = replace_by_function(graph, lambda t, shape: (t + t).view(shape), [mul.args[0], shape],
                                     outputs=[view], before=mul, region=[mul, view])
        assert is_op(out, aten.view) and any(isinstance(s, fx.Node) for s in out.args[1])

    counts = torch._dynamo.utils.counters
    counts.clear()
    x = torch.randn(3, 5, 4)
    p = _Pass(rewrite)
    with fresh_compile(), torch._inductor.config.patch(post_grad_custom_post_pass=p):
        compiled = torch.compile(f, backend="inductor", dynamic=True)
        for shape in ((3, 5, 4), (2, 7, 4), (4, 2, 6)):
            x = torch.randn(shape)
            torch.testing.assert_close(compiled(x), f(x))
    assert len(p.graphs) == 1 and "aten.add.Tensor" in p.graphs[0] and "aten.mul" not in p.graphs[0]


def test_users_standing_before_the_insertion_point_move_after_it():
    """The replacement goes after its last input; a user of a replaced output that stood
    earlier moves after it, with what it feeds (the graph stays topologically sorted)."""
    def f(x, y):
        a = x * 2
        b = a + 1  # reads a before y's gather exists
        c = y.index_select(0, torch.tensor([1, 0]))
        return b, c

    gm = _traced(f, torch.randn(2, 3), torch.randn(2, 3))
    g = gm.graph
    mul, add = _first(g, aten.mul), _first(g, aten.add)
    last = _first(g, aten.index_select)
    x, _ = g.find_nodes(op="placeholder")
    with transaction(g):
        replace_by_function(g, lambda x: x + x, [x], outputs=[mul], before=last.next, region=[mul])
    g.lint()
    order = list(g.nodes)
    assert order.index(add) > order.index(last)
    gm.recompile()
    p, q = torch.randn(2, 3), torch.randn(2, 3)
    assert all(torch.equal(u, v) for u, v in zip(gm(p, q), f(p, q)))


def test_a_failure_after_inserting_is_undone():
    """Nodes already inserted when the replacement fails (here: it returns more values than
    there are outputs) are erased by ``transaction``; the graph is as it was."""
    def f(a):
        return a.relu()

    gm = _traced(f, torch.randn(4))
    g, before = gm.graph, str(gm.graph)
    relu = _first(g, aten.relu)
    with pytest.raises(ValueError, match="returns 2 values for 1 outputs"), transaction(g):
        replace_by_function(g, lambda a: (a.clamp_min(0), a), [relu.args[0]], outputs=[relu], before=relu)
    assert str(g) == before
    with pytest.raises(RuntimeError, match="boom"), transaction(g):
        replace_by_function(g, lambda a: (_ for _ in ()).throw(RuntimeError("boom")), [relu.args[0]],
                            outputs=[relu], before=relu)
    assert str(g) == before
