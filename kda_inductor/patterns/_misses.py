"""What a rejected candidate is: how far it got (:class:`Stage`), the check that rejected it at
the user's source line (:class:`Miss`, :func:`source_location`), and the list one search keeps
(:class:`Misses`: every rewrite's base, and ``_merged_norms``'s search, which ``gated_norm_merge``
reports). Used by every rewrite through ``base`` (which re-exports it), by ``explain()``, the
CLI and the logs.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
from collections.abc import Iterable

import torch
import torch.fx as fx

from kda_inductor.patterns._graph import escaping


class Stage(enum.IntEnum):
    """How far a rejected candidate got, in the order every matcher checks: a miss at a later
    stage is closer to a match (``Rewrite.closest_misses`` keeps the furthest ones)."""

    INCIDENTAL = 0
    """The anchor op is there, in code no user would look for as this computation (a MoE's
    routing gathers for the spec split): logged at DEBUG (``TORCH_LOGS=+kda_inductor``), never
    shown by ``explain()``, the CLI, the HTML report or ``assert_rewrites`` (``Miss.shown``)."""
    FORM = 1
    """The anchor op is there, but not in this computation's form (dims, index shapes)."""
    LAYOUT = 2
    """The data's geometry does not fit (row widths, rows straddling tokens, the output)."""
    PIECES = 3
    """The computation's parts are not all there, or not one each (writes, scales, launches)."""
    INDEXING = 4
    """The parts do not index by one shared index (the slot mapping and its mask)."""
    ADDRESSING = 5
    """The bytes do not land where the layout puts them."""
    VALUES = 6
    """What is stored or computed is not this computation's value."""
    VALIDATED = 7
    """The fused op's own validator rejects these inputs."""
    REGION = 8
    """A value inside the region is read outside it (or through a view the op cannot keep)."""
    SPEED_RULE = 9
    """Everything matched; the speed rule leaves it to Inductor (measured faster there)."""


@dataclasses.dataclass(frozen=True)
class Miss:
    """A candidate a rewrite looked at and rejected, for ``explain()`` and ``--explain-misses``.

    ``stage`` says how far it got (higher is closer to a match); ``check`` names
    the check that rejected it; ``location`` is the user's source line the candidate
    node came from (``"model.py:123"``, from the node's stack trace; ``None`` when the
    graph has no trace for it) and ``code`` that line's text.
    """

    node: str
    stage: Stage
    check: str
    location: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location else ""
        return f"{where}not rewritten: {self.check}"

    @property
    def shown(self) -> bool:
        """A candidate a user would recognize: reported by ``explain()`` and the tools; the
        rest (:attr:`Stage.INCIDENTAL`) only at DEBUG."""
        return self.stage > Stage.INCIDENTAL


def shown_misses(misses: Iterable[Miss]) -> list[Miss]:
    """The misses of ``misses`` a user would recognize (``Miss.shown``), in order."""
    return [m for m in misses if m.shown]


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>[^\n]+)\n(?P<code>[^\n]*)')


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def source_location(node: fx.Node) -> tuple[str | None, str | None]:
    """``("file.py:123", "the line's code")`` of the innermost user frame that made ``node``
    (from ``node.meta["stack_trace"]``), or ``(None, None)``. Frames in torch's own files
    (``nn.RMSNorm``'s ``torch/nn/functional.py``) are not the user's: the innermost frame
    outside torch is, where the trace has one."""
    trace = node.meta.get("stack_trace") if isinstance(node, fx.Node) else None
    if not trace:
        return None, None
    frames = list(_FRAME.finditer(trace + "\n"))
    if not frames:
        return None, None
    users = [f for f in frames if not os.path.abspath(f["file"]).startswith(_TORCH_DIR)]
    last = (users or frames)[-1]
    return f"{last['file']}:{last['line']}", (last["code"].strip() or None)


class Misses:
    """The rejected candidates of one search, each at the user's source line: a rewrite's, or a
    shared analysis's that reports them through the rewrite that owns it."""

    def __init__(self) -> None:
        self.misses: list[Miss] = []

    def miss(self, node: fx.Node, stage: Stage, check: str) -> None:
        """Record that ``node`` was a candidate rejected by ``check``, at the user's source
        line it came from (returns None, so ``return self.miss(...)`` rejects)."""
        self.misses.append(Miss(node.name, stage, check, *source_location(node)))

    def region_closed(self, region: Iterable[fx.Node], outputs: Iterable[fx.Node], *, at: fx.Node,
                      what: str = "an intermediate of the region") -> bool:
        """The region check every rewrite makes: no value of ``region`` other than ``outputs``
        is read outside it (else replacing the region would recompute it). False, with a
        :attr:`Stage.REGION` miss at ``at`` naming the first escaping node, when one is."""
        leaking = escaping(region, outputs)
        if leaking:
            self.miss(at, Stage.REGION, f"{what} is read elsewhere ({leaking[0].name})")
        return not leaking

    def closest_misses(self) -> list[Miss]:
        """The rejected candidates that got furthest."""
        if not self.misses:
            return []
        best = max(m.stage for m in self.misses)
        return [m for m in self.misses if m.stage == best]
