"""``indexer_k_write``: DeepSeek-V3.2's indexer K write (norm + fp8 quant + paged store) -> one op.

Finds (post-grad graph, which is functional) a graph-input (or, under AOTInductor, a ``get_attr``
constant: a module buffer lifted by ``torch.export``) cache ``kv_cache`` uint8 ``[num_blocks,
block_size, D + 4G]`` written by exactly two functional writes and copied back with ``copy_``
(the writes read by :mod:`._cache_writes`):

* one storing the fp8 values ``q = fp8_e4m3(clamp(x / scale, -448, 448))`` of
  ``x = k.float().view(T, G, 128)`` (any 1-byte view of them) at bytes
  ``blk * block_bytes + off * D + j``;
* one storing the float32 scales (as float32 or as their bytes) at
  ``blk * block_bytes + block_size * D + off * 4G + 4g (+ byte)``;

with ``blk = slot // block_size``, ``off = slot % block_size`` for ``slot = slot_mapping[t]``,
and ``scale = max(amax(|x|), 1e-4) / 448`` (plain), or that rounded up to a power of two as
``2 ** ceil(log2(scale))`` / ``exp2(ceil(log2(scale)))`` ("ue8m0"). Byte addresses are read
symbolically, so the three store spellings, int32/int64, ``%`` or ``slot - blk * bs`` all match,
while another layout (the per-token interleaved one), block size, group size or scale formula
(another floor, another divisor, ``* (1 / 448)``) does not. The clamp to +-448 may be left out:
this scale bounds ``|x / scale|`` to 448 up to rounding (proof in ``_read_scaled``).

LayerNorm: when ``k`` is ``F.layer_norm(k0.float(), (D,), weight, bias, eps).to(k0.dtype)`` and
nothing else reads the normalized ``k``, the norm is fused too; where something sits between
(DeepSeek-V3.2's rotary) only quant + write are replaced (vLLM's ``indexer_k_quant_and_cache``).
Torch 2.9-2.11's joint-graph pass drops the norm's cast back to bf16 and the quantization's
``.float()``: that norm is fused with ``round_norm=False``, what the graph computes.

Padding slots (< 0): race-free, ``index_put_(..., torch.where(slot_mapping >= 0, new - old, 0),
accumulate=True)`` at the clamped slot (``kda_inductor.reference.write_indexer_k``): the op skips
padding, byte-exact. Racy, a plain ``index_put_`` of ``torch.where(slot_mapping >= 0, new, old)``:
where a real token shares padding's slot eager's result is undefined; still matched (equal to
eager wherever eager is defined), the op stores the real token and the graph's note says so
(``RACY_NOTE``). Unmasked negative slots land where Python indexing puts them
(``wrap_negative=True``); clamped but unmasked code is not matched.

Symbolic sizes (``docs/dynamic.md``): the block and token counts stay symbolic; the block size,
row width, head dim and group count are read as their example values and specialized when the
match is replaced (``_layout.specialize``); a size the user marked dynamic is a miss naming it.

Speed rule (``speed_rule``): CUDA always (stock Inductor cannot compile the write there: "must be
1 to view Float as Byte"; the op beats eager more than 30x, and kda without it is 92.1 us slower
in the hybrid model's T=256 spec step); CPU only from ``CPU_MIN_TOKENS`` tokens (static counts).
Measured: ``benchmarks/results/report.md``, ``profile_step.md``; the history:
``docs/speed-rules.md``.

Replacement (:func:`write`): ``kda::indexer_k_write`` on the cache, functionalized as
``auto_functionalized`` (its new cache feeds the user's ``copy_`` and every reader of the written
cache), which Inductor re-inplaces: the op writes the cache buffer itself, no clone, no copy.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import sympy
import torch
import torch.fx as fx

from kda_inductor.lowerings import indexer_k_write as _lowering  # registers the op
from kda_inductor.patterns._cache_writes import (
    BYTE,
    TOKEN,
    CacheChain,
    CacheState,
    Stored,
    fixed_sizes,
    read_write,
    same_layout,
    sizes_do_not_matter,
    sizes_only,
    through_views,
)
from kda_inductor.patterns._index_algebra import known, same
from kda_inductor.patterns._layout import (
    SYMBOLIC_ROW,
    input_sizes,
    marked_dynamic,
    marked_dynamic_miss,
    same_count,
    specialize,
    static_equal,
    static_size,
    symbolic_row,
)
from kda_inductor.patterns.base import (
    Match,
    Rewrite,
    Stage,
    aten,
    cpu_min_count_rule,
    earliest,
    in_graph_order,
    replace_by_function,
    source_location,
    val,
)
from kda_inductor.patterns.canonical import Canon, Term, const_value, f32
from kda_inductor.lowerings._fp8 import AMAX_FLOOR, FP8_MAX
from kda_inductor.reference import QUANT_GROUP, CacheLayout

CPU_MIN_TOKENS = 1024
"""Tokens written (a static count) from which the op runs on CPU (see the speed rule)."""
RACY_NOTE = ("this masked write stores padding's old bytes with a plain index_put_: where a real "
             "token shares the slot padding lands on (slot 0 when clamped, the last slot for -1), two writes of "
             "different bytes hit one address and eager's result is undefined (CPU eager keeps the old bytes); "
             "rewritten, kda.indexer_k_write stores the real token. Race-free spelling: "
             "kda_inductor.reference.write_indexer_k "
             "(index_put_(..., torch.where(valid, new - old, 0), accumulate=True))")


@dataclasses.dataclass
class _Quant:
    q: fx.Node  # the fp8 cast
    scale: Term  # the float32 scales the values were divided by ([T, G, 1], [T * G, 1], ...)
    scale_node: fx.Node  # the node divided by
    x: fx.Node  # the float32 values quantized, last dim 128
    k: fx.Node  # the [T, D] tensor whose .float() is x (k itself when float32)
    ue8m0: bool
    nodes: set[fx.Node]
    fp8_max_input: fx.Node | None = None  # the divisor, lifted to a graph input (dynamic=True)


def _read_quant(q: fx.Node, canon: Canon, fixed: dict | None = None) -> _Quant | str:
    """Check, in canonical terms, that ``q`` is the fp8 group quantization
    ``fp8(clamp(x / s, -448, 448))`` with ``s = max(amax(|x|, -1), 1e-4) / 448`` (or its
    ue8m0 rounding ``exp2(ceil(log2(s)))``) over groups of 128 values of float32 ``x``:
    every spelling :mod:`.canonical` normalizes matches (``clamp_min`` / ``torch.maximum`` with
    ``torch.tensor(eps)``, ``amax`` without keepdim then ``unsqueeze``, ``max(dim)[0]``,
    ``pow(2, .)`` / ``exp2``, one group per row or ``[T, G, 128]`` views, ``.float()`` /
    ``type_as``...). A string says why not. ``fixed``: the sizes read as their example values
    (``fixed_sizes``)."""
    t = canon(q)
    if not (t.op == "cast" and t.attr("dtype") == torch.float8_e4m3fn):
        return "values are not an fp8 e4m3 cast"
    c = t.args[0]
    if isinstance(c, Term) and c.op == "div":  # no clamp: proven unneeded below (_UNCLAMPED)
        got = _read_scaled(q, t, c, canon, fixed or {})
        return got if not isinstance(got, str) else f"{got} {_UNCLAMPED}"
    if not (isinstance(c, Term) and c.op == "clamp" and c.attr("lo") == -FP8_MAX and c.attr("hi") == FP8_MAX):
        return f"values are not clamped to [-{FP8_MAX:g}, {FP8_MAX:g}] before the fp8 cast"
    return _read_scaled(q, t, c.args[0], canon, fixed or {})


_UNCLAMPED = (f"(the values are not clamped to [-{FP8_MAX:g}, {FP8_MAX:g}] before the fp8 cast: that is "
              f"only safe with exactly this scale, which bounds them)")


def _read_scaled(q: fx.Node, t: Term, d: Any, canon: Canon, fixed: dict) -> _Quant | str:
    """The rest of :func:`_read_quant`: ``d`` is ``x / scale``. Without the clamp (``t``'s
    input is ``d`` itself) the same checks prove it a no-op: with ``|x| <= amax`` and
    ``scale = max(amax, 1e-4) / 448`` (float32, or its ue8m0 power-of-two ceiling, which only
    grows it; a lifted divisor is checked to be 448 at launch), ``|x / scale| <= 448`` up to
    two float32 roundings, far below 464, the midpoint between 448 and the next e4m3 step
    (480, not finite in e4m3fn): the cast rounds it to 448 as the clamp would, and NaN/inf
    pass through both alike. Another scale, divisor or floor is no proof: refused."""
    if not (isinstance(d, Term) and d.op == "div" and len(d.args) == 2 and isinstance(d.args[1], Term)):
        return "values are not x / scale"
    xt, st = d.args
    if xt.node is None or val(xt.node) is None or val(xt.node).dtype != torch.float32 \
            or val(xt.node).shape[-1] != QUANT_GROUP:
        return f"x is not float32 with groups of {QUANT_GROUP} in its last dim (another group size)"
    scale = canon.strip(st, "view")
    rounding = _scale_rounding(scale)
    if isinstance(rounding, str):
        return rounding
    plain, ue8m0, exact = rounding
    fp8_max_input = _scale_formula(plain, exact, xt, canon)
    if isinstance(fp8_max_input, str):
        return fp8_max_input
    k = _quantized_k(xt, exact, canon, fixed)
    if isinstance(k, str):
        return k
    nodes = canon.region(t, stop=lambda s_: s_.node is k) | canon.region(st, stop=lambda s_: s_.node is k)
    return _Quant(q, scale, st.node, xt.node, k, ue8m0, nodes, fp8_max_input)


def _scale_rounding(scale: Term) -> tuple[Term, bool, bool] | str:
    """``(plain scale, ue8m0, exact)``: the scale without its ue8m0 rounding up to a power of
    two (``exp2(ceil(log2(s)))``, or ``exact``: by bit tricks), or why not."""
    if scale.op == "exp2":
        inner = scale.args[0]
        if not (inner.op == "ceil" and inner.args[0].op == "log2"):
            return "scale is 2 ** (something other than ceil(log2(s)))"
        return inner.args[0].args[0], True, False
    if scale.op == "pow2_ceil":  # the exact ceiling by bit tricks (DeepSeek-V3.2's fast_pow2)
        return scale.args[0], True, True
    return scale, False, False


def _scale_formula(plain: Term, exact: bool, xt: Term, canon: Canon) -> fx.Node | None | str:
    """The plain scale is ``max(amax(|x|), 1e-4) / 448`` of the ``x`` divided (``* (1 / 448)``
    only with the exact ue8m0 ceiling): the divisor's lifted graph input (``dynamic=True``),
    None for the constant; or why not."""
    divisor = plain.args[1] if plain.op == "div" and len(plain.args) == 2 else None
    fp8_max_input = divisor.attr("input") if isinstance(divisor, Term) and divisor.op == "lifted" else None
    times_inverse = (exact and plain.op == "mul" and len(plain.args) == 2
                     and const_value(plain.args[1]) is not None and f32(const_value(plain.args[1])) == f32(1 / FP8_MAX))
    if const_value(divisor) != FP8_MAX and fp8_max_input is None and not times_inverse:
        return f"scale is not max(amax, {AMAX_FLOOR:g}) / {FP8_MAX:g} (another scale formula)"
    floor = plain.args[0]
    if not (floor.op == "clamp" and floor.attr("hi") is None and floor.attr("lo") is not None
            and f32(floor.attr("lo")) == f32(AMAX_FLOOR)):
        return f"scale is not max(amax, {AMAX_FLOOR:g}) / {FP8_MAX:g} (another floor)"
    amax = floor.args[0]
    rank = val(amax.args[0].node).dim() if amax.op == "amax" and amax.args[0].node is not None else None
    if not (amax.op == "amax" and amax.args[0].op == "abs" and amax.attr("keepdim") and rank
            and amax.attr("dims") == (rank - 1,)):
        return "scale does not start from amax(abs(x)) over the group's 128 values (keepdim)"
    if canon.strip(amax.args[0].args[0], "view") != canon.strip(xt, "view"):
        return "amax and the division read different x"
    return fp8_max_input


def _quantized_k(xt: Term, exact: bool, canon: Canon, fixed: dict) -> fx.Node | str:
    """The ``[T, D]`` tensor whose ``.float()`` is the quantized ``x`` (itself when float32),
    or why not (``fixed``: :func:`_read_quant`'s)."""
    src = canon.strip(xt, "view")
    if src.op == "cast" and src.attr("dtype") == torch.float32:
        k = src.args[0].node
    else:
        k = src.node
    kv = val(k) if k is not None else None
    if kv is None or kv.dim() != 2 or kv.dtype not in (torch.bfloat16, torch.float16, torch.float32) \
            or not (known(kv.numel() == val(xt.node).numel()) or static_equal(kv.numel(), val(xt.node).numel(), fixed)):
        return "k is not a [T, D] bfloat16/float16/float32 tensor quantized in groups of 128"
    if exact and kv.dtype == torch.float32:
        # the exact power-of-two ceiling equals 2 ** ceil(log2(s)) (what the op computes), and
        # amax * (1 / 448) ties amax / 448 there, for every amax of 16-bit values (checked
        # exhaustively over bf16 and fp16); float32 amax can differ just above a power of two
        return "ue8m0 by bit tricks on float32 k (the exact ceiling differs from 2 ** ceil(log2(s)) there)"
    return k


def _layer_norm(x, w, b, eps):
    return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), w, b, eps)


def _layer_norm_rounded(x, w, b, eps):
    return _layer_norm(x, w, b, eps).to(x.dtype)


@functools.cache
def _layer_norm_patterns() -> tuple:
    """``(pattern, k dtype kind, rounded)`` for DeepSeek-V3.2's ``k_norm``:
    ``F.layer_norm(k.float(), (D,), weight, bias, eps)`` cast back to ``k``'s dtype (16-bit k),
    the same without the cast back (float32 k, or what torch 2.9-2.11's joint-graph pass leaves
    of a bf16 round trip), traced into patterns by PyTorch's own pattern matcher with this
    torch's decompositions (a fixed subgraph: ``var_mean``, ``rsqrt``, ``* weight + bias``), eps
    a keyword argument of the match."""
    from torch._inductor.pattern_matcher import fwd_only, gen_pattern

    out = []
    for dtype in (torch.bfloat16, torch.float32):
        args = [torch.empty(4, 128, dtype=dtype), torch.empty(128), torch.empty(128), 1e-6]
        for fn, rounded in ((_layer_norm_rounded, True), (_layer_norm, False)):
            if dtype == torch.float32 and rounded:
                continue  # the cast back to float32 is no op
            out.append((gen_pattern(fn, args, fwd_only, scalar_workaround={"eps": 1e-6}), dtype, rounded))
    return tuple(out)


def _read_layer_norm(k: fx.Node):
    """``k = layer_norm(k0.float(), weight, bias, eps).to(k0.dtype)`` -> (k0, w, b, eps,
    rounded, nodes); ``rounded`` False for the same norm without the cast back (float32
    ``k0``, or float32 ``k``: what Inductor's joint-graph pass leaves of the cast back and the
    quantization's ``.float()`` on torch 2.9-2.11, which drop float32 -> bf16 -> float32 round
    trips). Matched with ``torch._inductor.pattern_matcher`` (see ``_layer_norm_patterns``)."""
    for pattern, dtype, rounded in _layer_norm_patterns():
        m = pattern.match(k)
        if not m:
            continue
        k0, w, b, eps = (m.kwargs.get(name) for name in ("x", "w", "b", "eps"))
        kv = val(k0)
        if kv is None or kv.dim() != 2 or (dtype == torch.float32) != (kv.dtype == torch.float32):
            continue
        if rounded and val(k).dtype != kv.dtype:
            continue  # cast back to another dtype than the input's
        if not (_is_param(w, k0) and _is_param(b, k0)) or not isinstance(eps, float):
            continue
        return k0, w, b, eps, rounded or kv.dtype == torch.float32, set(m.nodes) - {k0, w, b}
    return None


def _is_param(p: Any, k0: fx.Node) -> bool:
    pv, kv = val(p), val(k0)
    return (isinstance(pv, torch.Tensor) and pv.dtype == torch.float32 and pv.dim() == 1
            and known(pv.shape[0] == kv.shape[1]))




class _Norm(NamedTuple):
    """The ``k`` the op reads and the LayerNorm it applies (``weight`` None: none)."""

    k: fx.Node
    weight: fx.Node | None = None
    bias: fx.Node | None = None
    eps: float = 1e-6
    round_norm: bool = True


def _fused_norm(k: fx.Node, region: set[fx.Node]) -> _Norm:
    """The LayerNorm that makes ``k``, fused (its nodes added to ``region``) when nothing
    outside the region reads what it computes; else ``k`` without a norm."""
    ln = _read_layer_norm(k)
    if ln is not None:
        k0, w, b, e, rounded, ln_nodes = ln
        inside = region | ln_nodes
        if all(u in inside for n in ln_nodes for u in n.users):
            region |= ln_nodes
            return _Norm(k0, w, b, e, rounded)
    return _Norm(k)


# --------------------------------------------------------------------------- the rewrite


@dataclasses.dataclass(frozen=True)
class WriteMatch(Match):
    copy: fx.Node  # the user's copy_ of the written cache back into the input
    cache: fx.Node
    k: fx.Node
    slot_mapping: fx.Node
    weight: fx.Node | None
    bias: fx.Node | None
    eps: float
    ue8m0: bool
    round_norm: bool
    wrap_negative: bool  # unmasked writes: negative slots count from the end, as eager
    block_size: int  # 0: the 3-D cache's; a 2-D page buffer's, from the write's byte addresses
    fp8_max_input: fx.Node | None  # the scale divisor as a lifted float (dynamic=True), checked at launch
    readers: list[fx.Node]  # last-version nodes read outside the chain: they get the new cache
    first: fx.Node  # the first write: the op goes before it
    fixed: dict = dataclasses.field(default_factory=dict)  # sizes specialized on replacing (_layout.specialize)


class IndexerKWrite(Rewrite):
    name = "indexer_k_write"
    finds = (
        "DeepSeek-V3.2's indexer K write: optional LayerNorm, fp8 e4m3 quantization per 128 values (plain or "
        "ue8m0 scales), the store into the blocked paged cache at `slot_mapping`"
    )
    spellings = (
        'DeepSeek-V3.2 indexer K write: optional LayerNorm, fp8 e4m3 quantization per 128 values '
        '(plain or ue8m0 scales, in every spelling the canonical layer reads: `clamp_min` / '
        '`torch.maximum(amax, torch.tensor(eps))`, amax without keepdim then `unsqueeze`, '
        '`max(dim)[0]`, `pow(2, .)` / `exp2` / the bit tricks on 16-bit k, one group per row or `[T, '
        "G, 128]`) and the store into the blocked paged cache (3-D, SGLang's 2-D pages) at "
        '`slot_mapping`, as `index_put_`, `index_copy_` or `view[blk, off] = ...`; padding (slot < 0)'
        ' written race-free as `index_put_(idx, torch.where(slot >= 0, new - old, 0), '
        'accumulate=True)` at the clamped slot (`kda_inductor.reference.write_indexer_k`) is skipped;'
        ' a plain `index_put_` of `torch.where(slot >= 0, new, old)` is matched too but races where a'
        " real token shares padding's slot (eager undefined; the graph's note says so); unmasked "
        'negative slots land where Python indexing puts them; symbolic token and block counts (a '
        '`dynamic=True` block size and head dim specialized)'
    )
    becomes = '`kda::indexer_k_write` (one Triton kernel, in place on the cache: no clone, no copy)'
    # a gather that reads the cache after the write sees a plain view of the written cache only once
    # the write is replaced
    runs_before = ("indexer_k_gather",)

    def note(self, node: fx.Node, text: str) -> None:
        """A note on a match at the user's line (``pass_manager`` adds it to the graph's note)."""
        where, _ = source_location(node)
        self.notes.append(f"{self.name} at {where or node.name}: {text}")

    def find(self, graph: fx.Graph) -> list[Match]:
        self.notes: list[str] = []
        return self._find(graph)

    def speed_rule(self, match: WriteMatch) -> str | None:
        if match.device == "cuda":
            return None
        if match.device != "cpu":
            return f"the op was never measured on {match.device} (see patterns/indexer_k_write.py)"
        return cpu_min_count_rule(val(match.k).shape[0], CPU_MIN_TOKENS, "tokens written", "indexer_k_write.py")

    def _find(self, graph: fx.Graph) -> list[Match]:
        matches = []
        canon = Canon()
        for n in graph.nodes:
            # the cache is a graph input (torch.compile) or a module buffer that AOTInductor
            # lifts to a constant (get_attr), mutated in place by the copy_ just the same
            if n.target is aten.copy_.default and n.args[0].op in ("placeholder", "get_attr"):
                cv = val(n.args[0])
                if isinstance(cv, torch.Tensor) and cv.dtype == torch.uint8 and cv.dim() >= 2:
                    m = self._match(n, canon)
                    if m is not None:
                        matches.append(m)
        return matches

    def _match(self, copy: fx.Node, canon: Canon) -> Match | None:
        """The match of the cache written back by ``copy``, in the stages of :class:`Stage`:
        the chain of writes (form), what each stores (pieces), the layout, the shared slot
        index, the byte addresses, the stored values, the op's validator and the region;
        else None, with a miss at the stage that rejected it."""
        written = self._written(copy)
        pieces = None if written is None else self._pieces(copy, *written)
        if pieces is None:
            return None
        values, scales, region, reads = pieces
        layout = self._layout(copy, values, scales)
        slot = None if layout is None else self._slot(copy, values, scales)
        if slot is None or not self._addressed(copy, values, scales, layout, slot):
            return None
        quant = self._quantized(values, scales, layout, slot, canon)
        if quant is None:
            return None
        region |= quant.nodes | values.algebra.visited
        norm = _fused_norm(quant.k, region)
        shape = [static_size(x, values.algebra.static) for x in val(copy.args[0]).shape]
        block_size = 0 if len(shape) == 3 and shape[1] == layout.block_size else layout.block_size
        if not self._validated(copy, norm, slot, block_size, values.masked):
            return None
        closed = self._region_closed(copy, written[0], len(written[1].writes), reads)
        if closed is None:
            return None
        readers, versions = closed
        region |= set(versions) | reads
        region -= {copy.args[0], copy}  # the user's copy_ stays: it copies the op's new cache
        if values.masked and not (values.write.accumulate and scales.write.accumulate):
            self.note(values.write.node, RACY_NOTE)
        return WriteMatch(
            nodes=in_graph_order(region),
            copy=copy, cache=copy.args[0], k=norm.k, slot_mapping=slot, weight=norm.weight, bias=norm.bias,
            eps=float(norm.eps), ue8m0=quant.ue8m0, round_norm=norm.round_norm, wrap_negative=not values.masked,
            block_size=block_size, fp8_max_input=quant.fp8_max_input, readers=readers,
            first=earliest((values.write.node, scales.write.node)),
            fixed=input_sizes(copy.graph, values.algebra.static),
        )

    # ------------------------------------------------------------------ recognition
    def _written(self, copy: fx.Node) -> tuple[CacheChain, CacheState] | None:
        """``(chain, final state)`` of the cache ``copy`` writes back, when it is a chain of two
        functional writes and views of it whose addresses do not depend on its symbolic sizes;
        else None (a ``Stage.FORM`` miss)."""
        cache = copy.args[0]
        try:
            chain = CacheChain(cache)
        except ValueError:
            return self.miss(copy, Stage.FORM, "the cache has a size without an example value (an unbacked size)")
        final = chain.state(copy.args[1])
        if final is None or not same_layout(final.layout, chain.root):
            return self.miss(copy, Stage.FORM, "not a chain of index_put / slice_scatter / views of the copied cache")
        if len(final.writes) != 2:
            return self.miss(copy, Stage.FORM, f"the cache is written {len(final.writes)} times, not twice (values and scales)")
        chain.fixed = fixed_sizes(copy, chain, final)  # read as their example values from here on
        marked = marked_dynamic(chain.fixed)
        if marked:
            return self.miss(copy, Stage.FORM, marked_dynamic_miss(marked))
        if not sizes_do_not_matter(copy, final, chain.fixed):
            return self.miss(copy, Stage.FORM, SYMBOLIC_ROW if symbolic_row(cache) else
                             "the writes' byte addresses depend on the cache's symbolic sizes")
        return chain, final

    def _pieces(self, copy: fx.Node, chain: CacheChain, final: CacheState):
        """``(values write, scales write, region, old bytes read)``: one write of fp8 values and
        one of float32 scales, each read by :meth:`read_write`; else None (a ``Stage.PIECES``
        miss)."""
        region: set[fx.Node] = {copy}
        reads: set[fx.Node] = set()
        found: dict[str, list[Stored]] = {}
        algebra = None
        for w in final.writes:
            got = read_write(w, chain, algebra, chain.fixed)
            if isinstance(got, str):
                return self.miss(w.node, Stage.PIECES, got)
            algebra = got.algebra
            found.setdefault(got.kind, []).append(got)
            region |= got.nodes
            reads |= got.reads
        if sorted(found) != ["scales", "values"] or any(len(v) != 1 for v in found.values()):
            return self.miss(copy, Stage.PIECES, "not one values write and one scales write")
        return found["values"][0], found["scales"][0], region, reads

    # ------------------------------------------------------------------ layout, indexing, addressing
    def _layout(self, copy: fx.Node, values: Stored, scales: Stored) -> CacheLayout | None:
        """The cache's layout for the stored rows' head_dim, else None (a ``Stage.LAYOUT``
        miss; a ``Stage.PIECES`` one when the scale rows are not that layout's)."""
        cv, fixed = val(copy.args[0]), values.algebra.static
        layout = CacheLayout.parse([static_size(x, fixed) for x in cv.shape], values.row_bytes)
        if layout is None or layout.head_dim != values.row_bytes or static_size(cv.stride(-1), fixed) != 1:
            return self.miss(copy, Stage.LAYOUT, "cache row width is not head_dim + 4 * head_dim // 128")
        if scales.row_bytes != layout.scale_bytes:
            return self.miss(scales.write.node, Stage.PIECES,
                             f"scale rows are {scales.row_bytes} bytes, not {layout.scale_bytes}")
        return layout

    def _slot(self, copy: fx.Node, values: Stored, scales: Stored) -> fx.Node | None:
        """The one ``slot_mapping`` both writes index by (masked alike), else None (a
        ``Stage.INDEXING`` miss)."""
        algebra = values.algebra
        if len(algebra.sequences) != 1:
            return self.miss(copy, Stage.INDEXING, "the writes do not index by one slot_mapping")
        if values.masked != scales.masked or (algebra.clamped and not values.masked):
            return self.miss(copy, Stage.INDEXING, "slots clamped to 0 but the writes are not masked by slot_mapping >= 0")
        return next(iter(algebra.sequences))

    def _addressed(self, copy: fx.Node, values: Stored, scales: Stored, layout: CacheLayout,
                   slot: fx.Node) -> bool:
        """Both writes store where ``layout`` puts slot ``slot_mapping[t]``'s bytes (block
        ``slot // block_size``, offset ``slot % block_size``); else a ``Stage.ADDRESSING`` miss."""
        bs, hd = layout.block_size, layout.head_dim
        seq = values.algebra.seq_fn(slot)(TOKEN)
        blk, off = sympy.floor(seq / bs), sympy.Mod(seq, bs)
        block = blk * static_size(val(copy.args[0]).stride(0), values.algebra.static)  # the block stride is free
        if not same(values.addr, block + layout.value_byte(off) + BYTE):
            self.miss(values.write.node, Stage.ADDRESSING, f"value bytes do not go to block slot // {bs}, byte "
                      f"(slot % {bs}) * {hd} + j (another layout or block size)")
            return False
        if not same(scales.addr, block + layout.scale_byte(off) + BYTE):
            self.miss(scales.write.node, Stage.ADDRESSING, f"scale bytes do not go to block slot // {bs}, byte "
                      f"{layout.scales_start} + (slot % {bs}) * {layout.scale_bytes} + j (another layout or "
                      "block size)")
            return False
        return True

    # ------------------------------------------------------------------ values
    def _quantized(self, values: Stored, scales: Stored, layout: CacheLayout, slot: fx.Node,
                   canon: Canon) -> _Quant | None:
        """The quantization whose fp8 values and scales are stored, of a ``k`` that fits the
        cache and ``slot_mapping``; else None (a ``Stage.VALUES`` miss)."""
        quant = _read_quant(values.src, canon, input_sizes(values.write.node.graph, values.algebra.static))
        if isinstance(quant, str):
            return self.miss(values.write.node, Stage.VALUES, quant)
        s_src = scales.src
        if canon.strip(canon(s_src), "view") != quant.scale and through_views(s_src)[0] is not through_views(
                quant.scale_node)[0]:
            return self.miss(scales.write.node, Stage.VALUES, "the stored scales are not the ones the values were divided by")
        kv = val(quant.k)
        if (static_size(kv.shape[1], values.algebra.static) != layout.head_dim
                or not same_count(kv.shape[0], val(slot).shape[0])):
            return self.miss(values.write.node, Stage.VALUES, "k's shape does not fit the cache and slot_mapping")
        return quant

    # ------------------------------------------------------------------ validation, region
    def _validated(self, copy: fx.Node, norm: _Norm, slot: fx.Node, block_size: int, masked: bool) -> bool:
        """The op's validator accepts these inputs (what it would reject is no match, not a
        failed rewrite); else a ``Stage.VALIDATED`` miss."""
        try:
            _lowering.validate(val(copy.args[0]), val(norm.k), val(slot), val(norm.weight), val(norm.bias),
                               norm.eps, block_size, not masked)
        except (ValueError, TypeError) as exc:
            self.miss(copy, Stage.VALIDATED, f"kda.indexer_k_write rejects these inputs: {exc}")
            return False
        return True

    def _region_closed(self, copy: fx.Node, chain: CacheChain, last: int, reads: set[fx.Node]):
        """``(readers, versions)``: every version of the cache but the last is read only inside
        the region (masked writes read the old bytes), and the last one's readers outside the
        chain (they get the new cache) read it whole; else None (a ``Stage.REGION`` miss)."""
        versions = {n: s for n, s in chain.memo.items() if s is not None}
        for n, s in versions.items():
            if 0 < len(s.writes) < last and any(u not in versions and u not in reads and not sizes_only(u, versions)
                                                for u in n.users):
                return self.miss(n, Stage.REGION, "a partly written cache is read elsewhere")
        readers = []
        for n, s in versions.items():
            if len(s.writes) == last and any(u not in versions for u in n.users if u is not copy):
                lay = s.layout
                if not (lay.storage_offset() == 0 and lay.is_contiguous() and lay.numel() == chain.root.numel()
                        and chain.root.is_contiguous()):
                    return self.miss(n, Stage.REGION, "the written cache is read through a strided view")
                readers.append(n)
        return readers, versions

    # --------------------------------------------------------------- replace
    def replace(self, graph: fx.Graph, match: WriteMatch) -> None:
        m = match
        specialize(m.fixed)  # the kernel's block size, head dim and groups: this graph serves these values
        args = (m.cache, m.k, m.slot_mapping, m.weight, m.bias, m.eps, m.ue8m0, m.round_norm, m.block_size,
                m.wrap_negative, m.fp8_max_input, [list(val(r).shape) for r in m.readers])
        # the user's copy_ back into the cache, and every reader of the written cache, read the new cache
        replace_by_function(graph, write, args, outputs=[m.copy.args[1], *m.readers], before=m.first,
                            region=m.nodes, origin=m.first)


def write(kv_cache, k, slot_mapping, weight, bias, eps, ue8m0, round_norm, block_size, wrap_negative,
          fp8_max_input, reader_shapes):
    """The replacement: the op writes the cache in place (re-inplaced by Inductor: no clone, no
    copy); returns the new cache, and viewed as each reader of the written cache viewed it."""
    torch.ops.kda.indexer_k_write(kv_cache, k, slot_mapping, weight, bias, eps, ue8m0, round_norm, block_size,
                                  wrap_negative, fp8_max_input)
    return [kv_cache, *(kv_cache.reshape(shape) for shape in reader_shapes)]
