"""Logs the torch way: ``TORCH_LOGS=kda_inductor`` and ``TORCH_LOGS=+kda_inductor``.

* ``TORCH_LOGS=kda_inductor`` (INFO): for each graph our pass runs on, its rewrite table
  (matches, nodes removed and added, by op), or the one-line reason it rewrote nothing; a
  graph whose compiled code was served from Inductor's FX graph cache (or AOTAutograd's
  cache) says so, since our pass does not run again then (no table, no misses), and how to
  see them (``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``).
* ``TORCH_LOGS=+kda_inductor`` (DEBUG) adds, per rewrite, the closest candidates it rejected,
  at the user's source line (``model.py:123: not rewritten: <why>``), and that line's code.
* ``torch._logging.set_logs(modules={"kda_inductor": logging.DEBUG})`` does the same from Python.

The logger is ``logging.getLogger("kda_inductor")``; torch's ``TORCH_LOGS`` handling gives it
its handler and format (``[rank0]:[0/0] ...`` prefixes). :func:`register` also registers the
name with ``torch._logging`` (done when the pass manager is imported).

When the logger is not enabled for INFO, nothing here does any work in the compile path:
one ``isEnabledFor`` check per graph.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, TYPE_CHECKING

NAME = "kda_inductor"
log = logging.getLogger(NAME)

_graphs_logged = 0
"""Graphs our pass reported on, for :func:`cache_scope` (counts only while logging is on)."""

if TYPE_CHECKING:
    from kda_inductor.record import PassRecord


def register() -> None:
    """Register ``kda_inductor`` with ``torch._logging`` (torch 2.9-2.14: ``register_log``)."""
    try:
        import torch._logging as tlog
    except ImportError:  # pragma: no cover
        return
    register_log = getattr(tlog, "register_log", None)
    registry = getattr(getattr(tlog, "_internal", None), "log_registry", None)
    if register_log is None:  # pragma: no cover
        return
    if registry is not None and registry.is_log(NAME):
        return
    register_log(NAME, NAME)


def enabled() -> bool:
    """``TORCH_LOGS=kda_inductor`` (or any INFO handler on our logger) is on."""
    return log.isEnabledFor(logging.INFO)


def graph_done(record: PassRecord) -> None:
    """Log one graph's outcome: INFO the rewrite table, DEBUG the misses with locations."""
    global _graphs_logged
    if not enabled():
        return
    _graphs_logged += 1
    from kda_inductor.diff import rewrite_table, short_location

    if record.skipped:
        log.info("kda_inductor: graph not rewritten: %s", record.skipped)
    elif record.before_nodes is not None:
        nodes = f"{len(record.before_nodes)} -> {len(record.after_nodes)} nodes"
        log.info("kda_inductor: rewrites in this post-grad graph (%s):\n%s", nodes,
                 "\n".join(rewrite_table(record)))
    if not log.isEnabledFor(logging.DEBUG):
        return
    lines = []
    for name, misses in record.misses.items():
        for m in {(m.location, m.check): m for m in misses}.values():
            where = f"{short_location(m.location)}: " if m.location else ""
            hidden = "" if m.shown else " (DEBUG only: not a candidate a user would look for)"
            lines.append(f"  {name}: {where}not rewritten: {m.check}{hidden}")
            if m.code:
                lines.append(f"      {m.code}")
    if lines:
        log.debug("kda_inductor: closest candidates not rewritten:\n%s", "\n".join(lines))
    else:
        log.debug("kda_inductor: no rejected candidate recorded in this graph")


_CACHES = (
    ("inductor", "fxgraph_cache_hit", "Inductor's FX graph cache"),
    ("aot_autograd", "autograd_cache_hit", "AOTAutograd's cache"),
)


def _hits() -> tuple[int, ...]:
    from torch._dynamo.utils import counters

    return tuple(counters[group][key] for group, key, _ in _CACHES)


@contextlib.contextmanager
def cache_scope(uuid: Any = None) -> Iterator[None]:
    # ``uuid``: the pass's ``uuid`` method (called only when a hit is logged)
    """Around one Inductor compile of a graph with our pass installed (the backend's
    ``compile_fx`` call): if a cache served the compiled code, so that our pass did not run,
    say so. Does nothing unless logging is on."""
    if not enabled():
        yield
        return
    before, logged = _hits(), _graphs_logged
    yield
    after = _hits()
    if _graphs_logged != logged:
        return  # our pass ran: its table was logged
    served = [label for (_, _, label), b, a in zip(_CACHES, before, after) if a > b]
    if served:
        tag = f" (our pass's uuid {str(uuid())[:12]}...)" if callable(uuid) else ""
        log.info("kda_inductor: this graph was served from %s: the code our pass produced when it was "
                 "compiled earlier with the same kda_inductor sources and options%s. Our pass did not run "
                 "again, so its rewrite table and its misses (TORCH_LOGS=+kda_inductor) were logged then, "
                 "not now; TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 recompiles the graph and logs them.",
                 " and ".join(served), tag)


def _trace_handlers() -> tuple[Any, list[logging.Handler], list[logging.Handler]]:
    """torch's structured-trace logger, its own handlers, and handlers others attached
    (pytest 9 attaches its log capture to every non-propagating logger, this one included)."""
    from torch._logging import _internal

    trace_log = _internal.trace_log
    is_torch = getattr(_internal, "_is_torch_handler", None)
    if is_torch is None:  # pragma: no cover - every torch 2.9-2.14 has it
        return trace_log, list(trace_log.handlers), []
    ours = [h for h in trace_log.handlers if is_torch(h)]
    return trace_log, ours, [h for h in trace_log.handlers if not is_torch(h)]


def tracing() -> bool:
    """``TORCH_TRACE`` is on (torch's own handler on its trace logger): tlparse will show our
    before/after graphs. A log capture (pytest's) attached to that logger does not count."""
    try:
        return bool(_trace_handlers()[1])
    except Exception:  # noqa: BLE001
        return False


@contextlib.contextmanager
def quiet_trace_log() -> Iterator[None]:
    """Detach foreign handlers from torch's trace logger for the block: under pytest 9 its
    capture handler makes torch build every structured-trace payload during a compile and
    fills failure reports with empty ``DEBUG torch.__trace`` lines."""
    try:
        trace_log, _, foreign = _trace_handlers()
    except Exception:  # noqa: BLE001
        yield
        return
    for h in foreign:
        trace_log.removeHandler(h)
    try:
        yield
    finally:
        for h in foreign:
            if h not in trace_log.handlers:
                trace_log.addHandler(h)
