"""Our post-grad pass inside vLLM, without our backend.

    vllm serve MODEL --compilation-config \\
        '{"inductor_passes": {"post_grad_custom_post_pass": "kda_inductor.post_grad_pass"}}'

How vLLM takes it (read in vLLM's ``vllm/config/compilation.py``, ``CompilationConfig.__post_init__``,
and ``vllm/compilation/passes/inductor_pass.py`` / ``pass_manager.py``):

* the qualified name is resolved as ``__import__("kda_inductor").__dict__["post_grad_pass"]``:
  ``__import__`` of a dotted name returns the top-level package, so the object must be a plain
  attribute of ``kda_inductor`` itself (a lazy module ``__getattr__`` is not consulted);
* an object that is not an instance of vLLM's ``InductorPass`` is wrapped in
  ``CallableInductorPass(obj)``, whose uuid hashes the source text of ``type(obj)`` only: our
  pattern sources and options would not be in vLLM's cache key, and an upgraded kda_inductor
  could be served stale compiled code. So :class:`VllmPostGradPass` is registered as a virtual
  subclass of ``InductorPass`` (``InductorPass.register``, the ABC mechanism); vLLM then uses it
  as is, and its ``uuid()`` is our pass's content hash (sources and options);
* vLLM's ``PostGradPassManager`` adds it after its own passes (``add`` asserts
  ``isinstance(pass_, InductorPass)``), asks ``is_applicable_for_range(compile_range)`` (older
  versions: ``is_applicable(shape)``) before calling it on each graph, and hashes ``uuid()``
  with ``json.dumps``; the config hash (``normalize_value``) also calls ``uuid()``.

The registration does not depend on the order of imports. ``import kda_inductor`` registers at
once when vLLM's pass module is already loaded; otherwise it leaves a small import hook
(:class:`_RegisterAfterImport`, on ``sys.meta_path``) that registers right after vLLM's pass
module has been executed, before vLLM's config can resolve the name, and then removes
itself. vLLM's ``vllm.general_plugins`` entry point (:func:`vllm_plugin`) and each
:class:`VllmPostGradPass` made later register too. (vLLM builds its ``CompilationConfig`` in
``LLM.__init__`` before it loads plugins, and ``import vllm`` does not load the pass module,
so neither of those alone is early enough when kda_inductor was imported first.)

Routes vLLM accepts (both tested on a real vLLM, ``integration/test_vllm_real.py``): the
qualified name in ``inductor_passes``, which vLLM types ``dict[str, str]`` (a pass object there
is rejected), or, from Python, the object itself in ``inductor_compile_config``.

Nothing here imports torch until the pass runs or is hashed: ``import kda_inductor`` stays cheap.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

_VLLM_PASS_MODULES = ("vllm.compilation.passes.inductor_pass", "vllm.compilation.inductor_pass")


class VllmPostGradPass:
    """The kda_inductor rewrites as a vLLM post-grad pass (``kda_inductor.post_grad_pass``).

    ``VllmPostGradPass(**kda_options)`` takes the options of ``options={"kda": {...}}``
    (``disable``, ``strict``, ``force``); make such an instance a top-level attribute of a
    module of yours and name it in ``inductor_passes`` (``"my_passes.kda_pass"``).
    """

    def __init__(self, **kda_options: Any) -> None:
        self.kda_options = dict(kda_options)
        self._impl: Any = None
        register_with_vllm()

    def _pass(self) -> Any:
        if self._impl is None:
            from kda_inductor.options import KdaOptions
            from kda_inductor.pass_manager import KdaPostGradPass

            self._impl = KdaPostGradPass(KdaOptions.parse(self.kda_options))
        return self._impl

    def __call__(self, graph: Any) -> None:
        self._pass()(graph)

    def uuid(self) -> str:
        """Our pass's content hash: every kda_inductor source file and the options."""
        return self._pass().uuid()

    def is_applicable_for_range(self, compile_range: Any) -> bool:
        """vLLM asks before each graph; the rewrites decide per graph themselves."""
        return True

    def is_applicable(self, shape: Any = None) -> bool:
        """The same question in older vLLM versions."""
        return True

    def __getstate__(self) -> dict[str, Any]:
        return {"kda_options": self.kda_options, "_impl": None}

    def __reduce__(self) -> Any:
        if self is post_grad_pass:
            return "post_grad_pass"  # pickled by reference: kda_inductor.post_grad_pass
        return (VllmPostGradPass, (), self.__getstate__())

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.kda_options.items())
        return f"kda_inductor.VllmPostGradPass({opts})"


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Calls :func:`register_with_vllm` right after one of vLLM's pass modules is executed.

    It finds nothing itself: for those module names it asks the other finders for the spec
    and wraps that spec's loader's ``exec_module`` (the loader keeps its type, so source
    look-ups such as vLLM's ``inspect.getsource`` hashing are unchanged). It leaves
    ``sys.meta_path`` once a registration has been made."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _VLLM_PASS_MODULES:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is not None:
            def exec_then_register(module: Any) -> None:
                exec_module(module)  # the import system put the module in sys.modules before this
                if register_with_vllm():
                    uninstall_import_hook()

            spec.loader.exec_module = exec_then_register
        return spec


_hook = _RegisterAfterImport()


def install_import_hook() -> None:
    """Register now if vLLM's pass module is loaded, else once it is (idempotent)."""
    if not register_with_vllm() and _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)


def uninstall_import_hook() -> None:
    while _hook in sys.meta_path:
        sys.meta_path.remove(_hook)


def register_with_vllm() -> bool:
    """Make :class:`VllmPostGradPass` a virtual subclass of vLLM's ``InductorPass`` if vLLM's
    pass module is loaded (it never imports vLLM). Safe to call many times; True when done.
    Also the ``vllm.general_plugins`` entry point."""
    done = False
    for name in _VLLM_PASS_MODULES:
        module = sys.modules.get(name)
        base = getattr(module, "InductorPass", None)
        if base is not None and hasattr(base, "register"):
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
