"""Our post-grad pass inside vLLM, without our backend.

    vllm serve MODEL --compilation-config \\
        '{"inductor_passes": {"post_grad_custom_post_pass": "kda_inductor.post_grad_pass"}}'

How vLLM takes it (read in vLLM 0.32: ``vllm/config/compilation.py``, ``CompilationConfig.__post_init__``;
``vllm/compilation/passes/inductor_pass.py``; ``vllm/compilation/backends.py``; ``vllm/plugins``;
``vllm/engine/arg_utils.py``; ``vllm/entrypoints/llm.py``):

* the qualified name is resolved as ``__import__("kda_inductor").__dict__["post_grad_pass"]`` (a
  plain attribute of the package: a lazy module ``__getattr__`` is not consulted) when the
  ``CompilationConfig`` is built: in ``LLM(...)`` that is before vLLM loads its plugins (they load
  in ``EngineArgs.__post_init__``), in ``vllm serve`` after;
* an object that is not an instance of vLLM's ``InductorPass`` there is wrapped in
  ``CallableInductorPass(obj)``, whose uuid (vLLM's compile cache key for the pass, also what
  Inductor's FX graph cache sees through vLLM's pass manager) is ``InductorPass.hash_source(obj)``:
  the text of ``obj`` itself if it is a ``str``, else the source of ``type(obj)``. A class source
  would not change with our pattern sources or options: an upgraded kda_inductor could be served
  stale compiled code. So **the pass is a str whose text is its content hash**
  (:meth:`~kda_inductor.options.KdaOptions.pass_uuid`: our sources and options) and is callable:
  wrapped or not, vLLM's cache key covers what it compiles, in every import order;
* a pass object given from Python in ``inductor_compile_config`` is not wrapped, and vLLM's
  backend asserts it is an ``InductorPass`` when it compiles (after its plugins are loaded): our
  ``vllm.general_plugins`` entry point, :func:`vllm_plugin`, registers :class:`VllmPostGradPass`
  as a virtual subclass of ``InductorPass`` (the ABC mechanism). Where plugins load before the
  config (``vllm serve``), the named pass is then used as is, its ``uuid()`` the same content hash;
* vLLM's ``PostGradPassManager`` asks ``is_applicable_for_range(compile_range)`` (older versions:
  ``is_applicable(shape)``) before calling a pass on each graph.

Routes vLLM accepts (tested on a real vLLM, ``integration/test_vllm_real.py``): the qualified name
in ``inductor_passes`` (typed ``dict[str, str]``), or, from Python, the object itself in
``inductor_compile_config``. Importing this module imports neither torch nor vLLM and changes no
state outside it; the pass imports torch when it first runs.
"""

from __future__ import annotations

import importlib
from typing import Any

from kda_inductor.options import KdaOptions

_VLLM_PASS_MODULES = ("vllm.compilation.passes.inductor_pass", "vllm.compilation.inductor_pass")


class VllmPostGradPass(str):
    """The kda_inductor rewrites as a vLLM post-grad pass (``kda_inductor.post_grad_pass``).

    ``VllmPostGradPass(**kda_options)`` takes the options of ``options={"kda": {...}}``
    (``disable``, ``strict``, ``force``); make such an instance a top-level attribute of a
    module of yours and name it in ``inductor_passes`` (``"my_passes.kda_pass"``). Its text is its
    content hash (see the module's docstring: how vLLM keys its cache on a named pass)."""

    kda_options: dict[str, Any]

    def __new__(cls, **kda_options: Any) -> VllmPostGradPass:
        options = KdaOptions.parse(kda_options) if kda_options else KdaOptions()
        self = super().__new__(cls, options.pass_uuid())
        self.kda_options = dict(kda_options)
        self._impl = None
        return self

    def _pass(self) -> Any:
        if self._impl is None:
            from kda_inductor.pass_manager import KdaPostGradPass

            self._impl = KdaPostGradPass(KdaOptions.parse(self.kda_options))
        return self._impl

    def __call__(self, graph: Any) -> None:
        self._pass()(graph)

    def uuid(self) -> str:
        """Our pass's content hash (every kda_inductor source file and the options): the text."""
        return str.__str__(self)

    def is_applicable_for_range(self, compile_range: Any) -> bool:
        """vLLM asks before each graph; the rewrites decide per graph themselves."""
        return True

    def is_applicable(self, shape: Any = None) -> bool:
        """The same question in older vLLM versions."""
        return True

    def __reduce__(self) -> Any:
        if self is post_grad_pass:
            return "post_grad_pass"  # pickled by reference: kda_inductor.post_grad_pass
        return (_with_options, (self.kda_options,))

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.kda_options.items())
        return f"kda_inductor.VllmPostGradPass({opts})"


def _with_options(kda_options: dict[str, Any]) -> VllmPostGradPass:
    return VllmPostGradPass(**kda_options)


def register_with_vllm() -> bool:
    """Make :class:`VllmPostGradPass` a virtual subclass of vLLM's ``InductorPass`` (True when
    vLLM has that class). Safe to call many times; imports vLLM's pass module: call it from vLLM
    (:func:`vllm_plugin`)."""
    done = False
    for name in _VLLM_PASS_MODULES:
        try:
            base = importlib.import_module(name).InductorPass
        except ModuleNotFoundError as err:
            if not name.startswith(err.name or "\0"):  # a module it imports is missing: vLLM's error
                raise
            continue  # this vLLM keeps its pass module under the other name
        if not issubclass(VllmPostGradPass, base):
            base.register(VllmPostGradPass)
        done = True
    return done


def vllm_plugin() -> None:
    """Our ``vllm.general_plugins`` entry point (vLLM calls it in every process at start-up):
    registers the pass (:func:`register_with_vllm`) and, only when ``KDA_INDUCTOR_VLLM_OPS=1``
    is set, puts vLLM's indexer cache ops on our kernels (:mod:`kda_inductor.vllm_ops`)."""
    register_with_vllm()
    from kda_inductor import vllm_ops

    if vllm_ops.requested():
        vllm_ops.install()


post_grad_pass = VllmPostGradPass()
"""The default-options instance that ``"kda_inductor.post_grad_pass"`` names."""
