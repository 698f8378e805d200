"""The prefill trace rules of :mod:`kda_inductor._dynamo_fixes` (``docs/dynamo-rules.md``), all named
``gdn_chunk`` (``options["kda"]["disable"]``), each emitting one ``kda::gdn_chunk`` call:

* **rule 2 for prefill, fla's chunked entry points** (:data:`FLA_CHUNK_ENTRY_POINTS`, by identity):
  ``chunk_gated_delta_rule`` (a decay per head; Qwen3-Next, Qwen3.5) as :func:`fla_chunk`, and
  ``chunk_kda`` (a decay per key channel; Kimi Linear) as :func:`fla_kda_chunk`. The first on CUDA,
  where measured faster than fla's kernels in the prefill step (:data:`CHUNK_RULE_MEASURED`); the
  second forced only until measured (:data:`KDA_CHUNK_RULE_MEASURED`).
* **rule 3, transformers' torch chunk references** (:data:`TORCH_CHUNK_REFERENCES`, found by name
  under transformers' hub-kernel wrappers, then by identity): ``torch_chunk_gated_delta_rule`` as
  :func:`torch_chunk` (on CUDA, where measured; forced elsewhere) and Kimi Linear's
  ``chunk_kimi_delta_attention`` (its torch chunked KDA core: what prefill runs without fla-core,
  on devices fla does not support, and under ``torch.export``) as :func:`torch_kda_chunk` (forced
  only: not yet measured).

Every call outside the op's domain keeps the function it names, and is a miss with its reason
(``_dynamo_substitute.MISSES``, logged at INFO). :func:`register` registers them (``_dynamo_fixes.register``
calls it).
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from kda_inductor import _dynamo_substitute as shared
from kda_inductor.options import TRACE_RULES

CHUNK_RULE = TRACE_RULES[1]
OP = "kda::gdn_chunk"
FLA_CHUNK_ENTRY_POINTS = (
    ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),  # qwen3_next, qwen3_5 prefill
    ("fla.ops.kda", "chunk_kda"),  # kimi_linear prefill
)
"""fla-core's chunked entry points traced as ``kda::gdn_chunk``: (module, attribute)."""

CHUNK_RULE_MEASURED = True
"""Whether ``kda::gdn_chunk`` was measured faster than fla's ``chunk_gated_delta_rule`` where the rule
sits, on CUDA (the speed rule of the prefill rule; off CUDA, forced only: fla runs on GPUs): yes, in the
step. Alone, side by side (H100, triton 3.6, 2026-12-06 05:56, commit 8b741ab, ``bench_gdn_chunk.py
--quick``, Qwen3-Next's dims, ``benchmarks/results/gdn_chunk.md``), the op's
:data:`~kda_inductor.lowerings.gdn_chunk.DEFAULT` took 294.0 / 1,118.5 us at T 4,096 / 16,384 against
fla's 293.0 / 1,129.6 (a tie, its error below fla's: 3.33e-3 against 4.07e-3), and 36 against 49 at 256
(45b9f1b). In the step (H100, 2026-12-06 07:51, commit d461889, ``hf_models --case prefill --variant
kda,kda@with-gdn_chunk``, ``benchmarks/results/hf_models.md``), Qwen3-Next prefill 1 x 4096 took
9,186 us with the rule against 9,689 without (0.948x; two compiles each, cold and warm), ONE graph
against twelve: no graph break at each layer's chunk call, so the code around it fuses. At 584a967
(H100, 2026-12-06 10:22, the same file): Qwen3-Next prefill 1 x 1024 2,789 us against 3,004 with the
rule off (0.928x: no size guard), Qwen3.5 prefill 1 x 4096 13,935 against 14,258 (0.977x), both ONE
graph against twelve; without fla-core (transformers' torch reference traced, ``kda@no-fla``) Qwen3-Next
prefill 9,179 against 9,153 with it (1.003x)."""
KDA_CHUNK_RULE_MEASURED = False
"""Whether the op's launches for a decay per key channel (``gdn_chunk.KDA``) were measured faster
than fla's ``chunk_kda``: no. In the step (H100, 2026-12-06 10:35, 584a967 with the harness's variant
check, ``hf_models --family kimi_linear --case prefill --variant kda,kda@with-gdn_chunk``,
``benchmarks/results/hf_models.md``), Kimi Linear prefill 1 x 4096 took 15,767 us with ``chunk_kda``
traced as the op (one graph) against 11,792 with fla's kernels between graph breaks: 1.337x slower
(two compiles each, cold and warm within 0.7 %). Forced only until the KDA launches beat fla's."""

FLA_REASONS = {
    "use_gate_in_kernel": "use_gate_in_kernel: fla computes the decay from A_log / dt_bias in its kernel "
                          "(the op takes the log decay)",
    "use_beta_sigmoid_in_kernel": "use_beta_sigmoid_in_kernel: beta in logit space, the sigmoid in fla's kernel",
    "allow_neg_eigval": "allow_neg_eigval: beta scaled to [0, 2) in fla's kernel",
    "return_intermediate_states": "return_intermediate_states: the op returns no per-chunk states",
    "state_v_first": "state_v_first: the state in [V, K] layout (the op's is [K, V])",
    "cu_seqlens_cpu": "cu_seqlens_cpu: a host copy of the offsets, which the op does not read",
    "chunk_indices": "chunk_indices: fla's precomputed chunk map, which the op does not read",
    "cp_context": "cp_context: context parallelism across devices",
    "use_graph": "use_graph: fla's padded fixed-shape varlen batches",
    "max_num_seqs": "max_num_seqs: fla's padded fixed-shape varlen batches (use_graph)",
}
"""Why an fla argument the op does not read, given, keeps fla's function (other names: "given: an
argument kda::gdn_chunk does not read")."""
KDA_IGNORED = ("safe_gate", "lower_bound", "disable_recompute", "A_log", "dt_bias", "chunk_size",
               "transpose_state_layout")
"""``chunk_kda``'s arguments that leave its forward result as the op's once the gate is not computed
in the kernel: ``safe_gate`` (a faster path for gates the caller bounded), ``lower_bound``, ``A_log``,
``dt_bias`` (read only by the in-kernel gate), ``disable_recompute`` (what backward keeps),
``chunk_size`` 32 or 64 (:func:`_kda_why_not` checks it) and a false ``transpose_state_layout``."""


def register() -> None:
    """Register each rule whose function is imported (never imports fla or transformers)."""
    for module, name in FLA_CHUNK_ENTRY_POINTS:
        fn = getattr(sys.modules.get(module), name, None)
        if callable(fn) and id(fn) not in shared._substituted:
            _substitute_fla(fn, kda=name == "chunk_kda")
    for name, substitute in ((TORCH_CHUNK_REFERENCE, _substitute_torch_chunk),
                             (TORCH_KDA_REFERENCE, _substitute_torch_kda)):
        for fn in torch_chunk_references(name):
            if id(fn) not in shared._substituted:
                substitute(fn)


@torch.compiler.assume_constant_result
def _chunk_rule_on() -> bool:
    """Evaluated once per trace: the trace is for kda_inductor and ``gdn_chunk`` is not disabled."""
    return shared.rule_is_on(CHUNK_RULE)


@torch.compiler.assume_constant_result
def _forced() -> bool:
    """``options["kda"]["force"]`` of the trace's compile (evaluated once per trace)."""
    options = shared.current_options()
    return bool(options and options.force)


def _speed(measured: bool, what: str) -> str | None:
    """None where the speed rule lets the rule apply (``measured`` or forced), else the miss."""
    if measured or _forced():
        return None
    return f"the speed rule: {OP} is not yet measured faster than {what} (options['kda']['force'] applies it)"


# --------------------------------------------------------------------------- rule 2 for prefill: fla's chunk


def fla_chunk(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    """fla's ``chunk_gated_delta_rule`` (or ``chunk_kda``) on the arguments transformers passes, as one
    ``kda::gdn_chunk``: ``[B, T, H, K]`` q / k (GVA), ``g [B, T, HV]`` (``[B, T, HV, K]``: per key
    channel), ``beta [B, T, HV]``, an ``[N, HV, K, V]`` state read as float32, varlen
    ``cu_seqlens``; ``(o in q's dtype as fla returns it, final_state or None)``."""
    state = None if initial_state is None else initial_state.float()
    # None where q's dtype is v's (the op's default): no dtype argument for a package's proxy executor to
    # misread (patterns/base.py: proxy_executor_reads_dtypes)
    out, final = torch.ops.kda.gdn_chunk(q, k, v, g, beta, scale, state, bool(use_qk_l2norm_in_kernel), cu_seqlens,
                                         out_dtype=None if q.dtype == v.dtype else q.dtype)
    return out, final if output_final_state else None


def fla_kda_chunk(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    """fla's ``chunk_kda`` on the arguments of its domain (:func:`_kda_why_not`): :func:`fla_chunk`
    with ``g [B, T, HV, K]``, the log decay per key channel."""
    return fla_chunk(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens)


def _gdn_why_not(bound: dict) -> str | None:
    g, beta = bound.get("g"), bound.get("beta")
    if g is None or g.dim() != 3:
        return "g is not a log decay per head [B, T, HV] (per key channel is chunk_kda's)"
    if beta is None or beta.dim() != 3:
        return "beta is not one per value head [B, T, HV]"
    if bound["q"].device.type != "cuda":  # the speed rule's device
        return _speed(False, "fla's chunk_gated_delta_rule off CUDA")
    return _speed(CHUNK_RULE_MEASURED, "fla's chunk_gated_delta_rule")


def _kda_why_not(bound: dict) -> str | None:
    """``chunk_kda``'s domain (fla-core 0.6.0): a log decay per key channel given as ``g`` (not computed
    in the kernel: ``FLA_REASONS``), beta per value head, a float32 state, ``K <= 128`` (the op's KDA
    launches; past that its float32 token loop), ``chunk_size`` 32 or 64 (fla's; the result does not
    depend on it), no transposed state."""
    g, beta, q, state = bound.get("g"), bound.get("beta"), bound.get("q"), bound.get("initial_state")
    if g is None or g.dim() != 4:
        return "g is not a log decay per key channel [B, T, HV, K]"
    if beta is None or beta.dim() != 3:
        return "beta is not one per value head [B, T, HV]"
    if state is not None and state.dtype != torch.float32:
        return "initial_state is not float32 (fla requires it)"
    if q.shape[-1] > 128:
        return "K > 128: the op's KDA launches take K <= 128"
    if bound.get("cu_seqlens") is not None and q.shape[0] != 1:
        return "cu_seqlens with a batch of more than one row (fla raises)"
    if bound.get("chunk_size", 64) not in (32, 64):
        return "chunk_size is not 32 or 64 (fla raises)"
    if bound.get("transpose_state_layout", False):
        return FLA_REASONS["state_v_first"]
    return _speed(KDA_CHUNK_RULE_MEASURED, "fla's chunk_kda")


def _substitute_fla(fn: Callable[..., Any], *, kda: bool) -> None:
    """Rule 2 for one fla chunked entry point: in the op's domain and with the rule on, :func:`fla_chunk`
    (``chunk_gated_delta_rule``) or :func:`fla_kda_chunk` (``chunk_kda``); else fla's."""
    import kda_inductor.lowerings.gdn_chunk  # noqa: F401  (registers the op)

    if kda:
        shared.substitute_with(fn, fla_kda_chunk, _kda_why_not, _chunk_rule_on, op=OP, ignored=KDA_IGNORED,
                               reasons=FLA_REASONS)
    else:
        shared.substitute_with(fn, fla_chunk, _gdn_why_not, _chunk_rule_on, op=OP, reasons=FLA_REASONS)


# --------------------------------------------------------------------------- rule 3: transformers' torch chunk cores

TORCH_CHUNK_REFERENCE = "torch_chunk_gated_delta_rule"
"""transformers' torch chunked core (Qwen3-Next, Qwen3.5, OLMo-hybrid, ...): what prefill runs
without fla-core, and under ``torch.export``. Found by name in each imported
``transformers.models.*`` modeling module, under transformers' hub-kernel wrappers (a plain
function in 5.17; in 5.2x an ``nn.Module`` whose ``forward`` closes over a ``functools.wraps``
wrapper of it): the function whose body is the reference, by identity."""
TORCH_KDA_REFERENCE = "chunk_kimi_delta_attention"
"""Kimi Linear's torch chunked KDA core (``modeling_kimi_linear``; decorated
``use_kernel_func_from_hub_with_fallback("chunk_kda", "fla")`` in 5.25, ``use_kernel_func_from_hub(
"chunk_kimi_delta_attention")`` before): ``(query, key, value, g, beta, chunk_size=64,
initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs)``, ``g`` the
log decay per key channel ``[B, T, H, K]``, scale ``K ** -0.5``, q / k / v with the same heads (or
one q / k head, which its broadcasts spread over the value heads: the op's GVA), output in query's
dtype, float32 state; no varlen (transformers' dispatch refuses ``cu_seqlens`` without fla). Found
as :data:`TORCH_CHUNK_REFERENCE` is."""
TORCH_CHUNK_REFERENCES = (TORCH_CHUNK_REFERENCE, TORCH_KDA_REFERENCE)

TORCH_CHUNK_RULE_MEASURED = True
"""Whether ``kda::gdn_chunk`` was measured faster than Inductor's code for the torch reference
(``benchmarks/bench_gdn_chunk.py``'s ``stock`` column, stock ``torch.compile`` of transformers'
reference; ``benchmarks/results/gdn_chunk.md``): on CUDA, yes: 36 us against 411 at T = 256 (H100,
2026-12-05, the op's FAST launches), 1,225 against 4,056 at 4,096 with the op's slower float32
launches (H200). So rule 3 applies on CUDA; on CPU (not measured) only with ``force``."""
TORCH_KDA_RULE_MEASURED = False
"""The same for Kimi Linear's reference: not measured (``bench_gdn_chunk.py --kda`` times transformers'
eager, not Inductor's code for it), so forced only."""


def torch_chunk_references(name: str = TORCH_CHUNK_REFERENCE) -> list[Callable[..., Any]]:
    """The plain functions behind every imported modeling module's ``name`` (one of
    :data:`TORCH_CHUNK_REFERENCES`; never imports transformers)."""
    found: dict[int, Callable[..., Any]] = {}
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("transformers.models."):
            fn = reference_behind(getattr(module, name, None), name)
            if fn is not None:
                found[id(fn)] = fn
    return list(found.values())


def reference_behind(attr: Any, name: str) -> Callable[..., Any] | None:
    """The plain function named ``name`` that a modeling module's attribute ``attr`` is, or wraps
    (transformers' hub-kernel wrappers: ``functools.wraps``, or an ``nn.Module`` whose ``forward``
    closes over one), else None."""
    forward = getattr(type(attr), "forward", None) if isinstance(attr, torch.nn.Module) else None
    cells = [c.cell_contents for c in getattr(forward, "__closure__", None) or ()]
    for fn in [attr, *cells]:
        fn = inspect.unwrap(fn) if isinstance(fn, types.FunctionType) else None
        if fn is not None and fn.__name__ == name:
            return fn
    return None


def torch_chunk(query, key, value, g, beta, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False):
    """transformers' ``torch_chunk_gated_delta_rule`` on the arguments it reads (``chunk_size`` 64),
    as one ``kda::gdn_chunk``: :func:`fla_chunk` with the reference's scale, ``K ** -0.5``."""
    return fla_chunk(query, key, value, g, beta, key.shape[-1] ** -0.5, initial_state, output_final_state,
                     use_qk_l2norm_in_kernel)


def torch_kda_chunk(query, key, value, g, beta, initial_state=None, output_final_state=False,
                    use_qk_l2norm_in_kernel=False):
    """Kimi Linear's ``chunk_kimi_delta_attention`` on the arguments it reads: :func:`torch_chunk`
    with ``g [B, T, H, K]``."""
    return torch_chunk(query, key, value, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel)


def _chunk_size(bound: dict) -> str | None:
    return None if bound.get("chunk_size", 64) == 64 else "chunk_size is not 64 (the op's chunks)"


def _substitute_torch_chunk(fn: Callable[..., Any]) -> None:
    """Rule 3 for one GDN reference function: in the op's domain (``chunk_size`` 64, keywords it does
    not read None, a decay and a beta per value head), on CUDA tensors (where it was measured) or
    forced, and with the rule on, :func:`torch_chunk`; else the reference."""
    import kda_inductor.lowerings.gdn_chunk  # noqa: F401  (registers the op torch_chunk calls)

    def why_not(bound: dict) -> str | None:
        g, beta, q = bound.get("g"), bound.get("beta"), bound.get("query")
        if g is None or g.dim() != 3 or beta is None or beta.dim() != 3:
            return "g or beta is not one per value head [B, T, HV]"
        return _chunk_size(bound) or (None if q.device.type == "cuda" else  # the speed rule's device
                                      _speed(False, "Inductor's code for the reference off CUDA"))

    shared.substitute_with(fn, torch_chunk, why_not, _chunk_rule_on, op=OP, extra_none=True,
                           ignored=("chunk_size",))


def _substitute_torch_kda(fn: Callable[..., Any]) -> None:
    """Rule 3 for one Kimi Linear reference function: in the op's domain (a log decay per key
    channel, beta per head, q / k / v heads the reference takes (equal, or one q / k head), ``K <= 128``,
    ``chunk_size`` 64, keywords it does not read None), forced (:data:`TORCH_KDA_RULE_MEASURED`),
    and with the rule on, :func:`torch_kda_chunk`; else the reference."""
    import kda_inductor.lowerings.gdn_chunk  # noqa: F401  (registers the op torch_kda_chunk calls)

    def why_not(bound: dict) -> str | None:
        g, beta, q, v = bound.get("g"), bound.get("beta"), bound.get("query"), bound.get("value")
        if g is None or g.dim() != 4:
            return "g is not a log decay per key channel [B, T, H, K]"
        if beta is None or beta.dim() != 3:
            return "beta is not one per head [B, T, H]"
        if q.shape[2] != v.shape[2] and q.shape[2] != 1:
            return "q / k heads neither 1 nor the value heads': the reference's broadcast of them fails"
        if q.shape[-1] > 128:
            return "K > 128: the op's KDA launches take K <= 128"
        return _chunk_size(bound) or _speed(TORCH_KDA_RULE_MEASURED, "Inductor's code for the reference")

    shared.substitute_with(fn, torch_kda_chunk, why_not, _chunk_rule_on, op=OP, extra_none=True,
                           ignored=("chunk_size",))
