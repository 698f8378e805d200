"""The ``kda_inductor`` torch.compile backend: stock Inductor plus our post-grad pass.

Registered under the ``torch_dynamo_backends`` entry point, so
``torch.compile(m, backend="kda_inductor")`` works without importing us.
``mode=`` and every Inductor option behave exactly as with ``backend="inductor"``;
the extra ``options["kda"]`` key holds :class:`~kda_inductor.options.KdaOptions`.

Importing this module changes nothing outside it. The rules of :mod:`kda_inductor._dynamo_fixes`
(what Dynamo traces, in traces for this backend only) are registered with Dynamo when torch
resolves the name ``"kda_inductor"`` (the entry point names :data:`registered_backend`, which
registers them and is :func:`kda_inductor`): that is at ``torch.compile(..., backend="kda_inductor")``,
before its first trace. Each compile registers them again for fla modules imported since
(a backend passed as the function object gets them from its first compile on).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import torch

from kda_inductor import _dynamo_fixes, logs
from kda_inductor.options import KdaOptions
from kda_inductor.pass_manager import KdaPostGradPass, combine_with

HOOK = "post_grad_custom_post_pass"


def _inductor_config_patches(mode: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """Inductor's own config patches for ``mode``/``options``, validated as Inductor does."""
    wrapper_cls = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper_cls is not None:
        return dict(wrapper_cls(mode, options, None).config)
    # Fallback for a torch without the wrapper: same mapping, less validation.
    from torch._inductor import list_mode_options

    patches = dict(list_mode_options(mode)) if mode and mode != "default" else {}
    patches.update({k.replace("-", "_"): v for k, v in options.items()})
    return patches


def kda_inductor(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    mode: str | None = None,
    options: dict[str, Any] | None = None,
):
    """Compile ``gm`` with Inductor, running the kda rewrites as a post-grad pass."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    _dynamo_fixes.register()  # for the next traces: fla modules imported since the last compile
    try:
        options = dict(options or {})
        kda_options = KdaOptions.parse(options.pop("kda", None))
        patches = _inductor_config_patches(mode, options)
    except (TypeError, ValueError, RuntimeError) as exc:  # the settings' own errors, not the graph's
        return _raises(exc)
    existing = patches.get(HOOK, getattr(inductor_config, HOOK))
    grad = _traced_with_grad(example_inputs)

    def compile_with(ours: KdaPostGradPass):
        patches[HOOK] = combine_with(ours, existing)
        with logs.cache_scope(ours.uuid):  # TORCH_LOGS=kda_inductor: says when a cache served the graph
            return compile_fx(gm, example_inputs, config_patches=patches)

    ours = KdaPostGradPass(kda_options, grad=grad)
    try:
        return compile_with(ours)
    except Exception as exc:  # noqa: BLE001 - only a failure on code our speed rules left is retried
        if not ours.left_to_inductor:
            raise
        failure = exc
    return _compile_forced(compile_with, ours, failure)


def _compile_forced(compile_with: Callable[[KdaPostGradPass], Any], ours: KdaPostGradPass,
                    failure: Exception) -> Any:
    """Stock Inductor cannot compile code that a speed rule left to it (torch 2.9's CPU lowering
    of the cache write's byte view, for example): our op is better than a failed compile. Warn,
    take back what ``ours`` reported, and compile again with every match rewritten; if that
    fails too, raise Inductor's first error with a note."""
    left = sorted(ours.left_to_inductor)
    note = (f"Inductor could not compile this graph with {', '.join(left)} left to it by the speed "
            f"rules ({_one_line(failure)}); compiled again with every match rewritten")
    warnings.warn(f"kda_inductor: {note}", RuntimeWarning, stacklevel=3)
    ours.retract()
    try:
        return compile_with(KdaPostGradPass(dataclasses.replace(ours.options, force=True), grad=ours.grad, note=note))
    except Exception as again:  # noqa: BLE001
        if hasattr(failure, "add_note"):  # Python 3.11+
            failure.add_note(f"kda_inductor: compiling again with every match rewritten failed too: {_one_line(again)}")
        raise failure from None


def _raises(exc: Exception) -> Callable[..., Any]:
    """A compiled function that raises ``exc`` (its type and message) at every call.

    A bad ``mode=``/``options=`` (a typo, an unknown rewrite name) reaches the backend only at
    the first call, inside Dynamo, which wraps whatever a backend raises in
    ``BackendCompilerFailed`` with its "reporting a bug to PyTorch" text (torch 2.9-2.14; no hook
    sees the options at ``torch.compile`` time). Raised by the compiled code instead, it reaches
    the caller as itself, at every call, since the settings stay wrong.
    """

    def bad_settings(*_: Any) -> Any:
        raise exc.with_traceback(None)

    return bad_settings


def _one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, at most 200 characters."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:200]


def _traced_with_grad(example_inputs: list[Any]) -> bool:
    """AOTAutograd will trace a joint forward/backward graph: grad mode is on and some input
    (parameters are inputs of Dynamo's graph) requires grad."""
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs
    )


def _reset() -> None:
    """Called by ``torch._dynamo.reset()``: drop cudagraph trees as Inductor does."""
    from torch._inductor import config

    if config.triton.cudagraphs:
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees

        reset_cudagraph_trees()


kda_inductor.reset = _reset  # type: ignore[attr-defined]
setattr(kda_inductor, _dynamo_fixes.MARK, True)  # the traces _dynamo_fixes' rules apply to


def __getattr__(name: str) -> Any:
    """``registered_backend``: what the ``torch_dynamo_backends`` entry point names, which torch
    loads when it resolves ``backend="kda_inductor"``: :func:`kda_inductor`, once the rules of
    :mod:`kda_inductor._dynamo_fixes` are registered with Dynamo (before the first trace)."""
    if name != "registered_backend":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _dynamo_fixes.register()
    return kda_inductor

