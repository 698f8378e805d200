"""The framework's promises about the code itself (issue: a rewrite file holds only the meaning
of its computation): no function in ``kda_inductor/patterns/`` over 40 lines, and the registry
as the only list of rewrites, so that a new rewrite costs its pattern file, its lowering file,
one registry line, its tests, its corpus cases (``tests/spellings/cases_*.py``, found by name)
and its benchmark (``benchmarks/bench_<name>.py``, found by name) and no other edit."""

from __future__ import annotations

import ast
from pathlib import Path

from kda_inductor.patterns import REWRITE_NAMES

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 40


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_no_pattern_function_over_40_lines():
    long = [f"{p.relative_to(ROOT)}:{line} {name} ({n} lines)"
            for p in sorted((ROOT / "kda_inductor" / "patterns").glob("*.py"))
            for name, line, n in _functions(p) if n > MAX_LINES]
    assert not long, "split these into named steps:\n" + "\n".join(long)


def test_the_bound_can_fail(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    path = tmp_path / "long.py"
    path.write_text(f"def f():\n{body}\n")
    assert [n for *_, n in _functions(path)] == [MAX_LINES + 1]


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
