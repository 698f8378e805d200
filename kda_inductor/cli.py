"""The ``kda-inductor`` command.

    kda-inductor graph-diff TARGET [--rewrite NAME] [--html FILE] [--explain-misses]
                                   [--mode MODE] [--color auto|always|never]

TARGET names a function that builds what to compile:

* ``path/to/file.py`` (calls its ``build()``) or ``path/to/file.py:make_thing``;
* ``package.module:function`` (importable from the current directory or sys.path).

The function takes no arguments and returns ``(fn, args)`` or ``(fn, args, kwargs)``:
``fn`` is a module or function, called once as ``fn(*args, **kwargs)``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from kda_inductor.patterns import REWRITE_NAMES


def load_target(spec: str) -> tuple[Any, tuple, dict]:
    """Import TARGET and call its builder; returns ``(fn, args, kwargs)``."""
    path, _, func = spec.partition(":")
    if path.endswith(".py") or os.sep in path or Path(path).is_file():
        file = Path(path)
        if not file.is_file():
            raise SystemExit(f"graph-diff: no such file: {path}")
        name = f"_kda_target_{file.stem}"
        module_spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        sys.path.insert(0, str(file.resolve().parent))
        module_spec.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        module = importlib.import_module(path)
    func = func or "build"
    builder = getattr(module, func, None)
    if not callable(builder):
        raise SystemExit(f"graph-diff: {spec} has no function {func}() (see --help for the convention)")
    built = builder()
    if not isinstance(built, tuple) or len(built) not in (2, 3):
        raise SystemExit(f"graph-diff: {func}() must return (fn, args) or (fn, args, kwargs)")
    fn, args, kwargs = (*built, {}) if len(built) == 2 else built
    return fn, tuple(args), dict(kwargs)


def _use_color(choice: str) -> bool:
    if choice == "always":
        return True
    if choice == "never":
        return False
    return sys.stdout.isatty() and os.environ.get("NO_COLOR") is None


def graph_diff(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="kda-inductor graph-diff",
        description="Compile a model with backend='kda_inductor' and show what our pass changed.",
        epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", help="file.py[:builder] or package.module:builder")
    p.add_argument("--rewrite", choices=REWRITE_NAMES, help="run only this rewrite")
    p.add_argument("--html", metavar="FILE", help="also write a side-by-side HTML page")
    p.add_argument("--explain-misses", action="store_true",
                   help="for rewrites that found nothing: the closest candidates and the check that rejected them")
    p.add_argument("--mode", help='torch.compile mode (e.g. "reduce-overhead" to see cudagraph skips)')
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    args = p.parse_args(argv)

    from kda_inductor.diff import html, readable_names
    from kda_inductor.explain import Explainer

    fn, fargs, fkwargs = load_target(args.target)
    options = None
    if args.rewrite:
        options = {"kda": {"disable": [n for n in REWRITE_NAMES if n != args.rewrite]}}
        if args.mode:
            raise SystemExit("graph-diff: --mode and --rewrite cannot be combined (torch.compile "
                             "takes mode or options)")
    report = Explainer(mode=args.mode, options=options)(fn, *fargs, **fkwargs)
    color = _use_color(args.color)
    shown = [args.rewrite] if args.rewrite else list(REWRITE_NAMES)
    out = []
    for i, g in enumerate(report.graphs):
        out += [_bold(f"=== graph {i} ===", color), *g.table(), ""]
        out.append(g.diff(color=color, title=f"graph {i}") or "(our pass changed nothing)")
        out.append("")
        if args.explain_misses:
            names = readable_names(g.record["before_nodes"], g.record["after_nodes"])
            for rewrite in shown:
                if g.matches.get(rewrite):
                    continue
                misses = g.misses.get(rewrite, [])
                out.append(f"{rewrite}: no match" + ("; closest candidates:" if misses else
                                                     "; no candidate node at all"))
                out += [f"  {names.get(m.node, m.node)}: {m.check}" for m in misses]
            out.append("")
    if not report.graphs:
        out.append("no graph was compiled (everything ran in eager)")
    out.append(report.obstacles())
    print("\n".join(out))
    if args.html:
        pages = [(f"graph {i}", g.record["before_nodes"], g.record["after_nodes"])
                 for i, g in enumerate(report.graphs)]
        Path(args.html).write_text(html(pages), encoding="utf-8")
        print(f"\nwrote {args.html}")
    return 0


def _bold(text: str, color: bool) -> str:
    return f"\x1b[1m{text}\x1b[0m" if color else text


COMMANDS = {"graph-diff": graph_diff}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(f"usage: kda-inductor {{{','.join(COMMANDS)}}} ...\n\n{__doc__.strip()}")
        return 0 if argv[:1] in ([], ["-h"], ["--help"]) else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
