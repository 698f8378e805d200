"""The framework's promises about the code itself (issue: a rewrite file holds only the meaning
of its computation): no function in ``kda_inductor/`` over 40 lines, the registry as the only
list of rewrites, so that a new rewrite costs its pattern file, its lowering file, one registry
line, its tests, its corpus cases (``tests/spellings/cases_*.py``, found by name) and its
benchmark (``benchmarks/bench_<name>.py``, found by name) and no other edit; the rewrites' declared
order; the shared analyses."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from kda_inductor.patterns import REWRITE_NAMES

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 40


# Functions allowed over the bound while someone splits them (empty: the bound holds for all of
# kda_inductor/); test_the_allow_list_is_current fails once an entry is short enough (or gone), so
# that an entry cannot outlive its reason.
OVER_40_ALLOWED: set[str] = set()
OVER_40_ALLOWED_FILES: set[str] = set()


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _functions(path: Path, prefix: str = ""):
    """``(qualified name, line, lines)`` of every function in ``path``, methods and nested
    functions included (``pkg.module.Class.method``)."""
    def walk(node, qual):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{qual}.{child.name}", child.lineno, child.end_lineno - child.lineno + 1
                yield from walk(child, f"{qual}.{child.name}")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{qual}.{child.name}")
            else:
                yield from walk(child, qual)

    yield from walk(ast.parse(path.read_text(encoding="utf-8")), prefix or path.stem)


def _long_functions():
    for p in sorted((ROOT / "kda_inductor").rglob("*.py")):
        for name, line, n in _functions(p, _module(p)):
            if n > MAX_LINES:
                yield p, name, line, n


def test_no_function_over_40_lines():
    long = [f"{p.relative_to(ROOT)}:{line} {name} ({n} lines)" for p, name, line, n in _long_functions()
            if name not in OVER_40_ALLOWED and str(p.relative_to(ROOT)) not in OVER_40_ALLOWED_FILES]
    assert not long, "split these into named steps:\n" + "\n".join(long)


def test_the_allow_list_is_current():
    """Every allowed name is still a function over the bound (else drop it from the list)."""
    long = {name for _, name, _, _ in _long_functions()}
    assert sorted(OVER_40_ALLOWED - long) == []


def test_the_bound_can_fail(tmp_path):
    body = "\n".join(f"x{i} = {i}" for i in range(MAX_LINES))
    path = tmp_path / "long.py"
    path.write_text(f"def f():\n{textwrap.indent(body, ' ' * 4)}\n\nclass C:\n    def m(self):\n"
                    f"        def inner():\n{textwrap.indent(body, ' ' * 12)}\n        return inner\n")
    assert [(name, n) for name, _, n in _functions(path)] == [
        ("long.f", MAX_LINES + 1), ("long.C.m", MAX_LINES + 3), ("long.C.m.inner", MAX_LINES + 1)]


def _hand_lists(path: Path) -> list[str]:
    """Literal tuples / lists / sets in ``path`` naming two or more registered rewrites."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in REWRITE_NAMES]
            if len(names) >= 2:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {names}")
    return out


def test_the_registry_is_the_only_list_of_rewrites():
    """No module of the package, the benchmarks or the corpus spells a list of rewrites (they
    read ``REWRITE_NAMES``); ``.ci/gpu`` names none (its stages come from the registry)."""
    files = [*(ROOT / "kda_inductor").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "tests" / "spellings").glob("*.py")]
    found = [hit for p in sorted(files) if p.name != "__init__.py" or p.parent.name != "patterns"
             for hit in _hand_lists(p)]
    assert not found, "read kda_inductor.REWRITE_NAMES instead:\n" + "\n".join(found)
    ci = (ROOT / ".ci" / "gpu").read_text(encoding="utf-8")
    code = "\n".join(line for line in ci.splitlines() if not line.lstrip().startswith("#"))  # usage examples aside
    assert "REWRITE_NAMES" in code and not [n for n in REWRITE_NAMES if n in code]


def test_every_rewrite_has_its_benchmark_and_table_row():
    """What the consumers look up by name exists for every registered rewrite: its benchmark
    module with ``report_jobs`` (report.py, .ci/gpu), its ``finds`` / ``becomes`` (the README)."""
    from kda_inductor.patterns import REWRITES

    for name, cls in REWRITES.items():
        bench = (ROOT / "benchmarks" / f"bench_{name}.py").read_text(encoding="utf-8")
        assert "def report_jobs(" in bench, name
        assert cls.finds and cls.becomes and "kda::" in cls.becomes, name


def test_an_analysis_is_computed_once_per_graph():
    """``Analyses``: the first rewrite that asks computes a reading, the others read it; another
    graph gets its own. ``alive`` tells which of a reading's matches an earlier rewrite erased."""
    import torch
    import torch.fx as fx

    from kda_inductor.patterns.base import Analyses, Match, Rewrite, alive

    graphs = [fx.Graph(), fx.Graph()]
    for g in graphs:
        a = g.placeholder("a")
        g.output(g.call_function(torch.ops.aten.neg.default, (g.call_function(torch.ops.aten.relu.default, (a,)),)))
    calls = []

    def reading(graph):
        calls.append(graph)
        return [Match(nodes=[n]) for n in graph.nodes if n.op == "call_function"]

    shared = Analyses()
    first, second = Rewrite(shared), Rewrite(shared)
    assert first.analysis(graphs[0], reading) is second.analysis(graphs[0], reading)
    assert calls == [graphs[0]]
    relu, neg = second.analysis(graphs[0], reading)
    neg.nodes[0].replace_all_uses_with(relu.nodes[0])
    graphs[0].erase_node(neg.nodes[0])
    assert (alive(relu), alive(neg)) == (True, False)
    first.analysis(graphs[1], reading)
    assert calls == graphs


def test_the_registry_runs_each_rewrite_in_its_declared_order():
    """Every ``runs_before`` / ``runs_after`` a rewrite declares holds in the registry's order
    (the order the pass runs them in, ``REWRITE_NAMES``)."""
    from kda_inductor.patterns import REWRITES

    at = {name: i for i, name in enumerate(REWRITE_NAMES)}
    declared = [(name, later) for name, cls in REWRITES.items() for later in cls.runs_before]
    declared += [(earlier, name) for name, cls in REWRITES.items() for earlier in cls.runs_after]
    assert ("indexer_k_write", "indexer_k_gather") in declared and ("gated_norm_quant", "gated_norm_merge") in declared
    assert [(a, b) for a, b in declared if at[a] > at[b]] == []


def _rewrite(name, before=(), after=()):
    from kda_inductor.patterns.base import Rewrite

    return type(name, (Rewrite,), {"name": name, "runs_before": tuple(before), "runs_after": tuple(after)})


def test_ordered_is_a_stable_topological_order():
    from kda_inductor.patterns.base import ordered

    a, b, c, d = _rewrite("a"), _rewrite("b", before=["a"]), _rewrite("c"), _rewrite("d", after=["a"])
    assert list(ordered([a, c, d])) == ["a", "c", "d"]  # no constraint moves anything
    assert list(ordered([a, b, c, d])) == ["b", "a", "c", "d"]
    assert list(ordered([d, c, a])) == ["c", "a", "d"]


def test_a_cycle_or_an_unknown_name_in_the_order_is_an_error():
    from kda_inductor.patterns.base import ordered

    with pytest.raises(ValueError, match="cycle among"):
        ordered([_rewrite("a", before=["b"]), _rewrite("b", before=["c"]), _rewrite("c", before=["a"])])
    with pytest.raises(ValueError, match="cycle among"):
        ordered([_rewrite("a", after=["b"]), _rewrite("b", after=["a"])])
    with pytest.raises(ValueError, match=r"unregistered rewrites: nope \(in a's order\)"):
        ordered([_rewrite("a", before=["nope"])])


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports at its top level (``TYPE_CHECKING`` blocks
    included: a type hint is a dependency too); ``from pkg import module`` is that module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    body = [*tree.body, *(n for stmt in tree.body if isinstance(stmt, ast.If) for n in stmt.body)]
    found = set()
    for node in body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= subs or {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found & modules


def test_no_import_cycle():
    """No two modules of the package import each other, directly or around a loop (the pass
    manager, the logs and the diff used to, for ``PassRecord``'s type hints)."""
    paths = {_module(p): p for p in (ROOT / "kda_inductor").rglob("*.py")}
    graph = {m: _module_imports(p, set(paths)) for m, p in paths.items()}
    cycles = []

    def visit(m, stack):
        for n in sorted(graph[m]):
            if n in stack:
                cycles.append(" -> ".join([*stack[stack.index(n):], n]))
            elif n not in done:
                visit(n, [*stack, n])
        done.add(m)

    done: set[str] = set()
    for m in sorted(graph):
        if m not in done:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
    assert "kda_inductor.pass_manager" not in graph["kda_inductor.logs"] | graph["kda_inductor.diff"]


def test_no_lowering_imports_another_lowerings_private_names():
    """Helpers two lowerings share are public in their module (``gated_norm_merge``'s tile,
    ``_fp8``'s roundings): no ``from kda_inductor.lowerings.x import _private``."""
    modules = {_module(p) for p in (ROOT / "kda_inductor").rglob("*.py")}
    found = []
    for p in sorted((ROOT / "kda_inductor" / "lowerings").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kda_inductor.lowerings"):
                found += [f"{p.name}:{node.lineno} {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and f"{node.module}.{a.name}" not in modules]
    assert not found, found
