"""The framework's promises about the code itself (issue: a rewrite file holds only the meaning
of its computation): no function in ``kda_inductor/`` over 40 lines, pattern files within their
size bounds, no interpreter frames read, no document outside the repository cited, an import
without side effects; the registry as the only list of rewrites, so that a new rewrite costs its
pattern file, its lowering file, one registry line, its tests, its corpus cases
(``tests/spellings/cases_*.py``, found by name) and its benchmark (``benchmarks/bench_<name>.py``,
found by name) (``docs/adding-a-rewrite.md`` says what else a rewrite may touch); the rewrites'
declared order; the shared analyses."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from kda_inductor.patterns import REWRITE_NAMES

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 40
MAX_PATTERN_FILE_LINES, MAX_BASE_LINES = 600, 450


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
    long = [f"{p.relative_to(ROOT)}:{line} {name} ({n} lines)" for p, name, line, n in _long_functions()]
    assert not long, "split these into named steps:\n" + "\n".join(long)


def test_the_bound_can_fail(tmp_path):
    body = "\n".join(f"x{i} = {i}" for i in range(MAX_LINES))
    path = tmp_path / "long.py"
    path.write_text(f"def f():\n{textwrap.indent(body, ' ' * 4)}\n\nclass C:\n    def m(self):\n"
                    f"        def inner():\n{textwrap.indent(body, ' ' * 12)}\n        return inner\n")
    assert [(name, n) for name, _, n in _functions(path)] == [
        ("long.f", MAX_LINES + 1), ("long.C.m", MAX_LINES + 3), ("long.C.m.inner", MAX_LINES + 1)]


def test_pattern_files_within_their_size_bounds():
    """A pattern file reads as its computation: every ``patterns/*.py`` at most 600 lines, the
    shared machinery (``patterns/base.py``) at most 450."""
    bound = {"base.py": MAX_BASE_LINES}
    over = [f"{p.name}: {n} lines (at most {bound.get(p.name, MAX_PATTERN_FILE_LINES)})"
            for p in sorted((ROOT / "kda_inductor" / "patterns").glob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > bound.get(p.name, MAX_PATTERN_FILE_LINES)]
    assert not over, over


FRAME_READS = {"_getframe", "_current_frames", "f_locals", "f_globals", "f_back", "tb_frame"}
INSPECT_FRAME_READS = {"currentframe", "stack", "trace", "getouterframes", "getinnerframes", "getframeinfo"}


def _frame_reads(path: Path, root: Path = ROOT) -> list[str]:
    """Reads of interpreter frames in ``path``: ``sys._getframe``, a frame's ``f_locals`` /
    ``f_back`` ..., ``inspect.currentframe`` / ``inspect.stack`` ... (attribute or imported name)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and (node.attr in FRAME_READS or (
                node.attr in INSPECT_FRAME_READS and isinstance(node.value, ast.Name) and node.value.id == "inspect")):
            found.append(f"{path.relative_to(root)}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("inspect", "sys"):
            found += [f"{path.relative_to(root)}:{node.lineno} {node.module}.{a.name}" for a in node.names
                      if a.name in FRAME_READS | INSPECT_FRAME_READS]
    return found


def test_no_interpreter_frames_read():
    """What the code decides never depends on who called it: no frame walking in ``kda_inductor/``
    (Dynamo's own state comes through its APIs: the trace's ``tx``)."""
    found = [hit for p in sorted((ROOT / "kda_inductor").rglob("*.py")) for hit in _frame_reads(p)]
    assert not found, found


def test_the_frame_and_citation_checks_can_fail(tmp_path):
    path = tmp_path / "frames.py"
    path.write_text("import sys, inspect\nfrom inspect import stack\nx = sys._getframe(1).f_locals\n"
                    "y = inspect.currentframe()\nz = torch.stack([])\n")
    assert sorted(hit.split(" ")[1] for hit in _frame_reads(path, tmp_path)) == [
        "._getframe", ".currentframe", ".f_locals", "inspect.stack"]
    path.write_text("see shared/reference.md, docs/layout.md, docs/no-such-page.md and "
                    "https://github.com/o/r/blob/main/docs/elsewhere.md\n")
    assert [hit.split(" ")[1] for hit in _outside_citations(path, tmp_path)] == [
        "shared/reference.md", "docs/no-such-page.md"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "there.md").write_text("x\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("see ../there.md, ../gone.md and ../../outside.md\n")
    assert [hit.split(" ")[1] for hit in _outside_citations(page, tmp_path)] == ["../gone.md", "../../outside.md"]


# a path-like citation of a Markdown document: folders then ``name.md``
_CITED = re.compile(r"(?<![\w/.:-])(/?(?:[\w.-]+/)+[\w.-]+\.md)\b")
_REPO_FOLDERS = {"docs", "benchmarks", "results", "tests", "kda_inductor", "integration", "examples", ".ci"}


def _outside_citations(path: Path, root: Path = ROOT) -> list[str]:
    """Documents ``path`` cites that the repository does not hold: anything under ``shared/`` or
    an absolute path, or a repository path (``docs/x.md``, ``results/x.md``) that does not exist."""
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for cited in _CITED.findall(line):
            if "://" in line.split(cited)[0][-12:]:
                continue  # part of a URL
            up = (path.parent / cited).resolve() if cited.startswith("../") else None
            outside = cited.startswith(("/", "shared/")) or (up is not None and not up.is_relative_to(root.resolve()))
            missing = (up is not None and not up.exists()) or cited.split("/")[0] in _REPO_FOLDERS and not any(
                (base / cited).exists() for base in (ROOT, ROOT / "benchmarks", ROOT / "docs", path.parent))
            if outside or missing:
                found.append(f"{path.relative_to(root)}:{number} {cited}")
    return found


def test_no_document_outside_the_repository_is_cited():
    """The facts the code and the docs rely on live in the repository (``docs/``): no citation of
    a document outside it (a shared folder, an absolute path) or of one it does not have."""
    files = [*(ROOT / "kda_inductor").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "docs").glob("*.md"),
             ROOT / "README.md", *(ROOT / "integration").glob("*.py"), *(ROOT / "examples").glob("*.py"),
             *(ROOT / "benchmarks").glob("*.py")]
    found = [hit for p in sorted(files) if p != Path(__file__).resolve() for hit in _outside_citations(p)]
    assert not found, found


def test_importing_the_package_has_no_side_effects():
    """``import kda_inductor`` (which the pytest plugin does at start-up, and vLLM's config when it
    resolves ``kda_inductor.post_grad_pass``) adds no import hook and imports neither torch nor vLLM."""
    code = ("import sys; hooks = list(sys.meta_path); import kda_inductor; "
            "assert sys.meta_path == hooks, sys.meta_path; "
            "assert not {'torch', 'vllm'} & set(sys.modules), 'imported torch or vllm'; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_every_listed_slow_test_exists():
    """``tests/slow_tests.txt`` (the tests the fast tier leaves out) names only test functions that
    exist: a renamed or deleted test cannot leave a stale line behind."""
    from tests.conftest import slow_tests

    missing = []
    for entry in sorted(slow_tests()):
        path, *names = entry.split("::")
        scope: list = ast.parse((ROOT / path).read_text(encoding="utf-8")).body if (ROOT / path).is_file() else []
        for name in names:
            found = [n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name]
            scope = found[0].body if found else []
            if not found:
                missing.append(entry)
                break
    assert not missing, missing


def test_the_spec_and_the_fp8_helpers_agree():
    """``kda_inductor.reference`` (the specification) states the fp8 constants it quantizes with;
    the ops' shared helpers (``lowerings/_fp8.py``) use the same numbers."""
    from kda_inductor import reference
    from kda_inductor.lowerings import _fp8

    assert (reference.FP8_MAX, reference.AMAX_FLOOR) == (_fp8.FP8_MAX, _fp8.AMAX_FLOOR) == (448.0, 1e-4)


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
        assert cls.finds and cls.becomes, name
        # a rewrite names the op it puts in (``kda::``) exactly where its pattern imports one of
        # our lowerings (gqa_decode_attention re-states torch's own sdpa: no op of ours)
        module = sys.modules[cls.__module__]
        lowering = any(getattr(v, "__name__", "").startswith("kda_inductor.lowerings.") and not
                       getattr(v, "__name__", "").startswith("kda_inductor.lowerings._")
                       for v in vars(module).values() if isinstance(v, types.ModuleType))
        assert ("kda::" in cls.becomes) == lowering, name


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
    """The package's modules ``path`` imports anywhere: at its top level, in ``TYPE_CHECKING``
    blocks (a type hint is a dependency too) and inside functions (an import deferred to a call
    is still a dependency, and a cycle through it is still one); ``from pkg import module`` is
    that module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= subs or {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found & modules


def test_no_import_cycle():
    """No two modules of the package import each other, directly or around a loop, at the top
    level or inside a function (the pass manager, the logs and the diff used to, for
    ``PassRecord``'s type hints; ``_dynamo_fixes`` imported the backend in a function to know
    its traces: the backend marks its compiler function instead)."""
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
    assert "kda_inductor.backend" not in graph["kda_inductor._dynamo_fixes"]  # read inside a function too


def test_no_rewrite_imports_another_rewrites_module():
    """Rewrites do not reach into each other: a pattern file imports from ``patterns/`` only the
    shared modules (``_``-prefixed: ``_merged_norms``, ``_cache_writes``, ...) and the framework
    (``base``, ``canonical``); what two rewrites both use moves there. A rewrite's later stage
    (``patterns.STAGES``) is a file of its own too, which its first stage does not import."""
    from kda_inductor.patterns import REWRITES, STAGES

    stages = [cls for classes in STAGES.values() for cls in classes]
    rewrite_modules = {cls.__module__ for cls in [*REWRITES.values(), *stages]}
    modules = {_module(p) for p in (ROOT / "kda_inductor").rglob("*.py")}
    found = [f"{p.name} imports {m}" for p in sorted((ROOT / "kda_inductor" / "patterns").glob("*.py"))
             if p.name != "__init__.py"  # the registry
             for m in sorted(_module_imports(p, modules)) if m in rewrite_modules and m != _module(p)]
    assert not found, found
    assert len(rewrite_modules) == len(REWRITES) + len(stages)  # one file per rewrite or stage
    assert set(STAGES) <= set(REWRITES) and all(cls.name == name for name, cs in STAGES.items() for cls in cs)


def test_every_shared_pattern_module_says_which_rewrites_use_it():
    """A shared module (``patterns/_*.py``) opens with a docstring naming the rewrites that use it
    (its public names are those other modules read: the rest are ``_``-prefixed)."""
    bare = []
    for p in sorted((ROOT / "kda_inductor" / "patterns").glob("_*.py")):
        doc = ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or ""
        if p.name != "__init__.py" and not any(f"``{name}``" in doc or "every rewrite" in doc for name in REWRITE_NAMES):
            bare.append(p.name)
    assert not bare, bare


def test_importing_ops_registers_every_op():
    """``import kda_inductor.ops`` (for users calling ``torch.ops.kda.*`` directly) registers the
    ops of every lowering, the fla rules' ``gdn_chunk`` among them."""
    code = ("import torch, kda_inductor.ops as ops; "
            "assert {'gated_norm_merge', 'gdn_recurrent_step', 'gdn_chunk', 'causal_conv1d'} <= set(ops.LOWERINGS); "
            "missing = [n for n in ('gated_norm_merge', 'gated_norm_quant', 'gdn_recurrent_step', 'gdn_chunk', "
            "'causal_conv1d', 'indexer_k_gather', 'indexer_k_write') if not hasattr(torch.ops.kda, n)]; "
            "assert not missing, missing; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


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
