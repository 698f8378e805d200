"""What a long compile is doing, for the command line and the demo.

    with compile_progress("compiling examples/gdn_layers.py:build_gdn") as step:
        step("loading the target")
        ...

On a terminal (stderr is a tty, ``rich`` installed) this is one live line on stderr: a
spinner, the current step, the time so far; each graph our pass finishes adds what it
replaced. When stderr is piped or redirected (CI logs, ``2>file``), or ``NO_PROGRESS`` /
``KDA_NO_PROGRESS`` is set, nothing is printed. Nothing here runs during a normal
``torch.compile``: only the tools open it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:
    from kda_inductor.record import PassRecord


def enabled(stream: Any = None) -> bool:
    """Live progress is shown: ``stream`` (stderr) is a terminal, rich is installed, and
    neither ``NO_PROGRESS`` nor ``KDA_NO_PROGRESS`` is set."""
    stream = sys.stderr if stream is None else stream
    if os.environ.get("NO_PROGRESS") or os.environ.get("KDA_NO_PROGRESS"):
        return False
    try:
        if not stream.isatty():
            return False
    except (AttributeError, ValueError):
        return False
    try:
        import rich.progress  # noqa: F401
    except ImportError:
        return False
    return True


def _graph_summary(index: int, record: PassRecord) -> str:
    done = ", ".join(f"{name} x{n}" for name, n in record.matches.items() if n)
    what = done or ("nothing rewritten: " + record.skipped if record.skipped else "nothing rewritten")
    return f"graph {index}: our pass done ({what}); Inductor generates code"


@contextlib.contextmanager
def compile_progress(title: str, *, show: bool | None = None) -> Iterator[Callable[[str], None]]:
    """Yield ``step(text)`` that sets the current step; while inside, every graph our
    pass finishes is reported too (``pass_manager.observe``). ``show`` forces it on/off."""
    show = enabled() if show is None else show
    if not show:
        yield lambda text: None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from kda_inductor import pass_manager

    console = Console(stderr=True)
    columns = (SpinnerColumn(), TextColumn("[bold]{task.fields[title]}[/bold]  {task.description}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("starting", title=title, total=None)
        graphs = [0]

        def step(text: str) -> None:
            bar.update(task, description=text)

        def on_graph(record: PassRecord) -> None:
            step(_graph_summary(graphs[0], record))
            graphs[0] += 1

        pass_manager._observers.append(on_graph)
        try:
            yield step
        finally:
            pass_manager._observers.remove(on_graph)
