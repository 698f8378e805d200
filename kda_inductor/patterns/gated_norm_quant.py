"""``gated_norm_quant``: a GDN / KDA layer's gated RMSNorm followed by dynamic fp8 quantization
per token group, as vLLM traces its ``_output_projection`` for FP8 checkpoints (Qwen3-Next /
Qwen3.5 FP8: block-wise fp8 weights, activations quantized per group of 128 by ``QuantFP8``'s
``forward_native``) -> one ``kda::gated_norm_quant``: merge (when present) + norm + gate + quant,
the norm's bf16 output never written.

Recognized: every gated RMSNorm ``gated_norm_merge`` reads (its matcher, any rank and spelling,
with or without the merge in front; read from the framework's ``gated_norms`` analysis, so the
norms are searched once per graph for both rewrites) whose output ``y`` is read only by one
quantization:

    xg = y.view(M, K // g, g)                   (or y.view(M, K): one group per token)
    s = amax(|xg|, -1, keepdim).float() / 448
    s = exp2(ceil(log2(s)))                     (optional: ue8m0, power-of-two scales)
    s = clamp(s, min=1 / (448 * 512))
    q = clamp(xg / s, -448, 448).to(float8_e4m3fn)   (or xg.float() * s.reciprocal())

``q`` and ``s`` are what the user reads (``q.view(M, K)``, ``s.squeeze(-1)``, a column-major copy
of it: those stay as they are and read the op's outputs). Not matched, with the reason at the
user's line: a static scale or another scale formula (another divisor, floor or rounding), a
group that does not divide the token's values, or ``y`` also read in bf16 elsewhere (the norm's
output must then be written anyway: ``gated_norm_merge`` alone).

Speed rule: left to Inductor until measured. On CPU the op runs the norm op and then the torch
quantization (no faster than Inductor's C++ for the same graph). On CUDA the kernel has not yet
been timed against Inductor's code for this graph (``benchmarks/bench_gated_norm_quant.py``, T
1..16384, H=32, D=128, symbolic T; results go to ``benchmarks/results/gated_norm_quant.md``), so
it fires only with ``options["kda"]["force"]``. The rule changes with that measurement.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx

from kda_inductor.lowerings import gated_norm_quant as _lowering  # noqa: F401  (registers the op)
from kda_inductor.patterns import gated_norm_merge as norm_merge
from kda_inductor.patterns.base import (
    Match,
    Rewrite,
    Route,
    Stage,
    call_args,
    earliest,
    escaping,
    in_graph_order,
    insert_fused,
    is_op,
    val,
)
from kda_inductor.patterns.canonical import Canon, Term, const_value
from kda_inductor.lowerings._fp8 import FP8_MAX, SCALE_FLOOR


def _is_fp8_cast(n: fx.Node) -> bool:
    return is_op(n, torch.ops.prims.convert_element_type) and n.args[1] == torch.float8_e4m3fn


def _f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


@dataclasses.dataclass
class Quant:
    """A dynamic fp8 quantization of the norm's output."""

    q: fx.Node  # the fp8 cast
    scale: fx.Node  # the clamped scale the values were divided by
    width: int  # K: values per token as quantized
    group: int  # values per scale
    ue8m0: bool
    reciprocal: bool  # x * (1 / s), vLLM's per-token form, else x / s
    nodes: set[fx.Node]


@dataclasses.dataclass
class QuantMatch(Match):
    norm: norm_merge.NormMatch
    quant: Quant

    @property
    def anchor(self) -> fx.Node:
        return self.quant.q

    @property
    def part(self) -> str:
        return self.norm.part


class GatedNormQuant(Rewrite):
    name = "gated_norm_quant"
    finds = (
        "a gated RMSNorm (with or without the merge) whose output only feeds vLLM's dynamic fp8 quantization, "
        "per token group or per token; forced only until measured on a GPU"
    )
    spellings = ("a gated RMSNorm as `gated_norm_merge` reads it (with or without the merge) whose output only "
                 "feeds a dynamic fp8 e4m3 quantization per token group or per token (vLLM's `QuantFP8` "
                 "`forward_native`: amax, `/ 448`, optional ue8m0 power-of-two scales, the scale floor, the "
                 "clamp to +-448, the cast); forced only until measured on a GPU")
    becomes = "`kda::gated_norm_quant` (one Triton kernel: merge + norm + gate + quant, no bf16 output)"
    # it takes the norms whose output only an fp8 quantization reads; gated_norm_merge rewrites the rest
    runs_before = ("gated_norm_merge",)

    def find(self, graph: fx.Graph) -> list[Match]:
        casts = graph.find_nodes(op="call_function", target=torch.ops.prims.convert_element_type.default)
        if not any(_is_fp8_cast(n) for n in casts):
            return []  # nothing quantized to fp8: the norm search waits for gated_norm_merge
        canon = Canon(graph)
        out: list[Match] = []
        for m in self.analysis(graph, norm_merge.gated_norms).matches:
            quant = self._quant(m, canon)
            if quant is not None:
                out.append(QuantMatch(nodes=in_graph_order(set(m.nodes) | quant.nodes), norm=m, quant=quant))
        return out

    def speed_rule(self, match: QuantMatch) -> str | None:
        return (f"not yet measured against Inductor's code on {match.device} "
                "(benchmarks/bench_gated_norm_quant.py; see patterns/gated_norm_quant.py)")

    # ------------------------------------------------------------------ the quantization
    def _quant(self, m: norm_merge.NormMatch, canon: Canon) -> Quant | None:
        y = m.norm.y
        casts = [n for n in _value_users(y) if _is_fp8_cast(n)]
        if not casts:
            return None  # not quantized: gated_norm_merge's business
        if len(casts) > 1:
            return self.miss(casts[-1], Stage.PIECES, "the norm's output is quantized twice")
        got = _read_quant(casts[0], canon, y)
        if isinstance(got, str):
            return self.miss(casts[0], Stage.VALUES, got)
        rows = val(y).numel()
        if not (got.width % got.group == 0 and (got.group % m.norm.D == 0 or m.norm.D % got.group == 0)):
            return self.miss(casts[0], Stage.LAYOUT, f"groups of {got.group} do not divide the norm's rows of "
                             f"{m.norm.D} or its tokens' {got.width} values")
        if isinstance(rows, int) and rows % got.width:
            return self.miss(casts[0], Stage.LAYOUT, f"{got.width} values per token do not divide {rows}")
        leaking = escaping(got.nodes | {y}, [got.q, got.scale])
        if leaking:
            what = "the norm's output" if leaking[0] is y else f"an intermediate of the quantization ({leaking[0].name})"
            return self.miss(casts[0], Stage.REGION, f"{what} is also read elsewhere (in bf16: the norm must write it)")
        return got

    def replace(self, graph: fx.Graph, match: QuantMatch) -> None:
        m, qt = match.norm, match.quant
        norm = norm_merge.op_args(graph, m)._asdict()
        norm["norm_dtype"] = norm.pop("out_dtype")
        op = torch.ops.kda.gated_norm_quant.default
        args = call_args(op, **norm, width=qt.width, group_size=qt.group, ue8m0=qt.ue8m0, reciprocal=qt.reciprocal,
                         column_major=False)
        inside = set(match.nodes)
        insert_fused(
            graph, op, args,
            before=earliest([qt.q, qt.scale]),
            routes=[Route(qt.q, index=0, shape=list(val(qt.q).shape)),
                    Route(qt.scale, index=1, shape=list(val(qt.scale).shape), only=lambda u: u not in inside)],
            region=match.nodes, origin=m.norm.y)
        norm_merge.drop_gate_copy(graph, m, norm["z"])


def _value_users(n: fx.Node, limit: int = 32) -> list[fx.Node]:
    """The nodes that read ``n``'s values through views, abs, amax and arithmetic (the
    quantization's nodes), in graph order."""
    seen: list[fx.Node] = []
    stack = list(n.users)
    while stack and len(seen) < limit:
        u = stack.pop()
        if u in seen or u.op != "call_function":
            continue
        seen.append(u)
        if not _is_fp8_cast(u):
            stack.extend(u.users)
    return in_graph_order(seen)


def _is_output(t: Any, canon: Canon, y: fx.Node) -> bool:
    """``t`` is the norm's output ``y``, viewed, or viewed and cast to float32."""
    t = canon.strip(t, "view")
    if isinstance(t, Term) and t.op == "cast" and t.attr("dtype") == torch.float32 and t.node is not y:
        t = canon.strip(t.args[0], "view")
    return t == canon.strip(canon(y), "view")


def _read_quant(cast: fx.Node, canon: Canon, y: fx.Node) -> Quant | str:
    """Read ``cast`` as the quantization of the module docstring over ``y``, or say why not."""
    c = canon(cast).args[0]
    if not (isinstance(c, Term) and c.op == "clamp" and c.attr("lo") == -FP8_MAX and c.attr("hi") == FP8_MAX):
        return f"the values are not clamped to [-{FP8_MAX:g}, {FP8_MAX:g}] before the fp8 cast"
    scaled = _scaled(c.args[0])
    if isinstance(scaled, str):
        return scaled
    xt, st, reciprocal = scaled
    if not _is_output(xt, canon, y):
        return "the quantized values are not the norm's output"
    ue8m0 = _scale_formula(st, canon, y)
    if isinstance(ue8m0, str):
        return ue8m0
    shape = list(val(xt.node).shape) if xt.node is not None and val(xt.node) is not None else []
    width = 1
    for d in shape[1:]:
        width *= d
    if len(shape) < 2 or not isinstance(width, int) or not isinstance(shape[-1], int):
        return "the quantized view has no static values per token"
    stop = lambda s_: s_.node is y  # noqa: E731  (the views and casts of y are the quantization's)
    nodes = canon.region(canon(cast), stop=stop) | canon.region(st, stop=stop)
    return Quant(cast, st.node, width, shape[-1], ue8m0, reciprocal, nodes)


def _scaled(d: Any) -> tuple[Term, Term, bool] | str:
    """``(x, scale, reciprocal)`` of ``x / scale`` or ``x * reciprocal(scale)``."""
    if isinstance(d, Term) and d.op == "div" and len(d.args) == 2 and isinstance(d.args[1], Term):
        return d.args[0], d.args[1], False
    if isinstance(d, Term) and d.op == "mul" and len(d.args) == 2 and isinstance(d.args[1], Term) \
            and d.args[1].op == "reciprocal":
        return d.args[0], d.args[1].args[0], True
    return "the values are not x / scale or x * (1 / scale) (a static scale of another meaning?)"


def _scale_formula(st: Term, canon: Canon, y: fx.Node) -> bool | str:
    """``ue8m0`` of ``clamp(r(amax(|x|) / 448), min=1 / (448 * 512))`` with ``r`` the identity or
    ``exp2(ceil(log2(.)))``, ``x`` the norm's output; or why not."""
    s = canon.strip(st, "view")
    if not (s.op == "clamp" and s.attr("hi") is None and const_value(s.attr("lo")) is not None
            and _f32(s.attr("lo")) == _f32(SCALE_FLOOR)):
        return f"the scale is not floored at 1 / ({FP8_MAX:g} * 512) (another scale formula)"
    raw, ue8m0 = s.args[0], False
    if raw.op == "exp2" and raw.args[0].op == "ceil" and raw.args[0].args[0].op == "log2":
        raw, ue8m0 = raw.args[0].args[0].args[0], True
    if not (raw.op == "div" and const_value(raw.args[1]) == FP8_MAX):
        return f"the scale is not amax / {FP8_MAX:g} (another divisor or rounding)"
    amax = canon.strip(raw.args[0], "cast", "view")
    if not (amax.op == "amax" and amax.args[0].op == "abs" and _is_output(amax.args[0].args[0], canon, y)):
        return "the scale does not start from amax(|x|) of the norm's output"
    return ue8m0
