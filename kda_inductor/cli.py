"""The kda-inductor command.

    kda-inductor rewrites [--markdown]   the registered rewrites, in the order the pass runs them
                                         (--markdown: as the README's table)
    kda-inductor graph-diff TARGET [--rewrite NAME] [--mode MODE] [--force] [--grad]
                                   [--explain-misses] [--html FILE] [--color auto|always|never]
                                   [--traceback]

TARGET names a function that builds what to compile:

  path/to/file.py              calls the file's build()
  path/to/file.py:make_thing   calls make_thing()
  package.module:function      importable from the current directory or sys.path

The function takes no arguments and returns (fn, args) or (fn, args, kwargs): fn is a
module or function, called once as fn(*args, **kwargs), compiled with
backend="kda_inductor" and Inductor's caches off. It runs under torch.inference_mode()
(serving code; the fused ops have no backward), unless --grad is given.

For maintainers, from a checkout (not listed by the command's help):

    python -m kda_inductor.cli update-docs [README.md]   rewrite README.md's rewrite table and
                                                         docs/rewrites.md from the registry
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any

from kda_inductor.options import mode_as_options
from kda_inductor.patterns import REWRITE_NAMES


def _builders(module: Any) -> list[str]:
    """Functions of ``module`` (defined there) that can be called with no arguments,
    ``build*`` / ``make*`` first: candidates for TARGET's builder."""
    found = []
    for name, obj in vars(module).items():
        if name.startswith("_") or not inspect.isfunction(obj) or obj.__module__ != module.__name__:
            continue
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):  # pragma: no cover
            continue
        if all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in sig.parameters.values()):
            found.append(name)
    return sorted(found, key=lambda n: (not n.startswith(("build", "make")), n))


class TargetError(SystemExit):
    """TARGET could not be loaded or built: the message says why in a few lines (exit status 1);
    ``error`` is the user code's exception, if any (``--traceback`` prints it)."""

    error: BaseException | None = None


def _where(exc: BaseException, files: set[str]) -> str:
    """``"  at file.py:12 in build: <code>"`` for the innermost frame of ``exc``'s traceback in
    one of ``files`` (the target's), else its innermost frame outside this module and
    importlib; "" without one."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<frozen") and f.filename != __file__]
    ours = [f for f in frames if str(Path(f.filename).resolve()) in files] or frames[-1:]
    if not ours:
        return ""
    f = ours[-1]
    code = f": {f.line.strip()}" if f.line else ""
    return f"\n  at {_short(f.filename)}:{f.lineno} in {f.name}{code}"


def _short(filename: str) -> str:
    try:
        return os.path.relpath(filename)
    except ValueError:  # pragma: no cover - another drive on Windows
        return filename


def _failed(what: str, exc: BaseException, files: set[str]) -> TargetError:
    lines = str(exc).strip().splitlines()
    message = f"{type(exc).__name__}: {lines[0] if lines else ''}" + (" ..." if len(lines) > 1 else "")
    err = TargetError(f"graph-diff: {what} raised {message}{_where(exc, files)}\n"
                      f"  (--traceback shows the whole traceback)")
    err.error = exc
    return err


def load_target(spec: str) -> tuple[Any, tuple, dict]:
    """Import TARGET and call its builder; returns ``(fn, args, kwargs)``. Every failure (no
    such file, an import that fails, no such builder, a builder that needs arguments, raises
    or returns something else) is a :class:`TargetError` with a short message."""
    path, _, func = spec.partition(":")
    if path.endswith(".py") or os.sep in path or Path(path).is_file():
        module, files = _import_file(path)
    else:
        module, files = _import_module(path, spec)
    func = func or "build"
    return _build(_builder(module, path, func), func, files)


def _import_file(path: str) -> tuple[Any, set[str]]:
    """TARGET's file as a module (its folder first on ``sys.path``), and the files that are the
    target's (for the line of a failure)."""
    file = Path(path)
    if not file.is_file():
        raise TargetError(f"graph-diff: no such file: {path}")
    name = f"_kda_target_{file.stem}"
    module_spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    sys.path.insert(0, str(file.resolve().parent))
    files = {str(file.resolve())}
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's module: say what failed, briefly
        sys.modules.pop(name, None)
        raise _failed(f"importing {path}", exc, files) from None
    return module, files


def _import_module(path: str, spec: str) -> tuple[Any, set[str]]:
    """TARGET's ``package.module``, importable from the current directory or ``sys.path``."""
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(path)
    except Exception as exc:  # noqa: BLE001
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        if missing and f"{path}.".startswith(f"{missing}."):
            raise TargetError(f"graph-diff: no module named {missing!r} (TARGET {spec}: file.py[:builder], or "
                              "package.module:builder importable from the current directory or sys.path)"
                              ) from None
        raise _failed(f"importing {path}", exc, set()) from None
    return module, {str(Path(module.__file__).resolve())} if getattr(module, "__file__", None) else set()


def _builder(module: Any, path: str, func: str) -> Any:
    """``module.func``, a function that takes no arguments, or a TargetError naming the ones
    that do."""
    builder = getattr(module, func, None)
    if not callable(builder):
        candidates = [b for b in _builders(module) if b.startswith(("build", "make"))] or _builders(module)
        hint = (f"; its functions that take no arguments: {', '.join(candidates)} (e.g. "
                f"kda-inductor graph-diff {path}:{candidates[0]})" if candidates else
                "; it has no function that takes no arguments")
        raise TargetError(f"graph-diff: {path} has no function {func}(){hint}. See --help for the convention.")
    try:
        inspect.signature(builder).bind()
    except TypeError:
        others = [b for b in _builders(module) if b != func]
        hint = f" ({path}'s functions that take none: {', '.join(others)})" if others else ""
        raise TargetError(f"graph-diff: {func}{inspect.signature(builder)} needs arguments; TARGET names a "
                          f"function that takes none{hint}. See --help for the convention.") from None
    except ValueError:  # pragma: no cover - no signature (a builtin): call it and see
        pass
    return builder


def _build(builder: Any, func: str, files: set[str]) -> tuple[Any, tuple, dict]:
    """Call the builder: ``(fn, args, kwargs)``, or a TargetError saying what it did instead."""
    try:
        built = builder()
    except Exception as exc:  # noqa: BLE001
        raise _failed(f"{func}()", exc, files) from None
    if not isinstance(built, tuple) or len(built) not in (2, 3):
        raise TargetError(f"graph-diff: {func}() must return (fn, args) or (fn, args, kwargs), "
                          f"got {type(built).__name__}")
    fn, args, kwargs = (*built, {}) if len(built) == 2 else built
    return fn, tuple(args), dict(kwargs)


def _use_color(choice: str) -> bool:
    if choice == "always":
        return True
    if choice == "never":
        return False
    return sys.stdout.isatty() and os.environ.get("NO_COLOR") is None


def compile_settings(mode: str | None, rewrite: str | None, force: bool) -> tuple[str | None, dict | None]:
    """``(mode, options)`` for ``torch.compile``: with kda options, the mode is spelled as the
    Inductor options it stands for (torch.compile takes one or the other)."""
    kda: dict[str, Any] = {}
    if rewrite:
        kda["disable"] = [n for n in REWRITE_NAMES if n != rewrite]
    if force:
        kda["force"] = True
    if not kda:
        return mode, None
    return None, mode_as_options(mode, {"kda": kda})


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kda-inductor graph-diff",
        description="Compile a model with backend='kda_inductor' and show what our pass changed.",
        epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", help="file.py[:builder] or package.module:builder")
    p.add_argument("--rewrite", choices=REWRITE_NAMES, help="run only this rewrite")
    p.add_argument("--mode", help='torch.compile mode (e.g. "reduce-overhead" to see cudagraph skips)')
    p.add_argument("--force", action="store_true",
                   help="rewrite wherever a pattern matches, ignoring the speed rules that leave code to "
                        "Inductor where our op is not faster (e.g. on CPU)")
    p.add_argument("--grad", action="store_true",
                   help="keep grad mode on (default: run under torch.inference_mode(); graphs traced with "
                        "grad enabled are not rewritten)")
    p.add_argument("--explain-misses", action="store_true",
                   help="for rewrites that found nothing: the closest candidates, at your source line, "
                        "and the check that rejected them")
    p.add_argument("--html", metavar="FILE", help="also write the report as one HTML page")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    p.add_argument("--traceback", action="store_true",
                   help="when importing or building the target fails, print the whole traceback")
    return p


def graph_diff(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    grad = "grad mode on (--grad)" if args.grad else "torch.inference_mode() (--grad keeps grad)"
    report = _compile_target(args, grad)
    color = _use_color(args.color)
    shown = [args.rewrite] if args.rewrite else list(REWRITE_NAMES)
    out = [""]
    for i, g in enumerate(report.graphs):
        out += _graph_lines(i, g, shown, args.explain_misses, color)
    if not report.graphs:
        out.append("no graph was compiled (everything ran in eager)")
    out.append(report.obstacles())
    print("\n".join(out))
    if args.html:
        from kda_inductor.report_html import page

        notes = [f"Target: {args.target}; run under {grad}."]
        Path(args.html).write_text(page(report, title=f"kda_inductor report: {args.target}", notes=notes),
                                   encoding="utf-8")
        print(f"\nwrote {args.html}")
    return 0


def _compile_target(args: argparse.Namespace, grad: str) -> Any:
    """Build TARGET and compile it with the backend under the command's settings, a live line
    saying what runs; returns the ``explain`` report."""
    import contextlib

    import torch

    from kda_inductor._explain import Explainer
    from kda_inductor.progress import compile_progress

    mode, options = compile_settings(args.mode, args.rewrite, args.force)
    settings = [f"mode={args.mode}" if args.mode else None, f"only {args.rewrite}" if args.rewrite else None,
                "force (speed rules off)" if args.force else None]
    title = f"graph-diff {Path(args.target.partition(':')[0]).name}"
    with compile_progress(title) as step:
        step("building the target")
        try:
            fn, fargs, fkwargs = load_target(args.target)
        except TargetError as err:
            if args.traceback and err.error is not None:
                import traceback

                traceback.print_exception(type(err.error), err.error, err.error.__traceback__)
            raise
    print(f"graph-diff {args.target}: compiled with backend='kda_inductor'"
          f"{''.join(f', {s}' for s in settings if s)}; run under {grad}")
    with compile_progress(title) as step:
        step("compiling (Dynamo, AOTAutograd, our pass, Inductor)")
        with contextlib.nullcontext() if args.grad else torch.inference_mode():
            report = Explainer(mode=mode, options=options)(fn, *fargs, **fkwargs)
        step("writing the report")
    return report


def _graph_lines(i: int, g: Any, shown: list[str], explain_misses: bool, color: bool) -> list[str]:
    """One compiled graph's part of the output: its rewrite table, why it was not rewritten,
    its diff (or why it is empty), and with ``--explain-misses`` the closest misses."""
    out = [_bold(f"=== graph {i} ===", color), *g.table(), ""]
    if g.skipped:
        out += [f"not rewritten: {g.skipped}", ""]
    diff = g.diff(color=color, title=f"graph {i}")
    out += [diff] if diff else _unchanged(g, shown, listed=explain_misses)
    out.append("")
    if explain_misses and not g.skipped:
        out += [*_miss_lines(g, shown), ""]
    return out


def _miss_lines(g: Any, shown: list[str]) -> list[str]:
    """``--explain-misses``: for each shown rewrite that found nothing in graph ``g``, its
    closest candidates at the user's source lines (with the line's code)."""
    from kda_inductor.diff import readable_names, short_location

    names = readable_names(g.record.before_nodes, g.record.after_nodes)
    out = []
    for rewrite in shown:
        if g.matches.get(rewrite):
            continue
        misses = g.misses.get(rewrite, [])
        out.append(f"{rewrite}: no match" + ("; closest candidates:" if misses else "; no candidate node at all"))
        for m in misses:
            where = f"{short_location(m.location)}: " if m.location else ""
            out.append(f"  {where}not rewritten: {m.check} (node {names.get(m.node, m.node)})")
            if m.code:
                out.append(f"      {m.code}")
    return out


LEFT = "left to Inductor: "
"""How a speed rule's miss reads (``pass_manager``)."""


def _unchanged(g: Any, shown: list[str], *, listed: bool) -> list[str]:
    """Why a graph's diff is empty: the speed rules' reasons, per rewrite and source line (unless
    ``--explain-misses`` lists them), or where to look."""
    from kda_inductor.diff import short_location

    left = {(name, m.location, m.check): m for name in shown for m in g.misses.get(name, [])
            if m.check.startswith(LEFT)}
    if not left:
        return ["(our pass changed nothing" + ("" if listed or g.skipped else "; --explain-misses says why") + ")"]
    lines = ["(our pass changed nothing: the speed rules left these matches to Inductor, whose code is faster "
             "here; --force rewrites them anyway)"]
    for (name, location, check) in ([] if listed else left):
        where = f"{short_location(location)}: " if location else ""
        lines.append(f"  {name}: {where}{check}")
    return lines


def _bold(text: str, color: bool) -> str:
    return f"\x1b[1m{text}\x1b[0m" if color else text


def rewrites(argv: list[str]) -> int:
    """``kda-inductor rewrites [--markdown]``: the registered rewrites, in the order the pass runs
    them, as a table for the terminal (wrapped to its width); ``--markdown``: the README's table."""
    from kda_inductor.patterns import markdown_table

    p = argparse.ArgumentParser(prog="kda-inductor rewrites")
    p.add_argument("--markdown", action="store_true", help="the README's markdown table (with links)")
    args = p.parse_args(argv)
    print(markdown_table() if args.markdown else terminal_table(), end="")
    return 0


def terminal_table(width: int | None = None) -> str:
    """The registered rewrites as plain text: one block a rewrite, its name then what it finds and
    what it becomes, wrapped to ``width`` (the terminal's, at most 100 columns)."""
    import shutil
    import textwrap

    from kda_inductor.patterns import REWRITES

    width = width or min(shutil.get_terminal_size((100, 24)).columns, 100)
    name_w = max(map(len, REWRITES)) + 2
    lines = []
    for name, cls in REWRITES.items():
        for i, (label, text) in enumerate((("finds", cls.finds), ("becomes", cls.becomes))):
            body = textwrap.wrap(f"{label}: {text.replace('`', '')}", width - name_w) or [""]
            lines += [f"{name if i == 0 and j == 0 else '':<{name_w}}{line}" for j, line in enumerate(body)]
        lines.append("")
    return "\n".join(lines)


def update_docs(argv: list[str]) -> int:
    """``python -m kda_inductor.cli update-docs [FILE]`` (maintainers): replace the rewrite table
    in ``FILE`` (README.md by default: the lines from its header row to the next blank line) with
    the registry's, and write ``docs/rewrites.md`` beside it (every spelling of each rewrite)."""
    from kda_inductor.patterns import markdown_table, rewrites_page

    path = Path(argv[0] if argv else "README.md")
    table = markdown_table()
    text = path.read_text(encoding="utf-8")
    start = text.find(table.splitlines()[0])
    if start < 0:
        print(f"update-docs: no rewrite table (a line '{table.splitlines()[0]}') in {path}", file=sys.stderr)
        return 1
    end = text.find("\n\n", start)
    path.write_text(text[:start] + table + text[end + 1 if end >= 0 else len(text):], encoding="utf-8")
    page = path.parent / "docs" / "rewrites.md"
    page.parent.mkdir(exist_ok=True)
    page.write_text(rewrites_page(), encoding="utf-8")
    return 0


COMMANDS = {"graph-diff": graph_diff, "rewrites": rewrites}
MAINTAINER_COMMANDS = {"update-docs": update_docs}
"""Run as ``python -m kda_inductor.cli NAME``; not listed by the help (they write files of a checkout)."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"kda-inductor {version('kda-inductor')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            print("kda-inductor (not installed: no version)")
        return 0
    commands = {**COMMANDS, **MAINTAINER_COMMANDS}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print(f"usage: kda-inductor {{{','.join(COMMANDS)}}} ...\n\n{__doc__.strip()}")
        return 0 if argv[:1] in ([], ["-h"], ["--help"]) else 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
