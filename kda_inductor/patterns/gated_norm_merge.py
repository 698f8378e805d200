"""``gated_norm_merge``: a GDN/KDA layer's spec / non-spec merge + gated RMSNorm -> one
``kda.gated_norm_merge`` launch (no merged buffer).

What it finds (post-grad graph, where ``index_copy_`` / ``index_put_`` / ``out[:, idx] = v``
on a fresh buffer are functional ``aten.index_put``):

* the merge: ``M = index_put(index_put(empty, [None]*d + [i0], v0), [None]*d + [i1], v1)``
  (one or two writes, every dim before ``d`` of size 1, each ``v`` exactly the rows it
  writes), into ``torch.empty`` only, the two index tensors distinct graph values whose
  lengths add up to the token count (a partition, as the layer's metadata guarantees:
  the sizes are checked, the values cannot be), and ``M`` read only through views to
  ``X [N, D]``. Under automatic dynamic shapes the lengths and ``T`` are unrelated symbols:
  then only lengths that provably do not add up are rejected, and the op compares the sizes
  at launch (host ints, no sync), taking eager's merge-then-norm path when they differ;
* the norm, read as an expression tree whose spellings are normalized (``pow(x, 2)`` /
  ``square`` / ``x * x``, ``mean`` / ``sum / D``, ``rsqrt`` / ``1 / sqrt`` / ``sqrt ** -1``,
  ``silu`` / ``x * sigmoid(x)`` / ``x / (1 + exp(-x))``, products in any order)::

      fla (flash-linear-attention, vLLM): y = (x * r * w * act(z)).to(dtype)
      hf  (transformers):                 y = ((w * (x * r).to(dtype)) * act(z)).to(dtype)
      x = X.float(), r = rsqrt(mean(x^2, -1) + eps), act = silu or sigmoid, z [N, D] any tensor

  with ``eps`` read from the graph and passed to the op (never baked into a kernel).

Must not match: ``norm_before_gate=False`` (the gate inside the mean), a norm without a gate,
another activation, a merged buffer (or any intermediate of the norm) read elsewhere, a
merge into zeros or other data (uncovered rows would have to keep it), one index tensor used
twice, index lengths that provably do not add up to the tokens.

The merge-free case (the same gated RMSNorm of a 16-bit ``[N, D]`` tensor that no merge
wrote) becomes the op with one source and no indices when ``N`` is static and ``N * D <=
MERGE_FREE_MAX_VALUES``: measured faster than Inductor's own fusion there, slower above.

Numerics: the op computes products in the order written above (and ``rsqrt`` or
``1 / sqrt`` as the graph does), so those spellings are bit-exact on CPU and differ from
eager only by the reduction order on GPU; other product orders are within two bf16 ulps.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.fx as fx

from kda_inductor.lowerings import gated_norm_merge as _lowering  # noqa: F401  (registers the op)
from kda_inductor.patterns._index_algebra import known
from kda_inductor.patterns.base import (
    VIEWS,
    Match,
    Rewrite,
    Route,
    aten,
    escaping,
    insert_fused,
    is_op,
    prims,
    reachable,
    set_fake_vals,
    val,
)

_F32 = torch.float32
MERGE_FREE_MAX_VALUES = 4096 * 32 * 128
"""Largest merge-free norm (rows x D) rewritten: the kernel beat Inductor's own fusion up to
4096 tokens of 32 heads x 128 on the H200 (2.3 vs 4.4 us at 64 tokens, 26.1 vs 29.4 us at
4096) and lost at 16384 (99.9 vs 95.7 us): ``benchmarks/tune_gated_norm_merge.py --merge-free``."""


def _same_or_symbolic(a, b) -> bool:
    """Sizes that index_put_ requires equal: proven equal, or both symbolic (Dynamo
    specializes sizes 0 and 1, so a symbolic size is never a broadcast 1; some torch
    versions keep the values' and the index's token counts as separate symbols)."""
    return known(a == b) or (isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt))


# --------------------------------------------------------------------------- expressions
class _Expr:
    """Normalized expression trees over FX nodes (tuples; leaves are ``("leaf", node)``)."""

    def __init__(self, x: fx.Node):
        self.x = x
        self.memo: dict[fx.Node, Any] = {}
        self.visited: set[fx.Node] = set()

    def __call__(self, n: Any) -> Any:
        if not isinstance(n, fx.Node):
            return ("const", float(n)) if isinstance(n, (int, float)) else ("?", repr(n))
        if n not in self.memo:
            self.memo[n] = self._build(n)
        return self.memo[n]

    def _build(self, n: fx.Node) -> Any:
        if n is self.x:
            return ("X",)
        if n.op != "call_function":
            return ("leaf", n)
        a = n.args
        v = val(n)
        dtype = getattr(v, "dtype", None)
        e = None
        if is_op(n, prims.convert_element_type):
            inner = self(a[0])
            e = inner if getattr(val(a[0]), "dtype", None) == a[1] else ("cast", a[1], inner)
        elif is_op(n, aten.mul) and len(a) == 2:
            factors = [f for arg in a for f in self._factors(self(arg), dtype)]
            e = self._mul(dtype, factors)
        elif is_op(n, aten.pow) and len(a) == 2 and not isinstance(a[1], fx.Node):
            p = float(a[1])
            e = {2.0: ("sq", self(a[0])), 0.5: ("sqrt", self(a[0])), -0.5: ("recip", ("sqrt", self(a[0])))}.get(p)
        elif is_op(n, aten.square):
            e = ("sq", self(a[0]))
        elif is_op(n, aten.sqrt):
            e = ("sqrt", self(a[0]))
        elif is_op(n, aten.rsqrt):
            e = ("rsqrt", self(a[0]))
        elif is_op(n, aten.reciprocal):
            e = ("recip", self(a[0]))
        elif is_op(n, aten.sigmoid):
            e = ("sigmoid", self(a[0]))
        elif is_op(n, aten.silu):
            e = ("silu", self(a[0]))
        elif is_op(n, aten.exp):
            e = ("exp", self(a[0]))
        elif is_op(n, aten.neg):
            e = ("neg", self(a[0]))
        elif is_op(n, aten.expand):
            e = self(a[0])
        elif is_op(n, aten.mean, aten.sum) and self._last_dim_keepdim(n):
            e = ("mean" if is_op(n, aten.mean) else "sum", self(a[0]))
        elif is_op(n, aten.add) and len(a) == 2:
            (t, c) = (a[0], a[1]) if not isinstance(a[1], fx.Node) else (a[1], a[0])
            if not isinstance(c, fx.Node) and isinstance(t, fx.Node):
                e = ("add", self(t), float(c))
        elif is_op(n, aten.div) and len(a) == 2:
            e = self._div(n, a, dtype)
        if e is None:
            return ("leaf", n)
        self.visited.add(n)
        return e

    @staticmethod
    def _last_dim_keepdim(n: fx.Node) -> bool:
        dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        keep = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
        rank = val(n.args[0]).dim()
        return keep and isinstance(dims, (list, tuple)) and len(dims) == 1 and dims[0] in (-1, rank - 1)

    def _div(self, n, a, dtype):
        num, den = a
        if not isinstance(den, fx.Node):  # sum / D
            en = self(num)
            if en[0] == "sum" and float(den) == val(num.args[0]).shape[-1]:
                return ("mean", en[1])
            return None
        ed = self(den)
        if not isinstance(num, fx.Node):
            return ("recip", ed) if float(num) == 1.0 else None
        en = self(num)
        if ed == ("add", ("exp", ("neg", en)), 1.0):  # x / (1 + exp(-x)): silu's decomposition
            return ("silu", en)
        return self._mul(dtype, self._factors(en, dtype) + [("recip", ed)])

    @staticmethod
    def _factors(e: Any, dtype) -> list:
        """Flatten float32 products into their factors (a bf16 product rounds: kept whole)."""
        return list(e[2]) if e[0] == "mul" and e[1] == dtype == _F32 else [e]

    @staticmethod
    def _mul(dtype, factors: list) -> Any:
        factors = [f for f in factors if f != ("const", 1.0)]  # 1 / sqrt(v) is reciprocal(...) * 1
        if len(factors) == 1:
            return factors[0]
        for f in list(factors):  # x * sigmoid(x) -> silu(x)
            if ("sigmoid", f) in factors and f in factors:
                factors.remove(("sigmoid", f))
                factors.remove(f)
                factors.append(("silu", f))
        if len(factors) == 2 and factors[0] == factors[1]:
            return ("sq", factors[0])
        return ("mul", dtype, tuple(factors))


def _strip_cast(e, dtype=_F32):
    """``e`` without a cast to ``dtype`` (``(inner, had_cast)``)."""
    if e[0] == "cast" and e[1] == dtype:
        return e[2], True
    return e, False


@dataclasses.dataclass
class NormMatch(Match):
    """A gated RMSNorm ``y`` (and the merge that wrote its input, unless ``plain``)."""

    y: fx.Node
    z: fx.Node
    weight: fx.Node
    eps: Any
    act: str
    form: str
    rsqrt: bool
    out_dtype: torch.dtype
    writes: list = dataclasses.field(default_factory=list)  # (index, values, dim) per write
    T: Any = None
    rest_dims: int = 0
    plain: fx.Node | None = None  # the merge-free norm's input
    rows_per_token: int = 1


class GatedNormMerge(Rewrite):
    name = "gated_norm_merge"
    summary = "index_copy_ merge + gated RMSNorm of a GDN/KDA layer -> one kda::gated_norm_merge launch"

    def find(self, graph: fx.Graph) -> list[Match]:
        matches = []
        for n in graph.nodes:
            if is_op(n, aten.index_put) and not any(is_op(u, aten.index_put) for u in n.users):
                m = self._match(n)
                if m is not None:
                    matches.append(m)
        taken = {n for m in matches for n in m.nodes}
        for n in list(graph.nodes):
            if n not in taken and self._plain_candidate(n):
                m = self._match_plain(n)
                if m is not None and not taken & set(m.nodes):
                    matches.append(m)
                    taken |= set(m.nodes)
        return matches

    # ------------------------------------------------------------------ the merge
    def _merge(self, last: fx.Node):
        writes, n = [], last
        while is_op(n, aten.index_put):
            base, indices, values = n.args[:3]
            accumulate = n.args[3] if len(n.args) > 3 else n.kwargs.get("accumulate", False)
            tensors = [(d, i) for d, i in enumerate(indices) if i is not None]
            if accumulate or len(tensors) != 1:
                return self.miss(n, 1, "not a row write (accumulate, or several index tensors)")
            d, idx = tensors[0]
            writes.append((idx, values, d))
            if n is not last and len(n.users) != 1:
                return self.miss(n, 1, "a partial merge is read elsewhere")
            n = base
        writes.reverse()
        base, mv = n, val(last)
        if not is_op(base, aten.empty, aten.empty_strided) or len(base.users) != 1:
            return self.miss(last, 1, "the merge does not start from torch.empty (rows no index covers "
                                      "would have to keep their data)")
        if len(writes) > 2 or len({w[2] for w in writes}) != 1:
            return self.miss(last, 1, "more than two writes, or writes along different dims")
        d = writes[0][2]
        if any(s != 1 for s in mv.shape[:d]):
            return self.miss(last, 1, f"writes along dim {d} of {tuple(mv.shape)}: not token rows")
        T = mv.shape[d]
        if len({w[0] for w in writes}) != len(writes):
            return self.miss(last, 1, "the same index tensor written twice: not a partition")
        lengths = [val(w[0]).shape[0] for w in writes]
        if known(sum(lengths) != T):
            return self.miss(last, 1, f"index lengths {lengths} do not add up to the {T} tokens: not a partition")
        if not isinstance(T, int):  # symbolic: the empty's size (serving recompiles with T dynamic)
            T = base.args[0][d] if isinstance(base.args[0], (list, tuple)) else None
            if not isinstance(T, fx.Node):
                return self.miss(last, 1, "the token count is symbolic but not a size of the torch.empty")
        rest = list(mv.shape[d + 1:])
        for idx, values, _ in writes:
            vv = val(values)  # [1, ..., n, *rest], leading 1s optional (out[:, idx] = v)
            full = [val(idx).shape[0]] + rest
            shape = list(vv.shape)
            while len(shape) > len(full) and shape[0] == 1:
                shape.pop(0)
            if len(shape) != len(full) or not all(map(_same_or_symbolic, shape, full)) or vv.dtype != mv.dtype:
                return self.miss(last, 1, "written values are broadcast or of another dtype")
        return writes, T

    # ------------------------------------------------------------------ the norm
    def _match(self, last: fx.Node) -> Match | None:
        merge = self._merge(last)
        if merge is None:
            return None
        writes, T = merge
        views, x = [], last
        while len(x.users) == 1 and is_op(next(iter(x.users)), *VIEWS):
            x = next(iter(x.users))
            views.append(x)
        xv = val(x)
        if x is last or xv.dim() != 2 or len(x.users) == 0:
            return self.miss(last, 2, "the merged buffer is not viewed as [rows, D]")
        if any(len(v.users) != 1 for v in views[:-1]) or len(last.users) != 1:
            return self.miss(last, 2, "the merged buffer is read elsewhere")
        N, D = xv.shape
        per_token = 1
        for s in val(last).shape[writes[0][2] + 1:]:
            per_token *= s
        if not known(per_token % D == 0):
            return self.miss(last, 2, "norm rows straddle tokens")
        found = self._norm_after(x)
        if found is None:
            return self.miss(last, 3, "no x * rsqrt(mean(x^2) + eps) * weight * act(z) (norm before gate, "
                                      "silu or sigmoid gate) reads the merged rows")
        y, params, norm_nodes = found
        region = norm_nodes | {x, *views, last} | set(self._chain(last))
        leaking = escaping(region, [y])
        if leaking:
            return self.miss(last, 4, f"an intermediate of the norm is read elsewhere ({leaking[0].name})")
        order = {n: i for i, n in enumerate(last.graph.nodes)}
        return NormMatch(nodes=sorted(region | {y}, key=order.__getitem__), writes=writes, T=T, y=y,
                         rest_dims=val(last).dim() - writes[0][2] - 1, **params)

    def _norm_after(self, x: fx.Node):
        """The gated norm reading ``x [N, D]``: ``(y, params, its nodes)``, or None."""
        N, D = val(x).shape
        downstream = reachable([x], upstream=False)
        expr = _Expr(x)
        order = {n: i for i, n in enumerate(x.graph.nodes)}
        candidates = sorted((n for n in downstream if n.op == "call_function"), key=order.__getitem__)
        for y in reversed(candidates[:60]):
            yv = val(y)
            if not isinstance(yv, torch.Tensor) or list(yv.shape) != [N, D]:
                continue
            params = self._norm(expr(y), x, downstream)
            if params is not None:
                return y, params, {n for n in expr.visited if n in downstream}
        return None

    # ------------------------------------------------------------------ merge-free
    @staticmethod
    def _plain_candidate(n: fx.Node) -> bool:
        """A 16-bit ``[N, D]`` tensor cast to float32 by one of its users: where a gated
        RMSNorm of a contiguous tensor starts."""
        v = val(n)
        return (isinstance(v, torch.Tensor) and v.dim() == 2 and v.dtype in (torch.bfloat16, torch.float16)
                and any(is_op(u, prims.convert_element_type) and u.args[1] == _F32 for u in n.users))

    def _match_plain(self, x: fx.Node) -> Match | None:
        src = x
        while is_op(src, *VIEWS):
            src = src.args[0]
        if is_op(src, aten.index_put):
            return None  # a merge the merge path rejected (read elsewhere, ...): not ours either
        found = self._norm_after(x)
        if found is None:
            return None  # most candidates are not norms: no miss recorded
        y, params, norm_nodes = found
        N, D = val(x).shape
        if not (isinstance(N, int) and isinstance(D, int)):
            return self.miss(x, 3, "a merge-free gated norm with a symbolic row count: left to Inductor "
                                   "(its fusion is faster at the largest sizes)")
        if N * D > MERGE_FREE_MAX_VALUES:
            return self.miss(x, 3, f"a merge-free gated norm of {N * D} values: left to Inductor (faster "
                                   f"above {MERGE_FREE_MAX_VALUES})")
        leaking = escaping(norm_nodes, [y])
        if leaking:
            return self.miss(x, 4, f"an intermediate of the norm is read elsewhere ({leaking[0].name})")
        R = math.gcd(N, 32)  # rows per program group: any split of the rows in order will do
        order = {n: i for i, n in enumerate(x.graph.nodes)}
        return NormMatch(nodes=sorted(norm_nodes | {y}, key=order.__getitem__), plain=x, rows_per_token=R, y=y,
                         **params)

    @staticmethod
    def _chain(last: fx.Node) -> list[fx.Node]:
        out, n = [], last
        while is_op(n, aten.index_put):
            out.append(n)
            n = n.args[0]
        return out + [n]

    def _norm(self, e, x: fx.Node, downstream: set[fx.Node]) -> dict | None:
        in_dtype = val(x).dtype
        out_dtype = _F32
        if e[0] == "cast":
            out_dtype, e = e[1], e[2]
        if e[0] != "mul" or e[1] != _F32:
            return None
        x32 = ("X",) if in_dtype == _F32 else ("cast", _F32, ("X",))
        factors = list(e[2])
        acts = [f for f in factors if f[0] in ("silu", "sigmoid")]
        if len(acts) != 1:
            return None
        act = acts[0]
        factors.remove(act)
        z, _ = _strip_cast(act[1])
        if z[0] != "leaf" or z[1] in downstream or list(val(z[1]).shape) != list(val(x).shape):
            return None
        rstd = self._rstd(x32)
        # fla: {x, r, w}
        for r, eps, rsqrt in rstd(factors):
            rest = list(factors)
            if x32 in rest and r in rest:
                rest.remove(x32)
                rest.remove(r)
                w = self._weight(rest, x)
                if w is not None:
                    return dict(form="fla", eps=eps, rsqrt=rsqrt, act=act[0], z=z[1], weight=w, out_dtype=out_dtype)
        # hf: {w, n} (w float32) or {(w * n) in the input dtype}
        body = factors
        if len(factors) == 1:
            inner, _ = _strip_cast(factors[0])
            if inner[0] == "mul" and inner[1] == in_dtype:
                body = list(inner[2])
        ns = [f for f in body if f[0] == "cast" and f[1] == in_dtype and f[2][0] == "mul"]
        for n in ns:
            rest = list(body)
            rest.remove(n)
            inner = list(n[2][2])
            for r, eps, rsqrt in rstd(inner):
                if sorted(map(repr, inner)) == sorted(map(repr, [x32, r])):
                    w = self._weight(rest, x)
                    if w is not None:
                        return dict(form="hf", eps=eps, rsqrt=rsqrt, act=act[0], z=z[1], weight=w,
                                    out_dtype=out_dtype)
        return None

    @staticmethod
    def _rstd(x32):
        def find(factors):
            for f in factors:
                if f[0] == "rsqrt":
                    v, rsqrt = f[1], True
                elif f[0] == "recip" and f[1][0] == "sqrt":
                    v, rsqrt = f[1][1], False
                else:
                    continue
                if v[0] == "add" and v[1] in (("mean", ("sq", x32)),):
                    yield f, v[2], rsqrt
        return find

    @staticmethod
    def _weight(rest: list, x: fx.Node) -> fx.Node | None:
        if len(rest) != 1:
            return None
        w, _ = _strip_cast(rest[0])
        if w[0] != "leaf":
            return None
        wv = val(w[1])
        D = val(x).shape[-1]
        if wv is None or wv.dim() != 1 or not known(wv.shape[0] == D):
            return None
        return w[1]

    # ------------------------------------------------------------------ replace
    def replace(self, graph: fx.Graph, match: NormMatch) -> None:
        m = match
        sources, indices, num_tokens = [], [], m.T  # an int, or the SymInt node that sized the torch.empty
        with graph.inserting_before(m.y):
            if m.plain is not None:
                N, D = val(m.plain).shape
                R = m.rows_per_token
                sources = [graph.call_function(aten.reshape.default, (m.plain, [N // R, R * D]))]
                num_tokens = N // R
            else:
                for idx, values, _ in m.writes:
                    vv = val(values)
                    width = 1
                    for size in vv.shape[vv.dim() - m.rest_dims:]:
                        width *= size
                    sources.append(graph.call_function(aten.reshape.default, (values, [-1, width])))
                    indices.append(idx)
            for src in sources:
                set_fake_vals(graph, src)
        insert_fused(
            graph, torch.ops.kda.gated_norm_merge.default,
            (sources, indices, m.z, m.weight, m.eps, m.act, m.form, m.rsqrt, num_tokens, m.out_dtype),
            before=m.y, routes=[Route(m.y)], region=m.nodes, origin=m.y,
        )
