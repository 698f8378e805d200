"""``kda_inductor.explain``: what the backend did to a function, and what kept it slow."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from kda_inductor import pass_manager
from kda_inductor.patterns import REWRITE_NAMES, REWRITES

_DATA_DEPENDENT = re.compile(r"data[- ]dependent", re.IGNORECASE)


@dataclasses.dataclass
class GraphReport:
    """One graph Inductor compiled: our pass's view of it."""

    matches: dict[str, int]
    before: str
    after: str
    errors: dict[str, str]


@dataclasses.dataclass
class GraphBreak:
    reason: str
    """Dynamo's reason, in a line, and where it happened."""
    detail: str
    """Dynamo's whole message."""
    count: int


@dataclasses.dataclass
class EagerFrame:
    """A frame Dynamo gave up on: it runs in eager, uncompiled."""

    name: str
    location: str
    reason: str
    hint: str | None


@dataclasses.dataclass
class Report:
    """What ``explain`` found. ``print(report)`` gives a readable summary."""

    matches: dict[str, int]
    """Every registered rewrite -> how many times it replaced code (zeros included)."""
    graphs: list[GraphReport]
    graph_breaks: list[GraphBreak]
    eager_frames: list[EagerFrame]

    @property
    def before(self) -> str:
        """Post-grad FX graph text before our pass (all graphs)."""
        return "\n".join(g.before for g in self.graphs)

    @property
    def after(self) -> str:
        """Post-grad FX graph text after our pass (all graphs)."""
        return "\n".join(g.after for g in self.graphs)

    def __str__(self) -> str:
        width = max(len(n) for n in self.matches)
        lines = [f"kda_inductor: {len(self.graphs)} graph(s) compiled", "", "rewrite matches:"]
        lines += [f"  {name:<{width}}  {count}" for name, count in self.matches.items()]
        for i, g in enumerate(self.graphs):
            for name, err in g.errors.items():
                lines.append(f"  graph {i}: {name} failed and was skipped: {err}")
        lines += ["", f"graph breaks: {sum(b.count for b in self.graph_breaks)}"]
        lines += [f"  [{b.count}x] {b.reason}" for b in self.graph_breaks]
        lines += ["", f"frames that fell back to eager: {len(self.eager_frames)}"]
        for f in self.eager_frames:
            lines.append(f"  {f.name} ({f.location}): {f.reason}")
            if f.hint:
                lines.append(f"    hint: {f.hint}")
        return "\n".join(lines)


class _DynamoLogCapture(logging.Handler):
    """Collects Dynamo's graph-break and skipped-frame messages while compiling.

    Reads the ``graph_breaks`` log artifact and the INFO messages of the frame
    converter, whose text has been stable from torch 2.9 on (counters are not:
    2.9 counts no graph break for a frame it skips).
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[tuple[str, str]] = []  # (kind, text)

    def emit(self, record: logging.LogRecord) -> None:
        kind = "break" if record.name.endswith("__graph_breaks") else "info"
        self.messages.append((kind, record.getMessage()))

    @contextlib.contextmanager
    def attached(self) -> Iterator[_DynamoLogCapture]:
        import torch._dynamo.convert_frame  # noqa: F401  (creates the loggers)

        names = [
            n
            for n in list(logging.root.manager.loggerDict)
            if n.startswith("torch._dynamo.")
            and (n.endswith(".__graph_breaks") or n in _INFO_LOGGERS)
        ]
        saved = []
        for name in names:
            lg = logging.getLogger(name)
            saved.append((lg, lg.level, lg.propagate, lg.disabled))
            lg.setLevel(logging.DEBUG if name.endswith("__graph_breaks") else logging.INFO)
            lg.propagate, lg.disabled = False, False
            lg.addHandler(self)
        try:
            yield self
        finally:
            for lg, level, propagate, disabled in saved:
                lg.removeHandler(self)
                lg.setLevel(level)
                lg.propagate, lg.disabled = propagate, disabled


_INFO_LOGGERS = ("torch._dynamo.symbolic_convert", "torch._dynamo.convert_frame")
_BREAK = re.compile(r"Graph break in user code at (?P<where>\S+)\s*\nGraph Break Reason: (?P<reason>.*)", re.S)
_PREAMBLE = re.compile(r"^(Failed to handle graph break gracefully|Graph break encountered)")
_SKIPS = (
    re.compile(r"Skipping frame because (?P<why>[^\n]+)\n<FrameSummary file (?P<file>.+?), line (?P<line>\d+) in (?P<name>\S+)>"),
    re.compile(r"WON'T CONVERT (?P<name>\S+) (?P<file>\S+) line (?P<line>\d+)"),
)


def _summary(reason: str) -> str:
    """The first informative line of a graph-break reason."""
    for line in reason.splitlines():
        line = line.strip()
        if line and not _PREAMBLE.match(line):
            return line
    return reason.strip()


def _hint(reason: str) -> str | None:
    if not _DATA_DEPENDENT.search(reason):
        return None
    forms = [cls.eager_form_hint for cls in REWRITES.values() if cls.eager_form_hint]
    return (
        "branching on tensor values (and reading them on the host) cannot be traced; "
        "write the code without host syncs. " + "; ".join(forms)
    )


def _parse(messages: list[tuple[str, str]]) -> tuple[list[GraphBreak], list[EagerFrame]]:
    breaks: dict[str, GraphBreak] = {}
    frames: dict[tuple[str, str], EagerFrame] = {}
    last_reason = ""
    for kind, text in messages:
        if kind == "break" and (m := _BREAK.search(text)):
            last_reason = m["reason"]
            key = f"{_summary(last_reason)} at {m['where']}"
            if key in breaks:
                breaks[key].count += 1
            else:
                breaks[key] = GraphBreak(key, text, 1)
            continue
        for pattern in _SKIPS:
            if m := pattern.search(text):
                key = (m["name"], m["file"])
                if key not in frames:
                    cause = _summary(last_reason) if last_reason else m.groupdict().get("why", "")
                    hint = _hint(last_reason or text)
                    frames[key] = EagerFrame(m["name"], f"{m['file']}:{m['line']}", cause, hint)
                break
    return list(breaks.values()), list(frames.values())


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Report:
    """Compile ``fn`` with ``backend="kda_inductor"`` on these inputs and report.

    Resets Dynamo first (like ``torch._dynamo.explain``) and compiles with
    Inductor's caches off so that every graph really goes through our pass.
    ``fn`` is called once; its result is discarded.
    """
    import torch._dynamo

    torch._dynamo.reset()
    with (
        _DynamoLogCapture().attached() as capture,
        pass_manager.observe() as records,
        torch._inductor.config.patch(force_disable_caches=True),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("ignore", message=".*force disabled by.*force_disable_caches")
        torch.compile(fn, backend="kda_inductor")(*args, **kwargs)
    breaks, frames = _parse(capture.messages)
    graphs = [GraphReport(r["matches"], r["before"], r["after"], r["errors"]) for r in records]
    matches = {name: sum(g.matches.get(name, 0) for g in graphs) for name in REWRITE_NAMES}
    return Report(
        matches=matches,
        graphs=graphs,
        graph_breaks=breaks,
        eager_frames=frames,
    )
