"""``kda_inductor.explain``: what the backend did to a function, and what kept it slow."""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from kda_inductor import pass_manager
from kda_inductor.patterns import REWRITE_NAMES, REWRITES

_FRAME_SKIPPED = re.compile(r"frame skipped: (?P<name>\S+) \((?P<file>.+?) line (?P<line>\d+)\)")
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
    """The first line of Dynamo's reason."""
    detail: str
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


def _snapshot() -> dict[str, Counter]:
    from torch._dynamo.utils import counters

    return {k: Counter(v) for k, v in counters.items()}


def _delta(before: dict[str, Counter], key: str) -> Counter:
    from torch._dynamo.utils import counters

    now = Counter(counters.get(key, {}))
    now.subtract(before.get(key, Counter()))
    return Counter({k: v for k, v in now.items() if v > 0})


def _first_line(reason: str) -> str:
    return reason.strip().splitlines()[0] if reason.strip() else reason


def _hint(reason: str) -> str | None:
    if not _DATA_DEPENDENT.search(reason):
        return None
    forms = [cls.eager_form_hint for cls in REWRITES.values() if cls.eager_form_hint]
    return (
        "branching on tensor values (and reading them on the host) cannot be traced; "
        "write the code without host syncs. " + "; ".join(forms)
    )


def _eager_frames(breaks: Counter, frames: Counter) -> list[EagerFrame]:
    reasons = list(breaks)
    found: dict[tuple[str, str], EagerFrame] = {}
    for reason in reasons:
        for m in _FRAME_SKIPPED.finditer(reason):
            key = (m["name"], f"{m['file']}:{m['line']}")
            if key not in found:
                cause = _first_line(reason)
                found[key] = EagerFrame(m["name"], key[1], cause, _hint(reason))
    out = list(found.values())
    missing = frames["total"] - frames["ok"] - len(out)
    for _ in range(max(0, missing)):
        cause = _first_line(reasons[0]) if reasons else "unknown"
        out.append(EagerFrame("<unknown frame>", "?", cause, _hint(" ".join(reasons))))
    return out


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Report:
    """Compile ``fn`` with ``backend="kda_inductor"`` on these inputs and report.

    Resets Dynamo first (like ``torch._dynamo.explain``) and compiles with
    Inductor's caches off so that every graph really goes through our pass.
    ``fn`` is called once; its result is discarded.
    """
    import torch._dynamo

    torch._dynamo.reset()
    before = _snapshot()
    with (
        pass_manager.observe() as records,
        torch._inductor.config.patch(force_disable_caches=True),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("ignore", message=".*force disabled by.*force_disable_caches")
        torch.compile(fn, backend="kda_inductor")(*args, **kwargs)
    breaks = _delta(before, "graph_break")
    unimplemented = _delta(before, "unimplemented")
    # A break that made Dynamo skip the whole frame is only counted as unimplemented.
    breaks |= unimplemented
    graphs = [GraphReport(r["matches"], r["before"], r["after"], r["errors"]) for r in records]
    matches = {name: sum(g.matches.get(name, 0) for g in graphs) for name in REWRITE_NAMES}
    return Report(
        matches=matches,
        graphs=graphs,
        graph_breaks=[GraphBreak(_first_line(r), r, c) for r, c in breaks.items()],
        eager_frames=_eager_frames(breaks, _delta(before, "frames")),
    )
