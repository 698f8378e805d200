"""A Dynamo fix that changes what transformers' hybrid models trace, scoped to kda_inductor's graphs.

``torch.compiler.is_exporting()`` is documented as True only under ``torch.export``, but Dynamo
folds it to the constant True in every ``torch.compile`` trace (pytorch/pytorch#176347; fixed by
#176499, which reads the flag at trace time: torch 2.13 has it, the H200's torch 2.11 does not).
transformers' hub-kernel dispatch (``use_kernel_func_from_hub_with_fallback``) takes the torch
reference path under export, so under ``torch.compile`` every GDN / KDA layer ran transformers'
reference chunk loop instead of fla-core's kernels (and causal-conv1d's, where installed): compiled
prefill slower than eager (issue 21; ``benchmarks/results/hf_profile_qwen3_next_prefill.md``).

:func:`install` makes a trace whose backend is kda_inductor read the real flag (False outside
export), as the fixed torch does for everyone, with one measured exception: inside transformers'
dispatch of a core whose torch reference is not a chunked (prefill) one, the constant stays. On the
H200 (``benchmarks/results/hf_models.md``, Qwen3-Next) fla-core's chunk kernels make compiled
prefill 2x faster than the reference, while its ``fused_recurrent`` decode kernel, which fla wraps
in ``torch.compiler.disable`` (a graph break around each layer's core), made decode of 128
sequences 11% slower than the reference step Inductor fuses. Traces for every other backend keep
their torch's behaviour (``applied_to_every_backend()`` applies the fix to every backend, for
benchmarks that separate what the fix gives from what the rewrites give).

Where torch already reads the flag at trace time (the fix of #176499: torch 2.13 has it), the fix
turns itself off: :func:`torch_folds_is_exporting` traces ``is_exporting()`` once with Dynamo's
``eager`` backend (a feature check, not a version string) and :func:`install` installs nothing
when the trace reads False. There stock and kda_inductor both run fla-core everywhere.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import Any

import torch

_installed = False
_every_backend = False


def _ours(compiler_fn: Any) -> bool:
    """``compiler_fn`` (Dynamo's, wrapped in its debug and ``torch.compile`` wrappers) is ours."""
    fn = compiler_fn
    for _ in range(8):
        if fn is None:
            return False
        if (getattr(fn, "__module__", "") or "").startswith("kda_inductor"):
            return True
        fn = next((getattr(fn, a) for a in ("compiler_fn", "func", "__wrapped__") if getattr(fn, a, None) is not None
                   and getattr(fn, a) is not fn), None)
    return False


def _tracing_for_us() -> bool:
    """The frame Dynamo is tracing now will be compiled by kda_inductor (by any backend inside
    ``applied_to_every_backend()``)."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    if _every_backend:
        return True
    try:
        tx = InstructionTranslator.current_tx()
    except Exception:  # noqa: BLE001 - not inside a trace
        return False
    output = getattr(tx, "output", None)
    return _ours(getattr(output, "compiler_fn", None))


# transformers' torch references (``use_kernel_func_from_hub_with_fallback``) that get the
# installed package's kernel in our traces: the chunked prefill cores (measured, see above)
PACKAGE_FOR = ("chunk",)


def _dispatched_reference() -> str | None:
    """The name of the torch reference whose transformers dispatch (``wrapped``, made with
    ``functools.wraps``) the current trace is inside, if any: read from the innermost translator,
    the ``tx`` of Dynamo's handler that is asking the table."""
    frame = sys._getframe(2)
    for _ in range(4):
        tx = frame.f_locals.get("tx") if frame is not None else None
        if tx is not None and hasattr(tx, "parent"):
            break
        frame = frame.f_back if frame is not None else None
    else:
        return None
    for _ in range(16):
        if tx is None:
            return None
        ref = getattr(getattr(getattr(tx, "funcvar", None), "fn", None), "__wrapped__", None)
        if ref is not None and hasattr(ref, "__name__"):
            return ref.__name__
        tx = getattr(tx, "parent", None)
    return None


def _exporting_in_our_trace() -> bool:
    """What ``torch.compiler.is_exporting()`` traces to for kda_inductor."""
    reference = _dispatched_reference()
    if reference is not None and not any(key in reference for key in PACKAGE_FOR):
        return True  # torch's constant: the reference, measured faster under compile
    return bool(torch.compiler._is_exporting_flag)


class _TracingState(dict):
    """Dynamo's table of tracing-state functions and the constant each traces to, with
    ``is_exporting`` read from the real flag in traces for kda_inductor."""

    def __getitem__(self, fn: Any) -> Any:
        if fn is torch.compiler.is_exporting and _tracing_for_us():
            try:
                return _exporting_in_our_trace()
            except Exception:  # noqa: BLE001 - Dynamo's internals moved: the real flag
                return bool(torch.compiler._is_exporting_flag)
        return dict.__getitem__(self, fn)


def _is_exporting_probe(x):
    return x + 1 if torch.compiler.is_exporting() else x - 1


@functools.cache
def torch_folds_is_exporting() -> bool:
    """This torch traces ``torch.compiler.is_exporting()`` to True under ``torch.compile``
    (pytorch#176347): one trace of a two-line function with Dynamo's ``eager`` backend, its
    counters put back as they were. False where the trace reads the real flag (torch with
    #176499) or cannot run here (inside another trace)."""
    import copy

    from torch._dynamo.utils import counters

    if torch.compiler.is_compiling():
        return False
    saved = copy.deepcopy(dict(counters))
    try:
        x = torch.zeros(1)
        out = torch.compile(_is_exporting_probe, backend="eager", fullgraph=True, dynamic=False)(x)
        return bool(out.item() == 1.0)
    except Exception:  # noqa: BLE001 - a torch this probe cannot run on: assume the bug, as before
        return True
    finally:
        counters.clear()
        counters.update(saved)


@contextlib.contextmanager
def applied_to_every_backend() -> Iterator[None]:
    """Inside: the fix applies to traces for every backend (``torch.compile(backend="inductor")``
    becomes "stock + fix"), for benchmarks; installs it first where it is needed."""
    global _every_backend
    install()
    previous, _every_backend = _every_backend, True
    try:
        yield
    finally:
        _every_backend = previous


def install() -> bool:
    """Install the fix where this torch needs it (:func:`torch_folds_is_exporting`) and has the
    pieces it needs; True when installed."""
    global _installed
    if _installed:
        return True
    if not torch_folds_is_exporting():
        return False
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        from torch._dynamo.variables import torch as dynamo_torch
    except ImportError:
        return False
    table = getattr(dynamo_torch, "tracing_state_functions", None)
    if (table is None or not hasattr(torch.compiler, "_is_exporting_flag")
            or not hasattr(InstructionTranslator, "current_tx")):
        return False
    fixed = _TracingState(table())
    if torch.compiler.is_exporting not in fixed:
        return False
    dynamo_torch.tracing_state_functions = functools.cache(lambda: fixed)
    _installed = True
    return True
