"""``kda_inductor.explain``: what the backend did to a function, and what kept it slow."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TYPE_CHECKING

from kda_inductor import _dynamo_substitute, logs, pass_manager
from kda_inductor.diff import records_diff, rewrite_table, short_location, unified
from kda_inductor.patterns.base import Miss, shown_misses
from kda_inductor.patterns import REWRITES

_DATA_DEPENDENT = re.compile(r"data[- ]dependent", re.IGNORECASE)

if TYPE_CHECKING:
    from kda_inductor.record import PassRecord


@dataclasses.dataclass
class GraphReport:
    """One graph Inductor compiled: our pass's view of it (see ``pass_manager.observe``)."""

    record: PassRecord = dataclasses.field(repr=False)

    @property
    def matches(self) -> dict[str, int]:
        return self.record.matches

    @property
    def errors(self) -> dict[str, str]:
        return self.record.errors

    @property
    def before(self) -> str:
        return self.record.before

    @property
    def after(self) -> str:
        return self.record.after

    @property
    def misses(self) -> dict[str, list[Miss]]:
        """Rewrite -> its closest rejected candidates a user would recognize (each with the user's
        source line; ``Miss.shown``): what ``explain()`` prints."""
        return {name: shown_misses(ms) for name, ms in self.record.misses.items()}

    @property
    def all_misses(self) -> dict[str, list[Miss]]:
        """Rewrite -> its closest rejected candidates, also those no user would look for
        (``Stage.INCIDENTAL``: logged at DEBUG only)."""
        return self.record.misses

    @property
    def skipped(self) -> str | None:
        """Why our pass rewrote nothing in this graph (e.g. traced with grad enabled), or None."""
        return self.record.skipped

    @property
    def note(self) -> str | None:
        """Why the backend compiled this graph again (stock Inductor failed on code our speed
        rules had left to it), or None."""
        return self.record.note

    def diff(self, *, color: bool = False, title: str = "graph") -> str:
        """Unified diff of the post-grad graph before/after our pass, readable node names."""
        return unified(self.record.before_nodes, self.record.after_nodes, title=title, color=color)

    def table(self) -> list[str]:
        """Rewrite table: matches, nodes removed and added (with their ops)."""
        return rewrite_table(self.record)


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
    cudagraph_skips: list[str] = dataclasses.field(default_factory=list)
    """Why Inductor did not use CUDA graphs (only with ``mode="reduce-overhead"`` etc.)."""
    compiled: Callable[..., Any] | None = dataclasses.field(default=None, repr=False, compare=False)
    """The compiled function ``explain`` ran: call it again (same guards) without compiling again."""
    traced: dict[str, int] = dataclasses.field(default_factory=dict)
    """Each trace rule (``docs/dynamo-rules.md``) -> the calls Dynamo traced as its op (in the graphs
    as they reached our pass: fla's or transformers' functions become ``kda::gdn_chunk`` /
    ``kda::gdn_recurrent_step`` before any rewrite)."""
    trace_misses: list[Any] = dataclasses.field(default_factory=list)
    """The trace rules' misses in this compile (:class:`kda_inductor._dynamo_substitute.TraceMiss`:
    a function kept, why, at the user's line)."""

    @property
    def diff(self) -> str:
        """Per compiled graph: the rewrite table and the unified before/after diff."""
        return records_diff([g.record for g in self.graphs])

    def normalized(self) -> str:
        """Op names and rewrite tables only (no node names): stable across torch versions; the
        tables list the rewrites that did something, so adding a rewrite changes no snapshot."""
        lines = []
        for i, g in enumerate(self.graphs):
            lines += [f"graph {i}", *rewrite_table(g.record, active_only=True)]
        lines.append(f"graph breaks: {len(self.graph_breaks)}; eager frames: "
                     f"{[f.name for f in self.eager_frames]}; cudagraph skips: {len(self.cudagraph_skips)}")
        return "\n".join(lines)

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
            if g.note:
                lines.append(f"  graph {i}: {g.note}")
        skipped = list(dict.fromkeys(g.skipped for g in self.graphs if g.skipped))
        lines += [f"  not rewritten: {why}" for why in skipped]
        if self.traced:
            lines += ["", "traced as our ops (trace rules):"]
            lines += [f"  {name:<{width}}  {count}" for name, count in self.traced.items()]
        misses = self.misses_text()
        if misses:
            lines += ["", "not rewritten (closest candidates):", *misses]
        if self.trace_misses:
            lines += ["", "not traced as our ops (trace rules):"]
            lines += [f"  {m._replace_location(short_location(m.location)) if m.location else m}"
                      for m in dict.fromkeys(self.trace_misses)]
        return "\n".join(lines) + "\n\n" + self.obstacles()

    def misses_text(self) -> list[str]:
        """``"  rewrite: model.py:123: not rewritten: <why>"`` for the closest rejected
        candidate of each rewrite that matched nothing in a graph (one line per source line)."""
        lines = []
        for g in self.graphs:
            for name, misses in g.misses.items():
                if g.matches.get(name):
                    continue
                for m in {(m.location, m.check): m for m in misses}.values():
                    where = f"{short_location(m.location)}: " if m.location else ""
                    lines.append(f"  {name}: {where}not rewritten: {m.check}")
        return list(dict.fromkeys(lines))

    def obstacles(self) -> str:
        """What kept the code from being fast: graph breaks, frames that fell back to
        eager, cudagraph skips, each with its reason."""
        lines = [f"graph breaks: {sum(b.count for b in self.graph_breaks)}"]
        lines += [f"  [{b.count}x] {b.reason}" for b in self.graph_breaks]
        lines += ["", f"frames that fell back to eager: {len(self.eager_frames)}"]
        for f in self.eager_frames:
            lines.append(f"  {f.name} ({f.location}): {f.reason}")
            if f.hint:
                lines.append(f"    hint: {f.hint}")
        if self.cudagraph_skips:
            lines += ["", f"cudagraph skips: {len(self.cudagraph_skips)}"]
            lines += [f"  {why}" for why in self.cudagraph_skips]
        return "\n".join(lines)


class CompileLogCapture(logging.Handler):
    """Collects Dynamo's graph-break and skipped-frame messages, and Inductor's
    cudagraph skip reasons, while compiling (``with CompileLogCapture().attached()``).

    Reads the ``graph_breaks`` log artifact and the INFO messages of the frame
    converter, whose text has been stable from torch 2.9 on (counters are not:
    2.9 counts no graph break for a frame it skips).
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[tuple[str, str]] = []  # (kind, text)

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(_CUDAGRAPH_LOGGERS):
            kind = "cudagraphs"
        else:
            kind = "break" if record.name.endswith("__graph_breaks") else "info"
        self.messages.append((kind, record.getMessage()))

    def parsed(self) -> tuple[list[GraphBreak], list[EagerFrame], list[str]]:
        """Graph breaks, frames that fell back to eager, cudagraph skip reasons."""
        return _parse(self.messages)

    def logged_cudagraph_skips(self) -> int:
        """How many skips Inductor logged a reason for (it counts some silently)."""
        return sum(1 for kind, text in self.messages if kind == "cudagraphs" and _SKIP_CUDAGRAPHS.search(text))

    @contextlib.contextmanager
    def attached(self) -> Iterator[CompileLogCapture]:
        import torch._dynamo.convert_frame  # noqa: F401  (creates the loggers)
        import torch._inductor.cudagraph_utils  # noqa: F401

        names = [
            n
            for n in list(logging.root.manager.loggerDict)
            if (n.startswith("torch._dynamo.") and (n.endswith(".__graph_breaks") or n in _INFO_LOGGERS))
            or n.startswith(_CUDAGRAPH_LOGGERS)
        ]
        saved = []
        for name in names:
            lg = logging.getLogger(name)
            saved.append((lg, lg.level, lg.propagate, lg.disabled))
            lg.setLevel(logging.INFO if name in _INFO_LOGGERS else logging.DEBUG)
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
# cudagraph skip reasons: the "cudagraphs" artifact (2.13+) or "perf_hints" (2.9)
_CUDAGRAPH_LOGGERS = ("torch._inductor.cudagraph_utils.__", "torch._inductor.cudagraph_trees.__")
_SKIP_CUDAGRAPHS = re.compile(r"skipping cudagraphs due to (?P<why>.+)", re.S)
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


def _parse(messages: list[tuple[str, str]]) -> tuple[list[GraphBreak], list[EagerFrame], list[str]]:
    breaks: dict[str, GraphBreak] = {}
    frames: dict[tuple[str, str], EagerFrame] = {}
    skips: list[str] = []
    last_reason = ""
    for kind, text in messages:
        if kind == "cudagraphs":
            if (m := _SKIP_CUDAGRAPHS.search(text)) and m["why"].strip() not in skips:
                skips.append(m["why"].strip())
            continue
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
    return list(breaks.values()), list(frames.values()), skips


@dataclasses.dataclass(frozen=True)
class Explainer:
    """``explain`` with compile settings: ``Explainer(mode="reduce-overhead")(fn, *args)``.

    ``mode`` and ``options`` are those of ``torch.compile`` (``options["kda"]`` holds
    ours). The call passes every keyword argument to ``fn``: the way to give ``fn`` a keyword
    named ``mode`` or ``options``, which :func:`explain` takes itself.
    """

    mode: str | None = None
    options: dict[str, Any] | None = None

    def __call__(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Report:
        """Compile ``fn`` with ``backend="kda_inductor"`` on these inputs and report.

        Resets Dynamo first (like ``torch._dynamo.explain``) and compiles with
        Inductor's graph caches off so that every graph really goes through our pass
        (``pass_manager.graph_caches_off``: kernel caches stay on).
        ``fn`` is called once; its result is discarded.
        """
        import torch._dynamo
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        skips_before = counters["inductor"]["cudagraph_skips"]
        misses_before = _dynamo_substitute._appended[0]
        with (
            CompileLogCapture().attached() as capture,
            pass_manager.observe() as records,
            pass_manager.graph_caches_off(),
            logs.quiet_trace_log(),
            warnings.catch_warnings(),
        ):
            warnings.filterwarnings("ignore", message=".*force disabled by.*force_disable_caches")
            compiled = torch.compile(fn, backend="kda_inductor", mode=self.mode, options=self.options)
            compiled(*args, **kwargs)
        breaks, frames, skips = capture.parsed()
        silent = counters["inductor"]["cudagraph_skips"] - skips_before - capture.logged_cudagraph_skips()
        if silent > 0:  # Inductor counts these without a message
            skips.append(f"{silent} graph(s) with no CUDA ops (CUDA graphs only apply to CUDA work)")
        graphs = [GraphReport(r) for r in records]
        matches = pass_manager.total_matches(records)
        return Report(matches, graphs, breaks, frames, skips, compiled, traced_ops(records),
                      _dynamo_substitute.misses_since(misses_before))


TRACED_OPS = {"gdn_chunk": "torch.ops.kda.gdn_chunk.", "gdn_recurrent_step": "torch.ops.kda.gdn_recurrent_step."}
"""Each trace rule -> its op as the graph text names it."""


def traced_ops(records) -> dict[str, int]:
    """Each trace rule that fired -> its op's calls in the graphs as they reached our pass."""
    counts = {name: sum(r.before.count(op) for r in records) for name, op in TRACED_OPS.items()}
    return {name: n for name, n in counts.items() if n}


def explain(fn: Callable[..., Any], /, *args: Any, mode: str | None = None,
            options: dict[str, Any] | None = None, **kwargs: Any) -> Report:
    """Compile ``fn`` with the backend, call it once as ``fn(*args, **kwargs)`` and report.

    ``mode`` and ``options`` are explain's own, those of ``torch.compile`` (``options["kda"]``
    holds ours: ``explain(fn, x, options={"kda": {"force": True}})``); every other keyword
    argument goes to ``fn``. To give ``fn`` a keyword argument named ``mode`` or ``options``,
    call ``Explainer(mode=..., options=...)(fn, *args, **kwargs)``, which passes them all to ``fn``.

    ``fn`` runs once, for real, and its result is dropped: what it mutates stays mutated (a decode
    step's cache moves one step forward). Pass copies of such inputs, or keep a copy to restore;
    ``report.compiled`` is the compiled function that ran, to call again without compiling again.
    """
    return Explainer(mode=mode, options=options)(fn, *args, **kwargs)
