"""The registry: every rewrite, by its stable name, in the order the pass runs them.

A rewrite that must run before or after another says so itself (``runs_before`` /
``runs_after``, with the reason beside it); ``ordered`` sorts the list below by those, keeping
its order elsewhere. A new rewrite is one more class in the list.
"""

from __future__ import annotations

from kda_inductor.patterns.base import Rewrite, ordered
from kda_inductor.patterns.gated_norm_merge import GatedNormMerge
from kda_inductor.patterns.gated_norm_quant import GatedNormQuant
from kda_inductor.patterns.gdn_spec_split import GdnSpecSplit
from kda_inductor.patterns.indexer_k_gather import IndexerKGather
from kda_inductor.patterns.indexer_k_write import IndexerKWrite

REWRITES: dict[str, type[Rewrite]] = ordered((IndexerKWrite, IndexerKGather, GdnSpecSplit, GatedNormQuant, GatedNormMerge))
REWRITE_NAMES: tuple[str, ...] = tuple(REWRITES)
"""The only list of rewrites: the pass, the options, ``benchmarks/report.py``, ``.ci/gpu``, the
spelling corpus and the README's rewrite table all read it."""


def markdown_table() -> str:
    """The README's rewrite table, one row per registered rewrite (``kda-inductor rewrites``;
    ``tests/test_readme.py`` checks the README holds exactly this)."""
    lines = ["| name | finds | replaces with |", "|---|---|---|"]
    lines += [f"| `{name}` | {cls.finds} | {cls.becomes} |" for name, cls in REWRITES.items()]
    return "\n".join(lines) + "\n"


__all__ = ["REWRITES", "REWRITE_NAMES", "Rewrite", "markdown_table", "ordered"]
