"""What the trace rules of :mod:`kda_inductor._dynamo_fixes` and :mod:`kda_inductor._dynamo_chunk`
share: whose trace it is (:func:`our_options`), the substitution of a function by our op's in
traces for us, by identity (:func:`substitute_with`: Dynamo's ``torch.compiler.substitute_in_graph``),
and the misses of the rules (:class:`TraceMiss`, :data:`MISSES`).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import os
import types
from collections.abc import Callable
from typing import Any

import torch

from kda_inductor.options import KdaOptions

MARK = "_kda_inductor_rules"
"""The attribute that marks a compiler function whose traces these rules apply to: the backend sets
it on :func:`kda_inductor.backend.kda_inductor` (this module does not import the backend)."""

_substituted: dict[int, Callable[..., Any]] = {}
"""id(fla entry point) -> the entry point (kept alive: Dynamo keys polyfills by id)."""
_polyfills: dict[int, Callable[..., Any]] = {}
"""id(substituted function) -> what a trace runs in its place (:func:`substitute_with`'s ``traced``):
:func:`kda_inductor._export.exporting` puts it where the model looks the function up."""
_exporting: list[KdaOptions] = []
"""The options of the active :func:`kda_inductor._export.exporting` contexts, innermost last."""

# --------------------------------------------------------------------------- whose trace


def backend_of(tx: Any) -> tuple[Any, dict[str, Any] | None]:
    """``(compiler function, torch.compile options)`` of the trace ``tx``: Dynamo keeps the backend
    as ``tx.output.compiler_fn`` in its debug wrapper (made with ``functools.wraps``: the wrapped
    object is ``__wrapped__``), around ``torch.compile``'s ``_TorchCompileWrapper`` (the compiler
    function and its ``kwargs``) when the backend came through ``torch.compile``."""
    compiler = getattr(getattr(tx, "output", None), "compiler_fn", None)
    compiler = getattr(compiler, "__wrapped__", compiler)
    options = (getattr(compiler, "kwargs", None) or {}).get("options")
    return getattr(compiler, "compiler_fn", compiler), options


def our_options(tx: Any) -> KdaOptions | None:
    """Our options when ``tx`` traces for kda_inductor, else None. Options the backend will refuse
    count as not ours: the backend reports them, as themselves, when it is called."""
    compiler, options = backend_of(tx)
    if getattr(compiler, MARK, False) is not True:
        return None
    try:
        return KdaOptions.parse((options or {}).get("kda"))
    except (TypeError, ValueError):
        return None


def current_options() -> KdaOptions | None:
    """Our options for the code being traced now: those of the kda_inductor compile Dynamo traces
    for, else (another trace, ``torch.export``'s strict one, or none: its non-strict one) the innermost
    :func:`kda_inductor._export.exporting` context's, else None."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    try:
        tx = InstructionTranslator.current_tx()
    except AttributeError:  # no Dynamo trace on this thread
        tx = None
    options = our_options(tx) if tx is not None else None
    return options if options is not None or not _exporting else _exporting[-1]


def rule_is_on(rule: str) -> bool:
    """At trace time: the trace is for kda_inductor (or inside :func:`kda_inductor._export.exporting`)
    and ``rule`` is not in its ``options["kda"]["disable"]``."""
    options = current_options()
    return options is not None and rule not in options.disable


def same_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Another function object with ``fn``'s code, globals, defaults, closure and attributes (fla's
    ``torch.compiler.disable`` marks among them): Dynamo traces or skips it as it does ``fn``,
    without the rule substituting it again."""
    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    twin.__kwdefaults__ = fn.__kwdefaults__
    twin.__qualname__, twin.__module__ = fn.__qualname__, fn.__module__
    twin.__dict__.update(fn.__dict__)
    return twin


def substitute_with(fn: Callable[..., Any], ours: Callable[..., Any], why_not: Callable[[dict], str | None],
                     rule_on: Callable[[], bool], *, op: str, extra_none: bool = False,
                     ignored: tuple[str, ...] = (), reasons: dict[str, str] | None = None) -> None:
    """Register ``ours`` for fla's ``fn`` in traces: with ``rule_on()`` (evaluated once per trace:
    ours, not disabled), its call is bound against fla's own signature; where every argument
    ``ours`` does not read is at its default (``extra_none``: or a keyword ``fn``'s ``**kwargs``
    takes, given as None; ``ignored``: arguments that do not change ``fn``'s result in this domain)
    and ``why_not(bound)`` is None, it is ``ours`` on the arguments it reads; else ``fn``'s own
    function, and a miss (:func:`_missed`) with the first reason: ``reasons[name]`` for an argument
    ``ours`` does not read, else ``why_not``'s."""
    reads = tuple(inspect.signature(ours).parameters)
    params = inspect.signature(fn).parameters.values()
    names = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    fla, reasons = same_function(fn), reasons or {}
    label = f"{fn.__module__}.{fn.__qualname__}"

    def unread(bound: dict) -> str | None:
        for n in bound:
            if n in reads or n in ignored:
                continue
            if n in defaults and bound[n] is defaults[n] or extra_none and n not in names and bound[n] is None:
                continue
            return reasons.get(n, f"{n} given: an argument {op} does not read")
        return None

    def traced(*args, **kwargs):
        if not rule_on():
            return fla(*args, **kwargs)
        bound = {**defaults, **dict(zip(names, args)), **kwargs}
        reason = ("more positional arguments than its signature names" if len(args) > len(names)
                  else unread(bound) or why_not(bound))
        if reason is None:
            return ours(**{n: bound[n] for n in reads if n in bound})
        _missed(label, op, reason)
        return fla(*args, **kwargs)

    traced.__name__ = traced.__qualname__ = f"kda_inductor_rule_for_{fn.__name__}"
    torch.compiler.substitute_in_graph(fn)(traced)
    _substituted[id(fn)], _polyfills[id(fn)] = fn, traced


# --------------------------------------------------------------------------- misses


@dataclasses.dataclass(frozen=True)
class TraceMiss:
    """A call a rule did not trace as its op: the function kept (``fla.ops.kda.chunk.chunk_kda``),
    the op, why, and the user's source line (``/path/model.py:123``: the innermost frame of the
    trace outside kda_inductor and transformers' hub-kernel dispatch; None where there is none)."""

    function: str
    op: str
    reason: str
    location: str | None = None

    def _replace_location(self, location: str | None) -> TraceMiss:
        return dataclasses.replace(self, location=location)

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location else ""
        return f"{where}{self.function} kept, not traced as {self.op}: {self.reason}"


MISSES: collections.deque[TraceMiss] = collections.deque(maxlen=64)
"""The latest misses of the trace rules, newest last (also logged at INFO: ``TORCH_LOGS=kda_inductor``)."""
_appended = [0]
"""How many misses :data:`MISSES` has received (:func:`misses_since`)."""


def misses_since(count: int) -> list[TraceMiss]:
    """The misses recorded since :data:`_appended` read ``count`` (the latest 64 at most)."""
    new = _appended[0] - count
    return list(MISSES)[-new:] if new > 0 else []
_NOT_USER = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
             os.sep + os.path.join("transformers", "integrations") + os.sep,
             os.sep + os.path.join("kernels", "_internals") + os.sep)
"""Frames that are not the user's: ours, transformers' hub-kernel dispatch and the ``kernels`` package's
layer wrappers around it."""


def _user_location() -> str | None:
    """``file:line`` of the innermost frame of the trace's user stack (what Dynamo records as an FX
    node's stack trace: ``TracingContext.extract_stack()``) outside :data:`_NOT_USER`; None where
    every traced frame is one of those (a trace that starts in transformers' dispatch, after a graph
    break in its caller)."""
    import traceback

    from torch._guards import TracingContext

    # outside Dynamo (torch.export's non-strict trace inside kda_inductor._export.exporting): Python's stack
    stack, not_user = TracingContext.extract_stack(), _NOT_USER
    if not stack:
        stack, not_user = traceback.extract_stack(), _NOT_USER + (os.path.dirname(torch.__file__) + os.sep,)
    for frame in reversed(stack):
        if frame.filename and not any(part in os.path.abspath(frame.filename) for part in not_user):
            return f"{frame.filename}:{frame.lineno}"
    return None


@torch.compiler.assume_constant_result
def _missed(function: str, op: str, reason: str) -> bool:
    """At trace time: record (:data:`MISSES`) and log (INFO) that a rule kept ``function`` for
    ``reason``, at the user's source line. Once per call site: the traces of one call (Dynamo
    restarts a trace after a graph break, then compiles the frames below it, each tracing down to
    the call again) make one miss, the one with a location where some trace had it."""
    from kda_inductor import logs

    miss = TraceMiss(function, op, reason, _user_location())
    last = MISSES[-1] if MISSES else None
    if last is not None and last._replace_location(None) == miss._replace_location(None):
        if last.location == miss.location or miss.location is None:
            return True
        if last.location is None:
            MISSES.pop()
    MISSES.append(miss)
    _appended[0] += 1
    logs.log.info("kda_inductor: %s", miss)
    return True
