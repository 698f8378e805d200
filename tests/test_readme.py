"""Every command and snippet in README.md and in the pages of ``docs/`` runs as written.

Extracts the fenced blocks of README.md (and of ``README_*.md`` drafts beside it) and of every
``docs/*.md`` (found by name: a new page is covered as it is added):

* ``bash`` / ``sh`` / ``shell`` / ``console`` blocks run as one bash script (``set -e``) in a
  scratch folder that holds the repository's files and ``tests/readme_standins/`` (stand-ins
  for placeholder files such as ``my_model.py``). ``pip install ...`` and ``pytest`` commands
  are left out (that is what CI itself runs); a ``vllm serve ... --compilation-config JSON``
  line (no vLLM here) is checked instead: the JSON parses and every ``inductor_passes`` name
  resolves the way vLLM resolves it, to a callable with a ``uuid()``.
* ``python`` blocks run in a fresh namespace after ``tests/readme_standins/snippets.py``
  (stand-ins for placeholder names such as ``model``, ``fn``, ``args``).

A block opts out with ``<!-- readme-test: skip (why) -->`` on the line before its fence, runs
only where a command is installed with ``<!-- readme-test: needs COMMAND (why) -->`` (skipped,
saying so, where it is not), and gets extra stand-ins with ``<!-- readme-test: setup`` ...
``-->`` (Python code run first).
Both are HTML comments: invisible on the rendered page.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STANDINS = Path(__file__).with_name("readme_standins")
SHELLS = {"bash", "sh", "shell", "console"}
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_DIRECTIVE = re.compile(r"<!--\s*readme-test:\s*(skip|setup|needs)\b(.*?)-->\s*$", re.S)
_LEFT_OUT = re.compile(r"^\s*(pip3?|python3? -m pip|uv pip) install\b|^\s*(python3? -m )?pytest\b")


@dataclasses.dataclass
class Block:
    file: str
    line: int
    lang: str
    code: str
    skip: str | None = None
    setup: str = ""
    needs: str | None = None
    """A command the block runs that is installed separately (``needs`` directive)."""

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}-{self.lang}"


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    found = []
    for m in _FENCE.finditer(text):
        lang = m.group(1).lower()
        if lang not in SHELLS and lang != "python":
            continue
        block = Block(_name(path), text.count("\n", 0, m.start()) + 1, lang, m.group(2))
        before = text[:m.start()].rstrip()
        if (d := re.search(r"<!--[^<]*?-->\s*\Z", before, re.S)) and (dm := _DIRECTIVE.search(d.group(0))):
            if dm.group(1) == "skip":
                block.skip = dm.group(2).strip() or "opted out"
            elif dm.group(1) == "needs":
                command, _, why = dm.group(2).strip().partition(" ")
                if shutil.which(command, path=_search_path()) is None:
                    block.skip = f"{command} is not installed {why.strip()}".strip()
                block.needs = command
            else:
                block.setup = dm.group(2)
        found.append(block)
    return found


def _name(path: Path) -> str:
    """``README.md``, ``docs/vllm.md``: the file as the repository names it (ids, messages)."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.name


def _search_path() -> str:
    """PATH as the shell blocks get it: this Python's scripts first."""
    return f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def _pages() -> list[Path]:
    """README.md, its ``README_*.md`` drafts and every page in ``docs/``."""
    return [ROOT / "README.md", *sorted(ROOT.glob("README_*.md")), *sorted((ROOT / "docs").glob("*.md"))]


def _all_blocks() -> list[Block]:
    return [b for f in _pages() if f.is_file() for b in blocks(f)]


BLOCKS = _all_blocks()


def test_readme_has_snippets():
    assert any(b.file == "README.md" and b.lang in SHELLS for b in BLOCKS)
    assert any(b.file == "README.md" and b.lang == "python" for b in BLOCKS)
    assert any(b.file.startswith("docs/") and b.lang in SHELLS for b in BLOCKS)  # the docs are covered
    assert any(b.file.startswith("docs/") and b.lang == "python" for b in BLOCKS)


def test_readme_stays_short_and_links_the_docs():
    """The README a newcomer reads: at most 150 lines, and a link to the docs folder (every page
    there is one click away)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    assert "](docs/)" in text


def test_relative_links_resolve():
    """Every relative link of README.md and the docs pages names a file or folder that exists."""
    broken = [f"{_name(page)}: {link}" for page in _pages() if page.is_file()
              for link in re.findall(r"\]\(([^)#\s]+)[^)]*\)", page.read_text(encoding="utf-8"))
              if "://" not in link and not (page.parent / link).exists()]
    assert not broken, broken


def test_directives_are_read(tmp_path):
    (tmp_path / "R.md").write_text("x\n<!-- readme-test: skip (needs a GPU) -->\n```bash\nnvidia-smi\n```\n"
                                   "<!-- readme-test: setup\nmodel = 1\n-->\n```python\nprint(model)\n```\n"
                                   "```text\nnot code\n```\n")
    (tmp_path / "N.md").write_text("<!-- readme-test: needs no-such-command-kda (pip install it) -->\n"
                                   "```bash\nno-such-command-kda\n```\n"
                                   "<!-- readme-test: needs bash -->\n```bash\nbash -c true\n```\n")
    missing, present = blocks(tmp_path / "N.md")
    assert missing.needs == "no-such-command-kda"
    assert missing.skip == "no-such-command-kda is not installed (pip install it)"
    assert (present.needs, present.skip) == ("bash", None)
    skip, setup = blocks(tmp_path / "R.md")
    assert (skip.line, skip.skip, skip.code) == (3, "(needs a GPU)", "nvidia-smi\n")
    assert setup.skip is None and setup.setup.strip() == "model = 1" and setup.code == "print(model)\n"
    assert _shell_script("pip install -e . && python x.py  # run\npython -m pytest -q\n") == ("python x.py  # run", [])


def _logical_lines(code: str) -> list[str]:
    return re.sub(r"\\\n\s*", " ", code).splitlines()


def _shell_script(code: str) -> tuple[str, list[str]]:
    """The block as a bash script without the install / pytest commands; ``vllm`` lines apart."""
    kept, vllm = [], []
    for line in _logical_lines(code):
        if re.match(r"^\s*vllm\b", line):
            vllm.append(line)
            continue
        parts = [p for p in line.split("&&") if not _LEFT_OUT.search(p)]
        if parts and "".join(parts).strip():
            kept.append("&&".join(parts).strip())
    return "\n".join(kept), vllm


def _check_vllm_line(line: str) -> None:
    """``vllm serve MODEL --compilation-config JSON``: the JSON parses and each pass name resolves
    as vLLM's CompilationConfig resolves it (``__import__(module).__dict__[name]``)."""
    argv = shlex.split(line.split("#")[0])
    assert argv[:2] == ["vllm", "serve"], line
    configs = [argv[i + 1] for i, a in enumerate(argv) if a in ("--compilation-config", "-O") and i + 1 < len(argv)]
    configs += [a.split("=", 1)[1] for a in argv if a.startswith("--compilation-config=")]
    assert configs, f"no --compilation-config in {line!r}"
    for raw in configs:
        config = json.loads(raw)
        for hook, qualname in config.get("inductor_passes", {}).items():
            assert hook in ("post_grad_custom_pre_pass", "post_grad_custom_post_pass"), hook
            module, _, name = qualname.rpartition(".")
            obj = __import__(module).__dict__[name]
            assert callable(obj) and callable(getattr(obj, "uuid", None)), qualname


def _scratch(tmp_path: Path) -> Path:
    """The repository's files (linked) plus the stand-ins, for commands that write files."""
    work = tmp_path / "work"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".git", ".venv", "out", "__pycache__"):
            (work / entry.name).symlink_to(entry)
    for entry in STANDINS.iterdir():
        if entry.name not in ("README.md", "__pycache__"):
            target = work / entry.name
            if entry.is_dir():
                shutil.copytree(entry, target)
            else:
                shutil.copy(entry, target)
    return work


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang in SHELLS], ids=lambda b: b.id)
def test_shell_block_runs(block: Block, tmp_path):
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    script, vllm_lines = _shell_script(block.code)
    for line in vllm_lines:
        _check_vllm_line(line)
    if not script.strip():
        return
    work = _scratch(tmp_path)
    env = {**os.environ, "PATH": _search_path(),
           "OMP_NUM_THREADS": "1", "NO_PROGRESS": "1", "PYTHONPATH": str(work)}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, (
        f"{block.id} failed (exit {done.returncode}):\n{script}\n--- stdout (end)\n{done.stdout[-3000:]}\n"
        f"--- stderr (end)\n{done.stderr[-3000:]}\nA placeholder needs a stand-in in tests/readme_standins/, "
        "or the block a <!-- readme-test: skip (why) --> comment.")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "python"], ids=lambda b: b.id)
def test_python_block_runs(block: Block, tmp_path, monkeypatch):
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    import torch

    work = _scratch(tmp_path)
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))
    namespace: dict = {"__name__": "readme_snippet"}
    exec(compile((STANDINS / "snippets.py").read_text(), str(STANDINS / "snippets.py"), "exec"), namespace)
    torch._dynamo.reset()
    try:
        if block.setup:
            exec(compile(block.setup, f"{block.id} (setup)", "exec"), namespace)
        exec(compile(block.code, block.id, "exec"), namespace)
    except NameError as err:
        raise AssertionError(f"{block.id}: {err}: give the placeholder a stand-in in "
                             "tests/readme_standins/snippets.py or a <!-- readme-test: setup --> comment") from err
    finally:
        torch._dynamo.reset()
        torch._logging.set_logs()  # a block that turns logs on (docs/inspecting.md) leaves them as found


def test_rewrite_table_is_the_registry(tmp_path):
    """The README's rewrite table is ``kda-inductor rewrites``' output: every registered rewrite,
    in registry order, with its pattern class's ``finds`` / ``becomes`` (a new rewrite needs no
    README edit: regenerate the table), and ``docs/rewrites.md`` is the registry's page (every
    spelling). The commands' output is checked too: ``kda-inductor rewrites --markdown`` prints the
    table, the maintainers' ``python -m kda_inductor.cli update-docs`` writes both, and the plain
    ``kda-inductor rewrites`` is a terminal table (no markdown, lines within 100 columns)."""
    from kda_inductor.patterns import REWRITE_NAMES, markdown_table, rewrites_page

    page = rewrites_page()
    assert (ROOT / "docs" / "rewrites.md").read_text(encoding="utf-8") == page, (
        "docs/rewrites.md differs from the registry: run `python -m kda_inductor.cli update-docs`")
    assert [line[4:-1] for line in page.splitlines() if line.startswith("## `")] == list(REWRITE_NAMES)

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = markdown_table()
    assert table in text, "README.md's rewrite table differs from the registry: run `python -m kda_inductor.cli update-docs README.md`"
    assert [line.split("`")[1] for line in table.splitlines()[2:]] == list(REWRITE_NAMES)
    run = subprocess.run([sys.executable, "-m", "kda_inductor.cli", "rewrites", "--markdown"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and run.stdout == table, run.stderr
    run = subprocess.run([sys.executable, "-m", "kda_inductor.cli", "rewrites"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "COLUMNS": "80"})
    assert run.returncode == 0 and "|" not in run.stdout and "](" not in run.stdout, run.stdout
    assert all(len(line) <= 80 for line in run.stdout.splitlines()), run.stdout
    assert [line.split()[0] for line in run.stdout.splitlines() if line and not line[0].isspace()] == list(REWRITE_NAMES)
    stale = tmp_path / "README.md"
    stale.write_text(text.replace(table, table.replace("|---|---|---|\n", "|---|---|---|\n| `old` | x | y |\n")))
    run = subprocess.run([sys.executable, "-m", "kda_inductor.cli", "update-docs", str(stale)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and stale.read_text() == text, run.stderr
    assert (tmp_path / "docs" / "rewrites.md").read_text() == page
