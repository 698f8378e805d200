"""``PassRecord``: what our pass did to one graph, for the observers (``pass_manager.observe``,
``explain()``, the logs, ``TORCH_TRACE``, the graph diff and the HTML report). Its own module,
so that the pass manager and the modules that read records (``logs``, ``diff``, ...) import it
and not each other."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from kda_inductor.patterns.base import Miss

__all__ = ["PassRecord"]


@dataclasses.dataclass
class PassRecord:
    """What our pass did to one graph, for the observers (``observe``, ``explain()``, logs,
    ``TORCH_TRACE``). The graph texts and snapshots are taken only while someone observes."""

    matches: dict[str, int] = dataclasses.field(default_factory=dict)
    """Every registered rewrite -> how many matches it replaced in this graph."""
    errors: dict[str, str] = dataclasses.field(default_factory=dict)
    """Rewrite -> the error it raised (the graph compiled without it)."""
    changes: dict[str, dict[str, list[str]]] = dataclasses.field(default_factory=dict)
    """Rewrite -> ``{"removed": [...], "added": [...]}`` FX node names."""
    misses: dict[str, list[Miss]] = dataclasses.field(default_factory=dict)
    """Rewrite -> its closest rejected candidates, at the user's source lines (also those no
    user would look for, ``Stage.INCIDENTAL``: ``Miss.shown`` tells them apart)."""
    parts: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    """Rewrite -> {part -> count} where a match says how much it fused (``Match.part``)."""
    skipped: str | None = None
    """Why no rewrite ran on this graph (a training graph), or None."""
    note: str | None = None
    """Why the backend compiled this graph again, and notes on matches; or None."""
    before: str | None = None
    after: str | None = None
    """The graph's text before and after the pass."""
    before_nodes: list | None = None
    after_nodes: list | None = None
    """``kda_inductor.diff.snapshot`` of the graph before and after the pass."""
