"""Readable before/after views of the graphs our pass rewrote.

The pass records a :class:`NodeRow` snapshot of each post-grad graph before and
after it runs (and the nodes each rewrite removed and added). This module turns
those into

* readable listings with stable node names: names come from the op and its
  order of appearance in the *before* graph (``index_0``, ``in2``), so a node
  the pass left alone has the same name on both sides, and nodes it added get
  fresh names of their own op (``indexer_k_gather_0``);
* a unified diff (coloured for terminals) and the pieces of the HTML report
  (:mod:`kda_inductor.report_html`);
* a normalized summary (rewrite table with op names, no node names) that stays
  the same across torch versions, for snapshot tests.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, TYPE_CHECKING

import torch
import torch.fx as fx

if TYPE_CHECKING:
    from kda_inductor.record import PassRecord


@dataclasses.dataclass(frozen=True)
class NodeRow:
    """One FX node, detached from the graph (safe to keep after compiling)."""

    name: str
    op: str  # placeholder / call_function / output / get_attr / ...
    target: str  # "aten.index.Tensor", "operator.getitem", ...
    args: str  # rendered with %fx_name references
    meta: str  # "u8[9, 8448]" or ""
    inputs: tuple[str, ...]  # fx names this node reads
    note: str = ""  # e.g. "in place on kv_cache" for a functionalized call of a mutating op


def _overload_name(op: torch._ops.OpOverload) -> str:
    return f"{op.namespace}.{op._schema.name.split('::')[-1]}.{op._overloadname}"


_INT64_MAX = 2**63 - 1
_FUNCTIONALIZED = ("auto_functionalized", "auto_functionalized_v2")


def _functionalized_op(node: fx.Node) -> torch._ops.OpOverload | None:
    """The mutating op an ``auto_functionalized(_v2)`` node calls (shown under its own name)."""
    t = node.target
    if (isinstance(t, torch._ops.HigherOrderOperator) and t.__name__ in _FUNCTIONALIZED and node.args
            and isinstance(node.args[0], torch._ops.OpOverload)):
        return node.args[0]
    return None


def _target_name(node: fx.Node) -> str:
    t = node.target
    op = _functionalized_op(node)
    if op is not None:
        return _overload_name(op)
    if isinstance(t, torch._ops.OpOverload):
        return _overload_name(t)
    if isinstance(t, torch._ops.HigherOrderOperator):
        return f"higher_order.{t.__name__}"
    if callable(t):
        return f"{getattr(t, '__module__', '') or ''}.{getattr(t, '__name__', str(t))}".lstrip(".")
    return str(t)


def _meta(node: fx.Node) -> str:
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor):
        short = str(v.dtype).replace("torch.", "")
        return f"{short}[{', '.join(str(s) for s in v.shape)}]"
    return ""


def _render_arg(a: Any) -> str:
    if isinstance(a, bool) or a is None:
        return repr(a)
    if isinstance(a, int) and abs(a) >= _INT64_MAX:  # a slice to the end: x[64:]
        return "None" if a > 0 else "-None"
    if isinstance(a, torch.device):
        return repr(str(a))
    if isinstance(a, fx.Node):
        return f"%{a.name}"
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_render_arg(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k}: {_render_arg(v)}" for k, v in a.items()) + "}"
    if isinstance(a, torch._ops.OpOverload):
        return _overload_name(a)
    return repr(a)


_QUIET_KWARGS = {"requires_grad": False, "pin_memory": False}
"""Keyword arguments left out of listings when they have these (default) values."""


def snapshot(graph: fx.Graph) -> list[NodeRow]:
    rows = []
    for n in graph.nodes:
        call_args, note = n.args, ""
        if n.op == "call_function" and _functionalized_op(n) is not None:
            op = _functionalized_op(n)
            call_args = n.args[1:]
            mutated = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
            where = ", ".join(_render_arg(n.kwargs[m]) for m in mutated if m in n.kwargs)
            note = f"in place on {where}" if where else "functionalized"
        kwargs = {k: v for k, v in n.kwargs.items() if not (k in _QUIET_KWARGS and v == _QUIET_KWARGS[k])}
        args = ", ".join(
            [_render_arg(a) for a in call_args] + [f"{k}={_render_arg(v)}" for k, v in kwargs.items()]
        )
        rows.append(
            NodeRow(n.name, n.op, _target_name(n) if n.op == "call_function" else str(n.target),
                    args, _meta(n), tuple(m.name for m in n.all_input_nodes), note)
        )
    return rows


def op_name(row: NodeRow) -> str:
    """Short op name: ``aten.index.Tensor`` -> ``aten.index``; inputs -> ``input``."""
    if row.op == "placeholder":
        return "input"
    if row.op == "output":
        return "output"
    parts = row.target.split(".")
    if parts[0] in ("aten", "prims", "kda", "higher_order") and len(parts) >= 2:
        return ".".join(parts[:2])
    return parts[-1]


def _kind(row: NodeRow) -> str:
    return "in" if row.op == "placeholder" else op_name(row).split(".")[-1]


def readable_names(before: Sequence[NodeRow], after: Sequence[NodeRow]) -> dict[str, str]:
    """fx name -> stable readable name, numbered per op in order of first appearance."""
    names: dict[str, str] = {}
    counts: Counter[str] = Counter()
    for row in [*before, *after]:
        if row.name in names or row.op == "output":
            continue
        kind = _kind(row)
        names[row.name] = f"{kind}{counts[kind]}" if kind == "in" else f"{kind}_{counts[kind]}"
        counts[kind] += 1
    return names


_REF = re.compile(r"%(\w+)")


def listing(rows: Sequence[NodeRow], names: dict[str, str]) -> list[str]:
    """One line per node, e.g. ``index_0 = aten.index.Tensor(in0, [sub_0])  # i64[205]``."""
    out = []
    rename = lambda text: _REF.sub(lambda m: names.get(m.group(1), m.group(1)), text)  # noqa: E731
    for r in rows:
        args = rename(r.args)
        comment = "; ".join(rename(x) for x in (r.meta, r.note) if x)
        note = f"  # {comment}" if comment else ""
        if r.op == "placeholder":
            out.append(f"{names[r.name]} = input{note}")
        elif r.op == "output":
            out.append(f"return {args}")
        else:
            out.append(f"{names[r.name]} = {r.target}({args}){note}")
    return out


def unified(before: Sequence[NodeRow], after: Sequence[NodeRow], *, title: str = "graph",
            color: bool = False) -> str:
    names = readable_names(before, after)
    lines = difflib.unified_diff(
        listing(before, names), listing(after, names),
        f"{title} before kda_inductor", f"{title} after kda_inductor", lineterm="", n=2,
    )
    if not color:
        return "\n".join(lines)
    paint = {"+": "\x1b[32m", "-": "\x1b[31m", "@": "\x1b[36m"}
    return "\n".join(
        f"{paint[ln[0]]}{ln}\x1b[0m" if ln[:1] in paint and not ln.startswith(("+++", "---")) else ln
        for ln in lines
    )


def html(pages: Iterable[tuple[str, Sequence[NodeRow], Sequence[NodeRow]]]) -> str:
    """A side-by-side page, one table per ``(title, before, after)`` graph."""
    maker = difflib.HtmlDiff(wrapcolumn=100)
    tables = []
    for title, before, after in pages:
        names = readable_names(before, after)
        tables.append(f"<h2>{title}</h2>")
        tables.append(
            maker.make_table(listing(before, names), listing(after, names),
                             "before kda_inductor", "after kda_inductor")
        )
    head = maker.make_file([], [])  # the stylesheet and legend difflib ships
    return head.replace("<body>", "<body>\n<h1>kda_inductor graph diff</h1>\n" + "\n".join(tables), 1)


def short_location(location: str | None) -> str | None:
    """``"/abs/path/model.py:12"`` -> ``"model.py:12"`` relative to the working directory
    when the file is under it (as a user would type it), else unchanged."""
    if not location:
        return location
    import os

    path, sep, line = location.rpartition(":")
    if not sep or not line.isdigit() or not os.path.isabs(path):
        return location
    rel = os.path.relpath(path)
    return f"{rel}:{line}" if not rel.startswith("..") else location


def op_counts(rows: Iterable[NodeRow], wanted: Iterable[str] | None = None) -> dict[str, int]:
    """Multiset of op names, optionally only for the fx names in ``wanted``."""
    keep = None if wanted is None else set(wanted)
    c = Counter(op_name(r) for r in rows if keep is None or r.name in keep)
    return dict(sorted(c.items()))


_WRAP = 100
"""Rewrite tables wrap their op lists at this many columns."""


def _fmt_ops(ops: dict[str, int]) -> str:
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in ops.items()) or "-"


def rewrite_table(record: PassRecord, *, rows_only: bool = False, active_only: bool = False) -> list[str]:
    """Lines: rewrite, matches, nodes removed, nodes added (counts; ops unless ``rows_only``).
    ``active_only``: only rewrites that matched, changed nodes or failed (a snapshot that does
    not change when a rewrite is added)."""
    before = {r.name: r for r in record.before_nodes}
    after = {r.name: r for r in record.after_nodes}
    empty = {"removed": [], "added": []}
    rows = [name for name, count in record.matches.items() if not active_only or count or name in record.errors
            or record.changes.get(name, empty)["removed"] or record.changes.get(name, empty)["added"]]
    width = max(len(n) for n in ["rewrite", *rows])  # the rows shown: another rewrite's name changes no snapshot
    lines = [f"{'rewrite':<{width}}  matches  removed  added"]
    for name in rows:
        count, ch = record.matches[name], record.changes.get(name, empty)
        lines.append(f"{name:<{width}}  {count:>7}  {len(ch['removed']):>7}  {len(ch['added']):>5}")
        parts = record.parts.get(name)
        if parts:  # which part fired, where a rewrite fuses more or less (Match.part)
            lines.append(f"{'':<{width}}    fused: " + ", ".join(f"{p} {n}" for p, n in sorted(parts.items())))
        if not rows_only and (ch["removed"] or ch["added"]):
            removed = op_counts([before[n] for n in ch["removed"] if n in before])
            added = op_counts([after[n] for n in ch["added"] if n in after])
            for sign, ops in (("-", removed), ("+", added)):
                lead = f"{'':<{width}}    {sign} "
                lines += textwrap.wrap(_fmt_ops(ops), width=_WRAP, initial_indent=lead,
                                       subsequent_indent=" " * len(lead), break_on_hyphens=False)
        for err in [record.errors[name]] if name in record.errors else []:
            lines.append(f"{'':<{width}}    failed and skipped: {err}")
    return lines


def records_diff(records: Sequence[PassRecord]) -> str:
    """Per graph our pass ran on: the rewrite table and the unified before/after diff."""
    parts: list[str] = []
    for i, r in enumerate(records):
        diff = unified(r.before_nodes, r.after_nodes, title=f"graph {i}")
        parts += [f"=== graph {i} ===", *rewrite_table(r), "", diff or "(our pass changed nothing in this graph)", ""]
    return "\n".join(parts)
