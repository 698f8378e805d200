"""The canonical term (:mod:`.canonical`'s vocabulary): an expression of a graph's values that
compares structurally, so that two nodes computing the same canonical expression of the same
leaves are equal terms (re-exported by :mod:`.canonical`, through which every rewrite that reads
canonical terms uses it)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.fx as fx


@dataclasses.dataclass(frozen=True)
class Term:
    """A canonical expression. ``args`` are terms or Python constants; ``attrs`` sorted
    ``(name, value)`` pairs. ``node`` is the graph node whose value the term is and
    ``nodes`` the nodes the rule folded into it (neither takes part in equality)."""

    op: str
    args: tuple = ()
    attrs: tuple = ()
    node: fx.Node | None = dataclasses.field(default=None, compare=False, repr=False)
    nodes: frozenset = dataclasses.field(default=frozenset(), compare=False, repr=False)

    def __hash__(self) -> int:
        """Computed once per term: a term is a DAG whose shared sub-terms the derived hash
        would hash once per path (exponential in the depth of a real model's graph)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.op, self.args, self.attrs))
            object.__setattr__(self, "_hash", h)
        return h

    def attr(self, name: str, default: Any = None) -> Any:
        return dict(self.attrs).get(name, default)

    @property
    def leaf(self) -> fx.Node | None:
        """The graph node of a ``leaf`` term (None for other terms)."""
        return self.attr("of") if self.op == "leaf" else None

    def __repr__(self) -> str:
        if self.op == "leaf":
            return f"%{self.leaf.name}"
        if self.op == "const":
            return repr(self.args[0])
        inner = ", ".join([repr(a) for a in self.args] + [f"{k}={v}" for k, v in self.attrs])
        return f"{self.op}({inner})"


def term(op: str, *args: Any, node: fx.Node | None = None, nodes=(), **attrs: Any) -> Term:
    return Term(op, tuple(args), tuple(sorted(attrs.items())), node, frozenset(nodes))


def const_value(t: Any) -> float | int | None:
    """The number a ``const`` term (or a plain number) stands for, else None."""
    if isinstance(t, bool):
        return None
    if isinstance(t, (int, float)):
        return t
    if isinstance(t, Term) and t.op == "const":
        return t.args[0]
    return None
