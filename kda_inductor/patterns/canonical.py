"""Canonical forms: the spellings that mean the same thing, normalized once, before any
rewrite looks.

Real code spells one computation many ways (``x * x`` / ``x.pow(2)`` / ``x.square()``,
``clamp_min`` / ``clamp(min=)`` / ``torch.maximum(x, torch.tensor(eps))``, ``amax(keepdim=False)``
then ``unsqueeze``, ``2 ** y`` / ``exp2(y)``, ``type_as`` / ``to`` / ``.float()``, a reshape
chain / ``flatten`` / a plain ``as_strided``...). :class:`Canon` reads a post-grad graph as
:class:`Term` trees in one canonical vocabulary, so each rewrite matches one form. It is a
read-only view (a copy of the facts the matchers read): it never changes the graph, so what
Inductor compiles changes only where a rewrite fires.

Every rule is a small function in :data:`RULES`, applied in order to each node (the first
that returns a term wins; a node no rule reads becomes a generic term of its op); each has
its own test (``tests/test_canonical.py``). Terms compare structurally: two nodes that
compute the same canonical expression of the same leaves are equal terms, so duplicated
subexpressions (Inductor does not CSE before our pass) compare equal. ``Canon.region(t)``
gives the graph nodes a term stands for (to check they are read nowhere else and erase
them). Integer index arithmetic is the business of :mod:`._index_algebra`.

The canonical vocabulary (``Term.op``):

* ``leaf`` (a node no rule reads: an input, a matmul...), ``const`` (a Python number, or a
  0-d constant tensor: ``full([], c)``, ``scalar_tensor(c)``, a ``_tensor_constant``),
  ``lifted`` (a Python float that ``dynamic=True`` made a graph input),
* ``cast`` (to ``dtype``; a cast to the dtype it already has disappears; integer to integer
  casts of index tensors disappear too: index values fit in both),
* ``view`` (``shape``: any value-preserving reshape; nested views collapse to one),
* ``square``, ``mean`` (``dims``, ``keepdim``; ``sum / n`` too), ``amax`` (``dims``,
  ``keepdim``; ``max(dim)[0]`` too), ``bitcast`` (``x.view(dtype)``), ``pow2_ceil`` (the
  exact power-of-two ceiling by bit tricks), ``rsqrt``, ``recip_sqrt`` (``1 / sqrt``, ``sqrt ** -1``,
  ``v ** -0.5``: rounds differently from ``rsqrt``), ``silu`` (``x * sigmoid(x)``,
  ``x / (1 + exp(-x))``), ``clamp`` (``lo``, ``hi``; ``torch.where(x < c, c, x)`` too), ``exp2`` (``2 ** y``), ``mul``
  (float32 products flattened, factors in order, ``* 1`` dropped),
* otherwise the op's own name (``abs``, ``div``, ``add``, ``log2``, ``ceil``, ``sigmoid``...)
  with canonical arguments.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from kda_inductor.patterns._term import Term, const_value, term  # noqa: F401  (Term, const_value: re-exported)
from kda_inductor.patterns.base import SHAPE_VIEWS, aten, is_op, prims, val

_INT = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
_CASTS = (prims.convert_element_type, aten._to_copy, aten.to)
_VALUE_VIEWS = (*SHAPE_VIEWS, aten.alias, aten.clone)


class Canon:
    """Memoized canonical terms of a graph's nodes (see the module docstring)."""

    def __init__(self) -> None:
        """Terms are built per node on demand (of any graph) and memoized."""
        self._memo: dict[fx.Node, Term] = {}

    def __call__(self, n: Any) -> Any:
        """The canonical term of ``n`` (a node), or ``n`` itself for non-node constants
        (numbers become ``const`` terms)."""
        if not isinstance(n, fx.Node):
            return term("const", n) if const_value(n) is not None else n
        if n not in self._memo:
            self._memo[n] = self._build(n)
        return self._memo[n]

    def _build(self, n: fx.Node) -> Term:
        if n.op == "call_function":
            for rule in RULES:
                t = rule(self, n)
                if t is not None:
                    return t if t.node is not None else dataclasses.replace(t, node=n)
            return self.generic(n)
        if n.op == "get_attr":
            c = _tensor_constant(n)
            if c is not None:
                return term("const", c, node=n)
        return term("leaf", node=n, of=n)

    def generic(self, n: fx.Node) -> Term:
        """The op's own name with canonical arguments (``aten.abs.default`` -> ``abs``)."""
        if not isinstance(getattr(n.target, "overloadpacket", None), torch._ops.OpOverloadPacket):
            return term("leaf", node=n, of=n)
        args = tuple(self(a) if isinstance(a, fx.Node) else _freeze(a) for a in n.args)
        kw = {k: (self(v) if isinstance(v, fx.Node) else _freeze(v)) for k, v in n.kwargs.items()}
        return term(n.target.overloadpacket.__name__, *args, node=n, nodes=(n,), **kw)

    def region(self, t: Any, stop: Callable[[Term], bool] | None = None) -> set[fx.Node]:
        """The graph nodes ``t`` stands for: its own and its subterms' folded nodes (not
        leaves, and not below a subterm ``stop`` accepts)."""
        out: set[fx.Node] = set()
        stack = [t]
        while stack:
            x = stack.pop()
            if not isinstance(x, Term) or x.op == "leaf" or (stop is not None and stop(x)):
                continue
            out |= x.nodes
            stack.extend(x.args)
            stack.extend(v for _, v in x.attrs if isinstance(v, Term))
        return out

    def strip(self, t: Any, *ops: str) -> Any:
        """``t`` without its outer terms of the given ops (e.g. ``"view"``, ``"cast"``)."""
        while isinstance(t, Term) and t.op in ops:
            t = t.args[0]
        return t


def _freeze(a: Any) -> Any:
    if isinstance(a, list):
        return tuple(_freeze(x) for x in a)
    return a


def _tensor_constant(n: fx.Node) -> float | int | None:
    """The value of a 0-d constant tensor attribute (``torch.tensor(eps)`` in the code)."""
    mod = getattr(n.graph, "owning_module", None)
    try:
        v = getattr(mod, n.target) if mod is not None else None
    except AttributeError:
        v = None
    if isinstance(v, torch.Tensor) and v.dim() == 0 and not v.is_meta and v.device.type == "cpu":
        return v.item()
    return None


def _dtype(n: Any) -> torch.dtype | None:
    v = val(n)
    return getattr(v, "dtype", None)


def _dims(n: fx.Node, i: int, key: str = "dim") -> tuple[int, ...] | None:
    d = n.args[i] if len(n.args) > i else n.kwargs.get(key)
    if d is None:
        return None
    d = tuple(d) if isinstance(d, (list, tuple)) else (d,)
    rank = val(n.args[0]).dim()
    return tuple(sorted(x % rank if rank else x for x in d))


def _keepdim(n: fx.Node, i: int) -> bool:
    return bool(n.args[i] if len(n.args) > i else n.kwargs.get("keepdim", False))


def f32(x: float) -> float:
    """``x`` rounded to float32 (a float32 op sees its Python scalar so)."""
    return float(torch.tensor(x, dtype=torch.float32))


# --------------------------------------------------------------------------- rules
# Each rule: (canon, node) -> Term | None. Order matters where one rule reads the
# output of another's spelling (e.g. the unsqueeze of a keepdim=False amax).


def rule_cast(c: Canon, n: fx.Node) -> Term | None:
    """``.float()`` / ``.to(dtype)`` / ``type_as`` / ``_to_copy(dtype=)`` -> ``cast``; a cast
    to the dtype the value has, or between integer dtypes (index values fit), is no op."""
    if not is_op(n, *_CASTS):
        return None
    if is_op(n, aten._to_copy) and set(n.kwargs) - {"dtype", "layout", "device", "pin_memory", "memory_format"}:
        return None
    src = n.args[0]
    dst = n.args[1] if is_op(n, prims.convert_element_type) else n.kwargs.get("dtype", _dtype(n))
    if is_op(n, aten._to_copy, aten.to) and val(src) is not None and val(n) is not None \
            and val(src).device != val(n).device:
        return None  # a device copy, not a cast
    inner = c(src)
    have = _dtype(src)
    if dst is None or dst == have or (dst in _INT and have in _INT):
        return dataclasses.replace(inner, node=n, nodes=inner.nodes | {n}) if isinstance(inner, Term) else None
    return term("cast", inner, node=n, nodes=(n,), dtype=dst)


def rule_lifted_scalar(c: Canon, n: fx.Node) -> Term | None:
    """A Python float Dynamo lifted to a graph input (``dynamic=True`` does so for floats in
    tensor arithmetic: ``x / FP8_MAX``, ``+ self.eps``): a 0-d float CPU tensor input, cast
    -> ``lifted`` (``input``: the placeholder). Its value is known only at run time: a rewrite
    that takes it passes the tensor to its op, which reads it on the host (no device sync)."""
    if not is_op(n, *_CASTS):
        return None
    src = n.args[0]
    v = val(src)
    if not (isinstance(src, fx.Node) and src.op == "placeholder" and isinstance(v, torch.Tensor)
            and v.dim() == 0 and v.is_floating_point() and v.device.type == "cpu"):
        return None
    return term("lifted", node=n, nodes=(n,), input=src)


def rule_as_strided_view(c: Canon, n: fx.Node) -> Term | None:
    """``as_strided`` that only reshapes a contiguous tensor (contiguous strides, offset 0,
    all elements) -> ``view``."""
    if not is_op(n, aten.as_strided):
        return None
    src, size, stride = n.args[:3]
    offset = n.args[3] if len(n.args) > 3 else n.kwargs.get("storage_offset", 0)
    sv = val(src)
    if sv is None or not sv.is_contiguous() or offset not in (0, None):
        return None
    expect, numel = 1, 1
    for s, st in reversed(list(zip(size, stride))):
        if s != 1 and st != expect:
            return None
        expect *= s
        numel *= s
    if numel != sv.numel():
        return None
    return _view(c, n, src, list(size))


def _view(c: Canon, n: fx.Node, src: fx.Node, shape: list) -> Term:
    inner = c(src)
    if isinstance(inner, Term) and inner.op == "view":
        inner_src, folded = inner.args[0], inner.nodes
    else:
        inner_src, folded = inner, frozenset()
    base = inner_src.node if isinstance(inner_src, Term) else None
    if base is not None and val(base) is not None and list(val(base).shape) == list(shape):
        # a view back to the source's own shape is the source (unsqueeze then squeeze, x[:n] of n
        # rows): the same term, standing for the same values as its source node
        return dataclasses.replace(inner_src, nodes=inner_src.nodes | folded | {n})
    return term("view", inner_src, node=n, nodes=folded | {n}, shape=tuple(shape))


def rule_keepdim_reduction(c: Canon, n: fx.Node) -> Term | None:
    """``unsqueeze(r(x), d)`` where ``r`` reduces dim ``d`` of ``x`` with keepdim=False,
    through elementwise ops on the way (``maximum(amax(x, -1), eps).unsqueeze(-1)``) ->
    the same with keepdim=True."""
    if not is_op(n, aten.unsqueeze):
        return None
    src, d = n.args[:2]
    rank = val(n).dim()
    d = d % rank
    chain, t = [], c(src)
    while isinstance(t, Term) and t.op in _ELEMENTWISE and t.args and isinstance(t.args[0], Term):
        chain.append(t)
        t = t.args[0]
    if not (isinstance(t, Term) and t.op in ("amax", "mean") and not t.attr("keepdim") and t.attr("dims") == (d,)):
        return None
    if any(a for x in chain for a in x.args[1:] if isinstance(a, Term) and a.op != "const"):
        return None  # only scalar operands broadcast the same with and without the dim
    out = dataclasses.replace(t, attrs=tuple(sorted({**dict(t.attrs), "keepdim": True}.items())))
    for x in reversed(chain):
        out = dataclasses.replace(x, args=(out, *x.args[1:]))
    return dataclasses.replace(out, node=n, nodes=out.nodes | {n})


_ELEMENTWISE = ("clamp", "div", "mul", "add", "sub", "abs", "cast", "exp2", "log2", "ceil", "rsqrt",
                "recip_sqrt", "sqrt")


def rule_view(c: Canon, n: fx.Node) -> Term | None:
    """``view`` / ``reshape`` / ``_unsafe_view`` / ``squeeze`` / ``unsqueeze`` / ``flatten``
    / ``unflatten`` (post-grad: views) / ``alias`` / ``clone`` -> ``view`` of the first
    non-view source, with the final shape (chains collapse)."""
    if not is_op(n, *_VALUE_VIEWS) or n.target is aten.view.dtype:
        return None
    if is_op(n, aten.clone) and set(n.kwargs) - {"memory_format"}:
        return None
    return _view(c, n, n.args[0], list(val(n).shape))


def rule_unit_select_full_slice(c: Canon, n: fx.Node) -> Term | None:
    """``x[0]`` of a size-1 dim (``select(x, d, 0)``) and ``x[:, :n]`` that keeps every row
    (``slice`` from 0 to at least the size, step 1) -> ``view`` (same elements, same order)."""
    if is_op(n, aten.select) and len(n.args) >= 3:
        x, d, i = n.args[:3]
        if i == 0 and val(x) is not None and val(x).shape[d] == 1:
            return _view(c, n, x, list(val(n).shape))
        return None
    if is_op(n, aten.slice) and n.target is aten.slice.Tensor:
        x = n.args[0]
        d = n.args[1] if len(n.args) > 1 else 0
        start = n.args[2] if len(n.args) > 2 else 0
        end = n.args[3] if len(n.args) > 3 else None
        step = n.args[4] if len(n.args) > 4 else 1
        size = val(x).shape[d]
        endv = val(end) if isinstance(end, fx.Node) else end
        if start in (0, None) and step == 1 and (endv is None or statically_known_true(endv >= size)):
            return _view(c, n, x, list(val(n).shape))
    return None


def rule_bitcast(c: Canon, n: fx.Node) -> Term | None:
    """``x.view(dtype)`` (a reinterpretation of the bits) -> ``bitcast`` (``dtype``); nested
    bitcasts collapse, a bitcast back to the source's dtype is the source."""
    if n.target is not aten.view.dtype:
        return None
    inner, dt = c(n.args[0]), n.args[1]
    folded = {n}
    if isinstance(inner, Term) and inner.op == "bitcast":
        folded |= inner.nodes
        inner = inner.args[0]
    src = inner.node if isinstance(inner, Term) else None
    if src is not None and _dtype(src) == dt and val(src).shape == val(n).shape:
        return dataclasses.replace(inner, nodes=inner.nodes | folded)
    return term("bitcast", inner, node=n, nodes=folded, dtype=dt)


_MANTISSA, _EXPONENT = 0x7FFFFF, 0x7F800000


def rule_pow2_ceil_bits(c: Canon, n: fx.Node) -> Term | None:
    """The power of two at or above a positive float32 ``s``, by its bits -> ``pow2_ceil``
    (exact, unlike ``exp2(ceil(log2(s)))``, whose float32 log2 can round down to an integer
    just above a power of two): ``((bits + 0x7FFFFF) & 0x7F800000).view(float32)``, and
    DeepSeek-V3.2's ``fast_pow2(fast_log2_ceil(s))``: ``((((bits >> 23) & 0xFF) - 127 +
    ((bits & 0x7FFFFF) != 0)) + 127) << 23``, with ``bits = s.view(int32)``."""
    if n.target is not aten.view.dtype or n.args[1] != torch.float32:
        return None
    t = c(n.args[0])

    def bits_of(x):
        return x.args[0] if isinstance(x, Term) and x.op == "bitcast" and x.attr("dtype") == torch.int32 else None

    def is_(x, op, k):  # x == op(a, const k) -> a
        if isinstance(x, Term) and x.op == op and len(x.args) == 2 and const_value(x.args[1]) == k:
            return x.args[0]
        return None

    s = None
    inner = is_(t, "bitwise_and", _EXPONENT)
    if inner is not None:
        s = bits_of(is_(inner, "add", _MANTISSA))
    exp = is_(is_(t, "__lshift__", 23), "add", 127)
    if s is None and exp is not None and isinstance(exp, Term) and exp.op == "add" and len(exp.args) == 2:
        for a, b in (exp.args, exp.args[::-1]):
            biased = is_(a, "sub", 127)
            field = is_(biased, "bitwise_and", 0xFF)
            bits = is_(field, "__rshift__", 23)
            if not (isinstance(b, Term) and b.op == "cast" and b.attr("dtype") == torch.int32):
                continue
            ne = b.args[0]
            man = is_(ne, "ne", 0)
            if bits is not None and is_(man, "bitwise_and", _MANTISSA) == bits and bits_of(bits) is not None:
                s = bits_of(bits)
                break
    if s is None or _dtype(s.node) != torch.float32:
        return None
    return term("pow2_ceil", s, nodes=c.region(t, stop=lambda x: x is s) | {n})


def rule_square(c: Canon, n: fx.Node) -> Term | None:
    """``x * x`` / ``x ** 2`` / ``square(x)`` -> ``square``."""
    if is_op(n, aten.square):
        return term("square", c(n.args[0]), nodes=(n,))
    if is_op(n, aten.pow) and len(n.args) == 2 and const_value(n.args[1]) == 2 and isinstance(n.args[0], fx.Node):
        return term("square", c(n.args[0]), nodes=(n,))
    if is_op(n, aten.mul) and len(n.args) == 2 and all(isinstance(a, fx.Node) for a in n.args):
        a, b = c(n.args[0]), c(n.args[1])
        if a == b:
            return term("square", a, nodes=(n,))
    return None


def rule_reductions(c: Canon, n: fx.Node) -> Term | None:
    """``mean`` / ``sum(x) / n`` -> ``mean``; ``amax`` / ``max(x, dim)[0]`` -> ``amax``
    (``dims`` normalized to non-negative, ``keepdim``)."""
    if is_op(n, aten.mean):
        dims = _dims(n, 1)
        if dims is not None:
            return term("mean", c(n.args[0]), nodes=(n,), dims=dims, keepdim=_keepdim(n, 2))
    if is_op(n, aten.amax):
        dims = _dims(n, 1)
        if dims is not None:
            return term("amax", c(n.args[0]), nodes=(n,), dims=dims, keepdim=_keepdim(n, 2))
    if n.target.__name__ == "getitem" and n.args[1] == 0 and is_op(n.args[0], aten.max) \
            and n.args[0].target is aten.max.dim:
        m = n.args[0]
        return term("amax", c(m.args[0]), nodes=(n, m), dims=_dims(m, 1), keepdim=_keepdim(m, 2))
    if is_op(n, aten.div) and len(n.args) == 2 and is_op(n.args[0], aten.sum):
        s, d = n.args
        dims = _dims(s, 1)
        if dims is not None and const_value(d) is not None:
            shape = val(s.args[0]).shape
            count = math.prod(shape[i] for i in dims)
            if isinstance(count, int) and float(const_value(d)) == count:
                return term("mean", c(s.args[0]), nodes=(n, s), dims=dims, keepdim=_keepdim(s, 2))
    return None


def rule_rsqrt(c: Canon, n: fx.Node) -> Term | None:
    """``rsqrt(v)`` -> ``rsqrt``; ``1 / sqrt(v)`` (post-grad ``reciprocal(sqrt(v)) * 1``),
    ``sqrt(v) ** -1``, ``v ** -0.5`` -> ``recip_sqrt``."""
    if is_op(n, aten.rsqrt):
        return term("rsqrt", c(n.args[0]), nodes=(n,))
    if is_op(n, aten.reciprocal) and is_op(n.args[0], aten.sqrt):
        return term("recip_sqrt", c(n.args[0].args[0]), nodes=(n, n.args[0]))
    if is_op(n, aten.div) and const_value(n.args[0]) == 1 and is_op(n.args[1], aten.sqrt):
        return term("recip_sqrt", c(n.args[1].args[0]), nodes=(n, n.args[1]))
    if is_op(n, aten.pow) and len(n.args) == 2 and isinstance(n.args[0], fx.Node):
        p = const_value(n.args[1])
        if p == -0.5:
            return term("recip_sqrt", c(n.args[0]), nodes=(n,))
        if p == -1 and is_op(n.args[0], aten.sqrt):
            return term("recip_sqrt", c(n.args[0].args[0]), nodes=(n, n.args[0]))
    return None


def rule_silu(c: Canon, n: fx.Node) -> Term | None:
    """``silu(x)`` / ``x * sigmoid(x)`` / ``x / (1 + exp(-x))`` -> ``silu``."""
    if is_op(n, aten.silu):
        return term("silu", c(n.args[0]), nodes=(n,))
    if is_op(n, aten.mul) and len(n.args) == 2 and all(isinstance(a, fx.Node) for a in n.args):
        for x, s in (n.args, n.args[::-1]):
            if is_op(s, aten.sigmoid) and c(s.args[0]) == c(x):
                return term("silu", c(x), nodes=(n, s))
    if is_op(n, aten.div) and len(n.args) == 2 and all(isinstance(a, fx.Node) for a in n.args):
        x, den = n.args
        d = c(den)
        if d.op == "add" and len(d.args) == 2 and const_value(d.args[1]) == 1 and d.args[0].op == "exp":
            inner = d.args[0].args[0]
            if isinstance(inner, Term) and inner.op == "neg" and inner.args[0] == c(x):
                return term("silu", c(x), nodes=(n, *c.region(d, stop=lambda s: s == c(x))))
    return None


def _const_operand(c: Canon, a: Any) -> float | None:
    """A clamp bound: a number or a 0-d constant tensor."""
    if not isinstance(a, fx.Node):
        return const_value(a)
    t = c(a)
    if t.op == "const":
        return t.args[0]
    if is_op(a, aten.full) and list(a.args[0]) == [] and const_value(a.args[1]) is not None:
        return a.args[1]
    if is_op(a, aten.scalar_tensor) and const_value(a.args[0]) is not None:
        return a.args[0]
    return None


def rule_clamp(c: Canon, n: fx.Node) -> Term | None:
    """``clamp_min`` / ``clamp_max`` / ``clamp(min=, max=)`` / ``maximum`` or ``minimum``
    with a constant (``torch.maximum(amax, torch.tensor(eps))``) -> ``clamp(lo, hi)``;
    nested clamps combine. Bounds of a float32 value are compared as float32 numbers."""
    lo = hi = None
    if is_op(n, aten.clamp_min):
        x, lo = n.args[0], _const_operand(c, n.args[1])
        if lo is None:
            return None
    elif is_op(n, aten.clamp_max):
        x, hi = n.args[0], _const_operand(c, n.args[1])
        if hi is None:
            return None
    elif is_op(n, aten.clamp):
        x = n.args[0]
        a_lo = n.args[1] if len(n.args) > 1 else n.kwargs.get("min")
        a_hi = n.args[2] if len(n.args) > 2 else n.kwargs.get("max")
        lo = None if a_lo is None else _const_operand(c, a_lo)
        hi = None if a_hi is None else _const_operand(c, a_hi)
        if (a_lo is not None and lo is None) or (a_hi is not None and hi is None):
            return None
    elif is_op(n, aten.maximum, aten.minimum) and len(n.args) == 2:
        for x, b in (n.args, n.args[::-1]):
            bound = _const_operand(c, b)
            if bound is not None and isinstance(x, fx.Node) and val(b) is not None and val(b).dim() == 0:
                break
        else:
            return None
        if is_op(n, aten.maximum):
            lo = bound
        else:
            hi = bound
        folded = {n} | ({b} if isinstance(b, fx.Node) else set())
        return _combine_clamp(c, n, x, lo, hi, folded)
    else:
        return None
    return _combine_clamp(c, n, x, lo, hi, {n})


def rule_where_clamp(c: Canon, n: fx.Node) -> Term | None:
    """``torch.where(x < c, c, x)`` (or ``<=``) -> ``clamp(lo=c)``; ``torch.where(x > c, c, x)``
    (or ``>=``) -> ``clamp(hi=c)``. Only the forms whose NaN case picks ``x`` (as clamp does);
    ``where(x > c, x, c)`` turns a NaN into ``c`` and stays what it is."""
    if not (is_op(n, aten.where) and len(n.args) == 3):
        return None
    cond, picked, other = n.args
    below, above = is_op(cond, aten.lt, aten.le), is_op(cond, aten.gt, aten.ge)
    if not (below or above) or cond.args[0] is not other or not isinstance(other, fx.Node):
        return None
    bound, chosen = _const_operand(c, cond.args[1]), _const_operand(c, picked)
    if bound is None or chosen is None:
        return None
    if _dtype(n) == torch.float32:
        bound, chosen = f32(bound), f32(chosen)
    if bound != chosen or val(other) is None or val(n) is None or val(n).shape != val(other).shape:
        return None
    folded = {n, cond} | ({picked} if isinstance(picked, fx.Node) else set())
    return _combine_clamp(c, n, other, bound if below else None, bound if above else None, folded)


def _combine_clamp(c: Canon, n, x, lo, hi, folded) -> Term:
    if _dtype(n) == torch.float32:
        lo = None if lo is None else f32(lo)
        hi = None if hi is None else f32(hi)
    inner = c(x)
    if isinstance(inner, Term) and inner.op == "clamp":
        ilo, ihi = inner.attr("lo"), inner.attr("hi")
        lo = ilo if lo is None else (lo if ilo is None else max(lo, ilo))
        hi = ihi if hi is None else (hi if ihi is None else min(hi, ihi))
        folded = folded | inner.nodes
        inner = inner.args[0]
    return term("clamp", inner, node=n, nodes=folded, lo=lo, hi=hi)


def rule_exp2(c: Canon, n: fx.Node) -> Term | None:
    """``2 ** y`` (``pow.Scalar(2, y)``) / ``exp2(y)`` -> ``exp2``."""
    if is_op(n, aten.exp2):
        return term("exp2", c(n.args[0]), nodes=(n,))
    if n.target is aten.pow.Scalar and const_value(n.args[0]) == 2:
        return term("exp2", c(n.args[1]), nodes=(n,))
    return None


def rule_mul(c: Canon, n: fx.Node) -> Term | None:
    """float32 products -> one ``mul`` of all factors in order (``* 1`` dropped); a 16-bit
    product rounds, so it stays one factor of its own."""
    if not (is_op(n, aten.mul) and len(n.args) == 2):
        return None
    dtype = _dtype(n)
    factors = []
    for a in n.args:
        t = c(a)
        if const_value(t) == 1:
            continue
        if isinstance(t, Term) and t.op == "mul" and t.attr("dtype") == dtype == torch.float32:
            factors.extend(t.args)
        else:
            factors.append(t)
    folded = {n} | {x for a in n.args if isinstance(a, fx.Node) for x in (c(a).nodes if c(a).op == "mul" else ())}
    if dtype == torch.float32:  # x * ... * sigmoid(x), in any order -> silu(x)
        for f in list(factors):
            sig = term("sigmoid", f)
            if isinstance(f, Term) and sig in factors and f in factors:
                i = factors.index(sig)
                folded |= factors[i].nodes
                factors.remove(sig)
                factors[factors.index(f)] = term("silu", f)
    if len(factors) == 1 and isinstance(factors[0], Term):
        return dataclasses.replace(factors[0], node=n, nodes=factors[0].nodes | folded)
    # the dtype rounds each product; integer products of in-range indices are exact in any dtype
    return term("mul", *factors, nodes=folded, dtype=None if dtype in _INT else dtype)


RULES: tuple[Callable[[Canon, fx.Node], Term | None], ...] = (
    rule_lifted_scalar,
    rule_cast,
    rule_as_strided_view,
    rule_keepdim_reduction,
    rule_pow2_ceil_bits,
    rule_bitcast,
    rule_view,
    rule_unit_select_full_slice,
    rule_square,
    rule_reductions,
    rule_rsqrt,
    rule_silu,
    rule_clamp,
    rule_where_clamp,
    rule_exp2,
    rule_mul,
)
