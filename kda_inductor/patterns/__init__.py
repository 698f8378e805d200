"""The registry: every rewrite, by its stable name, in the order the pass runs them.

A rewrite that must run before or after another says so itself (``runs_before`` /
``runs_after``, with the reason beside it); ``ordered`` sorts the list below by those, keeping
its order elsewhere. A new rewrite is one more class in the list.
"""

from __future__ import annotations

from kda_inductor.patterns.base import Rewrite, ordered
from kda_inductor.patterns.causal_conv1d import CausalConv1d
from kda_inductor.patterns.gated_norm_merge import GatedNormMerge
from kda_inductor.patterns.gated_norm_quant import GatedNormQuant
from kda_inductor.patterns.gdn_recurrent_step import GdnRecurrentStep
from kda_inductor.patterns.gdn_recurrent_step_write_back import GdnRecurrentStepWriteBack
from kda_inductor.patterns.gdn_spec_split import GdnSpecSplit
from kda_inductor.patterns.gqa_decode_attention import GqaDecodeAttention
from kda_inductor.patterns.indexer_k_gather import IndexerKGather
from kda_inductor.patterns.indexer_k_write import IndexerKWrite
from kda_inductor.patterns.mla_decode_absorb import MlaDecodeAbsorb
from kda_inductor.patterns.moe_grouped_experts import MoeGroupedExperts
from kda_inductor.patterns.moe_grouped_mm import MoeGroupedMm
from kda_inductor.patterns.moe_routing import MoeRouting

REWRITES: dict[str, type[Rewrite]] = ordered(
    (IndexerKWrite, IndexerKGather, CausalConv1d, GdnRecurrentStep, MoeGroupedExperts, MoeGroupedMm, MoeRouting,
     GdnSpecSplit, GatedNormQuant, GatedNormMerge, GqaDecodeAttention, MlaDecodeAbsorb))
REWRITE_NAMES: tuple[str, ...] = tuple(REWRITES)
"""The only list of rewrites: the pass, the options, ``benchmarks/report.py``, ``.ci/gpu``, the
spelling corpus, the README's rewrite table and ``docs/rewrites.md`` all read it."""

STAGES: dict[str, tuple[type[Rewrite], ...]] = {"gdn_recurrent_step": (GdnRecurrentStepWriteBack,)}
"""A registered rewrite's later stages: rewrites of their own (``find`` / ``replace``) with no name
of their own, which the pass manager runs right after it on each graph, their matches, parts and
misses counted under its name. So ``disable`` of that name turns them off too, and the reports,
the options and ``.ci/gpu`` know only the names above. ``gdn_recurrent_step``'s write-back puts
a functional step (the fla rule's, or one the first stage left functional) in place on its cache."""


def markdown_table() -> str:
    """The README's rewrite table, one row per registered rewrite (``kda-inductor rewrites --markdown``;
    ``tests/test_readme.py`` checks the README holds exactly this); each name links to its
    section of ``docs/rewrites.md``."""
    lines = ["| name | finds | replaces with |", "|---|---|---|"]
    lines += [f"| [`{name}`](docs/rewrites.md#{name}) | {cls.finds} | {cls.becomes} |" for name, cls in REWRITES.items()]
    return "\n".join(lines) + "\n"


def rewrites_page() -> str:
    """``docs/rewrites.md``: every registered rewrite in the order the pass runs them, with what
    it finds, every spelling it reads, what it becomes, its place in the order (declared by it
    or by the other) and its pattern file (``python -m kda_inductor.cli update-docs`` writes it;
    ``tests/test_readme.py`` checks it)."""
    out = ["# The rewrites", "",
           "<!-- generated from the registry: python -m kda_inductor.cli update-docs (tests/test_readme.py checks it) -->",
           "", "In the order the pass runs them. Each pattern file's docstring holds the rest: the canonical form it",
           "reads, what must not match, and its speed rule with a one-line summary of its measurement",
           "([speed-rules.md](speed-rules.md) holds the measurements and their history).", ""]
    for name, cls in REWRITES.items():
        path = f"kda_inductor/patterns/{cls.__module__.rsplit('.', 1)[-1]}.py"
        out += [f"## `{name}`", "", f"**Finds:** {cls.finds}.", ""]
        out += [f"**Spellings:** {cls.spellings}.", ""] if cls.spellings else []
        out += [f"**Replaces with:** {cls.becomes}.", ""]
        out += [f"**Order:** {_order_of(name)}.", ""] if _order_of(name) else []
        out += [f"Pattern: [`{path}`](../{path}).", ""]
    return "\n".join(out)


def _order_of(name: str) -> str:
    """``"runs before `b`; runs after `a`"``: what ``name`` declares and what others declare of it."""
    before = [*REWRITES[name].runs_before, *(n for n, c in REWRITES.items() if name in c.runs_after)]
    after = [*REWRITES[name].runs_after, *(n for n, c in REWRITES.items() if name in c.runs_before)]
    parts = [f"{word} {', '.join(f'`{n}`' for n in names)}" for word, names in
             (("runs before", before), ("runs after", after)) if names]
    return "; ".join(parts)


__all__ = ["REWRITES", "REWRITE_NAMES", "STAGES", "Rewrite", "markdown_table", "ordered", "rewrites_page"]
