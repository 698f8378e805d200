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

Numerics: the CPU op is eager's ops (bit-exact with eager on CPU); the Triton kernel rounds the
norm output to bf16 in registers and divides with IEEE ``div_rn`` (``s = div_rn(amax, 448)``
floored at ``1 / (448 * 512)``, ``q = sat(div_rn(x, s))``): vLLM's CUDA group-quant kernel bit for
bit wherever the amax is at least 1/512, eager's CUDA code up to the one-ulp reciprocal rounding
of its scale. Stock Inductor differs more (it drops the bf16 rounding of the norm's output and
divides approximately). The four computations, side by side: ``docs/speed-rules.md``.

Speed rule (``speed_rule``, CUDA only): the op fires where ``MEASURED`` (per :class:`Shape` and
token count, from ``benchmarks/bench_gated_norm_quant.py``) says it was faster than Inductor's
code for the same graph, and only between the token counts measured; on CPU never. ``MEASURED``
holds no verdict: the rewrite is forced only. On its region it is faster than stock at every T
from 256 to 16384, static and symbolic (H100, 2026-12-05: 117.2 against 127.9 us symbolic at
16384), but in the step it sits in it gains nothing: the FP8 hybrid spec step, 256 tokens, took
1,328 us with it forced against 1,325 without (H100, 2026-12-06, ``report.py --only model
--models fp8``; ``benchmarks/results/gated_norm_quant.md``; the history: ``docs/speed-rules.md``).

Replacement (:func:`norm_quant`): ``kda::gated_norm_quant`` over ``gated_norm_merge``'s norm
arguments and the quantization's constants, its fp8 values and scales viewed as the user's were.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
import torch.fx as fx

from kda_inductor.lowerings import gated_norm_quant as _lowering  # noqa: F401  (registers the op)
from kda_inductor.patterns._layout import specialize
from kda_inductor.patterns._merged_norms import NormMatch, as_read, gated_norms, norm_arguments, norm_region
from kda_inductor.patterns.base import (
    Match,
    Rewrite,
    Stage,
    earliest,
    escaping,
    in_graph_order,
    is_op,
    replace_by_function,
    val,
)
from kda_inductor.patterns.canonical import Canon, Term, const_value, f32
from kda_inductor.lowerings._fp8 import FP8_MAX, SCALE_FLOOR


class Shape(NamedTuple):
    """What the op's speed against Inductor's code depends on, besides the token count."""

    merged: bool  # the spec / non-spec merge in front of the norm (else the norm alone)
    width: int  # values per token as quantized (heads x head dim)
    per_token: bool  # one scale per token (else one per group)


class Measured(NamedTuple):
    """One shape's verdicts from the benchmark: the static token counts where the op was faster
    than Inductor's code for the same graph, those where it was not, and whether the graph
    compiled with a symbolic token count was never slower (within the benchmark's tolerance)
    at any measured count."""

    faster: tuple[int, ...]
    slower: tuple[int, ...]
    symbolic: bool


MEASURED: dict[str, dict[Shape, Measured]] = {
    # benchmarks/bench_gated_norm_quant.py --cases "vllm H=32" on the H200, 2026-12-03 21:20 UTC (torch 2.11,
    # triton 3.6, commit d5304b8): on its region, static T faster at 256 / 1024 (3.9 vs 6.0, 8.5 vs 15.9 us),
    # 4096 / 16384 not reached by the budget; symbolic T slower from 256 (318 vs 156 us at 16384: one norm row
    # a program, the launch fixed since, see the module docstring; to be timed again). Not yet
    # measured in the step it sits in (report.py's FP8 hybrid steps, kda against kda-no-gated_norm_quant):
    # until then no verdict here, so the rewrite stays forced only. H100, 2026-12-05 (6136ae3, 21f36a9): on its
    # region now faster at every T, static and symbolic (16384: 117.2 us against 127.9 symbolic, 227.7 static);
    # the step: a tie (H100, 2026-12-06 03:32, 9aaa3b2: the FP8 spec step 1,328 us forced against 1,325 with the
    # rule bypassed), so still no verdict: forced only
    "cuda": {
        Shape(merged=False, width=4096, per_token=False): Measured(faster=(), slower=(), symbolic=False),
    },
}
"""Per device type, the measured verdicts the speed rule reads (module docstring)."""


def faster_than_inductor(table: dict[Shape, Measured], shape: Shape, tokens: int | None) -> str | None:
    """None where ``table`` says the op is faster than Inductor's code for ``shape`` at
    ``tokens`` (an int, or None for a symbolic count), else why not: the verdicts of the
    measured width, or of both measured widths around it."""
    widths = sorted(s.width for s in table if (s.merged, s.per_token) == (shape.merged, shape.per_token))
    kind = f"{'merge + ' if shape.merged else ''}norm + {'per-token' if shape.per_token else 'group'} quant"
    if shape.width in widths:
        near = [shape.width]
    elif widths and widths[0] < shape.width < widths[-1]:
        near = [max(w for w in widths if w < shape.width), min(w for w in widths if w > shape.width)]
    else:
        return f"{kind} not measured at {shape.width} values per token (measured: {widths or 'none'})"
    for w in near:
        why = _verdict(table[shape._replace(width=w)], tokens)
        if why is not None:
            return f"{kind}, {w} values per token: {why}"
    return None


def _verdict(m: Measured, tokens: int | None) -> str | None:
    if tokens is None:
        return None if m.symbolic else "compiled with a symbolic token count, slower than Inductor's code at some T"
    points = sorted({*m.faster, *m.slower})
    if points and not points[0] <= tokens <= points[-1]:
        return f"not measured at T={tokens} (measured: T={points[0]}..{points[-1]})"
    below = [p for p in points if p <= tokens]
    above = [p for p in points if p >= tokens]
    near = set(below[-1:] + above[:1])
    slow = sorted(near & set(m.slower))
    if not points or slow:
        return f"slower than Inductor's code at T={slow[0]}" if slow else "no token count measured"
    return None


def _is_fp8_cast(n: fx.Node) -> bool:
    return is_op(n, torch.ops.prims.convert_element_type) and n.args[1] == torch.float8_e4m3fn


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


@dataclasses.dataclass(frozen=True)
class QuantMatch(Match):
    norm: NormMatch
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
        "per token group or per token; forced only (faster alone, no gain measured in the FP8 step)"
    )
    spellings = ("a gated RMSNorm as `gated_norm_merge` reads it (with or without the merge) whose output only "
                 "feeds a dynamic fp8 e4m3 quantization per token group or per token (vLLM's `QuantFP8` "
                 "`forward_native`: amax, `/ 448`, optional ue8m0 power-of-two scales, the scale floor, the "
                 "clamp to +-448, the cast); forced only: faster than Inductor's code alone at every measured T, "
                 "but no faster in the FP8 step it sits in")
    becomes = "`kda::gated_norm_quant` (one Triton kernel: merge + norm + gate + quant, no bf16 output)"
    # it takes the norms whose output only an fp8 quantization reads; gated_norm_merge rewrites the rest
    runs_before = ("gated_norm_merge",)

    def find(self, graph: fx.Graph) -> list[Match]:
        casts = graph.find_nodes(op="call_function", target=torch.ops.prims.convert_element_type.default)
        if not any(_is_fp8_cast(n) for n in casts):
            return []  # nothing quantized to fp8: the norm search waits for gated_norm_merge
        canon = Canon()
        out: list[Match] = []
        for m in self.analysis(graph, gated_norms).matches:
            quant = self._quant(m, canon)
            if quant is not None:
                out.append(QuantMatch(nodes=in_graph_order(set(m.nodes) | quant.nodes), norm=m, quant=quant))
        return out

    def speed_rule(self, match: QuantMatch) -> str | None:
        if match.device == "cpu":
            return ("on cpu the op runs the norm op and then the quantization op by op, slower than "
                    "Inductor's fused code for the graph (see patterns/gated_norm_quant.py)")
        table = MEASURED.get(match.device)
        if not table:
            return (f"not yet measured against Inductor's code on {match.device} "
                    "(benchmarks/bench_gated_norm_quant.py; MEASURED in patterns/gated_norm_quant.py)")
        tokens = val(match.quant.q).shape[0]
        shape = Shape(not match.norm.plain, match.quant.width, match.quant.group == match.quant.width)
        why = faster_than_inductor(table, shape, tokens if isinstance(tokens, int) else None)
        return None if why is None else f"on {match.device}: {why} (benchmarks/results/gated_norm_quant.md)"

    # ------------------------------------------------------------------ the quantization
    def _quant(self, m: NormMatch, canon: Canon) -> Quant | None:
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
        qt = match.quant
        quant = dict(width=qt.width, group_size=qt.group, ue8m0=qt.ue8m0, reciprocal=qt.reciprocal)
        shapes = [list(val(qt.q).shape), list(val(qt.scale).shape)]
        specialize(match.norm.fixed)  # the sizes the match read static
        replace_by_function(graph, norm_quant, (_op_norm_arguments(match), quant, shapes),
                            outputs=[qt.q, qt.scale], before=earliest([qt.q, qt.scale]),
                            region=[*match.nodes, *norm_region(match.norm)], origin=match.norm.norm.y)


def _op_norm_arguments(match: QuantMatch) -> dict:
    """``norm_arguments`` of the norm, the merge-free norm's tokens those of the quantization
    (``width`` values, where that is whole norm rows): a group of rows then lies in one token
    (``kernel_mode``), and a symbolic token count reaches the op as ``[T, H * D]`` as a static
    one does, not as ``[T * H, D]`` (the rows the norm search gives a symbolic count)."""
    args = norm_arguments(match.norm)
    m, width = match.norm, match.quant.width
    if m.plain and m.source is None and width % m.norm.D == 0:
        args.update(width=width, num_tokens=None)  # the count: the sources' rows (``as_read``)
    return args


def norm_quant(norm: dict, quant: dict, shapes: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The replacement: the gated norm (``gated_norm_merge``'s arguments) and its quantization in
    one op (``kda::gated_norm_quant``, whose docstring and CPU implementation are the
    computation); the fp8 values and scales viewed as the user's were."""
    args = as_read(norm)
    args["norm_dtype"] = args.pop("out_dtype")
    q, scale = torch.ops.kda.gated_norm_quant(**args, **quant, column_major=False)
    return q.reshape(shapes[0]), scale.reshape(shapes[1])


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
    if isinstance(c, Term) and c.op == "clamp" and (_lifted(c.attr("lo")) or _lifted(c.attr("hi"))):
        return _LIFTED.format(what="the fp8 clamp's bounds")
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


_LIFTED = ("{what} is a graph input here, not a constant: dynamic=True makes Python floats inputs "
           "(torch._dynamo.config.specialize_float off), and the fused op's formula needs the constants; "
           "compile with dynamic=None and torch._dynamo.mark_dynamic on the token dim (vLLM's way), or set "
           "specialize_float")


def _lifted(t: Any) -> bool:
    """``t`` is a Python float that ``dynamic=True`` turned into a graph input (a ``lifted``
    term, or a SymFloat leaf)."""
    if not isinstance(t, Term):
        return False
    return t.op == "lifted" or (t.op == "leaf" and isinstance(val(t.leaf), torch.SymFloat))


def _scale_formula(st: Term, canon: Canon, y: fx.Node) -> bool | str:
    """``ue8m0`` of ``clamp(r(amax(|x|) / 448), min=1 / (448 * 512))`` with ``r`` the identity or
    ``exp2(ceil(log2(.)))``, ``x`` the norm's output; or why not."""
    s = canon.strip(st, "view")
    if s.op == "clamp" and _lifted(s.attr("lo")):
        return _LIFTED.format(what="the scale's floor")
    if not (s.op == "clamp" and s.attr("hi") is None and const_value(s.attr("lo")) is not None
            and f32(s.attr("lo")) == f32(SCALE_FLOOR)):
        return f"the scale is not floored at 1 / ({FP8_MAX:g} * 512) (another scale formula)"
    raw, ue8m0 = s.args[0], False
    if raw.op == "exp2" and raw.args[0].op == "ceil" and raw.args[0].args[0].op == "log2":
        raw, ue8m0 = raw.args[0].args[0].args[0], True
    if raw.op == "div" and _lifted(raw.args[1]):
        return _LIFTED.format(what=f"the scale's divisor ({FP8_MAX:g})")
    if not (raw.op == "div" and const_value(raw.args[1]) == FP8_MAX):
        return f"the scale is not amax / {FP8_MAX:g} (another divisor or rounding)"
    amax = canon.strip(raw.args[0], "cast", "view")
    if not (amax.op == "amax" and amax.args[0].op == "abs" and _is_output(amax.args[0].args[0], canon, y)):
        return "the scale does not start from amax(|x|) of the norm's output"
    return ue8m0
