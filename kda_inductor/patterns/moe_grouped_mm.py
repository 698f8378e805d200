"""``moe_grouped_mm``: a MoE layer's grouped GEMM at decode sizes as our weight-streaming kernel.

What it finds (post-grad graph): ``aten._grouped_mm(x, w, offs)`` with ``x [S, K]`` (the (token,
expert) pairs' rows sorted by expert), ``w [E, K, N]`` (the experts' ``[E, N, K]`` weights
transposed is a ``permute`` view) and ``offs [E]`` int32, each expert's end row: what transformers'
``grouped_mm`` experts (``integrations/moe.py``, ``_grouped_linear``: ``F.grouped_mm`` where torch has
it, else ``torch._grouped_mm``; 5.17-5.25, the experts' default on GPUs outside ``generate()``'s
decoding, and what ``benchmarks/hf_models.py``'s steps run) and the ``moe_grouped_experts`` rewrite
(``generate()``'s decoding path) put in the graph. Inductor calls torch's kernel for it (CUTLASS on
sm_90), tiled for large groups: in kda's Qwen3-Next decode-32 step (H100, 19e7fc8, ``hf_models.json``'s
kernel table) its 8 calls took 225.8 of 896 us where the 16 experts' weights read once take ~133.

Spellings: ``torch._grouped_mm(x, w, offs=offs)`` and ``F.grouped_mm(x, w, offs=offs)`` (the same aten op),
``w`` a transposed view or stored ``[E, K, N]`` (transformers' ``is_transposed`` experts). Must not match:
the other operand forms of the op (2-D x 2-D weight gradients, 3-D x 3-D batches: no MoE forward, no miss
a user would look for), a bias or an ``out_dtype`` other than the inputs' (a miss: the kernel adds no bias,
rounds to the inputs' dtype), dtypes other than bf16 / fp16 (a miss), offsets that are not one ``[E]``
int32 tensor (a miss).

Speed rule (``speed_rule``): on CUDA from 1 to 320 pairs (``MEASURED``: up to 32 decode tokens at top-10). In
Qwen3-Next's decode-32 step (320 pairs, 16 experts; H100, torch 2.11, 2026-12-07, tree 1b64ac1,
``hf_models --variant kda,kda@with-moe_grouped_mm``, three compiles each) 860 against kda's 905 us (0.950x).
Alone (``benchmarks/bench_moe_grouped_mm.py``, the same day; ``benchmarks/results/moe_grouped_mm.md``) the op
took 0.44-0.95x torch's time at 10 and 320 pairs with 16 or 512 experts, both projections; at 1,280 pairs
with 16 experts (80 rows a group) the gate-up projection took 1.75x (each block of rows streams the weights
again), and at 40,960 1.1-4.0x: outside the range, torch's. Fewer than 10 pairs run the same one-block-a-group
launch over fewer groups. CPU: forced only (the op is torch's ``_grouped_mm`` there). The history:
``docs/speed-rules.md``.

Replacement: ``kda::moe_grouped_mm(x, w, offs)`` (``lowerings/moe_grouped_mm.py``): on CUDA one program
per expert and block of output columns streams that expert's weights once per block of its rows,
``tl.dot`` in float32, rounded once to the dtype (the sums' order differs from CUTLASS's: within bf16
rounding); rows at or past ``offs[-1]`` unwritten, as torch leaves them. CPU: ``torch._grouped_mm``
itself (bit-exact).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from kda_inductor.lowerings import moe_grouped_mm as lowering  # noqa: F401  (registers kda::moe_grouped_mm)
from kda_inductor.patterns.base import Match, Rewrite, Stage, aten, erase_dead, is_op, moved, replace_by_function, val

MEASURED: dict[str, tuple[int, int]] = {"cuda": (1, 320)}
"""Per device type, the pair counts (lowest, highest) where the op was measured faster than torch's grouped
GEMM in the step it sits in. CUDA (H100, 2026-12-07, tree 1b64ac1): Qwen3-Next decode 32 (320 pairs) 860
against 905 us (0.950x, three compiles each); alone 0.44-0.95x torch's at 10 and 320 pairs (16 / 512 experts),
1.75x at 1,280 pairs over 16 experts (``benchmarks/results/moe_grouped_mm.md``)."""

_GROUPED = getattr(aten, "_grouped_mm", None)  # torch 2.9+; earlier, nothing to find
_HALF = (torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True)
class GroupedMmMatch(Match):
    """One grouped GEMM of a MoE layer's sorted rows: its operands."""

    mm: fx.Node
    x: fx.Node
    w: fx.Node
    offs: fx.Node

    @property
    def anchor(self) -> fx.Node:
        return self.mm


class MoeGroupedMm(Rewrite):
    name = "moe_grouped_mm"
    finds = ("a MoE layer's grouped GEMM (`torch._grouped_mm` / `F.grouped_mm` of the pairs' rows sorted by expert "
             "with the experts' weights and each expert's end row), as transformers' `grouped_mm` experts call it")
    spellings = ("`torch._grouped_mm(x, w, offs=offs)` / `F.grouped_mm(x, w, offs=offs)` of `x [S, K]`, `w [E, K, N]` "
                 "(a transposed view of `[E, N, K]` weights, or stored so), `offs [E]` int32; no bias, the inputs' "
                 "dtype out; bf16 / fp16; forced only (not yet measured)")
    becomes = ("`kda::moe_grouped_mm`: each used expert's weights streamed once per block of its rows, `tl.dot` in "
               "float32 (our Triton kernel); rows past the last offset unwritten, as torch's")

    runs_after = ("moe_grouped_experts",)  # the grouped GEMMs it puts in are this rewrite's to take too

    def speed_rule(self, match: GroupedMmMatch) -> str | None:
        span = MEASURED.get(match.device)
        pairs = val(match.x).shape[0]
        if span is not None and isinstance(pairs, int) and span[0] <= pairs <= span[1]:
            return None
        where = f"{span[0]}-{span[1]} pairs" if span else "no size yet"
        return (f"{pairs} pairs on {match.device}: the op was measured faster than torch's grouped GEMM at {where} "
                "(MEASURED in patterns/moe_grouped_mm.py; benchmarks/bench_moe_grouped_mm.py times it): forced only")

    def find(self, graph: fx.Graph) -> list[Match]:
        if _GROUPED is None:
            return []
        found = []
        for node in graph.nodes:
            if is_op(node, _GROUPED):
                m = self._grouped(node)
                if m is not None:
                    found.append(m)
        return found

    def _grouped(self, mm: fx.Node) -> GroupedMmMatch | None:
        args = dict(zip(("x", "w", "offs", "bias", "out_dtype"), mm.args)) | dict(mm.kwargs)
        if "self" in args:
            args["x"] = args.pop("self")
        if "mat2" in args:
            args["w"] = args.pop("mat2")
        x, w, offs = args.get("x"), args.get("w"), args.get("offs")
        xv, wv, ov = val(x), val(w), val(offs) if isinstance(offs, fx.Node) else None
        if xv is None or wv is None or xv.dim() != 2 or wv.dim() != 3:
            return None  # weight gradients, batched 3-D x 3-D: not a MoE layer's forward
        if ov is None or ov.dim() != 1 or ov.dtype != torch.int32:
            return self.miss(mm, Stage.FORM, "no offsets, or not one [E] int32 tensor of each expert's end row")
        if args.get("bias") is not None or args.get("out_dtype") not in (None, xv.dtype):
            return self.miss(mm, Stage.FORM, "a bias or another output dtype: the kernel adds none and rounds to the "
                             "inputs' dtype")
        if xv.dtype not in _HALF or wv.dtype != xv.dtype:
            return self.miss(mm, Stage.LAYOUT, f"{xv.dtype} rows and {wv.dtype} weights: the kernel takes bf16 / fp16")
        return GroupedMmMatch(nodes=[mm], mm=mm, x=x, w=w, offs=offs)

    def replace(self, graph: fx.Graph, match: GroupedMmMatch) -> dict[fx.Node, fx.Node]:
        new = replace_by_function(graph, streamed, (match.x, match.w, match.offs), outputs=[match.mm],
                                  before=match.mm, origin=match.mm)
        erase_dead(graph, match.nodes)
        return moved([match.mm], new)


def streamed(x, w, offs):
    """``torch._grouped_mm(x, w, offs=offs)`` by our kernel."""
    return torch.ops.kda.moe_grouped_mm(x, w, offs)
