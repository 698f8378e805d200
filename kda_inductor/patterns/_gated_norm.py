"""The gated RMSNorm of a GDN / KDA layer, read in canonical terms (:mod:`.canonical`), and how
the fused ops read its inputs: shared by ``gated_norm_merge`` and ``gated_norm_quant`` (through
:mod:`._merged_norms`, the search of what wrote the norm's input, which both read; ``gated_norm_quant``
reads what quantizes its output itself).

    fla (flash-linear-attention, vLLM): y = (x * r * w * act(z)).to(dtype)
    hf  (transformers):                 y = ((w * (x * r).to(dtype)) * act(z)).to(dtype)
    x = X.float(), r = rsqrt(mean(x^2, -1) + eps) or 1 / sqrt(...) (also x / sqrt(...)),
    act = silu (any spelling) or sigmoid, z any tensor of x's numel and last dim D, w [D]

Products in any order; ``eps`` read from the graph (a constant, or a graph input under
``dynamic=True``), never baked into a kernel. Each gated norm a user would recognize and the op
does not compute gets a miss naming what differs (:func:`_why_not_a_gated_norm`): the gate before
the norm (``norm_before_gate=False``), another activation, and, where only precision differs, a
16-bit gate activation (eager rounds the gate to bf16, the op keeps it in float32), a gate
multiplied in 16 bits, a norm with no float32 upcast, ``nn.RMSNorm``'s rounding after its weight.
A plain RMSNorm whose input holds gated values from further up (a SwiGLU MLP's ``silu(g) * u``
through its matmul and the residual add: every layer's input norm) is no candidate: no miss.

The gate is read where it lies when the user's ``reshape`` copied it from a strided tensor (a
split of the projection: a contiguous ``clone`` then views), that tensor viewed ``[A, B, D]``
(:func:`gate_read`); float32 sources rounded to 16 bits are read before the rounding
(:func:`before_cast`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from kda_inductor.patterns._layout import free_symbols, input_sizes, marked_dynamic, static_size
from kda_inductor.patterns.base import VIEWS, Stage, aten, in_graph_order, is_op, live_users, mutated_nodes, prims, val
from kda_inductor.patterns.canonical import Canon, Term, const_value

_F32 = torch.float32
HALF = (torch.bfloat16, torch.float16)


@dataclasses.dataclass
class Norm:
    """A gated RMSNorm found in the graph: ``y = norm(x) * act(z)``."""

    y: fx.Node
    x: fx.Node  # the normalized tensor (before its cast to float32)
    z: fx.Node  # the gate, as the user viewed it (before its cast to float32)
    weight: fx.Node
    eps: Any  # float, or the graph input that holds it
    act: str
    form: str
    rsqrt: bool
    out_dtype: torch.dtype
    D: int
    nodes: set[fx.Node]
    fixed: dict = dataclasses.field(default_factory=dict)  # D's size if symbolic: specialized on replacing


def gated_norms_of(graph: fx.Graph, canon: Canon, miss: Callable[[fx.Node, Stage, str], None]) -> Iterator[Norm]:
    """Every gated RMSNorm: anchored at each ``rsqrt`` / ``1 / sqrt`` of a mean of squares,
    grown through the elementwise nodes that use it to the outermost that reads as a norm; an
    RMSNorm a user would take for a gated norm the op does not compute gets ``miss``, saying why."""
    for n in graph.nodes:
        if not is_op(n, aten.rsqrt, aten.reciprocal, aten.sqrt, aten.pow):
            continue
        found, users, unspecialized = None, _elementwise_users(n), []
        for y in users:
            got = _read_norm(canon, y, unspecialized)
            if got is not None:
                found = got
        if found is not None:
            yield found
        elif users and is_op(n, aten.rsqrt, aten.reciprocal):
            why = unspecialized[-1] if unspecialized else _why_not_a_gated_norm([canon(u) for u in users], canon(n))
            if why is not None:
                miss(n, Stage.FORM, why)


def _read_norm(canon: Canon, y: fx.Node, unspecialized: list[str]) -> Norm | None:
    """``y`` as a gated norm, or None (where it is one whose D cannot be specialized, saying why
    in ``unspecialized``)."""
    t = canon(y)
    out_dtype = _F32
    if t.op == "cast":
        out_dtype, t = t.attr("dtype"), t.args[0]
    if t.op != "mul" or t.attr("dtype") != _F32:
        return None
    factors = _expand_div(list(t.args))
    acts = [f for f in factors if isinstance(f, Term) and f.op in ("silu", "sigmoid")]
    if len(acts) != 1:
        return None
    act = acts[0]
    factors.remove(act)
    gate = act.args[0]
    z = gate.args[0] if gate.op == "cast" and gate.attr("dtype") == _F32 else gate
    if not isinstance(z, Term) or z.node is None or val(z.node).dtype not in (*HALF, _F32):
        return None
    for rstd, x32, eps, rsqrt in _rstds(_subterms(factors)):
        got = _fla(factors, rstd, x32) or _hf(factors, rstd, x32)
        if got is None:
            continue
        form, weight = got
        x = x32.args[0] if x32.op == "cast" else x32
        if x.node is None or val(x.node).dtype not in (*HALF, _F32) or (x32.op == "cast") == (val(x.node).dtype == _F32):
            continue
        xv, zv, wv = val(x.node), val(z.node), val(weight)
        D, fixed = static_row_size(y.graph, xv.shape[-1])  # dynamic=True: D symbolic, specialized on replacing
        if not (wv.dim() == 1 and statically_known_true(wv.shape[0] == xv.shape[-1])
                and statically_known_true(zv.shape[-1] == xv.shape[-1])
                and statically_known_true(zv.numel() == xv.numel())):
            continue
        if not isinstance(D, int):  # a gated norm, but its D cannot be specialized: say so
            unspecialized.append(_UNSPECIALIZED.format(marked_dynamic(input_sizes(y.graph, free_symbols(D)))
                                                       or f"D = {D}"))
            continue
        nodes = canon.region(canon(y), stop=lambda s: s is x or s is z)
        return Norm(y, x.node, z.node, weight, eps, act.op, form, rsqrt, out_dtype, D, nodes, fixed)
    return None


def _fla(factors: list, rstd: Term, x32: Term):
    """``{x32, rstd, w}``: the weight applied in float32."""
    rest = list(factors)
    if x32 in rest and rstd in rest:
        rest.remove(x32)
        rest.remove(rstd)
        w = _weight(rest)
        if w is not None:
            return "fla", w
    return None


def _hf(factors: list, rstd: Term, x32: Term):
    """``{w, (x32 * rstd).to(dtype)}`` (float32 weight), or ``{(w * n).float()}`` with a
    16-bit product (16-bit weight)."""
    body = list(factors)
    if len(body) == 1:  # a 16-bit product, promoted to float32 by the next product (or cast)
        prod = body[0].args[0] if body[0].op == "cast" and body[0].attr("dtype") == _F32 else body[0]
        if prod.op == "mul" and prod.attr("dtype") in HALF:
            body = list(prod.args)
    for n in body:
        inner = n.args[0] if n.op == "cast" and n.attr("dtype") == _F32 else n
        if not (inner.op == "cast" and inner.attr("dtype") in HALF and inner.args[0].op == "mul"):
            continue
        prod = list(inner.args[0].args)
        if _same_terms(prod, [x32, rstd]):
            rest = list(body)
            rest.remove(n)
            w = _weight(rest)
            if w is not None:
                return "hf", w
    return None


def before_cast(x: fx.Node) -> tuple[fx.Node, list[fx.Node], torch.dtype] | None:
    """``(v, chain, dtype)`` where ``x`` is ``v`` (contiguous float32) rounded to the 16-bit
    ``dtype`` through ops that keep each value's row-major position (views, contiguous copies,
    permutes that move only unit dims, a ``select_scatter`` that fills a unit dim of a fresh
    buffer), every step read only by the next (``chain``, from ``x`` down); else None."""
    chain, n, dtype = [], x, None
    while True:
        nxt = _order_keeping_arg(n)
        if nxt is None and dtype is None and _rounding(n):
            dtype, nxt = val(n).dtype, n.args[0]
        if nxt is None:
            break
        if n is not x and len(live_users(n)) != 1:
            return None
        chain.append(n)
        n = nxt
    v = val(n)
    if dtype is None or not isinstance(v, torch.Tensor) or v.dtype != _F32 or not v.is_contiguous():
        return None
    return n, chain, dtype


def _rounding(n: fx.Node) -> bool:
    """``n`` casts a float32 tensor to 16 bits (``.to(torch.bfloat16)``)."""
    return (is_op(n, prims.convert_element_type) and isinstance(val(n.args[0]), torch.Tensor)
            and val(n.args[0]).dtype == _F32 and val(n).dtype in HALF)


def _order_keeping_arg(n: fx.Node) -> fx.Node | None:
    """The tensor ``n`` takes its values from in the same row-major order, or None."""
    if is_op(n, *VIEWS, aten.squeeze, aten.unsqueeze, aten.alias):
        return n.args[0]
    if is_op(n, aten.clone) and n.kwargs.get("memory_format", torch.contiguous_format) == torch.contiguous_format:
        return n.args[0]
    if is_op(n, aten.permute):
        shape = val(n.args[0]).shape
        moved = [d for d in n.args[1] if not statically_known_true(shape[d] == 1)]
        return n.args[0] if moved == sorted(moved) else None
    if is_op(n, aten.select_scatter):
        base, src, dim = n.args[:3]
        fresh = fresh_fill(base) is not NO_FILL
        return src if fresh and statically_known_true(val(base).shape[dim] == 1) else None
    return None


def _elementwise_users(n: fx.Node, limit: int = 12) -> list[fx.Node]:
    """Nodes reached from ``n`` through elementwise products, divisions and casts (the norm's
    product chain), in graph order."""
    out, seen, stack = [], {n}, [n]
    while stack and len(out) < 4 * limit:
        cur = stack.pop()
        for u in cur.users:
            if u in seen or not is_op(u, aten.mul, aten.div, aten.reciprocal, aten.sqrt, aten.rsqrt,
                                      aten.pow, prims.convert_element_type):
                continue
            seen.add(u)
            out.append(u)
            stack.append(u)
    return in_graph_order(out)


_OTHER_ACTS = {"gelu": "gelu", "erf": "gelu", "tanh": "tanh (or the tanh gelu)", "relu": "relu",
               "softplus": "softplus", "elu": "elu", "mish": "mish", "hardswish": "hardswish",
               "hardsigmoid": "hardsigmoid", "leaky_relu": "leaky_relu"}
"""Activations (and the ops their decompositions leave: gelu's ``erf``) the op does not take."""
_GENERIC = ("a gated norm that does not read as x * rsqrt(mean(x^2, -1) + eps) * w * act(gate) "
            "(the mean over the last dim, one weight of that width, the gate after the norm)")
_PRECISION = "precision differs from the fused op's float32 math, so it is not rewritten"


def _why_not_a_gated_norm(outs: list[Term], rstd: Term) -> str | None:
    """Why the products around the RMSNorm whose rstd is ``rstd`` (``outs``: the terms of the
    nodes reached from it, innermost first) are a gated norm the op does not compute, naming what
    differs; None where nothing gates it (a plain RMSNorm, also of an activation's output or of a
    layer whose MLP gates: every model has them, no candidate). Only the norm's own factors count:
    the normalized tensor itself a product with an activation (the gate before the norm), and the
    factors of the norm's product chain (:func:`_norm_chain`), never what computed ``x``."""
    got = next(_rstds([rstd]), None)
    if got is None:
        return None  # not the rsqrt of a mean of squares (a LayerNorm's): no RMSNorm
    x32 = got[1]
    if _is_gated(x32):
        return ("the gate is applied before the norm (norm_before_gate=False: the gate inside the mean), "
                "a different function from the fused op's norm-then-gate")
    chain = next((c for c in map(lambda t: _norm_chain(t, (rstd, x32)), reversed(outs))
                  if any(f is rstd or f == rstd for f in c)), [])
    acts = _activations(chain)
    if not acts:
        return None
    if _dtype_of(x32) in HALF:
        return (f"the norm is computed in {dtype_name(_dtype_of(x32))} (no float32 upcast of x before the mean of squares): "
                f"{_PRECISION}; write x.float()")
    if not any(f.op in ("silu", "sigmoid") for f in acts):
        return f"the gate's activation is {_OTHER_ACTS[acts[0].op]}; the fused op takes silu or sigmoid"
    return _precision_reason(chain, acts, rstd)


def _precision_reason(chain: list[Term], acts: list[Term], rstd: Term) -> str:
    """Why a norm-then-gate with silu or sigmoid (``chain``: its products, ``acts``: the gate's
    activations among them) differs from the op: where only a rounding does, which; else the
    generic reason."""
    gate16 = [f for f in chain if f.op == "cast" and f.attr("dtype") in HALF and f.args[0] in acts]
    if gate16:
        return (f"the gate's activation is rounded to {dtype_name(gate16[0].attr('dtype'))} "
                f"(F.silu / sigmoid of a 16-bit gate) where the fused op keeps it in float32: {_PRECISION}; write F.silu(z.float())")
    if any(_gates(f, acts) and f.attr("dtype") in HALF for f in chain):
        return f"the gate is multiplied in 16 bits (both factors 16-bit): {_PRECISION}"
    if any(f.op == "cast" and f.attr("dtype") in HALF and rstd in _subterms([f.args[0]], 2) for f in chain):
        return ("the norm is rounded to 16 bits after its weight and before the gate (nn.RMSNorm / F.rms_norm "
                "of a 16-bit tensor): the fused op rounds before the weight (transformers) or not at all (fla): "
                f"{_PRECISION}")
    return _GENERIC


_ACTS = ("silu", "sigmoid", *_OTHER_ACTS)


def _strip(t: Any) -> Any:
    """``t`` without the casts and views around it."""
    while isinstance(t, Term) and t.op in ("cast", "view"):
        t = t.args[0]
    return t


def _is_gated(x32: Term) -> bool:
    """The normalized tensor is itself a product with an activation factor (``x * silu(z)``,
    through casts and views): the gate inside the mean. A sum (a residual add, a MoE's
    combine) or a matmul of gated values is not."""
    x = _strip(x32)
    return isinstance(x, Term) and x.op == "mul" and any(getattr(_strip(a), "op", None) in _ACTS for a in x.args)


def _norm_chain(t: Any, stop: tuple, limit: int = 64) -> list[Term]:
    """The terms of the product chain ending at ``t``: ``t``, and through products, divisions,
    casts and views the factors below it, each once; the ``stop`` terms (the rstd, the
    normalized tensor) and every other factor are listed but not entered."""
    out, seen, stack = [], set(), [t]
    while stack and len(out) < limit:
        f = stack.pop()
        if not isinstance(f, Term) or f.op in ("leaf", "const") or id(f) in seen:
            continue
        seen.add(id(f))
        out.append(f)
        if f.op in ("mul", "div", "cast", "view") and not any(f is s or f == s for s in stop):
            stack.extend(f.args)
    return out


def _activations(chain: list[Term]) -> list[Term]:
    """The activations among the factors of a norm's product chain, also inside a factor that a
    decomposed activation leaves (gelu's ``1 + erf(z / sqrt(2))``)."""
    acts = [f for f in chain if f.op in _ACTS]
    for f in chain:
        if f.op in ("add", "sub"):
            acts += [a for a in f.args if isinstance(a, Term) and a.op in ("erf", "tanh")]
    return acts


def _gates(f: Term, acts: list[Term]) -> bool:
    """``f`` is a product with an activation (or its cast) among its factors."""
    return f.op == "mul" and any((a.args[0] if isinstance(a, Term) and a.op == "cast" else a) in acts for a in f.args)


def dtype_name(dtype: torch.dtype | None) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_of(t: Term) -> torch.dtype | None:
    v = val(t.node) if t.node is not None else None
    return getattr(v, "dtype", None)


def _expand_div(factors: list) -> list:
    """``a / sqrt(v)`` as the factors of ``a`` times ``1 / sqrt(v)``."""
    out = []
    for f in factors:
        if isinstance(f, Term) and f.op == "div" and len(f.args) == 2 and isinstance(f.args[1], Term) \
                and f.args[1].op == "sqrt":
            a = f.args[0]
            out += list(a.args) if isinstance(a, Term) and a.op == "mul" and a.attr("dtype") == _F32 else [a]
            out.append(Term("recip_sqrt", (f.args[1].args[0],)))
        else:
            out.append(f)
    return out


def _subterms(factors: list, depth: int = 4) -> list:
    """``factors`` and the factors of products below them (the hf form's inner ``x * r``)."""
    out, frontier = [], list(factors)
    for _ in range(depth):
        nxt = []
        for f in frontier:
            if not isinstance(f, Term):
                continue
            out.append(f)
            if f.op in ("mul", "cast"):
                nxt.extend(f.args)
        frontier = nxt
    return list({id(f): f for f in out}.values())


def _rstds(factors: list):
    """``(rstd factor, x32, eps, rsqrt)`` for each ``rsqrt(mean(x32^2, -1) + eps)`` /
    ``1 / sqrt(...)`` among ``factors``."""
    for f in factors:
        if not isinstance(f, Term) or f.op not in ("rsqrt", "recip_sqrt"):
            continue
        v = f.args[0]
        if not (isinstance(v, Term) and v.op == "add" and len(v.args) == 2 and not v.attr("alpha")):
            continue
        mean, eps = v.args
        if isinstance(eps, Term) and eps.op == "mean":
            mean, eps = eps, mean
        eps = _eps(eps)
        if eps is None or not (isinstance(mean, Term) and mean.op == "mean" and mean.attr("keepdim")):
            continue
        sq = mean.args[0]
        if not (isinstance(sq, Term) and sq.op == "square"):
            continue
        x32 = sq.args[0]
        # a keepdim mean has its input's rank (its node may be the unsqueeze of a keepdim=False mean)
        rank = val(mean.node).dim() if val(mean.node) is not None else None
        if rank is None or mean.attr("dims") != (rank - 1,):
            continue
        yield f, x32, eps, f.op == "rsqrt"


def _eps(t: Any):
    """eps: a number, a SymFloat graph input, or (``dynamic=True`` lifts float attributes)
    a lifted 0-d CPU tensor, returned as ``("tensor", placeholder)``."""
    c = const_value(t)
    if c is not None:
        return float(c)
    if isinstance(t, Term) and t.op == "leaf" and not isinstance(val(t.leaf), torch.Tensor):
        return t.leaf
    if isinstance(t, Term) and t.op == "lifted":
        return ("tensor", t.attr("input"))
    return None


def _weight(rest: list) -> fx.Node | None:
    if len(rest) != 1 or not isinstance(rest[0], Term):
        return None
    w = rest[0].args[0] if rest[0].op == "cast" else rest[0]
    if not isinstance(w, Term) or w.op != "leaf" or val(w.leaf) is None or val(w.leaf).dim() != 1:
        return None
    return w.leaf


NO_FILL = object()


def fresh_fill(base: fx.Node):
    """A fresh buffer's contents: ``None`` for ``torch.empty`` (undefined), the value of
    ``torch.zeros`` / ``torch.full``, else ``NO_FILL``."""
    if is_op(base, aten.empty, aten.empty_strided):
        return None
    if is_op(base, aten.full) and const_value(base.args[1]) is not None:
        return float(base.args[1])
    if is_op(base, aten.zeros):
        return 0.0
    return NO_FILL


def _same_terms(a: list, b: list) -> bool:
    """``a`` and ``b`` hold equal terms, in any order (equality, never ``repr``: a term's text
    spells out every path through its DAG, exponential in a real model's graph depth)."""
    rest = list(b)
    for t in a:
        i = next((i for i, u in enumerate(rest) if t is u or t == u), None)
        if i is None:
            return False
        del rest[i]
    return not rest


def copy_chain(z: fx.Node) -> list[fx.Node]:
    """``z`` and the views it was made of, down to the first node that is no view (the
    user's copy, a ``clone``, where the gate was copied)."""
    chain = [z]
    while is_op(chain[-1], *VIEWS):
        chain.append(chain[-1].args[0])
    return chain


def gate_view(z: fx.Node, D: int) -> tuple[fx.Node, list | None]:
    """``(node, shape)``: the gate as the op reads it, ``node`` viewed ``shape`` (None: as it is).
    Where it lies (:func:`gate_read`), or ``z`` itself where its strides allow: a 2-D ``[N, D]``
    or 3-D ``[A, B, D]`` gate with unit column stride (vLLM's gate, a ``[T, H, D]`` view of the
    projection's split, with a symbolic ``T``); else ``z`` reshaped ``[-1, D]`` (a copy only where
    no view exists)."""
    node, shape = gate_read(z, D)
    if shape is not None:
        return node, shape
    zv = val(node)
    if zv is not None and zv.dim() in (2, 3) and zv.shape[-1] == D and (zv.stride(-1) == 1 or D == 1):
        return node, None
    return node, [-1, D]


def gate_read(z: fx.Node, D: int) -> tuple[fx.Node, list | None]:
    """``(node, shape)``: the gate is ``node`` (``z``, shape None: read as ``[-1, D]``); where
    ``z`` is the user's copy of a strided tensor (``reshape`` of a split of the projection: a
    contiguous ``clone`` then views), the tensor itself viewed ``shape`` = ``[A, B, D]`` in place:
    the kernel reads any strides, and the copy, which stock Inductor fuses into its norm, would
    otherwise be written out for the op (measured: ``benchmarks/results/profile_step.md``, the 16K
    prefill). The copied tensor may itself be a reshape that no view gives as rows (transformers'
    Qwen3-Next with one key head: the split ``[B, S, 1, 2 * Dv]`` reshaped ``[B, S, 2, Dv]``): then
    a reshape it was made from is viewed."""
    z = _before_upcast(z)
    src = copy_chain(z)[-1]
    if not (is_op(src, aten.clone)
            and src.kwargs.get("memory_format", torch.contiguous_format) == torch.contiguous_format):
        return z, None
    mutated = mutated_nodes(z.graph)
    for base in copy_chain(src.args[0]):  # the copied tensor, then the reshapes it came from
        shape = _rows_view(val(base), D) if isinstance(base, fx.Node) else None
        if shape is not None and base not in mutated:
            return base, shape
    return z, None


def _before_upcast(z: fx.Node) -> fx.Node:
    """``z`` without the unit-dim views and the exact float32 upcast of a 16-bit tensor around it
    (``torch.sigmoid(z.float().unsqueeze(0))``): the op upcasts the gate itself, so it reads the
    16-bit tensor where it lies instead of an upcast copy Inductor would write out for it."""
    n = z
    while is_op(n, aten.unsqueeze, aten.squeeze) or (is_op(n, prims.convert_element_type) and _upcast(n)):
        n = n.args[0]
    return n if n is not z and len(live_users(n)) >= 1 else z


def _upcast(n: fx.Node) -> bool:
    """``n`` casts a 16-bit tensor to float32 (exact)."""
    src = val(n.args[0])
    return isinstance(src, torch.Tensor) and src.dtype in HALF and val(n).dtype == _F32


def _rows_view(v: Any, D: int) -> list | None:
    """``[-1, C // D, D]`` where ``v`` (last dim ``C``, a multiple of ``D``) can be viewed so,
    else None: a stride computation (never a view that may raise): the last dim always splits,
    the leading dims merge into one where each non-unit dim's stride is the next one's stride
    times its size."""
    if not isinstance(v, torch.Tensor) or v.dim() < 1 or not isinstance(v.shape[-1], int) or v.shape[-1] % D:
        return None
    lead = [(s, st) for s, st in zip(v.shape[:-1], v.stride()[:-1]) if not statically_known_true(s == 1)]
    if all(statically_known_true(st0 == st1 * s1) for (_, st0), (s1, st1) in zip(lead, lead[1:])):
        return [-1, v.shape[-1] // D, D]
    return None


_UNSPECIALIZED = ("the norm's last dim ({}) is symbolic and cannot be made static (marked dynamic with "
                  "torch._dynamo.mark_dynamic, or without an example value): the fused op's matching needs it "
                  "static; mark only the token dims, or use torch._dynamo.maybe_mark_dynamic")


def static_row_size(graph: fx.Graph, size: Any, fixed: dict | None = None) -> tuple[Any, dict]:
    """``(size as an int, fixed)``: a symbolic per-row size (``dynamic=True``: the norm's D, a
    token's heads x D) as its example value, its symbols added to ``fixed`` (specialized on
    replacing: the graph serves that value, another recompiles); ``(size, fixed)`` unchanged
    where it is static or cannot be specialized (a symbol no input size gives, or one the user
    marked dynamic)."""
    fixed = dict(fixed or {})
    if isinstance(size, int):
        return size, fixed
    more = input_sizes(graph, free_symbols(size))
    if more.keys() != free_symbols(size) or marked_dynamic(more):
        return size, fixed
    fixed.update(more)
    return static_size(size, fixed), fixed
