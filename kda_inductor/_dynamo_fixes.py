"""Rules for what Dynamo traces, each applied only to traces for kda_inductor
(``docs/dynamo-rules.md``): stock ``torch.compile`` keeps its torch's behaviour, so that
benchmarks against it stay honest.

1. **``torch.compiler.is_exporting()`` reads the flag** (a backport of pytorch#176499): torch <=
   2.12 folds it to the constant True in every ``torch.compile`` trace (pytorch#176347), so
   transformers' hub-kernel dispatch (``use_kernel_func_from_hub_with_fallback``) took its torch
   reference cores instead of fla-core's and causal-conv1d's kernels. :class:`ReadsTheFlag` wraps
   torch's own Dynamo handler of ``is_exporting`` and replaces its answer by
   ``torch.compiler._is_exporting_flag`` where the two differ in a trace for us: on a torch with
   #176499 they never differ, so the rule changes nothing there.
2. **fla's recurrent decode entry points become ``kda::gdn_recurrent_step``**: with
   fla-core installed and ``is_exporting()`` False, transformers' decode calls fla's
   ``fused_recurrent_gated_delta_rule`` (qwen3_next, qwen3_5, olmo_hybrid) or
   ``fused_recurrent_kda`` (kimi_linear), which fla keeps out of graphs
   (``torch.compiler.disable``): a graph break in every layer. In our traces those two function
   objects (by identity: :data:`FLA_ENTRY_POINTS`) are traced as :func:`fla_recurrent_step`, the
   same computation in one call of our op, so the decode step stays one graph; arguments outside
   the op's domain (varlen ``cu_seqlens``, in-kernel gates, ...) and
   ``options["kda"]["disable"] = ["gdn_recurrent_step"]`` keep fla's own function. Dynamo's
   polyfill registration (``torch.compiler.substitute_in_graph``) puts the rule in; a constant
   evaluated at trace time (``torch.compiler.assume_constant_result``) says whose trace it is.

3. **transformers' torch chunk core becomes ``kda::gdn_chunk``** (:func:`torch_chunk_references`),
   with its own speed rule (:data:`TORCH_CHUNK_RULE_MEASURED`): on CUDA (measured), forced elsewhere.

:func:`register` registers them with Dynamo (idempotent; nothing at import): when torch resolves
the backend name (``kda_inductor.backend``'s entry point, before the first trace) and again at
each of our compiles, for fla modules imported later.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from kda_inductor.options import TRACE_RULES, KdaOptions

RULE, CHUNK_RULE = TRACE_RULES
"""``gdn_recurrent_step`` / ``gdn_chunk``: ``options["kda"]["disable"]`` turns an fla rule off with
the name of the op it emits."""
FLA_ENTRY_POINTS = (
    ("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule"),  # qwen3_next, qwen3_5, olmo_hybrid
    ("fla.ops.kda", "fused_recurrent_kda"),  # kimi_linear
)
"""fla-core's recurrent entry points transformers dispatches decode to: (module, attribute)."""
FLA_CHUNK_ENTRY_POINTS = (("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),)  # qwen3_next, qwen3_5 prefill
"""fla-core's chunked entry points traced as ``kda::gdn_chunk`` (rule :data:`CHUNK_RULE`)."""

MARK = "_kda_inductor_rules"
"""The attribute that marks a compiler function whose traces these rules apply to: the backend sets
it on :func:`kda_inductor.backend.kda_inductor` (this module does not import the backend)."""

_every_backend = False
_exporting_rule: ReadsTheFlag | None = None
_substituted: dict[int, Callable[..., Any]] = {}
"""id(fla entry point) -> the entry point (kept alive: Dynamo keys polyfills by id)."""


def register() -> None:
    """Register both rules with Dynamo where this torch has the hooks (feature checks); the fla
    rule for each entry point whose module is imported (never imports fla). Idempotent."""
    _register_exporting_rule()
    if hasattr(torch.compiler, "substitute_in_graph") and hasattr(torch.compiler, "assume_constant_result"):
        for entry_points, chunked in ((FLA_ENTRY_POINTS, False), (FLA_CHUNK_ENTRY_POINTS, True)):
            for module, name in entry_points:
                fn = getattr(sys.modules.get(module), name, None)
                if callable(fn) and id(fn) not in _substituted:
                    _substitute_chunk(fn) if chunked else _substitute(fn)
        for fn in torch_chunk_references():
            if id(fn) not in _substituted:
                _substitute_torch_chunk(fn)


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


# --------------------------------------------------------------------------- rule 1: is_exporting


class ReadsTheFlag:
    """Dynamo's handler of ``torch.compiler.is_exporting`` with pytorch#176499 applied to traces for
    kda_inductor (every trace inside :func:`applied_to_every_backend`): the trace reads the flag
    ``torch.export`` sets. torch's own answer (``torch_handler``) stands wherever it is the flag
    already or the trace is someone else's."""

    def __init__(self, torch_handler: Callable[..., Any]) -> None:
        self.torch_handler = torch_handler

    def __call__(self, variable: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
        traced = self.torch_handler(variable, tx, *args, **kwargs)
        flag = bool(torch.compiler._is_exporting_flag)
        if traced.as_python_constant() is flag or not (_every_backend or our_options(tx) is not None):
            return traced
        from torch._dynamo.variables import ConstantVariable

        return ConstantVariable.create(flag)


def _register_exporting_rule() -> None:
    """Put :class:`ReadsTheFlag` around torch's handler (torch 2.9-2.14 keep one handler per
    function in ``TorchInGraphFunctionVariable._get_handlers()``), once."""
    global _exporting_rule
    if _exporting_rule is not None or not hasattr(torch.compiler, "_is_exporting_flag"):
        return
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

    handlers = getattr(TorchInGraphFunctionVariable, "_get_handlers", dict)()
    if torch.compiler.is_exporting in handlers:
        _exporting_rule = handlers[torch.compiler.is_exporting] = ReadsTheFlag(handlers[torch.compiler.is_exporting])


@contextlib.contextmanager
def applied_to_every_backend() -> Iterator[None]:
    """Inside: rule 1 applies to traces for every backend (``backend="inductor"`` becomes "stock +
    fix"), for benchmarks that separate what it gives from what the rewrites give."""
    global _every_backend
    register()
    previous, _every_backend = _every_backend, True
    try:
        yield
    finally:
        _every_backend = previous


def _is_exporting_probe(x):
    return x + 1 if torch.compiler.is_exporting() else x - 1


@functools.cache
def torch_folds_is_exporting() -> bool:
    """This torch traces ``is_exporting()`` to True under ``torch.compile`` (pytorch#176347): one
    trace of a two-line function with Dynamo's ``eager`` backend, Dynamo's counters left as found.
    For benchmarks (is "stock + fix" another variant here?); the rules never need it."""
    from torch._dynamo.utils import counters

    before = {group: dict(counts) for group, counts in counters.items()}
    try:
        x = torch.zeros(1)
        out = torch.compile(_is_exporting_probe, backend="eager", fullgraph=True, dynamic=False)(x)
        return bool(out.item() == 1.0)
    finally:
        for group in list(counters):  # the same Counter objects, their counts as before
            counters[group].clear()
            counters[group].update(before.get(group, {}))


# --------------------------------------------------------------------------- rule 2: fla's decode


def fla_recurrent_step(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                       use_qk_l2norm_in_kernel=False, gk=None):
    """fla's ``fused_recurrent_gated_delta_rule`` / ``fused_recurrent_kda`` on the arguments
    transformers passes, as one ``kda::gdn_recurrent_step``: ``[B, T, H, K]`` q / k (GVA: ``HV``
    value heads), a log decay per head (``g``) and / or per key channel (``gk``; KDA's ``g``),
    ``beta [B, T, HV]``, a ``[B, HV, K, V]`` state read as float32; returns ``(o, final_state or
    None)``, ``o`` in v's dtype, as fla does."""
    decay = gk if g is None else g if gk is None else g.unsqueeze(-1) + gk
    state = None if initial_state is None else initial_state.float()
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    out, final = torch.ops.kda.gdn_recurrent_step(q, k, v, decay, beta, state, scale, bool(use_qk_l2norm_in_kernel))
    return out, final if output_final_state else None


def _rule_is_on(rule: str) -> bool:
    from torch._dynamo.symbolic_convert import InstructionTranslator

    options = our_options(InstructionTranslator.current_tx())
    return options is not None and rule not in options.disable


@torch.compiler.assume_constant_result
def _rule_on() -> bool:
    """Evaluated once per trace, at trace time: the trace is for kda_inductor and the rule is not
    disabled (``options["kda"]["disable"]``)."""
    return _rule_is_on(RULE)


CHUNK_RULE_MEASURED = False
"""Whether ``kda::gdn_chunk`` was measured faster than fla's chunk kernels (the speed rule of the
prefill rule): not yet (H200, 2026-12-05: 1,285 us against fla's 270 at T = 4096, ``benchmarks/results/gdn_chunk.md``; the faster ``gdn_chunk.FAST`` path awaits its timing), so the rule applies only with
``options["kda"]["force"]`` (``docs/dynamo-rules.md``)."""


@torch.compiler.assume_constant_result
def _chunk_rule_on() -> bool:
    """:func:`_rule_on` of :data:`CHUNK_RULE`, which also needs its speed rule: measured faster
    than fla's kernels (:data:`CHUNK_RULE_MEASURED`), or ``force``."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    options = our_options(InstructionTranslator.current_tx())
    return _rule_is_on(CHUNK_RULE) and (CHUNK_RULE_MEASURED or bool(options and options.force))


def _same_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Another function object with ``fn``'s code, globals, defaults, closure and attributes (fla's
    ``torch.compiler.disable`` marks among them): Dynamo traces or skips it as it does ``fn``,
    without the rule substituting it again."""
    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    twin.__kwdefaults__ = fn.__kwdefaults__
    twin.__qualname__, twin.__module__ = fn.__qualname__, fn.__module__
    twin.__dict__.update(fn.__dict__)
    return twin


def _substitute(fn: Callable[..., Any]) -> None:
    """Register the rule for one fla recurrent entry point: in our op's domain (a decay and a beta
    per head given) and with the rule on, :func:`fla_recurrent_step` (:func:`_substitute_with`)."""
    import kda_inductor.lowerings.gdn_recurrent_step  # noqa: F401  (registers the op fla_recurrent_step calls)

    def in_domain(bound: dict) -> bool:
        beta = bound.get("beta")
        return (beta is not None and beta.dim() == 3  # one beta per head (not per value channel)
                and (bound.get("g") is not None or bound.get("gk") is not None))

    _substitute_with(fn, fla_recurrent_step, in_domain, _rule_on)


def _substitute_with(fn: Callable[..., Any], ours: Callable[..., Any], in_domain: Callable[[dict], bool],
                     rule_on: Callable[[], bool], *, extra_none: bool = False) -> None:
    """Register ``ours`` for fla's ``fn`` in traces: its call is bound against fla's own
    signature; where every argument ``ours`` does not read is at its default (``extra_none``: or
    a keyword ``fn``'s ``**kwargs`` takes, given as None), ``in_domain(bound)`` holds and
    ``rule_on()`` (evaluated once per trace), it is ``ours`` on the arguments it reads; else
    ``fn``'s own function."""
    reads = tuple(inspect.signature(ours).parameters)
    params = inspect.signature(fn).parameters.values()
    names = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    fla = _same_function(fn)

    def traced(*args, **kwargs):
        bound = {**defaults, **dict(zip(names, args)), **kwargs}
        others = [n for n in bound if n not in reads]
        if (len(args) <= len(names) and all(bound[n] is defaults[n] if n in defaults else
                                            extra_none and n not in names and bound[n] is None for n in others)
                and in_domain(bound) and rule_on()):
            return ours(**{n: bound[n] for n in reads if n in bound})
        return fla(*args, **kwargs)

    traced.__name__ = traced.__qualname__ = f"kda_inductor_rule_for_{fn.__name__}"
    torch.compiler.substitute_in_graph(fn)(traced)
    _substituted[id(fn)] = fn


# --------------------------------------------------------------------------- rule 2 for prefill: fla's chunk


def fla_chunk(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    """fla's ``chunk_gated_delta_rule`` on the arguments transformers passes, as one
    ``kda::gdn_chunk``: ``[B, T, H, K]`` q / k (GVA), ``g [B, T, HV]``, ``beta [B, T, HV]``, an
    ``[N, HV, K, V]`` state read as float32, varlen ``cu_seqlens``; ``(o, final_state or None)``."""
    state = None if initial_state is None else initial_state.float()
    out, final = torch.ops.kda.gdn_chunk(q, k, v, g, beta, scale, state, bool(use_qk_l2norm_in_kernel), cu_seqlens)
    return out, final if output_final_state else None


def _substitute_chunk(fn: Callable[..., Any]) -> None:
    """:func:`_substitute` for fla's chunk entry point: in the op's domain (a decay and a beta per
    head, ``[B, T, HV]``: a per-channel decay is ``chunk_kda``'s, not traced yet) and with the rule on,
    :func:`fla_chunk`; else fla's."""
    import kda_inductor.lowerings.gdn_chunk  # noqa: F401  (registers the op fla_chunk calls)

    def in_domain(bound: dict) -> bool:
        g, beta = bound.get("g"), bound.get("beta")
        return g is not None and g.dim() == 3 and beta is not None and beta.dim() == 3

    _substitute_with(fn, fla_chunk, in_domain, _chunk_rule_on)


# --------------------------------------------------------------------------- rule 3: transformers' torch chunk core

TORCH_CHUNK_REFERENCE = "torch_chunk_gated_delta_rule"
"""transformers' torch chunked core (Qwen3-Next, Qwen3.5, OLMo-hybrid, ...): what prefill runs
without fla-core, and under ``torch.export``. Found by name in each imported
``transformers.models.*`` modeling module, under transformers' hub-kernel wrappers (a plain
function in 5.17; in 5.2x an ``nn.Module`` whose ``forward`` closes over a ``functools.wraps``
wrapper of it): the function whose body is the reference, by identity."""

TORCH_CHUNK_RULE_MEASURED = True
"""Whether ``kda::gdn_chunk`` was measured faster than Inductor's code for the torch reference
(``benchmarks/bench_gdn_chunk.py``'s ``stock`` column, stock ``torch.compile`` of transformers'
reference; ``benchmarks/results/gdn_chunk.md``): on CUDA, yes: 36 us against 411 at T = 256 (H100,
2026-12-05, the op's FAST launches), 1,225 against 4,056 at 4,096 with the op's slower float32
launches (H200). So rule 3 applies on CUDA; on CPU (not measured) only with ``force``."""


def torch_chunk_references() -> list[Callable[..., Any]]:
    """The plain functions behind every imported modeling module's :data:`TORCH_CHUNK_REFERENCE`
    (never imports transformers)."""
    found: dict[int, Callable[..., Any]] = {}
    for name, module in list(sys.modules.items()):
        attr = getattr(module, TORCH_CHUNK_REFERENCE, None) if name.startswith("transformers.models.") else None
        forward = getattr(type(attr), "forward", None) if isinstance(attr, torch.nn.Module) else None
        cells = [c.cell_contents for c in getattr(forward, "__closure__", None) or ()]
        for fn in [attr, *cells]:
            fn = inspect.unwrap(fn) if isinstance(fn, types.FunctionType) else None
            if fn is not None and fn.__name__ == TORCH_CHUNK_REFERENCE:
                found[id(fn)] = fn
    return list(found.values())


@torch.compiler.assume_constant_result
def _torch_chunk_rule_on() -> bool:
    """:func:`_rule_on` of :data:`CHUNK_RULE` for transformers' torch reference, which needs its
    own speed rule (:data:`TORCH_CHUNK_RULE_MEASURED`) or ``force``."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    options = our_options(InstructionTranslator.current_tx())
    return _rule_is_on(CHUNK_RULE) and (TORCH_CHUNK_RULE_MEASURED or bool(options and options.force))


@torch.compiler.assume_constant_result
def _forced() -> bool:
    """``options["kda"]["force"]`` of the trace's compile (evaluated once per trace)."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    options = our_options(InstructionTranslator.current_tx())
    return bool(options and options.force)


def torch_chunk(query, key, value, g, beta, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False):
    """transformers' ``torch_chunk_gated_delta_rule`` on the arguments it reads (``chunk_size`` 64),
    as one ``kda::gdn_chunk``: :func:`fla_chunk` with the reference's scale, ``K ** -0.5``."""
    return fla_chunk(query, key, value, g, beta, key.shape[-1] ** -0.5, initial_state, output_final_state,
                     use_qk_l2norm_in_kernel)


def _substitute_torch_chunk(fn: Callable[..., Any]) -> None:
    """Rule 3 for one reference function: in the op's domain (``chunk_size`` 64, keywords it does
    not read None, a decay and a beta per value head), on CUDA tensors (where it was measured) or
    forced, and with the rule on, :func:`torch_chunk`; else the reference."""
    import kda_inductor.lowerings.gdn_chunk  # noqa: F401  (registers the op torch_chunk calls)

    def in_domain(bound: dict) -> bool:
        g, beta, q = bound.get("g"), bound.get("beta"), bound.get("query")
        measured_here = q is not None and q.device.type == "cuda"  # the speed rule's device
        return (g is not None and g.dim() == 3 and beta is not None and beta.dim() == 3
                and (measured_here or _forced()))

    _substitute_with(fn, torch_chunk, in_domain, _torch_chunk_rule_on, extra_none=True)
