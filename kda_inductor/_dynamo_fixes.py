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

For prefill, :mod:`kda_inductor._dynamo_chunk` (rule ``gdn_chunk``): fla's ``chunk_gated_delta_rule``
and ``chunk_kda`` become ``kda::gdn_chunk`` (rule 2's way, forced until measured), and

3. **transformers' torch chunk cores become ``kda::gdn_chunk``** (``torch_chunk_gated_delta_rule``;
   Kimi Linear's ``chunk_kimi_delta_attention``), each with its own speed rule.

A call a rule leaves to the function it names (outside the op's domain, or by a speed rule) is a
miss (:class:`TraceMiss`: its reason at the user's source line), kept in :data:`MISSES` and
logged at INFO (``TORCH_LOGS=kda_inductor``); a rule turned off (not our trace, ``disable``) is not.

:func:`register` registers them with Dynamo (idempotent; nothing at import): when torch resolves
the backend name (``kda_inductor.backend``'s entry point, before the first trace) and again at
each of our compiles, for fla modules imported later.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from kda_inductor import _dynamo_chunk
from kda_inductor._dynamo_substitute import (MARK, MISSES, TraceMiss, _substituted, backend_of,  # noqa: F401
                                             our_options, rule_is_on, substitute_with)
from kda_inductor.options import TRACE_RULES

RULE, CHUNK_RULE = TRACE_RULES
"""``gdn_recurrent_step`` / ``gdn_chunk``: ``options["kda"]["disable"]`` turns an fla rule off with
the name of the op it emits."""
FLA_ENTRY_POINTS = (
    ("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule"),  # qwen3_next, qwen3_5, olmo_hybrid
    ("fla.ops.kda", "fused_recurrent_kda"),  # kimi_linear
)
"""fla-core's recurrent entry points transformers dispatches decode to: (module, attribute)."""

_every_backend = False
_exporting_rule: ReadsTheFlag | None = None


def register() -> None:
    """Register the rules with Dynamo where this torch has the hooks (feature checks); the fla
    rules for each entry point whose module is imported (never imports fla), the prefill rules
    (:mod:`kda_inductor._dynamo_chunk`) likewise. Idempotent."""
    _register_exporting_rule()
    if hasattr(torch.compiler, "substitute_in_graph") and hasattr(torch.compiler, "assume_constant_result"):
        for module, name in FLA_ENTRY_POINTS:
            fn = getattr(sys.modules.get(module), name, None)
            if callable(fn) and id(fn) not in _substituted:
                _substitute(fn)
        _dynamo_chunk.register()


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


@torch.compiler.assume_constant_result
def _rule_on() -> bool:
    """Evaluated once per trace, at trace time: the trace is for kda_inductor and the rule is not
    disabled (``options["kda"]["disable"]``)."""
    return rule_is_on(RULE)


def _substitute(fn: Callable[..., Any]) -> None:
    """Register the rule for one fla recurrent entry point: in our op's domain (a decay and a beta
    per head given) and with the rule on, :func:`fla_recurrent_step` (:func:`~kda_inductor._dynamo_substitute.substitute_with`)."""
    import kda_inductor.lowerings.gdn_recurrent_step  # noqa: F401  (registers the op fla_recurrent_step calls)

    def why_not(bound: dict) -> str | None:
        beta = bound.get("beta")
        if beta is None or beta.dim() != 3:
            return "beta is not one per value head [B, T, HV] (per value channel, or absent)"
        if bound.get("g") is None and bound.get("gk") is None:
            return "no decay given (g and gk None)"
        return None

    substitute_with(fn, fla_recurrent_step, why_not, _rule_on, op="kda::gdn_recurrent_step")
