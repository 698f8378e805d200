"""``gated_norm_merge``: a GDN/KDA layer's spec / non-spec merge + gated RMSNorm -> one
``kda.gated_norm_merge`` launch (no merged buffer).

Finds, anchored at the norm (the gated RMSNorm of any rank and spelling that :mod:`._gated_norm`
reads, norm before gate, silu or sigmoid), what wrote its input ``x`` (through views; the search,
which ``gated_norm_quant`` shares, is :mod:`._merged_norms`):

* **the merge**: ``M = index_put(index_put(empty, [None]*d + [i0], v0), [None]*d + [i1], v1)``
  (``index_copy_`` / ``index_put_`` / ``out[:, idx] = v``; one or two writes, every dim before
  ``d`` of size 1, each ``v`` exactly the rows it writes) into ``torch.empty``, ``torch.zeros``
  or ``torch.full`` (the fill passed as ``pad_value``), the two index tensors distinct graph
  values whose lengths add up to the token count (a partition, as the layer's metadata
  guarantees: the sizes are checked, the values cannot be). Under automatic dynamic shapes the
  lengths and ``T`` are unrelated symbols: only lengths that provably do not add up are
  rejected, and the op compares the sizes at launch (host ints), taking eager's merge-then-norm
  path when they differ;
* **the merge copied into a padded output** (vLLM's ``core_attn_out[:n] = merged.squeeze(0)``,
  ``out[0, :n] = ...``), the norm reading all ``T_pad`` rows: the padding rows keep the buffer's
  fill (``pad_value``), the buffer is read nowhere else;
* **nothing** (the merge-free norm of a 16-bit tensor), subject to the speed rule.

Must not match: a merged buffer (or any intermediate of the norm) read elsewhere, a merge into
other data (a graph input, a computed tensor: uncovered rows would have to keep it), one index
tensor used twice, index lengths that provably do not add up to the tokens, a padded output that
is a graph input, a graph traced with grad enabled (the pass manager); the norms
:mod:`._gated_norm` refuses, with their reasons.

Speed rule (``speed_rule``): on CUDA the merge always (the kernel reads each source once and
writes ``y``; Inductor writes and re-reads the merged buffer); the merge-free norm at a symbolic
row count always (never slower than Inductor's symbolic code, T = 1 ... 16384) and at a static
size up to ``MERGE_FREE_MAX_VALUES``; in context, not where Inductor would fuse the norm's input or
gate (pointwise code) or its output's reduction (a quantization's amax) into its own norm kernel
(Qwen3.5 decode: 1.08x stock's step before that rule); on CPU never. Measured on an H200:
``benchmarks/results/gated_norm_merge.md``, ``gated_norm_symbolic.md``, ``hf_models.md``; the
history: ``docs/speed-rules.md``.

Replacement (:func:`merge_norm`): ``kda::gated_norm_merge`` over the merge's sources (read before
a float32 -> 16-bit rounding where they are one: ``_merged_norms._source_reads``), the index tensors and the
gate where it lies; its docstring and CPU implementation are the computation. Numerics: the op
computes products in the order of the two forms (and ``rsqrt`` or ``1 / sqrt`` as the graph
does): bit-exact on CPU, the reduction order apart on GPU; other product orders within two bf16
ulps.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from kda_inductor.lowerings import gated_norm_merge as _lowering  # noqa: F401  (registers the op)
from kda_inductor.patterns._gated_norm import gate_read
from kda_inductor.patterns._layout import specialize
from kda_inductor.patterns._merged_norms import NormMatch, as_read, gated_norms, norm_arguments, norm_region
from kda_inductor.patterns.base import (
    Match,
    Rewrite,
    alive,
    fused_consumer_reduction,
    inline_producer,
    replace_by_function,
    source_location,
    val,
)

MERGE_FREE_MAX_VALUES = 256 * 32 * 128
"""Largest merge-free norm (rows x D) rewritten on CUDA: 256 tokens of 32 heads x 128. On the
H200 the kernel won or tied up to that size in every run; from 1024 tokens it won or lost by
turns (stock's own timing of this norm is noisy), and it lost at 16384. Never slower means the
threshold sits below every loss (measured: ``benchmarks/results/gated_norm_merge.md``, the
merge-free and ``kda4d`` tables; ``benchmarks/tune_gated_norm_merge.py --merge-free``,
``bench_gated_norm_merge.py --case kda4d``)."""


class GatedNormMerge(Rewrite):
    name = "gated_norm_merge"
    finds = (
        "a GDN/KDA layer's spec / non-spec merge (`index_copy_` into a fresh or padded buffer) and the gated "
        "RMSNorm that reads it; also that norm alone"
    )
    spellings = (
        "a GDN/KDA layer's spec / non-spec merge (`index_copy_` / `index_put_` / `out[:, idx] = v` "
        "into `torch.empty` or `torch.zeros`), also copied into a padded output (vLLM's "
        '`core_attn_out[:n] = merged.squeeze(0)`, `out[0, :n] = ...`), read by a gated RMSNorm of any'
        " rank (`[N, D]`, KDA's `[1, N, H, D]`; norm before gate, silu or sigmoid; "
        'flash-linear-attention and transformers spellings); also that norm with no merge, up to 256 '
        'x 32 x 128 values (static shapes)'
    )
    becomes = '`kda::gated_norm_merge` (one Triton kernel, no merged buffer; eps is an argument)'

    def find(self, graph: fx.Graph) -> list[Match]:
        found = self.analysis(graph, gated_norms)
        self.misses.extend(found.misses)
        return [m for m in found.matches if alive(m)]  # those gated_norm_quant did not take

    def speed_rule(self, match: NormMatch) -> str | None:
        if match.device != "cuda":
            return (f"on {match.device} the fused op's implementation is slower than the code Inductor "
                    "generates for it (measured, see patterns/gated_norm_merge.py)")
        inline = _inline_input(match)
        if inline is not None:
            return inline
        reduced = fused_consumer_reduction(match.norm.y)
        if reduced is not None:
            return (f"the norm's output is reduced again (a {_op_at(reduced)}: an fp8 quantization's amax?), "
                    "which Inductor fuses into its own norm kernel; written out by the fused op it is read twice "
                    "(measured: vLLM's norm + QuantFP8 at T = 16384, 201 vs 156 us, "
                    "benchmarks/results/gated_norm_quant.md)")
        if match.plain:
            rows_d = val(match.norm.x).numel()
            if not isinstance(rows_d, int):
                if match.pad_value is None:  # the merge-free kernel: never slower at a symbolic T (module docstring)
                    return None
                return ("a gated norm of a tensor copied into a padded output, with a symbolic row count (not "
                        "measured against Inductor's symbolic code)")
            if rows_d > MERGE_FREE_MAX_VALUES:
                return f"a merge-free gated norm of {rows_d} values (Inductor's fusion is faster above {MERGE_FREE_MAX_VALUES})"
        return None

    # ------------------------------------------------------------------ replace
    def replace(self, graph: fx.Graph, match: NormMatch) -> None:
        y = match.norm.y
        specialize(match.fixed)
        replace_by_function(graph, merge_norm, (norm_arguments(match), list(val(y).shape)), outputs=[y],
                            before=y, region=norm_region(match), origin=y)


def merge_norm(args: dict, shape: list) -> torch.Tensor:
    """The replacement: the merge (if any) and the gated norm in one op (``kda::gated_norm_merge``,
    whose docstring and CPU implementation are the computation), viewed as the user's output."""
    return torch.ops.kda.gated_norm_merge(**as_read(args)).reshape(shape)


def _inline_input(match: NormMatch) -> str | None:
    """The speed rule in context: why the op would slow the step it sits in, or None. Inductor
    emits the code that computes the norm's input (merge-free) or its gate inside its norm kernel
    when that code is pointwise (:func:`~kda_inductor.patterns.base.inline_producer`); the op
    reads them from memory, so Inductor would write them out first and move that code into the
    kernel that produces them. Measured: Qwen3.5's decode step on the H200, whose norm input was a
    bf16 rounding of a transposed reduction output (the search now reads before it: ``_merged_norms``): that
    rounding fused into the reduction made its kernel 3.7x slower and the step 1.08-1.26x stock's
    (``benchmarks/results/hf_models.md``). A merge's sources are left out: stock writes the merged
    buffer they would be fused into, which the op does not."""
    gate, _ = gate_read(match.norm.z, match.norm.D)
    for x, what in [*[(r, "input") for r in (match.reads if match.plain else [])], (gate, "gate")]:
        p = inline_producer(x)
        if p is not None:
            return (f"the norm's {what} is computed by {_op_at(p)}, which Inductor fuses into its own norm "
                    "kernel; read by the "
                    "fused op it must be written out first, which slows the kernel that computes it (measured in "
                    "context: see patterns/gated_norm_merge.py)")
    return None


def _op_at(n: fx.Node) -> str:
    """``n``'s op and the user's line that made it, for a speed rule's reason."""
    where = source_location(n)[0]
    return f"{getattr(n.target, '__name__', n.target)}{' at ' + where if where else ''}"


