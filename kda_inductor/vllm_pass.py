"""Our post-grad pass inside vLLM, without our backend.

    vllm serve MODEL --compilation-config \\
        '{"inductor_passes": {"post_grad_custom_post_pass": "kda_inductor.post_grad_pass"}}'

How vLLM takes it (read in vLLM 0.32: ``vllm/config/compilation.py``, ``CompilationConfig.__post_init__``;
``vllm/compilation/passes/inductor_pass.py``; ``vllm/compilation/backends.py``; ``vllm/config/utils.py``;
``vllm/plugins``; ``vllm/engine/arg_utils.py``; ``vllm/entrypoints/llm.py``):

* the qualified name is resolved as ``__import__("kda_inductor").__dict__["post_grad_pass"]`` (a
  plain attribute of the package: a module ``__getattr__`` is not consulted) when the
  ``CompilationConfig`` is built: in ``LLM(...)`` before vLLM loads its plugins, in ``vllm serve``
  after; whichever of vLLM and kda_inductor was imported first;
* the object found is used as is where ``isinstance(obj, InductorPass)`` (vLLM's class), else it is
  wrapped in ``CallableInductorPass(obj)``, whose uuid (vLLM's compile cache key for the pass, in
  ``CompilationConfig.compute_hash`` and in its ``PostGradPassManager.uuid``) is a hash of the
  source of ``type(obj)``: it would not change with our rewrites, kernels or options;
* vLLM's backend asserts the configured pass is an ``InductorPass`` and calls
  ``is_applicable_for_range(compile_range)`` (older versions: ``is_applicable(shape)``) before
  running it on each graph; ``compute_hash`` keys on ``uuid()``.

So the pass is one of vLLM's ``InductorPass`` objects **when vLLM asks**: its ``__class__`` (what
``isinstance`` consults, as for ``unittest.mock``'s ``spec``) is a subclass of vLLM's
``InductorPass`` made on first asking (:func:`_pass_class`) from vLLM's module as it is then
loaded (vLLM is imported by then: it is the one asking); without vLLM loaded it is a subclass of
torch's ``CustomGraphPass`` (where torch's module is loaded: Inductor's cache asks too), else our
plain class. Its ``uuid()`` is our content hash (:meth:`~kda_inductor.options.KdaOptions.pass_uuid`:
every source file of the package and the options): an upgrade or other options recompile, in every
import order, with or without vLLM's plugins. Nothing is registered anywhere and nothing is imported
to answer: importing this module imports neither torch nor vLLM and changes no state outside it;
the pass imports torch when it first runs. Tested on a real vLLM: ``integration/test_vllm_real.py``.

Routes vLLM accepts: the qualified name in ``inductor_passes`` (typed ``dict[str, str]``), or, from
Python, the object itself in ``inductor_compile_config``.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from kda_inductor.options import KdaOptions


class VllmPostGradPass:
    """The kda_inductor rewrites as a vLLM post-grad pass (``kda_inductor.post_grad_pass``).

    ``VllmPostGradPass(**kda_options)`` takes the options of ``options={"kda": {...}}``
    (``disable``, ``strict``, ``force``); make such an instance a top-level attribute of a
    module of yours and name it in ``inductor_passes`` (``"my_passes.kda_pass"``). To vLLM it is
    an ``InductorPass`` keyed on our content (the module's docstring)."""

    def __init__(self, **kda_options: Any) -> None:
        self.options = KdaOptions.parse(kda_options) if kda_options else KdaOptions()
        self.kda_options = dict(kda_options)
        self._impl: Any = None

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        """vLLM's ``InductorPass`` (torch's ``CustomGraphPass``) subclass of our class, where the
        module that asks ``isinstance`` is loaded (:func:`_pass_class`); ``type(self)`` stays ours."""
        return _pass_class(type(self))

    def _pass(self) -> Any:
        if self._impl is None:
            from kda_inductor.pass_manager import KdaPostGradPass

            self._impl = KdaPostGradPass(self.options)
        return self._impl

    def __call__(self, graph: Any) -> None:
        self._pass()(graph)

    def uuid(self) -> str:
        """Our pass's content hash: every kda_inductor source file and the options."""
        return self.options.pass_uuid()

    def is_applicable_for_range(self, compile_range: Any) -> bool:
        """vLLM asks before each graph; the rewrites decide per graph themselves."""
        return True

    def is_applicable(self, shape: Any = None) -> bool:
        """The same question in older vLLM versions."""
        return True

    def __reduce__(self) -> Any:
        if self is post_grad_pass:
            return "post_grad_pass"  # pickled by reference: kda_inductor.vllm_pass.post_grad_pass
        return (_with_options, (self.kda_options,))

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.kda_options.items())
        return f"kda_inductor.VllmPostGradPass({opts})"


def _with_options(kda_options: dict[str, Any]) -> VllmPostGradPass:
    return VllmPostGradPass(**kda_options)


VLLM_PASS_MODULES = ("vllm.compilation.passes.inductor_pass", "vllm.compilation.inductor_pass")
"""Where vLLM keeps ``InductorPass``: 0.32 and later, then the older name."""
TORCH_PASS_MODULE = "torch._inductor.custom_graph_pass"


def _pass_class(cls: type) -> type:
    """``cls`` as vLLM's ``InductorPass`` where vLLM's pass module is loaded, else as torch's
    ``CustomGraphPass`` where that is, else ``cls``: read from ``sys.modules`` only (never imports)."""
    for name in (*VLLM_PASS_MODULES, TORCH_PASS_MODULE):
        base = getattr(sys.modules.get(name), "InductorPass" if name != TORCH_PASS_MODULE else "CustomGraphPass", None)
        if isinstance(base, type):
            return _subclass(cls, base)
    return cls


@functools.cache
def _subclass(cls: type, base: type) -> type:
    """A class of ``cls`` and ``base`` (never instantiated: what ``isinstance`` reads), named as ``cls``."""
    return type(cls.__name__, (cls, base), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})


def vllm_plugin() -> None:
    """Our ``vllm.general_plugins`` entry point (vLLM calls it in every process at start-up): only
    when ``KDA_INDUCTOR_VLLM_OPS=1`` is set, puts vLLM's indexer cache ops on our kernels
    (:mod:`kda_inductor.vllm_ops`). The pass needs no plugin (the module's docstring)."""
    from kda_inductor import vllm_ops

    if vllm_ops.requested():
        vllm_ops.install()


post_grad_pass = VllmPostGradPass()
"""The default-options instance that ``"kda_inductor.post_grad_pass"`` names."""
