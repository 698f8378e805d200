"""The post-grad pass: run every enabled rewrite once over Inductor's graph.

Installed as ``post_grad_custom_post_pass`` so it runs after Inductor's own
post-grad patterns and before re-inplacing and lowering. It is a
``CustomGraphPass`` whose ``uuid()`` hashes our source files and options, so the
FX graph cache stays on and never serves code compiled with other options.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import pathlib
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch.fx as fx
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass

from kda_inductor.options import KdaOptions
from kda_inductor.patterns import REWRITES
from kda_inductor.patterns.base import transaction

log = logging.getLogger("kda_inductor")

COUNTER_KEY = "kda_inductor"
"""``torch._dynamo.utils.counters[COUNTER_KEY][rewrite_name]`` counts replacements."""

_observers: list[Callable[[dict[str, Any]], None]] = []
"""Callbacks that receive one record per graph the pass ran on (used by explain)."""


@functools.cache
def _source_hash() -> str:
    root = pathlib.Path(__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


class KdaPostGradPass(CustomGraphPass):
    """Runs the enabled rewrites; a failing rewrite is skipped with a warning."""

    def __init__(self, options: KdaOptions | None = None):
        self.options = options or KdaOptions()

    def uuid(self) -> str:
        h = hashlib.sha256(_source_hash().encode())
        h.update(self.options.cache_key().encode())
        return h.hexdigest()

    def __call__(self, graph: fx.Graph) -> None:
        record: dict[str, Any] | None = None
        if _observers:
            record = {"before": str(graph), "matches": {}, "errors": {}}
        matches: Counter[str] = Counter({name: 0 for name in REWRITES})
        for name in self.options.enabled():
            rewrite = REWRITES[name]()
            try:
                found = rewrite.find(graph)
                for match in found:
                    with transaction(graph):
                        rewrite.replace(graph, match)
                    matches[name] += 1
            except Exception as exc:  # noqa: BLE001 - any failure falls back
                if self.options.strict:
                    raise
                msg = (
                    f"kda_inductor: rewrite {name!r} failed and was skipped "
                    f"({type(exc).__name__}: {exc}); the graph compiles without it"
                )
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
                log.warning(msg, exc_info=True)
                if record is not None:
                    record["errors"][name] = f"{type(exc).__name__}: {exc}"
        for name, n in matches.items():
            if n:
                counters[COUNTER_KEY][name] += n
                log.info("kda_inductor: %s replaced %d time(s)", name, n)
        graph.lint()
        if record is not None:
            record["matches"] = dict(matches)
            record["after"] = str(graph)
            for observe in list(_observers):
                observe(record)


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
def observe() -> Iterator[list[dict[str, Any]]]:
    """Collect one record per graph our pass runs on while the block executes.

    Each record has ``matches`` (rewrite -> count), ``errors`` (rewrite ->
    message), and the graph text ``before`` and ``after`` the pass. Only
    graphs actually compiled are seen: disable Inductor's caches to see all.
    """
    records: list[dict[str, Any]] = []
    _observers.append(records.append)
    try:
        yield records
    finally:
        _observers.remove(records.append)
