"""The post-grad pass: run every enabled rewrite once over Inductor's graph.

Installed as ``post_grad_custom_post_pass`` so it runs after Inductor's own
post-grad patterns and before re-inplacing and lowering. It is a
``CustomGraphPass`` whose ``uuid()`` hashes our source files and options, so the
FX graph cache stays on and never serves code compiled with other options.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import pathlib
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch.fx as fx
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass

from kda_inductor import logs
from kda_inductor.diff import snapshot
from kda_inductor.options import KdaOptions
from kda_inductor.patterns import REWRITES
from kda_inductor.patterns.base import Analyses, Miss, Stage, transaction

log = logs.log  # logging.getLogger("kda_inductor"): TORCH_LOGS=kda_inductor / +kda_inductor
logs.register()

COUNTER_KEY = "kda_inductor"
"""``torch._dynamo.utils.counters[COUNTER_KEY][rewrite_name]`` counts replacements."""



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


_observers: list[Callable[[PassRecord], None]] = []
"""Callbacks that receive one record per graph the pass ran on (used by explain)."""
_timers: list[list[float]] = []
"""Lists that receive the seconds of each run of the pass (``timed``)."""


@functools.cache
def _source_hash() -> str:
    root = pathlib.Path(__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


GRAD_SKIP = (
    "this graph was traced with grad enabled (inputs or parameters require grad, outside "
    "torch.no_grad() / torch.inference_mode()): the fused ops have no backward, so no rewrite "
    "runs; serve under torch.inference_mode()"
)


class KdaPostGradPass(CustomGraphPass):
    """Runs the enabled rewrites; a failing rewrite is skipped with a warning.

    ``grad``: the graph belongs to a training compile (AOTAutograd's forward or backward):
    nothing is rewritten and the record says why (``PassRecord.skipped``)."""

    def __init__(self, options: KdaOptions | None = None, *, grad: bool = False, note: str | None = None):
        self.options = options or KdaOptions()
        self.grad = grad
        self.note = note
        """Why this compile runs, in each record (the backend's retry after Inductor failed)."""
        self.left_to_inductor: set[str] = set()
        """Rewrites whose matches a speed rule left to Inductor in this pass's runs."""
        self._runs: list[tuple[PassRecord | None, Counter[str]]] = []

    def retract(self) -> None:
        """Take back what this pass's runs reported, for a compile that failed and is done
        again: their counter increments, and their records from the observers that keep them
        (``observe``)."""
        for record, matches in self._runs:
            for name, n in matches.items():
                counters[COUNTER_KEY][name] -= n
            for observer in list(_observers) if record is not None else ():
                getattr(observer, "retract", lambda _: None)(record)
        self._runs.clear()

    def uuid(self) -> str:
        h = hashlib.sha256(_source_hash().encode())
        h.update(self.options.cache_key().encode())
        h.update(b"grad" if self.grad else b"")
        return h.hexdigest()

    def __call__(self, graph: fx.Graph) -> None:
        if not _timers:
            return self._run(graph)
        t0 = time.perf_counter()
        try:
            return self._run(graph)
        finally:
            for spent in _timers:
                spent.append(time.perf_counter() - t0)

    def _run(self, graph: fx.Graph) -> None:
        tracing = _tracing_enabled()
        observed = bool(_observers) or tracing or logs.enabled()
        record = PassRecord(skipped=GRAD_SKIP if self.grad else None, note=self.note)
        if observed:
            record.before, record.before_nodes = str(graph), snapshot(graph)
        matches: Counter[str] = Counter({name: 0 for name in REWRITES})
        analyses = Analyses()  # readings of this graph the rewrites share (the gated norms)
        for name in ([] if self.grad else self.options.enabled()):
            rewrite = REWRITES[name](analyses)
            names_before = {n.name for n in graph.nodes} if observed else set()
            try:
                found = rewrite.find(graph)
                for match in found:
                    why = None if self.options.force else rewrite.speed_rule(match)
                    if why:
                        rewrite.miss(match.anchor, Stage.SPEED_RULE, f"left to Inductor: {why}")
                        self.left_to_inductor.add(name)
                        continue
                    with transaction(graph):
                        rewrite.replace(graph, match)
                    matches[name] += 1
                    if match.part is not None:
                        parts = record.parts.setdefault(name, {})
                        parts[match.part] = parts.get(match.part, 0) + 1
            except Exception as exc:  # noqa: BLE001 - any failure falls back
                if self.options.strict:
                    raise
                msg = (
                    f"kda_inductor: rewrite {name!r} failed and was skipped "
                    f"({type(exc).__name__}: {exc}); the graph compiles without it"
                )
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
                log.warning(msg, exc_info=True)
                record.errors[name] = f"{type(exc).__name__}: {exc}"
            if observed:
                names_after = {n.name for n in graph.nodes}
                record.changes[name] = {
                    "removed": sorted(names_before - names_after),
                    "added": sorted(names_after - names_before),
                }
                record.misses[name] = rewrite.closest_misses()
                notes = getattr(rewrite, "notes", ())  # notes on matches (indexer_k_write's racy spelling)
                if notes:
                    record.note = "; ".join([*filter(None, [record.note]), *notes])
        for name, n in matches.items():
            if n:
                counters[COUNTER_KEY][name] += n
        self._runs.append((record if observed else None, +matches))
        graph.lint()
        if observed:
            record.matches = dict(matches)
            record.after, record.after_nodes = str(graph), snapshot(graph)
            if tracing:
                _trace(record)
            logs.graph_done(record)
            for observe in list(_observers):
                observe(record)


def _tracing_enabled() -> bool:
    """``TORCH_TRACE`` is on: tlparse will show our before/after graphs."""
    return logs.tracing()


def _trace(record: PassRecord) -> None:
    """Emit our graphs and rewrite table as ``TORCH_TRACE`` artifacts."""
    from torch._logging import trace_structured

    from kda_inductor.diff import rewrite_table, unified

    payloads = {
        "kda_inductor_post_grad_before": record.before,
        "kda_inductor_post_grad_after": record.after,
        "kda_inductor_rewrites": "\n".join(rewrite_table(record)),
        "kda_inductor_graph_diff": unified(record.before_nodes, record.after_nodes),
    }
    for name, text in payloads.items():
        trace_structured(
            "artifact",
            metadata_fn=lambda name=name: {"name": name, "encoding": "string"},
            payload_fn=lambda text=text: text,
        )


class _Chain(CustomGraphPass):
    """Our pass followed by a pass the user had already installed."""

    def __init__(self, *passes: Any):
        self.passes = passes

    def __call__(self, graph: fx.Graph) -> None:
        for p in self.passes:
            p(graph)

    def uuid(self) -> Any:
        parts = []
        for p in self.passes:
            u = p.uuid() if hasattr(p, "uuid") else None
            if u is None:  # an un-hashable pass: let Inductor bypass the cache
                return None
            parts.append(str(u))
        return hashlib.sha256("|".join(parts).encode()).hexdigest()


def combine_with(ours: KdaPostGradPass, existing: Any) -> Any:
    """Value for ``post_grad_custom_post_pass`` running ``ours`` then ``existing``.

    torch 2.9-2.12 take a single pass; newer versions also take a list.
    """
    if existing is None:
        return ours
    if isinstance(existing, (list, tuple)):
        return [ours, *existing]
    return _Chain(ours, existing)


@contextlib.contextmanager
def observe() -> Iterator[list[PassRecord]]:
    """Collect one :class:`PassRecord` per graph our pass runs on while the block executes.
    A compile that failed and was done again leaves only the second one's record. Only graphs
    actually compiled are seen: disable Inductor's caches to see all."""
    records = _Records()
    _observers.append(records)
    try:
        yield records
    finally:
        _observers[:] = [o for o in _observers if o is not records]  # by identity: lists compare by value


class _Records(list):
    """An ``observe`` list: receives each record, and gives one back when its compile is
    retracted (``KdaPostGradPass.retract``)."""

    def __call__(self, record: PassRecord) -> None:
        self.append(record)

    def retract(self, record: PassRecord) -> None:
        self[:] = [r for r in self if r is not record]


@contextlib.contextmanager
def timed() -> Iterator[list[float]]:
    """The seconds our pass takes on each graph it runs on while the block executes, one
    entry per run (benchmarks: the pass's share of a compile; tests: that it ran)."""
    spent: list[float] = []
    _timers.append(spent)
    try:
        yield spent
    finally:
        _timers.remove(spent)


@contextlib.contextmanager
def counted() -> Iterator[dict[str, int]]:
    """The replacements each rewrite makes while the block executes (``counters`` deltas,
    filled in on exit, rewrites that fired only): what one compile rewrote, in benchmarks."""
    before = dict(counters[COUNTER_KEY])
    made: dict[str, int] = {}
    try:
        yield made
    finally:
        made.update({k: n - before.get(k, 0) for k, n in counters[COUNTER_KEY].items() if n > before.get(k, 0)})


def total_matches(records: list[PassRecord]) -> dict[str, int]:
    """Every registered rewrite -> replacements summed over ``observe`` records."""
    return {name: sum(r.matches.get(name, 0) for r in records) for name in REWRITES}


@contextlib.contextmanager
def graph_caches_off() -> Iterator[None]:
    """Inductor's FX graph cache and AOTAutograd's cache off: the caches that serve a whole
    graph's code without running our pass (``explain``, test compiles: every graph goes through
    it). Kernel caches stay on: they are keyed on a kernel's source, which our pass has already
    shaped, so a hit skips only the C++ / Triton compile of a kernel seen before (on CPU most of a
    compile's time; ``torch._inductor.config.force_disable_caches`` recompiles every kernel, in a
    fresh directory each time)."""
    import torch._functorch.config as aot_config
    import torch._inductor.config as inductor_config

    aot = {"enable_autograd_cache": False} if hasattr(aot_config, "enable_autograd_cache") else {}
    with inductor_config.patch(fx_graph_cache=False, force_disable_caches=False), aot_config.patch(aot):
        yield
