"""The post-grad pass: run every enabled rewrite once over Inductor's graph.

Installed as ``post_grad_custom_post_pass`` so it runs after Inductor's own
post-grad patterns and before re-inplacing and lowering. It is a
``CustomGraphPass`` whose ``uuid()`` hashes our source files and options, so the
FX graph cache stays on and never serves code compiled with other options.
"""

from __future__ import annotations

import contextlib
import hashlib
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
from kda_inductor.patterns import REWRITES, STAGES
from kda_inductor.patterns.base import Analyses, Match, ReplacementRefused, Rewrite, Stage, remap, transaction
from kda_inductor.record import PassRecord

log = logs.log  # logging.getLogger("kda_inductor"): TORCH_LOGS=kda_inductor / +kda_inductor
logs.register()

COUNTER_KEY = "kda_inductor"
"""``torch._dynamo.utils.counters[COUNTER_KEY][rewrite_name]`` counts replacements."""

__all__ = ["COUNTER_KEY", "KdaPostGradPass", "PassRecord", "combine_with", "counted", "graph_caches_off", "observe",
           "timed", "total_matches"]


_observers: list[Callable[[PassRecord], None]] = []
"""Callbacks that receive one record per graph the pass ran on (used by explain)."""
_timers: list[list[float]] = []
"""Lists that receive the seconds of each run of the pass (``timed``)."""


GRAD_SKIP = (
    "this graph was traced with grad enabled (inputs or parameters require grad, outside "
    "torch.no_grad() / torch.inference_mode()): the fused ops have no backward, so no rewrite "
    "runs; serve under torch.inference_mode()"
)


FORCE_HINT = ' (options={"kda": {"force": True}} rewrites it anyway)'
"""How a speed rule's miss says to force the rewrite (on CPU every match reads so: the backend
leaves CPU code to Inductor)."""


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
        return self.options.pass_uuid(grad=self.grad)

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
        tracing = logs.tracing()  # TORCH_TRACE: tlparse shows our before / after graphs
        observed = bool(_observers) or tracing or logs.enabled()
        record = PassRecord(skipped=GRAD_SKIP if self.grad else None, note=self.note)
        if observed:
            record.before, record.before_nodes = str(graph), snapshot(graph)
        matches = self.apply(graph, record, observed=observed)
        for name, n in matches.items():
            if n:
                counters[COUNTER_KEY][name] += n
        self._runs.append((record if observed else None, +matches))
        graph.lint()
        if observed:
            self.observe(graph, record, matches, tracing=tracing)

    def apply(self, graph: fx.Graph, record: PassRecord, *, observed: bool = False) -> Counter[str]:
        """Run every enabled rewrite once over ``graph``, in registry order, each followed by its
        stages (``patterns.STAGES``, counted under its name), sharing one ``Analyses``; returns
        the replacements per rewrite. ``record`` gets the failures and parts (and, when
        ``observed``, each rewrite's node changes, misses and notes)."""
        matches: Counter[str] = Counter({name: 0 for name in REWRITES})
        analyses = Analyses()  # readings of this graph the rewrites share (the gated norms)
        moved: dict[fx.Node, fx.Node] = {}  # old -> new of every replacement so far (base.remap)
        for name in ([] if self.grad else self.options.enabled()):
            names_before = {n.name for n in graph.nodes} if observed else set()
            rewrite = REWRITES[name](analyses)
            for stage in (rewrite, *(cls(analyses) for cls in STAGES.get(name, ()))):
                stage.misses = rewrite.misses  # one rewrite's misses, whichever stage rejected them
                try:
                    for match in stage.find(graph):
                        match = remap(match, moved)
                        if self._replace(graph, stage, match, moved):
                            matches[name] += 1
                            _count_part(record, name, match)
                except Exception as exc:  # noqa: BLE001 - any failure falls back
                    self._failed(name, exc, record)
                    break
            if observed:
                _note_rewrite(graph, rewrite, record, names_before)
        return matches

    def _replace(self, graph: fx.Graph, rewrite: Rewrite, match: Match, moved: dict[fx.Node, fx.Node]) -> bool:
        """Replace ``match`` in a transaction, unless its GPU is too old for it (a ``Stage.VALIDATED``
        miss), its speed rule leaves it to Inductor (a ``Stage.SPEED_RULE`` miss, and False) or it
        refuses where it would go (a miss at its stage);
        what the replacement stands for goes into ``moved``."""
        refused = rewrite.device_refuses(match)
        if refused:
            rewrite.miss(match.anchor, Stage.VALIDATED, refused)
            return False
        why = None if self.options.force else rewrite.speed_rule(match)
        if why:
            rewrite.miss(match.anchor, Stage.SPEED_RULE, f"left to Inductor: {why}{FORCE_HINT}")
            self.left_to_inductor.add(rewrite.name)
            return False
        try:
            with transaction(graph):
                moved.update(rewrite.replace(graph, match) or {})
        except ReplacementRefused as refused:  # undone by the transaction: a miss, not a failure
            rewrite.miss(match.anchor, refused.stage, str(refused))
            return False
        return True

    def _failed(self, name: str, exc: Exception, record: PassRecord) -> None:
        """A rewrite raised: re-raised under ``strict``, else a warning and the record's error
        (the graph compiles without it)."""
        if self.options.strict:
            raise exc
        msg = (
            f"kda_inductor: rewrite {name!r} failed and was skipped "
            f"({type(exc).__name__}: {exc}); the graph compiles without it"
        )
        warnings.warn(msg, RuntimeWarning, stacklevel=4)
        log.warning(msg, exc_info=exc)
        record.errors[name] = f"{type(exc).__name__}: {exc}"

    def observe(self, graph: fx.Graph, record: PassRecord, matches: Counter[str], *, tracing: bool) -> None:
        """Complete ``record`` with the outcome and the graph after the pass, and hand it to the
        observers: ``TORCH_TRACE``, the logs, ``observe()`` (explain, tests)."""
        record.matches = dict(matches)
        record.after, record.after_nodes = str(graph), snapshot(graph)
        if tracing:
            _trace(record)
        logs.graph_done(record)
        for observer in list(_observers):
            observer(record)


def _count_part(record: PassRecord, name: str, match: Match) -> None:
    """Count a replaced match's part (``Match.part``) in the record."""
    if match.part is not None:
        parts = record.parts.setdefault(name, {})
        parts[match.part] = parts.get(match.part, 0) + 1


def _note_rewrite(graph: fx.Graph, rewrite: Rewrite, record: PassRecord, names_before: set[str]) -> None:
    """What one rewrite did, for an observed record: the nodes it removed and added, its
    closest misses, its notes on matches (indexer_k_write's racy spelling)."""
    names_after = {n.name for n in graph.nodes}
    record.changes[rewrite.name] = {"removed": sorted(names_before - names_after),
                                    "added": sorted(names_after - names_before)}
    record.misses[rewrite.name] = rewrite.closest_misses()
    notes = getattr(rewrite, "notes", ())
    if notes:
        record.note = "; ".join([*filter(None, [record.note]), *notes])


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
