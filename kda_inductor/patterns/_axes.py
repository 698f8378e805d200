"""Reading tensors of a post-grad graph with named axes: ``gdn_recurrent_step``'s vocabulary (its
pattern file and :mod:`._gdn_products`, which reads its contractions).

A value is read as a node and the names of its axes (``("b", "h", "k", "v")``; ``""`` for a unit
or broadcast axis): views that keep every value (unit dims added or dropped, permutes, broadcasts,
contiguous copies) carry the names down to the tensor they view (:func:`relabel`), a float32
product is the bag of its factors each with its own names (:func:`factors`), a contraction over
an axis is a ``sum`` of a product or a ``bmm`` of reshapes (:func:`dot`). Two spellings of one
computation read as the same names; a transposed one does not (a ``[K, V]`` state summed over
``V`` is no sum over ``k``), whatever the sizes: names follow positions, never sizes (a size-1 axis
matches any name, its values being the same under every broadcast).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true as known

from kda_inductor.patterns.base import aten, is_op, live_users, prims, val
from kda_inductor.patterns.canonical import Canon

_F32 = torch.float32
_16BIT = (torch.bfloat16, torch.float16)
VALUE_VIEWS = (aten.unsqueeze, aten.squeeze, aten.permute, aten.view, aten.reshape, aten._unsafe_view, aten.clone)
"""Ops whose output holds its input's values (in another shape or order)."""



def unit(s: Any) -> bool:
    return known(s == 1)


def _same_shape(a: tuple, b: tuple) -> bool:
    """Two shapes provably equal (no guard on symbolic sizes)."""
    return len(a) == len(b) and all(known(x == y) for x, y in zip(a, b))


def shape(n: Any) -> tuple:
    v = val(n)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else ()


def _view_map(n: Any) -> tuple[Any, list | None]:
    """``(base, src)``: ``n`` is ``base`` through views that keep each value (unit dims added or
    dropped, permutes, broadcasts, copies); ``src[i]`` is the base dim of ``n``'s dim ``i`` (None: a
    unit or broadcast dim)."""
    if not isinstance(n, fx.Node) or not isinstance(val(n), torch.Tensor):
        return n, None
    ident = (n, list(range(val(n).dim())))
    if is_op(n, aten.alias) or (is_op(n, aten.clone) and set(n.kwargs) <= {"memory_format"}):
        return _view_map(n.args[0])
    if is_op(n, aten.unsqueeze, aten.squeeze, aten.permute, aten.expand, aten.view, aten.reshape,
             aten._unsafe_view) and n.target is not aten.view.dtype:
        b, src = _view_map(n.args[0])
        out = _view_step(n, src)
        return (b, out) if out is not None else ident
    return ident


def _view_step(n: fx.Node, src: list) -> list | None:
    """``src`` of ``n`` from its argument's ``src`` (see :func:`_view_map`), or None."""
    xs, ns = shape(n.args[0]), shape(n)
    if is_op(n, aten.unsqueeze):
        d = n.args[1] % len(ns)
        return src[:d] + [None] + src[d:]
    if is_op(n, aten.permute):
        return [src[p % len(xs)] for p in n.args[1]]
    if is_op(n, aten.expand):
        src = [None] * (len(ns) - len(xs)) + src
        xs = (1,) * (len(ns) - len(xs)) + xs
        return [None if unit(a) and not unit(b) else s for s, a, b in zip(src, xs, ns)]
    keep_x = [i for i, s in enumerate(xs) if not unit(s)]
    keep_n = [i for i, s in enumerate(ns) if not unit(s)]
    if len(keep_x) != len(keep_n) or not all(known(xs[a] == ns[b]) for a, b in zip(keep_x, keep_n)):
        return None  # squeeze, or a reshape that only adds or drops unit dims
    out = [None] * len(ns)
    for a, b in zip(keep_x, keep_n):
        out[b] = src[a]
    return out


def relabel(n: Any, labels: tuple, groups: bool = True) -> tuple[Any, tuple]:
    """``n``'s view base and its axis names, given ``n``'s (``""``: a unit or broadcast dim), also
    through reshapes that merge or split axes (:func:`_regroup`) unless ``groups`` is False."""
    for _ in range(16 if groups else 1):
        b, src = _view_map(n)
        if b is not n and src is not None:
            out = [""] * len(shape(b))
            for i, j in enumerate(src):
                if j is not None:
                    out[j] = labels[i]
            n, labels = b, tuple(out)
        got = _regroup(n, labels) if groups else None
        if got is None:
            break
        n, labels = got
    return n, labels


def _groups(xs: tuple, ns: tuple) -> list[tuple[list[int], list[int]]] | None:
    """The non-unit dims of a reshape from ``xs`` to ``ns`` in groups of equal products (static
    sizes), each one dim on one side; None where a group is many to many or a size symbolic."""
    xi, ni = [i for i, s in enumerate(xs) if not unit(s)], [i for i, s in enumerate(ns) if not unit(s)]
    if not all(isinstance(s, int) for s in (*xs, *ns)):
        return None
    out, a, b = [], 0, 0
    while a < len(xi) and b < len(ni):
        ga, gb, pa, pb = [xi[a]], [ni[b]], xs[xi[a]], ns[ni[b]]
        while pa != pb and (a + 1 < len(xi) if pa < pb else b + 1 < len(ni)):  # grow the smaller side
            if pa < pb:
                a += 1
                ga, pa = ga + [xi[a]], pa * xs[xi[a]]
            else:
                b += 1
                gb, pb = gb + [ni[b]], pb * ns[ni[b]]
        if pa != pb or (len(ga) > 1 and len(gb) > 1):
            return None
        out.append((ga, gb))
        a, b = a + 1, b + 1
    return out if a == len(xi) and b == len(ni) else None


def _regroup(n: Any, labels: tuple) -> tuple[fx.Node, tuple] | None:
    """A reshape that merges or splits axes (``[B * H, K, V]`` of ``[B, H, K, V]``: a ``bmm``'s
    operands, a ``matmul``'s outer product): its input and that input's axis names, a merged
    axis named by the tuple of its parts' names; None for any other node or reshape."""
    if not is_op(n, aten.view, aten.reshape, aten._unsafe_view) or n.target is aten.view.dtype:
        return None
    groups = _groups(shape(n.args[0]), shape(n))
    if groups is None:
        return None
    out = [""] * len(shape(n.args[0]))
    for ga, gb in groups:
        if len(ga) == 1:
            names = [labels[j] for j in gb]
            out[ga[0]] = names[0] if len(names) == 1 else tuple(names)
        elif isinstance(labels[gb[0]], tuple) and len(labels[gb[0]]) == len(ga):
            for i, name in zip(ga, labels[gb[0]]):
                out[i] = name
        elif labels[gb[0]] != "":
            return None  # a merge of axes the names do not split
    return n.args[0], tuple(out)


def broadcast(a: fx.Node, n: fx.Node, labels: tuple) -> tuple:
    """The axis names of ``a``, an operand broadcast to ``n``'s shape."""
    xs, ns = shape(a), shape(n)
    off = len(ns) - len(xs)
    return tuple("" if unit(s) and not unit(ns[off + i]) else labels[off + i] for i, s in enumerate(xs))


class F(NamedTuple):
    """A factor of a product: a node (or a number) and its axis names."""

    node: Any
    labels: tuple

    def sig(self) -> frozenset:
        """The names of its non-unit axes (a merged axis's parts each)."""
        return frozenset(x for l, s in zip(self.labels, shape(self.node)) if l and not unit(s)
                         for x in (l if isinstance(l, tuple) else (l,)))

    def key(self, canon: Canon) -> tuple:
        """What two factors must share to be the same values on the same axes."""
        names = tuple(l if not unit(s) else "" for l, s in zip(self.labels, shape(self.node)))
        return canon(self.node), names


def factors(n: Any, labels: tuple, dtypes: tuple = (_F32,)) -> list[F]:
    """The factors of ``n`` (products in ``dtypes`` flattened, through views: float32, whose
    roundings any grouping shares within float32; 16-bit ones only to read what a candidate is),
    each with its axis names."""
    n, labels = relabel(n, labels)
    if not (is_op(n, aten.mul) and val(n).dtype in dtypes):
        return [F(n, labels)]
    out: list[F] = []
    for a in n.args:
        if isinstance(a, fx.Node) and isinstance(val(a), torch.Tensor) and val(a).dim() > 0:
            out += factors(a, broadcast(a, n, labels), dtypes)
        else:
            out.append(F(a, ()))
    return out


def dot(n: fx.Node, labels: tuple) -> list[tuple[list[F], F]]:
    """``n`` (axis names ``labels``, no ``k``) read as ``sum_k(M * x)``: each ``(M's factors, x)``
    with ``x`` a factor whose axes are ``b h k`` (a per-channel decay is one too): a ``sum`` over the
    ``k`` axis of a product, or a ``bmm`` of a ``[N, 1, K]`` vector and a ``[N, K, V]`` state (einsum,
    matmul: reshapes that merge the leading axes into ``N``, read by :func:`_regroup`)."""
    n, labels = relabel(n, labels)
    if is_op(n, aten.sum) and n.target is aten.sum.dim_IntList and len(n.args[1]) == 1:
        p = n.args[0]
        d = n.args[1][0] % len(shape(p))
        keep = len(n.args) > 2 and n.args[2]
        fs = factors(p, labels[:d] + ("k",) + labels[d + (1 if keep else 0):])
    elif is_op(n, aten.bmm) and unit(shape(n.args[0])[1]) and len(labels) == 3:
        lead = labels[0]  # the batch of the bmm: the merged leading axes
        fs = factors(n.args[0], (lead, "", "k")) + factors(n.args[1], (lead, "k", labels[2]))
    else:
        return []
    xs = [f for f in fs if isinstance(f.node, fx.Node) and f.sig() >= {"k"} and "v" not in f.sig()]
    return [([f for f in fs if f is not x], x) for x in xs]


def same_bag(a: list[F], b: list[F], canon: Canon) -> bool:
    """The same factors, in any order (term equality, never ``repr``: exponential in a deep DAG)."""
    rest = [f.key(canon) for f in b]
    for f in a:
        key = f.key(canon)
        i = next((i for i, r in enumerate(rest) if r == key), None)
        if i is None:
            return False
        del rest[i]
    return not rest


def arrange(x: torch.Tensor, have: tuple, want: tuple) -> torch.Tensor:
    """``x`` (axes named ``have``) with its axes in ``want``'s order: unit axes ``want`` lacks are
    dropped, axes ``have`` lacks (``""``, or a name it has not) are added as unit axes. No sizes
    are spelled out, so symbolic sizes trace."""
    present = [l for l in want if l and l in have]
    perm = [have.index(l) for l in present] + [i for i, l in enumerate(have) if l not in present]
    y = x.permute(perm) if perm != list(range(len(perm))) else x
    if len(present) < len(have):
        y = y.reshape(y.shape[:len(present)])
    for i, l in enumerate(want):
        if not (l and l in have):
            y = y.unsqueeze(i)
    return y


def between(outputs: list[fx.Node], stops: set, canon: Canon) -> set[fx.Node] | None:
    """The nodes that compute ``outputs`` from ``stops`` (upstream of the outputs, up to the stops
    or a node of the same canonical term: Inductor does not CSE before our pass, so ``x[:, t]``
    may be spelled twice); None where that reaches another graph input (the match would depend on
    something it lacks)."""
    region: set[fx.Node] = set()
    terms = [canon(n) for n in stops]  # a list: terms with symbolic sizes do not hash
    stack = list(outputs)
    while stack:
        n = stack.pop()
        if n in region or n in stops or not isinstance(val(n), torch.Tensor) or any(canon(n) == t for t in terms):
            continue
        if n.op != "call_function":
            return None
        region.add(n)
        stack.extend(n.all_input_nodes)
    return region


def labels_of(x: fx.Node, root: fx.Node, labels: tuple) -> tuple | None:
    """The axis names of ``x``, a view of ``root`` (named ``labels``); None if it is not one."""
    b, src = _view_map(x)
    return tuple(labels[j] if j is not None else "" for j in src) if b is root else None


# --------------------------------------------------------------------------- what a loop reads and writes


def token(n: fx.Node, labels: tuple) -> tuple[fx.Node, tuple, Any] | None:
    """``x[..., t, ...]`` (``select``): ``(x, its axis names with "t", t)``."""
    if is_op(n, aten.select) and n.target is aten.select.int and "t" not in labels:
        d = n.args[1] % (len(labels) + 1)
        t = n.args[2]
        return n.args[0], labels[:d] + ("t",) + labels[d:], t % shape(n.args[0])[d] if isinstance(t, int) else t
    return None


def upcast(n: fx.Node) -> bool:
    """``n`` is an exact cast to float32 (``.float()`` of a 16-bit or float32 tensor)."""
    src = val(n.args[0]) if n.args else None
    return (is_op(n, prims.convert_element_type, aten._to_copy) and set(n.kwargs) <= {"dtype"}
            and val(n).dtype == _F32 and isinstance(src, torch.Tensor) and src.dtype in (*_16BIT, _F32))


def repeat(n: fx.Node, labels: tuple) -> tuple[fx.Node, tuple, int] | None:
    """``x.repeat_interleave(G, dim=d)`` on the head axis (post-grad: ``unsqueeze(x, d + 1)``,
    ``expand`` of that dim to ``G``, a contiguous copy, a reshape merging the two): ``(x, its axis
    names, G)``. ``x.repeat(...)`` (tiling: head ``h % Hk``) is not it."""
    if not is_op(n, aten.view, aten.reshape, aten._unsafe_view):
        return None
    e = n.args[0].args[0] if is_op(n.args[0], aten.clone) else n.args[0]
    if not (is_op(e, aten.expand) and is_op(e.args[0], aten.unsqueeze)):
        return None
    x, d = e.args[0].args[0], e.args[0].args[1] % len(shape(e))
    xs, es, ns = shape(x), shape(e), shape(n)
    if not (1 <= d < len(es) and len(ns) == len(xs) and "h" == labels[d - 1]
            and known(ns[d - 1] == xs[d - 1] * es[d]) and _same_shape(es[:d - 1], ns[:d - 1]) and _same_shape(es[d + 1:], ns[d:])):
        return None
    return x, labels, es[d] if isinstance(es[d], int) else None


def sole_user(n: fx.Node) -> fx.Node | None:
    users = live_users(n)
    return users[0] if len(users) == 1 else None


def fresh(n: Any) -> bool:
    return is_op(n, aten.full, aten.zeros, aten.empty, aten.empty_strided, aten.new_zeros)


def written(o: fx.Node, labels: tuple, buf: Any, t: int) -> tuple[fx.Node, tuple] | None:
    """``buf[..., t, ...] = o`` (``select_scatter`` of ``o`` or its views, or of the functional
    ``copy`` into ``buf``'s select that ``o[:, t] = ...`` leaves): ``(the scatter, buf's names)``."""
    n = o
    while (u := sole_user(n)) is not None and is_op(u, *VALUE_VIEWS):
        n = u
    names = labels_of(n, o, labels)
    if u is not None and is_op(u, aten.copy) and u.args[1] is n and _same_shape(shape(u), shape(n)):
        n, u = u, sole_user(u)
    if not (names is not None and is_op(u, aten.select_scatter) and u.args[1] is n and u.args[3] == t):
        return None
    if buf is not None and u.args[0] is not buf:
        return None
    d = u.args[2] % len(shape(u))
    return u, names[:d] + ("t",) + names[d:]
