"""The registry: every rewrite, by its stable name, in the order the pass runs them.

``indexer_k_write`` runs before ``indexer_k_gather``: a gather that reads the cache after the
write sees a plain view of the written cache only once the write is replaced. ``gated_norm_quant``
runs before ``gated_norm_merge``: it takes the norms whose output only an fp8 quantization reads.
``causal_conv1d`` touches only convolutions and the values around them, which no other rewrite
reads; it runs before ``gdn_spec_split`` so that the split's speed rule (do a gather's readers
fuse it as an indirect load?) sees the fused conv op that reads a gathered ``mixed_qkv``.
"""

from __future__ import annotations

from kda_inductor.patterns.base import Rewrite
from kda_inductor.patterns.causal_conv1d import CausalConv1d
from kda_inductor.patterns.gated_norm_merge import GatedNormMerge
from kda_inductor.patterns.gated_norm_quant import GatedNormQuant
from kda_inductor.patterns.gdn_spec_split import GdnSpecSplit
from kda_inductor.patterns.indexer_k_gather import IndexerKGather
from kda_inductor.patterns.indexer_k_write import IndexerKWrite

REWRITES: dict[str, type[Rewrite]] = {
    cls.name: cls for cls in (IndexerKWrite, IndexerKGather, CausalConv1d, GdnSpecSplit, GatedNormQuant, GatedNormMerge)
}
REWRITE_NAMES: tuple[str, ...] = tuple(REWRITES)
"""The only list of rewrites: the pass, the options, ``benchmarks/report.py``, ``.ci/gpu``, the
spelling corpus and the README's rewrite table all read it."""


def markdown_table() -> str:
    """The README's rewrite table, one row per registered rewrite (``kda-inductor rewrites``;
    ``tests/test_readme.py`` checks the README holds exactly this)."""
    lines = ["| name | finds | replaces with |", "|---|---|---|"]
    lines += [f"| `{name}` | {cls.finds} | {cls.becomes} |" for name, cls in REWRITES.items()]
    return "\n".join(lines) + "\n"


__all__ = ["REWRITES", "REWRITE_NAMES", "Rewrite", "markdown_table"]
