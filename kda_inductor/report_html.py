"""The HTML report (``kda-inductor graph-diff --html FILE``): one self-contained page.

What it shows, in order: the rewrite table (matches, nodes removed and added, by op); per
rewrite and graph, the before/after of the region it replaced, unchanged lines folded into
``<details>`` (expandable, no JavaScript); the candidates that were not rewritten, with the
user's source line; graph breaks, frames that fell back to eager, cudagraph skips, each with
its reason. Long lines wrap: the page fits a 1280 px wide window without horizontal scrolling.
"""

from __future__ import annotations

import difflib
import html
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kda_inductor.diff import NodeRow, listing, op_counts, readable_names, short_location

if TYPE_CHECKING:  # pragma: no cover
    from kda_inductor._explain import Report

CONTEXT = 2
"""Unchanged lines shown on each side of a change; longer unchanged runs are folded."""

_CSS = """
:root { --add: #e6ffec; --add-mark: #1a7f37; --del: #ffebe9; --del-mark: #cf222e; --muted: #57606a; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328;
       max-width: 1180px; margin: 0 auto; padding: 16px 20px 48px; }
h1 { font-size: 1.5em; margin: 0.2em 0 0.1em; }
h2 { font-size: 1.2em; margin: 1.6em 0 0.4em; border-bottom: 1px solid #d0d7de; padding-bottom: 0.2em; }
h3 { font-size: 1.05em; margin: 1.2em 0 0.3em; }
p.sub, .muted { color: var(--muted); }
code, .code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 0.86em; }
table { border-collapse: collapse; width: 100%; table-layout: fixed; margin: 0.4em 0; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
td { overflow-wrap: anywhere; }
th { background: #f6f8fa; }
col.name { width: 18%; } col.num { width: 9.5%; } col.ops { width: 31.75%; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.zero td { color: var(--muted); }
.diff { border: 1px solid #d0d7de; border-radius: 6px; margin: 0.4em 0 1em; overflow: hidden; }
.diff .l { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12.5px;
           white-space: pre-wrap; overflow-wrap: anywhere; padding: 1px 8px 1px 2.2em; text-indent: -1.4em; }
.diff .add { background: var(--add); } .diff .add::before { content: "+ "; color: var(--add-mark); }
.diff .del { background: var(--del); } .diff .del::before { content: "- "; color: var(--del-mark); }
.diff .ctx::before { content: "  "; }
.diff details { background: #f6f8fa; border-top: 1px solid #eaeef2; border-bottom: 1px solid #eaeef2; }
.diff summary { cursor: pointer; color: var(--muted); padding: 2px 8px; font-size: 0.85em; }
.diff .edge { color: var(--muted); padding: 2px 8px; font-size: 0.85em; background: #f6f8fa; }
ul.items li { margin: 0.35em 0; overflow-wrap: anywhere; }
.note { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 6px; padding: 6px 10px; }
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _ops(ops: dict[str, int]) -> str:
    return ", ".join(f"{_e(k)}&nbsp;&times;{v}" if v > 1 else _e(k) for k, v in ops.items()) or "&ndash;"


def _totals(report: Report) -> dict[str, dict[str, Any]]:
    """Rewrite -> matches, removed/added node counts and op multisets over all graphs."""
    rows: dict[str, dict[str, Any]] = {
        name: {"matches": n, "removed": 0, "added": 0, "ops_removed": Counter(), "ops_added": Counter(),
               "errors": []}
        for name, n in report.matches.items()
    }
    for g in report.graphs:
        rec = g.record
        before = {r.name: r for r in rec.before_nodes or []}
        after = {r.name: r for r in rec.after_nodes or []}
        for name, ch in rec.changes.items():
            row = rows.setdefault(name, {"matches": 0, "removed": 0, "added": 0, "ops_removed": Counter(),
                                         "ops_added": Counter(), "errors": []})
            row["removed"] += len(ch["removed"])
            row["added"] += len(ch["added"])
            row["ops_removed"].update(op_counts([before[n] for n in ch["removed"] if n in before]))
            row["ops_added"].update(op_counts([after[n] for n in ch["added"] if n in after]))
        for name, err in rec.errors.items():
            rows[name]["errors"].append(err)
    return rows


def _rewrite_table(report: Report) -> str:
    out = ['<table id="rewrites"><colgroup><col class="name"><col class="num"><col class="num">'
           '<col class="ops"><col class="num"><col class="ops"></colgroup>',
           "<thead><tr><th>rewrite</th><th>matches</th><th>removed</th><th>ops removed</th>"
           "<th>added</th><th>ops added</th></tr></thead><tbody>"]
    for name, row in _totals(report).items():
        cls = ' class="zero"' if not row["matches"] else ""
        err = "".join(f'<br><span class="muted">failed and skipped: {_e(e)}</span>' for e in row["errors"])
        out.append(
            f"<tr{cls}><td><code>{_e(name)}</code>{err}</td><td class=num>{row['matches']}</td>"
            f"<td class=num>{row['removed']}</td><td><code>{_ops(dict(sorted(row['ops_removed'].items())))}</code></td>"
            f"<td class=num>{row['added']}</td><td><code>{_ops(dict(sorted(row['ops_added'].items())))}</code></td></tr>"
        )
    out.append("</tbody></table>")
    return "\n".join(out)


def _line(kind: str, text: str) -> str:
    return f'<div class="l {kind}">{_e(text)}</div>'


def _fold(lines: Sequence[str], label: str) -> str:
    body = "".join(_line("ctx", t) for t in lines)
    return f"<details><summary>{_e(label)}</summary>{body}</details>"


def region_diff(before: Sequence[NodeRow], after: Sequence[NodeRow], removed: Sequence[str],
                added: Sequence[str], *, others: Sequence[str] = (), context: int = CONTEXT) -> str:
    """The before/after of one rewrite's region as HTML: its removed (-) and added (+) lines,
    the users it rerouted to its new nodes, ``context`` unchanged lines around each change;
    longer unchanged runs, and lines of ``others`` (nodes other rewrites removed or added),
    folded into ``<details>``."""
    names = readable_names(before, after)
    old, new = listing(before, names), listing(after, names)
    ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    owned = _owned_changes(ops, old, new, _Mine(before, after, removed, added, others))
    if not owned:
        return ""
    gone = {old[i] for tag, i1, i2, _, _ in ops if tag != "equal" for i in range(i1, i2)}
    moved = gone & {new[j] for tag, _, _, j1, j2 in ops if tag != "equal" for j in range(j1, j2)}
    first, last = min(owned), max(owned)
    parts = ['<div class="diff">', *_leading_context(ops, old, first, context)]
    for k in range(first, last + 1):
        tag, i1, i2, j1, j2 = ops[k]
        if tag == "equal":
            parts += _unchanged_run(old[i1:i2], context)
            continue
        lines = owned.get(k) or [("-", old[i], False) for i in range(i1, i2)] + [
            ("+", new[j], False) for j in range(j1, j2)]
        parts += _change(lines, moved)
    parts += [*_trailing_context(ops, old, last, context), "</div>"]
    return "".join(parts)


class _Mine:
    """Which diff lines are this rewrite's: its removed and added nodes, and the users it
    rerouted to its new nodes; not those of ``others`` (another rewrite's nodes)."""

    def __init__(self, before, after, removed, added, others):
        self.before, self.after = before, after
        self.removed, self.added, self.others = set(removed), set(added), set(others)
        self.after_by_name = {r.name: r for r in after}

    def __call__(self, row: NodeRow, side: str) -> bool:
        if row.name in (self.removed if side == "-" else self.added):
            return True
        if row.name in self.others:
            return False
        new_row = self.after_by_name.get(row.name) if side == "-" else row  # a rerouted user
        return new_row is not None and bool(self.added.intersection(new_row.inputs))


def _owned_changes(ops, old, new, mine: _Mine) -> dict[int, list[tuple[str, str, bool]]]:
    """The changed opcodes with a line of this rewrite: index -> ``(sign, text, mine)`` lines."""
    owned: dict[int, list[tuple[str, str, bool]]] = {}
    for k, (tag, i1, i2, j1, j2) in enumerate(ops):
        if tag == "equal":
            continue
        lines = [("-", old[i], mine(mine.before[i], "-")) for i in range(i1, i2)]
        lines += [("+", new[j], mine(mine.after[j], "+")) for j in range(j1, j2)]
        if any(m for _, _, m in lines):
            owned[k] = lines
    return owned


def _leading_context(ops, old, first: int, context: int) -> list[str]:
    """Before the first change: a note for the lines not shown, then ``context`` lines."""
    lead = ops[first - 1] if first > 0 and ops[first - 1][0] == "equal" else None
    start = max(lead[1], lead[2] - context) if lead else ops[first][1]
    parts = [f'<div class="edge">lines 1-{start} of the graph: not shown</div>'] if start > 0 else []
    if lead is not None:
        parts += [_line("ctx", t) for t in old[start:lead[2]]]
    return parts


def _trailing_context(ops, old, last: int, context: int) -> list[str]:
    """After the last change: ``context`` lines, then a note for the lines not shown."""
    end = ops[last][2]
    tail = ops[last + 1] if last + 1 < len(ops) and ops[last + 1][0] == "equal" else None
    parts = []
    if tail is not None:
        end = min(tail[2], tail[1] + context)
        parts += [_line("ctx", t) for t in old[tail[1]:end]]
    if end < len(old):
        parts.append(f'<div class="edge">lines {end + 1}-{len(old)} of the graph: not shown</div>')
    return parts


def _unchanged_run(run: Sequence[str], context: int) -> list[str]:
    """Unchanged lines between two changes: all of them, or ``context`` on each side of a fold."""
    if len(run) <= 2 * context + 1:
        return [_line("ctx", t) for t in run]
    return [*(_line("ctx", t) for t in run[:context]),
            _fold(run[context:-context], f"{len(run) - 2 * context} unchanged lines"),
            *(_line("ctx", t) for t in run[-context:])]


_FOLDED = {"moved": "line(s) of nodes that only moved (same node, another place)",
           "other": "line(s) changed by another rewrite"}


def _change(lines: list[tuple[str, str, bool]], moved: set[str]) -> list[str]:
    """One change's lines: this rewrite's as - / +, runs of moved or other rewrites' lines folded."""
    parts: list[str] = []
    pending: list[str] = []
    pending_kind = ""
    for sign, text, is_mine in [*lines, ("", "", True)]:
        kind = "" if is_mine else ("moved" if text in moved else "other")
        if pending and kind != pending_kind:
            parts.append(_fold(pending, f"{len(pending)} {_FOLDED[pending_kind]}"))
            pending = []
        if kind:
            pending.append(f"{sign} {text}")
            pending_kind = kind
        elif sign:
            parts.append(_line("del" if sign == "-" else "add", text))
    return parts


def _rewrite_sections(report: Report) -> str:
    out = []
    for i, g in enumerate(report.graphs):
        rec = g.record
        if rec.before_nodes is None:
            continue
        for name, ch in rec.changes.items():
            if not (ch["removed"] or ch["added"]):
                continue
            n = rec.matches.get(name, 0)
            where = f" in graph {i}" if len(report.graphs) > 1 else ""
            out.append(f'<h3 id="{_e(name)}-{i}"><code>{_e(name)}</code>{where}: {n} match{"es" if n != 1 else ""}, '
                       f'{len(ch["removed"])} node(s) removed, {len(ch["added"])} added</h3>')
            others = [n for other, c in rec.changes.items() if other != name for n in (*c["removed"], *c["added"])]
            out.append(region_diff(rec.before_nodes, rec.after_nodes, ch["removed"], ch["added"],
                                   others=others))
    if not out:
        return '<p class="muted">No rewrite changed any graph.</p>'
    return "\n".join(out)


def _misses(report: Report) -> str:
    items = []
    seen = set()
    for g in report.graphs:
        for name, misses in g.misses.items():
            if g.matches.get(name):
                continue
            for m in misses:
                key = (name, m.location, m.check)
                if key in seen:
                    continue
                seen.add(key)
                where = f"<code>{_e(short_location(m.location))}</code>: " if m.location else ""
                code = f'<br><code class="muted">{_e(m.code)}</code>' if m.code else ""
                items.append(f"<li><code>{_e(name)}</code>: {where}not rewritten: {_e(m.check)}{code}</li>")
    skipped = list(dict.fromkeys(g.skipped for g in report.graphs if g.skipped))
    notes = "".join(f'<p class="note">Not rewritten: {_e(why)}</p>' for why in skipped)
    if not items:
        return notes + '<p class="muted">None: no rejected candidate was recorded.</p>'
    return notes + '<ul class="items">' + "".join(items) + "</ul>"


def _obstacles(report: Report) -> str:
    out = [f"<h2>Graph breaks: {sum(b.count for b in report.graph_breaks)}</h2>"]
    if report.graph_breaks:
        out.append('<ul class="items">' + "".join(
            f"<li>[{b.count}&times;] {_e(b.reason)}</li>" for b in report.graph_breaks) + "</ul>")
    out.append(f"<h2>Frames that fell back to eager: {len(report.eager_frames)}</h2>")
    if report.eager_frames:
        lis = []
        for f in report.eager_frames:
            hint = f'<br><span class="muted">hint: {_e(f.hint)}</span>' if f.hint else ""
            lis.append(f"<li><code>{_e(f.name)}</code> (<code>{_e(short_location(f.location))}</code>): "
                       f"{_e(f.reason)}{hint}</li>")
        out.append('<ul class="items">' + "".join(lis) + "</ul>")
    out.append(f"<h2>Cudagraph skips: {len(report.cudagraph_skips)}</h2>")
    if report.cudagraph_skips:
        out.append('<ul class="items">' + "".join(f"<li>{_e(s)}</li>" for s in report.cudagraph_skips) + "</ul>")
    else:
        out.append('<p class="muted">None (only reported for compiles with CUDA graphs, e.g. '
                   '<code>--mode reduce-overhead</code>).</p>')
    return "\n".join(out)


def page(report: Report, *, title: str, notes: Sequence[str] = ()) -> str:
    """The whole report as one self-contained HTML document (no scripts, no external files)."""
    total = sum(report.matches.values())
    sub = [f"{len(report.graphs)} graph(s) compiled with <code>backend=\"kda_inductor\"</code>; "
           f"{total} replacement(s)."] + [_e(n) for n in notes]
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        "".join(f'<p class="sub">{s}</p>' for s in sub),
        "<h2>Rewrites</h2>",
        _rewrite_table(report),
        "<h2>What changed</h2>",
        '<p class="muted">Per rewrite, the post-grad graph before (-) and after (+) our pass, around the '
        "region it replaced. Node names are stable: a node left alone has the same name on both sides. "
        "Click a grey bar to unfold the unchanged lines.</p>",
        _rewrite_sections(report),
        "<h2>Not rewritten</h2>",
        _misses(report),
        _obstacles(report),
        "</body></html>",
        "",
    ])
