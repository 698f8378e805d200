"""kda_inductor: a torch.compile backend that fuses hybrid linear-attention and
sparse-attention serving code into Triton kernels.

    torch.compile(model, backend="kda_inductor")            # no import needed
    torch.compile(model, backend="kda_inductor", options={"kda": {"disable": [...]}})
    print(kda_inductor.explain(fn, *args))

Public surface: ``backend`` (the module; ``backend.kda_inductor`` is the compiler
function that the ``torch_dynamo_backends`` entry point names), ``explain`` (and
``Explainer`` for mode/options) and its ``Report``, ``KdaOptions``,
``REWRITE_NAMES`` and ``__version__``; ``kda_inductor.testing`` and the pytest
plugin for tests; the ``kda-inductor`` command.

Attributes are imported on first use, so that ``import kda_inductor`` (which the
pytest plugin does at pytest start-up) imports neither torch nor triton.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "backend": ("kda_inductor.backend", None),
    "explain": ("kda_inductor.explain", "explain"),
    "Explainer": ("kda_inductor.explain", "Explainer"),
    "Report": ("kda_inductor.explain", "Report"),
    "KdaOptions": ("kda_inductor.options", "KdaOptions"),
    "REWRITE_NAMES": ("kda_inductor.patterns", "REWRITE_NAMES"),
}

__all__ = ["Explainer", "KdaOptions", "REWRITE_NAMES", "Report", "__version__", "backend", "explain"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'kda_inductor' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = importlib.import_module(module)
    value = value if attr is None else getattr(value, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
