"""``torch.export`` (and so AOTInductor) with kda_inductor's trace rules: :func:`exporting`.

Under ``torch.compile(backend="kda_inductor")`` the trace rules (``docs/dynamo-rules.md``) change what
Dynamo traces: prefill's chunked cores (transformers' ``torch_chunk_gated_delta_rule`` and Kimi
Linear's ``chunk_kimi_delta_attention``, fla's chunked and recurrent entry points) become our ops.
``torch.export`` is no kda_inductor compile: its strict trace is Dynamo's for no backend, its
non-strict one (the default) runs the model's Python under tracing tensors, so Dynamo's
substitutions never apply. Inside :func:`exporting` both traces get them: the rules read the
context's options, and each function they cover is replaced, where the model looks it up (the
modeling modules' globals, and the layers' own attributes for a ``model`` given: transformers
<= 5.17 binds ``self.chunk_gated_delta_rule`` at construction), by the rule's function, which calls
the op in its domain and the original elsewhere (a miss with its reason, as in a compile). Everything
is put back on exit.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from kda_inductor.options import KdaOptions


@contextlib.contextmanager
def exporting(model: Any = None, options: Mapping[str, Any] | KdaOptions | None = None) -> Iterator[None]:
    """Within the block, ``torch.export.export`` traces the functions the trace rules cover as our
    ops (speed rules and ``disable`` as in a compile; ``options``: what ``options["kda"]`` takes).
    ``model``: also replace the functions its submodules hold as attributes.

        with kda_inductor.exporting(model):
            ep = torch.export.export(model, args)
        pkg = torch._inductor.aoti_compile_and_package(
            ep, inductor_configs={"post_grad_custom_post_pass": KdaPostGradPass(KdaOptions())})

    Any other trace inside the block (``torch.compile`` with another backend) gets the rules too.
    """
    import kda_inductor.ops  # noqa: F401  (registers the ops the rules call)
    from kda_inductor import _dynamo_fixes
    from kda_inductor import _dynamo_substitute as shared

    opts = options if isinstance(options, KdaOptions) else KdaOptions.parse(options)
    _dynamo_fixes.register()
    swaps = _swaps(model)
    shared._exporting.append(opts)
    done: list[tuple[Any, str, Any, Any]] = []
    try:
        for swap in swaps:
            setattr(swap[0], swap[1], swap[3])
            done.append(swap)
        yield
    finally:
        for target, name, old, _ in reversed(done):
            setattr(target, name, old)
        shared._exporting.pop()


def _swaps(model: Any) -> list[tuple[Any, str, Any, Any]]:
    """``(object, attribute, what it holds, what replaces it)`` for each function a rule covers: the
    references in transformers' modeling modules, then ``model``'s submodules' attributes holding one
    of those or an fla entry point."""
    from kda_inductor import _dynamo_chunk
    from kda_inductor import _dynamo_substitute as shared

    swaps: list[tuple[Any, str, Any, Any]] = []
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("transformers.models."):
            continue
        for name in _dynamo_chunk.TORCH_CHUNK_REFERENCES:
            attr = getattr(module, name, None)
            fn = _dynamo_chunk.reference_behind(attr, name)
            if fn is not None and id(fn) in shared._polyfills:
                swaps.append((module, name, attr, shared._polyfills[id(fn)]))
    if model is not None:
        replacing = {id(old): new for *_, old, new in swaps}
        replacing.update({key: shared._polyfills[key] for key in shared._substituted})
        for sub in model.modules():
            for name, attr in list(vars(sub).items()):
                if callable(attr) and id(attr) in replacing:
                    swaps.append((sub, name, attr, replacing[id(attr)]))
    return swaps
