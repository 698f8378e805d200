"""kda_inductor: a torch.compile backend that fuses hybrid linear-attention and
sparse-attention serving code into Triton kernels.

    torch.compile(model, backend="kda_inductor")            # no import needed
    torch.compile(model, backend="kda_inductor", options={"kda": {"disable": [...]}})
    print(kda_inductor.explain(fn, *args))

Inside vLLM (no backend there), the pass alone:

    vllm serve MODEL --compilation-config \
        '{"inductor_passes": {"post_grad_custom_post_pass": "kda_inductor.post_grad_pass"}}'

Public surface: ``backend`` (the module; ``backend.kda_inductor`` is the compiler
function that the ``torch_dynamo_backends`` entry point names), ``post_grad_pass`` (the
pass alone, a plain attribute: vLLM resolves the name as
``__import__("kda_inductor").__dict__["post_grad_pass"]``) and ``VllmPostGradPass`` (the
same with options), ``explain`` (with
``mode=``/``options=``; ``Explainer`` passes every keyword to fn) and its ``Report``, ``KdaOptions``,
``REWRITE_NAMES`` and ``__version__``; ``exporting`` (a context: ``torch.export`` with the trace rules); ``kda_inductor.ops`` (importing it registers every
``torch.ops.kda.*`` op, for code that calls them directly); ``kda_inductor.testing`` and the pytest
plugin for tests; the ``kda-inductor`` command.

Attributes are imported on first use, so that ``import kda_inductor`` (which the
pytest plugin does at pytest start-up) imports neither torch nor triton nor vLLM, and changes
nothing outside the package: what must happen when vLLM loads goes through vLLM's plugin entry
point (``vllm_plugin``), what Dynamo traces for our backend through the backend's registration
(``kda_inductor.backend``).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# plain attributes (not lazy): vLLM looks them up in this module's __dict__ (a module __getattr__ is not
# consulted); the pass is vLLM's InductorPass when vLLM asks (vllm_pass); no torch import
from kda_inductor.vllm_pass import VllmPostGradPass, post_grad_pass, vllm_plugin  # noqa: E402

_LAZY = {
    "backend": ("kda_inductor.backend", None),
    # the implementation lives in a private module: a submodule named ``explain`` would be bound over the
    # function as soon as anything imported it
    "explain": ("kda_inductor._explain", "explain"),
    "Explainer": ("kda_inductor._explain", "Explainer"),
    "Report": ("kda_inductor._explain", "Report"),
    "GraphReport": ("kda_inductor._explain", "GraphReport"),
    "KdaOptions": ("kda_inductor.options", "KdaOptions"),
    "exporting": ("kda_inductor._export", "exporting"),
    "REWRITE_NAMES": ("kda_inductor.patterns", "REWRITE_NAMES"),
}

__all__ = ["Explainer", "GraphReport", "KdaOptions", "REWRITE_NAMES", "Report", "VllmPostGradPass", "__version__", "backend",
           "explain", "exporting", "post_grad_pass", "vllm_plugin"]


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
