"""``indexer_k_write``: DeepSeek-V3.2's indexer K write (norm + fp8 quant + paged store) -> one op.

What it finds (post-grad graph, which is functional): a graph-input (or, under AOTInductor, a
``get_attr`` constant: a module buffer lifted by ``torch.export``) cache ``kv_cache`` uint8
``[num_blocks, block_size, D + 4G]`` that is written by exactly two functional writes
(``aten.index_put``, possibly inside ``slice_scatter``, as ``index_put_``, ``index_copy_`` and
``view[blk, off] = ...`` into views of the cache become) and copied back with ``copy_``:

* one storing the fp8 values ``q = fp8_e4m3(clamp(x / scale, -448, 448))`` of
  ``x = k.float().view(T, G, 128)`` (any 1-byte view of them) at bytes
  ``blk * block_bytes + off * D + j``;
* one storing the float32 scales (as float32 or as their bytes) at
  ``blk * block_bytes + block_size * D + off * 4G + 4g (+ byte)``;

with ``blk = slot // block_size``, ``off = slot % block_size`` for ``slot = slot_mapping[t]``,
and ``scale = max(amax(|x|), 1e-4) / 448`` (plain), or that rounded up to a power of two as
``2 ** ceil(log2(scale))`` / ``exp2(ceil(log2(scale)))`` ("ue8m0"). Byte addresses are
derived from the views' strides and read symbolically (``_index_algebra``), so the three
spellings, int32/int64, ``%`` or ``slot - blk * bs`` all match, while another layout (the
per-token interleaved one), block size, group size or scale formula (another floor, another
divisor, ``* (1 / 448)``) does not. The clamp to +-448 may be left out: this scale
bounds ``|x / scale|`` to 448 up to rounding, so the cast rounds exactly as after the clamp
(proof in ``_read_scaled``); with another scale an unclamped cast is refused, saying so.

LayerNorm: when ``k`` is ``F.layer_norm(k0.float(), (D,), weight, bias, eps).to(k0.dtype)``
(post-grad: ``var_mean``, ``rsqrt``, ``* weight + bias``) and nothing else reads the
normalized ``k``, the norm is fused too. When something sits between the norm and the
quantization (DeepSeek-V3.2 applies rotary to the first 64 dims there) or the normalized
``k`` is read elsewhere, only quant + write are replaced (vLLM's
``indexer_k_quant_and_cache``) and the norm and rotary stay with Inductor. That is the
decision for V3.2: its rotary sits between the norm and the quantization, so the norm is
not fused there. Torch 2.9-2.11's joint-graph pass drops the norm's cast back to bf16 and
the quantization's ``.float()`` (a float32 -> bf16 -> float32 round trip) before our pass
runs; the norm without the cast back is fused too, with ``round_norm=False``, which is what
the graph we are handed computes. One token (``T == 1``): ``x[i] = v`` reshapes ``v`` from
``[1, B]`` to ``[B]`` before storing; that is matched too.

Padding slots (< 0), race-free: each write adds ``torch.where(slot_mapping >= 0, new - old, 0)``
with ``index_put_(..., accumulate=True)``, ``old`` read from the same addresses and the slot
clamped to 0 for the indexing (``kda_inductor.reference.write_indexer_k``): padding adds 0
wherever it lands, so a real token that shares the clamped slot keeps its bytes, in eager
too. The op skips padding: byte-exact against eager.

Padding slots, racy: a plain ``index_put_`` / ``view[blk, off] =`` of ``torch.where(slot_mapping
>= 0, new, old)`` (a masked flat ``index_copy_`` is not recognized), clamped to 0 or not,
writes padding's old bytes back to slot 0 (or, unclamped, to where -1 lands: the last slot).
Where a real token targets that slot too, one write stores two different byte strings at one
address: PyTorch leaves the winner undefined (CPU eager keeps the old bytes, losing the real
token's K). This is still matched (it equals eager wherever eager is defined, e.g. vLLM's
reserved block 0); the op stores the real token, and the graph's note (``explain()``,
``TORCH_LOGS=kda_inductor``) says so at the user's line (``RACY_NOTE``). Two real tokens on
one slot are the caller's error in every spelling: eager's result is undefined (plain) or
the sum of both deltas (accumulate), the op stores one of them.

Unmasked code writes a negative slot where Python indexing puts it (slot -1: the last row of
the last block; every spelling the index algebra accepts, ``//``, ``>>``, ``%``, ``&``, floors
the same way): it is replaced with ``wrap_negative=True``, which does exactly that. Clamped
but unmasked code is not matched; nor is an accumulating write that does not add a masked
delta.

Symbolic sizes (``docs/dynamic.md``): the block count and the token count stay symbolic
(automatic dynamic, ``mark_dynamic``, ``dynamic=True``): the cache's views are replayed with
their example sizes and again with every such symbol one larger, and match only where the byte
addresses agree. The kernel needs the block size, row width, head dim and group count static:
symbolic there (``dynamic=True``), they are read as their example values and specialized when
the match is replaced (``_layout.specialize``: a guard, so another value compiles again); a size
the user marked dynamic is a miss naming it.

Speed rule (``speed_rule``, "never make a graph slower"), decided by measurement:

* CUDA (an H200, torch 2.11, triton 3.6): always. Stock Inductor cannot compile the write
  there ("must be 1 to view Float as Byte"), so the alternative is eager, which the op beats
  by more than 30x at T=256 and T=16384 (the figures: ``benchmarks/results/report.md``, rows
  ``indexer_k_write``); in the hybrid model's T=256 spec-decode step (quant + write after the
  rotary) the rewrite alone saves 40 us of the step (918.7 vs 958.9 us, 2026-12-01), and kda
  without it is 92.1 us slower in that step (``profile_step.py --without-each``,
  ``benchmarks/results/profile_step.md``);
* CPU (this project's 2-core machine, torch 2.13, forced op vs the same graph left to
  Inductor, which compiles it there): only with a static count of at least
  ``CPU_MIN_TOKENS`` tokens. The op's CPU implementation wins from 512 tokens (512: 793 vs
  925 us; 1024: 1198 vs 1661; 2048: 1679 vs 2954; 8192: 3814 vs 13010) and loses below (256:
  671 vs 514; 16: 442 vs 145); symbolic counts are left to Inductor (decode steps would lose).

Replacement: ``auto_functionalized(kda.indexer_k_write, kv_cache=<input>, ...)``, whose new
cache feeds the user's ``copy_`` (and every reader of the written cache); Inductor
re-inplaces it, so the op writes the cache buffer itself: no clone, no copy.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, NamedTuple

import sympy
import torch
import torch.fx as fx

from kda_inductor.lowerings import indexer_k_write as _lowering  # registers the op
from kda_inductor.patterns._index_algebra import IndexAlgebra, Sym, Table, known, same
from kda_inductor.patterns._layout import (
    SYMBOLIC_ROW,
    concrete_args,
    free_symbols,
    input_sizes,
    is_view_op,
    marked_dynamic,
    marked_dynamic_miss,
    meta_like,
    row_sizes,
    same_addressing,
    same_count,
    specialize,
    static_equal,
    static_size,
    symbolic_row,
)
from kda_inductor.patterns.base import (
    SHAPE_VIEWS,
    VIEWS,
    Match,
    Rewrite,
    Stage,
    aten,
    cpu_min_count_rule,
    earliest,
    in_graph_order,
    is_op,
    prims,
    replace_by_function,
    source_location,
    val,
)
from kda_inductor.patterns.canonical import Canon, Term, const_value
from kda_inductor.lowerings._fp8 import AMAX_FLOOR, FP8_MAX
from kda_inductor.reference import QUANT_GROUP, CacheLayout

_T, _J = sympy.symbols("t j", integer=True, nonnegative=True)
CPU_MIN_TOKENS = 1024
"""Tokens written (a static count) from which the op runs on CPU (see the speed rule)."""
_VALUE_VIEWS = SHAPE_VIEWS
_CASTS = (prims.convert_element_type, aten._to_copy)
RACY_NOTE = ("this masked write stores padding's old bytes with a plain index_put_: where a real "
             "token shares the slot padding lands on (slot 0 when clamped, the last slot for -1), two writes of "
             "different bytes hit one address and eager's result is undefined (CPU eager keeps the old bytes); "
             "rewritten, kda.indexer_k_write stores the real token. Race-free spelling: "
             "kda_inductor.reference.write_indexer_k "
             "(index_put_(..., torch.where(valid, new - old, 0), accumulate=True))")


# --------------------------------------------------------------------------- cache versions


@dataclasses.dataclass(frozen=True)
class _Write:
    node: fx.Node  # aten.index_put
    layout: torch.Tensor  # meta tensor: the base's view of the cache bytes
    version: int  # writes before this one
    accumulate: bool = False  # index_put(..., accumulate=True): must add where(valid, new - old, 0)


@dataclasses.dataclass
class _State:
    """A tensor of the cache's write chain: the cache after ``writes``, seen through
    ``layout`` (a meta tensor viewing a byte buffer laid out as the cache)."""

    writes: tuple[_Write, ...]
    layout: torch.Tensor


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
            and tuple(a.stride()) == tuple(b.stride()) and a.storage_offset() == b.storage_offset())


class _Chain:
    """Reads the functional write chain of one graph-input cache. Symbolic sizes (a block
    count that varies) take their example values plus ``shift`` (see ``_sizes_do_not_matter``),
    but for ``fixed``'s (the block size and row width, specialized on replacing): their example
    values."""

    def __init__(self, cache: fx.Node, shift: int = 0, fixed: dict | None = None):  # ValueError: no example value
        self.cache = cache
        self.shift = shift
        self.fixed = row_sizes(cache) if fixed is None else fixed  # IndexerKWrite._written adds the rows' widths
        self.root = meta_like(val(cache), shift, self.fixed)
        self.memo: dict[fx.Node, _State | None] = {}

    def state(self, n: Any) -> _State | None:
        if not isinstance(n, fx.Node):
            return None
        if n not in self.memo:
            self.memo[n] = None  # cycles cannot happen; this also bounds the recursion
            try:
                self.memo[n] = self._state(n)
            except Exception:  # noqa: BLE001 - a view meta tensors reject: not ours
                self.memo[n] = None
        return self.memo[n]

    def _state(self, n: fx.Node) -> _State | None:
        if n is self.cache:
            return _State((), self.root)
        if not n.args:
            return None
        a = (n.args[0], *fx.node.map_aggregate(n.args[1:], self._leaf))
        if is_op(n, *VIEWS) and n.target is not aten.view.dtype:
            s = self.state(a[0])
            if s is None:
                return None
            r = s.layout.reshape(list(a[1]))
            return _State(s.writes, r) if r._is_view() else None
        if n.target is aten.view.dtype:
            s = self.state(a[0])
            return None if s is None else _State(s.writes, s.layout.view(a[1]))
        if is_op(n, aten.slice):
            s = self.state(a[0])
            if s is None:
                return None
            return _State(s.writes, aten.slice.Tensor(s.layout, *a[1:]))
        if n.target is aten.index_put.default:  # accumulate: checked as a masked delta (_read_write)
            s = self.state(a[0])
            if s is None:
                return None
            return _State(s.writes + (_Write(n, s.layout, len(s.writes), bool(len(a) > 3 and a[3])),), s.layout)
        if n.target is aten.slice_scatter.default:
            base, src = self.state(a[0]), self.state(a[1])
            if base is None or src is None or src.writes[: len(base.writes)] != base.writes:
                return None
            if not _same_layout(src.layout, aten.slice.Tensor(base.layout, *a[2:])):
                return None
            return _State(src.writes, base.layout)
        return None

    def _leaf(self, x: Any) -> Any:
        """A tensor node as it is; a size (int or symbolic) as an int; anything else: not ours."""
        if isinstance(x, (bool, torch.dtype)) or isinstance(x, fx.Node) and isinstance(val(x), torch.Tensor):
            return x
        got = concrete_args(x, self.shift, self.fixed)
        if got is None and x is not None:
            raise ValueError(f"not a size: {x!r}")
        return got


# --------------------------------------------------------------------------- slot algebra


class _SlotAlgebra(IndexAlgebra):
    """``IndexAlgebra`` where 1-D integer tensors of ``num_tokens`` entries are per-token
    sequences ``seq_<node>(tok)`` along one token axis, and ``clamp(min=0)`` of a sequence
    is the sequence (remembered in ``clamped``: only sound where the writes are masked)."""

    def __init__(self, num_tokens: Any):
        super().__init__()
        self.num_tokens = num_tokens
        self.tok = sympy.Symbol("tok", integer=True, nonnegative=True)
        self.axis_len[self.tok] = num_tokens
        self.sequences: set[fx.Node] = set()
        self.clamped = False

    def seq_fn(self, node: fx.Node):
        return self._fn("seq", node)

    def _interpret(self, n: fx.Node):
        v = val(n)
        if is_op(n, aten.clamp_min, aten.clamp) and isinstance(v, torch.Tensor):
            lo = n.args[1] if len(n.args) > 1 else n.kwargs.get("min")
            hi = n.args[2] if len(n.args) > 2 else n.kwargs.get("max")
            x = self.interpret(n.args[0])
            if lo == 0 and hi is None and isinstance(x, Sym) and x.expr.func.__name__.startswith("seq_"):
                self.clamped = True
                return x
            return None
        out = super()._interpret(n)
        if (
            isinstance(out, Table) and out.offset == 0 and isinstance(v, torch.Tensor)
            and v.dim() == 1 and same_count(v.shape[0], self.num_tokens)
        ):
            self.sequences.add(n)
            return Sym(self.seq_fn(n)(self.tok), (self.tok,))
        return out


# --------------------------------------------------------------------------- quant region


def _through_views(n: Any, views=_VALUE_VIEWS) -> tuple[Any, list[fx.Node]]:
    """Follow value-preserving views up to their source; returns (source, views passed)."""
    seen = []
    while is_op(n, *views) or (isinstance(n, fx.Node) and n.target is aten.view.dtype):
        seen.append(n)
        n = n.args[0]
    return n, seen


def _sizes_do_not_matter(copy: fx.Node, final: _State, fixed: dict) -> bool:
    """The chain addresses the cache alike with every symbolic size but ``fixed``'s one larger
    (a block count that varies moves no byte the writes address): ``final``'s writes and result
    read again."""
    try:
        chain = _Chain(copy.args[0], shift=1, fixed=fixed)
    except ValueError:  # a size without an example value
        return False
    other = chain.state(copy.args[1])
    return (other is not None and _same_layout(other.layout, chain.root) and len(other.writes) == len(final.writes)
            and all(same_addressing(w.layout, o.layout) for w, o in zip(final.writes, other.writes)))


def _fixed_sizes(copy: fx.Node, chain: _Chain, final: _State) -> dict:
    """The sizes a match reads as their example values, specialized when it is replaced
    (``_layout.specialize``): the cache's block size and row width, and the widths of the rows
    the writes store (k's head dim, its groups). Token and block counts stay symbolic."""
    widths = []
    for w in final.writes:
        indices = list(w.node.args[1])
        got = None if any(i is None for i in indices) else _unwrapped(w, indices, w.node.args[2])
        if isinstance(got, tuple) and isinstance(val(got[1]), torch.Tensor):
            widths += list(val(got[1]).shape[1:])
    return {**chain.fixed, **input_sizes(copy.graph, free_symbols(*widths))}


def _sizes_for(n: fx.Node, versions: dict, depth: int = 0) -> bool:
    """``n`` reads only sizes of a cache version, for the chain's own views (``dynamic=True``
    graphs size them so: ``sym_size(view(slice(cache_version)), 1)``): no byte of it."""
    if is_op(n, aten.sym_size, aten.sym_stride, aten.sym_numel):
        return all(u in versions or isinstance(val(u), torch.SymInt) for u in n.users)
    return (is_view_op(n) and depth < 8 and bool(n.users)
            and all(u in versions or _sizes_for(u, versions, depth + 1) for u in n.users))


def _masked_delta(values: Any) -> tuple[fx.Node, fx.Node, fx.Node, set[fx.Node]] | None:
    """``where(mask, new - old, 0)`` -> (mask, new, old, its nodes), else None."""
    if not (isinstance(values, fx.Node) and values.target is aten.where.self):
        return None
    mask, diff, zero = values.args
    if not (is_op(diff, aten.sub) and diff.target is aten.sub.Tensor and not diff.kwargs
            and isinstance(zero, fx.Node) and zero.target is aten.scalar_tensor.default and zero.args[0] == 0):
        return None
    return mask, diff.args[0], diff.args[1], {values, diff, zero}


def _flat_pair(indices: list, values: Any) -> tuple[fx.Node, fx.Node] | None:
    """``flat.index_copy_(0, idx.reshape(-1), v.reshape(-1))`` with ``idx`` and ``v`` of one
    2-D shape -> ``(idx, v)``; else None."""
    if len(indices) == 1 and val(indices[0]).dim() == 1 and is_op(indices[0], *VIEWS) and is_op(values, *VIEWS):
        xi, xv = indices[0].args[0], values.args[0]
        if val(xi).dim() == 2 and val(xv).dim() == 2 and all(map(known, map(operator.eq, val(xi).shape, val(xv).shape))):
            return xi, xv
    return None


def _leading_ones(v: Any) -> bool:
    """``v`` is ``[1, B]``: a one-token row that setitem reshapes to ``[B]`` before storing."""
    return isinstance(v, torch.Tensor) and v.dim() == 2 and known(v.shape[0] == 1)


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


def _f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def _read_quant(q: fx.Node, canon: Canon, fixed: dict | None = None) -> _Quant | str:
    """Check, in canonical terms, that ``q`` is the fp8 group quantization
    ``fp8(clamp(x / s, -448, 448))`` with ``s = max(amax(|x|, -1), 1e-4) / 448`` (or its
    ue8m0 rounding ``exp2(ceil(log2(s)))``) over groups of 128 values of float32 ``x``:
    every spelling :mod:`.canonical` normalizes matches (``clamp_min`` / ``torch.maximum`` with
    ``torch.tensor(eps)``, ``amax`` without keepdim then ``unsqueeze``, ``max(dim)[0]``,
    ``pow(2, .)`` / ``exp2``, one group per row or ``[T, G, 128]`` views, ``.float()`` /
    ``type_as``...). A string says why not. ``fixed``: the sizes read as their example values
    (``_fixed_sizes``)."""
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
                     and const_value(plain.args[1]) is not None and _f32(const_value(plain.args[1])) == _f32(1 / FP8_MAX))
    if const_value(divisor) != FP8_MAX and fp8_max_input is None and not times_inverse:
        return f"scale is not max(amax, {AMAX_FLOOR:g}) / {FP8_MAX:g} (another scale formula)"
    floor = plain.args[0]
    if not (floor.op == "clamp" and floor.attr("hi") is None and floor.attr("lo") is not None
            and _f32(floor.attr("lo")) == _f32(AMAX_FLOOR)):
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


# --------------------------------------------------------------------------- one write, read


class _Stored(NamedTuple):
    """One write of the cache, read (:meth:`IndexerKWrite._read_write`): what it stores, where."""

    kind: str  # "values" (an fp8 cast) or "scales" (float32)
    src: fx.Node  # the stored tensor, before its views
    masked: bool  # stored through torch.where(slot_mapping >= 0, new, old) (or its masked delta)
    write: _Write
    nodes: set  # the write's nodes (the index_put, the stored views, the mask)
    reads: set  # the old cache bytes a masked write reads
    addr: sympy.Expr  # byte address of byte j of token t's stored row
    row_bytes: int  # bytes stored per token
    algebra: _SlotAlgebra  # shared by both writes (the second write's reading extends the first's)


def _unwrapped(w: _Write, indices: list, values: Any):
    """``(indices, stored values, masked, nodes)`` of a write: the stored values without the
    one-token reshape, the mask (``(mask, old)``, or None when unmasked) and the flat
    ``index_copy_``'s flattening; or why not."""
    nodes = {w.node}
    masked = None
    if (is_op(values, *VIEWS) and val(values).dim() < 2 and _leading_ones(val(values.args[0]))
            and _flat_pair(indices, values) is None):
        nodes |= {values}  # one token: x[i] = v strips v's leading 1s ([1, B] -> [B])
        values = values.args[0]
    if w.accumulate:  # the race-free masked spelling: add where(valid, new - old, 0)
        delta = _masked_delta(values)
        if delta is None:
            return "accumulating write that does not add where(slot_mapping >= 0, new - old, 0)"
        mask, new, old, delta_nodes = delta
        masked, values = (mask, old), new
        nodes |= delta_nodes
    elif is_op(values, aten.where) and values.target is aten.where.self:
        mask, new, old = values.args
        masked = (mask, old)
        nodes |= {values}
        values = new
    flat = _flat_pair(indices, values)
    if flat is not None:  # index_copy_ on a flat view: unflatten both
        nodes |= {indices[0], values}
        indices, values = [flat[0]], flat[1]
    return indices, values, masked, nodes


def _byte_address(lay: torch.Tensor, indices: list, vv: torch.Tensor, algebra: _SlotAlgebra) -> sympy.Expr | str:
    """The byte address of byte ``j`` of token ``t``'s stored row ``vv`` in a write of the view
    laid out as ``lay`` at ``indices``, or why not."""
    syms = [algebra.interpret(i) for i in indices]
    if not all(isinstance(s, Sym) for s in syms):
        return "index tensors are not integer arithmetic of slot_mapping and arange"
    tail = list(lay.shape[len(indices):])
    p_rank = max(len(s.dims) for s in syms)
    if p_rank + len(tail) != 2:
        return "the write is not [tokens, bytes] shaped"
    bound = algebra.bind(syms, [_T, _J][:p_rank])
    if bound is None:
        return "index tensors do not broadcast to [tokens] or [tokens, bytes]"
    exprs, axes = bound
    if axes[0] is not algebra.tok:
        return "the first index dim is not the token axis"
    width = static_size(vv.shape[1], algebra.static)
    if p_rank == 2 and not known(static_size(algebra.axis_len.get(axes[1], -1), algebra.static) == width):
        return "the byte axis does not span the stored row"
    elem = sum(e * st for e, st in zip(exprs, lay.stride())) + lay.storage_offset()
    if tail:
        if not known(tail[0] == width):
            return "the stored row does not fill the indexed row"
        elem = elem + _J * lay.stride(len(indices))
    esize = lay.element_size()
    if vv.element_size() != esize:
        return "stored dtype size differs from the cache view's"
    addr = esize * elem  # byte address of element (t, j); bytes within it follow in order
    if esize > 1:
        addr = addr.subs(_J, sympy.floor(_J / esize)) + sympy.Mod(_J, esize)
    return addr


def _stored_source(values: Any, vv: torch.Tensor, esize: int, fixed: Any):
    """``(kind, source, views, row bytes)`` of the stored ``values``: fp8 values (an fp8 cast)
    or float32 scales (also as a view of their bits), all of it; or why not. ``fixed``: the
    size symbols read as their example values (the row width's, specialized on replacing)."""
    src, views = _through_views(values)
    row_bytes = static_size(vv.shape[1], fixed) * esize
    if not isinstance(row_bytes, int):
        return "the stored rows have a symbolic width"
    f32 = [v for v in [*views, src] if val(v) is not None and val(v).dtype == torch.float32]
    if f32 and val(src).dtype != torch.float32:  # scales stored from a float32 view of their bits
        src = f32[-1]
    if is_op(src, *_CASTS) and val(src).dtype == torch.float8_e4m3fn:
        kind = "values"
    elif val(src) is not None and val(src).dtype == torch.float32:
        kind = "scales"
    else:
        return "stores neither fp8 values nor float32 scales"
    if not known(val(src).numel() == vv.numel() * esize // val(src).element_size()):
        return "the stored bytes are not all of the quantized tensor"
    return kind, src, views, row_bytes


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


@dataclasses.dataclass
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
    def _written(self, copy: fx.Node) -> tuple[_Chain, _State] | None:
        """``(chain, final state)`` of the cache ``copy`` writes back, when it is a chain of two
        functional writes and views of it whose addresses do not depend on its symbolic sizes;
        else None (a ``Stage.FORM`` miss)."""
        cache = copy.args[0]
        try:
            chain = _Chain(cache)
        except ValueError:
            return self.miss(copy, Stage.FORM, "the cache has a size without an example value (an unbacked size)")
        final = chain.state(copy.args[1])
        if final is None or not _same_layout(final.layout, chain.root):
            return self.miss(copy, Stage.FORM, "not a chain of index_put / slice_scatter / views of the copied cache")
        if len(final.writes) != 2:
            return self.miss(copy, Stage.FORM, f"the cache is written {len(final.writes)} times, not twice (values and scales)")
        chain.fixed = _fixed_sizes(copy, chain, final)  # read as their example values from here on
        marked = marked_dynamic(chain.fixed)
        if marked:
            return self.miss(copy, Stage.FORM, marked_dynamic_miss(marked))
        if not _sizes_do_not_matter(copy, final, chain.fixed):
            return self.miss(copy, Stage.FORM, SYMBOLIC_ROW if symbolic_row(cache) else
                             "the writes' byte addresses depend on the cache's symbolic sizes")
        return chain, final

    def _pieces(self, copy: fx.Node, chain: _Chain, final: _State):
        """``(values write, scales write, region, old bytes read)``: one write of fp8 values and
        one of float32 scales, each read by :meth:`_read_write`; else None (a ``Stage.PIECES``
        miss)."""
        region: set[fx.Node] = {copy}
        reads: set[fx.Node] = set()
        found: dict[str, list[_Stored]] = {}
        algebra = None
        for w in final.writes:
            got = self._read_write(w, chain, algebra, chain.fixed)
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
    def _layout(self, copy: fx.Node, values: _Stored, scales: _Stored) -> CacheLayout | None:
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

    def _slot(self, copy: fx.Node, values: _Stored, scales: _Stored) -> fx.Node | None:
        """The one ``slot_mapping`` both writes index by (masked alike), else None (a
        ``Stage.INDEXING`` miss)."""
        algebra = values.algebra
        if len(algebra.sequences) != 1:
            return self.miss(copy, Stage.INDEXING, "the writes do not index by one slot_mapping")
        if values.masked != scales.masked or (algebra.clamped and not values.masked):
            return self.miss(copy, Stage.INDEXING, "slots clamped to 0 but the writes are not masked by slot_mapping >= 0")
        return next(iter(algebra.sequences))

    def _addressed(self, copy: fx.Node, values: _Stored, scales: _Stored, layout: CacheLayout,
                   slot: fx.Node) -> bool:
        """Both writes store where ``layout`` puts slot ``slot_mapping[t]``'s bytes (block
        ``slot // block_size``, offset ``slot % block_size``); else a ``Stage.ADDRESSING`` miss."""
        bs, hd = layout.block_size, layout.head_dim
        seq = values.algebra.seq_fn(slot)(_T)
        blk, off = sympy.floor(seq / bs), sympy.Mod(seq, bs)
        block = blk * static_size(val(copy.args[0]).stride(0), values.algebra.static)  # the block stride is free
        if not same(values.addr, block + layout.value_byte(off) + _J):
            self.miss(values.write.node, Stage.ADDRESSING, f"value bytes do not go to block slot // {bs}, byte "
                      f"(slot % {bs}) * {hd} + j (another layout or block size)")
            return False
        if not same(scales.addr, block + layout.scale_byte(off) + _J):
            self.miss(scales.write.node, Stage.ADDRESSING, f"scale bytes do not go to block slot // {bs}, byte "
                      f"{layout.scales_start} + (slot % {bs}) * {layout.scale_bytes} + j (another layout or "
                      "block size)")
            return False
        return True

    # ------------------------------------------------------------------ values
    def _quantized(self, values: _Stored, scales: _Stored, layout: CacheLayout, slot: fx.Node,
                   canon: Canon) -> _Quant | None:
        """The quantization whose fp8 values and scales are stored, of a ``k`` that fits the
        cache and ``slot_mapping``; else None (a ``Stage.VALUES`` miss)."""
        quant = _read_quant(values.src, canon, input_sizes(values.write.node.graph, values.algebra.static))
        if isinstance(quant, str):
            return self.miss(values.write.node, Stage.VALUES, quant)
        s_src = scales.src
        if canon.strip(canon(s_src), "view") != quant.scale and _through_views(s_src)[0] is not _through_views(
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

    def _region_closed(self, copy: fx.Node, chain: _Chain, last: int, reads: set[fx.Node]):
        """``(readers, versions)``: every version of the cache but the last is read only inside
        the region (masked writes read the old bytes), and the last one's readers outside the
        chain (they get the new cache) read it whole; else None (a ``Stage.REGION`` miss)."""
        versions = {n: s for n, s in chain.memo.items() if s is not None}
        for n, s in versions.items():
            if 0 < len(s.writes) < last and any(u not in versions and u not in reads and not _sizes_for(u, versions)
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

    # ------------------------------------------------------------------ one write
    def _read_write(self, w: _Write, chain: _Chain, algebra, fixed: dict) -> _Stored | str:
        """One write -> what it stores where (:class:`_Stored`), or why not. ``fixed``: the
        sizes read as their example values (:func:`_fixed_sizes`)."""
        indices = w.node.args[1]
        if any(i is None for i in indices) or len(indices) > w.layout.dim():
            return "index_put with None (slice) indices"
        got = _unwrapped(w, list(indices), w.node.args[2])
        if isinstance(got, str):
            return got
        indices, values, masked, nodes = got
        vv = val(values)
        if vv is None or vv.dim() != 2:
            return "the stored values are not [tokens, bytes]"
        if algebra is None:
            algebra = _SlotAlgebra(vv.shape[0])
            algebra.static |= set(fixed)
        elif not known(algebra.num_tokens == vv.shape[0]):
            return "the two writes store different numbers of tokens"
        addr = _byte_address(w.layout, indices, vv, algebra)
        if isinstance(addr, str):
            return addr
        reads: set[fx.Node] = set()
        if masked is not None:
            why = self._check_mask(masked, w, chain, indices, algebra, w.layout)
            if why:
                return why
            reads.add(masked[1])
            ge, views = _through_views(masked[0], (aten.unsqueeze, aten.expand, *VIEWS))
            nodes |= {masked[1], ge, *views}
        stored = _stored_source(values, vv, w.layout.element_size(), algebra.static)
        if isinstance(stored, str):
            return stored
        kind, src, views, row_bytes = stored
        return _Stored(kind, src, masked is not None, w, nodes | set(views), reads, addr, row_bytes, algebra)

    @staticmethod
    def _check_mask(masked, w, chain, indices, algebra, lay) -> str | None:
        mask, old = masked
        m, _ = _through_views(mask, (aten.unsqueeze, aten.expand, *VIEWS))
        ok = (is_op(m, aten.ge) and m.args[1] == 0) or (is_op(m, aten.gt) and m.args[1] == -1)
        if not ok or m.args[0] not in algebra.sequences and algebra.interpret(m.args[0]) is None:
            return "torch.where mask is not slot_mapping >= 0"
        ms = algebra.interpret(m.args[0])
        if not (isinstance(ms, Sym) and ms.expr.func.__name__.startswith("seq_")):
            return "torch.where mask is not slot_mapping >= 0"
        if not (is_op(old, aten.index) and old.target is aten.index.Tensor):
            return "torch.where does not keep the old cache bytes"
        st = chain.state(old.args[0])
        if st is None or len(st.writes) != w.version or not _same_layout(st.layout, lay):
            return "torch.where keeps bytes of another cache version or view"
        a = [algebra.interpret(i) for i in old.args[1]]
        b = [algebra.interpret(i) for i in indices]
        if len(a) != len(b) or not all(isinstance(s, Sym) for s in a):
            return "torch.where keeps bytes from other addresses"
        ba, bb = algebra.bind(a, [_T, _J][: max(len(s.dims) for s in a)]), algebra.bind(b, [_T, _J][: max(len(s.dims) for s in b)])
        if ba is None or bb is None or not all(same(x, y) for x, y in zip(ba[0], bb[0])):
            return "torch.where keeps bytes from other addresses"
        return None

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
