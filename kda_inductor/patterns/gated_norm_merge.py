"""``gated_norm_merge``: a GDN/KDA layer's spec / non-spec merge + gated RMSNorm -> one
``kda.gated_norm_merge`` launch (no merged buffer).

What it finds, in canonical terms (:mod:`.canonical`), anchored at the norm:

* **the gated RMSNorm** of ``x`` over its last dim ``D``, ``x`` of any rank (``[N, D]``,
  KDA's ``[N, H, D]`` or ``[1, N, H, D]``, or a view of them), norm before gate::

      fla (flash-linear-attention, vLLM): y = (x * r * w * act(z)).to(dtype)
      hf  (transformers):                 y = ((w * (x * r).to(dtype)) * act(z)).to(dtype)
      x = X.float(), r = rsqrt(mean(x^2, -1) + eps) or 1 / sqrt(...) (also x / sqrt(...)),
      act = silu (any spelling) or sigmoid, z any tensor of x's numel and last dim D, w [D]

  products in any order; ``eps`` read from the graph (a constant, or a graph input under
  ``dynamic=True``) and passed to the op, never baked into a kernel;
* what wrote ``x`` (through views):

  - **the merge**: ``M = index_put(index_put(empty, [None]*d + [i0], v0), [None]*d + [i1], v1)``
    (``index_copy_`` / ``index_put_`` / ``out[:, idx] = v``; one or two writes, every dim
    before ``d`` of size 1, each ``v`` exactly the rows it writes) into ``torch.empty``,
    ``torch.zeros`` or ``torch.full`` (the fill passed as ``pad_value``), the two index
    tensors distinct graph values whose lengths add up to the token count (a partition, as
    the layer's metadata guarantees: the sizes are checked, the values cannot be). Under automatic dynamic shapes the lengths and ``T`` are unrelated symbols:
    then only lengths that provably do not add up are rejected and the op compares the sizes
    at launch (host ints, no sync), taking eager's merge-then-norm path when they differ;
  - **the merge copied into a padded output**: vLLM's ``core_attn_out = torch.zeros(T_pad,
    H, D)``, ``core_attn_out[:n] = merged.squeeze(0)`` (or ``out[0, :n] = ...`` into
    ``[1, T_pad, H, D]``), the norm then reading all ``T_pad`` rows: the padding rows keep the
    buffer's fill value (``pad_value``; any value for ``torch.empty``), the buffer is read
    nowhere else;
  - **nothing** (the merge-free norm of a 16-bit tensor), subject to the speed rule;
* the gate: read where it lies when the user's ``reshape`` copied it from a strided tensor
  (a split of the projection: a contiguous ``clone`` then views), that tensor viewed
  ``[A, B, D]``; stock Inductor fuses that copy into its norm, the op would otherwise need
  it written out (measured: ``benchmarks/results/profile_step.md``, the 16K-token prefill).

Must not match: ``norm_before_gate=False`` (the gate inside the mean), a norm without a gate,
another activation, a norm over a group of a head (the reduced dim is not the weight's), a
merged buffer (or any intermediate of the norm) read elsewhere, a merge into other data (a
graph input, a computed tensor: uncovered rows would have to keep it), one index tensor used
twice, index lengths that provably do not add up to the tokens (also into ``torch.zeros``:
the uncovered rows would be normed), a padded output that is a graph input (its merged rows
must be stored), a graph traced with grad enabled (the pass manager). Each gated norm a user
would recognize and the op does not compute gets a miss naming what differs
(``_why_not_a_gated_norm``): the gate before the norm, another activation, and, where only
precision differs, a 16-bit gate activation (``F.silu(z)`` of a bf16 ``z``: eager rounds the
gate to bf16, the op keeps it in float32: outputs a bf16 ulp apart, so not rewritten), a gate
multiplied in 16 bits, a norm with no float32 upcast, and ``nn.RMSNorm``'s rounding after its
weight. Only the norm's own factors are read for that: the gate before the norm where the
normalized tensor is itself a product with an activation, the gate after it among the factors of
the norm's product chain. A plain RMSNorm whose input holds gated values from further up (a
SwiGLU MLP's ``silu(g) * u``, a sigmoid-gated shared expert, through their matmuls and the
residual add: the input norm of every layer of a model) is no candidate and gets no miss.

Speed rule (``speed_rule``; measured on an H200: ``benchmarks/results/gated_norm_merge.md``
for the merge, vLLM's padded output and KDA's 4-D norm,
``benchmarks/results/gated_norm_symbolic.md`` for the merge-free norm at a symbolic row count):

* CUDA, merge (into a fresh buffer or a padded output): always; the fused kernel reads each
  source once and writes ``y``, where Inductor writes and re-reads the merged buffer;
* CUDA, merge-free, symbolic row count (how vLLM compiles ``RMSNormGated.forward_native``:
  one graph for every token count): always. The merge-free kernel (``norm_rows_triton``) was
  measured against the code Inductor emits for the same graph with ``T`` dynamic, vLLM's
  spelling, T = 1 ... 16384 and 16 / 32 / 64 heads of 128
  (``benchmarks/bench_gated_norm_symbolic.py``): never slower beyond the timing noise of a
  launch, and far faster where Inductor's symbolic code runs far from the floor;
* CUDA, merge-free with static sizes (also a tensor copied into a padded output):
  ``rows * D <= MERGE_FREE_MAX_VALUES``; Inductor's code for a static size reaches the floor at
  the largest sizes, and the threshold sits below every loss measured. A tensor copied into a
  padded output with a symbolic row count is left to Inductor (not measured);
* CPU: never. The op's CPU implementation is eager's ops, several times slower than the C++
  Inductor generates for the same graph, with or without the merge (measured on the
  project's 2-core CPU machine; not recorded in ``benchmarks/results/``).

In context (the step the norm sits in; issue 28): the rules above were measured on the norm
alone, which cannot see what taking the norm out of Inductor's graph does to the kernels around
it. transformers' Qwen3.5 decode (H200, 32 sequences) ran at 1.08x stock's step with this
rewrite and at stock's without it: the rewrite's kernel was as fast as Inductor's norm, but the
norm's input, a bf16 rounding of the recurrent core's transposed float32 output, was then
fused into the reduction that computes it as an epilogue, and that kernel lost its tiled loop
(59 -> 221 us a call; ``benchmarks/hf_profile.py --code-dir`` shows both). Two rules follow:

* the op reads such an input before its rounding (``source_reads``: float32 values rounded in
  registers, the same bytes), so no code of the norm's is left to fuse into the producer;
* on CUDA, a merge-free norm whose input, or any norm whose gate, is still computed by pointwise
  code (``base.inline_producer``: code Inductor emits inside its own norm kernel) stays with
  Inductor: read by the op, that code would be written out and moved into another kernel. A
  merge's sources are exempt: stock writes the merged buffer they are fused into, the op does not;
* on CUDA, a norm whose output is reduced again (``base.fused_consumer_reduction``: an fp8
  quantization's amax, vLLM's ``QuantFP8`` after the norm where ``gated_norm_quant`` does not
  fire) stays with Inductor, which fuses that reduction into its norm kernel: norm op + Inductor's
  quantization took 201 us at T = 16384 (H200, T symbolic), stock's one kernel 156 us
  (``benchmarks/results/gated_norm_quant.md``, the "kda default" column).

Whole-step A/B on transformers' families (kda against kda-no-gated_norm_merge, decode 32 / 128
and prefill 4096): ``benchmarks/results/hf_models.md``; on the hybrid example's spec step:
``benchmarks/results/profile_step.md`` (``--without-each``).

Numerics: the op computes products in the order written above (and ``rsqrt`` or
``1 / sqrt`` as the graph does), so those spellings are bit-exact on CPU and differ from
eager only by the reduction order on GPU; other product orders are within two bf16 ulps.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from kda_inductor.lowerings import gated_norm_merge as _lowering  # noqa: F401  (registers the op)
from kda_inductor.patterns._layout import free_symbols, input_sizes, marked_dynamic, specialize, static_size
from kda_inductor.patterns.base import (
    Match,
    Miss,
    Rewrite,
    Stage,
    VIEWS,
    alive,
    aten,
    fused_consumer_reduction,
    in_graph_order,
    inline_producer,
    is_op,
    live_users,
    mutated_nodes,
    prims,
    replace_by_function,
    source_location,
    val,
)
from kda_inductor.patterns.canonical import Canon, Term, const_value

_F32 = torch.float32
_16BIT = (torch.bfloat16, torch.float16)
MERGE_FREE_MAX_VALUES = 256 * 32 * 128
"""Largest merge-free norm (rows x D) rewritten on CUDA: 256 tokens of 32 heads x 128. On the
H200 the kernel won or tied up to that size in every run; from 1024 tokens it won or lost by
turns (stock's own timing of this norm is noisy), and it lost at 16384. Never slower means the
threshold sits below every loss (measured: ``benchmarks/results/gated_norm_merge.md``, the
merge-free and ``kda4d`` tables; ``benchmarks/tune_gated_norm_merge.py --merge-free``,
``bench_gated_norm_merge.py --case kda4d``)."""


def _same_or_symbolic(a, b) -> bool:
    """Sizes that index_put_ requires equal: proven equal, or both symbolic (Dynamo
    specializes sizes 0 and 1, so a symbolic size is never a broadcast 1; some torch
    versions keep the values' and the index's token counts as separate symbols)."""
    return statically_known_true(a == b) or (isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt))


@dataclasses.dataclass
class Norm:
    """A gated RMSNorm found in the graph: ``y = norm(x) * act(z)``."""

    y: fx.Node
    x: fx.Node  # the normalized tensor (before its cast to float32)
    z: fx.Node  # the gate, as the user viewed it (before its cast to float32)
    weight: fx.Node
    eps: Any  # float, or the graph input that holds it
    act: str
    form: str
    rsqrt: bool
    out_dtype: torch.dtype
    D: int
    nodes: set[fx.Node]
    fixed: dict = dataclasses.field(default_factory=dict)  # D's size if symbolic: specialized on replacing


@dataclasses.dataclass
class Write:
    index: fx.Node
    values: fx.Node
    dim: int


@dataclasses.dataclass
class NormMatch(Match):
    """A gated RMSNorm and, unless merge-free, the merge that wrote its input."""

    norm: Norm
    writes: list[Write]
    num_tokens: Any  # merged tokens: an int, or the SymInt node that sized the torch.empty
    width: int  # values per token (R norm rows of D)
    pad_value: float | None = None  # the merged buffer's fill (rows no source writes; padding tokens)
    plain: bool = False  # the merge-free norm
    source: fx.Node | None = None  # merge-free: the tensor copied into a padded output
    reads: list[fx.Node] = dataclasses.field(default_factory=list)  # what the op reads its sources from
    in_dtype: torch.dtype | None = None  # the dtype it rounds them to first (None: read as they are)
    absorbed: list[fx.Node] = dataclasses.field(default_factory=list)  # the roundings it reads before
    fixed: dict = dataclasses.field(default_factory=dict)  # D's and width's sizes, specialized on replacing

    @property
    def anchor(self) -> fx.Node:
        return self.norm.y

    @property
    def part(self) -> Literal["merge + norm", "norm alone"]:
        """The norm alone where no merge wrote its input (or a gather did: ``cat`` + ``argsort``)."""
        return "norm alone" if self.plain else "merge + norm"


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

    def search(self, graph: fx.Graph) -> list[NormMatch]:
        """Every gated norm in ``graph`` this matcher reads (the ``gated_norms`` analysis)."""
        canon = Canon()
        matches: list[Match] = []
        taken: set[fx.Node] = set()
        for norm in self._norms(graph, canon):
            if norm.y in taken:
                continue
            m = self._match(norm, canon)
            if m is not None and not taken & set(m.nodes):
                m.reads, m.in_dtype, m.absorbed = source_reads(m)
                matches.append(m)
                taken |= set(m.nodes)
        return matches

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

    # ------------------------------------------------------------------ the norm
    def _norms(self, graph: fx.Graph, canon: Canon):
        """Every gated RMSNorm: anchored at each ``rsqrt`` / ``1 / sqrt`` of a mean of squares,
        grown through the elementwise nodes that use it to the outermost that reads as a norm."""
        for n in graph.nodes:
            if not is_op(n, aten.rsqrt, aten.reciprocal, aten.sqrt, aten.pow):
                continue
            found, users, self._unspecialized = None, _elementwise_users(n), None
            for y in users:
                got = self._read_norm(canon, y)
                if got is not None:
                    found = got
            if found is not None:
                yield found
            elif users and is_op(n, aten.rsqrt, aten.reciprocal):
                why = self._unspecialized or _why_not_a_gated_norm([canon(u) for u in users], canon(n))
                if why is not None:
                    self.miss(n, Stage.FORM, why)

    def _read_norm(self, canon: Canon, y: fx.Node) -> Norm | None:
        t = canon(y)
        out_dtype = _F32
        if t.op == "cast":
            out_dtype, t = t.attr("dtype"), t.args[0]
        if t.op != "mul" or t.attr("dtype") != _F32:
            return None
        factors = _expand_div(list(t.args))
        acts = [f for f in factors if isinstance(f, Term) and f.op in ("silu", "sigmoid")]
        if len(acts) != 1:
            return None
        act = acts[0]
        factors.remove(act)
        gate = act.args[0]
        z = gate.args[0] if gate.op == "cast" and gate.attr("dtype") == _F32 else gate
        if not isinstance(z, Term) or z.node is None or val(z.node).dtype not in (*_16BIT, _F32):
            return None
        for rstd, x32, eps, rsqrt in _rstds(_subterms(factors)):
            got = self._fla(factors, rstd, x32) or self._hf(factors, rstd, x32)
            if got is None:
                continue
            form, weight = got
            x = x32.args[0] if x32.op == "cast" else x32
            if x.node is None or val(x.node).dtype not in (*_16BIT, _F32) or (x32.op == "cast") == (val(x.node).dtype == _F32):
                continue
            xv, zv, wv = val(x.node), val(z.node), val(weight)
            D, fixed = _static(y.graph, xv.shape[-1])  # dynamic=True: D symbolic, specialized on replacing
            if not (wv.dim() == 1 and statically_known_true(wv.shape[0] == xv.shape[-1])
                    and statically_known_true(zv.shape[-1] == xv.shape[-1])
                    and statically_known_true(zv.numel() == xv.numel())):
                continue
            if not isinstance(D, int):  # a gated norm, but its D cannot be specialized: say so (_norms)
                self._unspecialized = _UNSPECIALIZED.format(marked_dynamic(input_sizes(y.graph, free_symbols(D)))
                                                            or f"D = {D}")
                continue
            nodes = canon.region(canon(y), stop=lambda s: s is x or s is z)
            return Norm(y, x.node, z.node, weight, eps, act.op, form, rsqrt, out_dtype, D, nodes, fixed)
        return None

    @staticmethod
    def _fla(factors: list, rstd: Term, x32: Term):
        """``{x32, rstd, w}``: the weight applied in float32."""
        rest = list(factors)
        if x32 in rest and rstd in rest:
            rest.remove(x32)
            rest.remove(rstd)
            w = _weight(rest)
            if w is not None:
                return "fla", w
        return None

    @staticmethod
    def _hf(factors: list, rstd: Term, x32: Term):
        """``{w, (x32 * rstd).to(dtype)}`` (float32 weight), or ``{(w * n).float()}`` with a
        16-bit product (16-bit weight)."""
        body = list(factors)
        if len(body) == 1:  # a 16-bit product, promoted to float32 by the next product (or cast)
            prod = body[0].args[0] if body[0].op == "cast" and body[0].attr("dtype") == _F32 else body[0]
            if prod.op == "mul" and prod.attr("dtype") in _16BIT:
                body = list(prod.args)
        for n in body:
            inner = n.args[0] if n.op == "cast" and n.attr("dtype") == _F32 else n
            if not (inner.op == "cast" and inner.attr("dtype") in _16BIT and inner.args[0].op == "mul"):
                continue
            prod = list(inner.args[0].args)
            if _same_terms(prod, [x32, rstd]):
                rest = list(body)
                rest.remove(n)
                w = _weight(rest)
                if w is not None:
                    return "hf", w
        return None

    # ------------------------------------------------------------------ what wrote x
    def _match(self, norm: Norm, canon: Canon) -> NormMatch | None:
        x, views = _source(canon, norm.x)
        if is_op(x, aten.index_put):
            return self._merge_match(norm, x, views, pad=None)
        scatter = _padded_write(x)
        if scatter is None:
            return self._plain_match(norm, views)
        base, src, end, fill, folded = scatter
        if fill is None:
            return self.miss(x, Stage.LAYOUT, "the padded output is a graph input or other data, not torch.zeros / torch.full / "
                                   "torch.empty: its rows must be stored")
        if len(live_users(x)) != 1 or any(u not in folded for u in live_users(base)):
            return self.miss(x, Stage.LAYOUT, "the padded output is read elsewhere")
        merge, chain = _source(canon, src)
        if is_op(merge, aten.index_put):
            return self._merge_match(norm, merge, [*views, *chain], pad=(fill, end, base), extra=[*folded, base])
        # a tensor copied into the padded output (vLLM Kimi: core_attn_out[0, :n] = o[0, :n]): no merge
        return self._plain_match(norm, [*views, *chain, *folded, base], copied=(src, fill))

    def _merge_match(self, norm: Norm, last: fx.Node, views: list[fx.Node], pad, extra=()) -> NormMatch | None:
        merge = self._merge(last)
        if merge is None:
            return None
        writes, T, chain, pad_value = merge
        if any(len(live_users(v)) != 1 for v in views if v is not norm.x) or len(live_users(last)) != 1:
            return self.miss(last, Stage.LAYOUT, "the merged buffer is read elsewhere")
        per_token_size = math.prod(val(last).shape[writes[0].dim + 1:])
        per_token, fixed = _static(last.graph, per_token_size, norm.fixed)
        if not (isinstance(per_token, int) and per_token % norm.D == 0):
            return self.miss(last, Stage.LAYOUT, "norm rows straddle tokens")
        if pad is not None:
            fill, end, base = pad
            end = val(end) if isinstance(end, fx.Node) else end
            if not statically_known_true(end == val(last).shape[writes[0].dim]):
                return self.miss(last, Stage.LAYOUT, "the merge is copied into part of the padded output other than its first rows")
            if (not statically_known_true(math.prod(val(base).shape) % per_token_size == 0)
                    or not statically_known_true(val(base).shape[-1] == val(last).shape[-1])):
                return self.miss(last, Stage.LAYOUT, "the padded output's rows are not the merge's tokens")
            pad_value = fill  # torch.empty's uncovered merged rows are undefined: the padding's fill will do
        region = norm.nodes | {norm.x, *views, *chain, *extra}
        if not self.region_closed(region, [norm.y], at=last, what="an intermediate of the norm"):
            return None
        return NormMatch(nodes=in_graph_order(region | {norm.y}), norm=norm, writes=writes, num_tokens=T,
                         width=per_token, pad_value=pad_value, fixed=fixed)

    def _merge(self, last: fx.Node):
        """The index_put chain into a fresh buffer (``torch.empty`` / ``zeros`` / ``full``)
        ending at ``last`` -> ``(writes, T, nodes, fill)``, or None with a miss."""
        writes = self._writes(last)
        if writes is None:
            return None
        chain = _index_put_chain(last)
        base = chain[-1]
        fill = _fill(base)
        if fill is _NO_FILL or len(live_users(base)) != 1:
            return self.miss(last, Stage.FORM, "the merge does not start from torch.empty / torch.zeros / torch.full "
                                      "(rows no index covers would have to keep their data)")
        if not self._token_rows(last, writes):
            return None
        T = self._partition(last, writes, base)
        if T is None or not self._values_fit(last, writes):
            return None
        return writes, T, chain, fill

    def _writes(self, last: fx.Node) -> list[Write] | None:
        """The row writes of the index_put chain ending at ``last``, first write first: one
        index tensor each, no accumulation, no partial merge read elsewhere."""
        writes, n = [], last
        while is_op(n, aten.index_put):
            base, indices, values = n.args[:3]
            accumulate = n.args[3] if len(n.args) > 3 else n.kwargs.get("accumulate", False)
            tensors = [(d, i) for d, i in enumerate(indices) if i is not None]
            if accumulate or len(tensors) != 1:
                return self.miss(n, Stage.FORM, "not a row write (accumulate, or several index tensors)")
            d, idx = tensors[0]
            writes.append(Write(idx, values, d))
            if n is not last and len(live_users(n)) != 1:
                return self.miss(n, Stage.FORM, "a partial merge is read elsewhere")
            n = base
        writes.reverse()
        return writes

    def _token_rows(self, last: fx.Node, writes: list[Write]) -> bool:
        """The layout: one or two writes along one dim, every dim before it of size 1 (token rows)."""
        if len(writes) > 2 or len({w.dim for w in writes}) != 1:
            self.miss(last, Stage.FORM, "more than two writes, or writes along different dims")
            return False
        d, mv = writes[0].dim, val(last)
        if any(s != 1 for s in mv.shape[:d]):
            self.miss(last, Stage.FORM, f"writes along dim {d} of {tuple(mv.shape)}: not token rows")
            return False
        return True

    def _partition(self, last: fx.Node, writes: list[Write], base: fx.Node) -> Any:
        """The merged token count ``T`` (an int, or the node that sized the buffer where it is
        symbolic), where the index tensors may partition the tokens: distinct graph values
        whose lengths do not provably miss ``T`` (the values cannot be checked); else None."""
        d = writes[0].dim
        T = val(last).shape[d]
        if len({w.index for w in writes}) != len(writes):
            return self.miss(last, Stage.FORM, "the same index tensor written twice: not a partition")
        lengths = [val(w.index).shape[0] for w in writes]
        if statically_known_true(sum(lengths) != T):
            return self.miss(last, Stage.FORM, f"index lengths {lengths} do not add up to the {T} tokens: not a partition")
        if not isinstance(T, int):  # symbolic: the empty's size (serving recompiles with T dynamic)
            T = base.args[0][d] if isinstance(base.args[0], (list, tuple)) else None
            if not isinstance(T, fx.Node):
                return self.miss(last, Stage.FORM, "the token count is symbolic but not a size of the torch.empty")
        return T

    def _values_fit(self, last: fx.Node, writes: list[Write]) -> bool:
        """Each write's values are exactly the rows it writes (``[1, ..., n, *rest]``, leading
        1s optional: ``out[:, idx] = v``), of the buffer's dtype: no broadcast."""
        mv = val(last)
        rest = list(mv.shape[writes[0].dim + 1:])
        for w in writes:
            vv = val(w.values)
            full = [val(w.index).shape[0]] + rest
            shape = list(vv.shape)
            while len(shape) > len(full) and shape[0] == 1:
                shape.pop(0)
            if len(shape) != len(full) or not all(map(_same_or_symbolic, shape, full)) or vv.dtype != mv.dtype:
                self.miss(last, Stage.FORM, "written values are broadcast or of another dtype")
                return False
        return True

    def _plain_match(self, norm: Norm, views: list[fx.Node], copied=None) -> NormMatch | None:
        """The norm of a tensor no merge wrote; ``copied``: ``(src, fill)`` when it is ``src``
        copied into the first rows of a padded ``torch.zeros`` / ``full`` output."""
        xv = val(norm.x)
        if xv.dtype not in _16BIT:  # not what the merge-free kernel was measured on
            return self.miss(norm.y, Stage.LAYOUT, f"the normalized tensor is {_name(xv.dtype)} and no merge wrote "
                             "it: the merge-free op takes bf16 / fp16 tensors (a float32 norm alone was not measured)")
        region = norm.nodes | ({norm.x, *views} if copied else set())
        if not self.region_closed(region, [norm.y], at=norm.y, what="an intermediate of the norm"):
            return None
        if copied is None:
            rows = xv.numel() // norm.D
            R = math.gcd(rows, 32) if isinstance(rows, int) else 1  # norm rows per "token": any split in order
            return NormMatch(nodes=in_graph_order(region | {norm.y}), norm=norm, writes=[],
                             num_tokens=rows // R if isinstance(rows, int) else None, width=R * norm.D, plain=True,
                             fixed=norm.fixed)
        src, fill = copied
        sv = val(src)
        lead = next((i for i, s_ in enumerate(sv.shape) if s_ != 1), sv.dim() - 1)
        width, fixed = _static(norm.y.graph, math.prod(sv.shape[lead + 1:]), norm.fixed)
        if not (isinstance(width, int) and width % norm.D == 0):
            return self.miss(norm.y, Stage.LAYOUT, "the copied rows straddle norm rows")
        return NormMatch(nodes=in_graph_order(region | {norm.y}), norm=norm, writes=[], num_tokens=sv.shape[lead],
                         width=width, plain=True, pad_value=fill, source=src, fixed=fixed)

    # ------------------------------------------------------------------ replace
    def replace(self, graph: fx.Graph, match: NormMatch) -> None:
        y = match.norm.y
        replace_by_function(graph, merge_norm, (norm_arguments(match), list(val(y).shape)), outputs=[y],
                            before=y, region=norm_region(match), origin=y)


def merge_norm(args: dict, shape: list) -> torch.Tensor:
    """The replacement: the merge (if any) and the gated norm in one op (``kda::gated_norm_merge``,
    whose docstring and CPU implementation are the computation), viewed as the user's output."""
    return torch.ops.kda.gated_norm_merge(**as_read(args)).reshape(shape)


@dataclasses.dataclass(frozen=True)
class NormSearch:
    """The ``gated_norms`` analysis: every gated norm ``GatedNormMerge``'s matcher finds in a
    graph, and its misses (``gated_norm_merge`` reports them)."""

    matches: list[NormMatch]
    misses: list[Miss]


def gated_norms(graph: fx.Graph) -> NormSearch:
    """The norm search, run once per graph: ``gated_norm_quant`` and ``gated_norm_merge`` read
    it through ``Rewrite.analysis(graph, gated_norms)``."""
    matcher = GatedNormMerge()
    return NormSearch(matcher.search(graph), matcher.misses)


def norm_arguments(match: NormMatch) -> dict:
    """``kda::gated_norm_merge``'s arguments for ``match`` by the op's names (``kda::gated_norm_quant``
    takes them too, ``out_dtype`` as its ``norm_dtype``): graph nodes and constants, with how the
    op reads them (:func:`as_read`: ``width``, each source's row width; ``gate_shape``, the gate's
    view, None: as it lies; ``num_tokens`` None: the merge-free norm's row count). Specializes the
    sizes the match read static (``_layout.specialize``): call it only to replace."""
    m, n = match, match.norm
    specialize(m.fixed)
    z, gate_shape = _gate_view(n.z, n.D)
    eps, eps_input = (0.0, n.eps[1]) if isinstance(n.eps, tuple) else (n.eps, None)
    tokens = None if m.plain and not isinstance(m.num_tokens, int) else m.num_tokens
    return dict(sources=m.reads, indices=[w.index for w in m.writes], z=z, weight=n.weight, eps=eps,
                activation=n.act, form=n.form, rsqrt=n.rsqrt, num_tokens=tokens, out_dtype=n.out_dtype,
                pad_value=m.pad_value, eps_input=eps_input, in_dtype=m.in_dtype, width=m.width, gate_shape=gate_shape)


def as_read(args: dict) -> dict:
    """:func:`norm_arguments` as the op takes them: each source as rows of ``width`` values, the
    gate viewed ``gate_shape``, the merge-free count that of the rows."""
    args = dict(args)
    width, gate_shape = args.pop("width"), args.pop("gate_shape")
    args["sources"] = [s.reshape(-1, width) for s in args["sources"]]
    args["z"] = args["z"] if gate_shape is None else args["z"].reshape(gate_shape)
    if args["num_tokens"] is None:
        args["num_tokens"] = args["sources"][0].shape[0]
    return args


def norm_region(match: NormMatch) -> list[fx.Node]:
    """What replacing ``match`` leaves dead: its nodes, the user's copy of the gate (and its views)
    where the op reads the gate where it lies, the roundings the op reads before
    (:func:`source_reads`); erased where dead."""
    return [*match.nodes, *_copy_chain(match.norm.z), *match.absorbed]


def _inline_input(match: NormMatch) -> str | None:
    """The speed rule in context: why the op would slow the step it sits in, or None. Inductor
    emits the code that computes the norm's input (merge-free) or its gate inside its norm kernel
    when that code is pointwise (:func:`~kda_inductor.patterns.base.inline_producer`); the op
    reads them from memory, so Inductor would write them out first and move that code into the
    kernel that produces them. Measured: Qwen3.5's decode step on the H200, whose norm input was a
    bf16 rounding of a transposed reduction output (``source_reads`` now reads before it): that
    rounding fused into the reduction made its kernel 3.7x slower and the step 1.08-1.26x stock's
    (``benchmarks/results/hf_models.md``). A merge's sources are left out: stock writes the merged
    buffer they would be fused into, which the op does not."""
    gate, _ = _gate_read(match.norm.z, match.norm.D)
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


def source_reads(match: NormMatch) -> tuple[list[fx.Node], torch.dtype | None, list[fx.Node]]:
    """The nodes the op reads its sources from, the 16-bit dtype it rounds them to first (None:
    they are read as they are) and the nodes of those roundings (dead once replaced). Where every source is a 16-bit rounding of a float32 value
    (:func:`before_cast`: transformers' recurrent decode core writes its float32 output into a
    zeroed ``[B, H, 1, V]`` buffer, transposes it and casts it to bf16) the op reads the float32
    values and rounds them in registers (the same bytes): the rounding, the transpose and the
    copy are then code of no kernel, so Inductor emits the producer's kernel as stock does. Read
    as bf16, they were fused into the producing reduction as its epilogue, and that kernel lost
    its tiled loop (strided loads of the recurrent state): 59 -> 221 us a call in Qwen3.5's
    decode step on the H200, the whole step 1.08x / 1.26x stock's at 32 / 128 sequences
    (issue 28; ``benchmarks/results/hf_models.md``)."""
    m = match
    nodes = [m.source if m.source is not None else m.norm.x] if m.plain else [w.values for w in m.writes]
    found = [before_cast(x) for x in nodes]
    dtypes = {f[2] for f in found if f is not None}
    if m.source is not None or None in found or len(dtypes) != 1:
        return nodes, None, []
    return [f[0] for f in found], dtypes.pop(), [c for f in found for c in f[1]]


def before_cast(x: fx.Node) -> tuple[fx.Node, list[fx.Node], torch.dtype] | None:
    """``(v, chain, dtype)`` where ``x`` is ``v`` (contiguous float32) rounded to the 16-bit
    ``dtype`` through ops that keep each value's row-major position (views, contiguous copies,
    permutes that move only unit dims, a ``select_scatter`` that fills a unit dim of a fresh
    buffer), every step read only by the next (``chain``, from ``x`` down); else None."""
    chain, n, dtype = [], x, None
    while True:
        nxt = _order_keeping_arg(n)
        if nxt is None and dtype is None and _rounding(n):
            dtype, nxt = val(n).dtype, n.args[0]
        if nxt is None:
            break
        if n is not x and len(live_users(n)) != 1:
            return None
        chain.append(n)
        n = nxt
    v = val(n)
    if dtype is None or not isinstance(v, torch.Tensor) or v.dtype != _F32 or not v.is_contiguous():
        return None
    return n, chain, dtype


def _rounding(n: fx.Node) -> bool:
    """``n`` casts a float32 tensor to 16 bits (``.to(torch.bfloat16)``)."""
    return (is_op(n, prims.convert_element_type) and isinstance(val(n.args[0]), torch.Tensor)
            and val(n.args[0]).dtype == _F32 and val(n).dtype in _16BIT)


def _order_keeping_arg(n: fx.Node) -> fx.Node | None:
    """The tensor ``n`` takes its values from in the same row-major order, or None."""
    if is_op(n, *VIEWS, aten.squeeze, aten.unsqueeze, aten.alias):
        return n.args[0]
    if is_op(n, aten.clone) and n.kwargs.get("memory_format", torch.contiguous_format) == torch.contiguous_format:
        return n.args[0]
    if is_op(n, aten.permute):
        shape = val(n.args[0]).shape
        moved = [d for d in n.args[1] if not statically_known_true(shape[d] == 1)]
        return n.args[0] if moved == sorted(moved) else None
    if is_op(n, aten.select_scatter):
        base, src, dim = n.args[:3]
        fresh = _fill(base) is not _NO_FILL
        return src if fresh and statically_known_true(val(base).shape[dim] == 1) else None
    return None


# --------------------------------------------------------------------------- helpers


def _elementwise_users(n: fx.Node, limit: int = 12) -> list[fx.Node]:
    """Nodes reached from ``n`` through elementwise products, divisions and casts (the norm's
    product chain), in graph order."""
    out, seen, stack = [], {n}, [n]
    while stack and len(out) < 4 * limit:
        cur = stack.pop()
        for u in cur.users:
            if u in seen or not is_op(u, aten.mul, aten.div, aten.reciprocal, aten.sqrt, aten.rsqrt,
                                      aten.pow, prims.convert_element_type):
                continue
            seen.add(u)
            out.append(u)
            stack.append(u)
    return in_graph_order(out)


_OTHER_ACTS = {"gelu": "gelu", "erf": "gelu", "tanh": "tanh (or the tanh gelu)", "relu": "relu",
               "softplus": "softplus", "elu": "elu", "mish": "mish", "hardswish": "hardswish",
               "hardsigmoid": "hardsigmoid", "leaky_relu": "leaky_relu"}
"""Activations (and the ops their decompositions leave: gelu's ``erf``) the op does not take."""
_GENERIC = ("a gated norm that does not read as x * rsqrt(mean(x^2, -1) + eps) * w * act(gate) "
            "(the mean over the last dim, one weight of that width, the gate after the norm)")
_PRECISION = "precision differs from the fused op's float32 math, so it is not rewritten"


def _why_not_a_gated_norm(outs: list[Term], rstd: Term) -> str | None:
    """Why the products around the RMSNorm whose rstd is ``rstd`` (``outs``: the terms of the
    nodes reached from it, innermost first) are a gated norm the op does not compute, naming what
    differs; None where nothing gates it (a plain RMSNorm, also of an activation's output or of a
    layer whose MLP gates: every model has them, no candidate). Only the norm's own factors count:
    the normalized tensor itself a product with an activation (the gate before the norm), and the
    factors of the norm's product chain (:func:`_norm_chain`), never what computed ``x``."""
    got = next(_rstds([rstd]), None)
    if got is None:
        return None  # not the rsqrt of a mean of squares (a LayerNorm's): no RMSNorm
    x32 = got[1]
    if _is_gated(x32):
        return ("the gate is applied before the norm (norm_before_gate=False: the gate inside the mean), "
                "a different function from the fused op's norm-then-gate")
    chain = next((c for c in map(lambda t: _norm_chain(t, (rstd, x32)), reversed(outs))
                  if any(f is rstd or f == rstd for f in c)), [])
    acts = _activations(chain)
    if not acts:
        return None
    if _dtype_of(x32) in _16BIT:
        return (f"the norm is computed in {_name(_dtype_of(x32))} (no float32 upcast of x before the mean of squares): "
                f"{_PRECISION}; write x.float()")
    if not any(f.op in ("silu", "sigmoid") for f in acts):
        return f"the gate's activation is {_OTHER_ACTS[acts[0].op]}; the fused op takes silu or sigmoid"
    return _precision_reason(chain, acts, rstd)


def _precision_reason(chain: list[Term], acts: list[Term], rstd: Term) -> str:
    """Why a norm-then-gate with silu or sigmoid (``chain``: its products, ``acts``: the gate's
    activations among them) differs from the op: where only a rounding does, which; else the
    generic reason."""
    gate16 = [f for f in chain if f.op == "cast" and f.attr("dtype") in _16BIT and f.args[0] in acts]
    if gate16:
        return (f"the gate's activation is rounded to {_name(gate16[0].attr('dtype'))} "
                f"(F.silu / sigmoid of a 16-bit gate) where the fused op keeps it in float32: {_PRECISION}; write F.silu(z.float())")
    if any(_gates(f, acts) and f.attr("dtype") in _16BIT for f in chain):
        return f"the gate is multiplied in 16 bits (both factors 16-bit): {_PRECISION}"
    if any(f.op == "cast" and f.attr("dtype") in _16BIT and rstd in _subterms([f.args[0]], 2) for f in chain):
        return ("the norm is rounded to 16 bits after its weight and before the gate (nn.RMSNorm / F.rms_norm "
                "of a 16-bit tensor): the fused op rounds before the weight (transformers) or not at all (fla): "
                f"{_PRECISION}")
    return _GENERIC


_ACTS = ("silu", "sigmoid", *_OTHER_ACTS)


def _strip(t: Any) -> Any:
    """``t`` without the casts and views around it."""
    while isinstance(t, Term) and t.op in ("cast", "view"):
        t = t.args[0]
    return t


def _is_gated(x32: Term) -> bool:
    """The normalized tensor is itself a product with an activation factor (``x * silu(z)``,
    through casts and views): the gate inside the mean. A sum (a residual add, a MoE's
    combine) or a matmul of gated values is not."""
    x = _strip(x32)
    return isinstance(x, Term) and x.op == "mul" and any(getattr(_strip(a), "op", None) in _ACTS for a in x.args)


def _norm_chain(t: Any, stop: tuple, limit: int = 64) -> list[Term]:
    """The terms of the product chain ending at ``t``: ``t``, and through products, divisions,
    casts and views the factors below it, each once; the ``stop`` terms (the rstd, the
    normalized tensor) and every other factor are listed but not entered."""
    out, seen, stack = [], set(), [t]
    while stack and len(out) < limit:
        f = stack.pop()
        if not isinstance(f, Term) or f.op in ("leaf", "const") or id(f) in seen:
            continue
        seen.add(id(f))
        out.append(f)
        if f.op in ("mul", "div", "cast", "view") and not any(f is s or f == s for s in stop):
            stack.extend(f.args)
    return out


def _activations(chain: list[Term]) -> list[Term]:
    """The activations among the factors of a norm's product chain, also inside a factor that a
    decomposed activation leaves (gelu's ``1 + erf(z / sqrt(2))``)."""
    acts = [f for f in chain if f.op in _ACTS]
    for f in chain:
        if f.op in ("add", "sub"):
            acts += [a for a in f.args if isinstance(a, Term) and a.op in ("erf", "tanh")]
    return acts


def _gates(f: Term, acts: list[Term]) -> bool:
    """``f`` is a product with an activation (or its cast) among its factors."""
    return f.op == "mul" and any((a.args[0] if isinstance(a, Term) and a.op == "cast" else a) in acts for a in f.args)


def _name(dtype: torch.dtype | None) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_of(t: Term) -> torch.dtype | None:
    v = val(t.node) if t.node is not None else None
    return getattr(v, "dtype", None)


def _expand_div(factors: list) -> list:
    """``a / sqrt(v)`` as the factors of ``a`` times ``1 / sqrt(v)``."""
    out = []
    for f in factors:
        if isinstance(f, Term) and f.op == "div" and len(f.args) == 2 and isinstance(f.args[1], Term) \
                and f.args[1].op == "sqrt":
            a = f.args[0]
            out += list(a.args) if isinstance(a, Term) and a.op == "mul" and a.attr("dtype") == _F32 else [a]
            out.append(Term("recip_sqrt", (f.args[1].args[0],)))
        else:
            out.append(f)
    return out


def _subterms(factors: list, depth: int = 4) -> list:
    """``factors`` and the factors of products below them (the hf form's inner ``x * r``)."""
    out, frontier = [], list(factors)
    for _ in range(depth):
        nxt = []
        for f in frontier:
            if not isinstance(f, Term):
                continue
            out.append(f)
            if f.op in ("mul", "cast"):
                nxt.extend(f.args)
        frontier = nxt
    return list({id(f): f for f in out}.values())


def _rstds(factors: list):
    """``(rstd factor, x32, eps, rsqrt)`` for each ``rsqrt(mean(x32^2, -1) + eps)`` /
    ``1 / sqrt(...)`` among ``factors``."""
    for f in factors:
        if not isinstance(f, Term) or f.op not in ("rsqrt", "recip_sqrt"):
            continue
        v = f.args[0]
        if not (isinstance(v, Term) and v.op == "add" and len(v.args) == 2 and not v.attr("alpha")):
            continue
        mean, eps = v.args
        if isinstance(eps, Term) and eps.op == "mean":
            mean, eps = eps, mean
        eps = _eps(eps)
        if eps is None or not (isinstance(mean, Term) and mean.op == "mean" and mean.attr("keepdim")):
            continue
        sq = mean.args[0]
        if not (isinstance(sq, Term) and sq.op == "square"):
            continue
        x32 = sq.args[0]
        # a keepdim mean has its input's rank (its node may be the unsqueeze of a keepdim=False mean)
        rank = val(mean.node).dim() if val(mean.node) is not None else None
        if rank is None or mean.attr("dims") != (rank - 1,):
            continue
        yield f, x32, eps, f.op == "rsqrt"


def _eps(t: Any):
    """eps: a number, a SymFloat graph input, or (``dynamic=True`` lifts float attributes)
    a lifted 0-d CPU tensor, returned as ``("tensor", placeholder)``."""
    c = const_value(t)
    if c is not None:
        return float(c)
    if isinstance(t, Term) and t.op == "leaf" and not isinstance(val(t.leaf), torch.Tensor):
        return t.leaf
    if isinstance(t, Term) and t.op == "lifted":
        return ("tensor", t.attr("input"))
    return None


def _weight(rest: list) -> fx.Node | None:
    if len(rest) != 1 or not isinstance(rest[0], Term):
        return None
    w = rest[0].args[0] if rest[0].op == "cast" else rest[0]
    if not isinstance(w, Term) or w.op != "leaf" or val(w.leaf) is None or val(w.leaf).dim() != 1:
        return None
    return w.leaf


def _padded_write(n: fx.Node):
    """``base[:end] = src`` along the token dim (post-grad ``slice_scatter``), also as
    ``base[0, :end] = src`` into ``[1, T_pad, ...]`` (``select_scatter`` of a
    ``slice_scatter``) -> ``(base, src, end, fill or None, folded nodes)``."""
    folded = [n]
    if is_op(n, aten.select_scatter):
        base, inner, dim, index = n.args[:4]
        if dim != 0 or index != 0 or val(base).shape[0] != 1 or not is_op(inner, aten.slice_scatter):
            return None
        sel = inner.args[0]
        if not (is_op(sel, aten.select) and sel.args[0] is base and tuple(sel.args[1:3]) == (0, 0)):
            return None
        folded += [inner, sel]
        n = inner
    elif is_op(n, aten.slice_scatter):
        base = n.args[0]
    else:
        return None
    _, src, dim, start, end = (list(n.args) + [0, None, None, 1])[:5]
    step = n.args[5] if len(n.args) > 5 else 1
    sv = val(n.args[0])
    if start not in (0, None) or step != 1 or any(s != 1 for s in sv.shape[:dim]):
        return None
    fill = _fill(base)
    fill = None if fill is _NO_FILL else (0.0 if fill is None else fill)  # empty's rows: any value will do
    end = sv.shape[dim] if end is None else end
    return base, src, end, fill, folded


def _index_put_chain(last: fx.Node) -> list[fx.Node]:
    """The ``index_put`` nodes ending at ``last``, last first, then the buffer they write."""
    chain, n = [], last
    while is_op(n, aten.index_put):
        chain.append(n)
        n = n.args[0]
    return chain + [n]


def _source(canon: Canon, n: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """The node ``n`` is a view of (``n`` itself if none), and the view nodes in between."""
    t = canon(n)
    if t.op == "view" and t.args[0].node is not None:
        return t.args[0].node, in_graph_order(t.nodes)
    return n, []


_NO_FILL = object()


def _fill(base: fx.Node):
    """A fresh buffer's contents: ``None`` for ``torch.empty`` (undefined), the value of
    ``torch.zeros`` / ``torch.full``, else ``_NO_FILL``."""
    if is_op(base, aten.empty, aten.empty_strided):
        return None
    if is_op(base, aten.full) and const_value(base.args[1]) is not None:
        return float(base.args[1])
    if is_op(base, aten.zeros):
        return 0.0
    return _NO_FILL


def _same_terms(a: list, b: list) -> bool:
    """``a`` and ``b`` hold equal terms, in any order (equality, never ``repr``: a term's text
    spells out every path through its DAG, exponential in a real model's graph depth)."""
    rest = list(b)
    for t in a:
        i = next((i for i, u in enumerate(rest) if t is u or t == u), None)
        if i is None:
            return False
        del rest[i]
    return not rest


def _copy_chain(z: fx.Node) -> list[fx.Node]:
    """``z`` and the views it was made of, down to the first node that is no view (the
    user's copy, a ``clone``, where the gate was copied)."""
    chain = [z]
    while is_op(chain[-1], *VIEWS):
        chain.append(chain[-1].args[0])
    return chain


def _gate_view(z: fx.Node, D: int) -> tuple[fx.Node, list | None]:
    """``(node, shape)``: the gate as the op reads it, ``node`` viewed ``shape`` (None: as it is).
    Where it lies (:func:`_gate_read`), or ``z`` itself where its strides allow: a 2-D ``[N, D]``
    or 3-D ``[A, B, D]`` gate with unit column stride (vLLM's gate, a ``[T, H, D]`` view of the
    projection's split, with a symbolic ``T``); else ``z`` reshaped ``[-1, D]`` (a copy only where
    no view exists)."""
    node, shape = _gate_read(z, D)
    if shape is not None:
        return node, shape
    zv = val(node)
    if zv is not None and zv.dim() in (2, 3) and zv.shape[-1] == D and (zv.stride(-1) == 1 or D == 1):
        return node, None
    return node, [-1, D]


def _gate_read(z: fx.Node, D: int) -> tuple[fx.Node, list | None]:
    """``(node, shape)``: the gate is ``node`` (``z``, shape None: read as ``[-1, D]``); where
    ``z`` is the user's copy of a strided tensor (``reshape`` of a split of the projection: a
    contiguous ``clone`` then views), the tensor itself viewed ``shape`` = ``[A, B, D]`` in place:
    the kernel reads any strides, and the copy, which stock Inductor fuses into its norm, would
    otherwise be written out for the op (measured: ``benchmarks/results/profile_step.md``, the 16K
    prefill). The copied tensor may itself be a reshape that no view gives as rows (transformers'
    Qwen3-Next with one key head: the split ``[B, S, 1, 2 * Dv]`` reshaped ``[B, S, 2, Dv]``): then
    a reshape it was made from is viewed."""
    z = _before_upcast(z)
    src = _copy_chain(z)[-1]
    if not (is_op(src, aten.clone)
            and src.kwargs.get("memory_format", torch.contiguous_format) == torch.contiguous_format):
        return z, None
    mutated = mutated_nodes(z.graph)
    for base in _copy_chain(src.args[0]):  # the copied tensor, then the reshapes it came from
        shape = _rows_view(val(base), D) if isinstance(base, fx.Node) else None
        if shape is not None and base not in mutated:
            return base, shape
    return z, None


def _before_upcast(z: fx.Node) -> fx.Node:
    """``z`` without the unit-dim views and the exact float32 upcast of a 16-bit tensor around it
    (``torch.sigmoid(z.float().unsqueeze(0))``): the op upcasts the gate itself, so it reads the
    16-bit tensor where it lies instead of an upcast copy Inductor would write out for it."""
    n = z
    while is_op(n, aten.unsqueeze, aten.squeeze) or (is_op(n, prims.convert_element_type) and _upcast(n)):
        n = n.args[0]
    return n if n is not z and len(live_users(n)) >= 1 else z


def _upcast(n: fx.Node) -> bool:
    """``n`` casts a 16-bit tensor to float32 (exact)."""
    src = val(n.args[0])
    return isinstance(src, torch.Tensor) and src.dtype in _16BIT and val(n).dtype == _F32


def _rows_view(v: Any, D: int) -> list | None:
    """``[-1, C // D, D]`` where ``v`` (last dim ``C``, a multiple of ``D``) can be viewed so,
    else None: a stride computation (never a view that may raise): the last dim always splits,
    the leading dims merge into one where each non-unit dim's stride is the next one's stride
    times its size."""
    if not isinstance(v, torch.Tensor) or v.dim() < 1 or not isinstance(v.shape[-1], int) or v.shape[-1] % D:
        return None
    lead = [(s, st) for s, st in zip(v.shape[:-1], v.stride()[:-1]) if not statically_known_true(s == 1)]
    if all(statically_known_true(st0 == st1 * s1) for (_, st0), (s1, st1) in zip(lead, lead[1:])):
        return [-1, v.shape[-1] // D, D]
    return None


_UNSPECIALIZED = ("the norm's last dim ({}) is symbolic and cannot be made static (marked dynamic with "
                  "torch._dynamo.mark_dynamic, or without an example value): the fused op's matching needs it "
                  "static; mark only the token dims, or use torch._dynamo.maybe_mark_dynamic")


def _static(graph: fx.Graph, size: Any, fixed: dict | None = None) -> tuple[Any, dict]:
    """``(size as an int, fixed)``: a symbolic per-row size (``dynamic=True``: the norm's D, a
    token's heads x D) as its example value, its symbols added to ``fixed`` (specialized on
    replacing: the graph serves that value, another recompiles); ``(size, fixed)`` unchanged
    where it is static or cannot be specialized (a symbol no input size gives, or one the user
    marked dynamic)."""
    fixed = dict(fixed or {})
    if isinstance(size, int):
        return size, fixed
    more = input_sizes(graph, free_symbols(size))
    if more.keys() != free_symbols(size) or marked_dynamic(more):
        return size, fixed
    fixed.update(more)
    return static_size(size, fixed), fixed
