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

The registration runs when ``kda_inductor`` is imported with vLLM's pass module already loaded
(as during that resolution) and from vLLM's ``vllm.general_plugins`` entry point (every vLLM
process calls it at start-up), so the order of imports does not matter.

Nothing here imports torch until the pass runs or is hashed: ``import kda_inductor`` stays cheap.
"""

from __future__ import annotations

import sys
from typing import Any

_VLLM_PASS_MODULES = ("vllm.compilation.passes.inductor_pass", "vllm.compilation.inductor_pass")


class VllmPostGradPass:
    """The kda_inductor rewrites as a vLLM post-grad pass (``kda_inductor.post_grad_pass``).

    ``VllmPostGradPass(**kda_options)`` takes the options of ``options={"kda": {...}}``
    (``disable``, ``enable``, ``strict``, ``force``); pass such an instance from Python as
    ``CompilationConfig(inductor_passes={"post_grad_custom_post_pass": obj})``.
    """

    def __init__(self, **kda_options: Any) -> None:
        self.kda_options = dict(kda_options)
        self._impl: Any = None

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


post_grad_pass = VllmPostGradPass()
"""The default-options instance that ``"kda_inductor.post_grad_pass"`` names."""


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
