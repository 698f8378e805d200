"""The contractions of the gated delta rule's step read in every spelling: the state read ``S k``
(in ``v - S k``) and the output ``S q``, each ``sum_k(S * x)``, written as a ``sum`` of a broadcast
product or as a ``bmm`` with the state in either operand (einsum ``"bhk,bhkv->bhv"`` and
``"bhkv,bhk->bhv"``, ``x @ S``, ``S^T @ x``, a ``bmm`` on flattened heads: post-grad, reshapes that
merge the heads into the batch, around a ``bmm`` of ``[N, 1, K] x [N, K, V]`` or ``[N, V, K] x [N, K,
1]``), and why a state read is not the step's: said only where it is established what the product
reads (the state before its decay, k of another token); where its form or factors are not read
here, the reason says that it could not be recognised, never what it is not. Used by
``gdn_recurrent_step``; one public entry per reading (``state_read``, ``dot``, ...).
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx

from kda_inductor.patterns.base import aten, is_op, live_users
from kda_inductor.patterns._axes import (F, _groups, _view_step, factors, fresh, relabel, same_bag, shape, token, unit,
                                          upcast)
from kda_inductor.patterns.canonical import Canon

_VIEWS = (aten.unsqueeze, aten.squeeze, aten.permute, aten.expand, aten.view, aten.reshape, aten._unsafe_view,
          aten.alias, aten.clone)


def _contraction(n: Any, labels: tuple) -> list[F] | None:
    """``n`` (axis names ``labels``, none of them ``k``) read as ``sum_k`` of a product: its factors,
    the summed axis named ``k``. None where ``n`` is of no form read here: a ``sum`` over one axis
    of a float32 product, a ``bmm`` (either operand the state, the contracted axis not a unit one)."""
    n, labels = relabel(n, labels)
    if "k" in labels:
        return None
    if is_op(n, aten.sum) and n.target is aten.sum.dim_IntList and len(n.args[1]) == 1:
        p = n.args[0]
        d = n.args[1][0] % len(shape(p))
        keep = len(n.args) > 2 and n.args[2]
        return factors(p, labels[:d] + ("k",) + labels[d + (1 if keep else 0):])
    if is_op(n, aten.bmm) and len(labels) == 3 and not unit(shape(n.args[0])[2]):
        lead, x, y = labels
        return factors(n.args[0], (lead, x, "k")) + factors(n.args[1], (lead, "k", y))
    return None


def dot(n: Any, labels: tuple) -> list[tuple[list[F], F]] | None:
    """``n`` read as ``sum_k(M * x)``: each ``(M's factors, x)`` with ``x`` a factor whose axes hold
    ``k`` and not ``v`` (a per-channel decay is one too); None where :func:`_contraction` reads no
    product (its form is not recognised)."""
    fs = _contraction(n, labels)
    if fs is None:
        return None
    xs = [f for f in fs if isinstance(f.node, fx.Node) and f.sig() >= {"k"} and "v" not in f.sig()]
    return [([f for f in fs if f is not x], x) for x in xs]


def plain(n: Any) -> bool:
    """``n`` is established to be a state as it was stored or updated, no decay in it: a graph input,
    a fresh tensor, an update's ``add``, a float32 cast or contiguous copy of one of these."""
    while isinstance(n, fx.Node) and (is_op(n, aten.clone) or upcast(n)):
        n = n.args[0]
    return isinstance(n, fx.Node) and (n.op == "placeholder" or fresh(n) or is_op(n, aten.add))


# --------------------------------------------------------------------------- the state read


def state_read(n: fx.Node, labels: tuple, k: F, decayed: list[F], prev: F, canon: Canon) -> tuple[list | None, str]:
    """The state read ``n`` (in ``v - n``) as ``sum_k(A * k)`` of the decayed state ``A`` (factors
    ``decayed``, ``prev`` the state before its decay) and the update's ``k``: ``(the read's factors,
    "")``, or ``(None, why not)``; ``why`` names what the read is only where that is established."""
    reads = dot(n, labels)
    if reads is None:
        return None, ("the state read (S k in v - S k) is of a form not recognised here (read: a sum over k of a "
                      "broadcast product, einsum, matmul or bmm)")
    for m, x in reads:
        if x.key(canon) == k.key(canon) and same_bag(m, decayed, canon):
            return [*m, x], ""
    for m, x in reads:
        if x.key(canon) == k.key(canon) and same_bag(m, [prev], canon):
            return None, ("the state read (S k in v - S k) reads the state before its decay: the gated delta rule "
                          "reads the decayed state S * exp(g) it adds the update to")
        other = _other_token(x, k, canon)
        if other is not None and same_bag(m, decayed, canon):
            return None, (f"the state read (S k in v - S k) reads k of token {other[0]}, the update adds k of token "
                          f"{other[1]}: the delta rule reads the k it writes")
    return None, ("the state read (S k in v - S k) could not be recognised as the update's k times the decayed state "
                  "it adds to (its factors are not read through here)")


def _other_token(x: F, k: F, canon: Canon) -> tuple[Any, Any] | None:
    """``(x's token, k's token)`` where both are tokens of one tensor along one axis, different
    ones (established: the same values but for the token); None else."""
    got = []
    for f in (x, k):
        n, labels = relabel(f.node, f.labels, groups=False)
        tok = token(n, labels) if isinstance(n, fx.Node) else None
        if tok is None:
            return None
        got.append(tok)
    (a, la, ta), (b, lb, tb) = got
    if la != lb or canon(a) != canon(b) or ta == tb:
        return None
    return ta, tb


# --------------------------------------------------------------------------- the output


def readers(n: fx.Node, labels: tuple) -> list[tuple[fx.Node, tuple]]:
    """The contractions that may read the state ``n`` (axis names ``labels``), each as the node
    its output is (a plain-named view after a ``bmm``) with its axis names: a ``sum`` of a product
    of a view of ``n``, or a ``bmm`` one of whose operands is a view of ``n``."""
    out, seen, stack = [], set(), [n]
    while stack:
        x = stack.pop()
        for u in live_users(x):
            if u in seen:
                continue
            seen.add(u)
            if is_op(u, *_VIEWS) and u.args[0] is x:
                stack.append(u)
            elif is_op(u, aten.mul):
                out += [got for s in live_users(u) if (got := _sum_names(s, u, n, labels))]
            elif is_op(u, aten.bmm):
                got = _bmm_names(u, n, labels)
                if got is not None:
                    out.append(got)
    return out


def _sum_names(s: fx.Node, p: fx.Node, n: fx.Node, labels: tuple) -> tuple[fx.Node, tuple] | None:
    """``s = sum(p, d)`` with ``p`` a product of a view of ``n``: ``(s, its names)``."""
    if not (is_op(s, aten.sum) and s.target is aten.sum.dim_IntList and len(s.args[1]) == 1 and s.args[0] is p):
        return None
    d = s.args[1][0] % max(len(shape(p)), 1)
    for x in p.args:
        names = _names_of(x, n, labels) if isinstance(x, fx.Node) else None
        if names is not None and len(names) == len(shape(p)):
            keep = len(s.args) > 2 and s.args[2]
            return s, names[:d] + (("",) if keep else ()) + names[d + 1:]
    return None


def _bmm_names(u: fx.Node, n: fx.Node, labels: tuple) -> tuple[fx.Node, tuple] | None:
    """A ``bmm`` reading ``n`` (``[N, K, V]`` second, or ``[N, V, K]`` first): the first plain-named
    view of its output (its sole users' chain), with those names."""
    a, b = (_names_of(x, n, labels) for x in u.args[:2])
    if b is not None and b[1] == "k" and unit(shape(u.args[0])[1]):
        names = (b[0], "", b[2])
    elif a is not None and a[2] == "k" and unit(shape(u.args[1])[2]):
        names = (a[0], a[1], "")
    else:
        return None
    x = u
    for _ in range(8):
        if all(isinstance(l, str) for l in names):
            return x, names
        users = live_users(x)
        if len(users) != 1 or not is_op(users[0], *_VIEWS):
            return None
        x = users[0]
        names = _forward(x, names)
        if names is None:
            return None
    return None


def _names_of(x: Any, root: fx.Node, labels: tuple, depth: int = 8) -> tuple | None:
    """The axis names of ``x``, a chain of views of ``root`` (named ``labels``), reshapes that merge
    axes included (a merged axis named by the tuple of its parts); None if it is not one."""
    if x is root:
        return labels
    if depth == 0 or not (isinstance(x, fx.Node) and is_op(x, *_VIEWS)) or x.target is aten.view.dtype:
        return None
    below = _names_of(x.args[0], root, labels, depth - 1)
    return None if below is None else _forward(x, below)


def _forward(x: fx.Node, below: tuple) -> tuple | None:
    """The axis names of the view ``x`` given its input's (``below``)."""
    if is_op(x, aten.alias, aten.clone):
        return below
    src = _view_step(x, list(range(len(below))))
    if src is not None:
        return tuple(below[j] if j is not None else "" for j in src)
    groups = _groups(shape(x.args[0]), shape(x)) if is_op(x, aten.view, aten.reshape, aten._unsafe_view) else None
    if groups is None:
        return None
    out = [""] * len(shape(x))
    for ga, gb in groups:
        parts = tuple(p for i in ga for p in (below[i] if isinstance(below[i], tuple) else (below[i],)))
        if len(gb) == 1:
            out[gb[0]] = parts[0] if len(parts) == 1 else parts
        elif len(parts) == len(gb):
            for i, p in zip(gb, parts):
                out[i] = p
        else:
            return None
    return tuple(out)
